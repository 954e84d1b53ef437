//! A validated command line: every check that needs no privileges, done before anything is
//! loaded, and what the run is then made of.
use std::{ffi::OsString, path::PathBuf, time::Duration};

use crate::{
    cli::{Cli, Event, Format, LockSource, Mode, OffCpuStacks},
    error::UserError,
    launcher, output, preflight,
    sources::{
        self,
        counting::TopdownCounting,
        locks::{self, Reading},
        samples, sched, Kind, Spec,
    },
    start::Recipe,
};

/// A validated command line.
pub struct Plan {
    pub mode: Mode,
    pub event: Event,
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
    pub counters: Vec<crate::cli::CounterEvent>,
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
        if matches!(cli.mode, Mode::Hotspot | Mode::Topdown) {
            preflight::check_frequency(cli.frequency)?;
        }
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
            event: cli.event,
            frequency_hz: cli.frequency,
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
            counters: cli.counters_events.clone(),
            preset: cli.preset.clone().unwrap_or_else(|| "topdown".into()),
            unwind: cli.unwind,
            lock_source: cli.lock_source,
            waits: cli.waits,
            annotate: cli.annotate,
            debug_dirs,
            debuginfod,
        })
    }

    /// `bpfprof top`: the same collection, for the whole system or some processes, with what is
    /// cheapest for a view that shows no stacks of sched or lock (off-CPU stacks off).
    pub fn for_top(args: &crate::cli::TopArgs) -> Result<Plan, UserError> {
        let mode = args.mode.mode();
        if mode == Mode::Hotspot {
            preflight::check_frequency(args.frequency)?;
        }
        if args.window == 0 {
            return Err(UserError::Usage("--window: at least 1 second".into()));
        }
        Ok(Plan {
            mode,
            event: Event::CpuClock,
            frequency_hz: args.frequency,
            duration: args.duration.map(Duration::from_secs_f64),
            system_wide: args.pids.is_empty(),
            pids: preflight::resolve_pids(&args.pids)?,
            command: Vec::new(),
            format: Format::Text,
            output: None,
            slow_threshold_ns: u64::MAX,
            offcpu_stacks: OffCpuStacks::None,
            counters: Vec::new(),
            preset: "topdown".into(),
            unwind: crate::cli::Unwind::Tables,
            lock_source: LockSource::Futex,
            waits: args.waits,
            annotate: None,
            debug_dirs: args.names.checked_dirs()?,
            debuginfod: args.names.debuginfod()?,
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
                Kind::CpuSamples => specs.extend(self.samples(counting.as_ref()).map(Spec::CpuSamples)),
                Kind::Sched => specs.push(Spec::Sched(sched::Spec::new(
                    self.slow_threshold_ns,
                    self.offcpu_stacks,
                ))),
                Kind::Locks => specs.push(Spec::Locks(locks::Spec::new(self.lock_source, locks))),
                Kind::Counting => specs.extend(counting.take().map(|c| Spec::Counting(Box::new(c)))),
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
    fn samples(&self, counting: Option<&TopdownCounting>) -> Option<samples::Spec> {
        let (event, counters, group, core) = match counting {
            Some(counting) => {
                let set = counting.per_function()?;
                let event = match set.hardware {
                    true => Event::Cycles,
                    false => self.event,
                };
                (event, set.events.to_vec(), set.group, counting.core.clone())
            }
            None => (
                self.event,
                self.counters.iter().map(|c| c.spec()).collect(),
                false,
                None,
            ),
        };
        Some(samples::Spec {
            event,
            frequency_hz: self.frequency_hz,
            counters,
            group,
            core,
        })
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
