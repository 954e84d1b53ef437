//! What symbolization needs from a process, captured while it is alive: its executable mappings,
//! and an open handle on every mapped file (so a process that exits, or a binary that is
//! replaced on disk, still symbolizes). Files are shared by (device, inode), not per pid; what
//! belongs to processes that exited can be forgotten (`forget`), so a long run stays bounded.
use std::{
    collections::{HashMap, HashSet},
    fs::File,
    io,
    os::{fd::AsRawFd, unix::fs::MetadataExt as _},
    path::PathBuf,
    sync::Arc,
};

mod capture;
mod info;
mod maps;
mod perf_map;
mod proc_dir;
mod section;
mod vdso;

pub use section::{section_data, SectionError};
use vdso::same_vdso;
pub use vdso::{own_vdso, OwnVdso};

use capture::Lately;
use info::LabelPaths;
pub use info::{comm_of, container_id, split_stat, threads_of, Announced, ProcessInfo};
pub use maps::{exec_mappings, parse_maps, MapsLine};
pub use perf_map::{JitMaps, JitNames, JitSymbol, PerfMap};
pub use proc_dir::{read_proc, ProcDir};
use profiler_common::{
    python::py_frame_parts,
    unwind::{is_address, truncation},
};

/// Index into [`Processes::files`].
pub type FileId = u32;

/// A user-space address, resolved against the memory map of its process at collection time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum UserAddr {
    /// In a mapped file: `offset` is the file offset, what blazesym resolves against the ELF.
    File { file: FileId, offset: u64, addr: u64 },
    /// In the vDSO: `offset` from its start, where every 64-bit process's vDSO (the same image)
    /// has the same code.
    Vdso { offset: u64, addr: u64 },
    /// In anonymous executable memory (JIT code, trampolines) no perf map names.
    Anon { addr: u64 },
    /// In a function of JIT code its runtime's perf map names (`JitNames`' `symbol`).
    Jit { symbol: u32, addr: u64 },
    /// In no executable mapping known for the process (it exited before it could be captured).
    Unmapped { addr: u64 },
    /// Where the walk stopped at its depth: the outermost frames are missing (the truncation
    /// slot, which says how many where that is known).
    Truncated { slot: u64 },
}

impl UserAddr {
    pub fn addr(&self) -> u64 {
        match *self {
            UserAddr::File { addr, .. }
            | UserAddr::Vdso { addr, .. }
            | UserAddr::Anon { addr }
            | UserAddr::Jit { addr, .. }
            | UserAddr::Unmapped { addr } => addr,
            UserAddr::Truncated { slot } => slot,
        }
    }
}

/// A GNU build ID as the kernel reports it: zero-padded to 20 bytes.
pub type BuildId = [u8; 20];

/// A user frame the kernel resolved itself, from the memory map at the moment of the sample:
/// which file (by build ID) and where in it. What symbolizes a process gone before its map was
/// read, when another process maps the same file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ObjectOffset {
    pub build_id: BuildId,
    pub offset: u64,
}

/// The build ID of an ELF file, read through its open handle (only the headers and the note).
pub(crate) fn build_id_of(file: &File) -> Option<BuildId> {
    let id = build_id_bytes(file)?;
    let mut padded = [0; 20];
    let n = id.len().min(20);
    padded[..n].copy_from_slice(&id[..n]);
    Some(padded)
}

/// The build ID of an ELF file as it is written (any length), through its open handle.
pub(crate) fn build_id_bytes(file: &File) -> Option<Vec<u8>> {
    let cache = object::ReadCache::new(file);
    elf_build_id(&object::File::parse(&cache).ok()?)
}

/// The build ID of a parsed ELF file, if it has a non-empty one.
pub(crate) fn elf_build_id<'d, R: object::ReadRef<'d>>(elf: &object::File<'d, R>) -> Option<Vec<u8>> {
    let id = object::Object::build_id(elf).ok()??;
    (!id.is_empty()).then(|| id.to_vec())
}

