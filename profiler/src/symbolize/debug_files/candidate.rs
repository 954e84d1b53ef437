//! Whether a file found by name is a binary's debug file. Names come from places the profiled
//! program controls (its directory, its debug link), so a candidate is opened without blocking
//! (a FIFO), never as a terminal, only if it is a regular file, and read in bounded pieces.
use std::{
    cell::RefCell,
    collections::HashMap,
    fs::{File, Metadata},
    os::unix::fs::{FileExt as _, MetadataExt as _, OpenOptionsExt as _},
    path::Path,
};

use object::{Object as _, ObjectSymbolTable as _};

use super::{
    facts::{has_dwarf, text_of, Facts},
    hex,
};
use crate::process::elf_build_id;

/// A candidate larger than this is refused (no debug file is; its CRC would be read whole).
pub(super) const MAX_DEBUG_FILE: u64 = 4 << 30;

/// CRCs kept, by file identity; beyond, they are forgotten and read again.
const CACHED_CRCS: usize = 1024;

/// Whether a symlink at the end of a path is followed: yes in the debug dirs (Fedora's
/// `.build-id/` entries are symlinks), no where the profiled program chose the name.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Links {
    Follow,
    Refuse,
}

/// `path` open for reading if it is a regular file (checked before opening, so no device is
/// opened, and again on the open file).
pub(super) fn open_regular(path: &Path, links: Links) -> Option<(File, Metadata)> {
    let before = match links {
        Links::Follow => std::fs::metadata(path),
        Links::Refuse => std::fs::symlink_metadata(path),
    };
    if !before.ok()?.is_file() {
        return None;
    }
    let mut flags = libc::O_NONBLOCK | libc::O_NOCTTY;
    if links == Links::Refuse {
        flags |= libc::O_NOFOLLOW;
    }
    let file = File::options().read(true).custom_flags(flags).open(path).ok()?;
    let meta = file.metadata().ok()?;
    meta.is_file().then_some((file, meta))
}

/// Candidates' CRCs by (device, inode, size, mtime): read once per file version.
#[derive(Default)]
pub(super) struct Crcs(RefCell<HashMap<(u64, u64, u64, i64), u32>>);

impl Crcs {
    fn of(&self, file: &File, meta: &Metadata) -> Option<u32> {
        let key = (
            meta.dev(),
            meta.ino(),
            meta.len(),
            meta.mtime_nsec() + meta.mtime() * 1_000_000_000,
        );
        if let Some(&crc) = self.0.borrow().get(&key) {
            return Some(crc);
        }
        let crc = crc_of(file)?;
        let mut crcs = self.0.borrow_mut();
        if crcs.len() >= CACHED_CRCS {
            crcs.clear();
        }
        crcs.insert(key, crc);
        Some(crc)
    }
}

/// The CRC-32 a debug link records, of the whole file, read in pieces.
fn crc_of(file: &File) -> Option<u32> {
    let mut hasher = crc32fast::Hasher::new();
    let mut buf = vec![0; 1 << 16];
    let mut at = 0;
    loop {
        match file.read_at(&mut buf, at) {
            Ok(0) => return Some(hasher.finalize()),
            Ok(n) => {
                hasher.update(&buf[..n]);
                at += n as u64;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
}

/// Whether `path` is a debug file for the binary: a regular ELF file with symbols or DWARF the
/// binary lacks, the binary's build id (if both have one: then the CRC adds nothing),
/// else the link's CRC (if it came by a link). A refused file that exists is said in `problems`.
pub(super) fn accept(
    crcs: &Crcs,
    path: &Path,
    facts: &Facts,
    (crc, links): (Option<u32>, Links),
    problems: &mut Vec<String>,
) -> bool {
    let Some((file, meta)) = open_regular(path, links) else {
        return false;
    };
    let shown = path.display();
    if meta.len() > MAX_DEBUG_FILE {
        problems.push(format!(
            "{shown}: {} bytes, more than a debug file's bound of {MAX_DEBUG_FILE}, ignored",
            meta.len()
        ));
        return false;
    }
    let cache = object::ReadCache::new(&file);
    let Ok(elf) = object::File::parse(&cache) else {
        problems.push(format!("{shown}: not an ELF file, ignored"));
        return false;
    };
    match (elf_build_id(&elf), facts.build_id.as_deref()) {
        (Some(id), Some(want)) if id != want => {
            problems.push(format!(
                "{shown}: build id {} is not the binary's {}, ignored",
                hex(&id),
                hex(want)
            ));
            return false;
        }
        (Some(_), Some(_)) => {
            // The same build id, and yet another binary's code: a note that lies (or collides).
            if let (Some(want), Some(got)) = (facts.text, text_of(&elf)) {
                if want != got {
                    problems.push(format!(
                        "{shown}: its .text ({:#x}, {} bytes) is not the binary's ({:#x}, {} bytes) though their build ids match, ignored",
                        got.0, got.1, want.0, want.1
                    ));
                    return false;
                }
            }
        }
        _ => {
            if let Some(want) = crc {
                let got = crcs.of(&file, &meta);
                if got != Some(want) {
                    let got = got.map_or("unreadable".into(), |c| format!("{c:#010x}"));
                    problems.push(format!(
                        "{shown}: CRC {got} where the debug link says {want:#010x}, ignored"
                    ));
                    return false;
                }
            }
        }
    }
    let symtab = elf.symbol_table().is_some_and(|t| t.symbols().nth(1).is_some());
    has_dwarf(&elf) || (symtab && !facts.symtab)
}
