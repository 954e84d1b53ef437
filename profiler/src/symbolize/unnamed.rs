//! Frames blazesym could not name (a stripped file, a Go binary without `.symtab`, or a file
//! it failed on as a whole): named from the file's own tables where they name functions, else
//! placed in the function its unwind table bounds, else kept by module and address. Nothing is
//! dropped: every address stays a frame.
//!
//! Where an address is in its file (build id, virtual address) comes from what the debug-file
//! locator already read of the file's headers. The costly tables (the unwind table's function
//! bounds, Go's table) are read once per file at the first address that needs them, and kept
//! across batches by file identity (`Layouts`), so an agent does not read a big stripped
//! binary's tables again at every window.
use super::{
    bounds::{placed_frame, FunctionBounds},
    debug_files::Located,
    Frame, NameKind, ObjectRef,
};
use crate::{
    golang::names::GoNames,
    process::{FileIdentity, MappedFile},
};

/// Files whose tables are kept; beyond, the least recently used file's are dropped.
pub(super) const LAYOUT_FILES: usize = 64;

/// One file's tables for code nothing names, each read at the first address that needs it.
#[derive(Default)]
pub(super) struct FileLayout {
    bounds: Option<FunctionBounds>,
    /// None: not opened (yet, or since it was released); Some(None): the file has none.
    go: Option<Option<GoNames>>,
}

impl FileLayout {
    fn bounds(&mut self, mapped: &MappedFile, reads: &mut usize) -> &FunctionBounds {
        self.bounds.get_or_insert_with(|| {
            *reads += 1;
            FunctionBounds::read(&mapped.read_path())
        })
    }

    fn go(&mut self, mapped: &MappedFile, reads: &mut usize) -> Option<&GoNames> {
        self.go
            .get_or_insert_with(|| {
                *reads += 1;
                GoNames::open(&mapped.read_path())
            })
            .as_ref()
    }

    /// Whether it holds a mapping of the file (the Go table reads the file as it is mapped).
    fn is_mapped(&self) -> bool {
        matches!(self.go, Some(Some(_)))
    }
}

/// Per-file layouts kept across batches, at most `LAYOUT_FILES`, most recently used last.
#[derive(Default)]
pub(super) struct Layouts {
    files: Vec<(FileIdentity, FileLayout)>,
    /// Tables read from files so far (what the cache saves).
    pub(super) reads: usize,
}

impl Layouts {
    /// The file's layout (a new, empty one for a file not kept, or not told apart).
    fn take(&mut self, identity: Option<FileIdentity>) -> FileLayout {
        let at = identity.and_then(|id| self.files.iter().position(|(f, _)| *f == id));
        at.map(|i| self.files.remove(i).1).unwrap_or_default()
    }

    /// Keeps the file's layout (if anything was read), as the most recently used; the oldest goes
    /// beyond the bound.
    fn keep(&mut self, identity: Option<FileIdentity>, layout: FileLayout) {
        let read = layout.bounds.is_some() || layout.go.is_some();
        let Some(identity) = identity.filter(|_| read) else {
            return;
        };
        if self.files.len() >= LAYOUT_FILES {
            self.files.remove(0);
        }
        self.files.push((identity, layout));
    }

    /// Between profiles: lets go of the files' mappings (a Go table is opened again when next
    /// needed, cheaply: its header only); the function bounds, read from the whole unwind
    /// table, stay.
    pub(super) fn release(&mut self) {
        for (_, layout) in &mut self.files {
            if layout.is_mapped() {
                layout.go = None;
            }
        }
    }

    pub(super) fn len(&self) -> usize {
        self.files.len()
    }
}

/// Where a file's addresses are, from what the locator read of its headers: no parse per
/// address, the build id spelled once per batch.
pub(super) struct Place<'l> {
    located: &'l Located,
    build_id: Option<String>,
}

impl<'l> Place<'l> {
    pub(super) fn new(located: &'l Located) -> Self {
        Self {
            located,
            build_id: located.build_id_hex(),
        }
    }

    pub(super) fn object(&self, file_offset: u64) -> ObjectRef {
        ObjectRef {
            build_id: self.build_id.clone(),
            file_offset: Some(file_offset),
            vaddr: self.located.vaddr_of(file_offset),
        }
    }
}

/// One file's fallbacks, for one batch of its addresses: its layout taken from `Layouts` for
/// the batch, and given back (`finish`).
pub(super) struct Unnamed<'a> {
    mapped: &'a MappedFile,
    place: &'a Place<'a>,
    layout: FileLayout,
    reads: usize,
}

impl<'a> Unnamed<'a> {
    pub(super) fn new(mapped: &'a MappedFile, place: &'a Place<'a>, layouts: &mut Layouts) -> Self {
        Self {
            mapped,
            place,
            layout: layouts.take(mapped.identity),
            reads: 0,
        }
    }

    /// Gives the layout back to be kept.
    pub(super) fn finish(self, layouts: &mut Layouts) {
        layouts.reads += self.reads;
        layouts.keep(self.mapped.identity, self.layout);
    }

    /// The frames of the address at `offset` in the file (mapped at `address`).
    pub(super) fn frames(&mut self, offset: u64, address: u64) -> Vec<Frame> {
        let object = self.place.object(offset);
        if let Some(frame) = self.go_frame(offset, address, &object) {
            return vec![frame];
        }
        let bounds = self.layout.bounds(self.mapped, &mut self.reads);
        vec![placed_frame(&self.mapped.path, address, object, bounds)]
    }

    /// A Go function from the file's own table (`.gopclntab`), with its source file and line.
    fn go_frame(&mut self, offset: u64, address: u64, object: &ObjectRef) -> Option<Frame> {
        let name = self.layout.go(self.mapped, &mut self.reads)?.lookup(offset)?;
        Some(Frame {
            function: name.function,
            file: name.file,
            line: name.line,
            start: Some(name.start),
            offset: Some(name.offset),
            kind: NameKind::GoTable,
            object: Some(object.clone()),
            ..Frame::unknown(&self.mapped.path, address, false)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(inode: u64) -> Option<FileIdentity> {
        Some(FileIdentity {
            dev: 1,
            inode,
            size: 3,
            mtime_ns: 4,
        })
    }

    #[test]
    fn layouts_are_kept_per_file_and_bounded_the_least_recently_used_dropped() {
        let mut layouts = Layouts::default();
        for inode in 0..LAYOUT_FILES as u64 {
            let layout = FileLayout {
                bounds: Some(FunctionBounds::new(vec![(inode, inode + 1)])),
                go: Some(None),
            };
            layouts.keep(identity(inode), layout);
        }
        // File 0 used again: file 1 is now the oldest.
        let used = layouts.take(identity(0));
        assert!(used.bounds.is_some());
        layouts.keep(identity(0), used);
        layouts.keep(
            identity(1000),
            FileLayout {
                bounds: None,
                go: Some(None),
            },
        );
        println!("{} layouts kept", layouts.len());
        assert_eq!(layouts.len(), LAYOUT_FILES);
        assert!(layouts.take(identity(1)).bounds.is_none(), "dropped");
        assert!(layouts.take(identity(0)).bounds.is_some(), "kept");
        // A file not told apart is never kept, nor one with nothing read.
        let before = layouts.len();
        layouts.keep(
            None,
            FileLayout {
                bounds: None,
                go: Some(None),
            },
        );
        layouts.keep(identity(2000), FileLayout::default());
        assert_eq!(layouts.len(), before);
    }
}
