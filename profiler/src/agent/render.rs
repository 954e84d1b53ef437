//! The renderer thread: symbolizes (one long-lived symbolizer), encodes one pprof per signal,
//! writes the window, publishes it as the latest and queues it for the pusher (CPU, to
//! Pyroscope) and the OTLP exporter (every signal, one request).
use std::{
    collections::{HashMap, HashSet},
    sync::{atomic::Ordering::Relaxed, mpsc as std_mpsc, Arc, Mutex},
    time::{Duration, SystemTime},
};

use bytes::Bytes;
use tokio::sync::oneshot;

use super::{
    metrics::Metrics,
    otlp,
    push::{hostname, Pusher, Upload},
    runqueue::ThreadWait,
    store::Store,
    unix_ms, Signal,
};
use crate::{
    cli::{LockSource, Waits},
    model::{self, RunMeta, Weight},
    modes::lock::{self, LockCollection, LockContext},
    process::{FileId, FileSnapshot, FileTable, ProcessInfo, Processes, UserAddr},
    profile::{Health, RawProfile},
    report::pprof,
    symbolize::{DebugLocator, Symbolizer},
};

/// Profiles waiting for the renderer; beyond, a window is dropped (and counted).
const RENDER_QUEUE: usize = 2;

/// One signal's figures in a window or a pull. At most four per window, each moved twice: the
/// inline CPU profile costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
pub enum Figures {
    /// By stack: samples (CPU) or nanoseconds (off-CPU).
    Stacks(RawProfile),
    /// Per thread: run-queue delay.
    Threads(Vec<ThreadWait>),
    /// Lock waits by lock and stack.
    Locks(Box<LockFigures>),
}

/// Per (pid, exec generation), the files that image maps (see `Processes::mapped_files`).
type MappedFiles = HashMap<(u32, u32), Vec<(FileId, u64, u64)>>;

/// A window's lock waits, with what naming their locks needs of processes that may be gone:
/// the files each image maps (a static lock is named from their symbols).
pub struct LockFigures {
    collection: LockCollection,
    mapped: MappedFiles,
    health: Health,
}

impl LockFigures {
    pub fn new(collection: LockCollection, health: Health, procs: &Processes) -> Box<LockFigures> {
        let mapped = collection
            .records
            .iter()
            .map(|r| (r.pid, r.exec_generation))
            .collect::<HashSet<_>>()
            .into_iter()
            .map(|(pid, generation)| ((pid, generation), procs.mapped_files(pid, generation)))
            .collect();
        Box::new(LockFigures {
            collection,
            mapped,
            health,
        })
    }
}

/// What `lock::report` asks of processes, answered from a rendering's snapshot.
struct SnapshotContext<'a> {
    rendering: &'a Rendering,
    mapped: &'a MappedFiles,
}

impl LockContext for SnapshotContext<'_> {
    fn comm(&self, pid: u32) -> String {
        self.rendering
            .labels
            .get(&pid)
            .map(|info| info.comm.clone())
            .unwrap_or_default()
    }

    fn mapped_files(&self, pid: u32, generation: u32) -> Vec<(FileId, u64, u64)> {
        self.mapped.get(&(pid, generation)).cloned().unwrap_or_default()
    }

    fn files(&self) -> &dyn FileTable {
        &self.rendering.files
    }
}

/// A window's (or a pull's) profiles with what they need of processes that may be gone.
pub struct Rendering {
    pub profiles: Vec<(Signal, Figures)>,
    files: FileSnapshot,
    labels: HashMap<u32, ProcessInfo>,
    pub started: SystemTime,
    pub duration: Duration,
}

impl Rendering {
    /// Taken now: the processes may be forgotten later.
    pub fn new(
        profiles: Vec<(Signal, Figures)>,
        procs: &Processes,
        started: SystemTime,
        duration: Duration,
    ) -> Rendering {
        let mut files: HashSet<FileId> = HashSet::new();
        let mut pids: HashSet<u32> = HashSet::new();
        for (_, figures) in &profiles {
            match figures {
                Figures::Stacks(profile) => stack_processes_and_files(profile, &mut pids, &mut files),
                Figures::Threads(threads) => pids.extend(threads.iter().map(|t| t.pid)),
                Figures::Locks(locks) => {
                    // Every record has its stack in the profile, under the record's pid.
                    stack_processes_and_files(&locks.collection.stacks, &mut pids, &mut files);
                    files.extend(locks.mapped.values().flatten().map(|(file, _, _)| *file));
                }
            }
        }
        Rendering {
            files: procs.snapshot(files),
            labels: pids
                .into_iter()
                .filter_map(|pid| Some((pid, procs.info(pid)?.clone())))
                .collect(),
            profiles,
            started,
            duration,
        }
    }
}

