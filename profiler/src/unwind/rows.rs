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
    rows.extend(aarch64_plt_rows(file));
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
) -> Result<(), gimli::Error>
where
    S: gimli::UnwindSection<gimli::EndianSlice<'a, gimli::LittleEndian>>,
{
    let mut entries = section.entries(bases);
    while let Some(entry) = entries.next()? {
        if let gimli::CieOrFde::Fde(partial) = entry {
            if let Ok(fde) = partial.parse(|s, b, o| s.cie_from_offset(b, o)) {
                visit(&fde);
            }
        }
    }
    Ok(())
}

/// AArch64 linkers give the PLT no unwind information. A stub loads an address and branches
/// (`br`, not `bl`): sp, x29 and x30 are still the caller's at the call, so it unwinds as a
/// function's first instruction does: CFA = sp, the return address in x30. (The lazy-binding
/// stub at the head of `.plt` pushes 16 bytes before it branches to the resolver; a sample in
/// those few instructions gets its caller right and the next CFA 16 bytes short.)
fn aarch64_plt_rows(file: &object::File<'_>) -> Vec<Row> {
    if file.architecture() != object::Architecture::Aarch64 {
        return Vec::new();
    }
    file.sections()
        .filter(|s| matches!(s.name(), Ok(".plt" | ".iplt")) && s.size() > 0)
        .flat_map(|plt| {
            [
                Row {
                    pc: plt.address(),
                    cfa: cfa::SP,
                    ..Row::default()
                },
                Row {
                    pc: plt.address().saturating_add(plt.size()),
                    cfa: cfa::NONE,
                    ..Row::default()
                },
            ]
        })
        .collect()
}

fn collect_rows<'a, S>(
    section: &S,
    bases: &gimli::BaseAddresses,
    registers: Registers,
    rows: &mut Vec<Row>,
) -> Result<(), gimli::Error>
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
) -> Result<(), gimli::Error>
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
#[derive(Clone, Copy, Debug)]
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
mod tests {
    use object::{Object as _, ObjectSection as _, ObjectSymbol as _};

    use super::*;

    fn own_binary() -> Vec<u8> {
        std::fs::read("/proc/self/exe").unwrap()
    }

    #[test]
    fn rows_of_a_real_binary_are_sorted_and_start_functions_at_rsp_plus_8() {
        let rows = rows_of(&own_binary()).unwrap();
        assert!(rows.len() > 1000, "{} rows", rows.len());
        assert!(
            rows.windows(2).all(|w| w[0].pc < w[1].pc),
            "sorted, one row per pc"
        );
        // At a function's first instruction the CFA is rsp + 8 (the return address just pushed).
        let entry = rows_of_function(
            &rows,
            rows_of_a_real_binary_are_sorted_and_start_functions_at_rsp_plus_8 as *const () as usize,
        );
        assert_eq!((entry.cfa, entry.cfa_offset), (cfa::SP, 8), "{entry:?}");
        assert!(rows.iter().any(|r| r.fp == fp::AT_CFA), "some function saves rbp");
    }

    #[test]
    fn aarch64_rows_keep_the_return_address_in_x30_until_the_prologue_saves_it() {
        // Debian's arm64 C library, which the cross compiler brings (cargo xtask setup).
        let path = "/usr/aarch64-linux-gnu/lib/libc.so.6";
        let libc = std::fs::read(path).unwrap_or_else(|e| panic!("{path}: {e}: run cargo xtask setup"));
        let rows = rows_of(&libc).unwrap();
        assert!(rows.len() > 1000, "{} rows", rows.len());
        // At a function's first instruction: CFA = sp, the return address still in x30.
        assert!(rows
            .iter()
            .any(|r| (r.cfa, r.cfa_offset, r.ra_offset) == (cfa::SP, 0, 0)));
        // After `stp x29, x30, [sp, #-N]!`: the frame record, x29 with x30 above it.
        assert!(
            rows.iter()
                .any(|r| r.fp == fp::AT_CFA && r.ra_offset < 0 && r.ra_offset == r.fp_offset + 8),
            "some function saves its frame record"
        );
        // Below the CFA wherever the CFA is a register's (an expression's rows are walked by the
        // frame pointer, which ignores them).
        let above: Vec<_> = rows
            .iter()
            .filter(|r| matches!(r.cfa, cfa::SP | cfa::FP) && r.ra_offset > 0)
            .collect();
        assert!(
            above.is_empty(),
            "{} rows, e.g. {:x?}",
            above.len(),
            &above[..above.len().min(3)]
        );
        // The PLT, which has no unwind information: as at a function's first instruction.
        let file = object::File::parse(&*libc).unwrap();
        let plt = file.section_by_name(".plt").expect("libc calls through its PLT");
        let at = |pc: u64| rows[rows.partition_point(|r| r.pc <= pc) - 1];
        for pc in [plt.address(), plt.address() + plt.size() - 4] {
            let row = at(pc);
            assert_eq!(
                (row.cfa, row.cfa_offset, row.fp, row.ra_offset),
                (cfa::SP, 0, fp::SAME, 0),
                "{pc:#x}"
            );
        }
        // x86-64's call always leaves it at CFA - 8.
        assert!(rows_of(&own_binary())
            .unwrap()
            .iter()
            .all(|r| r.ra_offset == -8 || r.cfa == cfa::NONE || r.cfa == cfa::END));
    }

