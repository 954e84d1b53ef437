//! The one collection loop. A run, `top` and the agent all load through it, drain on its tick,
//! stop on its conditions and detach in its order; they differ only in the sink each drained
//! batch goes to: a run's keeps everything for the report at the end, `top`'s redraws the
//! screen, the agent's cuts windows and serves pulls. A replay source drives the same loop in
//! the unit tests.
use std::{
    os::fd::{FromRawFd as _, OwnedFd, RawFd},
    path::Path,
    sync::Arc,
};

use anyhow::Context as _;
use aya::maps::{MapData, RingBuf};
use profiler_common::{names, said, ProcessEvent, ProcessEventKind};
use tokio::{
    io::unix::AsyncFd,
    signal::unix::{signal, Signal, SignalKind},
    sync::Notify,
    time::{interval, sleep_until, Instant, MissedTickBehavior},
};

use crate::{
    bpf::{KernelLogs, LoadOptions, Loaded},
    collect::{Commons, KernelCommons},
    launcher::RunningCommand,
    preflight,
    process::{Announced, Processes},
    profile::Health,
    sources::{Batch, Source, Wants},
    unwind::Tables,
};

/// Where each drain's batches go.
pub(crate) trait Sink {
    /// One drain's batches.
    fn drained(&mut self, drained: Drained<'_>) -> anyhow::Result<()>;
    /// The sources' last batches, once collection is over (what was still in flight).
    fn finished(&mut self, _batches: Vec<Batch>, _procs: &mut Processes) -> anyhow::Result<()> {
        Ok(())
    }
    /// A moment the sink wants a drain at, besides the regular ones (the end of an agent window).
    fn wake_at(&self) -> Option<Instant> {
        None
    }
    /// Notified when the sink wants a drain now (the agent, when a pull is asked for).
    fn woken(&self) -> Option<Arc<Notify>> {
        None
    }
    /// Just before a drain: a process that has exited by now left every sample it will ever
    /// leave in the records about to be drained. What the drain should bring besides.
    fn before_drain(&mut self, _procs: &Processes) -> Wants {
        Wants::default()
    }
}

/// A sink for what is read once, at the end (`trace`, `latency`): the sources' last batches.
#[derive(Default)]
pub(crate) struct AtEnd {
    pub batches: Vec<Batch>,
}

impl Sink for AtEnd {
    fn drained(&mut self, _drained: Drained<'_>) -> anyhow::Result<()> {
        Ok(())
    }

    fn finished(&mut self, batches: Vec<Batch>, _procs: &mut Processes) -> anyhow::Result<()> {
        self.batches.extend(batches);
        Ok(())
    }
}

/// What takes each batch as it comes (`record`, `sched record`: written out at once).
pub(crate) trait Stream {
    fn take(&mut self, batch: Batch, procs: &mut Processes);
}

/// A sink handing every batch to its `Stream`, a drain every `every` (a ring read often enough
/// never to fill).
pub(crate) struct Streaming<T> {
    pub stream: T,
    every: std::time::Duration,
    next: Instant,
}

impl<T: Stream> Streaming<T> {
    pub fn new(stream: T, every: std::time::Duration) -> Streaming<T> {
        Streaming {
            stream,
            every,
            next: Instant::now() + every,
        }
    }
}

impl<T: Stream> Sink for Streaming<T> {
    fn drained(&mut self, drained: Drained<'_>) -> anyhow::Result<()> {
        self.next = Instant::now() + self.every;
        for batch in drained.batches {
            self.stream.take(batch, drained.procs);
        }
        Ok(())
    }

    fn wake_at(&self) -> Option<Instant> {
        Some(self.next)
    }

    fn finished(&mut self, batches: Vec<Batch>, procs: &mut Processes) -> anyhow::Result<()> {
        for batch in batches {
            self.stream.take(batch, procs);
        }
        Ok(())
    }
}

/// What a sink is handed after each drain.
pub(crate) struct Drained<'a> {
    /// Each source's batch, in the sources' order.
    pub batches: Vec<Batch>,
    pub procs: &'a mut Processes,
    /// The table walker's rows, when tables are walked.
    pub tables: Option<&'a mut Tables>,
    /// For the kernel's counters of what was recorded, lost and damaged.
    pub commons: &'a dyn Commons,
}

/// Why the loop ended.
#[derive(Debug, PartialEq)]
pub(crate) enum Stop {
    Duration,
    Interrupted,
    Terminated,
    CommandExited(i32),
    TargetsExited,
}

