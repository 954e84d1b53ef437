//! `record`: each sampled hit of a target (every Nth, counted in `HITS` as the sampler counts
//! them) goes to user space whole through the `RECORDS` ring: a tracepoint's record copied as
//! it is, a probe's fetches read (`RECORD_FETCHES`). A full ring drops the record and counts it.
use aya_ebpf::{
    helpers::{
        bpf_get_current_comm, bpf_get_smp_processor_id, bpf_ktime_get_ns, bpf_probe_read_kernel,
        bpf_probe_read_kernel_buf, bpf_probe_read_user, bpf_probe_read_user_str_bytes,
    },
    macros::{map, tracepoint, uprobe},
    maps::{Array, PerCpuArray, RingBuf},
    programs::{ProbeContext, TracePointContext},
    EbpfContext as _,
};
use profiler_common::{
    records::{fetch, Fetch, HitRecord, MAX_FETCHES, RECORD_RING_BYTES, STRING_BYTES},
    MAX_SAMPLING_EVENTS,
};

use crate::{arch, hits::sampled_hit};

#[map(name = "RECORDS")]
static RECORDS: RingBuf = RingBuf::with_byte_size(RECORD_RING_BYTES, 0);

#[map(name = "RECORD_FETCHES")]
static RECORD_FETCHES: Array<Fetch> = Array::with_max_entries((MAX_SAMPLING_EVENTS * MAX_FETCHES) as u32, 0);

#[map(name = "RECORDS_LOST")]
static RECORDS_LOST: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

#[tracepoint]
pub fn record_tracepoint(ctx: TracePointContext) -> u32 {
    if let Some((tgid, tid, event)) = sampled_hit(&ctx) {
        if let Some(mut entry) = reserve() {
            let record = unsafe { &mut *entry.as_mut_ptr() };
            fill(record, tgid, tid, event);
            // The tracepoint's record, fields and all (what lies past its end is never read).
            if unsafe { bpf_probe_read_kernel_buf(ctx.as_ptr() as *const u8, &mut record.data) }.is_err() {
                record.failed = u16::MAX;
            }
            fetch_all(ctx.as_ptr() as *const u8, 0, record, event);
            entry.submit(0);
        }
    }
    0
}

#[uprobe]
pub fn record_probe(ctx: ProbeContext) -> u32 {
    if let Some((tgid, tid, event)) = sampled_hit(&ctx) {
        if let Some(mut entry) = reserve() {
            let record = unsafe { &mut *entry.as_mut_ptr() };
            fill(record, tgid, tid, event);
            let pc = arch::pc(unsafe { &*ctx.regs });
            fetch_all(ctx.as_ptr() as *const u8, pc, record, event);
            entry.submit(0);
        }
    }
    0
}

/// Room for one record in the ring; none (counted) when it is full.
#[inline(always)]
fn reserve() -> Option<aya_ebpf::maps::ring_buf::RingBufEntry<HitRecord>> {
    let entry = RECORDS.reserve::<HitRecord>(0);
    if entry.is_none() {
        if let Some(lost) = RECORDS_LOST.get_ptr_mut(0) {
            // Per CPU, and a program does not nest on its CPU: a plain add.
            unsafe { *lost += 1 };
        }
    }
    entry
}

/// The record's header: when, who, where; its fetches not yet read.
#[inline(always)]
fn fill(record: &mut HitRecord, tgid: u32, tid: u32, event: u16) {
    record.time_ns = unsafe { bpf_ktime_get_ns() };
    record.tgid = tgid;
    record.tid = tid;
    record.cpu = unsafe { bpf_get_smp_processor_id() };
    record.event = event;
    record.failed = 0;
    record.comm = bpf_get_current_comm().unwrap_or_default();
    record.values = [0; MAX_FETCHES];
}

/// Each of the event's fetches into the record (`context`: the program's, `pc`: where a probe
/// hit); a fetch that faulted is marked in `failed`.
#[inline(always)]
fn fetch_all(context: *const u8, pc: u64, record: &mut HitRecord, event: u16) {
    for n in 0..MAX_FETCHES {
        let at = u32::from(event) * MAX_FETCHES as u32 + n as u32;
        if let Some(fetch) = RECORD_FETCHES.get(at) {
            if fetch.kind != fetch::NONE && !fetch_one(context, pc, fetch, record, n) {
                record.failed |= 1 << n;
            }
        }
    }
}

/// Fetch `n` of this hit into the record; false where memory could not be read.
#[inline(always)]
fn fetch_one(context: *const u8, pc: u64, fetch: &Fetch, record: &mut HitRecord, n: usize) -> bool {
    let word = || {
        let word = unsafe { context.add(fetch.word as usize & 0x1ff) };
        unsafe { bpf_probe_read_kernel(word as *const u64) }.ok()
    };
    let mut address = match fetch.kind {
        fetch::WORD => word(),
        fetch::MEMORY => word().map(|base| base.wrapping_add(fetch.delta as u64)),
        fetch::CONSTANT => Some(fetch.delta as u64),
        _ => Some(pc.wrapping_add(fetch.delta as u64)),
    };
    if fetch.kind == fetch::MEMORY && fetch.size == 0 {
        // A pointer kept in memory: the string is where it points.
        address = address.and_then(|at| unsafe { bpf_probe_read_user(at as *const u64) }.ok());
    }
    let Some(address) = address else {
        return false;
    };
    if fetch.size == 0 {
        // A string: where the word points, or the global's own bytes.
        let start = n.min(MAX_FETCHES - 1) * STRING_BYTES;
        let slot = &mut record.strings[start..start + STRING_BYTES];
        return unsafe { bpf_probe_read_user_str_bytes(address as *const u8, slot) }.is_ok();
    }
    let value = match (fetch.kind, fetch.size) {
        (fetch::WORD | fetch::CONSTANT, _) => Ok(address),
        (_, 1) => unsafe { bpf_probe_read_user(address as *const u8) }.map(u64::from),
        (_, 2) => unsafe { bpf_probe_read_user(address as *const u16) }.map(u64::from),
        (_, 4) => unsafe { bpf_probe_read_user(address as *const u32) }.map(u64::from),
        _ => unsafe { bpf_probe_read_user(address as *const u64) },
    };
    match value {
        Ok(value) => {
            record.values[n.min(MAX_FETCHES - 1)] = value;
            true
        }
        Err(_) => false,
    }
}
