//! Table-based unwinding, user-space half: each file's compact unwind rows (`rows`), shared per
//! file, written into the BPF row array and given back when no process maps the file any more;
//! and per process the executable mappings the BPF walker searches.
mod rows;

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    os::fd::{AsFd as _, AsRawFd as _},
    path::Path,
};

use anyhow::Context as _;
use aya::maps::{HashMap as BpfHashMap, Map, MapData};
use profiler_common::unwind::{Mapping, ProcessMappings, Row, MAX_MAPPINGS, ROWS};
use rows::rows_of_file;
pub use rows::{bias_of, fde_ranges, rows_of, segments_of, Segment, TableError};

use crate::{
    process::{map_file, MapsLine},
    python::{Interpreter, Layout},
};
use profiler_common::python::PyProcess;

/// What the walker needs of one file, read and parsed once.
struct FileTable {
    /// The path it was first mapped from (what `/debug/unwind` shows).
    path: String,
    /// Its rows' place in the row array, or why it has none.
    rows: Result<(u32, u32), String>,
    segments: Vec<Segment>,
    /// The Python interpreter the file is, if the walker reads its frames.
    python: Option<Interpreter>,
    /// Processes given this file's rows; at zero its rows go back to `RowSpace`.
    users: usize,
}

/// A file by (device, inode); the vDSO and anonymous code by name.
type FileKey = (String, u64);

/// One file's share of the row array.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileWithRows {
    /// As `/proc/PID/maps` gives it (`major:minor`, hex); `[vdso]` for the vDSO.
    pub device: String,
    pub inode: u64,
    pub path: String,
    pub rows: u32,
    /// Processes its rows were given to.
    pub processes: usize,
}

/// Which rows of the shared array are in use. A file's rows are one run; they are taken
/// first-fit from runs freed by files no process maps any more, else from the untouched tail.
/// Freed neighbours merge (and a free run that reaches the tail shrinks it), so a long run's
/// churn of binaries does not leave the array in slivers too small for the next file.
#[derive(Debug)]
struct RowSpace {
    /// Free runs below `tail`: start -> length.
    free: BTreeMap<u32, u32>,
    tail: u32,
    capacity: u32,
}

impl RowSpace {
    fn new(capacity: u32) -> Self {
        Self {
            free: BTreeMap::new(),
            tail: 0,
            capacity,
        }
    }

    fn take(&mut self, len: u32) -> Option<u32> {
        if len == 0 {
            return Some(0);
        }
        let fit = self
            .free
            .iter()
            .find(|&(_, &free)| free >= len)
            .map(|(&at, &free)| (at, free));
        if let Some((at, free)) = fit {
            self.free.remove(&at);
            if free > len {
                self.free.insert(at + len, free - len);
            }
            return Some(at);
        }
        let end = self.tail.checked_add(len).filter(|&end| end <= self.capacity)?;
        let at = self.tail;
        self.tail = end;
        Some(at)
    }

    fn give_back(&mut self, mut at: u32, mut len: u32) {
        if len == 0 {
            return;
        }
        if let Some((&before, &before_len)) = self.free.range(..at).next_back() {
            if before + before_len == at {
                self.free.remove(&before);
                at = before;
                len += before_len;
            }
        }
        if let Some(after_len) = self.free.remove(&(at + len)) {
            len += after_len;
        }
        if at + len == self.tail {
            self.tail = at;
        } else {
            self.free.insert(at, len);
        }
    }

    fn used(&self) -> u32 {
        self.tail - self.free.values().sum::<u32>()
    }
}

/// Which files have rows, where, and which processes use them: the bookkeeping that lets rows
/// of files no process maps any more go back to `RowSpace`.
struct FileRows {
    space: RowSpace,
    files: HashMap<FileKey, FileTable>,
    /// Per process, the files it was given (counted in their `users`).
    uses: HashMap<u32, HashSet<FileKey>>,
}

impl FileRows {
    fn new(capacity: u32) -> Self {
        Self {
            space: RowSpace::new(capacity),
            files: HashMap::new(),
            uses: HashMap::new(),
        }
    }

