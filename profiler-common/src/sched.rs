//! Sched mode and topdown's thread states: per-task statistics, run-queue latency histograms,
//! off-CPU intervals and the slow-wait events, and the `task_struct` offsets they read.
use core::mem::size_of;

use crate::{unwind::StackReuse, COMM_LEN};

/// Latency histograms: log-linear, 2^HIST_SUB_BITS sub-buckets per power of two, so a bucket is
/// at most 1/16 (6.25%) wide relative to its values: fine enough for honest p50/p99.
pub const HIST_SUB_BITS: u32 = 4;
const HIST_SUB: u64 = 1 << HIST_SUB_BITS;
/// Covers 0 ns .. 2^40 ns (18 minutes); larger values land in the last bucket.
pub const HIST_BUCKETS: usize = 37 * 16;

/// The histogram bucket of a value (nanoseconds). Branch-light and loop-free for the verifier.
#[inline(always)]
pub fn hist_bucket(value: u64) -> usize {
    if value < HIST_SUB {
        return value as usize;
    }
    let exp = 63 - value.leading_zeros() as u64; // >= HIST_SUB_BITS
    let sub = (value >> (exp - HIST_SUB_BITS as u64)) & (HIST_SUB - 1);
    let index = ((exp - HIST_SUB_BITS as u64 + 1) * HIST_SUB + sub) as usize;
    if index < HIST_BUCKETS {
        index
    } else {
        HIST_BUCKETS - 1
    }
}

/// The smallest value in a bucket; the bucket holds values up to the next bucket's lower bound.
pub fn hist_lower_bound(index: usize) -> u64 {
    let index = index as u64;
    if index < HIST_SUB {
        return index;
    }
    let exp = index / HIST_SUB - 1 + HIST_SUB_BITS as u64;
    let sub = index % HIST_SUB;
    (HIST_SUB + sub) << (exp - HIST_SUB_BITS as u64)
}

/// Coarse buckets of the heatmap: 2 per power of two (every 8th histogram bucket).
pub const HEAT_BUCKETS: usize = HIST_BUCKETS / 8;

/// Key of `EXITED`: a task's stats move there when it exits, so its tid can be reused at once.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ExitedKey {
    pub tid: u32,
    pub _pad: u32,
    pub exited_at_ns: u64,
}
const _: () = assert!(size_of::<ExitedKey>() == 16);

/// When and why a task became runnable.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Enqueued {
    pub at_ns: u64,
    /// The task that woke it; 0 when it was preempted (still runnable).
    pub waker_tid: u32,
    pub waker_tgid: u32,
    /// The waker's `task_struct`; its name is read from it only for a slow wait.
    pub waker_task: u64,
    pub waker_comm: [u8; COMM_LEN],
}
const _: () = assert!(size_of::<Enqueued>() == 40);

/// When a task went to sleep, and where.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct OffCpuStart {
    pub at_ns: u64,
    pub user_stack_id: i32,
    pub kernel_stack_id: i32,
    /// Why it left the CPU: a `switch_reason`.
    pub reason: u32,
    pub tgid: u32,
    /// 1: `user_stack_id` names a table-unwound stack in `OFFCPU_USER_STACKS_n`.
    pub user_unwound: u32,
    /// The epoch generation it went to sleep in: its stacks are in that generation's slot.
    pub generation: u32,
}
const _: () = assert!(size_of::<OffCpuStart>() == 32);

