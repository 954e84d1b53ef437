//! Ground truth from Go's own toolchain: the test workload `gohash` built here with Debian's Go
//! 1.19 (`cargo xtask setup` installs it) by default (with `.symtab` and DWARF), with
//! `-ldflags=-s -w` (neither) and as PIE; and Debian's own stripped `go` and `compile`.
use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
};

use gimli::UnwindSection as _;
use object::{Object as _, ObjectSymbol as _};
use profiler_common::unwind::{cfa, fp, Row};

use super::{
    find,
    names::GoNames,
    rows::{build, Arch, BUDGET},
};
use crate::unwind::{rows_of, segments_of};

/// Builds gohash with `flags` into `dir` (its own Go caches there too).
fn gohash(dir: &Path, name: &str, flags: &[&str]) -> PathBuf {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/workloads/gohash");
    let out = dir.join(name);
    let built = std::process::Command::new("go")
        .args(["build", "-buildvcs=false"])
        .args(flags)
        .arg("-o")
        .arg(&out)
        .arg(".")
        .current_dir(source)
        .env("GOARCH", if name == "arm64" { "arm64" } else { "amd64" })
        .env("GOCACHE", dir.join("cache"))
        .env("GOPATH", dir.join("gopath"))
        .output()
        .expect("go (Debian's golang-go: cargo xtask setup)");
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    out
}

/// The `.symtab` functions of a file: (address, name), the linker's size-0 markers left out.
fn symtab_funcs(data: &[u8]) -> BTreeSet<(u64, String)> {
    let file = object::File::parse(data).unwrap();
    file.symbols()
        .filter(|s| s.kind() == object::SymbolKind::Text && s.size() > 0)
        .map(|s| (s.address(), s.name().unwrap().to_string()))
        .collect()
}

fn table_funcs(data: &[u8]) -> BTreeSet<(u64, String)> {
    let file = object::File::parse(data).unwrap();
    let table = find(&file).unwrap().table;
    let funcs: BTreeSet<_> = table
        .funcs()
        .map(|f| (f.entry, table.name(&f).unwrap().to_string()))
        .collect();
    assert_eq!(funcs.len(), table.len(), "every record reads whole");
    funcs
}

#[test]
fn s_w_and_pie_builds_name_the_functions_of_the_symbol_table() {
    let dir = tempfile::tempdir().unwrap();
    let plain = std::fs::read(gohash(dir.path(), "default", &[])).unwrap();
    let stripped = std::fs::read(gohash(dir.path(), "sw", &["-ldflags=-s -w"])).unwrap();
    let pie = std::fs::read(gohash(dir.path(), "pie", &["-buildmode=pie"])).unwrap();
    assert!(symtab_funcs(&stripped).is_empty(), "-s -w leaves no .symtab");
    // -s -w does not move the text: the default build's symbols are the truth.
    let (truth, got) = (symtab_funcs(&plain), table_funcs(&stripped));
    eprintln!(
        "{} functions in .symtab, {} in the -s -w build's table",
        truth.len(),
        got.len()
    );
    assert!(truth.len() > 1000);
    assert_same(&got, &truth);
    let (truth, got) = (symtab_funcs(&pie), table_funcs(&pie));
    eprintln!(
        "PIE: {} in .symtab, {} in .data.rel.ro.gopclntab",
        truth.len(),
        got.len()
    );
    assert_same(&got, &truth);
}

/// The same functions at the same addresses, by the same names as Go's runtime spells them:
/// `.symtab` marks assembly's ABI (`.abi0`), spells array types out (`[5]` where the table
/// has `[...]`) and writes `.` where the table keeps a middle dot (`newFunc·1`).
fn assert_same(got: &BTreeSet<(u64, String)>, truth: &BTreeSet<(u64, String)>) {
    let same = |name: &str, truth: &str| {
        let truth = truth.strip_suffix(".abi0").unwrap_or(truth);
        let name = name.replace('·', ".");
        match name.split_once("[...]") {
            Some((head, tail)) => truth.starts_with(head) && truth.ends_with(tail),
            None => name == truth,
        }
    };
    assert_eq!(got.len(), truth.len());
    let wrong: Vec<_> = got
        .iter()
        .zip(truth)
        .filter(|((a, name), (b, truth))| a != b || !same(name, truth))
        .take(5)
        .collect();
    assert!(wrong.is_empty(), "{wrong:x?}");
}

