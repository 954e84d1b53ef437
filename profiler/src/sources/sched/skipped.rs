//! Sleeps without stacks kept in the task entries (`TaskSched::skipped`): a short skipped sleep
//! that began and ended in one epoch is summed in its thread's entry, by the epoch's slot, not
//! recorded in the off-CPU map. Each drain turns the drained epoch's sums into the records the
//! map would have held (thread, no stacks, `STACK_SKIPPED`), so everything after reads them alike.
//!
//! A live thread's sums are read from the task map after the flip. A thread that exited took its
//! entry to the exited map, which is taken before the task map is read. From an exited entry:
//! sums of the epoch now written (it exited after the flip) are held for the next drain; of the
//! drained epoch, read; of the epoch before, read unless its live entry was read for them at the
//! last drain (it exited between that drain's two reads otherwise, and neither had it); older
//! ones were read live (an entry is taken at most one drain after its thread exits).
//!
//! Left: a thread that exits in the milliseconds between a drain's two reads has that interval's
//! sums read at the next drain, one interval late (and not at all after a run's last drain); a
//! thread that execs mid-interval has the interval's sums under its new image.
use std::collections::HashSet;

use profiler_common::{lock::NO_STACK, OffCpuTime, SampleKey, SkippedSleeps, TaskSched, STACK_SKIPPED};

use crate::collect::Flip;

#[derive(Default)]
pub(crate) struct SkippedInEntries {
    /// The threads whose sums were read from their live entry at the last drain.
    read_live: HashSet<u32>,
    /// Sums of the epoch written at the last drain, of threads that had exited by then.
    held: Vec<(SampleKey, OffCpuTime)>,
}

impl SkippedInEntries {
    /// The records of the epoch drained at `flip`: from `exited` (the entries taken from the
    /// exited map at this drain) and `live` (the task map, read after it).
    pub fn records(
        &mut self,
        flip: Flip,
        exited: &[TaskSched],
        live: &[(u32, TaskSched)],
    ) -> Vec<(SampleKey, OffCpuTime)> {
        let drained = flip.generation.wrapping_sub(1);
        let mut out = std::mem::take(&mut self.held);
        for task in exited {
            for sums in task.skipped.iter().filter(|s| s.count > 0) {
                match drained.wrapping_sub(sums.generation) as i32 {
                    -1 => self.held.push(record(task, sums)),
                    0 => out.push(record(task, sums)),
                    1 if !self.read_live.contains(&task.tid) => out.push(record(task, sums)),
                    _ => {}
                }
            }
        }
        self.read_live.clear();
        for (_, task) in live {
            let sums = &task.skipped[(drained & 1) as usize];
            // Once per thread, even if a read that fell back to walking the keys saw it twice.
            if sums.generation == drained && sums.count > 0 && self.read_live.insert(task.tid) {
                out.push(record(task, sums));
            }
        }
        out
    }
}

