//! Every bad input gets one clear line, the right exit code, and leaves nothing attached.
use std::os::unix::process::ExitStatusExt as _;

use bpfprof_tests::*;
use nix::{
    sys::signal::{kill, Signal},
    unistd::Pid,
};

fn assert_fails(out: &std::process::Output, code: i32, message: &str) {
    let err = stderr(out);
    assert_eq!(
        out.status.code(),
        Some(code),
        "exit status for {message:?}; stderr: {err}"
    );
    assert!(err.contains(message), "expected {message:?} in: {err}");
    let error_lines = err.lines().filter(|l| l.starts_with("bpfprof: ")).count();
    assert_eq!(error_lines, 1, "one error line: {err}");
    assert!(
        !err.contains("bpfprof: sampling "),
        "must fail before sampling starts: {err}"
    );
}

#[test]
fn not_root_is_refused_with_a_next_step() {
    let out = std::process::Command::new("setpriv")
        .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"])
        .arg(bpfprof_bin())
        .args(["-a", "-d", "1"])
        .output()
        .expect("setpriv (util-linux)");
    assert_fails(&out, 1, "needs root");
    assert!(stderr(&out).contains("sudo"));
}

#[test]
fn missing_pid() {
    let out = run(&["-p", "999999999", "-d", "1"]);
    assert_fails(&out, 1, "no process with pid 999999999");
}

#[test]
fn absurd_frequencies() {
    assert_fails(
        &run(&["-F", "0", "-d", "1"]),
        2,
        "sampling frequency must be between 1 and",
    );
    assert_fails(
        &run(&["-F", "100000000", "-d", "1"]),
        2,
        "sampling frequency must be between 1 and",
    );
}

#[test]
fn unwritable_output_fails_before_profiling() {
    let out = run(&["-a", "-d", "1", "-o", "/nonexistent-dir/flame.svg"]);
    assert_fails(&out, 1, "cannot write the report to /nonexistent-dir/flame.svg");
    // The directory that is missing is named, not the temporary file bpfprof tried in it.
    assert_fails(&out, 1, ": the directory /nonexistent-dir does not exist");
    assert!(!stderr(&out).contains(".bpfprof"), "{}", stderr(&out));
    let saved = temp_path("missing-dir.folded");
    std::fs::write(&saved, "main;work 10\n").unwrap();
    let out = run(&[
        "report",
        saved.to_str().unwrap(),
        "-o",
        "/nonexistent-dir/sub/r.svg",
    ]);
    assert_fails(&out, 1, "the directory /nonexistent-dir/sub does not exist");
}

/// `-o x.pb` (or any extension no format has) used to write text under that name; it is
/// refused in one line listing the extensions there are, before anything runs: the command is
/// never started, and report and diff do not read their profiles.
#[test]
fn an_unknown_output_extension_is_refused_before_anything_runs() {
    let marker = temp_path("started-anyway");
    let _ = std::fs::remove_file(&marker);
    let output = temp_path("profile.pb");
    let out = run(&[
        "-o",
        output.to_str().unwrap(),
        "--",
        "touch",
        marker.to_str().unwrap(),
    ]);
    assert_fails(
        &out,
        2,
        "bpfprof writes no `.pb` files: end the name in .txt, .json, .folded, .heatmap.svg, .svg, .pb.gz, .pprof",
    );
    assert!(!marker.exists(), "the command was started");
    assert!(!output.exists(), "something was written to {}", output.display());
    let refused = |args: &[&str], ext: &str| {
        assert_fails(&run(args), 2, &format!("bpfprof writes no `.{ext}` files"));
    };
    refused(&["report", "/nonexistent/a.json", "-o", "r.folded.gz"], "gz");
    refused(
        &[
            "diff",
            "/nonexistent/a.json",
            "/nonexistent/b.json",
            "-o",
            "d.png",
        ],
        "png",
    );
    // --format says what to write: the name is then the user's to choose.
    let saved = temp_path("any-name.folded");
    std::fs::write(&saved, "main;work 10\n").unwrap();
    let named = temp_path("stacks.pb");
    let out = run(&[
        "report",
        saved.to_str().unwrap(),
        "--format",
        "pprof",
        "-o",
        named.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        std::fs::read(&named).unwrap().starts_with(&[0x1f, 0x8b]),
        "pprof written"
    );
}

#[test]
fn command_that_does_not_exist() {
    let out = run(&["--", "no-such-command-bpfprof"]);
    assert_fails(&out, 127, "command not found: no-such-command-bpfprof");
}

/// Found but not runnable (no execute permission): the shell's 126, after everything loaded is
/// detached again.
#[test]
fn command_that_cannot_be_run() {
    let path = temp_path("not-a-program");
    std::fs::write(&path, "plain text\n").unwrap();
    let out = run(&["-d", "5", "--", path.to_str().unwrap()]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(126), "{err}");
    assert!(
        err.contains("cannot run") && err.contains("ermission denied"),
        "{err}"
    );
    std::fs::remove_file(&path).unwrap();
}

/// pprof and SVG bytes are refused on a terminal with what to do instead (through a pty that
/// `script` gives the command), and written as ever into a pipe.
#[test]
fn binary_output_is_refused_on_a_terminal_and_piped_as_ever() {
    let saved = temp_path("saved.folded");
    std::fs::write(&saved, "main;work 10\n").unwrap();
    let saved = saved.to_str().unwrap();
    for format in ["pprof", "svg"] {
        let command = format!("{} report {saved} --format {format}", bpfprof_bin().display());
        let out = std::process::Command::new("script")
            .args(["-qec", &command, "/dev/null"])
            .output()
            .unwrap();
        let screen = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(2), "{format}: {screen}");
        assert!(
            screen.contains(&format!("{format} output is not for a terminal")) && screen.contains("-o"),
            "{format}: {screen}"
        );
    }
    let piped = bpfprof()
        .args(["report", saved, "--format", "pprof"])
        .output()
        .unwrap();
    assert!(piped.status.success(), "{}", stderr(&piped));
    assert!(piped.stdout.starts_with(&[0x1f, 0x8b]), "gzip into the pipe");
}

