//! A validated command line: every check that needs no privileges, done before anything is
//! loaded, and what the run is then made of.
use std::{ffi::OsString, path::PathBuf, time::Duration};

use crate::{
    cli::{Cli, Format, LockSource, Mode, OffCpuStacks},
    counters::language::{Catalog, Event, Group},
    error::UserError,
    launcher, output, preflight,
    sources::{
        self,
        counting::TopdownCounting,
        latency,
        locks::{self, Reading},
        records,
        samples::{self, Rate},
        sched, stat, syscalls, timeline, values, Kind, Spec,
    },
    start::Recipe,
};
use traced::{
    by_values, filter_tracepoints, hit_filters, hit_period_fits, hit_weight, latency_keys, not_traced,
    traced_event, traced_events_fit, tracepoint_fields,
};

/// The sampling frequency when neither -F nor -c is given.
pub const DEFAULT_HZ: u64 = 99;

/// The event `-e` names, refused at once where it needs a PMU this machine has not (before
/// anything is loaded).
fn sampling_event(catalog: &Catalog, text: &str) -> Result<Event, UserError> {
    samplable(catalog, catalog.parse(text)?)
}

/// `event`, if this machine can sample it as asked.
fn samplable(catalog: &Catalog, event: Event) -> Result<Event, UserError> {
    if event.hardware && crate::counters::pmu::missing_reason().is_some() {
        return Err(UserError::NoPmu {
            event: event.spelled(),
        });
    }
    match catalog.imprecise(&event) {
        Some(why) => Err(UserError::Usage(format!("-e {}: {why}", event.spelled()))),
        None => Ok(event),
    }
}

/// A tracing command's user stacks, where it takes any, walked through each process's unwind
/// tables as the sampler's are.
fn tables_if(stacks: bool) -> crate::cli::Unwind {
    match stacks {
        true => crate::cli::Unwind::Tables,
        false => crate::cli::Unwind::Fp,
    }
}

/// `--duration-min MS` in nanoseconds (at least one).
fn millis_to_ns(ms: Option<f64>) -> Option<u64> {
    ms.map(|ms| ((ms * 1e6).round() as u64).max(1))
}

/// How often the events are sampled: every `-c` events (or hits), else a tracing event at every
/// hit, any other at the frequency.
fn rate_of(events: &[Event], period: Option<u64>, frequency_hz: u64) -> Rate {
    match (period, events.iter().any(Event::is_traced)) {
        (Some(n), _) => Rate::Period(n),
        (None, true) => Rate::Period(1),
        (None, false) => Rate::Frequency(frequency_hz),
    }
}

/// Every `-e` (each may list several, comma-separated), at most `MAX_SAMPLING_EVENTS`.
fn sampling_events(catalog: &Catalog, given: &[String]) -> Result<Vec<Event>, UserError> {
    let mut events = Vec::new();
    for text in given {
        for group in catalog.parse_list(text)? {
            for event in group.events {
                events.push(samplable(catalog, event)?);
            }
        }
    }
    if events.is_empty() && !given.is_empty() {
        return Err(UserError::Usage("-e: no event given".into()));
    }
    if events.len() > MAX_SAMPLING_EVENTS {
        return Err(UserError::Usage(format!(
            "at most {MAX_SAMPLING_EVENTS} sampling events in one run"
        )));
    }
    Ok(events)
}

/// How many events one run samples at most (each opens a perf event per CPU).
pub const MAX_SAMPLING_EVENTS: usize = profiler_common::MAX_SAMPLING_EVENTS;

/// Several sampling events give one profile each: hotspot only, into files (or text), not
/// annotated at once.
fn several_events_fit(events: &[Event], cli: &Cli, format: Format) -> Result<(), UserError> {
    if events.len() < 2 {
        return Ok(());
    }
    if cli.mode != Mode::Hotspot {
        return Err(UserError::Usage(
            "several sampling events (one profile each) go with --mode hotspot".into(),
        ));
    }
    if cli.output.is_none() && format != Format::Text {
        return Err(UserError::Usage(
        "several sampling events give one profile each: give -o FILE (each written with its event in the name: p.cycles.json) or text".into(),
        ));
    }
    if cli.annotate.is_some() {
        return Err(UserError::Usage(
        "--annotate shows one event: sample it alone (or annotate each saved profile with `bpfprof report`)".into(),
        ));
    }
    Ok(())
}

