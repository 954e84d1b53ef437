//! Futex source: the time targets' threads wait in `futex(2)` (only contended lock
//! acquisitions enter the kernel, so uncontended locks cost nothing), by (process, futex address,
//! waiting stack); and, for each wait, the stack that issued the wake that ended it (the thread
//! that released the lock), charged with the wait it caused.
use aya_ebpf::{
    bindings::BPF_F_USER_STACK,
    helpers::bpf_ktime_get_ns,
    macros::{map, raw_tracepoint},
    maps::{HashMap, LruHashMap, PerCpuArray},
    programs::{tracing::StackIdContext as _, RawTracePointContext, TracePointContext},
};
use profiler_common::{
    lock::{
        futex, futex_hint, stack, LastWake, LockId, LockKey, ThreadOffsets, Waiting, WalkFor,
        JOINABLE_ENTRIES, WAITER, WAITER_AT_EXIT, WAIT_ENTRIES, WAKER, WAKE_ENTRIES,
    },
    unwind::Walk,
    HealthCounter,
};

use super::{add, LOCK_HOLDERS, LOCK_STACKS, LOCK_WAITERS, NO_STACK};
use crate::{
    health::bump,
    sched::Task,
    targets::{current_ids, exec_generation, is_target},
};

/// `syscalls:sys_enter_futex`: the arguments follow the 8-byte common header and the syscall
/// number (padded to 8): `uaddr` at 16, `op` at 24. `sys_exit_futex` has no field we need.
const UADDR: usize = 16;
const OP: usize = 24;
const VAL: usize = 32;

/// Set by the loader from BTF (`clear_child_tid` `u32::MAX`: not known, no joins recorded).
#[unsafe(no_mangle)]
static LOCK_THREAD_OFFSETS: ThreadOffsets = ThreadOffsets {
    clear_child_tid: u32::MAX,
    tgid: 0,
    pid: 0,
    _pad: 0,
};

#[map(name = "LOCK_WAITING")]
static LOCK_WAITING: HashMap<u32, Waiting> = HashMap::with_max_entries(WAIT_ENTRIES, 0);
/// Per (process, `clear_child_tid`), the thread the kernel wakes that futex for when it exits.
#[map(name = "LOCK_JOINABLE")]
static LOCK_JOINABLE: LruHashMap<LockId, u32> = LruHashMap::with_max_entries(JOINABLE_ENTRIES, 0);
#[map(name = "LOCK_WAKES")]
static LOCK_WAKES: LruHashMap<LockId, LastWake> = LruHashMap::with_max_entries(WAKE_ENTRIES, 0);
/// Whose stack the walk in progress on this CPU is (syscall tracepoint programs do not nest on
/// a CPU).
#[map(name = "LOCK_WALK_FOR")]
static LOCK_WALK_FOR: PerCpuArray<WalkFor> = PerCpuArray::with_max_entries(1, 0);

tracepoint! {
pub fn futex_enter(ctx: TracePointContext) -> u32 {
    let _ = try_futex_enter(&ctx);
    crate::PASS_ON
}
}

fn try_futex_enter(ctx: &TracePointContext) -> Result<(), i64> {
    let (tgid, tid) = current_ids();
    if !is_target(tgid) {
        return Ok(());
    }
    let uaddr: u64 = unsafe { ctx.read_at(UADDR) }?;
    let op: u64 = unsafe { ctx.read_at(OP) }?;
    let cmd = op & futex::CMD_MASK;
    let now = unsafe { bpf_ktime_get_ns() };
    let role = if futex::waits(cmd) {
        let waiting = Waiting {
            uaddr,
            start_ns: now,
            stack_id: NO_STACK,
            aux: 0,
            hints: hints(ctx, tgid, uaddr, cmd),
            walk_again: 1,
        };
        if LOCK_WAITING.insert(tid, waiting, 0).is_err() {
            bump(HealthCounter::LockMapFull);
            kernel_log!("lock map full: a futex wait of tid {} not timed", tid);
            return Ok(());
        }
        WAITER
    } else if futex::wakes(cmd) {
        no_wait_now(tid);
        let wake = LastWake {
            at_ns: now,
            tid,
            user_stack_id: NO_STACK,
            ..Default::default()
        };
        let _ = LOCK_WAKES.insert(LockId { tgid, _pad: 0, uaddr }, wake, 0);
        WAKER
    } else {
        no_wait_now(tid);
        return Ok(());
    };
    // Its stacks will need its memory map.
    crate::sampling::announce_once(tgid);
    let Some(walk_for) = LOCK_WALK_FOR.get_ptr_mut(0) else {
        return Ok(());
    };
    unsafe {
        (*walk_for).uaddr = uaddr;
        (*walk_for).role = role;
    }
    // Through the unwind tables if the process has them (no return then).
    crate::unwind::start_lock(ctx, tgid, tid);
    let id = match ctx.get_stackid(&LOCK_STACKS, BPF_F_USER_STACK as u64) {
        Ok(id) => id as i32,
        Err(e) => e,
    };
    user_stack_walked(tgid, tid, id, None);
    Ok(())
}

