//! `bpfprof latency --from A --to B [--key FIELDS]`: the time from each hit of A to the next hit
//! of B with the same key, over a command, processes or the whole system: count, average, p50,
//! p90, p99, longest and a histogram. Collected by the `latency` source (a histogram summed in
//! the kernel); this module is its sink and its report.
use profiler_common::{hist_lower_bound, HEAT_BUCKETS};
use serde::Serialize;

use crate::{
    cli::{Format, LatencyArgs},
    modes::sched::{buckets, percentile, Bucket, Heatmap},
    plan::Plan,
    report::command,
    session::run_to_end,
    sources::{latency::LatencyBatch, Batch},
};
use slow::SlowIntervalsReport;

pub mod render;
pub mod slow;
#[cfg(test)]
mod tests;

pub fn run(args: LatencyArgs) -> anyhow::Result<i32> {
    let format = command::checked_format(&args.report, "latency", &[Format::Heatmap])?;
    let plan = Plan::for_latency(&args)?;
    let mut ended = run_to_end(&plan)?;
    let batch = ended.take(|batch| match batch {
        Batch::Latency(batch) => Some(batch),
        _ => None,
    });
    let spec = plan.latency.as_ref().expect("a latency plan has its events");
    let interval = Interval {
        from: spec.from.spelled(),
        to: spec.to.spelled(),
        key: spec.key.clone(),
        filter: spec.filter.as_ref().map(|(text, _)| text.clone()),
    };
    let batch = batch.unwrap_or_default();
    let mut report = LatencyReport::of(
        interval,
        plan.target_description(),
        ended.seconds,
        &batch,
        ended.notes,
    );
    report.program_runs_missed = ended.health.program_runs_missed;
    if let Some(min_ns) = spec.slow_ns {
        let lost = ended.health.slow_intervals_lost;
        report.slow = Some(SlowIntervalsReport::of(
            min_ns,
            &batch.slow,
            &spec.keys.sides[0],
            lost,
            &ended.procs,
        ));
    }
    match format {
        Format::Heatmap => {
            crate::output::write_report(plan.output.as_deref(), &|out| render::heatmap(&report, out))?
        }
        _ => command::write(plan.output.as_deref(), format, "latency", &report, render::text)?,
    }
    Ok(ended.exit_code)
}

/// What was timed: from which event to which, matched by what.
#[derive(Clone, Debug, Serialize)]
pub struct Interval {
    pub from: String,
    pub to: String,
    /// `thread`, or the fields (`dev,sector`).
    pub key: String,
    /// `--filter`: only the starts it passed were timed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub filter: Option<String>,
}

impl Interval {
    /// `--from` as the report names it: with its filter (`block:block_rq_issue where bytes > 4096`).
    pub fn start(&self) -> String {
        match &self.filter {
            Some(filter) => format!("{} where {filter}", self.from),
            None => self.from.clone(),
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct LatencyReport {
    #[serde(flatten)]
    pub interval: Interval,
    pub target: String,
    pub seconds: f64,
    pub count: u64,
    pub avg_ns: u64,
    /// Each the middle of the histogram's bucket that holds it (buckets at most 6.25% wide),
    /// never above `max_ns`.
    pub p50_ns: u64,
    pub p90_ns: u64,
    pub p99_ns: u64,
    pub max_ns: u64,
    /// Non-empty buckets: latencies of at most `le_ns` (and more than the previous bucket's).
    pub histogram: Vec<Bucket>,
    /// Ends with no start of their key (begun before the run, or started by another key).
    pub unmatched: u64,
    /// Starts with no end when the run stopped.
    pub pending: u64,
    /// Starts that came while a start of their key had not ended: the interval is timed from
    /// the later one (a recursive function between its entry and return, a request issued again).
    pub replaced: u64,
    /// Runs of bpfprof's programs the kernel skipped (a BPF program was already running on that
    /// CPU): each a start or an end not seen, so an interval not timed or a start left pending.
    pub program_runs_missed: u64,
    /// `--duration-min`: each interval at least that long.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slow: Option<SlowIntervalsReport>,
    pub notes: Vec<String>,
    /// `-o lat.heatmap.svg`: the latencies that ended in each second, by bucket.
    #[serde(skip)]
    pub heatmap: Heatmap,
}

impl LatencyReport {
    pub fn of(
        interval: Interval,
        target: String,
        seconds: f64,
        batch: &LatencyBatch,
        notes: Vec<String>,
    ) -> Self {
        let count: u64 = batch.hist.iter().sum();
        let at = |q| percentile(&batch.hist, q).min(batch.max_ns);
        LatencyReport {
            interval,
            target,
            seconds,
            count,
            avg_ns: batch.sum_ns.checked_div(count).unwrap_or(0),
            p50_ns: at(0.50),
            p90_ns: at(0.90),
            p99_ns: at(0.99),
            max_ns: batch.max_ns,
            histogram: buckets(&batch.hist),
            unmatched: batch.unmatched,
            pending: batch.pending,
            replaced: batch.replaced,
            program_runs_missed: 0,
            slow: None,
            notes,
            heatmap: Heatmap {
                column_s: crate::collect::DRAIN_EVERY.as_secs_f64(),
                row_lower_ns: (0..HEAT_BUCKETS).map(|b| hist_lower_bound(b * 8)).collect(),
                columns: batch.columns.clone(),
            },
        }
    }
}
