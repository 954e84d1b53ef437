//! User stacks without frame pointers: the workloads are built with `-fomit-frame-pointer` (and
//! Rust's default), so only the unwind tables can name a frameless leaf's caller or walk through
//! Debian's libc, which has no frame pointers either. The frame-pointer walk on the same workload
//! is the control: it must get these stacks wrong, or the test proves nothing.
use bpfprof_tests::*;
use serde_json::Value;

fn unwind_bin() -> String {
    workload("unwind").to_str().unwrap().to_string()
}

/// The stacks of `pid` whose leaf is `leaf`, with their sample counts.
fn leaf_stacks<'a>(report: &'a Report, pid: u32, leaf: &str) -> Vec<(Vec<&'a str>, u64)> {
    report
        .stacks_of(pid)
        .into_iter()
        .filter(|s| {
            // The leaf is the innermost frame with machine code of its own: helpers inlined into
            // it (on arm64, Rust's `Range::next` in a burn loop) are part of it.
            let physical = s["frames"]
                .as_array()
                .unwrap()
                .iter()
                .rev()
                .find(|f| f["inlined"] != true);
            physical.is_some_and(|f| f["function"] == leaf)
        })
        .map(|s| (Report::frames(s), s["count"].as_u64().unwrap()))
        .collect()
}

/// (samples whose stack satisfies `pred`, samples whose leaf is `leaf`) for `pid`.
fn count_leaf(report: &Report, pid: u32, leaf: &str, pred: impl Fn(&[&str]) -> bool) -> (u64, u64) {
    leaf_stacks(report, pid, leaf)
        .iter()
        .fold((0, 0), |(hits, total), (frames, n)| {
            (hits + if pred(frames) { n } else { &0 }, total + n)
        })
}

/// What a failed share shows: the commonest stacks under `leaf` that miss `pred`, and the
/// run's health (how many walks ended early, how many samples came before the tables).
fn misses(report: &Report, pid: u32, leaf: &str, pred: impl Fn(&[&str]) -> bool) -> String {
    let mut missed: Vec<_> = leaf_stacks(report, pid, leaf)
        .into_iter()
        .filter(|(frames, _)| !pred(frames))
        .collect();
    missed.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
    let shown: Vec<String> = missed
        .iter()
        .take(5)
        .map(|(frames, n)| format!("  {n} x {}", frames.join(";")))
        .collect();
    format!("\n{}\nhealth: {}", shown.join("\n"), report.0["health"])
}

/// Samples taken before the process's tables were loaded (an exec's first moments, before its
/// first sample announces it; its libraries are announced as the loader maps them): recorded by
/// frame pointers, which cannot see past a frameless leaf, so the shares of table walks below
/// leave them out. Bounded at 5% (20% in the emulated arm64 guest, where reading tables takes
/// many times longer): a walker never given its tables, or given them late, fails.
fn before_tables(report: &Report, samples: u64) -> u64 {
    let before = report.0["health"]["unwind_before_tables"].as_u64().unwrap();
    println!("{before} of {samples} samples taken before the tables were loaded");
    let bound = if cfg!(target_arch = "aarch64") { 5 } else { 20 };
    assert!(
        before * bound <= samples,
        "{before} of {samples} samples taken before the tables were loaded"
    );
    before
}

/// `hits` is at least `share` of the `total` samples less those taken before the tables.
fn share_of_walked(hits: u64, total: u64, before: u64, share: f64) -> bool {
    hits as f64 >= share * total.saturating_sub(before) as f64
}

fn ends_with(frames: &[&str], chain: &[&str]) -> bool {
    frames.ends_with(chain)
}

/// `chain` appears in order (not necessarily adjacent) in `frames`.
fn in_order(frames: &[&str], chain: &[&str]) -> bool {
    let mut it = frames.iter();
    chain.iter().all(|want| it.any(|f| f == want))
}

