//! Overhead benchmarks. One run compares a fixed CPU-bound workload that times itself, alone, under
//! bpfprof (already attached) and under `perf record` (already running), interleaved, and prints
//! ratios of the workload's own elapsed time (minimum over the rounds) and the profilers' CPU use.
use std::{
    io::{BufRead as _, BufReader},
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};

use crate::{bpfprof_bin, build_workload, sh, workspace_root};

mod record;
mod trace;

const ROUNDS: usize = 9;
const THREADS: &str = "2";

pub fn run(mode: &str) -> Result<()> {
    match mode {
        "hotspot" => hotspot(),
        "sched" => sched(),
        "unwind" => unwind(),
        "lock" => lock(),
        "agent" => agent(),
        "agent-churn" => agent_churn(),
        "trace" => trace::trace(),
        "record" => record::record(),
        "python" => python(),
        other => {
            bail!(
                "no benchmark for mode `{other}` (available: hotspot, sched, unwind, lock, agent, agent-churn, trace, record, python)"
            )
        }
    }
}

/// Runs the fixed workload once; its own elapsed time in seconds.
fn workload_seconds(bin: &Path, args: &[&str]) -> Result<f64> {
    let out = Command::new(bin).args(args).output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let ns: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("ELAPSED="))
        .context("workload printed no ELAPSED")?
        .trim()
        .parse()?;
    Ok(ns / 1e9)
}

/// On-CPU time of all a process's threads so far, in seconds.
fn cpu_seconds(pid: u32) -> Option<f64> {
    let threads = crate::soak::cpu_by_thread(pid)?;
    Some(threads.iter().map(|(_, seconds)| seconds).sum())
}

/// (run time ns, runs) of a process's BPF programs, from their fdinfo; needs
/// kernel.bpf_stats_enabled=1.
fn bpf_program_stats(pid: u32) -> (u64, u64) {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return (0, 0);
    };
    let mut total = (0, 0);
    for info in fds
        .filter_map(|f| f.ok())
        .filter_map(|f| std::fs::read_to_string(f.path()).ok())
    {
        let field = |name: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_string()))
        };
        if field("prog_type:").is_none() {
            continue;
        }
        total.0 += field("run_time_ns:").and_then(|v| v.parse().ok()).unwrap_or(0);
        total.1 += field("run_cnt:").and_then(|v| v.parse().ok()).unwrap_or(0);
    }
    total
}

const PERF_DATA: &str = "/tmp/bpfprof-bench-perf.data";

/// perf at 99 Hz system-wide with frame-pointer stacks and with DWARF stacks: the references of
/// the benches that compare how stacks are walked.
const PERF_STACKS: [&[&str]; 2] = [
    &["perf", "record", "-F", "99", "-g", "-a", "-q", "-o", PERF_DATA],
    &[
        "perf",
        "record",
        "-F",
        "99",
        "--call-graph",
        "dwarf",
        "-a",
        "-q",
        "-o",
        PERF_DATA,
    ],
];

const BPF_STATS: &str = "/proc/sys/kernel/bpf_stats_enabled";

/// A profiler running in the background, stopped with SIGINT like a user would.
struct Profiler {
    child: Child,
    cpu_at_ready: f64,
    ready_at: Instant,
}

/// What a profiler cost while it was ready.
struct Cost {
    /// Its own threads' CPU time, as a fraction of one core.
    cpu: f64,
    /// Its BPF programs: total run time and runs (zero for perf, and with statistics off).
    bpf_ns: u64,
    bpf_runs: u64,
    /// How long it was ready (seconds).
    wall: f64,
}

