//! The command line: a contract later modes and users rely on.
use std::{ffi::OsString, path::PathBuf};

use clap::{Args, Parser, Subcommand, ValueEnum};

mod events;
mod mode;
mod names;
mod sched;
pub use events::{
    LatencyArgs, ListArgs, RecordArgs, ReportOutput, ScopeArgs, ScriptArgs, StatArgs, TraceArgs,
};
pub use mode::Mode;
pub use names::NamesArgs;
pub use sched::{SchedArgs, SchedCommand, SchedMapArgs, SchedRecordArgs, TimehistArgs};

#[derive(Debug, Parser)]
#[command(
    name = "bpfprof",
    version,
    about = "eBPF profiler: hotspots, topdown, locks and scheduling latency",
    after_help = "Examples:\n  sudo bpfprof -a -d 10                      system-wide hotspots for 10 s\n  sudo bpfprof -p 1234 -o flame.svg          flamegraph of a running process (Ctrl-C stops)\n  sudo bpfprof -F 999 -- ./my-program args   profile a command from its first instruction\n  sudo bpfprof agent                         always-on system-wide profiling (pprof windows, HTTP)",
    after_long_help = EXIT_STATUS,
    args_conflicts_with_subcommands = true,
    propagate_version = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub subcommand: Option<Subcommands>,
    /// What to measure.
    #[arg(long, value_enum, default_value_t = Mode::Hotspot)]
    pub mode: Mode,
    /// Profile these processes (all their threads, and children they start during the run).
    #[arg(
        short = 'p',
        long = "pid",
        value_delimiter = ',',
        value_name = "PID[,PID...]",
        conflicts_with = "command"
    )]
    pub pids: Vec<u32>,
    /// Profile the whole system (the default when neither -p nor a command is given).
    #[arg(short = 'a', long = "all-cpus", conflicts_with = "pids")]
    pub system_wide: bool,
    /// Sampling frequency per CPU, in Hz (99 unless -c gives a period).
    #[arg(short = 'F', long = "freq", value_name = "HZ", conflicts_with = "period")]
    pub frequency: Option<u64>,
    /// Sample every N occurrences of the event instead (perf's -c): `-e branch-misses -c 1000`.
    #[arg(short = 'c', long = "count", value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub period: Option<u64>,
    /// Tracepoints and probes sampled with -e: each sample counts a number read at the hit
    /// instead of one: a function's argument (`arg1`..`arg6`) or return value (`retval`, a
    /// uretprobe's), a USDT probe's argument (`arg0`..), a tracepoint's field (`bytes`) or a
    /// global, as `record --fetch` reads them (`:TYPE` too). `-e uprobe:libc:malloc --weight
    /// arg1` gives the bytes asked, by call site.
    #[arg(long, value_name = "argN|retval|FIELD[:TYPE]", value_parser = parse_weight)]
    pub weight: Option<crate::counters::fetch::FetchSpec>,
    /// Tracepoints and probes sampled with -e: only the hits this filter passes count, up to 4
    /// comparisons joined by && of their number fields, arg1..arg6 or retval (`count > 4096`).
    #[arg(long, value_name = "EXPRESSION")]
    pub filter: Option<String>,
    /// Stop after this many seconds (default: at Ctrl-C, or when the command or targets exit).
    #[arg(short = 'd', long = "duration", value_name = "SECONDS", value_parser = parse_seconds)]
    pub duration: Option<f64>,
    /// Sampling event, in perf's event language: `cpu-clock` (the default: works everywhere),
    /// `cycles`, `instructions`, `branch-misses`, `cache-misses`, `L1-dcache-load-misses`, a
    /// software event (`page-faults`, `context-switches`, ...), a PMU's event by name
    /// (`l1d_cache_refill`, `armv8_pmuv3/inst_retired/`), by terms (`cpu/event=0xc4,umask=0/`) or raw
    /// (`r01c4`), with `:u`, `:k` or `:p`. `bpfprof list` shows what this machine has. Several
    /// (`-e cycles,instructions`, or -e again): one profile per event (hotspot).
    #[arg(
        short = 'e',
        long = "event",
        value_name = "EVENT",
        default_value = "cpu-clock"
    )]
    pub events: Vec<String>,
    /// Report format (default: from the -o extension, else text).
    #[arg(long, value_enum)]
    pub format: Option<Format>,
    /// Write the report here instead of standard output. Its extension picks the format: .txt,
    /// .json, .folded, .svg, .heatmap.svg, .pb.gz or .pprof (another is refused without --format).
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Sched mode: list each run-queue wait at least this long (milliseconds) with its culprits.
    #[arg(long = "slow-threshold", value_name = "MS", default_value_t = 10.0, value_parser = parse_millis)]
    pub slow_threshold_ms: f64,
    /// Sched mode: which stacks record where tasks block. `auto`: user stacks, plus kernel stacks
    /// for uninterruptible (I/O) sleeps and kernel threads, where the kernel is the reason; `all`:
    /// kernel stacks for every sleep too (a kernel stack walk costs ~3 us); `none`: off-CPU time
    /// per task only.
    #[arg(
        long = "offcpu-stacks",
        value_enum,
        value_name = "WHICH",
        default_value = "auto"
    )]
    pub offcpu_stacks: OffCpuStacks,
    /// Lock mode: where lock waits are seen. `futex`: contended waits in futex(2), which every
    /// glibc lock (mutex, rwlock, condition variable, semaphore) sleeps in; uncontended locks
    /// never enter the kernel, so they cost nothing (safe in production). `pthread`: probes on
    /// the target's pthread mutex, rwlock and condition-variable functions: hold times, and the
    /// exact stack that held the lock while others waited, at ~2.7 us per lock/unlock pair (needs
    /// -p or a command). `kernel`: the kernel's own lock contention (lock:contention_begin/end),
    /// with kernel stacks and lock types.
    #[arg(
        long = "lock-source",
        value_enum,
        value_name = "SOURCE",
        default_value = "futex"
    )]
    pub lock_source: LockSource,
    /// Lock mode: which waits the stack formats (svg, folded, pprof) carry. `contention`: waits for
    /// a lock another thread held (mutex, rwlock, spinlock, semaphore, kernel locks); `all`: also
    /// threads waiting for an event (condition variables, joins, barriers, bare futex queues).
    /// Text and JSON always show both, apart.
    #[arg(long, value_enum, value_name = "WHICH", default_value = "contention")]
    pub waits: Waits,
    /// How user stacks are walked when sampling. `tables`: with unwind tables built from each
    /// binary's `.eh_frame`, right without frame pointers (most distribution binaries), frame
    /// pointers where a binary has no table; `fp`: frame pointers only (cheaper, wrong for code
    /// built without them).
    #[arg(long, value_enum, value_name = "HOW", default_value = "tables")]
    pub unwind: Unwind,
    /// Hotspot: also attribute this counter's increments to the sampled stacks (repeatable, up to
    /// 8; any event `-e` takes): software events work everywhere, hardware ones need a PMU.
    #[arg(long = "counter", value_name = "EVENT")]
    pub counters_events: Vec<String>,
    /// Topdown mode: the counters counted over the whole run: `topdown` (this CPU family's level-1
    /// events and IPC), `branches`, `cache`, `tlb` (need a hardware PMU), or `software`
    /// (task-clock, context switches, migrations, page faults: work everywhere).
    #[arg(long, value_name = "SET",
          value_parser = clap::builder::PossibleValuesParser::new(crate::counters::events::PRESETS))]
    pub preset: Option<String>,
    /// Topdown mode: compute the report from a `perf stat -x,` CSV taken elsewhere (no BPF, no root).
    #[arg(long, value_name = "FILE")]
    pub counters: Option<PathBuf>,
    /// Topdown from counters: pipeline slots per cycle where the events do not say (Arm: the PMU's
    /// caps/slots; AMD Zen 5: 8).
    #[arg(long, value_name = "N")]
    pub slots: Option<u32>,
    /// Hotspot: instead of the report, where inside FUNCTION its samples landed: its hottest
    /// source lines and instructions (like `perf annotate`). An exact name, or part of one.
    #[arg(long, value_name = "FUNCTION")]
    pub annotate: Option<String>,
    #[command(flatten)]
    pub names: NamesArgs,
    /// Command to start and profile; bpfprof attaches first, so its first samples are captured.
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<OsString>,
}

