//! Shell completions and man pages, generated from bpfprof's own command line by
//! `cargo xtask docs`. An example rather than a subcommand: neither generator is in the binary.
use std::{io, path::PathBuf};

use clap::CommandFactory as _;
use clap_complete::Shell;
use profiler::cli::Cli;

fn main() -> io::Result<()> {
    let Some(out) = std::env::args_os().nth(1).map(PathBuf::from) else {
        eprintln!("usage: shell-docs OUT_DIR (writes OUT_DIR/completions and OUT_DIR/man)");
        std::process::exit(2);
    };
    // clap's `help` subcommand would get pages of its own (bpfprof-help-agent.1 ...).
    let mut command = Cli::command().disable_help_subcommand(true);
    // The generators read what clap fills in when it parses (version, help flags of subcommands).
    command.build();
    let completions = out.join("completions");
    let man = out.join("man");
    std::fs::create_dir_all(&completions)?;
    std::fs::create_dir_all(&man)?;
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        let path = clap_complete::generate_to(shell, &mut command, "bpfprof", &completions)?;
        println!("{}", path.display());
    }
    // bpfprof.1, and bpfprof-agent.1 etc. for each subcommand.
    clap_mangen::generate_to(command, &man)?;
    for entry in std::fs::read_dir(&man)? {
        println!("{}", entry?.path().display());
    }
    Ok(())
}
