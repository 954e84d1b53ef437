//! Sched mode's collection: the kernel maps drained into per-task records, slow waits and
//! off-CPU stacks, plus the threads that never switched during the run.

use aya::{
    maps::{HashMap as BpfHashMap, MapData, PerCpuArray, PerCpuValues, RingBuf, StackTraceMap},
    Ebpf,
};
use profiler_common::{
    names, switch_reason, unwind::UserStack, ExitedKey, OffCpuTime, SampleKey, SlowEvent, TaskSched,
    BEGAN_EARLIER, HEAT_BUCKETS, HIST_BUCKETS,
};

use super::{
    latencies,
    offcpu::{Asleep, SleepsInFlight, SlotStacks},
    TaskLatency,
};
use crate::{
    collect::{clear_stacks, comm_string, read_stack, read_unwound, Flip},
    process::Processes,
    profile::{RawProfile, RawSample, StackRead},
};

/// How many slow waits a report keeps (the longest).
pub const SLOW_EVENTS_KEPT: usize = 50;

/// One task's scheduling statistics as collected (several entries for a reused tid).
#[derive(Clone, Debug)]
pub struct TaskRecord {
    pub pid: u32,
    pub tid: u32,
    pub comm: String,
    pub runs: u64,
    pub delays: u64,
    pub total_delay_ns: u64,
    pub max_delay_ns: u64,
    pub max_at_ns: u64,
    pub running_ns: u64,
    pub sleeping_ns: u64,
    pub blocked_ns: u64,
    pub hist: Vec<u32>,
    /// The state a task was still in when the run ended, and for how long so far.
    pub open: Option<(OpenState, u64)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenState {
    Running,
    Runnable,
    Sleeping,
    Blocked,
}

impl TaskRecord {
    fn add_wait(&mut self, delay: u64, ended_ns: u64) {
        self.delays += 1;
        self.total_delay_ns += delay;
        if delay > self.max_delay_ns {
            (self.max_delay_ns, self.max_at_ns) = (delay, ended_ns);
        }
        if let Some(count) = self.hist.get_mut(profiler_common::hist_bucket(delay)) {
            *count += 1;
        }
    }