/// Per-task scheduling statistics, keyed by tid in `TASK_STATS`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct TaskSched {
    pub tgid: u32,
    pub tid: u32,
    pub comm: [u8; COMM_LEN],
    /// Times the task was switched in (its timeslices; with the kernel's accounting, its count).
    pub runs: u64,
    /// Run-queue waits measured (switch-ins after a wake-up or preemption seen by bpfprof).
    pub delays: u64,
    pub total_delay_ns: u64,
    pub max_delay_ns: u64,
    /// `bpf_ktime_get_ns()` when the longest wait ended.
    pub max_at_ns: u64,
    /// Time spent switched out while sleeping (S) and blocked (D).
    pub sleeping_ns: u64,
    pub blocked_ns: u64,
    /// Time on a CPU, from switch-in to switch-out.
    pub running_ns: u64,
    /// When it was last switched in.
    pub last_in_ns: u64,
    /// Runnable since (0: not waiting for a CPU). Kept in the task's own entry, not a map of its
    /// own: wake-up, switch and exit of one task are serialized by its run-queue lock, so plain
    /// field writes replace hash-map inserts and deletes on the hottest path of the kernel.
    pub enqueued: Enqueued,
    /// Blocked since (0: not off CPU).
    pub offcpu: OffCpuStart,
    /// With the kernel's accounting: its totals at this task's last switch-out (or first
    /// sight), and the wake-up that began the wait before its current run. A wait's delay and a
    /// run's time are the growth of those totals from one switch-out to the next, so they are
    /// counted at the switch-out that ends the run.
    pub kernel: KernelTotals,
    pub last_wait: Enqueued,
    /// 1: `kernel` holds the kernel's totals (delay and running time are the kernel's own).
    pub kernel_accounting: u32,
    /// 1 from a switch-out to the next switch-in. A switch-in that finds 0 after an earlier one
    /// follows a switch-out the tracepoint never showed (seen here: a thread of the VM's init
    /// switched in every second, never out): its run and wait are settled then, from the kernel's
    /// totals, instead of being taken for one run that never ends.
    pub switched_out: u32,
    /// The CPU of its last switch-in: where its current run is, and the wait before it ended.
    pub last_cpu: u32,
    /// 1: `kernel` was taken while the task was off every CPU (at its birth, `sched_wakeup_new`,
    /// or at a switch-out), so all its growth is whole runs, counted even when the switch-in
    /// that began the run was never shown. 0: taken mid-run (first seen running), whose part
    /// before bpfprof saw it is not counted.
    pub base_exact: u32,
    /// The exec generation of the process `exec_of` (0: none read yet), read at a switch-out and
    /// kept until the task execs: each sleep's key carries it without a lookup of its own.
    pub exec_of: u32,
    pub exec_generation: u32,
    /// The epoch of its last sleep, and how many of its sleeps since that epoch began had their
    /// stacks taken whatever the draw (`OffCpuSampling::exact`).
    pub stacks_epoch: u32,
    pub stacks_exact: u32,
    /// How far its process was announced since `exec_of` was read (a `seen` level; 0: not yet):
    /// a switch-out asks `SEEN` only when it needs more.
    pub announced: u32,
    pub _reserved: u32,
    /// Its `task_struct` when the entry was made: on the lean path, the entry a dying task made
    /// after its exit was recorded is told from a new task's that took its tid.
    pub task: u64,
    /// Its short sleeps whose stacks were not taken (`STACK_SKIPPED`) that began and ended in
    /// one epoch, by the epoch's slot: summed here, in the entry every switch-out holds, where a
    /// record of each in the off-CPU map cost a lookup of its key; user space reads the drained
    /// slot's (see `SkippedSleeps`).
    pub skipped: [SkippedSleeps; 2],
    /// Its last off-CPU walk that reached the stack's end, to be taken again (see `StackReuse`):
    /// in its own entry, which every switch-out reads already, where a map of its own cost a
    /// lookup per sleep (all zero until a walk: a `tgid` of 0 matches no process).
    pub offcpu_reuse: StackReuse,
    pub hist: [u32; HIST_BUCKETS],
}
const _: () = assert!(
    size_of::<TaskSched>()
        == 96 + 40 + 32 + 24 + 40 + 16 + 8 + 8 + 8 + 8 + 32 + size_of::<StackReuse>() + 4 * HIST_BUCKETS
);

/// A thread's skipped sleeps of one epoch (`generation`; a slot still holding an older one's is
/// reset by the first of the new): what the off-CPU map's record of them would hold.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SkippedSleeps {
    pub generation: u32,
    pub count: u32,
    pub total_ns: u64,
}
const _: () = assert!(size_of::<SkippedSleeps>() == 16);

/// Total blocked time per (thread, stacks): the value of `OFFCPU`, keyed by `SampleKey`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct OffCpuTime {
    pub total_ns: u64,
    pub count: u64,
}
const _: () = assert!(size_of::<OffCpuTime>() == 16);

/// One stretch of a CPU's time held by one task.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuRun {
    pub tid: u32,
    pub _pad: u32,
    /// Its `task_struct`, to read its name only if a slow wait needs it (all-zero name when
    /// the task has gone since: user space then asks /proc).
    pub task: u64,
    pub start_ns: u64,
    pub end_ns: u64,
    pub comm: [u8; COMM_LEN],
}
const _: () = assert!(size_of::<CpuRun>() == 48);

/// Off-CPU keys (thread, stacks) per epoch slot: a slot holds one drain interval's sleeps.
pub const OFFCPU_ENTRIES: u32 = 8 * 1024;
/// Stacks taken at switch-out per epoch slot (each slot holds one drain interval's).
pub const OFFCPU_STACK_ENTRIES: u32 = 8 * 1024;

