//! bpfprof's debuginfod cache: `<dir>/<hex>/debuginfo` for a file fetched and checked,
//! `<dir>/<hex>/miss` for a build id no server had (its mtime says when), `<dir>/.part-*` while a
//! download runs. The files' total size is bounded: the least recently used go first (a lookup
//! touches the file it answers with). Its own layout, not debuginfod-find's (which is
//! "deliberately undocumented").
use std::{
    fs, io,
    os::unix::fs::{DirBuilderExt as _, MetadataExt as _, OpenOptionsExt as _},
    path::{Path, PathBuf},
    time::{Duration, Instant, SystemTime},
};

use tempfile::NamedTempFile;

const DEBUGINFO: &str = "debuginfo";
const MISS: &str = "miss";
const PART: &str = ".part-";

/// A download's leftover older than this is from a run that died: removed by `trim`.
const STALE_PART: Duration = Duration::from_secs(3600);

/// `$BPFPROF_CACHE/debuginfod`; else `/var/cache/bpfprof/debuginfod` for root; else
/// `$XDG_CACHE_HOME/bpfprof/debuginfod` (`~/.cache` when unset); never a shared directory
/// such as /tmp (`None` when none of these is set).
pub(super) fn default_dir(var: &impl Fn(&str) -> Option<String>) -> Option<PathBuf> {
    default_dir_for(var, nix::unistd::geteuid().is_root())
}

pub(super) fn default_dir_for(var: &impl Fn(&str) -> Option<String>, root: bool) -> Option<PathBuf> {
    let set = |name| var(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    let root = match set("BPFPROF_CACHE") {
        Some(dir) => dir,
        None if root => PathBuf::from("/var/cache/bpfprof"),
        None => set("XDG_CACHE_HOME")
            .filter(|d| d.is_absolute())
            .or_else(|| set("HOME").map(|h| h.join(".cache")))?
            .join("bpfprof"),
    };
    Some(root.join("debuginfod"))
}

/// Refused unless `dir` is a directory (not a symlink) of this user that no one else may write:
/// what is in it is handed to the symbolizer as trusted.
fn check_private(dir: &Path) -> io::Result<()> {
    let meta = fs::symlink_metadata(dir)?;
    let euid = nix::unistd::geteuid().as_raw();
    let why = if !meta.is_dir() {
        "not a directory"
    } else if meta.uid() != euid {
        "owned by another user"
    } else if meta.mode() & 0o022 != 0 {
        "writable by others than its owner"
    } else {
        return Ok(());
    };
    Err(io::Error::other(why))
}

/// `dir/name` made a directory if missing; an existing symlink there is refused.
fn subdir(dir: &Path, name: &str) -> io::Result<PathBuf> {
    let path = dir.join(name);
    match fs::DirBuilder::new().mode(0o700).create(&path) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
        _ => {}
    }
    match fs::symlink_metadata(&path)?.is_dir() {
        true => Ok(path),
        false => Err(io::Error::other(format!("{} is not a directory", path.display()))),
    }
}

pub(super) struct Cache {
    dir: PathBuf,
    max: u64,
    miss_ttl: Duration,
}

impl Cache {
    /// The cache in `dir`, made if missing (readable by its owner only: the files came from
    /// processes of every user).
    pub(super) fn open(dir: &Path, max: u64, miss_ttl: Duration) -> io::Result<Cache> {
        fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
        check_private(dir)?;
        Ok(Cache {
            dir: dir.to_path_buf(),
            max,
            miss_ttl,
        })
    }

    /// The cached file of this build id, touched; `None` if there is none.
    pub(super) fn ready(&self, hex: &str) -> Option<PathBuf> {
        let path = self.dir.join(hex).join(DEBUGINFO);
        touch(&path).then_some(path)
    }

    /// Until when a miss recorded on disk for this build id stands, if it does.
    pub(super) fn missed(&self, hex: &str) -> Option<Instant> {
        let since = fs::metadata(self.dir.join(hex).join(MISS))
            .ok()?
            .modified()
            .ok()?;
        let age = SystemTime::now().duration_since(since).unwrap_or_default();
        let left = self.miss_ttl.checked_sub(age).filter(|d| !d.is_zero())?;
        Some(Instant::now() + left)
    }

