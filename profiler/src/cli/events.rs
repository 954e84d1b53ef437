//! The command lines of the commands on events: `stat` (counting), `trace` (system calls),
//! `latency` (between two events), `record` and `script` (each hit), and `list` (what there is),
//! with what they share: what they watch (`ScopeArgs`) and where their report goes
//! (`ReportOutput`).
use std::{ffi::OsString, path::PathBuf};

use clap::Args;

use super::{parse_seconds, Format};

#[derive(Clone, Debug, Args)]
pub struct StatArgs {
    /// Events to count, comma-separated or repeated, in `-e`'s language; `{a,b}` counts a and b
    /// as one group (on the PMU together). Default: the CPU's topdown set where there is a PMU,
    /// software counters where not.
    #[arg(short = 'e', long = "event", value_name = "EVENTS")]
    pub events: Vec<String>,
    /// Count only the tracepoint hits this filter passes, in the kernel's own filter language,
    /// on the tracepoint's fields (`count > 4096`, `fd == 1 && count < 64`, `comm == "dd"`): it
    /// applies to every tracepoint of -e.
    #[arg(long, value_name = "EXPRESSION")]
    pub filter: Option<String>,
    /// Also count each tracepoint's and probe's hits per value of one of its numbers: a
    /// tracepoint's number field, a probe's arg1..arg6 (at entry) or retval (at a return); with
    /// `:log2`, per power-of-two range (`--by fd`, `--by count:log2`, `--by arg1:log2`).
    #[arg(long, value_name = "FIELD[:log2]")]
    pub by: Option<String>,
    /// Run the command this many times and report each count's mean and relative spread.
    #[arg(short = 'r', long = "repeat", value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub repeat: u32,
    /// Print the counts of each interval of this many milliseconds as well.
    #[arg(short = 'I', long = "interval", value_name = "MS",
          value_parser = clap::value_parser!(u64).range(10..))]
    pub interval_ms: Option<u64>,
    #[command(flatten)]
    pub scope: ScopeArgs,
    #[command(flatten)]
    pub report: ReportOutput,
}

/// Where `stat`, `trace` and `latency` write their report, and in what format.
#[derive(Clone, Debug, Default, Args)]
pub struct ReportOutput {
    /// Output format: text or json (default: from the -o extension, else text).
    #[arg(long, value_enum)]
    pub format: Option<Format>,
    /// Write the report here instead of standard output.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Option<PathBuf>,
}

/// What `stat`, `trace` and `latency` watch, and for how long.
#[derive(Clone, Debug, Default, Args)]
pub struct ScopeArgs {
    /// These processes (all their threads, and what they start from now on).
    #[arg(
        short = 'p',
        long = "pid",
        value_delimiter = ',',
        value_name = "PID[,PID...]",
        conflicts_with = "command"
    )]
    pub pids: Vec<u32>,
    /// The whole system, every CPU (the default when neither -p nor a command is given).
    #[arg(short = 'a', long = "all-cpus", conflicts_with = "pids")]
    pub system_wide: bool,
    /// Stop after this many seconds (default: when the command or targets exit, or Ctrl-C).
    #[arg(short = 'd', long = "duration", value_name = "SECONDS", value_parser = parse_seconds)]
    pub duration: Option<f64>,
    /// Command to start and watch, from before its first instruction.
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<OsString>,
}

#[derive(Clone, Debug, Args)]
pub struct LatencyArgs {
    /// Where each interval starts: a tracepoint or a probe, in `-e`'s language.
    #[arg(long, value_name = "EVENT")]
    pub from: String,
    /// Where it ends: the next hit of this event with the same key.
    #[arg(long, value_name = "EVENT")]
    pub to: String,
    /// What matches an end to its start: `thread` (the default: the same thread), or one or two
    /// numbers both events have: tracepoints' fields (`dev,sector`: a block request, completed in
    /// an interrupt), probes' arguments (`arg1`: a request's address) or return value (`retval`);
    /// FROM=TO where the two events name it differently (`retval=arg1`: what the start returned
    /// is the end's first argument).
    #[arg(long, value_name = "FIELDS", default_value = "thread")]
    pub key: String,
    /// Only the starts this filter passes are timed: up to 4 comparisons joined by && of
    /// --from's number fields or a probe's arg1..arg6 (`bytes >= 262144`: the large requests).
    #[arg(long, value_name = "EXPRESSION")]
    pub filter: Option<String>,
    /// Also list each interval at least MS milliseconds long: when it began, its key, who
    /// started it and the stacks it was started from.
    #[arg(long = "duration-min", value_name = "MS", value_parser = super::parse_millis)]
    pub duration_min_ms: Option<f64>,
    #[command(flatten)]
    pub scope: ScopeArgs,
    #[command(flatten)]
    pub report: ReportOutput,
}

