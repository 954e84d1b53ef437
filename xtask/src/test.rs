//! `cargo xtask test`: every suite runs even when one fails (a red suite must not hide the state
//! of the others), each ends in one summary line, and the run ends in `N passed, N failed`.
//! `--repeat N` runs the whole thing N times back to back and `--noise` keeps the machine busy
//! meanwhile (see `noise`): the proof that the suite passes on a machine that is not quiet.
use std::{
    io::{BufRead as _, BufReader},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};

use crate::{
    bpfprof_bin, cargo, docs, guest, is_root,
    noise::Noise,
    sh, soak,
    tally::{slowest, timed, totals_line, Outcome, Tally},
    workspace_root,
};

/// The soak that a whole test run ends with (CI); 60 minutes by hand (`cargo xtask soak`).
const CI_SOAK_MINUTES: f64 = 3.0;
/// CPU only, as the soak's bounds were set for. With every signal on, a 3-minute soak's RSS
/// peaked 11.2% over its reading after the warm-up (last reading +1%): caches still filling
/// with off-CPU stacks' files; that run is the hour-long `cargo xtask soak --signals all`.
const CI_SOAK_SIGNALS: &str = "cpu";

pub struct Options {
    pub repeat: u32,
    pub noise: bool,
    /// Extra arguments for the test harness (a name filter): the soak is then left out.
    pub filter: Vec<String>,
}

pub fn run(options: &Options) -> Result<()> {
    // One profile for everything: the release build of bpfprof is what the end-to-end tests run,
    // and sharing it avoids compiling the BPF object twice. Default members only: the BPF crate
    // is never built for the host.
    crate::build_https()?;
    sh(cargo().args(["build", "--release"]))?;
    if !is_root() {
        bail!("the end-to-end tests load BPF programs and must run as root: sudo -E cargo xtask test");
    }
    let noise = match options.noise {
        true => Some(Noise::start()?),
        false => None,
    };
    let noise_note = noise
        .as_ref()
        .map_or(String::new(), |n| format!(" (noise: {})", n.description()));
    let mut runs: Vec<Vec<Outcome>> = Vec::new();
    for round in 1..=options.repeat {
        if options.repeat > 1 {
            println!("xtask test: run {round} of {}{noise_note}", options.repeat);
        }
        let outcomes = run_once(&options.filter, guest::time_limit(options.noise))?;
        println!();
        print_summary(round, options.repeat, &outcomes, &noise_note);
        runs.push(outcomes);
    }
    drop(noise);
    if options.repeat > 1 {
        println!("\nxtask test: {} runs{noise_note}", options.repeat);
        for (i, outcomes) in runs.iter().enumerate() {
            println!("  run {}: {}", i + 1, totals_line(outcomes));
        }
    }
    any_failed(runs.iter().flatten())
}

/// Only the arm64 suites (`cargo xtask guest`).
pub fn run_guest(filter: &[String]) -> Result<()> {
    let outcomes = guest::run_suites(filter, guest::time_limit(false))?;
    println!();
    print_summary(1, 1, &outcomes, "");
    any_failed(&outcomes)
}

/// An error naming how many tests failed, if any did.
fn any_failed<'a>(outcomes: impl IntoIterator<Item = &'a Outcome>) -> Result<()> {
    let failed: u32 = outcomes.into_iter().map(|o| o.failed).sum();
    if failed > 0 {
        bail!("{failed} test(s) failed");
    }
    Ok(())
}

/// Every suite once: unit tests, each end-to-end test file, then (on a whole run) the soak.
fn run_once(filter: &[String], guest_limit: Duration) -> Result<Vec<Outcome>> {
    // The tests' reports and fixtures go to a directory of this run, emptied at its start, so a
    // run leaves nothing in /tmp and the last run's files are there to read after a failure.
    let scratch = workspace_root().join("target/test-tmp");
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch)?;
    let mut outcomes = Vec::new();
    let mut unit = cargo();
    unit.env("TMPDIR", &scratch);
    unit.args([
        "test",
        "--release",
        "--no-fail-fast",
        "-p",
        "profiler",
        "-p",
        "profiler-common",
        "-p",
        "xtask",
        "--",
    ])
    .args(filter);
    outcomes.push(run_suite("unit", &mut unit, Tally::in_parallel())?);
    // Completions and man pages are generated from the command line of this build, and checked.
    if filter.is_empty() {
        let started = Instant::now();
        outcomes.push(Outcome::of_task("docs", docs::run(), started));
        // Every parser's fuzz target, briefly: the inputs they failed on are unit tests.
        outcomes.push(crate::fuzz::smoke());
    }
    for suite in e2e_suites()? {
        // Tests that load BPF share kernel state (the CPUs they sample): one at a time.
        let mut cmd = cargo();
        cmd.args(["test", "--release", "-p", "bpfprof-tests", "--test", &suite, "--"])
            .arg("--test-threads=1")
            .args(filter)
            .env("BPFPROF_BIN", bpfprof_bin())
            .env("BPFPROF_HTTPS_BIN", crate::bpfprof_https_bin())
            .env("TMPDIR", &scratch);
        outcomes.push(run_suite(&format!("e2e {suite}"), &mut cmd, Tally::default())?);
    }
    // The arm64 suites, in the emulated Neoverse (`cargo xtask guest` alone). A guest that cannot
    // be built or booted fails the run like a failing suite, after the host's suites have run.
    match guest::run_suites(filter, guest_limit) {
        Ok(guest) => outcomes.extend(guest),
        Err(e) => outcomes.push(Outcome {
            suite: "arm64 guest".into(),
            passed: 0,
            failed: 1,
            failures: vec![format!("{e:#}")],
            ..Default::default()
        }),
    }
    // The agent left running: only on a whole run (a filtered one is someone chasing one test).
    if filter.is_empty() {
        let started = Instant::now();
        let result = soak::run(CI_SOAK_MINUTES, CI_SOAK_SIGNALS);
        outcomes.push(Outcome::of_task("soak", result, started));
    }
    Ok(outcomes)
}

/// The end-to-end test files (`tests/tests/NAME.rs`) the host runs, in name order.
fn e2e_suites() -> Result<Vec<String>> {
    let mut names = crate::rust_files(&workspace_root().join("tests/tests"))?;
    names.retain(|name| !guest::GUEST_ONLY.contains(&name.as_str()));
    Ok(names)
}

/// Run one `cargo test` invocation, passing its output through, and read what it did from the
/// harness's own lines into `tally`.
fn run_suite(name: &str, cmd: &mut Command, mut tally: Tally) -> Result<Outcome> {
    let started = Instant::now();
    let mut child = cmd
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {cmd:?}"))?;
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line?;
        let took = tally.read(&line);
        println!("{}", timed(&line, took));
    }
    let status = child.wait()?;
    let failed_with = (!status.success()).then(|| status.to_string());
    Ok(tally.outcome(name, failed_with, started.elapsed()))
}

fn print_summary(round: u32, of: u32, outcomes: &[Outcome], noise_note: &str) {
    let run = match of {
        1 => String::new(),
        _ => format!(" (run {round} of {of})"),
    };
    println!("xtask test: the slowest tests{run}");
    for line in slowest(outcomes, 12) {
        println!("  {line}");
    }
    println!("xtask test: summary{run}{noise_note}");
    for outcome in outcomes {
        println!("  {}", outcome.line());
    }
    println!("{}", totals_line(outcomes));
}
