use super::*;
use clap::CommandFactory;

#[test]
fn command_line_definition_is_valid() {
    Cli::command().debug_assert();
}

/// Every help text, short and long, of the command and each subcommand, wrapped to 100
/// columns (what clap wraps to when the terminal's width is unknown); the long one ends with
/// the exit codes, and every subcommand knows the version.
#[test]
fn help_fits_100_columns_with_examples_and_exit_codes() {
    let mut top = Cli::command();
    let long = top.render_long_help().to_string();
    assert!(long.contains("Exit status:") && long.contains("128+N"), "{long}");
    let mut helps = vec![long, top.render_help().to_string()];
    // clap's own `help` subcommand aside.
    for sub in top.get_subcommands_mut().filter(|s| s.get_name() != "help") {
        let name = sub.get_name().to_string();
        let help = sub.render_long_help().to_string();
        assert!(
            help.contains("Examples:"),
            "bpfprof {name} --help has no examples"
        );
        assert!(sub.get_version().is_some(), "bpfprof {name} --version");
        helps.push(help);
        helps.push(sub.render_help().to_string());
    }
    for help in &helps {
        for line in help.lines() {
            assert!(
                line.chars().count() <= 100,
                "{} columns: {line}",
                line.chars().count()
            );
        }
    }
}

#[test]
fn signals_are_named_spelt_otherwise_or_all() {
    let only = |names: &[&str]| {
        names
            .iter()
            .map(|n| Signal::parse(n).unwrap())
            .collect::<Vec<_>>()
    };
    let parsed = parse_signals("cpu, mutex,run-queue").unwrap();
    assert_eq!(parsed.names(), ["cpu", "runqueue", "lock"]);
    assert_eq!(
        parse_signals("all").unwrap().names(),
        ["cpu", "offcpu", "runqueue", "lock"]
    );
    assert_eq!(only(&["off-cpu", "locks"]), [Signal::OffCpu, Signal::Lock]);
    let refused = parse_signals("cpu,disk").unwrap_err();
    assert!(
        refused.contains("`disk`") && refused.contains("cpu, offcpu, runqueue, lock, counters"),
        "{refused}"
    );
    for signal in Signal::ALL {
        assert_eq!(Signal::parse(signal.name()), Some(signal));
    }
}

#[test]
fn format_follows_output_extension_unless_given() {
    let format = |args: &[&str]| {
        let mut argv = vec!["bpfprof"];
        argv.extend_from_slice(args);
        Cli::parse_from(argv).resolved_format()
    };
    assert_eq!(format(&["-o", "out.pb.gz"]).unwrap(), Format::Pprof);
    assert_eq!(format(&["-o", "Flame.SVG"]).unwrap(), Format::Svg);
    assert_eq!(format(&["-o", "w.heatmap.svg"]).unwrap(), Format::Heatmap);
    assert_eq!(
        format(&["-o", "x.svg", "--format", "json"]).unwrap(),
        Format::Json
    );
    assert_eq!(format(&["-o", "report.txt"]).unwrap(), Format::Text);
    // A name without an extension is text; so is standard output.
    assert_eq!(format(&["-o", "report"]).unwrap(), Format::Text);
    assert_eq!(format(&["-o", "./.hidden"]).unwrap(), Format::Text);
    assert_eq!(format(&[]).unwrap(), Format::Text);
}

#[test]
fn an_output_extension_no_format_has_is_refused_listing_those_that_exist() {
    for (name, ext) in [
        ("x.pb", ".pb"),
        ("x.folded.gz", ".gz"),
        ("/tmp/a.b/r.html", ".html"),
    ] {
        let err = Cli::parse_from(["bpfprof", "-o", name])
            .resolved_format()
            .unwrap_err();
        assert_eq!(err.exit_code(), crate::error::exit::USAGE, "{name}");
        let line = err.to_string();
        assert!(line.contains(&format!("`{ext}`")), "{line}");
        for known in [
            ".txt",
            ".json",
            ".folded",
            ".svg",
            ".heatmap.svg",
            ".pb.gz",
            ".pprof",
        ] {
            assert!(line.contains(known), "{known} not listed: {line}");
        }
        assert!(!line.contains('\n'), "one line: {line}");
    }
    // --format says what to write: any name then goes.
    let cli = Cli::parse_from(["bpfprof", "-o", "x.pb", "--format", "pprof"]);
    assert_eq!(cli.resolved_format().unwrap(), Format::Pprof);
    // diff and report read -o the same way.
    let cli = Cli::parse_from(["bpfprof", "diff", "a.json", "b.json", "-o", "d.png"]);
    let Some(Subcommands::Diff(diff)) = cli.subcommand else {
        panic!("not diff");
    };
    assert!(format_for(diff.format, diff.output.as_deref()).is_err());
    let cli = Cli::parse_from(["bpfprof", "report", "a.json", "-o", "r.pb"]);
    let Some(Subcommands::Report(report)) = cli.subcommand else {
        panic!("not report");
    };
    assert!(format_for(report.format, report.output.as_deref()).is_err());
}

