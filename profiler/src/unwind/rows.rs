//! A file's unwind rows, built from its `.eh_frame` (or `.debug_frame`) with gimli and from a Go
//! binary's own table (`golang::rows`), and the arithmetic that maps a process's addresses to
//! the file's. The rules kept: CFA = sp/fp + offset, the x86-64 PLT expression, fp saved at
//! CFA + offset, where the return address is (x86-64: always CFA - 8; AArch64: saved at CFA +
//! offset, or still in x30), and "return address undefined" (the outermost frame). Anything
//! else falls back to the frame pointer in BPF.
use gimli::{AArch64, CfaRule, Register, RegisterRule, X86_64};
use object::{Object as _, ObjectSection as _, ObjectSegment as _};
use profiler_common::unwind::{cfa, fp, Row};

use crate::{
    golang,
    process::{section_data, SectionError},
};

/// Why a file has no table (it is then walked with frame pointers).
#[derive(Debug, thiserror::Error)]
pub enum TableError {
    #[error("not an ELF file bpfprof can read: {0}")]
    Elf(#[from] object::Error),
    #[error("no .eh_frame or .debug_frame section")]
    NoFrameInfo,
    #[error("its unwind information is corrupt: {0}")]
    Corrupt(#[from] gimli::Error),
    #[error("its unwind section {0}")]
    Section(#[from] SectionError),
    #[error("built for {0:?}, which bpfprof does not walk")]
    Architecture(object::Architecture),
    #[error("its unwind information is corrupt: none of its {0} entries names a CIE that can be read")]
    NoReadableEntry(usize),
}

/// The DWARF registers the walker knows, by architecture.
#[derive(Clone, Copy)]
struct Registers {
    sp: Register,
    fp: Register,
    ra: Register,
    /// Where the call leaves the return address, if the architecture fixes it (x86-64's push).
    ra_at: Option<i16>,
}

impl Registers {
    fn of(architecture: object::Architecture) -> Result<Registers, TableError> {
        match architecture {
            object::Architecture::X86_64 => Ok(Registers {
                sp: X86_64::RSP,
                fp: X86_64::RBP,
                ra: X86_64::RA,
                ra_at: Some(-8),
            }),
            object::Architecture::Aarch64 => Ok(Registers {
                sp: AArch64::SP,
                fp: AArch64::X29,
                ra: AArch64::X30,
                ra_at: None,
            }),
            other => Err(TableError::Architecture(other)),
        }
    }
}

/// The unwind rows of an ELF image, sorted by pc, with rows that change nothing merged.
pub fn rows_of(data: &[u8]) -> Result<Vec<Row>, TableError> {
    rows_of_file(&object::File::parse(data)?)
}

pub(super) fn rows_of_file(file: &object::File<'_>) -> Result<Vec<Row>, TableError> {
    let registers = Registers::of(file.architecture())?;
    let go = golang::rows::of_file(file);
    let mut rows = match frame_section_rows(file, registers) {
        Ok(rows) => rows,
        // Go's table unwinds its code on its own (a `-s -w` build has no other).
        Err(e) if go.is_some() => {
            log::debug!("Go binary without usable CFI ({e}): its Go table only");
            Vec::new()
        }
        Err(e) => return Err(e),
    };
    rows.extend(aarch64_plt_rows(file, registers));
    let stubs = syscall_stub_rows(file, &rows, registers);
    rows.extend(stubs);
    if let Some(go) = go {
        go.replace_in(&mut rows);
    }
    Ok(compact(rows))
}

/// The rows of `.eh_frame` if the file has one, otherwise of `.debug_frame`.
fn frame_section_rows(file: &object::File<'_>, registers: Registers) -> Result<Vec<Row>, TableError> {
    let (section, bases) = frame_section(file)?;
    let mut rows = Vec::new();
    match &section {
        FrameSection::Eh(data) => {
            let eh_frame = gimli::EhFrame::new(data, gimli::LittleEndian);
            collect_rows(&eh_frame, &bases, registers, &mut rows)?;
        }
        FrameSection::Debug(data) => {
            let debug_frame = gimli::DebugFrame::new(data, gimli::LittleEndian);
            collect_rows(&debug_frame, &bases, registers, &mut rows)?;
        }
    }
    Ok(rows)
}

/// A file's call frame information: `.eh_frame` where it has one, else `.debug_frame`.
enum FrameSection<'d> {
    Eh(std::borrow::Cow<'d, [u8]>),
    Debug(std::borrow::Cow<'d, [u8]>),
}

fn frame_section<'d>(
    file: &object::File<'d>,
) -> Result<(FrameSection<'d>, gimli::BaseAddresses), TableError> {
    let address = |name: &str| file.section_by_name(name).map(|s| s.address());
    let mut bases = gimli::BaseAddresses::default();
    if let Some(a) = address(".text") {
        bases = bases.set_text(a);
    }
    if let Some(a) = address(".got") {
        bases = bases.set_got(a);
    }
    if let Some(a) = address(".eh_frame_hdr") {
        bases = bases.set_eh_frame_hdr(a);
    }
    if let Some(section) = file.section_by_name(".eh_frame") {
        let bases = bases.set_eh_frame(section.address());
        return Ok((FrameSection::Eh(section_data(&section)?), bases));
    }
    // Compressed where the linker compressed the debug sections (Go's does, with zlib).
    match file
        .section_by_name(".debug_frame")
        .or_else(|| file.section_by_name(".zdebug_frame"))
    {
        Some(section) => Ok((FrameSection::Debug(section_data(&section)?), bases)),
        None => Err(TableError::NoFrameInfo),
    }
}

/// The functions the file's call frame information bounds: one `(start, end)` per entry (FDE),
/// in the file's own virtual addresses, in the section's order.
pub fn fde_ranges(file: &object::File<'_>) -> Result<Vec<(u64, u64)>, TableError> {
    let (section, bases) = frame_section(file)?;
    let mut ranges = Vec::new();
    let mut push = |fde: &Fde<'_>| ranges.push((fde.initial_address(), fde.end_address()));
    match &section {
        FrameSection::Eh(data) => {
            each_fde(&gimli::EhFrame::new(data, gimli::LittleEndian), &bases, &mut push)?
        }
        FrameSection::Debug(data) => each_fde(
            &gimli::DebugFrame::new(data, gimli::LittleEndian),
            &bases,
            &mut push,
        )?,
    }
    Ok(ranges)
}

type Fde<'a> = gimli::FrameDescriptionEntry<gimli::EndianSlice<'a, gimli::LittleEndian>>;

/// Every entry of a frame section whose CIE parses, in order. One that does not costs that
/// function, not the file.
fn each_fde<'a, S>(
    section: &S,
    bases: &gimli::BaseAddresses,
    visit: &mut dyn FnMut(&Fde<'a>),
) -> Result<(), TableError>
where
    S: gimli::UnwindSection<gimli::EndianSlice<'a, gimli::LittleEndian>>,
{
    let mut entries = section.entries(bases);
    let (mut read, mut unreadable) = (0usize, 0usize);
    while let Some(entry) = entries.next()? {
        if let gimli::CieOrFde::Fde(partial) = entry {
            match partial.parse(|s, b, o| s.cie_from_offset(b, o)) {
                Ok(fde) => {
                    read += 1;
                    visit(&fde);
                }
                // Its function is walked with frame pointers; the rest keeps its table.
                Err(_) => unreadable += 1,
            }
        }
    }
    // A table of which no entry could be read is no table: said, as a corrupt one is.
    match (read, unreadable) {
        (0, n) if n > 0 => Err(TableError::NoReadableEntry(n)),
        _ => Ok(()),
    }
}

/// AArch64 linkers give the PLT no unwind information. A stub loads an address and branches
/// (`br`, not `bl`): sp, x29 and x30 are still the caller's at the call, so it unwinds as a
/// function's first instruction does: CFA = sp, the return address in x30. (The lazy-binding
/// stub at the head of `.plt` pushes 16 bytes before it branches to the resolver; a sample in
/// those few instructions gets its caller right and the next CFA 16 bytes short.)
fn aarch64_plt_rows(file: &object::File<'_>, registers: Registers) -> Vec<Row> {
    if file.architecture() != object::Architecture::Aarch64 {
        return Vec::new();
    }
    file.sections()
        .filter(|s| matches!(s.name(), Ok(".plt" | ".iplt")) && s.size() > 0)
        .flat_map(|plt| {
            [
                entry_row(plt.address(), registers),
                Row {
                    pc: plt.address().saturating_add(plt.size()),
                    cfa: cfa::NONE,
                    ..Row::default()
                },
            ]
        })
        .collect()
}

/// A system call stub whose unwind information ends just before its system call instruction:
/// glibc's `clone` and `clone3` on x86-64 end their FDE there ("in the child the unwind info
/// will be wrong"), so a parent blocked in the call (every `posix_spawn`: the parent waits there
/// until its child execs) had no rule at its pc, and its stack stopped at `[unknown]`. There the
/// stub has pushed nothing since its entry: it unwinds as at its entry (`entry_row`), up to the
/// next function's entry, at most `SYSCALL_STUB_TAIL` bytes on (the parent's path: a test, two
/// branches and a return).
fn syscall_stub_rows(file: &object::File<'_>, rows: &[Row], registers: Registers) -> Vec<Row> {
    let instruction: &[u8] = match file.architecture() {
        object::Architecture::X86_64 => &[0x0f, 0x05],
        object::Architecture::Aarch64 => &[0x01, 0x00, 0x00, 0xd4],
        _ => return Vec::new(),
    };
    let starts_function = |pc: u64| rows.iter().any(|r| r.pc == pc && r.cfa != cfa::NONE);
    let code: Vec<_> = (file.sections())
        .filter(|s| s.kind() == object::SectionKind::Text)
        .collect();
    let code_at = |address: u64| {
        (code.iter())
            .find(|s| s.address() <= address && address < s.address() + s.size())
            .and_then(|s| s.data_range(address, instruction.len() as u64).ok().flatten())
    };
    let mut stubs = Vec::new();
    for end in rows.iter().filter(|r| r.cfa == cfa::NONE).map(|r| r.pc) {
        if code_at(end) != Some(instruction) || starts_function(end) {
            continue;
        }
        stubs.push(entry_row(end, registers));
        let tail = end + SYSCALL_STUB_TAIL;
        if !rows
            .iter()
            .any(|r| r.cfa != cfa::NONE && r.pc > end && r.pc <= tail)
        {
            stubs.push(Row {
                pc: tail,
                cfa: cfa::NONE,
                ..Row::default()
            });
        }
    }
    stubs
}

/// How far past its system call instruction a stub's rule reaches (see `syscall_stub_rows`).
const SYSCALL_STUB_TAIL: u64 = 32;

/// The rule at a function's first instruction, for code with no unwind information that is
/// known to be there: the caller's stack pointer is the CFA, less what the call pushed (x86-64:
/// CFA = rsp + 8, the return address below it; AArch64: CFA = sp, the return address in x30).
fn entry_row(pc: u64, registers: Registers) -> Row {
    let ra_offset = registers.ra_at.unwrap_or(0);
    Row {
        pc,
        cfa: cfa::SP,
        cfa_offset: -ra_offset,
        ra_offset,
        ..Row::default()
    }
}

fn collect_rows<'a, S>(
    section: &S,
    bases: &gimli::BaseAddresses,
    registers: Registers,
    rows: &mut Vec<Row>,
) -> Result<(), TableError>
where
    S: gimli::UnwindSection<gimli::EndianSlice<'a, gimli::LittleEndian>>,
{
    let mut ctx = Box::new(gimli::UnwindContext::new());
    // One function's bad instructions cost that function, not the file: hand-written assembly
    // (libgcrypt's ciphers) sets a CFA register after a CFA expression, which gimli refuses. Its
    // range is walked with frame pointers; the rest keeps its table.
    each_fde(section, bases, &mut |fde| {
        let first = rows.len();
        if let Err(e) = push_rows_of(section, bases, &mut ctx, registers, fde, rows) {
            log::debug!(
                "unwind rows of {:#x}: {e}: frame pointers there",
                fde.initial_address()
            );
            rows.truncate(first);
            rows.push(Row {
                pc: fde.initial_address(),
                cfa: cfa::UNSUPPORTED,
                ..Row::default()
            });
        }
        // Past the function's end there is no information until the next FDE says otherwise.
        rows.push(Row {
            pc: fde.end_address(),
            cfa: cfa::NONE,
            ..Row::default()
        });
    })
}

fn push_rows_of<'a, S>(
    section: &S,
    bases: &gimli::BaseAddresses,
    ctx: &mut gimli::UnwindContext<usize>,
    registers: Registers,
    fde: &gimli::FrameDescriptionEntry<gimli::EndianSlice<'a, gimli::LittleEndian>>,
    rows: &mut Vec<Row>,
) -> Result<(), TableError>
where
    S: gimli::UnwindSection<gimli::EndianSlice<'a, gimli::LittleEndian>>,
{
    let mut table = fde.rows(section, bases, ctx)?;
    while let Some(row) = table.next_row()? {
        rows.push(convert(section, registers, row));
    }
    Ok(())
}

fn convert<'a, S>(section: &S, registers: Registers, row: &gimli::UnwindTableRow<usize>) -> Row
where
    S: gimli::UnwindSection<gimli::EndianSlice<'a, gimli::LittleEndian>>,
{
    let mut out = Row {
        pc: row.start_address(),
        ..Row::default()
    };
    if matches!(row.register(registers.ra), Some(RegisterRule::Undefined)) {
        out.cfa = cfa::END;
        return out;
    }
    match row.cfa() {
        CfaRule::RegisterAndOffset { register, offset } => match i16::try_from(*offset) {
            Ok(offset) if *register == registers.sp => (out.cfa, out.cfa_offset) = (cfa::SP, offset),
            Ok(offset) if *register == registers.fp => (out.cfa, out.cfa_offset) = (cfa::FP, offset),
            _ => out.cfa = cfa::UNSUPPORTED,
        },
        CfaRule::Expression(expression) => {
            out.cfa = cfa::UNSUPPORTED;
            if let Ok(expression) = expression.get(section) {
                if let Some(threshold) = plt_threshold(expression.0.slice()) {
                    (out.cfa, out.cfa_offset) = (cfa::PLT, threshold);
                }
            }
        }
    }
    if let Some(RegisterRule::Offset(offset)) = row.register(registers.fp) {
        if let Ok(offset) = i16::try_from(offset) {
            (out.fp, out.fp_offset) = (fp::AT_CFA, offset);
        }
    }
    out.ra_offset = match (registers.ra_at, row.register(registers.ra)) {
        (Some(at), _) => at,
        // Saved by the prologue; 0 (not saved: still in the link register) otherwise. A saved
        // offset is never 0: the save area is below the CFA.
        (None, Some(RegisterRule::Offset(offset))) => i16::try_from(offset).unwrap_or(0),
        (None, _) => 0,
    };
    if registers.ra_at.is_none()
        && out.ra_offset == 0
        && !matches!(row.register(registers.ra), None | Some(RegisterRule::SameValue))
    {
        // Somewhere the walker cannot follow (another register, an expression).
        out.cfa = cfa::UNSUPPORTED;
    }
    out
}

/// The expression every x86-64 PLT carries: CFA = rsp + 8 + ((rip & 15) >= N) << 3, N = 10 or 11
/// (DW_OP_breg7 8; DW_OP_breg16 0; DW_OP_lit15; DW_OP_and; DW_OP_litN; DW_OP_ge; DW_OP_lit3;
/// DW_OP_shl; DW_OP_plus). Returns N.
fn plt_threshold(expression: &[u8]) -> Option<i16> {
    const LIT0: u8 = 0x30;
    match expression {
        [0x77, 8, 0x80, 0, 0x3f, 0x1a, lit, 0x2a, 0x33, 0x24, 0x22] if (LIT0..=LIT0 + 31).contains(lit) => {
            Some((lit - LIT0) as i16)
        }
        _ => None,
    }
}

/// Sort by pc; where two rows start at the same pc the later FDE's real rule beats an earlier
/// FDE's end marker; then drop rows that repeat the previous rule.
fn compact(mut rows: Vec<Row>) -> Vec<Row> {
    rows.sort_by_key(|r| (r.pc, r.cfa != cfa::NONE));
    // In place: a large library has a million rows or more (rustc's driver 1.15M, 18 MB), and a
    // second array of them would double what a long-running agent holds while it parses.
    let mut kept = 0;
    for i in 0..rows.len() {
        let row = rows[i];
        if kept > 0 {
            let last = &mut rows[kept - 1];
            if last.pc == row.pc {
                *last = row;
                continue;
            }
            if (Row { pc: last.pc, ..row }) == *last {
                continue;
            }
        }
        rows[kept] = row;
        kept += 1;
    }
    rows.truncate(kept);
    rows
}

/// A loadable segment: where it is in the file, and its virtual address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Segment {
    offset: u64,
    size: u64,
    vaddr: u64,
    /// In memory: with the zero-filled tail (`.bss`).
    mem_size: u64,
}

