//! `cargo xtask bench record`: each hit of a user probe recorded with a value fetched there,
//! where it costs most: the events workload's `lines N` calls `step(value, name)` 200,000 times
//! and does nothing else. Alone, under `bpfprof record -e uprobe:...:step --fetch arg1` and under
//! `perf record -e` the same probe (made by `perf probe` with the same argument), interleaved.
//! The workload times its own loop and its own CPU; the tool's CPU is what the bench's reaped
//! children used less the workload's, less what the tool takes to start and stop (a run of one
//! hit). perf's records are read by `perf script`, whose CPU is counted apart: bpfprof's file is
//! already text.
use std::{
    path::Path,
    process::{Command, Stdio},
};

use anyhow::{Context as _, Result};

use super::verdict;
use crate::build_workload;
use crate::{bpfprof_bin, workspace_root};

const ROUNDS: usize = 3;
const HITS: &str = "200000";
/// `perf probe`'s event for `step`, and the register of its first argument.
const PERF_EVENT: &str = "probe_events:step";
const ARG1: &str = if cfg!(target_arch = "aarch64") {
    "%x0"
} else {
    "%di"
};

/// One run: the workload's own loop time and CPU, the tool's CPU, the records written.
#[derive(Clone, Copy, Default)]
struct Run {
    elapsed_s: f64,
    tool_cpu_s: f64,
    records: u64,
    /// `perf script`'s CPU reading perf's records (0 for the others).
    reader_cpu_s: f64,
}

pub fn record() -> Result<()> {
    let bin = build_workload("events")?;
    let dir = workspace_root().join("target/bench");
    let (ours, theirs) = (dir.join("record.json"), dir.join("record.data"));
    let _ = perf(&["probe", "-q", "-d", PERF_EVENT]);
    perf(&[
        "probe",
        "-q",
        "-x",
        path(&bin),
        "--add",
        &format!("step arg1={ARG1}:s64"),
    ])
    .context("perf probe could not add a probe on step")?;
    eprintln!("bench record: {ROUNDS} interleaved rounds of `events lines {HITS}` (one probe hit per line)");
    let mut runs: [Vec<Run>; 3] = Default::default();
    let mut fixed = [0.0; 2];
    let result = (|| {
        fixed = [
            bpfprof_run(&bin, &ours, "1")?.tool_cpu_s,
            perf_run(&bin, &theirs, "1")?.tool_cpu_s,
        ];
        for round in 1..=ROUNDS {
            runs[0].push(run(&[path(&bin), "lines", HITS])?);
            runs[1].push(bpfprof_run(&bin, &ours, HITS)?);
            runs[2].push(perf_run(&bin, &theirs, HITS)?);
            let said: Vec<String> = (runs.iter())
                .map(|r| format!("{:.3} s", r[round - 1].elapsed_s))
                .collect();
            eprintln!(
                "  round {round}: alone {}, bpfprof {}, perf {}",
                said[0], said[1], said[2]
            );
        }
        Ok::<_, anyhow::Error>(())
    })();
    let _ = perf(&["probe", "-q", "-d", PERF_EVENT]);
    result?;
    report(&runs, fixed);
    Ok(())
}