    /// Count `pid` as a user of the files it maps now (and no longer of those it mapped before
    /// an exec). Only files already in `files` are counted, so counts and `uses` agree.
    fn set_uses(&mut self, pid: u32, keys: HashSet<FileKey>) {
        let keys: HashSet<FileKey> = keys.into_iter().filter(|k| self.files.contains_key(k)).collect();
        let before = self.uses.insert(pid, keys.clone()).unwrap_or_default();
        for key in keys.difference(&before) {
            if let Some(file) = self.files.get_mut(key) {
                file.users += 1;
            }
        }
        for key in before.difference(&keys) {
            self.unuse(key);
        }
    }

    fn forget(&mut self, pids: &HashSet<u32>) {
        for pid in pids {
            for key in self.uses.remove(pid).unwrap_or_default() {
                self.unuse(&key);
            }
        }
    }

    /// The files whose rows are in the array, most rows first: which binaries hold it.
    fn files_with_rows(&self) -> Vec<FileWithRows> {
        let mut files: Vec<FileWithRows> = self
            .files
            .iter()
            .filter_map(|((device, inode), file)| {
                let &(_, rows) = file.rows.as_ref().ok()?;
                Some(FileWithRows {
                    device: device.clone(),
                    inode: *inode,
                    path: file.path.clone(),
                    rows,
                    processes: file.users,
                })
            })
            .collect();
        files.sort_by(|a, b| b.rows.cmp(&a.rows).then_with(|| a.path.cmp(&b.path)));
        files
    }

    fn unuse(&mut self, key: &FileKey) {
        let Some(file) = self.files.get_mut(key) else {
            return;
        };
        file.users = file.users.saturating_sub(1);
        if file.users == 0 {
            if let Some(FileTable {
                rows: Ok((at, len)), ..
            }) = self.files.remove(key)
            {
                self.space.give_back(at, len);
            }
        }
    }
}

/// The BPF side's tables: one row array for all files (mapped into our memory, so a whole
/// table is one copy), and per process its executable mappings.
pub struct Tables {
    rows: RowArray,
    processes: BpfHashMap<MapData, u32, ProcessMappings>,
    interpreters: BpfHashMap<MapData, u32, PyProcess>,
    placed: FileRows,
    /// The last `ProcessMappings::version` given (each value given gets the next).
    version: u64,
}

impl Tables {
    pub fn new(rows: Map, processes: Map, interpreters: Map) -> anyhow::Result<Tables> {
        let Map::Array(rows) = rows else {
            anyhow::bail!("the unwind row map is not an array");
        };
        Ok(Tables {
            rows: RowArray::map(rows)?,
            processes: BpfHashMap::try_from(processes)?,
            interpreters: BpfHashMap::try_from(interpreters)?,
            placed: FileRows::new(ROWS),
            version: 0,
        })
    }

    /// Rows of the shared array in use, of `ROWS`.
    pub fn rows_used(&self) -> u32 {
        self.placed.space.used()
    }

    /// Processes that have exited: files no remaining process maps give their rows back, so a
    /// machine that sees new binaries for weeks (deploys) does not fill the array. The kernel
    /// side dropped these processes' mappings at exit, so nothing walks those rows any more.
    pub fn forget(&mut self, pids: &HashSet<u32>) {
        self.placed.forget(pids);
    }

    /// The files whose rows are in the array, most rows first: which binaries hold it.
    pub fn files_with_rows(&self) -> Vec<FileWithRows> {
        self.placed.files_with_rows()
    }

    /// Executables and libraries seen without a usable table (walked with frame pointers), as
    /// "path: why", sorted.
    pub fn files_without_tables(&self) -> Vec<String> {
        let mut named: Vec<String> = self
            .placed
            .files
            .values()
            .filter_map(|f| f.rows.as_ref().err().map(|why| format!("{}: {why}", f.path)))
            .collect();
        named.sort();
        named
    }

