use object::{Object as _, ObjectSection as _, ObjectSymbol as _};

use super::*;

fn own_binary() -> Vec<u8> {
    std::fs::read("/proc/self/exe").unwrap()
}

/// Every entry (FDE) made to name, as its CIE, itself: not one can be read, and the file is
/// said to have no table (with how many entries it had), not given an empty one.
#[test]
fn a_table_whose_every_entry_names_itself_as_its_cie_is_refused() {
    let mut data = own_binary();
    let (start, size) = {
        let file = object::File::parse(&*data).unwrap();
        let eh_frame = file.section_by_name(".eh_frame").unwrap();
        let (offset, size) = eh_frame.file_range().unwrap();
        (offset as usize, size as usize)
    };
    let (mut at, mut fdes) = (start, 0);
    while at + 8 <= start + size {
        let length = u32::from_le_bytes(data[at..at + 4].try_into().unwrap()) as usize;
        if length == 0 || length == 0xffff_ffff {
            break;
        }
        if data[at + 4..at + 8] != [0; 4] {
            data[at + 4..at + 8].copy_from_slice(&4u32.to_le_bytes());
            fdes += 1;
        }
        at += 4 + length;
    }
    assert!(fdes > 100, "{fdes} entries");
    match rows_of(&data) {
        Err(TableError::NoReadableEntry(n)) => assert_eq!(n, fdes),
        other => panic!("{:?}", other.map(|rows| rows.len())),
    }
}

#[test]
fn rows_of_a_real_binary_are_sorted_and_start_functions_at_rsp_plus_8() {
    let rows = rows_of(&own_binary()).unwrap();
    assert!(rows.len() > 1000, "{} rows", rows.len());
    assert!(
        rows.windows(2).all(|w| w[0].pc < w[1].pc),
        "sorted, one row per pc"
    );
    // At a function's first instruction the CFA is rsp + 8 (the return address just pushed).
    let entry = rows_of_function(
        &rows,
        rows_of_a_real_binary_are_sorted_and_start_functions_at_rsp_plus_8 as *const () as usize,
    );
    assert_eq!((entry.cfa, entry.cfa_offset), (cfa::SP, 8), "{entry:?}");
    assert!(rows.iter().any(|r| r.fp == fp::AT_CFA), "some function saves rbp");
}

#[test]
fn aarch64_rows_keep_the_return_address_in_x30_until_the_prologue_saves_it() {
    // Debian's arm64 C library, which the cross compiler brings (cargo xtask setup).
    let path = "/usr/aarch64-linux-gnu/lib/libc.so.6";
    let libc = std::fs::read(path).unwrap_or_else(|e| panic!("{path}: {e}: run cargo xtask setup"));
    let rows = rows_of(&libc).unwrap();
    assert!(rows.len() > 1000, "{} rows", rows.len());
    // At a function's first instruction: CFA = sp, the return address still in x30.
    assert!(rows
        .iter()
        .any(|r| (r.cfa, r.cfa_offset, r.ra_offset) == (cfa::SP, 0, 0)));
    // After `stp x29, x30, [sp, #-N]!`: the frame record, x29 with x30 above it.
    assert!(
        rows.iter()
            .any(|r| r.fp == fp::AT_CFA && r.ra_offset < 0 && r.ra_offset == r.fp_offset + 8),
        "some function saves its frame record"
    );
    // Below the CFA wherever the CFA is a register's (an expression's rows are walked by the
    // frame pointer, which ignores them).
    let above: Vec<_> = rows
        .iter()
        .filter(|r| matches!(r.cfa, cfa::SP | cfa::FP) && r.ra_offset > 0)
        .collect();
    assert!(
        above.is_empty(),
        "{} rows, e.g. {:x?}",
        above.len(),
        &above[..above.len().min(3)]
    );
    // The PLT, which has no unwind information: as at a function's first instruction.
    let file = object::File::parse(&*libc).unwrap();
    let plt = file.section_by_name(".plt").expect("libc calls through its PLT");
    let at = |pc: u64| rows[rows.partition_point(|r| r.pc <= pc) - 1];
    for pc in [plt.address(), plt.address() + plt.size() - 4] {
        let row = at(pc);
        assert_eq!(
            (row.cfa, row.cfa_offset, row.fp, row.ra_offset),
            (cfa::SP, 0, fp::SAME, 0),
            "{pc:#x}"
        );
    }
    // x86-64's call always leaves it at CFA - 8.
    assert!(rows_of(&own_binary())
        .unwrap()
        .iter()
        .all(|r| r.ra_offset == -8 || r.cfa == cfa::NONE || r.cfa == cfa::END));
}

