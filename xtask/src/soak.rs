//! `cargo xtask soak --minutes N`: the agent left running under process churn (thousands of
//! short-lived processes a minute, each exec'd anew) with short windows. After a warm-up its
//! resident memory and open descriptors must stay flat (within 10%); it must not crash; what it
//! lost is reported. Prints one summary line, and fails when a bound is broken. `cargo xtask bench
//! agent` runs the same at the agent's default rate with every signal and a lock workload beside
//! the churn, and reads off its CPU and memory over time.
use std::{
    io::{Read as _, Write as _},
    process::{Command, Stdio},
    sync::{
        atomic::{AtomicBool, Ordering::Relaxed},
        Arc,
    },
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};

use crate::{bpfprof_bin, build_workload};

const DIR: &str = "/tmp/bpfprof-soak";
const WINDOW_S: u64 = 15;
const EVERY: Duration = Duration::from_secs(5);
const TOLERANCE: f64 = 0.10;
const TRACE_EVERY: Duration = Duration::from_secs(60);

/// What runs: the agent's rate and signals, for how long, and what beside the churn.
pub struct Churn<'a> {
    pub minutes: f64,
    pub signals: &'a str,
    /// The agent's `-F`.
    pub hz: &'a str,
    /// `lockload` back to back beside the churn: contended mutexes for the lock signal.
    pub lock_load: bool,
    /// A line of figures this often.
    pub trace_every: Duration,
}

impl<'a> Churn<'a> {
    /// The soak as `cargo xtask soak` and the test run run it.
    pub fn soak(minutes: f64, signals: &'a str) -> Self {
        Churn {
            minutes,
            signals,
            hz: "99",
            lock_load: false,
            trace_every: TRACE_EVERY,
        }
    }
}

struct Reading {
    rss: u64,
    /// Of `rss`: anonymous memory (the heap); the rest is file pages the symbolizer has mapped,
    /// which the kernel can reclaim.
    rss_anon: u64,
    fds: u64,
}

fn read(pid: u32) -> Option<Reading> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb = |field: &str| -> Option<u64> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(field))?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    };
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64;
    Some(Reading {
        rss: kb("VmRSS:")? * 1024,
        rss_anon: kb("RssAnon:")? * 1024,
        fds,
    })
}

/// The CPU time of a process's threads so far, in seconds, by thread name (schedstat:
/// nanoseconds, not ticks); none once the process is gone.
pub(crate) fn cpu_by_thread(pid: u32) -> Option<Vec<(String, f64)>> {
    let mut by_name: Vec<(String, f64)> = Vec::new();
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    for task in tasks.flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        let ns: Option<f64> = std::fs::read_to_string(task.path().join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse().ok());
        let (name, seconds) = (comm.trim().to_string(), ns.unwrap_or(0.0) / 1e9);
        match by_name.iter_mut().find(|(n, _)| *n == name) {
            Some((_, total)) => *total += seconds,
            None => by_name.push((name, seconds)),
        }
    }
    Some(by_name)
}

/// What the agent's threads used since the last line: a share of one core each.
struct CpuSince {
    at: Instant,
    threads: Vec<(String, f64)>,
}

impl CpuSince {
    fn now(pid: u32) -> Self {
        CpuSince {
            at: Instant::now(),
            threads: cpu_by_thread(pid).unwrap_or_default(),
        }
    }

    /// "1.52% (main 1.10, render 0.42)", and the reading to measure the next line from.
    fn line(&self, pid: u32) -> (String, CpuSince) {
        let now = CpuSince::now(pid);
        let wall = now.at.duration_since(self.at).as_secs_f64().max(1e-9);
        let shares: Vec<(&str, f64)> = (now.threads.iter())
            .map(|(name, seconds)| {
                let before = self.threads.iter().find(|(n, _)| n == name).map_or(0.0, |t| t.1);
                (name.as_str(), (seconds - before) / wall * 100.0)
            })
            .collect();
        let parts: Vec<String> = (shares.iter())
            .filter(|(_, pct)| *pct >= 0.005)
            .map(|(name, pct)| format!("{name} {pct:.2}"))
            .collect();
        let total: f64 = shares.iter().map(|(_, pct)| pct).sum();
        (format!("CPU {total:.2}% of a core ({})", parts.join(", ")), now)
    }
}

