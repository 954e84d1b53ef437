//! pthread source: probes on the lock functions of the libc each target maps (attached per
//! process). A lock call that finds the lock held by another thread, or sleeps in the call, is a
//! contention: its wait runs from the probe at entry to the return probe, and its stack is
//! walked from the caller (at entry when it found the lock held, so the walk overlaps the wait;
//! else at the return). Each release while others wait charges the releasing stack with the
//! waiting done since the lock last changed hands, so holder stacks add up to the wait they
//! caused.
//!
//! Every acquisition and release is followed (who holds which lock), but stacks are walked only
//! for contended waits and for releases that had waiters: an uncontended lock costs the probe
//! traps and a few map operations.
use aya_ebpf::{
    bindings::pt_regs,
    helpers::{
        bpf_get_current_task, bpf_ktime_get_ns, bpf_probe_read_kernel, generated::bpf_get_attach_cookie,
    },
    macros::{map, uprobe, uretprobe},
    maps::{HashMap, LruHashMap, PerCpuArray},
    programs::{ProbeContext, RetProbeContext},
    EbpfContext,
};
use profiler_common::{
    lock::{
        call, call_flags, stack, LockCall, LockId, LockKey, LockState, WalkFor, HOLDER, STATE_ENTRIES,
        WAITER, WAITER_AT_ENTRY, WAIT_ENTRIES,
    },
    HealthCounter,
};

use super::{add, LOCK_HOLDERS, LOCK_WAITERS, NO_STACK};
use crate::{
    arch::{self, UserRegisters},
    atomic::atomic_add,
    health::bump,
    targets::{current_ids, exec_generation},
};

/// Offset of `task_struct.nvcsw` (from BTF); `u32::MAX`: unknown, only waits for a holder that
/// was seen count.
#[unsafe(no_mangle)]
static TASK_NVCSW_OFFSET: u32 = u32::MAX;

#[map(name = "LOCK_STATES")]
static LOCK_STATES: LruHashMap<LockId, LockState> = LruHashMap::with_max_entries(STATE_ENTRIES, 0);
#[map(name = "LOCK_CALLS")]
static LOCK_CALLS: HashMap<u32, LockCall> = HashMap::with_max_entries(WAIT_ENTRIES, 0);
/// Whose stack the walk in progress on this CPU is.
#[map(name = "PTHREAD_WALK_FOR")]
static PTHREAD_WALK_FOR: PerCpuArray<WalkFor> = PerCpuArray::with_max_entries(1, 0);

#[uprobe]
pub fn pthread_enter(ctx: ProbeContext) -> u32 {
    let _ = try_pthread_enter(&ctx);
    0
}

