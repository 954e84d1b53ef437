//! Overhead benchmarks. One run compares a fixed CPU-bound workload that times itself, alone, under
//! bpfprof (already attached) and under `perf record` (already running), interleaved, and prints
//! ratios of the workload's own elapsed time (minimum over the rounds) and the profilers' CPU use.
use std::{
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};

use compare::{compare, verdict, Comparison, Cost, Profiler, BPF_STATS};

use crate::{bpfprof_bin, build_workload, workspace_root};

mod compare;
pub mod floor;
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
        floor: &[],
        references: &[&["perf", "record", "-F", "99", "-g", "-a", "-q", "-o", PERF_DATA]],
        ratio_target: Some(1.005),
        perf_share_target: Some(0.5),
        cost_share_target: None,
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
        floor: &[],
        references: &[&["perf", "record", "-F", "19", "-g", "-a", "-q", "-o", PERF_DATA]],
        ratio_target: Some(1.005),
        perf_share_target: None,
        cost_share_target: None,
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
        floor: &[],
        references: &PERF_STACKS,
        ratio_target: Some(1.005),
        perf_share_target: None,
        cost_share_target: None,
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
        floor: &[],
        references: &PERF_STACKS,
        ratio_target: Some(1.005),
        perf_share_target: Some(0.5),
        cost_share_target: None,
    })
}

fn sched() -> Result<()> {
    let bin = build_workload("schedload")?;
    let trips = "600000";
    let configs: &[&[&str]] = &[
        &["--mode", "sched", "-a"],
        &["--mode", "sched", "-a", "--offcpu-stacks", "all"],
        &["--mode", "sched", "-a", "--offcpu-stacks", "none"],
        // The agent's scheduler signals, on the same programs.
        &[
            "agent",
            "-F",
            "19",
            "--signals",
            "offcpu,runqueue",
            "--listen",
            "off",
            "--output-dir",
            AGENT_DIR,
        ],
    ];
    let agent = configs.iter().position(|args| args[0] == "agent");
    compare(Comparison {
        mode: "sched",
        // On one CPU: a switch or a wake-up every two microseconds, the worst case; and the same
        // work in every run (across two CPUs this VM's ping-pong took 9.7 to 19 s alone).
        what: format!("pipe ping-pong between two threads on CPU 0 ({trips} round trips, 2 switches each)"),
        workload: Box::new(move || workload_seconds(&bin, &["pingpong", trips, "0"])),
        bpfprof: configs,
        floor: &floor::SCHED_TRACEPOINTS,
        references: &[
            &["perf", "sched", "record", "-a", "-q", "-o", PERF_DATA],
            // libbpf-tools: run-queue latency histograms, and off-CPU stacks.
            &["runqlat", "3600", "1"],
            &["offcputime", "3600"],
        ],
        ratio_target: Some(1.05),
        perf_share_target: None,
        // The agent's scheduler signals: at most half of sched mode's cost.
        cost_share_target: agent.map(|agent| (agent, 0.5)),
    })?;
    let _ = std::fs::remove_dir_all(AGENT_DIR);
    Ok(())
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
        floor: &[],
        references: &[],
        ratio_target: Some(1.05),
        perf_share_target: None,
        cost_share_target: None,
    })?;
    let few_calls = "1000000";
    let loop_bin = bin.clone();
    compare(Comparison {
        mode: "lock",
        what: format!("uncontended pthread_mutex_lock/unlock loop ({few_calls} pairs, one thread): added time / {few_calls} = cost per call"),
        workload: Box::new(move || workload_seconds(&loop_bin, &["loop", few_calls])),
        bpfprof: &[&["--mode", "lock", "-a"]],
        floor: &[],
        references: &[&["bpftrace", "-q", "-e", BPFTRACE_MUTEX]],
        ratio_target: None,
        perf_share_target: None,
        cost_share_target: None,
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
        floor: &[],
        references: &[&["bpftrace", "-q", "-e", BPFTRACE_MUTEX]],
        ratio_target: None,
        perf_share_target: None,
        cost_share_target: None,
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