/// Run-queue waits of the traced tasks, summed (one CPU's).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuWaits {
    pub waits: u64,
    pub delay_ns: u64,
    pub max_delay_ns: u64,
}
const _: () = assert!(size_of::<CpuWaits>() == 24);

impl CpuWaits {
    #[inline(always)]
    pub fn add(&mut self, delay: u64) {
        self.waits += 1;
        self.delay_ns += delay;
        if delay > self.max_delay_ns {
            self.max_delay_ns = delay;
        }
    }
}

/// Recent tasks on one CPU (a small ring), to name who held the CPU while a task waited; and
/// the traced tasks' run-queue waits on it since tracing began.
pub const CPU_HISTORY: usize = 8;
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CpuHistory {
    pub next: u64,
    pub last_switch_ns: u64,
    pub runs: [CpuRun; CPU_HISTORY],
    /// The waits for this CPU (each counted on the CPU it ended on, where the task then ran).
    pub waits: CpuWaits,
    /// Waits settled here whose CPU is not known: a switch-out the tracepoint never showed ended
    /// the run that followed them, perhaps on another CPU (see `SwitchOutsMissed`).
    pub unplaced: CpuWaits,
}
const _: () = assert!(size_of::<CpuHistory>() == 16 + 48 * CPU_HISTORY + 2 * 24);

/// Per CPU (`RUNNING`): the traced task it runs now and since when (its switch-in), for the
/// scheduler programs' lean path, where a switch-in writes only this (see `sched.rs`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Running {
    pub tid: u32,
    pub _pad: u32,
    pub since_ns: u64,
}
const _: () = assert!(size_of::<Running>() == 16);

/// How many CPU holders a slow event names.
pub const SLOW_CULPRITS: usize = 4;

/// A slow event's `cpu` when the wait was settled away from the CPU it ended on (a switch-out
/// the tracepoint never showed): then its CPU holders are not known either.
pub const CPU_UNKNOWN: u32 = u32::MAX;

/// A run-queue wait longer than the threshold, sent to user space as it happens.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct SlowEvent {
    pub tid: u32,
    pub tgid: u32,
    /// The CPU it waited for, or `CPU_UNKNOWN`.
    pub cpu: u32,
    pub culprit_count: u32,
    pub delay_ns: u64,
    pub at_ns: u64,
    pub comm: [u8; COMM_LEN],
    pub waker: Enqueued,
    pub culprits: [CpuRun; SLOW_CULPRITS],
}
const _: () = assert!(size_of::<SlowEvent>() == 48 + 40 + 48 * SLOW_CULPRITS);

/// Where the running kernel keeps what the raw sched tracepoints read from a `task_struct`,
/// from its BTF at start-up.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TaskOffsets {
    pub pid: u32,
    pub comm: u32,
    /// `__state` (`state` before 5.14): read only where `sched_switch` does not pass it.
    pub state: u32,
    /// 1 when `sched_switch` passes `prev_state` as its fourth argument (5.18 and later).
    pub switch_has_state_arg: u32,
    /// `sched_info.pcount` (followed by `run_delay`, read together as a `SchedInfoHead`) and
    /// `se.sum_exec_runtime`: the kernel's own count of runs, run-queue delay and time on a CPU
    /// (what /proc/PID/task/TID/schedstat prints). 0 where the kernel has no `CONFIG_SCHED_INFO`
    /// or its BTF does not say: then they are counted and timed at the tracepoints.
    pub sched_info: u32,
    pub sum_exec_runtime: u32,
    pub tgid: u32,
    /// `se.cfs_rq`, `cfs_rq.rq` and `rq.clock`: the run queue's clock, which the scheduler
    /// brought up to date for the switch (read at a switch instead of `bpf_ktime_get_ns`, see
    /// the kernel programs' `clock.rs`). `rq_clock` 0 where the BTF does not say (no
    /// `CONFIG_FAIR_GROUP_SCHED`): then the switch reads `bpf_ktime_get_ns`.
    pub se_cfs_rq: u32,
    pub cfs_rq_rq: u32,
    pub rq_clock: u32,
    /// `vfork_done`: set in a child of `vfork` until it execs or exits (0: not known).
    pub vfork_done: u32,
    /// Where a process's labels are read, as it is announced.
    pub labels: LabelOffsets,
}
const _: () = assert!(size_of::<TaskOffsets>() == 44 + 32);

