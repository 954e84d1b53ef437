//! The Go table against hand-made tables in each layout, and against what Go's own toolchain
//! writes (Debian's Go 1.19, which `cargo xtask setup` installs): the `.symtab` and DWARF of the
//! same program built with them, and Debian's own stripped `go` binary.
use profiler_common::unwind::{cfa, fp, Row};

use super::{
    fixtures::{table, TEXT},
    pclntab::{Pclntab, Refusal, Version, TOPFRAME},
    rows::{rows, Arch},
};

const LAYOUTS: [(Version, u8); 4] = [
    (Version::Go116, 1),
    (Version::Go118, 1),
    (Version::Go120, 1),
    (Version::Go120, 4),
];

#[test]
fn hand_made_tables_of_each_layout_name_and_place_their_functions() {
    for (version, quantum) in LAYOUTS {
        let data = table(version, quantum, TEXT);
        let table = Pclntab::parse(&data, 0).unwrap();
        let what = format!("{version:?}, quantum {quantum}");
        assert_eq!((table.version, table.len()), (version, 2), "{what}");
        assert_eq!(table.range(), Some((TEXT, TEXT + 0x50)), "{what}");
        let work = table.find(TEXT + 0x20).unwrap();
        assert_eq!(
            (work.entry, work.end, work.flag),
            (TEXT, TEXT + 0x40, 0),
            "{what}"
        );
        assert_eq!(table.name(&work), Some("main.work"), "{what}");
        assert_eq!(table.file(&work, TEXT + 0x20), Some("/src/main.go"), "{what}");
        assert_eq!(table.line(&work, TEXT + 0xc), Some(12), "{what}");
        assert_eq!(table.line(&work, TEXT + 0x10), Some(13), "{what}");
        let runs: Vec<_> = table.pc_values(work.pcsp, &work).collect();
        assert_eq!(
            runs,
            [
                (TEXT, TEXT + 8, 0),
                (TEXT + 8, TEXT + 0x38, 0x18),
                (TEXT + 0x38, TEXT + 0x40, 0)
            ],
            "{what}"
        );
        let root = table.find(TEXT + 0x4f).unwrap();
        assert_eq!(table.name(&root), Some("runtime.goexit.abi0"), "{what}");
        assert_eq!(root.flag, TOPFRAME, "{what}");
        assert_eq!(table.find(TEXT - 1), None, "{what}");
        assert_eq!(table.find(TEXT + 0x50), None, "{what}");
    }
}

#[test]
fn go_1_26_tables_with_text_start_0_take_the_text_from_the_file() {
    let data = table(Version::Go120, 1, 0);
    let table = Pclntab::parse(&data, TEXT).unwrap();
    assert_eq!(table.range(), Some((TEXT, TEXT + 0x50)));
    assert_eq!(table.find(TEXT + 0x41).map(|f| f.entry), Some(TEXT + 0x40));
}

#[test]
fn hand_made_tables_give_x86_64_and_arm64_rows() {
    let row = |pc, cfa, cfa_offset, fp, fp_offset, ra_offset| Row {
        pc,
        cfa,
        cfa_offset,
        fp,
        fp_offset,
        ra_offset,
    };
    let data = table(Version::Go118, 1, TEXT);
    let go = rows(&Pclntab::parse(&data, 0).unwrap(), Arch::X86_64).unwrap();
    assert_eq!(
        go.rows,
        [
            row(TEXT, cfa::SP, 8, fp::SAME, 0, -8),
            // The frame: the caller's RBP saved right below the return address.
            row(TEXT + 8, cfa::SP, 0x20, fp::AT_CFA, -16, -8),
            row(TEXT + 0x38, cfa::SP, 8, fp::SAME, 0, -8),
            row(TEXT + 0x40, cfa::NONE, 0, 0, 0, 0),
            // runtime.goexit: a goroutine's root.
            row(TEXT + 0x40, cfa::END, 0, 0, 0, 0),
            row(TEXT + 0x50, cfa::NONE, 0, 0, 0, 0),
        ]
    );
    assert!(go.covers(TEXT) && go.covers(TEXT + 0x4f));
    assert!(!go.covers(TEXT - 1) && !go.covers(TEXT + 0x50));
    let data = table(Version::Go120, 4, TEXT);
    let go = rows(&Pclntab::parse(&data, 0).unwrap(), Arch::Aarch64).unwrap();
    assert_eq!(
        go.rows[..3],
        [
            // The return address still in x30, then at the bottom of the frame.
            row(TEXT, cfa::SP, 0, fp::SAME, 0, 0),
            row(TEXT + 8, cfa::SP, 0x18, fp::SAME, 0, -0x18),
            row(TEXT + 0x38, cfa::SP, 0, fp::SAME, 0, 0),
        ]
    );
}

#[test]
fn old_unknown_and_corrupt_tables_are_refused_with_a_reason() {
    let mut data = table(Version::Go118, 1, TEXT);
    data[..4].copy_from_slice(&0xfffffffbu32.to_le_bytes());
    assert_eq!(Pclntab::parse(&data, 0).err(), Some(Refusal::Go12));
    data[..4].copy_from_slice(&0xfffffff2u32.to_le_bytes());
    assert_eq!(Pclntab::parse(&data, 0).err(), Some(Refusal::Magic(0xfffffff2)));
    let data = table(Version::Go118, 1, TEXT);
    let mut huge = data.clone();
    huge[8..16].copy_from_slice(&(u64::MAX / 2).to_le_bytes()); // nfunc
    assert_eq!(Pclntab::parse(&huge, 0).err(), Some(Refusal::Corrupt));
    assert_eq!(Pclntab::parse(&data[..40], 0).err(), Some(Refusal::Corrupt));
    assert!(Refusal::Go12.to_string().contains("Go 1.2-1.15"));
}

/// Every truncation and every byte set to 0x00, 0x7f, 0x80 or 0xff: parsed, looked up and made
/// into rows without a panic.
#[test]
fn malformed_tables_never_panic() {
    for (version, quantum) in LAYOUTS {
        let good = table(version, quantum, TEXT);
        let exercise = |data: &[u8]| {
            let Ok(table) = Pclntab::parse(data, TEXT) else {
                return;
            };
            for pc in (TEXT - 4..TEXT + 0x58).step_by(3) {
                if let Some(func) = table.find(pc) {
                    let _ = (table.name(&func), table.file(&func, pc), table.line(&func, pc));
                }
            }
            let _ = rows(&table, Arch::X86_64);
            let _ = rows(&table, Arch::Aarch64);
        };
        for len in 0..good.len() {
            exercise(&good[..len]);
        }
        for i in 0..good.len() {
            for byte in [0x00, 0x7f, 0x80, 0xff] {
                let mut bad = good.clone();
                bad[i] = byte;
                exercise(&bad);
            }
        }
    }
}