/// One number, as `record --fetch` spells it.
fn parse_weight(text: &str) -> Result<crate::counters::fetch::FetchSpec, String> {
    match crate::counters::fetch::parse_list(text)?.as_slice() {
        [spec] => Ok(spec.clone()),
        _ => Err("one number".into()),
    }
}

#[derive(Debug, Subcommand)]
pub enum Subcommands {
    /// Always-on system-wide profiling: every window a pprof profile, written into a directory
    /// (with retention), served over HTTP (`/debug/pprof/profile?seconds=N`, `/metrics`) and
    /// optionally pushed to a Pyroscope-compatible server. Runs in the foreground (systemd).
    #[command(
        after_help = "Examples:\n  sudo bpfprof agent                               CPU, a window a minute, served on 127.0.0.1:7071\n  sudo bpfprof agent --signals all --window 15     CPU, off-CPU, run queue and locks, 15 s windows\n  sudo bpfprof agent --otlp http://collector:4317  export every window over OTLP/gRPC\n  go tool pprof -seconds 30 http://127.0.0.1:7071/debug/pprof/profile\n                                                   30 s of CPU, pulled from a running agent"
    )]
    Agent(AgentArgs),
    /// Compare two saved profiles (any mode with stacks: JSON, pprof or folded): a table of each
    /// function's time (or samples) before and after, its change and each profile's shares, the
    /// largest change first; or a differential flamegraph (`-o diff.svg`: red grew, blue shrank).
    #[command(
        after_help = "Examples:\n  bpfprof diff before.json after.json                the functions whose time changed most\n  bpfprof diff before.pb.gz after.pb.gz -o diff.svg  differential flamegraph (red grew, blue shrank)"
    )]
    Diff(DiffArgs),
    /// Render a saved profile again (`-o flame.svg`), or annotate one of its functions.
    #[command(
        after_help = "Examples:\n  bpfprof report run.json -o flame.svg        a saved profile as a flamegraph\n  bpfprof report run.json --annotate hot_loop  where inside hot_loop its samples landed"
    )]
    Report(ReportArgs),
    /// Live view: the hottest functions (or, with --mode sched/lock, the worst-waiting tasks or
    /// locks) refreshed every second in the terminal, like `perf top`. `q` or Ctrl-C quits.
    #[command(
        after_help = "Examples:\n  sudo bpfprof top                     the hottest functions, system-wide\n  sudo bpfprof top -p 1234 --mode lock  the locks a process waits on longest"
    )]
    Top(TopArgs),
    /// Count events over a command, processes or the whole system, as `perf stat` does: each
    /// counter with the share of the run it was on the PMU, derived metrics (IPC, miss rates),
    /// `-r N` runs as mean ± relative spread, `-I MS` intervals.
    #[command(
        after_help = "Examples:\n  sudo bpfprof stat -- ./prog                               the default counters of this machine\n  sudo bpfprof stat -e page-faults,minor-faults -r 5 -- ./prog  five runs, mean and spread\n  sudo bpfprof stat -e '{cpu_cycles,inst_retired}' -- ./prog    counted together (IPC)\n  sudo bpfprof stat -a -e context-switches -I 1000 -d 10     system-wide, a line a second"
    )]
    Stat(StatArgs),
    /// The system calls of a command, processes or the whole system, per thread: calls, errors
    /// by errno, total, average, shortest and longest time (like `perf trace -s`, `strace -c`),
    /// timed and summed in the kernel.
    #[command(
        after_help = "Examples:\n  sudo bpfprof trace -s -- dd if=/dev/zero of=/dev/null count=100k   a command's calls\n  sudo bpfprof trace -s -p 1234 -d 10                                a process for 10 s\n  sudo bpfprof trace -s --duration-min 10 -p 1234                    and each call of 10 ms or more, with its stack"
    )]
    Trace(TraceArgs),
    /// The time from each hit of one event to the next hit of another with the same key (the
    /// thread, or some of the tracepoints' fields): count, average, p50/p90/p99, longest and a
    /// histogram, summed in the kernel.
    #[command(
        after_help = "Examples:\n  sudo bpfprof latency --from syscalls:sys_enter_read --to syscalls:sys_exit_read -p 1234\n  sudo bpfprof latency --from block:block_rq_issue --to block:block_rq_complete --key dev,sector -a -d 10\n  sudo bpfprof latency --from uprobe:libc:malloc --to uretprobe:libc:malloc -- ./prog"
    )]
    Latency(LatencyArgs),
    /// Each hit of tracepoints and probes (every Nth with -c), with the tracepoint's fields or
    /// the values fetched at the probe, through a ring buffer (lost records counted): a line
    /// each, or JSON Lines that `bpfprof script` prints.
    #[command(
        after_help = "Examples:\n  sudo bpfprof record -e syscalls:sys_enter_openat --fetch filename:str -- ls\n                                      each openat with its fields, the file's name read\n  sudo bpfprof record -e uprobe:./prog:prog.c:42 --fetch count:s32 -o hits.json -- ./prog\n                                      each time line 42 runs, with the global `count`"
    )]
    Record(RecordArgs),
    /// The scheduler's events one by one, as perf sched shows them: `record` every switch,
    /// wake-up and migration into a file, then `timehist` (each run's wait, delay and run time)
    /// or `map` (which task each CPU ran).
    #[command(
        after_help = "Examples:\n  sudo bpfprof sched record -o sched.json -- ./prog   every switch of a command's run\n  bpfprof sched timehist sched.json -w -s             each run, wake-ups, a summary per task\n  bpfprof sched map sched.json                        which task each CPU ran"
    )]
    Sched(SchedArgs),
    /// The hits `bpfprof record -o FILE` saved, a line each, then their totals.
    #[command(after_help = "Examples:\n  bpfprof script hits.json             the saved hits, a line each")]
    Script(ScriptArgs),
    /// What this machine can count and sample: perf's generic, cache and software events, each
    /// PMU's own (Arm's architected events by name), tracepoints by subsystem.
    #[command(
        after_help = "Examples:\n  bpfprof list             everything\n  bpfprof list cache       names containing `cache`"
    )]
    List(ListArgs),
}