/// A validated command line.
pub struct Plan {
    pub mode: Mode,
    /// What is sampled (hotspot: one profile each; topdown's per-function split where it cannot
    /// count on cycles, one event). Never empty.
    pub events: Vec<Event>,
    /// How often: a frequency (`-F`, 99 by default) or every N events (`-c`).
    pub rate: Rate,
    pub frequency_hz: u64,
    pub duration: Option<Duration>,
    pub system_wide: bool,
    pub pids: Vec<u32>,
    pub command: Vec<OsString>,
    pub format: Format,
    pub output: Option<PathBuf>,
    pub slow_threshold_ns: u64,
    pub offcpu_stacks: OffCpuStacks,
    /// Hotspot: counters whose deltas are attributed to the sampled stacks.
    pub counters: Vec<Event>,
    /// Topdown: the counter set counted over the run.
    pub preset: String,
    pub unwind: crate::cli::Unwind,
    pub lock_source: crate::cli::LockSource,
    /// Lock: the waits the stack formats (and `top`) carry.
    pub waits: crate::cli::Waits,
    /// Hotspot: annotate this function instead of the report.
    pub annotate: Option<String>,
    /// `--debug-dir`: where debug files are looked for first.
    pub debug_dirs: Vec<PathBuf>,
    /// `--debuginfod` or `DEBUGINFOD_URLS`: where debug files are fetched from by build id.
    pub debuginfod: Option<crate::symbolize::debuginfod::Config>,
    /// `stat`: the events counted, in their groups, and how often they are printed (`-I`).
    pub stat: Vec<Group>,
    pub interval: Option<Duration>,
    /// `stat --by`: the tracing events counted per value, and by what (as written).
    pub by: Option<(values::Spec, String)>,
    /// `latency`: the two events and their key.
    pub latency: Option<latency::Spec>,
    /// `record`: the events recorded, and what each fetches.
    pub record: Option<records::Spec>,
    /// `trace`: which calls are also listed one by one.
    pub syscalls: syscalls::Spec,
    /// What a tracing event's sample counts (`--weight`; none: one).
    pub weight: Option<crate::sources::samples::Weighed>,
    /// Per tracing event, what its hits must pass to be counted and sampled or recorded.
    pub filters: Vec<crate::counters::filter::SiteTerms>,
}

impl Plan {
    /// Every check that needs no privileges, so usage mistakes are reported first.
    pub fn from_cli(cli: Cli) -> Result<Plan, UserError> {
        let format = cli.resolved_format()?;
        let format_fits = match cli.mode {
            Mode::Topdown => matches!(format, Format::Text | Format::Json),
            Mode::Sched => true,
            _ => format != Format::Heatmap,
        };
        if !format_fits {
            return Err(UserError::FormatUnavailable {
                format: format.name(),
                mode: cli.mode.name(),
            });
        }
        let frequency_hz = cli.frequency.unwrap_or(DEFAULT_HZ);
        if cli.period.is_some() && cli.mode != Mode::Hotspot {
            return Err(UserError::Usage(
                "-c (sample every N events) goes with --mode hotspot".into(),
            ));
        }
        let catalog = Catalog::here().with_targets(&cli.pids);
        let events = sampling_events(&catalog, &cli.events)?;
        several_events_fit(&events, &cli, format)?;
        traced_events_fit(&events, &cli)?;
        let rate = rate_of(&events, cli.period, frequency_hz);
        if matches!(cli.mode, Mode::Hotspot | Mode::Topdown) && matches!(rate, Rate::Frequency(_)) {
            preflight::check_frequency(frequency_hz)?;
        }
        let counters = cli
            .counters_events
            .iter()
            .map(|c| catalog.parse(c))
            .collect::<Result<Vec<_>, _>>()?;
        counters.iter().try_for_each(|c| not_traced(c, "--counter"))?;
        let pids = preflight::resolve_pids(&cli.pids)?;
        if let Some(program) = cli.command.first() {
            launcher::resolve(program)?;
        }
        if cli.preset.is_some() && cli.mode != Mode::Topdown {
            return Err(UserError::Usage("--preset goes with --mode topdown".into()));
        }
        if !cli.counters_events.is_empty() && cli.mode != Mode::Hotspot {
            return Err(UserError::Usage("--counter goes with --mode hotspot".into()));
        }
        if cli.lock_source == LockSource::Pthread
            && cli.mode == Mode::Lock
            && (cli.system_wide || (cli.pids.is_empty() && cli.command.is_empty()))
        {
            return Err(UserError::Usage(
                "--lock-source pthread probes the target processes' own lock functions: give -p PID or a command (or use --lock-source futex for the whole system)".into(),
            ));
        }
        if cli.annotate.is_some() && (cli.mode != Mode::Hotspot || format != Format::Text) {
            return Err(UserError::Usage(
                "--annotate goes with --mode hotspot and writes text (annotate a saved profile with `bpfprof report PROFILE --annotate FUNCTION`)".into(),
            ));
        }
        if cli.counters_events.len() > profiler_common::MAX_COUNTERS {
            return Err(UserError::Usage(format!(
                "at most {} --counter events",
                profiler_common::MAX_COUNTERS
            )));
        }
        output::check_destination(format, cli.output.as_deref())?;
        let debug_dirs = cli.names.checked_dirs()?;
        let debuginfod = cli.names.debuginfod()?;
        Ok(Plan {
            mode: cli.mode,
            weight: hit_weight(&events, cli.weight.as_ref())?,
            filters: hit_filters(&events, cli.filter.as_deref())?,
            events,
            rate,
            frequency_hz,
            duration: cli.duration.map(Duration::from_secs_f64),
            system_wide: cli.system_wide || (cli.pids.is_empty() && cli.command.is_empty()),
            pids,
            command: cli.command,
            format,
            output: cli.output,
            // Topdown's thread states need neither stacks nor slow-wait events: the cheapest path.
            slow_threshold_ns: match cli.mode {
                Mode::Topdown => u64::MAX,
                _ => (cli.slow_threshold_ms * 1e6) as u64,
            },
            offcpu_stacks: match cli.mode {
                Mode::Topdown => OffCpuStacks::None,
                _ => cli.offcpu_stacks,
            },
            counters,
            preset: cli.preset.clone().unwrap_or_else(|| "topdown".into()),
            unwind: cli.unwind,
            lock_source: cli.lock_source,
            waits: cli.waits,
            annotate: cli.annotate,
            debug_dirs,
            debuginfod,
            ..Plan::base(cli.mode)?
        })
    }

