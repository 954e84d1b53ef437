//! Sampled off-CPU stacks (the agent's, see `OffCpuSampling`): a sleep whose stacks were not
//! taken still has its thread and its time. Within one drain interval, a thread's short skipped
//! sleeps are spread over its drawn sleeps (those whose stacks were taken at random to stand for
//! them) in proportion to their time, and their count in proportion to their count: the thread's
//! total time and sleeps stay exact, only their split across its stacks is estimated. Without a
//! drawn sleep in the interval, over its other samples with a stack; without any, and for a skipped sleep
//! of 1 ms or more (a rare long sleep may be elsewhere than a thread's frequent short ones), they
//! are shown as they are, their stack "not sampled".
use std::collections::HashMap;

use profiler_common::{SKIPPED_LONG, STACK_DRAWN, STACK_SKIPPED};

use crate::profile::{RawSample, StackRead};

/// One interval's off-CPU samples, each with its key's flags (`user_unwound`), to what the
/// profile shows.
pub(crate) fn spread_skipped(samples: Vec<(u16, RawSample)>) -> Vec<RawSample> {
    let (skipped, mut out): (Vec<_>, Vec<_>) = (samples.into_iter())
        .map(|(flags, sample)| match flags & SKIPPED_LONG {
            0 => (flags, sample),
            _ => (0, not_sampled(sample)),
        })
        .partition(|(flags, _)| flags & STACK_SKIPPED != 0);
    let mut by_thread: HashMap<u32, (RawSample, u64, u64)> = HashMap::new();
    for (_, sample) in skipped {
        let (ns, sleeps) = (sample.count, sample.deltas.values[0]);
        let total = by_thread.entry(sample.tid).or_insert((sample, 0, 0));
        (total.1, total.2) = (total.1 + ns, total.2 + sleeps);
    }
    // Each thread's samples with a stack, found once (not a pass over all samples per thread).
    let mut stacked: HashMap<u32, Vec<usize>> = HashMap::new();
    for (i, (_, sample)) in out.iter().enumerate() {
        if !matches!(sample.user, StackRead::NotSampled) {
            stacked.entry(sample.tid).or_default().push(i);
        }
    }
    let mut apart = Vec::new();
    for (tid, (sample, ns, sleeps)) in by_thread {
        let own = stacked.get(&tid).map_or(&[][..], Vec::as_slice);
        if !spread(&mut out, own, ns, sleeps) {
            let mut sample = not_sampled(sample);
            (sample.count, sample.deltas.values[0]) = (ns, sleeps);
            apart.push(sample);
        }
    }
    (out.into_iter().map(|(_, sample)| sample)).chain(apart).collect()
}

/// A thread's skipped time and sleeps over its drawn samples among `own` (its samples with a
/// stack, by index in `out`), else over all of `own`. False: it has none.
fn spread(out: &mut [(u16, RawSample)], own: &[usize], ns: u64, sleeps: u64) -> bool {
    let drawn: Vec<usize> = (own.iter().copied())
        .filter(|&i| out[i].0 & STACK_DRAWN != 0)
        .collect();
    let over = match drawn.is_empty() {
        false => drawn,
        true => own.to_vec(),
    };
    if over.is_empty() {
        return false;
    }
    let weights =
        |weight: fn(&RawSample) -> u64| -> Vec<u64> { over.iter().map(|&i| weight(&out[i].1)).collect() };
    let time = split(ns, &weights(|s| s.count));
    let count = split(sleeps, &weights(|s| s.deltas.values[0]));
    for (k, &i) in over.iter().enumerate() {
        out[i].1.count += time[k];
        out[i].1.deltas.values[0] += count[k];
    }
    true
}

/// `amount` in parts proportional to `weights` (equal parts where they are all 0), adding up to
/// it exactly: the rounding's remainder goes to the heaviest.
fn split(amount: u64, weights: &[u64]) -> Vec<u64> {
    let total: u128 = weights.iter().map(|&w| u128::from(w)).sum();
    let mut parts: Vec<u64> = match total {
        0 => vec![amount / weights.len().max(1) as u64; weights.len()],
        _ => (weights.iter())
            .map(|&w| (u128::from(amount) * u128::from(w) / total) as u64)
            .collect(),
    };
    let given: u64 = parts.iter().sum();
    let heaviest = (0..weights.len()).min_by_key(|&i| std::cmp::Reverse(weights[i]));
    if let Some(i) = heaviest {
        parts[i] += amount - given;
    }
    parts
}

