//! Topdown's counters over the whole run (`--preset`): what is counted is decided once, before
//! anything is loaded; counted by the counters read at each sample, per CPU, over the targets'
//! intervals; read at the run's end.
use std::path::Path;

use crate::{
    counters::{
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
        })
    }

    /// Say, in one line, when the set needs a PMU there is not (thread states stand in). The
    /// set is counted by the counters read at each sample, per CPU: their deltas over the
    /// targets' intervals add up to the run's totals (`Loaded::counter_totals`). Counting it a
    /// second time, per thread, would leave the kernel scheduling two sets on one PMU: the
    /// per-CPU one first, the other multiplexed or never on at all.
    pub fn announce(&self) {
        if !self.countable {
            eprintln!(
                "bpfprof: topdown: {}. Showing where each thread's time went instead (thread states from the scheduler).",
                self.reason
            );
        }
    }

    /// The run's totals, once read; a failed read keeps the thread states and says so.
    pub fn with_totals(self, totals: anyhow::Result<Option<Counts>>) -> TopdownCounting {
        let counts = match totals {
            Ok(counts) => counts,
            Err(e) => {
                log::warn!("reading the {} counters: {e}", self.set.name);
                None
            }
        };
        TopdownCounting {
            set: self.set,
            countable: self.countable,
            counts,
            reason: self.reason,
            machine: self.machine,
            core: self.core,
        }
    }
}
