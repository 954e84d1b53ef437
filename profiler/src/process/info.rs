//! Who a process is, read from `/proc` while it is alive: its name, executable and cgroup (what
//! labels its samples), and its threads.

/// What labels a process's samples: captured with its map, while it is alive.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcessInfo {
    /// `/proc/<pid>/comm`.
    pub comm: String,
    /// `/proc/<pid>/exe`, as the process sees it.
    pub executable: Option<String>,
    /// The cgroup v2 path (`0::/...` in `/proc/<pid>/cgroup`).
    pub cgroup: Option<String>,
}

impl ProcessInfo {
    pub(super) fn read(pid: u32) -> Option<ProcessInfo> {
        let comm = comm_of(pid)?;
        let executable = std::fs::read_link(format!("/proc/{pid}/exe"))
            .ok()
            .map(|p| p.to_string_lossy().into_owned());
        let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
            .ok()
            .and_then(|text| cgroup_v2(&text));
        Some(ProcessInfo {
            comm,
            executable,
            cgroup,
        })
    }

    /// The container this process runs in, where its cgroup says (Docker, containerd, CRI-O,
    /// Podman: a 64-hex-digit id in one of the path's components).
    pub fn container_id(&self) -> Option<&str> {
        container_id(self.cgroup.as_deref()?)
    }
}

fn cgroup_v2(text: &str) -> Option<String> {
    text.lines()
        .find_map(|line| line.strip_prefix("0::"))
        .map(str::to_string)
}

/// The container id in a cgroup path: `docker-<id>.scope`, `cri-containerd-<id>.scope`,
/// `crio-<id>.scope`, `libpod-<id>.scope`, or `/docker/<id>`, `/kubepods/.../<id>`.
pub fn container_id(cgroup: &str) -> Option<&str> {
    cgroup.rsplit('/').find_map(|component| {
        let component = component.strip_suffix(".scope").unwrap_or(component);
        let id = component.rsplit(['-', ':']).next()?;
        (id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit())).then_some(id)
    })
}

/// A `/proc/PID/stat` line split at its name: `(name, fields from the state on)`. The name is
/// in parentheses and may itself hold spaces and parentheses, so it ends at the last `)`.
pub fn split_stat(stat: &str) -> Option<(&str, &str)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    Some((stat.get(open + 1..close)?, stat.get(close + 1..)?.trim_start()))
}

/// A process's or thread's name now, from `/proc/<id>/comm`.
pub fn comm_of(id: u32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{id}/comm"))
        .ok()
        .map(|s| s.trim_end().to_string())
}

/// The threads of a process, so per-thread programs (sched) see those started before the run.
pub fn threads_of(pid: u32) -> Vec<u32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|dir| {
            dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_ids_from_cgroup_paths() {
        let id = "3f4e8a1b2c3d4e5f60718293a4b5c6d7e8f90123456789abcdef0123456789ab";
        for path in [
            format!("/system.slice/docker-{id}.scope"),
            format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice/cri-containerd-{id}.scope"),
            format!("/docker/{id}"),
            format!("/machine.slice/libpod-{id}.scope/container"),
            format!("/kubepods/besteffort/pod1/crio-{id}.scope"),
        ] {
            assert_eq!(container_id(&path), Some(id), "{path}");
        }
        assert_eq!(container_id("/user.slice/user-0.slice/session-3.scope"), None);
        assert_eq!(
            cgroup_v2("0::/system.slice/sshd.service\n"),
            Some("/system.slice/sshd.service".into())
        );
    }
}