/// The row in force at the function's own entry address (as linked in the file).
fn rows_of_function(rows: &[Row], runtime: usize) -> Row {
    let maps = crate::process::parse_maps(&std::fs::read_to_string("/proc/self/maps").unwrap());
    let exe = std::fs::read_link("/proc/self/exe").unwrap();
    let line = maps
        .iter()
        .find(|l| l.path == exe.to_str().unwrap() && (l.start..l.end).contains(&(runtime as u64)))
        .unwrap();
    let data = own_binary();
    let segments = segments_of(&object::File::parse(&*data).unwrap());
    let pc = runtime as u64 - bias_of(&segments, line.start, line.file_offset).unwrap();
    let i = rows.partition_point(|r| r.pc <= pc);
    rows[i - 1]
}

#[test]
fn bias_maps_runtime_addresses_to_the_files_symbols() {
    let data = own_binary();
    let file = object::File::parse(&*data).unwrap();
    let symbol = file
        .symbols()
        .find(|s| {
            // The function itself (`...symbols17h<hash>E`), not the harness's closure around it.
            s.name()
                .is_ok_and(|n| n.contains("bias_maps_runtime_addresses_to_the_files_symbols17h"))
        })
        .expect("the test's own symbol");
    let runtime = bias_maps_runtime_addresses_to_the_files_symbols as *const () as u64;
    let maps = crate::process::parse_maps(&std::fs::read_to_string("/proc/self/maps").unwrap());
    let line = maps.iter().find(|l| (l.start..l.end).contains(&runtime)).unwrap();
    assert_eq!(
        runtime - bias_of(&segments_of(&file), line.start, line.file_offset).unwrap(),
        symbol.address()
    );
}

/// A file built with `.debug_frame` only (no `.eh_frame`), plain and with its debug sections
/// compressed by objcopy (zlib and zstd, as `SHF_COMPRESSED`): the same rows.
#[test]
fn compressed_debug_frame_gives_the_rows_of_the_plain_one() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("f.c");
    std::fs::write(
        &source,
        "int leaf(int x) { return x * 3; }\nint caller(int x) { return leaf(x) + leaf(x + 1); }\nint main(void) { return caller(2); }\n",
    )
    .unwrap();
    let plain = dir.path().join("plain");
    let built = std::process::Command::new("cc")
        .args([
            "-g",
            "-O1",
            "-fno-asynchronous-unwind-tables",
            "-fno-unwind-tables",
            "-o",
        ])
        .arg(&plain)
        .arg(&source)
        .status()
        .expect("cc");
    assert!(built.success());
    // The C runtime's objects bring an `.eh_frame` of their own: gone, so `.debug_frame` is read.
    let removed = std::process::Command::new("objcopy")
        .args(["--remove-section=.eh_frame", "--remove-section=.eh_frame_hdr"])
        .arg(&plain)
        .status()
        .expect("objcopy");
    assert!(removed.success());
    let plain_data = std::fs::read(&plain).unwrap();
    let file = object::File::parse(&*plain_data).unwrap();
    assert!(file.section_by_name(".eh_frame").is_none());
    let expected = rows_of(&plain_data).unwrap();
    assert!(expected.len() >= 3, "{expected:?}");
    for format in ["zlib-gabi", "zstd"] {
        let compressed = dir.path().join(format);
        let out = std::process::Command::new("objcopy")
            .arg(format!("--compress-debug-sections={format}"))
            .arg(&plain)
            .arg(&compressed)
            .output()
            .expect("objcopy");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let data = std::fs::read(&compressed).unwrap();
        let section = object::File::parse(&*data)
            .unwrap()
            .section_by_name(".debug_frame")
            .unwrap()
            .compressed_data()
            .unwrap();
        assert_ne!(section.format, object::CompressionFormat::None, "{format}");
        assert_eq!(rows_of(&data).unwrap(), expected, "{format}");
    }
    // A crafted header (a size of a terabyte) and a corrupt stream: errors, not allocations.
    let zlib = std::fs::read(dir.path().join("zlib-gabi")).unwrap();
    let file = object::File::parse(&*zlib).unwrap();
    let (at, len) = file
        .section_by_name(".debug_frame")
        .unwrap()
        .file_range()
        .unwrap();
    let (at, len) = (at as usize, len as usize);
    let mut huge = zlib.clone();
    huge[at + 8..at + 16].copy_from_slice(&(1u64 << 40).to_le_bytes());
    assert!(matches!(
        rows_of(&huge),
        Err(TableError::Section(SectionError::TooLarge(_)))
    ));
    let mut corrupt = zlib.clone();
    corrupt[at + 24..at + len].fill(0xff);
    assert!(matches!(
        rows_of(&corrupt),
        Err(TableError::Section(SectionError::Corrupt(_)))
    ));
}

