//! Helpers for bpfprof's privileged end-to-end tests: find the binaries, run workloads that are
//! killed on drop, read their ground truth, query a JSON report, check nothing stays attached.
use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
};

use serde_json::Value;

pub mod schedload;

/// The bpfprof binary under test: `BPFPROF_BIN`, else the workspace's release build.
/// `cargo xtask test` builds it first; a missing binary fails the test, it never skips it.
pub fn bpfprof_bin() -> PathBuf {
    built_binary("BPFPROF_BIN", "bpfprof", "")
}

/// bpfprof built with the `https` feature: `BPFPROF_HTTPS_BIN`, else beside the release build.
pub fn bpfprof_https_bin() -> PathBuf {
    built_binary(
        "BPFPROF_HTTPS_BIN",
        "bpfprof-https",
        " (or `cargo xtask build --https`)",
    )
}

/// A build of bpfprof: where `variable` says, else `target/release/NAME`.
fn built_binary(variable: &str, name: &str, or: &str) -> PathBuf {
    let path = std::env::var_os(variable).map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../target/release")
            .join(name)
    });
    assert!(
        path.is_file(),
        "{} not found: run the tests with `cargo xtask test`{or}",
        path.display()
    );
    path
}

/// A test workload: in `BPFPROF_WORKLOADS` where set (the arm64 guest, which has them
/// elsewhere), else where the build script put them.
pub fn workload(name: &str) -> PathBuf {
    std::env::var_os("BPFPROF_WORKLOADS")
        .map_or_else(|| PathBuf::from(env!("BPFPROF_WORKLOADS")), PathBuf::from)
        .join(name)
}

pub fn bpfprof() -> Command {
    bpfprof_at(&bpfprof_bin())
}

/// A build of bpfprof, logging warnings only (what the tests read on stderr).
pub fn bpfprof_at(binary: &std::path::Path) -> Command {
    let mut cmd = Command::new(binary);
    cmd.env("RUST_LOG", "warn");
    cmd
}

/// Run bpfprof to completion.
pub fn run(args: &[&str]) -> Output {
    let out = bpfprof().args(args).output().expect("starting bpfprof");
    assert_no_programs_left();
    out
}

/// Seconds the hypervisor took from this machine's CPUs while `f` ran (steal, every CPU, from
/// /proc/stat), rounded up by a tick per CPU. A timer-driven sampler's clock runs through stolen
/// time while a thread's own CPU clock does not (the kernel's paravirtual steal accounting), so CPU
/// seconds counted by samples can exceed the thread's clock by up to this much on a busy host.
pub fn stolen_during<T>(f: impl FnOnce() -> T) -> (T, f64) {
    let before = steal_ticks();
    let value = f();
    let (after, cpus) = (steal_ticks(), online_cpus());
    // /proc/stat counts in USER_HZ, 100 a second on every architecture Linux runs on here.
    (value, (after.saturating_sub(before) + cpus) as f64 / 100.0)
}

fn steal_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/stat").expect("reading /proc/stat");
    let cpu = stat
        .lines()
        .find(|l| l.starts_with("cpu "))
        .expect("/proc/stat's cpu line");
    // user nice system idle iowait irq softirq steal ...
    cpu.split_whitespace()
        .nth(8)
        .and_then(|t| t.parse().ok())
        .unwrap_or(0)
}

fn online_cpus() -> u64 {
    std::thread::available_parallelism().map_or(1, |n| n.get() as u64)
}

/// A thread's time on a CPU so far, in ns (the first field of its schedstat): the kernel's own
/// account of how much a workload ran, whatever else the machine was doing.
pub fn on_cpu_ns(pid: u32, tid: u32) -> f64 {
    schedstat(pid, tid)[0]
}

/// A thread's schedstat: ns on a CPU, ns waiting on a run queue, timeslices.
pub fn schedstat(pid: u32, tid: u32) -> [f64; 3] {
    let path = format!("/proc/{pid}/task/{tid}/schedstat");
    let stat = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let fields: Vec<f64> = stat.split_whitespace().map(|f| f.parse().unwrap()).collect();
    [fields[0], fields[1], fields[2]]
}