impl Profiler {
    /// `args` may begin with `NAME=VALUE` settings of bpfprof's environment, as env(1) takes them;
    /// `BPFPROF_BIN=PATH` runs that binary instead (a baseline build: see `compare`).
    fn start_bpfprof(args: &[&str]) -> Result<Profiler> {
        let settings = args
            .iter()
            .take_while(|a| a.contains('=') && !a.starts_with('-'))
            .count();
        let bin = args[..settings]
            .iter()
            .find_map(|a| a.strip_prefix("BPFPROF_BIN="))
            .map_or_else(bpfprof_bin, std::path::PathBuf::from);
        let mut command = Command::new(bin);
        for setting in &args[..settings] {
            let (name, value) = setting.split_once('=').unwrap();
            command.env(name, value);
        }
        let args = &args[settings..];
        command.args(args);
        if args.first() != Some(&"agent") {
            command.args(["-o", "/tmp/bpfprof-bench.json"]);
        }
        let mut child = command.stderr(Stdio::piped()).spawn()?;
        // Ready once it says it is sampling (everything attached).
        let stderr = child.stderr.take().unwrap();
        let mut lines = BufReader::new(stderr).lines();
        loop {
            match lines.next() {
                Some(Ok(line)) if line.contains("Ctrl-C") => break,
                Some(Ok(_)) => continue,
                _ => bail!("bpfprof exited before it started sampling"),
            }
        }
        std::thread::spawn(move || lines.for_each(drop));
        Ok(Profiler::ready(child))
    }

    fn start_reference(tool: &[&str]) -> Result<Profiler> {
        let child = Command::new(tool[0])
            .args(&tool[1..])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", tool[0]))?;
        // No readiness signal: give it time to open its events and load its programs.
        std::thread::sleep(Duration::from_millis(1000));
        Ok(Profiler::ready(child))
    }

    fn ready(child: Child) -> Profiler {
        let cpu_at_ready = cpu_seconds(child.id()).unwrap_or(0.0);
        Profiler {
            child,
            cpu_at_ready,
            ready_at: Instant::now(),
        }
    }

    /// Stop it and say what it cost while it was ready.
    fn stop(mut self) -> Result<Cost> {
        let cpu = cpu_seconds(self.child.id()).unwrap_or(0.0) - self.cpu_at_ready;
        let wall = self.ready_at.elapsed().as_secs_f64();
        let (bpf_ns, bpf_runs) = bpf_program_stats(self.child.id());
        // SIGINT, as a user's Ctrl-C: both profilers then write out and detach.
        sh(Command::new("kill").args(["-INT", &self.child.id().to_string()]))?;
        self.child.wait()?;
        Ok(Cost {
            cpu: cpu / wall,
            bpf_ns,
            bpf_runs,
            wall,
        })
    }
}

