//! One run, from its command line to its report: check → start (load and attach, `start`) →
//! release the command → collect until a stop condition → final drains → detach → symbolize →
//! render. `top` collects the same way, drawing each drain instead of reporting.
use std::{collections::HashSet, path::Path, time::Duration};

use anyhow::Context as _;
use tokio::time::Instant;

use crate::{
    cli::{Cli, Format, Mode},
    collect::{add_batch, monotonic_ns},
    counters::language::Event,
    driver::{pidfd, prepare_to_load, Drained, Sink, Stop, Stopped, Stops},
    error::UserError,
    launcher::{self, RunningCommand},
    model::RunMeta,
    modes::{
        hotspot,
        lock::{self, LockCollection},
        sched::{self, SchedCollection},
        topdown,
    },
    output,
    plan::Plan,
    preflight,
    process::Processes,
    profile::{Health, RawProfile},
    report,
    sources::samples::Rate,
    sources::{counting::TopdownCounting, locks::Reading, Batch},
    start::{start, Started, Targets},
    status::StatusLine,
    symbolize::{
        debuginfod::{Debuginfod, Stats},
        DebugLocator, Symbolizer, Symbols,
    },
};

/// `--mode topdown --counters FILE`: the analysis of counts taken elsewhere. No BPF, no root.
pub fn topdown_from_counters(cli: &Cli, path: &Path) -> anyhow::Result<i32> {
    if cli.mode != Mode::Topdown {
        return Err(UserError::Usage("--counters goes with --mode topdown".into()).into());
    }
    let format = cli.resolved_format()?;
    if !matches!(format, Format::Text | Format::Json) {
        return Err(UserError::FormatUnavailable {
            format: format.name(),
            mode: "topdown",
        }
        .into());
    }
    if let Some(output) = &cli.output {
        output::check_writable(output)?;
    }
    let fail = |reason: String| UserError::Counters {
        path: path.to_path_buf(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| fail(e.to_string()))?;
    let counts = crate::counters::perf_csv::parse_perf_csv(&text).map_err(|e| fail(e.to_string()))?;
    let tma = crate::counters::tma::analyze(&counts, crate::counters::tma::Machine::with_slots(cli.slots))
        .map_err(|e| fail(e.to_string()))?;
    let meta = RunMeta {
        mode: "topdown",
        event: "counters".to_string(),
        frequency_hz: 0,
        period: None,
        duration_s: 0.0,
        target: format!("counters from {}", path.display()),
        cpus: 0,
        notes: counts
            .not_counted
            .iter()
            .map(|e| format!("{e}: not counted by perf"))
            .collect(),
        counters: Vec::new(),
        weight: None,
    };
    let report = topdown::from_counters(meta, tma);
    let renderer = report::renderer(format);
    output::write_report(cli.output.as_deref(), &|out| renderer.topdown(&report, out))?;
    Ok(0)
}

/// One run (`bpfprof [--mode …] [-p …] [-- command]`): load, collect, report. The result is the
/// process exit code (the command's own, when there is one).
pub fn run(cli: Cli) -> anyhow::Result<i32> {
    let plan = Plan::from_cli(cli)?;
    preflight::check_privileges()?;
    // Started before the run, so a cache it cannot use is said before anything is recorded.
    let debuginfod = Debuginfod::shared(plan.debuginfod.as_ref())?;
    let (tracefs, runtime) = prepare_to_load()?;
    let mut sink = RunSink::default();
    let recording = runtime.block_on(record(
        &plan,
        Reading::AtEnd,
        tracefs,
        &mut sink,
        Feedback::StatusLine,
    ))?;
    // Collection is over and everything is detached: a further Ctrl-C should end bpfprof at once
    // rather than be swallowed by the event loop's handler.
    // SAFETY: restoring the default disposition of a signal.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_DFL);
        libc::signal(libc::SIGTERM, libc::SIG_DFL);
    }
    let naming = Naming {
        symbolizer: Symbolizer::new(DebugLocator::new(
            plan.debug_dirs.clone(),
            debuginfod.clone().map(|d| d as _),
        )),
        debuginfod,
    };
    let exit_code = recording.exit_code;
    let written = match plan.events.len() {
        1 => vec![(plan.output.clone(), report_run(&plan, &naming, recording, sink)?)],
        _ => report_each_event(&plan, &naming, recording, sink)?,
    };
    for (path, described) in written {
        if let Some(path) = path {
            eprintln!("bpfprof: wrote {} ({described})", path.display());
        }
    }
    Ok(exit_code)
}

