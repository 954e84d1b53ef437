//! Topdown mode. This VM has no PMU, so what is proven here is the honest fallback: one clear line
//! naming what is missing, then each thread's running / runnable / sleeping / blocked time, checked
//! against the kernel's own accounting in /proc/self/task/<tid>/schedstat.
use std::collections::HashMap;

use bpfprof_tests::*;
use serde_json::Value;

/// Running and runnable time are the kernel's own figures (what schedstat prints): 2%, for
/// what a thread does after reading its own. Sleeping is timed at the tracepoints: 10%.
const TOLERANCE: f64 = 0.02;
const SLEEP_TOLERANCE: f64 = 0.10;

fn has_pmu() -> bool {
    ["cpu", "cpu_core", "armv8_pmuv3_0"]
        .iter()
        .any(|pmu| std::path::Path::new(&format!("/sys/bus/event_source/devices/{pmu}/events")).is_dir())
}

#[test]
fn without_a_pmu_thread_states_match_the_kernel() {
    assert!(
        !has_pmu(),
        "this test is written for a machine without a PMU; extend it for the PMU path"
    );
    let json = temp_path("topdown.json");
    let schedload = workload("schedload");
    let out = run(&[
        "--mode",
        "topdown",
        "-o",
        json.to_str().unwrap(),
        "--",
        schedload.to_str().unwrap(),
        "3",
        "3",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let reason_lines: Vec<String> = stderr(&out)
        .lines()
        .filter(|l| l.contains("no hardware PMU"))
        .map(String::from)
        .collect();
    assert_eq!(
        reason_lines.len(),
        1,
        "one clear line about the missing PMU: {}",
        stderr(&out)
    );

    let report: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(report["mode"], "topdown");
    assert_eq!(report["source"], "thread-state");
    assert!(
        report["level1"].is_null() && report["ipc"].is_null(),
        "no made-up PMU numbers"
    );
    assert!(report["reason"].as_str().unwrap().contains("no hardware PMU"));

    for line in stdout(&out).lines().filter(|l| l.starts_with("TASK ")) {
        let kv: HashMap<&str, f64> = line[5..]
            .split_whitespace()
            .filter_map(|kv| kv.split_once('='))
            .filter_map(|(k, v)| Some((k, v.parse().ok()?)))
            .collect();
        let tid = kv["tid"] as u64;
        let thread = report["threads"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["tid"] == tid)
            .unwrap_or_else(|| panic!("thread {tid} missing"));
        let running = thread["running_ns"].as_f64().unwrap();
        let runnable = thread["runnable_ns"].as_f64().unwrap();
        assert!(
            (running - kv["oncpu"]).abs() <= TOLERANCE * kv["oncpu"],
            "tid {tid}: running {running} ns, kernel on-CPU {} ns",
            kv["oncpu"]
        );
        assert!(
            (runnable - kv["run_delay"]).abs() <= TOLERANCE * kv["run_delay"],
            "tid {tid}: runnable {runnable} ns, kernel run_delay {} ns",
            kv["run_delay"]
        );
        if kv["slept"] > 0.0 {
            let sleeping = thread["sleeping_ns"].as_f64().unwrap();
            assert!(
                (sleeping - kv["slept"]).abs() <= SLEEP_TOLERANCE * kv["slept"],
                "tid {tid}: sleeping {sleeping} vs {}",
                kv["slept"]
            );
        }
    }
}

#[test]
fn topdown_has_no_stack_formats() {
    let out = run(&[
        "--mode",
        "topdown",
        "-d",
        "1",
        "-o",
        temp_path("t.svg").to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("format `svg` is not available for mode topdown"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn the_missions_own_command_works_verbatim() {
    let workload = start_workload("hotspot", &["split", "3"]);
    let out = run(&["-p", &workload.pid().to_string(), "--mode", "topdown", "-d", "1"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("bpfprof topdown") && text.contains("Per thread"),
        "{text}"
    );
    assert!(
        text.contains(&workload.pid().to_string()),
        "the target's thread is listed: {text}"
    );
}

/// perf stat -x, output of a Skylake-class run, multiplexed (topdown events ran half the time).
const SKYLAKE_CSV: &str = "\
4000000000,,cpu_clk_unhalted.thread,1000000000,50.00,,
4000000000,,idq_uops_not_delivered.core,1000000000,50.00,,
9600000000,,uops_issued.any,1000000000,50.00,,
8800000000,,uops_retired.retire_slots,1000000000,50.00,,
200000000,,int_misc.recovery_cycles,1000000000,50.00,,
8000000000,,instructions:u,1000000000,100.00,2.00,insn per cycle
4000000000,,cycles:u,1000000000,100.00,,
";

#[test]
fn counters_file_gives_level1_without_privileges() {
    let csv = temp_path("skl.csv");
    std::fs::write(&csv, SKYLAKE_CSV).unwrap();
    std::fs::set_permissions(
        csv.parent().unwrap(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let out = std::process::Command::new("setpriv")
        .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"])
        .arg(bpfprof_bin())
        .args([
            "--mode",
            "topdown",
            "--format",
            "json",
            "--counters",
            csv.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["source"], "pmu");
    let l = &v["level1"];
    for (key, want) in [
        ("retiring", 0.55),
        ("bad_speculation", 0.10),
        ("frontend_bound", 0.25),
        ("backend_bound", 0.10),
    ] {
        assert!((l[key].as_f64().unwrap() - want).abs() < 1e-9, "{key}: {l}");
    }
    assert!((v["ipc"].as_f64().unwrap() - 2.0).abs() < 1e-9);
    assert_eq!(v["multiplexed"]["uops_issued.any"], 0.5);
}

#[test]
fn counters_from_real_perf_stat_output_are_read_and_the_gap_named() {
    let csv = temp_path("real.csv");
    let perf = std::process::Command::new("perf")
        .args([
            "stat",
            "-x,",
            "-o",
            csv.to_str().unwrap(),
            "-e",
            "task-clock,context-switches,cycles",
            "--",
            "true",
        ])
        .output()
        .expect("perf (linux-perf) is installed by cargo xtask setup");
    assert!(perf.status.success(), "{}", stderr(&perf));
    let out = run(&["--mode", "topdown", "--counters", csv.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("no topdown events found"),
        "perf's own CSV must parse; the missing events are named: {err}"
    );
    assert!(!err.contains("not `perf stat -x,` output"), "{err}");
}

#[test]
fn counters_need_topdown_and_perf_csv() {
    let out = run(&["--counters", "/etc/hostname"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("--counters goes with --mode topdown"));
    let out = run(&["--mode", "topdown", "--counters", "/etc/passwd"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("not `perf stat -x,` output"),
        "{}",
        stderr(&out)
    );
}

/// A topdown run written as JSON: its output, the parsed report and the seconds the host stole
/// meanwhile (task-clock is the perf clock while a task is on a CPU, and runs through stolen
/// time; a thread's own CPU clock does not).
fn topdown_json(name: &str, args: &[&str]) -> (std::process::Output, Value, f64) {
    let json = temp_path(name);
    let mut all = vec!["--mode", "topdown", "-o", json.to_str().unwrap()];
    all.extend_from_slice(args);
    let (out, stolen) = stolen_during(|| run(&all));
    assert!(out.status.success(), "{}", stderr(&out));
    let report = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    (out, report, stolen)
}

/// A counter's total in a report; software counters are never multiplexed.
fn counter(report: &Value, name: &str) -> f64 {
    let c = report["counters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["event"] == name)
        .unwrap_or_else(|| panic!("no {name} in {}", report["counters"]));
    assert_eq!(c["running"], 1.0, "{name} was multiplexed");
    c["value"].as_f64().unwrap()
}

/// The threads' running time by the sched tracepoints, and how far the task-clock counter is
/// from it: two mechanisms, one truth.
fn assert_task_clock_matches_thread_states(report: &Value) {
    let running: f64 = report["threads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["running_ns"].as_f64().unwrap())
        .sum();
    let task_clock = counter(report, "task-clock");
    assert!(
        (task_clock - running).abs() <= 0.05 * running,
        "task-clock {task_clock} vs thread-state running {running}"
    );
}

/// The whole-run counting path (the one the hardware sets use) with the software set, which
/// works without a PMU: per-thread counters inherited by threads started later, against the
/// workload's own accounting and against the scheduler tracepoints' independent view.
#[test]
fn software_counters_match_the_workloads_own_accounting() {
    let schedload = workload("schedload");
    let (out, report, stolen) = topdown_json(
        "topdown-software.json",
        &[
            "--preset",
            "software",
            "--",
            schedload.to_str().unwrap(),
            "2",
            "3",
        ],
    );
    assert_eq!(report["preset"], "software");
    assert!(report["level1"].is_null(), "software counters give no level 1");
    // The threads are created after the counters open: only inheritance can count them.
    let (mut oncpu, mut runs) = (0.0, 0.0);
    for line in stdout(&out).lines().filter(|l| l.starts_with("TASK ")) {
        let kv: HashMap<&str, f64> = line[5..]
            .split_whitespace()
            .filter_map(|kv| kv.split_once('='))
            .filter_map(|(k, v)| Some((k, v.parse().ok()?)))
            .collect();
        oncpu += kv["oncpu"];
        runs += kv["pcount"];
    }
    assert!(oncpu > 1e9, "4 threads, 2 CPUs, 2 s: {oncpu}");
    let task_clock = counter(&report, "task-clock");
    // The main thread's own setup and the threads' last instants after they read schedstat;
    // and what the host stole while they ran.
    assert!(
        task_clock >= 0.95 * oncpu - 20e6 && task_clock <= 1.05 * oncpu + 20e6 + stolen * 1e9,
        "task-clock {task_clock} ns vs the threads' own on-CPU {oncpu} ns ({stolen} s stolen)"
    );
    let switches = counter(&report, "context-switches");
    assert!(
        (switches - runs).abs() <= 0.10 * runs + 20.0,
        "context switches {switches} vs the threads' timeslices {runs}"
    );
    assert_task_clock_matches_thread_states(&report);

    // Page faults, in a process whose faults are known.
    let hotspot = workload("hotspot");
    let (out, report, _) = topdown_json(
        "topdown-faults.json",
        &[
            "--preset",
            "software",
            "--",
            hotspot.to_str().unwrap(),
            "faults",
            "1",
        ],
    );
    let faults = truth(&stdout(&out))["faults"];
    let counted = counter(&report, "page-faults");
    // Plus the loader's and libc's own faults at start-up (a few hundred).
    assert!(
        counted >= faults && counted <= faults * 1.01 + 2000.0,
        "page faults {counted} vs {faults} touched"
    );
    assert_no_programs_left();
}

/// The per-function path end to end (the one hardware sets use for the level-1 split per
/// function), with software counters: each sample's counter deltas land on its function.
/// Task-clock per function is checked in nanoseconds against the workload's own clock in each
/// function; page faults must not land on the function that makes none.
///
/// A sample carries what its thread counted since its previous sample, so the phases are long
/// (300/150/50 ms) against the sampling interval (2 ms): within a phase the attribution is exact,
/// and what remains is an interval's worth at each phase's edges. Short phases would make the
/// check a matter of how many samples happened to fall into each phase instead.
#[test]
fn per_function_counters_follow_the_workloads_own_split() {
    let hotspot = workload("hotspot");
    let function = |report: &Value, name: &str| -> Value {
        report["functions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["function"] == name)
            .unwrap_or_else(|| panic!("{name} missing from {}", report["functions"]))
            .clone()
    };
    let (out, report, stolen) = topdown_json(
        "topdown-functions.json",
        &[
            "--preset",
            "software",
            "-F",
            "499",
            "--",
            hotspot.to_str().unwrap(),
            "weights",
            "300",
            "150",
            "50",
            "3",
        ],
    );
    assert_eq!(report["sampled_on"], "cpu-clock");
    let split = truth(&stdout(&out));
    for name in ["burn_a", "burn_b", "burn_c"] {
        let f = function(&report, name);
        let clock = f["counters"]["task-clock"].as_f64().unwrap();
        assert!(
            clock >= 0.90 * split[name] && clock <= 1.10 * split[name] + stolen * 1e9,
            "{name}: task-clock {clock} ns attributed, the workload spent {} ns there ({stolen} s stolen)",
            split[name]
        );
        assert!(f["level1"].is_null() && f["ipc"].is_null(), "no PMU numbers: {f}");
    }

    let (out, report, stolen) = topdown_json(
        "topdown-functions-faults.json",
        &[
            "--preset",
            "software",
            "-F",
            "499",
            "--",
            hotspot.to_str().unwrap(),
            "faults",
            "2",
        ],
    );
    let faults = truth(&stdout(&out));
    let burn = function(&report, "burn_a");
    let in_burn = burn["counters"]["page-faults"].as_f64().unwrap();
    // Only intervals that began in a fault phase and ended in burn_a carry any (~1 of 20 ms).
    assert!(
        in_burn <= 0.10 * faults["faults"],
        "{in_burn} of {} page faults landed on burn_a, which makes none",
        faults["faults"]
    );
    let clock = burn["counters"]["task-clock"].as_f64().unwrap();
    assert!(
        clock >= 0.90 * faults["burn_a"] && clock <= 1.10 * faults["burn_a"] + stolen * 1e9,
        "burn_a: task-clock {clock} vs {} ({stolen} s stolen)",
        faults["burn_a"]
    );
    assert_no_programs_left();
}

/// `-p`: every thread that already exists gets its own counters.
#[test]
fn software_counters_cover_every_thread_of_a_running_process() {
    // It outlives the run (and is stopped when the test ends).
    let target = start_workload("schedload", &["30", "3"]);
    let pid = target.pid();
    // Three busy threads, the sleeper and the main thread, all there before the run starts.
    let tids = threads_of(pid, 5);
    let before: Vec<f64> = tids.iter().map(|&tid| on_cpu_ns(pid, tid)).collect();
    let (_, report, stolen) = topdown_json(
        "topdown-software-p.json",
        &["--preset", "software", "-p", &pid.to_string(), "-d", "2"],
    );
    let after: Vec<f64> = tids.iter().map(|&tid| on_cpu_ns(pid, tid)).collect();
    // Counters on every thread add up to the time the scheduler saw each of them run...
    assert_task_clock_matches_thread_states(&report);
    // ...and every thread is in it, the main thread too (asleep in pthread_join all along: the
    // scheduler never mentions it), with no more than the kernel says it ran meanwhile. The
    // busy threads never sleep: for the whole run they are running or waiting for a CPU,
    // however busy the machine is.
    let duration = report["duration_s"].as_f64().unwrap() * 1e9;
    let mut busy = 0;
    for (i, &tid) in tids.iter().enumerate() {
        let thread = report["threads"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["tid"] == tid)
            .unwrap_or_else(|| panic!("thread {tid} missing from {}", report["threads"]));
        let ns = |state: &str| thread[state].as_f64().unwrap();
        let ran = after[i] - before[i];
        // The tracepoints' clock runs through stolen time, the thread's CPU clock does not.
        assert!(
            ns("running_ns") <= ran + 1e6 + stolen * 1e9,
            "tid {tid}: running {} ns, the kernel counted {ran} ns on CPU meanwhile ({stolen} s stolen)",
            ns("running_ns")
        );
        let off_cpu = ns("sleeping_ns") + ns("blocked_ns");
        if off_cpu == 0.0 {
            busy += 1;
            let on = ns("running_ns") + ns("runnable_ns");
            assert!(
                on >= 0.98 * duration,
                "busy tid {tid}: running or runnable {on} ns of a {duration} ns run: {thread}"
            );
        }
        if tid == pid {
            assert_eq!(ns("running_ns"), 0.0, "the main thread only waits: {thread}");
            assert!(
                off_cpu >= 0.98 * duration,
                "the main thread waits all run: {thread}"
            );
        }
    }
    assert_eq!(busy, 3, "three busy threads: {}", report["threads"]);
}

#[test]
fn presets_needing_a_pmu_fall_back_and_bad_presets_are_refused() {
    assert!(!has_pmu(), "written for a machine without a PMU");
    let out = run(&["--mode", "topdown", "--preset", "branches", "-a", "-d", "1"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let lines = stderr(&out)
        .lines()
        .filter(|l| l.contains("no hardware PMU"))
        .count();
    assert_eq!(lines, 1, "{}", stderr(&out));
    assert!(stdout(&out).contains("Where each thread's time went"));
    let out = run(&["--mode", "topdown", "--preset", "nonsense", "-a", "-d", "1"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let out = run(&["--mode", "sched", "--preset", "software", "-a", "-d", "1"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("--preset goes with --mode topdown"));
    assert_no_programs_left();
}