#[derive(Clone, Debug, Args)]
pub struct DiffArgs {
    /// The baseline profile.
    #[arg(value_name = "BEFORE")]
    pub before: PathBuf,
    /// The profile compared with it.
    #[arg(value_name = "AFTER")]
    pub after: PathBuf,
    /// Output format: text, svg, folded (`stack before after`, each profile's own counts) or json
    /// (default: from the -o extension, else text).
    #[arg(long, value_enum)]
    pub format: Option<Format>,
    /// Write here instead of standard output (the extension picks the format, as for a run).
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Functions listed in the table (and the JSON).
    #[arg(long, value_name = "N", default_value_t = 25)]
    pub limit: usize,
    /// Flamegraph: frames as wide as in AFTER (what runs now), or as in BEFORE (shows what is
    /// gone, too). Red grew and blue shrank either way.
    #[arg(long, value_enum, value_name = "WHICH", default_value = "after")]
    pub widths: Widths,
}

/// The modes the live view shows (topdown's counters need a whole run).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum TopMode {
    Hotspot,
    Sched,
    Lock,
}

impl TopMode {
    pub fn mode(self) -> Mode {
        match self {
            TopMode::Hotspot => Mode::Hotspot,
            TopMode::Sched => Mode::Sched,
            TopMode::Lock => Mode::Lock,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Widths {
    Before,
    After,
}

#[derive(Clone, Debug, Args)]
pub struct ReportArgs {
    /// A profile saved with -o (JSON, pprof or folded).
    #[arg(value_name = "PROFILE")]
    pub input: PathBuf,
    /// Where inside FUNCTION the samples landed (source lines, instructions).
    #[arg(long, value_name = "FUNCTION")]
    pub annotate: Option<String>,
    /// Output format (default: from the -o extension, else text).
    #[arg(long, value_enum)]
    pub format: Option<Format>,
    /// Write here instead of standard output (the extension picks the format, as for a run).
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Option<PathBuf>,
    #[command(flatten)]
    pub names: NamesArgs,
}

#[derive(Clone, Debug, Args)]
pub struct TopArgs {
    /// hotspot: the hottest functions; sched: the tasks waiting longest to run; lock: the locks
    /// waited on longest (futex).
    #[arg(long, value_enum, default_value_t = TopMode::Hotspot)]
    pub mode: TopMode,
    /// Only these processes (default: the whole system).
    #[arg(short = 'p', long = "pid", value_delimiter = ',', value_name = "PID[,PID...]")]
    pub pids: Vec<u32>,
    /// Sampling frequency per CPU, in Hz (hotspot).
    #[arg(short = 'F', long = "freq", default_value_t = 99, value_name = "HZ")]
    pub frequency: u64,
    /// Hotspot: sample every N occurrences of the event instead (perf's -c).
    #[arg(short = 'c', long = "count", value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub period: Option<u64>,
    /// Hotspot: the sampling event, in perf's event language (as the main command's -e).
    #[arg(
        short = 'e',
        long = "event",
        value_name = "EVENT",
        default_value = "cpu-clock"
    )]
    pub event: String,
    /// What each refresh shows: the last this many seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 5)]
    pub window: u32,
    /// Stop after this many seconds (default: at `q` or Ctrl-C).
    #[arg(short = 'd', long = "duration", value_name = "SECONDS", value_parser = parse_seconds)]
    pub duration: Option<f64>,
    /// Lock: `contention` (locks other threads held) or `all` (also waits for events: condition
    /// variables, joins, barriers).
    #[arg(long, value_enum, value_name = "WHICH", default_value = "contention")]
    pub waits: Waits,
    #[command(flatten)]
    pub names: NamesArgs,
}

#[derive(Clone, Debug, Args)]
pub struct AgentArgs {
    /// Sampling frequency per CPU, in Hz (low: the agent runs all the time).
    #[arg(short = 'F', long = "freq", default_value_t = 19, value_name = "HZ")]
    pub frequency: u64,
    /// Length of one profile window.
    #[arg(long, value_name = "SECONDS", default_value = "60", value_parser = parse_seconds)]
    pub window: f64,
    /// Where windows are written (`window-<unix ms>.pb.gz`, atomically).
    #[arg(long = "output-dir", value_name = "DIR", default_value = "/var/lib/bpfprof")]
    pub output_dir: PathBuf,
    /// Keep at most this many windows on disk (oldest removed first).
    #[arg(long, value_name = "N", default_value_t = 60)]
    pub keep: usize,
    /// Keep at most this many bytes of windows on disk (K, M, G suffixes).
    #[arg(long = "max-bytes", value_name = "BYTES", default_value = "256M", value_parser = parse_bytes)]
    pub max_bytes: u64,
    /// Serve the HTTP endpoint here (`off`: no endpoint).
    #[arg(long, value_name = "ADDR:PORT", default_value = "127.0.0.1:7071")]
    pub listen: String,
    /// Push each window to this Pyroscope-compatible server (`http://host:4040`: POST /ingest;
    /// https:// in a build with the `https` feature).
    #[arg(long, value_name = "URL")]
    pub push: Option<String>,
    /// Export each window, every signal, to this OTLP profiles endpoint: OTLP/HTTP
    /// (`http://collector:4318`; the path `/v1development/profiles` is added when none is given)
    /// or OTLP/gRPC (`http://collector:4317`).
    #[arg(long, value_name = "URL")]
    pub otlp: Option<String>,
    /// How --otlp speaks: `grpc` or `http` (protobuf over HTTP/1.1). Default: gRPC on port 4317,
    /// HTTP on any other.
    #[arg(long, value_enum, value_name = "PROTOCOL")]
    pub otlp_protocol: Option<OtlpProtocol>,
    /// The application name pushed windows are stored under (labels in braces allowed).
    #[arg(long = "push-name", value_name = "NAME", default_value = "bpfprof.cpu")]
    pub push_name: String,
    /// Windows waiting to be pushed (or exported) at most; beyond, the oldest is dropped (and
    /// counted).
    #[arg(long = "push-queue", value_name = "N", default_value_t = 8)]
    pub push_queue: usize,
    /// Headers sent with every push and export, one `Name: value` per line (e.g.
    /// `Authorization: Bearer …`, `X-Scope-OrgID: tenant`): read from a file, so no secret is on
    /// the command line.
    #[arg(long = "push-header-file", value_name = "FILE")]
    pub push_header_file: Option<PathBuf>,
    /// HTTP basic auth for every push and export: `user:password` on the file's first line.
    #[arg(long = "push-basic-auth-file", value_name = "FILE")]
    pub push_basic_auth_file: Option<PathBuf>,
    /// https: trust the certificates in this PEM file instead of the system's roots
    /// (/etc/ssl/certs/ca-certificates.crt, or SSL_CERT_FILE).
    #[arg(long = "push-ca", value_name = "FILE")]
    pub push_ca: Option<PathBuf>,
    /// Give up on one push (or export) attempt after this long.
    #[arg(long = "push-timeout", value_name = "SECONDS", default_value = "10", value_parser = parse_seconds)]
    pub push_timeout: f64,
    /// How user stacks are walked (see the main command's --unwind).
    #[arg(long, value_enum, value_name = "HOW", default_value = "tables")]
    pub unwind: Unwind,
    /// What each window profiles, comma-separated: `cpu` (on-CPU stacks), `offcpu` (time asleep
    /// by stack), `runqueue` (time waiting for a CPU, per thread), `lock` (futex waits by lock
    /// and stack), `counters` (on-CPU stacks weighted by the cycles and instructions they ran:
    /// IPC per function; needs a hardware PMU), or `all` (every one but counters).
    #[arg(long, value_name = "LIST", default_value = "cpu", value_parser = parse_signals)]
    pub signals: Signals,
    /// Off-CPU stacks: each thread's first 1000 sleeps of every second have theirs taken; past
    /// them, one sleep in N drawn at random, whose stacks stand for the others' time (each
    /// thread's total stays exact; sleeps of 1 ms or more that were not drawn are shown apart,
    /// as "stack not sampled"). 1: every sleep's stacks, as sched mode takes them.
    #[arg(long = "offcpu-sample", value_name = "N", default_value_t = 16,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub offcpu_sample: u32,
    /// Testing: entries of the kernel's sample map (to prove a full map is reported).
    #[arg(long = "sample-map-entries", value_name = "N", hide = true)]
    pub sample_map_entries: Option<u32>,
    #[command(flatten)]
    pub names: NamesArgs,
}

/// The exit codes, for scripts (`--help` and the README).
pub const EXIT_STATUS: &str = "Exit status:\n  0      the run finished and its report was written (or the agent stopped on SIGTERM/Ctrl-C)\n  1      it failed: the message says why and what to do\n  2      the command line was wrong\n  126    the command after -- was found but could not be run\n  127    the command after -- was not found\n  N      with a command after --, that command's own exit status\n  128+N  with a command after --, that command was killed by signal N (or it outlived SIGTERM\n         and was left running: N is the signal that stopped bpfprof)";

/// The two transports of OTLP.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum OtlpProtocol {
    Grpc,
    Http,
}

