//! JIT code named by its runtime's perf map (`/tmp/perf-PID.map`): the jit workload writes a
//! loop's machine code into anonymous memory, names it `jitted_spin` in its perf map, and times
//! it, a C function and an unnamed copy of the loop by its own clock.
use bpfprof_tests::*;

/// Each function's self share of the samples is the workload's own share of time within
/// `SHARE_TOLERANCE_PP`: the named JIT code under its perf map's name (module `[jit]`, named by
/// `perf_map`), the unnamed copy as `[unknown]` in `[anon]` (never under a neighbour's name).
/// The map's garbage line is skipped.
#[test]
fn jit_code_is_named_from_its_perf_map() {
    let bin = workload("jit");
    let (out, path) = profile_workload(
        "499",
        &format!("jit-{}.json", rand_suffix()),
        &[bin.to_str().unwrap(), "3000"],
    );
    let truth = truth(&stdout(&out));
    let pid = truth["pid"] as u32;
    let _ = std::fs::remove_file(format!("/tmp/perf-{pid}.map"));
    let report = Report::read(&path);
    let shares = truth_shares(&truth, &["jitted_spin", "native_spin", "anon"]);
    for name in ["jitted_spin", "native_spin"] {
        let (got, want) = (report.self_share(pid, name) * 100.0, shares[name] * 100.0);
        println!("{name}: {got:.2}% self, the workload measured {want:.2}%");
        assert!(
            (got - want).abs() <= SHARE_TOLERANCE_PP,
            "{name}: {got:.2}% vs {want:.2}%"
        );
    }
    let leaves: Vec<&serde_json::Value> = (report.stacks_of(pid).into_iter())
        .filter_map(|s| s["frames"].as_array()?.last())
        .collect();
    let jitted = leaves
        .iter()
        .find(|f| f["function"] == "jitted_spin")
        .expect("a jitted_spin leaf");
    assert_eq!(
        (&jitted["module"], &jitted["kind"]),
        (&"[jit]".into(), &"perf_map".into()),
        "{jitted}"
    );
    let samples = report.samples_of(pid) as f64;
    let anon: u64 = (report.stacks_of(pid).iter())
        .filter(|s| {
            s["frames"]
                .as_array()
                .and_then(|f| f.last())
                .is_some_and(|f| f["module"] == "[anon]")
        })
        .map(|s| s["count"].as_u64().unwrap())
        .sum();
    let want = shares["anon"] * 100.0;
    let got = 100.0 * anon as f64 / samples;
    println!("unnamed JIT code: {got:.2}% of {samples} samples in [anon], the workload measured {want:.2}%");
    assert!(
        (got - want).abs() <= SHARE_TOLERANCE_PP,
        "{got:.2}% vs {want:.2}%"
    );
}
