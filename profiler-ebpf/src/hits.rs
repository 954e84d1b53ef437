//! Sampling at tracing events: a tracepoint or a user probe runs its program at every hit,
//! whatever the perf event's period. So the program counts the targets' hits of each event
//! (exact: what a report says the event fired) and records every Nth hit as a sample, N and the
//! event's place in the run both in its cookie (`hit_cookie`). The sample goes the way of the
//! CPU sampler's: the same maps, the same stacks, the table walker where the process has tables.
use aya_ebpf::{
    helpers::{bpf_get_attach_cookie, bpf_probe_read_kernel},
    macros::{map, uprobe},
    maps::{Array, PerCpuArray},
    programs::{tracing::StackIdContext, ProbeContext},
    EbpfContext as _,
};
use profiler_common::{
    filter_op, hit_cookie_parts, FilterTerm, HealthCounter, MAX_FILTER_TERMS, MAX_SAMPLING_EVENTS,
};

use crate::{
    health::bump,
    sampling::{announce_once, record_sample},
    targets::{current_ids, is_target},
};

/// Per CPU, each event's hits by the targets, for the whole run.
#[map(name = "HITS")]
static HITS: PerCpuArray<u64> = PerCpuArray::with_max_entries(MAX_SAMPLING_EVENTS as u32, 0);

/// Set by user space: each event's filter (`--filter`), its terms at `event *
/// MAX_FILTER_TERMS + n`; none passes every hit.
#[map(name = "HIT_FILTERS")]
static HIT_FILTERS: Array<FilterTerm> =
    Array::with_max_entries((MAX_SAMPLING_EVENTS * MAX_FILTER_TERMS) as u32, 0);

/// Set by the loader: what a probe's sampled hit weighs: 0 one, else the byte offset of the
/// register to read in its `pt_regs`, plus one (`profiler_common::hit_weight`).
#[unsafe(no_mangle)]
static HIT_WEIGHT: u32 = 0;

/// Per CPU, the weight of the probe hit whose stack the walker is walking (a probe's program
/// does not nest on its CPU).
#[map(name = "PROBE_HIT_WEIGHTS")]
static PROBE_HIT_WEIGHTS: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

tracepoint! {
pub fn sample_tracepoint(ctx: TracePointContext) -> u32 {
    if let Some((tgid, tid, _)) = sampled_hit(&ctx) {
        // Hands the sample to the table walker if the process has tables (no return then).
        crate::unwind::start_tracepoint_hit(&ctx, tgid, tid);
        record_sample(&ctx, tgid, tid, None, 1);
    }
    crate::PASS_ON
}
}

#[uprobe]
pub fn sample_probe(ctx: ProbeContext) -> u32 {
    if let Some((tgid, tid, _)) = sampled_hit(&ctx) {
        let weight = weight(&ctx);
        if let Some(slot) = PROBE_HIT_WEIGHTS.get_ptr_mut(0) {
            unsafe { *slot = weight };
        }
        crate::unwind::start_probe_hit(&ctx, tgid, tid);
        record_sample(&ctx, tgid, tid, None, weight);
    }
    0
}

/// What this probe hit weighs: one, or the value of the register `HIT_WEIGHT` names (an
/// argument's or the return value's).
#[inline(always)]
fn weight(ctx: &ProbeContext) -> u64 {
    match unsafe { core::ptr::read_volatile(&HIT_WEIGHT) } {
        0 => 1,
        at => {
            // A negative value (an error returned, -1) weighs nothing rather than 2^64 - 1.
            let value = context_word(ctx.as_ptr() as *const u8, (at - 1) as usize).unwrap_or(0) as i64;
            value.max(0) as u64
        }
    }
}

/// The weight of the probe hit being walked on this CPU (see `sample_probe`).
#[inline(always)]
pub fn walked_probe_weight() -> u64 {
    PROBE_HIT_WEIGHTS.get(0).copied().unwrap_or(1)
}

/// Count a hit of a target thread; the thread and the event if this hit is one to sample (or,
/// for `record`, to record).
#[inline(always)]
pub(crate) fn sampled_hit<C: StackIdContext>(ctx: &C) -> Option<(u32, u32, u16)> {
    let (tgid, tid) = current_ids();
    if tid == 0 {
        bump(HealthCounter::Idle);
        return None;
    }
    if !is_target(tgid) {
        return None;
    }
    let (event, period) = hit_cookie_parts(unsafe { bpf_get_attach_cookie(ctx.as_ptr()) });
    if !passes_filter(ctx.as_ptr() as *const u8, event) {
        return None;
    }
    let hits = HITS.get_ptr_mut(u32::from(event))?;
    // Per CPU, and a program does not nest on its CPU: a plain add.
    let hits = unsafe {
        *hits += 1;
        *hits
    };
    if hits % period != 0 {
        return None;
    }
    announce_once(tgid);
    Some((tgid, tid, event))
}

/// The 8 bytes at `offset` of a program's context (a tracepoint's record, a probe's registers),
/// the offset bounded for the verifier.
#[inline(always)]
pub(crate) fn context_word(context: *const u8, offset: usize) -> Option<u64> {
    let word = unsafe { context.add(offset & 0x1ff) };
    unsafe { bpf_probe_read_kernel(word as *const u64) }.ok()
}

/// Whether this hit passes its event's filter: each term's number, read from the program's
/// context (a tracepoint's record, a probe's registers), compared as the term says.
#[inline(always)]
pub(crate) fn passes_filter(context: *const u8, event: u16) -> bool {
    for n in 0..MAX_FILTER_TERMS {
        let at = u32::from(event) * MAX_FILTER_TERMS as u32 + n as u32;
        let Some(term) = HIT_FILTERS.get(at) else {
            return true;
        };
        if term.op == filter_op::NONE {
            return true;
        }
        let raw = context_word(context, term.offset as usize).unwrap_or(0);
        if !term.passes(raw) {
            return false;
        }
    }
    true
}
