//! What the agent says about itself on `/metrics` (Prometheus text format): what it sampled and
//! lost, what it wrote and pushed, and what it costs (memory, descriptors, CPU, caches).
use super::runqueue::{BOUNDS_NS, BUCKETS};
use crate::symbolize::debuginfod::{Debuginfod, Stats};
use std::{
    fmt::Write as _,
    sync::atomic::{AtomicU64, Ordering::Relaxed},
    time::Instant,
};

/// Counters and gauges shared by the agent's threads.
pub struct Metrics {
    pub started: Instant,
    pub samples: AtomicU64,
    pub samples_lost: AtomicU64,
    pub stack_collisions: AtomicU64,
    pub stack_errors: AtomicU64,
    pub process_events_lost: AtomicU64,
    pub processes_not_captured: AtomicU64,
    pub unwind_walks: AtomicU64,
    pub unwind_failed: AtomicU64,
    pub unwind_truncated: AtomicU64,
    pub samples_before_unwind_tables: AtomicU64,
    pub windows_written: AtomicU64,
    pub window_write_errors: AtomicU64,
    pub windows_dropped: AtomicU64,
    pub last_window_unix_s: AtomicU64,
    pub pulls_served: AtomicU64,
    pub pulls_refused: AtomicU64,
    /// Pyroscope pushes (`--push`) and OTLP exports (`--otlp`).
    pub push: PushCounters,
    pub otlp: PushCounters,
    pub processes_tracked: AtomicU64,
    pub files_open: AtomicU64,
    pub frame_cache_entries: AtomicU64,
    pub frame_cache_bytes: AtomicU64,
    pub symbolizer_files: AtomicU64,
    pub unwind_rows_used: AtomicU64,
    pub stored_windows: AtomicU64,
    pub stored_bytes: AtomicU64,
    pub offcpu_ns: AtomicU64,
    pub offcpu_map_full: AtomicU64,
    pub offcpu_stacks_lost: AtomicU64,
    pub offcpu_sleeps_carried: AtomicU64,
    pub lock_waits: AtomicU64,
    pub lock_wait_ns: AtomicU64,
    pub lock_map_full: AtomicU64,
    pub lock_stacks_freed: AtomicU64,
    pub lock_stacks_lost: AtomicU64,
    pub lock_stacks_stored: AtomicU64,
    /// Run-queue waits per bucket of `runqueue::BOUNDS_NS` (not cumulative), and their sum.
    pub runqueue_buckets: [AtomicU64; BUCKETS],
    pub runqueue_delay_ns: AtomicU64,
    pub runqueue_threads: AtomicU64,
    /// The run-queue signal is on: only then is its histogram exported (all zero otherwise, it
    /// would claim threads never waited for a CPU).
    pub runqueue: bool,
    /// The debuginfod client, if servers are configured: its counts are read at each page.
    pub debuginfod: std::sync::OnceLock<std::sync::Arc<Debuginfod>>,
}

impl Default for Metrics {
    fn default() -> Self {
        let zero = || AtomicU64::new(0);
        Metrics {
            started: Instant::now(),
            samples: zero(),
            samples_lost: zero(),
            stack_collisions: zero(),
            stack_errors: zero(),
            process_events_lost: zero(),
            processes_not_captured: zero(),
            unwind_walks: zero(),
            unwind_failed: zero(),
            unwind_truncated: zero(),
            samples_before_unwind_tables: zero(),
            windows_written: zero(),
            window_write_errors: zero(),
            windows_dropped: zero(),
            last_window_unix_s: zero(),
            pulls_served: zero(),
            pulls_refused: zero(),
            push: PushCounters::default(),
            otlp: PushCounters::default(),
            processes_tracked: zero(),
            files_open: zero(),
            frame_cache_entries: zero(),
            frame_cache_bytes: zero(),
            symbolizer_files: zero(),
            unwind_rows_used: zero(),
            stored_windows: zero(),
            stored_bytes: zero(),
            offcpu_ns: zero(),
            offcpu_map_full: zero(),
            offcpu_stacks_lost: zero(),
            offcpu_sleeps_carried: zero(),
            lock_waits: zero(),
            lock_wait_ns: zero(),
            lock_map_full: zero(),
            lock_stacks_freed: zero(),
            lock_stacks_lost: zero(),
            lock_stacks_stored: zero(),
            runqueue_buckets: std::array::from_fn(|_| zero()),
            runqueue_delay_ns: zero(),
            runqueue_threads: zero(),
            runqueue: false,
            debuginfod: std::sync::OnceLock::new(),
        }
    }
}

