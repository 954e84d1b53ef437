//! `bpfprof diff BEFORE AFTER`: what changed between two profiles, in absolute figures (samples,
//! and seconds where the counts convert: CPU time for samples of the CPU clock, time off CPU or
//! waiting for locks) beside each profile's shares. Shares alone mislead after a speed-up (the
//! code that did not change takes a larger share of a shorter run); absolute figures alone
//! mislead between runs sampled differently. So each function gets both, and the table is ranked
//! by the absolute change where both profiles count the same thing (`measure`), else by the
//! change of share.
//! Rendered (`render`) as a table of the functions that moved most, a differential flamegraph,
//! two-count folded lines, or JSON.
pub mod counters;
mod measure;
mod render;

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::Serialize;

pub use measure::Ranking;
pub use render::{render, Rendering};

use crate::{
    error::UserError,
    model::{FunctionStat, StackReport, Weight},
    report::folded_lines,
    symbolize::UNKNOWN,
};

/// A figure before and after, and after - before.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Figures<T> {
    pub self_before: T,
    pub self_after: T,
    pub self_change: T,
    pub total_before: T,
    pub total_after: T,
    pub total_change: T,
}

/// One function in both profiles: its shares (fractions of each profile's own total), its counts
/// (in the profiles' unit) and, where the counts convert, its seconds.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FunctionChange {
    pub function: String,
    pub module: String,
    pub self_before: f64,
    pub self_after: f64,
    pub total_before: f64,
    pub total_after: f64,
    pub counts: Figures<i64>,
    /// `None` unless both profiles' counts convert to seconds.
    pub seconds: Option<Figures<f64>>,
}

impl FunctionChange {
    /// Change of the self share, in percentage points.
    pub fn self_change_pp(&self) -> f64 {
        100.0 * (self.self_after - self.self_before)
    }

    pub fn total_change_pp(&self) -> f64 {
        100.0 * (self.total_after - self.total_before)
    }
}

impl Side {
    /// How it was sampled (`cycles every 1000 events`, `cpu-clock at 99 Hz`), where it says.
    pub fn sampling(&self) -> Option<String> {
        match (self.event.as_str(), self.period, self.frequency_hz) {
            ("other", _, _) => None,
            (event, Some(n), _) => Some(format!("{event} every {n} events")),
            (event, None, hz) if hz > 0 => Some(format!("{event} at {hz} Hz")),
            _ => None,
        }
    }
}

/// One profile as read, with what its counts are worth.
#[derive(Clone, Debug, Serialize)]
pub struct Side {
    pub name: String,
    pub mode: &'static str,
    pub event: String,
    /// Samples per second per CPU; 0 where the profile does not say (or counts time).
    pub frequency_hz: u64,
    /// Sampled every this many events instead; null at a frequency.
    pub period: Option<u64>,
    /// The sum of its stacks' counts, in the diff's unit.
    pub total: u64,
    /// The total in seconds, where its counts convert (see `measure::seconds_per_count`).
    pub total_seconds: Option<f64>,
    /// How long the run took; 0 where the profile does not say.
    pub duration_s: f64,
    #[serde(skip)]
    pub seconds_per_count: Option<f64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Diff {
    #[serde(skip)]
    pub weight: Weight,
    pub before: Side,
    pub after: Side,
    pub unit: &'static str,
    /// What the functions are ranked by, and why.
    pub ranked_by: Ranking,
    pub ranking_reason: String,
    /// Largest change first, of what `ranked_by` says (self, then total).
    pub functions: Vec<FunctionChange>,
    /// Every folded stack of either profile with its count in BEFORE and in AFTER.
    #[serde(skip)]
    pub stacks: Vec<(String, u64, u64)>,
}

fn unit(weight: Weight) -> &'static str {
    match weight {
        Weight::Samples => "samples",
        Weight::OffCpuNanoseconds => "off-CPU ns",
        Weight::LockWaitNanoseconds => "lock-wait ns",
    }
}

/// Compare two profiles of the same kind (samples with samples, off-CPU time with off-CPU time).
pub fn diff(
    (before_name, before): (&str, &StackReport),
    (after_name, after): (&str, &StackReport),
) -> Result<Diff, UserError> {
    if before.weight != after.weight {
        return Err(UserError::Usage(format!(
            "{before_name} counts {} and {after_name} counts {}: compare profiles of the same kind",
            unit(before.weight),
            unit(after.weight)
        )));
    }
    let sides = (side(before_name, before), side(after_name, after));
    let (ranked_by, ranking_reason) = measure::ranking(after.weight, &sides.0, &sides.1);
    let mut functions: Vec<FunctionChange> = counts_by_function(before, after)
        .into_values()
        .map(|(function, module, counts)| change(function, module, counts, &sides))
        .collect();
    measure::rank(&mut functions, ranked_by);
    Ok(Diff {
        weight: after.weight,
        before: sides.0,
        after: sides.1,
        unit: unit(after.weight),
        ranked_by,
        ranking_reason,
        functions,
        stacks: stacks(before, after),
    })
}