    /// Give the BPF walker `pid`'s executable mappings and their files' tables (built once per
    /// file). A file without usable tables is walked with frame pointers; says which, once.
    /// Every executable mapping is listed, with or without a table (anonymous code: JIT), so
    /// that a pc outside all of them means the map changed (see `ProcessMappings::missed`).
    /// Returns the layout of the Python interpreter it runs, if the walker reads its frames.
    pub fn load_process(&mut self, pid: u32, maps: &[MapsLine]) -> anyhow::Result<Option<Layout>> {
        let started = std::time::Instant::now();
        let mut parsed = 0;
        let mut mappings = Vec::new();
        let mut python = None;
        let mut keys = HashSet::new();
        for line in maps {
            let key = match (line.inode, line.path.as_str()) {
                (0, VDSO) => (VDSO.to_string(), 0),
                (0, _) => (String::new(), 0),
                (inode, _) => (line.dev.clone(), inode),
            };
            if !self.placed.files.contains_key(&key) && !key.0.is_empty() {
                if let Some(file) = self.read_file(pid, line) {
                    parsed += 1;
                    self.placed.files.insert(key.clone(), file);
                }
            }
            if !key.0.is_empty() {
                keys.insert(key.clone());
            }
            let placed = self.placed.files.get(&key).and_then(|file| {
                let (first_row, rows) = file.rows.clone().ok()?;
                Some((
                    bias_of(&file.segments, line.start, line.file_offset)?,
                    first_row,
                    rows,
                ))
            });
            let (bias, first_row, rows) = placed.unwrap_or((0, 0, 0));
            if let Some(file) = self.placed.files.get(&key).filter(|_| python.is_none()) {
                python = (file.python).and_then(|found| {
                    Some((interpreter_at(pid, &found, &file.segments, line)?, found.layout))
                });
            }
            mappings.push(Mapping {
                start: line.start,
                end: line.end,
                bias,
                first_row,
                rows,
            });
        }
        self.placed.set_uses(pid, keys);
        mappings.sort_by_key(|m| m.start);
        if mappings.len() > MAX_MAPPINGS {
            log::info!(
                "pid {pid}: {} executable mappings, the unwinder takes the first {MAX_MAPPINGS}",
                mappings.len()
            );
            mappings.truncate(MAX_MAPPINGS);
        }
        self.version += 1;
        let mut value = ProcessMappings {
            count: mappings.len() as u32,
            missed: 0,
            version: self.version,
            mappings: [Mapping::default(); MAX_MAPPINGS],
        };
        value.mappings[..mappings.len()].copy_from_slice(&mappings);
        let given = match &python {
            Some((interpreter, _)) => (self.interpreters.insert(pid, interpreter, 0))
                .with_context(|| format!("giving the unwinder the Python interpreter of pid {pid}")),
            None => {
                let _ = self.interpreters.remove(&pid);
                Ok(())
            }
        }
        .and_then(|()| {
            (self.processes.insert(pid, value, 0))
                .with_context(|| format!("giving the unwinder the mappings of pid {pid}"))
        });
        if let Err(e) = given {
            // The rows of files it no longer maps are free already: its old mappings must not
            // stay (walked with frame pointers until it is given again).
            let _ = self.processes.remove(&pid);
            return Err(e);
        }
        log::debug!(
            "pid {pid}: {} executable mappings given to the unwinder in {:.1} ms ({parsed} files parsed)",
            mappings.len(),
            started.elapsed().as_secs_f64() * 1e3
        );
        Ok(python.map(|(_, layout)| layout))
    }

    /// Read and parse a mapping's file (through the process, so it is the file it mapped) and
    /// place its rows. None when it cannot be read now (the process may be gone): not cached.
    fn read_file(&mut self, pid: u32, line: &MapsLine) -> Option<FileTable> {
        let mapped;
        let data: &[u8] = match line.path.as_str() {
            VDSO => &crate::process::own_vdso()?.image,
            _ => {
                let path = line.map_files_path(pid);
                mapped = map_file(Path::new(&path))
                    .or_else(|_| map_file(Path::new(&line.path)))
                    .ok()?;
                &mapped
            }
        };
        let (rows, segments, python) = match object::File::parse(data) {
            Ok(file) => (
                rows_of_file(&file),
                segments_of(&file),
                python_of(&file, &line.path),
            ),
            Err(e) => (Err(e.into()), Vec::new(), None),
        };
        let rows = match rows {
            Ok(rows) => self
                .place(&rows)
                .ok_or_else(|| "the unwind row array is full".to_string()),
            Err(e) => Err(e.to_string()),
        };
        if let Err(reason) = &rows {
            log::info!("{}: no unwind table ({reason}): frame pointers there", line.path);
        }
        Some(FileTable {
            path: line.path.clone(),
            rows,
            segments,
            python,
            users: 0,
        })
    }

