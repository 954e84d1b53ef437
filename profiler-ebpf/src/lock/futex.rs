//! Futex source: the time targets' threads wait in `futex(2)` (only contended lock
//! acquisitions enter the kernel, so uncontended locks cost nothing), by (process, futex address,
//! waiting stack); and, for each wait, the stack that issued the wake that ended it (the thread
//! that released the lock), charged with the wait it caused.
use aya_ebpf::{
    bindings::BPF_F_USER_STACK,
    helpers::bpf_ktime_get_ns,
    macros::{map, tracepoint},
    maps::{HashMap, LruHashMap, PerCpuArray},
    programs::{tracing::StackIdContext as _, TracePointContext},
};
use profiler_common::{
    lock::{
        futex, stack, LastWake, LockId, LockKey, Waiting, WalkFor, WAITER, WAIT_ENTRIES, WAKER, WAKE_ENTRIES,
    },
    Counter,
};

use super::{add, LOCK_HOLDERS, LOCK_STACKS, LOCK_WAITERS, NO_STACK};
use crate::{
    counters::bump,
    targets::{current_ids, exec_generation, is_target},
};

/// `syscalls:sys_enter_futex`: the arguments follow the 8-byte common header and the syscall
/// number (padded to 8): `uaddr` at 16, `op` at 24. `sys_exit_futex` has no field we need.
const UADDR: usize = 16;
const OP: usize = 24;

#[map(name = "LOCK_WAITING")]
static LOCK_WAITING: HashMap<u32, Waiting> = HashMap::with_max_entries(WAIT_ENTRIES, 0);
#[map(name = "LOCK_WAKES")]
static LOCK_WAKES: LruHashMap<LockId, LastWake> = LruHashMap::with_max_entries(WAKE_ENTRIES, 0);
/// Whose stack the walk in progress on this CPU is (syscall tracepoint programs do not nest on
/// a CPU).
#[map(name = "LOCK_WALK_FOR")]
static LOCK_WALK_FOR: PerCpuArray<WalkFor> = PerCpuArray::with_max_entries(1, 0);

#[tracepoint]
pub fn futex_enter(ctx: TracePointContext) -> u32 {
    match try_futex_enter(&ctx) {
        Ok(()) => 0,
        Err(_) => 1,
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
        };
        if LOCK_WAITING.insert(tid, waiting, 0).is_err() {
            bump(Counter::LockMapFull);
            return Ok(());
        }
        WAITER
    } else if futex::wakes(cmd) {
        let wake = LastWake {
            at_ns: now,
            tid,
            user_stack_id: NO_STACK,
            ..Default::default()
        };
        let _ = LOCK_WAKES.insert(LockId { tgid, _pad: 0, uaddr }, wake, 0);
        WAKER
    } else {
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
    user_stack_walked(tgid, tid, id, false);
    Ok(())
}

/// The user stack of the wait or wake this CPU is recording (see `LOCK_WALK_FOR`).
#[inline(always)]
pub fn user_stack_walked(tgid: u32, tid: u32, id: i32, unwound: bool) {
    let Some(walk_for) = LOCK_WALK_FOR.get(0).copied() else {
        return;
    };
    if walk_for.role == WAITER {
        if let Some(waiting) = LOCK_WAITING.get_ptr_mut(tid) {
            unsafe {
                (*waiting).stack_id = id;
                (*waiting).aux = unwound as u32;
            }
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

#[tracepoint]
pub fn futex_exit(_ctx: TracePointContext) -> u32 {
    let _ = try_futex_exit();
    0
}

fn try_futex_exit() -> Result<(), i64> {
    let (tgid, tid) = current_ids();
    let Some(waiting) = LOCK_WAITING.get_ptr(tid) else {
        return Ok(());
    };
    let waiting = unsafe { *waiting };
    let _ = LOCK_WAITING.remove(tid);
    let now = unsafe { bpf_ktime_get_ns() };
    let wait = now.saturating_sub(waiting.start_ns);
    bump(Counter::LockWaits);
    let generation = exec_generation(tgid);
    add(
        &LOCK_WAITERS,
        LockKey {
            tgid,
            stack_id: waiting.stack_id,
            uaddr: waiting.uaddr,
            stack_kind: stack_kind(waiting.aux),
            exec_generation: generation,
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
    Ok(())
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
