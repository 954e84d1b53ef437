//! Tracepoints as events: `SUBSYSTEM:NAME` (`syscalls:sys_enter_write`, `sched:sched_switch`), a
//! perf event of type `PERF_TYPE_TRACEPOINT` whose config is the tracepoint's id in tracefs
//! (`events/SUBSYSTEM/NAME/id`). Counted by `bpfprof stat`; sampling them with stacks needs a
//! program of the tracepoint type, which the sampler is not (yet).
use std::path::Path;

pub const TRACEFS: &str = "/sys/kernel/tracing";
pub const TRACEFS_OLD: &str = "/sys/kernel/debug/tracing";

/// Where tracefs is mounted, if it is (without mounting it: `preflight::ensure_tracefs` does).
pub fn tracefs_root() -> &'static Path {
    [TRACEFS, TRACEFS_OLD]
        .into_iter()
        .map(Path::new)
        .find(|root| root.join("events").is_dir())
        .unwrap_or(Path::new(TRACEFS))
}

/// `perf_event_attr.type` of a tracepoint.
pub const PERF_TYPE_TRACEPOINT: u32 = 2;

/// `text`'s id as a tracepoint of `tracefs`: `None` when it is not one's spelling (no subsystem
/// of that name, or a modifier such as `cycles:u`); the subsystem's tracepoints (to name the
/// nearest) when the subsystem exists but the name does not.
pub fn id(tracefs: &Path, text: &str) -> Option<Result<u64, Vec<String>>> {
    let (system, name) = text.split_once(':')?;
    if name.contains(':') || system.contains('/') || system.is_empty() || name.is_empty() {
        return None;
    }
    let dir = tracefs.join("events").join(system);
    if !dir.is_dir() {
        return None;
    }
    let id = std::fs::read_to_string(dir.join(name).join("id")).ok();
    Some(id.and_then(|text| text.trim().parse().ok()).ok_or_else(|| {
        (std::fs::read_dir(&dir).into_iter().flatten().flatten())
            .filter(|e| e.path().is_dir())
            .map(|e| format!("{system}:{}", e.file_name().to_string_lossy()))
            .collect()
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tracefs with `sched:sched_switch` (id 316) and `syscalls:sys_enter_write` (id 700).
    fn tracefs() -> std::path::PathBuf {
        let root = std::env::temp_dir().join(format!("bpfprof-tracefs-{}", std::process::id()));
        for (system, name, id) in [
            ("sched", "sched_switch", 316),
            ("syscalls", "sys_enter_write", 700),
        ] {
            let dir = root.join("events").join(system).join(name);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("id"), format!("{id}\n")).unwrap();
        }
        root
    }

    #[test]
    fn tracepoints_by_subsystem_and_name_and_the_nearest_when_misspelt() {
        let root = tracefs();
        assert_eq!(id(&root, "sched:sched_switch"), Some(Ok(316)));
        assert_eq!(id(&root, "syscalls:sys_enter_write"), Some(Ok(700)));
        assert_eq!(
            id(&root, "sched:sched_swich"),
            Some(Err(vec!["sched:sched_switch".to_string()]))
        );
        // Not a tracepoint's spelling: an event with modifiers, a PMU's terms, no such subsystem.
        for text in [
            "cycles:u",
            "cpu/event=0x3c/:u",
            "nosuch:thing",
            "sched:",
            "sched_switch",
        ] {
            assert!(id(&root, text).is_none(), "{text}");
        }
    }
}