/// One destination's uploads.
#[derive(Default)]
pub struct PushCounters {
    pub sent: AtomicU64,
    pub failures: AtomicU64,
    pub dropped: AtomicU64,
    pub queue: AtomicU64,
}

/// This process's own use of the machine, read from `/proc/self`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct OwnUsage {
    pub rss_bytes: u64,
    pub cpu_seconds: f64,
    pub open_fds: u64,
}

impl OwnUsage {
    pub fn read() -> OwnUsage {
        // SAFETY: sysconf reads a constant.
        let (page, tick) = unsafe {
            (
                libc::sysconf(libc::_SC_PAGESIZE),
                libc::sysconf(libc::_SC_CLK_TCK),
            )
        };
        let rss_pages = std::fs::read_to_string("/proc/self/statm")
            .ok()
            .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
            .unwrap_or(0);
        let cpu_ticks = std::fs::read_to_string("/proc/self/stat")
            .ok()
            .and_then(|s| cpu_ticks(&s))
            .unwrap_or(0);
        let open_fds = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64);
        OwnUsage {
            rss_bytes: rss_pages * page.max(1) as u64,
            cpu_seconds: cpu_ticks as f64 / tick.max(1) as f64,
            open_fds,
        }
    }
}

/// utime + stime from a `/proc/<pid>/stat` line (fields 14 and 15; the name may hold spaces).
pub fn cpu_ticks(stat: &str) -> Option<u64> {
    let (_, from_state) = crate::process::split_stat(stat)?;
    let mut fields = from_state.split_whitespace().skip(11);
    Some(fields.next()?.parse::<u64>().ok()? + fields.next()?.parse::<u64>().ok()?)
}

impl Metrics {
    /// All zero; `runqueue`: the run-queue signal is on (its histogram is exported).
    pub fn new(runqueue: bool) -> Metrics {
        Metrics {
            runqueue,
            ..Metrics::default()
        }
    }

    /// What a closed window's health adds to the totals.
    pub fn count_window(&self, health: &crate::profile::Health) {
        self.samples.fetch_add(health.samples, Relaxed);
        self.samples_lost.fetch_add(health.lost_map_full, Relaxed);
        self.stack_collisions.fetch_add(health.collisions(), Relaxed);
        self.stack_errors
            .fetch_add(health.user_stack_errors + health.kernel_stack_errors, Relaxed);
        self.process_events_lost
            .fetch_add(health.process_events_lost, Relaxed);
        self.processes_not_captured
            .fetch_add(health.processes_not_captured, Relaxed);
        self.unwind_walks.fetch_add(health.unwind_walks, Relaxed);
        self.unwind_failed.fetch_add(health.unwind_failed, Relaxed);
        self.unwind_truncated.fetch_add(health.unwind_truncated, Relaxed);
        self.samples_before_unwind_tables
            .fetch_add(health.unwind_before_tables, Relaxed);
    }

