//! CPython, user-space half: which files are an interpreter (`Interpreter::of`), the layout of
//! each version the walker reads (from a table checked against each version's headers, or from
//! the interpreter's own description of itself in 3.13), and the names of the code objects the
//! walker puts in stacks (`code`).
pub mod code;

use object::{Object as _, ObjectSection as _, ObjectSymbol as _};
use profiler_common::python::{model, PyOffsets, NO_CFRAME};

pub use code::{PyCode, PyCodes};

/// An interpreter's file: where its evaluation loop and runtime state are (ELF virtual
/// addresses), and its layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Interpreter {
    pub eval_start: u64,
    pub eval_end: u64,
    pub runtime: u64,
    pub layout: Layout,
}

/// Why a file that is an interpreter has no Python frames read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Unsupported {
    #[error("Python {0}.{1}: its frames are not read (3.10 to 3.13 are); profiled natively")]
    Version(u8, u8),
    #[error("Python {0}.{1} built free-threaded: its frames are not read; profiled natively")]
    FreeThreaded(u8, u8),
    #[error("a Python that does not say its version (no Py_Version, and not 3.10's symbols: 3.9 or older?): its frames are not read (3.10 to 3.13 are); profiled natively")]
    NoVersion,
}

/// Where things are in one version's structures: what the walker reads (`walker`) and what
/// naming a code object reads (`code`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub version: (u8, u8),
    pub walker: PyOffsets,
    pub code: CodeLayout,
}

/// Offsets in a code object and in the string and bytes objects it points to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CodeLayout {
    pub qualname: u16,
    pub filename: u16,
    pub first_line: u16,
    pub line_table: u16,
    /// Where the bytecode starts in the code object (`co_code_adaptive`).
    pub bytecode: u16,
    /// `sizeof(PyASCIIObject)`: an ASCII string's characters follow it.
    pub ascii_header: u16,
    /// `sizeof(PyCompactUnicodeObject)`: another compact string's characters follow it.
    pub compact_header: u16,
    pub lines: LineTable,
}

/// How a code object's line table is laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LineTable {
    /// 3.11 and later: the location table (`Objects/locations.md`).
    Locations,
    /// 3.10: (bytecode bytes, line delta) byte pairs (`Objects/lnotab_notes.txt`).
    Pairs,
}

/// Offsets shared by the versions read: a string's length and state, a bytes object's size
/// and data.
pub const UNICODE_LENGTH: u64 = 16;
pub const UNICODE_STATE: u64 = 32;
pub const BYTES_SIZE: u64 = 16;
pub const BYTES_DATA: u64 = 32;

/// Where glibc keeps a thread's tid in its descriptor (`struct pthread`, what a `pthread_t`
/// points at), as its `_thread_db_pthread_tid` says (the unit tests read it from the machine's
/// C libraries): 3.10's thread states hold a `pthread_t`, not the tid.
const PTHREAD_TID: u16 = if cfg!(target_arch = "aarch64") { 208 } else { 720 };