/// The thread ids of `pid`, once it has at least `count` threads (a workload that starts its
/// threads: waits for them rather than for a fixed time).
pub fn threads_of(pid: u32, count: usize) -> Vec<u32> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let tids: Vec<u32> = std::fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .collect();
        if tids.len() >= count {
            return tids;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{pid} has only threads {tids:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Wait until `tid` of `pid` has run `ns` more on a CPU: a test that needs a workload to have
/// done some work waits for the work, not for a time that a busy machine stretches.
pub fn wait_for_cpu_time(pid: u32, tid: u32, ns: f64) {
    let start = on_cpu_ns(pid, tid);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while on_cpu_ns(pid, tid) - start < ns {
        assert!(
            std::time::Instant::now() < deadline,
            "tid {tid} ran less than {ns} ns in a minute"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Wait until `done` holds, checking every 100 ms, and fail after `limit` saying `what` was
/// awaited: a test waits for what it needs to have happened, never for a fixed time.
pub fn wait_until(what: &str, limit: std::time::Duration, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + limit;
    while !done() {
        assert!(
            std::time::Instant::now() < deadline,
            "still waiting after {limit:?}: {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// CPU time of the children a process has waited for, in ns (`cutime` + `cstime` of its stat,
/// in the kernel's fixed 100 Hz user ticks).
pub fn reaped_children_cpu_ns(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // From the state (field 3) on, past the name (which may hold spaces).
    let (_, from_state) = profiler::process::split_stat(&stat).unwrap();
    let fields: Vec<&str> = from_state.split(' ').collect();
    let ticks: f64 = fields[13].parse::<f64>().unwrap() + fields[14].parse::<f64>().unwrap();
    ticks * 1e7
}

/// Read lines from a running bpfprof's standard error until one contains `needle` (for
/// "Ctrl-C to stop": everything is attached); the lines read. Fails if it exits first.
pub fn wait_for_line(stderr: &mut impl std::io::BufRead, needle: &str) -> String {
    let mut seen = String::new();
    loop {
        let mut line = String::new();
        let n = stderr.read_line(&mut line).expect("reading bpfprof's stderr");
        assert!(n > 0, "bpfprof ended before saying {needle:?}: {seen}");
        seen += &line;
        if line.contains(needle) {
            return seen;
        }
    }
}

/// bpfprof started with `args` and its standard error piped, once it says everything is attached
/// (so a test acts on its target after the run began, however slowly a busy machine loads it).
/// The rest of its standard error is returned by `Running::finish_bpfprof`.
pub fn start_bpfprof(args: &[&str]) -> (Running, std::io::BufReader<std::process::ChildStderr>) {
    let mut child = Running::spawn(bpfprof().args(args).stderr(Stdio::piped()));
    let mut stderr = std::io::BufReader::new(child.0.stderr.take().unwrap());
    wait_for_line(&mut stderr, "Ctrl-C to stop");
    (child, stderr)
}

/// Wait for a bpfprof started by `start_bpfprof`: its exit status and the rest of its stderr.
pub fn finish_bpfprof(
    mut child: Running,
    mut stderr: std::io::BufReader<std::process::ChildStderr>,
) -> (std::process::ExitStatus, String) {
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stderr, &mut rest).unwrap();
    let status = child.0.wait().unwrap();
    assert_no_programs_left();
    (status, rest)
}

/// Ctrl-C to a bpfprof started by `start_bpfprof`, then `finish_bpfprof`.
pub fn interrupt_bpfprof(
    child: Running,
    stderr: std::io::BufReader<std::process::ChildStderr>,
) -> (std::process::ExitStatus, String) {
    let pid = nix::unistd::Pid::from_raw(child.pid() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    finish_bpfprof(child, stderr)
}

/// `bpfprof stat ... -o json -- COMMAND`: the report and the command's output.
pub fn stat(args: &[&str], command: &[&str]) -> (serde_json::Value, String) {
    let path = temp_path(&format!("stat-{}.json", std::process::id() ^ rand_suffix()));
    let mut all = vec!["stat", "-o", path.to_str().unwrap()];
    all.extend_from_slice(args);
    all.push("--");
    all.extend_from_slice(command);
    let out = run(&all);
    assert!(out.status.success(), "bpfprof {all:?}: {}", stderr(&out));
    (read_json(&path), stdout(&out))
}

/// A number that differs between calls (for file names within one test process).
pub fn rand_suffix() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos()
}

/// `args` fail with exit 2 and one line that says `says`.
pub fn refused_in_one_line(args: &[&str], says: &str) {
    let out = run(args);
    let err = stderr(&out);
    println!("{args:?}: {:?} {err}", out.status.code());
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains(says) && err.trim().lines().count() == 1, "{err}");
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A child process that is killed and reaped when dropped, whatever the test did.
pub struct Running(pub Child);

impl Running {
    pub fn spawn(cmd: &mut Command) -> Running {
        Running(cmd.spawn().expect("starting a workload"))
    }

    pub fn pid(&self) -> u32 {
        self.0.id()
    }

    /// Wait for the process and return its standard output.
    pub fn finish(mut self) -> String {
        let mut out = String::new();
        if let Some(mut stdout) = self.0.stdout.take() {
            std::io::Read::read_to_string(&mut stdout, &mut out).unwrap();
        }
        self.0.wait().unwrap();
        out
    }
}

/// A workload's perf map (a JIT's) goes with it: a later process given the same pid would
/// otherwise append to it, and be named from its lines.
fn forget_perf_map(pid: u32) {
    let _ = std::fs::remove_file(format!("/tmp/perf-{pid}.map"));
}

impl Running {
    /// Tell a workload that ends early on SIGUSR1 (hotspot split, lockload, jit) to finish now,
    /// and return its standard output.
    pub fn stop(self) -> String {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.pid() as i32),
            nix::sys::signal::Signal::SIGUSR1,
        )
        .expect("signalling the workload");
        self.finish()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        forget_perf_map(self.pid());
    }
}

/// Start a workload whose stdout (its ground truth) is captured.
pub fn start_workload(name: &str, args: &[&str]) -> Running {
    Running::spawn(Command::new(workload(name)).args(args).stdout(Stdio::piped()))
}

/// The `TRUTH key=value ...` line a workload prints at exit.
pub fn truth(stdout: &str) -> HashMap<String, f64> {
    let line = stdout
        .lines()
        .find(|l| l.starts_with("TRUTH "))
        .unwrap_or_else(|| panic!("no TRUTH line in workload output: {stdout:?}"));
    line["TRUTH ".len()..]
        .split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.parse().unwrap()))
        .collect()
}

/// Shares of `names` in the ground truth (each value over the sum of all of them).
pub fn truth_shares(truth: &HashMap<String, f64>, names: &[&str]) -> HashMap<String, f64> {
    let total: f64 = names.iter().map(|n| truth[*n]).sum();
    names.iter().map(|n| (n.to_string(), truth[*n] / total)).collect()
}

/// A JSON report as written, with each stack's frames in it (read through bpfprof's own reader
/// of the frames table, which its unit tests check against the frames written).
pub fn read_json(path: &std::path::Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut report = serde_json::from_str(&text).expect("the JSON report parses");
    profiler::report::json::inline_frames(&mut report).expect("every frame index is in the frames table");
    report
}

/// How far a function's share of samples may be from the workload's own measurement of it, in
/// percentage points.
pub const SHARE_TOLERANCE_PP: f64 = 3.0;

/// A hotspot JSON report.
pub struct Report(pub Value);

impl Report {
    pub fn read(path: &std::path::Path) -> Report {
        Report(read_json(path))
    }

    pub fn stacks(&self) -> &Vec<Value> {
        self.0["stacks"].as_array().expect("stacks array")
    }

    pub fn stacks_of(&self, pid: u32) -> Vec<&Value> {
        self.stacks().iter().filter(|s| s["pid"] == pid).collect()
    }

    pub fn samples_of(&self, pid: u32) -> u64 {
        self.stacks_of(pid)
            .iter()
            .map(|s| s["count"].as_u64().unwrap())
            .sum()
    }

    pub fn frames(stack: &Value) -> Vec<&str> {
        stack["frames"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["function"].as_str().unwrap())
            .collect()
    }

    /// Each of `names`' self share of `pid`'s samples against the workload's own measurement
    /// (`truth`, its TRUTH line), printed under `label`; each within `SHARE_TOLERANCE_PP`.
    pub fn assert_self_shares(&self, label: &str, pid: u32, truth: &HashMap<String, f64>, names: &[&str]) {
        let expected = truth_shares(truth, names);
        let samples = self.samples_of(pid);
        for name in names {
            let (got, want) = (self.self_share(pid, name) * 100.0, expected[*name] * 100.0);
            println!("{label}: {name} {got:.2}% self of {samples} samples of pid {pid}, workload measured {want:.2}%");
            assert!(
                (got - want).abs() <= SHARE_TOLERANCE_PP,
                "{label}: {name} reported {got:.2}% self, workload measured {want:.2}% (samples of pid {pid}: {samples})"
            );
        }
    }

    /// Share of `pid`'s samples spent in `function`'s own machine code: the innermost frame that
    /// is not inlined. Functions inlined into it (in Rust, `Range::next` of its loop) count as
    /// it, which is what a workload that times its own functions measures.
    pub fn self_share(&self, pid: u32, function: &str) -> f64 {
        let total = self.samples_of(pid) as f64;
        let hits: u64 = self
            .stacks_of(pid)
            .iter()
            .filter(|s| {
                let frames = s["frames"].as_array().unwrap();
                let physical = frames.iter().rev().find(|f| f["inlined"] != true);
                physical.is_some_and(|f| f["function"] == function)
            })
            .map(|s| s["count"].as_u64().unwrap())
            .sum();
        hits as f64 / total
    }

    /// Share of `pid`'s samples with `function` anywhere on the stack (itself and its callees,
    /// each sample once).
    pub fn total_share(&self, pid: u32, function: &str) -> f64 {
        let total = self.samples_of(pid) as f64;
        let hits: u64 = self
            .stacks_of(pid)
            .iter()
            .filter(|s| Report::frames(s).contains(&function))
            .map(|s| s["count"].as_u64().unwrap())
            .sum();
        hits as f64 / total
    }

    /// Whether some stack of `pid` contains `chain` as consecutive frames, outermost first.
    pub fn has_chain(&self, pid: u32, chain: &[&str]) -> bool {
        self.stacks_of(pid)
            .iter()
            .any(|s| Report::frames(s).windows(chain.len()).any(|w| w == chain))
    }

    /// The report's own totals agree with each other, and with the kernel's count of samples (a
    /// report of one-per-sample counts: a `--weight` sample counts its weight).
    pub fn assert_consistent(&self) {
        let v = &self.0;
        let samples = v["samples"].as_u64().unwrap();
        let in_stacks: u64 = self.stacks().iter().map(|s| s["count"].as_u64().unwrap()).sum();
        assert_eq!(samples, in_stacks, "samples == sum of stack counts");
        let self_sum: u64 = v["functions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["self"].as_u64().unwrap())
            .sum();
        assert_eq!(samples, self_sum, "samples == sum of functions' self");
        for f in v["functions"].as_array().unwrap() {
            assert!(f["total"].as_u64() >= f["self"].as_u64(), "total >= self: {f}");
        }
        assert_eq!(v["mode"], "hotspot");
        assert!(v["lost"].is_u64() && v["frequency_hz"].is_u64() && v["duration_s"].is_f64());
        // Sampling stops before the last drains: every sample the kernel counted is in the report.
        assert_eq!(
            v["health"]["samples"], v["samples"],
            "the kernel's count of samples == the report's"
        );
    }
}

/// Names of bpfprof's kernel programs (as the kernel shows them, at most 15 characters).
const PROGRAMS: [&str; 6] = [
    "sample_stack",
    "counter_switch",
    "unwind_user",
    "follow_fork",
    "forget_exit",
    "announce_exec",
];

/// No bpfprof program is still loaded in the kernel, except those held by processes that were
/// running before these tests began (a bpfprof agent on the machine, or a soak): those are not
/// the tests' to free. A tail-called program is freed by the kernel shortly after its program
/// array (deferred work), so this waits up to two seconds.
pub fn assert_no_programs_left() {
    let loaded = || -> Vec<String> {
        let theirs = programs_held_by_older_processes();
        aya::programs::loaded_programs()
            .filter_map(Result::ok)
            .filter(|p| !theirs.contains(&p.id()))
            .filter_map(|p| p.name_as_str().map(str::to_string))
            .filter(|name| PROGRAMS.contains(&name.as_str()))
            .collect()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    let mut left = loaded();
    while !left.is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
        left = loaded();
    }
    assert!(
        left.is_empty(),
        "bpfprof programs still loaded after it exited: {left:?}"
    );
    assert_no_probes_defined_by_the_dead();
}

/// No probe a finished bpfprof defined in tracefs to count (`bpfprof_PID/...`) is left.
fn assert_no_probes_defined_by_the_dead() {
    for file in ["uprobe_events", "kprobe_events"] {
        let tracefs = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"]
            .map(Path::new)
            .into_iter()
            .find(|root| root.join("events").is_dir())
            .expect("tracefs");
        let defined = std::fs::read_to_string(tracefs.join(file)).unwrap_or_default();
        let left: Vec<&str> = (defined.lines())
            .filter(|l| {
                let pid = l.split_once("bpfprof_").and_then(|(_, r)| r.split_once('/'));
                pid.is_some_and(|(pid, _)| !Path::new("/proc").join(pid).exists())
            })
            .collect();
        assert!(left.is_empty(), "{file} still defines {left:?}");
    }
}

/// When a process started, in clock ticks since boot (field 22 of /proc/PID/stat).
fn start_time(pid: &str) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 2..].split(' ').nth(19)?.parse().ok()
}

/// Program ids open in processes that started before this one.
fn programs_held_by_older_processes() -> std::collections::HashSet<u32> {
    let ours = start_time("self").unwrap_or(0);
    let mut held = std::collections::HashSet::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let pid = entry.file_name().to_string_lossy().into_owned();
        if !pid.bytes().all(|b| b.is_ascii_digit()) || start_time(&pid).is_none_or(|t| t >= ours) {
            continue;
        }
        for fd in std::fs::read_dir(format!("/proc/{pid}/fdinfo"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let info = std::fs::read_to_string(fd.path()).unwrap_or_default();
            held.extend(
                info.lines()
                    .filter_map(|l| l.strip_prefix("prog_id:")?.trim().parse::<u32>().ok()),
            );
        }
    }
    held
}

/// Profile a workload started as `-- COMMAND` at `hz`, writing the report to a fresh file named
/// `output` (its extension picks the format). Fails the test if bpfprof fails.
pub fn profile_workload(hz: &str, output: &str, command: &[&str]) -> (Output, PathBuf) {
    let path = temp_path(output);
    let mut args = vec!["-F", hz, "-o", path.to_str().unwrap(), "--"];
    args.extend_from_slice(command);
    let out = run(&args);
    assert!(out.status.success(), "bpfprof {args:?} failed: {}", stderr(&out));
    (out, path)
}

/// `bpfprof OPTIONS -o FILE -- COMMAND` (sampling): its JSON report, the report's notes as
/// one string, and the command's truth. Fails the test if bpfprof fails.
pub fn sample_hits(options: &[&str], command: &[&str]) -> (Report, String, HashMap<String, f64>) {
    let path = temp_path(&format!("hits-{}.json", rand_suffix()));
    let mut args = options.to_vec();
    args.extend(["-o", path.to_str().unwrap(), "--"]);
    args.extend(command);
    let out = run(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    let report = Report::read(&path);
    let notes = report.0["notes"].to_string();
    (report, notes, truth(&stdout(&out)))
}

/// A `stat` report's entry for `event`.
pub fn counter(report: &Value, event: &str) -> Value {
    report["counters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["event"] == event)
        .unwrap_or_else(|| panic!("no {event} in {report}"))
        .clone()
}

pub fn temp_path(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("bpfprof-e2e-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// `GET path` from an HTTP server at `address`: (status, body). For the agent's endpoint.
pub fn http_get(address: &str, path: &str) -> std::io::Result<(u16, Vec<u8>)> {
    use std::io::{Read as _, Write as _};
    let mut stream = std::net::TcpStream::connect(address)?;
    stream.set_read_timeout(Some(std::time::Duration::from_secs(60)))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response)?;
    let split = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| std::io::Error::other("no end of headers"))?;
    let head = String::from_utf8_lossy(&response[..split]);
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad status line: {head}")))?;
    Ok((status, response[split + 4..].to_vec()))
}

/// A pprof profile (gzipped `profile.proto`), decoded.
pub fn decode_pprof(gz: &[u8]) -> profiler::report::pprof::proto::Profile {
    use prost::Message as _;
    let mut raw = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(gz), &mut raw).expect("gzip");
    profiler::report::pprof::proto::Profile::decode(&raw[..]).expect("a pprof profile")
}

/// A free TCP port on the loopback (free when this returns; good enough for a test).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `bpfprof agent` running in the background; stopped (SIGTERM) and reaped on drop.
pub struct Agent {
    pub child: Child,
    pub address: String,
}

impl Agent {
    /// Start the agent with `args` and wait until its endpoint answers.
    pub fn start(args: &[&str]) -> Agent {
        Agent::start_with_env(args, &[])
    }

    /// The same, with these variables in its environment.
    pub fn start_with_env(args: &[&str], env: &[(&str, &str)]) -> Agent {
        Agent::start_binary(&bpfprof_bin(), args, env)
    }

    /// The agent of another build of bpfprof.
    pub fn start_binary(binary: &std::path::Path, args: &[&str], env: &[(&str, &str)]) -> Agent {
        let address = format!("127.0.0.1:{}", free_port());
        let child = bpfprof_at(binary)
            .arg("agent")
            .args(["--listen", &address])
            .args(args)
            .envs(env.iter().copied())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting the agent");
        let mut agent = Agent { child, address };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while http_get(&agent.address, "/healthz").is_err() {
            if let Ok(Some(status)) = agent.child.try_wait() {
                let mut err = String::new();
                std::io::Read::read_to_string(agent.child.stderr.as_mut().unwrap(), &mut err).unwrap();
                panic!("the agent exited ({status}) before serving: {err}");
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the agent never served its endpoint"
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        agent
    }

    /// One value of its `/metrics` page.
    pub fn metric(&self, name: &str) -> f64 {
        let (_, page) = http_get(&self.address, "/metrics").expect("reading /metrics");
        profiler::agent::metrics::value(&String::from_utf8_lossy(&page), name)
            .unwrap_or_else(|| panic!("no metric {name}"))
    }

    /// SIGTERM, then wait (at most `limit`) for it to flush and exit: (success, stderr, time taken).
    pub fn stop(mut self, limit: std::time::Duration) -> (bool, String, std::time::Duration) {
        let started = std::time::Instant::now();
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            assert!(
                started.elapsed() < limit,
                "the agent did not stop within {limit:?} of SIGTERM"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        };
        let mut err = String::new();
        std::io::Read::read_to_string(self.child.stderr.as_mut().unwrap(), &mut err).unwrap();
        (status.success(), err, started.elapsed())
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The libc this test process maps (as `/proc/self/maps` names it): the workloads' too.
pub fn own_libc() -> String {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    (maps.lines())
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.rsplit('/').next().is_some_and(|n| n.starts_with("libc.so")))
        .expect("the tests' own libc")
        .to_string()
}
