//! Names from a Go binary's own table, for the addresses blazesym could not name (a `-s -w` or
//! distribution-stripped Go binary has no `.symtab` and no DWARF).
use std::path::Path;

use crate::{
    process::map_file,
    unwind::{segments_of, Segment},
};

/// A Go function found by the table: what a frame shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GoName {
    pub function: String,
    pub file: Option<String>,
    pub line: Option<u32>,
    /// The function's entry, in the file's virtual addresses.
    pub start: u64,
    pub offset: u64,
}

/// One file's Go table, found once; looked up by file offset.
pub struct GoNames {
    data: memmap2::Mmap,
    /// Where the table starts in the file, and the text start its entries are offsets from.
    table_at: usize,
    text: u64,
    segments: Vec<Segment>,
}

impl GoNames {
    /// The file's table; None when it has none bpfprof reads.
    pub fn open(path: &Path) -> Option<GoNames> {
        let data = map_file(path).ok()?;
        let file = object::File::parse(&*data).ok()?;
        let found = super::find(&file)
            .map_err(|e| log::debug!("{}: {e}", path.display()))
            .ok()?;
        let (table_at, text, segments) = (
            usize::try_from(found.file_offset).ok()?,
            found.text,
            segments_of(&file),
        );
        drop(file);
        Some(GoNames {
            data,
            table_at,
            text,
            segments,
        })
    }

    /// The Go function holding the instruction at `file_offset`.
    pub fn lookup(&self, file_offset: u64) -> Option<GoName> {
        let vaddr = self.segments.iter().find_map(|s| s.vaddr(file_offset))?;
        let table = super::Pclntab::parse(self.data.get(self.table_at..)?, self.text).ok()?;
        let func = table.find(vaddr)?;
        Some(GoName {
            function: table.name(&func)?.to_string(),
            file: table.file(&func, vaddr).map(str::to_string),
            line: table.line(&func, vaddr),
            start: func.entry,
            offset: vaddr - func.entry,
        })
    }
}
