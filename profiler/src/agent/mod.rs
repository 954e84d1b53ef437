//! `bpfprof agent`: always-on system-wide profiling, built on the same collect → aggregate →
//! symbolize → render path as a run. Every window (default 60 s) becomes one pprof profile per
//! signal (on-CPU samples, off-CPU time, run-queue delay, lock waits) with per-process labels, written into a
//! directory with retention, served over HTTP and optionally pushed. Everything it holds is bounded: processes are forgotten once they have exited and
//! their window is out, their files closed when no live process maps them, symbols cached per
//! executable with a cap, queues with fixed lengths.
//!
//! Threads: the event loop (kernel maps, process announcements, timers, signals, the endpoint),
//! one renderer (symbolize + encode + write, so a slow symbolization never delays a capture), and
//! the pusher when pushing.
mod config;
pub(crate) mod credentials;
mod grpc;
mod http;
pub mod metrics;
mod otlp;
mod push;
mod render;
mod runqueue;
mod store;
mod systemd;

use std::{
    collections::{HashMap, HashSet},
    sync::{atomic::Ordering::Relaxed, mpsc as std_mpsc, Arc, Mutex},
    time::{Duration, SystemTime},
};

use anyhow::Context as _;
use bytes::Bytes;
use tokio::{
    sync::{mpsc, oneshot},
    time::Instant,
};

use crate::{
    cli::{AgentArgs, Signals},
    collect::{add_batch, monotonic_ns},
    driver::{prepare_to_load, Drained, Sink, Stops},
    error::UserError,
    model::RunMeta,
    modes::{
        lock::{LockBatch, LockCollection, Role},
        sched::TaskRecord,
    },
    preflight,
    process::Processes,
    profile::{Health, RawProfile, RawSample},
    sources::{self, sched::SchedBatch, Batch, Kind, Wants},
    start::{start, Started, Targets},
};
use http::{Endpoint, PullRequest};
use metrics::Metrics;
use push::{Destination, Pusher};
use render::{Figures, Job, LockFigures, Rendering};
use runqueue::RunQueue;
use store::Store;

/// Profiles being taken for the endpoint at once.
const MAX_PULLS: usize = 4;

pub use crate::cli::Signal;
pub use config::Config;

pub fn run(args: AgentArgs) -> anyhow::Result<i32> {
    let config = Config::from_args(&args)?;
    preflight::check_privileges()?;
    let store = Store::open(&args.output_dir, args.keep, args.max_bytes)?;
    // Bound before anything is loaded, so a port in use fails at once.
    let listener = match config.listen {
        Some(address) => Some(
            std::net::TcpListener::bind(address)
                .and_then(|l| l.set_nonblocking(true).map(|()| l))
                .map_err(|e| UserError::Listen {
                    address: address.to_string(),
                    reason: e.to_string(),
                })?,
        ),
        None => None,
    };
    let (tracefs, runtime) = prepare_to_load()?;
    runtime.block_on(agent(config, store, listener, tracefs, &args.output_dir))?;
    Ok(0)
}

/// A profile being taken for the endpoint.
struct Pull {
    signal: Signal,
    profile: RawProfile,
    /// The lock signal's records.
    locks: LockCollection,
    started: SystemTime,
    since: Instant,
    until: Instant,
    reply: oneshot::Sender<Result<Bytes, String>>,
}

/// The window being collected.
struct Window {
    /// On-CPU samples.
    profile: RawProfile,
    /// Off-CPU time by stack, in ns.
    offcpu: RawProfile,
    /// Lock waits that ended in the window.
    locks: LockCollection,
    /// The records of threads that exited during the window (for run-queue delay).
    exited: Vec<TaskRecord>,
    started: SystemTime,
    since: Instant,
    not_captured: HashSet<u32>,
}

impl Window {
    fn new() -> Window {
        Window {
            profile: RawProfile::new(),
            offcpu: RawProfile::new(),
            locks: LockCollection::default(),
            exited: Vec::new(),
            started: SystemTime::now(),
            since: Instant::now(),
            not_captured: HashSet::new(),
        }
    }
}

