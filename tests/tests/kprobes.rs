//! Kernel probes (`kprobe:FUNCTION`, `kretprobe:FUNCTION`), on the emulated arm64 machine's
//! kernel, which has them: `cargo xtask test` runs this file inside the guest (see
//! xtask/src/guest.rs); the host's kernel has none, and leaves it out (events.rs checks the one
//! line it says there instead). Ground truth: a workload that sleeps N times through
//! nanosleep(2), each of which runs the kernel's do_nanosleep once.
use bpfprof_tests::*;

fn events_bin() -> String {
    workload("events").to_str().unwrap().to_string()
}

/// The count `stat` gives each event of a run of `events naps N`, and the workload's truth.
fn counted(events: &str, naps: &str) -> (serde_json::Value, std::collections::HashMap<String, f64>) {
    let path = temp_path("kprobes-stat.json");
    let out = run(&[
        "stat",
        "-e",
        events,
        "-o",
        path.to_str().unwrap(),
        "--",
        &events_bin(),
        "naps",
        naps,
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    (read_json(&path), truth(&stdout(&out)))
}

fn value(report: &serde_json::Value, event: &str) -> f64 {
    (report["counters"].as_array().unwrap().iter())
        .find(|c| c["event"] == event)
        .and_then(|c| c["value"].as_f64())
        .unwrap_or_else(|| panic!("no {event} in {report}"))
}

#[test]
fn kprobes_count_and_sample_a_kernel_functions_calls_exactly() {
    let (report, said) = counted("kprobe:do_nanosleep,kretprobe:do_nanosleep", "200");
    let (entries, returns) = (
        value(&report, "kprobe:do_nanosleep"),
        value(&report, "kretprobe:do_nanosleep"),
    );
    println!(
        "{} naps: do_nanosleep entered {entries} times, returned {returns} times",
        said["naps"]
    );
    assert_eq!((entries, returns), (200.0, 200.0));
    // Sampled at every hit, with the user stack the thread entered the kernel with.
    let path = temp_path("kprobes.json");
    let out = run(&[
        "-e",
        "kprobe:do_nanosleep",
        "-o",
        path.to_str().unwrap(),
        "--",
        &events_bin(),
        "naps",
        "200",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let pid = truth(&stdout(&out))["pid"] as u32;
    let report = Report::read(&path);
    let samples = report.samples_of(pid);
    let under_napper = (report.total_share(pid, "napper") * samples as f64).round() as u64;
    let early = report.0["health"]["unwind_before_tables"].as_u64().unwrap();
    println!(
        "sampled: {samples} samples, {under_napper} under napper, {early} before the tables; notes {}",
        report.0["notes"]
    );
    assert_eq!(samples, 200);
    assert!(report.0["notes"]
        .to_string()
        .contains("kprobe:do_nanosleep: 200 hits"));
    assert!(under_napper + early >= samples, "{under_napper} under napper");
    assert!(
        report.has_chain(pid, &["do_nanosleep"]),
        "the kernel stack begins in the probed function"
    );
    // A misspelt function names the nearest.
    let out = run(&["stat", "-e", "kprobe:do_nanoslep", "--", "true"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("did you mean do_nanosleep"),
        "{}",
        stderr(&out)
    );
    assert_no_programs_left();
}