/// A thread making another futex call is in no wait: an entry user space made for a wait that
/// was going at the start (see `LockReader::enter_waits_in_progress`) and ended unseen (a
/// stopped thread's call, restarted without the syscall's tracepoints) goes.
#[inline(always)]
fn no_wait_now(tid: u32) {
    if LOCK_WAITING.get_ptr(tid).is_some() {
        let _ = LOCK_WAITING.remove(tid);
    }
}

/// What the wait's own arguments say it is (see `futex_hint`).
#[inline(always)]
fn hints(ctx: &TracePointContext, tgid: u32, uaddr: u64, cmd: u64) -> u32 {
    let mut hints = 0;
    if matches!(cmd, futex::LOCK_PI | futex::LOCK_PI2) {
        hints |= futex_hint::PI_LOCK;
    } else if unsafe { ctx.read_at::<u32>(VAL) } == Ok(2) {
        hints |= futex_hint::LOCK_WORD;
    }
    if LOCK_JOINABLE.get_ptr(LockId { tgid, _pad: 0, uaddr }).is_some() {
        hints |= futex_hint::JOIN;
    }
    hints
}

/// `sched_process_fork` (raw: the child's `task_struct`): a target's new thread, whose exit a
/// joiner will wait for on its `clear_child_tid`. Its process is announced too: a process that
/// starts threads is about to contend, and its memory map now holds the C library.
#[raw_tracepoint(tracepoint = "sched_process_fork")]
pub fn lock_thread_new(ctx: RawTracePointContext) -> u32 {
    match try_thread_new(&ctx) {
        Ok(()) => 0,
        Err(_) => 1,
    }
}

fn try_thread_new(ctx: &RawTracePointContext) -> Result<(), i64> {
    let (parent, _) = current_ids();
    if !is_target(parent) {
        return Ok(());
    }
    crate::sampling::announce_once(parent);
    let offsets = unsafe { core::ptr::read_volatile(&LOCK_THREAD_OFFSETS) };
    if offsets.clear_child_tid == u32::MAX {
        return Ok(());
    }
    let child = Task(ctx.arg(1));
    let clear_child_tid: u64 = child.read(offsets.clear_child_tid)?;
    if clear_child_tid == 0 {
        return Ok(());
    }
    let tgid: u32 = child.read(offsets.tgid)?;
    let tid: u32 = child.read(offsets.pid)?;
    let key = LockId {
        tgid,
        _pad: 0,
        uaddr: clear_child_tid,
    };
    let _ = LOCK_JOINABLE.insert(key, tid, 0);
    Ok(())
}

/// The user stack of the wait or wake this CPU is recording (see `LOCK_WALK_FOR`): `id` in
/// the unwinder's stacks if `walk` (through tables) is given, else in `LOCK_STACKS`.
#[inline(always)]
pub fn user_stack_walked(tgid: u32, tid: u32, id: i32, walk: Option<&Walk>) {
    let unwound = walk.is_some();
    let Some(walk_for) = LOCK_WALK_FOR.get(0).copied() else {
        return;
    };
    if walk_for.role == WAITER || walk_for.role == WAITER_AT_EXIT {
        if let Some(waiting) = LOCK_WAITING.get_ptr_mut(tid) {
            unsafe {
                (*waiting).stack_id = id;
                (*waiting).aux = unwound as u32;
                (*waiting).walk_again = walk.is_none_or(|w| w.stale != 0) as u32;
            }
        }
        if walk_for.role == WAITER_AT_EXIT {
            wait_ended(tgid, tid, walk_for.wait_ns);
        }
    } else {
        let key = LockId {
            tgid,
            _pad: 0,
            uaddr: walk_for.uaddr,
        };
        if let Some(wake) = LOCK_WAKES.get_ptr_mut(key) {
            unsafe {
                (*wake).user_stack_id = id;
                (*wake).user_unwound = unwound as u32;
            }
        }
    }
}