/// The processes a profile's stacks are of, and the files their user frames are in.
fn stack_processes_and_files(profile: &RawProfile, pids: &mut HashSet<u32>, files: &mut HashSet<FileId>) {
    for key in profile.stacks.keys() {
        pids.insert(key.pid);
        files.extend(key.user.iter().filter_map(|a| match a {
            UserAddr::File { file, .. } => Some(*file),
            _ => None,
        }));
    }
}

pub enum Job {
    Window(Rendering),
    /// A pull: one signal, answered with its pprof.
    Pull(Rendering, oneshot::Sender<Result<Bytes, String>>),
}

/// The latest window's pprof per signal.
pub type Latest = Arc<Mutex<HashMap<Signal, Bytes>>>;

/// Starts the renderer; it ends when the queue's sender is dropped.
pub fn start(
    mut store: Store,
    [pusher, exporter]: [Option<Pusher>; 2],
    latest: Latest,
    metrics: Arc<Metrics>,
    meta: RunMeta,
    locator: DebugLocator,
) -> (std_mpsc::SyncSender<Job>, std::thread::JoinHandle<()>) {
    let (jobs, queue) = std_mpsc::sync_channel::<Job>(RENDER_QUEUE);
    let thread = std::thread::Builder::new()
        .name("bpfprof-render".into())
        .spawn(move || {
            let symbolizer = Symbolizer::long_lived(locator);
            for job in queue {
                match job {
                    Job::Pull(rendering, reply) => {
                        let profiles = profiles(&symbolizer, &rendering, &meta);
                        let bytes = profiles.first().map(|(_, p)| gzipped(p)).unwrap_or_default();
                        let _ = reply.send(Ok(bytes));
                    }
                    Job::Window(rendering) => {
                        let profiles = profiles(&symbolizer, &rendering, &meta);
                        let encoded: Vec<(Signal, Bytes)> =
                            profiles.iter().map(|(s, p)| (*s, gzipped(p))).collect();
                        write_window(&mut store, &rendering, &encoded, &metrics, pusher.as_ref());
                        if let Some(exporter) = &exporter {
                            exporter.enqueue(Upload {
                                from_unix_s: unix_ms(rendering.started) / 1000,
                                until_unix_s: unix_ms(rendering.started + rendering.duration).div_ceil(1000),
                                body: Bytes::from(otlp::export_request(&profiles, &hostname())),
                            });
                        }
                        let mut latest = latest.lock().unwrap_or_else(|e| e.into_inner());
                        latest.extend(encoded);
                    }
                }
                symbolizer.release_files();
                release_freed_memory();
                let size = symbolizer.cache_size();
                metrics.frame_cache_entries.store(size.frames as u64, Relaxed);
                metrics.frame_cache_bytes.store(size.frame_bytes as u64, Relaxed);
                metrics.symbolizer_files.store(size.files as u64, Relaxed);
            }
            for pusher in [pusher, exporter].into_iter().flatten() {
                pusher.finish();
            }
        })
        .expect("starting the renderer thread");
    (jobs, thread)
}