#[test]
fn hardware_event_without_pmu_is_explained() {
    // This VM has no PMU; where one exists the run must succeed instead.
    let has_pmu = std::path::Path::new("/sys/bus/event_source/devices/cpu/events/cpu-cycles").exists()
        || std::path::Path::new("/sys/bus/event_source/devices/cpu_core").exists();
    let out = run(&[
        "-e",
        "cycles",
        "-d",
        "1",
        "-a",
        "-o",
        temp_path("pmu.json").to_str().unwrap(),
    ]);
    if has_pmu {
        assert!(out.status.success(), "{}", stderr(&out));
    } else {
        assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
        assert!(stderr(&out).contains("needs a hardware PMU"), "{}", stderr(&out));
    }
}

#[test]
fn sched_without_btf_is_explained_and_hotspot_still_works() {
    let with_btf = |path: &str, args: &[&str]| {
        std::process::Command::new(bpfprof_bin())
            .env("BPFPROF_BTF", path)
            .args(args)
            .output()
            .unwrap()
    };
    let json = temp_path("nobtf.json");
    let json = json.to_str().unwrap();
    let out = with_btf(
        "/nonexistent/vmlinux",
        &["--mode", "sched", "-a", "-d", "1", "-o", json],
    );
    assert_fails(
        &out,
        1,
        "this kernel has no usable BTF (reading /nonexistent/vmlinux",
    );
    assert!(stderr(&out).contains("BPFPROF_BTF"), "{}", stderr(&out));
    // Not BTF at all: the same clear line, not a parse trace.
    let out = with_btf(
        "/proc/self/status",
        &["--mode", "topdown", "-a", "-d", "1", "-o", json],
    );
    assert_fails(
        &out,
        1,
        "this kernel has no usable BTF (parsing the BTF in /proc/self/status",
    );
    let out = with_btf("/nonexistent/vmlinux", &["-a", "-d", "1", "-o", json]);
    assert!(out.status.success(), "hotspot needs no BTF: {}", stderr(&out));
    assert_no_programs_left();
}

