//! `latency --from A --to B`: each hit of A (by a target) notes when, under its key; the next
//! hit of B with that key takes the time since into a per-CPU histogram. The key is the thread,
//! or up to two numbers of each side's context (`LATENCY_KEYS`): a tracepoint's fields
//! (`dev,sector` of a block request, which completes in an interrupt, on no target's thread), a
//! probe's arguments or return value (a request's address, passed to its submit and complete).
//!
//! With `--duration-min` (`LATENCY_SLOW_NS`), each start also keeps who started it and its
//! stacks: the user stack through the process's unwind tables (the tracing hit's walker, a tail
//! call that ends in `walked_start`), else by frame pointers; and each interval at least that
//! long goes to the `LATENCY_SLOW` ring with its start.
use aya_ebpf::{
    bindings::BPF_F_USER_STACK,
    helpers::{bpf_get_attach_cookie, bpf_get_current_comm, bpf_ktime_get_ns},
    macros::{map, uprobe},
    maps::{HashMap, PerCpuArray, RingBuf, StackTrace},
    programs::{tracing::StackIdContext, ProbeContext},
};
use profiler_common::{
    hist_bucket,
    latency::{
        slot, KeyFields, LatencyKey, LatencyKeys, LatencyStart, SlowInterval, FROM, LATENCY_STACK_ENTRIES,
        LATENCY_START_ENTRIES, SLOW_INTERVAL_RING_BYTES,
    },
    sized, HealthCounter,
};

use crate::{
    health::bump,
    hits::{context_word, passes_filter},
    sampling::{announce_once, stack_id},
    targets::{current_ids, exec_generation, is_target},
};

/// Set by the loader: intervals at least this long are sent whole (0: none are).
#[unsafe(no_mangle)]
static LATENCY_SLOW_NS: u64 = 0;

#[map(name = "LATENCY_SLOW")]
static SLOW: RingBuf = RingBuf::with_byte_size(SLOW_INTERVAL_RING_BYTES, 0);

#[map(name = "LATENCY_STACKS")]
static STACKS: StackTrace = StackTrace::with_max_entries(LATENCY_STACK_ENTRIES, 0);

/// Per CPU, the start whose user stack is being walked (tracing programs do not nest on a CPU).
#[map(name = "LATENCY_PENDING")]
static PENDING: PerCpuArray<SlowInterval> = PerCpuArray::with_max_entries(1, 0);

/// Set by the loader: each side's key.
#[unsafe(no_mangle)]
static LATENCY_KEYS: LatencyKeys = LatencyKeys {
    sides: [KeyFields {
        fields: 0,
        signed: 0,
        offsets: [0; 2],
        sizes: [0; 2],
    }; 2],
};

#[map(name = "LATENCY_STARTS")]
static STARTS: HashMap<LatencyKey, LatencyStart> = HashMap::with_max_entries(LATENCY_START_ENTRIES, 0);

#[map(name = "LATENCY_HIST")]
static HIST: PerCpuArray<u64> = PerCpuArray::with_max_entries(slot::SLOTS, 0);

tracepoint! {
pub fn latency_tracepoint(ctx: TracePointContext) -> u32 {
    hit(&ctx, crate::unwind::start_tracepoint_hit);
    crate::PASS_ON
}
}

#[uprobe]
pub fn latency_probe(ctx: ProbeContext) -> u32 {
    hit(&ctx, crate::unwind::start_probe_hit);
    0
}

/// A hit of either side (the attach cookie): a start that passes the filter, or an end, under
/// its key.
#[inline(always)]
fn hit<C: StackIdContext>(ctx: &C, walk: fn(&C, u32, u32)) {
    // The side is the cookie's event (a probe's site is above it: `with_site`).
    let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    let side = u64::from(cookie as u16);
    if side == FROM && !passes_filter(ctx.as_ptr() as *const u8, cookie) {
        return;
    }
    if let Some(key) = key_of(ctx.as_ptr() as *const u8, side) {
        match side {
            FROM => start(ctx, key, walk),
            _ => end(key),
        }
    }
}

/// A side's key: the thread, or the values of its key's numbers in the program's context (a
/// tracepoint's fields, a probe's registers).
#[inline(always)]
fn key_of(context: *const u8, side: u64) -> Option<LatencyKey> {
    let fields = unsafe { core::ptr::read_volatile(&LATENCY_KEYS) }.sides[(side & 1) as usize];
    match fields.fields {
        0 => thread_key(),
        _ => Some(LatencyKey {
            a: key_number(context, &fields, 0)?,
            b: key_number(context, &fields, 1)?,
        }),
    }
}

/// The `i`th number of the key (0 past the side's numbers).
#[inline(always)]
fn key_number(context: *const u8, fields: &KeyFields, i: usize) -> Option<u64> {
    if i >= fields.fields as usize || i >= 2 {
        return Some(0);
    }
    let raw = context_word(context, fields.offsets[i] as usize)?;
    Some(sized(raw, fields.sizes[i] as u8).0)
}

/// A side keyed by thread: only the targets' threads start or end one.
#[inline(always)]
fn thread_key() -> Option<LatencyKey> {
    let (tgid, tid) = current_ids();
    (tid != 0 && is_target(tgid)).then_some(LatencyKey { a: tid as u64, b: 0 })
}

