//! The order of things for one run: check → load → attach → start the command → collect until a
//! stop condition → final drain → detach → symbolize → render. The only place that knows it.
use std::{
    collections::HashSet,
    os::fd::{FromRawFd as _, OwnedFd, RawFd},
    path::Path,
};

use anyhow::Context as _;
use aya::maps::{MapData, RingBuf};
use profiler_common::{names, ProcessEvent, ProcessEventKind};
use tokio::{
    io::unix::AsyncFd,
    signal::unix::{signal, SignalKind},
    time::{interval, sleep_until, Instant, MissedTickBehavior},
};

use crate::{
    bpf::{LoadOptions, Loaded},
    cli::{Cli, Event, Format, LockSource, Mode},
    collect::{add_batch, KernelSource, SampleSource as _},
    counters::events::{self, EventSpec, Pmu},
    counters::tma::Counts,
    error::UserError,
    launcher::{self, RunningCommand},
    model::RunMeta,
    modes::{
        hotspot,
        lock::{self, probes, LockCollection, LockMaps},
        sched::{self, SchedCollection, SchedSource},
        topdown::{self, counting::TopdownCounting},
    },
    output,
    plan::Plan,
    preflight,
    process::Processes,
    profile::{Health, RawProfile},
    report,
    symbolize::Symbolizer,
};

