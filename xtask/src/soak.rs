//! `cargo xtask soak --minutes N`: the agent left running under process churn (thousands of
//! short-lived processes a minute, each exec'd anew) with short windows. After a warm-up its
//! resident memory and open descriptors must stay flat (within 10%); it must not crash; what it
//! lost is reported. Prints one summary line, and fails when a bound is broken.
use std::{
    io::{Read as _, Write as _},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};

use crate::{bench::build_workload, bpfprof_bin};

const DIR: &str = "/tmp/bpfprof-soak";
const WINDOW_S: u64 = 15;
const EVERY: Duration = Duration::from_secs(5);
const TOLERANCE: f64 = 0.10;
const TRACE_EVERY: Duration = Duration::from_secs(60);

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

fn trace(elapsed: Duration, reading: &Reading, address: &str) {
    let page = metrics(address).unwrap_or_default();
    eprintln!(
        "soak: {:>4.0} s  RSS {:.1} MB (anon {:.1})  fds {}  processes {}  files {}  frames {} ({:.0} KB)  symbolizer files {}  unwind rows {}  lock waits {} (stacks stored {}, freed {}, lost {})",
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
            "99",
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
    eprintln!(
        "soak: {minutes} min of the agent ({signals}; 99 Hz, {WINDOW_S} s windows) under process churn; warm-up {:.0} s, then RSS and descriptors must stay within {:.0}%",
        warm_up.as_secs_f64(),
        TOLERANCE * 100.0
    );
    let started = Instant::now();
    let mut after_warm_up: Vec<Reading> = Vec::new();
    let mut crashed = None;
    let mut next_trace = TRACE_EVERY;
    while started.elapsed() < total {
        std::thread::sleep(EVERY);
        if let Some(status) = agent.try_wait()? {
            crashed = Some(status);
            break;
        }
        let Some(reading) = read(pid) else { continue };
        // A line a minute, so a bound that breaks can be traced to what grew.
        if started.elapsed() >= next_trace {
            next_trace += TRACE_EVERY;
            trace(started.elapsed(), &reading, address);
        }
        if started.elapsed() >= warm_up {
            after_warm_up.push(reading);
        }
    }
    let page = metrics(address).unwrap_or_default();
    terminate(workload.id());
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
        "soak: {minutes} min ({signals}), {} windows, {processes} processes churned; RSS {:.1} MB after warm-up, then {:+.1}%..{:+.1}% (last {:.1} MB); fds {}, then {:+.1}%..{:+.1}%; samples {}, lost {}, processes not captured {}, windows dropped {}; lock waits {}, lock map full {}, lock stacks lost {}; agent CPU {:.2}% of one core; stopped cleanly: {stopped_ok}: {}",
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
