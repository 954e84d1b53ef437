//! Who a process is, read from `/proc` while it is alive: its name, executable and cgroup (what
//! labels its samples), and its threads.

use profiler_common::FileId;

use super::proc_dir::LazyDir;

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

/// What the kernel said of a process as it announced it with its labels
/// (`ProcessEvent::labels`): what of them need not be read from `/proc`.
#[derive(Clone, Debug, Default)]
pub struct Announced {
    /// Its name, where the kernel said it.
    pub comm: Option<String>,
    /// Its cgroup's id (0: not said).
    pub cgroup_id: u64,
    /// The exec generation it was announced in: its name and executable are another image's
    /// once it has exec'd again.
    pub generation: u32,
    /// Its executable file, where the kernel said it (all 0: it has none, a kernel thread).
    pub executable: Option<FileId>,
}

impl Announced {
    /// Whether the kernel said all of its labels (then they are its image `generation`'s).
    pub fn complete(&self) -> bool {
        self.comm.is_some() && self.executable.is_some()
    }
}

/// What labels are kept from one process to the next: paths by cgroup and by executable file.
#[derive(Debug, Default)]
pub struct LabelPaths {
    cgroups: CgroupPaths,
    exes: ExePaths,
}

impl LabelPaths {
    /// Whether the path of the executable the kernel said is kept.
    pub(super) fn knows_executable(&self, said: &Announced) -> bool {
        said.executable
            .is_some_and(|id| id == FileId::default() || self.exes.knows(id))
    }
}

impl ProcessInfo {
    /// Read from `/proc` through the process's directory.
    pub(super) fn read_in(dir: &LazyDir) -> Option<ProcessInfo> {
        Self::read_announced(dir, &Announced::default(), &mut LabelPaths::default())
    }

    /// The same, taking what the kernel said and the paths kept.
    pub(super) fn read_announced(
        dir: &LazyDir,
        said: &Announced,
        kept: &mut LabelPaths,
    ) -> Option<ProcessInfo> {
        let comm = match &said.comm {
            Some(comm) => comm.clone(),
            None => dir.get()?.read("comm").ok()?.trim_end().to_string(),
        };
        Some(ProcessInfo {
            comm,
            executable: match said.executable {
                Some(id) => kept.exes.path(id, dir),
                None => dir.get().and_then(|dir| dir.read_link("exe").ok()),
            },
            cgroup: kept.cgroups.path(said.cgroup_id, dir),
        })
    }

    /// The container this process runs in, where its cgroup says (Docker, containerd, CRI-O,
    /// Podman: a 64-hex-digit id in one of the path's components).
    pub fn container_id(&self) -> Option<&str> {
        container_id(self.cgroup.as_deref()?)
    }
}

/// cgroup v2 paths by the kernel's id of the cgroup, which a process announced for its labels
/// carries: each cgroup's path read once, not once per process (the costliest of the labels to
/// read: the kernel takes the cgroup lock to write it). Kept only where the path read names the
/// cgroup of that id (its directory's inode under the cgroup2 mount is the id), since a process
/// may have moved since it was announced. Ids are never reused while the kernel runs.
#[derive(Debug, Default)]
pub struct CgroupPaths(std::collections::HashMap<u64, Option<String>>);

/// Where the cgroup2 hierarchy is mounted: systemd's place, or its place beside cgroup v1's
/// controllers (the hybrid layout). None: nowhere known, and no path is kept.
fn cgroup2_mount() -> Option<&'static str> {
    use nix::sys::statfs::{statfs, CGROUP2_SUPER_MAGIC};
    static MOUNT: std::sync::OnceLock<Option<&str>> = std::sync::OnceLock::new();
    *MOUNT.get_or_init(|| {
        ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
            .into_iter()
            .find(|dir| statfs(*dir).is_ok_and(|fs| fs.filesystem_type() == CGROUP2_SUPER_MAGIC))
    })
}

/// Cgroups whose paths are kept before the cache starts afresh.
const CGROUPS_KEPT: usize = 4096;

