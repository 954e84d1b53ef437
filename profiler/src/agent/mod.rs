//! `bpfprof agent`: always-on system-wide sampling, built on the same collect → aggregate →
//! symbolize → render path as a run. Every window (default 60 s) becomes a pprof profile with
//! per-process labels, written into a directory with retention, served over HTTP and optionally
//! pushed. Everything it holds is bounded: processes are forgotten once they have exited and
//! their window is out, their files closed when no live process maps them, symbols cached per
//! executable with a cap, queues with fixed lengths.
//!
//! Threads: the event loop (kernel maps, process announcements, timers, signals, the endpoint),
//! one renderer (symbolize + encode + write, so a slow symbolization never delays a capture), and
//! the pusher when pushing.
mod http;
pub mod metrics;
mod push;
mod store;

use std::{
    collections::{HashMap, HashSet},
    net::SocketAddr,
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
    bpf::LoadOptions,
    cli::{AgentArgs, Event, OffCpuStacks, Unwind},
    collect::add_batch,
    driver::{monotonic_ns, prepare_to_load, Drained, Driver, Sink, Stops},
    error::UserError,
    model::RunMeta,
    modes::hotspot,
    preflight,
    process::{FileId, FileSnapshot, ProcessInfo, Processes, UserAddr},
    profile::{Health, RawProfile},
    report::pprof,
    symbolize::Symbolizer,
};
use http::{Endpoint, PullRequest};
use metrics::Metrics;
use push::{PushConfig, Pusher, Upload};
use store::Store;

/// Profiles being taken for the endpoint at once.
const MAX_PULLS: usize = 4;
/// Profiles waiting for the renderer; beyond, a window is dropped (and counted).
const RENDER_QUEUE: usize = 2;

pub struct Config {
    pub frequency_hz: u64,
    pub window: Duration,
    pub listen: Option<SocketAddr>,
    pub push: Option<PushConfig>,
    pub unwind: Unwind,
    pub sample_map_entries: Option<u32>,
}

impl Config {
    fn from_args(args: &AgentArgs) -> Result<Config, UserError> {
        preflight::check_frequency(args.frequency)?;
        if args.window < 1.0 {
            return Err(UserError::Usage("--window: at least 1 second".into()));
        }
        let listen = match args.listen.as_str() {
            "off" | "none" => None,
            address => Some(address.parse().map_err(|_| UserError::Listen {
                address: address.into(),
                reason: "not an address (e.g. 127.0.0.1:7071, or [::1]:7071)".into(),
            })?),
        };
        let push = match &args.push {
            Some(url) if !url.starts_with("http://") => {
                return Err(UserError::Usage(format!(
                    "--push {url}: give an http:// URL (for https, push through a local TLS proxy)"
                )))
            }
            Some(url) => Some(PushConfig {
                url: url.clone(),
                name: args.push_name.clone(),
                capacity: args.push_queue.max(1),
                timeout: Duration::from_secs_f64(args.push_timeout),
                frequency_hz: args.frequency,
            }),
            None => None,
        };
        Ok(Config {
            frequency_hz: args.frequency,
            window: Duration::from_secs_f64(args.window),
            listen,
            push,
            unwind: args.unwind,
            sample_map_entries: args.sample_map_entries,
        })
    }
}

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

/// One profile to symbolize and encode, with what it needs of processes that may be gone.
struct Rendering {
    profile: RawProfile,
    files: FileSnapshot,
    labels: HashMap<u32, ProcessInfo>,
    started: SystemTime,
    duration: Duration,
}

enum Job {
    Window(Rendering),
    Pull(Rendering, oneshot::Sender<Result<Bytes, String>>),
}

/// A profile being taken for the endpoint.
struct Pull {
    profile: RawProfile,
    started: SystemTime,
    since: Instant,
    until: Instant,
    reply: oneshot::Sender<Result<Bytes, String>>,
}

/// The window being collected.
struct Window {
    profile: RawProfile,
    started: SystemTime,
    since: Instant,
    not_captured: HashSet<u32>,
}