fn not_sampled(mut sample: RawSample) -> RawSample {
    sample.user = StackRead::NotSampled;
    sample.kernel = StackRead::Absent;
    sample
}

#[cfg(test)]
mod tests {
    use super::*;
    use profiler_common::CounterDeltas;

    fn sample(tid: u32, stack: u64, ns: u64, sleeps: u64) -> RawSample {
        let mut deltas = CounterDeltas::default();
        deltas.values[0] = sleeps;
        RawSample {
            pid: 1,
            tid,
            comm: "t".into(),
            user: StackRead::Frames(vec![stack]),
            kernel: StackRead::Absent,
            count: ns,
            exec_generation: 0,
            event: 0,
            deltas,
            user_objects: Vec::new(),
        }
    }

    fn skipped(tid: u32, ns: u64, sleeps: u64) -> (u16, RawSample) {
        let mut s = sample(tid, 0, ns, sleeps);
        s.user = StackRead::Absent;
        (STACK_SKIPPED, s)
    }

    fn of(out: &[RawSample], tid: u32, user: StackRead) -> (u64, u64) {
        (out.iter())
            .filter(|s| s.tid == tid && s.user == user)
            .fold((0, 0), |(ns, n), s| (ns + s.count, n + s.deltas.values[0]))
    }

    #[test]
    fn skipped_sleeps_go_to_the_drawn_ones_of_their_thread_in_proportion_and_totals_stay_exact() {
        let out = spread_skipped(vec![
            (0, sample(7, 1, 1_000, 1)),
            (STACK_DRAWN, sample(7, 2, 300, 3)),
            (STACK_DRAWN, sample(7, 3, 100, 1)),
            skipped(7, 4_001, 40),
            (STACK_DRAWN, sample(8, 2, 50, 1)),
        ]);
        // The sleep taken whole keeps its own; 300:100 of the skipped time, 3:1 of its sleeps.
        assert_eq!(of(&out, 7, StackRead::Frames(vec![1])), (1_000, 1));
        assert_eq!(of(&out, 7, StackRead::Frames(vec![2])), (300 + 3_001, 3 + 30));
        assert_eq!(of(&out, 7, StackRead::Frames(vec![3])), (100 + 1_000, 1 + 10));
        assert_eq!(of(&out, 8, StackRead::Frames(vec![2])), (50, 1));
        let total: u64 = out.iter().map(|s| s.count).sum();
        assert_eq!(total, 1_000 + 300 + 100 + 4_001 + 50);
        assert!(out.iter().all(|s| s.user != StackRead::Absent));
    }

    #[test]
    fn without_drawn_sleeps_over_the_whole_ones_and_without_any_shown_not_sampled() {
        let out = spread_skipped(vec![
            (0, sample(7, 1, 100, 1)),
            (0, sample(7, 2, 300, 1)),
            skipped(7, 800, 4),
            skipped(9, 500, 2),
        ]);
        assert_eq!(of(&out, 7, StackRead::Frames(vec![1])), (300, 3));
        assert_eq!(of(&out, 7, StackRead::Frames(vec![2])), (900, 3));
        assert_eq!(of(&out, 9, StackRead::NotSampled), (500, 2));
    }

    #[test]
    fn long_skipped_sleeps_are_shown_apart_not_spread() {
        let mut long = skipped(7, 5_000_000, 1);
        long.0 |= SKIPPED_LONG;
        let out = spread_skipped(vec![(STACK_DRAWN, sample(7, 1, 100, 1)), long]);
        assert_eq!(of(&out, 7, StackRead::Frames(vec![1])), (100, 1));
        assert_eq!(of(&out, 7, StackRead::NotSampled), (5_000_000, 1));
    }

    #[test]
    fn parts_add_up_to_the_amount() {
        assert_eq!(split(10, &[1, 1, 1]), vec![4, 3, 3]);
        assert_eq!(split(7, &[0, 0]), vec![4, 3]);
        assert_eq!(
            split(u64::MAX, &[u64::MAX, 1])
                .iter()
                .map(|&p| p as u128)
                .sum::<u128>(),
            u64::MAX as u128
        );
    }
}