/// A hotspot run of several events: one report per event, each in a file of its own (named by
/// `hotspot::event_path`) or in turn on standard output. Each is symbolized on its own (the
/// long-lived symbolizer answers the second from its cache), so its notes count its own frames.
fn report_each_event(
    plan: &Plan,
    naming: &Naming,
    recording: Recording,
    mut sink: RunSink,
) -> anyhow::Result<Vec<(Option<std::path::PathBuf>, String)>> {
    let Recording {
        stopped: Stopped { health, procs, .. },
        meta,
        ..
    } = recording;
    let profile = sink.profile(&health);
    let renderer = report::renderer(plan.format);
    let mut written = Vec::new();
    let mut notes = meta.notes.clone();
    notes.push(format!(
        "one report per event of {} sampled together: the health figures (samples lost, stacks, warnings) are the whole run's",
        Event::spelled_list(&plan.events, ",")
    ));
    for (index, event) in plan.events.iter().enumerate() {
        let meta = RunMeta {
            event: event.spelled(),
            notes: notes.clone(),
            ..meta.clone()
        };
        let report = symbolized(naming, meta, &hotspot::of_event(&profile, index as u16), &procs);
        let path = (plan.output.as_deref()).map(|p| hotspot::event_path(p, &event.spelled()));
        output::write_report(path.as_deref(), &|out| {
            if index > 0 && path.is_none() {
                writeln!(out)?;
            }
            renderer.hotspot(&report, out)
        })?;
        written.push((path, format!("{}: {} samples", event.spelled(), report.samples)));
    }
    Ok(written)
}

/// The run's report, in its mode, written where the plan says; what it holds, in a few words.
fn report_run(
    plan: &Plan,
    naming: &Naming,
    recording: Recording,
    mut sink: RunSink,
) -> anyhow::Result<String> {
    let renderer = report::renderer(plan.format);
    let write = |render: &dyn Fn(&mut dyn std::io::Write) -> std::io::Result<()>| {
        output::write_report(plan.output.as_deref(), render)
    };
    let Recording {
        stopped: Stopped { health, procs, .. },
        meta,
        sampled,
        ..
    } = recording;
    let stacks = sampled.then(|| sink.profile(&health));
    match plan.mode {
        Mode::Topdown => {
            let counting = sink.counts.context("topdown run without its counting state")?;
            let collection = sink
                .sched
                .context("topdown run without thread states")?
                .finished();
            let mut report =
                topdown::thread_states(meta.clone(), health, &collection, counting.reason.clone());
            if let Some(counts) = &counting.counts {
                report = topdown::with_counts(report, &counting.set, counts, counting.machine);
            }
            if let Some(profile) = stacks {
                let sampled = symbolized(naming, meta, &profile, &procs);
                report = topdown::with_functions(report, &sampled, counting.set.name, counting.machine);
            }
            write(&|out| renderer.topdown(&report, out))?;
            Ok(format!(
                "{} threads, {} functions",
                report.threads.len(),
                report.functions.len()
            ))
        }
        Mode::Lock => {
            let collection = sink.locks.context("lock run without its records")?;
            let symbols = symbolize(naming, &collection.stacks, &procs);
            let report = lock::report(
                meta,
                plan.lock_source,
                plan.waits,
                health,
                &collection,
                &symbols,
                &procs,
            )
            .limit_stacks();
            write(&|out| renderer.lock(&report, out))?;
            let waited_for_events = report.of_class(lock::WaitClass::Waiting).count();
            Ok(format!(
                "{} contended locks, {waited_for_events} waits for events",
                report.locks.len() - waited_for_events
            ))
        }
        Mode::Sched => {
            let collection = sink.sched.context("sched run without its records")?.finished();
            let symbols = symbolize(naming, &collection.offcpu_ns, &procs);
            let report = sched::report(meta, health, &collection, &symbols, plan.slow_threshold_ns);
            write(&|out| renderer.sched(&report, out))?;
            Ok(format!("{} tasks", report.tasks.len()))
        }
        Mode::Stat | Mode::Trace | Mode::Latency | Mode::Record | Mode::SchedRecord => {
            anyhow::bail!("a {} run is reported by `bpfprof {0}`", plan.mode.name())
        }
        Mode::Hotspot => {
            let profile = stacks.context("hotspot run without samples")?;
            let report = symbolized(naming, meta, &profile, &procs);
            match &plan.annotate {
                // Resolved after the run: which functions ran is only known now.
                Some(function) => {
                    let annotation = crate::views::annotate::annotate(&report, function)?;
                    write(&|out| {
                        crate::views::annotate::render(&annotation, crate::views::ANNOTATE_LINES, out)
                    })?;
                }
                None => write(&|out| renderer.hotspot(&report, out))?,
            }
            Ok(match plan.weight {
                None => format!("{} samples", report.samples),
                Some(_) => format!("{} samples, weighing {}", health.samples, report.samples),
            })
        }
    }
}

