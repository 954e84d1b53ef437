//! Scheduler programs: run-queue delay per task (wake-up or preemption → switch-in), off-CPU
//! time per blocked stack, and the slow waits with who woke the task and who held its CPU.
//! Everything aggregates in maps; only waits above the threshold are sent to user space.
//!
//! They are BTF tracepoints: the kernel passes its `task_struct` pointers straight through
//! instead of first formatting a record for the classic tracepoint, which on a switch-heavy
//! machine is a large part of the cost, and the verifier knows them by their BTF type, so their
//! fields (tid, tgid, the kernel's own totals) are plain loads at offsets user space takes from
//! the kernel's BTF, where a raw tracepoint's pointer costs a helper call per read (measured here:
//! 75 ns of a wake-up's 377). The off-CPU walker they tail-call is loaded as the same kind.
use aya_ebpf::{
    bindings::BPF_F_USER_STACK,
    helpers::{
        bpf_get_current_comm, bpf_get_current_task_btf, bpf_get_smp_processor_id, bpf_ktime_get_ns,
        bpf_probe_read_kernel,
    },
    macros::{btf_tracepoint, map},
    maps::{HashMap, PerCpuArray, RingBuf, StackTrace},
    programs::{tracing::StackIdContext as _, BtfTracePointContext},
};
use profiler_common::{
    hist_bucket,
    lock::NO_STACK,
    offcpu_stacks, said, seen, switch_reason,
    unwind::{StackReuse, Walk},
    CpuHistory, CpuRun, Enqueued, ExecOffsets, ExitedKey, FileId, HealthCounter, KernelTotals, LabelOffsets,
    OffCpuSampling, OffCpuStart, OffCpuTime, ProcessEvent, Running, SampleKey, SchedInfoHead, SkippedSleeps,
    SlowEvent, TaskOffsets, TaskSched, BEGAN_EARLIER, COMM_LEN, CPU_HISTORY, CPU_UNKNOWN, HEAT_BUCKETS,
    OFFCPU_ENTRIES, OFFCPU_STACK_ENTRIES, SKIPPED_LONG, SLOW_CULPRITS, STACK_DRAWN, STACK_SKIPPED,
};

use crate::{health::bump, sampling::EPOCH, targets::is_target};

#[unsafe(no_mangle)]
static TASK_OFFSETS: TaskOffsets = TaskOffsets {
    pid: 0,
    comm: 0,
    state: 0,
    switch_has_state_arg: 1,
    sched_info: 0,
    sum_exec_runtime: 0,
    tgid: 0,
    se_cfs_rq: 0,
    cfs_rq_rq: 0,
    rq_clock: 0,
    vfork_done: 0,
    labels: LabelOffsets {
        group_leader: 0,
        mm: 0,
        exe_file: 0,
        f_inode: 0,
        i_ino: 0,
        i_generation: 0,
        i_sb: 0,
        s_dev: 0,
    },
};
/// Where the kernel says a task is in the middle of an exec (see `ExecOffsets`), read a field at
/// a time: apart from `TASK_OFFSETS`, which `sched_switch` copies onto its stack whole, 8 bytes
/// more there and 6.1's verifier refuses it (its frame and a call's may not pass 512 bytes).
#[unsafe(no_mangle)]
static EXEC_OFFSETS: ExecOffsets = ExecOffsets {
    fs: 0,
    in_exec: 0,
    start_stack: 0,
};
/// An `offcpu_stacks` policy. A kernel stack walk costs about three times a user one (measured
/// here: ~3 us against ~1 us), so `AUTO` walks it only where the kernel is the reason for the
/// sleep: uninterruptible sleeps (I/O, kernel locks) and kernel threads. A voluntary wait (futex,
/// poll, read, nanosleep) is named by its user stack.
#[unsafe(no_mangle)]
static OFFCPU_STACKS_ENABLED: u32 = offcpu_stacks::AUTO;
/// Waits at least this long are sent to user space as slow events.
#[unsafe(no_mangle)]
static SLOW_THRESHOLD_NS: u64 = 10_000_000;
/// 1: each CPU's history of who held it, the per-CPU waits, the heatmap and each wait's waker,
/// for sched mode's report and its slow events. 0 (the agent, whose profiles read none of them):
/// each switch keeps only the thread's own figures.
#[unsafe(no_mangle)]
static SCHED_DETAIL: u32 = 1;
/// Which sleeps get their stacks taken: every one (sched mode), or the agent's draw.
#[unsafe(no_mangle)]
static OFFCPU_SAMPLING: OffCpuSampling = OffCpuSampling::EVERY_SLEEP;

#[inline(always)]
fn sampling() -> OffCpuSampling {
    unsafe { core::ptr::read_volatile(&OFFCPU_SAMPLING) }
}

#[inline(always)]
fn detail() -> bool {
    unsafe { core::ptr::read_volatile(&SCHED_DETAIL) != 0 }
}

