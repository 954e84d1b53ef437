//! Kernel source: `lock:contention_begin`/`contention_end`, the kernel's own record of a task
//! waiting for a kernel lock (spinning or sleeping), with the lock type in the flags. Waits are
//! keyed per thread and lock, so a wait for an inner lock (a mutex's wait_lock) nests inside the
//! outer one. The kernel does not say who holds the lock: no holder stacks from this source.
use aya_ebpf::{
    helpers::bpf_ktime_get_ns,
    macros::map,
    maps::LruHashMap,
    programs::{tracing::StackIdContext as _, TracePointContext},
};
use profiler_common::lock::{stack, LockId, LockKey, Waiting, WAIT_ENTRIES};

use super::{add, LOCK_STACKS, LOCK_WAITERS};
use crate::{
    health::bump,
    targets::{current_ids, is_target},
};

/// Both events: `lock_addr` after the 8-byte common header; `flags` (begin) after it.
const LOCK_ADDR: usize = 8;
const FLAGS: usize = 16;

/// Per (tid, lock): LRU, because a thread that dies mid-wait cannot be found by tid alone.
#[map(name = "LOCK_KERNEL_WAITING")]
static LOCK_KERNEL_WAITING: LruHashMap<LockId, Waiting> = LruHashMap::with_max_entries(WAIT_ENTRIES, 0);

tracepoint! {
pub fn contention_begin(ctx: TracePointContext) -> u32 {
    let _ = try_contention_begin(&ctx);
    crate::PASS_ON
}
}

fn try_contention_begin(ctx: &TracePointContext) -> Result<(), i64> {
    let (tgid, tid) = current_ids();
    if !is_target(tgid) {
        return Ok(());
    }
    let uaddr: u64 = unsafe { ctx.read_at(LOCK_ADDR) }?;
    let key = LockId {
        tgid: tid,
        _pad: 0,
        uaddr,
    };
    // A sleeping lock may report the same wait again after spinning: the first begin counts.
    if LOCK_KERNEL_WAITING.get_ptr(key).is_some() {
        return Ok(());
    }
    let flags: u32 = unsafe { ctx.read_at(FLAGS) }?;
    let stack_id = match ctx.get_stackid(&LOCK_STACKS, 0) {
        Ok(id) => id as i32,
        Err(e) => e,
    };
    let waiting = Waiting {
        uaddr,
        start_ns: unsafe { bpf_ktime_get_ns() },
        stack_id,
        aux: flags,
        ..Default::default()
    };
    if LOCK_KERNEL_WAITING.insert(key, waiting, 0).is_err() {
        bump(profiler_common::HealthCounter::LockMapFull);
        kernel_log!("lock map full: a kernel lock wait not timed");
    }
    Ok(())
}

tracepoint! {
pub fn contention_end(ctx: TracePointContext) -> u32 {
    let _ = try_contention_end(&ctx);
    crate::PASS_ON
}
}

fn try_contention_end(ctx: &TracePointContext) -> Result<(), i64> {
    let (tgid, tid) = current_ids();
    let uaddr: u64 = unsafe { ctx.read_at(LOCK_ADDR) }?;
    let key = LockId {
        tgid: tid,
        _pad: 0,
        uaddr,
    };
    let Some(waiting) = LOCK_KERNEL_WAITING.get_ptr(key) else {
        return Ok(());
    };
    let waiting = unsafe { *waiting };
    let _ = LOCK_KERNEL_WAITING.remove(key);
    let wait = unsafe { bpf_ktime_get_ns() }.saturating_sub(waiting.start_ns);
    bump(profiler_common::HealthCounter::LockWaits);
    let key = LockKey {
        tgid,
        stack_id: waiting.stack_id,
        uaddr,
        stack_kind: stack::KERNEL,
        flags: waiting.aux,
        ..Default::default()
    };
    add(&LOCK_WAITERS, key, wait);
    Ok(())
}