/// The sampled stacks, symbolized and folded into the hotspot report.
fn symbolized(
    symbolizer: &Naming,
    meta: RunMeta,
    profile: &RawProfile,
    procs: &Processes,
) -> crate::model::StackReport {
    let symbols = symbolize(symbolizer, profile, procs);
    hotspot::report(meta, profile, &symbols)
}

/// Every address of a profile, symbolized, and said on a terminal while it happens: the one wait
/// after a run that can take seconds (large binaries' debug information).
fn symbolize(naming: &Naming, profile: &RawProfile, procs: &Processes) -> Symbols {
    let mut status = StatusLine::on_terminal(None);
    if let Some(status) = &mut status {
        status.show(&format!("symbolizing {} addresses", profile.distinct_addresses()));
    }
    let symbols = naming.symbolize(profile, procs, &mut status);
    drop(status);
    for failure in &symbols.failures {
        log::warn!("symbolization: {failure}");
    }
    symbols
}

/// How long a run waits at its end for debuginfod's files, all together.
const DEBUGINFOD_WAIT: Duration = Duration::from_secs(10);

/// A run's symbolizer, and the debuginfod client its debug-file locator asks (if any).
struct Naming {
    symbolizer: Symbolizer,
    debuginfod: Option<std::sync::Arc<Debuginfod>>,
}

impl Naming {
    /// Symbolized; if that asked debuginfod for files, again once the fetches are over (a
    /// bounded wait), and only if one of them brought a file.
    fn symbolize(&self, profile: &RawProfile, procs: &Processes, status: &mut Option<StatusLine>) -> Symbols {
        let stats = || self.debuginfod.as_ref().map(|d| d.stats()).unwrap_or_default();
        let before = stats();
        let symbols = self.symbolizer.symbolize(profile, procs);
        let (Some(debuginfod), true) = (&self.debuginfod, asked(before, stats())) else {
            return symbols;
        };
        if let Some(status) = status {
            let asked = stats().started - before.started;
            status.show(&format!("fetching {asked} debug files from debuginfod"));
        }
        if !debuginfod.wait(DEBUGINFOD_WAIT) {
            log::warn!(
                "debuginfod: {} debug files not fetched within {DEBUGINFOD_WAIT:?}: their functions stay unnamed",
                debuginfod.stats().pending
            );
        }
        match brought(before, stats()) {
            true => self.symbolizer.symbolize(profile, procs),
            false => symbols,
        }
    }
}

