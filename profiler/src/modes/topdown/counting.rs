//! Topdown's counters over the whole run (`--preset`): what is counted is decided once, before
//! anything is loaded; counted per thread of the targets or per CPU while the run lasts; read at
//! its end.
use std::path::Path;

use crate::{
    counters::{
        counting::{Counting, Scope},
        cpu::Method,
        events::{self, CounterSet, Pmu},
        tma::{Counts, Machine},
    },
    error::UserError,
    process::threads_of,
};

/// Topdown's whole-run counting, and what its report needs to know about the machine: asked
/// once, at the start.
pub struct TopdownCounting<C> {
    pub set: CounterSet,
    /// The set can be counted here (it needs no PMU, or there is one).
    countable: bool,
    /// The counters while running (`Counting`), their totals once read (`Counts`); none when the
    /// set needs a PMU there is not.
    pub counts: Option<C>,
    /// Why there is no level-1 split from hardware, unless counts give one.
    pub reason: String,
    /// The slots per cycle (the PMU's caps/slots where the kernel exposes it, else the
    /// family's) and the Arm core, for the formulas.
    pub machine: Machine,
    /// The CPU's core PMU, as sysfs describes it.
    pub core: Option<Pmu>,
}

impl<C> TopdownCounting<C> {
    /// The set can be counted here, so it is also read at each sample, per function.
    pub fn per_function(&self) -> Option<CounterSet> {
        self.countable.then_some(self.set)
    }
}

impl TopdownCounting<Counting> {
    /// What topdown will count (`--preset`), decided before anything is loaded: the sampling
    /// program is sized by it.
    pub fn plan(preset: &str) -> anyhow::Result<TopdownCounting<Counting>> {
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

    /// Start the counters over the whole run, once everything else is attached (so they cover
    /// the same time as the thread states): per thread of the `targets`, inherited by what they
    /// start, or per CPU. When the set needs a PMU there is not, says so in one line and counts
    /// nothing.
    pub fn start(&mut self, system_wide: bool, targets: &[u32]) -> anyhow::Result<()> {
        if !self.countable {
            eprintln!(
                "bpfprof: topdown: {}. Showing where each thread's time went instead (thread states from the scheduler).",
                self.reason
            );
            return Ok(());
        }
        let scope = match system_wide {
            true => Scope::Cpus(crate::counters::cpu::online_ids()?),
            false => Scope::Threads(targets.iter().flat_map(|&pid| threads_of(pid)).collect()),
        };
        let set = self.set;
        let counting = Counting::start(set.events, set.group, self.core.as_ref(), &scope)
            .map_err(|e| UserError::Counting(e.to_string()))?;
        log::info!("counting the {} set: {} events", set.name, set.events.len());
        self.counts = Some(counting);
        Ok(())
    }

    /// The totals at this moment; a failed read keeps the thread states and says so.
    pub fn read(self) -> TopdownCounting<Counts> {
        let counts = self.counts.and_then(|counting| match counting.read() {
            Ok(counts) => Some(counts),
            Err(e) => {
                log::warn!("reading the {} counters: {e}", self.set.name);
                None
            }
        });
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
