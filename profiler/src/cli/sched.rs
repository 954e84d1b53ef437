//! `bpfprof sched record | timehist | map`.
use std::path::PathBuf;

use clap::{Args, Subcommand};

use super::ScopeArgs;

#[derive(Debug, Args)]
pub struct SchedArgs {
    #[command(subcommand)]
    pub command: SchedCommand,
}

#[derive(Debug, Subcommand)]
pub enum SchedCommand {
    /// Every switch on every CPU, and the targets' wake-ups, migrations, forks and exits, each
    /// with the kernel's own run-queue delay and run time of the tasks it names, streamed into
    /// a file (JSON Lines; events a full ring dropped are counted).
    Record(SchedRecordArgs),
    /// A line per run of each task of a recording: when it left its CPU, its wait, run-queue
    /// delay and run time (`perf sched timehist`'s columns).
    Timehist(TimehistArgs),
    /// Which task each CPU of a recording ran, a line per switch (`perf sched map`).
    Map(SchedMapArgs),
}

#[derive(Clone, Debug, Args)]
pub struct SchedRecordArgs {
    /// The recording (JSON Lines), written as it comes, in place when the run ends.
    #[arg(short = 'o', long = "output", value_name = "FILE", required = true)]
    pub output: PathBuf,
    #[command(flatten)]
    pub scope: ScopeArgs,
}

#[derive(Clone, Debug, Args)]
pub struct TimehistArgs {
    /// A recording `bpfprof sched record` wrote.
    #[arg(value_name = "FILE")]
    pub input: PathBuf,
    /// Also each wake-up of a task shown, with its waker.
    #[arg(short = 'w', long = "wakeups")]
    pub wakeups: bool,
    /// Also each migration of a task shown, from CPU to CPU.
    #[arg(short = 'M', long = "migrations")]
    pub migrations: bool,
    /// A column per CPU, marked where the event happened (s: a run ended, w: a wake-up, m: a
    /// migration).
    #[arg(short = 'V', long = "cpu-visual")]
    pub cpu_visual: bool,
    /// A summary per task after the lines: runs, run time, run-queue delay, migrations.
    #[arg(short = 's', long = "summary")]
    pub summary: bool,
    /// Only the summary.
    #[arg(short = 'S', long = "summary-only")]
    pub summary_only: bool,
    /// Only these threads.
    #[arg(long = "tid", value_delimiter = ',', value_name = "TID[,TID...]")]
    pub tids: Vec<u32>,
    /// Only from this many seconds into the recording.
    #[arg(long, value_name = "SECONDS")]
    pub since: Option<f64>,
    /// Only up to this many seconds into the recording.
    #[arg(long, value_name = "SECONDS")]
    pub until: Option<f64>,
}

#[derive(Clone, Debug, Args)]
pub struct SchedMapArgs {
    /// A recording `bpfprof sched record` wrote.
    #[arg(value_name = "FILE")]
    pub input: PathBuf,
    /// Only these CPUs' columns (`0-3,8`); default: as many as the terminal's width holds.
    #[arg(long, value_name = "LIST")]
    pub cpus: Option<String>,
    /// The width to fit (default: the terminal's, else 120).
    #[arg(long, value_name = "COLUMNS")]
    pub width: Option<usize>,
}