    fn place(&mut self, rows: &[Row]) -> Option<(u32, u32)> {
        let len = u32::try_from(rows.len()).ok()?;
        let first = self.placed.space.take(len)?;
        self.rows.write(first as usize, rows);
        Some((first, len))
    }
}

const VDSO: &str = "[vdso]";

/// The interpreter `file` is, if its frames are read; one that is not is said once, here (each
/// file is read once).
fn python_of(file: &object::File, path: &str) -> Option<Interpreter> {
    match Interpreter::of(file)? {
        Ok(found) => {
            log::debug!(
                "{path}: Python {}.{}, its frames read",
                found.layout.version.0,
                found.layout.version.1
            );
            Some(found)
        }
        Err(why) => {
            log::warn!("{path}: {why}");
            None
        }
    }
}

/// The interpreter as `pid` maps it by `line` (its file's addresses moved by the mapping's
/// bias), with the process's pid namespace.
fn interpreter_at(pid: u32, found: &Interpreter, segments: &[Segment], line: &MapsLine) -> Option<PyProcess> {
    use std::os::unix::fs::MetadataExt as _;
    let bias = bias_of(segments, line.start, line.file_offset)?;
    let namespace = std::fs::metadata(format!("/proc/{pid}/ns/pid")).ok();
    Some(PyProcess {
        eval_start: found.eval_start.wrapping_add(bias),
        eval_end: found.eval_end.wrapping_add(bias),
        runtime: found.runtime.wrapping_add(bias),
        pidns_dev: namespace.as_ref().map_or(0, |m| m.dev()),
        pidns_ino: namespace.as_ref().map_or(0, |m| m.ino()),
        offsets: found.layout.walker,
    })
}

/// The BPF row array, mapped into this process (`BPF_F_MMAPABLE`).
struct RowArray {
    _map: MapData,
    base: *mut Row,
    len: usize,
}

impl RowArray {
    fn map(map: MapData) -> anyhow::Result<RowArray> {
        let len = ROWS as usize;
        let bytes = (len * std::mem::size_of::<Row>()).next_multiple_of(4096);
        let fd = map.fd().as_fd().as_raw_fd();
        // SAFETY: maps the array's value area, which the kernel sized for `ROWS` rows.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error()).context("mapping the unwind row array");
        }
        Ok(RowArray {
            _map: map,
            base: base.cast(),
            len,
        })
    }

    fn write(&mut self, at: usize, rows: &[Row]) {
        assert!(at + rows.len() <= self.len);
        // SAFETY: within the mapping (checked above); BPF only reads rows of files already
        // published through a process's mappings, which happens after this copy.
        unsafe { std::ptr::copy_nonoverlapping(rows.as_ptr(), self.base.add(at), rows.len()) };
    }
}