fn trace(elapsed: Duration, reading: &Reading, cpu: &str, address: &str) {
    let page = metrics(address).unwrap_or_default();
    eprintln!(
        "soak: {:>4.0} s  {cpu}  RSS {:.1} MB (anon {:.1})  fds {}  processes {}  files {}  frames {} ({:.0} KB)  symbolizer files {}  unwind rows {}  lock waits {} (stacks stored {}, freed {}, lost {})",
        elapsed.as_secs_f64(),
        reading.rss as f64 / 1e6,
        reading.rss_anon as f64 / 1e6,
        reading.fds,
        metric(&page, "bpfprof_agent_processes_tracked"),
        metric(&page, "bpfprof_agent_files_open"),
        metric(&page, "bpfprof_agent_symbolization_cache_frames"),
        metric(&page, "bpfprof_agent_symbolization_cache_bytes") / 1e3,
        metric(&page, "bpfprof_agent_symbolization_cache_files"),
        metric(&page, "bpfprof_agent_unwind_rows_used"),
        metric(&page, "bpfprof_agent_lock_waits_total"),
        metric(&page, "bpfprof_agent_lock_stacks_stored"),
        metric(&page, "bpfprof_agent_lock_stacks_freed_total"),
        metric(&page, "bpfprof_agent_lock_stacks_lost_total"),
    );
}

fn metrics(address: &str) -> Result<String> {
    let mut stream = std::net::TcpStream::connect(address)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        stream,
        "GET /metrics HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )?;
    let mut page = String::new();
    stream.read_to_string(&mut page)?;
    Ok(page)
}

fn metric(page: &str, name: &str) -> f64 {
    page.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or(f64::NAN)
}

/// Largest deviation below and above `base`, as fractions.
fn range(values: &[u64], base: u64) -> (f64, f64) {
    let dev = |v: u64| (v as f64 - base as f64) / base.max(1) as f64;
    let lo = values.iter().map(|&v| dev(v)).fold(0.0, f64::min);
    let hi = values.iter().map(|&v| dev(v)).fold(0.0, f64::max);
    (lo, hi)
}

fn terminate(pid: u32) {
    let _ = Command::new("kill").args(["-TERM", &pid.to_string()]).status();
}

pub fn run(minutes: f64, signals: &str) -> Result<()> {
    run_churn(&Churn::soak(minutes, signals))
}

/// `lockload 4 2` back to back until `stop` is set.
fn lock_load(stop: Arc<AtomicBool>) -> Result<std::thread::JoinHandle<()>> {
    let lockload = build_workload("lockload")?;
    Ok(std::thread::spawn(move || {
        while !stop.load(Relaxed) {
            let ran = Command::new(&lockload)
                .args(["4", "2"])
                .stdout(Stdio::null())
                .status();
            if ran.is_err() {
                return;
            }
        }
    }))
}

