//! JSON for scripts; the schema is documented in docs/json.md and kept stable.
use std::io::{self, Write};

use serde::Serialize;

use super::{frame_table::FrameTable, Renderer};
use crate::{
    counters::tma::Level1,
    model::{FunctionStat, Stack, StackReport},
    modes::{
        lock::{Holds, LockReport, LockStat, WaitClass},
        sched::{CpuLatency, OffCpuStack, SchedReport, SlowWait, TaskLatency},
        topdown::{CounterValue, FunctionCounters, ThreadState, TopdownReport},
    },
    profile::Health,
    symbolize::Frame,
};

pub use super::frame_table::inline_frames;

pub struct Json;

#[derive(Serialize)]
struct HotspotJson<'a> {
    mode: &'static str,
    event: &'a str,
    frequency_hz: u64,
    /// Sampled every this many events (`-c`); null when at a frequency.
    period: Option<u64>,
    duration_s: f64,
    target: &'a str,
    cpus: u32,
    samples: u64,
    lost: u64,
    stack_collisions: u64,
    idle_samples: u64,
    /// Samples whose leaf has no name but lies in a function its file's unwind table bounds.
    placed_leaf_samples: u64,
    /// Samples whose leaf has neither a name nor such a function.
    unplaced_leaf_samples: u64,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    counters: &'a [String],
    notes: &'a [String],
    warnings: Vec<String>,
    health: &'a Health,
    stacks: Vec<StackJson<'a>>,
    functions: &'a [FunctionStat],
    frames: Vec<&'a Frame>,
    /// Where each file's names came from.
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    symbols: &'a [crate::symbolize::NameSource],
}

/// A stack with its frames as indices into the report's `frames` (as are all below).
#[derive(Serialize)]
struct StackJson<'a> {
    pid: u32,
    tid: u32,
    comm: &'a str,
    count: u64,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    counters: &'a [u64],
    frames: Vec<usize>,
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
    per_cpu: &'a [CpuLatency],
    unplaced_waits: u64,
    unplaced_delay_ns: u64,
    idle_window_ns: u64,
    offcpu: Vec<OffCpuJson<'a>>,
    slow_events: &'a [SlowWait],
    frames: Vec<&'a Frame>,
}

#[derive(Serialize)]
struct OffCpuJson<'a> {
    pid: u32,
    tid: u32,
    comm: &'a str,
    total_ns: u64,
    count: u64,
    frames: Vec<usize>,
}

#[derive(Serialize)]
struct LockDoc<'a> {
    mode: &'static str,
    source: &'static str,
    target: &'a str,
    duration_s: f64,
    notes: &'a [String],
    warnings: Vec<String>,
    health: &'a Health,
    locks: Vec<LockJson<'a>>,
    frames: Vec<&'a Frame>,
}

/// A `LockStat` field for field (a test holds them to each other), its stacks as indices.
#[derive(Serialize)]
struct LockJson<'a> {
    pid: u32,
    comm: &'a str,
    #[serde(serialize_with = "crate::symbolize::hex")]
    address: u64,
    #[serde(skip_serializing_if = "is_zero")]
    instance: u32,
    symbol: &'a Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    thread: Option<u32>,
    waited_in: &'a Option<String>,
    kind: &'static str,
    class: WaitClass,
    contentions: u64,
    waiting_at_stop: u64,
    total_wait_ns: u64,
    max_wait_ns: u64,
    avg_wait_ns: u64,
    unattributed_wait_ns: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    holds: Option<Holds>,
    waiters: Vec<WaiterJson>,
    holders: Vec<HolderJson>,
}

#[derive(Serialize)]
struct WaiterJson {
    frames: Vec<usize>,
    contentions: u64,
    total_wait_ns: u64,
    max_wait_ns: u64,
}

#[derive(Serialize)]
struct HolderJson {
    frames: Vec<usize>,
    wakes: u64,
    total_wait_ns: u64,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
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
    sampled_on: Option<&'a str>,
    samples: u64,
    functions: &'a [FunctionCounters],
    notes: &'a [String],
    warnings: Vec<String>,
    threads: &'a [ThreadState],
    processes: &'a [ThreadState],
}

/// The version of the JSON reports' schema (docs/json.md), first in every document. Fields are
/// only ever added within a version; renaming or removing one, or changing what it means, raises it.
/// Version 2: stacks name their frames by index into the report's `frames` table.
pub const FORMAT_VERSION: u32 = 2;

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

