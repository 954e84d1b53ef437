//! What the agent says about itself on `/metrics` (Prometheus text format): what it sampled and
//! lost, what it wrote and pushed, and what it costs (memory, descriptors, CPU, caches).
use super::runqueue::{BOUNDS_NS, BUCKETS};
use crate::{
    health::{Health, COUNTERS},
    symbolize::debuginfod::{Debuginfod, Stats},
};
use std::{
    fmt::Write as _,
    sync::atomic::{AtomicU64, Ordering::Relaxed},
    time::Instant,
};

/// Counters and gauges shared by the agent's threads.
pub struct Metrics {
    pub started: Instant,
    /// Each health counter (`health::COUNTERS`) over the windows ended so far: the sum of a
    /// counter (`_total`), the last value of a gauge.
    health: Vec<AtomicU64>,
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
    pub offcpu_stacks_lost: AtomicU64,
    pub offcpu_sleeps_unsampled: AtomicU64,
    pub offcpu_sleeps_carried: AtomicU64,
    pub lock_waits: AtomicU64,
    pub lock_wait_ns: AtomicU64,
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
            health: COUNTERS.iter().map(|_| zero()).collect(),
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
            offcpu_stacks_lost: zero(),
            offcpu_sleeps_unsampled: zero(),
            offcpu_sleeps_carried: zero(),
            lock_waits: zero(),
            lock_wait_ns: zero(),
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

    /// What a closed window's health adds to the totals (a gauge: its value now).
    pub fn count_window(&self, health: &Health) {
        for ((counter, total), value) in COUNTERS.iter().zip(&self.health).zip(health.values()) {
            match is_total(counter.metric) {
                true => total.fetch_add(value, Relaxed),
                false => total.swap(value, Relaxed),
            };
        }
    }

    /// A health counter over the windows ended so far, by its field's name.
    pub fn health_total(&self, field: &str) -> u64 {
        COUNTERS
            .iter()
            .zip(&self.health)
            .find(|(c, _)| c.field == field)
            .map_or(0, |(_, total)| total.load(Relaxed))
    }

    pub fn render(&self, usage: OwnUsage) -> String {
        let mut out = String::new();
        let mut rows = self.health_rows();
        rows.extend(self.agent_rows());
        rows.extend(self.gauge_rows());
        rows.extend(usage_rows(usage, self));
        if let Some(client) = self.debuginfod.get() {
            rows.extend(debuginfod_rows(client.stats()));
        }
        for Row { name, help, value } in rows {
            let kind = if is_total(name) { "counter" } else { "gauge" };
            let _ = writeln!(out, "# HELP bpfprof_agent_{name} {help}");
            let _ = writeln!(out, "# TYPE bpfprof_agent_{name} {kind}");
            let _ = writeln!(out, "bpfprof_agent_{name} {value}");
        }
        if self.runqueue {
            self.runqueue_histogram(&mut out);
        }
        out
    }

    /// One line per health metric: a name two counters share is their sum (its help the first's).
    fn health_rows(&self) -> Vec<Row> {
        let mut rows: Vec<Row> = Vec::new();
        for (counter, total) in COUNTERS.iter().zip(&self.health) {
            let value = total.load(Relaxed) as f64;
            match rows.iter_mut().find(|r| r.name == counter.metric) {
                Some(row) => row.value += value,
                None => rows.push(Row {
                    name: counter.metric,
                    help: counter.help,
                    value,
                }),
            }
        }
        rows
    }

    /// What the agent did: windows, pulls, pushes, exports, and what the drains saw go by.
    fn agent_rows(&self) -> Vec<Row> {
        let row = Row::of;
        vec![
            row(
                "windows_written_total",
                "windows written to the output directory",
                &self.windows_written,
            ),
            row(
                "window_write_errors_total",
                "windows that could not be written (directory full or unwritable)",
                &self.window_write_errors,
            ),
            row(
                "windows_dropped_total",
                "windows dropped because the previous one was still being symbolized",
                &self.windows_dropped,
            ),
            row(
                "pulls_served_total",
                "profiles served on /debug/pprof/profile",
                &self.pulls_served,
            ),
            row(
                "pulls_refused_total",
                "profile requests refused (too many at once)",
                &self.pulls_refused,
            ),
            row(
                "pushes_sent_total",
                "windows pushed to the ingest URL",
                &self.push.sent,
            ),
            row(
                "push_failures_total",
                "push attempts that failed (retried)",
                &self.push.failures,
            ),
            row(
                "pushes_dropped_total",
                "windows never pushed (queue full, or retries exhausted)",
                &self.push.dropped,
            ),
            row(
                "otlp_exports_sent_total",
                "windows exported to the OTLP endpoint",
                &self.otlp.sent,
            ),
            row(
                "otlp_export_failures_total",
                "OTLP export attempts that failed (retried)",
                &self.otlp.failures,
            ),
            row(
                "otlp_exports_dropped_total",
                "windows never exported (queue full, or retries exhausted)",
                &self.otlp.dropped,
            ),
            row(
                "offcpu_stacks_lost_total",
                "sleeps across a window's end whose stacks were gone before they could be kept",
                &self.offcpu_stacks_lost,
            ),
            row(
                "offcpu_sleeps_unsampled_total",
                "sleeps whose stacks were not taken (--offcpu-sample): their time spread over their thread's drawn sleeps",
                &self.offcpu_sleeps_unsampled,
            ),
            row(
                "lock_waits_total",
                "futex waits that ended (as drained, every second)",
                &self.lock_waits,
            ),
            row(
                "lock_stacks_freed_total",
                "lock stacks no wait or wake named any more, freed from the kernel's maps",
                &self.lock_stacks_freed,
            ),
            row(
                "lock_stacks_lost_total",
                "lock records whose stack was gone when read (shown under a lost-stack frame)",
                &self.lock_stacks_lost,
            ),
            Row {
                name: "offcpu_seconds_total",
                help: "time threads spent off the CPU (asleep or blocked), windows ended so far",
                value: self.offcpu_ns.load(Relaxed) as f64 / 1e9,
            },
            Row {
                name: "lock_wait_seconds_total",
                help: "time threads waited in futex(2) (locks, and waits for events), as drained",
                value: self.lock_wait_ns.load(Relaxed) as f64 / 1e9,
            },
        ]
    }

