//! Off-CPU time, drained at every epoch flip like the samples, so each interval (a run's second,
//! an agent's window) holds exactly the time threads spent asleep within it.
//!
//! The kernel records a sleep when it ends, in the slot of that moment, with the stacks it took
//! when the sleep began, in the slot of *that* moment. A sleep that spans a flip is cut at it:
//! the part before goes to the interval just ended, under stacks user space reads before it
//! clears their slot and keeps by thread; when the sleep ends, its record (marked
//! `BEGAN_EARLIER`) brings only the rest. A thread has one sleep at a time, so one kept entry per
//! thread is all it takes.
use std::collections::HashMap;

use profiler_common::{
    CounterDeltas, OffCpuStart, OffCpuTime, SampleKey, BEGAN_EARLIER, COMM_LEN, SKIPPED_LONG, STACK_SKIPPED,
};

use crate::{
    collect::{comm_string, Flip},
    profile::{RawSample, StackRead},
};

/// Reads the stacks of a key taken in the slot being drained (before it is cleared).
pub(crate) trait SlotStacks {
    fn read(&self, key: &SampleKey) -> (StackRead, StackRead);
}

/// A thread asleep (or woken, not yet running) when its task entry was read after a flip.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Asleep {
    pub tid: u32,
    pub comm: [u8; COMM_LEN],
    pub start: OffCpuStart,
    /// When it was woken, if it was (then the sleep is over; it waits for a CPU).
    pub woke_ns: Option<u64>,
}

/// A sleep that began before the last flip and had not ended when it was read.
#[derive(Clone, Debug)]
struct Cut {
    began_ns: u64,
    user: StackRead,
    kernel: StackRead,
    /// Its time already given to earlier intervals.
    credited_ns: u64,
    /// Drains since it was last seen asleep: its record is due by the second.
    unseen: u8,
}

impl Cut {
    fn new(began_ns: u64, user: StackRead, kernel: StackRead) -> Cut {
        Cut {
            began_ns,
            user,
            kernel,
            credited_ns: 0,
            unseen: 0,
        }
    }
}

/// The sleeps cut at flips, by thread.
#[derive(Default)]
pub(crate) struct SleepsInFlight {
    cuts: HashMap<u32, Cut>,
    /// Sleeps whose stacks were gone before they could be kept (counted, shown as lost).
    pub stacks_lost: u64,
    /// Sleeps whose stacks were not taken (`STACK_SKIPPED`), so far.
    pub unsampled: u64,
}

impl SleepsInFlight {
    /// One drain after `flip`:
    /// - `ended`: the drained slot's records (sleeps that ended in the interval);
    /// - `asleep`: the threads asleep when the task entries were read, after the flip;
    /// - `ended_since`: the keys marked `BEGAN_EARLIER` in the slot now written, read after
    ///   `asleep` (sleeps that ended between the flip and that read);
    /// - `stacks`: the drained slot's stacks;
    /// - `generation_of`: a process's exec generation now.
    ///
    /// Returns the interval's off-CPU time by stack, in ns, with the sleeps that ended in it as
    /// counter 0 (sleeps whose stacks were not sampled spread over those drawn: `spread`).
    pub fn drain(
        &mut self,
        flip: Flip,
        ended: Vec<(SampleKey, OffCpuTime)>,
        asleep: &[Asleep],
        ended_since: &[SampleKey],
        stacks: &dyn SlotStacks,
        generation_of: &dyn Fn(u32) -> u32,
    ) -> Vec<RawSample> {
        // First the records, so a cut sleep that ended is settled before its thread's next one.
        let mut out = self.ended(ended, stacks);
        for cut in self.cuts.values_mut() {
            cut.unseen = cut.unseen.saturating_add(1);
        }
        for thread in asleep {
            out.extend(self.cut(flip, thread, stacks, generation_of));
        }
        // Sleeps that ended between the flip and the read: not cut, but their stacks are in the
        // slot about to be cleared.
        for key in ended_since {
            if key.user_unwound & BEGAN_EARLIER == 0 || self.cuts.contains_key(&key.tid) {
                continue;
            }
            let plain = SampleKey {
                user_unwound: key.user_unwound & !BEGAN_EARLIER,
                ..*key
            };
            let (user, kernel) = stacks.read(&plain);
            self.cuts.insert(key.tid, Cut::new(0, user, kernel));
        }
        // A cut whose thread was seen awake two drains running will get no record: it exited
        // asleep.
        self.cuts.retain(|_, cut| cut.unseen < 2);
        self.unsampled += (out.iter())
            .filter(|(flags, _)| flags & STACK_SKIPPED != 0)
            .map(|(_, sample)| sample.deltas.values[0])
            .sum::<u64>();
        super::spread::spread_skipped(out)
    }

