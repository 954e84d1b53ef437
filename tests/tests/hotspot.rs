//! Hotspot mode end to end, against workloads with a known split of CPU time. These load BPF
//! for real: run as root (`cargo xtask test`); without privileges they fail, never skip.
use std::{collections::HashMap, process::Stdio};

use bpfprof_tests::*;

fn workload_pid(truth: &HashMap<String, f64>) -> u32 {
    truth["pid"] as u32
}

fn hotspot_bin() -> String {
    workload("hotspot").to_str().unwrap().to_string()
}

#[test]
fn c_command_split_matches_ground_truth_and_caller_chain() {
    let (out, json) = profile_workload("997", "c-split.json", &[&hotspot_bin(), "split", "3"]);
    let truth = truth(&stdout(&out)); // the command's stdout passes through bpfprof
    let report = Report::read(&json);
    report.assert_consistent();
    let pid = workload_pid(&truth);
    assert!(
        report.samples_of(pid) > 2000,
        "too few samples: {}",
        report.samples_of(pid)
    );
    // The kernel maps were drained while sampling (1 s epochs), and nothing was lost across them.
    assert!(
        report.0["health"]["drains"].as_u64().unwrap() >= 4,
        "{}",
        report.0["health"]
    );
    assert_eq!(report.0["lost"], 0);
    report.assert_self_shares("hotspot", pid, &truth, &["burn_a", "burn_b", "burn_c"]);
    assert!(
        report.has_chain(pid, &["main", "run_split", "phase_ab", "burn_a"]),
        "burn_a's callers missing"
    );
    assert!(
        report.has_chain(pid, &["main", "run_split", "burn_c"]),
        "burn_c's callers missing"
    );
    let leaf = report.stacks_of(pid)[0]["frames"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert!(
        leaf["file"].as_str().unwrap_or("").ends_with("hotspot.c"),
        "line info: {leaf}"
    );
    assert!(leaf["line"].as_u64().is_some(), "line info: {leaf}");
}

#[test]
fn rust_command_split_matches_ground_truth() {
    let spin = workload("spin");
    let (out, json) = profile_workload("997", "rust-split.json", &[spin.to_str().unwrap(), "3"]);
    let truth = truth(&stdout(&out));
    let report = Report::read(&json);
    report.assert_consistent();
    let pid = workload_pid(&truth);
    let mut renamed = truth.clone();
    renamed.insert("spin::burn_x".into(), truth["burn_x"]);
    renamed.insert("spin::burn_y".into(), truth["burn_y"]);
    report.assert_self_shares("spin", pid, &renamed, &["spin::burn_x", "spin::burn_y"]);
    assert!(
        report.has_chain(pid, &["spin::main", "spin::run", "spin::burn_x"]),
        "demangled callers missing"
    );
}

#[test]
fn syscall_heavy_workload_shows_kernel_frames_under_its_caller() {
    let (out, json) = profile_workload("499", "syscalls.json", &[&hotspot_bin(), "syscalls", "2"]);
    let truth = truth(&stdout(&out));
    let report = Report::read(&json);
    report.assert_consistent();
    let pid = workload_pid(&truth);
    let stacks = report.stacks_of(pid);
    let in_kernel = |s: &&&serde_json::Value| {
        s["frames"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["kernel"] == true)
    };
    let kernel_samples: u64 = stacks
        .iter()
        .filter(in_kernel)
        .map(|s| s["count"].as_u64().unwrap())
        .sum();
    let share = kernel_samples as f64 / report.samples_of(pid) as f64;
    assert!(
        share > 0.5,
        "a read(2) loop spends most time in the kernel; kernel frames in {:.0}%",
        share * 100.0
    );
    // Debian's libc `read` has no frame pointer, so a frame-pointer walk from inside it skips its
    // caller `do_reads` and resumes at `run_syscalls` (the unwinding issue recovers it).
    let read_in_kernel = stacks.iter().any(|s| {
        let frames = s["frames"].as_array().unwrap();
        frames
            .iter()
            .any(|f| f["kernel"] == true && f["function"].as_str().unwrap().contains("read"))
            && Report::frames(s)
                .windows(2)
                .any(|w| w == ["main", "run_syscalls"])
    });
    assert!(
        read_in_kernel,
        "no stack with a kernel read function under main -> run_syscalls"
    );
}

#[test]
fn short_lived_child_of_the_command_is_symbolized() {
    let script = format!("{} split 0.6; sleep 0.4", hotspot_bin());
    let (out, json) = profile_workload("997", "child.json", &["sh", "-c", &script]);
    let truth = truth(&stdout(&out));
    let pid = workload_pid(&truth);
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "the child has exited"
    );
    let report = Report::read(&json);
    report.assert_consistent();
    assert!(
        report.samples_of(pid) > 300,
        "child samples: {}",
        report.samples_of(pid)
    );
    assert!(
        report.self_share(pid, "burn_a") > 0.5,
        "the exited child's frames are symbolized"
    );
}