/// Into the store (CPU under the window's plain name, as before there were signals), and the CPU
/// profile to the pusher.
fn write_window(
    store: &mut Store,
    rendering: &Rendering,
    encoded: &[(Signal, Bytes)],
    metrics: &Metrics,
    pusher: Option<&Pusher>,
) {
    let started = unix_ms(rendering.started);
    let files: Vec<(Option<&str>, &[u8])> = encoded
        .iter()
        .map(|(signal, bytes)| {
            let name = (*signal != Signal::Cpu).then(|| signal.name());
            (name, &bytes[..])
        })
        .collect();
    match store.write(started, &files) {
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
    if let (Some(pusher), Some((_, bytes))) = (pusher, encoded.iter().find(|(s, _)| *s == Signal::Cpu)) {
        pusher.enqueue(Upload {
            from_unix_s: started / 1000,
            until_unix_s: ended.div_ceil(1000),
            body: bytes.clone(),
        });
    }
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

/// pprof's file form: the encoded message, gzipped.
fn gzipped(profile: &pprof::proto::Profile) -> Bytes {
    let mut bytes = Vec::new();
    pprof::write_gz(profile, &mut bytes).expect("writing into memory");
    Bytes::from(bytes)
}

/// Symbolize each profile and build it as pprof with its processes' labels.
fn profiles(
    symbolizer: &Symbolizer,
    rendering: &Rendering,
    meta: &RunMeta,
) -> Vec<(Signal, pprof::proto::Profile)> {
    let labels = |pid: u32| process_labels(rendering, pid);
    let meta = RunMeta {
        duration_s: rendering.duration.as_secs_f64(),
        ..meta.clone()
    };
    let mut out = Vec::with_capacity(rendering.profiles.len());
    for (signal, figures) in &rendering.profiles {
        let mut profile = match figures {
            Figures::Stacks(raw) => stack_profile(symbolizer, rendering, *signal, raw, &meta, &labels),
            Figures::Locks(locks) => lock_profile(symbolizer, rendering, locks, &meta, &labels),
            Figures::Threads(threads) => thread_profile(rendering, threads, &labels),
        };
        profile.time_nanos = rendering
            .started
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i64);
        out.push((*signal, profile));
    }
    out
}

/// A process's labels: its executable, cgroup and container.
fn process_labels(rendering: &Rendering, pid: u32) -> Vec<(&'static str, String)> {
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
}

type Labels<'a> = dyn Fn(u32) -> Vec<(&'static str, String)> + 'a;

/// On-CPU samples, or off-CPU time, by stack.
fn stack_profile(
    symbolizer: &Symbolizer,
    rendering: &Rendering,
    signal: Signal,
    raw: &RawProfile,
    meta: &RunMeta,
    labels: &Labels<'_>,
) -> pprof::proto::Profile {
    let symbols = symbolizer.symbolize(raw, &rendering.files);
    for failure in &symbols.failures {
        log::info!("symbolization: {failure}");
    }
    let (weight, meta) = match signal {
        Signal::OffCpu => (
            Weight::OffCpuNanoseconds,
            RunMeta {
                mode: "sched",
                event: "sched_switch".to_string(),
                counters: Vec::new(),
                ..meta.clone()
            },
        ),
        // Only the counters profile carries what was read at each sample.
        Signal::Counters => (Weight::Samples, meta.clone()),
        _ => (
            Weight::Samples,
            RunMeta {
                counters: Vec::new(),
                ..meta.clone()
            },
        ),
    };
    let report = model::stack_report(meta, raw, &symbols, weight);
    pprof::hotspot_profile_labeled(&report, labels)
}

/// Lock waits as Go's mutex profile.
fn lock_profile(
    symbolizer: &Symbolizer,
    rendering: &Rendering,
    locks: &LockFigures,
    meta: &RunMeta,
    labels: &Labels<'_>,
) -> pprof::proto::Profile {
    let symbols = symbolizer.symbolize(&locks.collection.stacks, &rendering.files);
    let meta = RunMeta {
        mode: "lock",
        event: "futex".to_string(),
        ..meta.clone()
    };
    let context = SnapshotContext {
        rendering,
        mapped: &locks.mapped,
    };
    let report = lock::report(
        meta,
        LockSource::Futex,
        Waits::All,
        locks.health.clone(),
        &locks.collection,
        &symbols,
        &context,
    );
    pprof::lock_profile(&report, labels)
}

/// Run-queue delay per thread.
fn thread_profile(
    rendering: &Rendering,
    threads: &[ThreadWait],
    labels: &Labels<'_>,
) -> pprof::proto::Profile {
    let values: Vec<pprof::ThreadValue<'_>> = threads
        .iter()
        .map(|t| pprof::ThreadValue {
            pid: t.pid,
            tid: t.tid,
            comm: &t.comm,
            process: rendering
                .labels
                .get(&t.pid)
                .and_then(|info| info.executable.as_deref())
                .map_or(&t.comm, |exe| exe.rsplit('/').next().unwrap_or(exe)),
            value: t.delay_ns as i64,
            count: t.waits as i64,
        })
        .collect();
    let mut profile = pprof::per_thread_profile(
        ("runqueue-delay", "nanoseconds"),
        ("waits", "count"),
        &values,
        labels,
    );
    profile.duration_nanos = rendering.duration.as_nanos() as i64;
    profile
}