    /// What the agent holds now.
    fn gauge_rows(&self) -> Vec<Row> {
        let row = Row::of;
        vec![
            row("push_queue_windows", "windows waiting to be pushed", &self.push.queue),
            row("otlp_queue_windows", "windows waiting to be exported over OTLP", &self.otlp.queue),
            row("processes_tracked", "processes whose memory maps are held for symbolization", &self.processes_tracked),
            row("files_open", "executables and libraries held open for symbolization", &self.files_open),
            row("symbolization_cache_frames", "symbolized addresses cached per executable", &self.frame_cache_entries),
            row("symbolization_cache_bytes", "bytes of the symbolized addresses cached (allocator overhead aside; bounded)", &self.frame_cache_bytes),
            row("symbolization_cache_files", "files the symbolizer holds parsed", &self.symbolizer_files),
            row("unwind_rows_used", "rows of the kernel's unwind table array in use; a file no process maps any more keeps its rows 60 s (or until the array needs them)", &self.unwind_rows_used),
            row("stored_windows", "windows in the output directory", &self.stored_windows),
            row("stored_bytes", "bytes of windows in the output directory", &self.stored_bytes),
            row("last_window_timestamp_seconds", "when the last window ended (unix time)", &self.last_window_unix_s),
            row("offcpu_sleeps_carried", "sleeps going on across the last drain, cut at it (their stacks kept by thread)", &self.offcpu_sleeps_carried),
            row("lock_stacks_stored", "lock stacks held in the kernel's maps after the last sweep (bounded by the maps, 16 K each)", &self.lock_stacks_stored),
            row("runqueue_threads", "threads whose run-queue totals are followed", &self.runqueue_threads),
        ]
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

/// One line of the page: a counter if its name ends in `_total` (Prometheus's convention), else
/// a gauge.
struct Row {
    name: &'static str,
    help: &'static str,
    value: f64,
}

impl Row {
    fn of(name: &'static str, help: &'static str, value: &AtomicU64) -> Row {
        Row {
            name,
            help,
            value: value.load(Relaxed) as f64,
        }
    }
}

/// A metric summed over time (a Prometheus counter), by its name.
fn is_total(name: &str) -> bool {
    name.ends_with("_total")
}

/// The agent process's own use of the machine, and how long it has run.
fn usage_rows(usage: OwnUsage, metrics: &Metrics) -> [Row; 4] {
    [
        Row {
            name: "rss_bytes",
            help: "resident memory of the agent",
            value: usage.rss_bytes as f64,
        },
        Row {
            name: "open_fds",
            help: "open file descriptors of the agent",
            value: usage.open_fds as f64,
        },
        Row {
            name: "cpu_seconds_total",
            help: "CPU time of the agent process (user + system; BPF programs run in the profiled tasks)",
            value: usage.cpu_seconds,
        },
        Row {
            name: "uptime_seconds",
            help: "seconds since the agent started",
            value: metrics.started.elapsed().as_secs_f64(),
        },
    ]
}

/// The debuginfod client's figures.
fn debuginfod_rows(s: Stats) -> [Row; 5] {
    let row = |name, help, value: u64| Row {
        name,
        help,
        value: value as f64,
    };
    [
        row(
            "debuginfod_fetched_total",
            "debug files downloaded from debuginfod and kept",
            s.fetched,
        ),
        row(
            "debuginfod_missed_total",
            "build ids no debuginfod server had",
            s.missed,
        ),
        row(
            "debuginfod_failed_total",
            "debuginfod downloads that failed (no answer in time, refused, too large, another file)",
            s.failed,
        ),
        row(
            "debuginfod_cache_bytes",
            "bytes in the debuginfod cache (bounded)",
            s.cache_bytes,
        ),
        row(
            "debuginfod_pending",
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
        metrics.count_window(&Health {
            samples: 40,
            user_stack_collisions: 1,
            ..Health::default()
        });
        metrics.count_window(&Health {
            samples: 2,
            kernel_stack_collisions: 2,
            files_without_tables: 5,
            ..Health::default()
        });
        let usage = OwnUsage::read();
        assert!(usage.rss_bytes > 0 && usage.open_fds > 0, "{usage:?}");
        let page = metrics.render(usage);
        assert_eq!(value(&page, "bpfprof_agent_samples_total"), Some(42.0));
        // Two counters of one metric: their sum; a gauge: its last value.
        assert_eq!(value(&page, "bpfprof_agent_stack_collisions_total"), Some(3.0));
        assert_eq!(value(&page, "bpfprof_agent_files_without_tables"), Some(5.0));
        assert!(page.contains("# TYPE bpfprof_agent_files_without_tables gauge"));
        let lines = page
            .lines()
            .filter(|l| l.starts_with("bpfprof_agent_stack_collisions_total "));
        assert_eq!(lines.count(), 1, "one line for the two counters");
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