/// A start by a target (a side keyed by fields starts only for the targets too), noted at once
/// (an end may come on another CPU while its stack is walked). With `--duration-min` it keeps
/// who started it and its kernel stack, and its user stack is added once walked: through its
/// process's tables where it has them (`walk`: the hit's walker, a tail call that returns only
/// if it could not start; `walked_start` adds the stack then), else by frame pointers.
#[inline(always)]
fn start<C: StackIdContext>(ctx: &C, key: LatencyKey, walk: fn(&C, u32, u32)) {
    let now = unsafe { bpf_ktime_get_ns() };
    let (tgid, tid) = current_ids();
    if !is_target(tgid) {
        return;
    }
    let mut start = LatencyStart {
        started_ns: now,
        tgid,
        tid,
        ..LatencyStart::default()
    };
    if slow_ns() == 0 {
        note(key, &start);
        return;
    }
    // Its memory map read (and tables built) while it lives, for the stacks.
    announce_once(tgid);
    start.comm = bpf_get_current_comm().unwrap_or([0; 16]);
    start.exec_generation = exec_generation(tgid);
    start.kernel_stack = stack_id(ctx, &STACKS, 0, false);
    start.user_stack = NOT_WALKED;
    note(key, &start);
    if let Some(pending) = PENDING.get_ptr_mut(0) {
        unsafe {
            (*pending).start = start;
            (*pending).key = key;
        }
        walk(ctx, tgid, tid);
    }
    add_user_stack(
        key,
        &start,
        stack_id(ctx, &STACKS, BPF_F_USER_STACK as u64, true),
        false,
    );
}

/// The user stack of a start whose interval ended before it was walked: `-EINPROGRESS`.
const NOT_WALKED: i32 = -115;

/// The end of a start's table walk (`unwind`): the walked stack's id added to its start, if the
/// start is this thread's (a preempted uprobe's walk may resume after another thread's start
/// on this CPU took the scratch: that start is not given this stack).
#[inline(always)]
pub fn walked_start(stack_id: i32) {
    if let Some(pending) = PENDING.get_ptr(0) {
        let pending = unsafe { &*pending };
        if pending.start.tid == current_ids().1 {
            add_user_stack(pending.key, &pending.start, stack_id, true);
        }
    }
}

/// Its user stack into a start still waiting for its end (the same start: its thread and time).
#[inline(always)]
fn add_user_stack(key: LatencyKey, start: &LatencyStart, stack_id: i32, tables: bool) {
    if let Some(waiting) = STARTS.get_ptr_mut(&key) {
        let waiting = unsafe { &mut *waiting };
        if waiting.started_ns == start.started_ns && waiting.tid == start.tid {
            waiting.user_stack = stack_id;
            waiting.user_tables = u32::from(tables);
        }
    }
}

/// Whether starts walk their stacks (`--duration-min`): the tracing hits' walkers end here.
#[inline(always)]
pub fn walks_starts() -> bool {
    slow_ns() != 0
}

#[inline(always)]
fn slow_ns() -> u64 {
    unsafe { core::ptr::read_volatile(&LATENCY_SLOW_NS) }
}

/// A start waits for its end; one not ended yet is replaced (timed from the later one), and
/// counted.
#[inline(always)]
fn note(key: LatencyKey, start: &LatencyStart) {
    if unsafe { STARTS.get(key) }.is_some() {
        add(slot::REPLACED, 1);
    }
    if STARTS.insert(key, *start, 0).is_err() {
        bump(HealthCounter::LatencyStartsFull);
    }
}

/// An end: the time since its key's start into the histogram (and, at least `--duration-min`
/// long, the interval whole into the ring).
#[inline(always)]
fn end(key: LatencyKey) {
    let now = unsafe { bpf_ktime_get_ns() };
    let Some(start) = (unsafe { STARTS.get(key) }).copied() else {
        add(slot::UNMATCHED, 1);
        return;
    };
    // Only the end that removes the start times it (two CPUs may end one key at once).
    if STARTS.remove(key).is_err() {
        return;
    }
    let took = now.saturating_sub(start.started_ns);
    add(hist_bucket(took) as u32, 1);
    add(slot::SUM, took);
    if let Some(max) = HIST.get_ptr_mut(slot::MAX) {
        unsafe { *max = (*max).max(took) };
    }
    let threshold = slow_ns();
    if threshold != 0 && took >= threshold {
        let interval = SlowInterval {
            start,
            key,
            took_ns: took,
        };
        if SLOW.output::<SlowInterval>(&interval, 0).is_err() {
            bump(HealthCounter::SlowIntervalsLost);
        }
    }
}

/// A thread exits: a start keyed by it never ends (and its tid may be reused).
#[inline(always)]
pub fn forget_thread(tid: u32) {
    if keyed_by_thread() {
        let _ = STARTS.remove(LatencyKey { a: tid as u64, b: 0 });
    }
}

/// A thread that exec'd took on the tid `to`: its start moves with it.
#[inline(always)]
pub fn moved_thread(from: u32, to: u32) {
    if !keyed_by_thread() {
        return;
    }
    let from = LatencyKey { a: from as u64, b: 0 };
    if let Some(start) = (unsafe { STARTS.get(from) }).copied() {
        let _ = STARTS.remove(from);
        let _ = STARTS.insert(LatencyKey { a: to as u64, b: 0 }, start, 0);
    }
}

#[inline(always)]
fn keyed_by_thread() -> bool {
    unsafe { core::ptr::read_volatile(&LATENCY_KEYS) }.sides[0].fields == 0
}

/// Per CPU, added to atomically: a uprobe's program runs preemptible where the kernel allows it.
#[inline(always)]
fn add(at: u32, value: u64) {
    if let Some(slot) = HIST.get_ptr_mut(at) {
        crate::atomic::atomic_add(slot, value);
    }
}