#[map(name = "TASK_STATS")]
static TASK_STATS: HashMap<u32, TaskSched> = HashMap::with_max_entries(4096, 0);
/// Stats of tasks that exited since user space last drained (every second).
#[map(name = "EXITED")]
static EXITED: HashMap<ExitedKey, TaskSched> = HashMap::with_max_entries(2048, 0);
/// A zeroed `TaskSched` to insert from: the value is too large for the BPF stack.
#[map(name = "TASK_TEMPLATE")]
static TASK_TEMPLATE: PerCpuArray<TaskSched> = PerCpuArray::with_max_entries(1, 0);
/// Off-CPU time by stack, in the epoch slot of the moment each sleep ended; its stacks are in
/// the slot of the moment it began (see `BEGAN_EARLIER`).
#[map(name = "OFFCPU_0")]
static OFFCPU_0: HashMap<SampleKey, OffCpuTime> = HashMap::with_max_entries(OFFCPU_ENTRIES, 0);
#[map(name = "OFFCPU_1")]
static OFFCPU_1: HashMap<SampleKey, OffCpuTime> = HashMap::with_max_entries(OFFCPU_ENTRIES, 0);
#[map(name = "OFFCPU_STACKS_0")]
static OFFCPU_STACKS_0: StackTrace = StackTrace::with_max_entries(OFFCPU_STACK_ENTRIES, 0);
#[map(name = "OFFCPU_STACKS_1")]
static OFFCPU_STACKS_1: StackTrace = StackTrace::with_max_entries(OFFCPU_STACK_ENTRIES, 0);
#[map(name = "CPU_HISTORY")]
static CPU_HISTORY_MAP: PerCpuArray<CpuHistory> = PerCpuArray::with_max_entries(1, 0);
/// Per-CPU heatmap counts of the current epoch: index = epoch slot * HEAT_BUCKETS + bucket.
#[map(name = "HEAT")]
static HEAT: PerCpuArray<u64> = PerCpuArray::with_max_entries(2 * HEAT_BUCKETS as u32, 0);
#[map(name = "SLOW_EVENTS")]
static SLOW_EVENTS: RingBuf = RingBuf::with_byte_size(256 * 1024, 0);
/// Per CPU, the state of `draw_number`'s generator.
#[map(name = "DRAWS")]
static DRAWS: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);
/// Per CPU, the traced task it runs and since when: all a switch-in writes on the lean path.
#[map(name = "RUNNING")]
static RUNNING: PerCpuArray<Running> = PerCpuArray::with_max_entries(1, 0);

/// The lean path, the agent's (no per-CPU detail, and the kernel keeps each task's run-queue
/// delay and running time): no wake-up program, and a switch-in writes only its CPU's
/// `RUNNING`. A task's entry is brought up to date at the switch-out that ends its run, which
/// looks it up anyway: its switch-in replayed there (`arrived_late`), its wake-up placed by the
/// kernel's own count of the wait before it. One task-map lookup a switch, where the full path
/// takes three a sleep (wake-up, switch-in, switch-out). User space attaches accordingly.
#[inline(always)]
fn lean(off: &TaskOffsets) -> bool {
    !detail() && off.kernel_accounting()
}

#[inline(always)]
pub(crate) fn offsets() -> TaskOffsets {
    unsafe { core::ptr::read_volatile(&TASK_OFFSETS) }
}

/// A `task_struct` the tracepoint passed.
#[derive(Clone, Copy)]
pub(crate) struct Task(pub(crate) *const u8);

impl Task {
    #[inline(always)]
    pub(crate) fn read<T>(self, offset: u32) -> Result<T, i64> {
        unsafe { bpf_probe_read_kernel(self.0.wrapping_add(offset as usize) as *const T) }
            .map_err(|e| e as i64)
    }

    #[inline(always)]
    pub(crate) fn tid(self, off: &TaskOffsets) -> Result<u32, i64> {
        self.read::<i32>(off.pid).map(|tid| tid as u32)
    }

    /// The kernel's own runs, run-queue delay and time on a CPU for this task so far, where it
    /// keeps them. `sum_exec_runtime` is brought up to date before `sched_switch` fires for the
    /// task leaving; `pcount` and `run_delay` grow when a task arrives on a CPU, after
    /// `sched_switch` for it.
    #[inline(always)]
    pub(crate) fn kernel_totals(self, off: &TaskOffsets) -> Option<KernelTotals> {
        if !off.kernel_accounting() {
            return None;
        }
        Some(KernelTotals {
            sched_info: self.read(off.sched_info).ok()?,
            sum_exec_ns: self.read(off.sum_exec_runtime).ok()?,
        })
    }
}

/// A task the verifier knows by the kernel's BTF type (the one running this program, or a BTF
/// tracepoint's argument): its fields are plain loads at offsets fixed at load time (the
/// verifier reads them from the frozen `.rodata`), where a `Task` costs a helper call per read.
#[derive(Clone, Copy)]
struct BtfTask(*const u8);

impl BtfTask {
    /// The task running this program.
    #[inline(always)]
    fn current() -> BtfTask {
        BtfTask(unsafe { bpf_get_current_task_btf() } as *const u8)
    }

    /// The task a BTF tracepoint passed as its argument `n`.
    #[inline(always)]
    fn arg(ctx: &BtfTracePointContext, n: usize) -> BtfTask {
        BtfTask(ctx.arg(n))
    }

    #[inline(always)]
    fn field<T: Copy>(self, offset: u32) -> T {
        unsafe { core::ptr::read(self.0.wrapping_add(offset as usize) as *const T) }
    }

    #[inline(always)]
    fn tid(self, off: &TaskOffsets) -> u32 {
        self.field::<i32>(off.pid) as u32
    }

    #[inline(always)]
    fn tgid(self, off: &TaskOffsets) -> u32 {
        self.field::<i32>(off.tgid) as u32
    }

    /// A child of `vfork` that has not exec'd yet: it runs in its parent's memory, as its parent.
    #[inline(always)]
    fn before_exec_of_vfork(self, off: &TaskOffsets) -> bool {
        off.vfork_done != 0 && self.field::<u64>(off.vfork_done) != 0
    }

    /// In the middle of an exec (see `ExecOffsets`): its memory, name and executable may be the
    /// old image's or the new one's, each. Never where the BTF did not say where to look.
    #[inline(always)]
    fn in_exec(self, off: &TaskOffsets) -> bool {
        let read = |field: &u32| unsafe { core::ptr::read_volatile(field) };
        let (fs_at, in_exec) = (read(&EXEC_OFFSETS.fs), read(&EXEC_OFFSETS.in_exec));
        if fs_at != 0 && in_exec != 0 {
            let fs = self.field::<*const u8>(fs_at);
            if !fs.is_null() && BtfTask(fs).field::<i32>(in_exec) != 0 {
                return true;
            }
        }
        let (mm_at, start_stack) = (off.labels.mm, read(&EXEC_OFFSETS.start_stack));
        if mm_at == 0 || start_stack == 0 {
            return false;
        }
        let mm = self.field::<*const u8>(mm_at);
        !mm.is_null() && BtfTask(mm).field::<u64>(start_stack) == 0
    }

