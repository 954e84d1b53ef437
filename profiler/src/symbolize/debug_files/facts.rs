//! What a binary says about itself (build id, debug link, symbol sections, segments, `.text`),
//! read once per file, and whether its program headers are safe to hand to blazesym.
use std::path::Path;

use object::{Object as _, ObjectSection as _, ObjectSegment as _, ObjectSymbolTable as _};

use super::{
    candidate::{open_regular, Links},
    Origin,
};
use crate::{
    process::elf_build_id,
    unwind::{segments_of, Segment},
};

/// What the binary says about itself.
pub(super) struct Facts {
    pub build_id: Option<Vec<u8>>,
    pub debuglink: Option<(String, u32)>,
    pub dwarf: bool,
    pub symtab: bool,
    pub debugdata: bool,
    pub dynsym: bool,
    pub segments: Vec<Segment>,
    /// Where its `.text` is and how long (a debug file keeps both): a candidate whose `.text`
    /// differs is another binary's, whatever build id it claims.
    pub text: Option<(u64, u64)>,
    /// A program header whose end is past 2^64 (in the file or in memory), or a table blazesym
    /// would read otherwise than `object` does: blazesym adds them up unchecked, so such a
    /// file is not handed to it.
    pub headers_overflow: bool,
}

impl Facts {
    pub fn read(path: &Path) -> Option<Facts> {
        let (file, _) = open_regular(path, Links::Follow)?;
        let map = map(&file)?;
        let elf = object::File::parse(&*map).ok()?;
        let raw = RawElf(&map);
        Some(Facts {
            build_id: elf_build_id(&elf),
            debuglink: elf
                .gnu_debuglink()
                .ok()
                .flatten()
                .and_then(|(name, crc)| Some((plain_name(name)?, crc))),
            dwarf: has_dwarf(&elf),
            symtab: elf.symbol_table().is_some_and(|t| t.symbols().nth(1).is_some()),
            debugdata: elf.section_by_name(".gnu_debugdata").is_some(),
            dynsym: elf
                .dynamic_symbol_table()
                .is_some_and(|t| t.symbols().nth(1).is_some()),
            segments: segments_of(&elf),
            text: text_of(&elf),
            headers_overflow: headers_overflow(&elf)
                || !raw.program_header_size_is_standard()
                || raw.load_headers_overflow(),
        })
    }

    /// What the binary names by itself when no debug file is found.
    pub fn own(&self) -> Origin {
        if self.dwarf || self.symtab {
            Origin::OwnSymbols
        } else if self.debugdata {
            Origin::Minidebuginfo
        } else if self.dynsym {
            Origin::Dynsym
        } else {
            Origin::None
        }
    }
}

/// An ELF file's header fields read straight from its bytes, as blazesym reads them (it does
/// not ask `object`, which refuses or reads differently some tables blazesym accepts).
struct RawElf<'d>(&'d [u8]);

impl RawElf<'_> {
    fn is_64(&self) -> bool {
        self.0.get(4) == Some(&2)
    }

    /// `N` bytes at `at` in the file's byte order; `None` past the end.
    fn bytes<const N: usize>(&self, at: usize) -> Option<[u8; N]> {
        let mut bytes: [u8; N] = self.0.get(at..at.checked_add(N)?)?.try_into().ok()?;
        if self.0.get(5) != Some(&2) {
            bytes.reverse(); // little-endian: most significant byte last
        }
        Some(bytes)
    }

    fn u16(&self, at: usize) -> Option<u16> {
        self.bytes(at).map(u16::from_be_bytes)
    }

    fn u32(&self, at: usize) -> Option<u32> {
        self.bytes(at).map(u32::from_be_bytes)
    }

    fn u64(&self, at: usize) -> Option<u64> {
        self.bytes(at).map(u64::from_be_bytes)
    }

    /// Whether the program-header entry size is the standard one (56 bytes in ELF64, 32 in
    /// ELF32) or there are none: blazesym reads the table at the standard size whatever the
    /// header says, where `object` refuses it (so its segments could not be checked here).
    fn program_header_size_is_standard(&self) -> bool {
        let (size_at, standard) = if self.is_64() { (54, 56) } else { (42, 32) };
        match (self.u16(size_at), self.u16(size_at + 2)) {
            (Some(size), Some(count)) => count == 0 || size == standard,
            _ => false,
        }
    }

    /// An ELF64 file's `PT_LOAD` headers read as blazesym reads them (at `e_phoff`, `e_phnum`
    /// of 56 bytes): whether one ends past 2^64 in the file or in memory. A table that cannot
    /// be read (cut short, `PN_XNUM`) counts as one.
    fn load_headers_overflow(&self) -> bool {
        const PT_LOAD: u32 = 1;
        if !self.is_64() {
            return false;
        }
        let (Some(table), Some(count)) = (self.u64(32), self.u16(56)) else {
            return true;
        };
        if count == 0xffff {
            return true;
        }
        let overflows = |at: usize| -> Option<bool> {
            if self.u32(at)? != PT_LOAD {
                return Some(false);
            }
            let (offset, vaddr, filesz) = (self.u64(at + 8)?, self.u64(at + 16)?, self.u64(at + 32)?);
            Some(offset.checked_add(filesz).is_none() || vaddr.checked_add(filesz).is_none())
        };
        (0..count as u64).any(|n| overflows(table.saturating_add(n * 56) as usize).unwrap_or(true))
    }
}

fn headers_overflow<'d, R: object::ReadRef<'d>>(elf: &object::File<'d, R>) -> bool {
    elf.segments().any(|s| {
        let (offset, size) = s.file_range();
        offset.checked_add(size).is_none() || s.address().checked_add(s.size().max(size)).is_none()
    })
}

/// The address and size of a file's `.text`.
pub(super) fn text_of<'d, R: object::ReadRef<'d>>(elf: &object::File<'d, R>) -> Option<(u64, u64)> {
    elf.section_by_name(".text")
        .map(|text| (text.address(), text.size()))
}

pub(super) fn has_dwarf<'d, R: object::ReadRef<'d>>(elf: &object::File<'d, R>) -> bool {
    [".debug_info", ".zdebug_info"]
        .iter()
        .any(|name| elf.section_by_name(name).is_some_and(|s| s.size() > 0))
}

/// A debug link names a file in a directory: nothing with a `/`, nothing empty or dotted.
pub(super) fn plain_name(name: &[u8]) -> Option<String> {
    let name = std::str::from_utf8(name).ok()?;
    let plain = !name.is_empty() && !name.contains('/') && name != "." && name != "..";
    plain.then(|| name.to_string())
}

pub(super) fn map(file: &std::fs::File) -> Option<memmap2::Mmap> {
    // SAFETY: read-only and private: a file truncated under us would fault, as for every
    // binary blazesym maps; debug files and binaries are replaced (a new inode), not truncated.
    unsafe { memmap2::Mmap::map(file) }.ok()
}