/// Where the kernel keeps a process's name and the identity of its executable file:
/// `task->group_leader->comm`, `task->mm->exe_file->f_inode->{i_ino, i_generation,
/// i_sb->s_dev}`. `mm` 0: not known (the labels are read from `/proc`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LabelOffsets {
    pub group_leader: u32,
    pub mm: u32,
    pub exe_file: u32,
    pub f_inode: u32,
    pub i_ino: u32,
    pub i_generation: u32,
    pub i_sb: u32,
    pub s_dev: u32,
}

/// Where the kernel says a task is in the middle of an exec, from its BTF (0: not known):
/// `task->fs->in_exec` (set from the exec's start; cleared at its end up to 6.13, since 6.14 once
/// the new memory is in place) and `mm->start_stack` (0 in the new memory until the image is
/// loaded). Apart from `TaskOffsets`, which `sched_switch` copies onto its stack whole, at the
/// 6.1 verifier's limit: read one field at a time.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExecOffsets {
    pub fs: u32,
    pub in_exec: u32,
    pub start_stack: u32,
}
const _: () = assert!(size_of::<ExecOffsets>() == 12);

impl TaskOffsets {
    /// The kernel's own accounting can be read.
    pub fn kernel_accounting(&self) -> bool {
        self.sched_info != 0 && self.sum_exec_runtime != 0
    }
}

/// The head of the kernel's `struct sched_info`: runs so far (arrivals on a CPU) and the time
/// spent runnable, waiting for a CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct SchedInfoHead {
    pub pcount: u64,
    pub run_delay_ns: u64,
}
const _: () = assert!(size_of::<SchedInfoHead>() == 16);

/// A task's `sched_info` head and `se.sum_exec_runtime` when bpfprof last read them.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct KernelTotals {
    pub sched_info: SchedInfoHead,
    pub sum_exec_ns: u64,
}
const _: () = assert!(size_of::<KernelTotals>() == 24);

/// The scheduler's raw task states (`include/linux/sched.h`), as `sched_switch` sees them.
pub mod task_state {
    pub const UNINTERRUPTIBLE: u64 = 0x2;
    pub const DEAD: u64 = 0x80;
    /// With UNINTERRUPTIBLE: `TASK_IDLE`, an idle kernel thread, not I/O.
    pub const NOLOAD: u64 = 0x400;
    /// A sleeping lock on PREEMPT_RT: uninterruptible.
    pub const RTLOCK_WAIT: u64 = 0x1000;
}

/// Which stacks the switch program walks when a task goes to sleep (`OFFCPU_STACKS_ENABLED`).
pub mod offcpu_stacks {
    pub const NONE: u32 = 0;
    /// User stacks; kernel stacks only for uninterruptible sleeps and kernel threads.
    pub const AUTO: u32 = 1;
    pub const ALL: u32 = 2;
}

/// Which sleeps get their stacks taken (the agent's: a stack walked or checked at every
/// switch-out is most of a switch's cost on a switch-heavy machine). Each thread's first `exact`
/// sleeps of every epoch (a second) get theirs; after them, one sleep in `every` at random
/// (`STACK_DRAWN`), the others none (`STACK_SKIPPED`, their time still the thread's). `every`
/// 1: every sleep (sched mode).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OffCpuSampling {
    pub every: u32,
    pub exact: u32,
    /// A skipped sleep at least this long is kept apart (`SKIPPED_LONG`).
    pub long_ns: u64,
}
const _: () = assert!(size_of::<OffCpuSampling>() == 16);

impl OffCpuSampling {
    pub const EVERY_SLEEP: OffCpuSampling = OffCpuSampling {
        every: 1,
        exact: 0,
        long_ns: u64::MAX,
    };
}

/// How a task left the CPU, reduced from its raw state by the switch program.
pub mod switch_reason {
    pub const PREEMPTED: u32 = 0;
    /// Waiting for an event; also stopped, traced, parked and idle kernel threads.
    pub const SLEEPING: u32 = 1;
    /// Uninterruptible sleep (I/O, kernel locks), not counting idle kernel threads.
    pub const BLOCKED: u32 = 2;
    pub const EXITING: u32 = 3;

    /// The reason for a switch-out from `sched_switch`'s `preempt` and `prev_state`. A preempted
    /// task stays runnable whatever its state says (it was preempted on its way to sleep).
    #[inline(always)]
    pub const fn classify(preempt: bool, prev_state: u64) -> u32 {
        use super::task_state::*;
        if preempt || prev_state == 0 {
            PREEMPTED
        } else if prev_state & DEAD != 0 {
            EXITING
        } else if prev_state & RTLOCK_WAIT != 0
            || (prev_state & UNINTERRUPTIBLE != 0 && prev_state & NOLOAD == 0)
        {
            BLOCKED
        } else {
            SLEEPING
        }
    }
}
