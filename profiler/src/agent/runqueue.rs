//! Run-queue delay per thread, per window: the growth of each thread's totals (the kernel's own
//! figures, cumulative in the task map and in the record a thread leaves when it exits) since
//! the window before.
use std::collections::HashMap;

use crate::modes::sched::TaskRecord;

/// Upper bounds of the `/metrics` histogram, powers of four from 4 µs to 4.3 s: powers of two,
/// like the boundaries of the kernel side's fine buckets, so each fine bucket falls wholly under
/// one of them (a bound is exclusive by a nanosecond: a wait of exactly 2^k ns counts above it).
pub const BOUNDS_NS: [u64; 11] = [
    1 << 12,
    1 << 14,
    1 << 16,
    1 << 18,
    1 << 20,
    1 << 22,
    1 << 24,
    1 << 26,
    1 << 28,
    1 << 30,
    1 << 32,
];
/// The bounds and one more for longer waits.
pub const BUCKETS: usize = BOUNDS_NS.len() + 1;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Totals {
    waits: u64,
    delay_ns: u64,
    buckets: [u64; BUCKETS],
}

impl Totals {
    fn of(task: &TaskRecord) -> Totals {
        let mut buckets = [0u64; BUCKETS];
        for (index, &count) in task.hist.iter().enumerate() {
            if count > 0 {
                let lower = profiler_common::hist_lower_bound(index);
                buckets[BOUNDS_NS.partition_point(|&bound| bound <= lower)] += u64::from(count);
            }
        }
        Totals {
            waits: task.delays,
            delay_ns: task.total_delay_ns,
            buckets,
        }
    }

    fn since(&self, earlier: Option<&Totals>) -> Totals {
        let Some(earlier) = earlier else {
            return *self;
        };
        let mut buckets = self.buckets;
        for (now, then) in buckets.iter_mut().zip(earlier.buckets) {
            *now = now.saturating_sub(then);
        }
        Totals {
            waits: self.waits.saturating_sub(earlier.waits),
            delay_ns: self.delay_ns.saturating_sub(earlier.delay_ns),
            buckets,
        }
    }
}

/// One thread's waits for a CPU in a window.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThreadWait {
    pub pid: u32,
    pub tid: u32,
    pub comm: String,
    pub delay_ns: u64,
    pub waits: u64,
}

/// A window's run-queue figures.
#[derive(Clone, Debug, Default)]
pub struct RunQueueWindow {
    /// Threads that waited, longest first.
    pub threads: Vec<ThreadWait>,
    /// Waits per `/metrics` bucket (not cumulative).
    pub buckets: [u64; BUCKETS],
    pub delay_ns: u64,
}

/// Each thread's totals at the last window's end.
#[derive(Default)]
pub struct RunQueue {
    last: HashMap<u32, Totals>,
}

impl RunQueue {
    /// The window that ends now: `exited`, the records of threads that exited since the last
    /// (each the whole life of its thread); `live`, every thread's record so far.
    pub fn window(&mut self, exited: &[TaskRecord], live: &[TaskRecord]) -> RunQueueWindow {
        let mut window = RunQueueWindow::default();
        let mut add = |task: &TaskRecord, grown: Totals| {
            if grown.waits == 0 && grown.delay_ns == 0 {
                return;
            }
            for (sum, n) in window.buckets.iter_mut().zip(grown.buckets) {
                *sum += n;
            }
            window.delay_ns += grown.delay_ns;
            window.threads.push(ThreadWait {
                pid: task.pid,
                tid: task.tid,
                comm: task.comm.clone(),
                delay_ns: grown.delay_ns,
                waits: grown.waits,
            });
        };
        // Exits first: a tid reused since belongs to a new thread, counted from zero.
        for task in exited {
            let grown = Totals::of(task).since(self.last.remove(&task.tid).as_ref());
            add(task, grown);
        }
        let mut now = HashMap::with_capacity(live.len());
        for task in live {
            let totals = Totals::of(task);
            add(task, totals.since(self.last.get(&task.tid)));
            now.insert(task.tid, totals);
        }
        // Threads gone without a record (the kernel's map of exits was full) are let go too.
        self.last = now;
        window
            .threads
            .sort_by(|a, b| b.delay_ns.cmp(&a.delay_ns).then(a.tid.cmp(&b.tid)));
        window
    }

    pub fn threads(&self) -> usize {
        self.last.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use profiler_common::hist_bucket;

    fn task(tid: u32, waits: &[u64]) -> TaskRecord {
        TaskRecord::with_waits(tid, &format!("t{tid}"), waits)
    }

    #[test]
    fn each_window_holds_the_growth_since_the_last_and_a_reused_tid_starts_from_zero() {
        let mut rq = RunQueue::default();
        let first = rq.window(&[], &[task(7, &[1_000, 5_000_000])]);
        assert_eq!(first.delay_ns, 5_001_000);
        assert_eq!(first.buckets[0], 1, "1 µs: under 4 µs");
        assert_eq!(first.buckets[BOUNDS_NS.partition_point(|&b| b <= 5_000_000)], 1);
        // Thread 7 waited 2 ms more, then exited; a new thread 7 waited 3 µs.
        let second = rq.window(&[task(7, &[1_000, 5_000_000, 2_000_000])], &[task(7, &[3_000])]);
        assert_eq!(second.threads.len(), 2);
        assert_eq!(second.delay_ns, 2_003_000);
        assert_eq!(second.buckets.iter().sum::<u64>(), 2);
        let third = rq.window(&[], &[task(7, &[3_000])]);
        assert!(third.threads.is_empty(), "no growth, no entry");
        assert_eq!(rq.window(&[], &[]).delay_ns, 0);
        assert_eq!(rq.threads(), 0, "gone threads are let go");
    }

    #[test]
    fn a_fine_bucket_never_straddles_a_bound() {
        for &bound in &BOUNDS_NS {
            let below = hist_bucket(bound - 1);
            let at = hist_bucket(bound);
            assert_ne!(below, at);
            assert_eq!(profiler_common::hist_lower_bound(at), bound);
        }
    }
}