/// What an agent window holds a profile of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Signal {
    Cpu,
    OffCpu,
    RunQueue,
    Lock,
    /// On-CPU stacks weighted by the cycles and instructions read at each sample (needs a PMU).
    Counters,
}

impl Signal {
    pub const ALL: [Signal; 5] = [
        Signal::Cpu,
        Signal::OffCpu,
        Signal::RunQueue,
        Signal::Lock,
        Signal::Counters,
    ];
    /// What `all` asks for: every signal that works on any machine (`counters` needs a PMU).
    pub const EVERYWHERE: [Signal; 4] = [Signal::Cpu, Signal::OffCpu, Signal::RunQueue, Signal::Lock];

    pub fn name(self) -> &'static str {
        match self {
            Signal::Cpu => "cpu",
            Signal::OffCpu => "offcpu",
            Signal::RunQueue => "runqueue",
            Signal::Lock => "lock",
            Signal::Counters => "counters",
        }
    }

    /// By its name, or another spelling users reach for.
    pub fn parse(name: &str) -> Option<Signal> {
        match name {
            "off-cpu" => Some(Signal::OffCpu),
            "run-queue" => Some(Signal::RunQueue),
            "locks" | "mutex" => Some(Signal::Lock),
            name => Signal::ALL.into_iter().find(|s| s.name() == name),
        }
    }
}

