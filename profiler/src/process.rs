//! What symbolization needs from a process, captured while it is alive: its executable mappings,
//! and an open handle on every mapped file (so a process that exits, or a binary that is
//! replaced on disk, still symbolizes). Files are shared by (device, inode), not per pid.
use std::{collections::HashMap, fs::File, io, os::fd::AsRawFd, path::PathBuf};

/// Index into [`Processes::files`].
pub type FileId = u32;

/// A user-space address, resolved against the memory map of its process at collection time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum UserAddr {
    /// In a mapped file: `offset` is the file offset, what blazesym resolves against the ELF.
    File { file: FileId, offset: u64, addr: u64 },
    /// In the vDSO.
    Vdso { addr: u64 },
    /// In anonymous executable memory (JIT code, trampolines).
    Anon { addr: u64 },
    /// In no executable mapping known for the process (it exited before it could be captured).
    Unmapped { addr: u64 },
}

impl UserAddr {
    pub fn addr(&self) -> u64 {
        match *self {
            UserAddr::File { addr, .. }
            | UserAddr::Vdso { addr }
            | UserAddr::Anon { addr }
            | UserAddr::Unmapped { addr } => addr,
        }
    }
}

#[derive(Debug)]
pub struct MappedFile {
    /// The path as the process saw it (may be in another mount namespace, or deleted).
    pub path: String,
    /// Open via `/proc/<pid>/map_files`, so it stays readable whatever happens to the path.
    handle: Option<File>,
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

/// One line of `/proc/<pid>/maps`, executable mappings only.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapsLine {
    pub start: u64,
    pub end: u64,
    pub file_offset: u64,
    pub dev: String,
    pub inode: u64,
    pub path: String,
}

/// Parse the executable mappings out of a `/proc/<pid>/maps` text.
pub fn parse_maps(text: &str) -> Vec<MapsLine> {
    text.lines().filter_map(parse_maps_line).collect()
}

fn parse_maps_line(line: &str) -> Option<MapsLine> {
    let mut fields = line.splitn(6, ' ');
    let range = fields.next()?;
    let perms = fields.next()?;
    let offset = fields.next()?;
    let dev = fields.next()?;
    let inode = fields.next()?;
    let path = fields.next().unwrap_or("").trim_start().to_string();
    if !perms.contains('x') {
        return None;
    }
    let (start, end) = range.split_once('-')?;
    Some(MapsLine {
        start: u64::from_str_radix(start, 16).ok()?,
        end: u64::from_str_radix(end, 16).ok()?,
        file_offset: u64::from_str_radix(offset, 16).ok()?,
        dev: dev.to_string(),
        inode: inode.parse().ok()?,
        path,
    })
}

/// A process's or thread's name now, from `/proc/<id>/comm`.
pub fn comm_of(id: u32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{id}/comm"))
        .ok()
        .map(|s| s.trim_end().to_string())
}

/// Memory maps of every process seen in the run, and the files they map.
#[derive(Debug, Default)]
pub struct Processes {
    /// Per (pid, exec generation): a process that execs maps another image, and its samples
    /// from before are resolved against the map they were taken in.
    maps: HashMap<(u32, u32), Vec<Mapping>>,
    /// Process names (`/proc/<pid>/comm`), captured with the maps.
    names: HashMap<u32, String>,
    files: Vec<MappedFile>,
    file_ids: HashMap<(String, u64), FileId>,
    /// With `record_captures`: the maps captured since `take_captured` (for the unwinder).
    captured: Option<Vec<(u32, Vec<MapsLine>)>>,
    captured_at: HashMap<u32, std::time::Instant>,
    generations: Option<Generations>,
}

/// Where a process's current exec generation is read (the kernel's count; none: always 0).
pub struct Generations(Box<dyn Fn(u32) -> u32>);

impl std::fmt::Debug for Generations {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Generations")
    }
}

/// `refresh` reads a process's map at most this often: a pc that stays outside every mapping
/// (code bpfprof cannot see the mapping of) must not turn into a `/proc` read per sample.
const REFRESH_INTERVAL: std::time::Duration = std::time::Duration::from_millis(250);

