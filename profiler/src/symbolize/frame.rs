//! A frame of a stack as every report shows it: a function (or the place of code that has no
//! name), its module, where in its file, and how its name was found.
use serde::Serialize;

use super::UNKNOWN;
use crate::report::short_module;

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct Frame {
    pub function: String,
    pub module: String,
    pub file: Option<String>,
    pub line: Option<u32>,
    pub kernel: bool,
    /// Inlined into the frame before it (its caller) at this address.
    pub inlined: bool,
    /// The address looked up (callers' return addresses moved back into the call).
    #[serde(serialize_with = "hex")]
    pub address: u64,
    /// Where the function starts in its file's own address space (as `readelf -s` shows it),
    /// for the machine code of `--annotate`; not for inlined frames. For a frame placed by its
    /// file's unwind table (`NameKind::Fde`), where that table's entry starts.
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "hex_some")]
    pub start: Option<u64>,
    /// Bytes from the function's start to the instruction looked up.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub offset: Option<u64>,
    /// Where the name came from.
    pub kind: NameKind,
    /// Where the address is in its file, for a frame of a file.
    #[serde(flatten)]
    pub object: Option<ObjectRef>,
}

/// Where a frame's name came from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NameKind {
    /// A symbol (or debug information) of the file, or of the kernel.
    #[default]
    Symbol,
    /// Go's own function table (`.gopclntab`).
    GoTable,
    /// Not named: placed in the function the file's unwind table bounds, named
    /// `module+0x<where that function starts>` (an ELF virtual address).
    Fde,
    /// Not named and in no function the unwind table knows: `module+0x<its virtual address>`.
    Address,
    /// JIT code, named by its runtime's perf map (`/tmp/perf-PID.map`).
    PerfMap,
    /// A Python function, named from its code object in the interpreter's memory.
    Python,
    /// Nothing known: `[unknown]` (anonymous memory, the vDSO, no file, a file unreadable).
    None,
}

impl NameKind {
    pub fn as_str(self) -> &'static str {
        match self {
            NameKind::Symbol => "symbol",
            NameKind::GoTable => "go_table",
            NameKind::Fde => "fde",
            NameKind::Address => "address",
            NameKind::PerfMap => "perf_map",
            NameKind::Python => "python",
            NameKind::None => "none",
        }
    }

    /// As JSON writes it; `None` for a name this version does not know.
    /// What pprof's `Function.system_name` holds for a frame of this kind named `name`: the name
    /// itself for a symbol (as other tools write it), else the name and the kind (`x+0x10 [fde]`),
    /// so that the kind reads back (`from_system_name`) whatever the name looks like.
    pub fn system_name(self, name: &str) -> String {
        match self {
            NameKind::Symbol => name.to_string(),
            kind => format!("{name} [{}]", kind.as_str()),
        }
    }

    /// The kind `system_name` wrote; a symbol for any other tool's `system_name`.
    pub fn from_system_name(name: &str, system_name: &str) -> NameKind {
        system_name
            .strip_prefix(name)
            .and_then(|rest| rest.strip_prefix(" ["))
            .and_then(|rest| rest.strip_suffix(']'))
            .and_then(NameKind::parse)
            .unwrap_or(NameKind::Symbol)
    }

    pub fn parse(text: &str) -> Option<NameKind> {
        [
            NameKind::Symbol,
            NameKind::GoTable,
            NameKind::Fde,
            NameKind::Address,
            NameKind::PerfMap,
            NameKind::Python,
            NameKind::None,
        ]
        .into_iter()
        .find(|kind| kind.as_str() == text)
    }
}

/// Where an address is in the file it was mapped from: what another tool (objdump, addr2line,
/// pprof with the unstripped binary) needs to name it later.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct ObjectRef {
    /// The file's GNU build ID, in lowercase hex, where it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub build_id: Option<String>,
    /// The offset in the file (what the memory map gives).
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "hex_some")]
    pub file_offset: Option<u64>,
    /// The ELF virtual address (what objdump, addr2line and `--annotate` use), where a loadable
    /// segment holds that offset.
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "hex_some")]
    pub vaddr: Option<u64>,
}

/// Bytes as lowercase hex, as build ids are spelled (`.build-id` paths, debuginfod, reports).
pub fn lower_hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes
        .iter()
        .fold(String::with_capacity(2 * bytes.len()), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

/// Serializes an address as "0x...".
pub(crate) fn hex<S: serde::Serializer>(v: &u64, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format!("{v:#x}"))
}

fn hex_some<S: serde::Serializer>(v: &Option<u64>, s: S) -> Result<S::Ok, S::Error> {
    match v {
        Some(v) => hex(v, s),
        None => s.serialize_none(),
    }
}