impl Segment {
    /// Whether the file virtual address lies in the segment as loaded.
    pub fn holds(&self, vaddr: u64) -> bool {
        vaddr.checked_sub(self.vaddr).is_some_and(|d| d < self.mem_size)
    }

    /// Where the file virtual address is in the file, if the segment has it there.
    pub fn file_offset(&self, vaddr: u64) -> Option<u64> {
        let within = vaddr.checked_sub(self.vaddr).filter(|&d| d < self.size)?;
        self.offset.checked_add(within)
    }

    /// The file virtual address of a file offset, if the segment has it.
    pub fn vaddr(&self, file_offset: u64) -> Option<u64> {
        let within = file_offset.checked_sub(self.offset).filter(|&d| d < self.size)?;
        self.vaddr.checked_add(within)
    }
}

pub fn segments_of(file: &object::File<'_>) -> Vec<Segment> {
    file.segments()
        .map(|seg| {
            let (offset, size) = seg.file_range();
            Segment {
                offset,
                size,
                vaddr: seg.address(),
                mem_size: seg.size(),
            }
        })
        .collect()
}

/// The runtime address minus the file's virtual address for one mapping of the file: from the
/// loadable segment the mapping starts (a mapping begins at the page of its segment's file offset;
/// the segment before may share that page, so an exact start wins over mere overlap).
pub fn bias_of(segments: &[Segment], start: u64, file_offset: u64) -> Option<u64> {
    let off = file_offset;
    let starts_here = segments.iter().find(|s| s.offset & !0xfff == off);
    let overlaps = || {
        segments
            .iter()
            .find(|s| off.checked_sub(s.offset).is_some_and(|d| d < s.size))
    };
    let s = starts_here.or_else(overlaps)?;
    Some(start.wrapping_sub(s.vaddr.wrapping_add(off).wrapping_sub(s.offset)))
}

#[cfg(test)]
mod tests;
