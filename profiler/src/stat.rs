//! `bpfprof stat`: counts of any events over a command, processes or the whole system, as
//! `perf stat` gives them. Collected by the `stat` source through the one start path and loop;
//! this module is its sink (each interval, the totals) and its report: each counter with the
//! share of the run it was on the PMU, derived metrics where their inputs were counted, and with
//! `-r N` each figure's mean and relative spread over the runs.
use std::time::Duration;

use serde::Serialize;

use crate::{
    cli::{Format, StatArgs},
    counters::{
        language::Catalog,
        tma::{self, Counts},
    },
    driver::{Drained, Sink},
    error::UserError,
    plan::Plan,
    preflight,
    process::Processes,
    report::command,
    session::run_into,
    sources::{stat::StatBatch, Batch},
};

pub mod render;
#[cfg(test)]
mod tests;
pub mod values;

pub fn run(args: StatArgs) -> anyhow::Result<i32> {
    let format = command::checked_format(&args.report, "stat", &[])?;
    if args.repeat > 1 && args.scope.command.is_empty() {
        return Err(UserError::Usage("-r N runs a command N times: give it after --".into()).into());
    }
    let plan = Plan::for_stat(&args, default_events(&Catalog::here()))?;
    preflight::check_privileges()?;
    let mut runs = Vec::new();
    let mut exit_code = 0;
    for _ in 0..args.repeat {
        let names = plan
            .stat
            .iter()
            .flat_map(|g| g.events.iter().map(|e| e.spelled()));
        let mut sink = StatSink::new(plan.interval, format == Format::Text, names.collect());
        let recording = run_into(&plan, &mut sink)?;
        exit_code = recording.exit_code;
        let stopped_early = recording.meta.notes.iter().any(|n| n.starts_with("interrupted"));
        runs.push(Run {
            seconds: recording.meta.duration_s,
            counts: sink.totals.unwrap_or_default(),
            values: sink.values,
            intervals: sink.intervals,
            notes: recording.meta.notes,
        });
        if stopped_early {
            break;
        }
    }
    let report = StatReport::of(&plan, &runs);
    command::write(plan.output.as_deref(), format, "stat", &report, render::text)?;
    Ok(exit_code)
}

/// What is counted when `-e` is not given: the CPU's topdown set and the software counters where
/// there is a PMU; the software counters where not.
fn default_events(catalog: &Catalog) -> String {
    let software = "task-clock,context-switches,cpu-migrations,page-faults";
    match crate::counters::pmu::missing_reason() {
        Some(_) => software.to_string(),
        None => {
            let method = crate::counters::cpu::Method::here();
            let set = crate::counters::events::topdown_set(method);
            let resolvable: Vec<&str> = set
                .events
                .iter()
                .filter(|e| crate::counters::language::Event::from_spec(e, catalog.core()).is_ok())
                .map(|e| e.name)
                .collect();
            let hardware = match set.group {
                true => format!("{{{}}}", resolvable.join(",")),
                false => resolvable.join(","),
            };
            format!("{software},{hardware}")
        }
    }
}

/// One run's counts.
#[derive(Clone, Debug, Default)]
pub struct Run {
    pub seconds: f64,
    pub counts: Counts,
    /// `--by`: the tracing events' hits per value.
    pub values: Option<crate::sources::values::ValueBatch>,
    pub intervals: Vec<Interval>,
    pub notes: Vec<String>,
}

/// The counts of one interval (`-I`): what each counter counted in it.
#[derive(Clone, Debug, Serialize)]
pub struct Interval {
    /// Seconds since counting began, at the interval's end.
    pub at_s: f64,
    pub counts: Vec<(String, f64)>,
}

/// `stat`'s sink: each interval's counts (printed as they come on a text report), the totals.
struct StatSink {
    interval: Option<Duration>,
    print: bool,
    /// The events, in the order they were given.
    names: Vec<String>,
    /// When the next interval ends.
    next: Option<tokio::time::Instant>,
    /// The readings at the last interval's end (the intervals are their differences).
    previous: Option<Counts>,
    intervals: Vec<Interval>,
    totals: Option<Counts>,
    values: Option<crate::sources::values::ValueBatch>,
}

