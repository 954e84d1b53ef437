//! Sched mode: run-queue delay per task (the kernel's `run_delay`), its distribution, where tasks
//! block off-CPU, and the slowest waits with who woke the task and who held its CPU.

pub use crate::sources::sched::{CpuRecord, OpenState, SlowRecord, TaskRecord, SLOW_EVENTS_KEPT};
use crate::{process::Processes, profile::RawProfile, sources::sched::SchedBatch};

use profiler_common::{hist_lower_bound, CpuWaits, COMM_LEN, HEAT_BUCKETS, HIST_BUCKETS};
use serde::Serialize;

use crate::model::{self, RunMeta, StackReport, Weight};
use crate::{profile::Health, symbolize::Symbols};

/// Everything a sched run collected, before symbolization: its drains' batches, folded.
#[derive(Default)]
pub struct SchedCollection {
    pub tasks: Vec<TaskRecord>,
    /// Off-CPU stacks weighted by nanoseconds blocked, with the number of blocks as counter 0.
    pub offcpu_ns: RawProfile,
    /// Sleeps whose stacks were gone before they could be kept across a flip.
    pub offcpu_stacks_lost: u64,
    /// The longest slow waits (see `SLOW_EVENTS_KEPT`), and how many there were.
    pub slow: Vec<SlowRecord>,
    pub slow_seen: u64,
    /// One heatmap column per drain.
    pub heat: Vec<Vec<u64>>,
    /// `bpf_ktime_get_ns()` (CLOCK_MONOTONIC) when tracing began.
    pub started_ns: u64,
    /// Each CPU over the run (from the last batch).
    pub cpus: Vec<CpuRecord>,
}

impl SchedCollection {
    /// One drain's batch; the last (at the stop) brings the threads still alive.
    pub fn add(&mut self, batch: SchedBatch, procs: &Processes) {
        self.started_ns = batch.started_ns;
        self.offcpu_stacks_lost = batch.offcpu_stacks_lost;
        for sample in batch.offcpu {
            self.offcpu_ns.add(sample, procs);
        }
        self.tasks.extend(batch.exited);
        self.tasks.extend(batch.live.unwrap_or_default());
        self.slow_seen += batch.slow.len() as u64;
        self.slow.extend(batch.slow);
        if self.slow.len() > 4 * SLOW_EVENTS_KEPT {
            crate::sources::sched::keep_longest(&mut self.slow);
        }
        self.heat.extend(batch.heat);
        if let Some(cpus) = batch.cpus {
            self.cpus = cpus;
        }
    }

    /// The collection as reports read it: only the longest slow waits.
    pub fn finished(mut self) -> SchedCollection {
        crate::sources::sched::keep_longest(&mut self.slow);
        self
    }
}

/// The counter slot of off-CPU stacks: how many times the thread blocked there.
const OFFCPU_BLOCKS: &str = "blocks";