impl CgroupPaths {
    fn path(&mut self, id: u64, dir: &LazyDir) -> Option<String> {
        if let Some(path) = self.0.get(&id).filter(|_| id != 0) {
            return path.clone();
        }
        let path = cgroup_v2(&dir.get()?.read("cgroup").ok()?);
        let names_id = |path: &str| {
            use std::os::unix::fs::MetadataExt as _;
            cgroup2_mount()
                .is_some_and(|mount| std::fs::metadata(format!("{mount}{path}")).is_ok_and(|m| m.ino() == id))
        };
        if id != 0 && path.as_deref().is_some_and(names_id) {
            if self.0.len() >= CGROUPS_KEPT {
                self.0.clear();
            }
            self.0.insert(id, path.clone());
        }
        path
    }
}

/// Executables' paths by the kernel's identity of the file (`FileId`), which a process announced
/// with its labels carries: each path read once a minute, from a process found running the file,
/// not once per process (a build machine starts the same few compilers all day). Kept only where
/// the file read is the one the kernel named (`ProcDir::executable`: not after an exec in
/// between, nor where the filesystem's `stat` speaks of another inode number). A file
/// reached by several paths (hard links, bind mounts) is named by the one read; a file renamed
/// or deleted since, by its old path for at most `EXE_PATH_KEPT_FOR`.
#[derive(Debug, Default)]
struct ExePaths(std::collections::HashMap<FileId, (String, std::time::Instant)>);

/// Executables whose paths are kept before the cache starts afresh.
const EXES_KEPT: usize = 4096;
/// How long a path read is taken for the file's later processes.
const EXE_PATH_KEPT_FOR: std::time::Duration = std::time::Duration::from_secs(60);

impl ExePaths {
    /// The path read for the file within `EXE_PATH_KEPT_FOR`.
    fn fresh(&self, id: FileId) -> Option<&String> {
        self.0
            .get(&id)
            .filter(|(_, at)| at.elapsed() < EXE_PATH_KEPT_FOR)
            .map(|(path, _)| path)
    }

    fn knows(&self, id: FileId) -> bool {
        self.fresh(id).is_some()
    }

    fn path(&mut self, id: FileId, dir: &LazyDir) -> Option<String> {
        if id == FileId::default() {
            return None;
        }
        if let Some(path) = self.fresh(id) {
            return Some(path.clone());
        }
        // Read again where it can be (the file renamed since?); else what was read.
        let Some(dir) = dir.get() else {
            return self.0.get(&id).map(|(path, _)| path.clone());
        };
        let (path, same) = dir.executable(id).ok()?;
        if same {
            if self.0.len() >= EXES_KEPT {
                self.0.clear();
            }
            self.0.insert(id, (path.clone(), std::time::Instant::now()));
        }
        Some(path)
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
    super::read_proc(&format!("/proc/{id}/comm"))
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

    #[test]
    fn a_cgroups_path_is_kept_by_its_id_only_where_the_path_names_that_cgroup() {
        use std::os::unix::fs::MetadataExt as _;
        let dir = LazyDir::new(std::process::id());
        let own = cgroup_v2(&std::fs::read_to_string("/proc/self/cgroup").unwrap()).unwrap();
        let Some(mount) = cgroup2_mount() else {
            // Without a cgroup2 mount nothing is kept: each path is read.
            let mut paths = CgroupPaths::default();
            assert_eq!(paths.path(1, &dir), Some(own));
            assert!(paths.0.is_empty());
            return;
        };
        let id = std::fs::metadata(format!("{mount}{own}")).unwrap().ino();
        let mut paths = CgroupPaths::default();
        // An id the path read does not name (the process moved since it was announced): its
        // path is the one read, and not kept under that id.
        assert_eq!(paths.path(id + 1, &dir), Some(own.clone()));
        assert!(paths.0.is_empty());
        assert_eq!(paths.path(id, &dir), Some(own.clone()));
        assert_eq!(paths.0.get(&id), Some(&Some(own.clone())));
        // Kept: answered without reading (a directory of a process gone reads nothing).
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let gone = LazyDir::from(super::super::ProcDir::open(child.id()).unwrap());
        child.wait().unwrap();
        assert_eq!(paths.path(id, &gone), Some(own));
        assert_eq!(paths.path(id + 1, &gone), None);
        // Not said (0): read every time.
        assert_eq!(paths.path(0, &gone), None);
    }
}