impl StatSink {
    fn new(interval: Option<Duration>, print: bool, names: Vec<String>) -> StatSink {
        StatSink {
            interval,
            print,
            names,
            next: interval.map(|i| tokio::time::Instant::now() + i),
            previous: None,
            intervals: Vec::new(),
            totals: None,
            values: None,
        }
    }

    /// An interval ended: its counts, the differences of two readings.
    fn interval(&mut self, batch: &StatBatch) {
        let previous = self.previous.replace(batch.counts.clone());
        let counts = self
            .names
            .iter()
            .map(|name| {
                let now = batch.counts.events.get(name).map_or(0.0, |c| c.value);
                let then = previous
                    .as_ref()
                    .and_then(|p| p.events.get(name))
                    .map_or(0.0, |c| c.value);
                (name.clone(), (now - then).max(0.0))
            })
            .collect();
        let interval = Interval {
            at_s: batch.at_s,
            counts,
        };
        if self.print {
            let mut out = std::io::stdout().lock();
            let _ = render::interval_lines(&interval, &mut out);
        }
        self.intervals.push(interval);
    }
}

impl Sink for StatSink {
    fn drained(&mut self, drained: Drained<'_>) -> anyhow::Result<()> {
        for batch in drained.batches {
            let Batch::Stat(batch) = batch else { continue };
            let (Some(next), Some(every)) = (self.next, self.interval) else {
                continue;
            };
            if tokio::time::Instant::now() + Duration::from_millis(5) >= next {
                self.next = Some(next + every);
                self.interval(&batch);
            }
        }
        Ok(())
    }

    fn wake_at(&self) -> Option<tokio::time::Instant> {
        self.next
    }

    fn finished(&mut self, batches: Vec<Batch>, _procs: &mut Processes) -> anyhow::Result<()> {
        for batch in batches {
            match batch {
                Batch::Stat(batch) => {
                    // The last, shorter interval too: the intervals add up to the run's totals.
                    if self.interval.is_some() {
                        self.interval(&batch);
                    }
                    self.totals = Some(batch.counts);
                }
                Batch::Values(batch) => self.values = Some(batch),
                _ => {}
            }
        }
        Ok(())
    }
}

/// A figure over the runs: its mean, and its relative spread (the standard error of the mean
/// as a share of it, as perf's `( +- x% )`), with more than one run.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Figure {
    pub value: f64,
    pub spread_pct: Option<f64>,
}

impl Figure {
    pub fn of(values: &[f64]) -> Figure {
        let n = values.len() as f64;
        let mean = values.iter().sum::<f64>() / n.max(1.0);
        let spread_pct = (values.len() > 1 && mean != 0.0).then(|| {
            let variance = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0);
            100.0 * (variance / n).sqrt() / mean.abs()
        });
        Figure {
            value: mean,
            spread_pct,
        }
    }
}

/// One counter over the runs.
#[derive(Clone, Debug, Serialize)]
pub struct CounterStat {
    pub event: String,
    #[serde(flatten)]
    pub figure: Figure,
    /// The smallest share of the run it was on the PMU (below 1: multiplexed, scaled up).
    pub running: f64,
    /// Each run's count.
    pub runs: Vec<f64>,
}

/// One derived metric over the runs.
#[derive(Clone, Debug, Serialize)]
pub struct MetricStat {
    pub name: String,
    #[serde(flatten)]
    pub figure: Figure,
    /// `healthy` or `investigate`, by the usual rules of thumb, where there is one.
    pub assessment: Option<&'static str>,
}

/// What `stat` reports.
#[derive(Clone, Debug, Serialize)]
pub struct StatReport {
    pub target: String,
    pub runs: usize,
    pub seconds: Figure,
    pub counters: Vec<CounterStat>,
    pub metrics: Vec<MetricStat>,
    /// Events the kernel never put on the PMU during a run (no count to give).
    pub not_counted: Vec<String>,
    /// `--by`: each tracing event's hits per value (none without it).
    pub by_value: Vec<values::EventValues>,
    pub intervals: Vec<Interval>,
    pub notes: Vec<String>,
}