#[test]
fn pids_command_and_mode_parse() {
    let cli = Cli::parse_from(["bpfprof", "-p", "1,2,3", "--mode", "topdown", "-d", "2.5"]);
    assert_eq!(cli.pids, vec![1, 2, 3]);
    assert_eq!(cli.mode, Mode::Topdown);
    assert_eq!(cli.duration, Some(2.5));
    let cli = Cli::parse_from(["bpfprof", "-F", "999", "--", "ls", "-l"]);
    assert_eq!(cli.command, vec![OsString::from("ls"), OsString::from("-l")]);
    assert!(Cli::try_parse_from(["bpfprof", "-p", "1", "--", "ls"]).is_err());
    assert!(Cli::try_parse_from(["bpfprof", "-p", "1", "-a"]).is_err());
    assert!(Cli::try_parse_from(["bpfprof", "-d", "0"]).is_err());
    assert!(Cli::try_parse_from(["bpfprof", "-d", "-3"]).is_err());
}

#[test]
fn agent_subcommand_parses_and_keeps_its_own_flags() {
    let cli = Cli::parse_from([
        "bpfprof",
        "agent",
        "--window",
        "5",
        "--max-bytes",
        "10M",
        "-F",
        "99",
    ]);
    let Some(Subcommands::Agent(agent)) = cli.subcommand else {
        panic!("not the agent");
    };
    assert_eq!(agent.window, 5.0);
    assert_eq!(agent.max_bytes, 10 << 20);
    assert_eq!(agent.frequency, 99);
    assert_eq!(agent.listen, "127.0.0.1:7071");
    assert!(Cli::try_parse_from(["bpfprof", "-p", "1", "agent"]).is_err());
    assert!(Cli::try_parse_from(["bpfprof", "agent", "--mode", "lock"]).is_err());
    assert_eq!(parse_bytes("4096"), Ok(4096));
    assert_eq!(parse_bytes("2G"), Ok(2 << 30));
    assert_eq!(parse_bytes("64KiB"), Ok(64 << 10));
    assert!(parse_bytes("0").is_err() && parse_bytes("lots").is_err());
}

#[test]
fn view_subcommands_parse() {
    let cli = Cli::parse_from([
        "bpfprof", "diff", "a.json", "b.pb.gz", "-o", "d.svg", "--widths", "before",
    ]);
    let Some(Subcommands::Diff(diff)) = cli.subcommand else {
        panic!("not diff");
    };
    assert_eq!(
        format_for(diff.format, diff.output.as_deref()).unwrap(),
        Format::Svg
    );
    assert_eq!(diff.widths, Widths::Before);
    assert!(Cli::try_parse_from(["bpfprof", "diff", "only-one.json"]).is_err());
    let cli = Cli::parse_from(["bpfprof", "top", "--mode", "lock", "-p", "7"]);
    let Some(Subcommands::Top(top)) = cli.subcommand else {
        panic!("not top");
    };
    assert_eq!(
        (top.mode.mode(), top.pids.as_slice(), top.window),
        (Mode::Lock, &[7][..], 5)
    );
    assert!(Cli::try_parse_from(["bpfprof", "top", "--mode", "topdown"]).is_err());
    let cli = Cli::parse_from(["bpfprof", "report", "p.json", "--annotate", "hot"]);
    assert!(matches!(cli.subcommand, Some(Subcommands::Report(r)) if r.annotate.as_deref() == Some("hot")));
    let cli = Cli::parse_from(["bpfprof", "--annotate", "hot", "--", "./w"]);
    assert_eq!(cli.annotate.as_deref(), Some("hot"));
}

#[test]
fn debug_dirs_are_given_to_every_command_that_names_and_are_checked() {
    let dirs = |names: &NamesArgs| names.debug_dirs.clone();
    let two = ["--debug-dir", "/tmp", "--debug-dir", "/"];
    let run = Cli::parse_from(["bpfprof"].into_iter().chain(two).chain(["--", "true"]));
    assert_eq!(dirs(&run.names), [PathBuf::from("/tmp"), PathBuf::from("/")]);
    assert_eq!(run.names.checked_dirs().unwrap().len(), 2);
    for sub in [&["top"][..], &["report", "p.json"], &["agent"]] {
        let cli = Cli::parse_from(["bpfprof"].iter().chain(sub).chain(&two[..2]));
        let names = match cli.subcommand {
            Some(Subcommands::Top(a)) => a.names,
            Some(Subcommands::Report(a)) => a.names,
            Some(Subcommands::Agent(a)) => a.names,
            other => panic!("{other:?}"),
        };
        assert_eq!(dirs(&names), [PathBuf::from("/tmp")], "{sub:?}");
    }
    let missing = Cli::parse_from(["bpfprof", "--debug-dir", "/nonexistent/debug", "--", "true"]);
    let err = missing.names.checked_dirs().unwrap_err().to_string();
    assert!(
        err.contains("--debug-dir /nonexistent/debug: not a directory"),
        "{err}"
    );
}
