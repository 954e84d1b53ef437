//! Code objects named from a Python process's memory: its qualified name, its file, and the
//! line of an instruction from its location table. Read while the process is alive (when a
//! drain brings a stack holding the code object first), through `/proc/PID/mem` opened once
//! when its interpreter was found; kept per process until it is forgotten. Everything read is
//! bounded: a string's length, a line table's size, code objects per process.
use std::{
    collections::{HashMap, HashSet},
    fs::File,
    os::unix::fs::FileExt as _,
    sync::Arc,
    time::{Duration, Instant},
};

use profiler_common::python::py_frame_parts;

use super::{Layout, LineTable, BYTES_DATA, BYTES_SIZE, UNICODE_LENGTH, UNICODE_STATE};

/// A name longer than this many characters is cut.
const MAX_NAME_CHARS: u64 = 1024;
/// A line table longer than this is not read (the code object gets its first line).
const MAX_LINE_TABLE: u64 = 1 << 16;
/// Code objects kept per process; past it, new ones are not named.
const MAX_CODES: usize = 1 << 16;
/// Bytes of names and line tables kept over all processes; past it, new code objects are not
/// named (a process can make up code objects: what it makes bpfprof keep is bounded).
const MAX_BYTES: usize = 64 << 20;
/// How often a code object named is checked to be still the one at its address, when a stack
/// holds it: a freed code object's memory may hold another (a module's import-time code freed,
/// a function defined later put there), whose frames would otherwise bear the first's name.
const RECHECK: Duration = Duration::from_millis(200);

impl PyCode {
    /// What it keeps on the heap (`MAX_BYTES`).
    fn bytes(&self) -> usize {
        self.name.len() + self.file.len() + self.line_table.len() + std::mem::size_of::<PyCode>()
    }
}

/// One code object, as read.
#[derive(Debug, PartialEq, Eq)]
pub struct PyCode {
    pub name: Arc<str>,
    pub file: Arc<str>,
    pub first_line: u32,
    /// Where its qualified name's string is: with `first_line`, what tells it from another
    /// code object later at its address.
    name_at: u64,
    line_table: Box<[u8]>,
    bytecode: u16,
    lines: LineTable,
}

impl PyCode {
    /// The line of the instruction `offset` bytes into the code object (as the walker gives
    /// it); the first line where the table does not say.
    pub fn line(&self, offset: u64) -> u32 {
        if offset == profiler_common::python::PY_NO_OFFSET {
            return self.first_line;
        }
        let into_bytecode = offset.saturating_sub(self.bytecode as u64);
        match self.lines {
            LineTable::Locations => line_at(&self.line_table, self.first_line, into_bytecode / 2),
            LineTable::Pairs => line_of_pairs(&self.line_table, self.first_line, into_bytecode),
        }
        .unwrap_or(self.first_line)
    }
}

/// The line of code unit `unit` by a location table of 3.11 and later (CPython's
/// `Objects/locations.md`): entries of a first byte with the top bit set (a kind in bits 3-6,
/// code units covered less one in bits 0-2) and the bytes that follow it up to the next such.
/// Lines move by a signed varint (kinds 13 and 14), by 0-2 (kinds 10-12), or not at all; kind
/// 15 has no line.
pub fn line_at(table: &[u8], first_line: u32, unit: u64) -> Option<u32> {
    let (mut line, mut start, mut at) = (first_line as i64, 0u64, 0usize);
    while at < table.len() {
        let head = table[at];
        if head & 0x80 == 0 {
            return None;
        }
        let (kind, units) = ((head >> 3) & 15, (head & 7) as u64 + 1);
        at += 1;
        let has_line = match kind {
            15 => false,
            13 | 14 => {
                line = line.saturating_add(signed_varint(table, at)?);
                true
            }
            10..=12 => {
                line = line.saturating_add((kind - 10) as i64);
                true
            }
            _ => true,
        };
        while at < table.len() && table[at] & 0x80 == 0 {
            at += 1;
        }
        if unit < start.saturating_add(units) {
            return has_line.then(|| u32::try_from(line).ok()).flatten();
        }
        start = start.saturating_add(units);
    }
    None
}

/// The line of the instruction `offset` bytes into the bytecode by a 3.10 line table
/// (CPython's `Objects/lnotab_notes.txt`): byte pairs of the bytecode bytes a range covers and
/// the signed change of line at its start, -128 for a range without a line.
pub fn line_of_pairs(table: &[u8], first_line: u32, offset: u64) -> Option<u32> {
    let (mut line, mut end) = (first_line as i64, 0u64);
    for pair in table.chunks_exact(2) {
        let start = end;
        end = end.saturating_add(pair[0] as u64);
        let delta = pair[1] as i8;
        let has_line = delta != -128;
        if has_line {
            line = line.saturating_add(delta as i64);
        }
        if (start..end).contains(&offset) {
            return has_line.then(|| u32::try_from(line).ok()).flatten();
        }
    }
    None
}

