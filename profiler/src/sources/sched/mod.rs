//! The scheduler: BTF tracepoints on wake-ups and switches keep each thread's run-queue waits,
//! time on and off a CPU and where it went to sleep; slow waits come through a ring with who
//! woke the thread and who held its CPU. Drained at each flip into a [`SchedBatch`]: the off-CPU
//! time of the interval, threads that exited, slow waits, a heatmap column, and (when asked) the
//! live threads' records so far; at the end, each CPU's waits and idle time too.
use std::collections::HashMap;

use anyhow::Context as _;
use aya::{
    maps::{HashMap as BpfHashMap, MapData, PerCpuArray, PerCpuValues, RingBuf, StackTraceMap},
    Ebpf,
};
use profiler_common::{
    names, offcpu_stacks, unwind::UserStack, CpuHistory, ExecOffsets, ExitedKey, LabelOffsets,
    OffCpuSampling, OffCpuTime, Running, SampleKey, SlowEvent, TaskOffsets, TaskSched, BEGAN_EARLIER,
    HEAT_BUCKETS,
};

mod cpus;
mod offcpu;
mod records;
mod skipped;
mod spread;

pub use cpus::CpuRecord;
use records::{add_quiet_threads, name_or_proc};
pub use records::{keep_longest, OpenState, SlowRecord, TaskRecord, SLOW_EVENTS_KEPT};

use offcpu::{Asleep, SleepsInFlight, SlotStacks};
use skipped::SkippedInEntries;

use super::{AttachContext, Attached, Batch, Source, Wants};
use crate::{
    bpf::{LoadOptions, Loaded},
    cli::OffCpuStacks,
    collect::{clear_stacks, comm_string, monotonic_ns, read_stack, read_unwound, Flip},
    error::UserError,
    map_ops::{read_all, take_all},
    process::Processes,
    profile::{Health, RawSample, StackRead},
};

/// With sampled off-CPU stacks: each thread's sleeps a second whose stacks are taken whatever
/// the draw, and the length from which a sleep not drawn is shown apart.
const EXACT_SLEEPS_A_SECOND: u32 = 1000;
pub(crate) const LONG_SKIPPED_NS: u64 = 1_000_000;

/// What the scheduler is asked to keep.
pub struct Spec {
    /// Waits at least this long are sent one by one (`u64::MAX`: none).
    pub slow_threshold_ns: u64,
    /// Which stacks record where threads go to sleep.
    pub offcpu_stacks: OffCpuStacks,
    /// Each CPU's history, the per-CPU waits, the heatmap and each wait's waker are kept (sched
    /// mode's report); without, each switch keeps only the thread's own figures (the agent).
    pub detail: bool,
    /// Where the running kernel keeps the `task_struct` fields the programs read: from its
    /// BTF, by `prepare` (before anything is loaded: missing BTF is the first thing said).
    pub offsets: Option<TaskOffsets>,
    /// Where the kernel says a task is in the middle of an exec, with `offsets`.
    pub exec_offsets: ExecOffsets,
    /// Which sleeps get their stacks taken (every one, unless the agent samples them).
    pub sampling: OffCpuSampling,
}

impl Spec {
    pub fn new(slow_threshold_ns: u64, offcpu_stacks: OffCpuStacks) -> Spec {
        Spec {
            slow_threshold_ns,
            offcpu_stacks,
            detail: true,
            offsets: None,
            exec_offsets: ExecOffsets::default(),
            sampling: OffCpuSampling::EVERY_SLEEP,
        }
    }

    /// Only what the agent's profiles read: no slow waits, no per-CPU history, no heatmap; off-CPU
    /// stacks for one sleep in `sample_every` past each thread's first ones of a second (see
    /// `OffCpuSampling`).
    pub fn for_profiles(offcpu_stacks: OffCpuStacks, sample_every: u32) -> Spec {
        Spec {
            detail: false,
            sampling: OffCpuSampling {
                every: sample_every,
                exact: EXACT_SLEEPS_A_SECOND,
                long_ns: LONG_SKIPPED_NS,
            },
            ..Spec::new(u64::MAX, offcpu_stacks)
        }
    }

    pub fn prepare(&mut self) -> Result<(), UserError> {
        let (offsets, exec_offsets) = kernel_offsets()?;
        (self.offsets, self.exec_offsets) = (Some(offsets), exec_offsets);
        Ok(())
    }