#[test]
fn command_exit_status_is_passed_on() {
    let out = run(&[
        "-F",
        "99",
        "-o",
        temp_path("status.json").to_str().unwrap(),
        "--",
        "sh",
        "-c",
        "exit 3",
    ]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
}

#[test]
fn target_exiting_mid_run_reports_what_was_collected() {
    let workload = start_workload("hotspot", &["split", "60"]);
    let json = temp_path("exited.json");
    let pid = workload.pid();
    let (bpfprof, stderr) =
        start_bpfprof(&["-p", &pid.to_string(), "-F", "499", "-o", json.to_str().unwrap()]);
    // It exits in the middle of the run, after a second of its own CPU time under bpfprof.
    wait_for_cpu_time(pid, pid, 1e9);
    workload.stop();
    let (status, err) = finish_bpfprof(bpfprof, stderr);
    assert!(status.success(), "{err}");
    let report = Report::read(&json);
    report.assert_consistent();
    assert!(
        report.samples_of(pid) > 200,
        "samples before the exit: {}",
        report.samples_of(pid)
    );
    let notes = report.0["notes"].to_string();
    assert!(notes.contains("exited"), "{notes}");
    assert!(
        report.self_share(pid, "burn_a") > 0.5,
        "symbolized although it exited"
    );
}

fn stop_with(signal: Signal, note: &str) {
    let workload = start_workload("hotspot", &["split", "30"]);
    let json = temp_path(&format!("{signal:?}.json"));
    let (bpfprof, stderr) = start_bpfprof(&[
        "-p",
        &workload.pid().to_string(),
        "-F",
        "499",
        "-o",
        json.to_str().unwrap(),
    ]);
    // Once everything is attached, let the workload run a second of its own CPU time.
    wait_for_cpu_time(workload.pid(), workload.pid(), 1e9);
    kill(Pid::from_raw(bpfprof.pid() as i32), signal).unwrap();
    let (status, err) = finish_bpfprof(bpfprof, stderr);
    assert!(
        status.success(),
        "{signal:?} gave {status:?} (signal {:?}): {err}",
        status.signal()
    );
    let report = Report::read(&json);
    report.assert_consistent();
    // A second of CPU at 499 Hz, less what ended in the kernel map after the signal.
    let samples = report.samples_of(workload.pid());
    assert!(samples > 200, "{samples} samples of the workload");
    assert!(
        report.0["notes"].to_string().contains(note),
        "{}",
        report.0["notes"]
    );
}

#[test]
fn ctrl_c_gives_a_partial_report_and_detaches() {
    stop_with(Signal::SIGINT, "interrupted");
}

#[test]
fn sigterm_gives_a_partial_report_and_detaches() {
    stop_with(Signal::SIGTERM, "terminated");
}

/// bpfprof with a command, interrupted alone (a supervisor's or a script's SIGINT, not a Ctrl-C
/// that reached the command too): the report is written at once, not when the command would have
/// ended. The command does not outlive its profile: it is stopped with SIGTERM, said so, and
/// bpfprof exits with its status; one that ignores SIGTERM is left running and said so.
fn interrupted_alone(script: &str) -> (std::process::ExitStatus, String, Report, u32, std::time::Duration) {
    let pidfile = temp_path(&format!("command-{}.pid", script.len()));
    let json = temp_path(&format!("interrupted-{}.json", script.len()));
    let script = format!("echo $$ > {}; {script}", pidfile.display());
    let (bpfprof, stderr) = start_bpfprof(&[
        "-F",
        "99",
        "-o",
        json.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        &script,
    ]);
    wait_until("the command's pid", std::time::Duration::from_secs(20), || {
        std::fs::read_to_string(&pidfile).is_ok_and(|s| s.ends_with('\n'))
    });
    let pid: u32 = std::fs::read_to_string(&pidfile).unwrap().trim().parse().unwrap();
    wait_for_cpu_time(pid, pid, 3e8);
    let interrupted = std::time::Instant::now();
    let (status, err) = interrupt_bpfprof(bpfprof, stderr);
    (status, err, Report::read(&json), pid, interrupted.elapsed())
}

#[test]
fn interrupting_bpfprof_alone_stops_the_command_and_reports_at_once() {
    let workload = workload("hotspot");
    let (status, err, report, pid, took) =
        interrupted_alone(&format!("exec {} split 60", workload.display()));
    eprintln!("report written {:.2} s after the interrupt", took.as_secs_f64());
    assert!(
        took < std::time::Duration::from_secs(20),
        "bpfprof waited {took:?}: {err}"
    );
    assert!(err.contains("the interrupt reached bpfprof alone"), "{err}");
    assert_eq!(
        status.code(),
        Some(128 + 15),
        "the command's status (SIGTERM): {err}"
    );
    assert!(
        report.samples_of(pid) > 20,
        "the command's samples: {}",
        report.samples_of(pid)
    );
    let notes = report.0["notes"].to_string();
    assert!(
        notes.contains("interrupted") && notes.contains("stopped (SIGTERM)"),
        "{notes}"
    );
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "the command outlived its profile"
    );
}

#[test]
fn a_command_that_ignores_sigterm_is_left_running_and_said_so() {
    // Its output elsewhere: left running, it would hold bpfprof's stderr (this test's pipe) open.
    let (status, err, report, pid, took) =
        interrupted_alone("exec >/dev/null 2>&1; trap '' INT TERM; while :; do :; done");
    let alive = std::path::Path::new(&format!("/proc/{pid}")).exists();
    let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
    assert!(
        took < std::time::Duration::from_secs(20),
        "bpfprof waited {took:?}: {err}"
    );
    assert!(alive, "the command was left running");
    assert!(
        err.contains(&format!("the command (pid {pid}) did not exit")),
        "{err}"
    );
    assert_eq!(status.code(), Some(130), "{err}");
    assert!(
        report.0["notes"].to_string().contains("left running"),
        "{}",
        report.0["notes"]
    );
}