/// Whether a symbolization asked for debug files (between the two counts), or left one pending.
fn asked(before: Stats, after: Stats) -> bool {
    after.started > before.started || after.pending > 0
}

/// Whether debug files came in since `before`: only then can a second symbolization name more.
fn brought(before: Stats, after: Stats) -> bool {
    after.fetched > before.fetched
}

pub(crate) struct Recording {
    pub stopped: Stopped,
    pub meta: RunMeta,
    pub exit_code: i32,
    /// Whether stacks were sampled (hotspot; topdown per function).
    pub sampled: bool,
}

/// A run's sink: every source's batches, folded as they are drained.
#[derive(Default)]
struct RunSink {
    profile: RawProfile,
    not_captured: HashSet<u32>,
    sched: Option<SchedCollection>,
    locks: Option<LockCollection>,
    counts: Option<TopdownCounting>,
}

impl Sink for RunSink {
    fn drained(&mut self, drained: Drained<'_>) -> anyhow::Result<()> {
        for batch in drained.batches {
            self.add(batch, drained.procs);
        }
        Ok(())
    }

    fn finished(&mut self, batches: Vec<Batch>, procs: &mut Processes) -> anyhow::Result<()> {
        for batch in batches {
            self.add(batch, procs);
        }
        Ok(())
    }
}

impl RunSink {
    fn add(&mut self, batch: Batch, procs: &mut Processes) {
        match batch {
            Batch::Samples(samples) => add_batch(samples, &mut self.profile, procs, &mut self.not_captured),
            Batch::Sched(batch) => self.sched.get_or_insert_with(Default::default).add(batch, procs),
            Batch::Locks(batch) => self
                .locks
                .get_or_insert_with(Default::default)
                .add_batch(batch, procs),
            Batch::Counts(counting) => self.counts = Some(*counting),
            Batch::Stat(_)
            | Batch::Values(_)
            | Batch::Syscalls(_)
            | Batch::Latency(_)
            | Batch::Records(_)
            | Batch::Timeline(_) => {}
        }
    }

    /// The sampled profile, with the run's health and what only the drains know of it.
    fn profile(&mut self, health: &Health) -> RawProfile {
        let profile = std::mem::take(&mut self.profile);
        RawProfile {
            health: Health {
                drains: profile.health.drains,
                user_frames_by_build_id: profile.health.user_frames_by_build_id,
                python_unnamed: profile.health.python_unnamed,
                processes_not_captured: self.not_captured.len() as u64,
                ..health.clone()
            },
            ..profile
        }
    }
}

/// Collect as a run does, handing every drain to `live` (`bpfprof top`) instead of reporting.
/// Ends at the duration, SIGINT/SIGTERM (which is how the view's `q` ends it), or when every
/// target exited; the result is what the user should be told of how it ended.
pub(crate) fn run_live(plan: &Plan, live: &mut dyn Sink) -> anyhow::Result<Vec<String>> {
    preflight::check_privileges()?;
    let (tracefs, runtime) = prepare_to_load()?;
    // The live view owns the terminal: no status line under it.
    let recording = runtime.block_on(record(plan, Reading::Drained, tracefs, live, Feedback::None))?;
    Ok(recording
        .meta
        .notes
        .into_iter()
        .filter(|note| !note.starts_with("interrupted"))
        .collect())
}

/// Collect as a run does into `sink` (`bpfprof stat`'s), once; the recording says how it ended.
pub(crate) fn run_into(plan: &Plan, sink: &mut dyn Sink) -> anyhow::Result<Recording> {
    let (tracefs, runtime) = prepare_to_load()?;
    runtime.block_on(record(plan, Reading::AtEnd, tracefs, sink, Feedback::None))
}

/// A run read once, at its end (`trace`, `latency`): the sources' last batches, what the report
/// must say (how the run ended, what was lost), how long it ran and the command's exit status;
/// and its processes as they were read, to name stacks with.
pub(crate) struct Ended {
    pub batches: Vec<Batch>,
    pub notes: Vec<String>,
    pub seconds: f64,
    pub exit_code: i32,
    pub health: Health,
    pub procs: Processes,
}