    /// A task still alive at `now`: what it was doing, since when.
    fn with_open_interval(mut self, t: &TaskSched, now: u64) -> Self {
        let since = |at: u64| now.saturating_sub(at);
        if t.enqueued.at_ns != 0 && t.offcpu.at_ns != 0 && t.enqueued.at_ns > t.offcpu.at_ns {
            // Woken, not yet on a CPU: the sleep before the wake-up is over.
            let slept = t.enqueued.at_ns - t.offcpu.at_ns;
            match t.offcpu.reason {
                switch_reason::BLOCKED => self.blocked_ns += slept,
                _ => self.sleeping_ns += slept,
            }
        }
        self.open = if t.enqueued.at_ns != 0 {
            Some((OpenState::Runnable, since(t.enqueued.at_ns)))
        } else if t.offcpu.at_ns != 0 {
            let state = match t.offcpu.reason {
                switch_reason::BLOCKED => OpenState::Blocked,
                _ => OpenState::Sleeping,
            };
            Some((state, since(t.offcpu.at_ns)))
        } else if t.last_in_ns != 0 {
            if t.kernel_accounting != 0 && t.last_wait.at_ns != 0 && t.last_in_ns >= t.last_wait.at_ns {
                // The kernel's figures for this run and the wait before it are read as the run
                // ends, which it has not: the wait as the tracepoints timed it.
                self.add_wait(t.last_in_ns - t.last_wait.at_ns, t.last_in_ns);
                self.runs += 1;
            }
            Some((OpenState::Running, since(t.last_in_ns)))
        } else {
            None
        };
        self
    }
}

/// The process of a thread that never switched out under bpfprof (the kernel side learns a tgid
/// only then), while it is still alive.
fn tgid_of(tid: u32) -> u32 {
    std::fs::read_to_string(format!("/proc/{tid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Tgid:"))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}

#[cfg(test)]
impl TaskRecord {
    /// A task of pid 1 that waited these times for a CPU, each wait followed by a run.
    pub(crate) fn with_waits(tid: u32, comm: &str, waits: &[u64]) -> TaskRecord {
        let mut hist = vec![0u32; profiler_common::HIST_BUCKETS];
        for &w in waits {
            hist[profiler_common::hist_bucket(w)] += 1;
        }
        TaskRecord {
            pid: 1,
            tid,
            comm: comm.to_string(),
            runs: waits.len() as u64,
            delays: waits.len() as u64,
            total_delay_ns: waits.iter().sum(),
            max_delay_ns: waits.iter().copied().max().unwrap_or(0),
            max_at_ns: 0,
            running_ns: 0,
            sleeping_ns: 0,
            blocked_ns: 0,
            hist,
            open: None,
        }
    }
}

impl From<&TaskSched> for TaskRecord {
    fn from(t: &TaskSched) -> Self {
        TaskRecord {
            pid: if t.tgid != 0 { t.tgid } else { tgid_of(t.tid) },
            tid: t.tid,
            comm: comm_string(&t.comm),
            runs: t.runs,
            delays: t.delays,
            total_delay_ns: t.total_delay_ns,
            max_delay_ns: t.max_delay_ns,
            max_at_ns: t.max_at_ns,
            running_ns: t.running_ns,
            sleeping_ns: t.sleeping_ns,
            blocked_ns: t.blocked_ns,
            hist: t.hist.to_vec(),
            open: None,
        }
    }
}

/// A run-queue wait above the threshold, as the kernel reported it.
#[derive(Clone, Debug)]
pub struct SlowRecord {
    pub pid: u32,
    pub tid: u32,
    pub comm: String,
    /// None: settled away from the CPU it waited for (its holders are not known either).
    pub cpu: Option<u32>,
    pub delay_ns: u64,
    pub at_ns: u64,
    pub waker: Option<(u32, u32, String)>,
    /// (tid, name, start, end) of each task that held the CPU during the wait.
    pub holders: Vec<(u32, String, u64, u64)>,
}

/// A name the kernel side read; where it could not (the task had gone), what /proc says now.
fn name_or_proc(comm: &[u8], tid: u32) -> String {
    let name = comm_string(comm);
    if !name.is_empty() || tid == 0 {
        return name;
    }
    crate::process::comm_of(tid).unwrap_or_else(|| "?".into())
}

/// Everything collected by a sched run, before symbolization.
#[derive(Default)]
pub struct SchedCollection {
    pub tasks: Vec<TaskRecord>,
    /// Off-CPU stacks weighted by nanoseconds blocked, with the number of blocks as counter 0.
    pub offcpu_ns: RawProfile,
    /// Sleeps whose stacks were gone before they could be kept across a flip.
    pub offcpu_stacks_lost: u64,
    pub slow: Vec<SlowRecord>,
    pub slow_seen: u64,
    pub heat: Vec<Vec<u64>>,
    /// `bpf_ktime_get_ns()` (CLOCK_MONOTONIC) when sampling started.
    pub started_ns: u64,
    /// The targets' threads when tracing began, as (pid, tid): any of them without a single
    /// scheduler event by the end spent the whole run in one state (see `add_quiet_threads`).
    pub threads_at_start: Vec<(u32, u32)>,
}

/// The scheduler's maps and what has been read from them so far: drained with the samples, at
/// the same epoch flip.
pub struct SchedCollector {
    source: SchedMaps,
    pub collection: Box<SchedCollection>,
    sleeps: SleepsInFlight,
    /// Off-CPU time is kept in the collection (a run); otherwise each drain's is handed out.
    pub keep_offcpu: bool,
}

impl SchedCollector {
    /// The maps, and a collection starting now for the targets' threads of the moment.
    pub fn take(ebpf: &mut Ebpf, started_ns: u64, threads_at_start: Vec<(u32, u32)>) -> anyhow::Result<Self> {
        Ok(SchedCollector {
            source: SchedMaps::take(ebpf)?,
            collection: Box::new(SchedCollection {
                started_ns,
                threads_at_start,
                ..Default::default()
            }),
            sleeps: SleepsInFlight::default(),
            keep_offcpu: true,
        })
    }

