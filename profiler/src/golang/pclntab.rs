//! Go's own symbol table, the pclntab (the runtime's `pcHeader`, functab, `_func` records and
//! pc-value tables; Go's runtime/symtab.go and debug/gosym/pclntab.go are the reference). Read
//! from a file bpfprof did not choose: every read is bounds-checked and gives `None` when it
//! falls outside the table, so a malformed table names nothing and never panics; nothing is
//! allocated from a size the table claims.

/// The table layouts bpfprof reads, by the header's magic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Version {
    /// Go 1.16 and 1.17 (0xfffffffa): absolute entry PCs, no textStart.
    Go116,
    /// Go 1.18 and 1.19 (0xfffffff0): entries as offsets from textStart.
    Go118,
    /// Go 1.20 and later (0xfffffff1): `_func` gains `startLine`.
    Go120,
}

/// Why a file's table is not read.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("its Go table is from Go 1.2-1.15 (magic 0xfffffffb), which bpfprof does not read")]
    Go12,
    #[error("its Go table has an unknown magic {0:#x}")]
    Magic(u32),
    #[error("its Go table's header is corrupt or truncated")]
    Corrupt,
}

/// `_func.flag`: the function is the top of a stack (a goroutine's or a thread's root).
pub const TOPFRAME: u8 = 1;
/// `_func.flag`: the function writes SP (gogo, asmcgocall, cgocallback...): its pcsp is wrong
/// after the write, and Go's own traceback stops there.
pub const SPWRITE: u8 = 2;

/// The longest name or file name read (Go's longest are a few hundred bytes).
const MAX_STRING: usize = 4096;

/// One function of the table. Its pc-value tables are offsets into the table's pctab.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Func {
    /// Entry and end, in the file's virtual addresses.
    pub entry: u64,
    pub end: u64,
    pub name_off: u32,
    pub pcsp: u32,
    pub pcfile: u32,
    pub pcln: u32,
    pub cu_offset: u32,
    pub flag: u8,
}

/// A parsed header: where each part of the table lies (offsets checked against its length).
#[derive(Clone, Copy, Debug)]
pub struct Pclntab<'d> {
    data: &'d [u8],
    pub version: Version,
    pub quantum: u8,
    ptr_size: usize,
    nfunc: usize,
    text: u64,
    funcnametab: usize,
    cutab: usize,
    filetab: usize,
    pctab: usize,
    functab: usize,
}