#[derive(Clone, Debug)]
pub struct MappedFile {
    /// The path as the process saw it (may be in another mount namespace, or deleted).
    pub path: String,
    /// Open via `/proc/<pid>/map_files`, so it stays readable whatever happens to the path.
    /// Shared, so a symbolization pass elsewhere keeps it open after the process is forgotten.
    handle: Option<Arc<File>>,
    /// Which file this is, across processes and runs: what caches of its symbols are keyed by.
    pub identity: Option<FileIdentity>,
}

/// A file's content identity as far as the file system says: a file replaced on disk (upgrade)
/// gets another inode or mtime, so symbols cached for the old one are never used for the new.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FileIdentity {
    pub dev: u64,
    pub inode: u64,
    pub size: u64,
    pub mtime_ns: i64,
}

impl FileIdentity {
    pub(crate) fn of(file: &File) -> Option<FileIdentity> {
        Some(Self::from_metadata(&file.metadata().ok()?))
    }

    /// The identity of the file at `path` now (following a link: a `map_files` entry names
    /// the file mapped).
    pub(crate) fn at(path: &std::path::Path) -> Option<FileIdentity> {
        Some(Self::from_metadata(&std::fs::metadata(path).ok()?))
    }

    fn from_metadata(meta: &std::fs::Metadata) -> FileIdentity {
        FileIdentity {
            dev: meta.dev(),
            inode: meta.ino(),
            size: meta.size(),
            mtime_ns: meta.mtime() * 1_000_000_000 + meta.mtime_nsec(),
        }
    }
}

/// Where a symbolizer finds the files a profile's addresses point into, and the JIT functions.
pub trait FileTable {
    fn file(&self, id: FileId) -> Option<&MappedFile>;
    fn jit(&self, symbol: u32) -> Option<JitSymbol>;
}

/// The files one profile needs, taken out of `Processes` so that it can be symbolized elsewhere
/// (another thread) while the processes go on being tracked and forgotten.
#[derive(Clone, Debug, Default)]
pub struct FileSnapshot(HashMap<FileId, MappedFile>, JitNames);

impl FileTable for FileSnapshot {
    fn file(&self, id: FileId) -> Option<&MappedFile> {
        self.0.get(&id)
    }

    fn jit(&self, symbol: u32) -> Option<JitSymbol> {
        self.1.get(symbol)
    }
}

impl MappedFile {
    /// Where the symbolizer should read the file.
    pub fn read_path(&self) -> PathBuf {
        match &self.handle {
            Some(file) => PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd())),
            None => PathBuf::from(&self.path),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Region {
    File(FileId),
    Vdso,
    Anon,
}

#[derive(Clone, Debug)]
struct Mapping {
    start: u64,
    end: u64,
    file_offset: u64,
    region: Region,
}

/// Memory maps of every process seen in the run, and the files they map.
#[derive(Debug, Default)]
pub struct Processes {
    /// Per (pid, exec generation): a process that execs maps another image, and its samples
    /// from before are resolved against the map they were taken in.
    maps: HashMap<(u32, u32), Vec<Mapping>>,
    /// Process names, executables and cgroups, captured with the maps, and the exec generation
    /// read with them (not read again when the same image maps more: a loader mapping
    /// libraries is captured again and again, and who the process is did not change).
    info: HashMap<u32, (u32, ProcessInfo)>,
    files: HashMap<FileId, MappedFile>,
    file_ids: HashMap<(u64, u64), FileId>,
    /// The open files by build ID, for frames the kernel resolved (see `ObjectOffset`).
    /// None: two files claim the id (one of them lies), and such frames stay unnamed.
    by_build_id: HashMap<BuildId, Option<FileId>>,
    next_file: FileId,
    /// With `record_captures`: the maps captured since `take_captured` (for the unwinder).
    captured: Option<Vec<(u32, u32, Vec<MapsLine>)>>,
    captured_at: HashMap<u32, std::time::Instant>,
    /// Processes a capture found gone lately: their stacks still in the maps do not each try
    /// again (a `/proc` open and a map lookup apiece, every drain, under churn).
    gone: Lately,
    /// Processes labelled lately (`label`), with the image they run now: a process announced
    /// for its labels on its way through `execve` and again after it is read once.
    labelled: Lately,
    /// Paths of cgroups and executables, read once each.
    kept: LabelPaths,
    generations: Option<Generations>,
    /// The targets' perf maps: names of their JIT code.
    jit: JitMaps,
    python: crate::python::PyCodes,
}

/// Where a process's current exec generation is read (the kernel's count; none: always 0).
pub struct Generations(Box<dyn Fn(u32) -> u32>);

impl std::fmt::Debug for Generations {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Generations")
    }
}

