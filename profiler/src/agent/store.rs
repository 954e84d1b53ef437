//! Windows on the box: each written whole or not at all (temporary file, synced, renamed), and
//! retention by count and by bytes, oldest first, including windows a previous run left.
use std::{
    collections::VecDeque,
    io::{self, Write as _},
    path::{Path, PathBuf},
};

use crate::{error::UserError, output::write_atomically};

const PREFIX: &str = "window-";
const SUFFIX: &str = ".pb.gz";

pub struct Store {
    dir: PathBuf,
    keep: usize,
    max_bytes: u64,
    /// Oldest first, with their sizes.
    windows: VecDeque<(PathBuf, u64)>,
    bytes: u64,
}

impl Store {
    /// The directory, created if need be and proven writable, with what it already holds
    /// trimmed to the retention.
    pub fn open(dir: &Path, keep: usize, max_bytes: u64) -> Result<Store, UserError> {
        let fail = |reason: String| UserError::OutputDir {
            path: dir.to_path_buf(),
            reason,
        };
        if keep == 0 {
            return Err(UserError::Usage(
                "--keep 0 would keep no window: give at least 1".into(),
            ));
        }
        std::fs::create_dir_all(dir).map_err(|e| fail(e.to_string()))?;
        let probe = dir.join(format!(".bpfprof-probe-{}", std::process::id()));
        std::fs::File::create(&probe)
            .and_then(|mut f| f.write_all(b"probe"))
            .map_err(|e| fail(e.to_string()))?;
        let _ = std::fs::remove_file(&probe);
        let mut existing: Vec<(PathBuf, u64)> = std::fs::read_dir(dir)
            .map_err(|e| fail(e.to_string()))?
            .filter_map(|entry| {
                let entry = entry.ok()?;
                let name = entry.file_name().into_string().ok()?;
                if !(name.starts_with(PREFIX) && name.ends_with(SUFFIX)) {
                    return None;
                }
                Some((entry.path(), entry.metadata().ok()?.len()))
            })
            .collect();
        // Names carry a fixed-width timestamp: name order is time order.
        existing.sort();
        let mut store = Store {
            dir: dir.to_path_buf(),
            keep,
            max_bytes,
            bytes: existing.iter().map(|(_, n)| n).sum(),
            windows: existing.into(),
        };
        store.prune();
        Ok(store)
    }

    /// Write one window (started at `unix_ms`), then drop the oldest beyond the retention.
    pub fn write(&mut self, unix_ms: u64, bytes: &[u8]) -> io::Result<PathBuf> {
        let mut path = self.dir.join(format!("{PREFIX}{unix_ms:013}{SUFFIX}"));
        let mut n = 1;
        while path.exists() {
            path = self.dir.join(format!("{PREFIX}{unix_ms:013}.{n}{SUFFIX}"));
            n += 1;
        }
        write_atomically(&path, &|out| out.write_all(bytes))?;
        self.windows.push_back((path.clone(), bytes.len() as u64));
        self.bytes += bytes.len() as u64;
        self.prune();
        Ok(path)
    }

    fn prune(&mut self) {
        while self.windows.len() > self.keep || self.bytes > self.max_bytes {
            let Some((path, size)) = self.windows.pop_front() else {
                break;
            };
            if let Err(e) = std::fs::remove_file(&path) {
                if e.kind() != io::ErrorKind::NotFound {
                    log::warn!("removing old window {}: {e}", path.display());
                }
            }
            self.bytes -= size;
        }
    }

    pub fn windows(&self) -> usize {
        self.windows.len()
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("bpfprof-store-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    fn listed(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn retention_by_count_and_bytes_keeps_the_newest() {
        let dir = dir("retention");
        let mut store = Store::open(&dir, 3, 1000).unwrap();
        for ms in 1..=5u64 {
            store.write(ms, &[0u8; 100]).unwrap();
        }
        assert_eq!(
            listed(&dir),
            [
                "window-0000000000003.pb.gz",
                "window-0000000000004.pb.gz",
                "window-0000000000005.pb.gz"
            ]
        );
        store.write(6, &[0u8; 950]).unwrap();
        assert_eq!(listed(&dir), ["window-0000000000006.pb.gz"], "bytes bound");
        assert_eq!(store.bytes(), 950);
        // Another run of the agent finds them and applies its own retention.
        std::fs::write(dir.join("unrelated.txt"), "x").unwrap();
        let store = Store::open(&dir, 1, 100).unwrap();
        assert_eq!(store.windows(), 0);
        assert_eq!(listed(&dir), ["unrelated.txt"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn unusable_directories_are_refused_with_the_reason() {
        let err = Store::open(Path::new("/proc/version/windows"), 3, 1000)
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("/proc/version/windows") && err.contains("--output-dir"),
            "{err}"
        );
        assert!(Store::open(&dir("zero"), 0, 1000).is_err());
    }
}