    /// Off-CPU user stacks are walked through unwind tables.
    fn walks_tables(&self, unwind_tables: bool) -> bool {
        unwind_tables && self.offcpu_stacks != OffCpuStacks::None
    }

    pub fn needs(&self, options: &mut LoadOptions<'_>) {
        options.use_maps([&names::TASK_STATS, &names::EXITED]);
        options.use_maps(names::OFFCPU.iter().chain(&names::OFFCPU_STACKS));
        if self.walks_tables(options.unwind_tables) {
            options.use_maps(&names::OFFCPU_USER_STACKS);
            options.use_maps(&names::UNWIND_TABLES);
        }
        options.task_offsets = self.offsets.unwrap_or_default();
        options.exec_offsets = self.exec_offsets;
        options.slow_threshold_ns = self.slow_threshold_ns;
        options.sched_detail = u32::from(self.detail);
        options.offcpu_sampling = self.sampling;
        options.offcpu_stacks = match self.offcpu_stacks {
            OffCpuStacks::None => offcpu_stacks::NONE,
            OffCpuStacks::Auto => offcpu_stacks::AUTO,
            OffCpuStacks::All => offcpu_stacks::ALL,
        };
    }

    /// Its records cover the run from now on: the targets' threads of this moment are
    /// remembered (one that never switches is still part of the answer).
    pub fn attach(self, kernel: &mut Loaded, context: &AttachContext<'_>) -> anyhow::Result<Attached> {
        let maps = SchedMaps::take(&mut kernel.ebpf, self.detail)?;
        let btf = crate::btf::kernel_btf()?;
        if self.walks_tables(context.unwind_tables) {
            kernel
                .load_btf_tracepoint(&btf, names::PROG_UNWIND_OFFCPU, "sched_switch")
                .context("loading the off-CPU stack unwinding program")?;
            kernel.install_walker(names::PROG_UNWIND_OFFCPU, names::OFFCPU_UNWIND_PROGRAMS)?;
        }
        let threads_at_start = context
            .pids
            .iter()
            .flat_map(|&pid| {
                crate::process::threads_of(pid)
                    .into_iter()
                    .map(move |tid| (pid, tid))
            })
            .collect();
        let source = SchedSource {
            maps,
            sleeps: SleepsInFlight::default(),
            skipped: SkippedInEntries::default(),
            started_ns: monotonic_ns(),
            idle_at_start: cpus::IdleAt::now(),
            idle_at_stop: None,
            threads_at_start,
            slow_seen: 0,
        };
        // The lean path (the kernel programs' `lean`) places wake-ups without seeing them.
        let lean = !self.detail && self.offsets.is_some_and(|o| o.kernel_accounting());
        let programs = [
            (names::PROG_WAKEUP, "sched_wakeup"),
            (names::PROG_WAKEUP_NEW, "sched_wakeup_new"),
            (names::PROG_SWITCH, "sched_switch"),
        ];
        kernel.attach_btf_tracepoints(&btf, &programs[usize::from(lean)..])?;
        Ok(Attached {
            source: Box::new(source),
            doing: Some("tracing the scheduler".to_string()),
            note: self
                .offsets
                .is_some_and(|o| !o.kernel_accounting())
                .then(|| TRACEPOINT_CLOCKS_NOTE.to_string()),
        })
    }
}

/// Where the running kernel keeps the `task_struct` fields the raw sched tracepoints read.
pub fn task_offsets() -> Result<TaskOffsets, UserError> {
    Ok(kernel_offsets()?.0)
}