impl Window {
    fn new() -> Window {
        Window {
            profile: RawProfile::new(),
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
    let metrics = Arc::new(Metrics::default());
    let latest = Arc::new(Mutex::new(None));
    let unwind_files = Arc::new(Mutex::new(None));
    let pusher = config.push.clone().map(|p| Pusher::start(p, metrics.clone()));
    let cpus = crate::counters::cpu::online_ids().map_or(1, |c| c.len() as u32);
    // What every window's report says of the run; each gets its own duration.
    let meta = RunMeta {
        mode: "hotspot",
        event: Event::CpuClock.name(),
        frequency_hz: config.frequency_hz,
        duration_s: 0.0,
        target: "system-wide (agent)".into(),
        cpus,
        notes: Vec::new(),
        counters: Vec::new(),
    };
    let (jobs, renderer) = start_renderer(store, pusher, latest.clone(), metrics.clone(), meta);
    let (pull_tx, pull_rx) = mpsc::channel::<PullRequest>(MAX_PULLS);
    if let Some(listener) = listener {
        let listener = tokio::net::TcpListener::from_std(listener).context("serving the endpoint")?;
        let endpoint = Arc::new(Endpoint {
            pulls: pull_tx,
            latest,
            metrics: metrics.clone(),
            unwind_files: unwind_files.clone(),
            window: config.window,
        });
        tokio::spawn(http::serve(listener, endpoint));
    } else {
        drop(pull_tx);
    }

    let options = LoadOptions {
        sampling: true,
        sched: None,
        filter: false,
        slow_threshold_ns: u64::MAX,
        offcpu_stacks: OffCpuStacks::None,
        counters: 0,
        unwind_tables: config.unwind == Unwind::Tables,
        lock: None,
        nvcsw_offset: None,
        sample_map_entries: config.sample_map_entries,
        tracefs,
    };
    let mut driver = Driver::load(&options)?;
    driver.kernel.attach_process_tracking()?;
    driver
        .kernel
        .attach_sampling(Event::CpuClock, config.frequency_hz)?;
    eprintln!(
        "bpfprof agent: sampling all {cpus} CPUs at {} Hz; a window every {:.0} s into {}{}{}; SIGTERM or Ctrl-C writes the last window and stops",
        config.frequency_hz,
        config.window.as_secs_f64(),
        output_dir.display(),
        config.listen.map_or(String::new(), |a| format!("; endpoint http://{a}/")),
        config.push.as_ref().map_or(String::new(), |p| format!("; pushing to {}", p.url)),
    );

    let mut collector = AgentCollector {
        window: Window::new(),
        window_every: config.window,
        window_due: Instant::now() + config.window,
        closing: None,
        pulls: Vec::new(),
        requests: pull_rx,
        health: Health::default(),
        metrics: metrics.clone(),
        unwind_files,
        jobs,
    };
    let mut stops = Stops {
        survive_hangup: true,
        ..Stops::default()
    };
    driver.collect(&mut stops, &mut collector).await?;
    // Flush: what was collected since the last window is a (shorter) window of its own.
    let mut stopped = driver.stop(&mut collector, monotonic_ns())?;
    collector.close_window(stopped.health, &mut stopped.procs, HashSet::new());
    for pull in collector.pulls.drain(..) {
        let _ = pull.reply.send(Err("the agent is stopping".into()));
    }
    drop(collector); // closes the renderer's queue: it finishes what it has, then the pusher
    let _ = tokio::task::spawn_blocking(move || renderer.join()).await;
    eprintln!(
        "bpfprof agent: stopped after {:.0} s: {} windows written, {} samples, {} lost",
        metrics.started.elapsed().as_secs_f64(),
        metrics.windows_written.load(Relaxed),
        metrics.samples.load(Relaxed),
        metrics.samples_lost.load(Relaxed)
    );
    Ok(())
}

/// The agent's sink: the current window and the endpoint's profiles in progress.
struct AgentCollector {
    window: Window,
    window_every: Duration,
    /// When the current window ends: the driver drains then, and the window goes to the renderer.
    window_due: Instant,
    /// The processes that had exited before the drain that closes the window (so every sample
    /// they left is in it): forgotten after it, unless a pull still needs them.
    closing: Option<HashSet<u32>>,
    pulls: Vec<Pull>,
    /// Profiles asked for at the endpoint, started at the next drain.
    requests: mpsc::Receiver<PullRequest>,
    /// The kernel's cumulative counters at the last window's end.
    health: Health,
    metrics: Arc<Metrics>,
    unwind_files: Arc<Mutex<Option<Vec<crate::unwind::FileWithRows>>>>,
    jobs: std_mpsc::SyncSender<Job>,
}

impl Sink for AgentCollector {
    fn wake_at(&self) -> Option<Instant> {
        Some(self.window_due)
    }

    fn before_drain(&mut self, procs: &Processes) {
        if Instant::now() >= self.window_due {
            self.closing = Some(
                procs
                    .pids()
                    .into_iter()
                    .filter(|pid| !std::path::Path::new(&format!("/proc/{pid}")).exists())
                    .collect(),
            );
        }
    }

    /// Everything the kernel recorded since the last drain, into the window and every pull;
    /// pulls that are due go to the renderer, and so does the window when it is due.
    fn drained(&mut self, drained: Drained<'_>) -> anyhow::Result<()> {
        while let Ok(request) = self.requests.try_recv() {
            self.start_pull(request);
        }
        let Drained {
            samples,
            procs,
            tables,
            source,
            ..
        } = drained;
        for pull in &mut self.pulls {
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
        let now = Instant::now();
        let (due, waiting): (Vec<Pull>, Vec<Pull>) = self.pulls.drain(..).partition(|p| p.until <= now);
        self.pulls = waiting;
        for pull in due {
            let rendering = rendering(pull.profile, procs, pull.started, pull.since.elapsed());
            if let Err(std_mpsc::TrySendError::Full(Job::Pull(_, reply))) =
                self.jobs.try_send(Job::Pull(rendering, pull.reply))
            {
                let _ = reply.send(Err("the agent is busy writing a window: retry".into()));
            }
        }
        if let Some(exited) = self.closing.take() {
            // The next window ends a window's length after this one was due, or after now if
            // this drain came later than that.
            let next = self.window_due + self.window_every;
            self.window_due = match next > now {
                true => next,
                false => now + self.window_every,
            };
            let forgotten = self.close_window(source.health()?, procs, exited);
            if let Some(tables) = tables {
                tables.forget(&forgotten);
                self.metrics
                    .unwind_rows_used
                    .store(tables.rows_used().into(), Relaxed);
                *self.unwind_files.lock().unwrap_or_else(|e| e.into_inner()) = Some(tables.files_with_rows());
            }
        }
        self.update_gauges(procs);
        Ok(())
    }
}

impl AgentCollector {
    fn start_pull(&mut self, request: PullRequest) {
        if self.pulls.len() >= MAX_PULLS {
            let _ = request
                .reply
                .send(Err("too many profiles being taken at once: retry later".into()));
            return;
        }
        let since = Instant::now();
        self.pulls.push(Pull {
            profile: RawProfile::new(),
            started: SystemTime::now(),
            since,
            until: since + Duration::from_secs(request.seconds),
            reply: request.reply,
        });
    }

    /// End the window: hand it to the renderer with the kernel's counters since the last one
    /// (`total`: cumulative), and forget the processes in `exited` unless a pull still needs
    /// them. Returns the processes forgotten.
    fn close_window(
        &mut self,
        total: Health,
        procs: &mut Processes,
        mut exited: HashSet<u32>,
    ) -> HashSet<u32> {
        let window = std::mem::replace(&mut self.window, Window::new());
        let mut health = total.sampling_since(&self.health);
        health.processes_not_captured = window.not_captured.len() as u64;
        health.user_frames_by_build_id = window.profile.health.user_frames_by_build_id;
        self.health = total;
        self.count(&health);
        let mut profile = window.profile;
        profile.health = health;
        let rendering = rendering(profile, procs, window.started, window.since.elapsed());
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

    fn count(&self, health: &Health) {
        let m = &self.metrics;
        m.samples.fetch_add(health.samples, Relaxed);
        m.samples_lost.fetch_add(health.lost_map_full, Relaxed);
        m.stack_collisions.fetch_add(health.collisions(), Relaxed);
        m.stack_errors
            .fetch_add(health.user_stack_errors + health.kernel_stack_errors, Relaxed);
        m.process_events_lost
            .fetch_add(health.process_events_lost, Relaxed);
        m.processes_not_captured
            .fetch_add(health.processes_not_captured, Relaxed);
    }

    fn update_gauges(&self, procs: &Processes) {
        self.metrics
            .processes_tracked
            .store(procs.process_count() as u64, Relaxed);
        self.metrics.files_open.store(procs.file_count() as u64, Relaxed);
    }
}

/// A profile with the files and labels of its processes, taken now (they may be forgotten later).
fn rendering(profile: RawProfile, procs: &Processes, started: SystemTime, duration: Duration) -> Rendering {
    let mut files: HashSet<FileId> = HashSet::new();
    let mut pids: HashSet<u32> = HashSet::new();
    for key in profile.stacks.keys() {
        pids.insert(key.pid);
        files.extend(key.user.iter().filter_map(|a| match a {
            UserAddr::File { file, .. } => Some(*file),
            _ => None,
        }));
    }
    Rendering {
        files: procs.snapshot(files),
        labels: pids
            .into_iter()
            .filter_map(|pid| Some((pid, procs.info(pid)?.clone())))
            .collect(),
        profile,
        started,
        duration,
    }
}

/// The renderer thread: symbolizes (one long-lived symbolizer), encodes, writes, publishes as
/// the latest window and queues for the pusher. Ends when the queue's sender is dropped.
fn start_renderer(
    mut store: Store,
    pusher: Option<Pusher>,
    latest: Arc<Mutex<Option<Bytes>>>,
    metrics: Arc<Metrics>,
    meta: RunMeta,
) -> (std_mpsc::SyncSender<Job>, std::thread::JoinHandle<()>) {
    let (jobs, queue) = std_mpsc::sync_channel::<Job>(RENDER_QUEUE);
    let thread = std::thread::Builder::new()
        .name("bpfprof-render".into())
        .spawn(move || {
            let symbolizer = Symbolizer::long_lived();
            for job in queue {
                match job {
                    Job::Pull(rendering, reply) => {
                        let _ = reply.send(Ok(encode(&symbolizer, &rendering, &meta)));
                    }
                    Job::Window(rendering) => {
                        let bytes = encode(&symbolizer, &rendering, &meta);
                        let started = unix_ms(rendering.started);
                        match store.write(started, &bytes) {
                            Ok(_) => {
                                metrics.windows_written.fetch_add(1, Relaxed);
                            }
                            Err(e) => {
                                metrics.window_write_errors.fetch_add(1, Relaxed);
                                eprintln!("bpfprof agent: cannot write a window: {e} (kept in memory for /debug/pprof/latest; retrying with the next window)");
                            }
                        }
                        metrics.stored_windows.store(store.windows() as u64, Relaxed);
                        metrics.stored_bytes.store(store.bytes(), Relaxed);
                        let ended = unix_ms(rendering.started + rendering.duration);
                        metrics.last_window_unix_s.store(ended / 1000, Relaxed);
                        if let Some(pusher) = &pusher {
                            pusher.enqueue(Upload {
                                from_unix_s: started / 1000,
                                until_unix_s: ended.div_ceil(1000),
                                pprof_gz: bytes.clone(),
                            });
                        }
                        *latest.lock().unwrap_or_else(|e| e.into_inner()) = Some(bytes);
                    }
                }
                symbolizer.release_files();
                release_freed_memory();
                let size = symbolizer.cache_size();
                metrics.frame_cache_entries.store(size.frames as u64, Relaxed);
                metrics.frame_cache_bytes.store(size.frame_bytes as u64, Relaxed);
                metrics.symbolizer_files.store(size.files as u64, Relaxed);
            }
            if let Some(pusher) = pusher {
                pusher.finish();
            }
        })
        .expect("starting the renderer thread");
    (jobs, thread)
}

/// Returns the heap the last rendering freed to the system. glibc keeps a thread's freed arena
/// memory for reuse; the renderer's peaks (a window's symbolization) would otherwise stay in the
/// agent's RSS for good.
fn release_freed_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only walks glibc's own arenas; no pointer of ours is involved.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Symbolize a profile and encode it as pprof with its processes' labels.
fn encode(symbolizer: &Symbolizer, rendering: &Rendering, meta: &RunMeta) -> Bytes {
    let symbols = symbolizer.symbolize(&rendering.profile, &rendering.files);
    for failure in &symbols.failures {
        log::info!("symbolization: {failure}");
    }
    let meta = RunMeta {
        duration_s: rendering.duration.as_secs_f64(),
        ..meta.clone()
    };
    let report = hotspot::build(meta, &rendering.profile, &symbols);
    let labels = |pid: u32| -> Vec<(&'static str, String)> {
        let Some(info) = rendering.labels.get(&pid) else {
            return Vec::new();
        };
        let mut labels = Vec::new();
        if let Some(exe) = &info.executable {
            labels.push(("executable", exe.clone()));
        }
        if let Some(cgroup) = &info.cgroup {
            labels.push(("cgroup", cgroup.clone()));
        }
        if let Some(id) = info.container_id() {
            labels.push(("container_id", id.to_string()));
        }
        labels
    };
    let mut profile = pprof::hotspot_profile_labeled(&report, &labels);
    profile.time_nanos = rendering
        .started
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64);
    let mut out = Vec::new();
    pprof::write_gz(&profile, &mut out).expect("writing into memory");
    Bytes::from(out)
}