/// What ends the loop besides SIGINT and SIGTERM.
#[derive(Default)]
pub(crate) struct Stops {
    pub deadline: Option<Instant>,
    /// The command being profiled: its exit ends the run.
    pub command: Option<RunningCommand>,
    /// `-p` targets: the run ends once all have exited.
    pub targets: Vec<AsyncFd<OwnedFd>>,
    /// SIGHUP is answered with a line and otherwise ignored (the agent), instead of ending
    /// bpfprof as it does by default.
    pub survive_hangup: bool,
    /// A run on a terminal: its status line, updated at each drain and erased at the end.
    pub status: Option<crate::status::StatusLine>,
}

/// What was loaded and what is drained from it.
pub(crate) struct Driver<K = Loaded> {
    /// What stays attached while the loop runs: dropped last, which detaches every program and
    /// closes every perf event.
    pub kernel: K,
    /// The ring the kernel announces new processes and changed mappings in.
    events: Option<AsyncFd<RingBuf<MapData>>>,
    /// The programs' log lines (rare paths, at debug): one more thing the loop wakes for.
    kernel_logs: Option<AsyncFd<KernelLogs>>,
    pub sources: Sources,
    unix_signals: UnixSignals,
}

/// The Unix signals that end the loop, listened for from the moment of loading: one that
/// arrives while programs are being attached, or just after "Ctrl-C to stop" is printed, still
/// ends the run with its report (at the loop's start) instead of killing bpfprof.
struct UnixSignals {
    interrupt: Signal,
    terminate: Signal,
    child: Signal,
}

impl UnixSignals {
    fn listen() -> std::io::Result<UnixSignals> {
        Ok(UnixSignals {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
            child: signal(SignalKind::child())?,
        })
    }
}

/// The sources drained at each tick, what they share in the kernel, and what follows the
/// processes they name.
pub(crate) struct Sources {
    commons: Box<dyn Commons>,
    attached: Vec<Box<dyn Source>>,
    pub procs: Processes,
    pub tables: Option<Tables>,
}

/// What the loop leaves once everything is drained and detached.
pub(crate) struct Stopped {
    /// The kernel's counters at the end, with what only user space knows of the run.
    pub health: Health,
    pub procs: Processes,
    /// What the sources say of their figures (`Source::notes`).
    pub notes: Vec<String>,
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

impl Driver<Loaded> {
    /// Load the programs, and what follows processes for symbolization: the processes label
    /// each capture with the exec generation the kernel counts, and the unwinder (where tables
    /// are walked) gets each capture's mappings. Nothing is attached yet but the loader's own.
    pub fn load(options: &LoadOptions<'_>) -> anyhow::Result<Self> {
        let mut loaded = Loaded::load(options)?;
        let mut procs = Processes::new();
        let generations = crate::collect::take_map(&mut loaded.ebpf, names::EXEC_GENERATIONS)?;
        let generations: aya::maps::HashMap<MapData, u32, u32> = aya::maps::HashMap::try_from(generations)?;
        procs.with_generations(move |pid| generations.get(&pid, 0).unwrap_or(0));
        let tables = match options.walks_tables() {
            true => {
                procs.record_captures();
                let mut take = |name| crate::collect::take_map(&mut loaded.ebpf, name);
                Some(Tables::new(
                    take(names::UNWIND_ROWS)?,
                    take(names::UNWIND_PROCESSES)?,
                    take(names::PY_PROCESSES)?,
                )?)
            }
            false => None,
        };
        let commons = KernelCommons::take(&mut loaded.ebpf)?;
        let events = crate::collect::take_map(&mut loaded.ebpf, names::EVENTS)?;
        // SAFETY: the ring buffer owns its descriptor and outlives the registration (both are
        // dropped together).
        let events = unsafe { AsyncFd::register(RingBuf::try_from(events)?) }
            .map_err(|e| anyhow::anyhow!("watching the event ring: {e}"))?;
        let kernel_logs = loaded
            .kernel_logs
            .take()
            // SAFETY: as for the event ring: the logger owns its ring's descriptor, and both are
            // dropped together.
            .map(|logs| {
                unsafe { AsyncFd::register_with_interest(logs, tokio::io::Interest::READABLE) }
                    .map_err(|e| anyhow::anyhow!("watching the programs' log ring: {e}"))
            })
            .transpose()?;
        Ok(Driver {
            kernel: loaded,
            events: Some(events),
            kernel_logs,
            unix_signals: UnixSignals::listen()?,
            sources: Sources {
                commons: Box::new(commons),
                attached: Vec::new(),
                procs,
                tables,
            },
        })
    }
}

impl<K> Driver<K> {
    /// A driver over recorded batches, with nothing loaded: for tests of everything after
    /// collection.
    #[cfg(test)]
    pub fn replay(kernel: K, commons: crate::collect::ReplayCommons, sources: Vec<Box<dyn Source>>) -> Self {
        Driver {
            kernel,
            events: None,
            kernel_logs: None,
            unix_signals: UnixSignals::listen().expect("listening for signals"),
            sources: Sources {
                commons: Box::new(commons),
                attached: sources,
                procs: Processes::new(),
                tables: None,
            },
        }
    }