/// A location table's signed varint at `at`: 6 bits a byte, low first, bit 6 set where more
/// follow; the lowest bit of the whole the sign.
fn signed_varint(table: &[u8], mut at: usize) -> Option<i64> {
    let (mut value, mut shift) = (0u64, 0u32);
    loop {
        let byte = *table.get(at)?;
        at += 1;
        value |= ((byte & 63) as u64) << shift;
        if byte & 64 == 0 || shift > 56 {
            break;
        }
        shift += 6;
    }
    Some(match value & 1 {
        1 => -((value >> 1) as i64),
        _ => (value >> 1) as i64,
    })
}

/// One process's interpreter (in one image: an exec starts anew) and the code objects named so
/// far.
struct Process {
    mem: File,
    layout: Layout,
    generation: u32,
    codes: HashMap<u64, Known>,
}

/// A code object as last read (none: it could not be), and when it was last checked.
struct Known {
    code: Option<Arc<PyCode>>,
    checked: Instant,
}

/// The Python processes and their code objects.
#[derive(Default)]
pub struct PyCodes {
    processes: HashMap<u32, Process>,
    /// Bytes kept of names and line tables (`MAX_BYTES`).
    bytes: usize,
}

impl std::fmt::Debug for PyCodes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PyCodes({} processes)", self.processes.len())
    }
}

impl PyCodes {
    /// `pid`, in its image `generation`, runs an interpreter of `layout` (found in a file it
    /// maps): its memory is opened now, while it is alive. An exec's new image (even of the same
    /// interpreter) replaces what was known: its memory and code objects are others.
    pub fn found(&mut self, pid: u32, generation: u32, layout: Layout) {
        if (self.processes.get(&pid)).is_some_and(|p| p.layout == layout && p.generation == generation) {
            return;
        }
        self.forget(&HashSet::from([pid]));
        match File::open(format!("/proc/{pid}/mem")) {
            Ok(mem) => {
                let codes = HashMap::new();
                let process = Process {
                    mem,
                    layout,
                    generation,
                    codes,
                };
                self.processes.insert(pid, process);
            }
            Err(e) => log::debug!("pid {pid}: its memory cannot be read ({e}): Python frames unnamed"),
        }
    }

    /// Whether `pid` runs an interpreter whose frames are read (only its stacks hold Python
    /// frames: a slot with the top bit set in another's is no frame of it).
    pub fn knows(&self, pid: u32) -> bool {
        self.processes.contains_key(&pid)
    }

    /// Name the code objects of the Python frames among `slots` not named yet, and those not
    /// checked lately that are no longer the ones read (`RECHECK`).
    pub fn read(&mut self, pid: u32, slots: &[u64]) {
        let Some(process) = self.processes.get_mut(&pid) else {
            return;
        };
        for (code, _) in slots.iter().filter_map(|&s| py_frame_parts(s)) {
            let full = process.codes.len() >= MAX_CODES || self.bytes >= MAX_BYTES;
            match process.codes.get_mut(&code) {
                Some(known) if known.checked.elapsed() < RECHECK => continue,
                Some(known) => {
                    known.checked = Instant::now();
                    let same = (known.code.as_ref())
                        .is_some_and(|c| still_at(&process.mem, &process.layout, code, c));
                    if same {
                        continue;
                    }
                }
                None if full => continue,
                None => {}
            }
            let read = read_code(&process.mem, &process.layout, code);
            // What cannot be read now (the process exited) leaves what was read before.
            if read.is_some() || !process.codes.contains_key(&code) {
                store(&mut self.bytes, process, code, read);
            }
        }
    }

    /// A walk just put the code object at `code` in a stack: read it again (its memory may hold
    /// another since it was last read; walks say so rarely, once per CPU while it remembers).
    pub fn reread(&mut self, pid: u32, code: u64) {
        let Some(process) = self.processes.get_mut(&pid) else {
            return;
        };
        // What could not be read now (the process exiting) leaves what was read before.
        if let Some(read) = read_code(&process.mem, &process.layout, code) {
            store(&mut self.bytes, process, code, Some(read));
        }
    }

