//! `cargo xtask noise`: a machine that is not quiet, as CI hosts and the machines bpfprof runs on
//! are. A CPU hog on every CPU (plain busy threads at normal priority) and a loop that starts a
//! short-lived process every few milliseconds (exec, run, exit: what other jobs, shells and
//! health checks do). The tests must pass beside it: `cargo xtask test --noise`.
use std::{
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicU64, Ordering::Relaxed},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};

/// Pause between two short-lived processes (each is waited for before the next).
const SPAWN_EVERY: Duration = Duration::from_millis(10);

fn hogs() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}

/// Make noise until killed, or until the process that started us is gone.
pub fn run(seconds: Option<f64>) -> Result<()> {
    let parent = std::os::unix::process::parent_id();
    let hogs = hogs();
    static SPINS: AtomicU64 = AtomicU64::new(0);
    for _ in 0..hogs {
        std::thread::spawn(|| loop {
            let mut x = 0u64;
            for i in 0..1_000_000u64 {
                x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
            }
            SPINS.fetch_add(1, Relaxed);
        });
    }
    let started = Instant::now();
    let until = seconds.map(|s| started + Duration::from_secs_f64(s));
    let mut processes = 0u64;
    eprintln!(
        "noise: {hogs} CPU hogs and a short-lived process every {} ms",
        SPAWN_EVERY.as_millis()
    );
    while until.is_none_or(|t| Instant::now() < t) && std::os::unix::process::parent_id() == parent {
        let status = Command::new("true")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .context("starting `true`")?;
        if status.success() {
            processes += 1;
        }
        std::thread::sleep(SPAWN_EVERY);
    }
    eprintln!(
        "noise: {processes} processes in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The noise in a process of its own (this program, `noise` task), stopped when dropped.
pub struct Noise {
    child: Child,
}

impl Noise {
    pub fn start() -> Result<Noise> {
        let child = Command::new(std::env::current_exe()?)
            .arg("noise")
            .stdin(Stdio::null())
            .spawn()
            .context("starting the noise generator")?;
        Ok(Noise { child })
    }

    pub fn description(&self) -> String {
        format!(
            "{} CPU hogs, a short-lived process every {} ms",
            hogs(),
            SPAWN_EVERY.as_millis()
        )
    }
}

impl Drop for Noise {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