fn try_pthread_enter(ctx: &ProbeContext) -> Result<(), i64> {
    let (tgid, tid) = current_ids();
    let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    let kind = call::kind(cookie);
    let regs = unsafe { &*ctx.regs };
    let uaddr = arch::register(regs, call::register(cookie));
    let id = LockId { tgid, _pad: 0, uaddr };
    let now = unsafe { bpf_ktime_get_ns() };
    if call::destroys(kind) {
        destroyed(id, now);
        return Ok(());
    }
    if call::acquires(kind) {
        // Every call that may wait counts as waiting while in the lock function: it can only
        // be charged to a holder that releases meanwhile, so an uncontended call adds nothing;
        // and a call that finds the lock free yet waits (taken by a thread still inside its
        // own lock call) is charged to that holder's release all the same.
        let mut flags = 0;
        if call::waits(kind) {
            if let Some(state) = state_of(id, now) {
                let state = unsafe { &mut *state };
                if held_against(state, tid, kind) {
                    flags |= call_flags::FOUND_HELD;
                }
                atomic_add(&mut state.waiting, 1);
                atomic_add(&mut state.waiting_start_sum, now);
                flags |= call_flags::WAITING;
            }
        }
        let entry = LockCall {
            uaddr,
            entry_ns: now,
            entry_ip: arch::pc(regs),
            kind,
            flags,
            switches: voluntary_switches(),
            stack_id: NO_STACK,
            _pad: 0,
        };
        if LOCK_CALLS.insert(tid, entry, 0).is_err() {
            bump(HealthCounter::LockMapFull);
            kernel_log!("lock map full: a pthread lock call of tid {} not timed", tid);
            if flags & call_flags::WAITING != 0 {
                stop_waiting(id, now);
            }
            return Ok(());
        }
        if flags & call_flags::FOUND_HELD != 0 {
            // Walk now, while it waits anyway.
            if let Some(caller) = caller_registers(regs, cookie) {
                let walk_for = WalkFor {
                    uaddr,
                    wait_ns: 0,
                    role: WAITER_AT_ENTRY,
                    instance: 0,
                };
                start_walk(ctx, tgid, tid, walk_for, arch::pc(regs), caller);
            }
            return Ok(());
        }
        // A condition wait also releases: on to that.
        if kind != call::COND_WAIT {
            return Ok(());
        }
    }
    if !call::releases(kind) {
        return Ok(());
    }
    let Some(state) = LOCK_STATES.get_ptr_mut(id) else {
        return Ok(());
    };
    let state = unsafe { &mut *state };
    let charge = released(state, tid, now);
    if charge == 0 {
        return Ok(());
    }
    let Some(caller) = caller_registers(regs, cookie) else {
        record(tgid, uaddr, HOLDER, state.instance, charge, NO_STACK);
        return Ok(());
    };
    let walk_for = WalkFor {
        uaddr,
        wait_ns: charge,
        role: HOLDER,
        instance: state.instance,
    };
    walk(ctx, tgid, tid, walk_for, arch::pc(regs), caller);
    Ok(())
}

/// The registers of the lock function's caller at the probe (see `arch::caller_at_prologue`).
#[inline(always)]
fn caller_registers(regs: &pt_regs, cookie: u64) -> Option<UserRegisters> {
    arch::caller_at_prologue(regs, call::pushed(cookie) as u64)
}

#[uretprobe]
pub fn pthread_return(ctx: RetProbeContext) -> u32 {
    let _ = try_pthread_return(&ctx);
    0
}

fn try_pthread_return(ctx: &RetProbeContext) -> Result<(), i64> {
    let (tgid, tid) = current_ids();
    let Some(entry) = LOCK_CALLS.get_ptr(tid) else {
        return Ok(());
    };
    let entry = unsafe { *entry };
    let _ = LOCK_CALLS.remove(tid);
    let regs = unsafe { &*ctx.regs };
    let now = unsafe { bpf_ktime_get_ns() };
    let id = LockId {
        tgid,
        _pad: 0,
        uaddr: entry.uaddr,
    };
    // A condition wait returns holding the mutex whatever it returns.
    let acquired = arch::return_value(regs) as u32 == 0 || entry.kind == call::COND_WAIT;
    let state = unsafe { &mut *state_of(id, now).ok_or(0)? };
    let waited_as_waiter = entry.flags & call_flags::WAITING != 0;
    if waited_as_waiter {
        leave_waiting(state, entry.entry_ns);
    }
    if acquired {
        if entry.kind == call::RWLOCK_RDLOCK {
            atomic_add(&mut state.readers, 1);
        } else {
            state.holder = tid;
            state.acquired_ns = now;
        }
    }
    // A new holder: the waiting since the last release, while the lock changed hands, is
    // nobody's hold. (A reader joining others changes nothing for the waiters.)
    if acquired && (entry.kind != call::RWLOCK_RDLOCK || waited_as_waiter) {
        let (waiting, start_sum) = waiting_now(state);
        restart_charge(state, now, waiting, start_sum);
    }
    // Contended: it found the lock held, or it slept in the call.
    let slept = entry.switches != voluntary_switches();
    if (entry.flags & call_flags::FOUND_HELD == 0 && !slept) || !call::waits(entry.kind) {
        return Ok(());
    }
    let wait = now.saturating_sub(entry.entry_ns);
    if entry.stack_id != NO_STACK {
        record(tgid, entry.uaddr, WAITER, state.instance, wait, entry.stack_id);
        return Ok(());
    }
    let walk_for = WalkFor {
        uaddr: entry.uaddr,
        wait_ns: wait,
        role: WAITER,
        instance: state.instance,
    };
    // The return lands in the caller: its registers start the walk below the lock function.
    walk(ctx, tgid, tid, walk_for, entry.entry_ip, arch::registers(regs));
    Ok(())
}

