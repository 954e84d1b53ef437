//! User stacks without frame pointers: the workloads are built with `-fomit-frame-pointer` (and
//! Rust's default), so only the unwind tables can name a frameless leaf's caller or walk through
//! Debian's libc, which has no frame pointers either. The frame-pointer walk on the same workload
//! is the control: it must get these stacks wrong, or the test proves nothing.
use bpfprof_tests::*;
use serde_json::Value;

fn unwind_bin() -> String {
    workload("unwind").to_str().unwrap().to_string()
}

/// (samples whose stack satisfies `pred`, samples whose leaf is `leaf`) for `pid`.
fn count_leaf(report: &Report, pid: u32, leaf: &str, pred: impl Fn(&[&str]) -> bool) -> (u64, u64) {
    let (mut hits, mut total) = (0, 0);
    for s in report.stacks_of(pid) {
        let frames = Report::frames(s);
        if frames.last() != Some(&leaf) {
            continue;
        }
        let n = s["count"].as_u64().unwrap();
        total += n;
        if pred(&frames) {
            hits += n;
        }
    }
    (hits, total)
}

fn ends_with(frames: &[&str], chain: &[&str]) -> bool {
    frames.ends_with(chain)
}

/// `chain` appears in order (not necessarily adjacent) in `frames`.
fn in_order(frames: &[&str], chain: &[&str]) -> bool {
    let mut it = frames.iter();
    chain.iter().all(|want| it.any(|f| f == want))
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
    let (full, leaf) = count_leaf(&report, pid, "leaf_work", |f| ends_with(f, &chain));
    let (caller, _) = count_leaf(&report, pid, "leaf_work", |f| ends_with(f, &chain[3..]));
    assert!(leaf > 500, "{leaf} samples in leaf_work");
    assert!(
        full as f64 >= 0.90 * leaf as f64,
        "full chain on {full} of {leaf} leaf samples"
    );
    assert!(
        caller as f64 >= 0.95 * leaf as f64,
        "level_two -> leaf_work on {caller} of {leaf} leaf samples"
    );
    let (_, start) = count_leaf(&report, pid, "leaf_work", |f| f.first() == Some(&"_start"));
    assert!(
        start as f64 >= 0.90 * leaf as f64,
        "walks end at _start: {start} of {leaf}"
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
    let (ok, leaf) = count_leaf(&report, pid, "compare_items", |f| {
        in_order(f, &["main", "run_qsort", "compare_items"])
            && f.iter()
                .any(|name| name.contains("qsort") || name.contains("msort"))
    });
    assert!(leaf > 50, "{leaf} samples in compare_items");
    assert!(
        ok as f64 >= 0.90 * leaf as f64,
        "main .. run_qsort .. libc .. compare_items on {ok} of {leaf}"
    );
    // Every sample inside libc's sort names the caller too.
    let total = report.samples_of(pid);
    let under_run_qsort: u64 = report
        .stacks_of(pid)
        .iter()
        .filter(|s| in_order(&Report::frames(s), &["main", "run_qsort"]))
        .map(|s| s["count"].as_u64().unwrap())
        .sum();
    assert!(
        under_run_qsort as f64 >= 0.90 * total as f64,
        "{under_run_qsort} of {total} samples under main -> run_qsort"
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
    for burn in ["spin::burn_x", "spin::burn_y"] {
        let (ok, leaf) = count_leaf(&report, pid, burn, |f| {
            in_order(f, &["main", "spin::main", "spin::run", burn])
        });
        assert!(leaf > 100, "{leaf} samples in {burn}");
        assert!(
            ok as f64 >= 0.90 * leaf as f64,
            "{burn}: full chain on {ok} of {leaf}"
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
}
