//! Counting any events over a run, as `perf stat` counts them: on each target thread and
//! whatever it starts (or on each CPU, system-wide), groups scheduled onto the PMU together,
//! counts the kernel had to multiplex scaled by the share of time they ran. Read at the stop,
//! and at every drain when each interval is wanted (`stat -I`). Nothing of it is in the kernel
//! object: the counters are perf events of their own.
use std::time::Instant;

use super::{AttachContext, Attached, Batch, Source, Wants};
use crate::{
    bpf::{LoadOptions, Loaded},
    collect::Flip,
    counters::{
        counting::{Counting, CountingError, Scope},
        language::Group,
        tma::Counts,
    },
    error::UserError,
    process::Processes,
};

/// What is counted, and whether each drain reads the counts too.
pub struct Spec {
    pub groups: Vec<Group>,
    pub intervals: bool,
}

impl Spec {
    /// The kernel object is loaded as for any run; this source sets nothing in it.
    pub fn needs(&self, _options: &mut LoadOptions<'_>) {}

    pub fn attach(self, _kernel: &mut Loaded, context: &AttachContext<'_>) -> anyhow::Result<Attached> {
        let scope = match context.system_wide {
            true => Scope::Cpus(crate::counters::cpu::online_ids()?),
            false => {
                let threads = context
                    .pids
                    .iter()
                    .flat_map(|&pid| crate::process::threads_of(pid))
                    .chain(context.command);
                Scope::Threads(threads.collect())
            }
        };
        let counting = Counting::start_groups(&self.groups, &scope).map_err(|e| match e {
            CountingError::Unsupported { event, .. } if crate::counters::pmu::missing_reason().is_some() => {
                anyhow::Error::from(UserError::NoPmu { event })
            }
            e @ CountingError::Filter { .. } => UserError::Usage(format!("--filter: {e}")).into(),
            e => e.into(),
        })?;
        let events: usize = self.groups.iter().map(|g| g.events.len()).sum();
        Ok(Attached {
            source: Box::new(StatSource {
                counting,
                intervals: self.intervals,
                started: Instant::now(),
                at_stop: None,
            }),
            doing: Some(format!("counting {events} events")),
            note: None,
        })
    }
}

/// The counts at one moment of a run.
#[derive(Clone, Debug)]
pub struct StatBatch {
    pub counts: Counts,
    /// Seconds since counting began.
    pub at_s: f64,
    /// The run's totals (at the stop), not an interval's reading.
    pub last: bool,
}

struct StatSource {
    counting: Counting,
    intervals: bool,
    started: Instant,
    /// The totals read when collection stopped.
    at_stop: Option<StatBatch>,
}

impl StatSource {
    fn read(&self, last: bool) -> anyhow::Result<StatBatch> {
        Ok(StatBatch {
            counts: self.counting.read()?,
            at_s: self.started.elapsed().as_secs_f64(),
            last,
        })
    }
}

impl Source for StatSource {
    /// An interval's reading; none once collection stopped (the last drains come after the
    /// totals were read: a reading then would end an interval after the run's end).
    fn drain(&mut self, _flip: Flip, _wants: Wants, _procs: &mut Processes) -> anyhow::Result<Option<Batch>> {
        match self.intervals && self.at_stop.is_none() {
            true => Ok(Some(Batch::Stat(self.read(false)?))),
            false => Ok(None),
        }
    }

    /// The totals at the moment collection stopped: a command's, once it has exited.
    fn stopping(&mut self) {
        match self.read(true) {
            Ok(batch) => self.at_stop = Some(batch),
            Err(e) => log::warn!("reading the counters at the stop: {e}"),
        }
    }

    fn finish(&mut self, _stopped_ns: u64, _procs: &mut Processes) -> anyhow::Result<Option<Batch>> {
        Ok(self.at_stop.take().map(Batch::Stat))
    }
}