/// A command's own report (`stat`, `trace`), indented: its schema's version and its mode first.
pub(crate) fn write_command_json(
    out: &mut dyn Write,
    mode: &'static str,
    report: &impl Serialize,
) -> io::Result<()> {
    #[derive(Serialize)]
    struct Doc<'a, T> {
        format_version: u32,
        mode: &'static str,
        #[serde(flatten)]
        report: &'a T,
    }
    let doc = Doc {
        format_version: FORMAT_VERSION,
        mode,
        report,
    };
    serde_json::to_writer_pretty(&mut *out, &doc).map_err(io::Error::other)?;
    writeln!(out)
}

fn stacks_json<'a>(stacks: &'a [Stack], table: &mut FrameTable<'a>) -> Vec<StackJson<'a>> {
    stacks
        .iter()
        .map(|s| StackJson {
            pid: s.pid,
            tid: s.tid,
            comm: &s.comm,
            count: s.count,
            counters: &s.counters,
            frames: table.ids(&s.frames),
        })
        .collect()
}

fn offcpu_json<'a>(stacks: &'a [OffCpuStack], table: &mut FrameTable<'a>) -> Vec<OffCpuJson<'a>> {
    stacks
        .iter()
        .map(|s| OffCpuJson {
            pid: s.pid,
            tid: s.tid,
            comm: &s.comm,
            total_ns: s.total_ns,
            count: s.count,
            frames: table.ids(&s.frames),
        })
        .collect()
}