    /// Remember on disk that no server had this build id (so the next run does not ask).
    pub(super) fn remember_miss(&self, hex: &str) {
        let made = subdir(&self.dir, hex).and_then(|dir| {
            fs::File::options()
                .write(true)
                .create(true)
                .truncate(true)
                .custom_flags(libc::O_NOFOLLOW)
                .open(dir.join(MISS))
        });
        if let Err(e) = made {
            log::debug!("debuginfod cache: cannot record the miss of {hex}: {e}");
        }
    }

    /// A file for a download, in the cache's directory (so keeping it is a rename).
    pub(super) fn part(&self) -> io::Result<NamedTempFile> {
        tempfile::Builder::new().prefix(PART).tempfile_in(&self.dir)
    }

    /// Move a checked download in place as the build id's file.
    pub(super) fn keep(&self, part: NamedTempFile, hex: &str) -> io::Result<PathBuf> {
        let dir = subdir(&self.dir, hex)?;
        let path = dir.join(DEBUGINFO);
        part.persist(&path).map_err(|e| e.error)?;
        touch(&path);
        let _ = fs::remove_file(dir.join(MISS));
        Ok(path)
    }

    /// Bring the cache within its size, least recently used files first (never `keep`), drop
    /// expired misses and stale partial downloads; the bytes left.
    pub(super) fn trim(&self, keep: Option<&Path>) -> u64 {
        let mut files = self.scan();
        files.sort_by_key(|f| f.used);
        let mut total: u64 = files.iter().map(|f| f.size).sum();
        for file in files {
            if total <= self.max {
                break;
            }
            if Some(file.path.as_path()) == keep {
                continue;
            }
            match fs::remove_file(&file.path) {
                Ok(()) => {
                    total -= file.size;
                    let _ = fs::remove_dir(file.path.parent().unwrap_or(&self.dir));
                }
                Err(e) => log::debug!("debuginfod cache: cannot evict {}: {e}", file.path.display()),
            }
        }
        total
    }

    /// The cached files, with their sizes and last use; expired misses and stale parts removed.
    fn scan(&self) -> Vec<Cached> {
        let mut files = Vec::new();
        for entry in fs::read_dir(&self.dir).into_iter().flatten().flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            let path = entry.path();
            if name.starts_with(PART) {
                if older_than(&path, STALE_PART) {
                    let _ = fs::remove_file(&path);
                }
                continue;
            }
            let own_dir = entry.file_type().is_ok_and(|t| t.is_dir());
            if name.is_empty() || !name.bytes().all(|b| b.is_ascii_hexdigit()) || !own_dir {
                continue;
            }
            if older_than(&path.join(MISS), self.miss_ttl) {
                let _ = fs::remove_file(path.join(MISS));
                let _ = fs::remove_dir(&path);
            }
            let file = path.join(DEBUGINFO);
            if let Ok(meta) = fs::symlink_metadata(&file) {
                let used = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
                files.push(Cached {
                    path: file,
                    size: meta.len(),
                    used,
                });
            }
        }
        files
    }
}

struct Cached {
    path: PathBuf,
    size: u64,
    used: SystemTime,
}

fn older_than(path: &Path, age: Duration) -> bool {
    fs::symlink_metadata(path)
        .and_then(|m| m.modified())
        .is_ok_and(|t| SystemTime::now().duration_since(t).unwrap_or_default() > age)
}

/// Mark a cached file as just used (its mtime is its last use); false if it is gone or not a
/// file of its own (a symlink there is not followed).
pub(super) fn touch(path: &Path) -> bool {
    fs::File::options()
        .append(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .and_then(|f| match f.metadata()?.is_file() {
            true => Ok(f),
            false => Err(io::Error::other("not a file")),
        })
        .and_then(|f| f.set_modified(SystemTime::now()))
        .is_ok()
}