    /// After `flip`: slow waits, a heatmap column, exited tasks, and the off-CPU time of the
    /// interval that ended: kept, or returned when `keep_offcpu` is off.
    pub fn drain(&mut self, flip: Flip, procs: &mut Processes) -> anyhow::Result<Vec<RawSample>> {
        self.source.read_slow(&mut self.collection);
        self.source.drain(flip.slot, &mut self.collection)?;
        let offcpu = self.source.drain_offcpu(flip, &mut self.sleeps, procs)?;
        self.collection.offcpu_stacks_lost = self.sleeps.stacks_lost;
        for sample in &offcpu {
            if let StackRead::Frames(ips) = &sample.user {
                let _ = procs.refresh_unless_covered(sample.pid, sample.exec_generation, ips);
            }
        }
        if !self.keep_offcpu {
            return Ok(offcpu);
        }
        for sample in offcpu {
            self.collection.offcpu_ns.add(sample, procs);
        }
        Ok(Vec::new())
    }

    /// Every live task's record so far, read from the kernel (its current state left open).
    pub fn live_tasks(&self) -> Vec<TaskRecord> {
        self.source
            .tasks
            .iter()
            .filter_map(Result::ok)
            .map(|(_, task)| TaskRecord::from(&task))
            .collect()
    }

    /// Sleeps being carried across flips now (for the agent's gauges).
    pub fn sleeps_carried(&self) -> usize {
        self.sleeps.kept()
    }

    /// Every task's waits settled so far, for a live view: totals that only grow, so that what
    /// grew since the last look is what happened since (a wait still in progress, or the one
    /// before a run still going, counts once settled: at the latest at the next switch).
    pub fn settled_latencies(&self) -> Vec<TaskLatency> {
        let records = self.source.tasks_settled(&self.collection);
        latencies(&records, self.collection.started_ns)
    }

    /// The collection, with the tasks still alive at `stopped_ns`.
    pub fn finish(mut self, stopped_ns: u64) -> anyhow::Result<Box<SchedCollection>> {
        self.source.finish(&mut self.collection, stopped_ns)?;
        Ok(self.collection)
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
    heat: PerCpuArray<MapData, u64>,
    slow: RingBuf<MapData>,
}

impl SchedMaps {
    fn take(ebpf: &mut Ebpf) -> anyhow::Result<Self> {
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
            heat: PerCpuArray::try_from(take(names::HEAT)?)?,
            slow: RingBuf::try_from(take(names::SLOW_EVENTS)?)?,
        })
    }

    /// Once a second, after the epoch switched away from `old`: one heatmap column, and the
    /// stats of the tasks that exited since.
    fn drain(&mut self, old: usize, into: &mut SchedCollection) -> anyhow::Result<()> {
        let cpus = aya::util::nr_cpus().map_err(|(what, e)| anyhow::anyhow!("{what}: {e}"))?;
        let mut column = vec![0u64; HEAT_BUCKETS];
        for (bucket, cell) in column.iter_mut().enumerate() {
            let index = (old * HEAT_BUCKETS + bucket) as u32;
            let values = self.heat.get(&index, 0)?;
            *cell = values.iter().sum();
            if *cell > 0 {
                self.heat
                    .set(index, PerCpuValues::try_from(vec![0u64; cpus])?, 0)?;
            }
        }
        into.heat.push(column);

        let exited: Vec<ExitedKey> = self.exited.keys().filter_map(Result::ok).collect();
        for key in exited {
            if let Ok(task) = self.exited.get(&key, 0) {
                into.tasks.push(TaskRecord::from(&task));
            }
            let _ = self.exited.remove(&key);
        }
        Ok(())
    }