/// One benchmark: a self-timing workload alone, under bpfprof and under the reference tools,
/// interleaved.
struct Comparison<'a> {
    mode: &'a str,
    what: String,
    workload: Box<dyn Fn() -> Result<f64> + 'a>,
    /// bpfprof's arguments; more than one set are measured side by side.
    bpfprof: &'a [&'a [&'a str]],
    /// Reference tools, command lines; the first is `perf` and always present (setup installs
    /// it), the others are measured where installed.
    references: &'a [&'a [&'a str]],
    /// bpfprof's ratio must stay at or below this, where the issue sets a target.
    ratio_target: Option<f64>,
    /// bpfprof's added time must stay at or below this share of perf's, where the issue says so.
    perf_share_target: Option<f64>,
}

/// A workload's description, and one timed run of it.
type Workload = (String, Box<dyn Fn() -> Result<f64>>);

/// The hotspot workload's fixed CPU work, calibrated to about 1.5 s on every CPU.
fn fixed_cpu_work() -> Result<Workload> {
    let bin = build_workload("hotspot")?;
    let probe = 1_000_000_000u64;
    let t = workload_seconds(&bin, &["fixed", &probe.to_string(), THREADS])?;
    let iterations = ((probe as f64 * 1.5 / t) as u64).to_string();
    Ok((
        format!("fixed CPU work ({iterations} iterations x {THREADS} threads on 2 CPUs)"),
        Box::new(move || workload_seconds(&bin, &["fixed", &iterations, THREADS])),
    ))
}

fn hotspot() -> Result<()> {
    let (what, workload) = fixed_cpu_work()?;
    compare(Comparison {
        mode: "hotspot",
        what,
        workload,
        bpfprof: &[&["-a", "-F", "99"]],
        references: &[&["perf", "record", "-F", "99", "-g", "-a", "-q", "-o", PERF_DATA]],
        ratio_target: Some(1.005),
        perf_share_target: Some(0.5),
    })
}

const AGENT_DIR: &str = "/tmp/bpfprof-bench-agent";

/// The agent at its default rate, as the benches run it.
const AGENT_19: &[&str] = &["agent", "-F", "19", "--listen", "off", "--output-dir", AGENT_DIR];

/// The agent at its default 19 Hz, at 99 Hz, and at 19 Hz with every signal (the scheduler's
/// programs too): what it costs on an idle machine, and on a busy one (both CPUs running fixed
/// work) how much slower that work gets, beside `perf record -a`.
fn agent() -> Result<()> {
    let agent_99: &[&str] = &["agent", "-F", "99", "--listen", "off", "--output-dir", AGENT_DIR];
    let agent_all: &[&str] = &[
        "agent",
        "-F",
        "19",
        "--signals",
        "all",
        "--listen",
        "off",
        "--output-dir",
        AGENT_DIR,
    ];
    let configs = [AGENT_19, agent_99, agent_all];
    let seconds = 30.0;
    let stats_before = std::fs::read_to_string(BPF_STATS).unwrap_or_else(|_| "0".into());
    let _ = std::fs::write(BPF_STATS, "1");
    let idle = agent_costs("idle", &configs, seconds, None)?;
    // Busy: the fixed work back to back on both CPUs for about as long.
    let (what, workload) = fixed_cpu_work()?;
    let busy = agent_costs("busy", &configs, seconds, Some(&*workload))?;
    let _ = std::fs::write(BPF_STATS, stats_before.trim());
    compare(Comparison {
        mode: "agent",
        what,
        workload,
        bpfprof: &configs,
        references: &[&["perf", "record", "-F", "19", "-g", "-a", "-q", "-o", PERF_DATA]],
        ratio_target: Some(1.005),
        perf_share_target: None,
    })?;
    for (machine, costs) in [("idle", idle), ("busy (fixed work on both CPUs)", busy)] {
        println!(
            "bench agent, {machine} machine (~{seconds:.0} s each; BPF time from kernel.bpf_stats_enabled):"
        );
        print_agent_costs(&costs);
    }
    let _ = std::fs::remove_dir_all(AGENT_DIR);
    agent_churn()
}

/// The agent at its default rate with every signal, under process churn (a new process every
/// ~20 ms, each 20 ms of CPU) and a lock workload: its CPU (per thread) and RSS over time, and
/// whether the RSS stays flat after the warm-up (the soak's bound).
fn agent_churn() -> Result<()> {
    crate::soak::run_churn(&crate::soak::Churn {
        minutes: 4.0,
        signals: "all",
        hz: "19",
        lock_load: true,
        trace_every: Duration::from_secs(30),
    })
}

/// The agent's cost in each configuration over about `seconds`, with `load` run back to back
/// meanwhile (none: an idle machine).
fn agent_costs<'a>(
    machine: &str,
    configs: &[&'a [&'a str]],
    seconds: f64,
    load: Option<&dyn Fn() -> Result<f64>>,
) -> Result<Vec<(String, Cost)>> {
    let mut costs = Vec::new();
    for args in configs {
        eprintln!(
            "bench agent: {machine} machine, {} for ~{seconds} s",
            args.join(" ")
        );
        let profiler = Profiler::start_bpfprof(args)?;
        let started = Instant::now();
        match load {
            Some(load) => {
                while started.elapsed().as_secs_f64() < seconds {
                    load()?;
                }
            }
            None => std::thread::sleep(Duration::from_secs_f64(seconds)),
        }
        let label = match args.contains(&"--signals") {
            true => format!("{} Hz, all signals", args[2]),
            false => format!("{} Hz", args[2]),
        };
        costs.push((label, profiler.stop()?));
    }
    Ok(costs)
}

fn print_agent_costs(costs: &[(String, Cost)]) {
    for (label, cost) in costs {
        let bpf = cost.bpf_ns as f64 / 1e9 / cost.wall;
        let total = cost.cpu + bpf;
        println!(
            "  {label:>20}: agent process {:.3}% + BPF programs {:.3}% = {:.3}% of one core{}",
            100.0 * cost.cpu,
            100.0 * bpf,
            100.0 * total,
            match label.as_str() {
                "19 Hz" => format!(" (target <= 0.5%: {})", verdict(total <= 0.005)),
                _ => String::new(),
            }
        );
    }
}

