//! What reports are made of: the run's header (`RunMeta`) and the stack model every mode with
//! stacks builds (`StackReport`: weighted stacks and per-function self/total), whether the
//! weight is samples on CPU, nanoseconds off CPU or nanoseconds waited for locks.
use std::collections::{HashMap, HashSet};

use serde::Serialize;

use crate::{
    profile::{Health, LostStack, RawProfile, StackKey},
    sources::samples::Rate,
    symbolize::{Frame, Symbols},
};

/// What was measured, how, and for how long: the header of every report.
#[derive(Clone, Debug, Serialize)]
pub struct RunMeta {
    pub mode: &'static str,
    /// The event sampled (perf's name for it, as given), or what the mode times.
    pub event: String,
    pub frequency_hz: u64,
    /// Sampled every this many events (`-c`) rather than at `frequency_hz`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub period: Option<u64>,
    pub duration_s: f64,
    /// What was profiled, in words ("system-wide", "pid 1234", "command ./w").
    pub target: String,
    pub cpus: u32,
    /// Things the user should know about the run (e.g. a target exited early).
    pub notes: Vec<String>,
    /// Counters whose deltas are attributed to stacks (`--counter`), in order.
    pub counters: Vec<String>,
    /// What each sample counts instead of one (`--weight`: `arg1`, `retval`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<String>,
}

impl RunMeta {
    /// How the event was sampled: `cycles every 100003 events`, `cpu-clock at 99 Hz`; none for
    /// a profile that says neither.
    pub fn sampling(&self) -> Option<String> {
        let rate = match (self.period, self.frequency_hz) {
            (Some(n), _) => Rate::Period(n),
            (None, hz) if hz > 0 => Rate::Frequency(hz),
            _ => return None,
        };
        Some(format!("{} {rate}", self.event))
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Stack {
    pub pid: u32,
    pub tid: u32,
    pub comm: String,
    pub count: u64,
    /// Counter deltas attributed to this stack, in `RunMeta::counters` order (empty without).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub counters: Vec<u64>,
    /// Outermost first, leaf last.
    pub frames: Vec<Frame>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FunctionStat {
    pub function: String,
    pub module: String,
    #[serde(rename = "self")]
    pub self_samples: u64,
    #[serde(rename = "total")]
    pub total_samples: u64,
    /// Counter deltas of the samples where it is the leaf, in `RunMeta::counters` order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub counters: Vec<u64>,
}

/// What a stack's count measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Weight {
    /// Sampled on CPU: one per sample.
    Samples,
    /// Off CPU: nanoseconds blocked.
    OffCpuNanoseconds,
    /// Lock mode: nanoseconds waited for locks.
    LockWaitNanoseconds,
}

#[derive(Clone, Debug)]
pub struct StackReport {
    pub meta: RunMeta,
    pub weight: Weight,
    pub health: Health,
    /// Samples in the stacks below (the sum of their counts).
    pub samples: u64,
    /// Most samples first.
    pub stacks: Vec<Stack>,
    /// Most self samples first.
    pub functions: Vec<FunctionStat>,
    /// Where each user file's names came from (empty for a profile read back).
    pub symbols: Vec<crate::symbolize::NameSource>,
}

/// Fold a symbolized profile into stacks and functions, each count measuring `weight`.
pub fn stack_report(mut meta: RunMeta, raw: &RawProfile, symbols: &Symbols, weight: Weight) -> StackReport {
    meta.notes.extend(multiplexing_notes(&meta.counters, raw));
    meta.notes.extend(crate::symbolize::names_note(&symbols.names));
    let mut stacks: Vec<Stack> = raw
        .stacks
        .iter()
        .map(|(key, &count)| {
            let frames = frames_of(key, symbols);
            // Scaled where a counter was multiplexed; one that never ran in this stack's
            // intervals adds nothing (and the run's note says how much was not counted).
            let counters = match (meta.counters.len(), raw.counters.get(key)) {
                (0, _) => Vec::new(),
                (n, None) => vec![0; n],
                (n, Some(c)) => (0..n).map(|k| c.estimate(k).unwrap_or(0)).collect(),
            };
            Stack {
                pid: key.pid,
                tid: key.tid,
                comm: key.comm.clone(),
                count,
                counters,
                frames,
            }
        })
        .collect();
    stacks.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.frames.cmp(&b.frames)));

    let functions = function_stats(&stacks);
    let samples = stacks.iter().map(|s| s.count).sum();
    StackReport {
        meta,
        weight,
        health: raw.health.clone(),
        samples,
        stacks,
        functions,
        symbols: symbols.names.clone(),
    }
}