    pub fn render(&self, usage: OwnUsage) -> String {
        let mut out = String::new();
        let mut line = |name: &str, kind: &str, help: &str, value: f64| {
            let _ = writeln!(out, "# HELP bpfprof_agent_{name} {help}");
            let _ = writeln!(out, "# TYPE bpfprof_agent_{name} {kind}");
            let _ = writeln!(out, "bpfprof_agent_{name} {value}");
        };
        let get = |c: &AtomicU64| c.load(Relaxed) as f64;
        let counters = [
            ("samples_total", &self.samples, "samples recorded by the kernel"),
            (
                "samples_lost_total",
                &self.samples_lost,
                "samples dropped: the kernel's sample map was full",
            ),
            (
                "stack_collisions_total",
                &self.stack_collisions,
                "stacks lost to stack-map hash collisions",
            ),
            (
                "stack_errors_total",
                &self.stack_errors,
                "stacks that could not be read",
            ),
            (
                "process_events_lost_total",
                &self.process_events_lost,
                "new-process notifications dropped (ring full)",
            ),
            (
                "processes_not_captured_total",
                &self.processes_not_captured,
                "processes with samples that exited before their memory map was read",
            ),
            (
                "unwind_walks_total",
                &self.unwind_walks,
                "user stacks walked through unwind tables",
            ),
            (
                "unwind_failed_total",
                &self.unwind_failed,
                "table walks that ended early (kept as far as they went)",
            ),
            (
                "unwind_truncated_total",
                &self.unwind_truncated,
                "table walks that reached the depth limit",
            ),
            (
                "samples_before_unwind_tables_total",
                &self.samples_before_unwind_tables,
                "samples taken before their process's unwind tables were loaded (a new process's first): user stacks by frame pointers",
            ),
            (
                "windows_written_total",
                &self.windows_written,
                "windows written to the output directory",
            ),
            (
                "window_write_errors_total",
                &self.window_write_errors,
                "windows that could not be written (directory full or unwritable)",
            ),
            (
                "windows_dropped_total",
                &self.windows_dropped,
                "windows dropped because the previous one was still being symbolized",
            ),
            (
                "pulls_served_total",
                &self.pulls_served,
                "profiles served on /debug/pprof/profile",
            ),
            (
                "pulls_refused_total",
                &self.pulls_refused,
                "profile requests refused (too many at once)",
            ),
            (
                "pushes_sent_total",
                &self.push.sent,
                "windows pushed to the ingest URL",
            ),
            (
                "push_failures_total",
                &self.push.failures,
                "push attempts that failed (retried)",
            ),
            (
                "pushes_dropped_total",
                &self.push.dropped,
                "windows never pushed (queue full, or retries exhausted)",
            ),
            (
                "otlp_exports_sent_total",
                &self.otlp.sent,
                "windows exported to the OTLP endpoint",
            ),
            (
                "otlp_export_failures_total",
                &self.otlp.failures,
                "OTLP export attempts that failed (retried)",
            ),
            (
                "otlp_exports_dropped_total",
                &self.otlp.dropped,
                "windows never exported (queue full, or retries exhausted)",
            ),
            (
                "offcpu_map_full_total",
                &self.offcpu_map_full,
                "sleeps not recorded: the kernel's off-CPU map was full",
            ),
            (
                "offcpu_stacks_lost_total",
                &self.offcpu_stacks_lost,
                "sleeps across a window's end whose stacks were gone before they could be kept",
            ),
            (
                "lock_waits_total",
                &self.lock_waits,
                "futex waits that ended (as drained, every second)",
            ),
            (
                "lock_map_full_total",
                &self.lock_map_full,
                "futex waits not recorded: a kernel lock map was full",
            ),
            (
                "lock_stacks_freed_total",
                &self.lock_stacks_freed,
                "lock stacks no wait or wake named any more, freed from the kernel's maps",
            ),
            (
                "lock_stacks_lost_total",
                &self.lock_stacks_lost,
                "lock records whose stack was gone when read (shown under a lost-stack frame)",
            ),
        ];
        for (name, counter, help) in counters {
            line(name, "counter", help, get(counter));
        }
        let gauges = [
            (
                "push_queue_windows",
                &self.push.queue,
                "windows waiting to be pushed",
            ),
            (
                "otlp_queue_windows",
                &self.otlp.queue,
                "windows waiting to be exported over OTLP",
            ),
            (
                "processes_tracked",
                &self.processes_tracked,
                "processes whose memory maps are held for symbolization",
            ),
            (
                "files_open",
                &self.files_open,
                "executables and libraries held open for symbolization",
            ),
            (
                "symbolization_cache_frames",
                &self.frame_cache_entries,
                "symbolized addresses cached per executable",
            ),
            (
                "symbolization_cache_bytes",
                &self.frame_cache_bytes,
                "bytes of the symbolized addresses cached (allocator overhead aside; bounded)",
            ),
            (
                "symbolization_cache_files",
                &self.symbolizer_files,
                "files the symbolizer holds parsed",
            ),
            (
                "unwind_rows_used",
                &self.unwind_rows_used,
                "rows of the kernel's unwind table array in use; rows of files no process maps any more are freed",
            ),
            (
                "stored_windows",
                &self.stored_windows,
                "windows in the output directory",
            ),
            (
                "stored_bytes",
                &self.stored_bytes,
                "bytes of windows in the output directory",
            ),
            (
                "last_window_timestamp_seconds",
                &self.last_window_unix_s,
                "when the last window ended (unix time)",
            ),
            (
                "offcpu_sleeps_carried",
                &self.offcpu_sleeps_carried,
                "sleeps going on across the last drain, cut at it (their stacks kept by thread)",
            ),
            (
                "lock_stacks_stored",
                &self.lock_stacks_stored,
                "lock stacks held in the kernel's maps after the last sweep (bounded by the maps, 16 K each)",
            ),
            (
                "runqueue_threads",
                &self.runqueue_threads,
                "threads whose run-queue totals are followed",
            ),
        ];
        for (name, gauge, help) in gauges {
            line(name, "gauge", help, get(gauge));
        }
        line(
            "rss_bytes",
            "gauge",
            "resident memory of the agent",
            usage.rss_bytes as f64,
        );
        line(
            "open_fds",
            "gauge",
            "open file descriptors of the agent",
            usage.open_fds as f64,
        );
        line(
            "cpu_seconds_total",
            "counter",
            "CPU time of the agent process (user + system; BPF programs run in the profiled tasks)",
            usage.cpu_seconds,
        );
        line(
            "offcpu_seconds_total",
            "counter",
            "time threads spent off the CPU (asleep or blocked), windows ended so far",
            get(&self.offcpu_ns) / 1e9,
        );
        line(
            "lock_wait_seconds_total",
            "counter",
            "time threads waited in futex(2) (locks, and waits for events), as drained",
            get(&self.lock_wait_ns) / 1e9,
        );
        line(
            "uptime_seconds",
            "gauge",
            "seconds since the agent started",
            self.started.elapsed().as_secs_f64(),
        );
        if let Some(client) = self.debuginfod.get() {
            for (name, kind, help, value) in debuginfod_lines(client.stats()) {
                line(name, kind, help, value as f64);
            }
        }
        if self.runqueue {
            self.runqueue_histogram(&mut out);
        }
        out
    }

