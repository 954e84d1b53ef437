//! Project tasks: the only place that knows about toolchains, system packages and privileges.
//!
//!   cargo xtask setup            install what the build and tests need (idempotent, fast when done)
//!   cargo xtask build            release binary at target/release/bpfprof
//!                                [--target aarch64: target/aarch64-unknown-linux-gnu/release/bpfprof]
//!   cargo xtask run -- ARGS      build, then run bpfprof ARGS (as root)
//!   cargo xtask test             unit tests, privileged end-to-end tests, the arm64 suites in the
//!                                emulated Neoverse N1, then a short soak [--repeat N] [--noise] [FILTER]
//!   cargo xtask guest [FILTER]   only the arm64 suites, in the emulated Neoverse N1 (QEMU)
//!   cargo xtask bench [MODE]     overhead benchmarks (hotspot, sched, unwind, lock, agent, agent-churn, trace, record, python)
//!   cargo xtask soak --minutes N the agent under process churn: memory and descriptors stay flat
//!                                [--signals all: every signal on]
//!   cargo xtask fuzz [TARGET...] the parsers' fuzz targets [--seconds N each, default 60]
//!   cargo xtask docs             shell completions and man pages, in target/docs
//!   cargo xtask noise            a busy machine (CPU hogs, short-lived processes) until Ctrl-C
use std::{
    path::{Path, PathBuf},
    process::{exit, Command},
};

use anyhow::{bail, Context as _, Result};
use clap::{Parser, Subcommand};

mod bench;
mod docs;
mod fuzz;
mod guest;
mod noise;
mod setup;
mod soak;
#[cfg(test)]
mod structure;
mod tally;
mod test;

