//! Scheduler programs: run-queue delay per task (wake-up or preemption → switch-in), off-CPU
//! time per blocked stack, and the slow waits with who woke the task and who held its CPU.
//! Everything aggregates in maps; only waits above the threshold are sent to user space.
use aya_ebpf::{
    bindings::BPF_F_USER_STACK,
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_get_smp_processor_id, bpf_ktime_get_ns},
    macros::{map, tracepoint},
    maps::{HashMap, PerCpuArray, RingBuf, StackTrace},
    programs::{tracing::StackIdContext as _, TracePointContext},
};
use profiler_common::{
    hist_bucket, Counter, CpuHistory, CpuRun, Enqueued, ExitedKey, OffCpuStart, OffCpuTime, SampleKey,
    SchedOffsets, SlowEvent, TaskSched, COMM_LEN, CPU_HISTORY, HEAT_BUCKETS, SLOW_CULPRITS,
    STACK_MAP_ENTRIES, TASK_EXITING_STATES, TASK_INTERRUPTIBLE, TASK_SLEEP_STATES, TASK_UNINTERRUPTIBLE,
};

use crate::{counters::bump, sampling::EPOCH, targets::is_target};

#[unsafe(no_mangle)]
static SCHED_OFFSETS: SchedOffsets = SchedOffsets {
    switch_prev_comm: 8,
    switch_prev_pid: 24,
    switch_prev_state: 32,
    switch_next_comm: 40,
    switch_next_pid: 56,
    wakeup_pid: 24,
    wakeup_comm: 8,
    _pad: 0,
};
/// 0: do not walk stacks at switch-out (off-CPU time is still timed, per task).
#[unsafe(no_mangle)]
static OFFCPU_STACKS_ENABLED: u32 = 1;
/// Waits at least this long are sent to user space as slow events.
#[unsafe(no_mangle)]
static SLOW_THRESHOLD_NS: u64 = 10_000_000;

#[map(name = "TASK_STATS")]
static TASK_STATS: HashMap<u32, TaskSched> = HashMap::with_max_entries(4096, 0);
/// Stats of tasks that exited since user space last drained (every second).
#[map(name = "EXITED")]
static EXITED: HashMap<ExitedKey, TaskSched> = HashMap::with_max_entries(2048, 0);
/// A zeroed `TaskSched` to insert from: the value is too large for the BPF stack.
#[map(name = "TASK_TEMPLATE")]
static TASK_TEMPLATE: PerCpuArray<TaskSched> = PerCpuArray::with_max_entries(1, 0);
#[map(name = "OFFCPU")]
static OFFCPU: HashMap<SampleKey, OffCpuTime> = HashMap::with_max_entries(16384, 0);
#[map(name = "OFFCPU_STACKS")]
static OFFCPU_STACKS: StackTrace = StackTrace::with_max_entries(STACK_MAP_ENTRIES, 0);
#[map(name = "CPU_HISTORY")]
static CPU_HISTORY_MAP: PerCpuArray<CpuHistory> = PerCpuArray::with_max_entries(1, 0);
/// Per-CPU heatmap counts of the current epoch: index = epoch slot * HEAT_BUCKETS + bucket.
#[map(name = "HEAT")]
static HEAT: PerCpuArray<u64> = PerCpuArray::with_max_entries(2 * HEAT_BUCKETS as u32, 0);
#[map(name = "SLOW_EVENTS")]
static SLOW_EVENTS: RingBuf = RingBuf::with_byte_size(256 * 1024, 0);

#[inline(always)]
fn offsets() -> SchedOffsets {
    unsafe { core::ptr::read_volatile(&SCHED_OFFSETS) }
}

#[inline(always)]
fn tracked(tid: u32) -> bool {
    tid != 0 && is_target(tid)
}

#[tracepoint]
pub fn sched_wakeup(ctx: TracePointContext) -> u32 {
    match try_wakeup(&ctx) {
        Ok(()) => 0,
        Err(_) => 1,
    }
}

