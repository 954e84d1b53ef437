//! The system-call summary: the raw `sys_enter` notes the call a target thread enters and when,
//! `sys_exit` adds its time to the sums of (thread, call, errno). Only the thread itself writes
//! its entries, so plain adds suffice. A call that never returns (`exit`, `exit_group`) is
//! counted at the thread's exit; a call a fatal signal interrupts returns first (with a
//! kernel-internal errno, `ERESTARTSYS` ...).
//!
//! With `trace --duration-min` (`SLOW_CALL_NS`), `sys_enter` also keeps the call's arguments and
//! `sys_exit` sends each call at least that long to the `SLOW_CALLS` ring with the user stack it
//! was made from, walked by `unwind_syscall` (a tail call) through the process's tables.
use aya_ebpf::{
    bindings::pt_regs,
    helpers::{bpf_get_current_comm, bpf_get_smp_processor_id, bpf_ktime_get_ns},
    macros::{map, raw_tracepoint},
    maps::{HashMap, PerCpuArray, RingBuf},
    programs::RawTracePointContext,
};
use profiler_common::{
    syscalls::{
        errno_of, SlowCall, SlowCallHeader, SyscallEntry, SyscallKey, SyscallTotals, NO_RETURN,
        SLOW_CALL_RING_BYTES, SYSCALL_THREAD_ENTRIES, SYSCALL_TOTAL_ENTRIES,
    },
    unwind::{stop, Walk},
    HealthCounter,
};

use crate::{
    health::bump,
    sampling::announce_once,
    targets::{current_ids, is_target},
};

/// Set by the loader: calls at least this long are sent whole (0: none are).
#[unsafe(no_mangle)]
static SLOW_CALL_NS: u64 = 0;

#[map(name = "SLOW_CALLS")]
static SLOW_CALLS: RingBuf = RingBuf::with_byte_size(SLOW_CALL_RING_BYTES, 0);

/// Per CPU, the slow call whose stack is being walked (`sys_exit` does not nest on a CPU).
#[map(name = "SLOW_CALL_PENDING")]
static SLOW_CALL_PENDING: PerCpuArray<SlowCallHeader> = PerCpuArray::with_max_entries(1, 0);

#[map(name = "SYSCALL_THREADS")]
static THREADS: HashMap<u32, SyscallEntry> = HashMap::with_max_entries(SYSCALL_THREAD_ENTRIES, 0);

#[map(name = "SYSCALL_TOTALS")]
static TOTALS: HashMap<SyscallKey, SyscallTotals> = HashMap::with_max_entries(SYSCALL_TOTAL_ENTRIES, 0);

/// `sys_enter(regs, id)`.
#[raw_tracepoint(tracepoint = "sys_enter")]
pub fn syscall_enter(ctx: RawTracePointContext) -> u32 {
    let (tgid, tid) = current_ids();
    if is_target(tgid) {
        let args = match slow_call_ns() {
            0 => [0; 6],
            _ => {
                // Its memory map read (and tables built) while it lives, for the stacks.
                announce_once(tgid);
                crate::arch::syscall_args(ctx.arg::<*const pt_regs>(0))
            }
        };
        enter(tgid, tid, ctx.arg::<i64>(1) as u32, args);
    }
    0
}

/// `sys_exit(regs, ret)`.
#[raw_tracepoint(tracepoint = "sys_exit")]
pub fn syscall_exit(ctx: RawTracePointContext) -> u32 {
    let (_, tid) = current_ids();
    // Only the targets' calls are in the map (and none entered before the run began).
    if let Some(entry) = THREADS.get_ptr_mut(tid) {
        let entry = unsafe { &mut *entry };
        if entry.entered_ns != 0 {
            let took = unsafe { bpf_ktime_get_ns() }.saturating_sub(entry.entered_ns);
            let entered_ns = entry.entered_ns;
            entry.entered_ns = 0;
            let ret = ctx.arg::<i64>(1);
            add(entry.tgid, tid, entry.nr, errno_of(ret), took);
            if slow_call_ns() != 0 {
                after_call(&ctx, entry, tid, (entered_ns, took, ret));
            }
        }
    }
    0
}

/// With `--duration-min`: a slow call is sent. (A library it maps is announced by
/// `mappings.rs`, so its tables are loaded before a slow call walks through it.)
#[inline(always)]
fn after_call(
    ctx: &RawTracePointContext,
    entry: &SyscallEntry,
    tid: u32,
    (entered_ns, took, ret): (u64, u64, i64),
) {
    if took >= slow_call_ns() {
        slow(ctx, entry, tid, (entered_ns, took, ret));
    }
}

