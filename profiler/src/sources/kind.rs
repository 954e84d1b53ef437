//! The kinds of kernel data: a leaf, so that whatever is declared per source (health counters)
//! can name its source without depending on the sources themselves.

/// The kinds of kernel data, in the order the start path attaches them: the lock probes first
/// (they are placed before anything counts), the sampler before the counters read at each sample
/// (see `samples`), the scheduler last but for the counters' totals, so its thread states and
/// those totals cover the same run; `stat`'s counters (and their counts per value) and the system-call summary last of all, just before
/// a command is let run, `record`'s after them, then `sched record`'s.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Locks,
    CpuSamples,
    Sched,
    Counting,
    Stat,
    Values,
    Syscalls,
    Latency,
    Records,
    Timeline,
}
