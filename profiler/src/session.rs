//! The order of things for one run: check → load → attach → start the command → collect until a
//! stop condition → final drain → detach → symbolize → render. The only place that knows it.
use std::{collections::HashSet, path::Path, time::Duration};

use anyhow::Context as _;
use tokio::time::Instant;

use crate::{
    bpf::LoadOptions,
    cli::{Cli, Format, LockSource, Mode},
    collect::add_batch,
    collect::monotonic_ns,
    counters::events::{self, Pmu},
    driver::{pidfd, prepare_to_load, Drained, Driver, Sink, Stop, Stopped, Stops},
    error::UserError,
    launcher::{self, RunningCommand},
    model::RunMeta,
    modes::{
        hotspot,
        lock::{self, probes},
        sched,
        topdown::{self, counting::TopdownCounting},
    },
    output,
    plan::{Needs, Plan},
    preflight,
    process::Processes,
    profile::{Health, RawProfile},
    report,
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
        event: "counters",
        frequency_hz: 0,
        duration_s: 0.0,
        target: format!("counters from {}", path.display()),
        cpus: 0,
        notes: counts
            .not_counted
            .iter()
            .map(|e| format!("{e}: not counted by perf"))
            .collect(),
        counters: Vec::new(),
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
    let recording = runtime.block_on(record(&plan, tracefs, &mut sink, Feedback::StatusLine))?;
    // Collection is over and everything is detached: a further Ctrl-C should end bpfprof at once
    // rather than be swallowed by the event loop's handler.
    // SAFETY: restoring the default disposition of a signal.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_DFL);
        libc::signal(libc::SIGTERM, libc::SIG_DFL);
    }

    let symbolizer = Naming {
        symbolizer: Symbolizer::new(DebugLocator::new(
            plan.debug_dirs.clone(),
            debuginfod.clone().map(|d| d as _),
        )),
        debuginfod,
    };
    let renderer = report::renderer(plan.format);
    let Recording {
        stopped:
            Stopped {
                health,
                sched,
                locks,
                procs,
            },
        meta,
        exit_code,
        topdown,
        sampled,
    } = recording;
    let stacks = sampled.then(|| sink.into_profile(&health));
    let described = match plan.mode {
        Mode::Topdown => {
            let topdown = topdown.context("topdown run without its counting state")?;
            let collection = sched.context("topdown run without thread states")?;
            let mut report = topdown::thread_states(meta.clone(), health, &collection, topdown.reason);
            if let Some(counts) = &topdown.counts {
                report = topdown::with_counts(report, &topdown.set, counts, topdown.machine);
            }
            if let Some(profile) = stacks {
                let sampled = symbolized(&symbolizer, meta, &profile, &procs);
                report = topdown::with_functions(report, &sampled, topdown.set.name, topdown.machine);
            }
            output::write_report(plan.output.as_deref(), &|out| renderer.topdown(&report, out))?;
            format!(
                "{} threads, {} functions",
                report.threads.len(),
                report.functions.len()
            )
        }
        Mode::Lock => {
            let collection = locks.context("lock run without its records")?;
            let symbols = symbolize(&symbolizer, &collection.stacks, &procs);
            let report = lock::build(
                meta,
                plan.lock_source,
                plan.waits,
                health,
                &collection,
                &symbols,
                &procs,
            )
            .limit_stacks();
            output::write_report(plan.output.as_deref(), &|out| renderer.lock(&report, out))?;
            let waited_for_events = report.of_class(lock::WaitClass::Waiting).count();
            format!(
                "{} contended locks, {waited_for_events} waits for events",
                report.locks.len() - waited_for_events
            )
        }
        Mode::Sched => {
            let collection = sched.context("sched run without its records")?;
            let symbols = symbolize(&symbolizer, &collection.offcpu_ns, &procs);
            let report = sched::build(meta, health, &collection, &symbols, plan.slow_threshold_ns);
            output::write_report(plan.output.as_deref(), &|out| renderer.sched(&report, out))?;
            format!("{} tasks", report.tasks.len())
        }
        _ => {
            let profile = stacks.context("hotspot run without samples")?;
            let report = symbolized(&symbolizer, meta, &profile, &procs);
            match &plan.annotate {
                // Resolved after the run: which functions ran is only known now.
                Some(function) => {
                    let annotation = crate::views::annotate::annotate(&report, function)?;
                    output::write_report(plan.output.as_deref(), &|out| {
                        crate::views::annotate::render(&annotation, crate::views::ANNOTATE_LINES, out)
                    })?;
                }
                None => output::write_report(plan.output.as_deref(), &|out| renderer.hotspot(&report, out))?,
            }
            format!("{} samples", report.samples)
        }
    };
    if let Some(path) = &plan.output {
        eprintln!("bpfprof: wrote {} ({described})", path.display());
    }
    Ok(exit_code)
}