/// Samples of `pid` whose stack has `chain` in order.
fn samples_under(report: &Report, pid: u32, chain: &[&str]) -> u64 {
    report
        .stacks_of(pid)
        .iter()
        .filter(|s| in_order(&Report::frames(s), chain))
        .map(|s| s["count"].as_u64().unwrap())
        .sum()
}

fn profile(name: &str, args: &[&str], extra: &[&str]) -> (Report, u32) {
    let json = temp_path(name);
    let mut all = vec!["-F", "499", "-o", json.to_str().unwrap()];
    all.extend_from_slice(extra);
    all.push("--");
    let bin = unwind_bin();
    all.push(&bin);
    all.extend_from_slice(args);
    let out = run(&all);
    assert!(out.status.success(), "{}", stderr(&out));
    let pid = truth(&stdout(&out))["pid"] as u32;
    let report = Report::read(&json);
    report.assert_consistent();
    (report, pid)
}

#[test]
fn frameless_leaf_keeps_its_caller_and_the_whole_chain() {
    let chain = ["main", "run_chain", "level_one", "level_two", "leaf_work"];
    let (report, pid) = profile("unwind-chain.json", &["chain", "2"], &[]);
    let whole = |f: &[&str]| ends_with(f, &chain);
    let caller_of_leaf = |f: &[&str]| ends_with(f, &chain[3..]);
    let from_start = |f: &[&str]| f.first() == Some(&"_start");
    let (full, leaf) = count_leaf(&report, pid, "leaf_work", whole);
    let (caller, _) = count_leaf(&report, pid, "leaf_work", caller_of_leaf);
    let (start, _) = count_leaf(&report, pid, "leaf_work", from_start);
    assert!(leaf > 500, "{leaf} samples in leaf_work");
    let before = before_tables(&report, leaf);
    assert!(
        share_of_walked(full, leaf, before, 0.90),
        "full chain on {full} of {leaf} leaf samples ({before} before the tables):{}",
        misses(&report, pid, "leaf_work", whole)
    );
    assert!(
        share_of_walked(caller, leaf, before, 0.95),
        "level_two -> leaf_work on {caller} of {leaf} leaf samples ({before} before the tables):{}",
        misses(&report, pid, "leaf_work", caller_of_leaf)
    );
    assert!(
        share_of_walked(start, leaf, before, 0.90),
        "walks end at _start: {start} of {leaf} ({before} before the tables):{}",
        misses(&report, pid, "leaf_work", from_start)
    );
    assert_eq!(report.0["health"]["unwind_truncated"], 0);

    // Control: frame pointers cannot see the frameless leaf's caller here.
    let (report, pid) = profile("unwind-chain-fp.json", &["chain", "2"], &["--unwind", "fp"]);
    let (caller, leaf) = count_leaf(&report, pid, "leaf_work", |f| ends_with(f, &chain[3..]));
    assert!(
        (caller as f64) < 0.5 * leaf as f64,
        "the frame-pointer walk should miss level_two ({caller} of {leaf}): the workload has frame pointers?"
    );
    assert_no_programs_left();
}

#[test]
fn callbacks_through_libc_without_frame_pointers_keep_their_callers() {
    let (report, pid) = profile("unwind-qsort.json", &["qsort", "2"], &[]);
    let through_libc = |f: &[&str]| {
        in_order(f, &["main", "run_qsort", "compare_items"])
            && f.iter()
                .any(|name| name.contains("qsort") || name.contains("msort"))
    };
    let (ok, leaf) = count_leaf(&report, pid, "compare_items", through_libc);
    assert!(leaf > 50, "{leaf} samples in compare_items");
    // Every sample inside libc's sort names the caller too.
    let total = report.samples_of(pid);
    let before = before_tables(&report, total);
    assert!(
        share_of_walked(ok, leaf, before, 0.90),
        "main .. run_qsort .. libc .. compare_items on {ok} of {leaf} ({before} before the tables):{}",
        misses(&report, pid, "compare_items", through_libc)
    );
    let under_run_qsort = samples_under(&report, pid, &["main", "run_qsort"]);
    assert!(
        share_of_walked(under_run_qsort, total, before, 0.90),
        "{under_run_qsort} of {total} samples under main -> run_qsort ({before} before the tables)"
    );
    assert_no_programs_left();
}

