//! `--mode`: what a run measures, and the commands with their own command line that run as
//! one.
use clap::ValueEnum;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    Hotspot,
    Topdown,
    Lock,
    Sched,
    /// `bpfprof stat`, which has its own command line.
    #[value(skip)]
    Stat,
    /// `bpfprof trace`, which has its own command line.
    #[value(skip)]
    Trace,
    /// `bpfprof latency`, which has its own command line.
    #[value(skip)]
    Latency,
    /// `bpfprof record`, which has its own command line.
    #[value(skip)]
    Record,
    /// `bpfprof sched record`, which has its own command line.
    #[value(skip)]
    SchedRecord,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Hotspot => "hotspot",
            Mode::Topdown => "topdown",
            Mode::Lock => "lock",
            Mode::Sched => "sched",
            Mode::Stat => "stat",
            Mode::Trace => "trace",
            Mode::Latency => "latency",
            Mode::Record => "record",
            Mode::SchedRecord => "sched record",
        }
    }
}