    /// Write who this task's process is, as it runs (see `LabelOffsets`), into its announcement:
    /// its leader's name and its executable file, where the BTF said where they are; else its
    /// name only from its leader.
    #[inline(always)]
    fn write_labels(self, off: &TaskOffsets, tid: u32, tgid: u32, generation: u32, event: &mut ProcessEvent) {
        let at = &off.labels;
        event.generation = generation;
        if at.mm == 0 {
            if tid == tgid {
                let comm = event.comm.as_mut_ptr() as *mut core::ffi::c_void;
                unsafe { aya_ebpf::helpers::generated::bpf_get_current_comm(comm, COMM_LEN as u32) };
            }
            return;
        }
        let leader = BtfTask(self.field::<*const u8>(at.group_leader));
        event.comm = leader.field(off.comm);
        event.executable = self.executable(at);
        event.labels = said::LABELS | said::EXECUTABLE;
    }

    /// `mm->exe_file->f_inode`'s identity; all zero where the task has no memory (a kernel
    /// thread). The pointers are the verifier's to check: a load through one that faults reads 0.
    #[inline(always)]
    fn executable(self, at: &LabelOffsets) -> FileId {
        let mm = self.field::<*const u8>(at.mm);
        if mm.is_null() {
            return FileId::default();
        }
        let file = BtfTask(mm).field::<*const u8>(at.exe_file);
        if file.is_null() {
            return FileId::default();
        }
        let inode = BtfTask(BtfTask(file).field::<*const u8>(at.f_inode));
        FileId {
            inode: inode.field(at.i_ino),
            dev: BtfTask(inode.field::<*const u8>(at.i_sb)).field(at.s_dev),
            generation: inode.field(at.i_generation),
        }
    }

    /// As `Task::kernel_totals`.
    #[inline(always)]
    fn kernel_totals(self, off: &TaskOffsets) -> Option<KernelTotals> {
        if !off.kernel_accounting() {
            return None;
        }
        Some(KernelTotals {
            sched_info: SchedInfoHead {
                pcount: self.field(off.sched_info),
                run_delay_ns: self.field(off.sched_info + 8),
            },
            sum_exec_ns: self.field(off.sum_exec_runtime),
        })
    }
}

/// The task running this program.
#[inline(always)]
pub(crate) fn current_task() -> *const u8 {
    BtfTask::current().0
}

/// The epoch's generation now (its low bit: the slot being written).
#[inline(always)]
fn generation() -> u32 {
    EPOCH.get(0).copied().unwrap_or(0)
}

#[inline(always)]
fn tracked(tid: u32) -> bool {
    tid != 0 && is_target(tid)
}

/// `sched_wakeup(struct task_struct *p)`.
#[btf_tracepoint(function = "sched_wakeup")]
pub fn sched_wakeup(ctx: BtfTracePointContext) -> u32 {
    let off = offsets();
    let task = BtfTask::arg(&ctx, 0);
    woken(Task(task.0), task.tid(&off), &off);
    0
}

/// `sched_wakeup_new(struct task_struct *p)`: a new task's first event. Whatever its tid held
/// before (a task that died and was preempted after its exit was recorded) is not its history,
/// so it starts from a fresh entry.
#[btf_tracepoint(function = "sched_wakeup_new")]
pub fn sched_wakeup_new(ctx: BtfTracePointContext) -> u32 {
    let off = offsets();
    let task = BtfTask::arg(&ctx, 0);
    let tid = task.tid(&off);
    if !tracked(tid) {
        return 0;
    }
    let _ = TASK_STATS.remove(tid);
    woken(Task(task.0), tid, &off);
    if let Some(stats) = TASK_STATS.get_ptr_mut(tid) {
        // Never run yet: its totals are where its first run starts.
        unsafe { (*stats).base_exact = 1 };
    }
    0
}

/// The task became runnable: from now on it waits for a CPU.
#[inline(always)]
fn woken(task: Task, tid: u32, off: &TaskOffsets) {
    if !tracked(tid) {
        return;
    }
    let Some(stats) = task_stats(tid, task, off) else {
        return;
    };
    let stats = unsafe { &mut *stats };
    // A task woken again while still queued keeps the time it first became runnable.
    if stats.enqueued.at_ns == 0 {
        let at_ns = crate::clock::wakeup_now(task.0, off);
        if !detail() {
            stats.enqueued.at_ns = at_ns;
            return;
        }
        let waker = BtfTask::current();
        stats.enqueued = Enqueued {
            at_ns,
            waker_tid: waker.tid(off),
            waker_tgid: waker.tgid(off),
            // Its name only if this wait turns out slow: copying it on every wake-up costs.
            waker_task: waker.0 as u64,
            waker_comm: [0; COMM_LEN],
        };
    }
}

/// `sched_switch(bool preempt, struct task_struct *prev, struct task_struct *next,
/// unsigned int prev_state)`, running as `prev`.
#[btf_tracepoint(function = "sched_switch")]
pub fn sched_switch(ctx: BtfTracePointContext) -> u32 {
    switch(&ctx);
    0
}

#[inline(always)]
fn switch(ctx: &BtfTracePointContext) {
    crate::health::bump_in_switch(HealthCounter::SchedSwitches);
    let off = offsets();
    // `prev` is the task running this program (its argument: no helper call for it).
    let (current, next_task) = (BtfTask::arg(ctx, 1), BtfTask::arg(ctx, 2));
    let prev_task = Task(current.0);
    let prev = current.tid(&off);
    let next = next_task.tid(&off);
    let now = crate::clock::switch_now(current.0, prev, &off);
    let history_start = match detail() {
        true => remember_cpu_holder(prev, prev_task, now),
        false => None,
    };
    let mut walk_tables = None;
    if tracked(prev) {
        let prev_state = if off.switch_has_state_arg != 0 {
            ctx.arg::<u64>(3) as u32 as u64
        } else {
            current.field::<u32>(off.state) as u64
        };
        let preempt = ctx.arg::<u64>(0) & 0xff != 0;
        walk_tables = switch_out(
            ctx,
            &off,
            prev,
            prev_task,
            current,
            switch_reason::classify(preempt, prev_state),
            now,
            history_start,
        );
    }
    if lean(&off) {
        if let Some(running) = RUNNING.get_ptr_mut(0) {
            let tid = if tracked(next) { next } else { 0 };
            unsafe {
                (*running).tid = tid;
                (*running).since_ns = now;
            }
        }
    } else if tracked(next) {
        switch_in(&off, next, next_task, now, history_start);
    }
    if let Some(walk) = walk_tables {
        // Last: the walk continues in tail calls. `prev` cannot run again (nor its off-CPU
        // stint end) before this program returns: it is still on this CPU until the switch ends.
        crate::unwind::start_offcpu(ctx, walk.tgid, prev, walk.version, walk.expect);
        // The walk could not start: a frame-pointer stack after all.
        offcpu_user_stack(
            prev,
            stack_id(ctx, offcpu_generation(prev), BPF_F_USER_STACK as u64),
        );
    }
}