fn lock_json<'a>(lock: &'a LockStat, table: &mut FrameTable<'a>) -> LockJson<'a> {
    let waiters = lock
        .waiters
        .iter()
        .map(|w| WaiterJson {
            frames: table.ids(&w.frames),
            contentions: w.contentions,
            total_wait_ns: w.total_wait_ns,
            max_wait_ns: w.max_wait_ns,
        })
        .collect();
    let holders = lock
        .holders
        .iter()
        .map(|h| HolderJson {
            frames: table.ids(&h.frames),
            wakes: h.wakes,
            total_wait_ns: h.total_wait_ns,
        })
        .collect();
    LockJson {
        pid: lock.pid,
        comm: &lock.comm,
        address: lock.address,
        instance: lock.instance,
        symbol: &lock.symbol,
        thread: lock.thread,
        waited_in: &lock.waited_in,
        kind: lock.kind,
        class: lock.class,
        contentions: lock.contentions,
        waiting_at_stop: lock.waiting_at_stop,
        total_wait_ns: lock.total_wait_ns,
        max_wait_ns: lock.max_wait_ns,
        avg_wait_ns: lock.avg_wait_ns,
        unattributed_wait_ns: lock.unattributed_wait_ns,
        holds: lock.holds,
        waiters,
        holders,
    }
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
            sampled_on: r.sampled_on.as_deref(),
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
        let mut table = FrameTable::default();
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
            per_cpu: &r.cpus,
            unplaced_waits: r.unplaced.waits,
            unplaced_delay_ns: r.unplaced.delay_ns,
            idle_window_ns: r.idle_window_ns,
            offcpu: offcpu_json(&r.offcpu_stacks, &mut table),
            slow_events: &r.slow,
            frames: table.into_frames(),
        };
        write_json(out, &doc)
    }

    fn lock(&self, r: &LockReport, out: &mut dyn Write) -> io::Result<()> {
        let mut table = FrameTable::default();
        let doc = LockDoc {
            mode: "lock",
            source: r.source.name(),
            target: &r.meta.target,
            duration_s: r.meta.duration_s,
            notes: &r.meta.notes,
            warnings: r.health.warnings(),
            health: &r.health,
            locks: r.locks.iter().map(|l| lock_json(l, &mut table)).collect(),
            frames: table.into_frames(),
        };
        write_json(out, &doc)
    }

    fn hotspot(&self, r: &StackReport, out: &mut dyn Write) -> io::Result<()> {
        let mut table = FrameTable::default();
        let (placed, unplaced) = super::names::unnamed_leaves(&r.stacks);
        let doc = HotspotJson {
            mode: r.meta.mode,
            event: &r.meta.event,
            frequency_hz: r.meta.frequency_hz,
            period: r.meta.period,
            duration_s: r.meta.duration_s,
            target: &r.meta.target,
            cpus: r.meta.cpus,
            samples: r.samples,
            lost: r.health.lost(),
            stack_collisions: r.health.collisions(),
            idle_samples: r.health.idle,
            placed_leaf_samples: placed,
            unplaced_leaf_samples: unplaced,
            counters: &r.meta.counters,
            notes: &r.meta.notes,
            warnings: r.health.warnings(),
            health: &r.health,
            stacks: stacks_json(&r.stacks, &mut table),
            functions: &r.functions,
            frames: table.into_frames(),
            symbols: &r.symbols,
        };
        write_json(out, &doc)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;
    use crate::{
        cli::Format,
        modes::lock::{HolderStat, WaiterStat},
        report::tests::*,
    };

    fn hotspot_json() -> Value {
        serde_json::from_slice(&render(Format::Json, &sample_report())).unwrap()
    }

    #[test]
    fn json_matches_documented_shape_and_adds_up() {
        let v = hotspot_json();
        assert_eq!(v["format_version"], 2);
        assert_eq!(v["mode"], "hotspot");
        assert_eq!(v["samples"], 100);
        assert_eq!(v["lost"], 0);
        let stacks = v["stacks"].as_array().unwrap();
        let sum: u64 = stacks.iter().map(|s| s["count"].as_u64().unwrap()).sum();
        assert_eq!(sum, 100);
        let frame = &v["frames"][stacks[0]["frames"][0].as_u64().unwrap() as usize];
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
    }

    #[test]
    fn stacks_name_each_distinct_frame_of_the_table_by_index() {
        let report = sample_report();
        let v = hotspot_json();
        let table = v["frames"].as_array().expect("a frames table");
        let distinct: std::collections::HashSet<&Frame> =
            report.stacks.iter().flat_map(|s| &s.frames).collect();
        assert_eq!(table.len(), distinct.len(), "each distinct frame once: {table:?}");
        for (written, stack) in v["stacks"].as_array().unwrap().iter().zip(&report.stacks) {
            let named: Vec<Value> = written["frames"]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| table[i.as_u64().unwrap() as usize].clone())
                .collect();
            let want: Vec<Value> = stack
                .frames
                .iter()
                .map(|f| serde_json::to_value(f).unwrap())
                .collect();
            assert_eq!(named, want);
        }
    }

    /// Every key of an object, and of the objects inside it, by path.
    fn key_paths(value: &Value, path: &str, into: &mut Vec<String>) {
        match value {
            Value::Object(map) => map.iter().for_each(|(k, v)| {
                into.push(format!("{path}.{k}"));
                key_paths(v, &format!("{path}.{k}"), into);
            }),
            Value::Array(items) => items
                .iter()
                .for_each(|v| key_paths(v, &format!("{path}[]"), into)),
            _ => {}
        }
    }

    /// The views write the same fields as the types they show, frames aside (a field added to
    /// one of those types must be added to its view above).
    fn same_fields(original: &impl Serialize, view: &impl Serialize) {
        let paths = |value: Value| {
            let mut paths = Vec::new();
            key_paths(&value, "", &mut paths);
            paths.retain(|p| !p.contains(".frames["));
            paths.sort();
            paths.dedup();
            paths
        };
        let original = paths(serde_json::to_value(original).unwrap());
        assert_eq!(paths(serde_json::to_value(view).unwrap()), original);
        assert!(original.iter().any(|p| p.ends_with(".frames")), "{original:?}");
    }

    #[test]
    fn each_view_writes_every_field_of_what_it_shows() {
        let report = sample_report();
        let mut table = FrameTable::default();
        same_fields(&report.stacks, &stacks_json(&report.stacks, &mut table));
        let offcpu = vec![OffCpuStack {
            pid: 1,
            tid: 2,
            comm: "w".into(),
            total_ns: 5,
            count: 1,
            frames: report.stacks[0].frames.clone(),
        }];
        same_fields(&offcpu, &offcpu_json(&offcpu, &mut table));
        let lock = LockStat {
            pid: 1,
            comm: "w".into(),
            address: 0x10,
            instance: 1,
            exec_generation: 0,
            flags: 0,
            symbol: Some("m".into()),
            thread: Some(3),
            waited_in: Some("f".into()),
            kind: "mutex",
            class: WaitClass::Contention,
            contentions: 2,
            waiting_at_stop: 1,
            total_wait_ns: 9,
            max_wait_ns: 5,
            avg_wait_ns: 4,
            unattributed_wait_ns: 1,
            holds: Some(Holds::default()),
            waiters: vec![WaiterStat {
                frames: report.stacks[0].frames.clone(),
                contentions: 2,
                total_wait_ns: 9,
                max_wait_ns: 5,
            }],
            holders: vec![HolderStat {
                frames: report.stacks[1].frames.clone(),
                wakes: 2,
                total_wait_ns: 8,
            }],
        };
        same_fields(&lock, &lock_json(&lock, &mut table));
    }
}