impl Processes {
    pub fn new() -> Self {
        Self::default()
    }

    /// Label captures with the exec generation `current` reads for a pid.
    pub fn with_generations(&mut self, current: impl Fn(u32) -> u32 + 'static) {
        self.generations = Some(Generations(Box::new(current)));
    }

    pub fn current_generation(&self, pid: u32) -> u32 {
        self.generations.as_ref().map_or(0, |current| (current.0)(pid))
    }

    fn install_captured(&mut self, pid: u32, generation: u32, lines: Vec<MapsLine>) {
        self.captured_at.insert(pid, std::time::Instant::now());
        // JIT code: its perf map opened while the process is there to be asked for it.
        if lines.iter().any(|l| l.inode == 0 && !l.path.starts_with('[')) {
            self.jit.refresh(pid);
        }
        self.install((pid, generation), &lines, true);
        if let Some(captured) = &mut self.captured {
            captured.push((pid, generation, lines));
        }
    }

    /// `lines` map what `installed` maps: the same ranges of the same files.
    fn same_map(&self, installed: &[Mapping], lines: &[MapsLine]) -> bool {
        installed.len() == lines.len()
            && installed.iter().zip(lines).all(|(m, line)| {
                let file = self.file_ids.get(&(line.dev, line.inode)).copied();
                (m.start, m.end, m.file_offset) == (line.start, line.end, line.file_offset)
                    && match m.region {
                        Region::File(id) => file == Some(id),
                        Region::Vdso | Region::Anon => file.is_none(),
                    }
            })
    }

    /// Keep each capture's mappings until `take_captured`.
    pub fn record_captures(&mut self) {
        self.captured.get_or_insert_with(Vec::new);
    }

    /// The mappings captured since the last call: each process's latest, and only while its
    /// image is the one they were read from. An earlier capture, or one read just before an
    /// exec (a command announced on its way into `execve` is still a copy of bpfprof), would
    /// have the unwinder parse files the process no longer maps while its samples wait; the
    /// exec's own announcement brings the new map.
    pub fn take_captured(&mut self) -> Vec<(u32, Vec<MapsLine>)> {
        let captured = self.captured.as_mut().map(std::mem::take).unwrap_or_default();
        let mut taken = HashSet::new();
        let mut latest: Vec<_> = captured
            .into_iter()
            .rev()
            .filter(|(pid, generation, _)| taken.insert(*pid) && *generation == self.current_generation(*pid))
            .map(|(pid, _, lines)| (pid, lines))
            .collect();
        latest.reverse();
        latest
    }

    /// Install a memory map without reading `/proc` (replay and tests).
    pub fn insert_maps(&mut self, pid: u32, lines: Vec<MapsLine>) {
        self.install((pid, 0), &lines, false);
    }

    /// Record the mappings of `pid` in one exec generation; with `open_files`, open each new
    /// file through the process.
    fn install(&mut self, (pid, generation): (u32, u32), lines: &[MapsLine], open_files: bool) {
        let mappings = lines
            .iter()
            .map(|line| {
                let region = match open_files {
                    true => self.region_for(pid, line),
                    false => self.region_for_path(line, None),
                };
                Mapping {
                    start: line.start,
                    end: line.end,
                    file_offset: line.file_offset,
                    region,
                }
            })
            .collect();
        self.maps.insert((pid, generation), mappings);
    }

    fn region_for(&mut self, pid: u32, line: &MapsLine) -> Region {
        if line.path == "[vdso]" && !same_vdso(pid, line.start) {
            return Region::Anon;
        }
        let opener = || File::open(line.map_files_path(pid));
        self.region_for_path(line, Some(&opener))
    }