impl<'d> Pclntab<'d> {
    /// Parse the header of the table in `data`. `text` is the start of the Go text, used when
    /// the header's own textStart is 0 (Go 1.26 writes 0 there) for layouts with offsets.
    pub fn parse(data: &'d [u8], text: u64) -> Result<Pclntab<'d>, Refusal> {
        let magic = read_u32(data, 0).ok_or(Refusal::Corrupt)?;
        let version = match magic {
            0xfffffffa => Version::Go116,
            0xfffffff0 => Version::Go118,
            0xfffffff1 => Version::Go120,
            0xfffffffb => return Err(Refusal::Go12),
            other => return Err(Refusal::Magic(other)),
        };
        let (quantum, ptr_size) = match data.get(4..8) {
            Some(&[0, 0, q @ (1 | 2 | 4), p @ (4 | 8)]) => (q, p as usize),
            _ => return Err(Refusal::Corrupt),
        };
        let word = |i: usize| read_word(data, 8 + i * ptr_size, ptr_size).ok_or(Refusal::Corrupt);
        let offset = |i: usize| -> Result<usize, Refusal> {
            let at = usize::try_from(word(i)?).map_err(|_| Refusal::Corrupt)?;
            (at <= data.len()).then_some(at).ok_or(Refusal::Corrupt)
        };
        // Go 1.18 added textStart as the third word; the offsets after it move by one.
        let first = if version == Version::Go116 { 2 } else { 3 };
        let mut table = Pclntab {
            data,
            version,
            quantum,
            ptr_size,
            nfunc: usize::try_from(word(0)?).map_err(|_| Refusal::Corrupt)?,
            text: 0,
            funcnametab: offset(first)?,
            cutab: offset(first + 1)?,
            filetab: offset(first + 2)?,
            pctab: offset(first + 3)?,
            functab: offset(first + 4)?,
        };
        if version >= Version::Go118 {
            table.text = match word(2)? {
                0 => text,
                start => start,
            };
        }
        // The functab's 2 * nfunc + 1 fields (nfunc entries and offsets, then the end) must lie
        // in the table (Go's debug/gosym: functabsize).
        let functab_len = table
            .nfunc
            .checked_mul(2)
            .and_then(|n| n.checked_add(1))
            .and_then(|n| n.checked_mul(table.field_size()))
            .ok_or(Refusal::Corrupt)?;
        match table.functab.checked_add(functab_len) {
            Some(end) if end <= data.len() => Ok(table),
            _ => Err(Refusal::Corrupt),
        }
    }

    /// Functions in the table.
    pub fn len(&self) -> usize {
        self.nfunc
    }

    pub fn is_empty(&self) -> bool {
        self.nfunc == 0
    }

    /// Size of a functab field: u32 offsets since Go 1.18, pointers before.
    fn field_size(&self) -> usize {
        match self.version {
            Version::Go116 => self.ptr_size,
            _ => 4,
        }
    }

    /// The functab's `i`th entry PC (`i == len()`: the end of the last function).
    fn entry(&self, i: usize) -> Option<u64> {
        let size = self.field_size();
        let at = self.functab.checked_add(i.checked_mul(2 * size)?)?;
        let value = read_word(self.data, at, size)?;
        match self.version {
            Version::Go116 => Some(value),
            _ => self.text.checked_add(value),
        }
    }

    /// The Go text the table covers: the first function's entry to the last one's end.
    pub fn range(&self) -> Option<(u64, u64)> {
        Some((self.entry(0)?, self.entry(self.nfunc)?))
    }

    /// The `i`th function, if its record is whole and agrees with the functab.
    pub fn func(&self, i: usize) -> Option<Func> {
        if i >= self.nfunc {
            return None;
        }
        let size = self.field_size();
        let (entry, end) = (self.entry(i)?, self.entry(i + 1)?);
        let funcoff_at = self
            .functab
            .checked_add(i.checked_mul(2)?.checked_add(1)? * size)?;
        let funcoff = read_word(self.data, funcoff_at, size)?;
        let at = self.functab.checked_add(usize::try_from(funcoff).ok()?)?;
        // `_func`: the entry (a pointer before 1.18, a u32 offset since), then u32 fields.
        let base = at.checked_add(size)?;
        let field = |n: usize| read_u32(self.data, base.checked_add(4 * n)?);
        let own_entry = match self.version {
            Version::Go116 => read_word(self.data, at, size)?,
            _ => self.text.checked_add(u64::from(read_u32(self.data, at)?))?,
        };
        // After `cuOffset`: funcID and flag bytes (1.20 put a 4-byte startLine before them).
        let flag_at = base.checked_add(if self.version == Version::Go120 { 37 } else { 33 })?;
        let func = Func {
            entry,
            end,
            name_off: field(0)?,
            pcsp: field(3)?,
            pcfile: field(4)?,
            pcln: field(5)?,
            cu_offset: field(7)?,
            flag: *self.data.get(flag_at)?,
        };
        (own_entry == entry && entry <= end).then_some(func)
    }

    /// Every function whose record reads whole, in address order.
    pub fn funcs(&self) -> impl Iterator<Item = Func> + '_ {
        (0..self.nfunc).filter_map(|i| self.func(i))
    }

    /// The function holding `pc`.
    pub fn find(&self, pc: u64) -> Option<Func> {
        let (first, end) = self.range()?;
        if pc < first || pc >= end {
            return None;
        }
        // The last entry at or below pc: entries are sorted; one that does not read sorts last.
        let (mut low, mut high) = (0, self.nfunc);
        while low < high {
            let mid = low + (high - low) / 2;
            if self.entry(mid).is_some_and(|e| e <= pc) {
                low = mid + 1;
            } else {
                high = mid;
            }
        }
        let func = self.func(low.checked_sub(1)?)?;
        (func.entry..func.end).contains(&pc).then_some(func)
    }

