//! The interleaved comparison every overhead bench runs: the workload alone, under each bpfprof
//! configuration, on the floor (empty programs on the same tracepoints, where a bench names
//! them) and under the reference tools, round after round; then one more run of each with
//! `kernel.bpf_stats_enabled`, for the kernel's own account of BPF time per program run.
use std::{
    io::{BufRead as _, BufReader},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};

use super::{PERF_DATA, ROUNDS};
use crate::{bpfprof_bin, sh};

/// On-CPU time of all a process's threads so far, in seconds.
pub(super) fn cpu_seconds(pid: u32) -> Option<f64> {
    let threads = crate::soak::cpu_by_thread(pid)?;
    Some(threads.iter().map(|(_, seconds)| seconds).sum())
}

/// (run time ns, runs) of a process's BPF programs, from their fdinfo; needs
/// kernel.bpf_stats_enabled=1.
pub(super) fn bpf_program_stats(pid: u32) -> (u64, u64) {
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

pub(super) const BPF_STATS: &str = "/proc/sys/kernel/bpf_stats_enabled";

/// A profiler running in the background, stopped with SIGINT like a user would.
pub(super) struct Profiler {
    child: Child,
    cpu_at_ready: f64,
    ready_at: Instant,
}

/// What a profiler cost while it was ready.
pub(super) struct Cost {
    /// Its own threads' CPU time, as a fraction of one core.
    pub cpu: f64,
    /// Its BPF programs: total run time and runs (zero for perf, and with statistics off).
    pub bpf_ns: u64,
    pub bpf_runs: u64,
    /// How long it was ready (seconds).
    pub wall: f64,
}

impl Profiler {
    /// `args` may begin with `NAME=VALUE` settings of bpfprof's environment, as env(1) takes them;
    /// `BPFPROF_BIN=PATH` runs that binary instead (a baseline build: see `compare`).
    pub(super) fn start_bpfprof(args: &[&str]) -> Result<Profiler> {
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
        Profiler::until_ready(command, "bpfprof")
    }

    /// An empty program on each of `tracepoints`, held by this xtask's own binary (`floor.rs`).
    fn start_floor(tracepoints: &[&str]) -> Result<Profiler> {
        let mut command = Command::new(std::env::current_exe()?);
        command.arg("bench-floor").args(tracepoints);
        Profiler::until_ready(command, "the floor's empty programs")
    }

    /// Started, and ready once it says it is sampling (everything attached).
    fn until_ready(mut command: Command, who: &str) -> Result<Profiler> {
        let mut child = command.stderr(Stdio::piped()).spawn()?;
        let stderr = child.stderr.take().unwrap();
        let mut lines = BufReader::new(stderr).lines();
        let mut said = Vec::new();
        loop {
            match lines.next() {
                Some(Ok(line)) if line.contains("Ctrl-C") => break,
                Some(Ok(line)) => said.push(line),
                _ => {
                    let _ = child.wait();
                    bail!("{who} exited before it started sampling: {}", said.join("\n"))
                }
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

    pub(super) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Stop it and say what it cost while it was ready (dropped unstopped, on an error: killed).
    pub(super) fn stop(mut self) -> Result<Cost> {
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

impl Cost {
    /// BPF time per program run, where the kernel counted runs.
    fn ns_per_run(&self) -> Option<f64> {
        (self.bpf_runs > 0).then(|| self.bpf_ns as f64 / self.bpf_runs as f64)
    }

    /// Its BPF programs' run time as a share of all CPUs' time while it was ready.
    fn bpf_share(&self) -> f64 {
        self.bpf_ns as f64 / 1e9 / (self.wall * cpus())
    }
}

/// This machine's CPUs: the shares above are of all their time.
fn cpus() -> f64 {
    std::thread::available_parallelism().map_or(1, |n| n.get()) as f64
}

/// Its own threads' CPU time over the rounds, on average, as a fraction of one core.
fn mean_cpu(costs: &[Cost]) -> f64 {
    mean(&costs.iter().map(|c| c.cpu).collect::<Vec<_>>())
}

/// A bench that fails half-way leaves nothing attached: the floor's programs on the scheduler's
/// tracepoints would slow every later bench and test.
impl Drop for Profiler {
    fn drop(&mut self) {
        // A child already waited for is not signalled again.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One benchmark: a self-timing workload alone, under bpfprof, on the floor and under the
/// reference tools, interleaved.
pub(super) struct Comparison<'a> {
    pub mode: &'a str,
    pub what: String,
    pub workload: Box<dyn Fn() -> Result<f64> + 'a>,
    /// bpfprof's arguments; more than one set are measured side by side.
    pub bpfprof: &'a [&'a [&'a str]],
    /// The raw tracepoints bpfprof runs on at every event of the workload, if the bench is one of
    /// tracing: an empty program on each is the floor any program there costs.
    pub floor: &'a [&'a str],
    /// Reference tools, command lines; the first is `perf` and always present (setup installs
    /// it), the others are measured where installed.
    pub references: &'a [&'a [&'a str]],
    /// bpfprof's ratio must stay at or below this, where the issue sets a target.
    pub ratio_target: Option<f64>,
    /// bpfprof's added time must stay at or below this share of perf's, where the issue says so.
    pub perf_share_target: Option<f64>,
    /// Configuration `.0`'s measured cost (BPF and threads) must stay at or below this share
    /// `.1` of the first configuration's, where the issue says so.
    pub cost_share_target: Option<(usize, f64)>,
}

/// What one column of the rounds runs.
#[derive(Clone, Copy)]
enum Contender<'a> {
    Bpfprof(&'a [&'a str]),
    /// Empty programs on these raw tracepoints.
    Floor(&'a [&'a str]),
    Reference(&'a [&'a str]),
}

impl Contender<'_> {
    fn start(self) -> Result<Profiler> {
        match self {
            Contender::Bpfprof(args) => Profiler::start_bpfprof(args),
            Contender::Floor(tracepoints) => Profiler::start_floor(tracepoints),
            Contender::Reference(tool) => Profiler::start_reference(tool),
        }
    }

    fn label(self) -> String {
        match self {
            Contender::Bpfprof(args) => {
                // Without where the agent writes and listens: the same in every bench.
                let mut shown = Vec::new();
                let mut args = args.iter();
                while let Some(arg) = args.next() {
                    match *arg {
                        "--listen" | "--output-dir" => drop(args.next()),
                        _ => shown.push(*arg),
                    }
                }
                format!("bpfprof {}", shown.join(" "))
            }
            Contender::Floor(tracepoints) => {
                format!("the floor (empty programs on {})", tracepoints.join(", "))
            }
            Contender::Reference(tool) => tool.join(" "),
        }
    }
}

/// With `BENCH_BASELINE=PATH` (another build of bpfprof, say the commit before a change), its
/// first configuration also runs under that binary, in the same interleaved rounds: a before
/// and after that the machine's drift between two bench runs cannot blur.
pub(super) fn compare(c: Comparison<'_>) -> Result<()> {
    let baseline = std::env::var("BENCH_BASELINE").ok().map(|bin| {
        [
            vec![format!("BPFPROF_BIN={bin}")],
            c.bpfprof[0].iter().map(|a| a.to_string()).collect(),
        ]
        .concat()
    });
    let baseline: Vec<&str> = baseline.iter().flatten().map(String::as_str).collect();
    let mut contenders: Vec<Contender> = c.bpfprof.iter().map(|args| Contender::Bpfprof(args)).collect();
    if !baseline.is_empty() {
        contenders.push(Contender::Bpfprof(&baseline));
    }
    if !c.floor.is_empty() {
        contenders.push(Contender::Floor(c.floor));
    }
    for tool in c.references {
        match crate::setup::on_path(tool[0]) {
            true => contenders.push(Contender::Reference(tool)),
            false => eprintln!("bench {}: {} is not installed, not compared", c.mode, tool[0]),
        }
    }
    // The timed rounds run with BPF statistics off: they add two clock reads to every program
    // run, which on a switch-heavy load would be charged to bpfprof.
    let stats_before = std::fs::read_to_string(BPF_STATS).unwrap_or_else(|_| "0".into());
    let _ = std::fs::write(BPF_STATS, "0");
    let rounds = run_rounds(&c, &contenders);
    // Then one more workload run of each, with statistics on: the kernel's own account of the
    // programs' run time.
    let _ = std::fs::write(BPF_STATS, "1");
    let stats = rounds.and_then(|rounds| {
        let stats = contenders.iter().map(|who| {
            let profiler = who.start()?;
            (c.workload)()?;
            profiler.stop()
        });
        Ok((rounds, stats.collect::<Result<Vec<_>>>()?))
    });
    let _ = std::fs::write(BPF_STATS, stats_before.trim());
    let ((alone, under, costs), stats) = stats?;
    report(&c, &contenders, &alone, &under, &costs, &stats);
    let _ = std::fs::remove_file(PERF_DATA);
    let _ = std::fs::remove_file("/tmp/bpfprof-bench.json");
    Ok(())
}

/// The workload's times alone and under each contender, and each contender's costs, per round.
type Rounds = (Vec<f64>, Vec<Vec<f64>>, Vec<Vec<Cost>>);

fn run_rounds(c: &Comparison<'_>, contenders: &[Contender<'_>]) -> Result<Rounds> {
    eprintln!("bench {}: {ROUNDS} interleaved rounds of {}", c.mode, c.what);
    let mut alone = Vec::new();
    let mut under = vec![Vec::new(); contenders.len()];
    let mut costs: Vec<Vec<Cost>> = contenders.iter().map(|_| Vec::new()).collect();
    for round in 0..ROUNDS {
        alone.push((c.workload)()?);
        for (i, who) in contenders.iter().enumerate() {
            let profiler = who.start()?;
            under[i].push((c.workload)()?);
            costs[i].push(profiler.stop()?);
        }
        let times: Vec<String> = under.iter().map(|v| format!("{:.4} s", v[round])).collect();
        eprintln!(
            "  round {}: alone {:.4} s, then {}",
            round + 1,
            alone[round],
            times.join(" / ")
        );
    }
    Ok((alone, under, costs))
}

fn min(v: &[f64]) -> f64 {
    v.iter().cloned().fold(f64::INFINITY, f64::min)
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}

fn report(
    c: &Comparison<'_>,
    contenders: &[Contender<'_>],
    alone: &[f64],
    under: &[Vec<f64>],
    costs: &[Vec<Cost>],
    stats: &[Cost],
) {
    let a = min(alone);
    println!(
        "bench {} (min of {ROUNDS} interleaved runs of the workload's own elapsed time): {}",
        c.mode, c.what
    );
    println!("  alone                                {a:.4} s");
    // Noise-free cost: the kernel's own accounting of BPF run time (from the run with statistics
    // on), and the tool's own threads, as shares of all CPUs' time while it was attached.
    let measured: Vec<f64> = costs
        .iter()
        .zip(stats)
        .map(|(costs, stats)| stats.bpf_share() + mean_cpu(costs) / cpus())
        .collect();
    for (i, who) in contenders.iter().enumerate() {
        let b = min(&under[i]);
        let per_run = stats[i]
            .ns_per_run()
            .map_or(String::new(), |ns| format!("; BPF {ns:.0} ns per program run"));
        println!(
            "  under {:<36} {b:.4} s  ratio {:.4}x  added {:+.4} s  its CPU {:.2}% of one core{per_run}{}",
            who.label(),
            b / a,
            b - a,
            100.0 * mean_cpu(&costs[i]),
            match who {
                Contender::Reference(tool) if tool[0] == "perf" => " (perf writes its buffers out at exit)",
                _ => "",
            }
        );
        if stats[i].bpf_runs > 0 {
            println!(
                "      measured cost: BPF programs {:.3}% + its threads {:.3}% = {:.3}% of the machine's CPU time",
                100.0 * stats[i].bpf_share(),
                100.0 * (measured[i] - stats[i].bpf_share()),
                100.0 * measured[i]
            );
        }
    }
    println!("  {}", verdicts(c, contenders, a, under, &measured).join("; "));
}

/// The targets, each met or not.
fn verdicts(
    c: &Comparison<'_>,
    contenders: &[Contender<'_>],
    a: f64,
    under: &[Vec<f64>],
    measured: &[f64],
) -> Vec<String> {
    let b = min(&under[0]);
    let mut verdicts = Vec::new();
    if let Some(target) = c.ratio_target {
        verdicts.push(format!(
            "bpfprof ratio {:.4}x (target <= {target}x): {}",
            b / a,
            verdict(b / a <= target)
        ));
    }
    if let Some(floor) = contenders.iter().position(|w| matches!(w, Contender::Floor(_))) {
        let points = 100.0 * (b - min(&under[floor])) / a;
        verdicts.push(format!(
            "bpfprof {points:+.1} points above the floor (target <= 2): {}",
            verdict(points <= 2.0)
        ));
    }
    let perf = contenders
        .iter()
        .position(|w| matches!(w, Contender::Reference(tool) if tool[0] == "perf"));
    if let (Some(target), Some(perf)) = (c.perf_share_target, perf) {
        let p_added = min(&under[perf]) - a;
        let share = if p_added > 0.0 {
            (b - a).max(0.0) / p_added
        } else {
            f64::NAN
        };
        verdicts.push(format!(
            "bpfprof added time / perf added time {share:.2} (target <= {target}): {}",
            verdict(share <= target)
        ));
    }
    if let Some((i, target)) = c.cost_share_target {
        let share = measured[i] / measured[0];
        verdicts.push(format!(
            "{}'s measured cost / the first's {share:.2} (target <= {target}): {}",
            contenders[i].label(),
            verdict(share <= target)
        ));
    }
    verdicts
}

pub(super) fn verdict(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "NOT met"
    }
}