impl Processes {
    pub fn new() -> Self {
        Self::default()
    }

    /// Label captures with the exec generation `current` reads for a pid.
    pub fn with_generations(&mut self, current: impl Fn(u32) -> u32 + 'static) {
        self.generations = Some(Generations(Box::new(current)));
    }

    fn generation(&self, pid: u32) -> u32 {
        self.generations.as_ref().map_or(0, |current| (current.0)(pid))
    }

    /// Read the process's executable mappings and open its files. Fails if it is gone.
    pub fn capture(&mut self, pid: u32) -> io::Result<()> {
        // The generation read on both sides of the map: equal, the map belongs to it (an exec
        // in between would have changed it).
        let (mut text, mut generation) = (String::new(), 0);
        for _ in 0..3 {
            let before = self.generation(pid);
            text = std::fs::read_to_string(format!("/proc/{pid}/maps"))?;
            generation = self.generation(pid);
            if before == generation {
                break;
            }
        }
        if let Some(comm) = comm_of(pid) {
            self.names.insert(pid, comm);
        }
        let lines = parse_maps(&text);
        self.captured_at.insert(pid, std::time::Instant::now());
        if let Some(captured) = &mut self.captured {
            captured.push((pid, lines.clone()));
        }
        self.install((pid, generation), lines, true);
        Ok(())
    }

    /// Capture again because its map seems to have changed (an address outside it), unless it
    /// was captured moments ago.
    pub fn refresh(&mut self, pid: u32) -> io::Result<()> {
        match self.captured_at.get(&pid) {
            Some(at) if at.elapsed() < REFRESH_INTERVAL => Ok(()),
            _ => self.capture(pid),
        }
    }

    /// Capture the process again (see `refresh`) when a stack of one of its images falls
    /// outside that image's known map: it may have loaded a library since.
    pub fn refresh_unless_covered(&mut self, pid: u32, generation: u32, addrs: &[u64]) -> io::Result<()> {
        match self.covers(pid, generation, addrs) {
            true => Ok(()),
            false => self.refresh(pid),
        }
    }

    /// Keep each capture's mappings until `take_captured`.
    pub fn record_captures(&mut self) {
        self.captured.get_or_insert_with(Vec::new);
    }

