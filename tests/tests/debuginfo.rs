//! Names from where distributions put them (issue #39): a stripped binary's debug file by debug
//! link, by build id under `--debug-dir`, its MiniDebugInfo, a debug file with zstd-compressed
//! DWARF, and a debug link to a file whose CRC is wrong. The workload is `stripme` (hotspot.c's
//! 60/30/10 split of burn_a/burn_b/burn_c, no frame pointers, a build id) as tests/build.rs
//! strips and splits it, and makes its MiniDebugInfo (`stripme-mini`) and zstd-compressed debug
//! file (`stripme.zstd.debug`) with binutils and xz there, so that this suite needs no tool where
//! it runs (the arm64 guest has none). Each case is one 2-second profiled run whose shares are
//! checked against the workload's own TRUTH line. Root, like every end-to-end suite.
use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::Output,
};

use bpfprof_tests::*;
use object::{CompressionFormat, Object as _, ObjectSection as _};
use serde_json::Value;

const BURNS: [&str; 3] = ["burn_a", "burn_b", "burn_c"];

/// A fresh directory for one case's files.
fn case_dir(name: &str) -> PathBuf {
    let dir = temp_path(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn copy(from: &Path, to: &Path) {
    std::fs::create_dir_all(to.parent().unwrap()).unwrap();
    std::fs::copy(from, to).unwrap_or_else(|e| panic!("{} -> {}: {e}", from.display(), to.display()));
}

fn s(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// The bytes of the file at `path`.
fn elf(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Where `DIR/.build-id/xx/rest.debug` is for this binary's build id (its NT_GNU_BUILD_ID note,
/// in lowercase hex as readelf shows it).
fn build_id_path(dir: &Path, binary: &Path) -> PathBuf {
    let data = elf(binary);
    let file = object::File::parse(&*data).unwrap();
    let id: String = file
        .build_id()
        .unwrap()
        .unwrap_or_else(|| panic!("no build id in {}", binary.display()))
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    println!("build id of {}: {id}", binary.display());
    dir.join(".build-id")
        .join(&id[..2])
        .join(format!("{}.debug", &id[2..]))
}

/// One profiled run of `binary split 2`: its truth, its report, bpfprof's output.
fn profile(binary: &Path, extra: &[&str], output: &str) -> (HashMap<String, f64>, Report, Output) {
    let json = temp_path(output);
    let mut args = vec!["-F", "997", "-o", s(&json)];
    args.extend_from_slice(extra);
    args.extend(["--", s(binary), "split", "2"]);
    let out = run(&args);
    assert!(out.status.success(), "bpfprof {args:?} failed: {}", stderr(&out));
    let report = Report::read(&json);
    report.assert_consistent();
    (truth(&stdout(&out)), report, out)
}

/// burn_a/b/c named, each self share within tolerance of the workload's own; printed.
fn assert_named_like_the_truth(report: &Report, truth: &HashMap<String, f64>) {
    let pid = truth["pid"] as u32;
    let samples = report.samples_of(pid);
    assert!(samples > 500, "too few samples of pid {pid}: {samples}");
    report.assert_self_shares("named", pid, truth, &BURNS);
}

/// The report's `symbols` entry for the file whose path ends in `module`, printed.
fn symbols_of<'r>(report: &'r Report, module: &str) -> &'r Value {
    let all = report.0["symbols"]
        .as_array()
        .unwrap_or_else(|| panic!("no symbols array: notes {}", report.0["notes"]));
    let entry = all
        .iter()
        .find(|e| {
            e["module"]
                .as_str()
                .is_some_and(|m| m.ends_with(&format!("/{module}")))
        })
        .unwrap_or_else(|| panic!("no symbols entry for {module}: {all:?}"));
    println!("symbols of {module}: {entry}");
    entry
}

/// The leaf of the heaviest stack has a source line: DWARF was read, not only a symbol table.
fn assert_leaf_has_a_line(report: &Report, truth: &HashMap<String, f64>) {
    let stacks = report.stacks_of(truth["pid"] as u32);
    let leaf = stacks[0]["frames"].as_array().unwrap().last().unwrap();
    println!("leaf: {} at {}:{}", leaf["function"], leaf["file"], leaf["line"]);
    assert!(
        leaf["file"].as_str().unwrap_or("").ends_with("hotspot.c"),
        "{leaf}"
    );
    assert!(leaf["line"].as_u64().is_some(), "{leaf}");
}

#[test]
fn a_debug_link_beside_the_binary_names_it() {
    let dir = case_dir("linked");
    let binary = dir.join("stripme-linked");
    copy(&workload("stripme-linked"), &binary);
    copy(&workload("stripme.debug"), &dir.join("stripme.debug"));
    let (truth, report, _) = profile(&binary, &[], "linked.json");
    assert_named_like_the_truth(&report, &truth);
    assert_leaf_has_a_line(&report, &truth);
    let entry = symbols_of(&report, "stripme-linked");
    assert_eq!(entry["source"], "debuglink");
    assert_eq!(entry["path"].as_str(), Some(s(&dir.join("stripme.debug"))));
}

#[test]
fn a_build_id_tree_under_a_debug_dir_names_a_stripped_binary() {
    let dir = case_dir("build-id");
    let debug = build_id_path(&dir.join("debug"), &workload("stripme-stripped"));
    copy(&workload("stripme.debug"), &debug);
    let debug_dir = dir.join("debug");
    let (truth, report, _) = profile(
        &workload("stripme-stripped"),
        &["--debug-dir", s(&debug_dir)],
        "build-id.json",
    );
    assert_named_like_the_truth(&report, &truth);
    assert_leaf_has_a_line(&report, &truth);
    let entry = symbols_of(&report, "stripme-stripped");
    assert_eq!(entry["source"], "build-id-dir");
    assert_eq!(entry["path"].as_str(), Some(s(&debug)));
}

#[test]
fn minidebuginfo_names_a_stripped_binary() {
    // tests/build.rs made it by the gdb manual's recipe ("MiniDebugInfo", Debugging with GDB).
    let dir = case_dir("mini");
    let binary = dir.join("stripme-mini");
    copy(&workload("stripme-mini"), &binary);
    let (truth, report, _) = profile(&binary, &[], "mini.json");
    assert_named_like_the_truth(&report, &truth);
    assert_eq!(symbols_of(&report, "stripme-mini")["source"], "minidebuginfo");
}

#[test]
fn a_debug_file_with_zstd_compressed_dwarf_names_a_stripped_binary() {
    let dir = case_dir("zstd");
    let debug_dir = dir.join("debug");
    let debug = build_id_path(&debug_dir, &workload("stripme-stripped"));
    copy(&workload("stripme.zstd.debug"), &debug);
    let sections = compression_of_sections(&debug);
    let zstd: Vec<&str> = sections
        .iter()
        .filter(|(_, format)| *format == CompressionFormat::Zstandard)
        .map(|(name, _)| name.as_str())
        .collect();
    println!("zstd-compressed sections of {}: {zstd:?}", debug.display());
    assert!(!zstd.is_empty(), "objcopy wrote no zstd section: {sections:?}");
    let (truth, report, _) = profile(
        &workload("stripme-stripped"),
        &["--debug-dir", s(&debug_dir)],
        "zstd.json",
    );
    assert_named_like_the_truth(&report, &truth);
    assert_leaf_has_a_line(&report, &truth);
    assert_eq!(symbols_of(&report, "stripme-stripped")["source"], "build-id-dir");
}

/// Each section of the ELF file at `path` with the compression its header says.
fn compression_of_sections(path: &Path) -> Vec<(String, CompressionFormat)> {
    let data = elf(path);
    let file = object::File::parse(&*data).unwrap();
    file.sections()
        .map(|section| {
            let name = section.name().unwrap_or("?").to_string();
            let format = section.compressed_file_range().unwrap().format;
            (name, format)
        })
        .collect()
}

#[test]
fn a_debug_link_to_another_build_is_refused_with_a_note_and_costs_no_other_name() {
    let dir = case_dir("bad-crc");
    let binary = dir.join("stripme-linked");
    copy(&workload("stripme-linked"), &binary);
    // The file the link names, of another build: its build id changed by one byte (so its CRC
    // too). With the binary's build id, a CRC that differs would not matter: the build id decides.
    let mut debug = std::fs::read(workload("stripme.debug")).unwrap();
    let id = object::File::parse(&*elf(&binary))
        .unwrap()
        .build_id()
        .unwrap()
        .unwrap()
        .to_vec();
    let at = debug
        .windows(id.len())
        .position(|w| w == id)
        .expect("the build id in the debug file");
    debug[at] ^= 0xff;
    std::fs::write(dir.join("stripme.debug"), debug).unwrap();
    let (truth, report, out) = profile(&binary, &[], "bad-crc.json");
    let pid = truth["pid"] as u32;
    let notes = report.0["notes"].to_string();
    println!("notes: {notes}");
    assert!(
        notes.contains("is not the binary's"),
        "no note of the refused debug file: {notes}"
    );
    // Not a whole-file failure: blazesym never saw the file.
    let err = stderr(&out);
    assert!(!err.contains("checksum"), "{err}");
    let entry = symbols_of(&report, "stripme-linked");
    assert_eq!(entry["source"], "dynsym", "named from what the binary has");
    assert!(entry["problems"].to_string().contains("build id"), "{entry}");
    // Nothing named from the refused file; every sample is still in the binary's own frames.
    for name in BURNS {
        assert_eq!(
            report.self_share(pid, name),
            0.0,
            "{name} named from a refused file"
        );
    }
    let in_binary: u64 = report
        .stacks_of(pid)
        .iter()
        .filter(|s| {
            s["frames"]
                .as_array()
                .unwrap()
                .iter()
                .any(|f| f["module"] == s_val(&binary))
        })
        .map(|s| s["count"].as_u64().unwrap())
        .sum();
    println!(
        "{in_binary} of {} samples with a frame in {}",
        report.samples_of(pid),
        binary.display()
    );
    assert!(in_binary * 10 >= report.samples_of(pid) * 9);
}

fn s_val(path: &Path) -> Value {
    Value::from(s(path))
}

#[test]
fn a_saved_profile_is_named_later_from_a_debug_dir() {
    let dir = case_dir("later");
    let debug_dir = dir.join("debug");
    copy(
        &workload("stripme.debug"),
        &build_id_path(&debug_dir, &workload("stripme-stripped")),
    );
    let (truth, unnamed, _) = profile(&workload("stripme-stripped"), &[], "later-unnamed.json");
    let pid = truth["pid"] as u32;
    for name in BURNS {
        assert_eq!(unnamed.self_share(pid, name), 0.0, "{name} named at the run");
    }
    let named_json = temp_path("later-named.json");
    let out = bpfprof()
        .args([
            "report",
            s(&temp_path("later-unnamed.json")),
            "--debug-dir",
            s(&debug_dir),
        ])
        .args(["-o", s(&named_json)])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let named = Report::read(&named_json);
    named.assert_consistent();
    assert_eq!(named.samples_of(pid), unnamed.samples_of(pid), "the same samples");
    assert_named_like_the_truth(&named, &truth);
    assert_leaf_has_a_line(&named, &truth);
    assert_eq!(symbols_of(&named, "stripme-stripped")["source"], "build-id-dir");
}