fn report(runs: &[Vec<Run>; 3], fixed: [f64; 2]) {
    let best = |r: &[Run]| {
        *r.iter()
            .min_by(|a, b| a.elapsed_s.total_cmp(&b.elapsed_s))
            .unwrap()
    };
    let (alone, mut ours, mut theirs) = (best(&runs[0]), best(&runs[1]), best(&runs[2]));
    ours.tool_cpu_s = (ours.tool_cpu_s - fixed[0]).max(0.0);
    theirs.tool_cpu_s = (theirs.tool_cpu_s - fixed[1]).max(0.0);
    let per_hit = |s: f64, run: &Run| s * 1e9 / run.records.max(1) as f64;
    println!("bench record (the fastest of {ROUNDS} interleaved runs, by the workload's own clock): {HITS} hits of uprobe step, arg1 fetched");
    println!("  alone                       {:.4} s", alone.elapsed_s);
    for ((name, run), start) in [("bpfprof record", &ours), ("perf record", &theirs)]
        .into_iter()
        .zip(fixed)
    {
        println!(
            "  under {name:<15} {:.4} s  ratio {:.2}x  ({:.1} us a hit)  {} records  tool CPU {:.3} s past its start-up's {start:.2} s ({:.0} ns a record)",
            run.elapsed_s,
            run.elapsed_s / alone.elapsed_s,
            (run.elapsed_s - alone.elapsed_s) * 1e6 / run.records.max(1) as f64,
            run.records,
            run.tool_cpu_s,
            per_hit(run.tool_cpu_s, run)
        );
    }
    println!(
        "  perf script reading them: {:.3} s CPU ({:.0} ns a record); perf record + perf script: {:.0} ns a record, bpfprof record (already text): {:.0}",
        theirs.reader_cpu_s,
        per_hit(theirs.reader_cpu_s, &theirs),
        per_hit(theirs.tool_cpu_s + theirs.reader_cpu_s, &theirs),
        per_hit(ours.tool_cpu_s, &ours)
    );
    println!(
        "  bpfprof below perf record on the workload's time: {}; on CPU to a readable record: {}",
        verdict(ours.elapsed_s < theirs.elapsed_s),
        verdict(ours.tool_cpu_s < theirs.tool_cpu_s + theirs.reader_cpu_s)
    );
}

fn bpfprof_run(bin: &Path, out: &Path, hits: &str) -> Result<Run> {
    let probe = format!("uprobe:{}:step", path(bin));
    let bpfprof = bpfprof_bin();
    let words = [
        path(&bpfprof),
        "record",
        "-e",
        &probe,
        "--fetch",
        "arg1",
        "-o",
        path(out),
        "--",
    ];
    let mut run = run(&[&words[..], &[path(bin), "lines", hits]].concat())?;
    let text = std::fs::read_to_string(out)?;
    // Every line a hit but the last, the totals.
    run.records = text.lines().count().saturating_sub(1) as u64;
    anyhow::ensure!(
        text.contains("\"lost\":0"),
        "bpfprof lost records: {}",
        text.lines().last().unwrap_or("")
    );
    Ok(run)
}

fn perf_run(bin: &Path, out: &Path, hits: &str) -> Result<Run> {
    let words = ["perf", "record", "-q", "-e", PERF_EVENT, "-o", path(out), "--"];
    let mut run = run(&[&words[..], &[path(bin), "lines", hits]].concat())?;
    let before = children_cpu_s();
    let script = Command::new("perf").args(["script", "-i", path(out)]).output()?;
    run.reader_cpu_s = children_cpu_s() - before;
    run.records = String::from_utf8_lossy(&script.stdout)
        .lines()
        .filter(|l| l.contains("arg1="))
        .count() as u64;
    Ok(run)
}

/// `words` run to completion: the workload's TRUTH figures and the rest of the CPU its tool used.
fn run(words: &[&str]) -> Result<Run> {
    let before = children_cpu_s();
    let out = Command::new(words[0])
        .args(&words[1..])
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {}", words[0]))?;
    let used = children_cpu_s() - before;
    anyhow::ensure!(
        out.status.success(),
        "{words:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let figure = |key: &str| -> Result<f64> {
        let at = text
            .find(&format!("{key}="))
            .with_context(|| format!("no {key} in {text}"))?;
        Ok(text[at + key.len() + 1..]
            .split_whitespace()
            .next()
            .unwrap_or("")
            .parse()?)
    };
    let workload_cpu = figure("cpu_ns")? / 1e9;
    Ok(Run {
        elapsed_s: figure("elapsed_ns")? / 1e9,
        tool_cpu_s: (used - workload_cpu).max(0.0),
        ..Run::default()
    })
}

/// The CPU time of this process's children that have been waited for (`/proc/self/stat`'s
/// cutime and cstime, in clock ticks of 10 ms).
fn children_cpu_s() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<f64> = (stat.rsplit(')').next().unwrap_or("").split_whitespace())
        .map(|f| f.parse().unwrap_or(0.0))
        .collect();
    (fields.get(13).unwrap_or(&0.0) + fields.get(14).unwrap_or(&0.0)) / 100.0
}

fn perf(args: &[&str]) -> Result<()> {
    let out = Command::new("perf").args(args).output()?;
    anyhow::ensure!(
        out.status.success(),
        "perf {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap_or_default()
}
