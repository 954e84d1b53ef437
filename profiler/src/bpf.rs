//! Loading the embedded kernel programs, setting their globals and attaching them. Everything
//! attached belongs to [`Loaded`]; dropping it detaches and unloads, on every exit path.
use std::path::Path;

use anyhow::Context as _;
use aya::{
    maps::{HashMap as BpfHashMap, MapData},
    programs::{
        perf_event::{HardwareEvent, PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent},
        PerfEvent, ProgramError, TracePoint,
    },
    util::online_cpus,
    Ebpf, EbpfLoader,
};
use profiler_common::{names, ExitOffsets, ForkOffsets, SchedOffsets};

use std::os::fd::{AsFd as _, AsRawFd as _};

use crate::{
    cli::{CounterEvent, Event, Mode},
    error::UserError,
    preflight::tracepoint_field_offset,
};

static BPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/profiler"));

pub struct Loaded {
    pub ebpf: Ebpf,
    targets: BpfHashMap<MapData, u32, u8>,
    /// Per-CPU counting events the sampling program reads; closed with everything else.
    counter_fds: Vec<std::os::fd::OwnedFd>,
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

/// Field offsets of `sched_switch` and `sched_wakeup` on the running kernel.
pub fn sched_offsets(tracefs: &Path) -> anyhow::Result<SchedOffsets> {
    let field = |event: &str, name: &str| {
        tracepoint_field_offset(tracefs, "sched", event, name)
            .with_context(|| format!("sched:{event} has no field `{name}` in its tracefs format"))
    };
    Ok(SchedOffsets {
        switch_prev_comm: field("sched_switch", "prev_comm")?,
        switch_prev_pid: field("sched_switch", "prev_pid")?,
        switch_prev_state: field("sched_switch", "prev_state")?,
        switch_next_comm: field("sched_switch", "next_comm")?,
        switch_next_pid: field("sched_switch", "next_pid")?,
        wakeup_pid: field("sched_wakeup", "pid")?,
        wakeup_comm: field("sched_wakeup", "comm")?,
        _pad: 0,
    })
}

/// What to load for a run.
pub struct LoadOptions<'a> {
    pub mode: Mode,
    /// Keep only processes in the target set (else: the whole system).
    pub filter: bool,
    /// Sched mode: waits at least this long are reported one by one.
    pub slow_threshold_ns: u64,
    /// Sched mode: record where tasks block (two stack walks per sleep).
    pub offcpu_stacks: bool,
    /// Hotspot: how many counters' deltas the sampling program reads.
    pub counters: u32,
    pub tracefs: &'a Path,
}

/// Maps a mode does not use shrink to one entry, so they cost (almost) no kernel memory.
fn unused_maps(mode: Mode) -> &'static [&'static str] {
    match mode {
        Mode::Sched | Mode::Topdown => &["SAMPLES_0", "SAMPLES_1", "STACKS_0", "STACKS_1"],
        _ => &["TASK_STATS", "EXITED", "OFFCPU", "OFFCPU_STACKS"],
    }
}

impl Loaded {
    pub fn load(options: &LoadOptions<'_>) -> anyhow::Result<Loaded> {
        let (fork, exit) = tracepoint_offsets(options.tracefs)?;
        let sched = sched_offsets(options.tracefs)?;
        let filter = u32::from(options.filter);
        let stacks = u32::from(options.offcpu_stacks);
        let mut loader = EbpfLoader::new();
        loader
            .override_global(names::G_FILTER, &filter, true)
            .override_global(names::G_FORK, &fork, true)
            .override_global(names::G_EXIT, &exit, true)
            .override_global(names::G_SCHED, &sched, true)
            .override_global(names::G_SLOW_NS, &options.slow_threshold_ns, true)
            .override_global(names::G_OFFCPU_STACKS, &stacks, true)
            .override_global(names::G_COUNTERS, &options.counters, true);
        for map in unused_maps(options.mode) {
            loader.map_max_entries(map, 1);
        }
        let mut ebpf = loader
            .load(BPF_OBJECT)
            .context("loading the BPF programs into the kernel")?;
        let targets = ebpf.take_map(names::TARGETS).context("map TARGETS missing")?;
        let targets = BpfHashMap::try_from(targets)?;
        Ok(Loaded {
            ebpf,
            targets,
            counter_fds: Vec::new(),
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
            (names::PROG_FORK, "sched_process_fork"),
            (names::PROG_EXIT, "sched_process_exit"),
            (names::PROG_EXEC, "sched_process_exec"),
        ])
    }