/// The same, and where the kernel says a task is in the middle of an exec (`ExecOffsets`).
fn kernel_offsets() -> Result<(TaskOffsets, ExecOffsets), UserError> {
    let no_btf = |reason: String| UserError::NoBtf(reason);
    let path = crate::btf::kernel_btf_path();
    let btf = crate::btf::Btf::from_file(&path).map_err(|e| no_btf(format!("{e:#}")))?;
    let exec = ExecOffsets {
        fs: btf.member_offset("task_struct", "fs").unwrap_or(0),
        in_exec: btf.member_offset("fs_struct", "in_exec").unwrap_or(0),
        start_stack: btf.member_offset("mm_struct", "start_stack").unwrap_or(0),
    };
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
    // The run queue's clock, reached from the outgoing task (timed at the tracepoints: not read).
    let (se_cfs_rq, cfs_rq_rq, rq_clock) = match (
        nested("se", "sched_entity", "cfs_rq"),
        btf.member_offset("cfs_rq", "rq"),
        btf.member_offset("rq", "clock"),
    ) {
        _ if sched_info == 0 || !stable_sched_clock() => (0, 0, 0),
        (Some(se_cfs_rq), Some(cfs_rq_rq), Some(rq_clock)) => (se_cfs_rq, cfs_rq_rq, rq_clock),
        _ => (0, 0, 0),
    };
    let task = TaskOffsets {
        pid: field("pid")?,
        comm: field("comm")?,
        // `state` became `__state` in 5.14.
        state: field("__state").or_else(|_| field("state"))?,
        // The probe's data pointer, preempt, prev, next[, prev_state (5.18 and later)].
        switch_has_state_arg: u32::from(switch_params >= 5),
        sched_info,
        sum_exec_runtime,
        tgid: field("tgid")?,
        se_cfs_rq,
        cfs_rq_rq,
        rq_clock,
        vfork_done: field("vfork_done").unwrap_or(0),
        labels: label_offsets(&btf).unwrap_or_default(),
    };
    Ok((task, exec))
}

/// Where a process's name and executable file are (`LabelOffsets`), if the BTF says all of it.
fn label_offsets(btf: &crate::btf::Btf) -> Option<LabelOffsets> {
    Some(LabelOffsets {
        group_leader: btf.member_offset("task_struct", "group_leader")?,
        mm: btf.member_offset("task_struct", "mm")?,
        exe_file: btf.member_offset("mm_struct", "exe_file")?,
        f_inode: btf.member_offset("file", "f_inode")?,
        i_ino: btf.member_offset("inode", "i_ino")?,
        i_generation: btf.member_offset("inode", "i_generation")?,
        i_sb: btf.member_offset("inode", "i_sb")?,
        s_dev: btf.member_offset("super_block", "s_dev")?,
    })
}

/// Whether the kernel's `sched_clock` is the CPU's own counter, the same on every CPU: the clock
/// source is the TSC or Arm's architected counter. (Elsewhere, e.g. a jiffies or `kvm-clock`
/// source, each CPU's clock may be clamped within a tick of the others': the switch then reads
/// `bpf_ktime_get_ns`.)
fn stable_sched_clock() -> bool {
    let source = "/sys/devices/system/clocksource/clocksource0/current_clocksource";
    std::fs::read_to_string(source).is_ok_and(|s| matches!(s.trim(), "tsc" | "arch_sys_counter"))
}

/// What a report says when the kernel's own run-queue and CPU accounting cannot be read.
pub const TRACEPOINT_CLOCKS_NOTE: &str = "run-queue delay and running time are timed at the scheduler \
     tracepoints (a few microseconds from the kernel's own figures per switch; the kernel starts a \
     preempting wake-up's run at the wake-up, the tracepoints at the switch): this kernel's BTF has no \
     task_struct.sched_info.pcount and run_delay or se.sum_exec_runtime (CONFIG_SCHED_INFO off?)";

/// One drain of the scheduler's records.
#[derive(Default)]
pub struct SchedBatch {
    /// `bpf_ktime_get_ns()` (CLOCK_MONOTONIC) when tracing began.
    pub started_ns: u64,
    /// The interval's off-CPU time by stack, in ns, with the sleeps that ended as counter 0.
    pub offcpu: Vec<RawSample>,
    /// Threads that exited during the interval.
    pub exited: Vec<TaskRecord>,
    /// Slow waits reported since the last drain.
    pub slow: Vec<SlowRecord>,
    /// The interval's heatmap column (waits per bucket); none at the end, nor without `detail`.
    pub heat: Option<Vec<u64>>,
    /// Every live thread's record so far: when asked (`Wants::current`), and at the end (then
    /// with the state each was still in, and the threads that never switched).
    pub live: Option<Vec<TaskRecord>>,
    /// Sleeps whose stacks were gone before they could be kept across a flip, so far.
    pub offcpu_stacks_lost: u64,
    /// Sleeps being carried across flips now.
    pub sleeps_carried: u64,
    /// Sleeps whose stacks were not taken (sampled off-CPU stacks), so far.
    pub sleeps_unsampled: u64,
    /// Each CPU over the run: at the end only.
    pub cpus: Option<Vec<CpuRecord>>,
}

