//! `cargo xtask docs`: shell completions (bash, zsh, fish) and man pages, generated from
//! bpfprof's own command line by `profiler/examples/shell-docs.rs` (so neither generator is in the
//! binary), then checked: bash loads the completion, groff renders every page without a warning,
//! and each page and completion knows what the command line has. `cargo xtask test` runs it.
use std::{path::PathBuf, process::Command};

use anyhow::{bail, ensure, Context as _, Result};

use crate::{cargo, setup::output, sh, workspace_root};

/// Where they are written.
pub fn out_dir() -> PathBuf {
    workspace_root().join("target/docs")
}

/// The subcommands each of which gets its own page (`bpfprof-agent.1`) and completion.
const SUBCOMMANDS: &[&str] = &[
    "agent", "diff", "latency", "list", "record", "report", "script", "stat", "top", "trace",
];

/// Generate, check, and say where they are.
pub fn run() -> Result<()> {
    let out = out_dir();
    let _ = std::fs::remove_dir_all(&out);
    sh(cargo()
        .args([
            "run",
            "--quiet",
            "--release",
            "-p",
            "profiler",
            "--example",
            "shell-docs",
            "--",
        ])
        .arg(&out))?;
    check(&out)?;
    println!(
        "xtask docs: completions in {0}/completions (bash: source bpfprof.bash; zsh: _bpfprof on \
         $fpath; fish: bpfprof.fish in ~/.config/fish/completions), man pages in {0}/man \
         (man -l {0}/man/bpfprof.1)",
        out.display()
    );
    Ok(())
}

fn check(out: &std::path::Path) -> Result<()> {
    let completions = out.join("completions");
    let bash = completions.join("bpfprof.bash");
    let loaded = output(
        Command::new("bash")
            .arg("-c")
            .arg(format!("source '{}' && complete -p bpfprof", bash.display())),
    )
    .context("bash could not load the completion")?;
    ensure!(
        loaded.contains("_bpfprof"),
        "bash: no completion for bpfprof: {loaded}"
    );
    for file in ["bpfprof.bash", "_bpfprof", "bpfprof.fish"] {
        let text = std::fs::read_to_string(completions.join(file)).with_context(|| file.to_string())?;
        for word in SUBCOMMANDS
            .iter()
            .chain(&["--mode", "--signals", "hotspot", "topdown"])
        {
            let word = word.trim_start_matches('-');
            ensure!(text.contains(word), "{file} does not complete `{word}`");
        }
    }
    let pages =
        std::iter::once("bpfprof".to_string()).chain(SUBCOMMANDS.iter().map(|s| format!("bpfprof-{s}")));
    for page in pages {
        let path = out.join("man").join(format!("{page}.1"));
        // -k: the pages are UTF-8 (help text has `…`), read through preconv as man(1) does.
        let rendered = Command::new("groff")
            .args(["-k", "-man", "-Tutf8", "-ww", "-P-cbou"])
            .arg(&path)
            .output()
            .context("running groff (apt-get install groff-base)")?;
        let warnings = String::from_utf8_lossy(&rendered.stderr);
        if !rendered.status.success() || !warnings.trim().is_empty() {
            bail!("{}: groff: {warnings}", path.display());
        }
        let text = String::from_utf8_lossy(&rendered.stdout);
        ensure!(
            text.contains("SYNOPSIS") && text.contains("OPTIONS"),
            "{}: no synopsis or options",
            path.display()
        );
    }
    Ok(())
}
