//! `latency --from A --to B`: each hit of A (by a target) notes when, under its key; the next
//! hit of B with that key takes the time since into a per-CPU histogram. The key is the thread,
//! or up to two fields of each side's tracepoint (`LATENCY_KEYS`: `dev,sector` of a block
//! request, which completes in an interrupt, on no target's thread).
use aya_ebpf::{
    helpers::{bpf_get_attach_cookie, bpf_ktime_get_ns},
    macros::{map, uprobe},
    maps::{HashMap, PerCpuArray},
    programs::{ProbeContext, TracePointContext},
    EbpfContext,
};
use profiler_common::{
    hist_bucket,
    latency::{slot, KeyFields, LatencyKey, LatencyKeys, FROM, LATENCY_START_ENTRIES},
    HealthCounter,
};

use crate::{
    health::bump,
    hits::passes_filter,
    targets::{current_ids, is_target},
};

/// Set by the loader: each side's key.
#[unsafe(no_mangle)]
static LATENCY_KEYS: LatencyKeys = LatencyKeys {
    sides: [KeyFields {
        fields: 0,
        _pad: 0,
        offsets: [0; 2],
        sizes: [0; 2],
    }; 2],
};

#[map(name = "LATENCY_STARTS")]
static STARTS: HashMap<LatencyKey, u64> = HashMap::with_max_entries(LATENCY_START_ENTRIES, 0);

#[map(name = "LATENCY_HIST")]
static HIST: PerCpuArray<u64> = PerCpuArray::with_max_entries(slot::SLOTS, 0);

tracepoint! {
pub fn latency_tracepoint(ctx: TracePointContext) -> u32 {
    let side = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    if side == FROM && !passes_filter(ctx.as_ptr() as *const u8, FROM as u16) {
        return crate::PASS_ON;
    }
    let fields = unsafe { core::ptr::read_volatile(&LATENCY_KEYS) }.sides[(side & 1) as usize];
    match fields.fields {
        0 => by_thread(side),
        _ => {
            if let (Some(a), Some(b)) = (field(&ctx, &fields, 0), field(&ctx, &fields, 1)) {
                hit(side, LatencyKey { a, b });
            }
        }
    }
    crate::PASS_ON
}
}

#[uprobe]
pub fn latency_probe(ctx: ProbeContext) -> u32 {
    let side = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    if side != FROM || passes_filter(ctx.as_ptr() as *const u8, FROM as u16) {
        by_thread(side);
    }
    0
}

/// A side keyed by thread: only the targets' threads start or end one.
#[inline(always)]
fn by_thread(side: u64) {
    let (tgid, tid) = current_ids();
    if tid != 0 && is_target(tgid) {
        hit(side, LatencyKey { a: tid as u64, b: 0 });
    }
}

/// The `i`th key field's value (0 past the side's fields).
#[inline(always)]
fn field(ctx: &TracePointContext, fields: &KeyFields, i: usize) -> Option<u64> {
    if i >= fields.fields as usize || i >= 2 {
        return Some(0);
    }
    let at = fields.offsets[i] as usize;
    unsafe {
        match fields.sizes[i] {
            1 => ctx.read_at::<u8>(at).ok().map(u64::from),
            2 => ctx.read_at::<u16>(at).ok().map(u64::from),
            4 => ctx.read_at::<u32>(at).ok().map(u64::from),
            _ => ctx.read_at::<u64>(at).ok(),
        }
    }
}

#[inline(always)]
fn hit(side: u64, key: LatencyKey) {
    let now = unsafe { bpf_ktime_get_ns() };
    if side == FROM {
        // A side keyed by fields starts only for the targets too.
        let (tgid, _) = current_ids();
        if !is_target(tgid) {
            return;
        }
        // A start not ended yet is replaced (timed from the later one), and counted.
        if unsafe { STARTS.get(key) }.is_some() {
            add(slot::REPLACED, 1);
        }
        if STARTS.insert(key, now, 0).is_err() {
            bump(HealthCounter::LatencyStartsFull);
        }
        return;
    }
    let Some(started) = (unsafe { STARTS.get(key) }).copied() else {
        add(slot::UNMATCHED, 1);
        return;
    };
    // Only the end that removes the start times it (two CPUs may end one key at once).
    if STARTS.remove(key).is_err() {
        return;
    }
    let took = now.saturating_sub(started);
    add(hist_bucket(took) as u32, 1);
    add(slot::SUM, took);
    if let Some(max) = HIST.get_ptr_mut(slot::MAX) {
        unsafe { *max = (*max).max(took) };
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
    if let Some(started) = (unsafe { STARTS.get(from) }).copied() {
        let _ = STARTS.remove(from);
        let _ = STARTS.insert(LatencyKey { a: to as u64, b: 0 }, started, 0);
    }
}

#[inline(always)]
fn keyed_by_thread() -> bool {
    unsafe { core::ptr::read_volatile(&LATENCY_KEYS) }.sides[0].fields == 0
}

/// Per CPU, and a program does not nest on its CPU: a plain add.
#[inline(always)]
fn add(at: u32, value: u64) {
    if let Some(slot) = HIST.get_ptr_mut(at) {
        unsafe { *slot += value };
    }
}