/// The layouts known, from each version's headers (`offsetof` in a program built against
/// them: the unit tests build it and check the table so).
const LAYOUTS: [Layout; 4] = [
    Layout {
        version: (3, 10),
        walker: PyOffsets {
            runtime_interpreters: 32,
            interp_threads: 8,
            tstate_next: 8,
            tstate_native_id: 176,
            tstate_frame: 24,
            cframe_frame: NO_CFRAME,
            frame_code: 32,
            frame_previous: 24,
            frame_instr: 96,
            // No marker (not read): every frame is an activation's one.
            frame_marker: 0,
            pthread_tid: PTHREAD_TID,
            model: model::ONE_FRAME,
            _pad: [0; 1],
        },
        code: CodeLayout {
            // 3.10's code objects have no qualified name: `co_name`.
            qualname: 112,
            filename: 104,
            first_line: 40,
            line_table: 120,
            // The walker gives the offset into the bytecode itself.
            bytecode: 0,
            ascii_header: 48,
            compact_header: 72,
            lines: LineTable::Pairs,
        },
    },
    Layout {
        version: (3, 11),
        walker: PyOffsets {
            runtime_interpreters: 40,
            interp_threads: 16,
            tstate_next: 8,
            tstate_native_id: 160,
            tstate_frame: 56,
            cframe_frame: 8,
            frame_code: 32,
            frame_previous: 48,
            frame_instr: 56,
            frame_marker: 68,
            pthread_tid: 0,
            model: model::ENTRY_FLAG,
            _pad: [0; 1],
        },
        code: CodeLayout {
            qualname: 128,
            filename: 112,
            first_line: 72,
            line_table: 136,
            bytecode: 184,
            ascii_header: 48,
            compact_header: 72,
            lines: LineTable::Locations,
        },
    },
    Layout {
        version: (3, 12),
        walker: PyOffsets {
            runtime_interpreters: 40,
            interp_threads: 72,
            tstate_next: 8,
            tstate_native_id: 144,
            tstate_frame: 56,
            cframe_frame: 0,
            frame_code: 0,
            frame_previous: 8,
            frame_instr: 56,
            frame_marker: 70,
            pthread_tid: 0,
            model: model::CSTACK_FRAME,
            _pad: [0; 1],
        },
        code: CodeLayout {
            qualname: 128,
            filename: 112,
            first_line: 68,
            line_table: 136,
            bytecode: 192,
            ascii_header: 40,
            compact_header: 56,
            lines: LineTable::Locations,
        },
    },
    Layout {
        version: (3, 13),
        walker: PyOffsets {
            runtime_interpreters: 632,
            interp_threads: 7344,
            tstate_next: 8,
            tstate_native_id: 160,
            tstate_frame: 72,
            cframe_frame: NO_CFRAME,
            frame_code: 0,
            frame_previous: 8,
            frame_instr: 56,
            frame_marker: 70,
            pthread_tid: 0,
            model: model::CSTACK_FRAME,
            _pad: [0; 1],
        },
        code: CodeLayout {
            qualname: 128,
            filename: 112,
            first_line: 68,
            line_table: 136,
            bytecode: 200,
            ascii_header: 40,
            compact_header: 56,
            lines: LineTable::Locations,
        },
    },
];

/// The known layout of a version.
pub fn layout(version: (u8, u8)) -> Option<Layout> {
    LAYOUTS.into_iter().find(|l| l.version == version)
}

impl Interpreter {
    /// The interpreter `file` is (a `libpython3.X.so` or a python built statically): None for
    /// any other file; an error for an interpreter whose frames are not read.
    pub fn of(file: &object::File) -> Option<Result<Interpreter, Unsupported>> {
        let (mut eval, mut runtime, mut version) = (None, None, None);
        let (mut py_is, mut block_setup) = (false, false);
        for symbol in file.dynamic_symbols().chain(file.symbols()) {
            let range = (symbol.address(), symbol.address().checked_add(symbol.size()));
            match symbol.name() {
                Ok("_PyEval_EvalFrameDefault") => eval = Some(range),
                Ok("_PyRuntime") => runtime = Some(symbol.address()),
                Ok("Py_Version") => version = Some(symbol.address()),
                // 3.10 does not say its version (`Py_Version` came in 3.11): it is the one that
                // has both `Py_Is` (new in 3.10) and `PyFrame_BlockSetup` (gone in 3.11).
                Ok("Py_Is") => py_is = true,
                Ok("PyFrame_BlockSetup") => block_setup = true,
                _ => {}
            }
        }
        let version = match (version, py_is && block_setup) {
            (Some(at), _) => Some(Version::At(at)),
            (None, true) => Some(Version::Known((3, 10))),
            (None, false) => None,
        };
        let range = |(start, end): (u64, Option<u64>)| Some((start, end.filter(|&end| end > start)?));
        let ((eval_start, eval_end), runtime) = (eval.and_then(range)?, runtime?);
        Some(Self::read(file, version, runtime).map(|layout| Interpreter {
            eval_start,
            eval_end,
            runtime,
            layout,
        }))
    }

