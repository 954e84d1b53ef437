//! Every kind of kernel data bpfprof collects is a [`Source`], one module each:
//! - [`samples`]: CPU samples (stacks on a perf event, with the counters read at each sample);
//! - [`sched`]: the scheduler's thread states, run-queue waits and off-CPU stacks;
//! - [`locks`]: lock waits (futex, pthread probes or the kernel's contention tracepoints);
//! - [`counting`]: topdown's counter totals over the whole run;
//! - [`stat`]: any events counted over the run, as `perf stat` counts them;
//! - [`values`]: tracing events' hits counted per value of one of their numbers (`stat --by`);
//! - [`syscalls`]: every system call of the targets, timed and summed per thread, call and errno;
//! - [`latency`]: the time from each hit of one event to the next of another, as a histogram;
//! - [`records`]: each sampled hit of tracing events, whole, with what was fetched there;
//! - [`timeline`]: the scheduler's events one by one, with the kernel's figures at each.
//!
//! A source's [`Spec`] is what it needs (a value decided before anything is loaded: the globals
//! and maps it sets, checked by unit tests without root); the start path attaches it, in the
//! order of [`Kind`]; at each epoch flip it drains into a [`Batch`], and at the stop it settles
//! what is still in flight. [`MODE_SOURCES`] and [`SIGNAL_SOURCES`] say which sources each
//! `--mode` and each agent signal uses. A run, `top` and the agent differ only in the sink the
//! batches go to: a new kind of data is a new module, one [`Kind`] and one line in the table.
use crate::{
    bpf::{LoadOptions, Loaded},
    cli::{Mode, Signal},
    collect::Flip,
    process::Processes,
    profile::{Health, RawSample},
};

pub mod counting;
pub mod hooks;
pub mod kind;
pub mod latency;
pub mod locks;
pub mod records;
pub mod samples;
pub mod sched;
pub mod stat;
pub mod syscalls;
pub mod timeline;
pub mod values;

pub use kind::Kind;

/// Which sources each mode uses. Topdown samples only where its counter set can be counted (it
/// then splits the counts by function).
pub const MODE_SOURCES: [(Mode, &[Kind]); 9] = [
    (Mode::Hotspot, &[Kind::CpuSamples]),
    (Mode::Topdown, &[Kind::CpuSamples, Kind::Sched, Kind::Counting]),
    (Mode::Lock, &[Kind::Locks]),
    (Mode::Sched, &[Kind::Sched]),
    (Mode::Stat, &[Kind::Stat, Kind::Values]),
    (Mode::Trace, &[Kind::Syscalls]),
    (Mode::Latency, &[Kind::Latency]),
    (Mode::Record, &[Kind::Records]),
    (Mode::SchedRecord, &[Kind::Timeline]),
];

/// Which source each of the agent's signals is a view of.
pub const SIGNAL_SOURCES: [(Signal, Kind); 5] = [
    (Signal::Cpu, Kind::CpuSamples),
    (Signal::Counters, Kind::CpuSamples),
    (Signal::OffCpu, Kind::Sched),
    (Signal::RunQueue, Kind::Sched),
    (Signal::Lock, Kind::Locks),
];

/// The source an agent signal is a view of.
pub fn kind_of_signal(signal: Signal) -> Kind {
    SIGNAL_SOURCES
        .iter()
        .find(|(s, _)| *s == signal)
        .map(|(_, kind)| *kind)
        .expect("every signal is in the table")
}

/// The sources a mode uses.
pub fn of_mode(mode: Mode) -> &'static [Kind] {
    MODE_SOURCES
        .iter()
        .find(|(m, _)| *m == mode)
        .map_or(&[], |(_, kinds)| kinds)
}

/// The sources a set of agent signals uses, each once, in attach order.
pub fn of_signals(signals: &[Signal]) -> Vec<Kind> {
    let mut kinds: Vec<Kind> = SIGNAL_SOURCES
        .iter()
        .filter(|(s, _)| signals.contains(s))
        .map(|(_, kind)| *kind)
        .collect();
    kinds.sort();
    kinds.dedup();
    kinds
}

/// One source's settings, decided before anything is loaded.
pub enum Spec {
    CpuSamples(samples::Spec),
    Sched(sched::Spec),
    Locks(locks::Spec),
    Counting(Box<counting::TopdownCounting>),
    Stat(stat::Spec),
    Values(values::Spec),
    Syscalls(syscalls::Spec),
    Latency(Box<latency::Spec>),
    Records(records::Spec),
    Timeline(timeline::Spec),
}

impl Spec {
    pub fn kind(&self) -> Kind {
        match self {
            Spec::CpuSamples(_) => Kind::CpuSamples,
            Spec::Sched(_) => Kind::Sched,
            Spec::Locks(_) => Kind::Locks,
            Spec::Counting(_) => Kind::Counting,
            Spec::Stat(_) => Kind::Stat,
            Spec::Values(_) => Kind::Values,
            Spec::Syscalls(_) => Kind::Syscalls,
            Spec::Latency(_) => Kind::Latency,
            Spec::Records(_) => Kind::Records,
            Spec::Timeline(_) => Kind::Timeline,
        }
    }

    /// Whether it walks user stacks: a run where none does needs no unwind tables, nor the
    /// programs that see code mapped (on every mmap of the machine), each run of which could
    /// be one where the kernel skips another of ours (`program_runs_missed`).
    pub fn walks_user_stacks(&self) -> bool {
        match self {
            Spec::Counting(_) | Spec::Stat(_) | Spec::Values(_) => false,
            Spec::Syscalls(spec) => spec.slow_ns.is_some(),
            Spec::Latency(spec) => spec.slow_ns.is_some(),
            Spec::CpuSamples(_) | Spec::Sched(_) | Spec::Locks(_) | Spec::Records(_) | Spec::Timeline(_) => {
                true
            }
        }
    }