/// The user stack where `tid` went to sleep, by a frame-pointer walk (negative: no stack), the
/// table walk could not start.
#[inline(always)]
fn offcpu_user_stack(tid: u32, id: i32) {
    if let Some(stats) = TASK_STATS.get_ptr_mut(tid) {
        unsafe {
            (*stats).offcpu.user_stack_id = id;
            (*stats).offcpu.user_unwound &= STACK_DRAWN as u32;
        }
    }
}

/// The table walk of the user stack where its thread went to sleep ended with `stack_id` (or
/// an error) in `generation`'s slot: its sleep's stack, and the walk kept for its next sleep.
#[inline(always)]
pub fn offcpu_walked(walk: &mut Walk, stack_id: i32, generation: u32) {
    let Some(stats) = TASK_STATS.get_ptr_mut(walk.tid) else {
        return;
    };
    let stats = unsafe { &mut *stats };
    stats.offcpu.user_stack_id = stack_id;
    // (Drawn or not, as the switch-out decided.)
    stats.offcpu.user_unwound = 1 | (stats.offcpu.user_unwound & STACK_DRAWN as u32);
    crate::reuse::walked_offcpu(walk, stack_id, generation, &mut stats.offcpu_reuse);
}

/// The epoch generation `tid` went to sleep in.
#[inline(always)]
pub fn offcpu_generation(tid: u32) -> u32 {
    match TASK_STATS.get_ptr(tid) {
        Some(stats) => unsafe { (*stats).offcpu.generation },
        None => generation(),
    }
}

/// Append the outgoing task's stretch to this CPU's history. Returns the CPU's history.
#[inline(always)]
fn remember_cpu_holder(prev: u32, prev_task: Task, now: u64) -> Option<*mut CpuHistory> {
    let history = CPU_HISTORY_MAP.get_ptr_mut(0)?;
    let history_ref = unsafe { &mut *history };
    let slot = (history_ref.next as usize) & (CPU_HISTORY - 1);
    if let Some(run) = history_ref.runs.get_mut(slot) {
        run.tid = prev;
        run.start_ns = history_ref.last_switch_ns;
        run.end_ns = now;
        // The name is read only when a slow wait names this task (see `name_of`).
        run.task = prev_task.0 as u64;
    }
    history_ref.next += 1;
    history_ref.last_switch_ns = now;
    Some(history)
}

/// A user stack to walk through the tables, by the switch program's last act.
struct OffCpuWalk {
    tgid: u32,
    /// Its mappings' version, and the stack reuse would have given (-1: none; see `reuse`).
    version: u64,
    expect: i32,
}

