//! JSON for scripts; the schema is documented in docs/json.md and kept stable.
use std::io::{self, Write};

use serde::Serialize;

use super::Renderer;
use crate::{
    counters::tma::Level1,
    model::{FunctionStat, Stack, StackReport},
    modes::{
        lock::{LockReport, LockStat},
        sched::{OffCpuStack, SchedReport, SlowWait, TaskLatency},
        topdown::{CounterValue, FunctionCounters, ThreadState, TopdownReport},
    },
    profile::Health,
};

pub struct Json;

#[derive(Serialize)]
struct HotspotJson<'a> {
    mode: &'static str,
    event: &'static str,
    frequency_hz: u64,
    duration_s: f64,
    target: &'a str,
    cpus: u32,
    samples: u64,
    lost: u64,
    stack_collisions: u64,
    idle_samples: u64,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    counters: &'a [&'static str],
    notes: &'a [String],
    warnings: Vec<String>,
    health: &'a Health,
    stacks: &'a [Stack],
    functions: &'a [FunctionStat],
}

#[derive(Serialize)]
struct SchedJson<'a> {
    mode: &'static str,
    target: &'a str,
    duration_s: f64,
    cpus: u32,
    context_switches: u64,
    slow_threshold_ns: u64,
    slow_total: u64,
    notes: &'a [String],
    warnings: Vec<String>,
    health: &'a Health,
    tasks: &'a [TaskLatency],
    offcpu: &'a [OffCpuStack],
    slow_events: &'a [SlowWait],
}

#[derive(Serialize)]
struct LockJson<'a> {
    mode: &'static str,
    source: &'static str,
    target: &'a str,
    duration_s: f64,
    notes: &'a [String],
    warnings: Vec<String>,
    health: &'a Health,
    locks: &'a [LockStat],
}

#[derive(Serialize)]
struct TopdownJson<'a> {
    mode: &'static str,
    source: &'static str,
    reason: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    cpu: &'a str,
    target: &'a str,
    duration_s: f64,
    cpus: u32,
    family: Option<&'a str>,
    level1: Option<Level1>,
    ipc: Option<f64>,
    metrics: serde_json::Map<String, serde_json::Value>,
    /// Counter name -> share of the time it was running, for those multiplexed.
    multiplexed: serde_json::Map<String, serde_json::Value>,
    /// The counter set counted over the run (`--preset`) and its totals.
    preset: Option<&'static str>,
    counters: &'a [CounterValue],
    /// What the per-function samples were taken on, and how many.
    sampled_on: Option<&'static str>,
    samples: u64,
    functions: &'a [FunctionCounters],
    notes: &'a [String],
    warnings: Vec<String>,
    threads: &'a [ThreadState],
    processes: &'a [ThreadState],
}

/// The version of the JSON reports' schema (docs/json.md), first in every document. Fields are
/// only ever added within a version; renaming or removing one, or changing what it means, raises it.
pub const FORMAT_VERSION: u32 = 1;

#[derive(Serialize)]
struct Versioned<'a, T> {
    format_version: u32,
    #[serde(flatten)]
    report: &'a T,
}

/// One document on one line, its schema's version first.
pub(crate) fn write_json(out: &mut dyn Write, doc: &impl Serialize) -> io::Result<()> {
    let versioned = Versioned {
        format_version: FORMAT_VERSION,
        report: doc,
    };
    serde_json::to_writer(&mut *out, &versioned).map_err(io::Error::other)?;
    writeln!(out)
}

fn pairs(items: &[(String, f64)]) -> serde_json::Map<String, serde_json::Value> {
    items
        .iter()
        .map(|(k, v)| (k.clone(), serde_json::Value::from(*v)))
        .collect()
}

