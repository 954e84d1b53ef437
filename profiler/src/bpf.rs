//! Loading the embedded kernel programs, setting their globals and attaching them. Everything
//! attached belongs to [`Loaded`]; dropping it detaches and unloads, on every exit path.
use std::path::Path;

use anyhow::Context as _;
use aya::{
    maps::{HashMap as BpfHashMap, MapData, PerCpuArray},
    programs::{
        perf_event::{HardwareEvent, PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent},
        uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeScope},
        PerfEvent, ProgramError, RawTracePoint, TracePoint, UProbe,
    },
    Ebpf, EbpfLoader,
};
use profiler_common::{
    lock::ThreadOffsets, names, offcpu_stacks, CounterDeltas, ExitOffsets, ForkOffsets, TaskOffsets,
};

use std::os::fd::{AsFd as _, AsRawFd as _};

use crate::{
    cli::{Event, LockSource, OffCpuStacks},
    collect::take_map,
    counters::counting::{Counting, CountingError, Scope},
    counters::events::{EventSpec, Pmu, Source},
    error::UserError,
    modes::lock::probes::LockLibrary,
    preflight::tracepoint_field_offset,
};

static BPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/profiler"));

pub struct Loaded {
    pub ebpf: Ebpf,
    targets: BpfHashMap<MapData, u32, u8>,
    /// Per-CPU counting events the sampling program reads; closed with everything else.
    counters: Option<Counting>,
    /// The table walkers' slots (taken out of `ebpf`, so kept here while they run).
    unwind_programs: Vec<aya::maps::ProgramArray<MapData>>,
    /// The programs' log ring (aya-log), until the driver watches it.
    pub kernel_logs: Option<KernelLogs>,
}

/// The reader of the programs' log lines, which it writes to bpfprof's own log.
pub type KernelLogs = aya_log::EbpfLogger<&'static dyn log::Log>;

/// The kernel programs' log level: the user side's (`RUST_LOG`), as aya-log numbers it (the same
/// numbers as `log::LevelFilter`: 0 off, 1 error ... 4 debug, 5 trace).
fn kernel_log_level() -> u8 {
    log::max_level() as usize as u8
}

/// Field offsets of the sched tracepoints on the running kernel.
pub fn tracepoint_offsets(tracefs: &Path) -> anyhow::Result<(ForkOffsets, ExitOffsets)> {
    let field = |event: &str, name: &str| {
        tracepoint_field_offset(tracefs, "sched", event, name)
            .with_context(|| format!("sched:{event} has no field `{name}` in its tracefs format"))
    };
    let fork = ForkOffsets {
        parent_pid: field("sched_process_fork", "parent_pid")?,
        child_pid: field("sched_process_fork", "child_pid")?,
    };
    let exit = ExitOffsets {
        pid: field("sched_process_exit", "pid")?,
        group_dead: tracepoint_field_offset(tracefs, "sched", "sched_process_exit", "group_dead")
            .unwrap_or(u32::MAX),
    };
    Ok((fork, exit))
}

/// Where the running kernel keeps the `task_struct` fields the raw sched tracepoints read.
pub fn task_offsets() -> Result<TaskOffsets, UserError> {
    let no_btf = |reason: String| UserError::NoBtf(reason);
    let path = crate::btf::kernel_btf_path();
    let btf = crate::btf::Btf::from_file(&path).map_err(|e| no_btf(format!("{e:#}")))?;
    let field = |name: &str| {
        btf.member_offset("task_struct", name)
            .ok_or_else(|| no_btf(format!("task_struct has no field `{name}` in {}", path.display())))
    };
    let switch_params = btf
        .fn_pointer_params("btf_trace_sched_switch")
        .ok_or_else(|| no_btf("the kernel's BTF does not describe the sched_switch tracepoint".into()))?;
    let nested = |outer: &str, inner_type: &str, inner: &str| {
        Some(btf.member_offset("task_struct", outer)? + btf.member_offset(inner_type, inner)?)
    };
    let (sched_info, sum_exec_runtime) = match (
        nested("sched_info", "sched_info", "pcount"),
        nested("sched_info", "sched_info", "run_delay"),
        nested("se", "sched_entity", "sum_exec_runtime"),
    ) {
        // The tests' and benchmarks' way to run the fallback on a kernel that has the fields.
        _ if std::env::var_os("BPFPROF_TRACEPOINT_CLOCKS").is_some() => (0, 0),
        // Read as one `SchedInfoHead`, as every kernel since 2.6 lays them out.
        (Some(pcount), Some(run_delay), Some(sum_exec_runtime)) if run_delay == pcount + 8 => {
            (pcount, sum_exec_runtime)
        }
        _ => (0, 0),
    };
    Ok(TaskOffsets {
        pid: field("pid")?,
        comm: field("comm")?,
        // `state` became `__state` in 5.14.
        state: field("__state").or_else(|_| field("state"))?,
        // The probe's data pointer, preempt, prev, next[, prev_state (5.18 and later)].
        switch_has_state_arg: u32::from(switch_params >= 5),
        sched_info,
        sum_exec_runtime,
        tgid: field("tgid")?,
        _pad: 0,
    })
}