#[test]
fn attaches_to_a_running_pid() {
    let workload = start_workload("hotspot", &["split", "5"]);
    // Running: past the loader and into its work.
    wait_for_cpu_time(workload.pid(), workload.pid(), 1e8);
    let json = temp_path("pid.json");
    let pid = workload.pid().to_string();
    let out = run(&["-p", &pid, "-F", "997", "-d", "3", "-o", json.to_str().unwrap()]);
    assert!(out.status.success(), "bpfprof failed: {}", stderr(&out));
    let truth = truth(&workload.finish());
    let report = Report::read(&json);
    report.assert_consistent();
    let pid = workload_pid(&truth);
    let others: Vec<&serde_json::Value> = report.stacks().iter().filter(|s| s["pid"] != pid).collect();
    assert!(
        others.is_empty(),
        "-p must profile only the target; also saw {} other stacks",
        others.len()
    );
    report.assert_self_shares("hotspot", pid, &truth, &["burn_a", "burn_b", "burn_c"]);
}

#[test]
fn system_wide_sees_the_workload_among_others() {
    let workload = start_workload("hotspot", &["split", "60"]);
    let pid = workload.pid();
    let json = temp_path("all.json");
    let (bpfprof, stderr) = start_bpfprof(&["-a", "-F", "499", "-o", json.to_str().unwrap()]);
    // Sampling covers at least the time from "attached" to the signal: whatever else runs,
    // the workload gets 499 samples a second of its own CPU time in it.
    let before = on_cpu_ns(pid, pid);
    wait_for_cpu_time(pid, pid, 1.5e9);
    let ran = on_cpu_ns(pid, pid) - before;
    let (status, err) = interrupt_bpfprof(bpfprof, stderr);
    assert!(status.success(), "bpfprof failed: {err}");
    let report = Report::read(&json);
    report.assert_consistent();
    let expected = 499.0 * ran / 1e9;
    assert!(
        report.samples_of(pid) as f64 >= 0.9 * expected,
        "workload samples: {} for {ran} ns on CPU under sampling",
        report.samples_of(pid)
    );
    assert!(report.self_share(pid, "burn_a") > 0.45);
    assert!(report.0["idle_samples"].is_u64());
    assert!(report.0["target"].as_str().unwrap().contains("system-wide"));
}

#[test]
fn svg_folded_and_pprof_outputs() {
    let command = [hotspot_bin(), "split".into(), "1".into()];
    let command: Vec<&str> = command.iter().map(String::as_str).collect();

    let (_, svg) = profile_workload("499", "flame.svg", &command);
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.contains("<svg") && text.contains("burn_a") && text.trim_end().ends_with("</svg>"));

    let (_, folded) = profile_workload("499", "stacks.folded", &command);
    let text = std::fs::read_to_string(&folded).unwrap();
    assert!(
        text.lines()
            .any(|l| l.contains(";main;run_split;phase_ab;burn_a ")),
        "{text}"
    );

    let (_, pprof) = profile_workload("499", "profile.pb.gz", &command);
    let bytes = std::fs::read(&pprof).unwrap();
    let mut raw = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&bytes[..]), &mut raw).unwrap();
    use prost::Message as _;
    let profile = profiler::report::pprof_proto::Profile::decode(&raw[..]).expect("pprof decodes");
    assert!(profile.sample.len() > 1);
    let names: Vec<&str> = profile
        .function
        .iter()
        .map(|f| profile.string_table[f.name as usize].as_str())
        .collect();
    assert!(names.contains(&"burn_a"), "{names:?}");
    for sample in &profile.sample {
        for id in &sample.location_id {
            assert!(
                profile.location.iter().any(|l| l.id == *id),
                "dangling location id {id}"
            );
        }
    }
    // An independent reader (`cargo xtask setup` installs the Go toolchain for it).
    let go = std::process::Command::new("go")
        .args(["tool", "pprof", "-top", pprof.to_str().unwrap()])
        .output();
    let go = go.expect("`go` not found: run `cargo xtask setup` (installs golang-go for the pprof check)");
    assert!(
        go.status.success(),
        "go tool pprof rejected the profile: {}",
        stderr(&go)
    );
    assert!(stdout(&go).contains("burn_a"), "{}", stdout(&go));
}