impl Frame {
    /// A frame that stands for something other than code (a process, a thread): a name in a
    /// module of its own, nothing else known.
    pub fn named(function: String, module: &str) -> Frame {
        Frame {
            function,
            kind: NameKind::Symbol,
            ..Frame::unknown(module, 0, false)
        }
    }

    pub fn unknown(module: impl Into<String>, address: u64, kernel: bool) -> Frame {
        Frame {
            function: UNKNOWN.to_string(),
            module: module.into(),
            file: None,
            line: None,
            kernel,
            inlined: false,
            address,
            start: None,
            offset: None,
            kind: NameKind::None,
            object: None,
        }
    }

    /// A placeholder standing for frames the kernel could not give us.
    pub fn marker(what: &str, kernel: bool) -> Frame {
        Frame {
            function: format!("[{what}]"),
            ..Frame::unknown("", 0, kernel)
        }
    }

    /// The name of code nothing names, placed at `vaddr` (a function's start or its own
    /// address) in `module`: `libx.so.1+0x16900`.
    pub fn placed_name(module: &str, vaddr: u64) -> String {
        format!("{}+{vaddr:#x}", short_module(module))
    }

    /// Where a name `placed_name` made for `module` places its code; None for any other name.
    pub fn placed_at(module: &str, name: &str) -> Option<u64> {
        let hex = name.strip_prefix(short_module(module))?.strip_prefix("+0x")?;
        // `from_str_radix` would take a sign too.
        if hex.is_empty() || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        u64::from_str_radix(hex, 16).ok()
    }

    /// Not named: `[unknown]`, or placed by module and address (`module+0x…`) only.
    pub fn is_unknown(&self) -> bool {
        self.function == UNKNOWN || matches!(self.kind, NameKind::Fde | NameKind::Address)
    }

    /// Neither named nor placed in a function: what a profile of this code cannot tell apart.
    pub fn is_unplaced(&self) -> bool {
        self.is_unknown() && self.kind != NameKind::Fde
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn a_placed_name_reads_back_as_the_place_it_names() {
        let module = "/usr/lib/x86_64-linux-gnu/liblzma.so.5.4.1";
        let name = Frame::placed_name(module, 0x16900);
        assert_eq!(name, "liblzma.so.5.4.1+0x16900");
        assert_eq!(Frame::placed_at(module, &name), Some(0x16900));
        for other in [
            "lzma_code",
            "liblzma.so.5.4.1+0x",
            "liblzma.so.5.4.1+0x+10",
            "libz.so+0x10",
        ] {
            assert_eq!(Frame::placed_at(module, other), None, "{other}");
        }
        assert_eq!(lower_hex(&[0x72, 0xa4, 0x0f, 0xc3]), "72a40fc3");
        assert_eq!(lower_hex(&[]), "");
    }

    #[test]
    fn a_kind_reads_back_from_the_system_name_it_wrote() {
        let name = "liblzma.so.5.4.1+0x16900";
        for kind in [
            NameKind::Symbol,
            NameKind::GoTable,
            NameKind::Fde,
            NameKind::Address,
            NameKind::PerfMap,
            NameKind::Python,
            NameKind::None,
        ] {
            let system = kind.system_name(name);
            println!("{kind:?}: {system}");
            assert_eq!(NameKind::from_system_name(name, &system), kind);
        }
        // Another tool's: a mangled name, or none.
        assert_eq!(NameKind::from_system_name("f", "_Z1fv"), NameKind::Symbol);
        assert_eq!(NameKind::from_system_name("f", ""), NameKind::Symbol);
    }

    /// Frames of a stripped file as the symbolizer gives them: one placed by its FDE, one by its
    /// address only, one named with where it is in its file.
    pub(crate) fn stripped_frames() -> Vec<Frame> {
        // As in a file whose text segment is loaded 0x1000 above its place in the file.
        let object = |vaddr: u64| ObjectRef {
            build_id: Some("72a44fc3".into()),
            file_offset: Some(vaddr - 0x1000),
            vaddr: Some(vaddr),
        };
        let module = "/usr/lib/liblzma.so.5.4.1";
        let named = Frame {
            object: Some(object(0x4a10)),
            ..Frame::named("lzma_code".into(), module)
        };
        let placed = Frame {
            function: "liblzma.so.5.4.1+0x16900".into(),
            start: Some(0x16900),
            offset: Some(0x2b),
            kind: NameKind::Fde,
            object: Some(object(0x1692b)),
            ..Frame::unknown(module, 0x7f00_0001_692b, false)
        };
        let loose = Frame {
            function: "liblzma.so.5.4.1+0x4100".into(),
            kind: NameKind::Address,
            object: Some(object(0x4100)),
            ..Frame::unknown(module, 0x7f00_0000_4100, false)
        };
        vec![named, placed, loose]
    }
}