/// Calls at least this long are sent whole (0: none are).
#[inline(always)]
fn slow_call_ns() -> u64 {
    unsafe { core::ptr::read_volatile(&SLOW_CALL_NS) }
}

/// A slow call: noted for the walk of its stack, which sends it (a tail call, no return);
/// sent with no stack if the walk cannot start.
#[inline(always)]
fn slow(
    ctx: &RawTracePointContext,
    entry: &SyscallEntry,
    tid: u32,
    (entered_ns, took_ns, ret): (u64, u64, i64),
) {
    let Some(pending) = SLOW_CALL_PENDING.get_ptr_mut(0) else {
        return;
    };
    let pending = unsafe { &mut *pending };
    *pending = SlowCallHeader {
        entered_ns,
        took_ns,
        args: entry.args,
        ret,
        tgid: entry.tgid,
        tid,
        nr: entry.nr,
        cpu: unsafe { bpf_get_smp_processor_id() },
        comm: bpf_get_current_comm().unwrap_or([0; 16]),
    };
    crate::unwind::start_syscall(ctx, entry.tgid, tid);
    send_slow(None);
}

/// The pending slow call into the ring, with the stack `walked` (none: the walk could not start).
#[inline(always)]
pub fn send_slow(walked: Option<&Walk>) {
    let Some(pending) = SLOW_CALL_PENDING.get_ptr(0) else {
        return;
    };
    let Some(mut slot) = SLOW_CALLS.reserve::<SlowCall>(0) else {
        bump(HealthCounter::SlowCallsLost);
        return;
    };
    let call = unsafe { &mut *slot.as_mut_ptr() };
    call.call = unsafe { *pending };
    call.exec_generation = crate::targets::exec_generation(call.call.tgid);
    call.tables = u32::from(crate::unwind::has_current_tables(call.call.tgid));
    call.stop = walked.map_or(stop::WALKING, |walk| walk.stack.stop);
    call.user_bytes = match walked {
        None => 0,
        Some(walk) => crate::unwind::copy_walked(walk, &mut call.user),
    };
    slot.submit(0);
}

#[inline(always)]
fn enter(tgid: u32, tid: u32, nr: u32, args: [u64; 6]) {
    let entered_ns = unsafe { bpf_ktime_get_ns() };
    match THREADS.get_ptr_mut(tid) {
        Some(entry) => unsafe {
            (*entry).entered_ns = entered_ns;
            (*entry).nr = nr;
            (*entry).args = args;
        },
        None => {
            let entry = SyscallEntry {
                entered_ns,
                nr,
                tgid,
                args,
            };
            if THREADS.insert(tid, entry, 0).is_err() {
                bump(HealthCounter::SyscallThreadsFull);
            }
        }
    }
}

#[inline(always)]
fn add(tgid: u32, tid: u32, nr: u32, errno: u32, took: u64) {
    let key = SyscallKey { tgid, tid, nr, errno };
    match TOTALS.get_ptr_mut(&key) {
        Some(totals) => unsafe {
            let totals = &mut *totals;
            totals.calls += 1;
            totals.total_ns += took;
            totals.min_ns = totals.min_ns.min(took);
            totals.max_ns = totals.max_ns.max(took);
        },
        None => {
            let totals = SyscallTotals {
                calls: 1,
                total_ns: took,
                min_ns: took,
                max_ns: took,
                comm: bpf_get_current_comm().unwrap_or([0; 16]),
            };
            if TOTALS.insert(key, totals, 0).is_err() {
                bump(HealthCounter::SyscallTotalsFull);
            }
        }
    }
}

/// A thread that exec'd took on the tid `to` (its leader's): its call in progress moves with it
/// (the `execve` whose exit is still to come).
#[inline(always)]
pub fn moved_thread(from: u32, to: u32) {
    if let Some(entry) = (unsafe { THREADS.get(from) }).copied() {
        let _ = THREADS.remove(from);
        if THREADS.insert(to, entry, 0).is_err() {
            bump(HealthCounter::SyscallThreadsFull);
        }
    }
}

/// A thread exits (on itself): the call it is in never returns (`exit`, `exit_group`).
#[inline(always)]
pub fn forget_thread(tid: u32) {
    let Some(entry) = (unsafe { THREADS.get(tid) }).copied() else {
        return;
    };
    if entry.entered_ns != 0 {
        add(entry.tgid, tid, entry.nr, NO_RETURN, 0);
    }
    let _ = THREADS.remove(tid);
}