tracepoint! {
pub fn futex_exit(ctx: TracePointContext) -> u32 {
    let _ = try_futex_exit(&ctx);
    crate::PASS_ON
}
}

fn try_futex_exit(ctx: &TracePointContext) -> Result<(), i64> {
    let (tgid, tid) = current_ids();
    let Some(waiting) = LOCK_WAITING.get_ptr(tid) else {
        return Ok(());
    };
    let waiting = unsafe { *waiting };
    let wait = unsafe { bpf_ktime_get_ns() }.saturating_sub(waiting.start_ns);
    // Begun before its process had tables (walked with frame pointers, cut short in a library
    // without them), or with tables that missed a library mapped since, and the tables came
    // during the wait: walk it again, now, from the same user registers. The walk's end counts
    // the wait (a tail call: no return).
    if waiting.walk_again != 0 && crate::unwind::has_tables(tgid) {
        if let Some(walk_for) = LOCK_WALK_FOR.get_ptr_mut(0) {
            unsafe {
                (*walk_for).uaddr = waiting.uaddr;
                (*walk_for).role = WAITER_AT_EXIT;
                (*walk_for).wait_ns = wait;
            }
            crate::unwind::start_lock(ctx, tgid, tid);
        }
    }
    if waiting.stack_id == NO_STACK {
        // Entered by user space (going at the start), never walked and its process perhaps never
        // announced: the stack it returns to, by frame pointers.
        crate::sampling::announce_once(tgid);
        let id = match ctx.get_stackid(&LOCK_STACKS, BPF_F_USER_STACK as u64) {
            Ok(id) => id as i32,
            Err(e) => e,
        };
        if let Some(entry) = LOCK_WAITING.get_ptr_mut(tid) {
            unsafe {
                (*entry).stack_id = id;
                (*entry).aux = 0;
            }
        }
    }
    wait_ended(tgid, tid, wait);
    Ok(())
}

/// Count the ended wait of `tid` (in `LOCK_WAITING`) and charge it to the wake that ended it.
#[inline(always)]
fn wait_ended(tgid: u32, tid: u32, wait: u64) {
    let Some(waiting) = LOCK_WAITING.get_ptr(tid) else {
        return;
    };
    let waiting = unsafe { *waiting };
    let _ = LOCK_WAITING.remove(tid);
    bump(HealthCounter::LockWaits);
    let generation = exec_generation(tgid);
    add(
        &LOCK_WAITERS,
        LockKey {
            tgid,
            stack_id: waiting.stack_id,
            uaddr: waiting.uaddr,
            stack_kind: stack_kind(waiting.aux),
            exec_generation: generation,
            flags: waiting.hints,
            ..Default::default()
        },
        wait,
    );
    // The wake that ended this wait: the last one on this futex, by another thread, since the
    // wait began. (None: a timeout, a signal, or the value changed before it slept.)
    let key = LockId {
        tgid,
        _pad: 0,
        uaddr: waiting.uaddr,
    };
    if let Some(wake) = LOCK_WAKES.get_ptr(key) {
        let wake = unsafe { *wake };
        if wake.at_ns >= waiting.start_ns && wake.tid != tid {
            add(
                &LOCK_HOLDERS,
                LockKey {
                    tgid,
                    stack_id: wake.user_stack_id,
                    uaddr: waiting.uaddr,
                    stack_kind: stack_kind(wake.user_unwound),
                    exec_generation: generation,
                    ..Default::default()
                },
                wait,
            );
        }
    }
}

#[inline(always)]
fn stack_kind(unwound: u32) -> u32 {
    match unwound {
        0 => stack::USER_FP,
        _ => stack::USER_UNWOUND,
    }
}

/// A thread that exits in a wait (killed) leaves no entry behind.
#[inline(always)]
pub fn forget_thread(tid: u32) {
    let _ = LOCK_WAITING.remove(tid);
}