/// The agent's signals: each window is one profile per signal.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Signals {
    pub cpu: bool,
    pub offcpu: bool,
    pub runqueue: bool,
    pub lock: bool,
    pub counters: bool,
}

impl Signals {
    /// The scheduler's programs are needed.
    pub fn sched(self) -> bool {
        self.offcpu || self.runqueue
    }

    pub fn has(self, signal: Signal) -> bool {
        match signal {
            Signal::Cpu => self.cpu,
            Signal::OffCpu => self.offcpu,
            Signal::RunQueue => self.runqueue,
            Signal::Lock => self.lock,
            Signal::Counters => self.counters,
        }
    }

    fn add(&mut self, signal: Signal) {
        match signal {
            Signal::Cpu => self.cpu = true,
            Signal::OffCpu => self.offcpu = true,
            Signal::RunQueue => self.runqueue = true,
            Signal::Lock => self.lock = true,
            Signal::Counters => self.counters = true,
        }
    }

    pub fn names(self) -> Vec<&'static str> {
        Signal::ALL
            .into_iter()
            .filter(|s| self.has(*s))
            .map(Signal::name)
            .collect()
    }
}

fn parse_signals(s: &str) -> Result<Signals, String> {
    let mut signals = Signals::default();
    for name in s.split(',').map(str::trim) {
        match (name, Signal::parse(name)) {
            ("all", _) => Signal::EVERYWHERE.into_iter().for_each(|s| signals.add(s)),
            (_, Some(signal)) => signals.add(signal),
            (other, None) => {
                let names: Vec<&str> = Signal::ALL.iter().map(|s| s.name()).collect();
                return Err(format!(
                    "`{other}` is not a signal: give {} or all (comma-separated)",
                    names.join(", ")
                ));
            }
        }
    }
    Ok(signals)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LockSource {
    Futex,
    Pthread,
    Kernel,
}

impl LockSource {
    pub fn name(self) -> &'static str {
        match self {
            LockSource::Futex => "futex",
            LockSource::Pthread => "pthread",
            LockSource::Kernel => "kernel",
        }
    }
}

