//! `cargo xtask fuzz [TARGET...] [--seconds N]`: the libFuzzer targets of `profiler/fuzz` (one per
//! parser bpfprof drives with bytes it does not trust, `profiler::fuzz`), built by cargo-fuzz on
//! the nightly toolchain with AddressSanitizer, each run for N seconds from a corpus seeded with
//! real files: the machine's binaries and kernel files, and the profiles and maps kept under
//! `profiler/fuzz/seeds/TARGET/`, and every input that once failed the target
//! (`profiler/fuzz/regressions/TARGET/`). The corpus grows across runs (`target/fuzz/corpus/TARGET`).
//! An input that panics, overflows, leaks, runs past 30 s or asks for more than 1280 MB at once
//! is saved under `target/fuzz/artifacts/TARGET/` and fails the run: keep it under
//! `profiler/fuzz/regressions/TARGET/` with its fix (a unit test replays them).
//!
//! `cargo xtask test` runs every target for `SMOKE_SECONDS`, built unoptimized (`Build::Smoke`).
use std::{path::PathBuf, process::Command, time::Instant};

use anyhow::{bail, Context as _, Result};

use crate::{sh, tally::Outcome, workspace_root};

/// Each target's share of `cargo xtask test`.
pub const SMOKE_SECONDS: u32 = 10;

const FUZZ_DIR: &str = "profiler/fuzz";

/// The targets, as `profiler/fuzz/fuzz_targets/` has them (a unit test of `profiler` checks that
/// they are `profiler::fuzz::TARGETS`).
pub fn targets() -> Result<Vec<String>> {
    crate::rust_files(&workspace_root().join(FUZZ_DIR).join("fuzz_targets"))
}

/// Run `chosen` (every target when empty) for `seconds` each; fails naming the targets that
/// found something.
pub fn run(chosen: &[String], seconds: u32) -> Result<()> {
    let outcome = fuzz(chosen, seconds, Build::Optimized, Instant::now())?;
    if outcome.failed > 0 {
        bail!("{}", outcome.failures.join("; "));
    }
    Ok(())
}

/// Every target for `SMOKE_SECONDS`, as one line of `cargo xtask test`'s summary.
pub fn smoke() -> Outcome {
    let started = Instant::now();
    fuzz(&[], SMOKE_SECONDS, Build::Smoke, started)
        .unwrap_or_else(|e| Outcome::of_task("fuzz", Err(e), started))
}

fn fuzz(chosen: &[String], seconds: u32, build: Build, started: Instant) -> Result<Outcome> {
    let all = targets()?;
    if let Some(unknown) = chosen.iter().find(|c| !all.contains(c)) {
        bail!("no fuzz target `{unknown}`; there are: {}", all.join(", "));
    }
    let chosen = if chosen.is_empty() { all } else { chosen.to_vec() };
    sh(&mut cargo_fuzz("build", build))?;
    let mut failures = Vec::new();
    for target in &chosen {
        let corpus = corpus(target)?;
        let artifacts = workspace_root().join("target/fuzz/artifacts").join(target);
        std::fs::create_dir_all(&artifacts)?;
        // libFuzzer's own lines (thousands) go to a log; what it found is said here.
        let log_path = workspace_root()
            .join("target/fuzz/logs")
            .join(format!("{target}.log"));
        std::fs::create_dir_all(log_path.parent().unwrap())?;
        let log = std::fs::File::create(&log_path)?;
        let status = cargo_fuzz("run", build)
            .arg(target)
            .arg(&corpus)
            .arg("--")
            .arg(format!("-max_total_time={seconds}"))
            .arg(format!("-artifact_prefix={}/", artifacts.display()))
            .arg(format!("-max_len={}", max_len(target)))
            .args(LIMITS)
            .arg(build.timeout())
            .stdout(log.try_clone()?)
            .stderr(log)
            .status()
            .with_context(|| format!("starting the fuzz target {target}"))?;
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        let runs = log
            .lines()
            .find_map(|l| l.strip_prefix("stat::number_of_executed_units: "))
            .unwrap_or("?");
        if status.success() {
            eprintln!("xtask fuzz: {target}: clean for {seconds} s, {runs} inputs");
            continue;
        }
        let tail: Vec<&str> = log.lines().rev().take(30).collect();
        for line in tail.iter().rev() {
            eprintln!("  {line}");
        }
        failures.push(format!(
            "{target}: an input failed it (in {}; the log: {})",
            artifacts.display(),
            log_path.display()
        ));
    }
    Ok(Outcome {
        suite: "fuzz".into(),
        passed: (chosen.len() - failures.len()) as u32,
        failed: failures.len() as u32,
        failures,
        took: started.elapsed(),
        ..Default::default()
    })
}

/// AddressSanitizer: its allocator is what makes `-malloc_limit_mb` catch an allocation sized
/// by the input, before it is touched.
const SANITIZER: [&str; 2] = ["--sanitizer", "address"];

/// How the targets are built: optimized, as cargo-fuzz builds them, to find what inputs can do;
/// unoptimized for the smoke run (with debug assertions and overflow checks all the same), which
/// is about every seed and every input that once failed passing. The optimized build was most
/// of `cargo xtask test`'s fuzz time (9.7 min of 12 on two cores; unoptimized 4.5 min, with
/// 20 to 80 times fewer inputs run in the same seconds).
#[derive(Clone, Copy)]
enum Build {
    Optimized,
    Smoke,
}

