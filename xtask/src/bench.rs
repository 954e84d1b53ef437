//! Overhead benchmarks. One run compares a fixed CPU-bound workload that times itself, alone, under
//! bpfprof (already attached) and under `perf record` (already running), interleaved, and prints
//! ratios of the workload's own elapsed time (minimum over the rounds) and the profilers' CPU use.
use std::{
    io::{BufRead as _, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};

use crate::{bpfprof_bin, sh, workspace_root};

const ROUNDS: usize = 7;
const THREADS: &str = "2";

pub fn run(mode: &str) -> Result<()> {
    match mode {
        "hotspot" => hotspot(),
        other => bail!("no benchmark for mode `{other}` yet (available: hotspot)"),
    }
}

fn build_workload() -> Result<PathBuf> {
    let dir = workspace_root().join("target/bench");
    std::fs::create_dir_all(&dir)?;
    let bin = dir.join("hotspot");
    sh(Command::new("cc")
        .args(["-O2", "-g", "-pthread", "-fno-omit-frame-pointer", "-o"])
        .arg(&bin)
        .arg(workspace_root().join("tests/workloads/hotspot.c")))?;
    Ok(bin)
}

/// Runs the fixed workload once; its own elapsed time in seconds.
fn workload_seconds(bin: &Path, iterations: u64) -> Result<f64> {
    let out = Command::new(bin).args(["fixed", &iterations.to_string(), THREADS]).output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let ns: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("ELAPSED="))
        .context("workload printed no ELAPSED")?
        .trim()
        .parse()?;
    Ok(ns / 1e9)
}

/// CPU time (user + system) a process has used so far, in seconds.
fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat[stat.rfind(')')? + 2..].split(' ').collect();
    let ticks: f64 = fields[11].parse::<f64>().ok()? + fields[12].parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

/// A profiler running in the background, stopped with SIGINT like a user would.
struct Profiler {
    child: Child,
    cpu_at_ready: f64,
    ready_at: Instant,
}

impl Profiler {
    fn start_bpfprof() -> Result<Profiler> {
        let mut child = Command::new(bpfprof_bin())
            .args(["-a", "-F", "99", "-o", "/tmp/bpfprof-bench.json"])
            .stderr(Stdio::piped())
            .spawn()?;
        // Ready once it says it is sampling (everything attached).
        let stderr = child.stderr.take().unwrap();
        let mut lines = BufReader::new(stderr).lines();
        loop {
            match lines.next() {
                Some(Ok(line)) if line.contains("sampling") => break,
                Some(Ok(_)) => continue,
                _ => bail!("bpfprof exited before it started sampling"),
            }
        }
        std::thread::spawn(move || lines.for_each(drop));
        Ok(Profiler::ready(child))
    }

    fn start_perf() -> Result<Profiler> {
        let child = Command::new("perf")
            .args(["record", "-F", "99", "-g", "-a", "-q", "-o", "/tmp/bpfprof-bench-perf.data"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        // perf has no readiness signal: give it time to open its events and mmap its buffers.
        std::thread::sleep(Duration::from_millis(1000));
        Ok(Profiler::ready(child))
    }

    fn ready(child: Child) -> Profiler {
        let cpu_at_ready = cpu_seconds(child.id()).unwrap_or(0.0);
        Profiler { child, cpu_at_ready, ready_at: Instant::now() }
    }

    /// Stop it; returns its CPU use while ready, as a fraction of one core.
    fn stop(mut self) -> Result<f64> {
        let cpu = cpu_seconds(self.child.id()).unwrap_or(0.0) - self.cpu_at_ready;
        let wall = self.ready_at.elapsed().as_secs_f64();
        nix_kill(self.child.id(), libc_sigint())?;
        self.child.wait()?;
        Ok(cpu / wall)
    }
}

fn libc_sigint() -> i32 {
    2
}

fn nix_kill(pid: u32, signal: i32) -> Result<()> {
    sh(Command::new("kill").arg(format!("-{signal}")).arg(pid.to_string()))
}

fn hotspot() -> Result<()> {
    let bin = build_workload()?;
    // Calibrate: about 1.5 s of work on every CPU.
    let probe = 1_000_000_000u64;
    let t = workload_seconds(&bin, probe)?;
    let iterations = (probe as f64 * 1.5 / t) as u64;
    eprintln!("bench hotspot: {ROUNDS} interleaved rounds of a fixed workload ({iterations} iterations x {THREADS} threads)");

    let (mut alone, mut under_bpfprof, mut under_perf) = (Vec::new(), Vec::new(), Vec::new());
    let (mut bpfprof_cpu, mut perf_cpu) = (Vec::new(), Vec::new());
    for round in 1..=ROUNDS {
        alone.push(workload_seconds(&bin, iterations)?);

        let profiler = Profiler::start_bpfprof()?;
        under_bpfprof.push(workload_seconds(&bin, iterations)?);
        bpfprof_cpu.push(profiler.stop()?);

        let profiler = Profiler::start_perf()?;
        under_perf.push(workload_seconds(&bin, iterations)?);
        perf_cpu.push(profiler.stop()?);
        eprintln!(
            "  round {round}: alone {:.4} s, bpfprof {:.4} s, perf {:.4} s",
            alone[round - 1],
            under_bpfprof[round - 1],
            under_perf[round - 1]
        );
    }
    let min = |v: &[f64]| v.iter().cloned().fold(f64::INFINITY, f64::min);
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let (a, b, p) = (min(&alone), min(&under_bpfprof), min(&under_perf));
    let (b_added, p_added) = (b - a, p - a);
    println!("bench hotspot (min of {ROUNDS} interleaved runs, workload's own elapsed time, {THREADS} threads on 2 CPUs)");
    println!("  alone                      {a:.4} s");
    println!(
        "  under bpfprof -a -F 99     {b:.4} s  ratio {:.4}x  added {:+.4} s  bpfprof CPU {:.2}% of one core",
        b / a,
        b_added,
        100.0 * mean(&bpfprof_cpu)
    );
    println!(
        "  under perf record -F 99 -g -a {p:.4} s  ratio {:.4}x  added {:+.4} s  perf CPU {:.2}% of one core",
        p / a,
        p_added,
        100.0 * mean(&perf_cpu)
    );
    let share = if p_added > 0.0 { b_added.max(0.0) / p_added } else { f64::NAN };
    println!(
        "  bpfprof ratio {:.4}x (target <= 1.005x): {}; bpfprof added time / perf added time {share:.2} (target <= 0.5): {}",
        b / a,
        verdict(b / a <= 1.005),
        verdict(share <= 0.5)
    );
    let _ = std::fs::remove_file("/tmp/bpfprof-bench-perf.data");
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