    fn region_for_path(&mut self, line: &MapsLine, open: Option<&dyn Fn() -> io::Result<File>>) -> Region {
        if line.path == "[vdso]" {
            return Region::Vdso;
        }
        if line.inode == 0 || !line.path.starts_with('/') {
            return Region::Anon;
        }
        let key = (line.dev, line.inode);
        if let Some(&id) = self.file_ids.get(&key) {
            return Region::File(id);
        }
        let handle = open.and_then(|open| open().ok());
        let id = self.next_file;
        self.next_file = self.next_file.wrapping_add(1);
        if let Some(build_id) = handle.as_ref().and_then(build_id_of) {
            let claimed = self.by_build_id.entry(build_id).or_insert(Some(id));
            if *claimed != Some(id) {
                *claimed = None;
            }
        }
        self.files.insert(
            id,
            MappedFile {
                path: line.path.clone(),
                identity: handle.as_ref().and_then(FileIdentity::of),
                handle: handle.map(Arc::new),
            },
        );
        self.file_ids.insert(key, id);
        Region::File(id)
    }

    pub fn is_known(&self, pid: u32) -> bool {
        self.maps.keys().any(|&(known, _)| known == pid)
    }

    pub fn name(&self, pid: u32) -> Option<&str> {
        self.info(pid).map(|i| i.comm.as_str())
    }

    pub fn info(&self, pid: u32) -> Option<&ProcessInfo> {
        self.info.get(&pid).map(|(_, info)| info)
    }

    /// The processes known, whatever their state (captured, or only labelled).
    pub fn pids(&self) -> HashSet<u32> {
        let captured = self.maps.keys().map(|&(pid, _)| pid);
        captured.chain(self.info.keys().copied()).collect()
    }

    /// Forget processes (every image of each), then the files no process left maps: their
    /// handles close. Profiles already aggregated keep their file ids; symbolize them from a
    /// `snapshot` taken before.
    pub fn forget(&mut self, pids: &HashSet<u32>) {
        self.jit.forget(pids);
        self.python.forget(pids);
        self.maps.retain(|(pid, _), _| !pids.contains(pid));
        self.info.retain(|pid, _| !pids.contains(pid));
        self.captured_at.retain(|pid, _| !pids.contains(pid));
        self.gone.forget(pids);
        self.labelled.forget(pids);
        let used: HashSet<FileId> = self
            .maps
            .values()
            .flatten()
            .filter_map(|m| match m.region {
                Region::File(id) => Some(id),
                _ => None,
            })
            .collect();
        self.files.retain(|id, _| used.contains(id));
        self.file_ids.retain(|_, id| used.contains(id));
        self.by_build_id
            .retain(|_, id| id.is_none_or(|id| used.contains(&id)));
    }

    /// The files `ids` name, shareable with another thread.
    pub fn snapshot(&self, ids: impl IntoIterator<Item = FileId>) -> FileSnapshot {
        FileSnapshot(
            ids.into_iter()
                .filter_map(|id| Some((id, self.files.get(&id)?.clone())))
                .collect(),
            self.jit.names(),
        )
    }

    /// The files mapped executable into one image of the process: (file, mapping start, file
    /// offset), one per mapping.
    pub fn mapped_files(&self, pid: u32, generation: u32) -> Vec<(FileId, u64, u64)> {
        let Some(maps) = self.maps.get(&(pid, generation)) else {
            return Vec::new();
        };
        maps.iter()
            .filter_map(|m| match m.region {
                Region::File(file) => Some((file, m.start, m.file_offset)),
                _ => None,
            })
            .collect()
    }

    pub fn file_count(&self) -> usize {
        self.files.len()
    }

    pub fn process_count(&self) -> usize {
        self.pids().len()
    }

    /// Whether every address falls in a known executable mapping of the process's image.
    /// (A Python frame's slot is no address: it is covered.)
    pub fn covers(&self, pid: u32, generation: u32, addrs: &[u64]) -> bool {
        match self.maps.get(&(pid, generation)) {
            Some(maps) => (addrs.iter()).all(|&a| !is_address(a) || find(maps, a).is_some()),
            None => false,
        }
    }