    /// Waiting for a CPU, the kernel's own figures: a histogram over every thread.
    fn runqueue_histogram(&self, out: &mut String) {
        let name = "bpfprof_runqueue_delay_seconds";
        let _ = writeln!(out, "# HELP {name} time threads waited for a CPU after becoming runnable (kernel sched_info), windows ended so far");
        let _ = writeln!(out, "# TYPE {name} histogram");
        let mut cumulative = 0;
        for (i, bucket) in self.runqueue_buckets.iter().enumerate() {
            cumulative += bucket.load(Relaxed);
            let le = match BOUNDS_NS.get(i) {
                Some(&bound) => format!("{}", bound as f64 / 1e9),
                None => "+Inf".into(),
            };
            let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {cumulative}");
        }
        let sum = self.runqueue_delay_ns.load(Relaxed) as f64 / 1e9;
        let _ = writeln!(out, "{name}_sum {sum}");
        let _ = writeln!(out, "{name}_count {cumulative}");
    }
}

/// The debuginfod client's figures: name, kind, help, value.
fn debuginfod_lines(s: Stats) -> [(&'static str, &'static str, &'static str, u64); 5] {
    [
        (
            "debuginfod_fetched_total",
            "counter",
            "debug files downloaded from debuginfod and kept",
            s.fetched,
        ),
        (
            "debuginfod_missed_total",
            "counter",
            "build ids no debuginfod server had",
            s.missed,
        ),
        (
            "debuginfod_failed_total",
            "counter",
            "debuginfod downloads that failed (no answer in time, refused, too large, another file)",
            s.failed,
        ),
        (
            "debuginfod_cache_bytes",
            "gauge",
            "bytes in the debuginfod cache (bounded)",
            s.cache_bytes,
        ),
        (
            "debuginfod_pending",
            "gauge",
            "build ids being fetched or waiting to be",
            s.pending,
        ),
    ]
}

/// One value out of a `/metrics` page (for tests and the soak).
pub fn value(page: &str, name: &str) -> Option<f64> {
    page.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_parses_back_and_reads_own_usage() {
        let metrics = Metrics::default();
        metrics.samples.store(42, Relaxed);
        let usage = OwnUsage::read();
        assert!(usage.rss_bytes > 0 && usage.open_fds > 0, "{usage:?}");
        let page = metrics.render(usage);
        assert_eq!(value(&page, "bpfprof_agent_samples_total"), Some(42.0));
        assert_eq!(
            value(&page, "bpfprof_agent_rss_bytes"),
            Some(usage.rss_bytes as f64)
        );
        assert_eq!(value(&page, "bpfprof_agent_samples"), None, "whole names only");
        assert_eq!(cpu_ticks("1 (a b) S 0 0 0 0 0 0 0 0 0 0 7 5 0"), Some(12));
    }

    #[test]
    fn the_debuginfod_figures_are_exported_when_a_client_runs() {
        let work = tempfile::tempdir().unwrap();
        let config = crate::symbolize::debuginfod::Config {
            urls: Vec::new(),
            cache_dir: work.path().join("cache"),
            cache_max: 1 << 20,
            max_size: 1 << 20,
            connect_timeout: std::time::Duration::from_secs(1),
            stall_timeout: std::time::Duration::from_secs(1),
            max_time: std::time::Duration::from_secs(1),
            miss_ttl: std::time::Duration::from_secs(600),
            roots: None,
        };
        let metrics = Metrics::default();
        assert!(!metrics.render(OwnUsage::default()).contains("debuginfod"));
        let client = std::sync::Arc::new(Debuginfod::start(config).unwrap());
        let _ = metrics.debuginfod.set(client.clone());
        // No server to ask: the build id is missed.
        client.lookup(&[0xab; 20]);
        assert!(client.wait(std::time::Duration::from_secs(10)));
        let page = metrics.render(OwnUsage::default());
        println!("{page}");
        assert_eq!(value(&page, "bpfprof_agent_debuginfod_missed_total"), Some(1.0));
        assert_eq!(value(&page, "bpfprof_agent_debuginfod_fetched_total"), Some(0.0));
        assert_eq!(value(&page, "bpfprof_agent_debuginfod_pending"), Some(0.0));
    }

    #[test]
    fn the_run_queue_histogram_is_exported_only_when_its_signal_is_on() {
        let off = Metrics::default().render(OwnUsage::default());
        assert!(
            !off.contains("bpfprof_runqueue_delay_seconds"),
            "signal off, yet a histogram:\n{off}"
        );
        let on = Metrics::new(true);
        on.runqueue_buckets[0].store(3, Relaxed);
        on.runqueue_buckets[2].store(2, Relaxed);
        on.runqueue_delay_ns.store(1_500_000_000, Relaxed);
        let page = on.render(OwnUsage::default());
        assert_eq!(value(&page, "bpfprof_runqueue_delay_seconds_count"), Some(5.0));
        assert_eq!(value(&page, "bpfprof_runqueue_delay_seconds_sum"), Some(1.5));
    }
}
