//! USDT probes (`usdt:FILE:PROVIDER:NAME`): the static probe sites a program was built with,
//! described in its `.note.stapsdt` notes (SystemTap's format, as DTRACE_PROBE and sys/sdt.h
//! write them). Each note gives the probe's address (moved by the difference between its
//! `.stapsdt.base` section's address and the base recorded in the note, should the file have
//! been prelinked) and its semaphore's, a counter the program tests before preparing the probe's
//! arguments: the kernel raises it in every process while a probe on the site is attached
//! (`ref_ctr_offset`), and lowers it after.
use object::{
    read::elf::{ElfFile64, SectionHeader as _},
    Endianness, Object as _, ObjectSection as _,
};

/// One USDT probe site, as the kernel's uprobe PMU takes it: file offsets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Site {
    pub provider: String,
    pub name: String,
    /// The site's instruction, as an address of the file's and (`crate::counters::probe`
    /// converts) its offset.
    pub address: u64,
    /// Its semaphore's address, if it has one.
    pub semaphore: Option<u64>,
}

const NT_STAPSDT: u32 = 3;

/// Every USDT site of an ELF file (none when it has no `.note.stapsdt`, or is not 64-bit ELF).
pub fn sites(object: &object::File<'_>, data: &[u8]) -> Vec<Site> {
    let Ok(elf) = ElfFile64::<Endianness>::parse(data) else {
        return Vec::new();
    };
    let base = object.section_by_name(".stapsdt.base").map(|s| s.address());
    let endian = elf.endian();
    let mut found = Vec::new();
    for section in elf.elf_section_table().iter() {
        let Ok(Some(mut notes)) = section.notes(endian, data) else {
            continue;
        };
        while let Ok(Some(note)) = notes.next() {
            if note.name() != b"stapsdt" || note.n_type(endian) != NT_STAPSDT {
                continue;
            }
            if let Some(site) = parse(note.desc(), endian, base) {
                found.push(site);
            }
        }
    }
    found
}

/// A note's description: three addresses (the site, the base it was linked at, the
/// semaphore), then the provider, the name and the arguments, each NUL-terminated.
fn parse(desc: &[u8], endian: Endianness, base: Option<u64>) -> Option<Site> {
    let word = |i: usize| -> Option<u64> {
        let bytes: [u8; 8] = desc.get(i * 8..i * 8 + 8)?.try_into().ok()?;
        Some(match endian {
            Endianness::Little => u64::from_le_bytes(bytes),
            Endianness::Big => u64::from_be_bytes(bytes),
        })
    };
    let (pc, linked_base, semaphore) = (word(0)?, word(1)?, word(2)?);
    let mut strings = desc.get(24..)?.split(|b| *b == 0);
    let provider = String::from_utf8_lossy(strings.next()?).into_owned();
    let name = String::from_utf8_lossy(strings.next()?).into_owned();
    let address = match base {
        Some(base) if linked_base != 0 => pc.wrapping_add(base).wrapping_sub(linked_base),
        _ => pc,
    };
    Some(Site {
        provider,
        name,
        address,
        semaphore: (semaphore != 0).then_some(semaphore),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desc(pc: u64, base: u64, semaphore: u64, strings: &[u8]) -> Vec<u8> {
        [
            &pc.to_le_bytes()[..],
            &base.to_le_bytes(),
            &semaphore.to_le_bytes(),
            strings,
        ]
        .concat()
    }

    #[test]
    fn notes_give_the_site_moved_with_its_base_and_the_semaphore() {
        let note = desc(0x4287f3, 0x8cc5a0, 0xa8426e, b"python\0gc__start\0-4@112(%rsp)\0");
        let site = parse(&note, Endianness::Little, Some(0x8cc5a0)).unwrap();
        assert_eq!(
            site,
            Site {
                provider: "python".into(),
                name: "gc__start".into(),
                address: 0x4287f3,
                semaphore: Some(0xa8426e)
            }
        );
        // Prelinked 0x1000 lower than the file now says: the site moves up with it.
        let moved = parse(&note, Endianness::Little, Some(0x8cd5a0)).unwrap();
        assert_eq!(moved.address, 0x4297f3);
        // No semaphore; a truncated note is none.
        let bare = parse(&desc(0x10, 0, 0, b"p\0n\0\0"), Endianness::Little, None).unwrap();
        assert_eq!((bare.address, bare.semaphore), (0x10, None));
        assert!(parse(&note[..20], Endianness::Little, None).is_none());
    }
}