    /// Time run-queue waits and off-CPU intervals.
    pub fn attach_sched(&mut self) -> anyhow::Result<()> {
        self.attach_tracepoints(&[
            (names::PROG_WAKEUP, "sched_wakeup"),
            (names::PROG_WAKEUP_NEW, "sched_wakeup_new"),
            (names::PROG_SWITCH, "sched_switch"),
        ])
    }

    fn attach_tracepoints(&mut self, programs: &[(&str, &str)]) -> anyhow::Result<()> {
        for &(prog, event) in programs {
            let program: &mut TracePoint = self
                .ebpf
                .program_mut(prog)
                .with_context(|| format!("program {prog} missing"))?
                .try_into()?;
            program.load().with_context(|| format!("loading {prog}"))?;
            program
                .attach("sched", event)
                .with_context(|| format!("attaching to sched:{event}"))?;
        }
        Ok(())
    }

    /// Open one counting event per CPU for each counter and hand them to the sampling program.
    pub fn open_counters(&mut self, counters: &[CounterEvent]) -> anyhow::Result<()> {
        let cpus = online_cpus().map_err(|(what, e)| anyhow::anyhow!("{what}: {e}"))?;
        for (slot, counter) in counters.iter().enumerate() {
            let name = names::COUNTER_READERS[slot];
            let map = self
                .ebpf
                .map(name)
                .with_context(|| format!("map {name} missing"))?;
            let aya::maps::Map::PerfEventArray(data) = map else {
                anyhow::bail!("map {name} is not a perf event array");
            };
            let map_fd = data.fd().as_fd().as_raw_fd();
            let (kind, config) = counter.perf_type_config();
            for &cpu in &cpus {
                let fd = match crate::pmu::open_counter(kind, config, -1, cpu as i32) {
                    Ok(fd) => fd,
                    Err(e)
                        if kind == 0
                            && matches!(
                                e.raw_os_error(),
                                Some(libc::ENOENT | libc::EOPNOTSUPP | libc::ENODEV)
                            ) =>
                    {
                        return Err(UserError::NoPmu {
                            event: counter.name().to_string(),
                        }
                        .into());
                    }
                    Err(e) => {
                        return Err(e)
                            .with_context(|| format!("opening the {} counter on CPU {cpu}", counter.name()))
                    }
                };
                map_update(map_fd, cpu, fd.as_raw_fd() as u32)
                    .with_context(|| format!("handing the {} counter of CPU {cpu} to BPF", counter.name()))?;
                self.counter_fds.push(fd);
            }
        }
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
        let program: &mut PerfEvent = self
            .ebpf
            .program_mut(names::PROG_SAMPLE)
            .context("program sample_stack missing")?
            .try_into()?;
        program.load().context("loading the sampling program")?;
        let cpus = online_cpus().map_err(|(what, e)| anyhow::anyhow!("{what}: {e}"))?;
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
fn map_update(map_fd: std::os::fd::RawFd, key: u32, value: u32) -> std::io::Result<()> {
    #[repr(C)]
    struct Update {
        map_fd: u32,
        _pad: u32,
        key: u64,
        value: u64,
        flags: u64,
    }
    let attr = Update {
        map_fd: map_fd as u32,
        _pad: 0,
        key: &key as *const u32 as u64,
        value: &value as *const u32 as u64,
        flags: 0,
    };
    const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
    // SAFETY: the attribute points at live key and value for the duration of the call.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_MAP_UPDATE_ELEM,
            &attr as *const Update,
            std::mem::size_of::<Update>(),
        )
    };
    if ret < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