/// Account the outgoing task's stint on the CPU and, if it goes to sleep, where. Returns the
/// walk of its user stack through the unwind tables, if one is to be made (by the caller, last):
/// none where its last walk's stack is still the one a walk would find (`reuse`).
#[inline(always)]
fn switch_out(
    ctx: &BtfTracePointContext,
    off: &TaskOffsets,
    prev: u32,
    prev_task: Task,
    current: BtfTask,
    reason: u32,
    now: u64,
    history: Option<*mut CpuHistory>,
) -> Option<OffCpuWalk> {
    if reason == switch_reason::EXITING {
        // Its last switch-out: the exit tracepoint already moved its stats to EXITED. An entry
        // now is one a switch-in made after that (the dying task preempted on its way out: 0.5
        // to 2.5% of exits here, system-wide under churn): gone with it, where it stayed until
        // the tid was reused, its run open (a wait at the stop of a process long gone, and the
        // task map filling up on a machine that starts processes all day). Only an entry whose
        // run is on this CPU now is the dying task's: its tid may already be a new task's
        // (freed at its release, before this switch), whose own entry stays. On the lean path,
        // where a switch-in leaves the entry as it is, the entry made for this very task.
        if let Some(stats) = TASK_STATS.get_ptr(prev) {
            let stats = unsafe { &*stats };
            let running_here = match lean(off) {
                true => stats.task == current.0 as u64,
                false => {
                    stats.switched_out == 0
                        && stats.last_in_ns != 0
                        && stats.last_cpu == unsafe { bpf_get_smp_processor_id() }
                }
            };
            if running_here {
                let _ = TASK_STATS.remove(prev);
            }
        }
        return None;
    }
    let stats = task_stats(prev, prev_task, off)?;
    let stats = unsafe { &mut *stats };
    if lean(off) {
        arrived_late(off, stats, prev, now, current.kernel_totals(off));
    }
    // Out again: a sleep still open had its switch-in unseen.
    close_unseen_sleep(stats, prev, now);
    stats.switched_out = 1;
    if stats.kernel_accounting != 0 {
        settle_run(off, stats, prev, current.kernel_totals(off), history);
    } else if stats.last_in_ns != 0 && now > stats.last_in_ns {
        stats.running_ns += now - stats.last_in_ns;
    }
    let tgid = current.tgid(off);
    stats.tgid = tgid;
    if stats.exec_of != tgid {
        // Unchanged until the task execs (`exec_done`): read once, not at every sleep.
        stats.exec_generation = crate::targets::exec_generation(tgid);
        stats.exec_of = tgid;
        stats.announced = 0;
    }
    // Its sleeps' stacks will need its memory map, and its profiles its labels (executable,
    // cgroup: the agent's run-queue profile has them from this alone): user space reads them
    // now. A task only preempted so far needs its labels alone (its waits for a CPU are all it
    // has to show), unless it is a child of vfork about to exec (posix_spawn's), labelled as what
    // it execs instead. Once per task, image and need: its process stays announced until it execs
    // or exits.
    let needs = match reason {
        switch_reason::PREEMPTED if current.before_exec_of_vfork(off) => 0,
        switch_reason::PREEMPTED => seen::LABELLED,
        _ => seen::CAPTURED,
    };
    if stats.announced < needs as u32 {
        stats.announced = needs as u32;
        let generation = stats.exec_generation;
        let labels = |event: &mut ProcessEvent| current.write_labels(off, prev, tgid, generation, event);
        match needs {
            // (Blocked before its exec, a child of vfork has its parent's memory and name: its
            // labels are read by user space, after the exec if it gets there.)
            seen::CAPTURED if current.before_exec_of_vfork(off) => crate::sampling::announce_once(tgid),
            seen::CAPTURED => crate::sampling::announce_labelled_once(tgid, labels),
            // Its name may be the old image's, its generation is: the exec's tracepoint says
            // them (announced here too, it was announced twice, the first time wrong).
            _ if current.in_exec(off) => {}
            _ => crate::sampling::announce_labels_once(tgid, labels),
        }
    }
    if reason == switch_reason::PREEMPTED {
        // Preempted: still runnable, waiting for a CPU from now on. (Any earlier enqueue time
        // is stale: a wake-up that found the task still running.)
        stats.enqueued = Enqueued {
            at_ns: now,
            ..Default::default()
        };
        return None;
    }
    stats.enqueued.at_ns = 0;
    let policy = unsafe { core::ptr::read_volatile(&OFFCPU_STACKS_ENABLED) };
    let generation = generation();
    let drawn = match policy {
        offcpu_stacks::NONE => 0,
        _ => draw(stats, generation),
    };
    if drawn == STACK_SKIPPED {
        stats.offcpu = OffCpuStart {
            at_ns: now,
            user_stack_id: NO_STACK,
            kernel_stack_id: NO_STACK,
            reason,
            tgid,
            user_unwound: drawn as u32,
            generation,
        };
        return None;
    }
    let version = match policy {
        offcpu_stacks::NONE => None,
        _ => crate::unwind::tables_version(tgid),
    };
    let tables = version.is_some();
    // With tables: the last walk's stack again, or filled in by the walk the caller starts.
    let (mut user_stack_id, mut walk) = (NO_STACK, None);
    match version {
        Some(version) => {
            let reused = reused_stack(&stats.offcpu_reuse, tgid, version, generation);
            match reused {
                Some(id) if !crate::reuse::checking() => user_stack_id = id,
                _ => {
                    walk = Some(OffCpuWalk {
                        tgid,
                        version,
                        expect: reused.unwrap_or(-1),
                    })
                }
            }
        }
        None if policy == offcpu_stacks::NONE => {}
        None => user_stack_id = stack_id(ctx, generation, BPF_F_USER_STACK as u64),
    }
    let kernel_stack_id = match policy == offcpu_stacks::ALL
        || (policy != offcpu_stacks::NONE
            && (reason == switch_reason::BLOCKED || (!tables && user_stack_id < 0)))
    {
        true => stack_id(ctx, generation, 0),
        false => NO_STACK,
    };
    stats.offcpu = OffCpuStart {
        at_ns: now,
        user_stack_id,
        kernel_stack_id,
        reason,
        tgid,
        user_unwound: tables as u32 | drawn as u32,
        generation,
    };
    walk
}

/// Whether this sleep gets its stacks (see `OffCpuSampling`): 0 (taken, counted exactly),
/// `STACK_DRAWN` (taken, standing for the skipped ones too) or `STACK_SKIPPED`. The thread's
/// first sleeps of each epoch are always taken: one that sleeps now and then has every stack.
#[inline(always)]
fn draw(stats: &mut TaskSched, generation: u32) -> u16 {
    let sampling = sampling();
    if sampling.every <= 1 {
        return 0;
    }
    if stats.stacks_epoch != generation {
        stats.stacks_epoch = generation;
        stats.stacks_exact = 0;
    }
    if stats.stacks_exact < sampling.exact {
        stats.stacks_exact += 1;
        return 0;
    }
    // At random, not every Nth: a thread that alternates between places is not aliased.
    match draw_number() % sampling.every {
        0 => STACK_DRAWN,
        _ => STACK_SKIPPED,
    }
}

/// A number drawn at random, from this CPU's xorshift64* generator (seeded from the clock at
/// its first draw): the kernel's `bpf_get_prandom_u32` is a helper call, which on this VM costs
/// as much as a map lookup (retpolines, SRSO's safe return), at every switch of a busy sleeper.
#[inline(always)]
fn draw_number() -> u32 {
    let Some(state) = DRAWS.get_ptr_mut(0) else {
        return 0;
    };
    let state = unsafe { &mut *state };
    let mut x = match *state {
        0 => unsafe { bpf_ktime_get_ns() | 1 },
        x => x,
    };
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32) as u32
}

/// The thread's last walked stack, if walking now would find it again (`reuse`), counted.
#[inline(always)]
fn reused_stack(kept: &StackReuse, tgid: u32, version: u64, generation: u32) -> Option<i32> {
    let id = crate::reuse::offcpu_stack(kept, tgid, version, generation)?;
    crate::health::bump_in_switch(HealthCounter::StacksReused);
    Some(id)
}

#[inline(always)]
fn stack_id(ctx: &BtfTracePointContext, generation: u32, flags: u64) -> i32 {
    let stacks = match generation & 1 {
        0 => &OFFCPU_STACKS_0,
        _ => &OFFCPU_STACKS_1,
    };
    match ctx.get_stackid(stacks, flags) {
        Ok(id) => id as i32,
        Err(err) => err,
    }
}

