//! The hardware-counter path, on a real (emulated) PMU: `cargo xtask test` runs this file inside
//! an emulated Neoverse N1 (`qemu-system-aarch64 -cpu neoverse-n1 -icount shift=0`, see
//! xtask/src/guest.rs); the host, which has no PMU, leaves it out. On a machine without a PMU
//! every test here fails: none of them skips.
//!
//! The ground truth: under `-icount shift=0` each instruction takes one virtual nanosecond and
//! CPU_CYCLES counts virtual time at 1 GHz, so cycles equal instructions (IPC exactly 1.0), and a
//! function's share of the instructions is its share of the thread's CPU time, which the
//! workload measures itself.
use std::collections::HashMap;

use bpfprof_tests::*;
use serde_json::Value;

/// Shares must match the workload's own measurement within this many percentage points.
const TOLERANCE_PP: f64 = 3.0;

const PMU: &str = "/sys/bus/event_source/devices/armv8_pmuv3";

fn assert_pmu() {
    assert!(
        std::path::Path::new(PMU).is_dir(),
        "{PMU} is missing: this suite is for the emulated Neoverse (cargo xtask test boots it)"
    );
}

fn hotspot() -> String {
    workload("hotspot").to_str().unwrap().to_string()
}

const BURNS: [&str; 3] = ["burn_a", "burn_b", "burn_c"];

/// bpfprof with `flags` at 499 Hz on the hotspot workload's 60/30/10 split for 2 s of its CPU
/// time: the workload's own measurement, and the JSON report.
fn profile_split(name: &str, flags: &[&str]) -> (HashMap<String, f64>, std::path::PathBuf) {
    let json = temp_path(name);
    let hotspot = hotspot();
    let mut args = flags.to_vec();
    args.extend([
        "-F",
        "499",
        "-o",
        json.to_str().unwrap(),
        "--",
        &hotspot,
        "split",
        "2",
    ]);
    let out = run(&args);
    assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    (truth(&stdout(&out)), json)
}

/// The events whose samples are taken where the counter overflows. QEMU 7.2 (Debian 12) raises
/// the overflow interrupt of a general-purpose event counter only at the CPU's next exception,
/// not when it overflows (measured: a loop without syscalls sampled with `-e instructions -F
/// 499` gets 250 samples a second, the guest's timer tick, where `-e cycles` gets 483; with a
/// syscall in the loop, 71% of them land in the kernel's `el0_svc_common`, where the system
/// call unmasks interrupts). Its dedicated cycle counter, which `-e cycles` gets, is on time.
/// An instructions sample's innermost frames are therefore the emulator's, not the program's;
/// the stack below them is the program's, so its callers' shares still hold.
const PRECISE: [&str; 2] = ["cycles", "cpu-clock"];

/// Each burn's share (`got`, 0 to 1) against what the workload measured, within the tolerance;
/// printed either way, each line starting with `label` and ending with `context` on failure.
fn assert_shares(label: &str, got: impl Fn(&str) -> f64, truth: &HashMap<String, f64>, context: &str) {
    let want = truth_shares(truth, &BURNS);
    let shares: Vec<(f64, f64)> = BURNS
        .iter()
        .map(|name| (got(name) * 100.0, want[*name] * 100.0))
        .collect();
    for (name, (got, want)) in BURNS.iter().zip(&shares) {
        eprintln!("{label}: {name} {got:.2}%, workload measured {want:.2}%");
    }
    for (name, (got, want)) in BURNS.iter().zip(shares) {
        assert!(
            (got - want).abs() <= TOLERANCE_PP,
            "{label}: {name} {got:.2}%, workload measured {want:.2}%{context}"
        );
    }
}

#[test]
fn hotspot_shares_on_cycles_instructions_and_cpu_clock_match_the_workload() {
    assert_pmu();
    for event in ["cycles", "instructions", "cpu-clock"] {
        let (truth, json) = profile_split(&format!("pmu-hotspot-{event}.json"), &["-e", event]);
        let pid = truth["pid"] as u32;
        let report = Report::read(&json);
        report.assert_consistent();
        assert_eq!(report.0["lost"], 0, "-e {event}");
        let samples = report.samples_of(pid);
        eprintln!("-e {event}: {samples} samples of the workload");
        assert!(samples > 500, "-e {event}: {samples} samples of the workload");
        let leaves: Vec<String> = report
            .stacks_of(pid)
            .iter()
            .take(5)
            .map(|s| format!("{} x{}", Report::frames(s).last().unwrap_or(&"-"), s["count"]))
            .collect();
        // A burn's own time includes the clock reads it makes (the workload times them in), so
        // its samples with callees are what the workload measured.
        let context = format!("; top stacks' leaves: {leaves:?}");
        let label = format!("-e {event}, with callees");
        assert_shares(&label, |f| report.total_share(pid, f), &truth, &context);
        if PRECISE.contains(&event) {
            let label = format!("-e {event}, self");
            assert_shares(&label, |f| report.self_share(pid, f), &truth, &context);
        }
        assert!(
            report.has_chain(pid, &["main", "run_split", "phase_ab", "burn_a"]),
            "-e {event}: burn_a's callers missing"
        );
    }
}