/// `--mode topdown --counters FILE`: the analysis of counts taken elsewhere. No BPF, no root.
pub fn topdown_from_counters(cli: &Cli, path: &Path) -> anyhow::Result<i32> {
    if cli.mode != Mode::Topdown {
        return Err(UserError::Usage("--counters goes with --mode topdown".into()).into());
    }
    let format = cli.resolved_format();
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
    let counts = crate::counters::tma::parse_perf_csv(&text).map_err(|e| fail(e.to_string()))?;
    let tma = crate::counters::tma::analyze(&counts, cli.slots).map_err(|e| fail(e.to_string()))?;
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
    let (tracefs, runtime) = prepare_to_load()?;
    let recording = runtime.block_on(record(&plan, tracefs, None))?;
    // Collection is over and everything is detached: a further Ctrl-C should end bpfprof at once
    // rather than be swallowed by the event loop's handler.
    // SAFETY: restoring the default disposition of a signal.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_DFL);
        libc::signal(libc::SIGTERM, libc::SIG_DFL);
    }

    let symbolizer = Symbolizer::new();
    let renderer = report::renderer(plan.format);
    let Recording {
        collected,
        procs,
        meta,
        exit_code,
        topdown,
    } = recording;
    let Collected {
        stacks,
        sched,
        locks,
        health,
    } = collected;
    let described = match plan.mode {
        Mode::Topdown => {
            let topdown = topdown.context("topdown run without its counting state")?;
            let collection = sched.context("topdown run without thread states")?;
            let mut report = topdown::thread_states(meta.clone(), health, &collection, topdown.reason);
            if let Some(counts) = &topdown.counts {
                report = topdown::with_counts(report, topdown.set.name, counts, topdown.slots);
            }
            if let Some(profile) = stacks {
                let sampled = symbolized(&symbolizer, meta, &profile, &procs);
                report = topdown::with_functions(report, &sampled, topdown.set.name, topdown.slots);
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
            let symbols = symbolizer.symbolize(&collection.stacks, &procs);
            warn_failures(&symbols.failures);
            let report = lock::build(meta, plan.lock_source, health, &collection, &symbols, &procs);
            output::write_report(plan.output.as_deref(), &|out| renderer.lock(&report, out))?;
            format!("{} contended locks", report.locks.len())
        }
        Mode::Sched => {
            let collection = sched.context("sched run without its records")?;
            let symbols = symbolizer.symbolize(&collection.offcpu_ns, &procs);
            warn_failures(&symbols.failures);
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

/// What every loading run needs once privileges are checked: tracefs, limits, the event loop.
pub(crate) fn prepare_to_load() -> anyhow::Result<(&'static Path, tokio::runtime::Runtime)> {
    let tracefs = preflight::ensure_tracefs()?;
    preflight::raise_limits();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the event loop")?;
    Ok((tracefs, runtime))
}

/// The sampled stacks, symbolized and folded into the hotspot report.
fn symbolized(
    symbolizer: &Symbolizer,
    meta: RunMeta,
    profile: &RawProfile,
    procs: &Processes,
) -> crate::model::StackReport {
    let symbols = symbolizer.symbolize(profile, procs);
    warn_failures(&symbols.failures);
    hotspot::build(meta, profile, &symbols)
}

fn warn_failures(failures: &[String]) {
    for failure in failures {
        log::warn!("symbolization: {failure}");
    }
}

/// What a run collected: sampled stacks (hotspot; topdown per function), scheduler records
/// (sched; topdown thread states), or both; or lock waits (lock).
pub struct Collected {
    pub stacks: Option<RawProfile>,
    pub sched: Option<Box<SchedCollection>>,
    pub locks: Option<LockCollection>,
    pub health: Health,
}

pub struct Recording {
    pub collected: Collected,
    pub procs: Processes,
    pub meta: RunMeta,
    pub exit_code: i32,
    /// Topdown: the whole-run counter totals, and what the report needs to know of the machine.
    pub topdown: Option<TopdownCounting<Counts>>,
}

/// Sampled stacks, aggregated as they are drained.
#[derive(Default)]
struct StackCollector {
    profile: RawProfile,
    not_captured: HashSet<u32>,
}

/// Scheduler records, aggregated as they are drained.
struct SchedCollector {
    source: Box<SchedSource>,
    collection: Box<SchedCollection>,
}

/// What a run drains from the kernel while it runs; both parts share one epoch flip. (Lock
/// records only grow, one per lock and stack: read at the end.)
struct Collector {
    stacks: Option<StackCollector>,
    sched: Option<SchedCollector>,
    locks: Option<LockMaps>,
}

impl Collector {
    fn drain(&mut self, kernel: &mut KernelSource, procs: &mut Processes) -> anyhow::Result<()> {
        let old = kernel.flip()?;
        if let Some(s) = &mut self.stacks {
            add_batch(
                kernel.drain_slot(old)?,
                &mut s.profile,
                procs,
                &mut s.not_captured,
            );
        }
        if let Some(s) = &mut self.sched {
            s.source.read_slow(&mut s.collection);
            s.source.drain(old, &mut s.collection)?;
        }
        Ok(())
    }

    /// The collections, with the run's health (`files_without_tables`: from the unwinder, which
    /// the kernel does not know of).
    fn finish(
        self,
        kernel: &mut KernelSource,
        procs: &mut Processes,
        files_without_tables: u64,
        stopped_ns: u64,
    ) -> anyhow::Result<Collected> {
        let mut health = kernel.health()?;
        health.files_without_tables = files_without_tables;
        let sched = match self.sched {
            Some(mut s) => {
                s.source.finish(&mut s.collection, procs, stopped_ns)?;
                health.slow_events = s.collection.slow_seen;
                Some(s.collection)
            }
            None => None,
        };
        let stacks = self.stacks.map(|s| {
            health.drains = s.profile.health.drains;
            health.processes_not_captured = s.not_captured.len() as u64;
            RawProfile {
                health: health.clone(),
                ..s.profile
            }
        });
        let locks = self.locks.map(|source| source.collect(procs));
        Ok(Collected {
            stacks,
            sched,
            locks,
            health,
        })
    }
}

#[derive(Debug, PartialEq)]
enum Stop {
    Duration,
    Interrupted,
    Terminated,
    CommandExited(i32),
    TargetsExited,
}

/// A descriptor that becomes readable when the process exits (a zombie counts as exited), and
/// that keeps naming the same process even if its pid is reused.
fn pidfd(pid: u32) -> std::io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
    // SAFETY: the AsyncFd owns the descriptor it watches.
    unsafe { AsyncFd::register(fd) }.map_err(|e| std::io::Error::other(e.to_string()))
}

/// Resolves once every process behind `fds` has exited; never, for an empty list.
async fn all_exited(fds: &[AsyncFd<OwnedFd>]) {
    if fds.is_empty() {
        return std::future::pending().await;
    }
    for fd in fds {
        let _ = fd.readable().await;
    }
}

/// CLOCK_MONOTONIC, the clock of `bpf_ktime_get_ns()`.
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// What a live view (`bpfprof top`) is handed after every drain: the stacks sampled since the
/// last one (its to take), every task's scheduling statistics and the lock records so far, and
/// the run's health.
pub(crate) struct LiveData<'a> {
    pub stacks: Option<&'a mut RawProfile>,
    pub tasks: Option<Vec<sched::TaskLatency>>,
    pub locks: Option<&'a LockMaps>,
    pub procs: &'a mut Processes,
    pub health: Health,
}

pub(crate) trait Live {
    fn refresh(&mut self, data: LiveData<'_>) -> anyhow::Result<()>;
}

/// Collect as a run does, handing everything to `live` every second instead of reporting it.
/// Ends at the duration, SIGINT/SIGTERM (which is how the view's `q` ends it), or when every
/// target exited; the result is what the user should be told of how it ended.
pub(crate) fn run_live(plan: &Plan, live: &mut dyn Live) -> anyhow::Result<Vec<String>> {
    preflight::check_privileges()?;
    let (tracefs, runtime) = prepare_to_load()?;
    let recording = runtime.block_on(record(plan, tracefs, Some(live)))?;
    Ok(recording
        .meta
        .notes
        .into_iter()
        .filter(|note| !note.starts_with("interrupted"))
        .collect())
}

async fn record(plan: &Plan, tracefs: &Path, mut live: Option<&mut dyn Live>) -> anyhow::Result<Recording> {
    let paused = match plan.command.is_empty() {
        true => None,
        false => Some(launcher::spawn_paused(&plan.command)?),
    };
    let tracing_sched = matches!(plan.mode, Mode::Sched | Mode::Topdown);
    // Which file of each target has its lock functions: known before anything is loaded.
    let mut lock_libraries = Vec::new();
    if plan.mode == Mode::Lock && plan.lock_source == LockSource::Pthread {
        for &pid in &plan.pids {
            lock_libraries.push((pid, probes::for_process(pid)?));
        }
        if let Some(paused) = &paused {
            lock_libraries.push((paused.pid(), probes::for_command(paused.program())?));
        }
    }
    // Missing BTF is the first thing to say, before anything is counted.
    let task_offsets = tracing_sched.then(crate::bpf::task_offsets).transpose()?;
    let mut counting = match plan.mode {
        Mode::Topdown => Some(TopdownCounting::plan(plan)?),
        _ => None,
    };
    // Topdown reads its set at each sample too, for the split per function, wherever it counts.
    let per_function = counting.as_ref().and_then(TopdownCounting::per_function);
    let (sample_counters, group): (Vec<EventSpec>, bool) = match (plan.mode, per_function) {
        (_, Some(set)) => (set.events.to_vec(), set.group),
        (Mode::Hotspot, None) => (plan.counters.iter().map(|c| c.spec()).collect(), false),
        _ => (Vec::new(), false),
    };
    let sampling = match plan.mode {
        Mode::Hotspot => Some(plan.event),
        Mode::Topdown => per_function.map(|set| match set.hardware {
            // Sampled on the cycle counter's overflow where there is one.
            true => Event::Cycles,
            false => plan.event,
        }),
        _ => None,
    };
    let mut procs = Processes::new();
    let load_options = LoadOptions {
        sampling: sampling.is_some(),
        sched: task_offsets,
        filter: !plan.system_wide,
        slow_threshold_ns: plan.slow_threshold_ns,
        offcpu_stacks: plan.offcpu_stacks,
        counters: sample_counters.len() as u32,
        unwind_tables: plan.unwind == crate::cli::Unwind::Tables,
        lock: (plan.mode == Mode::Lock).then_some(plan.lock_source),
        nvcsw_offset: match lock_libraries.is_empty() {
            true => None,
            false => crate::bpf::nvcsw_offset(),
        },
        sample_map_entries: None,
        tracefs,
    };
    let (mut loaded, mut tables) = load_following_processes(&load_options, &mut procs)?;
    // Only -p targets end a run by exiting; a command ends it through SIGCHLD instead.
    let exits = match plan.system_wide || paused.is_some() {
        true => Vec::new(),
        false => plan
            .pids
            .iter()
            .map(|&pid| pidfd(pid))
            .collect::<std::io::Result<_>>()
            .map_err(|_| UserError::NoSuchProcess(plan.pids[0]))?,
    };
    for &pid in &plan.pids {
        loaded.add_target(pid)?;
        for tid in crate::process::threads_of(pid) {
            loaded.add_target(tid)?;
        }
        let _ = procs.capture(pid);
    }
    give_tables(&mut tables, &mut procs);
    if let Some(paused) = &paused {
        loaded.add_target(paused.pid())?;
    }
    loaded.attach_process_tracking()?;
    let mut kernel = KernelSource::take(&mut loaded.ebpf, !sample_counters.is_empty())?;
    let mut events = event_ring(&mut loaded)?;
    let mut collector = Collector {
        stacks: None,
        sched: None,
        locks: None,
    };
    let mut doing = Vec::new();
    if plan.mode == Mode::Lock {
        collector.locks = Some(LockMaps::take(&mut loaded.ebpf)?);
        match plan.lock_source {
            LockSource::Futex => {
                loaded.attach_futex()?;
                doing.push("timing futex waits (contended locks)".to_string());
            }
            LockSource::Kernel => {
                loaded.attach_kernel_locks()?;
                doing.push("timing kernel lock contention".to_string());
            }
            LockSource::Pthread => {
                loaded.attach_pthread(&lock_libraries)?;
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
        if !sample_counters.is_empty() {
            let core = match &counting {
                Some(c) => c.core.clone(),
                None => Pmu::core(Path::new(events::SYSFS_PMUS)),
            };
            loaded.open_counters(&sample_counters, group, core.as_ref())?;
        }
        loaded.attach_sampling(event, plan.frequency_hz)?;
        collector.stacks = Some(StackCollector::default());
        doing.push(format!("sampling at {} Hz ({})", plan.frequency_hz, event.name()));
    }
    let cpus = crate::bpf::online_cpu_ids().map_or(1, |c| c.len() as u32);
    // The scheduler last, just before the counters and the clock of the run start: its thread
    // states then cover the run the report's duration and the counters' totals speak of.
    if tracing_sched {
        let source = Box::new(SchedSource::take(&mut loaded.ebpf)?);
        loaded.attach_sched()?;
        let collection = Box::new(SchedCollection {
            started_ns: monotonic_ns(),
            threads_at_start: plan
                .pids
                .iter()
                .flat_map(|&pid| {
                    crate::process::threads_of(pid)
                        .into_iter()
                        .map(move |tid| (pid, tid))
                })
                .collect(),
            ..Default::default()
        });
        collector.sched = Some(SchedCollector { source, collection });
        doing.insert(0, "tracing the scheduler".to_string());
    }
    if let Some(counting) = &mut counting {
        counting.start(plan, paused.as_ref().map(|p| p.pid()))?;
    }
    let mut command = paused.map(|p| p.release()).transpose()?;

    eprintln!(
        "bpfprof: {} for {} on {cpus} CPUs; Ctrl-C to stop",
        doing.join(" and "),
        plan.target_description()
    );
    let started = Instant::now();
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sigchld = signal(SignalKind::child())?;
    // The only periodic wake-up: everything else (signals, exits, new processes) wakes us itself.
    let mut drain_timer = interval(crate::collect::DRAIN_EVERY);
    drain_timer.set_missed_tick_behavior(MissedTickBehavior::Delay);
    drain_timer.tick().await;
    let targets_exited = all_exited(&exits);
    tokio::pin!(targets_exited);
    let deadline = plan.duration.map(|d| started + d);
    let until_deadline = async {
        match deadline {
            Some(deadline) => sleep_until(deadline).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(until_deadline);

    let stop = loop {
        tokio::select! {
            _ = &mut until_deadline => break Stop::Duration,
            _ = sigint.recv() => break Stop::Interrupted,
            _ = sigterm.recv() => break Stop::Terminated,
            _ = sigchld.recv() => {
                if let Some(code) = command.as_mut().and_then(RunningCommand::try_wait) {
                    break Stop::CommandExited(code);
                }
            }
            guard = events.readable_mut() => {
                let mut guard = guard?;
                capture_announced(guard.get_inner_mut(), &mut procs);
                guard.clear_ready();
                give_tables(&mut tables, &mut procs);
            }
            _ = &mut targets_exited => break Stop::TargetsExited,
            _ = drain_timer.tick() => {
                // Also a safety net for a SIGCHLD that raced the handler's registration.
                if let Some(code) = command.as_mut().and_then(RunningCommand::try_wait) {
                    break Stop::CommandExited(code);
                }
                collector.drain(&mut kernel, &mut procs)?;
                give_tables(&mut tables, &mut procs);
                if let Some(live) = live.as_deref_mut() {
                    live.refresh(LiveData {
                        stacks: collector.stacks.as_mut().map(|s| &mut s.profile),
                        tasks: collector.sched.as_ref().map(|s| {
                            let records = s.source.tasks_now(&s.collection, monotonic_ns());
                            sched::latencies(&records, s.collection.started_ns)
                        }),
                        locks: collector.locks.as_ref(),
                        procs: &mut procs,
                        health: kernel.health()?,
                    })?;
                }
            }
        }
    };
    let elapsed = started.elapsed();
    // Where the thread states still open end (the drains below take time of their own).
    let stopped_ns = monotonic_ns();

    // Both epoch slots, so nothing recorded is left behind.
    capture_announced(events.get_mut(), &mut procs);
    collector.drain(&mut kernel, &mut procs)?;
    // The counters' totals at the moment the run ended (a command's counts include its exited
    // children: they fold into the inherited parent counters).
    let topdown = counting.map(TopdownCounting::read);
    collector.drain(&mut kernel, &mut procs)?;
    let files_without_tables = tables.as_ref().map_or(0, |t| t.files_without_tables());
    let collected = collector.finish(&mut kernel, &mut procs, files_without_tables, stopped_ns)?;
    drop(events);
    drop(kernel);
    drop(loaded); // detaches every program and closes every perf event

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
    let exit_code = match (stop, command.as_mut()) {
        (Stop::CommandExited(code), _) => code,
        (stop, Some(command)) => {
            if stop != Stop::Interrupted {
                // We stopped first (-d or SIGTERM): the command does not outlive the profile.
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(command.pid() as i32),
                    nix::sys::signal::Signal::SIGTERM,
                );
                notes.push(format!("the command was stopped (SIGTERM) after {secs:.1} s"));
            }
            command.wait()
        }
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
        collected,
        procs,
        meta,
        exit_code,
        topdown,
    })
}

/// Load the programs, and what follows processes for symbolization: `procs` labels each capture
/// with the exec generation the kernel counts, and the unwinder (where tables are walked) gets
/// each capture's mappings (see `give_tables`).
pub(crate) fn load_following_processes(
    options: &LoadOptions<'_>,
    procs: &mut Processes,
) -> anyhow::Result<(Loaded, Option<crate::unwind::Tables>)> {
    let mut loaded = Loaded::load(options)?;
    let generations = crate::bpf::take_map(&mut loaded.ebpf, names::EXEC_GENERATIONS)?;
    let generations: aya::maps::HashMap<MapData, u32, u32> = aya::maps::HashMap::try_from(generations)?;
    procs.with_generations(move |pid| generations.get(&pid, 0).unwrap_or(0));
    let tables = match options.walks_tables() {
        true => {
            procs.record_captures();
            Some(loaded.enable_unwinding(options)?)
        }
        false => None,
    };
    Ok((loaded, tables))
}

/// The ring the kernel announces new processes in, watched by the event loop.
pub(crate) fn event_ring(loaded: &mut Loaded) -> anyhow::Result<AsyncFd<RingBuf<MapData>>> {
    let events = crate::bpf::take_map(&mut loaded.ebpf, names::EVENTS)?;
    // SAFETY: the ring buffer owns its descriptor and outlives the registration (both are
    // dropped together).
    unsafe { AsyncFd::register(RingBuf::try_from(events)?) }
        .map_err(|e| anyhow::anyhow!("watching the event ring: {e}"))
}

/// Give the table walker the mappings (and files' tables) of processes captured since last time:
/// new targets, and processes whose map changed (exec, dlopen). A process it cannot be given is
/// walked with frame pointers.
pub(crate) fn give_tables(tables: &mut Option<crate::unwind::Tables>, procs: &mut Processes) {
    let Some(tables) = tables else {
        return;
    };
    for (pid, maps) in procs.take_captured() {
        if let Err(e) = tables.load_process(pid, &maps) {
            log::warn!("unwind tables for pid {pid}: {e:#}");
        }
    }
}

/// Capture the memory map of every process the kernel announced, while it is alive.
pub(crate) fn capture_announced(ring: &mut RingBuf<MapData>, procs: &mut Processes) {
    while let Some(item) = ring.next() {
        if item.len() < std::mem::size_of::<ProcessEvent>() {
            continue;
        }
        // SAFETY: the ring carries only `ProcessEvent`s, checked for length above.
        let event: ProcessEvent = unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) };
        let _ = match event.kind {
            k if k == ProcessEventKind::MappingsChanged as u32 => procs.refresh(event.tgid),
            _ => procs.capture(event.tgid),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pidfds_report_exit_including_zombies() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let mut child = std::process::Command::new("sleep").arg("0.2").spawn().unwrap();
            let fds = vec![pidfd(child.id()).unwrap()];
            let started = Instant::now();
            all_exited(&fds).await; // the child is a zombie here: not reaped yet
            assert!(started.elapsed() >= std::time::Duration::from_millis(150));
            child.wait().unwrap();
            assert!(pidfd(u32::MAX >> 2).is_err());
        });
    }
}