#[derive(Clone, Debug, Serialize)]
pub struct Bucket {
    pub le_ns: u64,
    pub count: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct TaskLatency {
    pub pid: u32,
    pub tid: u32,
    pub comm: String,
    pub runs: u64,
    /// Waits measured (switch-ins after a wake-up or preemption seen during the run).
    pub waits: u64,
    pub total_delay_ns: u64,
    pub avg_delay_ns: u64,
    pub p50_delay_ns: u64,
    pub p99_delay_ns: u64,
    pub max_delay_ns: u64,
    /// Seconds after the start of the run when the longest wait ended.
    pub max_at_s: f64,
    pub running_ns: u64,
    pub sleeping_ns: u64,
    pub blocked_ns: u64,
    /// Non-empty buckets only: waits of at most `le_ns` (and more than the previous bucket's).
    pub histogram: Vec<Bucket>,
}

#[derive(Clone, Debug, Serialize)]
pub struct TaskRef {
    pub pid: u32,
    pub tid: u32,
    pub comm: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct CpuHolder {
    pub tid: u32,
    pub comm: String,
    /// How long it held the CPU while the waiting task waited.
    pub held_ns: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct SlowWait {
    pub pid: u32,
    pub tid: u32,
    pub comm: String,
    /// `null`: the wait was settled away from the CPU it waited for; its holders are not known.
    pub cpu: Option<u32>,
    pub delay_ns: u64,
    pub at_s: f64,
    /// Who woke it; `null` when it was preempted (it never stopped being runnable).
    pub waker: Option<TaskRef>,
    /// Who ran on its CPU while it waited, each task once with its time, most recent first.
    pub cpu_holders: Vec<CpuHolder>,
    /// The holders cover the whole wait, back to its start (false where more tasks took turns
    /// than a slow event names, or the wait began before the CPU's kept history).
    pub holders_complete: bool,
}

#[derive(Clone, Debug, Serialize)]
pub struct OffCpuStack {
    pub pid: u32,
    pub tid: u32,
    pub comm: String,
    pub total_ns: u64,
    pub count: u64,
    pub frames: Vec<crate::symbolize::Frame>,
}

/// One CPU over the run: the traced tasks' run-queue waits that ended on it (where they then
/// ran), and how long it was idle.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CpuLatency {
    pub cpu: u32,
    pub waits: u64,
    pub total_delay_ns: u64,
    pub avg_delay_ns: u64,
    pub max_delay_ns: u64,
    /// Idle or waiting for I/O within the report's `idle_window_ns` (the kernel's count, to a
    /// clock tick); `null` where /proc/stat could not be read.
    pub idle_ns: Option<u64>,
}

/// Each online CPU, and the waits whose CPU is not known (the sum over all CPUs' `unplaced`).
pub fn cpu_latencies(records: &[CpuRecord]) -> (Vec<CpuLatency>, CpuWaits) {
    let mut unplaced = CpuWaits::default();
    let cpus = (records.iter())
        .map(|r| {
            unplaced.waits += r.unplaced.waits;
            unplaced.delay_ns += r.unplaced.delay_ns;
            unplaced.max_delay_ns = unplaced.max_delay_ns.max(r.unplaced.max_delay_ns);
            CpuLatency {
                cpu: r.cpu,
                waits: r.waits.waits,
                total_delay_ns: r.waits.delay_ns,
                avg_delay_ns: r.waits.delay_ns.checked_div(r.waits.waits).unwrap_or(0),
                max_delay_ns: r.waits.max_delay_ns,
                idle_ns: r.idle_ns,
            }
        })
        .collect();
    (cpus, unplaced)
}

#[derive(Clone, Debug, Default)]
pub struct Heatmap {
    pub column_s: f64,
    /// Lower bound (ns) of each row's bucket.
    pub row_lower_ns: Vec<u64>,
    /// `columns[t][row]` = waits ending in second `t` in that bucket.
    pub columns: Vec<Vec<u64>>,
}

#[derive(Clone, Debug)]
pub struct SchedReport {
    pub meta: RunMeta,
    pub health: Health,
    /// Most total delay first.
    pub tasks: Vec<TaskLatency>,
    /// By CPU number (none in a report saved before they were kept).
    pub cpus: Vec<CpuLatency>,
    /// Waits settled away from their CPU, in no CPU's row.
    pub unplaced: CpuWaits,
    /// What the CPUs' idle times were measured over (0: not measured).
    pub idle_window_ns: u64,
    /// Off-CPU stacks weighted by blocked nanoseconds (for flamegraphs and pprof).
    pub offcpu: StackReport,
    pub offcpu_stacks: Vec<OffCpuStack>,
    pub slow_threshold_ns: u64,
    /// How many waits exceeded the threshold (only the longest are listed).
    pub slow_total: u64,
    pub slow: Vec<SlowWait>,
    pub heatmap: Heatmap,
}

/// A fine histogram's non-empty buckets.
pub fn buckets<C: Copy + Into<u64>>(hist: &[C]) -> Vec<Bucket> {
    hist.iter()
        .enumerate()
        .filter(|(_, &c)| c.into() > 0)
        .map(|(i, &c)| Bucket {
            le_ns: hist_lower_bound(i + 1).saturating_sub(1),
            count: c.into(),
        })
        .collect()
}

/// The value at quantile `q` of a histogram: the midpoint of the bucket holding it.
pub fn percentile<C: Copy + Into<u64>>(hist: &[C], q: f64) -> u64 {
    let total: u64 = hist.iter().map(|&c| c.into()).sum();
    if total == 0 {
        return 0;
    }
    let rank = ((q * total as f64).ceil() as u64).max(1);
    let mut seen = 0;
    for (i, &count) in hist.iter().enumerate() {
        seen += count.into();
        if seen >= rank {
            let (lo, hi) = (hist_lower_bound(i), hist_lower_bound(i + 1));
            return lo + (hi - lo) / 2;
        }
    }
    0
}

/// Each task that ran or waited, most total run-queue delay first.
pub fn latencies(records: &[TaskRecord], started_ns: u64) -> Vec<TaskLatency> {
    let mut tasks: Vec<TaskLatency> = records
        .iter()
        .filter(|t| t.runs > 0 || t.delays > 0)
        .map(|t| task_latency(t, started_ns))
        .collect();
    tasks.sort_by(|a, b| b.total_delay_ns.cmp(&a.total_delay_ns).then(a.tid.cmp(&b.tid)));
    tasks
}

fn task_latency(t: &TaskRecord, started_ns: u64) -> TaskLatency {
    let histogram = buckets(&t.hist);
    TaskLatency {
        pid: t.pid,
        tid: t.tid,
        comm: t.comm.clone(),
        runs: t.runs,
        waits: t.delays,
        total_delay_ns: t.total_delay_ns,
        avg_delay_ns: t.total_delay_ns.checked_div(t.delays).unwrap_or(0),
        p50_delay_ns: percentile(&t.hist, 0.50).min(t.max_delay_ns),
        p99_delay_ns: percentile(&t.hist, 0.99).min(t.max_delay_ns),
        max_delay_ns: t.max_delay_ns,
        max_at_s: seconds_since(t.max_at_ns, started_ns),
        running_ns: t.running_ns,
        sleeping_ns: t.sleeping_ns,
        blocked_ns: t.blocked_ns,
        histogram,
    }
}

fn seconds_since(at_ns: u64, started_ns: u64) -> f64 {
    at_ns.saturating_sub(started_ns) as f64 / 1e9
}

pub fn report(
    meta: RunMeta,
    health: Health,
    collection: &SchedCollection,
    symbols: &Symbols,
    slow_threshold_ns: u64,
) -> SchedReport {
    let tasks = latencies(&collection.tasks, collection.started_ns);
    let (cpus, unplaced) = cpu_latencies(&collection.cpus);

    let offcpu_meta = RunMeta {
        counters: vec![OFFCPU_BLOCKS.to_string()],
        ..meta.clone()
    };
    let offcpu = model::stack_report(
        offcpu_meta,
        &collection.offcpu_ns,
        symbols,
        Weight::OffCpuNanoseconds,
    );
    let offcpu_stacks = offcpu
        .stacks
        .iter()
        .map(|s| OffCpuStack {
            pid: s.pid,
            tid: s.tid,
            comm: s.comm.clone(),
            total_ns: s.count,
            count: s.counters.first().copied().unwrap_or(0),
            frames: s.frames.clone(),
        })
        .collect();

    let slow = collection
        .slow
        .iter()
        .map(|e| SlowWait {
            pid: e.pid,
            tid: e.tid,
            comm: e.comm.clone(),
            cpu: e.cpu,
            delay_ns: e.delay_ns,
            at_s: seconds_since(e.at_ns, collection.started_ns),
            waker: e.waker.as_ref().map(|(pid, tid, comm)| TaskRef {
                pid: *pid,
                tid: *tid,
                comm: comm.clone(),
            }),
            cpu_holders: cpu_holders(e),
            holders_complete: holders_complete(e),
        })
        .collect();

    let heatmap = Heatmap {
        column_s: 1.0,
        row_lower_ns: (0..HEAT_BUCKETS).map(|b| hist_lower_bound(b * 8)).collect(),
        columns: collection.heat.clone(),
    };
    SchedReport {
        meta,
        health,
        tasks,
        cpus,
        unplaced,
        idle_window_ns: collection.cpus.first().map_or(0, |c| c.idle_window_ns),
        offcpu,
        offcpu_stacks,
        slow_threshold_ns,
        slow_total: collection.slow_seen,
        slow,
        heatmap,
    }
}

/// Who held the CPU while a slow wait waited: each task once (a task that ran several
/// stretches of the wait, between others, is one holder with their sum), most recent first.
/// Each stretch counts only within the wait, so no holder held longer than it waited.
fn cpu_holders(e: &SlowRecord) -> Vec<CpuHolder> {
    let began = e.at_ns.saturating_sub(e.delay_ns);
    let mut holders: Vec<CpuHolder> = Vec::with_capacity(e.holders.len());
    for (tid, comm, start_ns, end_ns) in &e.holders {
        let held_ns = (*end_ns).min(e.at_ns).saturating_sub((*start_ns).max(began));
        match holders.iter_mut().find(|h| h.tid == *tid) {
            Some(holder) => holder.held_ns += held_ns,
            None => holders.push(CpuHolder {
                tid: *tid,
                comm: comm.clone(),
                held_ns,
            }),
        }
    }
    holders
}

/// Whether a slow wait's stretches reach back to its start: a CPU's stretches follow one another
/// without a gap, so then they cover all of it.
fn holders_complete(e: &SlowRecord) -> bool {
    let began = e.at_ns.saturating_sub(e.delay_ns);
    e.cpu.is_some() && e.holders.iter().any(|(_, _, start_ns, _)| *start_ns <= began)
}

const _: () = assert!(HIST_BUCKETS.is_multiple_of(8) && COMM_LEN == 16);

#[cfg(test)]
mod tests {
    use super::*;
    use profiler_common::hist_bucket;