pub(crate) fn unix_ms(time: SystemTime) -> u64 {
    time.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

async fn agent(
    config: Config,
    store: Store,
    listener: Option<std::net::TcpListener>,
    tracefs: &std::path::Path,
    output_dir: &std::path::Path,
) -> anyhow::Result<()> {
    let metrics = Arc::new(Metrics::new(config.signals.runqueue));
    let latest: render::Latest = Arc::new(Mutex::new(HashMap::new()));
    let unwind_files = Arc::new(Mutex::new(None));
    let (jobs, renderer) = start_renderer(&config, store, latest.clone(), metrics.clone())?;
    let wake = Arc::new(tokio::sync::Notify::new());
    let endpoint = Endpoint {
        pulls: mpsc::channel(MAX_PULLS).0,
        wake: wake.clone(),
        latest,
        metrics: metrics.clone(),
        unwind_files: unwind_files.clone(),
        window: config.window,
        signals: config.signals,
    };
    let requests = serve(listener, endpoint)?;
    let everything = Targets {
        system_wide: true,
        pids: &[],
        command: None,
    };
    let Started { mut driver, .. } = start(config.recipe(), &everything, tracefs)?;
    announce(&config, output_dir);
    let mut sink = AgentSink {
        signals: config.signals,
        runqueue: RunQueue::default(),
        window: Window::new(),
        window_every: config.window,
        window_due: Instant::now() + config.window,
        closing: None,
        pulls: Vec::new(),
        requests,
        wake,
        health: Health::default(),
        metrics: metrics.clone(),
        unwind_files,
        jobs,
        notifier: systemd::Notifier::from_env(),
        live_at_stop: Vec::new(),
    };
    let mut stops = Stops {
        survive_hangup: true,
        ..Stops::default()
    };
    driver.collect(&mut stops, &mut sink).await?;
    sink.notifier.stopping();
    // Flush: what was collected since the last window is a (shorter) window of its own, with
    // the threads still alive as the scheduler's records end with them.
    let mut stopped = driver.stop(&mut sink, monotonic_ns())?;
    let live = std::mem::take(&mut sink.live_at_stop);
    sink.close_window(stopped.health, &mut stopped.procs, HashSet::new(), &live);
    for pull in sink.pulls.drain(..) {
        let _ = pull.reply.send(Err("the agent is stopping".into()));
    }
    drop(sink); // closes the renderer's queue: it finishes what it has, then the pusher
    let _ = tokio::task::spawn_blocking(move || renderer.join()).await;
    eprintln!(
        "bpfprof agent: stopped after {:.0} s: {} windows written, {} samples, {} lost",
        metrics.started.elapsed().as_secs_f64(),
        metrics.windows_written.load(Relaxed),
        metrics.health_total("samples"),
        metrics.health_total("lost_map_full")
    );
    Ok(())
}

/// The renderer thread, with its pusher and exporter, and the queue of its jobs.
fn start_renderer(
    config: &Config,
    store: Store,
    latest: render::Latest,
    metrics: Arc<Metrics>,
) -> anyhow::Result<(std_mpsc::SyncSender<Job>, std::thread::JoinHandle<()>)> {
    let pusher = config.push.clone().map(|p| Pusher::start(p, metrics.clone()));
    let exporter = config.otlp.clone().map(|p| Pusher::start(p, metrics.clone()));
    // What every window's report says of the run; each gets its own duration.
    let meta = RunMeta {
        mode: "hotspot",
        event: "cpu-clock".to_string(),
        frequency_hz: config.frequency_hz,
        period: None,
        duration_s: 0.0,
        target: "system-wide (agent)".into(),
        cpus: crate::counters::cpu::online_ids().map_or(1, |c| c.len() as u32),
        notes: Vec::new(),
        counters: config.counter_events().iter().map(|e| e.spelled()).collect(),
        weight: None,
    };
    let debuginfod = crate::symbolize::debuginfod::Debuginfod::shared(config.debuginfod.as_ref())?;
    if let Some(client) = &debuginfod {
        let _ = metrics.debuginfod.set(client.clone());
    }
    let locator = crate::symbolize::DebugLocator::new(config.debug_dirs.clone(), debuginfod.map(|d| d as _));
    Ok(render::start(
        store,
        [pusher, exporter],
        latest,
        metrics,
        meta,
        locator,
    ))
}

/// Serve the endpoint on `listener`, if there is one; the requests for profiles it takes.
fn serve(
    listener: Option<std::net::TcpListener>,
    mut endpoint: Endpoint,
) -> anyhow::Result<mpsc::Receiver<PullRequest>> {
    let (pulls, requests) = mpsc::channel::<PullRequest>(MAX_PULLS);
    if let Some(listener) = listener {
        let listener = tokio::net::TcpListener::from_std(listener).context("serving the endpoint")?;
        endpoint.pulls = pulls;
        tokio::spawn(http::serve(listener, Arc::new(endpoint)));
    }
    Ok(requests)
}

/// The agent's one line of what it does.
fn announce(config: &Config, output_dir: &std::path::Path) {
    let cpus = crate::counters::cpu::online_ids().map_or(1, |c| c.len() as u32);
    eprintln!(
        "bpfprof agent: {} on all {cpus} CPUs (samples at {} Hz); a window every {:.0} s into {}{}{}{}; SIGTERM or Ctrl-C writes the last window and stops",
        config.signals.names().join(", "),
        config.frequency_hz,
        config.window.as_secs_f64(),
        output_dir.display(),
        config.listen.map_or(String::new(), |a| format!("; endpoint http://{a}/")),
        config.push.as_ref().map_or(String::new(), |p| format!("; pushing to {}", p.url)),
        config.otlp.as_ref().map_or(String::new(), |p| {
            let protocol = match p.destination {
                Destination::OtlpGrpc => "gRPC",
                _ => "HTTP",
            };
            format!("; exporting OTLP/{protocol} to {}", p.url)
        }),
    );
}

/// The agent's sink: the current window and the endpoint's profiles in progress.
struct AgentSink {
    signals: Signals,
    /// Each thread's run-queue totals at the last window's end.
    runqueue: RunQueue,
    window: Window,
    window_every: Duration,
    /// When the current window ends: the driver drains then, and the window goes to the renderer.
    window_due: Instant,
    /// The processes that had exited before the drain that closes the window (so every sample
    /// they left is in it): forgotten after it, unless a pull still needs them.
    closing: Option<HashSet<u32>>,
    pulls: Vec<Pull>,
    /// Profiles asked for at the endpoint, each started by the drain it wakes.
    requests: mpsc::Receiver<PullRequest>,
    /// Notified by the endpoint with each request.
    wake: Arc<tokio::sync::Notify>,
    /// The kernel's cumulative counters at the last window's end.
    health: Health,
    metrics: Arc<Metrics>,
    unwind_files: Arc<Mutex<Option<Vec<crate::unwind::FileWithRows>>>>,
    jobs: std_mpsc::SyncSender<Job>,
    notifier: systemd::Notifier,
    /// The live threads' scheduler records at the stop, for the last window.
    live_at_stop: Vec<TaskRecord>,
}

impl Sink for AgentSink {
    /// The window's end, or a pull's if sooner: each ends at a drain of its own.
    fn wake_at(&self) -> Option<Instant> {
        let pulls = self.pulls.iter().map(|p| p.until);
        pulls.chain([self.window_due]).min()
    }

    fn woken(&self) -> Option<Arc<tokio::sync::Notify>> {
        Some(self.wake.clone())
    }

    /// At a window's end, the live threads' records (run-queue delay) and the threads joins
    /// wait for (lock waits named as joins).
    fn before_drain(&mut self, procs: &Processes) -> Wants {
        if Instant::now() >= self.window_due {
            self.closing = Some(
                procs
                    .pids()
                    .into_iter()
                    .filter(|pid| !std::path::Path::new(&format!("/proc/{pid}")).exists())
                    .collect(),
            );
        }
        Wants {
            current: self.closing.is_some() && (self.signals.runqueue || self.signals.lock),
        }
    }

    /// Everything the kernel recorded since the last drain, into the window and every pull
    /// already started; pulls asked for since start now (the endpoint woke this drain for them);
    /// pulls that are due go to the renderer, and so does the window when it is due.
    fn drained(&mut self, drained: Drained<'_>) -> anyhow::Result<()> {
        let Drained {
            batches,
            procs,
            tables,
            commons,
        } = drained;
        let mut live = Vec::new();
        for batch in batches {
            match batch {
                Batch::Samples(samples) => self.take_samples(samples, procs),
                Batch::Sched(batch) => live = self.take_sched(batch, procs),
                Batch::Locks(batch) => self.take_locks(batch, procs),
                Batch::Counts(_)
                | Batch::Stat(_)
                | Batch::Values(_)
                | Batch::Syscalls(_)
                | Batch::Latency(_)
                | Batch::Records(_)
                | Batch::Timeline(_) => {}
            }
        }
        // Only now: what this drain took was recorded before they were asked for.
        while let Ok(request) = self.requests.try_recv() {
            self.start_pull(request);
        }
        self.send_due_pulls(procs);
        if let Some(exited) = self.closing.take() {
            // The next window ends a window's length after this one was due, or after now if
            // this drain came later than that.
            let now = Instant::now();
            let next = self.window_due + self.window_every;
            self.window_due = match next > now {
                true => next,
                false => now + self.window_every,
            };
            let mut total = commons.health()?;
            if let Some(tables) = &tables {
                total.files_without_tables_named = tables.files_without_tables();
                total.files_without_tables = total.files_without_tables_named.len() as u64;
            }
            let forgotten = self.close_window(total, procs, exited, &live);
            if let Some(tables) = tables {
                tables.forget(&forgotten);
                self.metrics
                    .unwind_rows_used
                    .store(tables.rows_used().into(), Relaxed);
                *self.unwind_files.lock().unwrap_or_else(|e| e.into_inner()) = Some(tables.files_with_rows());
            }
        }
        self.update_gauges(procs);
        let (signals, every) = (self.signals, self.window_every);
        self.notifier.drained(|| {
            let names = signals.names().join(", ");
            format!("profiling {names}: a window every {:.0} s", every.as_secs_f64())
        });
        Ok(())
    }

    fn finished(&mut self, batches: Vec<Batch>, _procs: &mut Processes) -> anyhow::Result<()> {
        for batch in batches {
            if let Batch::Sched(batch) = batch {
                self.live_at_stop = batch.live.unwrap_or_default();
            }
        }
        Ok(())
    }
}

impl AgentSink {
    fn start_pull(&mut self, request: PullRequest) {
        if self.pulls.len() >= MAX_PULLS {
            let _ = request
                .reply
                .send(Err("too many profiles being taken at once: retry later".into()));
            return;
        }
        let since = Instant::now();
        self.pulls.push(Pull {
            signal: request.signal,
            profile: RawProfile::new(),
            locks: LockCollection::default(),
            started: SystemTime::now(),
            since,
            until: since + Duration::from_secs(request.seconds),
            reply: request.reply,
        });
    }

    /// Pulls that are due, to the renderer.
    fn send_due_pulls(&mut self, procs: &Processes) {
        let now = Instant::now();
        let (due, waiting): (Vec<Pull>, Vec<Pull>) = self.pulls.drain(..).partition(|p| p.until <= now);
        self.pulls = waiting;
        for pull in due {
            let figures = match pull.signal {
                Signal::Lock => Figures::Locks(LockFigures::new(pull.locks, Health::default(), procs)),
                _ => Figures::Stacks(pull.profile),
            };
            let profiles = vec![(pull.signal, figures)];
            let rendering = Rendering::new(profiles, procs, pull.started, pull.since.elapsed());
            if let Err(std_mpsc::TrySendError::Full(Job::Pull(_, reply))) =
                self.jobs.try_send(Job::Pull(rendering, pull.reply))
            {
                let _ = reply.send(Err("the agent is busy writing a window: retry".into()));
            }
        }
    }

    /// The pulls of the signals that are views of `kind`.
    fn pulls_of(&mut self, kind: Kind) -> impl Iterator<Item = &mut Pull> {
        (self.pulls.iter_mut()).filter(move |p| sources::kind_of_signal(p.signal) == kind)
    }

    /// On-CPU samples since the last drain, into the window and the CPU and counter pulls.
    fn take_samples(&mut self, samples: Vec<RawSample>, procs: &mut Processes) {
        for pull in self.pulls_of(Kind::CpuSamples) {
            for sample in &samples {
                pull.profile.add(sample.clone(), procs);
            }
        }
        add_batch(
            samples,
            &mut self.window.profile,
            procs,
            &mut self.window.not_captured,
        );
    }

    /// The scheduler's records since the last drain that the window needs (the rest, heatmap
    /// columns and slow waits, is let go, so nothing grows over a long run). Returns the live
    /// threads' records, when read (at a window's end).
    fn take_sched(&mut self, batch: SchedBatch, procs: &mut Processes) -> Vec<TaskRecord> {
        for pull in self.pulls.iter_mut().filter(|p| p.signal == Signal::OffCpu) {
            for sample in &batch.offcpu {
                pull.profile.add(sample.clone(), procs);
            }
        }
        let m = &self.metrics;
        m.offcpu_ns
            .fetch_add(batch.offcpu.iter().map(|s| s.count).sum(), Relaxed);
        m.offcpu_stacks_lost.store(batch.offcpu_stacks_lost, Relaxed);
        m.offcpu_sleeps_unsampled.store(batch.sleeps_unsampled, Relaxed);
        m.offcpu_sleeps_carried.store(batch.sleeps_carried, Relaxed);
        add_batch(
            batch.offcpu,
            &mut self.window.offcpu,
            procs,
            &mut self.window.not_captured,
        );
        if self.signals.runqueue {
            self.window.exited.extend(batch.exited);
        }
        batch.live.unwrap_or_default()
    }

    /// The lock waits that ended since the last drain, into the window and the lock pulls.
    fn take_locks(&mut self, batch: LockBatch, procs: &Processes) {
        for pull in self.pulls_of(Kind::Locks) {
            pull.locks.add_batch(batch.clone(), procs);
        }
        for drained in batch.records.iter().filter(|d| d.record.role == Role::Waiter) {
            self.metrics
                .lock_waits
                .fetch_add(drained.record.time.count, Relaxed);
            self.metrics
                .lock_wait_ns
                .fetch_add(drained.record.time.total_ns, Relaxed);
        }
        let m = &self.metrics;
        m.lock_stacks_freed.store(batch.health.stacks_freed, Relaxed);
        m.lock_stacks_lost.store(batch.health.stacks_lost, Relaxed);
        m.lock_stacks_stored.store(batch.health.stacks_stored, Relaxed);
        self.window.locks.add_batch(batch, procs);
    }

    /// End the window: hand it to the renderer with the kernel's counters since the last one
    /// (`total`: cumulative), and forget the processes in `exited` unless a pull still needs
    /// them; `live` is every thread's scheduler record now (for run-queue delay). Returns the
    /// processes forgotten.
    fn close_window(
        &mut self,
        total: Health,
        procs: &mut Processes,
        mut exited: HashSet<u32>,
        live: &[TaskRecord],
    ) -> HashSet<u32> {
        let window = std::mem::replace(&mut self.window, Window::new());
        let mut health = total.since(&self.health);
        health.processes_not_captured = window.not_captured.len() as u64;
        health.user_frames_by_build_id = window.profile.health.user_frames_by_build_id;
        health.python_unnamed = window.profile.health.python_unnamed;
        health.drains = window.profile.health.drains.max(window.offcpu.health.drains);
        health.files_without_tables = total.files_without_tables;
        health.files_without_tables_named = total.files_without_tables_named.clone();
        self.health = total;
        self.metrics.count_window(&health);
        // Each profile says what its source lost, and what every source shares.
        let of = |signal: Signal| health.of(&[sources::kind_of_signal(signal)]);
        let mut profiles = Vec::new();
        // The CPU and counters profiles are two views of the same samples.
        let (cpu, counters) = match (self.signals.cpu, self.signals.counters) {
            (true, true) => (Some(window.profile.clone()), Some(window.profile)),
            (true, false) => (Some(window.profile), None),
            (false, true) => (None, Some(window.profile)),
            (false, false) => (None, None),
        };
        for (signal, profile) in [(Signal::Cpu, cpu), (Signal::Counters, counters)] {
            if let Some(mut profile) = profile {
                profile.health = of(signal);
                profiles.push((signal, Figures::Stacks(profile)));
            }
        }
        if self.signals.offcpu {
            let mut offcpu = window.offcpu;
            offcpu.health = of(Signal::OffCpu);
            profiles.push((Signal::OffCpu, Figures::Stacks(offcpu)));
        }
        if self.signals.runqueue {
            let waits = self.runqueue.window(&window.exited, live);
            for (total, n) in self.metrics.runqueue_buckets.iter().zip(waits.buckets) {
                total.fetch_add(n, Relaxed);
            }
            self.metrics.runqueue_delay_ns.fetch_add(waits.delay_ns, Relaxed);
            self.metrics
                .runqueue_threads
                .store(self.runqueue.threads() as u64, Relaxed);
            procs.label_unknown(waits.threads.iter().map(|t| t.pid));
            profiles.push((Signal::RunQueue, Figures::Threads(waits.threads)));
        }
        if self.signals.lock {
            let locks = LockFigures::new(window.locks, of(Signal::Lock), procs);
            profiles.push((Signal::Lock, Figures::Locks(locks)));
        }
        let rendering = Rendering::new(profiles, procs, window.started, window.since.elapsed());
        if self.jobs.try_send(Job::Window(rendering)).is_err() {
            self.metrics.windows_dropped.fetch_add(1, Relaxed);
            log::warn!("a window was dropped: the previous one is still being symbolized");
        }
        for pull in &self.pulls {
            exited.retain(|pid| !pull.profile.stacks.keys().any(|k| k.pid == *pid));
        }
        procs.forget(&exited);
        self.update_gauges(procs);
        exited
    }

    fn update_gauges(&self, procs: &Processes) {
        self.metrics
            .processes_tracked
            .store(procs.process_count() as u64, Relaxed);
        self.metrics.files_open.store(procs.file_count() as u64, Relaxed);
    }
}
