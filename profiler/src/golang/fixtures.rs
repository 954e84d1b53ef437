//! Hand-made Go tables in each layout bpfprof reads (Go 1.16, 1.18 and 1.20), laid out as Go's
//! linker lays them out (cmd/link/internal/ld/pcln.go): header, funcnametab, cutab, filetab,
//! pctab, then the functab with the `_func` records after it.
use super::pclntab::{Version, TOPFRAME};

/// Where the fixture's text starts.
pub const TEXT: u64 = 0x40_1000;

/// One function of a fixture: name, file, size, pcsp runs and pcln runs (bytes, value).
pub struct FixtureFunc {
    pub name: &'static str,
    pub file: &'static str,
    pub size: u64,
    pub flag: u8,
    pub pcsp: &'static [(u64, i32)],
    pub pcln: &'static [(u64, i32)],
}

/// `main.work` (a frame of 0x18 bytes between its prologue and epilogue), then `runtime.goexit`
/// (a stack's root, in assembly).
pub const FUNCS: [FixtureFunc; 2] = [
    FixtureFunc {
        name: "main.work",
        file: "/src/main.go",
        size: 0x40,
        flag: 0,
        pcsp: &[(0x8, 0), (0x30, 0x18), (0x8, 0)],
        pcln: &[(0x10, 12), (0x30, 13)],
    },
    FixtureFunc {
        name: "runtime.goexit.abi0",
        file: "/src/runtime/asm_amd64.s",
        size: 0x10,
        flag: TOPFRAME,
        pcsp: &[(0x10, 0)],
        pcln: &[(0x10, 1581)],
    },
];

/// The table in `version`'s layout, for an architecture with `quantum`-byte instructions.
/// `text_in_header`: what a 1.18+ header says textStart is (Go 1.26 writes 0).
pub fn table(version: Version, quantum: u8, text_in_header: u64) -> Vec<u8> {
    table_of(&FUNCS, version, quantum, text_in_header)
}

/// The table of `funcs`, laid out as `table` lays out `FUNCS`.
pub fn table_of(funcs: &[FixtureFunc], version: Version, quantum: u8, text_in_header: u64) -> Vec<u8> {
    let words = if version == Version::Go116 { 7 } else { 8 };
    let header_len = 8 + 8 * words;
    let mut names = Vec::new();
    let mut files = Vec::new();
    let mut pctab = vec![0u8]; // offset 0 means "no table"
    let mut records = Vec::new();
    let mut entry = 0;
    for (i, f) in funcs.iter().enumerate() {
        let name_off = names.len() as u32;
        names.extend_from_slice(f.name.as_bytes());
        names.push(0);
        files.push(f.file);
        let pcsp = push_pc_values(&mut pctab, f.pcsp, quantum);
        let pcfile = push_pc_values(&mut pctab, &[(f.size, 0)], quantum);
        let pcln = push_pc_values(&mut pctab, f.pcln, quantum);
        records.push((name_off, i as u32, pcsp, pcfile, pcln, entry, f.flag));
        entry += f.size;
    }
    let mut filetab = Vec::new();
    let mut cutab = Vec::new();
    for file in &files {
        cutab.extend_from_slice(&(filetab.len() as u32).to_le_bytes());
        filetab.extend_from_slice(file.as_bytes());
        filetab.push(0);
    }
    let funcnametab = header_len;
    let cutab_at = funcnametab + names.len();
    let filetab_at = cutab_at + cutab.len();
    let pctab_at = filetab_at + filetab.len();
    let functab_at = pctab_at + pctab.len();
    let mut out = Vec::new();
    let magic: u32 = match version {
        Version::Go116 => 0xfffffffa,
        Version::Go118 => 0xfffffff0,
        Version::Go120 => 0xfffffff1,
    };
    out.extend_from_slice(&magic.to_le_bytes());
    out.extend_from_slice(&[0, 0, quantum, 8]);
    let mut header = vec![funcs.len() as u64, files.len() as u64];
    if version != Version::Go116 {
        header.push(text_in_header);
    }
    header.extend([funcnametab, cutab_at, filetab_at, pctab_at, functab_at].map(|o| o as u64));
    for word in header {
        out.extend_from_slice(&word.to_le_bytes());
    }
    for part in [&names, &cutab, &filetab, &pctab] {
        out.extend_from_slice(part);
    }
    out.extend(functab(version, &records, entry));
    out
}