#[test]
fn corrupt_or_missing_frame_information_is_an_error_not_a_panic() {
    let data = own_binary();
    let file = object::File::parse(&*data).unwrap();
    let (offset, size) = file.section_by_name(".eh_frame").unwrap().file_range().unwrap();
    let mut corrupt = data.clone();
    corrupt[offset as usize..(offset + size) as usize].fill(0xff);
    assert!(matches!(rows_of(&corrupt), Err(TableError::Corrupt(_))));

    let mut renamed = data.clone();
    for name in [&b".eh_frame\0"[..], &b".debug_frame\0"[..]] {
        let mut at = 0;
        while let Some(i) = renamed[at..].windows(name.len()).position(|w| w == name) {
            renamed[at + i + 1] = b'x';
            at += i + 1;
        }
    }
    assert!(matches!(rows_of(&renamed), Err(TableError::NoFrameInfo)));
    assert!(matches!(rows_of(b"not an ELF file"), Err(TableError::Elf(_))));
}

#[test]
fn a_function_with_instructions_gimli_refuses_falls_back_alone() {
    // CIE (zR, udata4 pointers; CFA = rsp + 8, return address at CFA - 8), then two FDEs:
    // 0x1000..0x1010 pushes 8 bytes after one instruction; 0x2000..0x2010 sets the CFA by
    // an expression and then names a CFA register, as libgcrypt's assembly does.
    #[rustfmt::skip]
    let eh_frame: &[u8] = &[
        20, 0, 0, 0,  0, 0, 0, 0,  1, b'z', b'R', 0,  1, 0x78, 16,  1, 0x03,
        0x0c, 7, 8,  0x90, 1,  0, 0,
        16, 0, 0, 0,  28, 0, 0, 0,  0x00, 0x10, 0, 0,  0x10, 0, 0, 0,  0,
        0x41, 0x0e, 16,
        20, 0, 0, 0,  48, 0, 0, 0,  0x00, 0x20, 0, 0,  0x10, 0, 0, 0,  0,
        0x0f, 2, 0x77, 8,  0x41, 0x0d, 6,
        0, 0, 0, 0,
    ];
    let mut section = gimli::EhFrame::new(eh_frame, gimli::LittleEndian);
    section.set_address_size(8);
    let registers = Registers::of(object::Architecture::X86_64).unwrap();
    let mut rows = Vec::new();
    collect_rows(&section, &gimli::BaseAddresses::default(), registers, &mut rows).unwrap();
    let rules: Vec<_> = rows.iter().map(|r| (r.pc, r.cfa, r.cfa_offset)).collect();
    assert_eq!(
        rules,
        [
            (0x1000, cfa::SP, 8),
            (0x1001, cfa::SP, 16),
            (0x1010, cfa::NONE, 0),
            (0x2000, cfa::UNSUPPORTED, 0),
            (0x2010, cfa::NONE, 0),
        ]
    );
}

