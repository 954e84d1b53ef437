//! Sched mode end to end, against the kernel's own accounting: every thread of the workload reads
//! its /proc/self/task/<tid>/schedstat (on-CPU ns, run-queue wait ns, timeslices) before exiting.

use bpfprof_tests::{
    schedload::{schedload, tasks},
    *,
};
use serde_json::Value;

/// Relative tolerance of totals against the kernel's accounting: bpfprof reads the very fields
/// schedstat prints; what a thread does after reading its own (returning, exiting) is the rest.
const TOLERANCE: f64 = 0.02;
/// What is timed at the tracepoints (off-CPU time; delay and running time where the kernel's
/// fields cannot be read, the fallback): they fire a few microseconds away from the kernel's
/// own clock points (measured on this VM: about 4 us per wait, 1.9 to 7.7 us per run), so 10%
/// and 10 us per switch.
const TRACEPOINT_TOLERANCE: f64 = 0.10;
const PER_SWITCH_OFFSET_NS: f64 = 10_000.0;

fn task(report: &Value, tid: u32) -> &Value {
    report["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["tid"] == tid)
        .unwrap_or_else(|| panic!("tid {tid} missing from the report"))
}

/// Run sched mode on a command, writing `output` (its extension picks the format); the command's
/// stdout and the report's path.
fn sched_run(output: &str, command: &[&str]) -> (String, std::path::PathBuf) {
    let path = temp_path(output);
    let mut args = vec!["--mode", "sched", "-o", path.to_str().unwrap(), "--"];
    args.extend_from_slice(command);
    let out = run(&args);
    assert!(out.status.success(), "bpfprof {args:?} failed: {}", stderr(&out));
    (stdout(&out), path)
}

fn profile_sched(output: &str, command: &[&str]) -> (String, Value) {
    let (stdout, path) = sched_run(output, command);
    let report = read_json(&path);
    (stdout, report)
}

/// Every thread of `schedload 3 4` (four busy threads on this machine's CPUs, one that sleeps
/// 1 ms at a time) against the schedstat it read as its last act; `exact`: bpfprof read the
/// kernel's own fields, else it timed the tracepoints (`BPFPROF_TRACEPOINT_CLOCKS`).
fn check_every_thread_against_its_schedstat(output: &str, exact: bool) {
    let path = temp_path(output);
    let mut args = vec!["--mode", "sched", "-o", path.to_str().unwrap(), "--"];
    let bin = schedload();
    args.extend_from_slice(&[&bin, "3", "4"]);
    let mut command = bpfprof();
    if !exact {
        command.env("BPFPROF_TRACEPOINT_CLOCKS", "1");
    }
    let out = command.args(&args).output().unwrap();
    assert_no_programs_left();
    assert!(out.status.success(), "{}", stderr(&out));
    let report: Value = read_json(&path);
    assert_eq!(report["mode"], "sched");
    let notes = report["notes"].to_string();
    assert_eq!(
        !notes.contains("timed at the scheduler tracepoints"),
        exact,
        "the fallback says so, once: {notes}"
    );
    let truth = tasks(&stdout(&out));
    assert_eq!(truth.len(), 5);
    for t in &truth {
        let got = task(&report, t.tid);
        let runs = got["runs"].as_f64().unwrap();
        let delay = got["total_delay_ns"].as_f64().unwrap();
        let running = got["running_ns"].as_f64().unwrap();
        eprintln!(
            "{} {}: delay {delay:.0} vs {:.0} ns ({:+.2}%), running {running:.0} vs {:.0} ns ({:+.2}%), runs {runs} vs {}",
            t.role,
            t.tid,
            t.run_delay,
            100.0 * (delay / t.run_delay - 1.0),
            t.oncpu,
            100.0 * (running / t.oncpu - 1.0),
            t.pcount
        );
        let (allowed_delay, allowed_running) = match exact {
            true => (TOLERANCE * t.run_delay, TOLERANCE * t.oncpu),
            false => (
                TRACEPOINT_TOLERANCE * t.run_delay + PER_SWITCH_OFFSET_NS * runs,
                TRACEPOINT_TOLERANCE * t.oncpu + PER_SWITCH_OFFSET_NS * runs,
            ),
        };
        // The kernel's count, plus what the thread's exit after its read may add. The tracepoints
        // see fewer: the kernel counts an arrival now and then with no `sched_switch` for it.
        let fewest = match exact {
            true => t.pcount,
            false => (1.0 - TRACEPOINT_TOLERANCE) * t.pcount,
        };
        assert!(
            runs >= fewest && runs <= t.pcount + 2.0,
            "{} tid {}: {runs} runs, kernel counted {} timeslices",
            t.role,
            t.tid,
            t.pcount
        );
        if !exact && t.role == "sleeper" {
            // A wake-up that preempts the running task has the kernel skip its next clock update
            // ("a useless back to back clock update"): the wakee's run starts, in the kernel's
            // books, at its wake-up, not at its switch-in. For the sleeper, whose runs are a few
            // microseconds each, that moves up to half its running time into the kernel's split
            // (measured: -50.7% running, +17.5% delay, their sum -4.0%, in a full run under load).
            // The tracepoints time the switch itself, so only the sum is the kernel's.
            let (sum, kernel) = (delay + running, t.run_delay + t.oncpu);
            assert!(
                (sum - kernel).abs() <= allowed_delay + allowed_running,
                "sleeper tid {}: run-queue delay + running {sum} ns, kernel {kernel} ns (allowed ±{:.0})",
                t.tid,
                allowed_delay + allowed_running
            );
        } else {
            assert!(
                (delay - t.run_delay).abs() <= allowed_delay,
                "{} tid {}: {delay} ns run-queue delay, kernel run_delay {} ns (allowed ±{allowed_delay:.0})",
                t.role,
                t.tid,
                t.run_delay
            );
            assert!(
                (running - t.oncpu).abs() <= allowed_running,
                "{} tid {}: running {running} ns, kernel {} ns (allowed ±{allowed_running:.0})",
                t.role,
                t.tid,
                t.oncpu
            );
        }
        match t.role.as_str() {
            // More busy threads than CPUs: they wait a lot.
            "busy" => assert!(t.run_delay > 1e8, "busy threads should wait: {}", t.run_delay),
            // Short runs, thousands of them: where the tracepoints' offset per switch shows.
            _ => assert!(t.pcount > 500.0, "the sleeper runs in short bursts: {}", t.pcount),
        }
        let p50 = got["p50_delay_ns"].as_u64().unwrap();
        let p99 = got["p99_delay_ns"].as_u64().unwrap();
        let max = got["max_delay_ns"].as_u64().unwrap();
        assert!(p50 <= p99 && p99 <= max, "percentiles ordered: {got}");
        let in_hist: u64 = got["histogram"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["count"].as_u64().unwrap())
            .sum();
        assert_eq!(
            in_hist,
            got["waits"].as_u64().unwrap(),
            "histogram holds every wait"
        );
    }
}

#[test]
fn run_queue_delay_running_time_and_runs_are_the_kernels_own_for_every_thread() {
    check_every_thread_against_its_schedstat("sched.json", true);
}

#[test]
fn without_the_kernels_fields_the_tracepoints_time_them_and_the_report_says_so() {
    check_every_thread_against_its_schedstat("sched-tracepoints.json", false);
}

/// Each CPU's idle and iowait time by /proc/stat, in ns (the test's own reading).
fn idle_by_cpu() -> std::collections::HashMap<u32, f64> {
    // SAFETY: sysconf has no preconditions. (The guest has no getconf.)
    let ticks = unsafe { nix::libc::sysconf(nix::libc::_SC_CLK_TCK) };
    assert!(ticks > 0, "sysconf(_SC_CLK_TCK): {ticks}");
    let tick_ns = 1e9 / ticks as f64;
    let stat = std::fs::read_to_string("/proc/stat").unwrap();
    (stat
        .lines()
        .filter(|l| l.starts_with("cpu") && !l.starts_with("cpu ")))
    .map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        let ticks: f64 = f[4].parse::<f64>().unwrap() + f[5].parse::<f64>().unwrap();
        (f[0][3..].parse().unwrap(), ticks * tick_ns)
    })
    .collect()
}