#[tracepoint]
pub fn sched_wakeup_new(ctx: TracePointContext) -> u32 {
    match try_wakeup_new(&ctx) {
        Ok(()) => 0,
        Err(_) => 1,
    }
}

/// A new task's first event: whatever its tid held before (a task that died and was preempted
/// after its exit was recorded) is not its history, so it starts from a fresh entry.
fn try_wakeup_new(ctx: &TracePointContext) -> Result<(), i64> {
    let off = offsets();
    let tid: i32 = unsafe { ctx.read_at(off.wakeup_pid as usize) }.map_err(|e| e as i64)?;
    if tracked(tid as u32) {
        let _ = TASK_STATS.remove(tid as u32);
    }
    try_wakeup(ctx)
}

fn try_wakeup(ctx: &TracePointContext) -> Result<(), i64> {
    let off = offsets();
    let tid: i32 = unsafe { ctx.read_at(off.wakeup_pid as usize) }.map_err(|e| e as i64)?;
    let tid = tid as u32;
    if !tracked(tid) {
        return Ok(());
    }
    let Some(stats) = task_stats(ctx, tid, off.wakeup_comm) else {
        return Ok(());
    };
    let stats = unsafe { &mut *stats };
    // A task woken again while still queued keeps the time it first became runnable.
    if stats.enqueued.at_ns == 0 {
        let waker = bpf_get_current_pid_tgid();
        stats.enqueued = Enqueued {
            at_ns: unsafe { bpf_ktime_get_ns() },
            waker_tid: waker as u32,
            waker_tgid: (waker >> 32) as u32,
            waker_comm: bpf_get_current_comm().unwrap_or([0; COMM_LEN]),
        };
    }
    Ok(())
}

#[tracepoint]
pub fn sched_switch(ctx: TracePointContext) -> u32 {
    match try_switch(&ctx) {
        Ok(()) => 0,
        Err(_) => 1,
    }
}

fn try_switch(ctx: &TracePointContext) -> Result<(), i64> {
    bump(Counter::SchedSwitches);
    let off = offsets();
    let prev: i32 = unsafe { ctx.read_at(off.switch_prev_pid as usize) }.map_err(|e| e as i64)?;
    let next: i32 = unsafe { ctx.read_at(off.switch_next_pid as usize) }.map_err(|e| e as i64)?;
    let prev_state: i64 = unsafe { ctx.read_at(off.switch_prev_state as usize) }.map_err(|e| e as i64)?;
    let (prev, next, prev_state) = (prev as u32, next as u32, prev_state as u64);
    let now = unsafe { bpf_ktime_get_ns() };
    let history_start = remember_cpu_holder(ctx, &off, prev, now);
    if tracked(prev) {
        switch_out(ctx, &off, prev, prev_state, now);
    }
    if tracked(next) {
        switch_in(ctx, &off, next, now, history_start);
    }
    Ok(())
}

/// Append the outgoing task's stretch to this CPU's history. Returns the CPU's history.
#[inline(always)]
fn remember_cpu_holder(
    ctx: &TracePointContext,
    off: &SchedOffsets,
    prev: u32,
    now: u64,
) -> Option<*mut CpuHistory> {
    let history = CPU_HISTORY_MAP.get_ptr_mut(0)?;
    let history_ref = unsafe { &mut *history };
    let slot = (history_ref.next as usize) & (CPU_HISTORY - 1);
    if let Some(run) = history_ref.runs.get_mut(slot) {
        run.tid = prev;
        run.start_ns = history_ref.last_switch_ns;
        run.end_ns = now;
        run.comm = unsafe { ctx.read_at(off.switch_prev_comm as usize) }.unwrap_or([0; COMM_LEN]);
    }
    history_ref.next += 1;
    history_ref.last_switch_ns = now;
    Some(history)
}

