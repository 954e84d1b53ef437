//! Code nothing names, end to end: a stripped binary's functions placed apart by its own unwind
//! table (`module+0x<FDE start>`), in JSON, folded, `--annotate` and pprof, against the 60/30/10
//! workload built twice (`stripme` with its symbols, the truth; `stripme-stripped` as
//! distributions ship binaries). These load BPF: run as root (`cargo xtask test`).
use std::{collections::HashMap, path::Path, process::Command};

use bpfprof_tests::*;
use object::{Object as _, ObjectSegment as _, ObjectSymbol as _};
use serde_json::Value;

/// Shares must match the workload's own measurement within this many percentage points.
const TOLERANCE_PP: f64 = 3.0;
const BURNS: [&str; 3] = ["burn_a", "burn_b", "burn_c"];
const STRIPPED: &str = "stripme-stripped";

/// Where each burn function starts, and the build ID, read from the binary that has symbols.
fn truth_of_binary() -> (HashMap<String, (u64, u64)>, String) {
    let data = std::fs::read(workload("stripme")).expect("the stripme workload");
    let file = object::File::parse(&*data).expect("an ELF file");
    let functions = file
        .symbols()
        .filter_map(|s| Some((s.name().ok()?.to_string(), (s.address(), s.size()))))
        .filter(|(name, _)| BURNS.contains(&name.as_str()))
        .collect::<HashMap<_, _>>();
    assert_eq!(functions.len(), 3, "{functions:?}");
    let id = file.build_id().unwrap().expect("stripme has a build id");
    (functions, id.iter().map(|b| format!("{b:02x}")).collect())
}

/// A file's loadable segments: (file offset, size in the file, virtual address).
fn segments(path: &Path) -> Vec<(u64, u64, u64)> {
    let data = std::fs::read(path).unwrap();
    let file = object::File::parse(&*data).unwrap();
    file.segments()
        .map(|s| (s.file_range().0, s.file_range().1, s.address()))
        .collect()
}

/// The virtual address of a file offset, by the file's segments.
fn vaddr_of(segments: &[(u64, u64, u64)], offset: u64) -> Option<u64> {
    segments
        .iter()
        .find(|&&(off, size, _)| off <= offset && offset - off < size)
        .map(|&(off, _, vaddr)| vaddr + (offset - off))
}

fn hex(v: &Value) -> u64 {
    u64::from_str_radix(v.as_str().unwrap().trim_start_matches("0x"), 16).unwrap()
}

fn group(start: u64) -> String {
    format!("{STRIPPED}+{start:#x}")
}

/// The leaf (innermost frame that is not inlined) of each of `pid`'s stacks, with its count.
fn leaves(report: &Report, pid: u32) -> Vec<(&Value, u64)> {
    report
        .stacks_of(pid)
        .into_iter()
        .filter_map(|s| {
            let frames = s["frames"].as_array()?;
            let leaf = frames.iter().rev().find(|f| f["inlined"] != true)?;
            Some((leaf, s["count"].as_u64()?))
        })
        .collect()
}

#[test]
fn a_stripped_binarys_functions_are_placed_apart_by_its_unwind_table() {
    let (functions, build_id) = truth_of_binary();
    let stripped = workload(STRIPPED);
    let (out, json) = profile_workload(
        "997",
        "stripped.json",
        &[stripped.to_str().unwrap(), "split", "3"],
    );
    let truth = truth(&stdout(&out));
    let report = Report::read(&json);
    report.assert_consistent();
    let pid = truth["pid"] as u32;
    let samples = report.samples_of(pid);
    assert!(samples > 2000, "too few samples: {samples}");

    // Samples by placed group (leaf frames of kind "fde").
    let mut groups: HashMap<String, u64> = HashMap::new();
    for (leaf, count) in leaves(&report, pid) {
        if leaf["kind"] == "fde" {
            *groups
                .entry(leaf["function"].as_str().unwrap().to_string())
                .or_default() += count;
        }
    }
    let mut ranked: Vec<(&String, &u64)> = groups.iter().collect();
    ranked.sort_by(|a, b| b.1.cmp(a.1));
    eprintln!("placed groups of pid {pid} ({samples} samples): {ranked:?}");
    let want: Vec<String> = BURNS.iter().map(|b| group(functions[*b].0)).collect();
    let top: Vec<&String> = ranked.iter().take(3).map(|(name, _)| *name).collect();
    let mut sorted_top = top.clone();
    sorted_top.sort();
    let mut sorted_want: Vec<&String> = want.iter().collect();
    sorted_want.sort();
    assert_eq!(
        sorted_top, sorted_want,
        "the three hottest groups are burn_a/b/c's FDEs"
    );
    let in_three: u64 = want.iter().map(|g| groups.get(g).copied().unwrap_or(0)).sum();
    let share = 100.0 * in_three as f64 / samples as f64;
    eprintln!("the three groups hold {share:.2}% of the samples");
    assert!(share >= 95.0, "{share:.2}% in the three groups");

    let expected = truth_shares(&truth, &BURNS);
    for burn in BURNS {
        let got = report.self_share(pid, &group(functions[burn].0)) * 100.0;
        let want = expected[burn] * 100.0;
        eprintln!(
            "{burn} = {}: {got:.2}% of samples, its clock {want:.2}%",
            group(functions[burn].0)
        );
        assert!(
            (got - want).abs() <= TOLERANCE_PP,
            "{burn}: {got:.2}% vs {want:.2}%"
        );
    }

    // Each placed frame says where it is: in the function's bounds, with the file's build id.
    let (a_start, a_size) = functions["burn_a"];
    let (leaf, _) = leaves(&report, pid)
        .into_iter()
        .find(|(leaf, _)| leaf["function"] == group(a_start).as_str())
        .unwrap();
    eprintln!("a leaf of burn_a: {leaf}");
    assert_eq!(leaf["build_id"], build_id.as_str());
    assert_eq!(hex(&leaf["start"]), a_start);
    let vaddr = hex(&leaf["vaddr"]);
    assert!((a_start..a_start + a_size).contains(&vaddr), "{vaddr:#x}");
    assert_eq!(leaf["offset"].as_u64().unwrap() + a_start, vaddr);
    // Its file offset is where that address is in the file, by the unstripped binary's segments.
    let file_offset = hex(&leaf["file_offset"]);
    eprintln!("file offset {file_offset:#x}, vaddr {vaddr:#x}");
    assert_eq!(
        vaddr_of(&segments(&workload("stripme")), file_offset),
        Some(vaddr)
    );
    assert_eq!(
        report.0["unplaced_leaf_samples"]
            .as_u64()
            .map(|n| n < samples / 20),
        Some(true)
    );

    folded_and_annotate(&json, &want, a_start);
}

