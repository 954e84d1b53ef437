//! Hand-made hostile tables: what a crafted file cannot make bpfprof do (allocate or loop without
//! bound, read past a table's part, trust a stack-pointer write, take a table that points outside
//! the code).
use profiler_common::unwind::cfa;

use super::{
    find,
    fixtures::{elf, table, table_of, FixtureFunc, TEXT},
    pclntab::{Pclntab, Version, SPWRITE},
    rows::{build, rows, rows_within, Arch},
    NoTable,
};

fn func(name: &'static str, size: u64, flag: u8, pcsp: &'static [(u64, i32)]) -> FixtureFunc {
    FixtureFunc {
        name,
        file: "/src/main.go",
        size,
        flag,
        pcsp,
        pcln: &[(4, 7)],
    }
}

fn leak(runs: impl Iterator<Item = (u64, i32)>) -> &'static [(u64, i32)] {
    Vec::leak(runs.collect())
}

/// 10,000 steps that never move the pc, and 10,000 that run past a 16-byte function's end:
/// one run and two (a function of n quanta has at most n + 1), and as many rows.
#[test]
fn pc_value_runs_stop_at_a_zero_pc_delta_and_at_the_functions_end() {
    let stuck = leak((0..10_000).map(|i| (if i == 0 { 8 } else { 0 }, 8 + 8 * (i % 2))));
    let long = leak((0..10_000).map(|i| (8, 8 * (i % 2))));
    let funcs = [
        func("main.stuck", 0x10, 0, stuck),
        func("main.long", 0x10, 0, long),
    ];
    let data = table_of(&funcs, Version::Go120, 1, TEXT);
    let table = Pclntab::parse(&data, 0).unwrap();
    let runs = |i| {
        let f = table.func(i).unwrap();
        table.pc_values(f.pcsp, &f).count()
    };
    let go = rows(&table, Arch::X86_64).unwrap();
    eprintln!("{} and {} runs, {} rows", runs(0), runs(1), go.rows.len());
    assert_eq!((runs(0), runs(1)), (1, 2));
    assert_eq!(go.rows.len(), (1 + 1) + (2 + 1)); // each function's runs and its end
}

/// The rows stop as soon as they pass the limit; past the second limit (frame pointers for Go
/// code) the file keeps no Go rows.
#[test]
fn rows_past_the_limits_stop_and_are_left_out() {
    let data = table(Version::Go118, 1, TEXT);
    let table = Pclntab::parse(&data, 0).unwrap();
    let all = build(&table, Arch::X86_64, false, usize::MAX).unwrap().rows.len();
    let hybrid = build(&table, Arch::X86_64, true, usize::MAX).unwrap().rows.len();
    eprintln!("{all} rows, {hybrid} with frame pointers for Go code");
    assert_eq!((all, hybrid), (6, 4));
    assert!(build(&table, Arch::X86_64, false, all).is_some());
    assert!(build(&table, Arch::X86_64, false, all - 1).is_none());
    let within = |budget, hybrid_budget| rows_within(&table, Arch::X86_64, budget, hybrid_budget);
    assert_eq!(within(5, 4).map(|g| g.rows.len()), Some(4));
    assert!(within(5, 3).is_none());
}

/// gogo, asmcgocall, cgocallback... write SP: their pcsp is wrong after the write, and the walk
/// ends there as Go's traceback does.
#[test]
fn functions_that_write_sp_end_the_walk() {
    let funcs = [func("runtime.gogo.abi0", 0x10, SPWRITE, &[(8, 0), (8, 8)])];
    let data = table_of(&funcs, Version::Go120, 1, TEXT);
    let go = rows(&Pclntab::parse(&data, 0).unwrap(), Arch::X86_64).unwrap();
    let kinds: Vec<_> = go.rows.iter().map(|r| (r.pc - TEXT, r.cfa)).collect();
    eprintln!("{kinds:?}");
    assert_eq!(kinds, [(0, cfa::END), (0x10, cfa::NONE)]);
}

/// A name must end (with a NUL) within the name table and within 4 KiB.
#[test]
fn names_end_in_their_table_and_within_4_kib() {
    let long: &'static str = String::leak("main.".to_string() + &"x".repeat(5000));
    let funcs = [func(long, 8, 0, &[(8, 0)]), func("main.b", 8, 0, &[(8, 0)])];
    let mut data = table_of(&funcs, Version::Go120, 1, TEXT);
    let name = |data: &[u8], i| {
        let table = Pclntab::parse(data, 0).unwrap();
        table.name(&table.func(i).unwrap()).map(str::len)
    };
    eprintln!("{:?} {:?}", name(&data, 0), name(&data, 1));
    assert_eq!((name(&data, 0), name(&data, 1)), (None, Some(6)));
    // main.b's NUL, the name table's last byte, made a letter: the cutab's 0 is not its end.
    let at = data.windows(7).position(|w| w == b"main.b\0").unwrap();
    data[at + 6] = b'c';
    eprintln!("{:?}", name(&data, 1));
    assert_eq!(name(&data, 1), None);
}

/// The functab is 2 * nfunc + 1 fields (Go's functabsize), not 2 * (nfunc + 1).
#[test]
fn a_functab_of_2n_plus_1_fields_is_whole() {
    let data = table(Version::Go118, 1, TEXT);
    let functab = u64::from_le_bytes(data[64..72].try_into().unwrap()) as usize;
    let end = functab + (2 * 2 + 1) * 4;
    let table = Pclntab::parse(&data[..end], 0).map(|t| t.range());
    eprintln!("{table:?}");
    assert_eq!(table, Ok(Some((TEXT, TEXT + 0x50))));
    assert!(Pclntab::parse(&data[..end - 1], 0).is_err());
}

/// A file without section headers: its table found by its header (after a decoy that does not
/// parse), and only where its functions lie in executable code.
#[test]
fn a_table_is_taken_only_where_its_functions_are_executable_code() {
    let mut rodata = vec![0xf0, 0xff, 0xff, 0xff, 0, 0, 1, 8];
    rodata.extend(table(Version::Go118, 1, TEXT));
    let rx = object::elf::PF_R | object::elf::PF_X;
    let found = |data: &[u8]| {
        let file = object::File::parse(data).unwrap();
        find(&file).map(|f| (f.file_offset, f.table.len()))
    };
    let good = found(&elf(0x50, rx, &rodata));
    let (short, not_x) = (found(&elf(0x40, rx, &rodata)), found(&elf(0x50, 4, &rodata)));
    eprintln!("{good:?} {short:?} {not_x:?}");
    assert_eq!(good.unwrap(), (0x300 + 8, 2));
    assert!(matches!(short, Err(NoTable::Misplaced)));
    assert!(matches!(not_x, Err(NoTable::Misplaced)));
}
