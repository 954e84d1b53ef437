//! What a profile's counts are worth, and so whether two profiles' counts compare: time compares
//! with time (CPU time for samples of the CPU clock, whatever their rate), samples with samples
//! of the same event at the same rate; anything else only by shares of each profile's total.
use serde::Serialize;

use super::{FunctionChange, Side};
use crate::model::{StackReport, Weight};

/// What the functions of a diff are ranked by: the change of self (then total) ...
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Ranking {
    /// ... time, in seconds.
    Seconds,
    /// ... samples.
    Samples,
    /// ... share of each profile's own total, in percentage points.
    Share,
}

/// Seconds one count stands for: a nanosecond for off-CPU and lock-wait profiles; for samples of
/// the CPU clock, its period (`-c` nanoseconds, or the kernel's 1e9 / frequency whole
/// nanoseconds). Samples of other events, or at a rate the profile does not say, are not time.
pub fn seconds_per_count(report: &StackReport) -> Option<f64> {
    let hz = report.meta.frequency_hz;
    match (report.weight, report.meta.period) {
        (Weight::OffCpuNanoseconds | Weight::LockWaitNanoseconds, _) => Some(1e-9),
        (Weight::Samples, _) if report.meta.event != "cpu-clock" => None,
        (Weight::Samples, Some(n)) => Some(n as f64 / 1e9),
        (Weight::Samples, None) if hz > 0 => Some((1_000_000_000 / hz) as f64 / 1e9),
        (Weight::Samples, None) => None,
    }
}

/// What the two profiles' functions compare by, and why, in words.
pub fn ranking(weight: Weight, before: &Side, after: &Side) -> (Ranking, String) {
    if before.seconds_per_count.is_some() && after.seconds_per_count.is_some() {
        let why = match weight {
            Weight::Samples => "both profiles sampled the CPU clock, so their samples are CPU time",
            Weight::OffCpuNanoseconds => "both profiles count time off CPU",
            Weight::LockWaitNanoseconds => "both profiles count time waiting for locks",
        };
        return (Ranking::Seconds, why.to_string());
    }
    let rate = |side: &Side| side.sampling().unwrap_or_default();
    let known = |side: &Side| side.sampling().is_some();
    let why = match (known(before), known(after)) {
        (true, true) if rate(before) == rate(after) => {
            return (
                Ranking::Samples,
                format!("both profiles sampled {}", rate(before)),
            );
        }
        (true, true) => format!("the profiles sampled {} and {}", rate(before), rate(after)),
        (false, _) => "BEFORE does not say how often it was sampled".to_string(),
        (true, false) => "AFTER does not say how often it was sampled".to_string(),
    };
    (Ranking::Share, why)
}

/// Largest change first, of self then total; by name where equal.
pub fn rank(functions: &mut [FunctionChange], by: Ranking) {
    let key = |f: &FunctionChange| match (by, &f.seconds) {
        (Ranking::Seconds, Some(s)) => (s.self_change.abs(), s.total_change.abs()),
        (Ranking::Samples, _) => (
            f.counts.self_change.unsigned_abs() as f64,
            f.counts.total_change.unsigned_abs() as f64,
        ),
        _ => (f.self_change_pp().abs(), f.total_change_pp().abs()),
    };
    functions.sort_by(|a, b| {
        key(b)
            .partial_cmp(&key(a))
            .unwrap_or(std::cmp::Ordering::Equal)
            .then_with(|| a.function.cmp(&b.function))
    });
}
