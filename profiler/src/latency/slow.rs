//! `latency --duration-min MS`: each interval at least that long, when it began, its key, the
//! thread that started it and the stacks it was started from (kernel frames first, then user).
use profiler_common::latency::{KeyFields, LatencyStart};
use serde::Serialize;

use crate::{
    collect::comm_string,
    process::Processes,
    record::stacks::StackFrame,
    sources::latency::SlowIntervals,
    symbolize::{DebugLocator, Symbolizer},
};

/// The intervals at least `min_ms` long, in the order they began.
#[derive(Clone, Debug, Serialize)]
pub struct SlowIntervalsReport {
    pub min_ms: f64,
    pub intervals: Vec<SlowIntervalReport>,
    /// Intervals as long not listed: past the most a report keeps, or dropped by a full ring
    /// (counted in the notes too).
    pub not_listed: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct SlowIntervalReport {
    /// When it began, in seconds since collection began.
    pub at_s: f64,
    pub took_ns: u64,
    /// The key's values: the thread's tid, or each key field's (a signed one as signed).
    pub key: Vec<serde_json::Value>,
    /// Who started it.
    pub pid: u32,
    pub tid: u32,
    pub comm: String,
    /// The stacks it was started from, leaf first: the kernel's (at a tracepoint), then the
    /// user stack.
    pub stack: Vec<StackFrame>,
    /// Why the user stack may be incomplete, if it may.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stack_note: Option<String>,
}

impl SlowIntervalsReport {
    /// `key`: the start's key fields (none: the thread).
    pub fn of(min_ns: u64, slow: &SlowIntervals, key: &KeyFields, lost: u64, procs: &Processes) -> Self {
        let named = (slow.stacks).named(&Symbolizer::long_lived(DebugLocator::default()), procs);
        let mut intervals: Vec<SlowIntervalReport> = (slow.intervals.iter())
            .map(|read| {
                let (interval, start) = (&read.interval, &read.interval.start);
                SlowIntervalReport {
                    at_s: start.started_ns.saturating_sub(slow.started_ns) as f64 / 1e9,
                    took_ns: interval.took_ns,
                    key: key_values(key, [interval.key.a, interval.key.b]),
                    pid: start.tgid,
                    tid: start.tid,
                    comm: comm_string(&start.comm),
                    stack: named(&read.stack),
                    stack_note: stack_note(start),
                }
            })
            .collect();
        intervals.sort_by(|a, b| a.at_s.total_cmp(&b.at_s).then(a.tid.cmp(&b.tid)));
        SlowIntervalsReport {
            min_ms: min_ns as f64 / 1e6,
            intervals,
            not_listed: slow.not_kept + lost,
        }
    }
}

/// A key's values as its fields are typed: a signed field's sign-extended from its size; the
/// thread's tid where there are none.
fn key_values(key: &KeyFields, values: [u64; 2]) -> Vec<serde_json::Value> {
    (0..(key.fields as usize).clamp(1, 2))
        .map(|i| match key.signed >> i & 1 {
            1 => profiler_common::sized(values[i], key.sizes[i] as u8).1.into(),
            _ => values[i].into(),
        })
        .collect()
}

/// The user stack of a start not walked through its process's tables, and why.
fn stack_note(start: &LatencyStart) -> Option<String> {
    /// `-EINPROGRESS`: the interval ended before its start's stack was walked.
    const NOT_WALKED: i32 = -115;
    match (start.user_tables, start.user_stack) {
        (0, NOT_WALKED) => Some("the interval ended before its start's user stack was walked".into()),
        (0, _) => Some(
            "user stack by frame pointers: its process's unwind tables were not loaded yet, or the walk could not start"
                .into(),
        ),
        _ => None,
    }
}
