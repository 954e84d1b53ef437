//! `cargo xtask bench trace`: the system-call summary's cost where it is highest, a command that
//! does nothing but system calls (`dd bs=512`, two calls a block), alone and under each tool that
//! gives the same summary: `strace -c`, `perf trace -s` and `bpfprof trace -s`, interleaved. Each
//! tool starts the command itself; dd's own clock (its `copied, S s` line) times it, so the
//! tools' start-up is not counted.
use std::process::Command;

use anyhow::{Context as _, Result};

use super::compare::{bpf_program_stats, verdict, Profiler, BPF_STATS};
use crate::bpfprof_bin;

const ROUNDS: usize = 3;
const DD: [&str; 5] = ["dd", "if=/dev/zero", "of=/dev/null", "bs=512", "count=1000k"];

/// The tools, each as the words before `dd ...`.
fn tools() -> Vec<(&'static str, Vec<String>)> {
    let bpfprof = bpfprof_bin().to_string_lossy().into_owned();
    vec![
        ("alone", Vec::new()),
        (
            "bpfprof trace -s",
            vec![
                bpfprof,
                "trace".into(),
                "-s".into(),
                "-o".into(),
                "/dev/null".into(),
                "--".into(),
            ],
        ),
        (
            "perf trace -s",
            ["perf", "trace", "-s", "-o", "/dev/null", "--"]
                .map(String::from)
                .to_vec(),
        ),
        (
            "strace -c",
            ["strace", "-c", "-o", "/dev/null", "--"]
                .map(String::from)
                .to_vec(),
        ),
    ]
}

/// One run of dd under `wrapper`: dd's own elapsed seconds.
fn dd_seconds(wrapper: &[String]) -> Result<f64> {
    let mut words: Vec<&str> = wrapper.iter().map(String::as_str).collect();
    words.extend(DD);
    let out = Command::new(words[0])
        .args(&words[1..])
        .output()
        .with_context(|| format!("running {}", words[0]))?;
    anyhow::ensure!(
        out.status.success(),
        "{words:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // "... bytes (...) copied, 1.23456 s, 415 MB/s"
    let text = String::from_utf8_lossy(&out.stderr);
    text.lines()
        .find_map(|l| l.split("copied, ").nth(1)?.split(" s").next()?.parse().ok())
        .with_context(|| format!("dd printed no elapsed time under {words:?}: {text}"))
}

pub fn trace() -> Result<()> {
    let tools = tools();
    eprintln!("bench trace: {ROUNDS} interleaved rounds of `{}`", DD.join(" "));
    let mut seconds = vec![Vec::new(); tools.len()];
    for round in 1..=ROUNDS {
        for (i, (_, wrapper)) in tools.iter().enumerate() {
            seconds[i].push(dd_seconds(wrapper)?);
        }
        let line: Vec<String> = tools
            .iter()
            .zip(&seconds)
            .map(|((name, _), s)| format!("{name} {:.3} s", s[round - 1]))
            .collect();
        eprintln!("  round {round}: {}", line.join(", "));
    }
    let min = |v: &[f64]| v.iter().cloned().fold(f64::INFINITY, f64::min);
    let alone = min(&seconds[0]);
    println!(
        "bench trace (min of {ROUNDS} interleaved runs of dd's own elapsed time): `{}`, 2,048,000 read and write calls",
        DD.join(" ")
    );
    println!("  alone                  {alone:.4} s");
    for ((name, _), s) in tools.iter().zip(&seconds).skip(1) {
        let t = min(s);
        println!(
            "  under {name:<16} {t:.4} s  ratio {:.2}x  added {:+.4} s",
            t / alone,
            t - alone
        );
    }
    let ratio = |name: &str| {
        let i = tools.iter().position(|(n, _)| *n == name).unwrap();
        min(&seconds[i]) / alone
    };
    let (ours, perf, strace) = (
        ratio("bpfprof trace -s"),
        ratio("perf trace -s"),
        ratio("strace -c"),
    );
    println!(
        "  bpfprof below perf trace -s: {}; below strace -c: {}",
        verdict(ours < perf),
        verdict(ours < strace)
    );
    per_call_cost()
}

/// The programs' own run time per call, from the kernel (`kernel.bpf_stats_enabled`), with the
/// summary attached system-wide while dd runs alone.
fn per_call_cost() -> Result<()> {
    let before = std::fs::read_to_string(BPF_STATS).unwrap_or_else(|_| "0".into());
    std::fs::write(BPF_STATS, "1").context("enabling kernel.bpf_stats_enabled")?;
    let profiler = Profiler::start_bpfprof(&["trace", "-s", "-a"])?;
    dd_seconds(&[])?;
    let (ns, runs) = bpf_program_stats(profiler.pid());
    profiler.stop()?;
    let _ = std::fs::write(BPF_STATS, before.trim());
    println!(
        "  BPF per program run (sys_enter and sys_exit, every call of the machine): {:.0} ns over {runs} runs",
        ns as f64 / runs.max(1) as f64
    );
    Ok(())
}