/// What a report says when the kernel's own run-queue and CPU accounting cannot be read.
pub const TRACEPOINT_CLOCKS_NOTE: &str = "run-queue delay and running time are timed at the scheduler \
     tracepoints (a few microseconds from the kernel's own figures per switch): this kernel's BTF has no \
     task_struct.sched_info.pcount and run_delay or se.sum_exec_runtime (CONFIG_SCHED_INFO off?)";

/// Offset of `task_struct.nvcsw` in the running kernel, if its BTF says.
pub fn nvcsw_offset() -> Option<u32> {
    let btf = crate::btf::Btf::from_file(&crate::btf::kernel_btf_path()).ok()?;
    btf.member_offset("task_struct", "nvcsw")
}

/// Where the running kernel keeps the `task_struct` fields the futex source reads at thread
/// creation (to tell a join). Without them (no BTF, or a kernel without the field) joins are told
/// from their stacks only.
pub fn thread_offsets() -> ThreadOffsets {
    let unknown = ThreadOffsets {
        clear_child_tid: u32::MAX,
        ..Default::default()
    };
    let Ok(btf) = crate::btf::Btf::from_file(&crate::btf::kernel_btf_path()) else {
        return unknown;
    };
    let field = |name: &str| btf.member_offset("task_struct", name);
    match (field("clear_child_tid"), field("tgid"), field("pid")) {
        (Some(clear_child_tid), Some(tgid), Some(pid)) => ThreadOffsets {
            clear_child_tid,
            tgid,
            pid,
            _pad: 0,
        },
        _ => unknown,
    }
}

/// What to load for a run.
pub struct LoadOptions<'a> {
    /// The sampling program and its stack maps are used.
    pub sampling: bool,
    /// The sched programs and their maps are used, with these `task_struct` offsets (from BTF:
    /// see `task_offsets`).
    pub sched: Option<TaskOffsets>,
    /// Keep only processes in the target set (else: the whole system).
    pub filter: bool,
    /// Sched mode: waits at least this long are reported one by one.
    pub slow_threshold_ns: u64,
    /// Sched mode: record where tasks block (two stack walks per sleep).
    pub offcpu_stacks: OffCpuStacks,
    /// How many counters' deltas the sampling program reads.
    pub counters: u32,
    /// User stacks of processes with unwind tables are walked through them.
    pub unwind_tables: bool,
    /// Lock mode: the programs and maps of this source are used.
    pub lock: Option<LockSource>,
    /// pthread source: offset of `task_struct.nvcsw` (from BTF), to tell a lock call that slept.
    pub nvcsw_offset: Option<u32>,
    /// Entries of each sample map, where not the default (a test of a full map).
    pub sample_map_entries: Option<u32>,
    pub tracefs: &'a Path,
}

impl LoadOptions<'_> {
    /// Sched mode records where threads go to sleep.
    fn offcpu_stacks(&self) -> bool {
        self.sched.is_some() && self.offcpu_stacks != OffCpuStacks::None
    }

    /// Some user stack (sampled, where a thread sleeps, or at a lock) is walked through unwind
    /// tables.
    pub fn walks_tables(&self) -> bool {
        self.unwind_tables
            && (self.sampling
                || self.offcpu_stacks()
                || matches!(self.lock, Some(LockSource::Futex | LockSource::Pthread)))
    }
}