/// A stack's frames, outermost first; what could not be walked shows as a marker frame.
pub fn frames_of(key: &StackKey, symbols: &Symbols) -> Vec<Frame> {
    let mut frames = Vec::with_capacity(key.user.len() + key.kernel.len() + 2);
    if let Some(lost) = key.user_lost {
        frames.push(Frame::marker(lost_label(lost, "user"), false));
    }
    for addr in key.user.iter().rev() {
        frames.extend(symbols.user(addr));
    }
    if let Some(lost) = key.kernel_lost {
        frames.push(Frame::marker(lost_label(lost, "kernel"), true));
    }
    frames.extend(symbols.kernel_stack(&key.kernel));
    if frames.is_empty() {
        frames.push(Frame::marker("no stack", false));
    }
    frames
}

/// One note per counter that was not on the PMU for all of the sampled intervals.
fn multiplexing_notes(names: &[String], raw: &RawProfile) -> Vec<String> {
    let mut total = profiler_common::CounterDeltas::default();
    for deltas in raw.counters.values() {
        total.add(deltas);
    }
    names
        .iter()
        .enumerate()
        .filter(|&(k, _)| total.running_share(k) < 0.999)
        .map(|(k, name)| {
            format!(
                "counter {name} was on the PMU for {:.1}% of the sampled intervals (multiplexed): its per-stack values are scaled estimates",
                total.running_share(k) * 100.0
            )
        })
        .collect()
}

fn lost_label(lost: LostStack, side: &str) -> &'static str {
    match (lost, side) {
        (LostStack::Collision, "user") => "lost user stack: collision",
        (LostStack::Collision, _) => "lost kernel stack: collision",
        (LostStack::Error, "user") => "lost user stack",
        (LostStack::Error, _) => "lost kernel stack",
        (LostStack::NotSampled, "user") => "stack not sampled",
        (LostStack::NotSampled, _) => "kernel stack not sampled",
    }
}

/// The stacks' counts added up; a saved profile's may claim anything, so they saturate.
pub fn total_count(stacks: &[Stack]) -> u64 {
    stacks.iter().fold(0, |total, s| total.saturating_add(s.count))
}

/// Self = samples where the function is the leaf; total = samples where it is anywhere on the
/// stack (once per stack, so recursion does not count twice).
pub fn function_stats(stacks: &[Stack]) -> Vec<FunctionStat> {
    let mut stats: HashMap<(&str, &str), (u64, u64, Vec<u64>)> = HashMap::new();
    for stack in stacks {
        let mut seen = HashSet::new();
        for frame in &stack.frames {
            let key = (frame.function.as_str(), frame.module.as_str());
            if seen.insert(key) {
                let total = &mut stats.entry(key).or_default().1;
                *total = total.saturating_add(stack.count);
            }
        }
        if let Some(leaf) = stack.frames.last() {
            let entry = stats
                .entry((leaf.function.as_str(), leaf.module.as_str()))
                .or_default();
            entry.0 = entry.0.saturating_add(stack.count);
            entry.2.resize(stack.counters.len(), 0);
            for (total, delta) in entry.2.iter_mut().zip(&stack.counters) {
                *total = total.saturating_add(*delta);
            }
        }
    }
    // Every function carries one value per counter, zeros where it is never the leaf.
    let width = stacks.iter().map(|s| s.counters.len()).max().unwrap_or(0);
    let mut out: Vec<FunctionStat> = stats
        .into_iter()
        .map(
            |((function, module), (self_samples, total_samples, mut counters))| {
                counters.resize(width, 0);
                FunctionStat {
                    function: function.to_string(),
                    module: module.to_string(),
                    self_samples,
                    total_samples,
                    counters,
                }
            },
        )
        .collect();
    out.sort_by(|a, b| {
        b.self_samples
            .cmp(&a.self_samples)
            .then(b.total_samples.cmp(&a.total_samples))
            .then_with(|| a.function.cmp(&b.function))
    });
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub fn frame(name: &str) -> Frame {
        Frame::named(name.into(), "/bin/w")
    }

    pub fn stack(names: &[&str], count: u64) -> Stack {
        Stack {
            pid: 1,
            tid: 1,
            comm: "w".into(),
            count,
            counters: vec![],
            frames: names.iter().map(|n| frame(n)).collect(),
        }
    }

    #[test]
    fn self_and_total_counts() {
        let stacks = vec![
            stack(&["main", "a", "leaf"], 6),
            stack(&["main", "b", "leaf"], 3),
            stack(&["main", "b"], 1),
            stack(&["main", "rec", "rec", "rec"], 2),
        ];
        let stats = function_stats(&stacks);
        let get = |n: &str| stats.iter().find(|s| s.function == n).unwrap().clone();
        assert_eq!((get("leaf").self_samples, get("leaf").total_samples), (9, 9));
        assert_eq!((get("main").self_samples, get("main").total_samples), (0, 12));
        assert_eq!((get("b").self_samples, get("b").total_samples), (1, 4));
        assert_eq!((get("rec").self_samples, get("rec").total_samples), (2, 2));
        assert_eq!(stats[0].function, "leaf");
        let self_sum: u64 = stats.iter().map(|s| s.self_samples).sum();
        assert_eq!(self_sum, 12, "every sample has exactly one leaf");
    }
}