    /// Every task's statistics so far as the kernel settled them, without taking anything: those
    /// that exited (in `into`) and those still alive (read from the kernel). For a live view.
    fn tasks_settled(&self, collected: &SchedCollection) -> Vec<TaskRecord> {
        let mut tasks = collected.tasks.clone();
        for (_, task) in self.tasks.iter().filter_map(Result::ok) {
            tasks.push(TaskRecord::from(&task));
        }
        tasks
    }

    /// Slow events waiting in the ring buffer; only the longest `SLOW_EVENTS_KEPT` are kept.
    fn read_slow(&mut self, into: &mut SchedCollection) {
        while let Some(item) = self.slow.next() {
            if item.len() < std::mem::size_of::<SlowEvent>() {
                continue;
            }
            // SAFETY: the ring carries only `SlowEvent`s, checked for length above.
            let e: SlowEvent = unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) };
            into.slow_seen += 1;
            into.slow.push(SlowRecord {
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
        if into.slow.len() > 4 * SLOW_EVENTS_KEPT {
            keep_longest(&mut into.slow);
        }
    }

    /// The off-CPU time of the interval that ended at `flip` (see `offcpu`), leaving the slot
    /// empty for the interval after next.
    fn drain_offcpu(
        &mut self,
        flip: Flip,
        sleeps: &mut SleepsInFlight,
        procs: &Processes,
    ) -> anyhow::Result<Vec<RawSample>> {
        let slot = flip.slot;
        let ended: Vec<(SampleKey, OffCpuTime)> = {
            let map = &mut self.offcpu[slot];
            let keys: Vec<SampleKey> = map.keys().filter_map(Result::ok).collect();
            let mut ended = Vec::with_capacity(keys.len());
            for key in keys {
                if let Ok(time) = map.get(&key, 0) {
                    ended.push((key, time));
                }
                let _ = map.remove(&key);
            }
            ended
        };
        // In this order: a sleep not seen asleep here has its record in the live slot already.
        let asleep: Vec<Asleep> = self
            .tasks
            .iter()
            .filter_map(Result::ok)
            .filter(|(_, t)| t.offcpu.at_ns != 0)
            .map(|(tid, t)| Asleep {
                tid,
                comm: t.comm,
                start: t.offcpu,
                woke_ns: (t.enqueued.at_ns != 0 && t.enqueued.at_ns >= t.offcpu.at_ns)
                    .then_some(t.enqueued.at_ns),
            })
            .collect();
        let ended_since: Vec<SampleKey> = self.offcpu[slot ^ 1]
            .keys()
            .filter_map(Result::ok)
            .filter(|k| k.user_unwound & BEGAN_EARLIER != 0)
            .collect();
        let stacks = SlotMaps {
            stacks: &self.stacks[slot],
            user_stacks: &self.user_stacks[slot],
        };
        let generation_of = |pid: u32| procs.current_generation(pid);
        let out = sleeps.drain(flip, ended, &asleep, &ended_since, &stacks, &generation_of);
        clear_stacks(&mut self.stacks[slot], &mut self.user_stacks[slot]);
        Ok(out)
    }

    /// At the end: the tasks still alive.
    fn finish(&mut self, into: &mut SchedCollection, now_ns: u64) -> anyhow::Result<()> {
        for (_, task) in self.tasks.iter().filter_map(Result::ok) {
            into.tasks
                .push(TaskRecord::from(&task).with_open_interval(&task, now_ns));
        }
        add_quiet_threads(into, now_ns);
        keep_longest(&mut into.slow);
        Ok(())
    }
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

/// Threads that neither woke, switched nor exited during the run: the kernel side never saw them,
/// yet they are part of the answer (the idle workers of a server are most of its threads). No
/// event means no change of state, so the state /proc shows now is the state of the whole run.
fn add_quiet_threads(into: &mut SchedCollection, now_ns: u64) {
    let seen: std::collections::HashSet<u32> = into.tasks.iter().map(|t| t.tid).collect();
    let whole_run = now_ns.saturating_sub(into.started_ns);
    for &(pid, tid) in &into.threads_at_start {
        if seen.contains(&tid) {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")) else {
            continue; // gone before tracing began (an exit during the run is an event)
        };
        let Some((comm, state)) = comm_and_state(&stat) else {
            continue;
        };
        let state = match state {
            'R' => OpenState::Running,
            'D' => OpenState::Blocked,
            // As `switch_reason::classify`: stopped, traced, parked and idle count as sleeping.
            _ => OpenState::Sleeping,
        };
        into.tasks.push(TaskRecord {
            pid,
            tid,
            comm,
            runs: 0,
            delays: 0,
            total_delay_ns: 0,
            max_delay_ns: 0,
            max_at_ns: 0,
            running_ns: 0,
            sleeping_ns: 0,
            blocked_ns: 0,
            hist: vec![0; HIST_BUCKETS],
            open: Some((state, whole_run)),
        });
    }
}

/// The name and state letter of a `/proc/PID/task/TID/stat` line: `tid (comm) S ...`, where the
/// name may itself hold spaces and parentheses.
fn comm_and_state(stat: &str) -> Option<(String, char)> {
    let (comm, fields) = crate::process::split_stat(stat)?;
    Some((comm.to_string(), fields.chars().next()?))
}

fn keep_longest(slow: &mut Vec<SlowRecord>) {
    slow.sort_by_key(|e| std::cmp::Reverse(e.delay_ns));
    slow.truncate(SLOW_EVENTS_KEPT);
}

#[cfg(test)]
mod tests {
    use super::*;
    use profiler_common::hist_bucket;

    #[test]
    fn a_run_still_going_at_the_end_brings_its_wait_where_the_kernel_has_not_counted_it_yet() {
        // SAFETY: TaskSched is plain old data; all-zero is a task with nothing recorded.
        let mut t: TaskSched = unsafe { std::mem::zeroed() };
        t.tid = 7;
        t.tgid = 7;
        (t.runs, t.delays, t.total_delay_ns) = (3, 3, 9_000);
        t.last_wait.at_ns = 1_000;
        t.last_in_ns = 5_000;
        let counted = |kernel_accounting| {
            let mut t = t;
            t.kernel_accounting = kernel_accounting;
            TaskRecord::from(&t).with_open_interval(&t, 9_000)
        };
        // The kernel's figures: this run and the wait before it are read at its switch-out.
        let kernel = counted(1);
        assert_eq!(
            (kernel.runs, kernel.delays, kernel.total_delay_ns),
            (4, 4, 13_000)
        );
        assert_eq!(kernel.hist[hist_bucket(4_000)], 1);
        assert_eq!(kernel.open, Some((OpenState::Running, 4_000)));
        // Timed at the tracepoints: both were counted as the run began.
        let tracepoints = counted(0);
        assert_eq!(
            (tracepoints.runs, tracepoints.delays, tracepoints.total_delay_ns),
            (3, 3, 9_000)
        );
        assert_eq!(tracepoints.open, Some((OpenState::Running, 4_000)));
    }

    #[test]
    fn names_and_states_are_read_past_parentheses_in_the_name() {
        assert_eq!(
            comm_and_state("42 (a) b (c)) S 1 42 0"),
            Some(("a) b (c)".to_string(), 'S'))
        );
        assert_eq!(comm_and_state("7 (w) D 1"), Some(("w".to_string(), 'D')));
        assert_eq!(comm_and_state("garbage"), None);
    }
}