/// Go's `.debug_frame` is written from the same pcsp tables (cmd/link dwarf.go): its CFA at
/// every pc of every function equals SP + pcsp + 8.
#[test]
fn pcsp_gives_the_cfa_of_the_debug_frame_at_every_pc() {
    let dir = tempfile::tempdir().unwrap();
    let data = std::fs::read(gohash(dir.path(), "default", &[])).unwrap();
    assert_pcsp_is_the_debug_frames(&data, 8);
}

/// The same for arm64 (cross-built: pure Go needs no C toolchain), where the CFA is SP + pcsp:
/// names as in its `.symtab`, the CFA at every pc as in its `.debug_frame`.
#[test]
fn arm64_build_names_and_cfa_agree_with_its_symbols_and_debug_frame() {
    let dir = tempfile::tempdir().unwrap();
    let data = std::fs::read(gohash(dir.path(), "arm64", &["-buildmode=exe"])).unwrap();
    assert_eq!(
        object::File::parse(&*data).unwrap().architecture(),
        object::Architecture::Aarch64
    );
    assert_same(&table_funcs(&data), &symtab_funcs(&data));
    assert_pcsp_is_the_debug_frames(&data, 0);
}

fn assert_pcsp_is_the_debug_frames(data: &[u8], plus: i64) {
    let file = object::File::parse(data).unwrap();
    let table = find(&file).unwrap().table;
    let section = file.section_by_name(".debug_frame").unwrap();
    let bytes = crate::process::section_data(&section).unwrap();
    let mut debug_frame = gimli::DebugFrame::new(&bytes, gimli::LittleEndian);
    debug_frame.set_address_size(8);
    let bases = gimli::BaseAddresses::default();
    let mut ctx = gimli::UnwindContext::new();
    let (mut funcs, mut pcs, mut wrong) = (0, 0u64, Vec::new());
    let mut entries = debug_frame.entries(&bases);
    while let Some(entry) = entries.next().unwrap() {
        let gimli::CieOrFde::Fde(partial) = entry else {
            continue;
        };
        let fde = partial.parse(|s, b, o| s.cie_from_offset(b, o)).unwrap();
        let func = table.find(fde.initial_address()).unwrap();
        funcs += 1;
        let mut rows = fde.rows(&debug_frame, &bases, &mut ctx).unwrap();
        while let Some(row) = rows.next_row().unwrap() {
            let gimli::CfaRule::RegisterAndOffset { offset, .. } = row.cfa() else {
                panic!()
            };
            for pc in row.start_address()..row.end_address() {
                pcs += 1;
                let sp = table.value_at(func.pcsp, &func, pc).map(|v| i64::from(v) + plus);
                if sp != Some(*offset) && wrong.len() < 5 {
                    wrong.push((pc, sp, *offset));
                }
            }
        }
    }
    eprintln!("{funcs} functions, {pcs} pcs compared");
    assert_eq!(wrong, [], "(pc, pcsp + {plus}, .debug_frame CFA)");
    assert!(
        funcs * 10 >= table.len() * 9,
        "{funcs} FDEs of {} functions",
        table.len()
    );
}