/// Run-queue delay per CPU: `schedload crowd` pins two busy threads to the last CPU, where they
/// queue behind each other, and a busy thread, a napper and main to the first (on a machine of
/// one CPU, all of them there). Each CPU's row holds the waits of the threads pinned to it (but
/// for main's before it pinned itself and each thread's before its code first ran: glibc pins a
/// new thread after creating it, so those may have ended on another CPU), those close to
/// their own schedstat; the rows and the waits in none add up to the tasks' waits; and each
/// CPU's idle time is what /proc/stat says of the run, read by the test around it. With the
/// kernel's fields and, `exact` false, timed at the tracepoints.
fn check_each_cpus_waits(output: &str, exact: bool) {
    let path = temp_path(output);
    let bin = schedload();
    let args = [
        "--mode",
        "sched",
        "-o",
        path.to_str().unwrap(),
        "--",
        &bin,
        "crowd",
        "2",
    ];
    let mut command = bpfprof();
    if !exact {
        command.env("BPFPROF_TRACEPOINT_CLOCKS", "1");
    }
    let (idle_before, began) = (idle_by_cpu(), std::time::Instant::now());
    let out = command.args(args).output().unwrap();
    let (idle_after, lasted) = (idle_by_cpu(), began.elapsed().as_nanos() as f64);
    assert_no_programs_left();
    assert!(out.status.success(), "{}", stderr(&out));
    let (tasks, report) = (tasks(&stdout(&out)), read_json(&path));
    let num = |v: &Value, key: &str| v[key].as_f64().unwrap_or_else(|| panic!("no {key} in {v}"));
    let main = (tasks.iter().find(|t| t.role == "main")).expect("main's TASK line");
    let main_delay = num(task(&report, main.tid), "total_delay_ns");
    // What may have ended on another CPU than the row's: main's waits before it pinned itself,
    // and each thread's before its code first ran (glibc pins a new thread after creating it).
    let elsewhere = main_delay + tasks.iter().map(|t| t.early).sum::<f64>();
    let (rows, window) = (
        report["per_cpu"].as_array().expect("per_cpu"),
        num(&report, "idle_window_ns"),
    );
    for row in rows {
        let cpu = row["cpu"].as_u64().unwrap() as u32;
        let pinned: Vec<_> = (tasks.iter())
            .filter(|t| t.cpu == Some(cpu) && t.role != "main")
            .collect();
        let in_report: f64 = pinned
            .iter()
            .map(|t| num(task(&report, t.tid), "total_delay_ns"))
            .sum();
        let schedstat: f64 = pinned.iter().map(|t| t.run_delay).sum();
        let (got, idle) = (num(row, "total_delay_ns"), num(row, "idle_ns"));
        let (stat_idle, outside) = (idle_after[&cpu] - idle_before[&cpu], lasted - window);
        println!(
            "CPU {cpu}: {:.2} ms of waits; its threads' {:.2} ms in the report, {:.2} ms by their schedstat, main's {:.2} ms; \
             idle {:.0} ms of {:.0} ms, {:.0} ms by /proc/stat over {:.0} ms",
            got / 1e6,
            in_report / 1e6,
            schedstat / 1e6,
            main_delay / 1e6,
            idle / 1e6,
            window / 1e6,
            stat_idle / 1e6,
            lasted / 1e6
        );
        assert!(
            (got - in_report).abs() <= elsewhere,
            "CPU {cpu}: {got} ns of waits, {in_report} ns of the threads pinned to it ({elsewhere} ns may have ended elsewhere)"
        );
        if exact {
            assert!(
                (in_report - schedstat).abs() <= TOLERANCE * schedstat,
                "CPU {cpu}: its threads' {in_report} ns, {schedstat} ns by their schedstat"
            );
        }
        // /proc/stat's ticks at both ends (10 ms each); the test's span holds bpfprof's own
        // start and end, outside the window, where the CPU may have idled or not.
        assert!(
            idle <= stat_idle + 20e6 && idle >= stat_idle - outside - 20e6,
            "CPU {cpu}: idle {idle} ns in {window} ns, /proc/stat {stat_idle} ns in {lasted} ns"
        );
    }
    let pinned: std::collections::BTreeSet<u32> = tasks.iter().filter_map(|t| t.cpu).collect();
    assert!(
        pinned.iter().all(|cpu| rows.iter().any(|r| r["cpu"] == *cpu)),
        "a row for each CPU of the workload: {rows:?}"
    );
    let sum = |list: &Value, key: &str| -> u64 {
        (list.as_array().unwrap().iter())
            .map(|v| v[key].as_u64().unwrap())
            .sum()
    };
    assert_eq!(
        sum(&report["per_cpu"], "waits") + report["unplaced_waits"].as_u64().unwrap(),
        sum(&report["tasks"], "waits"),
        "the CPUs' waits and those in none are the tasks' waits"
    );
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn each_cpu_has_the_run_queue_waits_of_the_threads_pinned_to_it() {
    check_each_cpus_waits("sched-cpus.json", true);
}

#[test]
fn each_cpu_has_its_threads_waits_timed_at_the_tracepoints_too() {
    check_each_cpus_waits("sched-cpus-tracepoints.json", false);
}

#[test]
fn off_cpu_time_lands_on_the_sleeping_function() {
    let (stdout, report) = profile_sched("offcpu.json", &[&schedload(), "2", "1"]);
    let sleeper = tasks(&stdout).into_iter().find(|t| t.role == "sleeper").unwrap();
    let stacks: Vec<&Value> = report["offcpu"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["tid"] == sleeper.tid)
        .filter(|s| {
            s["frames"]
                .as_array()
                .unwrap()
                .iter()
                .any(|f| f["function"] == "sleep_known")
        })
        .collect();
    let blocked: f64 = stacks.iter().map(|s| s["total_ns"].as_f64().unwrap()).sum();
    assert!(
        (blocked - sleeper.slept).abs() <= TRACEPOINT_TOLERANCE * sleeper.slept,
        "off-CPU time in sleep_known: {blocked} ns, the workload slept {} ns",
        sleeper.slept
    );
    let frames = Report::frames(stacks[0]);
    assert!(
        frames
            .windows(3)
            .any(|w| w == ["sleeper", "sleep_until", "sleep_known"]),
        "caller chain: {frames:?}"
    );
    assert!(
        stacks[0]["count"].as_u64().unwrap() > 100,
        "each 2 ms sleep is one block"
    );
}

/// Sleeps made with the same user registers whose stacks differ only in return addresses
/// (`schedload twins`: twin_a's 2 ms sleeps and twin_b's 1 ms ones, two of each in turn, each
/// pair from one call site): the second of a pair takes the first's stack again without a walk
/// (`offcpu_stacks_reused`), the first never takes the other twin's, so each twin's off-CPU time
/// is its own as the workload counted it. 400 rounds (about 2.4 s) span two of the epochs a
/// reused id must be in (a stack taken from the last epoch's slot would be missing from the
/// report). With `BPFPROF_CHECK_STACK_REUSE=1` every sleep is walked, and no walk finds another
/// stack than reuse gave.
#[test]
fn a_reused_off_cpu_stack_is_the_one_a_walk_finds() {
    for check in [false, true] {
        let path = temp_path(&format!("twins-{check}.json"));
        let mut command = bpfprof();
        if check {
            command.env("BPFPROF_CHECK_STACK_REUSE", "1");
        }
        let bin = schedload();
        let out = command
            .args([
                "--mode",
                "sched",
                "-o",
                path.to_str().unwrap(),
                "--",
                &bin,
                "twins",
                "400",
            ])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        let stdout = stdout(&out);
        let line = stdout
            .lines()
            .find(|l| l.starts_with("TWINS "))
            .expect("a TWINS line");
        let truth: std::collections::HashMap<&str, &str> = line
            .split_whitespace()
            .filter_map(|w| w.split_once('='))
            .collect();
        let tid: u64 = truth["tid"].parse().unwrap();
        let report = read_json(&path);
        let under = |twin: &str| -> f64 {
            (report["offcpu"].as_array().unwrap().iter())
                .filter(|s| s["tid"] == tid)
                .filter(|s| (s["frames"].as_array().unwrap().iter()).any(|f| f["function"] == twin))
                .map(|s| s["total_ns"].as_f64().unwrap())
                .sum()
        };
        for (twin, slept) in [("twin_a", truth["a"]), ("twin_b", truth["b"])] {
            let slept: f64 = slept.parse().unwrap();
            let ours = under(twin);
            println!("check {check}: {twin} {ours} ns off-CPU, the workload slept {slept} ns");
            assert!(
                (ours - slept).abs() <= TRACEPOINT_TOLERANCE * slept,
                "check {check}: off-CPU in {twin} {ours} ns, the workload slept {slept} ns"
            );
        }
        let health = &report["health"];
        println!("check {check}: health {health}");
        assert!(
            health["offcpu_stacks_reused"].as_u64().unwrap() >= 300,
            "{health}"
        );
        if check {
            assert_eq!(health["offcpu_stack_reuse_wrong"].as_u64(), Some(0), "{health}");
        }
    }
}

/// Every off-CPU stack is taken inside bpfprof's program at `sched_switch`, a tracepoint in
/// `__schedule`: its kernel frames must begin there, not in the program (JITed code, named after
/// whatever kallsyms symbol precedes it) or what ran it (`bpf_trace_run4`). The sleeper blocks in
/// nanosleep(2): through `schedule` into `__schedule`.
#[test]
fn off_cpu_kernel_stacks_begin_in_the_scheduler_not_in_the_tracing_machinery() {
    let path = temp_path("offcpu-kernel.json");
    let out = run(&[
        "--mode",
        "sched",
        "--offcpu-stacks",
        "all",
        "-o",
        path.to_str().unwrap(),
        "--",
        &schedload(),
        "2",
        "1",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let (stdout, report) = (stdout(&out), read_json(&path));
    let sleeper = tasks(&stdout).into_iter().find(|t| t.role == "sleeper").unwrap();
    let stacks = report["offcpu"].as_array().unwrap();
    let mut with_kernel = 0;
    // The sleeper's blocked time, and the part of it in nanosleep(2) (it may also block once in
    // its start-up, e.g. on the mmap lock in madvise).
    let (mut slept, mut in_nanosleep) = (0, 0);
    for stack in stacks {
        let kernel: Vec<&Value> = stack["frames"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|f| f["kernel"] == true && !f["function"].as_str().unwrap().starts_with("[lost"))
            .collect();
        let Some(leaf) = kernel.last() else { continue };
        with_kernel += 1;
        let name = leaf["function"].as_str().unwrap();
        let tracing = [
            "bpf_",
            "__bpf_",
            "trace_call_bpf",
            "__traceiter_",
            "perf_trace_",
            "kprobe_",
        ];
        // A code address more than 1 MiB past its symbol is in no function: JITed code.
        let offset = leaf["offset"].as_u64().unwrap_or(0);
        assert!(
            !tracing.iter().any(|t| name.starts_with(t)) && offset < 1 << 20 && name != "[unknown]",
            "a kernel stack begins in the tracing machinery: {name}+{offset:#x} in {:?}",
            Report::frames(stack)
        );
        assert_eq!(name, "__schedule", "{:?}", Report::frames(stack));
        if stack["tid"] == sleeper.tid {
            let names: Vec<&str> = kernel.iter().map(|f| f["function"].as_str().unwrap()).collect();
            let ns = stack["count"].as_u64().unwrap();
            slept += ns;
            if names.ends_with(&["schedule", "__schedule"]) && names.contains(&"do_nanosleep") {
                in_nanosleep += ns;
            }
        }
    }
    assert!(with_kernel > 0, "no off-CPU stack with kernel frames");
    assert!(
        in_nanosleep as f64 >= 0.95 * slept as f64,
        "the sleeper's stacks: {in_nanosleep} of {slept} ns through do_nanosleep into schedule"
    );
}

#[test]
fn slow_waits_name_the_waker_and_the_cpu_holders() {
    let path = temp_path("slow.json");
    let out = run(&[
        "--mode",
        "sched",
        "--slow-threshold",
        "1",
        "-o",
        path.to_str().unwrap(),
        "--",
        &schedload(),
        "2",
        "3",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let report: Value = read_json(&path);
    let workload: Vec<u32> = tasks(&stdout(&out)).iter().map(|t| t.tid).collect();
    let slow = report["slow_events"].as_array().unwrap();
    assert!(
        !slow.is_empty(),
        "three busy threads on two CPUs wait for milliseconds"
    );
    assert!(report["slow_total"].as_u64().unwrap() >= slow.len() as u64);
    // Over the workload's waits: how much of the time they waited is named holders' time.
    let (mut waited, mut held_total) = (0u64, 0u64);
    for e in slow {
        let delay = e["delay_ns"].as_u64().unwrap();
        assert!(delay >= 1_000_000);
        let holders = e["cpu_holders"].as_array().unwrap();
        if e["cpu"].is_null() {
            // Settled away from the CPU it waited for: its holders are not known, and none named.
            assert!(holders.is_empty(), "holders named without a CPU: {e}");
            continue;
        }
        // Each task that held the CPU is named once, with all of its time in the wait.
        let tids: Vec<u64> = holders.iter().map(|h| h["tid"].as_u64().unwrap()).collect();
        let distinct: std::collections::HashSet<&u64> = tids.iter().collect();
        assert_eq!(distinct.len(), tids.len(), "a holder named twice: {e}");
        let held: u64 = holders.iter().map(|h| h["held_ns"].as_u64().unwrap()).sum();
        // The stretches are clipped to the wait, which the kernel's clock points time.
        assert!(held <= delay, "held longer than waited: {e}");
        // Where the holders reach back to the wait's start, they are all of it: the stretches of
        // a CPU follow one another.
        if workload.contains(&(e["tid"].as_u64().unwrap() as u32)) && e["holders_complete"] == true {
            (waited, held_total) = (waited + delay, held_total + held);
        }
    }
    println!("complete holders named for {held_total} of {waited} ns waited by the workload");
    // On a busy machine every wait may span more stretches of other tasks than a CPU's history
    // keeps (`CPU_HISTORY`): then none is complete, and each says so (`holders_complete`).
    match waited {
        0 => println!("no wait's holders reach back to its start: the machine is busy"),
        _ => assert!(
            held_total as f64 >= 0.9 * waited as f64,
            "the complete holders named cover {held_total} of {waited} ns waited"
        ),
    }
    // A busy thread waits because the other busy threads hold the CPU: they must be named.
    let named_busy = slow.iter().any(|e| {
        workload.contains(&(e["tid"].as_u64().unwrap() as u32))
            && e["cpu_holders"]
                .as_array()
                .unwrap()
                .iter()
                .any(|h| workload.contains(&(h["tid"].as_u64().unwrap() as u32)))
    });
    assert!(
        named_busy,
        "no slow wait names another workload thread as the CPU holder"
    );
}

#[test]
fn running_process_threads_started_before_the_run_are_seen() {
    let workload = start_workload("schedload", &["30", "3"]);
    let pid = workload.pid();
    // The busy threads and the sleeper exist before the run.
    let threads = threads_of(pid, 5);
    let path = temp_path("sched-pid.json");
    let window = std::time::Duration::from_secs(2);
    let (bpfprof, stderr) = start_bpfprof(&[
        "--mode",
        "sched",
        "-p",
        &pid.to_string(),
        "-d",
        &window.as_secs().to_string(),
        "-o",
        path.to_str().unwrap(),
    ]);
    // Each thread's own account of the same window: its schedstat as the run starts and ends.
    let before: Vec<[f64; 3]> = threads.iter().map(|&tid| schedstat(pid, tid)).collect();
    std::thread::sleep(window);
    let after: Vec<[f64; 3]> = threads.iter().map(|&tid| schedstat(pid, tid)).collect();
    let (status, err) = finish_bpfprof(bpfprof, stderr);
    assert!(status.success(), "{err}");
    let report: Value = read_json(&path);
    let mine: Vec<&Value> = report["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["pid"] == pid)
        .collect();
    assert!(
        mine.len() >= 4,
        "busy threads and the sleeper of a running process: {}",
        mine.len()
    );
    let others = report["tasks"].as_array().unwrap().len() - mine.len();
    assert_eq!(others, 0, "-p reports only the target's threads");
    // Runs and waits that began before the run are the window's edges: a busy thread's running
    // time and delay over the window are the growth of its schedstat, within what a few ms of
    // misaligned edges make of two seconds.
    for (i, &tid) in threads.iter().enumerate() {
        let Some(got) = mine.iter().find(|t| t["tid"] == tid) else {
            continue;
        };
        let (ran, waited) = (after[i][0] - before[i][0], after[i][1] - before[i][1]);
        if ran < 0.2 * window.as_nanos() as f64 {
            continue; // the main thread, which only waits for the others, and the sleeper
        }
        let running = got["running_ns"].as_f64().unwrap();
        let delay = got["total_delay_ns"].as_f64().unwrap();
        eprintln!("busy {tid}: running {running:.0} vs {ran:.0} ns, delay {delay:.0} vs {waited:.0} ns");
        assert!(
            (running - ran).abs() <= 0.05 * ran,
            "tid {tid}: running {running} ns over the window, schedstat grew by {ran} ns"
        );
        assert!(
            (delay - waited).abs() <= 0.05 * (ran + waited),
            "tid {tid}: delay {delay} ns over the window, schedstat grew by {waited} ns"
        );
    }
}

#[test]
fn heatmap_flamegraph_and_text_outputs() {
    let (_, heat) = sched_run("latency.heatmap.svg", &[&schedload(), "2", "3"]);
    let svg = std::fs::read_to_string(&heat).unwrap();
    assert!(svg.contains("<svg") && svg.contains("latency heatmap") && svg.matches("<rect").count() > 5);

    let (workload_out, folded) = sched_run("offcpu.folded", &[&schedload(), "1", "1"]);
    let sleeper = tasks(&workload_out)
        .into_iter()
        .find(|t| t.role == "sleeper")
        .unwrap();
    let text = std::fs::read_to_string(&folded).unwrap();
    let sleeping: f64 = text
        .lines()
        .filter(|l| l.contains(";sleep_known;"))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum();
    assert!(
        (sleeping - sleeper.slept).abs() <= TRACEPOINT_TOLERANCE * sleeper.slept,
        "folded off-CPU stacks are weighted in ns: {sleeping}, the sleeper slept {} ns",
        sleeper.slept
    );

    let out = run(&["--mode", "sched", "--", &schedload(), "1", "3"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("Run-queue delay per task")
            && text.contains("Off-CPU")
            && text.contains("Slowest waits"),
        "{text}"
    );
}

#[test]
fn heatmap_needs_sched_mode() {
    let out = run(&["-o", temp_path("x.heatmap.svg").to_str().unwrap(), "-d", "1"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("format `heatmap` is not available for mode hotspot"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_reused_thread_id_is_two_tasks_not_one() {
    let (stdout, report) = profile_sched("reuse.json", &[&schedload(), "reuse"]);
    assert!(
        !stdout.contains("NOREUSE"),
        "the workload could not get its thread id back"
    );
    let lives = tasks(&stdout);
    assert_eq!(lives.len(), 2);
    assert_eq!(lives[0].tid, lives[1].tid, "both lives share one thread id");
    let entries: Vec<&Value> = report["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["tid"] == lives[0].tid)
        .collect();
    for life in &lives {
        let matching = entries.iter().any(|t| {
            let runs = t["runs"].as_f64().unwrap();
            (runs - life.pcount).abs() <= TRACEPOINT_TOLERANCE * life.pcount
        });
        assert!(
            matching,
            "{} life ({} timeslices) has no entry of its own among {entries:?}",
            life.role, life.pcount
        );
    }
    // Tens of thousands of threads came and went within a second: what could not be kept is said.
    let warnings = report["warnings"].to_string();
    let dropped = report["health"]["exited_map_full"].as_u64().unwrap();
    assert!(
        dropped == 0 || warnings.contains("exited tasks are missing"),
        "{warnings}"
    );
}

/// System-wide, processes that start and exit all the time (`churn`: two at a time, each
/// 2 ms of CPU): each child is one task in the report, never two. A dying task can be preempted
/// on its way out after its exit was recorded; seen switched in again, it must not come back
/// as a second, never-ending task (before: 37 and 48 of ~1,900 children, their entries kept
/// until their thread ids were reused, filling the task map of an always-on agent).
#[test]
fn an_exited_thread_is_one_task_however_it_leaves() {
    let json = temp_path("churn-exits.json");
    let (bpfprof, stderr) = start_bpfprof(&["--mode", "sched", "-a", "-o", json.to_str().unwrap()]);
    let churn = start_workload("churn", &["3", "2", "2"]);
    let stdout = churn.finish();
    let (status, err) = interrupt_bpfprof(bpfprof, stderr);
    assert!(status.success(), "bpfprof failed: {err}");
    let truth = truth(&stdout);
    let (parent, children) = (truth["pid"] as u64, truth["children"] as usize);
    let report = read_json(&json);
    let mut entries: std::collections::HashMap<u64, usize> = Default::default();
    for task in report["tasks"].as_array().unwrap() {
        // Each child is the binary exec'd anew through /proc/self/exe: named "exe".
        if task["comm"] == "exe" && task["pid"] != parent {
            *entries.entry(task["tid"].as_u64().unwrap()).or_default() += 1;
        }
    }
    let twice: Vec<_> = entries.iter().filter(|(_, &n)| n > 1).collect();
    println!(
        "{children} children, {} tasks of them, twice: {twice:?}",
        entries.len()
    );
    assert!(twice.is_empty(), "a child seen as two tasks: {twice:?}");
    assert_eq!(entries.len(), children, "one task per child");
}

/// A command that starts processes (`churn`: each child `posix_spawn`ed, as shells and build
/// tools start them): each process is announced for its labels once per image. A child of
/// `vfork` is nearly always preempted in the middle of its exec, as it releases its parent:
/// announced there too, each was announced twice (~1.9 a child before), the first time with the
/// name it had before.
#[test]
fn each_process_is_announced_for_its_labels_once_per_image() {
    let (stdout, report) = profile_sched(
        "labels-once.json",
        &[&workload("churn").to_string_lossy(), "2", "2", "2"],
    );
    let children = truth(&stdout)["children"] as u64;
    let labelled = report["health"]["processes_labelled"].as_u64().unwrap();
    println!("{children} children, {labelled} processes announced for their labels");
    assert!(children >= 100, "too few children to tell: {children}");
    // The children, each one image (a child of vfork is not announced before its exec), and
    // the command itself: churn, and, if preempted before its exec, bpfprof's fork of it.
    assert!(
        labelled <= children + 2,
        "{labelled} announcements for {children} children"
    );
    // Each child was seen running before its exec (the first run of a new task is a wait for a
    // CPU), and is announced by its exec.
    assert!(
        labelled >= children,
        "{labelled} announcements for {children} children"
    );
    for task in report["tasks"].as_array().unwrap() {
        assert_ne!(task["pid"], 0, "a task without its process: {task}");
    }
}

/// A `posix_spawn` parent waits in `clone3` until its child execs (the child runs in its
/// memory until then), and glibc's x86-64 `clone3` ends its unwind information just before its
/// system call: that wait's user stack is walked on through the stub to `main` (before: one
/// failed walk per child, every such stack `[unknown]` past `clone3`). The waits are found by
/// their kernel frames (`kernel_clone`: the stub itself is named only with glibc's debug
/// symbols). The process's first sleeps, before its unwind tables are loaded, are walked by
/// frame pointers: a few, allowed.
#[test]
fn a_spawning_parents_wait_is_walked_through_clone_to_main() {
    let (stdout, report) = profile_sched(
        "spawn-wait.json",
        &[&workload("churn").to_string_lossy(), "2", "1", "2"],
    );
    let parent = truth(&stdout)["pid"] as u64;
    let (mut in_clone, mut to_main) = (0, 0);
    for stack in (report["offcpu"].as_array().unwrap().iter()).filter(|s| s["pid"] == parent) {
        let frames = stack["frames"].as_array().unwrap();
        let named = |kernel: bool, name: &str| {
            (frames.iter()).any(|f| f["kernel"] == kernel && f["function"].as_str() == Some(name))
        };
        if named(true, "kernel_clone") {
            let count = stack["count"].as_u64().unwrap();
            in_clone += count;
            if named(false, "main") {
                to_main += count;
            }
        }
    }
    println!("{in_clone} waits of pid {parent} in clone, {to_main} of them walked to main");
    assert!(in_clone >= 50, "too few waits in clone: {}", report["offcpu"]);
    assert!(
        to_main * 100 >= in_clone * 95,
        "{to_main} of {in_clone} waits in clone walked to main"
    );
    let health = &report["health"];
    let (failed, walks) = (
        health["unwind_failed"].as_u64().unwrap(),
        health["unwind_walks"].as_u64().unwrap(),
    );
    assert!(failed * 10 <= walks, "{failed} of {walks} walks ended early");
}