#[derive(Parser)]
#[command(about = "bpfprof project tasks")]
struct Args {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install the nightly rust-src, bpf-linker, test tools; mount tracefs.
    Setup,
    /// Build the release binary (target/release/bpfprof).
    Build {
        /// Also build target/release/bpfprof-https: the agent's pushes and exports to https://
        /// URLs (rustls; +1.5 MB, so not in the default build).
        #[arg(long)]
        https: bool,
        /// Build for another machine: `aarch64` (Graviton, Neoverse) cross-builds bpfprof and its
        /// BPF object for arm64 into target/aarch64-unknown-linux-gnu/release/bpfprof.
        #[arg(long, value_enum)]
        target: Option<CrossTarget>,
    },
    /// Build and run bpfprof with the given arguments.
    Run {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Run every test: unit tests, the privileged end-to-end tests, and a 3-minute soak.
    /// Every suite runs even when one fails; a summary line per suite ends the run.
    Test {
        /// Run everything this many times, back to back.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
        repeat: u32,
        /// Keep the machine busy meanwhile (see `cargo xtask noise`).
        #[arg(long)]
        noise: bool,
        /// Extra arguments for the test harness (e.g. a test name filter; the soak is then left out).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Only the arm64 suites, in the emulated Neoverse (`test` runs them after the host's).
    Guest {
        /// Extra arguments for the test harness (a test name filter).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Measure overhead against the workload alone and against perf.
    Bench {
        #[arg(default_value = "hotspot")]
        mode: String,
    },
    /// The floor of a tracing bench: an empty program on each raw tracepoint named, held until
    /// interrupted (run by `bench`).
    #[command(hide = true)]
    BenchFloor { tracepoints: Vec<String> },
    /// Leave the agent running under process churn; its memory and descriptors must stay flat.
    Soak {
        #[arg(long, default_value_t = 60.0)]
        minutes: f64,
        /// The agent's --signals (e.g. `all`).
        #[arg(long, default_value = "cpu")]
        signals: String,
    },
    /// Run the fuzz targets of profiler/fuzz (every one, or those named) for N seconds each.
    Fuzz {
        /// Targets (profiler/fuzz/fuzz_targets); all when none is named.
        targets: Vec<String>,
        #[arg(long, default_value_t = 60)]
        seconds: u32,
    },
    /// Generate shell completions (bash, zsh, fish) and man pages into target/docs, and check them.
    Docs,
    /// Load the machine as a busy host would: a CPU hog on every CPU and a stream of
    /// short-lived processes, until stopped.
    Noise {
        /// Stop after this many seconds.
        #[arg(long)]
        seconds: Option<f64>,
    },
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum CrossTarget {
    Aarch64,
}

fn main() {
    let args = Args::parse();
    let result = match args.task {
        Task::Setup => setup::run(setup::Needs::Test),
        Task::Build { target: None, https } => setup::run(setup::Needs::Build)
            .and_then(|()| match https {
                true => build_https(),
                false => Ok(()),
            })
            .and_then(|()| build()),
        Task::Build {
            target: Some(CrossTarget::Aarch64),
            ..
        } => setup::run(setup::Needs::Build)
            .and_then(|()| setup::ensure_arm64_cross())
            .and_then(|()| build_arm64()),
        Task::Run { args } => setup::run(setup::Needs::Build)
            .and_then(|()| build())
            .and_then(|()| run_bpfprof(&args)),
        Task::Test { repeat, noise, args } => setup::run(setup::Needs::Test).and_then(|()| {
            test::run(&test::Options {
                repeat,
                noise,
                filter: args,
            })
        }),
        Task::Guest { args } => setup::run(setup::Needs::Test).and_then(|()| test::run_guest(&args)),
        Task::Bench { mode } => setup::run(setup::Needs::Test)
            .and_then(|()| build())
            .and_then(|()| bench::run(&mode)),
        Task::BenchFloor { tracepoints } => bench::floor::hold(&tracepoints),
        Task::Soak { minutes, signals } => setup::run(setup::Needs::Build)
            .and_then(|()| build())
            .and_then(|()| soak::run(minutes, &signals)),
        Task::Fuzz { targets, seconds } => {
            setup::run(setup::Needs::Fuzz).and_then(|()| fuzz::run(&targets, seconds))
        }
        Task::Docs => setup::run(setup::Needs::Build).and_then(|()| docs::run()),
        Task::Noise { seconds } => noise::run(seconds),
    };
    if let Err(err) = result {
        eprintln!("xtask: {err:#}");
        exit(1);
    }
}

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The names of the `.rs` files in `dir` (without the extension), in name order.
pub fn rust_files(dir: &Path) -> Result<Vec<String>> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .with_context(|| format!("listing {}", dir.display()))?
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str()?.strip_suffix(".rs").map(str::to_string))
        .collect();
    names.sort();
    Ok(names)
}

pub fn bpfprof_bin() -> PathBuf {
    workspace_root().join("target/release/bpfprof")
}

/// A C workload of `tests/workloads`, built for the benches and the soak into `target/bench`.
pub(crate) fn build_workload(name: &str) -> Result<PathBuf> {
    let dir = workspace_root().join("target/bench");
    std::fs::create_dir_all(&dir)?;
    let bin = dir.join(name);
    sh(Command::new("cc")
        .args(["-O2", "-g", "-pthread", "-fno-omit-frame-pointer", "-o"])
        .arg(&bin)
        .arg(workspace_root().join(format!("tests/workloads/{name}.c"))))?;
    Ok(bin)
}

/// The same binary built with the `https` feature (the agent's https pushes), beside it.
pub fn bpfprof_https_bin() -> PathBuf {
    workspace_root().join("target/release/bpfprof-https")
}

/// Build bpfprof with the `https` feature as `bpfprof-https`. Its own features give it its own
/// artifacts, so building it beside the default binary costs nothing once both are built; the
/// default build runs last, so `target/release/bpfprof` stays the default binary.
pub fn build_https() -> Result<()> {
    sh(cargo().args(["build", "--release", "-p", "profiler", "--features", "https"]))?;
    std::fs::copy(bpfprof_bin(), bpfprof_https_bin()).context("copying the https build")?;
    Ok(())
}

/// Run a command, failing with its description if it does not succeed.
pub fn sh(cmd: &mut Command) -> Result<()> {
    let status = cmd.status().with_context(|| format!("starting {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed ({status})");
    }
    Ok(())
}

pub fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(workspace_root());
    cmd
}

fn build() -> Result<()> {
    sh(cargo().args(["build", "--release", "-p", "profiler"]))
}

pub const ARM64_TRIPLE: &str = "aarch64-unknown-linux-gnu";
/// Debian's cross compiler, which links arm64 binaries; cargo is told through this variable.
pub const ARM64_GCC: &str = "aarch64-linux-gnu-gcc";
pub const ARM64_LINKER_ENV: &str = "CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER";

/// bpfprof for arm64: the user side cross-compiled and linked with Debian's cross gcc; aya-build
/// builds the embedded BPF object for the target's architecture (its `pt_regs`, its registers).
pub fn build_arm64() -> Result<()> {
    sh(cargo()
        .args(["build", "--release", "-p", "profiler", "--target", ARM64_TRIPLE])
        .env(ARM64_LINKER_ENV, ARM64_GCC))?;
    eprintln!(
        "xtask build: {}",
        workspace_root()
            .join("target")
            .join(ARM64_TRIPLE)
            .join("release/bpfprof")
            .display()
    );
    Ok(())
}

/// BPF needs root; re-run through sudo when we are not.
fn privileged(program: &Path) -> Command {
    if is_root() {
        Command::new(program)
    } else {
        let mut cmd = Command::new("sudo");
        cmd.arg("--preserve-env=PATH,RUST_LOG").arg(program);
        cmd
    }
}

pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("Uid:")
                    .map(|r| r.split_whitespace().nth(1) == Some("0"))
            })
        })
        .unwrap_or(false)
}

fn run_bpfprof(args: &[String]) -> Result<()> {
    let status = privileged(&bpfprof_bin())
        .args(args)
        .status()
        .context("starting bpfprof")?;
    exit(status.code().unwrap_or(1));
}