/// A Go build that is not position-independent: its text is at 0x401000 in memory, 0x1000 in the
/// file. Every frame of it says both, apart, and they agree with the file's segments; a frame
/// of main.hashWork is in that function's symbol.
#[test]
fn a_go_binarys_frames_say_their_file_offset_and_address_apart() {
    let binary = workload("gohash");
    let go_profile = temp_path("gohash-places.pb.gz");
    let (out, json) = profile_workload(
        "199",
        "gohash-places.json",
        &[binary.to_str().unwrap(), "2", go_profile.to_str().unwrap()],
    );
    let pid = truth(&stdout(&out))["pid"] as u32;
    let report = Report::read(&json);
    let segments = segments(&binary);
    let data = std::fs::read(&binary).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let work = file
        .symbols()
        .find(|s| s.name() == Ok("main.hashWork"))
        .expect("main.hashWork's symbol");
    let (start, end) = (work.address(), work.address() + work.size());
    let (mut checked, mut in_work) = (0, 0);
    for stack in report.stacks_of(pid) {
        for frame in stack["frames"].as_array().unwrap() {
            if !frame["module"].as_str().unwrap_or("").ends_with("/gohash") {
                continue;
            }
            let (offset, vaddr) = (hex(&frame["file_offset"]), hex(&frame["vaddr"]));
            assert_ne!(offset, vaddr, "{frame}");
            assert_eq!(vaddr_of(&segments, offset), Some(vaddr), "{frame}");
            checked += 1;
            if frame["function"] == "main.hashWork" {
                assert!(
                    (start..end).contains(&vaddr),
                    "{vaddr:#x} in {start:#x}..{end:#x}"
                );
                in_work += 1;
            }
        }
    }
    eprintln!("{checked} frames of gohash checked, {in_work} in main.hashWork ({start:#x}..{end:#x})");
    assert!(
        checked > 100 && in_work > 0,
        "{checked} frames, {in_work} in main.hashWork"
    );
}

/// The saved profile as folded stacks names the groups; `--annotate` on one decodes its code.
fn folded_and_annotate(json: &Path, groups: &[String], a_start: u64) {
    let folded = run(&["report", json.to_str().unwrap(), "--format", "folded"]);
    assert!(folded.status.success(), "{}", stderr(&folded));
    let text = stdout(&folded);
    for group in groups {
        let lines = text
            .lines()
            .filter(|l| l.rsplit_once(' ').unwrap().0.ends_with(group.as_str()));
        assert!(lines.count() > 0, "{group} in the folded stacks:\n{text}");
    }
    let name = group(a_start);
    let annotated = run(&["report", json.to_str().unwrap(), "--annotate", &name]);
    assert!(annotated.status.success(), "{}", stderr(&annotated));
    let text = stdout(&annotated);
    eprintln!("{text}");
    // The loop's multiply, as the disassembly of either architecture spells it.
    let multiply = if cfg!(target_arch = "aarch64") {
        ["mul", "madd"]
    } else {
        ["imul", "imul"]
    };
    assert!(
        text.starts_with(&format!("Annotation of {name}")) && multiply.iter().any(|m| text.contains(m)),
        "{text}"
    );
}