/// The scheduler's maps, and what it carries from one drain to the next.
pub struct SchedSource {
    maps: SchedMaps,
    sleeps: SleepsInFlight,
    /// Skipped sleeps summed in the task entries, read as records.
    skipped: SkippedInEntries,
    started_ns: u64,
    /// Each CPU's idle time when tracing began, and when collection stopped.
    idle_at_start: Option<cpus::IdleAt>,
    idle_at_stop: Option<cpus::IdleAt>,
    /// The targets' threads when tracing began, as (pid, tid): any of them without a single
    /// scheduler event by the end spent the whole run in one state (see `add_quiet_threads`).
    threads_at_start: Vec<(u32, u32)>,
    /// Slow waits reported so far.
    slow_seen: u64,
}

impl SchedSource {
    fn batch(&self) -> SchedBatch {
        SchedBatch {
            started_ns: self.started_ns,
            offcpu_stacks_lost: self.sleeps.stacks_lost,
            sleeps_carried: self.sleeps.kept() as u64,
            sleeps_unsampled: self.sleeps.unsampled,
            ..SchedBatch::default()
        }
    }
}

impl Source for SchedSource {
    /// After `flip`: slow waits, a heatmap column, exited tasks, and the off-CPU time of the
    /// interval that ended.
    fn drain(&mut self, flip: Flip, wants: Wants, procs: &mut Processes) -> anyhow::Result<Option<Batch>> {
        let slow = self.maps.read_slow();
        self.slow_seen += slow.len() as u64;
        let (heat, exited_entries) = self.maps.drain(flip.slot)?;
        let exited: Vec<TaskRecord> = exited_entries.iter().map(TaskRecord::from).collect();
        if !self.threads_at_start.is_empty() && !exited.is_empty() {
            // An exit is an event: such a thread was not quiet.
            let gone: std::collections::HashSet<u32> = exited.iter().map(|t| t.tid).collect();
            self.threads_at_start.retain(|(_, tid)| !gone.contains(tid));
        }
        let sleeps = (&mut self.sleeps, &mut self.skipped);
        let (offcpu, tasks) = self.maps.drain_offcpu(flip, sleeps, &exited_entries, procs)?;
        for sample in &offcpu {
            if let StackRead::Frames(ips) = &sample.user {
                let _ = procs.refresh_unless_covered(sample.pid, sample.exec_generation, ips);
            }
        }
        Ok(Some(Batch::Sched(SchedBatch {
            offcpu,
            exited,
            slow,
            heat,
            live: wants.current.then(|| live_tasks(&tasks)),
            ..self.batch()
        })))
    }

    /// The threads still alive at `stopped_ns`, each in the state it was still in, and the
    /// targets' threads that never switched.
    fn finish(&mut self, stopped_ns: u64, _procs: &mut Processes) -> anyhow::Result<Option<Batch>> {
        let tasks: Vec<TaskSched> = (read_all(&self.maps.tasks).into_iter()).map(|(_, t)| t).collect();
        let mut live: Vec<TaskRecord> = (tasks.iter())
            .map(|task| TaskRecord::from(task).with_open_interval(task, stopped_ns))
            .collect();
        let slow = self.maps.read_slow();
        self.slow_seen += slow.len() as u64;
        add_quiet_threads(&mut live, &self.threads_at_start, self.started_ns, stopped_ns);
        let open_waits = (tasks.iter()).filter_map(|t| Some((t.last_cpu, records::open_wait(t)?)));
        let cpus = cpus::records(
            &self.maps.cpus,
            open_waits,
            self.idle_at_start.as_ref(),
            self.idle_at_stop.as_ref(),
        );
        Ok(Some(Batch::Sched(SchedBatch {
            slow,
            live: Some(live),
            cpus: Some(cpus),
            ..self.batch()
        })))
    }

    fn stopping(&mut self) {
        self.idle_at_stop = cpus::IdleAt::now();
    }

    fn add_health(&self, health: &mut Health) {
        health.slow_events = self.slow_seen;
    }
}