fn side(name: &str, report: &StackReport) -> Side {
    let seconds_per_count = measure::seconds_per_count(report);
    Side {
        name: name.to_string(),
        mode: report.meta.mode,
        event: report.meta.event.clone(),
        frequency_hz: report.meta.frequency_hz,
        period: report.meta.period,
        total: report.samples,
        total_seconds: seconds_per_count.map(|s| report.samples as f64 * s),
        duration_s: report.meta.duration_s,
        seconds_per_count,
    }
}

/// The row a function is counted in. Functions are keyed by name alone (a folded file gives no
/// module, and two runs may load a library at another path); an `[unknown]` frame is keyed by
/// its module, named as stackcollapse-perf and our folded files name it (`[liblzma.so.5]`), so
/// unknown code in two libraries stays two rows.
fn row_name(function: &str, module: &str) -> String {
    // Truncation marks, whatever frames each says were lost, are one row.
    if module == crate::symbolize::TRUNCATED {
        return crate::symbolize::TRUNCATED.to_string();
    }
    if function != UNKNOWN || module.is_empty() {
        return function.to_string();
    }
    crate::report::unknown_frame_name(module)
}

/// A row's counts: self (before, after) and total (before, after).
type Counts = ((u64, u64), (u64, u64));

fn counts_by_function(
    before: &StackReport,
    after: &StackReport,
) -> BTreeMap<String, (String, String, Counts)> {
    let mut rows: BTreeMap<String, (String, String, Counts)> = BTreeMap::new();
    let mut add = |f: &FunctionStat, is_after: bool| {
        let name = row_name(&f.function, &f.module);
        let row = rows
            .entry(name.clone())
            .or_insert_with(|| (name, String::new(), Default::default()));
        if row.1.is_empty() {
            row.1 = f.module.clone();
        }
        // Two modules with one name (rare) add up: the name is what the table shows.
        let (own, total) = &mut row.2;
        let (own, total) = match is_after {
            false => (&mut own.0, &mut total.0),
            true => (&mut own.1, &mut total.1),
        };
        *own = own.saturating_add(f.self_samples);
        *total = total.saturating_add(f.total_samples);
    };
    before.functions.iter().for_each(|f| add(f, false));
    after.functions.iter().for_each(|f| add(f, true));
    rows
}

fn change(
    function: String,
    module: String,
    ((own0, own1), (all0, all1)): Counts,
    (before, after): &(Side, Side),
) -> FunctionChange {
    let share = |n: u64, side: &Side| {
        if side.total == 0 {
            0.0
        } else {
            n as f64 / side.total as f64
        }
    };
    let counts = Figures {
        self_before: own0 as i64,
        self_after: own1 as i64,
        self_change: own1 as i64 - own0 as i64,
        total_before: all0 as i64,
        total_after: all1 as i64,
        total_change: all1 as i64 - all0 as i64,
    };
    let seconds = before
        .seconds_per_count
        .zip(after.seconds_per_count)
        .map(|(b, a)| Figures {
            self_before: own0 as f64 * b,
            self_after: own1 as f64 * a,
            self_change: own1 as f64 * a - own0 as f64 * b,
            total_before: all0 as f64 * b,
            total_after: all1 as f64 * a,
            total_change: all1 as f64 * a - all0 as f64 * b,
        });
    FunctionChange {
        function,
        module,
        self_before: share(own0, before),
        self_after: share(own1, after),
        total_before: share(all0, before),
        total_after: share(all1, after),
        counts,
        seconds,
    }
}

fn folded_counts(report: &StackReport) -> HashMap<String, u64> {
    folded_lines(report)
        .into_iter()
        .filter_map(|line| {
            let (stack, count) = line.rsplit_once(' ')?;
            Some((stack.to_string(), count.parse().ok()?))
        })
        .collect()
}

/// Every stack of either profile with its two counts, as each profile has them.
fn stacks(before: &StackReport, after: &StackReport) -> Vec<(String, u64, u64)> {
    let (old, new) = (folded_counts(before), folded_counts(after));
    let names: HashSet<&String> = old.keys().chain(new.keys()).collect();
    let mut stacks: Vec<(String, u64, u64)> = names
        .into_iter()
        .map(|name| {
            let count = |counts: &HashMap<String, u64>| counts.get(name).copied().unwrap_or(0);
            (name.clone(), count(&old), count(&new))
        })
        .collect();
    stacks.sort();
    stacks
}

#[cfg(test)]
mod tests;