pub fn run_churn(c: &Churn<'_>) -> Result<()> {
    let Churn {
        minutes, signals, hz, ..
    } = *c;
    if minutes < 1.0 {
        bail!("--minutes: at least 1 (the warm-up alone is a minute)");
    }
    let churn = build_workload("churn")?;
    let total = Duration::from_secs_f64(minutes * 60.0);
    // Caches fill while new executables are first symbolized: half the run, at most 5 minutes.
    let warm_up = Duration::from_secs_f64((minutes * 60.0 / 2.0).clamp(60.0, 300.0));
    let _ = std::fs::remove_dir_all(DIR);
    let address = "127.0.0.1:7079";
    let mut agent = Command::new(bpfprof_bin())
        .args([
            "agent",
            "-F",
            hz,
            "--window",
            &WINDOW_S.to_string(),
            "--keep",
            "4",
        ])
        .args(["--output-dir", DIR, "--listen", address, "--signals", signals])
        .stderr(Stdio::piped())
        .spawn()
        .context("starting the agent")?;
    let pid = agent.id();
    // Its standard error is drained, so a chatty agent never blocks on a full pipe.
    let stderr = agent.stderr.take().unwrap();
    let log = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = std::io::BufReader::new(stderr).read_to_string(&mut text);
        text
    });
    std::thread::sleep(Duration::from_secs(3));
    // One child at a time, 20 ms of CPU each: ~2500 processes a minute, half the machine busy.
    let mut workload = Command::new(&churn)
        .args([&format!("{}", total.as_secs() + 30), "1", "20"])
        .stdout(Stdio::piped())
        .spawn()
        .context("starting the churn workload")?;
    let stop_lock = Arc::new(AtomicBool::new(false));
    let lock = match c.lock_load {
        true => Some(lock_load(stop_lock.clone())?),
        false => None,
    };
    eprintln!(
        "soak: {minutes} min of the agent ({signals}; {hz} Hz, {WINDOW_S} s windows) under process churn{}; warm-up {:.0} s, then RSS and descriptors must stay within {:.0}%",
        if lock.is_some() { " and lockload" } else { "" },
        warm_up.as_secs_f64(),
        TOLERANCE * 100.0
    );
    let started = Instant::now();
    let mut after_warm_up: Vec<Reading> = Vec::new();
    let mut crashed = None;
    let mut next_trace = c.trace_every;
    let mut cpu = CpuSince::now(pid);
    while started.elapsed() < total {
        std::thread::sleep(EVERY);
        if let Some(status) = agent.try_wait()? {
            crashed = Some(status);
            break;
        }
        let Some(reading) = read(pid) else { continue };
        // A line a minute, so a bound that breaks can be traced to what grew.
        if started.elapsed() >= next_trace {
            next_trace += c.trace_every;
            let (line, now) = cpu.line(pid);
            cpu = now;
            trace(started.elapsed(), &reading, &line, address);
        }
        if started.elapsed() >= warm_up {
            after_warm_up.push(reading);
        }
    }
    let page = metrics(address).unwrap_or_default();
    terminate(workload.id());
    stop_lock.store(true, Relaxed);
    if let Some(lock) = lock {
        let _ = lock.join();
    }
    let mut truth = String::new();
    workload.stdout.take().unwrap().read_to_string(&mut truth)?;
    workload.wait()?;
    let processes = truth
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("children="))
        .unwrap_or("?")
        .to_string();
    let stopped_ok = match crashed {
        Some(_) => false,
        None => {
            terminate(pid);
            agent.wait()?.success()
        }
    };
    let log = log.join().unwrap_or_default();
    let _ = std::fs::remove_dir_all(DIR);
    if let Some(status) = crashed {
        bail!(
            "soak: the agent died ({status}) after {:.0} s:\n{log}",
            started.elapsed().as_secs_f64()
        );
    }
    let Some(base) = after_warm_up.first() else {
        bail!("soak: no reading after the warm-up");
    };
    let rss: Vec<u64> = after_warm_up.iter().map(|r| r.rss).collect();
    let fds: Vec<u64> = after_warm_up.iter().map(|r| r.fds).collect();
    let (rss_lo, rss_hi) = range(&rss, base.rss);
    let (fd_lo, fd_hi) = range(&fds, base.fds);
    let flat = |(lo, hi): (f64, f64)| lo >= -TOLERANCE && hi <= TOLERANCE;
    let pass = flat((rss_lo, rss_hi)) && flat((fd_lo, fd_hi)) && stopped_ok;
    let cpu =
        metric(&page, "bpfprof_agent_cpu_seconds_total") / metric(&page, "bpfprof_agent_uptime_seconds");
    println!(
        "soak: {minutes} min ({signals}, {hz} Hz), {} windows, {processes} processes churned; RSS {:.1} MB after warm-up, then {:+.1}%..{:+.1}% (last {:.1} MB); fds {}, then {:+.1}%..{:+.1}%; samples {}, lost {}, processes not captured {}, windows dropped {}; lock waits {}, lock map full {}, lock stacks lost {}; agent CPU {:.2}% of one core; stopped cleanly: {stopped_ok}: {}",
        metric(&page, "bpfprof_agent_windows_written_total"),
        base.rss as f64 / 1e6,
        rss_lo * 100.0,
        rss_hi * 100.0,
        rss.last().copied().unwrap_or(0) as f64 / 1e6,
        base.fds,
        fd_lo * 100.0,
        fd_hi * 100.0,
        metric(&page, "bpfprof_agent_samples_total"),
        metric(&page, "bpfprof_agent_samples_lost_total"),
        metric(&page, "bpfprof_agent_processes_not_captured_total"),
        metric(&page, "bpfprof_agent_windows_dropped_total"),
        metric(&page, "bpfprof_agent_lock_waits_total"),
        metric(&page, "bpfprof_agent_lock_map_full_total"),
        metric(&page, "bpfprof_agent_lock_stacks_lost_total"),
        cpu * 100.0,
        if pass { "PASS" } else { "FAIL" }
    );
    if !pass {
        bail!("soak failed; the agent said:\n{log}");
    }
    Ok(())
}