/// The task's entry, created on first sight with its name read from its `task_struct`.
#[inline(always)]
fn task_stats(tid: u32, task: Task, off: &TaskOffsets) -> Option<*mut TaskSched> {
    if let Some(stats) = TASK_STATS.get_ptr_mut(tid) {
        return Some(stats);
    }
    let template = TASK_TEMPLATE.get_ptr_mut(0)?;
    unsafe {
        (*template).tid = tid;
        (*template).task = task.0 as u64;
        (*template).comm = task.read(off.comm).unwrap_or([0; COMM_LEN]);
        // The kernel's totals so far: what happens from now on is their growth.
        let totals = task.kernel_totals(off);
        (*template).kernel = totals.unwrap_or_default();
        (*template).kernel_accounting = totals.is_some() as u32;
    }
    // By reference: a copy of the 2.5 KB value would not fit on the 512-byte BPF stack.
    #[allow(clippy::needless_borrows_for_generic_args)]
    if TASK_STATS.insert(tid, unsafe { &*template }, 1).is_err() {
        bump(HealthCounter::TaskMapFull);
        kernel_log!("task map full: tid {} not tracked", tid);
    }
    TASK_STATS.get_ptr_mut(tid)
}

#[inline(always)]
fn switch_in(off: &TaskOffsets, next: u32, next_task: BtfTask, now: u64, history: Option<*mut CpuHistory>) {
    let Some(stats) = task_stats(next, Task(next_task.0), off) else {
        return;
    };
    let stats = unsafe { &mut *stats };
    if stats.kernel_accounting != 0 && stats.last_in_ns != 0 && stats.switched_out == 0 {
        // In again, never seen out: the run since its last switch-in and the waits before this
        // one, as the kernel counted them (it adds this wait just after this tracepoint).
        bump(HealthCounter::SwitchOutsMissed);
        // Without this CPU's history: the run that ended unseen may have been on another CPU,
        // whose holders this one's history does not show (a slow wait then names none).
        settle_run(off, stats, next, next_task.kernel_totals(off), None);
    }
    arrive(off, stats, next, now, history);
}

/// The task arrives on this CPU at `now`: its run begins, its wait (without the kernel's
/// totals) and its sleep end.
#[inline(always)]
fn arrive(off: &TaskOffsets, stats: &mut TaskSched, tid: u32, now: u64, history: Option<*mut CpuHistory>) {
    stats.switched_out = 0;
    stats.last_in_ns = now;
    stats.last_cpu = unsafe { bpf_get_smp_processor_id() };

    let enqueued = stats.enqueued;
    stats.enqueued.at_ns = 0;
    if stats.kernel_accounting != 0 {
        // The kernel adds this wait to run_delay just after this tracepoint: it is counted at
        // the switch-out that ends this run, with what is known of it now.
        stats.last_wait = enqueued;
    } else {
        stats.runs += 1;
        if enqueued.at_ns != 0 {
            record_wait(
                off,
                stats,
                tid,
                now.saturating_sub(enqueued.at_ns),
                now,
                &enqueued,
                history,
            );
        }
    }

    let _ = end_sleep(stats, tid, enqueued.at_ns, now);
}

/// The lean path's switch-in of `tid`, replayed at the switch-out (or exit) that ends its run:
/// it arrived when this CPU's `RUNNING` says, and if it was asleep, it woke the wait before that
/// which the kernel's totals grew by (one arrival since its last switch-out; else the sleep is
/// taken to the arrival). Not for a task first seen in this run (its arrival is before its
/// entry's base), nor twice for one arrival.
#[inline(always)]
fn arrived_late(off: &TaskOffsets, stats: &mut TaskSched, tid: u32, now: u64, totals: Option<KernelTotals>) {
    let Some(running) = RUNNING.get_ptr(0) else {
        return;
    };
    let running = unsafe { *running };
    let known = stats.switched_out != 0 || stats.base_exact != 0;
    if running.tid != tid || running.since_ns == 0 || running.since_ns == stats.last_in_ns || !known {
        return;
    }
    if stats.offcpu.at_ns != 0 {
        stats.enqueued.at_ns = woke_before(stats, running.since_ns, now, totals);
    }
    arrive(off, stats, tid, running.since_ns, None);
}

/// When a task woke that arrived at `arrived_ns` and is leaving at `now`: before its run, the
/// wait the kernel counted (one arrival since its last switch-out; else taken as none). Of two
/// bounds, the earlier: the kernel's run begins where its clock was last read, which after a
/// wake-up that preempts (an idle CPU's) is the wake-up itself, so its time on the CPU is the
/// task's running time, not its sleep (as the kernel counts it, and the full path); its task
/// clock leaves out time stolen by the hypervisor and taken by interrupts, which the arrival
/// bounds.
#[inline(always)]
fn woke_before(stats: &TaskSched, arrived_ns: u64, now: u64, totals: Option<KernelTotals>) -> u64 {
    let base = &stats.kernel;
    match totals {
        Some(totals) if totals.sched_info.pcount == base.sched_info.pcount + 1 => {
            let wait = totals
                .sched_info
                .run_delay_ns
                .saturating_sub(base.sched_info.run_delay_ns);
            let ran = totals.sum_exec_ns.saturating_sub(base.sum_exec_ns);
            let by_run = now.saturating_sub(ran).saturating_sub(wait);
            arrived_ns.saturating_sub(wait).min(by_run)
        }
        _ => arrived_ns,
    }
}

/// A task seen running (switched out or exiting) with a sleep still open: the kernel's
/// tracepoint never showed the switch-in that ended it. It slept until the wake-up it was woken
/// by (seen or not); the run now ending began unseen after the wait that followed, left as a
/// switch-in would have left it (without the kernel's totals, wait and run are one).
#[inline(always)]
fn close_unseen_sleep(stats: &mut TaskSched, tid: u32, now: u64) {
    if stats.offcpu.at_ns == 0 {
        return;
    }
    bump(HealthCounter::SwitchInsMissed);
    let woke = stats.enqueued;
    stats.last_in_ns = end_sleep(stats, tid, woke.at_ns, now);
    stats.last_wait = woke;
}

