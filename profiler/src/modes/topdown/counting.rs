//! Topdown's counters over the whole run (`--preset`): what is counted is decided once, before
//! anything is loaded; counted by the counters read at each sample, per CPU, over the targets'
//! intervals; read at the run's end.
use std::path::Path;

use profiler_common::CounterDeltas;

use crate::{
    counters::{
        counting::{counts_of, Reading},
        cpu::Method,
        events::{self, CounterSet, Pmu},
        tma::{Counts, Machine},
    },
    error::UserError,
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
    /// intervals (`Loaded::counter_totals`). Counting it a second time, per thread, would leave
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