impl Renderer for Json {
    fn topdown(&self, r: &TopdownReport, out: &mut dyn Write) -> io::Result<()> {
        let doc = TopdownJson {
            mode: "topdown",
            source: r.source,
            reason: &r.reason,
            cpu: &r.cpu,
            target: &r.meta.target,
            duration_s: r.meta.duration_s,
            cpus: r.meta.cpus,
            family: r.tma.as_ref().map(|t| t.family.as_str()),
            level1: r.tma.as_ref().and_then(|t| t.level1),
            ipc: r.tma.as_ref().and_then(|t| t.ipc),
            metrics: pairs(r.tma.as_ref().map(|t| &t.metrics[..]).unwrap_or(&[])),
            multiplexed: pairs(r.tma.as_ref().map(|t| &t.multiplexed[..]).unwrap_or(&[])),
            preset: r.preset,
            counters: &r.counters,
            sampled_on: r.sampled_on,
            samples: r.samples,
            functions: &r.functions,
            notes: &r.meta.notes,
            warnings: r.health.warnings(),
            threads: &r.threads,
            processes: &r.processes,
        };
        write_json(out, &doc)
    }

    fn sched(&self, r: &SchedReport, out: &mut dyn Write) -> io::Result<()> {
        let doc = SchedJson {
            mode: "sched",
            target: &r.meta.target,
            duration_s: r.meta.duration_s,
            cpus: r.meta.cpus,
            context_switches: r.health.sched_switches,
            slow_threshold_ns: r.slow_threshold_ns,
            slow_total: r.slow_total,
            notes: &r.meta.notes,
            warnings: r.health.warnings(),
            health: &r.health,
            tasks: &r.tasks,
            offcpu: &r.offcpu_stacks,
            slow_events: &r.slow,
        };
        write_json(out, &doc)
    }

    fn lock(&self, r: &LockReport, out: &mut dyn Write) -> io::Result<()> {
        let doc = LockJson {
            mode: "lock",
            source: r.source.name(),
            target: &r.meta.target,
            duration_s: r.meta.duration_s,
            notes: &r.meta.notes,
            warnings: r.health.warnings(),
            health: &r.health,
            locks: &r.locks,
        };
        write_json(out, &doc)
    }

    fn hotspot(&self, r: &StackReport, out: &mut dyn Write) -> io::Result<()> {
        let doc = HotspotJson {
            mode: r.meta.mode,
            event: r.meta.event,
            frequency_hz: r.meta.frequency_hz,
            duration_s: r.meta.duration_s,
            target: &r.meta.target,
            cpus: r.meta.cpus,
            samples: r.samples,
            lost: r.health.lost(),
            stack_collisions: r.health.collisions(),
            idle_samples: r.health.idle,
            counters: &r.meta.counters,
            notes: &r.meta.notes,
            warnings: r.health.warnings(),
            health: &r.health,
            stacks: &r.stacks,
            functions: &r.functions,
        };
        write_json(out, &doc)
    }
}

#[cfg(test)]
mod tests {
    use crate::{cli::Format, report::tests::*};

    #[test]
    fn json_matches_documented_shape_and_adds_up() {
        let v: serde_json::Value = serde_json::from_slice(&render(Format::Json, &sample_report())).unwrap();
        assert_eq!(v["format_version"], super::FORMAT_VERSION);
        assert_eq!(v["mode"], "hotspot");
        assert_eq!(v["samples"], 100);
        assert_eq!(v["lost"], 0);
        let stacks = v["stacks"].as_array().unwrap();
        let sum: u64 = stacks.iter().map(|s| s["count"].as_u64().unwrap()).sum();
        assert_eq!(sum, 100);
        let frame = &stacks[0]["frames"][0];
        for key in ["function", "module", "file", "line", "kernel"] {
            assert!(frame.get(key).is_some(), "frame lacks {key}: {frame}");
        }
        let self_sum: u64 = v["functions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["self"].as_u64().unwrap())
            .sum();
        assert_eq!(self_sum, 100);
        assert_eq!(
            stacks[0]["frames"].as_array().unwrap().last().unwrap()["function"],
            "hot_a"
        );
    }
}