impl Ended {
    /// The batch `pick` takes (the one a command's source gives at the end).
    pub fn take<B>(&mut self, pick: fn(Batch) -> Option<B>) -> Option<B> {
        std::mem::take(&mut self.batches).into_iter().find_map(pick)
    }
}

/// Run `plan` (privileges checked first) to its end.
pub(crate) fn run_to_end(plan: &Plan) -> anyhow::Result<Ended> {
    preflight::check_privileges()?;
    let mut sink = crate::driver::AtEnd::default();
    let recording = run_into(plan, &mut sink)?;
    let mut notes = recording.meta.notes;
    notes.extend(recording.stopped.health.warnings());
    Ok(Ended {
        batches: sink.batches,
        notes,
        seconds: recording.meta.duration_s,
        exit_code: recording.exit_code,
        health: recording.stopped.health,
        procs: recording.stopped.procs,
    })
}

/// What a run shows while it collects.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Feedback {
    /// A status line each second, on a terminal.
    StatusLine,
    None,
}

/// Collect as the plan says, handing every drain to `sink`, until a stop condition.
async fn record(
    plan: &Plan,
    locks: Reading,
    tracefs: &Path,
    sink: &mut dyn Sink,
    feedback: Feedback,
) -> anyhow::Result<Recording> {
    let recipe = plan.recipe(locks)?;
    let sampling = recipe.samples().map(|s| {
        (
            Event::spelled_list(&s.events, ","),
            s.counters.iter().map(Event::spelled).collect(),
        )
    });
    let sampling_was_on = sampling.is_some();
    let paused = match plan.command.is_empty() {
        true => None,
        false => Some(launcher::spawn_paused(&plan.command)?),
    };
    let targets = Targets {
        system_wide: plan.system_wide,
        pids: &plan.pids,
        command: paused.as_ref().map(|p| (p.pid(), p.program())),
    };
    let Started {
        mut driver,
        doing,
        notes: collection_notes,
    } = start(recipe, &targets, tracefs)?;
    // Only -p targets end a run by exiting; a command ends it through SIGCHLD instead.
    let mut stops = Stops {
        targets: match plan.system_wide || paused.is_some() {
            true => Vec::new(),
            false => plan
                .pids
                .iter()
                .map(|&pid| pidfd(pid))
                .collect::<std::io::Result<_>>()
                .map_err(|_| UserError::NoSuchProcess(plan.pids[0]))?,
        },
        ..Stops::default()
    };
    let cpus = crate::counters::cpu::online_ids().map_or(1, |c| c.len() as u32);
    eprintln!(
        "bpfprof: {} for {} on {cpus} CPUs; Ctrl-C to stop",
        doing.join(" and "),
        plan.target_description()
    );
    // The run's time begins as the command is let run (what `stat` divides by, too).
    let started = Instant::now();
    let steal = crate::steal::Steal::now();
    stops.command = paused.map(|p| p.release()).transpose()?;
    stops.deadline = plan.duration.map(|d| started + d);
    if feedback == Feedback::StatusLine {
        stops.status = StatusLine::on_terminal(plan.duration);
    }
    let stop = driver.collect(&mut stops, sink).await;
    // Erased before anything else is said, an error included.
    stops.status = None;
    let stop = stop?;
    let secs = started.elapsed().as_secs_f64();
    // Where the thread states still open end, and the counters' totals (a command's include the
    // processes it started: they are targets too): now, the last drains take time of their own.
    let stopped = driver.stop(sink, monotonic_ns())?;
    let mut notes = stop_notes(&stop, secs);
    notes.extend(steal.note_since(cpus, started.elapsed()));
    notes.extend(collection_notes);
    notes.extend(stopped.notes.iter().cloned());
    let exit_code = match (stop, stops.command.as_mut()) {
        (Stop::CommandExited(code), _) => code,
        (stop, Some(command)) => settle_command(stop, command, secs, &mut notes),
        (_, None) => 0,
    };
    let (event, counters) = sampling.unwrap_or((Event::spelled_list(&plan.events, ","), Vec::new()));
    let meta = RunMeta {
        mode: plan.mode.name(),
        event,
        frequency_hz: plan.frequency_hz,
        period: match plan.rate {
            Rate::Period(n) if sampling_was_on => Some(n),
            _ => None,
        },
        duration_s: secs,
        target: plan.target_description(),
        cpus,
        notes,
        counters,
        weight: plan.weight.as_ref().map(|w| w.name.clone()),
    };
    Ok(Recording {
        stopped,
        meta,
        exit_code,
        sampled: sampling_was_on,
    })
}