/// An allocation past bpfprof's largest named bound (a decompressed section: 1 GiB) is a
/// finding; an input running 30 s (on a machine that may be busy) is one too, or 300 s in the
/// unoptimized build (up to 80 times slower).
const LIMITS: [&str; 3] = [
    "-malloc_limit_mb=1280",
    "-rss_limit_mb=4096",
    "-print_final_stats=1",
];

impl Build {
    fn timeout(self) -> &'static str {
        match self {
            Build::Optimized => "-timeout=30",
            Build::Smoke => "-timeout=300",
        }
    }
}

/// Inputs as long as the seeds that matter: whole ELF files (a Go program is 1.5 MB).
fn max_len(target: &str) -> usize {
    match target {
        "elf" | "unwind_rows" => 4 << 20,
        "gopclntab" => 2 << 20,
        _ => 64 << 10,
    }
}

/// `cargo +nightly fuzz`: rustup's proxy (`+nightly` is its), not the cargo running xtask.
fn cargo_fuzz(subcommand: &str, build: Build) -> Command {
    let mut cmd = Command::new("cargo");
    cmd.current_dir(workspace_root())
        .env_remove("RUSTUP_TOOLCHAIN")
        .args(["+nightly", "fuzz", subcommand, "--fuzz-dir", FUZZ_DIR])
        .args(SANITIZER);
    if let Build::Smoke = build {
        cmd.arg("--dev");
    }
    cmd
}

/// The target's corpus directory, with its seeds written in (again each run: cheap, and a seed
/// added since is taken).
fn corpus(target: &str) -> Result<PathBuf> {
    let dir = workspace_root().join("target/fuzz/corpus").join(target);
    std::fs::create_dir_all(&dir)?;
    // The kept seeds, and the inputs that once failed (run first by libFuzzer, in this build
    // with overflow checks, which the unit test replaying them in a release build lacks).
    let mut seeds: Vec<PathBuf> = ["seeds", "regressions"]
        .iter()
        .flat_map(|kind| std::fs::read_dir(workspace_root().join(FUZZ_DIR).join(kind).join(target)))
        .flatten()
        .filter_map(|e| Some(e.ok()?.path()))
        .collect();
    seeds.extend(machine_seeds(target));
    for (n, seed) in seeds.iter().enumerate() {
        let name = format!(
            "seed-{n}-{}",
            seed.file_name().unwrap_or_default().to_string_lossy()
        );
        // Read and written, not copied: procfs and sysfs files give no size to copy by. A
        // machine without one of them (another distribution, a container) seeds with the rest.
        match std::fs::read(seed) {
            Ok(bytes) => std::fs::write(dir.join(name), bytes)?,
            Err(e) => eprintln!("xtask fuzz: {target}: no seed from {}: {e}", seed.display()),
        }
    }
    if target == "gopclntab" {
        if let Err(e) = write_go_table(&dir) {
            eprintln!("xtask fuzz: gopclntab: no seed from {GO_PROGRAM}: {e:#}");
        }
    }
    Ok(dir)
}

/// Real files of this machine each target reads in bpfprof's use: small ones, so that an input
/// runs in milliseconds.
fn machine_seeds(target: &str) -> Vec<PathBuf> {
    let paths: &[&str] = match target {
        // An executable and a library of each architecture bpfprof walks (the arm64 ones from
        // the cross toolchain setup installs), and a Go program (Debian's Go tools are).
        "unwind_rows" | "elf" | "symbolize" | "annotate" => &[
            "/usr/bin/true",
            "/usr/lib/x86_64-linux-gnu/libz.so.1",
            "/usr/lib/x86_64-linux-gnu/libpthread.so.0",
            "/usr/aarch64-linux-gnu/lib/ld-linux-aarch64.so.1",
            "/usr/aarch64-linux-gnu/lib/libpthread.so.0",
            GO_PROGRAM,
        ],
        "tracefs_format" => &[
            "/sys/kernel/tracing/events/syscalls/sys_enter_write/format",
            "/sys/kernel/tracing/events/sched/sched_switch/format",
            "/sys/kernel/tracing/events/block/block_rq_issue/format",
        ],
        "maps" => &["/proc/self/maps"],
        _ => &[],
    };
    paths.iter().map(PathBuf::from).collect()
}

/// The smallest of Debian's Go tools (setup installs golang-go).
const GO_PROGRAM: &str = "/usr/lib/go/pkg/tool/linux_amd64/pack";

/// The target's input: an architecture byte (0: x86-64), then the table (the program's text at
/// Go's usual 0x401000, as the target assumes).
fn write_go_table(dir: &std::path::Path) -> Result<()> {
    let table = dir.join("go-table.tmp");
    sh(Command::new("objcopy")
        .args(["-O", "binary", "--only-section=.gopclntab", GO_PROGRAM])
        .arg(&table))?;
    let mut seed = vec![0u8];
    seed.extend(std::fs::read(&table)?);
    std::fs::remove_file(&table)?;
    std::fs::write(dir.join("seed-go-pack"), seed)?;
    Ok(())
}