/// The kernel maps of the sched programs.
struct SchedMaps {
    tasks: BpfHashMap<MapData, u32, TaskSched>,
    exited: BpfHashMap<MapData, ExitedKey, TaskSched>,
    offcpu: [BpfHashMap<MapData, SampleKey, OffCpuTime>; 2],
    stacks: [StackTraceMap<MapData>; 2],
    /// Table-unwound user stacks (when the run walks tables).
    user_stacks: [BpfHashMap<MapData, u32, UserStack>; 2],
    heat: Option<PerCpuArray<MapData, u64>>,
    cpus: PerCpuArray<MapData, CpuHistory>,
    /// Per CPU, the traced task on it and since when (the lean path's switch-ins).
    running: PerCpuArray<MapData, Running>,
    slow: RingBuf<MapData>,
}

impl SchedMaps {
    /// The maps; the heatmap only with `detail` (the kernel writes it only then).
    fn take(ebpf: &mut Ebpf, detail: bool) -> anyhow::Result<Self> {
        let mut take = |name: &str| crate::collect::take_map(ebpf, name);
        Ok(SchedMaps {
            tasks: BpfHashMap::try_from(take(names::TASK_STATS)?)?,
            exited: BpfHashMap::try_from(take(names::EXITED)?)?,
            offcpu: [
                BpfHashMap::try_from(take(names::OFFCPU[0])?)?,
                BpfHashMap::try_from(take(names::OFFCPU[1])?)?,
            ],
            stacks: [
                StackTraceMap::try_from(take(names::OFFCPU_STACKS[0])?)?,
                StackTraceMap::try_from(take(names::OFFCPU_STACKS[1])?)?,
            ],
            user_stacks: [
                BpfHashMap::try_from(take(names::OFFCPU_USER_STACKS[0])?)?,
                BpfHashMap::try_from(take(names::OFFCPU_USER_STACKS[1])?)?,
            ],
            heat: match detail {
                true => Some(PerCpuArray::try_from(take(names::HEAT)?)?),
                false => None,
            },
            cpus: PerCpuArray::try_from(take(names::CPU_HISTORY)?)?,
            running: PerCpuArray::try_from(take(names::RUNNING)?)?,
            slow: RingBuf::try_from(take(names::SLOW_EVENTS)?)?,
        })
    }

    /// Once a second, after the epoch switched away from `old`: one heatmap column (where the
    /// heatmap is kept), and the entries of the tasks that exited since.
    fn drain(&mut self, old: usize) -> anyhow::Result<(Option<Vec<u64>>, Vec<TaskSched>)> {
        let column = self
            .heat
            .as_mut()
            .map(|heat| heat_column(heat, old))
            .transpose()?;
        let exited = (take_all(&self.exited).entries.into_iter())
            .map(|(_, task)| task)
            .collect();
        Ok((column, exited))
    }