    pub fn name(&self, func: &Func) -> Option<&'d str> {
        let at = self
            .funcnametab
            .checked_add(usize::try_from(func.name_off).ok()?)?;
        c_str(self.data.get(..self.cutab)?, at)
    }

    /// The pc-value table at `offset` (pcsp, pcfile or pcln) of `func`: the runs `(start, end,
    /// value)` in address order, within the function. Empty where the offset is 0 (no table).
    pub fn pc_values(&self, offset: u32, func: &Func) -> PcValues<'d> {
        let at = usize::try_from(offset)
            .ok()
            .filter(|&o| o != 0)
            .and_then(|o| self.pctab.checked_add(o));
        PcValues {
            data: at.and_then(|at| self.data.get(at..)).unwrap_or(&[]),
            pc: func.entry,
            end: func.end,
            value: -1,
            first: true,
            quantum: u64::from(self.quantum),
        }
    }

    /// The value a pc-value table gives at `pc`.
    pub fn value_at(&self, offset: u32, func: &Func, pc: u64) -> Option<i32> {
        self.pc_values(offset, func)
            .take_while(|&(start, _, _)| start <= pc)
            .find(|&(_, end, _)| pc < end)
            .map(|(_, _, value)| value)
    }

    /// The source file of the instruction at `pc` (its function's file where nothing was
    /// inlined there).
    pub fn file(&self, func: &Func, pc: u64) -> Option<&'d str> {
        let index = u32::try_from(self.value_at(func.pcfile, func, pc)?).ok()?;
        let slot = usize::try_from(func.cu_offset.checked_add(index)?).ok()?;
        let at = self.cutab.checked_add(slot.checked_mul(4)?)?;
        let file_off = usize::try_from(read_u32(self.data, at)?).ok()?;
        c_str(self.data.get(..self.pctab)?, self.filetab.checked_add(file_off)?)
    }

    /// The source line of the instruction at `pc`.
    pub fn line(&self, func: &Func, pc: u64) -> Option<u32> {
        u32::try_from(self.value_at(func.pcln, func, pc)?).ok()
    }
}

/// Runs of one pc-value table: a value delta (zig-zag varint) and a pc delta (varint, in
/// instruction quanta) per step, from the value -1 at the entry; a zero value delta after the
/// first step ends the table. So does a zero pc delta after the first step (Go's linker writes
/// none: it would repeat a pc) and the function's end: a function of n quanta has at most n + 1
/// runs, whatever the table says.
pub struct PcValues<'d> {
    data: &'d [u8],
    pc: u64,
    end: u64,
    value: i32,
    first: bool,
    quantum: u64,
}

impl Iterator for PcValues<'_> {
    type Item = (u64, u64, i32);

    fn next(&mut self) -> Option<(u64, u64, i32)> {
        if self.pc >= self.end {
            return None;
        }
        let delta = self.varint()?;
        let first = std::mem::replace(&mut self.first, false);
        if delta == 0 && !first {
            return None;
        }
        let delta = if delta & 1 != 0 { !(delta >> 1) } else { delta >> 1 };
        self.value = self.value.wrapping_add(delta as i32);
        let start = self.pc;
        let pc_delta = u64::from(self.varint()?) * self.quantum;
        if pc_delta == 0 && !first {
            self.data = &[];
            return None;
        }
        self.pc = start.checked_add(pc_delta)?;
        Some((start, self.pc, self.value))
    }
}

impl PcValues<'_> {
    fn varint(&mut self) -> Option<u32> {
        let mut value = 0u32;
        for (i, &byte) in self.data.iter().take(5).enumerate() {
            value |= u32::from(byte & 0x7f) << (7 * i);
            if byte & 0x80 == 0 {
                self.data = &self.data[i + 1..];
                return Some(value);
            }
        }
        self.data = &[];
        None
    }
}

pub(super) fn read_u32(data: &[u8], at: usize) -> Option<u32> {
    let bytes = data.get(at..at.checked_add(4)?)?;
    Some(u32::from_le_bytes(bytes.try_into().ok()?))
}

pub(super) fn read_word(data: &[u8], at: usize, size: usize) -> Option<u64> {
    match size {
        4 => read_u32(data, at).map(u64::from),
        8 => {
            let bytes = data.get(at..at.checked_add(8)?)?;
            Some(u64::from_le_bytes(bytes.try_into().ok()?))
        }
        _ => None,
    }
}

/// The NUL-terminated UTF-8 string at `at`, of at most `MAX_STRING` bytes, within `data` (the
/// table up to the end of the part it is in).
fn c_str(data: &[u8], at: usize) -> Option<&str> {
    let rest = data.get(at..)?;
    let rest = &rest[..rest.len().min(MAX_STRING + 1)];
    let len = rest.iter().position(|&b| b == 0)?;
    std::str::from_utf8(&rest[..len]).ok()
}