/// Lock mode: which waits a view of stacks carries (see `--waits`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Waits {
    #[default]
    Contention,
    All,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Unwind {
    Tables,
    Fp,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum OffCpuStacks {
    None,
    Auto,
    All,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Text,
    Json,
    Folded,
    Svg,
    Pprof,
    /// Sched mode: latency heatmap (time across, wait buckets up).
    Heatmap,
}

impl Format {
    pub fn name(self) -> &'static str {
        match self {
            Format::Text => "text",
            Format::Json => "json",
            Format::Folded => "folded",
            Format::Svg => "svg",
            Format::Pprof => "pprof",
            Format::Heatmap => "heatmap",
        }
    }

    /// The format an output path asks for by its extension: `None` for a name without one; an
    /// extension no format has is refused, listing those that exist.
    pub fn from_path(path: &std::path::Path) -> Result<Option<Format>, String> {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().to_ascii_lowercase())
            .unwrap_or_default();
        if let Some((_, format)) = EXTENSIONS.iter().find(|(ext, _)| name.ends_with(ext)) {
            return Ok(Some(*format));
        }
        match path.extension() {
            None => Ok(None),
            Some(ext) => Err(format!(
                "-o {}: bpfprof writes no `.{}` files: end the name in {} (or give --format)",
                path.display(),
                ext.to_string_lossy(),
                EXTENSIONS.map(|(ext, _)| ext).join(", ")
            )),
        }
    }
}