    /// The sleeps that ended in the interval: whole, or the rest of a sleep cut earlier.
    fn ended(
        &mut self,
        ended: Vec<(SampleKey, OffCpuTime)>,
        stacks: &dyn SlotStacks,
    ) -> Vec<(u16, RawSample)> {
        let mut out = Vec::with_capacity(ended.len());
        for (key, time) in ended {
            let (user, kernel, total_ns) = match key.user_unwound & BEGAN_EARLIER {
                0 => {
                    let (user, kernel) = stacks.read(&key);
                    (user, kernel, time.total_ns)
                }
                _ => match self.cuts.remove(&key.tid) {
                    Some(cut) => (
                        cut.user,
                        cut.kernel,
                        time.total_ns.saturating_sub(cut.credited_ns),
                    ),
                    None => {
                        // (A sleep without stacks had none to keep.)
                        self.stacks_lost += u64::from(key.user_unwound & STACK_SKIPPED == 0);
                        (StackRead::Error(0), StackRead::Error(0), time.total_ns)
                    }
                },
            };
            out.push((key.user_unwound, sample(&key, user, kernel, total_ns, time.count)));
        }
        out
    }

    /// A thread asleep across the flip: its sleep is cut there (kept with its stacks the first
    /// time), and the interval gets the part not credited yet.
    fn cut(
        &mut self,
        flip: Flip,
        thread: &Asleep,
        stacks: &dyn SlotStacks,
        generation_of: &dyn Fn(u32) -> u32,
    ) -> Option<(u16, RawSample)> {
        let start = &thread.start;
        // Asleep since after the flip: the next interval's.
        if start.at_ns == 0 || start.generation == flip.generation {
            return None;
        }
        let key = start_key(thread);
        if self
            .cuts
            .get(&thread.tid)
            .is_none_or(|cut| cut.began_ns != start.at_ns)
        {
            let (user, kernel) = match start.generation == flip.generation.wrapping_sub(1) {
                true => stacks.read(&key),
                // Its slot was cleared while it slept, and it was not kept: never expected (a
                // sleep is kept at the first flip it spans).
                false => {
                    self.stacks_lost += u64::from(start.user_unwound & u32::from(STACK_SKIPPED) == 0);
                    (StackRead::Error(0), StackRead::Error(0))
                }
            };
            self.cuts.insert(thread.tid, Cut::new(start.at_ns, user, kernel));
        }
        let cut = self.cuts.get_mut(&thread.tid).expect("kept just above");
        cut.unseen = 0;
        let until = thread.woke_ns.map_or(flip.at_ns, |woke| woke.min(flip.at_ns));
        let due = until.saturating_sub(start.at_ns).saturating_sub(cut.credited_ns);
        if due == 0 {
            return None;
        }
        cut.credited_ns += due;
        let key = SampleKey {
            exec_generation: generation_of(key.tgid),
            ..key
        };
        // A sleep without stacks long enough by now is shown apart, as the kernel keys it as it ends.
        let long = key.user_unwound & STACK_SKIPPED != 0
            && until.saturating_sub(start.at_ns) >= super::LONG_SKIPPED_NS;
        let flags = key.user_unwound | if long { SKIPPED_LONG } else { 0 };
        Some((flags, sample(&key, cut.user.clone(), cut.kernel.clone(), due, 0)))
    }