    /// The slow events waiting in the ring buffer.
    fn read_slow(&mut self) -> Vec<SlowRecord> {
        let mut slow = Vec::new();
        while let Some(item) = self.slow.next() {
            if item.len() < std::mem::size_of::<SlowEvent>() {
                continue;
            }
            // SAFETY: the ring carries only `SlowEvent`s, checked for length above.
            let e: SlowEvent = unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) };
            slow.push(SlowRecord {
                pid: e.tgid,
                tid: e.tid,
                comm: comm_string(&e.comm),
                cpu: (e.cpu != profiler_common::CPU_UNKNOWN).then_some(e.cpu),
                delay_ns: e.delay_ns,
                at_ns: e.at_ns,
                waker: (e.waker.waker_tid != 0).then(|| {
                    (
                        e.waker.waker_tgid,
                        e.waker.waker_tid,
                        name_or_proc(&e.waker.waker_comm, e.waker.waker_tid),
                    )
                }),
                holders: e
                    .culprits
                    .iter()
                    .take(e.culprit_count as usize)
                    .map(|run| {
                        (
                            run.tid,
                            name_or_proc(&run.comm, run.tid),
                            run.start_ns,
                            run.end_ns,
                        )
                    })
                    .collect(),
            });
        }
        slow
    }

    /// The off-CPU time of the interval that ended at `flip` (see `offcpu`), leaving the slot
    /// empty for the interval after next; and the live tasks as read for it (one read of the
    /// task map a drain, for their sleeps and, when asked, their records). `exited`: the
    /// entries the exited map held at this drain, taken before.
    fn drain_offcpu(
        &mut self,
        flip: Flip,
        (sleeps, skipped): (&mut SleepsInFlight, &mut SkippedInEntries),
        exited: &[TaskSched],
        procs: &Processes,
    ) -> anyhow::Result<(Vec<RawSample>, Vec<LiveTask>)> {
        let slot = flip.slot;
        let mut ended: Vec<(SampleKey, OffCpuTime)> = take_all(&self.offcpu[slot]).entries;
        // In this order: a sleep not seen asleep here has its record in the live slot already.
        let tasks = read_all(&self.tasks);
        ended.extend(skipped.records(flip, exited, &tasks));
        // On the lean path a sleep's wake-up is known only once its run ends: a thread running
        // now woke before it arrived (its wait for the CPU is taken as sleep until then).
        let running: HashMap<u32, u64> = (self.running.get(&0, 0).into_iter())
            .flat_map(|per_cpu| per_cpu.iter().map(|r| (r.tid, r.since_ns)).collect::<Vec<_>>())
            .filter(|&(tid, _)| tid != 0)
            .collect();
        let asleep: Vec<Asleep> = (tasks.iter())
            .filter(|(_, t)| t.offcpu.at_ns != 0)
            .map(|&(tid, ref t)| Asleep {
                tid,
                comm: t.comm,
                start: t.offcpu,
                // (Never before the sleep began: see the kernel programs' `end_sleep`.)
                woke_ns: (t.enqueued.at_ns != 0)
                    .then_some(t.enqueued.at_ns.max(t.offcpu.at_ns))
                    .or_else(|| {
                        running
                            .get(&tid)
                            .copied()
                            .filter(|&since| since >= t.offcpu.at_ns)
                    }),
            })
            .collect();
        let ended_since: Vec<SampleKey> = (read_all(&self.offcpu[slot ^ 1]).into_iter())
            .map(|(key, _)| key)
            .filter(|k| k.user_unwound & BEGAN_EARLIER != 0)
            .collect();
        let stacks = SlotMaps {
            stacks: &self.stacks[slot],
            user_stacks: &self.user_stacks[slot],
        };
        let generation_of = |pid: u32| procs.current_generation(pid);
        let out = sleeps.drain(flip, ended, &asleep, &ended_since, &stacks, &generation_of);
        clear_stacks(&mut self.stacks[slot], &mut self.user_stacks[slot]);
        Ok((out, tasks))
    }
}

/// A live task's entry in the kernel's task map: its tid and its record.
type LiveTask = (u32, TaskSched);

/// The heatmap column of epoch slot `old` (waits per bucket, summed over the CPUs), its cells
/// zeroed for the slot's next interval.
fn heat_column(heat: &mut PerCpuArray<MapData, u64>, old: usize) -> anyhow::Result<Vec<u64>> {
    let cpus = aya::util::nr_cpus().map_err(|(what, e)| anyhow::anyhow!("{what}: {e}"))?;
    let mut column = vec![0u64; HEAT_BUCKETS];
    for (bucket, cell) in column.iter_mut().enumerate() {
        let index = (old * HEAT_BUCKETS + bucket) as u32;
        *cell = heat.get(&index, 0)?.iter().sum();
        if *cell > 0 {
            heat.set(index, PerCpuValues::try_from(vec![0u64; cpus])?, 0)?;
        }
    }
    Ok(column)
}

/// Every live task's record so far, as read from the kernel (its current state left open):
/// totals that only grow, as the kernel settled them.
fn live_tasks(tasks: &[LiveTask]) -> Vec<TaskRecord> {
    (tasks.iter()).map(|(_, task)| TaskRecord::from(task)).collect()
}

/// One slot's off-CPU stacks.
struct SlotMaps<'a> {
    stacks: &'a StackTraceMap<MapData>,
    user_stacks: &'a BpfHashMap<MapData, u32, UserStack>,
}

impl SlotStacks for SlotMaps<'_> {
    fn read(&self, key: &SampleKey) -> (StackRead, StackRead) {
        let user = match key.user_unwound & 1 {
            0 => read_stack(self.stacks, key.user_stack_id),
            _ => read_unwound(self.user_stacks, key.user_stack_id),
        };
        (user, read_stack(self.stacks, key.kernel_stack_id))
    }
}
