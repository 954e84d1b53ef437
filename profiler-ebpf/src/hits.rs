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
    EbpfContext,
};
use profiler_common::{
    cookie_site, filter_op, hit_cookie_parts,
    records::{fetch, Fetch},
    FilterTerm, HealthCounter, MAX_FILTER_TERMS, MAX_PROBE_SITES, MAX_SAMPLING_EVENTS,
};

use crate::{
    health::bump,
    sampling::{announce_once, record_sample},
    targets::{current_ids, is_target},
};

/// Each event's hits by the targets, for the whole run: one counter for every CPU, so that every
/// Nth hit of the run is sampled, not every Nth of each CPU's.
#[map(name = "HITS")]
static HITS: Array<u64> = Array::with_max_entries(MAX_SAMPLING_EVENTS as u32, 0);

/// Set by user space: each event's filter (`--filter`), as each of its sites reads it, its terms
/// at `(event * MAX_PROBE_SITES + site) * MAX_FILTER_TERMS + n`; none passes every hit.
#[map(name = "HIT_FILTERS")]
static HIT_FILTERS: Array<FilterTerm> = Array::with_max_entries(
    (MAX_SAMPLING_EVENTS * MAX_PROBE_SITES * MAX_FILTER_TERMS) as u32,
    0,
);

/// Set by user space (`--weight`): what a sampled hit weighs, at `event * MAX_PROBE_SITES +
/// site` (a probe's site, see `with_site`): a number read as a record's fetch is (an
/// argument, the return value, a tracepoint's field, a USDT argument, a global); none weighs one.
#[map(name = "WEIGHT_FETCHES")]
static WEIGHT_FETCHES: Array<Fetch> =
    Array::with_max_entries((MAX_SAMPLING_EVENTS * MAX_PROBE_SITES) as u32, 0);

/// Per CPU, the weight of the hit whose stack the walker is walking: a probe's at 0, a
/// tracepoint's at 1 (neither program nests on its CPU).
#[map(name = "HIT_WEIGHTS")]
static HIT_WEIGHTS: PerCpuArray<u64> = PerCpuArray::with_max_entries(2, 0);

tracepoint! {
pub fn sample_tracepoint(ctx: TracePointContext) -> u32 {
    if let Some((tgid, tid, _)) = sampled_hit(&ctx) {
        let weight = weight(&ctx, 0, TRACEPOINT_WALK);
        // Hands the sample to the table walker if the process has tables (no return then).
        crate::unwind::start_tracepoint_hit(&ctx, tgid, tid);
        record_sample(&ctx, tgid, tid, None, weight);
    }
    crate::PASS_ON
}
}

#[uprobe]
pub fn sample_probe(ctx: ProbeContext) -> u32 {
    if let Some((tgid, tid, _)) = sampled_hit(&ctx) {
        let weight = weight(&ctx, crate::arch::pc(unsafe { &*ctx.regs }), PROBE_WALK);
        crate::unwind::start_probe_hit(&ctx, tgid, tid);
        record_sample(&ctx, tgid, tid, None, weight);
    }
    0
}

/// `HIT_WEIGHTS`' slots.
pub const PROBE_WALK: u32 = 0;
pub const TRACEPOINT_WALK: u32 = 1;

/// What this hit weighs (`WEIGHT_FETCHES`), kept in `walk`'s slot for the walker: one, or the
/// number its event's fetch reads (`pc`: where a probe hit). A negative number (an error
/// returned, -1) or one that could not be read weighs nothing.
#[inline(always)]
fn weight<C: EbpfContext>(ctx: &C, pc: u64, walk: u32) -> u64 {
    let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    let slot =
        u32::from(hit_cookie_parts(cookie).0) * MAX_PROBE_SITES as u32 + u32::from(cookie_site(cookie));
    let weight = match WEIGHT_FETCHES.get(slot) {
        Some(fetch) if fetch.kind != fetch::NONE => {
            let value = crate::records::fetched_number(ctx.as_ptr() as *const u8, pc, fetch).unwrap_or(0);
            (value as i64).max(0) as u64
        }
        _ => 1,
    };
    if let Some(kept) = HIT_WEIGHTS.get_ptr_mut(walk) {
        unsafe { *kept = weight };
    }
    weight
}

/// The weight of the hit being walked on this CPU (see `weight`).
#[inline(always)]
pub fn walked_weight(walk: u32) -> u64 {
    HIT_WEIGHTS.get(walk).copied().unwrap_or(1)
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
    let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    let (event, period) = hit_cookie_parts(cookie);
    if !passes_filter(ctx.as_ptr() as *const u8, cookie) {
        return None;
    }
    let hits = crate::atomic::atomic_fetch_add(HITS.get_ptr_mut(u32::from(event))?, 1) + 1;
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

/// Whether this hit passes its event's filter, as its site (the cookie's, see `with_site`)
/// reads it: each term's number, read from the program's context (a tracepoint's record, a
/// probe's registers, or memory they point at), compared as the term says. A number that could
/// not be read is 0.
#[inline(always)]
pub(crate) fn passes_filter(context: *const u8, cookie: u64) -> bool {
    let slot = u32::from(cookie as u16) * MAX_PROBE_SITES as u32 + u32::from(cookie_site(cookie));
    for n in 0..MAX_FILTER_TERMS {
        let Some(term) = HIT_FILTERS.get(slot * MAX_FILTER_TERMS as u32 + n as u32) else {
            return true;
        };
        if term.op == filter_op::NONE {
            return true;
        }
        // No term reads a global by its distance from the probed instruction: no `pc`.
        let number = crate::records::fetched_number(context, 0, &term.fetch).unwrap_or(0);
        if !term.passes(number) {
            return false;
        }
    }
    true
}