/// The sampled stacks, symbolized and folded into the hotspot report.
fn symbolized(
    symbolizer: &Naming,
    meta: RunMeta,
    profile: &RawProfile,
    procs: &Processes,
) -> crate::model::StackReport {
    let symbols = symbolize(symbolizer, profile, procs);
    hotspot::build(meta, profile, &symbols)
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
    /// Topdown: the whole-run counter totals, and what the report needs to know of the machine.
    pub topdown: Option<TopdownCounting>,
    /// Whether stacks were sampled (hotspot; topdown per function).
    pub sampled: bool,
}

/// A run's sink: the sampled stacks, aggregated as they are drained. The scheduler's and the
/// lock records are the driver's until the end.
#[derive(Default)]
struct RunSink {
    profile: RawProfile,
    not_captured: HashSet<u32>,
}

impl Sink for RunSink {
    fn drained(&mut self, drained: Drained<'_>) -> anyhow::Result<()> {
        add_batch(
            drained.samples,
            &mut self.profile,
            drained.procs,
            &mut self.not_captured,
        );
        Ok(())
    }
}

impl RunSink {
    /// The profile, with the run's health and what only the drains know of it.
    fn into_profile(self, health: &Health) -> RawProfile {
        RawProfile {
            health: Health {
                drains: self.profile.health.drains,
                user_frames_by_build_id: self.profile.health.user_frames_by_build_id,
                processes_not_captured: self.not_captured.len() as u64,
                ..health.clone()
            },
            ..self.profile
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
    let recording = runtime.block_on(record(plan, tracefs, live, Feedback::None))?;
    Ok(recording
        .meta
        .notes
        .into_iter()
        .filter(|note| !note.starts_with("interrupted"))
        .collect())
}

/// What a run shows while it collects.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Feedback {
    /// A status line each second, on a terminal.
    StatusLine,
    None,
}

async fn record(
    plan: &Plan,
    tracefs: &Path,
    sink: &mut dyn Sink,
    feedback: Feedback,
) -> anyhow::Result<Recording> {
    let paused = match plan.command.is_empty() {
        true => None,
        false => Some(launcher::spawn_paused(&plan.command)?),
    };
    let Needs {
        sampling,
        sample_counters,
        group,
        sched: tracing_sched,
        lock,
        mut counting,
    } = plan.needs()?;
    // Which file of each target has its lock functions: known before anything is driver.kernel.
    let mut lock_libraries = Vec::new();
    if lock == Some(LockSource::Pthread) {
        for &pid in &plan.pids {
            lock_libraries.push((pid, probes::for_process(pid)?));
        }
        if let Some(paused) = &paused {
            lock_libraries.push((paused.pid(), probes::for_command(paused.program())?));
        }
    }
    // Missing BTF is the first thing to say, before anything is counted.
    let task_offsets = tracing_sched.then(crate::bpf::task_offsets).transpose()?;
    let load_options = LoadOptions {
        sampling: sampling.is_some(),
        sched: task_offsets,
        filter: !plan.system_wide,
        slow_threshold_ns: plan.slow_threshold_ns,
        offcpu_stacks: plan.offcpu_stacks,
        counters: sample_counters.len() as u32,
        unwind_tables: plan.unwind == crate::cli::Unwind::Tables,
        lock,
        nvcsw_offset: match lock_libraries.is_empty() {
            true => None,
            false => crate::bpf::nvcsw_offset(),
        },
        sample_map_entries: None,
        tracefs,
    };
    let mut driver = Driver::load(&load_options)?;
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
    for &pid in &plan.pids {
        driver.kernel.add_target(pid)?;
        for tid in crate::process::threads_of(pid) {
            driver.kernel.add_target(tid)?;
        }
        let _ = driver.collector.procs.capture(pid);
    }
    driver.collector.give_tables();
    if let Some(paused) = &paused {
        driver.kernel.add_target(paused.pid())?;
    }
    driver.kernel.attach_process_tracking()?;
    let mut doing = Vec::new();
    if let Some(source) = lock {
        driver.take_locks()?;
        match source {
            LockSource::Futex => {
                driver.kernel.attach_futex()?;
                doing.push("timing futex waits (contended locks)".to_string());
            }
            LockSource::Kernel => {
                driver.kernel.attach_kernel_locks()?;
                doing.push("timing kernel lock contention".to_string());
            }
            LockSource::Pthread => {
                driver.kernel.attach_pthread(&lock_libraries)?;
                let probed: Vec<String> = lock_libraries.iter().map(|(_, l)| l.display.clone()).collect();
                doing.push(format!(
                    "probing the pthread lock functions of {}",
                    probed.join(", ")
                ));
                for (_, library) in &lock_libraries {
                    let slow = library.single_stepped();
                    if !slow.is_empty() {
                        eprintln!(
                            "bpfprof: warning: {} in {} probed on their first instruction (single-stepped by the kernel: several µs per call)",
                            slow.join(", "),
                            library.display
                        );
                    }
                }
            }
        }
    }
    if let Some(event) = sampling {
        // The sampler opens before the counters read at each sample: created first, it is
        // scheduled first, so a cycles sampler takes the PMU's dedicated cycle counter where
        // there is one, and the counters share the general-purpose ones.
        driver.kernel.attach_sampling(event, plan.frequency_hz)?;
        if !sample_counters.is_empty() {
            let core = match &counting {
                Some(c) => c.core.clone(),
                None => Pmu::core(Path::new(events::SYSFS_PMUS)),
            };
            driver
                .kernel
                .open_counters(&sample_counters, group, core.as_ref())?;
        }
        doing.push(format!("sampling at {} Hz ({})", plan.frequency_hz, event.name()));
    }
    let cpus = crate::counters::cpu::online_ids().map_or(1, |c| c.len() as u32);
    // The scheduler last, just before the counters' totals and the clock of the run start: its
    // thread states then cover the run the report's duration and the counters' totals speak of.
    if tracing_sched {
        driver.trace_sched(
            plan.pids
                .iter()
                .flat_map(|&pid| {
                    crate::process::threads_of(pid)
                        .into_iter()
                        .map(move |tid| (pid, tid))
                })
                .collect(),
        )?;
        doing.insert(0, "tracing the scheduler".to_string());
    }
    if let Some(counting) = &mut counting {
        counting.start(driver.kernel.counter_totals())?;
    }
    stops.command = paused.map(|p| p.release()).transpose()?;

    eprintln!(
        "bpfprof: {} for {} on {cpus} CPUs; Ctrl-C to stop",
        doing.join(" and "),
        plan.target_description()
    );
    let started = Instant::now();
    stops.deadline = plan.duration.map(|d| started + d);
    if feedback == Feedback::StatusLine {
        stops.status = StatusLine::on_terminal(plan.duration);
    }
    let stop = driver.collect(&mut stops, sink).await;
    // Erased before anything else is said, an error included.
    stops.status = None;
    let stop = stop?;
    let elapsed = started.elapsed();
    // Where the thread states still open end (the drains below take time of their own), and
    // the counters' totals at that moment (a command's include the processes it started: they
    // are targets too).
    let stopped_ns = monotonic_ns();
    let topdown = counting.map(|c| c.finish(driver.kernel.counter_totals()));
    let stopped = driver.stop(sink, stopped_ns)?;

    let mut notes = Vec::new();
    let secs = elapsed.as_secs_f64();
    match stop {
        Stop::Interrupted => notes.push(format!("interrupted after {secs:.1} s: partial profile")),
        Stop::Terminated => notes.push(format!("terminated (SIGTERM) after {secs:.1} s: partial profile")),
        Stop::TargetsExited => notes.push(format!(
            "every target process exited after {secs:.1} s: this is what was collected until then"
        )),
        Stop::CommandExited(code) if code != 0 => {
            notes.push(format!("the command exited with status {code}"))
        }
        Stop::CommandExited(_) | Stop::Duration => {}
    }
    if task_offsets.is_some_and(|o| !o.kernel_accounting()) {
        notes.push(crate::bpf::TRACEPOINT_CLOCKS_NOTE.to_string());
    }
    let exit_code = match (stop, stops.command.as_mut()) {
        (Stop::CommandExited(code), _) => code,
        (stop, Some(command)) => settle_command(stop, command, secs, &mut notes),
        (_, None) => 0,
    };

    let meta = RunMeta {
        mode: plan.mode.name(),
        event: sampling.unwrap_or(plan.event).name(),
        frequency_hz: plan.frequency_hz,
        duration_s: secs,
        target: plan.target_description(),
        cpus,
        notes,
        counters: sample_counters.iter().map(|e| e.name).collect(),
    };
    Ok(Recording {
        stopped,
        meta,
        exit_code,
        topdown,
        sampled: sampling.is_some(),
    })
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