/// The current thread's voluntary context switches (0 if unknown).
#[inline(always)]
fn voluntary_switches() -> u64 {
    let offset = unsafe { core::ptr::read_volatile(&TASK_NVCSW_OFFSET) };
    if offset == u32::MAX {
        return 0;
    }
    let task = unsafe { bpf_get_current_task() };
    unsafe { bpf_probe_read_kernel((task + offset as u64) as *const u64) }.unwrap_or(0)
}

/// The lock's state, created on first use.
#[inline(always)]
fn state_of(id: LockId, now: u64) -> Option<*mut LockState> {
    if let Some(state) = LOCK_STATES.get_ptr_mut(id) {
        return Some(state);
    }
    let fresh = LockState {
        since_ns: now,
        ..Default::default()
    };
    // BPF_NOEXIST: another CPU's insert of the same lock wins.
    let _ = LOCK_STATES.insert(id, fresh, 1);
    LOCK_STATES.get_ptr_mut(id)
}

/// The lock is held by someone else in a way that makes a `kind` call wait.
#[inline(always)]
fn held_against(state: &LockState, tid: u32, kind: u32) -> bool {
    let writer = state.holder != 0 && state.holder != tid;
    match kind {
        call::RWLOCK_RDLOCK => writer,
        _ => writer || state.readers > 0,
    }
}

/// A release by `tid`: end its hold and return the waiting it is charged with.
#[inline(always)]
fn released(state: &mut LockState, tid: u32, now: u64) -> u64 {
    if state.holder == tid {
        let hold = now.saturating_sub(state.acquired_ns);
        state.holds += 1;
        state.hold_total_ns += hold;
        if hold > state.hold_max_ns {
            state.hold_max_ns = hold;
        }
        state.holder = 0;
    } else if state.readers > 0 {
        atomic_add(&mut state.readers, u64::MAX);
    } else {
        // Taken where we do not probe (trylock of an rwlock, inside libc): released all the same.
        state.holder = 0;
    }
    let (waiting, start_sum) = waiting_now(state);
    let since = state.since_ns;
    let before = state.waiting_at_since;
    let span = now.saturating_sub(since);
    let charge = if waiting == 0 {
        0
    } else if waiting < before {
        // A waiter gave up (timed lock) since: all that remain waited at most the span.
        waiting * span
    } else {
        // `before` waiters waited the whole span, each later one since its own start.
        let later = (waiting - before)
            .wrapping_mul(now)
            .wrapping_sub(start_sum.wrapping_sub(state.start_sum_at_since));
        let exact = (before * span).wrapping_add(later);
        if exact > waiting * span {
            waiting * span
        } else {
            exact
        }
    };
    restart_charge(state, now, waiting, start_sum);
    charge
}

/// The waiters now: how many, and the sum of their start times (both updated atomically by
/// other CPUs).
#[inline(always)]
fn waiting_now(state: &LockState) -> (u64, u64) {
    unsafe {
        (
            core::ptr::read_volatile(&state.waiting),
            core::ptr::read_volatile(&state.waiting_start_sum),
        )
    }
}

/// The next release is charged from `now`, with these waiters.
#[inline(always)]
fn restart_charge(state: &mut LockState, now: u64, waiting: u64, start_sum: u64) {
    state.since_ns = now;
    state.waiting_at_since = waiting;
    state.start_sum_at_since = start_sum;
}