    /// Drain every `DRAIN_EVERY` (and whenever the sink asks) until a stop condition; what
    /// the kernel announces is captured as it comes.
    pub async fn collect(&mut self, stops: &mut Stops, sink: &mut dyn Sink) -> anyhow::Result<Stop> {
        // Registered only where it is survived: a handler stays for the life of the process.
        let mut sighup = stops
            .survive_hangup
            .then(|| signal(SignalKind::hangup()))
            .transpose()?;
        // The only periodic wake-up: everything else (signals, exits, new processes) wakes us itself.
        let mut drain_timer = interval(crate::collect::DRAIN_EVERY);
        drain_timer.set_missed_tick_behavior(MissedTickBehavior::Delay);
        drain_timer.tick().await;
        let targets_exited = all_exited(&stops.targets);
        tokio::pin!(targets_exited);
        let until_deadline = until(stops.deadline);
        tokio::pin!(until_deadline);
        let Driver {
            events,
            kernel_logs,
            sources,
            unix_signals: signals,
            ..
        } = self;
        loop {
            tokio::select! {
                _ = &mut until_deadline => return Ok(Stop::Duration),
                _ = signals.interrupt.recv() => return Ok(Stop::Interrupted),
                _ = signals.terminate.recv() => return Ok(Stop::Terminated),
                _ = received(&mut sighup) => {
                    eprintln!("bpfprof agent: SIGHUP: nothing to reload (settings are read at start); carrying on");
                }
                _ = signals.child.recv() => {
                    if let Some(code) = stops.command.as_mut().and_then(RunningCommand::try_wait) {
                        return Ok(Stop::CommandExited(code));
                    }
                }
                guard = announced(events) => {
                    let mut guard = guard?;
                    capture_announced(guard.get_inner_mut(), &mut sources.procs);
                    guard.clear_ready();
                    sources.give_tables();
                }
                guard = logged(kernel_logs) => {
                    let mut guard = guard?;
                    guard.get_inner_mut().flush();
                    guard.clear_ready();
                }
                _ = &mut targets_exited => return Ok(Stop::TargetsExited),
                _ = drain_timer.tick() => {
                    // Also a safety net for a SIGCHLD that raced the handler's registration.
                    if let Some(code) = stops.command.as_mut().and_then(RunningCommand::try_wait) {
                        return Ok(Stop::CommandExited(code));
                    }
                    sources.drain(sink)?;
                    if let (Some(status), Ok(health)) = (&mut stops.status, sources.commons.health()) {
                        status.progress(&health);
                    }
                }
                _ = until(sink.wake_at()) => sources.drain(sink)?,
                _ = notified(sink.woken()) => sources.drain(sink)?,
            }
        }
    }

    /// The last records, from both epoch slots so nothing recorded is left behind, then what
    /// the sources still hold (open scheduler states end at `stopped_ns`); detaches everything.
    pub fn stop(self, sink: &mut dyn Sink, stopped_ns: u64) -> anyhow::Result<Stopped> {
        let Driver {
            kernel,
            mut events,
            kernel_logs,
            mut sources,
            ..
        } = self;
        for source in &mut sources.attached {
            source.stopping();
        }
        if let Some(mut logs) = kernel_logs {
            logs.get_mut().flush();
        }
        if let Some(events) = &mut events {
            capture_announced(events.get_mut(), &mut sources.procs);
        }
        sources.drain(sink)?;
        sources.drain(sink)?;
        let mut finished = Vec::new();
        for source in &mut sources.attached {
            finished.extend(source.finish(stopped_ns, &mut sources.procs)?);
        }
        sink.finished(finished, &mut sources.procs)?;
        let mut health = sources.commons.health()?;
        let mut notes = Vec::new();
        for source in &sources.attached {
            source.add_health(&mut health);
            notes.extend(source.notes());
        }
        health.files_without_tables_named = sources
            .tables
            .as_ref()
            .map(Tables::files_without_tables)
            .unwrap_or_default();
        health.files_without_tables = health.files_without_tables_named.len() as u64;
        health.program_runs_missed = crate::bpf::program_runs_missed();
        let Sources { attached, procs, .. } = sources;
        drop(events);
        drop(attached);
        drop(kernel);
        Ok(Stopped { health, procs, notes })
    }
}

impl Sources {
    /// A source attached by the start path, drained from now on.
    pub fn add(&mut self, source: Box<dyn Source>) {
        self.attached.push(source);
    }