/// The task's sleep (if it was asleep) ends: recorded with the stacks taken when it began.
/// It slept until its wake-up at `woke_ns`; from then on it was runnable, which is run-queue
/// delay (counted apart), not off-CPU time: the thread's states add up to its time. Without a
/// wake-up seen since the sleep began, it slept until `now`. Returns when the sleep ended (0:
/// it was not asleep).
#[inline(always)]
fn end_sleep(stats: &mut TaskSched, tid: u32, woke_ns: u64, now: u64) -> u64 {
    let start = stats.offcpu;
    let mut woke = 0;
    if start.at_ns != 0 {
        // A wake-up is never before the sleep it ends (its stamp is zeroed as the sleep begins):
        // one that reads so is two CPUs' clocks a few microseconds apart, not a wake-up unseen.
        woke = match woke_ns != 0 {
            true => woke_ns.max(start.at_ns),
            false => now,
        };
        let blocked = woke.saturating_sub(start.at_ns);
        if start.reason == switch_reason::BLOCKED {
            stats.blocked_ns += blocked;
        } else {
            stats.sleeping_ns += blocked;
        }
        let generation = generation();
        // A long sleep without stacks is shown apart (`SKIPPED_LONG`), never summed.
        let skipped = start.user_unwound as u16 & STACK_SKIPPED != 0;
        let long = skipped && blocked >= sampling().long_ns;
        if skipped && !long && start.generation == generation {
            // Short, without stacks, within one epoch: summed in the task's own entry.
            let slot = &mut stats.skipped[(generation & 1) as usize];
            if slot.generation != generation {
                *slot = SkippedSleeps {
                    generation,
                    count: 0,
                    total_ns: 0,
                };
            }
            slot.count += 1;
            slot.total_ns += blocked;
        } else {
            record_sleep(stats, tid, &start, blocked, generation, long);
        }
        // Only now: user space, seeing the task awake, knows its sleep is recorded.
        stats.offcpu.at_ns = 0;
    }
    woke
}

/// A sleep's record in the off-CPU map of `generation`'s slot, under its stacks (`long`: one
/// without stacks, to be shown apart).
#[inline(always)]
fn record_sleep(stats: &TaskSched, tid: u32, start: &OffCpuStart, blocked: u64, generation: u32, long: bool) {
    let began_earlier = match start.generation == generation {
        true => 0,
        false => BEGAN_EARLIER,
    };
    let long = match long {
        true => SKIPPED_LONG,
        false => 0,
    };
    let key = SampleKey {
        tgid: start.tgid,
        tid,
        user_stack_id: start.user_stack_id,
        kernel_stack_id: start.kernel_stack_id,
        comm: stats.comm,
        user_unwound: start.user_unwound as u16 | began_earlier | long,
        event: 0,
        exec_generation: match stats.exec_of == start.tgid {
            true => stats.exec_generation,
            false => crate::targets::exec_generation(start.tgid),
        },
    };
    match generation & 1 {
        0 => add_offcpu(&OFFCPU_0, &key, blocked),
        _ => add_offcpu(&OFFCPU_1, &key, blocked),
    }
}

#[inline(always)]
fn add_offcpu(map: &HashMap<SampleKey, OffCpuTime>, key: &SampleKey, blocked: u64) {
    if let Some(total) = map.get_ptr_mut(key) {
        // Only this task's switch-in updates its keys: no other CPU writes them concurrently.
        unsafe {
            (*total).total_ns += blocked;
            (*total).count += 1;
        }
    } else if map
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
        bump(HealthCounter::OffCpuMapFull);
        kernel_log!("off-CPU map full: {} ns asleep not recorded", blocked);
    }
}

/// The growth of the kernel's totals since the task's last switch-out: the wait that preceded
/// this run and the run itself, exactly as the kernel counted them. A task first seen running
/// (its run began before bpfprof saw it) only starts from here. A run whose switch-in was not
/// shown (the kernel now and then counts an arrival with no `sched_switch`) is still counted
/// from an exact base (`base_exact`), with the wait's end and CPU unknown.
#[inline(always)]
fn settle_run(
    off: &TaskOffsets,
    stats: &mut TaskSched,
    tid: u32,
    totals: Option<KernelTotals>,
    mut history: Option<*mut CpuHistory>,
) {
    let Some(totals) = totals else {
        return;
    };
    // One run, never more: growth of several runs none of which was seen is not this task's (a
    // dying thread preempted after its tid was freed and given to a new one, whose entry this
    // is); it is left uncounted, as a first sight's is.
    let unseen_start = stats.last_in_ns == 0
        && stats.base_exact != 0
        && totals.sched_info.pcount == stats.kernel.sched_info.pcount + 1;
    if unseen_start {
        bump(HealthCounter::SwitchInsMissed);
        // It ran by now; where and when its wait ended is not known, what began it is.
        stats.last_in_ns = unsafe { bpf_ktime_get_ns() };
        stats.last_wait = stats.enqueued;
        history = None;
    }
    if stats.last_in_ns != 0 {
        stats.running_ns += totals.sum_exec_ns.saturating_sub(stats.kernel.sum_exec_ns);
        // One run as a rule; more where the kernel counted an arrival with no `sched_switch`
        // for it (seen here: one in a few hundred runs of a busy thread).
        stats.runs += totals
            .sched_info
            .pcount
            .saturating_sub(stats.kernel.sched_info.pcount);
        let delay = totals
            .sched_info
            .run_delay_ns
            .saturating_sub(stats.kernel.sched_info.run_delay_ns);
        let wait = stats.last_wait;
        record_wait(off, stats, tid, delay, stats.last_in_ns, &wait, history);
    }
    stats.kernel = totals;
    stats.base_exact = 1;
}