/// The output extensions and the format each writes (longest first where one ends another).
const EXTENSIONS: [(&str, Format); 7] = [
    (".txt", Format::Text),
    (".json", Format::Json),
    (".folded", Format::Folded),
    (".heatmap.svg", Format::Heatmap),
    (".svg", Format::Svg),
    (".pb.gz", Format::Pprof),
    (".pprof", Format::Pprof),
];

impl Cli {
    /// The format the report will be written in.
    pub fn resolved_format(&self) -> Result<Format, crate::error::UserError> {
        format_for(self.format, self.output.as_deref())
    }
}

pub(crate) fn parse_millis(s: &str) -> Result<f64, String> {
    match s.trim_end_matches("ms").parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!("`{s}` is not a duration in milliseconds")),
    }
}

/// Format from `--format`, else the output's extension, else text. An extension that names no
/// format is a usage error (it used to write text silently), unless `--format` says what to write.
pub fn format_for(
    format: Option<Format>,
    output: Option<&std::path::Path>,
) -> Result<Format, crate::error::UserError> {
    let from_path = match (format, output) {
        (None, Some(path)) => Format::from_path(path).map_err(crate::error::UserError::Usage)?,
        _ => None,
    };
    Ok(format.or(from_path).unwrap_or(Format::Text))
}

/// A size in bytes: a number with an optional K, M or G (powers of 1024).
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let upper = s.trim().to_ascii_uppercase();
    let digits = upper.trim_end_matches(['B', 'I']);
    let (number, shift) = match digits.char_indices().last() {
        Some((i, 'K')) => (&digits[..i], 10),
        Some((i, 'M')) => (&digits[..i], 20),
        Some((i, 'G')) => (&digits[..i], 30),
        _ => (digits, 0),
    };
    number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(1 << shift))
        .filter(|&n| n > 0)
        .ok_or_else(|| format!("`{s}` is not a size (a positive number of bytes, e.g. 500M or 2G)"))
}

fn parse_seconds(s: &str) -> Result<f64, String> {
    let trimmed = s.strip_suffix('s').unwrap_or(s);
    match trimmed.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v <= 366.0 * 86400.0 => Ok(v),
        _ => Err(format!(
            "`{s}` is not a duration in seconds (a positive number, e.g. 10 or 0.5)"
        )),
    }
}

#[cfg(test)]
mod tests;