#[test]
fn text_report_to_a_closed_pipe_is_not_an_error() {
    let mut child = bpfprof()
        .args(["-F", "499", "--", &hotspot_bin(), "split", "0.5"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take()); // like `| head -0`
    let status = child.wait().unwrap();
    assert_no_programs_left();
    assert!(status.success(), "broken pipe gave {status}");
}

#[test]
fn counter_deltas_land_on_the_function_that_causes_them() {
    // Without --counter, reports carry no counters at all.
    let (_, plain) = profile_workload("499", "faults.json", &[&hotspot_bin(), "faults", "0.5"]);
    assert!(
        Report::read(&plain).0["functions"][0].get("counters").is_none(),
        "no counters unless asked"
    );

    let json2 = temp_path("faults-counted.json");
    let out = run(&[
        "-F",
        "499",
        "--counter",
        "page-faults",
        "--counter",
        "context-switches",
        "-o",
        json2.to_str().unwrap(),
        "--",
        &hotspot_bin(),
        "faults",
        "2",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let truth = truth(&stdout(&out));
    let report = Report::read(&json2);
    report.assert_consistent();
    let pid = workload_pid(&truth);
    let stacks = report.stacks_of(pid);
    let faults = |s: &&serde_json::Value| s["counters"][0].as_u64().unwrap();
    let total: u64 = stacks.iter().map(faults).sum();
    let in_touch: u64 = stacks
        .iter()
        .filter(|s| Report::frames(s).contains(&"touch_pages"))
        .map(faults)
        .sum();
    let caused = truth["faults"];
    assert!(
        (total as f64) >= 0.9 * caused,
        "{total} page faults attributed, the workload caused {caused}"
    );
    assert!(
        in_touch as f64 >= 0.9 * total as f64,
        "{in_touch} of {total} attributed page faults are in touch_pages"
    );
    let functions = report.0["functions"].as_array().unwrap();
    assert!(functions
        .iter()
        .all(|f| f["counters"].as_array().is_some_and(|c| c.len() == 2)));
}

/// On a terminal a run says how it goes: a status line rewritten each second (time of the run,
/// samples, lost) and a line while symbolizing, each erased in place. When standard error is not
/// a terminal, none of it.
#[test]
fn a_run_on_a_terminal_shows_its_progress_and_a_pipe_gets_none() {
    let json = temp_path("status.json");
    let command = format!(
        "{} -d 30 -F 199 -o {} -- {} split 3",
        bpfprof_bin().display(),
        json.display(),
        workload("hotspot").display()
    );
    let out = std::process::Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .output()
        .unwrap();
    let screen = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{screen}");
    for second in ["1 s of 30 s · ", "2 s of 30 s · "] {
        assert!(
            screen.contains(&format!("\r\x1b[2Kbpfprof: {second}")),
            "no status line `{second}`: {screen:?}"
        );
    }
    assert!(
        screen.contains(" samples · ") && screen.contains(" lost"),
        "{screen:?}"
    );
    assert!(
        screen.contains("\r\x1b[2Kbpfprof: symbolizing ") && screen.contains(" addresses"),
        "{screen:?}"
    );
    // The line is erased before the run's last words.
    let wrote = screen.find("bpfprof: wrote").expect("the run's last line");
    assert!(screen[..wrote].ends_with("\r\x1b[2K"), "{screen:?}");
    Report::read(&json).assert_consistent();

    let piped = temp_path("status-piped.json");
    let out = run(&[
        "-d",
        "30",
        "-o",
        piped.to_str().unwrap(),
        "--",
        workload("hotspot").to_str().unwrap(),
        "split",
        "2",
    ]);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(
        !err.contains('\x1b') && !err.contains(" of 30 s") && !err.contains("symbolizing"),
        "status output without a terminal: {err:?}"
    );
}
