//! `stat --by`: each counted tracing event's hits per value of one of its numbers (or per
//! power-of-two range), over the runs (each value's mean), and their lines in the report.
use std::{
    collections::BTreeMap,
    io::{self, Write},
};

use profiler_common::values::ByField;
use serde::Serialize;

use super::render::grouped;
use crate::sources::values::ValueBatch;

/// Rows of values a text report shows per event (JSON has them all).
const SHOWN: usize = 20;

/// One event's hits by value.
#[derive(Clone, Debug, Serialize)]
pub struct EventValues {
    pub event: String,
    /// What they were counted by, as written (`fd`, `count:log2`).
    pub by: String,
    /// Each value with its hits (the mean over the runs): by value for ranges, else most first.
    pub values: Vec<ValueCount>,
    /// Hits (the mean over the runs) of values past the distinct ones the kernel's table kept:
    /// counted, but not by value.
    pub unkept: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct ValueCount {
    /// The value, or with `:log2` the range's first and last.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<i128>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from: Option<i128>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub to: Option<i128>,
    /// A system call's name, where the number is one (`raw_syscalls`' `id`, `__syscall_nr`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub count: f64,
}

/// Each event's values over the runs' batches (`fields` by the events' place in the run).
pub fn over_runs(
    events: &[String],
    by: &str,
    fields: &[ByField],
    runs: &[Option<&ValueBatch>],
) -> Vec<EventValues> {
    let n = runs.len().max(1) as f64;
    (events.iter().zip(fields).enumerate())
        .map(|(i, (event, field))| {
            let mut sums: BTreeMap<u64, u64> = BTreeMap::new();
            let mut unkept = 0;
            for batch in runs.iter().flatten() {
                for (value, count) in batch.values.get(i).into_iter().flatten() {
                    *sums.entry(*value).or_default() += count;
                }
                unkept += batch.lost.get(i).copied().unwrap_or(0);
            }
            let syscall = matches!(by.trim_end_matches(":log2"), "id" | "__syscall_nr")
                && (event.starts_with("raw_syscalls:") || event.starts_with("syscalls:"));
            let mut values: Vec<ValueCount> = (sums.into_iter())
                .map(|(raw, count)| value_count(field, raw, syscall, count as f64 / n))
                .collect();
            if field.log2 == 0 {
                values.sort_by(|a, b| b.count.total_cmp(&a.count));
            } else {
                values.sort_by_key(|v| v.from);
            }
            EventValues {
                event: event.clone(),
                by: by.to_string(),
                values,
                unkept: unkept as f64 / n,
            }
        })
        .collect()
}

fn value_count(field: &ByField, raw: u64, syscall: bool, count: f64) -> ValueCount {
    let number = match field.signed {
        0 => i128::from(raw),
        _ => i128::from(raw as i64),
    };
    let (value, from, to) = match field.log2 {
        0 => (Some(number), None, None),
        _ => {
            let (from, to) = log2_range(number);
            (None, Some(from), Some(to))
        }
    };
    ValueCount {
        value,
        from,
        to,
        name: (syscall && field.log2 == 0 && number >= 0).then(|| crate::trace::syscall_name(number as u32)),
        count,
    }
}

/// The numbers of a range (`log2_bucket`'s): 0 → 0..0, b → 2^(b-1)..2^b-1; negative b the same
/// range negated.
fn log2_range(bucket: i128) -> (i128, i128) {
    let positive = |b: i128| match b {
        0 => (0, 0),
        b => (1i128 << (b - 1), (1i128 << b) - 1),
    };
    match bucket < 0 {
        true => {
            let (low, high) = positive(-bucket);
            (-high, -low)
        }
        false => positive(bucket),
    }
}

/// Each event's values under the counters, as `count  share  by=value`.
pub fn text(events: &[EventValues], out: &mut dyn Write) -> io::Result<()> {
    for e in events {
        let total: f64 = e.values.iter().map(|v| v.count).sum::<f64>() + e.unkept;
        writeln!(out, "\n {} by {}:\n", e.event, e.by)?;
        if total == 0.0 {
            writeln!(out, "   no hits")?;
        }
        let field = e.by.trim_end_matches(":log2");
        // Ranges all (at most 130), in order; values the most frequent.
        let shown = match e.by.ends_with(":log2") {
            true => e.values.len(),
            false => SHOWN,
        };
        for v in e.values.iter().take(shown) {
            let shown = match (v.value, v.from, v.to) {
                (Some(value), ..) => format!("{field}={value}"),
                (None, Some(from), Some(to)) if from == to => format!("{field}={from}"),
                (None, Some(from), Some(to)) => format!("{field}={from}..{to}"),
                _ => field.to_string(),
            };
            let name = v.name.as_ref().map_or(String::new(), |n| format!(" ({n})"));
            writeln!(
                out,
                "{:>18}  {:>6.2}%  {shown}{name}",
                grouped(v.count),
                100.0 * v.count / total
            )?;
        }
        if e.values.len() > shown {
            let rest: f64 = e.values[shown..].iter().map(|v| v.count).sum();
            writeln!(
                out,
                "{:>18}  {:>6.2}%  {} more values (all in JSON)",
                grouped(rest),
                100.0 * rest / total,
                e.values.len() - shown
            )?;
        }
        if e.unkept > 0.0 {
            writeln!(
                out,
                "{:>18}  {:>6.2}%  values past the {} the kernel's table keeps",
                grouped(e.unkept),
                100.0 * e.unkept / total,
                profiler_common::values::VALUE_COUNT_ENTRIES
            )?;
        }
    }
    Ok(())
}