#[inline(always)]
fn switch_out(ctx: &TracePointContext, off: &SchedOffsets, prev: u32, prev_state: u64, now: u64) {
    if prev_state & TASK_EXITING_STATES != 0 {
        // Its last switch-out: the exit tracepoint already moved its stats to EXITED.
        return;
    }
    let Some(stats) = task_stats(ctx, prev, off.switch_prev_comm) else {
        return;
    };
    let stats = unsafe { &mut *stats };
    if stats.last_in_ns != 0 && now > stats.last_in_ns {
        stats.running_ns += now - stats.last_in_ns;
    }
    // The switch tracepoint runs in the outgoing task's context: its tgid is current.
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    stats.tgid = tgid;
    if prev_state & TASK_SLEEP_STATES == 0 {
        // Preempted: still runnable, waiting for a CPU from now on. (Any earlier enqueue time
        // is stale: a wake-up that found the task still running.)
        stats.enqueued = Enqueued {
            at_ns: now,
            ..Default::default()
        };
    } else {
        stats.enqueued.at_ns = 0;
        // Its blocked stacks will need its memory map: have user space capture it now.
        crate::sampling::announce_once(tgid);
        stats.offcpu = OffCpuStart {
            at_ns: now,
            user_stack_id: stack_id(ctx, BPF_F_USER_STACK as u64),
            kernel_stack_id: stack_id(ctx, 0),
            state: prev_state as u32,
            tgid,
        };
    }
}

#[inline(always)]
fn stack_id(ctx: &TracePointContext, flags: u64) -> i32 {
    if unsafe { core::ptr::read_volatile(&OFFCPU_STACKS_ENABLED) } == 0 {
        return -14; // -EFAULT: "no stack", as for a kernel thread's user stack
    }
    match ctx.get_stackid(&OFFCPU_STACKS, flags) {
        Ok(id) => id as i32,
        Err(err) => err,
    }
}

/// The task's entry, created on first sight with its name read from the tracepoint at
/// `comm_offset`.
#[inline(always)]
fn task_stats(ctx: &TracePointContext, tid: u32, comm_offset: u32) -> Option<*mut TaskSched> {
    if let Some(stats) = TASK_STATS.get_ptr_mut(tid) {
        return Some(stats);
    }
    let template = TASK_TEMPLATE.get_ptr_mut(0)?;
    unsafe {
        (*template).tid = tid;
        (*template).comm = ctx.read_at(comm_offset as usize).unwrap_or([0; COMM_LEN]);
    }
    // By reference: a copy of the 2.5 KB value would not fit on the 512-byte BPF stack.
    #[allow(clippy::needless_borrows_for_generic_args)]
    if TASK_STATS.insert(tid, unsafe { &*template }, 1).is_err() {
        bump(Counter::TaskMapFull);
    }
    TASK_STATS.get_ptr_mut(tid)
}

#[inline(always)]
fn switch_in(
    ctx: &TracePointContext,
    off: &SchedOffsets,
    next: u32,
    now: u64,
    history: Option<*mut CpuHistory>,
) {
    let Some(stats) = task_stats(ctx, next, off.switch_next_comm) else {
        return;
    };
    let stats = unsafe { &mut *stats };
    stats.runs += 1;
    stats.last_in_ns = now;

    let enqueued = stats.enqueued;
    if enqueued.at_ns != 0 {
        stats.enqueued.at_ns = 0;
        let delay = now.saturating_sub(enqueued.at_ns);
        stats.delays += 1;
        stats.total_delay_ns += delay;
        if delay > stats.max_delay_ns {
            stats.max_delay_ns = delay;
            stats.max_at_ns = now;
        }
        // Through an opaque load and a mask: the optimizer must not fold the bounds check into
        // arithmetic the verifier cannot follow.
        let bucket = hist_bucket(delay);
        let bucket = unsafe { core::ptr::read_volatile(&bucket) } & 1023;
        if let Some(count) = stats.hist.get_mut(bucket) {
            *count += 1;
        }
        let slot = EPOCH.get(0).copied().unwrap_or(0) & 1;
        let heat = slot as usize * HEAT_BUCKETS + (bucket / 8).min(HEAT_BUCKETS - 1);
        if let Some(cell) = HEAT.get_ptr_mut(heat as u32) {
            unsafe { *cell += 1 };
        }
        if delay >= unsafe { core::ptr::read_volatile(&SLOW_THRESHOLD_NS) } {
            report_slow(stats, next, delay, now, &enqueued, history);
        }
    }

    let start = stats.offcpu;
    if start.at_ns != 0 {
        stats.offcpu.at_ns = 0;
        let blocked = now.saturating_sub(start.at_ns);
        if start.state as u64 & TASK_UNINTERRUPTIBLE != 0 {
            stats.blocked_ns += blocked;
        } else if start.state as u64 & TASK_INTERRUPTIBLE != 0 {
            stats.sleeping_ns += blocked;
        }
        let key = SampleKey {
            tgid: start.tgid,
            tid: next,
            user_stack_id: start.user_stack_id,
            kernel_stack_id: start.kernel_stack_id,
            comm: stats.comm,
        };
        if let Some(total) = OFFCPU.get_ptr_mut(key) {
            // Only this task's switch-in updates its keys: no other CPU writes them concurrently.
            unsafe {
                (*total).total_ns += blocked;
                (*total).count += 1;
            }
        } else if OFFCPU
            .insert(
                key,
                OffCpuTime {
                    total_ns: blocked,
                    count: 1,
                },
                0,
            )
            .is_err()
        {
            bump(Counter::OffCpuMapFull);
        }
    }
    let _ = ctx;
}