impl StatReport {
    pub fn of(plan: &Plan, runs: &[Run]) -> StatReport {
        let events: Vec<String> = plan
            .stat
            .iter()
            .flat_map(|g| g.events.iter().map(|e| e.spelled()))
            .collect();
        let mut not_counted = Vec::new();
        let counters = events
            .iter()
            .filter_map(|event| {
                let counts: Vec<_> = runs.iter().filter_map(|r| r.counts.events.get(event)).collect();
                if counts.len() < runs.len() || counts.is_empty() {
                    not_counted.push(event.clone());
                    return None;
                }
                let values: Vec<f64> = counts.iter().map(|c| c.value).collect();
                Some(CounterStat {
                    event: event.clone(),
                    figure: Figure::of(&values),
                    running: counts.iter().map(|c| c.running).fold(1.0, f64::min),
                    runs: values,
                })
            })
            .collect();
        let seconds: Vec<f64> = runs.iter().map(|r| r.seconds).collect();
        let mut notes: Vec<String> = runs.iter().flat_map(|r| r.notes.clone()).collect();
        notes.dedup();
        StatReport {
            target: plan.target_description(),
            runs: runs.len(),
            seconds: Figure::of(&seconds),
            counters,
            metrics: metrics(runs),
            not_counted,
            by_value: by_value(plan, runs),
            intervals: runs.first().map(|r| r.intervals.clone()).unwrap_or_default(),
            notes,
        }
    }
}

/// `--by`'s values over the runs.
fn by_value(plan: &Plan, runs: &[Run]) -> Vec<values::EventValues> {
    let Some((spec, by)) = &plan.by else {
        return Vec::new();
    };
    let events: Vec<String> = spec.events.iter().map(|e| e.spelled()).collect();
    let batches: Vec<_> = runs.iter().map(|r| r.values.as_ref()).collect();
    values::over_runs(&events, by, &spec.fields, &batches)
}

/// The metrics every run's counts give (IPC, CPUs utilized, the miss and walk rates), each over
/// the runs.
fn metrics(runs: &[Run]) -> Vec<MetricStat> {
    let per_run: Vec<Vec<(String, f64)>> = runs.iter().map(run_metrics).collect();
    let Some(first) = per_run.first() else {
        return Vec::new();
    };
    first
        .iter()
        .filter_map(|(name, _)| {
            let values: Vec<f64> = per_run
                .iter()
                .filter_map(|m| m.iter().find(|(n, _)| n == name).map(|(_, v)| *v))
                .collect();
            (values.len() == runs.len()).then(|| {
                let figure = Figure::of(&values);
                MetricStat {
                    name: name.clone(),
                    figure,
                    assessment: assessment(name, figure.value),
                }
            })
        })
        .collect()
}

/// One run's metrics from its counts.
fn run_metrics(run: &Run) -> Vec<(String, f64)> {
    // The ratios are written with perf's lower-case spellings of the generic cache events, and
    // without modifiers (`inst_retired:u` over `cpu_cycles:u` is still IPC).
    let mut lower = Counts::default();
    for (name, count) in &run.counts.events {
        let base = name.split(':').next().unwrap_or(name).to_ascii_lowercase();
        lower.events.entry(base).or_insert(*count);
    }
    let derived = tma::derived_only(&lower);
    let mut metrics = Vec::new();
    if let Some(ipc) = derived.ipc {
        metrics.push(("ipc".to_string(), ipc));
    }
    if let (Some(clock), true) = (run.counts.events.get("task-clock"), run.seconds > 0.0) {
        metrics.push(("cpus_utilized".to_string(), clock.value / 1e9 / run.seconds));
    }
    metrics.extend(derived.metrics);
    metrics
}

/// `ok` or `investigate` for the metrics that have a rule of thumb.
fn assessment(name: &str, value: f64) -> Option<&'static str> {
    match name {
        "cpus_utilized"
        | "frontend_stall_cycles"
        | "backend_stall_cycles"
        | "backend_memory_stall_cycles" => None,
        name => Some(tma::assess(name, value)),
    }
}