    /// Resolve an address of `pid` against the memory map captured of its image then.
    pub fn normalize(&self, pid: u32, generation: u32, addr: u64) -> UserAddr {
        if truncation(addr).is_some() {
            return UserAddr::Truncated { slot: addr };
        }
        if let Some((code, offset)) = py_frame_parts(addr).filter(|_| self.python.knows(pid)) {
            return self.python_frame(pid, code, offset, addr);
        }
        let Some(mapping) = self
            .maps
            .get(&(pid, generation))
            .and_then(|maps| find(maps, addr))
        else {
            return UserAddr::Unmapped { addr };
        };
        match mapping.region {
            Region::File(file) => UserAddr::File {
                file,
                offset: addr - mapping.start + mapping.file_offset,
                addr,
            },
            Region::Vdso => UserAddr::Vdso {
                offset: addr - mapping.start,
                addr,
            },
            Region::Anon => match self.jit.symbol(pid, addr) {
                Some(symbol) => UserAddr::Jit { symbol, addr },
                None => UserAddr::Anon { addr },
            },
        }
    }

    /// A Python frame: its function at its line, if its code object was read (see `PyCodes`).
    fn python_frame(&self, pid: u32, code: u64, offset: u64, addr: u64) -> UserAddr {
        let named = self.python.code(pid, code).and_then(|code| {
            self.jit.names().intern(JitSymbol {
                start: 0,
                size: 0,
                name: code.name.clone(),
                file: Some(code.file.clone()),
                line: Some(code.line(offset)),
            })
        });
        match named {
            Some(symbol) => UserAddr::Jit { symbol, addr },
            None => UserAddr::Unmapped { addr },
        }
    }

    /// A walk just put the code object at `code` in a stack of `pid`: name it while it exists.
    pub fn python_code(&mut self, pid: u32, code: u64) {
        self.python.reread(pid, code);
    }

    /// `pid` runs a Python interpreter of `layout`: the code objects in its stacks are named
    /// from its memory from now on.
    pub fn python_found(&mut self, pid: u32, layout: crate::python::Layout) {
        let generation = self.current_generation(pid);
        self.python.found(pid, generation, layout);
    }

    /// Whether `pid`'s stacks hold Python frames (see `PyCodes::knows`).
    pub fn runs_python(&self, pid: u32) -> bool {
        self.python.knows(pid)
    }

    /// A frame the kernel resolved (see `ObjectOffset`), in an open file with its build ID. The
    /// file offset is moved back as far as `addr` was from the sampled address (a caller's
    /// return address).
    pub fn resolve_object(&self, object: &ObjectOffset, addr: u64, moved_back: u64) -> Option<UserAddr> {
        let file = (*self.by_build_id.get(&object.build_id)?)?;
        Some(UserAddr::File {
            file,
            offset: object.offset.checked_sub(moved_back)?,
            addr,
        })
    }
}

impl FileTable for Processes {
    fn file(&self, id: FileId) -> Option<&MappedFile> {
        self.files.get(&id)
    }

    fn jit(&self, symbol: u32) -> Option<JitSymbol> {
        self.jit.names().get(symbol)
    }
}

fn find(maps: &[Mapping], addr: u64) -> Option<&Mapping> {
    maps.iter().find(|m| m.start <= addr && addr < m.end)
}

/// The process of a live thread (from its /proc status).
pub fn tgid_of(tid: u32) -> Option<u32> {
    let status = read_proc(&format!("/proc/{tid}/status")).ok()?;
    let tgid = status.lines().find_map(|l| l.strip_prefix("Tgid:"))?;
    tgid.trim().parse().ok()
}

/// Every process but this one (the numeric entries of /proc).
pub fn all_pids() -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    (entries.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()))
        .filter(|&pid| pid != std::process::id())
        .collect()
}

/// A file's bytes as a read-only mapping: parsing an executable touches its headers and the
/// sections wanted (unwind tables, symbols), not all of it. Read into the heap instead, a large
/// binary a process maps would be a transient heap of its size in a long-running agent.
pub fn map_file(path: &std::path::Path) -> io::Result<memmap2::Mmap> {
    map_open(&std::fs::File::open(path)?)
}

/// The same, of a file already open.
pub fn map_open(file: &File) -> io::Result<memmap2::Mmap> {
    // SAFETY: mapped read-only and private to this parse. A file truncated while mapped would
    // fault on access; the executables and libraries mapped here are mapped by running
    // processes too, and package managers replace such files (a new inode) rather than
    // truncate them.
    unsafe { memmap2::Mmap::map(file) }
}

#[cfg(test)]
mod tests;
