//! Probes counted on threads and whatever they start, defined in tracefs for the run.
//!
//! A counter inherited by the children of a thread is created again at each fork, in the forking
//! process. A perf event of the `uprobe` or `kprobe` PMU names its file or function by a pointer
//! into bpfprof's memory (`config1`), which the kernel would then read in the forking process:
//! the fork fails (EFAULT, `bash: fork: Bad address`). So, as `perf probe` does, each probe site
//! counted that way is defined in `uprobe_events` or `kprobe_events` for as long as it is
//! counted, and counted as the tracepoint that defines (`PERF_TYPE_TRACEPOINT`, its id), which
//! forks copy as they copy any tracepoint's counter.
use std::{fs, io, io::Write as _, os::unix::ffi::OsStrExt as _, path::PathBuf};

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
        let file = tracefs.join(if probe.kernel {
            "kprobe_events"
        } else {
            "uprobe_events"
        });
        remove_the_dead_runs(&file);
        let group = format!("{GROUP_PREFIX}{}", std::process::id());
        let definition = definition(probe, site, &format!("{group}/{name}"))?;
        append(&file, &definition)?;
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
        let _ = append(&self.file, &format!("-:{}", self.name));
    }
}

/// The line that defines `site` as `name`: `p:NAME PATH:0xOFFSET(0xSEMAPHORE)` at a user
/// instruction, `r:` at a function's returns, `FUNCTION+OFFSET` in the kernel.
fn definition(probe: &Probe, site: &ProbeSite, name: &str) -> io::Result<String> {
    let kind = if probe.ret { 'r' } else { 'p' };
    let target = std::ffi::OsStr::from_bytes(probe.target.as_bytes()).to_string_lossy();
    if target.contains(char::is_whitespace) {
        return Err(io::Error::other(format!(
            "tracefs cannot name `{target}` (it has a space): count its probes with -a, or sample them with -e"
        )));
    }
    let at = match (probe.kernel, site.semaphore) {
        (true, _) => format!("{target}+{}", site.offset),
        (false, None) => format!("{target}:{:#x}", site.offset),
        (false, Some(semaphore)) => format!("{target}:{:#x}({semaphore:#x})", site.offset),
    };
    Ok(format!("{kind}:{name} {at}"))
}

/// Remove what runs that were killed before they could left in `file` (their group's process
/// is gone).
fn remove_the_dead_runs(file: &std::path::Path) {
    let Ok(defined) = fs::read_to_string(file) else {
        return;
    };
    for line in defined.lines() {
        // `p:bpfprof_1234/g0e0s0 /usr/lib/...`
        let Some(name) = line.get(2..).and_then(|l| l.split_whitespace().next()) else {
            continue;
        };
        let pid = name.strip_prefix(GROUP_PREFIX).and_then(|n| n.split_once('/'));
        if let Some((pid, _)) = pid.filter(|(pid, _)| !std::path::Path::new("/proc").join(pid).exists()) {
            log::debug!("removing {name}, left by bpfprof {pid}");
            let _ = append(file, &format!("-:{name}"));
        }
    }
}

/// Write one line to a tracefs definitions file, keeping what is there.
fn append(file: &std::path::Path, line: &str) -> io::Result<()> {
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
}
