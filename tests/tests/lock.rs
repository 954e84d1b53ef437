//! Lock mode against a workload that times its own waits: threads contend for one global mutex
//! (held 1 ms at a time in `critical_section`) and take private mutexes nobody else touches.
use bpfprof_tests::*;
use serde_json::Value;

const TOLERANCE: f64 = 0.10;

fn lock_run(
    name: &str,
    extra: &[&str],
    workload_args: &[&str],
) -> (std::collections::HashMap<String, f64>, Value) {
    let json = temp_path(name);
    let bin = workload("lockload");
    let mut args = vec!["--mode", "lock", "-o", json.to_str().unwrap()];
    args.extend_from_slice(extra);
    args.push("--");
    args.push(bin.to_str().unwrap());
    args.extend_from_slice(workload_args);
    let out = run(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    let truth = truth(&stdout(&out));
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).expect("lock JSON parses");
    (truth, report)
}

fn functions(frames: &Value) -> Vec<&str> {
    frames
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["function"].as_str().unwrap())
        .collect()
}

fn address_of(truth: &std::collections::HashMap<String, f64>, key: &str) -> String {
    format!("{:#x}", truth[key] as u64)
}

#[test]
fn the_shared_lock_its_wait_its_waiters_and_its_holders() {
    let (truth, report) = lock_run("lock.json", &[], &["3", "2"]);
    assert_eq!(report["mode"], "lock");
    assert_eq!(report["source"], "futex");
    let pid = truth["pid"] as u32;
    let locks = report["locks"].as_array().unwrap();
    let shared = address_of(&truth, "shared");
    let lock = locks
        .iter()
        .find(|l| l["address"] == shared.as_str())
        .unwrap_or_else(|| panic!("shared lock {shared} not reported: {locks:?}"));
    assert_eq!(lock["pid"], pid);
    assert_eq!(
        lock["symbol"], "shared_lock",
        "named from the symbol table (.bss)"
    );
    assert_eq!(lock["kind"], "mutex");
    // The lock was the most waited-for one that threads of the workload contended in code.
    let waited = lock["total_wait_ns"].as_f64().unwrap();
    let truth_wait = truth["wait_ns"];
    assert!(truth_wait > 1e9, "the workload should contend: {truth_wait} ns");
    assert!(
        (waited - truth_wait).abs() <= TOLERANCE * truth_wait,
        "shared_lock: {waited} ns waited, the workload timed {truth_wait} ns"
    );
    let contentions = lock["contentions"].as_u64().unwrap();
    assert!(
        contentions > 100 && contentions as f64 <= 1.5 * truth["acquisitions"],
        "{contentions} waits"
    );

    // Waiting stacks name the function that called the lock function.
    let named: f64 = lock["waiters"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|w| {
            let f = functions(&w["frames"]);
            f.windows(2)
                .any(|p| p[0] == "critical_section" && p[1].contains("pthread_mutex_lock"))
        })
        .map(|w| w["total_wait_ns"].as_f64().unwrap())
        .sum();
    assert!(
        named >= 0.90 * waited,
        "critical_section -> pthread_mutex_lock on {named} of {waited} ns"
    );

    // Holders: the stack that released the lock to each waiter is the critical section's.
    let released: f64 = lock["holders"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|h| functions(&h["frames"]).contains(&"critical_section"))
        .map(|h| h["total_wait_ns"].as_f64().unwrap())
        .sum();
    assert!(
        released >= 0.90 * waited,
        "released from critical_section for {released} of {waited} ns"
    );

    // Never-contended private locks never show up.
    for i in 0..3 {
        let private = address_of(&truth, &format!("private{i}"));
        assert!(
            locks.iter().all(|l| l["address"] != private.as_str()),
            "private lock {private} reported as contended"
        );
    }
    assert!(report["health"]["lock_waits"].as_u64().unwrap() >= contentions);
    assert_no_programs_left();
}

#[test]
fn stack_formats_weigh_waiting_stacks_by_wait() {
    let json = temp_path("lock.folded");
    let bin = workload("lockload");
    let out = run(&[
        "--mode",
        "lock",
        "-o",
        json.to_str().unwrap(),
        "--",
        bin.to_str().unwrap(),
        "2",
        "1",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let folded = std::fs::read_to_string(&json).unwrap();
    let shared: u64 = folded
        .lines()
        .filter(|l| l.contains("critical_section") && l.contains("[lock shared_lock]"))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    let truth = truth(&stdout(&out));
    assert!(
        (shared as f64 - truth["wait_ns"]).abs() <= 0.15 * truth["wait_ns"],
        "folded weight under [lock shared_lock]: {shared} ns, truth {} ns",
        truth["wait_ns"]
    );
}
