//! The system-call summary: the raw `sys_enter` notes the call a target thread enters and when,
//! `sys_exit` adds its time to the sums of (thread, call, errno). Only the thread itself writes
//! its entries, so plain adds suffice. A call that never returns (`exit`, `exit_group`) is
//! counted at the thread's exit; a call a fatal signal interrupts returns first (with a
//! kernel-internal errno, `ERESTARTSYS` ...).
use aya_ebpf::{
    helpers::{bpf_get_current_comm, bpf_ktime_get_ns},
    macros::{map, raw_tracepoint},
    maps::HashMap,
    programs::RawTracePointContext,
};
use profiler_common::{
    syscalls::{
        errno_of, SyscallEntry, SyscallKey, SyscallTotals, NO_RETURN, SYSCALL_THREAD_ENTRIES,
        SYSCALL_TOTAL_ENTRIES,
    },
    HealthCounter,
};

use crate::{
    health::bump,
    targets::{current_ids, is_target},
};

#[map(name = "SYSCALL_THREADS")]
static THREADS: HashMap<u32, SyscallEntry> = HashMap::with_max_entries(SYSCALL_THREAD_ENTRIES, 0);

#[map(name = "SYSCALL_TOTALS")]
static TOTALS: HashMap<SyscallKey, SyscallTotals> = HashMap::with_max_entries(SYSCALL_TOTAL_ENTRIES, 0);

/// `sys_enter(regs, id)`.
#[raw_tracepoint(tracepoint = "sys_enter")]
pub fn syscall_enter(ctx: RawTracePointContext) -> u32 {
    let (tgid, tid) = current_ids();
    if is_target(tgid) {
        enter(tgid, tid, ctx.arg::<i64>(1) as u32);
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
            entry.entered_ns = 0;
            let errno = errno_of(ctx.arg::<i64>(1));
            add(entry.tgid, tid, entry.nr, errno, took);
        }
    }
    0
}

#[inline(always)]
fn enter(tgid: u32, tid: u32, nr: u32) {
    let entered_ns = unsafe { bpf_ktime_get_ns() };
    match THREADS.get_ptr_mut(tid) {
        Some(entry) => unsafe {
            (*entry).entered_ns = entered_ns;
            (*entry).nr = nr;
        },
        None => {
            let entry = SyscallEntry { entered_ns, nr, tgid };
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