#[test]
fn rust_without_frame_pointers() {
    let spin = workload("spin-nofp");
    let json = temp_path("spin-nofp.json");
    let out = run(&[
        "-F",
        "499",
        "-o",
        json.to_str().unwrap(),
        "--",
        spin.to_str().unwrap(),
        "2",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let pid = truth(&stdout(&out))["pid"] as u32;
    let report = Report::read(&json);
    let before = before_tables(&report, report.samples_of(pid));
    for burn in ["spin::burn_x", "spin::burn_y"] {
        let chain = |f: &[&str]| in_order(f, &["main", "spin::main", "spin::run", burn]);
        let (ok, leaf) = count_leaf(&report, pid, burn, chain);
        assert!(leaf > 100, "{leaf} samples in {burn}");
        assert!(
            share_of_walked(ok, leaf, before, 0.90),
            "{burn}: full chain on {ok} of {leaf} ({before} before the tables):{}",
            misses(&report, pid, burn, chain)
        );
    }
}

#[test]
fn stacks_deeper_than_the_walk_are_reported_truncated() {
    let (report, pid) = profile("unwind-deep.json", &["deep", "1"], &[]);
    let health: &Value = &report.0["health"];
    assert!(health["unwind_truncated"].as_u64().unwrap() > 0, "{health}");
    assert!(
        report.0["warnings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w.as_str().unwrap().contains("deeper than 127 frames")),
        "{}",
        report.0["warnings"]
    );
    let (deepest, leaf) = count_leaf(&report, pid, "leaf_work", |f| {
        f.iter().filter(|&&n| n == "recurse").count() >= 120
    });
    assert!(
        deepest as f64 >= 0.9 * leaf as f64,
        "{deepest} of {leaf} walked 120+ recurse frames"
    );
    // A truncated stack says so where its outermost frames would be, with how many it lost; a
    // whole one does not.
    let stacks = report.stacks_of(pid);
    let is_mark = |f: &str| f.starts_with("[truncated");
    let (marked, whole): (Vec<&&Value>, Vec<&&Value>) =
        (stacks.iter()).partition(|s| Report::frames(s).first().is_some_and(|f| is_mark(f)));
    let count = |v: &[&&Value]| v.iter().map(|s| s["count"].as_u64().unwrap()).sum::<u64>();
    println!(
        "{} samples' stacks marked [truncated], {} whole",
        count(&marked),
        count(&whole)
    );
    // (Those taken before the process's tables, by frame pointers, are cut by the kernel unsaid.)
    assert!(
        count(&marked) as f64 >= 0.9 * deepest as f64,
        "{} marked of {deepest} stacks with 120+ recurse frames",
        count(&marked)
    );
    // Below leaf_work, 201 recurse frames, then run_deep, main and the C library's three
    // (`__libc_start_call_main`, `__libc_start_main`, `_start`): what was not kept was lost.
    const RECURSE_FRAMES: usize = 201;
    const BELOW_RECURSE: usize = 5;
    let mut counted = 0;
    for stack in &marked {
        let frames = Report::frames(stack);
        let recursion = frames.iter().filter(|&&f| f == "recurse").count();
        assert!(
            recursion >= 100,
            "a stack marked truncated had {recursion} recurse frames"
        );
        if frames.last() == Some(&"leaf_work") {
            let lost = RECURSE_FRAMES - recursion + BELOW_RECURSE;
            if frames[0] == format!("[truncated: {lost} frames]") {
                counted += stack["count"].as_u64().unwrap();
                continue;
            }
            // Else only a count the walk ran out before finishing, said as a lower bound ("N+"),
            // and true.
            let at_least = (frames[0].strip_prefix("[truncated: "))
                .and_then(|rest| rest.strip_suffix("+ frames]"))
                .and_then(|n| n.parse::<usize>().ok());
            assert!(
                at_least.is_some_and(|n| n < lost),
                "with {recursion} recurse frames kept, {lost} lost: {}",
                frames[0]
            );
        }
    }
    println!("{counted} samples in leaf_work said exactly how many frames they lost");
    assert!(counted as f64 >= 0.9 * deepest as f64, "{counted} of {deepest}");
    assert!(
        (whole.iter()).all(|s| !Report::frames(s).iter().any(|f| is_mark(f))),
        "the mark is only ever the outermost frame"
    );
}

/// The kernel's rare paths reach bpfprof's log at debug (`RUST_LOG=...,bpfprof::kernel=debug`):
/// here the walker stopping at its depth limit, once per walk it counted. Below debug there is
/// not a line (the programs were loaded with their log sites pruned), and the count is the same.
#[test]
fn kernel_log_lines_reach_the_log_at_debug_and_none_below() {
    let run_deep = |log: &str| {
        let json = temp_path("unwind-deep-log.json");
        let out = bpfprof()
            .env("RUST_LOG", log)
            // 199 Hz: a busy machine that delays bpfprof's reads a second still leaves the ring
            // (512 lines of this size) room for every line.
            .args([
                "-F",
                "199",
                "-o",
                json.to_str().unwrap(),
                "--",
                &unwind_bin(),
                "deep",
                "1",
            ])
            .output()
            .unwrap();
        assert_no_programs_left();
        assert!(out.status.success(), "{}", stderr(&out));
        let pid = truth(&stdout(&out))["pid"] as u32;
        let truncated = Report::read(&json).0["health"]["unwind_truncated"]
            .as_u64()
            .unwrap();
        (stderr(&out), pid, truncated)
    };
    let (log, pid, truncated) = run_deep("warn,bpfprof::kernel=debug");
    let lines = log
        .lines()
        .filter(|l| {
            l.starts_with("[DEBUG bpfprof::kernel] unwinding pid ") && l.contains("stopped at 127 frames")
        })
        .count() as u64;
    assert!(truncated > 0, "nothing truncated: {log}");
    assert!(log.contains(&format!("unwinding pid {pid} ")), "{log}");
    // One line per truncated walk; the log ring (128 KiB, read as soon as it has a line) keeps up.
    assert!(
        lines <= truncated && lines as f64 >= 0.9 * truncated as f64,
        "{lines} log lines for {truncated} truncated walks"
    );
    let (log, _, truncated) = run_deep("warn");
    assert!(truncated > 0);
    assert!(
        !log.contains("bpfprof::kernel"),
        "kernel lines below debug: {log}"
    );
}

fn unwind_lib() -> String {
    workload("libunwindlib.so").to_str().unwrap().to_string()
}

#[test]
fn off_cpu_stacks_through_libc_keep_the_whole_chain() {
    let chain = ["main", "run_sleep", "nap_outer", "nap_inner"];
    // (off-CPU ns under the whole chain, all off-CPU ns) of the workload's thread.
    let offcpu = |name: &str, extra: &[&str]| -> (f64, f64) {
        let json = temp_path(name);
        let bin = unwind_bin();
        let mut args = vec!["--mode", "sched", "-o", json.to_str().unwrap()];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--", &bin, "sleep", "2"]);
        let out = run(&args);
        assert!(out.status.success(), "{}", stderr(&out));
        let pid = truth(&stdout(&out))["pid"] as u32;
        let report = Report::read(&json);
        let (mut chained, mut total) = (0.0, 0.0);
        for s in report.0["offcpu"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| s["pid"] == pid)
        {
            let ns = s["total_ns"].as_f64().unwrap();
            total += ns;
            if in_order(&Report::frames(s), &chain) {
                chained += ns;
            }
        }
        (chained, total)
    };
    let (chained, total) = offcpu("unwind-sleep.json", &[]);
    assert!(total > 1e9, "the workload naps most of 2 s: {total} ns off CPU");
    assert!(
        chained >= 0.90 * total,
        "main .. nap_inner on {chained} of {total} off-CPU ns"
    );
    // Control: libc's nanosleep has no frame pointer, so a frame-pointer walk loses the chain.
    let (chained, total) = offcpu("unwind-sleep-fp.json", &["--unwind", "fp"]);
    assert!(
        chained < 0.5 * total,
        "the frame-pointer walk found the chain for {chained} of {total} ns: libc has frame pointers?"
    );
    assert_no_programs_left();
}

#[test]
fn libraries_loaded_during_the_run_get_tables() {
    let lib = unwind_lib();
    // A second copy (another file to the loader) loaded 0.1 s after the first: the walker asks
    // for the second's tables moments after the first's were read, and must get them then.
    let copy = temp_path("libunwindlib-second.so");
    std::fs::copy(&lib, &copy).unwrap();
    let copy = copy.to_str().unwrap();
    let (report, pid) = profile("unwind-dlopen.json", &["dlopen", "2", &lib, copy], &[]);
    let chain = ["main", "run_dlopen", "lib_entry", "lib_middle", "lib_leaf"];
    let (full, leaf) = count_leaf(&report, pid, "lib_leaf", |f| ends_with(f, &chain));
    assert!(leaf > 400, "{leaf} samples in lib_leaf");
    assert!(
        full as f64 >= 0.95 * leaf as f64,
        "full chain on {full} of {leaf} samples in the dlopened library"
    );
}

/// A futex wait made in a library loaded after the process's tables were given: its innermost
/// pc is in no mapping the walker knows, so the walk is cut there, and the mappings are asked
/// for again. The wait is walked again as it ends, with them: its whole chain bears its time.
#[test]
fn a_wait_in_a_library_loaded_since_the_tables_were_given_keeps_its_callers() {
    let json = temp_path("unwind-dlwait.json");
    let (bin, lib) = (unwind_bin(), unwind_lib());
    let out = run(&[
        "--mode",
        "lock",
        "-o",
        json.to_str().unwrap(),
        "--",
        &bin,
        "dlwait",
        "300",
        &lib,
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let truth = truth(&stdout(&out));
    let report = read_json(&json);
    let chain = ["main", "run_dlwait", "lib_wait", "lib_futex_wait"];
    let (mut chained, mut in_lib, mut seen) = (0.0, 0.0, String::new());
    let locks = (report["locks"].as_array().unwrap().iter()).filter(|l| l["pid"] == truth["pid"] as u32);
    for waiter in locks.flat_map(|l| l["waiters"].as_array().unwrap()) {
        let frames = Report::frames(waiter);
        if frames.last() != Some(&"lib_futex_wait") {
            continue;
        }
        let ns = waiter["total_wait_ns"].as_f64().unwrap();
        in_lib += ns;
        chained += if ends_with(&frames, &chain) { ns } else { 0.0 };
        seen += &format!("\n  {:.1} ms: {}", ns / 1e6, frames.join(";"));
    }
    let waited = truth["lib_waited_ns"];
    assert!(
        (in_lib - waited).abs() <= 0.05 * waited,
        "{in_lib} ns waited in lib_futex_wait, {waited} ns by the workload's clock:{seen}"
    );
    assert_eq!(
        chained, in_lib,
        "the wait in the library keeps its callers:{seen}"
    );
}

#[test]
fn a_sample_in_a_library_mapped_since_the_tables_were_given_is_counted_stale() {
    let json = temp_path("unwind-stale.json");
    let (bin, lib) = (unwind_bin(), unwind_lib());
    let out = run(&[
        "-e",
        "context-switches",
        "-c",
        "1",
        "-o",
        json.to_str().unwrap(),
        "--",
        &bin,
        "dlwait",
        "50",
        &lib,
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let truth = truth(&stdout(&out));
    let report = Report::read(&json);
    let in_lib: u64 = (report.stacks_of(truth["pid"] as u32).into_iter())
        .filter(|s| Report::frames(s).contains(&"lib_futex_wait"))
        .map(|s| s["count"].as_u64().unwrap())
        .sum();
    let health = &report.0["health"];
    let stale = health["unwind_stale"].as_u64().unwrap();
    println!(
        "{in_lib} samples in lib_futex_wait; stale {stale}, failed {}, before tables {}",
        health["unwind_failed"], health["unwind_before_tables"]
    );
    // The library's futex wait switches out microseconds after dlopen mapped it: before user
    // space can have given its tables, so that walk begins in code no mapping given names.
    assert!(in_lib >= 1, "the wait in the library was sampled");
    assert!(
        stale >= 1,
        "a walk through tables without the library is counted stale"
    );
}

#[test]
fn mappings_that_disappear_under_the_walker_are_survived() {
    let lib = unwind_lib();
    // Attached to the running process (-p): its tables are given to the walker before sampling
    // starts, so every one of its samples must be a table walk. (A command's first samples, before
    // its tables are loaded, are frame-pointer walks: what this test is about is the library
    // coming and going every 20 ms under the walker, not how a command starts.)
    let workload = start_workload("unwind", &["dlcycle", "60", &lib]);
    let pid = workload.pid();
    let json = temp_path("unwind-dlcycle.json");
    let out = run(&[
        "-F",
        "499",
        "-p",
        &pid.to_string(),
        "-d",
        "3",
        "-o",
        json.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    drop(workload);
    let report = Report::read(&json);
    report.assert_consistent();
    // Each walk either follows the mapping it found or stops where a read fails (counted), and
    // never invents frames.
    let (caller, leaf) = count_leaf(&report, pid, "lib_leaf", |f| {
        ends_with(f, &["lib_entry", "lib_middle", "lib_leaf"])
    });
    assert!(leaf > 400, "{leaf} samples in lib_leaf");
    assert!(
        caller as f64 >= 0.90 * leaf as f64,
        "lib_entry -> lib_middle -> lib_leaf on {caller} of {leaf}"
    );
    let health = &report.0["health"];
    assert_eq!(
        health["unwind_walks"], health["samples"],
        "every sample of a process with tables is a table walk: {health}"
    );
    assert_no_programs_left();
}

#[test]
fn a_process_that_execs_keeps_both_images_stacks() {
    let (report, pid) = profile("unwind-exec.json", &["exec", "2"], &[]);
    let chain = ["main", "run_chain", "level_one", "level_two", "leaf_work"];
    let whole = |f: &[&str]| ends_with(f, &chain);
    let (full, leaf) = count_leaf(&report, pid, "leaf_work", whole);
    assert!(leaf > 400, "{leaf} samples in leaf_work after the exec");
    // Both images start without tables: the command's and the exec's first moments.
    let before = before_tables(&report, leaf);
    assert!(
        share_of_walked(full, leaf, before, 0.90),
        "full chain on {full} of {leaf} samples of the new image ({before} before the tables):{}",
        misses(&report, pid, "leaf_work", whole)
    );
    // The first quarter ran the old image (same binary, another address): its samples must be
    // named from the old image's map, not the new one's.
    let total = report.samples_of(pid);
    let before = samples_under(&report, pid, &["main", "run_qsort"]);
    assert!(
        before as f64 >= 0.20 * total as f64,
        "{before} of {total} samples under main -> run_qsort; the old image ran a quarter of the time"
    );
}

/// Share of a Go CPU profile's samples with `function` on their stack.
fn go_share(profile: &profiler::report::pprof::proto::Profile, function: &str) -> f64 {
    let ids: Vec<u64> = profile
        .function
        .iter()
        .filter(|f| profile.string_table[f.name as usize] == function)
        .map(|f| f.id)
        .collect();
    let under = |s: &profiler::report::pprof::proto::Sample| {
        s.location_id.iter().any(|l| {
            let location = profile.location.iter().find(|x| x.id == *l).unwrap();
            location.line.iter().any(|line| ids.contains(&line.function_id))
        })
    };
    let all: i64 = profile.sample.iter().map(|s| s.value[0]).sum();
    let hits: i64 = profile
        .sample
        .iter()
        .filter(|s| under(s))
        .map(|s| s.value[0])
        .sum();
    hits as f64 / all as f64
}

/// A Go program: its linker compresses `.debug_frame` (zlib, `SHF_COMPRESSED`), which bpfprof
/// took for corrupt, so its stacks fell back to frame pointers and crypto/sha256's assembly (RBP
/// used as a register) lost every caller (0.1% of samples under main.main). The workload times
/// its two functions on its own thread's CPU clock and takes its own runtime/pprof profile in
/// the same run: hashWork's share is within 3 pp of its clock (and near Go's own profile), and
/// sha256's samples keep main.hashWork and main.main as callers.
#[test]
fn go_compressed_debug_frame_keeps_the_callers_of_its_assembly() {
    go_keeps_its_callers("gohash");
}

#[test]
fn go_pie_keeps_the_callers_of_its_assembly() {
    go_keeps_its_callers("gohash-pie");
}

/// Built `-s -w`: no `.symtab`, no `.debug_frame` (and Go writes no `.eh_frame`). Named and
/// unwound from Go's own table, `.gopclntab`; before, every frame was `[unknown]` and walks
/// went by frame pointers, which crypto/sha256's assembly breaks.
#[test]
fn go_stripped_keeps_the_callers_of_its_assembly() {
    go_keeps_its_callers("gohash-sw");
}

/// The Go workload `name`, one of the three builds tests/build.rs makes.
fn go_keeps_its_callers(name: &str) {
    let binary = workload(name);
    let go_profile = temp_path(&format!("{name}.pb.gz"));
    let (out, json) = profile_workload(
        "499",
        &format!("{name}.json"),
        &[binary.to_str().unwrap(), "3", go_profile.to_str().unwrap()],
    );
    let truth = truth(&stdout(&out));
    let pid = truth["pid"] as u32;
    let report = Report::read(&json);
    report.assert_consistent();
    // Where the binary's names came from: its .symtab, or (`-s -w`) Go's own table.
    let source = report.0["symbols"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|e| {
            e["module"]
                .as_str()
                .is_some_and(|m| m.ends_with(&format!("/{name}")))
        })
        .map_or(Value::Null, |e| e["source"].clone());
    eprintln!("{name}: names from {source}");
    if name.ends_with("-sw") {
        assert_eq!(source, "go-table", "a -s -w build is named from its .gopclntab");
    }
    let want = truth["hash"] / (truth["hash"] + truth["spin"]);
    let (hash, spin) = (
        samples_under(&report, pid, &["main.hashWork"]),
        samples_under(&report, pid, &["main.spinWork"]),
    );
    let got = hash as f64 / (hash + spin) as f64;
    let go_profile = decode_pprof(&std::fs::read(&go_profile).unwrap());
    let (go_hash, go_spin) = (
        go_share(&go_profile, "main.hashWork"),
        go_share(&go_profile, "main.spinWork"),
    );
    let go = go_hash / (go_hash + go_spin);
    eprintln!(
        "hashWork: {:.1}% of bpfprof's samples, {:.1}% of its thread's CPU time, {:.1}% of runtime/pprof's",
        got * 100.0,
        want * 100.0,
        go * 100.0
    );
    assert!(
        (got - want).abs() * 100.0 <= 3.0,
        "hashWork {got:.3}, its clock {want:.3}"
    );
    assert!(
        (got - go).abs() * 100.0 <= 5.0,
        "hashWork {got:.3}, runtime/pprof {go:.3}"
    );
    let (kept, all) = report
        .stacks_of(pid)
        .iter()
        .filter(|s| {
            Report::frames(s)
                .iter()
                .any(|f| f.starts_with("crypto/sha256.block"))
        })
        .fold((0, 0), |(kept, all), s| {
            let n = s["count"].as_u64().unwrap();
            let whole = in_order(&Report::frames(s), &["main.main", "main.hashWork"]);
            (kept + if whole { n } else { 0 }, all + n)
        });
    let before = before_tables(&report, report.samples_of(pid));
    // Go's stacks end at a goroutine's root (runtime.goexit) or a thread's (runtime.mstart):
    // complete, not "ended early" (1335 of 1511 walks were, before).
    let health = &report.0["health"];
    let (failed, walks) = (
        health["unwind_failed"].as_u64().unwrap(),
        health["unwind_walks"].as_u64().unwrap(),
    );
    eprintln!("{failed} of {walks} table walks ended early");
    assert!(
        failed * 20 <= walks,
        "{failed} of {walks} table walks ended early"
    );
    assert!(all > 100, "{all} samples in crypto/sha256.block");
    assert!(
        share_of_walked(kept, all, before, 0.95),
        "{kept} of {all} samples in crypto/sha256.block under main.main -> main.hashWork ({before} before tables)"
    );
    assert_the_clock_keeps_its_callers(&report, pid, before, truth["gominor"]);
}

/// Reading the clock: time.Now's call into the vDSO is named (it was `[unknown]`) by the
/// vDSO's own symbols, and keeps its callers (its walks ended at time.now, the assembly that
/// moves to the system stack, as if at a root: 4% of a clock-reading Go program's samples cut
/// off). The vDSO frame's caller is the Go function that calls it.
fn assert_the_clock_keeps_its_callers(report: &Report, pid: u32, before: u64, go_minor: f64) {
    const VDSO_CALLERS: [&str; 3] = ["time.now", "runtime.nanotime1", "runtime.walltime"];
    let count = |s: &&Value| s["count"].as_u64().unwrap();
    let vdso_at = |s: &Value| {
        s["frames"]
            .as_array()
            .unwrap()
            .iter()
            .position(|f| f["module"] == "[vdso]")
    };
    let in_vdso: Vec<&Value> = report
        .stacks_of(pid)
        .into_iter()
        .filter(|s| vdso_at(s).is_some())
        .collect();
    let all: u64 = in_vdso.iter().map(count).sum();
    // Named by a symbol, not placed (`[vdso]+0x…`) nor `[unknown]`.
    let by_symbol = |s: &&&Value| {
        s["frames"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|f| f["module"] == "[vdso]")
            .all(|f| !f["function"].as_str().unwrap().starts_with('['))
    };
    let named: u64 = in_vdso.iter().filter(by_symbol).map(count).sum();
    for s in in_vdso.iter().filter(|s| !by_symbol(s)) {
        eprintln!("not named by a vDSO symbol: {}", s["frames"]);
    }
    let kept: u64 = in_vdso
        .iter()
        .filter(|s| {
            let frames = Report::frames(s);
            let caller = vdso_at(s).unwrap().checked_sub(1).map(|i| frames[i]);
            in_order(&frames, &["main.main", "main.nowWork", "time.Now"])
                && caller.is_some_and(|c| VDSO_CALLERS.contains(&c))
        })
        .map(count)
        .sum();
    eprintln!(
        "{all} samples in the vDSO: {named} named by its symbols, {kept} under main.main -> main.nowWork -> time.Now"
    );
    assert!(all > 20, "{all} samples in the vDSO");
    // arm64's vDSO has static helpers its symbols leave out (placed by its .eh_frame instead).
    assert!(
        named * 10 >= all * 9,
        "{named} of {all} vDSO samples named by its symbols"
    );
    // arm64 Go before 1.21 kept no reliable frame pointers (Debian's is 1.19): its walks still
    // end where Go moves to the system stack.
    let arm64_before_1_21 = cfg!(target_arch = "aarch64") && go_minor < 21.0;
    assert!(
        arm64_before_1_21 || share_of_walked(kept, all, before, 0.95),
        "{kept} of {all} samples in the vDSO under main.nowWork ({before} before tables)"
    );
}