/// Hotspot sampling with user stacks walked through unwind tables (the default) against frame
/// pointers, on a workload built with frame pointers so that both walk the same stacks; the BPF
/// ns per sample line of each is the per-sample cost of its walk (the table walker runs as a tail
/// call, accounted to the sampling program).
/// Python code (pysplit's `fixed` rounds under pyenv's 3.12, calibrated to about 1.5 s), profiled
/// system-wide with its Python frames walked, beside perf's frame-pointer and DWARF stacks
/// (which show the interpreter's C frames only), and the agent at its default rate (its cost
/// with Python processes on the machine). `BENCH_BASELINE=` a build without Python frames gives
/// what walking them costs.
fn python() -> Result<()> {
    let python = "/root/.pyenv/versions/3.12.1/bin/python3.12".to_string();
    let script = workspace_root().join("tests/workloads/pysplit.py");
    let script = script.to_str().context("the workload's path")?.to_string();
    let run =
        move |rounds: u64| workload_seconds(Path::new(&python), &[&script, "fixed", &rounds.to_string()]);
    let probe = 50;
    let rounds = ((probe as f64 * 1.5 / run(probe)?) as u64).max(1);
    compare(Comparison {
        mode: "python",
        what: format!("{rounds} rounds of Python work (pysplit fixed, CPython 3.12)"),
        workload: Box::new(move || run(rounds)),
        bpfprof: &[&["-a", "-F", "99"], &["-a", "-F", "999"], AGENT_19],
        references: &PERF_STACKS,
        ratio_target: Some(1.005),
        perf_share_target: None,
    })
}

fn unwind() -> Result<()> {
    let (what, workload) = fixed_cpu_work()?;
    compare(Comparison {
        mode: "unwind",
        what,
        workload,
        bpfprof: &[
            &["-a", "-F", "99"],
            &["-a", "-F", "99", "--unwind", "fp"],
            &["-a", "-F", "999"],
        ],
        references: &PERF_STACKS,
        ratio_target: Some(1.005),
        perf_share_target: Some(0.5),
    })
}

fn sched() -> Result<()> {
    let bin = build_workload("schedload")?;
    let trips = "150000";
    compare(Comparison {
        mode: "sched",
        what: format!("pipe ping-pong between two threads ({trips} round trips, 2 switches each)"),
        workload: Box::new(move || workload_seconds(&bin, &["pingpong", trips])),
        bpfprof: &[
            &["--mode", "sched", "-a"],
            &["--mode", "sched", "-a", "--offcpu-stacks", "all"],
            &["--mode", "sched", "-a", "--offcpu-stacks", "none"],
            // Where threads sleep walked with frame pointers instead of the unwind tables.
            &["--mode", "sched", "-a", "--unwind", "fp"],
            // Delay and running time timed at the tracepoints, as before the kernel's own
            // fields were read (and as on a kernel without them).
            &["BPFPROF_TRACEPOINT_CLOCKS=1", "--mode", "sched", "-a"],
        ],
        references: &[
            &["perf", "sched", "record", "-a", "-q", "-o", PERF_DATA],
            // libbpf-tools: run-queue latency histograms, and off-CPU stacks.
            &["runqlat", "3600", "1"],
            &["offcputime", "3600"],
        ],
        ratio_target: Some(1.05),
        perf_share_target: None,
    })
}

/// pmlock.bt's way: a uprobe and a uretprobe on glibc's pthread_mutex_lock, timing every call.
const BPFTRACE_MUTEX: &str = "uprobe:/lib/x86_64-linux-gnu/libc.so.6:pthread_mutex_lock { @start[tid] = nsecs; } \
     uretprobe:/lib/x86_64-linux-gnu/libc.so.6:pthread_mutex_lock /@start[tid]/ { @wait = hist(nsecs - @start[tid]); delete(@start[tid]); }";

