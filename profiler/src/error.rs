//! Errors a user sees: each says what went wrong and what to do next. Printed once, by `main`.
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UserError {
    #[error("bpfprof needs root (or CAP_BPF and CAP_PERFMON) to load BPF programs: run it with sudo")]
    NotPrivileged,
    #[error("no process with pid {0}: check the pid with `ps -p {0}`")]
    NoSuchProcess(u32),
    #[error("command not found: {0}")]
    CommandNotFound(String),
    #[error("cannot run {command}: {reason}")]
    CommandFailed { command: String, reason: String },
    #[error("-F {given}: the sampling frequency must be between 1 and {max} Hz (kernel.perf_event_max_sample_rate)")]
    BadFrequency { given: u64, max: u64 },
    #[error("event `{event}` needs a hardware PMU, and this machine has none (typical of VMs without a virtual PMU): use `-e cpu-clock`")]
    NoPmu { event: String },
    #[error("--signals counters needs a hardware PMU (it reads cycles and instructions at each sample), and this machine cannot count them: {0}. Leave counters out of --signals")]
    NoPmuForCounters(String),
    #[error("cannot write the report to {}: {reason}", path.display())]
    Output { path: PathBuf, reason: String },
    #[error("tracefs is not mounted and could not be mounted at /sys/kernel/tracing ({0}): run `mount -t tracefs nodev /sys/kernel/tracing`")]
    NoTracefs(String),
    #[error("this kernel has no usable BTF ({0}); the sched and topdown modes need it to read the scheduler's task_struct: use a kernel built with CONFIG_DEBUG_INFO_BTF=y (a file named by BPFPROF_BTF gives the offsets only: the programs also need the kernel's own /sys/kernel/btf/vmlinux; hotspot mode works without it)")]
    NoBtf(String),
    #[error("format `{format}` is not available for mode {mode}")]
    FormatUnavailable {
        format: &'static str,
        mode: &'static str,
    },
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    Event(#[from] crate::counters::language::EventError),
    #[error("cannot read the profile {}: {reason}; give a profile saved with -o (.json, .pb.gz or .folded)", path.display())]
    SavedProfile { path: PathBuf, reason: String },
    #[error("cannot keep windows in {}: {reason}; pick another directory with --output-dir", path.display())]
    OutputDir { path: PathBuf, reason: String },
    #[error("cannot serve the endpoint on {address}: {reason}; pick another with --listen ADDR:PORT, or --listen off")]
    Listen { address: String, reason: String },
    #[error("cannot use the counters in {}: {reason}", path.display())]
    Counters { path: PathBuf, reason: String },
    #[error("{0}: pick another --preset, or --preset software for counters that work everywhere")]
    Counting(String),
    #[error("--lock-source pthread: {target} has no pthread lock functions to probe (looked in: {searched}); a statically linked binary without symbols has none. Use --lock-source futex, which needs no symbols")]
    NoPthread { target: String, searched: String },
}

/// Process exit codes, for scripts.
pub mod exit {
    pub const OK: i32 = 0;
    pub const FAILURE: i32 = 1;
    pub const USAGE: i32 = 2;
    /// Found but not run (the exec failed: permissions, format), as a shell says.
    pub const COMMAND_NOT_RUN: i32 = 126;
    pub const COMMAND_NOT_FOUND: i32 = 127;
    /// Interrupted (SIGINT) or terminated (SIGTERM), as a shell says of a process that died of it:
    /// for a command left running, whose own status is not known.
    pub const INTERRUPTED: i32 = 130;
    pub const TERMINATED: i32 = 143;
}

impl UserError {
    pub fn exit_code(&self) -> i32 {
        match self {
            UserError::CommandNotFound(_) => exit::COMMAND_NOT_FOUND,
            UserError::CommandFailed { .. } => exit::COMMAND_NOT_RUN,
            UserError::BadFrequency { .. }
            | UserError::Usage(_)
            | UserError::Event(_)
            // The profile given is the problem, as a bad argument is.
            | UserError::SavedProfile { .. }
            | UserError::FormatUnavailable { .. } => exit::USAGE,
            _ => exit::FAILURE,
        }
    }
}