    /// Sleeps being kept across flips now.
    pub fn kept(&self) -> usize {
        self.cuts.len()
    }
}

/// The key the kernel will record this sleep under when it ends (less `BEGAN_EARLIER`).
fn start_key(thread: &Asleep) -> SampleKey {
    SampleKey {
        tgid: thread.start.tgid,
        tid: thread.tid,
        user_stack_id: thread.start.user_stack_id,
        kernel_stack_id: thread.start.kernel_stack_id,
        comm: thread.comm,
        user_unwound: thread.start.user_unwound as u16,
        event: 0,
        exec_generation: 0,
    }
}

/// Weighted by time asleep; how many sleeps ended rides in the first counter slot. Untimed, so
/// taken as they are (see `CounterDeltas::estimate`).
fn sample(key: &SampleKey, user: StackRead, kernel: StackRead, ns: u64, sleeps: u64) -> RawSample {
    let mut deltas = CounterDeltas::default();
    deltas.values[0] = sleeps;
    RawSample {
        pid: key.tgid,
        tid: key.tid,
        comm: comm_string(&key.comm),
        user,
        kernel,
        count: ns,
        exec_generation: key.exec_generation,
        event: 0,
        deltas,
        user_objects: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Stacks by user stack id: id n is the frame [n].
    struct Slot;
    impl SlotStacks for Slot {
        fn read(&self, key: &SampleKey) -> (StackRead, StackRead) {
            (
                StackRead::Frames(vec![key.user_stack_id as u64]),
                StackRead::Absent,
            )
        }
    }
    struct Cleared;
    impl SlotStacks for Cleared {
        fn read(&self, _: &SampleKey) -> (StackRead, StackRead) {
            panic!("a kept sleep's stacks are read from a slot that no longer has them")
        }
    }

    fn flip(generation: u32, at_ns: u64) -> Flip {
        Flip {
            slot: (generation.wrapping_sub(1) & 1) as usize,
            generation,
            at_ns,
        }
    }

    fn asleep(tid: u32, at_ns: u64, generation: u32, stack: i32) -> Asleep {
        Asleep {
            tid,
            comm: [0; COMM_LEN],
            start: OffCpuStart {
                at_ns,
                user_stack_id: stack,
                kernel_stack_id: -14,
                tgid: 1,
                generation,
                ..Default::default()
            },
            woke_ns: None,
        }
    }

    fn record(tid: u32, stack: i32, earlier: bool, total_ns: u64) -> (SampleKey, OffCpuTime) {
        let key = SampleKey {
            tgid: 1,
            tid,
            user_stack_id: stack,
            kernel_stack_id: -14,
            comm: [0; COMM_LEN],
            user_unwound: if earlier { BEGAN_EARLIER } else { 0 },
            event: 0,
            exec_generation: 0,
        };
        (key, OffCpuTime { total_ns, count: 1 })
    }

    fn total(samples: &[RawSample]) -> (u64, u64) {
        (
            samples.iter().map(|s| s.count).sum(),
            samples.iter().map(|s| s.deltas.values[0]).sum(),
        )
    }

    #[test]
    fn a_sleep_over_three_flips_is_cut_at_each_under_the_stack_it_began_with() {
        let mut sleeps = SleepsInFlight::default();
        let none = |_| 0;
        // Asleep from 100 in generation 0 until 3500 (generation 3); flips at 1000, 2000, 3000.
        let first = sleeps.drain(flip(1, 1000), vec![], &[asleep(7, 100, 0, 42)], &[], &Slot, &none);
        assert_eq!(total(&first), (900, 0));
        assert_eq!(first[0].user, StackRead::Frames(vec![42]));
        let second = sleeps.drain(
            flip(2, 2000),
            vec![],
            &[asleep(7, 100, 0, 42)],
            &[],
            &Cleared,
            &none,
        );
        assert_eq!(total(&second), (1000, 0));
        assert_eq!(second[0].user, StackRead::Frames(vec![42]), "kept, not re-read");
        let third = sleeps.drain(
            flip(3, 3000),
            vec![],
            &[asleep(7, 100, 0, 42)],
            &[],
            &Cleared,
            &none,
        );
        assert_eq!(total(&third), (1000, 0));
        // It ends at 3500: the kernel's record holds all 3400 ns; only the rest is new.
        let last = sleeps.drain(
            flip(4, 4000),
            vec![record(7, 42, true, 3400)],
            &[],
            &[],
            &Cleared,
            &none,
        );
        assert_eq!(total(&last), (500, 1), "the rest of the sleep, counted once");
        assert_eq!(last[0].user, StackRead::Frames(vec![42]));
        assert_eq!(sleeps.kept(), 0);
        assert_eq!(sleeps.stacks_lost, 0);
    }

    #[test]
    fn a_sleep_that_ends_between_the_flip_and_the_read_keeps_its_stack_for_the_next_drain() {
        let mut sleeps = SleepsInFlight::default();
        let none = |_| 0;
        // Began in generation 0, ended just after the flip to 1, before the task entries were
        // read: not asleep any more, its record is in the slot now written.
        let (key, _) = record(7, 42, true, 950);
        let first = sleeps.drain(flip(1, 1000), vec![], &[], &[key], &Slot, &none);
        assert!(first.is_empty(), "not cut: the whole sleep goes with its record");
        let next = sleeps.drain(
            flip(2, 2000),
            vec![record(7, 42, true, 950)],
            &[],
            &[],
            &Cleared,
            &none,
        );
        assert_eq!(total(&next), (950, 1));
        assert_eq!(next[0].user, StackRead::Frames(vec![42]));
    }

    #[test]
    fn a_woken_thread_is_cut_where_it_woke_and_sleeps_of_the_interval_are_taken_whole() {
        let mut sleeps = SleepsInFlight::default();
        let none = |_| 0;
        let mut woken = asleep(7, 100, 0, 42);
        woken.woke_ns = Some(600);
        let ended = vec![record(8, 5, false, 300)];
        // A thread asleep since after the flip belongs to the next interval.
        let later = asleep(9, 1001, 1, 6);
        let first = sleeps.drain(flip(1, 1000), ended, &[woken, later], &[], &Slot, &none);
        assert_eq!(total(&first), (300 + 500, 1));
        // It runs after the flip: the kernel's record (500 ns) is all credited already.
        let next = sleeps.drain(
            flip(2, 2000),
            vec![record(7, 42, true, 500)],
            &[],
            &[],
            &Cleared,
            &none,
        );
        assert_eq!(total(&next), (0, 1));
    }

    #[test]
    fn a_thread_that_exits_asleep_is_forgotten_and_a_record_without_its_stacks_is_counted() {
        let mut sleeps = SleepsInFlight::default();
        let none = |_| 0;
        sleeps.drain(flip(1, 1000), vec![], &[asleep(7, 100, 0, 42)], &[], &Slot, &none);
        assert_eq!(sleeps.kept(), 1);
        sleeps.drain(flip(2, 2000), vec![], &[], &[], &Cleared, &none);
        sleeps.drain(flip(3, 3000), vec![], &[], &[], &Cleared, &none);
        assert_eq!(sleeps.kept(), 0, "its record never came");
        let orphan = sleeps.drain(
            flip(4, 4000),
            vec![record(8, 1, true, 10)],
            &[],
            &[],
            &Cleared,
            &none,
        );
        assert_eq!(total(&orphan), (10, 1), "the time stays, under a lost stack");
        assert_eq!(orphan[0].user, StackRead::Error(0));
        assert_eq!(sleeps.stacks_lost, 1);
    }
}