/// One run-queue wait of `delay` ns that ended at `ended_ns`: totals, histogram, heatmap, and
/// a slow event if it is slow.
#[inline(always)]
fn record_wait(
    off: &TaskOffsets,
    stats: &mut TaskSched,
    tid: u32,
    delay: u64,
    ended_ns: u64,
    enqueued: &Enqueued,
    history: Option<*mut CpuHistory>,
) {
    stats.delays += 1;
    stats.total_delay_ns += delay;
    if delay > stats.max_delay_ns {
        stats.max_delay_ns = delay;
        stats.max_at_ns = ended_ns;
    }
    // Through an opaque load and a mask: the optimizer must not fold the bounds check into
    // arithmetic the verifier cannot follow.
    let bucket = hist_bucket(delay);
    let bucket = unsafe { core::ptr::read_volatile(&bucket) } & 1023;
    if let Some(count) = stats.hist.get_mut(bucket) {
        *count += 1;
    }
    if !detail() {
        return;
    }
    match history {
        Some(cpu) => unsafe { (*cpu).waits.add(delay) },
        // (Rare: a switch-out the tracepoint never showed.)
        None => {
            if let Some(here) = CPU_HISTORY_MAP.get_ptr_mut(0) {
                unsafe { (*here).unplaced.add(delay) };
            }
        }
    }
    let slot = generation() & 1;
    let heat = slot as usize * HEAT_BUCKETS + (bucket / 8).min(HEAT_BUCKETS - 1);
    if let Some(cell) = HEAT.get_ptr_mut(heat as u32) {
        unsafe { *cell += 1 };
    }
    if delay >= unsafe { core::ptr::read_volatile(&SLOW_THRESHOLD_NS) } {
        report_slow(off, stats, tid, delay, ended_ns, enqueued, history);
    }
}

#[inline(always)]
fn report_slow(
    off: &TaskOffsets,
    stats: &TaskSched,
    tid: u32,
    delay: u64,
    now: u64,
    enqueued: &Enqueued,
    history: Option<*mut CpuHistory>,
) {
    let Some(mut entry) = SLOW_EVENTS.reserve::<SlowEvent>(0) else {
        bump(HealthCounter::SlowEventLost);
        kernel_log!(
            "slow-event ring full: a wait of tid {} ({} ns) not reported",
            tid,
            delay
        );
        return;
    };
    let event = entry.as_mut_ptr();
    unsafe {
        (*event).tid = tid;
        (*event).tgid = stats.tgid;
        // Without a history, which CPU it waited for is not known either.
        (*event).cpu = match history {
            Some(_) => bpf_get_smp_processor_id(),
            None => CPU_UNKNOWN,
        };
        (*event).delay_ns = delay;
        (*event).at_ns = now;
        (*event).comm = stats.comm;
        (*event).waker = *enqueued;
        if enqueued.waker_tid != 0 {
            (*event).waker.waker_comm = name_of(enqueued.waker_task, enqueued.waker_tid, off);
        }
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
            // Only stretches within the wait: none after it ended (`now`), none before it began.
            if run.end_ns <= enqueued.at_ns || run.start_ns >= now || run.tid == tid || found >= SLOW_CULPRITS
            {
                continue;
            }
            unsafe {
                if let Some(dst) = (*event).culprits.get_mut(found) {
                    *dst = *run;
                    dst.comm = name_of(run.task, run.tid, off);
                }
            }
            found += 1;
        }
        unsafe { (*event).culprit_count = found as u32 };
    }
    entry.submit(0);
}

/// The name of a task seen earlier, if that `task_struct` still holds the same task (it may
/// have exited and been freed since; then an all-zero name, and user space asks /proc).
#[inline(always)]
fn name_of(task: u64, tid: u32, off: &TaskOffsets) -> [u8; COMM_LEN] {
    let task = Task(task as *const u8);
    match task.tid(off) {
        Ok(now) if now == tid && tid != 0 => task.read(off.comm).unwrap_or([0; COMM_LEN]),
        _ => [0; COMM_LEN],
    }
}

/// The task exec'd: its scheduling history stays, under its new name and image (its exec
/// generation is read again at its next switch-out), and its process is announced for its new
/// image's labels: its waits for a CPU are its thread's, named the new image's from now on, and
/// a process that execs and exits (or only ever waits for a CPU and runs) may have no switch-out
/// left to say them; one preempted in the middle of its exec (a child of `vfork`, as it wakes
/// its parent, nearly always) is announced here, not there. Only a task the entry is this one's:
/// one left under the tid by a thread that exec'd (which takes its leader's) is not.
#[inline(always)]
pub fn exec_done(tgid: u32, tid: u32) {
    let Some(stats) = TASK_STATS.get_ptr_mut(tid) else {
        return;
    };
    let current = BtfTask::current();
    let own = unsafe {
        (*stats).exec_of = 0;
        (*stats).tgid = tgid;
        (*stats).task == current.0 as u64
    };
    if let Ok(comm) = bpf_get_current_comm() {
        unsafe { (*stats).comm = comm };
    }
    if !own {
        return;
    }
    let off = offsets();
    let generation = crate::targets::exec_generation(tgid);
    crate::sampling::announce_labels_once(tgid, |event| {
        current.write_labels(&off, tid, tgid, generation, event)
    });
}

/// A task exited: its stats move to `EXITED` (the tid may be reused at once), with the time it
/// was still running up to now.
#[inline(always)]
pub fn forget_task(tgid: u32, tid: u32) {
    let Some(stats) = TASK_STATS.get_ptr_mut(tid) else {
        return;
    };
    let now = unsafe { bpf_ktime_get_ns() };
    let off = offsets();
    let totals = BtfTask::current().kernel_totals(&off);
    unsafe {
        // (A task that never left a CPU but to exit was never told its process; a slow wait
        // closed here names it.)
        (*stats).tgid = tgid;
        if lean(&off) {
            arrived_late(&off, &mut *stats, tid, now, totals);
        }
        // Exiting, so running: a sleep still open had its switch-in unseen.
        close_unseen_sleep(&mut *stats, tid, now);
        if (*stats).kernel_accounting != 0 {
            // Its last run, to the kernel's last update of its time (at most a tick ago).
            settle_run(&off, &mut *stats, tid, totals, CPU_HISTORY_MAP.get_ptr_mut(0));
            (*stats).last_in_ns = 0;
        } else if (*stats).last_in_ns != 0 && now > (*stats).last_in_ns {
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
        bump(HealthCounter::ExitedMapFull);
        kernel_log!("exited-task map full: tid {} missing", tid);
    }
    let _ = TASK_STATS.remove(tid);
}