#[derive(Clone, Debug, Args)]
pub struct TraceArgs {
    /// The summary: per thread, each system call's calls, errors (by errno), total, average,
    /// shortest and longest time, as `perf trace -s` and `strace -c` give them (always given:
    /// each call as it happens is not listed, only the slow ones with --duration-min).
    #[arg(short = 's', long = "summary")]
    pub summary: bool,
    /// Also list each call that took at least MS milliseconds, as `perf trace --duration` does:
    /// when, which thread, its arguments and result, and the user stack it was made from.
    #[arg(long = "duration-min", value_name = "MS", value_parser = super::parse_millis)]
    pub duration_min_ms: Option<f64>,
    #[command(flatten)]
    pub scope: ScopeArgs,
    #[command(flatten)]
    pub report: ReportOutput,
}

#[derive(Clone, Debug, Args)]
pub struct ListArgs {
    /// Only names containing this.
    #[arg(value_name = "FILTER")]
    pub filter: Option<String>,
    /// The functions of this file a user probe can name (`uprobe:FILE:FUNCTION`), instead of the
    /// events: a path, a program on $PATH or a library's name (`libc`).
    #[arg(long, value_name = "FILE")]
    pub probes: Option<String>,
    /// With --probes: the source lines of this function, numbered where a probe can fire
    /// (`uprobe:FILE:SOURCE:LINE`), from the file's DWARF line tables.
    #[arg(long, value_name = "FUNCTION", requires = "probes")]
    pub lines: Option<String>,
    /// Output format: text or json.
    #[arg(long, value_enum)]
    pub format: Option<Format>,
}

#[derive(Clone, Debug, Args)]
pub struct RecordArgs {
    /// Tracepoints and probes whose hits are recorded, comma-separated or repeated, in `-e`'s
    /// language (`syscalls:sys_enter_write`, `uprobe:./prog:prog.c:42`, `uretprobe:libc:malloc`).
    #[arg(short = 'e', long = "event", value_name = "EVENTS", required = true)]
    pub events: Vec<String>,
    /// Record every Nth hit of each event (counted over every CPU); every hit by default.
    #[arg(short = 'c', long = "count", value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub period: Option<u64>,
    /// What each hit of a probe reads, up to 4, each NAME[:TYPE]: arg1..arg6 (at a function's
    /// entry), retval (at a return), a USDT probe's own arg0..arg11, or a global variable of the
    /// probed file by name; TYPE u8..u64, s8..s64, x8..x64 (hex) or str (`--fetch arg1,arg2:str`,
    /// `--fetch line_value:s32`).
    #[arg(long, value_name = "LIST")]
    pub fetch: Option<String>,
    /// Each hit with its stacks, innermost first: the kernel's, then the user's, walked through
    /// the process's unwind tables once loaded (before: by frame pointers, as `perf record -g`).
    #[arg(short = 'g', long = "stacks")]
    pub stacks: bool,
    /// Only the hits this filter passes are counted and recorded: up to 4 comparisons joined by
    /// && of a tracepoint's number fields or a probe's arg1..arg6 (at entry) or retval
    /// (`count > 4096 && fd == 1`).
    #[arg(long, value_name = "EXPRESSION")]
    pub filter: Option<String>,
    #[command(flatten)]
    pub scope: ScopeArgs,
    // Text: a line per hit, as `perf script` prints them (the default on standard output); json:
    // JSON Lines, an object per hit, then one with the totals (`bpfprof script` reads it).
    #[command(flatten)]
    pub report: ReportOutput,
}

#[derive(Clone, Debug, Args)]
pub struct ScriptArgs {
    /// Hits `bpfprof record -o FILE` saved (JSON Lines).
    #[arg(value_name = "FILE")]
    pub input: PathBuf,
}