/// The futex source on an uncontended lock loop (it must cost nothing: such locks never enter
/// the kernel) and on a contended one, against a bpftrace uprobe + uretprobe script.
fn lock() -> Result<()> {
    let bin = build_workload("lockload")?;
    // Long enough for a stable ratio; the bpftrace comparison below takes fewer calls, because
    // under a uprobe each costs microseconds instead of nanoseconds.
    let calls = "100000000";
    let loop_bin = bin.clone();
    compare(Comparison {
        mode: "lock",
        what: format!("uncontended pthread_mutex_lock/unlock loop ({calls} pairs, one thread)"),
        workload: Box::new(move || workload_seconds(&loop_bin, &["loop", calls])),
        bpfprof: &[&["--mode", "lock", "-a"]],
        references: &[],
        ratio_target: Some(1.05),
        perf_share_target: None,
    })?;
    let few_calls = "1000000";
    let loop_bin = bin.clone();
    compare(Comparison {
        mode: "lock",
        what: format!("uncontended pthread_mutex_lock/unlock loop ({few_calls} pairs, one thread): added time / {few_calls} = cost per call"),
        workload: Box::new(move || workload_seconds(&loop_bin, &["loop", few_calls])),
        bpfprof: &[&["--mode", "lock", "-a"]],
        references: &[&["bpftrace", "-q", "-e", BPFTRACE_MUTEX]],
        ratio_target: None,
        perf_share_target: None,
    })?;
    let acquisitions = "200000";
    let contend_bin = bin.clone();
    compare(Comparison {
        mode: "lock",
        what: format!("contended mutex ({acquisitions} acquisitions over {THREADS} threads, 2 us held)"),
        workload: Box::new(move || workload_seconds(&contend_bin, &["contend", acquisitions, THREADS])),
        bpfprof: &[
            &["--mode", "lock", "-a"],
            &["--mode", "lock", "-a", "--unwind", "fp"],
        ],
        references: &[&["bpftrace", "-q", "-e", BPFTRACE_MUTEX]],
        ratio_target: None,
        perf_share_target: None,
    })?;
    pthread_source(&bin, &["loop", few_calls], "uncontended loop", few_calls.parse()?)?;
    pthread_source(
        &bin,
        &["contend", acquisitions, THREADS],
        "contended mutex",
        acquisitions.parse()?,
    )
}

/// The pthread source probes its targets' own libc (never the whole machine), so it runs the
/// workload as its command, as does bpftrace (`-c`); the workload's self-timed elapsed time is
/// read from their output. Cost per lock/unlock pair = added time / pairs.
fn pthread_source(bin: &Path, args: &[&str], what: &str, pairs: f64) -> Result<()> {
    const PTHREAD_ROUNDS: usize = 5;
    let command = std::iter::once(bin.to_str().unwrap())
        .chain(args.iter().copied())
        .collect::<Vec<_>>();
    let elapsed = |out: std::process::Output| -> Result<f64> {
        let text = String::from_utf8_lossy(&out.stdout);
        let ns: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix("ELAPSED="))
            .with_context(|| format!("no ELAPSED in {text}"))?
            .trim()
            .parse()?;
        Ok(ns / 1e9)
    };
    let bpftrace = crate::setup::on_path("bpftrace");
    eprintln!("bench lock: pthread source, {PTHREAD_ROUNDS} interleaved rounds of the {what}");
    let (mut alone, mut ours, mut theirs) = (Vec::new(), Vec::new(), Vec::new());
    for round in 1..=PTHREAD_ROUNDS {
        alone.push(workload_seconds(bin, args)?);
        let out = Command::new(bpfprof_bin())
            .args([
                "--mode",
                "lock",
                "--lock-source",
                "pthread",
                "-o",
                "/tmp/bpfprof-bench.json",
                "--",
            ])
            .args(&command)
            .stderr(Stdio::null())
            .output()?;
        ours.push(elapsed(out)?);
        if bpftrace {
            let out = Command::new("bpftrace")
                .args(["-q", "-e", BPFTRACE_MUTEX, "-c", &command.join(" ")])
                .stderr(Stdio::null())
                .output()?;
            theirs.push(elapsed(out)?);
        }
        eprintln!(
            "  round {round}: alone {:.4} s, bpfprof --lock-source pthread {:.4} s, bpftrace {}",
            alone[round - 1],
            ours[round - 1],
            theirs.last().map_or("-".into(), |t| format!("{t:.4} s"))
        );
    }
    let min = |v: &[f64]| v.iter().cloned().fold(f64::INFINITY, f64::min);
    let a = min(&alone);
    println!("bench lock (min of {PTHREAD_ROUNDS} interleaved runs, workload self-timed): pthread source on the {what} ({pairs} lock/unlock pairs)");
    println!("  alone                                {a:.4} s");
    let per_pair = |t: f64| (t - a) / pairs * 1e6;
    let b = min(&ours);
    println!(
        "  under bpfprof --lock-source pthread  {b:.4} s  ratio {:.3}x  added {:.2} us per lock/unlock pair (probes on lock entry, lock return, unlock entry)",
        b / a,
        per_pair(b)
    );
    if !theirs.is_empty() {
        let r = min(&theirs);
        println!(
            "  under bpftrace (pmlock.bt way)       {r:.4} s  ratio {:.3}x  added {:.2} us per lock/unlock pair (uprobe + uretprobe on lock, at its first instruction)",
            r / a,
            per_pair(r)
        );
        println!(
            "  pthread source cost per pair below bpftrace's: {}",
            verdict(per_pair(b) < per_pair(r))
        );
    }
    let _ = std::fs::remove_file("/tmp/bpfprof-bench.json");
    Ok(())
}

