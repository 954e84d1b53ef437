//! bpfprof: an eBPF profiler. The data path is the shape:
//! `sources` (one module per kind of kernel data: what it needs loaded, how it attaches, drains
//! and finishes) → `start` (the one start path) → `driver` (the one loop: an epoch flip and a
//! drain each second) → batches → a sink (`session`: a run's report; `top`: a redraw; `agent`:
//! windows and pulls) → `modes` (fold batches into each report) → `symbolize` → `report`.
//! `sources::MODE_SOURCES` and `SIGNAL_SOURCES` say which sources each mode and agent signal use;
//! `health` declares every counter of what was lost once.
pub mod agent;
pub mod bpf;
pub mod btf;
pub mod cli;
pub mod collect;
pub mod counters;
pub mod driver;
pub mod error;
pub mod fuzz;
pub mod golang;
pub mod health;
pub mod latency;
pub mod launcher;
pub mod list;
pub mod map_ops;
pub mod model;
pub mod modes;
pub mod output;
pub mod plan;
pub mod preflight;
pub mod process;
pub mod profile;
pub mod python;
pub mod record;
pub mod report;
pub mod session;
pub mod sources;
pub mod start;
pub mod stat;
pub mod status;
pub mod steal;
pub mod symbolize;
pub mod timeline;
pub mod top;
pub mod trace;
pub mod unwind;
pub mod views;
pub mod which;

use cli::{Cli, Subcommands};

/// Run bpfprof; the result is the process exit code. The outline of the program: each
/// subcommand, a topdown report from a saved `perf stat` file, or one run.
pub fn run(mut cli: Cli) -> anyhow::Result<i32> {
    match cli.subcommand.take() {
        Some(Subcommands::Agent(args)) => agent::run(args),
        Some(Subcommands::Diff(args)) => views::run_diff(args),
        Some(Subcommands::Report(args)) => views::run_report(args),
        Some(Subcommands::Top(args)) => top::run(args),
        Some(Subcommands::Stat(args)) => stat::run(args),
        Some(Subcommands::Trace(args)) => trace::run(args),
        Some(Subcommands::Latency(args)) => latency::run(args),
        Some(Subcommands::Record(args)) => record::run(args),
        Some(Subcommands::Script(args)) => record::script(args),
        Some(Subcommands::Sched(args)) => timeline::run(args),
        Some(Subcommands::List(args)) => list::run(args),
        None => match cli.counters.clone() {
            Some(path) => session::topdown_from_counters(&cli, &path),
            None => session::run(cli),
        },
    }
}