    fn hist_of(values: &[u64]) -> Vec<u32> {
        let mut hist = vec![0u32; HIST_BUCKETS];
        for &v in values {
            hist[hist_bucket(v)] += 1;
        }
        hist
    }

    #[test]
    fn percentiles_are_within_a_bucket_of_the_truth() {
        let values: Vec<u64> = (1..=1000).map(|i| i * 10_000).collect(); // 10 us .. 10 ms
        let hist = hist_of(&values);
        for (q, truth) in [(0.5, 5_000_000.0), (0.99, 9_900_000.0)] {
            let got = percentile(&hist, q) as f64;
            assert!((got - truth).abs() / truth < 0.07, "p{q}: {got} vs {truth}");
        }
        assert_eq!(percentile(&vec![0u32; HIST_BUCKETS], 0.5), 0);
    }

    #[test]
    fn a_task_that_held_the_cpu_several_times_during_a_wait_is_one_holder() {
        // A 10 ms wait from 100 ms to 110 ms; most recent stretch first, as the kernel sends them.
        let ms = 1_000_000;
        let stretch = |tid: u32, start: u64, end: u64| (tid, format!("t{tid}"), start * ms, end * ms);
        let record = SlowRecord {
            pid: 1,
            tid: 2,
            comm: "waiter".into(),
            cpu: Some(0),
            delay_ns: 10 * ms,
            at_ns: 110 * ms,
            waker: None,
            holders: vec![
                // Both ends clipped to the wait: a stretch that began before it, and one that
                // ran on after it ended (a record from another CPU's history would): no
                // holder may hold longer than the wait.
                stretch(9, 108, 113),
                stretch(7, 104, 108),
                stretch(8, 101, 104),
                stretch(7, 95, 101),
            ],
        };
        let holders: Vec<(u32, String, u64)> = cpu_holders(&record)
            .into_iter()
            .map(|h| (h.tid, h.comm, h.held_ns))
            .collect();
        assert_eq!(
            holders,
            [
                (9, "t9".to_string(), 2 * ms),
                (7, "t7".to_string(), 5 * ms),
                (8, "t8".to_string(), 3 * ms)
            ],
            "each holder once, its stretches within the wait summed"
        );
    }