    /// The code object at `code` in `pid`, as read.
    pub fn code(&self, pid: u32, code: u64) -> Option<Arc<PyCode>> {
        self.processes.get(&pid)?.codes.get(&code)?.code.clone()
    }

    pub fn forget(&mut self, pids: &HashSet<u32>) {
        for pid in pids {
            if let Some(process) = self.processes.remove(pid) {
                let bytes: usize = (process.codes.values())
                    .filter_map(|k| k.code.as_ref())
                    .map(|c| c.bytes())
                    .sum();
                self.bytes = self.bytes.saturating_sub(bytes);
            }
        }
    }
}

/// Keep what was read of the code object at `code` (replacing what was), within `MAX_CODES` and
/// `MAX_BYTES` (`bytes`: what is kept over all processes).
fn store(bytes: &mut usize, process: &mut Process, code: u64, read: Option<PyCode>) {
    let added = read.as_ref().map_or(0, PyCode::bytes);
    let replaced = process
        .codes
        .get(&code)
        .and_then(|k| k.code.as_ref())
        .map_or(0, |c| c.bytes());
    let room = process.codes.len() < MAX_CODES || process.codes.contains_key(&code);
    let kept = bytes.saturating_sub(replaced);
    if room && kept + added <= MAX_BYTES {
        *bytes = kept + added;
        let known = Known {
            code: read.map(Arc::new),
            checked: Instant::now(),
        };
        process.codes.insert(code, known);
    }
}

/// Whether the code object at `code` is still the one read as `read`.
fn still_at(mem: &File, layout: &Layout, code: u64, read: &PyCode) -> bool {
    let c = &layout.code;
    let name_at = read_u64(mem, code, c.qualname as u64);
    let first_line = read_u64(mem, code, c.first_line as u64).map(|l| l as u32);
    name_at == Some(read.name_at) && first_line == Some(read.first_line)
}

/// The 8 bytes `offset` past `at` in the process (addresses read from it: checked).
fn read_u64(mem: &File, at: u64, offset: u64) -> Option<u64> {
    let mut bytes = [0u8; 8];
    mem.read_exact_at(&mut bytes, at.checked_add(offset)?).ok()?;
    Some(u64::from_le_bytes(bytes))
}

pub(crate) fn read_code(mem: &File, layout: &Layout, code: u64) -> Option<PyCode> {
    let c = &layout.code;
    let name_at = read_u64(mem, code, c.qualname as u64)?;
    let name = read_str(mem, layout, name_at)?;
    let file = read_str(mem, layout, read_u64(mem, code, c.filename as u64)?)?;
    let first_line = read_u64(mem, code, c.first_line as u64)? as u32;
    let table = read_u64(mem, code, c.line_table as u64)?;
    let size = read_u64(mem, table, BYTES_SIZE)?;
    let mut line_table = vec![0u8; if size <= MAX_LINE_TABLE { size as usize } else { 0 }];
    mem.read_exact_at(&mut line_table, table.checked_add(BYTES_DATA)?)
        .ok()?;
    Some(PyCode {
        name: name.into(),
        file: file.into(),
        first_line,
        name_at,
        line_table: line_table.into(),
        bytecode: c.bytecode,
        lines: c.lines,
    })
}

/// A compact string object's text (code objects' names and files are compact).
fn read_str(mem: &File, layout: &Layout, at: u64) -> Option<String> {
    let length = read_u64(mem, at, UNICODE_LENGTH)?.min(MAX_NAME_CHARS) as usize;
    let state = read_u64(mem, at, UNICODE_STATE)? as u32;
    let (kind, compact, ascii) = ((state >> 2) & 7, (state >> 5) & 1 == 1, (state >> 6) & 1 == 1);
    if !compact {
        return None;
    }
    let header = match ascii {
        true => layout.code.ascii_header,
        false => layout.code.compact_header,
    } as u64;
    let width = match (ascii, kind) {
        (true, _) | (false, 1) => 1,
        (false, 2) => 2,
        (false, 4) => 4,
        _ => return None,
    };
    let mut bytes = vec![0u8; length * width];
    mem.read_exact_at(&mut bytes, at.checked_add(header)?).ok()?;
    Some(match width {
        1 => bytes.iter().map(|&b| b as char).collect(),
        2 => char::decode_utf16(bytes.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])))
            .map(|c| c.unwrap_or(char::REPLACEMENT_CHARACTER))
            .collect(),
        _ => (bytes.chunks_exact(4))
            .map(|c| {
                char::from_u32(u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .unwrap_or(char::REPLACEMENT_CHARACTER)
            })
            .collect(),
    })
}