    /// The one drain: one epoch flip for every source.
    fn drain(&mut self, sink: &mut dyn Sink) -> anyhow::Result<()> {
        let wants = sink.before_drain(&self.procs);
        let flip = self.commons.flip()?;
        let mut batches = Vec::with_capacity(self.attached.len());
        for source in &mut self.attached {
            batches.extend(source.drain(flip, wants, &mut self.procs)?);
        }
        sink.drained(Drained {
            batches,
            procs: &mut self.procs,
            tables: self.tables.as_mut(),
            commons: &*self.commons,
        })?;
        self.give_tables();
        Ok(())
    }

    /// Give the table walker the mappings (and files' tables) of processes captured since last
    /// time: new targets, and processes whose map changed (exec, dlopen). A process it cannot be
    /// given is walked with frame pointers.
    pub fn give_tables(&mut self) {
        let Some(tables) = &mut self.tables else {
            return;
        };
        for (pid, maps) in self.procs.take_captured() {
            match tables.load_process(pid, &maps) {
                Ok(Some(python)) => self.procs.python_found(pid, python),
                Ok(None) => {}
                Err(e) => log::warn!("unwind tables for pid {pid}: {e:#}"),
            }
        }
    }
}

/// Capture the memory map of every process the kernel announced, while it is alive (or only its
/// labels, where that is all it asked for). A process announced as changed many times over (a
/// loader mapping libraries, a runtime mapping code in a loop) is read once, after the ring is
/// drained, unless it was captured since (what it announced before its capture, the capture
/// read). The ring fills while it is read: what a process announces after its capture began is
/// read again at the end (a new process captured on its way into `execve`, announced again
/// after it).
fn capture_announced(ring: &mut RingBuf<MapData>, procs: &mut Processes) {
    use std::collections::{BTreeSet, HashSet};
    let (mut changed, mut again, mut captured) = (BTreeSet::new(), BTreeSet::new(), HashSet::new());
    while let Some(item) = ring.next() {
        if item.len() < std::mem::size_of::<ProcessEvent>() {
            continue;
        }
        // SAFETY: the ring carries only `ProcessEvent`s, checked for length above.
        let event: ProcessEvent = unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) };
        let _ = match event.kind {
            k if k == ProcessEventKind::MappingsChanged as u32 => {
                changed.insert(event.tgid);
                Ok(())
            }
            k if k == ProcessEventKind::PythonCode as u32 => {
                procs.python_code(event.tgid, event.value);
                Ok(())
            }
            k if k == ProcessEventKind::Labelled as u32 => {
                procs.label(event.tgid, &what_was_said(&event));
                Ok(())
            }
            // (A first sample again: an exec, or the pid another process's; captured anew.)
            _ if captured.contains(&event.tgid) => {
                label_if_said(procs, &event);
                again.insert(event.tgid);
                Ok(())
            }
            _ => {
                captured.insert(event.tgid);
                changed.remove(&event.tgid);
                label_if_said(procs, &event);
                procs.capture(event.tgid)
            }
        };
    }
    for tgid in &again {
        let _ = procs.capture(*tgid);
    }
    for tgid in changed.difference(&again) {
        let _ = procs.refresh_changed(*tgid);
    }
}

/// A first sample's announcement with its labels (the scheduler's): its labels first, which its
/// capture then need not read.
fn label_if_said(procs: &mut Processes, event: &ProcessEvent) {
    if event.labels & said::LABELS != 0 {
        procs.label(event.tgid, &what_was_said(event));
    }
}