/// What the symbolizer shows for a `-s -w` build: name, file and line at the file offsets of
/// main.hashWork, as blazesym reads them from the default build's DWARF.
#[test]
fn s_w_build_frames_carry_the_dwarf_file_and_line() {
    use blazesym::symbolize::{source, Input, Symbolized, Symbolizer};
    let dir = tempfile::tempdir().unwrap();
    let plain = gohash(dir.path(), "default", &[]);
    let stripped = gohash(dir.path(), "sw", &["-ldflags=-s -w"]);
    let data = std::fs::read(&plain).unwrap();
    let (entry, name) = symtab_funcs(&data)
        .into_iter()
        .find(|(_, n)| n == "main.hashWork")
        .unwrap();
    let file = object::File::parse(&*data).unwrap();
    let offset = segments_of(&file)
        .iter()
        .find_map(|s| s.file_offset(entry))
        .unwrap();
    let symbolizer = Symbolizer::builder().enable_code_info(true).build();
    let dwarf = symbolizer
        .symbolize_single(
            &source::Source::Elf(source::Elf::new(&plain)),
            Input::VirtOffset(entry),
        )
        .unwrap();
    let Symbolized::Sym(sym) = dwarf else {
        panic!("{dwarf:?}")
    };
    let info = sym.code_info.unwrap();
    let truth = (info.to_path().display().to_string(), info.line.unwrap());
    // What blazesym makes of the -s -w build on its own: nothing.
    let alone = symbolizer
        .symbolize_single(
            &source::Source::Elf(source::Elf::new(&stripped)),
            Input::VirtOffset(entry),
        )
        .unwrap();
    assert!(matches!(alone, Symbolized::Unknown(_)), "{alone:?}");
    let names = GoNames::open(&stripped).expect("a Go table");
    let got = names.lookup(offset).unwrap();
    eprintln!("{name} at {entry:#x}: DWARF {truth:?}, Go table {got:?}");
    assert_eq!((got.function, got.start, got.offset), (name, entry, 0));
    assert_eq!((got.file.unwrap(), got.line.unwrap()), truth);
    assert_eq!(names.lookup(offset + 1).unwrap().offset, 1);
    // A file without a Go table: nothing (the caller places it).
    assert!(GoNames::open(Path::new("/proc/self/exe")).is_none());
}

/// A `-s -w` build has no CFI at all: before, no rows (frame pointers, which crypto/sha256's
/// assembly breaks). Its table gives rows, with goroutine roots ending the walk.
#[test]
fn s_w_build_unwinds_from_its_table() {
    let dir = tempfile::tempdir().unwrap();
    let data = std::fs::read(gohash(dir.path(), "sw", &["-ldflags=-s -w"])).unwrap();
    let file = object::File::parse(&*data).unwrap();
    for cfi in [".eh_frame", ".debug_frame", ".symtab"] {
        assert!(file.section_by_name(cfi).is_none(), "{cfi}");
    }
    let rows = rows_of(&data).unwrap();
    let table = find(&file).unwrap().table;
    let at = |pc: u64| rows[rows.partition_point(|r| r.pc <= pc) - 1];
    let func = |name: &str| table.funcs().find(|f| table.name(f) == Some(name)).unwrap();
    eprintln!("{} rows for {} functions", rows.len(), table.len());
    for root in ["runtime.goexit", "runtime.mstart", "runtime.mcall"] {
        assert_eq!(at(func(root).entry + 1).cfa, cfa::END, "{root}");
    }
    // Stack switches that keep the goroutine's frame record in RBP: systemstack (no frame of
    // its own) by frame pointer throughout; the vDSO's callers by the stack pointer's rule at
    // their entry (nothing pushed yet), by frame pointer past their prologue.
    assert_eq!(at(func("runtime.systemstack").entry).cfa, cfa::UNSUPPORTED);
    for switch in ["runtime.nanotime1", "time.now"] {
        let f = func(switch);
        let entry = at(f.entry);
        assert_eq!(
            (entry.cfa, entry.cfa_offset),
            (cfa::SP, 8),
            "{switch} at its entry"
        );
        let (body, _, _) = table.pc_values(f.pcsp, &f).find(|&(_, _, sp)| sp > 0).unwrap();
        assert_eq!(at(body).cfa, cfa::UNSUPPORTED, "{switch} past its prologue");
    }
    // hashWork's frame saves the caller's RBP below its return address; sha256's assembly does
    // not (it uses RBP as a register).
    let work = func("main.hashWork");
    let body = table
        .pc_values(work.pcsp, &work)
        .find(|&(_, _, sp)| sp > 0)
        .unwrap();
    let row = at(body.0);
    assert_eq!(
        (row.cfa, row.cfa_offset, row.fp, row.fp_offset),
        (cfa::SP, body.2 as i16 + 8, fp::AT_CFA, -16)
    );
    let block = func("crypto/sha256.block");
    assert!(table
        .pc_values(block.pcsp, &block)
        .all(|(start, _, _)| at(start).fp == fp::SAME));
}