/// With `BENCH_BASELINE=PATH` (another build of bpfprof, say the commit before a change), its
/// first configuration also runs under that binary, in the same interleaved rounds: a before
/// and after that the machine's drift between two bench runs cannot blur.
fn compare(c: Comparison<'_>) -> Result<()> {
    let baseline = std::env::var("BENCH_BASELINE").ok().map(|bin| {
        [
            vec![format!("BPFPROF_BIN={bin}")],
            c.bpfprof[0].iter().map(|a| a.to_string()).collect(),
        ]
        .concat()
    });
    let baseline: Vec<&str> = baseline.iter().flatten().map(String::as_str).collect();
    let configs: Vec<&[&str]> = c
        .bpfprof
        .iter()
        .copied()
        .chain((!baseline.is_empty()).then_some(&baseline[..]))
        .collect();
    let c = Comparison {
        bpfprof: &configs,
        ..c
    };
    // The timed rounds run with BPF statistics off: they add two clock reads to every program
    // run, which on a switch-heavy load would be charged to bpfprof.
    let stats_before = std::fs::read_to_string(BPF_STATS).unwrap_or_else(|_| "0".into());
    let _ = std::fs::write(BPF_STATS, "0");
    eprintln!("bench {}: {ROUNDS} interleaved rounds of {}", c.mode, c.what);
    let mut alone = Vec::new();
    let mut under_bpfprof = vec![Vec::new(); c.bpfprof.len()];
    let mut bpfprof_cost: Vec<Vec<Cost>> = (0..c.bpfprof.len()).map(|_| Vec::new()).collect();
    let references: Vec<&[&str]> = c
        .references
        .iter()
        .copied()
        .filter(|tool| {
            let found = crate::setup::on_path(tool[0]);
            if !found {
                eprintln!("bench {}: {} is not installed, not compared", c.mode, tool[0]);
            }
            found
        })
        .collect();
    let mut under_ref = vec![Vec::new(); references.len()];
    let mut ref_cost: Vec<Vec<Cost>> = (0..references.len()).map(|_| Vec::new()).collect();
    for round in 1..=ROUNDS {
        alone.push((c.workload)()?);
        for (i, args) in c.bpfprof.iter().enumerate() {
            let profiler = Profiler::start_bpfprof(args)?;
            under_bpfprof[i].push((c.workload)()?);
            bpfprof_cost[i].push(profiler.stop()?);
        }
        for (i, tool) in references.iter().enumerate() {
            let profiler = Profiler::start_reference(tool)?;
            under_ref[i].push((c.workload)()?);
            ref_cost[i].push(profiler.stop()?);
        }
        let times = |v: &[Vec<f64>]| {
            v.iter()
                .map(|v| format!("{:.4} s", v[round - 1]))
                .collect::<Vec<_>>()
                .join(" / ")
        };
        eprintln!(
            "  round {round}: alone {:.4} s, bpfprof {}, references {}",
            alone[round - 1],
            times(&under_bpfprof),
            times(&under_ref)
        );
    }
    // Then one more workload run per bpfprof configuration, with statistics on: the kernel's own
    // account of the programs' run time.
    let _ = std::fs::write(BPF_STATS, "1");
    let mut bpf_stats = Vec::new();
    for args in c.bpfprof {
        let profiler = Profiler::start_bpfprof(args)?;
        (c.workload)()?;
        bpf_stats.push(profiler.stop()?);
    }
    let _ = std::fs::write(BPF_STATS, stats_before.trim());
    let min = |v: &[f64]| v.iter().cloned().fold(f64::INFINITY, f64::min);
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let a = min(&alone);
    println!(
        "bench {} (min of {ROUNDS} interleaved runs of the workload's own elapsed time): {}",
        c.mode, c.what
    );
    println!("  alone                                {a:.4} s");
    for (i, args) in c.bpfprof.iter().enumerate() {
        let b = min(&under_bpfprof[i]);
        let cpu: Vec<f64> = bpfprof_cost[i].iter().map(|c| c.cpu).collect();
        let (bpf_ns, bpf_runs, wall) = (bpf_stats[i].bpf_ns, bpf_stats[i].bpf_runs, bpf_stats[i].wall);
        // Noise-free cost: the kernel's own accounting of BPF run time, and bpfprof's own threads,
        // as shares of all CPUs' time while it was attached.
        let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1) as f64;
        let bpf_share = bpf_ns as f64 / 1e9 / (wall * cpus);
        let user_share = mean(&bpfprof_cost[i].iter().map(|c| c.cpu).collect::<Vec<_>>()) / cpus;
        println!(
            "  under bpfprof {:<22} {b:.4} s  ratio {:.4}x  added {:+.4} s  bpfprof CPU {:.2}% of one core; BPF {:.0} ns per program run",
            args.join(" "),
            b / a,
            b - a,
            100.0 * mean(&cpu),
            if bpf_runs > 0 { bpf_ns as f64 / bpf_runs as f64 } else { 0.0 }
        );
        println!(
            "      measured cost (BPF from one extra run with kernel.bpf_stats_enabled): BPF programs {:.3}% + bpfprof threads {:.3}% = {:.3}% of the machine's CPU time",
            100.0 * bpf_share,
            100.0 * user_share,
            100.0 * (bpf_share + user_share)
        );
    }
    let b = min(&under_bpfprof[0]);
    let b_added = b - a;
    for (i, tool) in references.iter().enumerate() {
        let r = min(&under_ref[i]);
        println!(
            "  under {:<30} {r:.4} s  ratio {:.4}x  added {:+.4} s  its CPU {:.2}% of one core{}",
            tool.join(" "),
            r / a,
            r - a,
            100.0 * mean(&ref_cost[i].iter().map(|c| c.cpu).collect::<Vec<_>>()),
            if tool[0] == "perf" {
                " (perf writes its buffers out at exit)"
            } else {
                ""
            }
        );
    }
    let mut verdicts = Vec::new();
    if let Some(target) = c.ratio_target {
        verdicts.push(format!(
            "bpfprof ratio {:.4}x (target <= {target}x): {}",
            b / a,
            verdict(b / a <= target)
        ));
    }
    if let (Some(target), Some(perf)) = (c.perf_share_target, under_ref.first()) {
        let p_added = min(perf) - a;
        let share = if p_added > 0.0 {
            b_added.max(0.0) / p_added
        } else {
            f64::NAN
        };
        verdicts.push(format!(
            "bpfprof added time / perf added time {share:.2} (target <= {target}): {}",
            verdict(share <= target)
        ));
    }
    println!("  {}", verdicts.join("; "));
    let _ = std::fs::remove_file(PERF_DATA);
    let _ = std::fs::remove_file("/tmp/bpfprof-bench.json");
    Ok(())
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "NOT met"
    }
}