/// What a report says of how its run ended.
fn stop_notes(stop: &Stop, secs: f64) -> Vec<String> {
    match stop {
        Stop::Interrupted => vec![format!("interrupted after {secs:.1} s: partial profile")],
        Stop::Terminated => vec![format!("terminated (SIGTERM) after {secs:.1} s: partial profile")],
        Stop::TargetsExited => vec![format!(
            "every target process exited after {secs:.1} s: this is what was collected until then"
        )],
        Stop::CommandExited(code) if *code != 0 => vec![format!("the command exited with status {code}")],
        Stop::CommandExited(_) | Stop::Duration => Vec::new(),
    }
}

/// At a Ctrl-C the terminal interrupts the command too: this long for it to exit of itself.
const INTERRUPT_GRACE: Duration = Duration::from_millis(500);
/// How long a command is given to exit once sent SIGTERM.
const TERM_GRACE: Duration = Duration::from_secs(2);

/// What becomes of a command still running when the run stopped first, said in the notes, and
/// the exit code: the command does not outlive its profile (as with perf), and bpfprof never
/// waits silently or without end. After an interrupt it is given a moment to exit of itself (a
/// Ctrl-C at a terminal reached it too); one sent to bpfprof alone, `-d` and SIGTERM stop it with
/// SIGTERM; a command that outlives SIGTERM is left running, and said so.
fn settle_command(stop: Stop, command: &mut RunningCommand, secs: f64, notes: &mut Vec<String>) -> i32 {
    let pid = command.pid();
    if stop == Stop::Interrupted {
        if let Some(code) = command.wait_for(INTERRUPT_GRACE) {
            return code;
        }
        eprintln!(
            "bpfprof: the interrupt reached bpfprof alone: stopping the command (pid {pid}) with SIGTERM"
        );
    }
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    notes.push(format!("the command was stopped (SIGTERM) after {secs:.1} s"));
    match command.wait_for(TERM_GRACE) {
        Some(code) => code,
        None => {
            let left = format!(
                "the command (pid {pid}) did not exit within {} s of SIGTERM: left running",
                TERM_GRACE.as_secs()
            );
            eprintln!("bpfprof: {left}");
            notes.push(left);
            match stop {
                Stop::Interrupted => crate::error::exit::INTERRUPTED,
                _ => crate::error::exit::TERMINATED,
            }
        }
    }
}

#[cfg(test)]
mod debuginfod_tests {
    use super::*;

    #[test]
    fn a_second_symbolization_only_when_a_fetch_brought_a_file() {
        let before = Stats::default();
        let asked_one = Stats {
            started: 1,
            pending: 1,
            ..before
        };
        let missed = Stats {
            started: 1,
            missed: 1,
            ..before
        };
        let fetched = Stats {
            started: 1,
            fetched: 1,
            ..before
        };
        println!("asked {asked_one:?}; then {missed:?} or {fetched:?}");
        assert!(!asked(before, before), "nothing asked: one pass");
        assert!(asked(before, asked_one) && asked(before, fetched));
        assert!(
            !brought(before, missed),
            "every fetch missed: the first pass stands"
        );
        assert!(brought(before, fetched));
    }
}