#[test]
fn go_tool_pprof_names_the_placed_frames_from_the_unstripped_binary() {
    let (functions, build_id) = truth_of_binary();
    let stripped = workload(STRIPPED);
    let (out, pprof) = profile_workload(
        "997",
        "stripped.pb.gz",
        &[stripped.to_str().unwrap(), "split", "3"],
    );
    let truth = truth(&stdout(&out));
    let profile = decode_pprof(&std::fs::read(&pprof).unwrap());
    let text = |i: i64| profile.string_table[i as usize].as_str();
    let mapping = profile
        .mapping
        .iter()
        .find(|m| text(m.filename).ends_with(STRIPPED))
        .expect("a mapping of the stripped binary");
    eprintln!("{mapping:?}, build id {}", text(mapping.build_id));
    assert_eq!(text(mapping.build_id), build_id);
    assert!(!mapping.has_functions);

    // Without the binary: the groups, by their names.
    let plain = go_pprof_top(&pprof, None);
    assert!(plain.contains(&group(functions["burn_a"].0)), "{plain}");
    // With the unstripped binary where pprof looks for it: the functions' names. `go tool
    // pprof` reads no build IDs (its cmd/pprof object tool returns "" for every file, so any
    // mapping with one is a mismatch), so it is given the profile without them; what it checks
    // is that the mapping and the addresses bpfprof wrote name the right functions.
    let dir = temp_path("pprof-binaries");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(workload("stripme"), dir.join(STRIPPED)).unwrap();
    let mut without_ids = profile.clone();
    without_ids.mapping.iter_mut().for_each(|m| m.build_id = 0);
    let unlabelled = temp_path("stripped-no-build-id.pb.gz");
    let mut gz = std::fs::File::create(&unlabelled).unwrap();
    profiler::report::pprof::write_gz(&without_ids, &mut gz).unwrap();
    let named = go_pprof_top(&unlabelled, Some(&dir));
    let expected = truth_shares(&truth, &BURNS);
    for burn in BURNS {
        let flat = named
            .lines()
            .find(|l| l.split_whitespace().last() == Some(burn))
            .and_then(|l| {
                l.split_whitespace()
                    .nth(1)?
                    .trim_end_matches('%')
                    .parse::<f64>()
                    .ok()
            })
            .unwrap_or_else(|| panic!("{burn} named by go tool pprof:\n{named}"));
        let want = expected[burn] * 100.0;
        eprintln!("go tool pprof: {burn} flat {flat:.2}%, its clock {want:.2}%");
        assert!(
            (flat - want).abs() <= TOLERANCE_PP,
            "{burn}: {flat:.2}% vs {want:.2}%"
        );
    }
}

/// `go tool pprof -symbolize=local -top`, with `PPROF_BINARY_PATH` where given.
fn go_pprof_top(profile: &Path, binaries: Option<&Path>) -> String {
    let mut cmd = Command::new("go");
    cmd.args(["tool", "pprof", "-symbolize=local", "-top", "-nodecount=50"]);
    cmd.arg(profile);
    cmd.env("PPROF_BINARY_PATH", binaries.unwrap_or(Path::new("/nonexistent")));
    let out = cmd
        .output()
        .expect("running go tool pprof (Debian package golang-go)");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!("go tool pprof: {}\n{text}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success());
    text
}

/// Debian's xz, its liblzma stripped: nearly every sample lies in a function liblzma's unwind
/// table bounds, and its hot code shows as several functions, not one `[unknown]`.
#[test]
fn debian_xz_leaves_are_placed_in_liblzmas_functions() {
    let input = temp_path("random-64m");
    let status = Command::new("head")
        .args(["-c", "67108864", "/dev/urandom"])
        .stdout(std::fs::File::create(&input).unwrap())
        .status()
        .unwrap();
    assert!(status.success());
    let script = format!("xz -T2 -6 -c {} > /dev/null", input.display());
    let (_, json) = profile_workload("997", "xz.json", &["sh", "-c", &script]);
    let report = Report::read(&json);
    let samples = report.0["samples"].as_u64().unwrap();
    let unplaced = report.0["unplaced_leaf_samples"].as_u64().unwrap();
    let mut groups: HashMap<String, u64> = HashMap::new();
    for stack in report.stacks() {
        let Some(leaf) = stack["frames"].as_array().unwrap().last() else {
            continue;
        };
        if leaf["kind"] == "fde" && leaf["module"].as_str().unwrap_or("").contains("liblzma") {
            *groups
                .entry(leaf["function"].as_str().unwrap().to_string())
                .or_default() += stack["count"].as_u64().unwrap();
        }
    }
    let mut ranked: Vec<(&String, &u64)> = groups.iter().collect();
    ranked.sort_by(|a, b| b.1.cmp(a.1));
    let share = 100.0 * unplaced as f64 / samples as f64;
    eprintln!(
        "xz: {samples} samples, {unplaced} ({share:.2}%) with neither name nor group; {} liblzma groups, hottest {:?}",
        groups.len(),
        &ranked[..ranked.len().min(8)]
    );
    let _ = std::fs::remove_file(&input);
    assert!(share < 5.0, "{share:.2}% unplaced");
    assert!(groups.len() >= 5, "{} liblzma groups", groups.len());
}
