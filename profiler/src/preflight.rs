//! Checks before anything is loaded: each failure is one sentence with a next step.
use std::path::Path;

use crate::error::UserError;

const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// Root, or the capabilities BPF profiling needs.
pub fn check_privileges() -> Result<(), UserError> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let caps = effective_caps(&status).unwrap_or(0);
    let has = |cap: u32| caps & (1u64 << cap) != 0;
    if has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON)) {
        Ok(())
    } else {
        Err(UserError::NotPrivileged)
    }
}

fn effective_caps(status: &str) -> Option<u64> {
    let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?.trim();
    u64::from_str_radix(hex, 16).ok()
}

pub use crate::counters::tracepoint::{tracefs_root, TRACEFS, TRACEFS_OLD};

/// The tracefs root, mounting it if the system has not (as root may).
pub fn ensure_tracefs() -> Result<&'static Path, UserError> {
    for root in [TRACEFS, TRACEFS_OLD] {
        if Path::new(root).join("events").is_dir() {
            return Ok(Path::new(root));
        }
    }
    nix::mount::mount(
        Some("nodev"),
        TRACEFS,
        Some("tracefs"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    )
    .map_err(|e| UserError::NoTracefs(e.desc().to_string()))?;
    if Path::new(TRACEFS).join("events").is_dir() {
        log::info!("mounted tracefs at {TRACEFS}");
        Ok(Path::new(TRACEFS))
    } else {
        Err(UserError::NoTracefs("no events directory after mounting".into()))
    }
}

/// Byte offset of `field` in a tracepoint's record, from its tracefs format file.
pub fn tracepoint_field_offset(tracefs: &Path, group: &str, event: &str, field: &str) -> Option<u32> {
    let format =
        std::fs::read_to_string(tracefs.join("events").join(group).join(event).join("format")).ok()?;
    field_offset(&format, field)
}

fn field_offset(format: &str, field: &str) -> Option<u32> {
    format.lines().find_map(|line| {
        let decl = line.trim().strip_prefix("field:")?;
        let (decl, rest) = decl.split_once(';')?;
        let name = decl.rsplit([' ', '*']).next()?;
        let name = name.split('[').next()?;
        if name != field {
            return None;
        }
        rest.split(';')
            .find_map(|kv| kv.trim().strip_prefix("offset:")?.parse().ok())
    })
}

/// Each pid's process id (a thread id given by mistake becomes its process), in order, once.
pub fn resolve_pids(pids: &[u32]) -> Result<Vec<u32>, UserError> {
    let mut out: Vec<u32> = Vec::with_capacity(pids.len());
    for &pid in pids {
        let tgid = match pid {
            0 => None,
            pid => crate::process::tgid_of(pid),
        };
        let tgid = tgid.ok_or(UserError::NoSuchProcess(pid))?;
        if !out.contains(&tgid) {
            out.push(tgid);
        }
    }
    Ok(out)
}

/// The kernel's ceiling for sampling rates (it lowers it itself when sampling gets too costly).
pub fn max_sample_rate() -> u64 {
    std::fs::read_to_string("/proc/sys/kernel/perf_event_max_sample_rate")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100_000)
}

pub fn check_frequency(hz: u64) -> Result<(), UserError> {
    let max = max_sample_rate();
    if hz == 0 || hz > max {
        return Err(UserError::BadFrequency { given: hz, max });
    }
    Ok(())
}

/// Older kernels charge BPF maps to RLIMIT_MEMLOCK; every open mapped file costs a descriptor.
pub fn raise_limits() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource, RLIM_INFINITY};
    let _ = setrlimit(Resource::RLIMIT_MEMLOCK, RLIM_INFINITY, RLIM_INFINITY);
    if let Ok((_, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_effective_capabilities() {
        let status = "Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t000001ffffffffff\n";
        assert_eq!(effective_caps(status), Some(0x1ffffffffff));
        assert_eq!(effective_caps("Name: x\n"), None);
    }

    #[test]
    fn finds_tracepoint_field_offsets() {
        let format = "name: sched_process_fork\nformat:\n\
            \tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\
            \tfield:__data_loc char[] parent_comm;\toffset:8;\tsize:4;\tsigned:0;\n\
            \tfield:pid_t parent_pid;\toffset:12;\tsize:4;\tsigned:1;\n\
            \tfield:char child_comm[16];\toffset:16;\tsize:16;\tsigned:0;\n\
            \tfield:pid_t child_pid;\toffset:32;\tsize:4;\tsigned:1;\n";
        assert_eq!(field_offset(format, "child_pid"), Some(32));
        assert_eq!(field_offset(format, "parent_pid"), Some(12));
        assert_eq!(field_offset(format, "child_comm"), Some(16));
        assert_eq!(field_offset(format, "parent_comm"), Some(8));
        assert_eq!(field_offset(format, "missing"), None);
    }

    #[test]
    fn thread_ids_resolve_to_their_process() {
        let me = std::process::id();
        // Test threads are not the main thread: this id is a thread id, not a process id.
        let tid = unsafe { libc::gettid() } as u32;
        assert_eq!(resolve_pids(&[tid, me]).unwrap(), vec![me]);
        assert!(matches!(resolve_pids(&[0]), Err(UserError::NoSuchProcess(0))));
        assert!(matches!(
            resolve_pids(&[u32::MAX >> 2]),
            Err(UserError::NoSuchProcess(_))
        ));
    }

    #[test]
    fn rejects_absurd_frequencies() {
        assert!(matches!(check_frequency(0), Err(UserError::BadFrequency { .. })));
        assert!(matches!(
            check_frequency(u64::MAX),
            Err(UserError::BadFrequency { .. })
        ));
        assert!(check_frequency(99).is_ok());
    }
}
