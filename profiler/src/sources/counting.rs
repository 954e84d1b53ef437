//! Topdown's counters over the whole run (`--preset`): what is counted is decided once, before
//! anything is loaded; counted by the counters read at each sample, per CPU, over the targets'
//! intervals (the samples source opens them); their running sums read when the run starts and
//! when it stops.
use std::path::Path;

use aya::maps::{MapData, PerCpuArray};
use profiler_common::{names, CounterDeltas};

use super::{Attached, Batch, Source};
use crate::{
    bpf::Loaded,
    collect::take_map,
    counters::{
        counting::{counts_of, Reading},
        cpu::Method,
        events::{self, CounterSet, Pmu},
        tma::{Counts, Machine},
    },
    error::UserError,
    process::Processes,
};

/// Topdown's whole-run counting, and what its report needs to know about the machine: asked
/// once, at the start.
pub struct TopdownCounting {
    pub set: CounterSet,
    /// The set can be counted here (it needs no PMU, or there is one).
    countable: bool,
    /// The totals once read; none when the set needs a PMU there is not.
    pub counts: Option<Counts>,
    /// Why there is no level-1 split from hardware, unless counts give one.
    pub reason: String,
    /// The slots per cycle (the PMU's caps/slots where the kernel exposes it, else the
    /// family's) and the Arm core, for the formulas.
    pub machine: Machine,
    /// The CPU's core PMU, as sysfs describes it.
    pub core: Option<Pmu>,
    /// Per CPU, the counters' running sums when the run started.
    at_start: Option<Vec<CounterDeltas>>,
}

impl TopdownCounting {
    /// The set can be counted here, so it is also read at each sample, per function.
    pub fn per_function(&self) -> Option<CounterSet> {
        self.countable.then_some(self.set)
    }

    /// What topdown will count (`--preset`), decided before anything is loaded: the sampling
    /// program is sized by it.
    pub fn plan(preset: &str) -> anyhow::Result<TopdownCounting> {
        let method = Method::here();
        let set = events::preset(preset, method)
            .ok_or_else(|| UserError::Usage(format!("unknown --preset {preset}")))?;
        let core = Pmu::core(Path::new(events::SYSFS_PMUS));
        let missing_pmu = crate::counters::pmu::missing_reason();
        let countable = !(set.hardware && missing_pmu.is_some());
        Ok(TopdownCounting {
            set,
            countable,
            counts: None,
            reason: missing_pmu.unwrap_or_else(|| {
                format!(
                    "the {} counter set has no pipeline-slot events (--preset topdown has)",
                    set.name
                )
            }),
            machine: Machine {
                slots: core.as_ref().and_then(Pmu::slots).or(method.slots()),
                arm: match method {
                    Method::ArmSlots { core } => Some(core),
                    _ => None,
                },
            },
            core,
            at_start: None,
        })
    }

    /// The run starts (with the thread states): say, in one line, when the set needs a PMU there
    /// is not (thread states stand in); else take the counters' running sums (`sums`), per CPU.
    /// The set is counted by the counters read at each sample, per CPU, over the targets'
    /// intervals (`COUNTER_TOTALS`). Counting it a second time, per thread, would leave
    /// the kernel scheduling two sets on one PMU: the per-CPU one first, the other multiplexed
    /// or never on at all.
    pub fn start(&mut self, sums: anyhow::Result<Option<Vec<CounterDeltas>>>) -> anyhow::Result<()> {
        if !self.countable {
            eprintln!(
                "bpfprof: topdown: {}. Showing where each thread's time went instead (thread states from the scheduler).",
                self.reason
            );
            return Ok(());
        }
        self.at_start = sums?;
        Ok(())
    }

    /// The run ends: its totals are what the running sums (`sums`, per CPU) gained since the
    /// start, each CPU's scaled by its own running share as perf does. A failed read keeps the
    /// thread states and says so.
    pub fn finish(mut self, sums: anyhow::Result<Option<Vec<CounterDeltas>>>) -> TopdownCounting {
        let names: Vec<&str> = self.set.events.iter().map(|e| e.name).collect();
        self.counts = match (sums, &self.at_start) {
            (Ok(Some(end)), Some(start)) => {
                let mut readings = vec![Reading::default(); names.len()];
                for (end, start) in end.iter().zip(start) {
                    let run = end.since(start);
                    for (k, reading) in readings.iter_mut().enumerate() {
                        reading.add(run.values[k], run.enabled_ns, run.running_ns[k]);
                    }
                }
                Some(counts_of(&names, &readings))
            }
            (Ok(_), _) => None,
            (Err(e), _) => {
                log::warn!("reading the {} counters: {e}", self.set.name);
                None
            }
        };
        self
    }
}

/// The counting source: the counters' running sums, per CPU, read at the start and the stop.
struct RunCounting {
    /// None once finished (read at the stop).
    counting: Option<TopdownCounting>,
    /// The per-CPU running sums the sampling program keeps; none when the set is not counted.
    totals: Option<PerCpuArray<MapData, CounterDeltas>>,
}

impl RunCounting {
    fn read(&self) -> anyhow::Result<Option<Vec<CounterDeltas>>> {
        let Some(totals) = &self.totals else {
            return Ok(None);
        };
        Ok(Some(totals.get(&0, 0)?.iter().copied().collect()))
    }
}

/// Start counting: the run's totals are what the sums gain from now on (the scheduler attached
/// just before, so its thread states cover the same run).
pub fn attach(mut counting: TopdownCounting, kernel: &mut Loaded) -> anyhow::Result<Attached> {
    let totals = match counting.per_function() {
        Some(_) => Some(PerCpuArray::try_from(take_map(
            &mut kernel.ebpf,
            names::COUNTER_TOTALS,
        )?)?),
        None => None,
    };
    let mut source = RunCounting {
        counting: None,
        totals,
    };
    counting.start(source.read())?;
    source.counting = Some(counting);
    Ok(Attached {
        source: Box::new(source),
        doing: None,
        note: None,
    })
}

impl Source for RunCounting {
    /// The totals at the moment collection stopped (the last drains take time of their own).
    fn stopping(&mut self) {
        let sums = self.read();
        self.counting = self.counting.take().map(|c| c.finish(sums));
    }

    fn finish(&mut self, _stopped_ns: u64, _procs: &mut Processes) -> anyhow::Result<Option<Batch>> {
        Ok(self.counting.take().map(|c| Batch::Counts(Box::new(c))))
    }
}