/// Over the row budget: ordinary Go code is stepped by frame pointer (one row a function);
/// assembly and the Go files that call RBP-clobbering assembly keep their deltas.
#[test]
fn over_the_budget_only_assembly_and_its_callers_keep_deltas() {
    let dir = tempfile::tempdir().unwrap();
    let data = std::fs::read(gohash(dir.path(), "sw", &["-ldflags=-s -w"])).unwrap();
    let table = find(&object::File::parse(&*data).unwrap()).unwrap().table;
    let (full, hybrid) = (
        build(&table, Arch::X86_64, false, usize::MAX).unwrap(),
        build(&table, Arch::X86_64, true, usize::MAX).unwrap(),
    );
    eprintln!("{} rows, {} over the budget", full.rows.len(), hybrid.rows.len());
    assert!(hybrid.rows.len() * 2 < full.rows.len());
    let rules = |name: &str| -> Vec<_> {
        let func = table.funcs().find(|f| table.name(f) == Some(name)).unwrap();
        // (The function before ends where this one starts: its end marker is left out.)
        let within = |r: &&Row| (func.entry..func.end).contains(&r.pc) && r.cfa != cfa::NONE;
        hybrid.rows.iter().filter(within).map(|r| (r.cfa, r.fp)).collect()
    };
    assert_eq!(rules("main.hashWork"), [(cfa::UNSUPPORTED, fp::SAME)]);
    assert!(rules("crypto/sha256.block")
        .iter()
        .all(|&r| r == (cfa::SP, fp::SAME)));
    assert!(rules("crypto/sha256.Sum256").contains(&(cfa::SP, fp::AT_CFA)));
}

/// Renamed sections: the table is found by its `runtime.pclntab` symbol (default build) or by
/// its header in the read-only data (`-s -w`), at the same place.
#[test]
fn the_table_is_found_by_symbol_or_by_scanning_without_its_section() {
    let dir = tempfile::tempdir().unwrap();
    for (name, flags) in [("default", &[][..]), ("sw", &["-ldflags=-s -w"][..])] {
        let data = std::fs::read(gohash(dir.path(), name, flags)).unwrap();
        let at = find(&object::File::parse(&*data).unwrap()).unwrap().file_offset;
        let mut renamed = data.clone();
        let needle = b"\0.gopclntab\0";
        let i = renamed.windows(needle.len()).position(|w| w == needle).unwrap();
        renamed[i + 2] = b'x';
        let file = object::File::parse(&*renamed).unwrap();
        assert!(file.section_by_name(".gopclntab").is_none());
        let found = find(&file).unwrap();
        assert_eq!(
            (found.file_offset, found.table.len()),
            (at, table_funcs(&data).len()),
            "{name}"
        );
    }
}

/// Debian's `go` and `compile`: Go 1.19 built by the distribution, without `.symtab`,
/// `.debug_frame` or `.eh_frame`. Named and unwound from the table alone; rows well under the
/// budget.
#[test]
fn debians_stripped_go_binaries_are_named_and_unwound() {
    for path in [
        "/usr/lib/go-1.19/bin/go",
        "/usr/lib/go-1.19/pkg/tool/linux_amd64/compile",
    ] {
        let data = std::fs::read(path).unwrap_or_else(|e| panic!("{path}: {e}: cargo xtask setup"));
        let started = std::time::Instant::now();
        let funcs = table_funcs(&data);
        let named = started.elapsed();
        let started = std::time::Instant::now();
        let rows = rows_of(&data).unwrap();
        let unwound = started.elapsed();
        eprintln!(
            "{path}: {} functions read in {:.1} ms; {} rows in {:.1} ms",
            funcs.len(),
            named.as_secs_f64() * 1e3,
            rows.len(),
            unwound.as_secs_f64() * 1e3
        );
        assert!(funcs.len() >= 10_000, "{}", funcs.len());
        assert!(funcs.iter().any(|(_, n)| n == "main.main"));
        assert!(rows.len() < BUDGET, "{}", rows.len());
    }
}