    /// The mappings captured since the last call.
    pub fn take_captured(&mut self) -> Vec<(u32, Vec<MapsLine>)> {
        self.captured.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// Install a memory map without reading `/proc` (replay and tests).
    pub fn insert_maps(&mut self, pid: u32, lines: Vec<MapsLine>) {
        self.install((pid, 0), lines, false);
    }

    /// Record the mappings of `pid` in one exec generation; with `open_files`, open each new
    /// file through the process.
    fn install(&mut self, (pid, generation): (u32, u32), lines: Vec<MapsLine>, open_files: bool) {
        let mappings = lines
            .into_iter()
            .map(|line| {
                let region = match open_files {
                    true => self.region_for(pid, &line),
                    false => self.region_for_path(&line, None),
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
        let opener = || File::open(format!("/proc/{pid}/map_files/{:x}-{:x}", line.start, line.end));
        self.region_for_path(line, Some(&opener))
    }

    fn region_for_path(&mut self, line: &MapsLine, open: Option<&dyn Fn() -> io::Result<File>>) -> Region {
        if line.path == "[vdso]" {
            return Region::Vdso;
        }
        if line.inode == 0 || !line.path.starts_with('/') {
            return Region::Anon;
        }
        let key = (line.dev.clone(), line.inode);
        if let Some(&id) = self.file_ids.get(&key) {
            return Region::File(id);
        }
        let handle = open.and_then(|open| open().ok());
        let id = self.files.len() as FileId;
        self.files.push(MappedFile {
            path: line.path.clone(),
            handle,
        });
        self.file_ids.insert(key, id);
        Region::File(id)
    }

    pub fn is_known(&self, pid: u32) -> bool {
        self.maps.keys().any(|&(known, _)| known == pid)
    }

    pub fn name(&self, pid: u32) -> Option<&str> {
        self.names.get(&pid).map(String::as_str)
    }

    pub fn file(&self, id: FileId) -> &MappedFile {
        &self.files[id as usize]
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

    /// Whether every address falls in a known executable mapping of the process's image.
    pub fn covers(&self, pid: u32, generation: u32, addrs: &[u64]) -> bool {
        match self.maps.get(&(pid, generation)) {
            Some(maps) => addrs.iter().all(|&a| find(maps, a).is_some()),
            None => false,
        }
    }

    /// Resolve an address of `pid` against the memory map captured of its image then.
    pub fn normalize(&self, pid: u32, generation: u32, addr: u64) -> UserAddr {
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
            Region::Vdso => UserAddr::Vdso { addr },
            Region::Anon => UserAddr::Anon { addr },
        }
    }
}

fn find(maps: &[Mapping], addr: u64) -> Option<&Mapping> {
    maps.iter().find(|m| m.start <= addr && addr < m.end)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
55d0c0a00000-55d0c0a01000 r--p 00000000 fd:01 1234 /usr/bin/prog
55d0c0a01000-55d0c0a05000 r-xp 00001000 fd:01 1234 /usr/bin/prog
7f0000000000-7f0000100000 r-xp 00028000 fd:01 99 /usr/lib/x86_64-linux-gnu/libc.so.6
7f0000200000-7f0000201000 rwxp 00000000 00:00 0 
7ffd00000000-7ffd00002000 r-xp 00000000 00:00 0                          [vdso]
7ffd10000000-7ffd10002000 rw-p 00000000 00:00 0                          [stack]
";

    #[test]
    fn parses_executable_mappings_only() {
        let lines = parse_maps(MAPS);
        assert_eq!(lines.len(), 4);
        assert_eq!(lines[0].start, 0x55d0c0a01000);
        assert_eq!(lines[0].file_offset, 0x1000);
        assert_eq!(lines[0].path, "/usr/bin/prog");
        assert_eq!(lines[2].path, "");
        assert_eq!(lines[3].path, "[vdso]");
    }

    #[test]
    fn normalizes_to_file_offsets_and_shares_files() {
        let mut procs = Processes::new();
        procs.insert_maps(10, parse_maps(MAPS));
        procs.insert_maps(11, parse_maps(MAPS));
        assert_eq!(procs.file_count(), 2, "files are shared across processes");
        match procs.normalize(10, 0, 0x55d0c0a01234) {
            UserAddr::File { offset, .. } => assert_eq!(offset, 0x1234),
            other => panic!("{other:?}"),
        }
        match procs.normalize(11, 0, 0x7f0000000010) {
            UserAddr::File { file, offset, .. } => {
                assert_eq!(offset, 0x28010);
                assert!(procs.file(file).path.ends_with("libc.so.6"));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            procs.normalize(10, 0, 0x7f0000200010),
            UserAddr::Anon { addr: 0x7f0000200010 }
        );
        assert_eq!(
            procs.normalize(10, 0, 0x7ffd00000010),
            UserAddr::Vdso { addr: 0x7ffd00000010 }
        );
        assert_eq!(
            procs.normalize(10, 0, 0x1000),
            UserAddr::Unmapped { addr: 0x1000 }
        );
        assert_eq!(
            procs.normalize(99, 0, 0x55d0c0a01234),
            UserAddr::Unmapped { addr: 0x55d0c0a01234 }
        );
        assert!(procs.covers(10, 0, &[0x55d0c0a01234, 0x7f0000000010]));
        assert!(!procs.covers(10, 0, &[0x1000]));
    }

    #[test]
    fn captures_own_process() {
        let mut procs = Processes::new();
        procs.capture(std::process::id()).unwrap();
        let here = captures_own_process as *const () as u64;
        assert!(matches!(
            procs.normalize(std::process::id(), 0, here),
            UserAddr::File { .. }
        ));
        assert!(procs.capture(u32::MAX - 1).is_err());
    }
}
