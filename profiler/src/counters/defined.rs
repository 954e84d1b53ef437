//! Probes counted on threads and whatever they start, defined in tracefs for the run.
//!
//! A counter inherited by the children of a thread is created again at each fork, in the forking
//! process. A perf event of the `uprobe` or `kprobe` PMU names its file or function by a pointer
//! into bpfprof's memory (`config1`), which the kernel would then read in the forking process:
//! the fork fails (EFAULT, `bash: fork: Bad address`). So, as `perf probe` does, each probe site
//! counted that way is defined in `uprobe_events` or `kprobe_events` for as long as it is
//! counted, and counted as the tracepoint that defines (`PERF_TYPE_TRACEPOINT`, its id), which
//! forks copy as they copy any tracepoint's counter.
use std::{
    fs, io,
    io::Write as _,
    path::{Path, PathBuf},
};

use super::probe::{Probe, ProbeSite};

/// The group every run's definitions are in, with its process id (`bpfprof_1234`): a run never
/// touches another's, and one that died before it removed its own is found by its id.
const GROUP_PREFIX: &str = "bpfprof_";

/// One probe site defined in tracefs, removed when dropped (after its counters are closed: the
/// kernel refuses to remove a definition a perf event holds).
pub struct DefinedSite {
    /// `uprobe_events` or `kprobe_events`.
    file: PathBuf,
    /// `GROUP/NAME`.
    name: String,
    /// Its tracepoint's id.
    pub id: u64,
}

impl DefinedSite {
    /// Define `site` of `probe` as `NAME` of this run's group.
    pub fn define(probe: &Probe, site: &ProbeSite, name: &str) -> io::Result<DefinedSite> {
        let tracefs = super::tracepoint::tracefs_root();
        let file = tracefs.join(definitions_file(probe.kernel));
        let group = format!("{GROUP_PREFIX}{}", std::process::id());
        let definition = definition(probe, site, &format!("{group}/{name}"))?;
        append(&file, &definition).map_err(|e| {
            let why = match e.raw_os_error() {
                // The kernel's reason, where it gives one.
                Some(libc::EINVAL) => last_error_logged(tracefs).unwrap_or_else(|| e.to_string()),
                _ => e.to_string(),
            };
            io::Error::new(
                e.kind(),
                format!("writing `{definition}` to {}: {why}", file.display()),
            )
        })?;
        // Defined: removed when dropped, whatever goes wrong next.
        let mut defined = DefinedSite {
            file,
            name: format!("{group}/{name}"),
            id: 0,
        };
        let id_file = tracefs.join("events").join(&group).join(name).join("id");
        let id = fs::read_to_string(&id_file)?;
        defined.id =
            (id.trim().parse()).map_err(|_| io::Error::other(format!("{}: {id:?}", id_file.display())))?;
        Ok(defined)
    }
}

impl Drop for DefinedSite {
    fn drop(&mut self) {
        if let Err(e) = append(&self.file, &format!("-:{}", self.name)) {
            log::warn!("could not remove {} from {}: {e}", self.name, self.file.display());
        }
    }
}

fn definitions_file(kernel: bool) -> &'static str {
    match kernel {
        true => "kprobe_events",
        false => "uprobe_events",
    }
}

/// The line that defines `site` as `name`: `p:NAME PATH:0xOFFSET(0xSEMAPHORE)` at a user
/// instruction, `r:` at a function's returns, `FUNCTION+OFFSET` in the kernel.
fn definition(probe: &Probe, site: &ProbeSite, name: &str) -> io::Result<String> {
    let kind = if probe.ret { 'r' } else { 'p' };
    let target = std::str::from_utf8(probe.target.as_bytes())
        .ok()
        .filter(|t| !t.contains(char::is_whitespace))
        .ok_or_else(|| {
            io::Error::other(format!(
                "tracefs cannot name `{}` (a space, or not UTF-8): count its probes with -a, or sample them with -e",
                probe.target.to_string_lossy()
            ))
        })?;
    let at = match (probe.kernel, site.semaphore) {
        (true, _) => format!("{target}+{}", site.offset),
        (false, None) => format!("{target}:{:#x}", site.offset),
        (false, Some(semaphore)) => format!("{target}:{:#x}({semaphore:#x})", site.offset),
    };
    Ok(format!("{kind}:{name} {at}"))
}