/// Maps a run does not use shrink to one entry, so they cost (almost) no kernel memory.
fn unused_maps(options: &LoadOptions<'_>) -> Vec<&'static str> {
    let mut unused = Vec::new();
    if !options.sampling {
        unused.extend(names::SAMPLES.iter().chain(&names::STACKS));
    }
    if !options.sampling || options.counters == 0 {
        unused.extend(names::DELTAS);
        unused.push(names::PENDING_DELTAS);
    }
    if !options.sampling || !options.unwind_tables {
        unused.extend(names::USER_STACKS);
    }
    if !options.offcpu_stacks() || !options.unwind_tables {
        unused.extend(names::OFFCPU_USER_STACKS);
    }
    let lock = options.lock;
    if lock.is_none() {
        unused.push(names::LOCK_WAITERS);
    }
    if lock != Some(LockSource::Futex) {
        unused.extend([names::LOCK_WAITING, names::LOCK_WAKES, names::LOCK_JOINABLE]);
    }
    if !matches!(lock, Some(LockSource::Futex | LockSource::Pthread)) {
        unused.push(names::LOCK_HOLDERS);
    }
    if lock != Some(LockSource::Pthread) {
        unused.extend([names::LOCK_STATES, names::LOCK_CALLS]);
    }
    if lock != Some(LockSource::Kernel) {
        unused.push(names::LOCK_KERNEL_WAITING);
    }
    // Frame-pointer user stacks (futex, for processes without tables) and kernel stacks.
    if !matches!(lock, Some(LockSource::Futex | LockSource::Kernel)) {
        unused.push(names::LOCK_STACKS);
    }
    let walks_lock_tables = match lock {
        Some(LockSource::Futex) => options.unwind_tables,
        Some(LockSource::Pthread) => true,
        _ => false,
    };
    if !walks_lock_tables {
        unused.push(names::LOCK_USER_STACKS);
    }
    if !options.walks_tables() {
        unused.extend([names::UNWIND_ROWS, names::UNWIND_PROCESSES]);
    }
    if !options.unwind_tables {
        unused.extend(names::BUILD_ID_STACKS);
    }
    if options.sched.is_none() {
        unused.extend([names::TASK_STATS, names::EXITED]);
        unused.extend(names::OFFCPU.iter().chain(&names::OFFCPU_STACKS));
    }
    unused
}

impl Loaded {
    pub fn load(options: &LoadOptions<'_>) -> anyhow::Result<Loaded> {
        let (fork, exit) = tracepoint_offsets(options.tracefs)?;
        // Without the sched programs (hotspot mode) no BTF is needed.
        let tasks = options.sched.unwrap_or_default();
        let filter = u32::from(options.filter);
        let stacks = match options.offcpu_stacks {
            OffCpuStacks::None => offcpu_stacks::NONE,
            OffCpuStacks::Auto => offcpu_stacks::AUTO,
            OffCpuStacks::All => offcpu_stacks::ALL,
        };
        let unwind = u32::from(options.unwind_tables);
        let nvcsw = options.nvcsw_offset.unwrap_or(u32::MAX);
        let threads = match options.lock {
            Some(LockSource::Futex) => thread_offsets(),
            _ => ThreadOffsets {
                clear_child_tid: u32::MAX,
                ..Default::default()
            },
        };
        let mut loader = EbpfLoader::new();
        loader
            .override_global(names::G_FILTER, &filter, true)
            .override_global(names::G_FORK, &fork, true)
            .override_global(names::G_EXIT, &exit, true)
            .override_global(names::G_TASK_OFFSETS, &tasks, true)
            .override_global(names::G_SLOW_NS, &options.slow_threshold_ns, true)
            .override_global(names::G_OFFCPU_STACKS, &stacks, true)
            .override_global(names::G_COUNTERS, &options.counters, true)
            .override_global(names::G_UNWIND, &unwind, true)
            .override_global(names::G_NVCSW, &nvcsw, true)
            .override_global(names::G_THREAD_OFFSETS, &threads, true);
        // Fixed at load: below debug the verifier sees a constant and prunes every kernel log
        // site as dead code, and the log ring shrinks to one page (it stays empty).
        let log_level = kernel_log_level();
        loader.override_global(aya_log::LEVEL, &log_level, true);
        if log_level < log::LevelFilter::Debug as usize as u8 {
            let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
                .ok()
                .flatten()
                .unwrap_or(4096) as u32;
            loader.map_max_entries(names::KERNEL_LOGS, page);
        }
        for map in unused_maps(options) {
            loader.map_max_entries(map, 1);
        }
        if let Some(entries) = options.sample_map_entries {
            for map in names::SAMPLES {
                loader.map_max_entries(map, entries.max(1));
            }
        }
        let mut ebpf = loader
            .load(BPF_OBJECT)
            .context("loading the BPF programs into the kernel")?;
        let targets = take_map(&mut ebpf, names::TARGETS)?;
        let targets = BpfHashMap::try_from(targets)?;
        let kernel_logs =
            aya_log::EbpfLogger::init(&mut ebpf).context("reading the BPF programs' log ring")?;
        Ok(Loaded {
            ebpf,
            targets,
            counters: None,
            unwind_programs: Vec::new(),
            kernel_logs: Some(kernel_logs),
        })
    }

    pub fn add_target(&mut self, pid: u32) -> anyhow::Result<()> {
        self.targets
            .insert(pid, 1, 0)
            .with_context(|| format!("adding pid {pid} to the targets"))
    }

    /// Follow targets' children, forget exited threads, re-announce processes that exec.
    pub fn attach_process_tracking(&mut self) -> anyhow::Result<()> {
        self.attach_tracepoints(&[
            (names::PROG_FORK, "sched", "sched_process_fork"),
            (names::PROG_EXIT, "sched", "sched_process_exit"),
            (names::PROG_EXEC, "sched", "sched_process_exec"),
        ])
    }

    /// Time targets' futex waits and record who wakes them.
    pub fn attach_futex(&mut self) -> anyhow::Result<()> {
        // Before the waits: a thread's creation records what joining it waits on.
        let program: &mut RawTracePoint = self.program(names::PROG_THREAD_NEW)?;
        program
            .load()
            .with_context(|| format!("loading {}", names::PROG_THREAD_NEW))?;
        program
            .attach("sched_process_fork")
            .context("attaching the lock thread tracker to the raw tracepoint sched_process_fork")?;
        self.attach_tracepoints(&[
            (names::PROG_FUTEX_ENTER, "syscalls", "sys_enter_futex"),
            (names::PROG_FUTEX_EXIT, "syscalls", "sys_exit_futex"),
        ])
        .context("lock mode times futex waits at the syscall tracepoints (the kernel needs CONFIG_FTRACE_SYSCALLS)")
    }

    /// Time the kernel's own lock contention.
    pub fn attach_kernel_locks(&mut self) -> anyhow::Result<()> {
        self.attach_tracepoints(&[
            (names::PROG_CONTENTION_BEGIN, "lock", "contention_begin"),
            (names::PROG_CONTENTION_END, "lock", "contention_end"),
        ])
        .context("--lock-source kernel needs the lock:contention_begin/end tracepoints (Linux 5.19 or later)")
    }

    /// Probe the pthread lock functions of each target's library, for that process only.
    pub fn attach_pthread(&mut self, libraries: &[(u32, LockLibrary)]) -> anyhow::Result<()> {
        let walker: &mut UProbe = self.program(names::PROG_UNWIND_PTHREAD)?;
        walker
            .load()
            .context("loading the pthread stack unwinding program")?;
        self.install_walker(names::PROG_UNWIND_PTHREAD, names::PTHREAD_UNWIND_PROGRAMS)?;
        for name in [names::PROG_PTHREAD_ENTER, names::PROG_PTHREAD_RETURN] {
            let program: &mut UProbe = self.program(name)?;
            program.load().with_context(|| format!("loading {name}"))?;
        }
        for (pid, library) in libraries {
            let scope =
                UProbeScope::OneProcess(std::num::NonZeroU32::new(*pid).context("pid 0 is not a process")?);
            for probe in &library.probes {
                let point = || UProbeAttachPoint {
                    location: UProbeAttachLocation::AbsoluteOffset(probe.file_offset),
                    cookie: Some(probe.cookie),
                };
                let mut programs = vec![names::PROG_PTHREAD_ENTER];
                if probe.returns {
                    programs.push(names::PROG_PTHREAD_RETURN);
                }
                for name in programs {
                    let program: &mut UProbe = self.program(name)?;
                    program.attach(point(), &library.path, scope).with_context(|| {
                        format!(
                            "probing {} in {} (offset {:#x}) for pid {pid}",
                            probe.function, library.display, probe.file_offset
                        )
                    })?;
                }
            }
        }
        Ok(())
    }

    /// Time run-queue waits and off-CPU intervals.
    pub fn attach_sched(&mut self) -> anyhow::Result<()> {
        for (prog, event) in [
            (names::PROG_WAKEUP, "sched_wakeup"),
            (names::PROG_WAKEUP_NEW, "sched_wakeup_new"),
            (names::PROG_SWITCH, "sched_switch"),
        ] {
            let program: &mut RawTracePoint = self.program(prog)?;
            program.load().with_context(|| format!("loading {prog}"))?;
            program
                .attach(event)
                .with_context(|| format!("attaching to the raw tracepoint {event}"))?;
        }
        Ok(())
    }

    fn attach_tracepoints(&mut self, programs: &[(&str, &str, &str)]) -> anyhow::Result<()> {
        for &(prog, category, event) in programs {
            let program: &mut TracePoint = self.program(prog)?;
            program.load().with_context(|| format!("loading {prog}"))?;
            program
                .attach(category, event)
                .with_context(|| format!("attaching to {category}:{event}"))?;
        }
        Ok(())
    }

    /// A program of the object, as its kind.
    fn program<'a, P>(&'a mut self, name: &str) -> anyhow::Result<&'a mut P>
    where
        &'a mut P: TryFrom<&'a mut aya::programs::Program, Error = ProgramError>,
    {
        let program = self
            .ebpf
            .program_mut(name)
            .with_context(|| format!("program {name} missing"))?;
        Ok(program.try_into()?)
    }

    /// Open `events` on every CPU (one group per CPU when `group`) and hand them to the sampling
    /// program, which reads them at each sample.
    pub fn open_counters(
        &mut self,
        events: &[EventSpec],
        group: bool,
        core: Option<&Pmu>,
    ) -> anyhow::Result<()> {
        anyhow::ensure!(
            events.len() <= names::COUNTER_READERS.len(),
            "at most {} counters per sample",
            names::COUNTER_READERS.len()
        );
        let counting = Counting::start(
            events,
            group,
            core,
            &Scope::Cpus(crate::counters::cpu::online_ids()?),
        )
        .map_err(|e| match e {
            CountingError::Unsupported { event, .. }
                if events
                    .iter()
                    .any(|s| s.name == event && !matches!(s.source, Source::Software(_))) =>
            {
                anyhow::Error::from(UserError::NoPmu { event })
            }
            e => e.into(),
        })?;
        for (cpu, fds) in counting.per_cpu() {
            for (slot, fd) in fds.iter().enumerate() {
                let name = names::COUNTER_READERS[slot];
                let map = self
                    .ebpf
                    .map(name)
                    .with_context(|| format!("map {name} missing"))?;
                let aya::maps::Map::PerfEventArray(data) = map else {
                    anyhow::bail!("map {name} is not a perf event array");
                };
                map_update(data.fd().as_fd(), cpu, fd.as_raw_fd() as u32).with_context(|| {
                    format!("handing the {} counter of CPU {cpu} to BPF", events[slot].name)
                })?;
            }
        }
        self.counters = Some(counting);
        // The counters are per CPU: a fresh baseline at every context switch keeps each
        // sample's interval to the sampled thread's own time.
        let program: &mut RawTracePoint = self.program(names::PROG_COUNTER_SWITCH)?;
        program
            .load()
            .with_context(|| format!("loading {}", names::PROG_COUNTER_SWITCH))?;
        program
            .attach("sched_switch")
            .context("attaching the counter baseline to the raw tracepoint sched_switch")?;
        Ok(())
    }

    /// Per CPU, what the counters read at each sample have counted so far over the intervals
    /// target threads ran (running sums: the run's totals are the difference of two readings).
    /// `None` when no counters are read at samples.
    pub fn counter_totals(&self) -> anyhow::Result<Option<Vec<CounterDeltas>>> {
        if self.counters.is_none() {
            return Ok(None);
        }
        let map = self
            .ebpf
            .map(names::COUNTER_TOTALS)
            .with_context(|| format!("map {} missing", names::COUNTER_TOTALS))?;
        let totals: PerCpuArray<&MapData, CounterDeltas> = PerCpuArray::try_from(map)?;
        Ok(Some(totals.get(&0, 0)?.iter().copied().collect()))
    }

    /// Load the table walkers the run needs (`options`: as loaded), hand each to the program
    /// that starts its walks, and return the tables to fill.
    pub fn enable_unwinding(&mut self, options: &LoadOptions<'_>) -> anyhow::Result<crate::unwind::Tables> {
        // One walker per program type that starts walks (a tail call stays within its type).
        if options.sampling {
            let program: &mut PerfEvent = self.program(names::PROG_UNWIND)?;
            program.load().context("loading the stack unwinding program")?;
            self.install_walker(names::PROG_UNWIND, names::UNWIND_PROGRAMS)?;
        }
        if options.offcpu_stacks() {
            let program: &mut RawTracePoint = self.program(names::PROG_UNWIND_OFFCPU)?;
            program
                .load()
                .context("loading the off-CPU stack unwinding program")?;
            self.install_walker(names::PROG_UNWIND_OFFCPU, names::OFFCPU_UNWIND_PROGRAMS)?;
        }
        if options.lock == Some(LockSource::Futex) {
            let program: &mut TracePoint = self.program(names::PROG_UNWIND_LOCK)?;
            program
                .load()
                .context("loading the lock stack unwinding program")?;
            self.install_walker(names::PROG_UNWIND_LOCK, names::LOCK_UNWIND_PROGRAMS)?;
        }
        let rows = take_map(&mut self.ebpf, names::UNWIND_ROWS)?;
        crate::unwind::Tables::new(rows, take_map(&mut self.ebpf, names::UNWIND_PROCESSES)?)
    }

    /// Put a loaded walker into the program array its walks tail-call (kept open for the run).
    fn install_walker(&mut self, walker: &str, array: &str) -> anyhow::Result<()> {
        let fd = self
            .ebpf
            .program(walker)
            .with_context(|| format!("program {walker} missing"))?
            .fd()?
            .try_clone()?;
        let programs = take_map(&mut self.ebpf, array)?;
        let mut programs = aya::maps::ProgramArray::try_from(programs)?;
        programs.set(profiler_common::unwind::PROGRAM_SLOT, &fd, 0)?;
        self.unwind_programs.push(programs);
        Ok(())
    }

    /// One sampling event per online CPU. Returns the number of CPUs.
    pub fn attach_sampling(&mut self, event: Event, frequency_hz: u64) -> anyhow::Result<u32> {
        let (config, policy) = match event {
            // The software clock counts nanoseconds: a fixed period is exact and needs no warm-up.
            Event::CpuClock => (
                PerfEventConfig::Software(SoftwareEvent::CpuClock),
                SamplePolicy::Period(1_000_000_000 / frequency_hz),
            ),
            Event::Cycles => (
                PerfEventConfig::Hardware(HardwareEvent::CpuCycles),
                SamplePolicy::Frequency(frequency_hz),
            ),
            Event::Instructions => (
                PerfEventConfig::Hardware(HardwareEvent::Instructions),
                SamplePolicy::Frequency(frequency_hz),
            ),
        };
        let program: &mut PerfEvent = self.program(names::PROG_SAMPLE)?;
        program.load().context("loading the sampling program")?;
        let cpus = crate::counters::cpu::online_ids()?;
        for &cpu in &cpus {
            if let Err(err) =
                program.attach(config, PerfEventScope::AllProcessesOneCpu { cpu }, policy, false)
            {
                if event != Event::CpuClock && is_missing_pmu(&err) {
                    return Err(UserError::NoPmu {
                        event: event.name().to_string(),
                    }
                    .into());
                }
                return Err(err).with_context(|| format!("opening the {} event on CPU {cpu}", event.name()));
            }
        }
        Ok(cpus.len() as u32)
    }
}

/// perf_event_open's answers when there is no hardware PMU for the event.
fn is_missing_pmu(err: &ProgramError) -> bool {
    let ProgramError::SyscallError(syscall) = err else {
        return false;
    };
    matches!(
        syscall.io_error.raw_os_error(),
        Some(libc::ENOENT) | Some(libc::EOPNOTSUPP) | Some(libc::ENODEV) | Some(libc::EINVAL)
    )
}

/// `bpf(BPF_MAP_UPDATE_ELEM)` for a perf event array: aya's own type for it only opens ring buffers.
fn map_update(map_fd: std::os::fd::BorrowedFd<'_>, key: u32, mut value: u32) -> std::io::Result<()> {
    const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
    crate::collect::map_elem_call(
        BPF_MAP_UPDATE_ELEM,
        map_fd,
        (&key as *const u32).cast(),
        (&mut value as *mut u32).cast(),
    )
}