/// What an event says of its process's labels.
fn what_was_said(event: &ProcessEvent) -> Announced {
    let name = event.comm.split(|&b| b == 0).next().unwrap_or_default();
    Announced {
        comm: (!name.is_empty()).then(|| String::from_utf8_lossy(name).into_owned()),
        cgroup_id: event.value,
        generation: event.generation,
        executable: (event.labels & said::EXECUTABLE != 0).then_some(event.executable),
    }
}

type ReadyRing<'a> = tokio::io::unix::AsyncFdReadyMutGuard<'a, RingBuf<MapData>>;

/// The event ring once it has something; never, without one.
async fn announced(events: &mut Option<AsyncFd<RingBuf<MapData>>>) -> std::io::Result<ReadyRing<'_>> {
    match events {
        Some(events) => events.readable_mut().await,
        None => std::future::pending().await,
    }
}

async fn logged(
    logs: &mut Option<AsyncFd<KernelLogs>>,
) -> std::io::Result<tokio::io::unix::AsyncFdReadyMutGuard<'_, KernelLogs>> {
    match logs {
        Some(logs) => logs.readable_mut().await,
        None => std::future::pending().await,
    }
}

async fn received(signal: &mut Option<Signal>) {
    match signal {
        Some(signal) => {
            signal.recv().await;
        }
        None => std::future::pending().await,
    }
}

/// Resolves at `deadline`; never, without one.
async fn until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// Resolves when notified; never, without a notifier.
async fn notified(notify: Option<Arc<Notify>>) {
    match notify {
        Some(notify) => notify.notified().await,
        None => std::future::pending().await,
    }
}

/// A descriptor that becomes readable when the process exits (a zombie counts as exited), and
/// that keeps naming the same process even if its pid is reused.
pub(crate) fn pidfd(pid: u32) -> std::io::Result<AsyncFd<OwnedFd>> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        collect::{add_batch, monotonic_ns, ReplayCommons},
        profile::{RawProfile, RawSample, StackRead},
        sources::samples::Replay,
    };
    use std::time::Duration;

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

    /// A sink as a run's: everything into one profile; counts its drains and wake-ups.
    #[derive(Default)]
    struct Keeps {
        profile: RawProfile,
        drains: u32,
        wake_at: Option<Instant>,
        woken: u32,
    }

    impl Sink for Keeps {
        fn drained(&mut self, drained: Drained<'_>) -> anyhow::Result<()> {
            self.drains += 1;
            if self.wake_at.is_some_and(|at| Instant::now() >= at) {
                self.woken += 1;
                self.wake_at = None;
            }
            for batch in drained.batches {
                if let Batch::Samples(samples) = batch {
                    add_batch(samples, &mut self.profile, drained.procs, &mut Default::default());
                }
            }
            Ok(())
        }

        fn wake_at(&self) -> Option<Instant> {
            self.wake_at
        }
    }

    fn sample(pid: u32, count: u64) -> RawSample {
        RawSample {
            pid,
            tid: pid,
            comm: "w".into(),
            user: StackRead::Absent,
            kernel: StackRead::Frames(vec![0xffff_ffff_8100_0000]),
            count,
            exec_generation: 0,
            event: 0,
            deltas: Default::default(),
            user_objects: Vec::new(),
        }
    }

    /// The loop a run takes, on recorded batches and a paused clock: a drain a second, one more
    /// when the sink asks, and the two of the stop; every batch reaches the sink once.
    #[test]
    fn replayed_batches_reach_the_sink_at_each_drain_and_at_the_stop() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap();
        runtime.block_on(async {
            let batches = (1..=6).map(|n| vec![sample(7, n)]).collect();
            let commons = ReplayCommons {
                health: Health::default(),
            };
            let mut driver = Driver::replay((), commons, vec![Box::new(Replay::new(batches))]);
            let started = Instant::now();
            let mut sink = Keeps {
                wake_at: Some(started + Duration::from_millis(1500)),
                ..Default::default()
            };
            let mut stops = Stops {
                deadline: Some(started + Duration::from_millis(3500)),
                ..Default::default()
            };
            let stop = driver.collect(&mut stops, &mut sink).await.unwrap();
            assert_eq!(stop, Stop::Duration);
            // Ticks at 1, 2 and 3 s, and the sink's own at 1.5 s.
            assert_eq!((sink.drains, sink.woken), (4, 1));
            driver.stop(&mut sink, monotonic_ns()).unwrap();
            assert_eq!(sink.drains, 6);
            assert_eq!(sink.profile.total_samples(), (1..=6).sum::<u64>());
        });
    }
}