impl Drop for RowArray {
    fn drop(&mut self) {
        let bytes = (self.len * std::mem::size_of::<Row>()).next_multiple_of(4096);
        // SAFETY: unmapping exactly what `map` mapped.
        unsafe { libc::munmap(self.base.cast(), bytes) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freed_rows_are_taken_again_and_neighbours_merge() {
        let mut space = RowSpace::new(100);
        let a = space.take(30).unwrap();
        let b = space.take(30).unwrap();
        let c = space.take(30).unwrap();
        assert_eq!((a, b, c), (0, 30, 60));
        assert_eq!(space.take(11), None, "10 rows left at the tail");
        space.give_back(a, 30);
        assert_eq!(space.take(20), Some(0), "first fit, in the freed run");
        assert_eq!(space.used(), 80);
        space.give_back(b, 30);
        // The rest of the first run (20..30) and b's run (30..60) are one run now.
        assert_eq!(space.take(40), Some(20));
        space.give_back(c, 30);
        space.give_back(20, 40);
        space.give_back(0, 20);
        assert_eq!(space.used(), 0);
        assert_eq!(space.tail, 0, "everything freed: the tail went back to the start");
        assert!(space.free.is_empty());
        assert_eq!(space.take(100), Some(0), "the whole array in one run again");
    }

    /// Against a model that knows every row: runs never overlap, and a request fails only when
    /// no free stretch of that length exists anywhere (merging keeps free runs whole).
    #[test]
    fn row_space_agrees_with_a_row_by_row_model() {
        const CAPACITY: u32 = 64;
        let mut space = RowSpace::new(CAPACITY);
        let mut model = [false; CAPACITY as usize];
        let mut held: Vec<(u32, u32)> = Vec::new();
        let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for _ in 0..20_000 {
            if held.is_empty() || next(2) == 0 {
                let len = 1 + next(16) as u32;
                let fits = model.windows(len as usize).any(|w| w.iter().all(|used| !used));
                match space.take(len) {
                    Some(at) => {
                        for used in &mut model[at as usize..(at + len) as usize] {
                            assert!(!*used, "row {at}+{len} handed out twice");
                            *used = true;
                        }
                        held.push((at, len));
                    }
                    None => assert!(!fits, "{len} free rows in a row exist, yet refused"),
                }
            } else {
                let (at, len) = held.swap_remove(next(held.len() as u64) as usize);
                space.give_back(at, len);
                model[at as usize..(at + len) as usize].fill(false);
            }
            assert_eq!(space.used() as usize, model.iter().filter(|&&u| u).count());
        }
    }

    fn file_with_rows(placed: &mut FileRows, name: &str, len: u32) -> FileKey {
        let at = placed.space.take(len).unwrap();
        let key = (name.to_string(), 1);
        placed.files.insert(
            key.clone(),
            FileTable {
                path: name.to_string(),
                rows: Ok((at, len)),
                segments: Vec::new(),
                python: None,
                users: 0,
            },
        );
        key
    }

    #[test]
    fn a_files_rows_are_freed_when_its_last_process_is_forgotten_or_execs() {
        let mut placed = FileRows::new(1000);
        let libc = file_with_rows(&mut placed, "libc", 100);
        let app = file_with_rows(&mut placed, "app", 200);
        placed.set_uses(10, HashSet::from([libc.clone(), app.clone()]));
        placed.set_uses(11, HashSet::from([libc.clone(), app.clone()]));
        assert_eq!(placed.space.used(), 300);

        placed.forget(&HashSet::from([10]));
        assert_eq!(placed.space.used(), 300, "pid 11 still maps both");

        // pid 11 execs something that maps libc only: app has no user left.
        let other = file_with_rows(&mut placed, "other", 50);
        placed.set_uses(11, HashSet::from([libc.clone(), other.clone()]));
        assert!(!placed.files.contains_key(&app));
        assert_eq!(placed.space.used(), 150);
        // The same pid loaded again (a map change) counts each file once.
        placed.set_uses(11, HashSet::from([libc.clone(), other.clone()]));
        assert_eq!(placed.files[&libc].users, 1);

        // A file without rows, or one never read, is not counted and frees nothing.
        placed.set_uses(12, HashSet::from([libc.clone(), ("unread".to_string(), 9)]));
        assert_eq!(placed.uses[&12].len(), 1);

        let listed: Vec<(String, u32, usize)> = placed
            .files_with_rows()
            .into_iter()
            .map(|f| (f.path, f.rows, f.processes))
            .collect();
        assert_eq!(
            listed,
            [("libc".to_string(), 100, 2), ("other".to_string(), 50, 1)],
            "most rows first, with their users"
        );

        placed.forget(&HashSet::from([11, 12, 99]));
        assert!(placed.files.is_empty());
        assert!(placed.files_with_rows().is_empty());
        assert_eq!(placed.space.used(), 0);
    }
}
