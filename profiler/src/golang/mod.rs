//! Go binaries' own table, the pclntab: function names, source files and lines for the
//! symbolizer, and stack-pointer deltas (pcsp) for the unwinder. Every Go binary has one, also
//! one built with `-ldflags=-s -w` (no `.symtab`, no DWARF) or stripped by a distribution.
pub mod names;
pub mod pclntab;
pub mod rows;

use object::{Object as _, ObjectSection as _, ObjectSegment as _, ObjectSymbol as _, SegmentFlags};

pub use pclntab::{Func, Pclntab, Refusal, Version};

/// A file's Go table and where it lies in the file.
pub struct Found<'d> {
    pub table: Pclntab<'d>,
    pub file_offset: u64,
    /// Where the Go text starts when the header leaves it 0 (what `Pclntab::parse` needs).
    pub text: u64,
}

/// Why a file has no Go table bpfprof reads.
#[derive(Debug, thiserror::Error)]
pub enum NoTable {
    #[error("no Go table")]
    Absent,
    #[error("its Go table's functions lie outside its executable code")]
    Misplaced,
    #[error(transparent)]
    Refused(#[from] Refusal),
}

/// The file's Go table: the section the linker names (`.gopclntab`; `.data.rel.ro.gopclntab`
/// in a position-independent build), else the `runtime.pclntab` symbol, else a scan of the
/// loadable data for the table's header where a Go file lost its section headers. The first
/// table that parses and whose functions lie in executable code.
pub fn find<'d>(file: &object::File<'d>) -> Result<Found<'d>, NoTable> {
    let text = text_start(file);
    let candidates: Box<dyn Iterator<Item = Candidate<'d>> + '_> = match section(file) {
        Some(found) => Box::new(std::iter::once(found)),
        // Past the sections every file has a name for, only in files that look like Go (or have
        // no sections to tell): a C library's symbols are not searched at every load.
        None if !looks_like_go(file) => return Err(NoTable::Absent),
        None => match symbol(file) {
            Some(found) => Box::new(std::iter::once(found)),
            None => Box::new(scan(file)),
        },
    };
    let mut refusal = NoTable::Absent;
    for (data, file_offset) in candidates {
        match Pclntab::parse(data, text) {
            Ok(table) if in_text(file, &table) => {
                return Ok(Found {
                    table,
                    file_offset,
                    text,
                })
            }
            Ok(_) => refusal = NoTable::Misplaced,
            Err(e) => refusal = NoTable::Refused(e),
        }
    }
    Err(refusal)
}

/// Whether the table's functions lie in one executable segment of the file.
fn in_text(file: &object::File<'_>, table: &Pclntab<'_>) -> bool {
    let Some((first, end)) = table.range() else {
        return false;
    };
    file.segments().filter(|s| executable(s)).any(|s| {
        let seg_end = s.address().saturating_add(s.size());
        s.address() <= first && first <= end && end <= seg_end
    })
}

fn executable(segment: &object::Segment<'_, '_>) -> bool {
    match segment.flags() {
        SegmentFlags::Elf { p_flags } => p_flags & object::elf::PF_X != 0,
        _ => true,
    }
}

/// The table's bytes (to the end of their segment: the header says where each part is) and
/// their file offset.
type Candidate<'d> = (&'d [u8], u64);

fn section<'d>(file: &object::File<'d>) -> Option<Candidate<'d>> {
    [".gopclntab", ".data.rel.ro.gopclntab"]
        .iter()
        .filter_map(|name| file.section_by_name(name))
        .find_map(|s| Some((s.data().ok()?, s.file_range()?.0)))
}

fn symbol<'d>(file: &object::File<'d>) -> Option<Candidate<'d>> {
    let symbol = file.symbols().find(|s| s.name() == Ok("runtime.pclntab"))?;
    at_address(file, symbol.address())
}

/// The bytes from the virtual address `vaddr` to the end of the loadable segment holding it.
fn at_address<'d>(file: &object::File<'d>, vaddr: u64) -> Option<Candidate<'d>> {
    file.segments().find_map(|segment| {
        let data = segment.data().ok()?;
        let skip = usize::try_from(vaddr.checked_sub(segment.address())?).ok()?;
        Some((
            data.get(skip..).filter(|d| !d.is_empty())?,
            segment.file_range().0.checked_add(skip as u64)?,
        ))
    })
}

fn looks_like_go(file: &object::File<'_>) -> bool {
    let go = [".go.buildinfo", ".note.go.buildid"];
    file.sections().next().is_none() || go.iter().any(|n| file.section_by_name(n).is_some())
}

/// Where a Go file lost its section headers: the table's header in its loadable data (the
/// magic, two zero bytes, a pc quantum of 1 or 4 and 8-byte pointers), 8-byte aligned as the
/// linker places it. Lazily: the search stops at the first table `find` takes.
fn scan<'d, 'f>(file: &'f object::File<'d>) -> impl Iterator<Item = Candidate<'d>> + 'f {
    let data = file.segments().filter(|s| !executable(s));
    data.filter_map(|s| Some((s.data().ok()?, s.file_range().0)))
        .flat_map(|(data, offset)| {
            let at = (0..data.len() / 8).map(|i| i * 8);
            at.filter(move |&i| {
                matches!(
                    data[i..i + 8],
                    [0xfa | 0xf0 | 0xf1, 0xff, 0xff, 0xff, 0, 0, 1 | 4, 8]
                )
            })
            .filter_map(move |i| Some((&data[i..], offset.checked_add(i as u64)?)))
        })
}

/// Where the Go text starts, for a table whose header leaves it 0 (Go 1.26): the module data's
/// `text` field (its 23rd word, in `.go.module`), else the `runtime.text` symbol (the linker's
/// own mark; cgo's C code may come first in `.text`), else the `.text` section.
fn text_start(file: &object::File<'_>) -> u64 {
    let module = file
        .section_by_name(".go.module")
        .and_then(|s| s.data().ok())
        .and_then(|d| pclntab::read_word(d, 22 * 8, 8))
        .filter(|&t| t != 0);
    let symbol = || {
        let found = file.symbols().find(|s| s.name() == Ok("runtime.text"));
        found.map(|s| s.address()).filter(|&t| t != 0)
    };
    module
        .or_else(symbol)
        .or_else(|| file.section_by_name(".text").map(|s| s.address()))
        .unwrap_or(0)
}

#[cfg(test)]
mod fixtures;
#[cfg(test)]
mod go_builds;
#[cfg(test)]
mod hostile;
#[cfg(test)]
mod tests;