    /// The row in force at the function's own entry address (as linked in the file).
    fn rows_of_function(rows: &[Row], runtime: usize) -> Row {
        let maps = crate::process::parse_maps(&std::fs::read_to_string("/proc/self/maps").unwrap());
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let line = maps
            .iter()
            .find(|l| l.path == exe.to_str().unwrap() && (l.start..l.end).contains(&(runtime as u64)))
            .unwrap();
        let data = own_binary();
        let segments = segments_of(&object::File::parse(&*data).unwrap());
        let pc = runtime as u64 - bias_of(&segments, line.start, line.file_offset).unwrap();
        let i = rows.partition_point(|r| r.pc <= pc);
        rows[i - 1]
    }

    #[test]
    fn bias_maps_runtime_addresses_to_the_files_symbols() {
        let data = own_binary();
        let file = object::File::parse(&*data).unwrap();
        let symbol = file
            .symbols()
            .find(|s| {
                // The function itself (`...symbols17h<hash>E`), not the harness's closure around it.
                s.name()
                    .is_ok_and(|n| n.contains("bias_maps_runtime_addresses_to_the_files_symbols17h"))
            })
            .expect("the test's own symbol");
        let runtime = bias_maps_runtime_addresses_to_the_files_symbols as *const () as u64;
        let maps = crate::process::parse_maps(&std::fs::read_to_string("/proc/self/maps").unwrap());
        let line = maps.iter().find(|l| (l.start..l.end).contains(&runtime)).unwrap();
        assert_eq!(
            runtime - bias_of(&segments_of(&file), line.start, line.file_offset).unwrap(),
            symbol.address()
        );
    }

    /// A file built with `.debug_frame` only (no `.eh_frame`), plain and with its debug sections
    /// compressed by objcopy (zlib and zstd, as `SHF_COMPRESSED`): the same rows.
    #[test]
    fn compressed_debug_frame_gives_the_rows_of_the_plain_one() {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("f.c");
        std::fs::write(
            &source,
            "int leaf(int x) { return x * 3; }\nint caller(int x) { return leaf(x) + leaf(x + 1); }\nint main(void) { return caller(2); }\n",
        )
        .unwrap();
        let plain = dir.path().join("plain");
        let built = std::process::Command::new("cc")
            .args([
                "-g",
                "-O1",
                "-fno-asynchronous-unwind-tables",
                "-fno-unwind-tables",
                "-o",
            ])
            .arg(&plain)
            .arg(&source)
            .status()
            .expect("cc");
        assert!(built.success());
        // The C runtime's objects bring an `.eh_frame` of their own: gone, so `.debug_frame` is read.
        let removed = std::process::Command::new("objcopy")
            .args(["--remove-section=.eh_frame", "--remove-section=.eh_frame_hdr"])
            .arg(&plain)
            .status()
            .expect("objcopy");
        assert!(removed.success());
        let plain_data = std::fs::read(&plain).unwrap();
        let file = object::File::parse(&*plain_data).unwrap();
        assert!(file.section_by_name(".eh_frame").is_none());
        let expected = rows_of(&plain_data).unwrap();
        assert!(expected.len() >= 3, "{expected:?}");
        for format in ["zlib-gabi", "zstd"] {
            let compressed = dir.path().join(format);
            let out = std::process::Command::new("objcopy")
                .arg(format!("--compress-debug-sections={format}"))
                .arg(&plain)
                .arg(&compressed)
                .output()
                .expect("objcopy");
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            let data = std::fs::read(&compressed).unwrap();
            let section = object::File::parse(&*data)
                .unwrap()
                .section_by_name(".debug_frame")
                .unwrap()
                .compressed_data()
                .unwrap();
            assert_ne!(section.format, object::CompressionFormat::None, "{format}");
            assert_eq!(rows_of(&data).unwrap(), expected, "{format}");
        }
        // A crafted header (a size of a terabyte) and a corrupt stream: errors, not allocations.
        let zlib = std::fs::read(dir.path().join("zlib-gabi")).unwrap();
        let file = object::File::parse(&*zlib).unwrap();
        let (at, len) = file
            .section_by_name(".debug_frame")
            .unwrap()
            .file_range()
            .unwrap();
        let (at, len) = (at as usize, len as usize);
        let mut huge = zlib.clone();
        huge[at + 8..at + 16].copy_from_slice(&(1u64 << 40).to_le_bytes());
        assert!(matches!(
            rows_of(&huge),
            Err(TableError::Section(SectionError::TooLarge(_)))
        ));
        let mut corrupt = zlib.clone();
        corrupt[at + 24..at + len].fill(0xff);
        assert!(matches!(
            rows_of(&corrupt),
            Err(TableError::Section(SectionError::Corrupt(_)))
        ));
    }