/// A waiter that started at `start` leaves the lock's waiters.
#[inline(always)]
fn leave_waiting(state: &mut LockState, start: u64) {
    atomic_add(&mut state.waiting, u64::MAX);
    atomic_add(&mut state.waiting_start_sum, start.wrapping_neg());
}

/// A waiter whose call could not be recorded (or whose thread died in it) is no waiter.
#[inline(always)]
fn stop_waiting(id: LockId, start: u64) {
    if let Some(state) = LOCK_STATES.get_ptr_mut(id) {
        leave_waiting(unsafe { &mut *state }, start);
    }
}

/// The lock was destroyed: memory reused for another lock is another lock.
#[inline(always)]
fn destroyed(id: LockId, now: u64) {
    if let Some(state) = LOCK_STATES.get_ptr_mut(id) {
        let instance = unsafe { (*state).instance } + 1;
        let fresh = LockState {
            since_ns: now,
            instance,
            ..Default::default()
        };
        let _ = LOCK_STATES.insert(id, fresh, 0);
    }
}

/// Walk the stack starting at `leaf` (the probed instruction, in the lock function) and then
/// at the caller's `registers`, and record the wait or release; the walker ends in
/// `stack_walked`.
#[inline(always)]
fn walk<C: EbpfContext>(
    ctx: &C,
    tgid: u32,
    tid: u32,
    walk_for: WalkFor,
    leaf: u64,
    registers: UserRegisters,
) {
    start_walk(ctx, tgid, tid, walk_for, leaf, registers);
    record(
        tgid,
        walk_for.uaddr,
        walk_for.role,
        walk_for.instance,
        walk_for.wait_ns,
        NO_STACK,
    );
}

/// Start the walk (a tail call: returns only if it could not start).
#[inline(always)]
fn start_walk<C: EbpfContext>(
    ctx: &C,
    tgid: u32,
    tid: u32,
    walk_for: WalkFor,
    leaf: u64,
    registers: UserRegisters,
) {
    if let Some(slot) = PTHREAD_WALK_FOR.get_ptr_mut(0) {
        unsafe { *slot = walk_for };
        crate::sampling::announce_once(tgid);
        crate::unwind::start_pthread(ctx, tgid, tid, leaf, registers);
    }
}

/// The walker's result for the wait or release this CPU is recording.
#[inline(always)]
pub fn stack_walked(tgid: u32, tid: u32, id: i32) {
    let Some(walk_for) = PTHREAD_WALK_FOR.get(0).copied() else {
        return;
    };
    if walk_for.role == WAITER_AT_ENTRY {
        if let Some(entry) = LOCK_CALLS.get_ptr_mut(tid) {
            unsafe { (*entry).stack_id = id };
        }
        return;
    }
    record(
        tgid,
        walk_for.uaddr,
        walk_for.role,
        walk_for.instance,
        walk_for.wait_ns,
        id,
    );
}

#[inline(always)]
fn record(tgid: u32, uaddr: u64, role: u32, instance: u32, wait: u64, stack_id: i32) {
    let key = LockKey {
        tgid,
        stack_id,
        uaddr,
        stack_kind: stack::USER_UNWOUND,
        exec_generation: exec_generation(tgid),
        instance,
        flags: 0,
    };
    match role {
        WAITER => {
            bump(HealthCounter::LockWaits);
            add(&LOCK_WAITERS, key, wait)
        }
        _ => add(&LOCK_HOLDERS, key, wait),
    }
}

/// A thread that exits inside a lock call (killed) leaves no entry, and no waiter, behind.
#[inline(always)]
pub fn forget_thread(tgid: u32, tid: u32) {
    if let Some(entry) = LOCK_CALLS.get_ptr(tid) {
        let entry = unsafe { *entry };
        if entry.flags & call_flags::WAITING != 0 {
            stop_waiting(
                LockId {
                    tgid,
                    _pad: 0,
                    uaddr: entry.uaddr,
                },
                entry.entry_ns,
            );
        }
        let _ = LOCK_CALLS.remove(tid);
    }
}