fn topdown(name: &str, args: &[&str]) -> Value {
    let json = temp_path(name);
    let mut all = vec!["--mode", "topdown", "-o", json.to_str().unwrap()];
    all.extend_from_slice(args);
    let out = run(&all);
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap()
}

fn counters(report: &Value) -> HashMap<String, f64> {
    report["counters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["event"].as_str().unwrap().to_string(),
                c["value"].as_f64().unwrap(),
            )
        })
        .collect()
}

/// Each hot function's share of `counter` among the burns, against the workload's CPU-time
/// shares (= its instruction shares here).
fn assert_function_shares(report: &Value, counter: &str, truth: &HashMap<String, f64>) {
    // Topdown keys a function's counters by name; a hotspot report lists them in the order of
    // its top-level `counters`.
    let position = report["counters"]
        .as_array()
        .and_then(|names| names.iter().position(|n| n == counter));
    let function = |name: &str| -> f64 {
        let f = report["functions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["function"] == name)
            .unwrap_or_else(|| panic!("{name} missing from {}", report["functions"]));
        let value = match position {
            Some(i) => &f["counters"][i],
            None => &f["counters"][counter],
        };
        value
            .as_f64()
            .unwrap_or_else(|| panic!("{name} has no {counter}: {f}"))
    };
    let total: f64 = BURNS.iter().map(|n| function(n)).sum();
    let label = format!("{counter} of the burns' {total:.0}");
    assert_shares(&label, |n| function(n) / total, truth, "");
}

/// The headline command on a real counter: `--mode topdown -p PID`.
#[test]
fn topdown_of_a_running_process_counts_ipc_one_and_splits_instructions_by_function() {
    assert_pmu();
    // Longer than any run here: bpfprof's start under emulation takes seconds of the
    // workload's CPU time; it is stopped once the profile is written.
    let workload = start_workload("hotspot", &["split", "600"]);
    let pid = workload.pid().to_string();
    let report = topdown("pmu-topdown.json", &["-p", &pid, "-d", "3", "-F", "499"]);
    let truth = truth(&workload.stop());
    assert_eq!(
        report["source"], "pmu",
        "{}; counters {}; notes {}",
        report["reason"], report["counters"], report["notes"]
    );
    let counts = counters(&report);
    let (cycles, instructions) = (counts["cpu_cycles"], counts["inst_retired"]);
    let ipc = report["ipc"].as_f64().unwrap();
    eprintln!("topdown -p: {instructions:.0} instructions in {cycles:.0} cycles, IPC {ipc:.4}");
    assert!(instructions > 1e8, "{instructions} instructions in 3 s");
    assert!((ipc - 1.0).abs() <= 0.02, "IPC {ipc}, exactly 1 on this machine");
    assert_function_shares(&report, "inst_retired", &truth);
    // The stall events count nothing on this CPU model: said so, never shown as a real 0%.
    for stall in ["stall_frontend", "stall_backend"] {
        if counts.get(stall) == Some(&0.0) {
            let said = report["notes"].to_string();
            assert!(
                said.contains(stall),
                "{stall} read 0 and no note says it counted nothing: {said}"
            );
        }
    }
}

/// `--counter instructions`: the hotspot report's per-function instructions, from the counter
/// read at each sample.
#[test]
fn per_function_instructions_follow_the_instructions_each_function_executes() {
    assert_pmu();
    let (truth, json) = profile_split("pmu-counter.json", &["--counter", "instructions"]);
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_function_shares(&report, "instructions", &truth);
}

/// Any PMU event perf's language names, sampled every N occurrences: by its name (sysfs or
/// Arm's architected table) and by its format terms, both in one run (one profile per event,
/// each run by the sampling program with the event's place as its cookie), each a split of the
/// workload's own.
#[test]
fn sampling_a_pmu_event_every_n_by_name_or_by_terms_splits_as_the_workload() {
    assert_pmu();
    let events = [
        ("inst_retired", "inst_retired"),
        ("armv8_pmuv3/event=0x8/", "armv8_pmuv3_event_0x8"),
    ];
    let json = temp_path("pmu-every.json");
    let args = [
        "-e",
        events[0].0,
        "-e",
        events[1].0,
        "-c",
        "100003",
        "-o",
        json.to_str().unwrap(),
        "--",
        &hotspot(),
        "split",
        "2",
    ];
    let out = run(&args);
    assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    let truth = truth(&stdout(&out));
    let pid = truth["pid"] as u32;
    for (event, file) in events {
        let report = Report::read(&temp_path(&format!("pmu-every.{file}.json")));
        assert_eq!(
            (report.0["event"].as_str(), report.0["period"].as_u64()),
            (Some(event), Some(100003))
        );
        let samples = report.samples_of(pid);
        eprintln!("-e {event} -c 100003: {samples} samples of the workload");
        assert!(samples > 1000, "{samples} samples");
        // Instructions: under `-icount`, a burn's share of them is its share of CPU time.
        let label = format!("-e {event} -c 100003, with callees");
        assert_shares(&label, |f| report.total_share(pid, f), &truth, "");
    }
}

fn stat(name: &str, args: &[&str]) -> Value {
    let json = temp_path(name);
    let mut all = vec!["stat", "-o", json.to_str().unwrap()];
    all.extend_from_slice(args);
    let out = run(&all);
    assert!(out.status.success(), "{all:?}: {}", stderr(&out));
    serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap()
}

/// `stat -r 5` on cycles and instructions: IPC exactly 1 here, a spread over the runs; counted
/// apart and as one group (`{...}`).
#[test]
fn stat_counts_ipc_one_over_runs_apart_and_as_a_group() {
    assert_pmu();
    let hotspot = hotspot();
    for events in [
        "cpu_cycles,inst_retired",
        "{cpu_cycles,inst_retired},stall_backend",
    ] {
        let report = stat(
            "pmu-stat.json",
            &["-r", "5", "-e", events, "--", &hotspot, "split", "1"],
        );
        let metric = |name: &str| -> Value {
            report["metrics"]
                .as_array()
                .unwrap()
                .iter()
                .find(|m| m["name"] == name)
                .cloned()
                .unwrap_or_default()
        };
        let ipc = metric("ipc");
        let cycles = report["counters"][0].clone();
        eprintln!(
            "stat -r 5 -e {events}: IPC {} ( +- {}% ); cycles {} ( +- {}% )",
            ipc["value"], ipc["spread_pct"], cycles["value"], cycles["spread_pct"]
        );
        assert_eq!(report["runs"], 5);
        let value = ipc["value"]
            .as_f64()
            .unwrap_or_else(|| panic!("no IPC: {report}"));
        assert!(
            (value - 1.0).abs() <= 0.01,
            "IPC {value}, exactly 1 on this machine"
        );
        assert!(ipc["spread_pct"].as_f64().is_some() && cycles["spread_pct"].as_f64().is_some());
        assert!(cycles["value"].as_f64().unwrap() > 5e8, "{cycles}");
    }
}

/// Counter A/B: the same workload doing a known extra amount of work (a loop of exactly two
/// instructions, run 10% more times), each side `stat -r 3`; `diff` gives the instructions'
/// difference, and names the instruction count as why the cycles grew.
#[test]
fn counter_diff_of_two_builds_names_the_instruction_count_and_its_delta() {
    assert_pmu();
    let events = workload("events").to_str().unwrap().to_string();
    let side = |name: &str, iterations: u64| -> (std::path::PathBuf, f64) {
        let path = temp_path(name);
        let args = [
            "stat",
            "-r",
            "3",
            "-e",
            // User-space counts only: the kernel's share (page faults, exec) varies by about a
            // million instructions from run to run, which is a 1% error on the loop's delta.
            "cpu_cycles:u,inst_retired:u",
            "-o",
            path.to_str().unwrap(),
            "--",
            &events,
            "insns",
            &iterations.to_string(),
        ];
        let out = run(&args);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        let report: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        for c in report["counters"].as_array().unwrap() {
            println!(
                "{name}: {} runs {} running {}",
                c["event"], c["runs"], c["running"]
            );
        }
        (path, truth(&stdout(&out))["loop_instructions"])
    };
    let (before, before_loop) = side("pmu-ab-before.json", 50_000_000);
    let (after, after_loop) = side("pmu-ab-after.json", 55_000_000);
    let out = run(&[
        "diff",
        before.to_str().unwrap(),
        after.to_str().unwrap(),
        "--format",
        "json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let diff: Value = serde_json::from_slice(&out.stdout).unwrap();
    let instructions = diff["counters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "inst_retired:u")
        .unwrap();
    let delta = instructions["after"].as_f64().unwrap() - instructions["before"].as_f64().unwrap();
    let known = after_loop - before_loop;
    let answer = diff["answer"].as_str().unwrap_or_default();
    eprintln!(
        "A/B: inst_retired {} -> {} (delta {delta:.0}; the loop's extra {known:.0}); {answer}",
        instructions["before"], instructions["after"]
    );
    assert!(
        (delta - known).abs() <= 0.01 * known,
        "delta {delta} for {known} extra instructions"
    );
    assert!(answer.contains("the instruction count grew"), "{answer}");
    assert_eq!(instructions["beyond_spread"], true, "{instructions}");
}

/// The agent's counters signal: a pull of `/debug/pprof/counters` weights each stack by the
/// cycles and instructions its samples ran (read in BPF at each sample), so each function's
/// IPC is exactly 1 here, and the instructions split as the workload measured its own time.
#[test]
fn agent_counters_signal_weights_each_function_by_its_cycles_and_instructions() {
    assert_pmu();
    let dir = temp_path("pmu-agent-windows");
    let agent = Agent::start(&[
        "--signals",
        "cpu,counters",
        "--window",
        "60",
        "-F",
        "499",
        "--output-dir",
        dir.to_str().unwrap(),
    ]);
    let workload = start_workload("hotspot", &["split", "600"]);
    let pid = workload.pid();
    let (status, body) = http_get(&agent.address, "/debug/pprof/counters?seconds=3").unwrap();
    let truth = truth(&workload.stop());
    let (ok, err, _) = agent.stop(std::time::Duration::from_secs(30));
    assert!(ok, "the agent failed: {err}");
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let p = decode_pprof(&body);
    let text = |i: i64| p.string_table[i as usize].as_str();
    let types: Vec<&str> = p.sample_type.iter().map(|t| text(t.r#type)).collect();
    let column = |name: &str| {
        (types.iter().position(|t| *t == name)).unwrap_or_else(|| panic!("no {name} in {types:?}"))
    };
    let (cycles, instructions) = (column("cycles"), column("instructions"));
    // Each burn's cycles and instructions, with callees (its clock reads are in its own time).
    let mut counts: HashMap<&str, (f64, f64)> = HashMap::new();
    for sample in &p.sample {
        let of_workload = (sample.label.iter()).any(|l| text(l.key) == "pid" && l.num == pid as i64);
        let functions: Vec<&str> = (sample.location_id.iter())
            .flat_map(|id| &p.location.iter().find(|l| l.id == *id).unwrap().line)
            .map(|line| text(p.function.iter().find(|f| f.id == line.function_id).unwrap().name))
            .collect();
        for burn in BURNS.iter().filter(|b| of_workload && functions.contains(b)) {
            let entry = counts.entry(burn).or_default();
            entry.0 += sample.value[cycles] as f64;
            entry.1 += sample.value[instructions] as f64;
        }
    }
    for burn in BURNS {
        let (c, i) = counts.get(burn).copied().unwrap_or_default();
        eprintln!(
            "agent counters: {burn} {c:.0} cycles, {i:.0} instructions, IPC {:.4}",
            i / c
        );
        assert!(i > 1e6, "{burn}: {i} instructions in a 3 s pull");
        assert!(
            (i / c - 1.0).abs() <= 0.02,
            "{burn}: IPC {}, exactly 1 on this machine",
            i / c
        );
    }
    let total: f64 = counts.values().map(|(_, i)| i).sum();
    let share = |name: &str| counts.get(name).map_or(0.0, |(_, i)| i / total);
    assert_shares("agent counters, instructions", share, &truth, "");
    // The last window's files hold the counters profile beside the CPU one.
    let files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(files.iter().any(|f| f.contains("counters")), "{files:?}");
}

/// Arm's PMUv3 has no precise sampling (no caps/max_precise): `:p` is refused in one line, not
/// silently sampled as if it were precise.
#[test]
fn precise_sampling_is_refused_where_the_pmu_has_none() {
    assert_pmu();
    let out = run(&["-e", "inst_retired:p", "--", "true"]);
    let err = stderr(&out);
    eprintln!("-e inst_retired:p: {:?} {err}", out.status.code());
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("cannot sample precisely"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
}