/// `_func` fields: name offset, file index, pcsp, pcfile, pcln, entry offset and flag.
type Record = (u32, u32, u32, u32, u32, u64, u8);

/// The functab (nfunc + 1 entries) and the `_func` records after it.
fn functab(version: Version, records: &[Record], end: u64) -> Vec<u8> {
    let field = if version == Version::Go116 { 8 } else { 4 };
    let pc = |offset: u64| -> Vec<u8> {
        match version {
            Version::Go116 => (TEXT + offset).to_le_bytes().to_vec(),
            _ => (offset as u32).to_le_bytes().to_vec(),
        }
    };
    let record_len = field + 32 + if version == Version::Go120 { 8 } else { 4 };
    let table_len = (2 * records.len() + 1) * field;
    let mut table = Vec::new();
    let mut funcs = Vec::new();
    for (i, &(name, file, pcsp, pcfile, pcln, entry, flag)) in records.iter().enumerate() {
        table.extend(pc(entry));
        let funcoff = (table_len + i * record_len) as u64;
        table.extend_from_slice(&funcoff.to_le_bytes()[..field]);
        funcs.extend(pc(entry));
        for value in [name, 0, 0, pcsp, pcfile, pcln, 0, file] {
            funcs.extend_from_slice(&value.to_le_bytes());
        }
        if version == Version::Go120 {
            funcs.extend_from_slice(&7u32.to_le_bytes()); // startLine
        }
        funcs.extend_from_slice(&[0, flag, 0, 0]); // funcID, flag, pad, nfuncdata
    }
    table.extend(pc(end));
    table.extend(funcs);
    table
}

/// A pc-value table of `runs` (bytes, value) appended to `pctab`; its offset.
fn push_pc_values(pctab: &mut Vec<u8>, runs: &[(u64, i32)], quantum: u8) -> u32 {
    let at = pctab.len() as u32;
    let mut value = -1;
    for &(len, v) in runs {
        let delta = v - value;
        let zigzag = if delta < 0 {
            (!(delta as u32) << 1) | 1
        } else {
            (delta as u32) << 1
        };
        varint(pctab, zigzag);
        varint(pctab, (len / u64::from(quantum)) as u32);
        value = v;
    }
    pctab.push(0);
    at
}

fn varint(out: &mut Vec<u8>, mut v: u32) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// An x86-64 ELF executable without section headers (as a Go file that lost them): one
/// loadable segment of `text_size` bytes of code at `TEXT` (executable if `text_flags` says so)
/// and a read-only one holding `rodata` at 0x50_0000.
pub fn elf(text_size: u64, text_flags: u32, rodata: &[u8]) -> Vec<u8> {
    let mut out = vec![0x7f, b'E', b'L', b'F', 2, 1, 1];
    out.resize(16, 0);
    out.extend_from_slice(&[2, 0, 62, 0, 1, 0, 0, 0]); // ET_EXEC, EM_X86_64, version
    for word in [TEXT, 64, 0] {
        out.extend_from_slice(&word.to_le_bytes()); // entry, phoff, shoff
    }
    for half in [0u16, 0, 64, 56, 2, 64, 0, 0] {
        out.extend_from_slice(&half.to_le_bytes()); // flags (2 halves), sizes, counts
    }
    let rodata_at = 0x200 + text_size.next_multiple_of(0x100);
    let segments = [
        (text_flags, 0x200, TEXT, text_size),
        (object::elf::PF_R, rodata_at, 0x50_0000, rodata.len() as u64),
    ];
    for (flags, offset, vaddr, size) in segments {
        out.extend_from_slice(&object::elf::PT_LOAD.to_le_bytes());
        out.extend_from_slice(&flags.to_le_bytes());
        for word in [offset, vaddr, vaddr, size, size, 0x1000] {
            out.extend_from_slice(&word.to_le_bytes());
        }
    }
    out.resize(0x200 + text_size as usize, 0xcc);
    out.resize(rodata_at as usize, 0);
    out.extend_from_slice(rodata);
    out
}