/// Remove what runs that were killed before they could left (their group's process is gone, or
/// is this one: a dead run had its id), before this run defines its own.
pub fn remove_the_dead_runs() {
    let tracefs = super::tracepoint::tracefs_root();
    for file in [true, false].map(|kernel| tracefs.join(definitions_file(kernel))) {
        let Ok(defined) = fs::read_to_string(&file) else {
            continue;
        };
        for name in defined.lines().filter_map(defined_name) {
            let pid = name.strip_prefix(GROUP_PREFIX).and_then(|n| n.split_once('/'));
            let dead =
                |pid: &str| pid == std::process::id().to_string() || !Path::new("/proc").join(pid).exists();
            if let Some((pid, _)) = pid.filter(|(pid, _)| dead(pid)) {
                log::debug!("removing {name}, left by bpfprof {pid}");
                let _ = append(&file, &format!("-:{name}"));
            }
        }
    }
}

/// `GROUP/NAME` of a line the kernel lists: `p:G/N /path:0x...`, `r16:G/N func+0`.
fn defined_name(line: &str) -> Option<&str> {
    line.split_once(':')?.1.split_whitespace().next()
}

/// The last line of tracefs's `error_log`: why the kernel refused a definition.
fn last_error_logged(tracefs: &Path) -> Option<String> {
    let log = fs::read_to_string(tracefs.join("error_log")).ok()?;
    let line = log
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty() && !l.trim_start().starts_with('^'))?;
    Some(line.trim().to_string())
}

/// Write one line to a tracefs definitions file, keeping what is there.
fn append(file: &Path, line: &str) -> io::Result<()> {
    let mut out = fs::OpenOptions::new().append(true).open(file)?;
    out.write_all(format!("{line}\n").as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probe(kernel: bool, ret: bool, target: &str) -> Probe {
        Probe {
            target: std::ffi::CString::new(target).unwrap(),
            kernel,
            ret,
            entry: true,
            sites: Vec::new(),
        }
    }

    #[test]
    fn each_kind_of_site_is_defined_as_perf_probe_defines_it() {
        let site = |offset, semaphore| ProbeSite {
            offset,
            semaphore,
            ..ProbeSite::default()
        };
        let line = |p: &Probe, s: &ProbeSite| definition(p, s, "bpfprof_7/p0").unwrap();
        assert_eq!(
            line(&probe(false, false, "/usr/lib/libc.so.6"), &site(0x9a0f0, None)),
            "p:bpfprof_7/p0 /usr/lib/libc.so.6:0x9a0f0"
        );
        assert_eq!(
            line(&probe(false, true, "/bin/x"), &site(16, None)),
            "r:bpfprof_7/p0 /bin/x:0x10"
        );
        assert_eq!(
            line(
                &probe(false, false, "/usr/bin/python3.11"),
                &site(0x1234, Some(0x5678))
            ),
            "p:bpfprof_7/p0 /usr/bin/python3.11:0x1234(0x5678)"
        );
        assert_eq!(
            line(&probe(true, false, "do_sys_openat2"), &site(4, None)),
            "p:bpfprof_7/p0 do_sys_openat2+4"
        );
        assert!(definition(&probe(false, false, "/tmp/a b"), &site(0, None), "g/n").is_err());
    }

    #[test]
    fn definitions_are_named_as_the_kernel_lists_them() {
        for (line, name) in [
            (
                "p:bpfprof_12/g0e0s0 /usr/lib/libc.so.6:0x00000000000a0ff0",
                Some("bpfprof_12/g0e0s0"),
            ),
            ("r16:bpfprof_12/g0e1s0 do_nanosleep+0", Some("bpfprof_12/g0e1s0")),
            (
                "p:probe_libc/malloc /usr/lib/libc.so.6:0x0(0x10)",
                Some("probe_libc/malloc"),
            ),
            ("", None),
        ] {
            assert_eq!(defined_name(line), name, "{line}");
        }
    }
}