    #[test]
    fn each_cpu_is_a_row_and_the_waits_of_no_cpu_are_summed_apart() {
        let waits = |delays: &[u64]| {
            let mut w = CpuWaits::default();
            delays.iter().for_each(|&d| w.add(d));
            w
        };
        let records = [
            CpuRecord {
                cpu: 0,
                waits: waits(&[100, 300]),
                unplaced: waits(&[50]),
                idle_ns: Some(7),
                idle_window_ns: 10,
            },
            CpuRecord {
                cpu: 3,
                waits: waits(&[]),
                unplaced: waits(&[20, 80]),
                idle_ns: None,
                idle_window_ns: 10,
            },
        ];
        let (cpus, unplaced) = cpu_latencies(&records);
        let row = |c: &CpuLatency| {
            (
                c.cpu,
                c.waits,
                c.total_delay_ns,
                c.avg_delay_ns,
                c.max_delay_ns,
                c.idle_ns,
            )
        };
        assert_eq!(
            cpus.iter().map(row).collect::<Vec<_>>(),
            [(0, 2, 400, 200, 300, Some(7)), (3, 0, 0, 0, 0, None)]
        );
        assert_eq!(unplaced, waits(&[50, 20, 80]));
    }

    #[test]
    fn task_table_rows_add_up() {
        let record = TaskRecord {
            pid: 1,
            tid: 2,
            comm: "w".into(),
            runs: 10,
            delays: 4,
            total_delay_ns: 4_000,
            max_delay_ns: 2_500,
            max_at_ns: 3_000_000_000,
            running_ns: 0,
            sleeping_ns: 0,
            blocked_ns: 0,
            hist: hist_of(&[500, 500, 500, 2_500]),
            open: None,
        };
        let row = task_latency(&record, 1_000_000_000);
        assert_eq!(row.avg_delay_ns, 1_000);
        assert_eq!(row.max_at_s, 2.0);
        assert!(
            row.p99_delay_ns <= 2_500 && row.p99_delay_ns >= 2_400,
            "{}",
            row.p99_delay_ns
        );
        assert_eq!(row.histogram.iter().map(|b| b.count).sum::<u64>(), 4);
        assert!(row.histogram.windows(2).all(|w| w[0].le_ns < w[1].le_ns));
    }
}
