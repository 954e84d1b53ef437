//! `sched record`: each scheduler event into the `SCHED_TIMELINE` ring as it happens (see
//! `profiler_common::timeline`), with the kernel's totals of the tasks it names. Every switch
//! on every CPU is sent, whoever it names, so a per-CPU map has no holes, and every exit;
//! wake-ups, migrations and forks only for the targets. A full ring drops the event and counts it.
use aya_ebpf::{
    helpers::{bpf_get_smp_processor_id, bpf_ktime_get_ns},
    macros::{map, raw_tracepoint},
    maps::{PerCpuArray, RingBuf},
    programs::RawTracePointContext,
};
use profiler_common::{
    timeline::{event_kind, SchedEvent, TaskSnap, TIMELINE_RING_BYTES},
    TaskOffsets,
};

use crate::{
    sched::{offsets, Task},
    targets::is_target,
};

#[map(name = "SCHED_TIMELINE")]
static SCHED_TIMELINE: RingBuf = RingBuf::with_byte_size(TIMELINE_RING_BYTES, 0);

#[map(name = "SCHED_TIMELINE_LOST")]
static SCHED_TIMELINE_LOST: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// `sched_switch(bool preempt, struct task_struct *prev, struct task_struct *next,
/// unsigned int prev_state)`.
#[raw_tracepoint(tracepoint = "sched_switch")]
pub fn timeline_switch(ctx: RawTracePointContext) -> u32 {
    let off = offsets();
    let (prev, next) = (snap(ctx.arg(1), &off), snap(ctx.arg(2), &off));
    let state = match off.switch_has_state_arg != 0 {
        true => ctx.arg::<u64>(3) as u32 as u64,
        false => Task(ctx.arg(1)).read::<u32>(off.state).unwrap_or(0) as u64,
    };
    let preempted = (ctx.arg::<u64>(0) & 0xff != 0) as u64;
    send(event_kind::SWITCH, prev, next, state | preempted << 32);
    0
}

#[raw_tracepoint(tracepoint = "sched_wakeup")]
pub fn timeline_wakeup(ctx: RawTracePointContext) -> u32 {
    woken(&ctx, event_kind::WAKEUP);
    0
}

#[raw_tracepoint(tracepoint = "sched_wakeup_new")]
pub fn timeline_wakeup_new(ctx: RawTracePointContext) -> u32 {
    woken(&ctx, event_kind::WAKEUP_NEW);
    0
}

/// `sched_migrate_task(struct task_struct *p, int dest_cpu)`.
#[raw_tracepoint(tracepoint = "sched_migrate_task")]
pub fn timeline_migrate(ctx: RawTracePointContext) -> u32 {
    let off = offsets();
    let task = snap(ctx.arg(0), &off);
    if task.target != 0 {
        send(
            event_kind::MIGRATE,
            task,
            TaskSnap::default(),
            ctx.arg::<u64>(1) as u32 as u64,
        );
    }
    0
}

/// `sched_process_fork(struct task_struct *parent, struct task_struct *child)`.
#[raw_tracepoint(tracepoint = "sched_process_fork")]
pub fn timeline_fork(ctx: RawTracePointContext) -> u32 {
    let off = offsets();
    let (parent, mut child) = (snap(ctx.arg(0), &off), snap(ctx.arg(1), &off));
    if parent.target != 0 || child.target != 0 {
        // A target's child is one (the target set follows it, maybe after this program).
        child.target = 1;
        send(event_kind::FORK, child, parent, 0);
    }
    0
}

/// `sched_process_exit(struct task_struct *p[, bool group_dead])`: every exit (a group's last
/// thread may already be out of the target set, which the views know it was in).
#[raw_tracepoint(tracepoint = "sched_process_exit")]
pub fn timeline_exit(ctx: RawTracePointContext) -> u32 {
    let off = offsets();
    send(event_kind::EXIT, snap(ctx.arg(0), &off), TaskSnap::default(), 0);
    0
}

/// A wake-up of a target, with its waker (the task running this program).
#[inline(always)]
fn woken(ctx: &RawTracePointContext, kind: u32) {
    let off = offsets();
    let task = snap(ctx.arg(0), &off);
    if task.target != 0 {
        let waker = snap(crate::sched::current_task(), &off);
        send(kind, task, waker, 0);
    }
}

/// A task as it stands (the idle task and unreadable ones: tid 0).
#[inline(always)]
fn snap(task: *const u8, off: &TaskOffsets) -> TaskSnap {
    let task = Task(task);
    let tid = task.tid(off).unwrap_or(0);
    let tgid = task.read::<i32>(off.tgid).map_or(0, |t| t as u32);
    TaskSnap {
        tid,
        tgid,
        comm: task.read(off.comm).unwrap_or_default(),
        totals: task.kernel_totals(off).unwrap_or_default(),
        target: (tid != 0 && is_target(tgid)) as u32,
        _pad: 0,
    }
}

#[inline(always)]
fn send(kind: u32, a: TaskSnap, b: TaskSnap, arg: u64) {
    let Some(mut entry) = SCHED_TIMELINE.reserve::<SchedEvent>(0) else {
        if let Some(lost) = SCHED_TIMELINE_LOST.get_ptr_mut(0) {
            // Per CPU, added to atomically: the fork and exit programs run with interrupts on.
            crate::atomic::atomic_add(lost, 1);
        }
        return;
    };
    entry.write(SchedEvent {
        time_ns: unsafe { bpf_ktime_get_ns() },
        cpu: unsafe { bpf_get_smp_processor_id() },
        kind,
        a,
        b,
        arg,
    });
    entry.submit(0);
}