    /// `bpfprof stat`: what to count (`default`: when no `-e`), on what, how often printed.
    pub fn for_stat(args: &crate::cli::StatArgs, default: String) -> Result<Plan, UserError> {
        let catalog = Catalog::here().with_targets(&args.scope.pids);
        let lists = match args.events.is_empty() {
            true => vec![default],
            false => args.events.clone(),
        };
        let mut stat = Vec::new();
        for list in &lists {
            stat.extend(catalog.parse_list(list)?);
        }
        if stat.is_empty() {
            return Err(UserError::Usage("-e: no event given".into()));
        }
        if let Some(filter) = &args.filter {
            filter_tracepoints(&mut stat, filter)?;
        }
        let by = match &args.by {
            Some(by) => Some((by_values(&stat, by, args.filter.as_deref())?, by.clone())),
            None => None,
        };
        Ok(Plan {
            stat,
            by,
            interval: args.interval_ms.map(Duration::from_millis),
            ..Plan::scoped(Mode::Stat, &args.scope, args.report.output.clone())?
        })
    }

    /// `bpfprof latency`: the time from one event to another, per key.
    pub fn for_latency(args: &crate::cli::LatencyArgs) -> Result<Plan, UserError> {
        let catalog = Catalog::here().with_targets(&args.scope.pids);
        let from = traced_event(&catalog, "--from", &args.from)?;
        let to = traced_event(&catalog, "--to", &args.to)?;
        if from.spelled() == to.spelled() {
            return Err(UserError::Usage(format!(
                "--from and --to are both {}: an interval is between two events",
                from.spelled()
            )));
        }
        let tracefs = crate::counters::tracepoint::tracefs_root();
        let (keys, key) = latency_keys(tracefs, [&from, &to], &args.key)?;
        let filter = match &args.filter {
            Some(text) => Some((
                text.clone(),
                hit_filters(std::slice::from_ref(&from), Some(text))?.remove(0),
            )),
            None => None,
        };
        let heatmap = crate::cli::format_for(args.report.format, args.report.output.as_deref())?;
        Ok(Plan {
            latency: Some(latency::Spec {
                from,
                to,
                keys,
                key,
                filter,
                heatmap: heatmap == crate::cli::Format::Heatmap,
                slow_ns: millis_to_ns(args.duration_min_ms),
            }),
            // A slow interval's start stack through each process's unwind tables.
            unwind: tables_if(args.duration_min_ms.is_some()),
            ..Plan::scoped(Mode::Latency, &args.scope, args.report.output.clone())?
        })
    }