    #[test]
    fn corrupt_or_missing_frame_information_is_an_error_not_a_panic() {
        let data = own_binary();
        let file = object::File::parse(&*data).unwrap();
        let (offset, size) = file.section_by_name(".eh_frame").unwrap().file_range().unwrap();
        let mut corrupt = data.clone();
        corrupt[offset as usize..(offset + size) as usize].fill(0xff);
        assert!(matches!(rows_of(&corrupt), Err(TableError::Corrupt(_))));

        let mut renamed = data.clone();
        for name in [&b".eh_frame\0"[..], &b".debug_frame\0"[..]] {
            let mut at = 0;
            while let Some(i) = renamed[at..].windows(name.len()).position(|w| w == name) {
                renamed[at + i + 1] = b'x';
                at += i + 1;
            }
        }
        assert!(matches!(rows_of(&renamed), Err(TableError::NoFrameInfo)));
        assert!(matches!(rows_of(b"not an ELF file"), Err(TableError::Elf(_))));
    }

    #[test]
    fn a_function_with_instructions_gimli_refuses_falls_back_alone() {
        // CIE (zR, udata4 pointers; CFA = rsp + 8, return address at CFA - 8), then two FDEs:
        // 0x1000..0x1010 pushes 8 bytes after one instruction; 0x2000..0x2010 sets the CFA by
        // an expression and then names a CFA register, as libgcrypt's assembly does.
        #[rustfmt::skip]
        let eh_frame: &[u8] = &[
            20, 0, 0, 0,  0, 0, 0, 0,  1, b'z', b'R', 0,  1, 0x78, 16,  1, 0x03,
            0x0c, 7, 8,  0x90, 1,  0, 0,
            16, 0, 0, 0,  28, 0, 0, 0,  0x00, 0x10, 0, 0,  0x10, 0, 0, 0,  0,
            0x41, 0x0e, 16,
            20, 0, 0, 0,  48, 0, 0, 0,  0x00, 0x20, 0, 0,  0x10, 0, 0, 0,  0,
            0x0f, 2, 0x77, 8,  0x41, 0x0d, 6,
            0, 0, 0, 0,
        ];
        let mut section = gimli::EhFrame::new(eh_frame, gimli::LittleEndian);
        section.set_address_size(8);
        let registers = Registers::of(object::Architecture::X86_64).unwrap();
        let mut rows = Vec::new();
        collect_rows(&section, &gimli::BaseAddresses::default(), registers, &mut rows).unwrap();
        let rules: Vec<_> = rows.iter().map(|r| (r.pc, r.cfa, r.cfa_offset)).collect();
        assert_eq!(
            rules,
            [
                (0x1000, cfa::SP, 8),
                (0x1001, cfa::SP, 16),
                (0x1010, cfa::NONE, 0),
                (0x2000, cfa::UNSUPPORTED, 0),
                (0x2010, cfa::NONE, 0),
            ]
        );
    }

    #[test]
    fn plt_expression_and_row_compaction() {
        let plt = [0x77, 8, 0x80, 0, 0x3f, 0x1a, 0x3b, 0x2a, 0x33, 0x24, 0x22];
        assert_eq!(plt_threshold(&plt), Some(11));
        assert_eq!(plt_threshold(&plt[..10]), None);

        let row = |pc, cfa_kind, cfa_offset| Row {
            pc,
            cfa: cfa_kind,
            cfa_offset,
            ..Row::default()
        };
        let rows = compact(vec![
            row(0x20, cfa::SP, 8),
            row(0x10, cfa::SP, 8),
            row(0x14, cfa::SP, 16),
            row(0x18, cfa::SP, 16),
            // One function ends where the next begins: the next one's rule wins.
            row(0x20, cfa::NONE, 0),
        ]);
        assert_eq!(
            rows,
            vec![
                row(0x10, cfa::SP, 8),
                row(0x14, cfa::SP, 16),
                row(0x20, cfa::SP, 8)
            ]
        );
    }

    /// Segments a file places at the top of the address space: no overflow, nothing held past it.
    #[test]
    fn segments_at_the_top_of_the_address_space_do_not_overflow() {
        let (at, size, top) = (u64::MAX - 0x10, 0x100, u64::MAX);
        let s = Segment {
            offset: at,
            size,
            vaddr: at,
            mem_size: size,
        };
        let got = (
            s.holds(top),
            s.file_offset(top),
            s.vaddr(top),
            bias_of(&[s], top, top),
        );
        eprintln!("{got:?} {:?}", (s.holds(0), s.file_offset(0)));
        assert_eq!(got, (true, Some(top), Some(top), Some(0)));
        assert!(!s.holds(0) && s.file_offset(0).is_none());
    }
}