    /// What it needs of the system, resolved before anything is loaded: the kernel's offsets
    /// (sched), each target's lock library (pthread). `command`: a command started paused, with
    /// the program it runs.
    pub fn prepare(&mut self, pids: &[u32], command: Option<(u32, &std::path::Path)>) -> anyhow::Result<()> {
        match self {
            Spec::Sched(spec) => Ok(spec.prepare()?),
            Spec::Timeline(spec) => Ok(spec.prepare()?),
            Spec::Locks(spec) => spec.prepare(pids, command),
            Spec::CpuSamples(_)
            | Spec::Counting(_)
            | Spec::Stat(_)
            | Spec::Values(_)
            | Spec::Syscalls(_)
            | Spec::Latency(_)
            | Spec::Records(_) => Ok(()),
        }
    }

    /// What it sets before the object is loaded: its globals, the maps it uses.
    pub fn needs(&self, options: &mut LoadOptions<'_>) {
        match self {
            Spec::CpuSamples(spec) => spec.needs(options),
            Spec::Sched(spec) => spec.needs(options),
            Spec::Locks(spec) => spec.needs(options),
            Spec::Stat(spec) => spec.needs(options),
            Spec::Values(spec) => spec.needs(options),
            Spec::Syscalls(spec) => spec.needs(options),
            Spec::Latency(spec) => spec.needs(options),
            Spec::Records(spec) => spec.needs(options),
            Spec::Timeline(spec) => spec.needs(options),
            Spec::Counting(_) => {}
        }
    }

    /// Attach its programs and take its maps; its line of what the run does, if it says one.
    pub fn attach(self, kernel: &mut Loaded, context: &AttachContext<'_>) -> anyhow::Result<Attached> {
        match self {
            Spec::CpuSamples(spec) => spec.attach(kernel, context),
            Spec::Sched(spec) => spec.attach(kernel, context),
            Spec::Locks(spec) => spec.attach(kernel, context),
            Spec::Counting(counting) => counting::attach(*counting, kernel),
            Spec::Stat(spec) => spec.attach(kernel, context),
            Spec::Values(spec) => spec.attach(kernel, context),
            Spec::Syscalls(spec) => spec.attach(kernel, context),
            Spec::Latency(spec) => (*spec).attach(kernel, context),
            Spec::Records(spec) => spec.attach(kernel, context),
            Spec::Timeline(spec) => spec.attach(kernel, context),
        }
    }
}

/// What attaching a source needs to know of the run besides its own settings.
pub struct AttachContext<'a> {
    /// The whole system is the target.
    pub system_wide: bool,
    /// The `-p` targets (a source may read their threads or map their libraries).
    pub pids: &'a [u32],
    /// A command started paused (its pid).
    pub command: Option<u32>,
    /// User stacks are walked through unwind tables where a process has them.
    pub unwind_tables: bool,
}

/// A source once attached, what it tells the user it does ("sampling at 99 Hz"), and what a
/// report must say of how its figures were taken.
pub struct Attached {
    pub source: Box<dyn Source>,
    pub doing: Option<String>,
    pub note: Option<String>,
}

/// What a sink asks of a drain beyond what ended since the last one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Wants {
    /// What the kernel holds now of things still going: each live thread's scheduler record
    /// (so far), the threads joins wait for.
    pub current: bool,
}

/// What one drain hands on, by kind.
#[allow(clippy::large_enum_variant)]
pub enum Batch {
    /// On-CPU samples recorded since the last drain.
    Samples(Vec<RawSample>),
    /// The scheduler's records since the last drain.
    Sched(sched::SchedBatch),
    /// Lock waits (since the last drain, or all of them at the end).
    Locks(locks::LockBatch),
    /// Topdown's counter totals, at the end.
    Counts(Box<counting::TopdownCounting>),
    /// `stat`'s counts: at each drain when intervals are wanted, and at the end.
    Stat(stat::StatBatch),
    /// `stat --by`'s counts per value, at the end.
    Values(values::ValueBatch),
    /// The system-call summary, at the end.
    Syscalls(syscalls::SyscallBatch),
    /// `latency`'s histogram, at the end.
    Latency(latency::LatencyBatch),
    /// `record`'s hits since the last drain (at the end, with the run's totals).
    Records(records::RecordBatch),
    /// `sched record`'s events since the last drain (at the end, with the events lost).
    Timeline(timeline::TimelineBatch),
}

/// One kind of kernel data, attached: drained at each epoch flip, settled at the stop.
pub trait Source {
    /// What it recorded since the last drain (the epoch just switched to `flip`); nothing for a
    /// source read only at the end (`finish`).
    fn drain(&mut self, _flip: Flip, _wants: Wants, _procs: &mut Processes) -> anyhow::Result<Option<Batch>> {
        Ok(None)
    }
    /// Collection stopped: read what must be read at that very moment (before the last drains).
    fn stopping(&mut self) {}
    /// After the last drains, with everything still attached: what is still in flight, as it
    /// stands at `stopped_ns`.
    fn finish(&mut self, _stopped_ns: u64, _procs: &mut Processes) -> anyhow::Result<Option<Batch>> {
        Ok(None)
    }
    /// What only user space knows of the run, into the run's health.
    fn add_health(&self, _health: &mut Health) {}
    /// What the report must say of the run's figures, read at its end (with everything still
    /// attached).
    fn notes(&self) -> Vec<String> {
        Vec::new()
    }
}

#[cfg(test)]
mod tests;