    /// `bpfprof record`: the tracing events whose hits are recorded, every Nth, and what each
    /// probe fetches at them.
    pub fn for_record(args: &crate::cli::RecordArgs) -> Result<Plan, UserError> {
        let catalog = Catalog::here().with_targets(&args.scope.pids);
        let mut events = Vec::new();
        for list in &args.events {
            for group in catalog.parse_list(list)? {
                events.extend(group.events);
            }
        }
        if let Some(event) = events.iter().find(|e| !e.is_traced()) {
            return Err(UserError::Usage(format!(
                "-e {}: not a tracepoint or a probe (record takes each hit of a tracing event; `bpfprof list` shows them)",
                event.spelled()
            )));
        }
        if events.is_empty() || events.len() > profiler_common::MAX_SAMPLING_EVENTS {
            return Err(UserError::Usage(format!(
                "-e: one to {} tracepoints or probes",
                profiler_common::MAX_SAMPLING_EVENTS
            )));
        }
        let specs = (args.fetch.as_deref())
            .map(crate::counters::fetch::parse_list)
            .transpose()
            .map_err(|why| UserError::Usage(format!("--fetch {why}")))?;
        let fetches = (events.iter())
            .map(|event| match &specs {
                None => Ok(Vec::new()),
                Some(specs) => crate::counters::fetch::resolve(specs, event, &tracepoint_fields(event))
                    .map_err(|why| UserError::Usage(format!("--fetch with -e {}: {why}", event.spelled()))),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let filters = hit_filters(&events, args.filter.as_deref())?;
        hit_period_fits(args.period)?;
        Ok(Plan {
            record: Some(records::Spec {
                events,
                period: args.period.unwrap_or(1),
                fetches,
                stacks: args.stacks,
                filters,
            }),
            // The user stacks of `-g` through each process's unwind tables, as the sampler's.
            unwind: tables_if(args.stacks),
            ..Plan::scoped(Mode::Record, &args.scope, args.report.output.clone())?
        })
    }

    /// `bpfprof sched record`: the scheduler's events of a command, processes or the whole
    /// system, one by one.
    pub fn for_sched_record(args: &crate::cli::SchedRecordArgs) -> Result<Plan, UserError> {
        Plan::scoped(Mode::SchedRecord, &args.scope, Some(args.output.clone()))
    }

    /// `bpfprof trace`: the system-call summary of a command, processes or the whole system.
    pub fn for_trace(args: &crate::cli::TraceArgs) -> Result<Plan, UserError> {
        Ok(Plan {
            syscalls: syscalls::Spec {
                slow_ns: millis_to_ns(args.duration_min_ms),
            },
            // A slow call's stack through each process's unwind tables, as the sampler's.
            unwind: tables_if(args.duration_min_ms.is_some()),
            ..Plan::scoped(Mode::Trace, &args.scope, args.report.output.clone())?
        })
    }

    /// A plan of `stat` or `trace`: what they watch and for how long, nothing sampled.
    fn scoped(mode: Mode, scope: &crate::cli::ScopeArgs, output: Option<PathBuf>) -> Result<Plan, UserError> {
        if let Some(program) = scope.command.first() {
            launcher::resolve(program)?;
        }
        Ok(Plan {
            duration: scope.duration.map(Duration::from_secs_f64),
            system_wide: scope.system_wide || (scope.pids.is_empty() && scope.command.is_empty()),
            pids: preflight::resolve_pids(&scope.pids)?,
            command: scope.command.clone(),
            output,
            ..Plan::base(mode)?
        })
    }

    /// What every plan starts from: the whole system sampled on the CPU clock at the default
    /// rate until stopped, reported as text on standard output; nothing else asked.
    fn base(mode: Mode) -> Result<Plan, UserError> {
        Ok(Plan {
            mode,
            events: vec![Catalog::here().parse("cpu-clock")?],
            rate: Rate::Frequency(DEFAULT_HZ),
            frequency_hz: 0,
            duration: None,
            system_wide: true,
            pids: Vec::new(),
            command: Vec::new(),
            format: Format::Text,
            output: None,
            slow_threshold_ns: u64::MAX,
            offcpu_stacks: OffCpuStacks::None,
            counters: Vec::new(),
            preset: "topdown".into(),
            unwind: crate::cli::Unwind::Fp,
            lock_source: LockSource::Futex,
            waits: crate::cli::Waits::Contention,
            annotate: None,
            debug_dirs: Vec::new(),
            debuginfod: None,
            stat: Vec::new(),
            interval: None,
            by: None,
            latency: None,
            record: None,
            syscalls: syscalls::Spec::default(),
            weight: None,
            filters: Vec::new(),
        })
    }

    /// `bpfprof top`: the same collection, for the whole system or some processes, with what is
    /// cheapest for a view that shows no stacks of sched or lock (off-CPU stacks off).
    pub fn for_top(args: &crate::cli::TopArgs) -> Result<Plan, UserError> {
        let mode = args.mode.mode();
        if mode == Mode::Hotspot && args.period.is_none() {
            preflight::check_frequency(args.frequency)?;
        }
        if args.window == 0 {
            return Err(UserError::Usage("--window: at least 1 second".into()));
        }
        let events = vec![sampling_event(&Catalog::here(), &args.event)?];
        if events[0].is_traced() {
            hit_period_fits(args.period)?;
        }
        Ok(Plan {
            rate: rate_of(&events, args.period, args.frequency),
            events,
            frequency_hz: args.frequency,
            duration: args.duration.map(Duration::from_secs_f64),
            system_wide: args.pids.is_empty(),
            pids: preflight::resolve_pids(&args.pids)?,
            unwind: crate::cli::Unwind::Tables,
            waits: args.waits,
            debug_dirs: args.names.checked_dirs()?,
            debuginfod: args.names.debuginfod()?,
            ..Plan::base(mode)?
        })
    }

    /// What the run collects, from the mode's sources (`sources::MODE_SOURCES`): decided once,
    /// before anything is loaded. `locks`: how lock records are read (a run at the end, `top` at
    /// every drain).
    pub fn recipe(&self, locks: Reading) -> anyhow::Result<Recipe> {
        let kinds = sources::of_mode(self.mode);
        let mut counting = match kinds.contains(&Kind::Counting) {
            true => Some(TopdownCounting::plan(&self.preset)?),
            false => None,
        };
        let mut specs = Vec::new();
        for kind in kinds {
            match kind {
                Kind::CpuSamples => specs.extend(self.samples(counting.as_ref())?.map(Spec::CpuSamples)),
                Kind::Sched => specs.push(Spec::Sched(sched::Spec::new(
                    self.slow_threshold_ns,
                    self.offcpu_stacks,
                ))),
                Kind::Locks => specs.push(Spec::Locks(locks::Spec::new(self.lock_source, locks))),
                Kind::Counting => specs.extend(counting.take().map(|c| Spec::Counting(Box::new(c)))),
                Kind::Stat => specs.push(Spec::Stat(stat::Spec {
                    groups: self.stat.clone(),
                    intervals: self.interval.is_some(),
                })),
                Kind::Values => specs.extend(self.by.clone().map(|(spec, _)| Spec::Values(spec))),
                Kind::Syscalls => specs.push(Spec::Syscalls(self.syscalls.clone())),
                Kind::Latency => specs.extend(self.latency.clone().map(|l| Spec::Latency(Box::new(l)))),
                Kind::Records => specs.extend(self.record.clone().map(Spec::Records)),
                Kind::Timeline => specs.push(Spec::Timeline(timeline::Spec::default())),
            }
        }
        Ok(Recipe {
            specs,
            unwind_tables: self.unwind == crate::cli::Unwind::Tables,
            sample_map_entries: None,
        })
    }

    /// What is sampled: the event asked for with `--counter`s; topdown reads its set at each
    /// sample too, for the split per function, wherever it can count it (on the cycle counter's
    /// overflow where there is one), and samples nothing where it cannot.
    fn samples(&self, counting: Option<&TopdownCounting>) -> anyhow::Result<Option<samples::Spec>> {
        let (events, counters, group) = match counting {
            Some(counting) => {
                let Some(set) = counting.per_function() else {
                    return Ok(None);
                };
                let event = match set.hardware {
                    true => Catalog::here().parse("cycles")?,
                    false => self.events[0].clone(),
                };
                let counters = set
                    .events
                    .iter()
                    .map(|e| Event::from_spec(e, counting.core.as_ref()))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|reason| anyhow::anyhow!("topdown's {} set: {reason}", set.name))?;
                (vec![event], counters, set.group)
            }
            None => (self.events.clone(), self.counters.clone(), false),
        };
        Ok(Some(samples::Spec {
            events,
            rate: self.rate,
            counters,
            group,
            weight: self.weight.clone(),
            filters: self.filters.clone(),
        }))
    }

    pub fn target_description(&self) -> String {
        let mut parts = Vec::new();
        if self.system_wide {
            parts.push("system-wide".to_string());
        }
        if !self.pids.is_empty() {
            let pids: Vec<String> = self.pids.iter().map(u32::to_string).collect();
            parts.push(format!("pid {}", pids.join(",")));
        }
        if !self.command.is_empty() {
            parts.push(format!("command `{}`", launcher::display(&self.command)));
        }
        parts.join(", ")
    }
}

#[cfg(test)]
mod tests;
mod traced;