#[test]
fn plt_expression_and_row_compaction() {
    let plt = [0x77, 8, 0x80, 0, 0x3f, 0x1a, 0x3b, 0x2a, 0x33, 0x24, 0x22];
    assert_eq!(plt_threshold(&plt), Some(11));
    assert_eq!(plt_threshold(&plt[..10]), None);

    let row = |pc, cfa_kind, cfa_offset| Row {
        pc,
        cfa: cfa_kind,
        cfa_offset,
        ..Row::default()
    };
    let rows = compact(vec![
        row(0x20, cfa::SP, 8),
        row(0x10, cfa::SP, 8),
        row(0x14, cfa::SP, 16),
        row(0x18, cfa::SP, 16),
        // One function ends where the next begins: the next one's rule wins.
        row(0x20, cfa::NONE, 0),
    ]);
    assert_eq!(
        rows,
        vec![
            row(0x10, cfa::SP, 8),
            row(0x14, cfa::SP, 16),
            row(0x20, cfa::SP, 8)
        ]
    );
}

/// Segments a file places at the top of the address space: no overflow, nothing held past it.
#[test]
fn segments_at_the_top_of_the_address_space_do_not_overflow() {
    let (at, size, top) = (u64::MAX - 0x10, 0x100, u64::MAX);
    let s = Segment {
        offset: at,
        size,
        vaddr: at,
        mem_size: size,
    };
    let got = (
        s.holds(top),
        s.file_offset(top),
        s.vaddr(top),
        bias_of(&[s], top, top),
    );
    eprintln!("{got:?} {:?}", (s.holds(0), s.file_offset(0)));
    assert_eq!(got, (true, Some(top), Some(top), Some(0)));
    assert!(!s.holds(0) && s.file_offset(0).is_none());
}

/// glibc's `clone` (as `clone3`, which `posix_spawn` and thread starts call) ends its unwind
/// information just before its system call on x86-64; there a parent waits until its child
/// execs or starts. Its pc after the call unwinds as the stub's entry does: on x86-64 from the
/// row made for it (before: none, and the walk stopped at `[unknown]`), on AArch64 from the
/// stub's own (its information covers the call).
#[test]
fn a_system_call_stub_past_its_unwind_information_unwinds_as_at_its_entry() {
    // Each library, its system call instruction, and the entry's rule (CFA register and
    // offset, where the return address is).
    type Entry = (u8, i16, i16);
    let libcs: [(&str, &[u8], Entry); 2] = [
        ("/lib/x86_64-linux-gnu/libc.so.6", &[0x0f, 0x05], (cfa::SP, 8, -8)),
        (
            "/usr/aarch64-linux-gnu/lib/libc.so.6",
            &[0x01, 0x00, 0x00, 0xd4],
            (cfa::SP, 0, 0),
        ),
    ];
    for (path, instruction, entry) in libcs {
        let libc = std::fs::read(path).unwrap_or_else(|e| panic!("{path}: {e}: run cargo xtask setup"));
        let file = object::File::parse(&*libc).unwrap();
        let clone = file
            .dynamic_symbols()
            .find(|s| s.name() == Ok("clone"))
            .unwrap_or_else(|| panic!("{path} exports clone"));
        let code = file
            .section_by_index(clone.section_index().unwrap())
            .unwrap()
            .data_range(clone.address(), clone.size())
            .unwrap()
            .unwrap();
        let at = code
            .windows(instruction.len())
            .position(|w| w == instruction)
            .unwrap_or_else(|| panic!("{path}: no system call in clone"));
        let after = clone.address() + (at + instruction.len()) as u64;
        let rows = rows_of(&libc).unwrap();
        let row = rows[rows.partition_point(|r| r.pc <= after) - 1];
        assert_eq!(
            (row.cfa, row.cfa_offset, row.ra_offset),
            entry,
            "{path}: {after:#x}: {row:?}"
        );
    }
}