/// The off-CPU map's record of a thread's sums.
fn record(task: &TaskSched, sums: &SkippedSleeps) -> (SampleKey, OffCpuTime) {
    let key = SampleKey {
        tgid: task.tgid,
        tid: task.tid,
        user_stack_id: NO_STACK,
        kernel_stack_id: NO_STACK,
        comm: task.comm,
        user_unwound: STACK_SKIPPED,
        event: 0,
        exec_generation: task.exec_generation,
    };
    let time = OffCpuTime {
        total_ns: sums.total_ns,
        count: u64::from(sums.count),
    };
    (key, time)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(tid: u32, sums: [(u32, u32, u64); 2]) -> TaskSched {
        // SAFETY: all-zero is a valid `TaskSched` (plain integers and arrays of them).
        let mut t: TaskSched = unsafe { std::mem::zeroed() };
        t.tid = tid;
        t.tgid = 1;
        for (slot, (generation, count, total_ns)) in t.skipped.iter_mut().zip(sums) {
            *slot = SkippedSleeps {
                generation,
                count,
                total_ns,
            };
        }
        t
    }

    fn flip(generation: u32) -> Flip {
        Flip {
            slot: (generation.wrapping_sub(1) & 1) as usize,
            generation,
            at_ns: 0,
        }
    }

    fn totals(records: &[(SampleKey, OffCpuTime)]) -> Vec<(u32, u64, u64)> {
        let mut v: Vec<_> = (records.iter())
            .map(|(k, t)| {
                assert_eq!(k.user_unwound, STACK_SKIPPED);
                assert_eq!((k.user_stack_id, k.kernel_stack_id), (NO_STACK, NO_STACK));
                (k.tid, t.count, t.total_ns)
            })
            .collect();
        v.sort();
        v
    }

    #[test]
    fn a_live_threads_drained_epoch_is_read_once_and_the_written_one_at_the_next_drain() {
        let mut s = SkippedInEntries::default();
        // Epoch 5 drained (slot 1); slot 0 already holds epoch 6's first sums.
        let live = [(7, task(7, [(6, 1, 10), (5, 3, 300)]))];
        assert_eq!(totals(&s.records(flip(6), &[], &live)), vec![(7, 3, 300)]);
        let live = [(7, task(7, [(6, 4, 40), (5, 3, 300)]))];
        assert_eq!(totals(&s.records(flip(7), &[], &live)), vec![(7, 4, 40)]);
        // Nothing new in epoch 7: slot 1 still holds epoch 5's, not read again.
        assert!(s.records(flip(8), &[], &live).is_empty());
    }

    #[test]
    fn a_thread_that_exits_after_the_flip_gives_the_drained_epoch_now_and_the_new_one_next() {
        let mut s = SkippedInEntries::default();
        let exited = [task(7, [(6, 2, 20), (5, 3, 300)])];
        assert_eq!(totals(&s.records(flip(6), &exited, &[])), vec![(7, 3, 300)]);
        assert_eq!(totals(&s.records(flip(7), &[], &[])), vec![(7, 2, 20)]);
        assert!(s.records(flip(8), &[], &[]).is_empty());
    }

    #[test]
    fn a_thread_that_exits_after_its_entry_was_read_is_not_counted_twice() {
        let mut s = SkippedInEntries::default();
        let live = [(7, task(7, [(0, 0, 0), (5, 3, 300)]))];
        assert_eq!(totals(&s.records(flip(6), &[], &live)), vec![(7, 3, 300)]);
        // It slept in epoch 6 too, then exited: only epoch 6's sums are new.
        let exited = [task(7, [(6, 2, 20), (5, 3, 300)])];
        assert_eq!(totals(&s.records(flip(7), &exited, &[])), vec![(7, 2, 20)]);
    }

    #[test]
    fn sums_read_live_drains_ago_are_not_read_again_when_the_thread_exits() {
        let mut s = SkippedInEntries::default();
        let live = [(7, task(7, [(2, 1, 10), (3, 3, 300)]))];
        assert_eq!(totals(&s.records(flip(3), &[], &live)), vec![(7, 1, 10)]);
        assert_eq!(totals(&s.records(flip(4), &[], &live)), vec![(7, 3, 300)]);
        assert!(s.records(flip(5), &[], &live).is_empty());
        let exited = [task(7, [(2, 1, 10), (3, 3, 300)])];
        assert!(s.records(flip(6), &exited, &[]).is_empty());
    }

    #[test]
    fn a_thread_that_exits_between_the_two_reads_is_counted_at_the_next_drain() {
        let mut s = SkippedInEntries::default();
        // Gone from the task map at drain 6, in neither read; the exited map has it at drain 7.
        assert!(s.records(flip(6), &[], &[]).is_empty());
        let exited = [task(7, [(0, 0, 0), (5, 3, 300)])];
        assert_eq!(totals(&s.records(flip(7), &exited, &[])), vec![(7, 3, 300)]);
    }
}
