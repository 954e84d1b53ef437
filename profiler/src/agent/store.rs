//! Windows on the box: each file written whole or not at all (temporary file, synced, renamed),
//! and retention by count and by bytes, oldest window first (with every signal's file of it),
//! including windows a previous run left.
use std::{
    collections::VecDeque,
    io::{self, Write as _},
    path::{Path, PathBuf},
};

use crate::{error::UserError, output::write_atomically};

const PREFIX: &str = "window-";
const SUFFIX: &str = ".pb.gz";
/// Digits of the start time in a window's name (unix ms, fixed width: name order is time order).
const TIME_DIGITS: usize = 13;

pub struct Store {
    dir: PathBuf,
    keep: usize,
    max_bytes: u64,
    /// Oldest first: each window's files and their total size.
    windows: VecDeque<(Vec<PathBuf>, u64)>,
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
        let mut existing: Vec<(String, PathBuf, u64)> = std::fs::read_dir(dir)
            .map_err(|e| fail(e.to_string()))?
            .filter_map(|entry| {
                let entry = entry.ok()?;
                let name = entry.file_name().into_string().ok()?;
                if !(name.starts_with(PREFIX) && name.ends_with(SUFFIX)) {
                    return None;
                }
                let time = name.get(PREFIX.len()..PREFIX.len() + TIME_DIGITS)?.to_string();
                Some((time, entry.path(), entry.metadata().ok()?.len()))
            })
            .collect();
        existing.sort();
        let mut windows: VecDeque<(Vec<PathBuf>, u64)> = VecDeque::new();
        let mut last_time = None;
        for (time, path, size) in existing {
            match windows.back_mut() {
                Some((paths, bytes)) if last_time.as_ref() == Some(&time) => {
                    paths.push(path);
                    *bytes += size;
                }
                _ => windows.push_back((vec![path], size)),
            }
            last_time = Some(time);
        }
        let mut store = Store {
            dir: dir.to_path_buf(),
            keep,
            max_bytes,
            bytes: windows.iter().map(|(_, n)| n).sum(),
            windows,
        };
        store.prune();
        Ok(store)
    }

    /// Write one window (started at `unix_ms`): a file per signal, `window-<ms>.pb.gz` for the
    /// unnamed one (CPU) and `window-<ms>.<name>.pb.gz` for the others; then drop the oldest
    /// windows beyond the retention. Returns the files written.
    pub fn write(&mut self, unix_ms: u64, files: &[(Option<&str>, &[u8])]) -> io::Result<Vec<PathBuf>> {
        let mut base = format!("{PREFIX}{unix_ms:0w$}", w = TIME_DIGITS);
        let mut n = 1;
        while self.dir.join(format!("{base}{SUFFIX}")).exists() {
            base = format!("{PREFIX}{unix_ms:0w$}.{n}", w = TIME_DIGITS);
            n += 1;
        }
        let mut written = Vec::with_capacity(files.len());
        let mut size = 0;
        for (name, bytes) in files {
            let path = match name {
                None => self.dir.join(format!("{base}{SUFFIX}")),
                Some(name) => self.dir.join(format!("{base}.{name}{SUFFIX}")),
            };
            let result = write_atomically(&path, &|out| out.write_all(bytes));
            if let Err(e) = result {
                // Nothing half-kept: the window's other files go too.
                for path in &written {
                    let _ = std::fs::remove_file(path);
                }
                return Err(e);
            }
            written.push(path);
            size += bytes.len() as u64;
        }
        self.windows.push_back((written.clone(), size));
        self.bytes += size;
        self.prune();
        Ok(written)
    }

    fn prune(&mut self) {
        while self.windows.len() > self.keep || self.bytes > self.max_bytes {
            let Some((paths, size)) = self.windows.pop_front() else {
                break;
            };
            for path in paths {
                if let Err(e) = std::fs::remove_file(&path) {
                    if e.kind() != io::ErrorKind::NotFound {
                        log::warn!("removing old window {}: {e}", path.display());
                    }
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
            store.write(ms, &[(None, &[0u8; 100])]).unwrap();
        }
        assert_eq!(
            listed(&dir),
            [
                "window-0000000000003.pb.gz",
                "window-0000000000004.pb.gz",
                "window-0000000000005.pb.gz"
            ]
        );
        store
            .write(6, &[(None, &[0u8; 900]), (Some("offcpu"), &[0u8; 50])])
            .unwrap();
        assert_eq!(
            listed(&dir),
            ["window-0000000000006.offcpu.pb.gz", "window-0000000000006.pb.gz"],
            "bytes bound: a window's files go together"
        );
        assert_eq!(store.bytes(), 950);
        let store = Store::open(&dir, 1, 1000).unwrap();
        assert_eq!(
            (store.windows(), store.bytes()),
            (1, 950),
            "one window of two files"
        );
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
