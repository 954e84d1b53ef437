//! `stat --by FIELD`: at each hit of a counted tracing event by a target (and passing its
//! `--filter`), one more for the value of its number in a per-CPU hash (`VALUE_COUNTS`); a hit
//! whose value finds the hash full is counted apart, so the values' counts and the lost ones
//! add up to the event's count.
use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::bpf_get_attach_cookie,
    macros::{map, uprobe},
    maps::{Array, PerCpuArray, PerCpuHashMap},
    programs::ProbeContext,
    EbpfContext,
};
use profiler_common::{
    values::{ByField, ValueKey, VALUE_COUNT_ENTRIES},
    MAX_SAMPLING_EVENTS,
};

use crate::{
    hits::passes_filter,
    targets::{current_ids, is_target},
};

#[map(name = "BY_FIELDS")]
static BY_FIELDS: Array<ByField> = Array::with_max_entries(MAX_SAMPLING_EVENTS as u32, 0);

#[map(name = "VALUE_COUNTS")]
static VALUE_COUNTS: PerCpuHashMap<ValueKey, u64> = PerCpuHashMap::with_max_entries(VALUE_COUNT_ENTRIES, 0);

#[map(name = "VALUE_COUNTS_LOST")]
static VALUE_COUNTS_LOST: PerCpuArray<u64> = PerCpuArray::with_max_entries(MAX_SAMPLING_EVENTS as u32, 0);

tracepoint! {
pub fn count_tracepoint_value(ctx: TracePointContext) -> u32 {
    count(&ctx);
    crate::PASS_ON
}
}

#[uprobe]
pub fn count_probe_value(ctx: ProbeContext) -> u32 {
    count(&ctx);
    0
}

#[inline(always)]
fn count<C: EbpfContext>(ctx: &C) {
    let (tgid, _) = current_ids();
    if !is_target(tgid) {
        return;
    }
    let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    let event = u32::from(cookie as u16);
    let context = ctx.as_ptr() as *const u8;
    if !passes_filter(context, cookie) {
        return;
    }
    let Some(field) = BY_FIELDS.get(event) else {
        return;
    };
    let raw = crate::hits::context_word(context, field.offset as usize).unwrap_or(0);
    let key = ValueKey {
        event,
        _pad: 0,
        value: field.value(raw),
    };
    // Per CPU, added to atomically: a uprobe's program runs preemptible where the kernel allows it.
    // Another CPU may add the key between the lookup and the insert: it is then there to add to.
    if VALUE_COUNTS.get_ptr_mut(&key).is_none() {
        // Fails when the hash is full, or when another CPU just added the key: the lookup tells.
        let _ = VALUE_COUNTS.insert(&key, &0, BPF_NOEXIST as u64);
    }
    match VALUE_COUNTS.get_ptr_mut(&key) {
        Some(count) => crate::atomic::atomic_add(count, 1),
        None => {
            if let Some(lost) = VALUE_COUNTS_LOST.get_ptr_mut(event) {
                crate::atomic::atomic_add(lost, 1);
            }
        }
    }
}