    /// The layout of the interpreter of `version`: its own description where it has one
    /// (3.13), else the table's.
    fn read(file: &object::File, version: Option<Version>, runtime: u64) -> Result<Layout, Unsupported> {
        let version = match version.ok_or(Unsupported::NoVersion)? {
            Version::Known(version) => version,
            Version::At(at) => {
                let hex = read_at(file, at, 4)
                    .map(|b| u32::from_le_bytes(b.try_into().unwrap_or_default()))
                    .ok_or(Unsupported::NoVersion)?;
                ((hex >> 24) as u8, (hex >> 16) as u8)
            }
        };
        if let Some(described) =
            read_at(file, runtime, DEBUG_OFFSETS_READ).and_then(|b| described(b, version))
        {
            return described;
        }
        layout(version).ok_or(Unsupported::Version(version.0, version.1))
    }
}

/// How an interpreter says its version: `Py_Version`'s address (3.11 and later), or known by
/// what it exports (3.10).
enum Version {
    At(u64),
    Known((u8, u8)),
}

/// Bytes of `_Py_DebugOffsets` read: through the Unicode object's offsets.
const DEBUG_OFFSETS_READ: u64 = 71 * 8;

/// The layout a 3.13 interpreter describes at the start of its `_PyRuntime`
/// (`_Py_DebugOffsets`, statically initialized, so in the file): None where there is no such
/// description (before 3.13), an error for a free-threaded build, and for a later version
/// (whose description is laid out differently) the table's word that it is not known.
fn described(bytes: &[u8], version: (u8, u8)) -> Option<Result<Layout, Unsupported>> {
    if bytes.get(..8)? != b"xdebugpy" {
        return None;
    }
    let word =
        |i: usize| -> Option<u64> { Some(u64::from_le_bytes(bytes.get(i * 8..i * 8 + 8)?.try_into().ok()?)) };
    if word(2)? != 0 {
        return Some(Err(Unsupported::FreeThreaded(version.0, version.1)));
    }
    if version != (3, 13) {
        return Some(Err(Unsupported::Version(version.0, version.1)));
    }
    let field = |i: usize| word(i).and_then(|w| u16::try_from(w).ok());
    let layout = Layout {
        version,
        walker: PyOffsets {
            runtime_interpreters: field(5)?,
            interp_threads: field(9)?,
            tstate_next: field(21)?,
            tstate_native_id: field(25)?,
            tstate_frame: field(23)?,
            cframe_frame: NO_CFRAME,
            frame_code: field(30)?,
            frame_previous: field(29)?,
            frame_instr: field(31)?,
            frame_marker: field(33)?,
            pthread_tid: 0,
            model: model::CSTACK_FRAME,
            _pad: [0; 1],
        },
        code: CodeLayout {
            qualname: field(37)?,
            filename: field(35)?,
            first_line: field(39)?,
            line_table: field(38)?,
            bytecode: field(43)?,
            ascii_header: field(70)?,
            // Its UTF-8 length and pointer after the ASCII header (3.12 and later).
            compact_header: field(70)?.checked_add(16)?,
            lines: LineTable::Locations,
        },
    };
    Some(Ok(layout))
}

/// `len` bytes of the file's image at virtual address `at`, from the section holding them.
fn read_at<'d>(file: &object::File<'d>, at: u64, len: u64) -> Option<&'d [u8]> {
    let section = file.sections().find(|s| {
        s.address() <= at
            && at
                .checked_add(len)
                .is_some_and(|end| end <= s.address().saturating_add(s.size()))
    })?;
    let data = section.data().ok()?;
    let from = usize::try_from(at - section.address()).ok()?;
    data.get(from..from.checked_add(usize::try_from(len).ok()?)?)
}

#[cfg(test)]
mod tests;