#[inline(always)]
fn report_slow(
    stats: &TaskSched,
    tid: u32,
    delay: u64,
    now: u64,
    enqueued: &Enqueued,
    history: Option<*mut CpuHistory>,
) {
    let Some(mut entry) = SLOW_EVENTS.reserve::<SlowEvent>(0) else {
        bump(Counter::SlowEventLost);
        return;
    };
    let event = entry.as_mut_ptr();
    unsafe {
        (*event).tid = tid;
        (*event).tgid = stats.tgid;
        (*event).cpu = bpf_get_smp_processor_id();
        (*event).delay_ns = delay;
        (*event).at_ns = now;
        (*event).comm = stats.comm;
        (*event).waker = *enqueued;
        (*event).culprit_count = 0;
        (*event).culprits = [CpuRun::default(); SLOW_CULPRITS];
    }
    if let Some(history) = history {
        let history = unsafe { &*history };
        let mut found = 0usize;
        // Newest first: the stretches of this CPU that overlap the wait.
        for back in 1..=CPU_HISTORY as u64 {
            let slot = (history.next.wrapping_sub(back) as usize) & (CPU_HISTORY - 1);
            let Some(run) = history.runs.get(slot) else { break };
            if run.end_ns <= enqueued.at_ns || run.tid == tid || found >= SLOW_CULPRITS {
                continue;
            }
            unsafe {
                if let Some(dst) = (*event).culprits.get_mut(found) {
                    *dst = *run;
                }
            }
            found += 1;
        }
        unsafe { (*event).culprit_count = found as u32 };
    }
    entry.submit(0);
}

/// A task exited: its stats move to `EXITED` (the tid may be reused at once), with the time it
/// was still running up to now.
#[inline(always)]
pub fn forget_task(tid: u32) {
    let Some(stats) = TASK_STATS.get_ptr_mut(tid) else {
        return;
    };
    let now = unsafe { bpf_ktime_get_ns() };
    unsafe {
        if (*stats).last_in_ns != 0 && now > (*stats).last_in_ns {
            (*stats).running_ns += now - (*stats).last_in_ns;
            (*stats).last_in_ns = 0;
        }
        (*stats).enqueued.at_ns = 0;
        (*stats).offcpu.at_ns = 0;
    }
    let key = ExitedKey {
        tid,
        _pad: 0,
        exited_at_ns: now,
    };
    // By reference: a copy of the 2.5 KB value would not fit on the 512-byte BPF stack.
    #[allow(clippy::needless_borrows_for_generic_args)]
    if EXITED.insert(key, unsafe { &*stats }, 0).is_err() {
        bump(Counter::ExitedMapFull);
    }
    let _ = TASK_STATS.remove(tid);
}
