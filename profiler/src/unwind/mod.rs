//! Table-based unwinding, user-space half: each file's compact unwind rows (`rows`), shared per
//! file, written into the BPF row array and given back when no process can map the file any
//! more (`placed`); and per process the executable mappings the BPF walker searches.
mod placed;
mod rows;

use std::{
    collections::HashSet,
    fs::File,
    os::fd::{AsFd as _, AsRawFd as _},
    path::Path,
    time::Instant,
};

use anyhow::Context as _;
use aya::maps::{HashMap as BpfHashMap, Map, MapData};
use profiler_common::unwind::{Mapping, ProcessMappings, Row, MAX_MAPPINGS, ROWS, VERSION_UNKEPT};
use rows::rows_of_file;
pub use rows::{bias_of, fde_ranges, rows_of, segments_of, Segment, TableError};

use crate::{
    process::{map_open, FileIdentity, MapsLine},
    python::{Interpreter, Layout},
};
pub use placed::FileWithRows;
use placed::{FileKey, FileRows, FileTable};
use profiler_common::python::PyProcess;

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

    /// Processes that have exited: files no remaining process maps give their rows back once
    /// idle for `IDLE_KEPT`, so a machine that sees new binaries for weeks (deploys) does not
    /// fill the array. The kernel side dropped these processes' mappings at exit, so nothing
    /// walks those rows until a process that maps the file again is given them.
    pub fn forget(&mut self, pids: &HashSet<u32>) {
        self.placed.forget(pids, Instant::now());
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
                (0, VDSO) => Some(VDSO_KEY),
                (0, _) => None,
                (inode, _) => Some((line.dev, inode)),
            };
            // (A file this load uses already was checked at its first line.)
            if let Some(key) = key.filter(|key| line.inode != 0 && !keys.contains(key)) {
                let path = line.map_files_path(pid);
                self.placed
                    .drop_if_replaced(&key, || FileIdentity::at(Path::new(&path)));
            }
            if let Some(key) = key.filter(|key| !self.placed.files.contains_key(key)) {
                if let Some(file) = self.read_file(pid, line, &keys) {
                    parsed += 1;
                    self.placed.files.insert(key, file);
                }
            }
            keys.extend(key);
            let file = key.and_then(|key| self.placed.files.get(&key));
            let placed = file.and_then(|file| {
                let (first_row, rows) = file.rows.clone().ok()?;
                Some((
                    bias_of(&file.segments, line.start, line.file_offset)?,
                    first_row,
                    rows,
                ))
            });
            let (bias, first_row, rows) = placed.unwrap_or((0, 0, 0));
            if let Some(file) = file.filter(|_| python.is_none()) {
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
            Some((interpreter, _)) => {
                self.retire_version(pid);
                (self.interpreters.insert(pid, interpreter, 0))
                    .with_context(|| format!("giving the unwinder the Python interpreter of pid {pid}"))
            }
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

    /// `pid`'s mappings as given, under `VERSION_UNKEPT`, before its interpreter is given: an
    /// off-CPU walk kept under the version before (`StackReuse`, walked without this interpreter)
    /// is not taken again, and none walked until the mappings that follow the interpreter is kept.
    /// (Only an entry still there: one the kernel removed at an exec stays removed.)
    fn retire_version(&mut self, pid: u32) {
        if let Ok(mut value) = self.processes.get(&pid, 0) {
            value.version = VERSION_UNKEPT;
            let _ = self.processes.insert(pid, value, BPF_EXIST);
        }
    }

    /// Read and parse a mapping's file (through the process, so it is the file it mapped) and
    /// place its rows. None when it cannot be read now (the process may be gone): not cached.
    /// Rows are never taken from the files of `this_load` (kept idle until now, and already
    /// given to this process's mappings).
    fn read_file(&mut self, pid: u32, line: &MapsLine, this_load: &HashSet<FileKey>) -> Option<FileTable> {
        let (mapped, handle);
        let data: &[u8] = match line.path.as_str() {
            VDSO => {
                handle = None;
                &crate::process::own_vdso()?.image
            }
            _ => {
                let file = File::open(line.map_files_path(pid))
                    .or_else(|_| File::open(&line.path))
                    .ok()?;
                mapped = map_open(&file).ok()?;
                handle = Some(file);
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
                .place(&rows, this_load)
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
            identity: handle.as_ref().and_then(FileIdentity::of),
            handle,
            users: 0,
            idle_since: None,
        })
    }

    fn place(&mut self, rows: &[Row], this_load: &HashSet<FileKey>) -> Option<(u32, u32)> {
        let len = u32::try_from(rows.len()).ok()?;
        let first = self.placed.take(len, this_load)?;
        self.rows.write(first as usize, rows);
        Some((first, len))
    }
}

const VDSO: &str = "[vdso]";
/// The vDSO's key among files (no file has inode 0).
const VDSO_KEY: FileKey = (0, 0);
/// `bpf_map_update_elem`'s flag: only an entry that exists.
const BPF_EXIST: u64 = 2;

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
