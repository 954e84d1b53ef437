//! Tracepoints as events: `SUBSYSTEM:NAME` (`syscalls:sys_enter_write`, `sched:sched_switch`), a
//! perf event of type `PERF_TYPE_TRACEPOINT` whose config is the tracepoint's id in tracefs
//! (`events/SUBSYSTEM/NAME/id`). Counted by `bpfprof stat`, sampled with stacks (`-e`), and timed
//! from one to another (`latency`).
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

/// The tracepoints a glob names (`syscalls:sys_enter_*`, `sched:sched_wak*`: `*` and `?` in
/// either part), sorted; none when `text` is not a tracepoint's spelling with a wildcard.
pub fn expand(tracefs: &Path, text: &str) -> Option<Vec<String>> {
    let (system, name) = text.split_once(':')?;
    if !text.contains(['*', '?']) || name.contains(':') || system.contains('/') {
        return None;
    }
    let dirs = |dir: &Path| -> Vec<String> {
        (std::fs::read_dir(dir).into_iter().flatten().flatten())
            .filter(|e| e.path().is_dir())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect()
    };
    let events = tracefs.join("events");
    let mut found = Vec::new();
    for group in dirs(&events).into_iter().filter(|g| glob_matches(system, g)) {
        for event in dirs(&events.join(&group))
            .into_iter()
            .filter(|e| glob_matches(name, e))
        {
            if events.join(&group).join(&event).join("id").is_file() {
                found.push(format!("{group}:{event}"));
            }
        }
    }
    found.sort();
    Some(found)
}

/// `*` any run of characters, `?` any one, anything else itself.
fn glob_matches(pattern: &str, text: &str) -> bool {
    match pattern.chars().next() {
        None => text.is_empty(),
        Some('*') => (0..=text.len())
            .filter(|&at| text.is_char_boundary(at))
            .any(|at| glob_matches(&pattern[1..], &text[at..])),
        Some(c) => {
            let mut chars = text.chars();
            match chars.next() {
                Some(t) if c == '?' || c == t => glob_matches(&pattern[c.len_utf8()..], chars.as_str()),
                _ => false,
            }
        }
    }
}

/// A tracepoint's field names, from its tracefs `format` (the common ones first): what a filter
/// may name. None when tracefs does not describe it.
pub fn fields(tracefs: &Path, text: &str) -> Vec<String> {
    layout(tracefs, text).into_iter().map(|f| f.name).collect()
}

/// One field of a tracepoint's record, as its tracefs `format` describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Field {
    pub name: String,
    pub offset: u32,
    pub size: u32,
    /// An array or a string (`char name[16]`, `__data_loc char[] name`): not a number.
    pub array: bool,
    pub signed: bool,
    /// As declared, less the name (`char[16]`, `__data_loc char[]`, `unsigned long`).
    pub declared: String,
}

impl Field {
    /// Text: a `char` array, in place or where a `__data_loc` word points.
    pub fn is_text(&self) -> bool {
        self.array && self.declared.contains("char")
    }

    /// Where its bytes are (a `__data_loc` field holds their offset and length in its record).
    pub fn is_dynamic(&self) -> bool {
        self.declared.starts_with("__data_loc")
    }
}

/// A tracepoint's fields (the common ones first); none when tracefs does not describe it.
pub fn layout(tracefs: &Path, text: &str) -> Vec<Field> {
    let Some((system, name)) = text.split_once(':') else {
        return Vec::new();
    };
    let format = std::fs::read_to_string(tracefs.join("events").join(system).join(name).join("format"));
    parse_format(&format.unwrap_or_default())
}

/// The fields of a `format` file: `field:TYPE NAME;\toffset:N;\tsize:N;\tsigned:N;` lines.
pub fn parse_format(format: &str) -> Vec<Field> {
    format
        .lines()
        .filter_map(|line| {
            let mut parts = line.trim().split(';').map(str::trim);
            let declaration = parts.next()?.strip_prefix("field:")?;
            let mut number = |key: &str| parts.next()?.strip_prefix(key)?.parse::<u32>().ok();
            let (offset, size, signed) = (number("offset:")?, number("size:")?, number("signed:"));
            let last = declaration.split_whitespace().last()?;
            Some(Field {
                name: last.split('[').next()?.trim_start_matches('*').to_string(),
                offset,
                size,
                array: declaration.contains('[') || declaration.contains("__data_loc"),
                signed: signed == Some(1),
                declared: declaration
                    .strip_suffix(last)
                    .unwrap_or(declaration)
                    .trim()
                    .to_string()
                    + last.find('[').map_or("", |at| &last[at..]),
            })
        })
        .collect()
}

/// Whether `filter` names only fields of `fields` (and `comm` and `cpu`, which the kernel's
/// filters also know); the first name that is not one otherwise. Quoted strings and numbers
/// are not names.
pub fn unknown_field<'a>(filter: &'a str, fields: &[String]) -> Option<&'a str> {
    let mut rest = filter;
    while let Some(start) = rest.find(|c: char| c.is_ascii_alphabetic() || c == '_' || c == '"') {
        rest = &rest[start..];
        if let Some(quoted) = rest.strip_prefix('"') {
            rest = quoted.split_once('"').map_or("", |(_, after)| after);
            continue;
        }
        let end = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        let (name, after) = rest.split_at(end);
        let number = rest.len() < filter.len()
            && filter[..filter.len() - rest.len()].ends_with(|c: char| c.is_ascii_digit());
        if !number && !["comm", "cpu", "COMM", "CPU"].contains(&name) && !fields.iter().any(|f| f == name) {
            return Some(name);
        }
        rest = after;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_any_run_or_any_one_character() {
        assert!(glob_matches("sys_enter_*", "sys_enter_write"));
        assert!(glob_matches("*", ""));
        assert!(glob_matches("sys_?nter_wr*e", "sys_enter_write"));
        assert!(!glob_matches("sys_enter_*", "sys_exit_write"));
        assert!(!glob_matches("sys_enter_write", "sys_enter_writev"));
        assert!(glob_matches("*write*", "sys_enter_pwritev2"));
    }

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
    fn a_filter_names_only_the_tracepoints_fields() {
        let root = std::env::temp_dir().join(format!("bpfprof-format-{}", std::process::id()));
        let dir = root.join("events/syscalls/sys_enter_write");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("format"),
            "name: sys_enter_write\nformat:\n\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n\tfield:const char * buf;\toffset:24;\tsize:8;\tsigned:0;\n\tfield:size_t count;\toffset:32;\tsize:8;\tsigned:0;\n\tfield:char name[16];\toffset:40;\tsize:16;\tsigned:0;\n",
        )
        .unwrap();
        let fields = fields(&root, "syscalls:sys_enter_write");
        assert_eq!(fields, ["common_pid", "buf", "count", "name"]);
        let count = &layout(&root, "syscalls:sys_enter_write")[2];
        assert_eq!((count.offset, count.size, count.array), (32, 8, false));
        assert!(
            layout(&root, "syscalls:sys_enter_write")[3].array,
            "char name[16]"
        );
        assert_eq!(unknown_field("count > 4096 && common_pid != 0x1f", &fields), None);
        assert_eq!(unknown_field("comm == \"dd x\" || name ~ \"a*\"", &fields), None);
        assert_eq!(unknown_field("cnt > 1", &fields), Some("cnt"));
        assert_eq!(unknown_field("count > 1 && bytes < 2", &fields), Some("bytes"));
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
