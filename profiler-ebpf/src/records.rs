//! `record`: each sampled hit of a target (every Nth, counted in `HITS` as the sampler counts
//! them) goes to user space whole through the `RECORDS` ring: a tracepoint's record copied as
//! it is, a probe's fetches read (`RECORD_FETCHES`). A full ring drops the record and counts it.
use aya_ebpf::{
    bindings::BPF_F_USER_STACK,
    helpers::{
        bpf_get_attach_cookie, bpf_get_current_comm, bpf_get_smp_processor_id, bpf_get_stack,
        bpf_ktime_get_ns, bpf_probe_read_kernel_buf, bpf_probe_read_user, bpf_probe_read_user_str_bytes,
    },
    macros::{map, uprobe},
    maps::{Array, PerCpuArray, RingBuf},
    programs::{ProbeContext, TracePointContext},
    EbpfContext,
};
use profiler_common::{
    cookie_site, hit_cookie_parts,
    records::{fetch, Fetch, HitRecord, StackedRecord, MAX_FETCHES, RECORD_RING_BYTES, STRING_BYTES},
    unwind::Walk,
    MAX_PROBE_SITES, MAX_SAMPLING_EVENTS,
};

use crate::{arch, hits::sampled_hit};

#[map(name = "RECORDS")]
static RECORDS: RingBuf = RingBuf::with_byte_size(RECORD_RING_BYTES, 0);

#[map(name = "RECORD_FETCHES")]
static RECORD_FETCHES: Array<Fetch> =
    Array::with_max_entries((MAX_SAMPLING_EVENTS * MAX_PROBE_SITES * MAX_FETCHES) as u32, 0);

#[map(name = "RECORDS_LOST")]
static RECORDS_LOST: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// Set by the loader: each record with its stacks (`record -g`, a `StackedRecord`).
#[unsafe(no_mangle)]
static RECORD_STACKS: u32 = 0;

tracepoint! {
pub fn record_tracepoint(ctx: TracePointContext) -> u32 {
    if let Some((tgid, tid, event)) = sampled_hit(&ctx) {
        if recording_stacks() {
            // Through the process's unwind tables where it has them (no return then).
            crate::unwind::start_tracepoint_hit(&ctx, tgid, tid);
        }
        emit(
            &ctx,
            |record| tracepoint_record(&ctx, record, (tgid, tid, event)),
            None,
        );
    }
    crate::PASS_ON
}
}

#[uprobe]
pub fn record_probe(ctx: ProbeContext) -> u32 {
    if let Some((tgid, tid, event)) = sampled_hit(&ctx) {
        if recording_stacks() {
            crate::unwind::start_probe_hit(&ctx, tgid, tid);
        }
        emit(
            &ctx,
            |record| probe_record(&ctx, record, (tgid, tid, event)),
            None,
        );
    }
    0
}

/// The end of a tracepoint hit's table walk (`unwind`): its record, with the walked stack.
#[inline(always)]
pub fn walked_tracepoint(ctx: &TracePointContext, walk: &Walk) {
    let event = hit_cookie_parts(unsafe { bpf_get_attach_cookie(ctx.as_ptr()) }).0;
    emit(
        ctx,
        |record| tracepoint_record(ctx, record, (walk.tgid, walk.tid, event)),
        Some(walk),
    );
}

/// The same for a probe's hit.
#[inline(always)]
pub fn walked_probe(ctx: &ProbeContext, walk: &Walk) {
    let event = hit_cookie_parts(unsafe { bpf_get_attach_cookie(ctx.as_ptr()) }).0;
    emit(
        ctx,
        |record| probe_record(ctx, record, (walk.tgid, walk.tid, event)),
        Some(walk),
    );
}

/// Whether records carry their stacks (`record -g`).
#[inline(always)]
pub fn recording_stacks() -> bool {
    unsafe { core::ptr::read_volatile(&RECORD_STACKS) != 0 }
}

/// A tracepoint's hit: its record, fields and all (what lies past its end is never read).
#[inline(always)]
fn tracepoint_record(ctx: &TracePointContext, record: &mut HitRecord, (tgid, tid, event): (u32, u32, u16)) {
    fill(record, tgid, tid, event);
    if unsafe { bpf_probe_read_kernel_buf(ctx.as_ptr() as *const u8, &mut record.data) }.is_err() {
        record.failed = u8::MAX;
    }
    fetch_all(
        ctx.as_ptr() as *const u8,
        0,
        record,
        u32::from(event) * MAX_PROBE_SITES as u32,
    );
}

/// A probe's hit: what it fetches, read at the probed instruction as its site places it.
#[inline(always)]
fn probe_record(ctx: &ProbeContext, record: &mut HitRecord, (tgid, tid, event): (u32, u32, u16)) {
    fill(record, tgid, tid, event);
    let pc = arch::pc(unsafe { &*ctx.regs });
    let site = cookie_site(unsafe { bpf_get_attach_cookie(ctx.as_ptr()) });
    let slot = u32::from(event) * MAX_PROBE_SITES as u32 + u32::from(site);
    fetch_all(ctx.as_ptr() as *const u8, pc, record, slot);
}

/// One record into the ring, filled by `fill`, with its stacks if they are asked for: the user
/// stack `walked` through tables, else by frame pointers.
#[inline(always)]
fn emit<C: EbpfContext>(ctx: &C, fill: impl FnOnce(&mut HitRecord), walked: Option<&Walk>) {
    if !recording_stacks() {
        if let Some(mut entry) = reserve::<HitRecord>() {
            fill(unsafe { &mut *entry.as_mut_ptr() });
            entry.submit(0);
        }
        return;
    }
    if let Some(mut entry) = reserve::<StackedRecord>() {
        let record = unsafe { &mut *entry.as_mut_ptr() };
        fill(&mut record.hit);
        match walked {
            Some(walk) => record.user_bytes = crate::unwind::copy_walked(walk, &mut record.user),
            None => {
                record.user_bytes = stack(ctx, &mut record.user, BPF_F_USER_STACK as u64);
            }
        }
        record.kernel_bytes = stack(ctx, &mut record.kernel, 0);
        record.exec_generation = crate::targets::exec_generation(record.hit.tgid);
        entry.submit(0);
    }
}

/// The current stack into `frames` (leaf first): the bytes written, or the negative error.
#[inline(always)]
fn stack<C: EbpfContext, const N: usize>(ctx: &C, frames: &mut [u64; N], flags: u64) -> i32 {
    let size = core::mem::size_of::<[u64; N]>() as u32;
    (unsafe { bpf_get_stack(ctx.as_ptr(), frames.as_mut_ptr() as *mut _, size, flags) }) as i32
}

/// Room for one record in the ring; none (counted) when it is full.
#[inline(always)]
fn reserve<T: 'static>() -> Option<aya_ebpf::maps::ring_buf::RingBufEntry<T>> {
    let entry = RECORDS.reserve::<T>(0);
    if entry.is_none() {
        if let Some(lost) = RECORDS_LOST.get_ptr_mut(0) {
            // Per CPU, added to atomically: a uprobe's program runs preemptible where the kernel
            // allows it.
            crate::atomic::atomic_add(lost, 1);
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
    record.cut = 0;
    record.comm = bpf_get_current_comm().unwrap_or_default();
    record.values = [0; MAX_FETCHES];
}

/// Each of the fetches at `slot` (an event's site) into the record (`context`: the
/// program's, `pc`: where a probe hit); a fetch that faulted is marked in `failed`.
#[inline(always)]
fn fetch_all(context: *const u8, pc: u64, record: &mut HitRecord, slot: u32) {
    for n in 0..MAX_FETCHES {
        let at = slot * MAX_FETCHES as u32 + n as u32;
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
    if fetch.size != 0 {
        let Some(value) = fetched_number(context, pc, fetch) else {
            return false;
        };
        record.values[n.min(MAX_FETCHES - 1)] = value;
        return true;
    }
    let mut address = address_of(context, pc, fetch);
    if fetch.kind == fetch::MEMORY {
        // A pointer kept in memory: the string is where it points.
        address = address.and_then(|at| unsafe { bpf_probe_read_user(at as *const u64) }.ok());
    }
    let Some(address) = address else {
        return false;
    };
    // A string: where the word points, or the global's own bytes.
    let start = n.min(MAX_FETCHES - 1) * STRING_BYTES;
    let slot = &mut record.strings[start..start + STRING_BYTES];
    let Ok(read) = (unsafe { bpf_probe_read_user_str_bytes(address as *const u8, slot) }) else {
        return false;
    };
    if read.len() == STRING_BYTES - 1 {
        // The slot is full: cut, unless its last byte was the string's end.
        let past = address.wrapping_add(STRING_BYTES as u64 - 1) as *const u8;
        if unsafe { bpf_probe_read_user(past) }.is_ok_and(|byte| byte != 0) {
            record.cut |= 1 << n;
        }
    }
    true
}

/// Where a fetch's value lies (a word or a constant: the value itself). `context`: the
/// program's, `pc`: where a probe hit.
#[inline(always)]
fn address_of(context: *const u8, pc: u64, fetch: &Fetch) -> Option<u64> {
    let word = || crate::hits::context_word(context, fetch.word as usize);
    match fetch.kind {
        fetch::WORD => word(),
        fetch::MEMORY => word().map(|base| base.wrapping_add(fetch.delta as u64)),
        fetch::CONSTANT => Some(fetch.delta as u64),
        _ => Some(pc.wrapping_add(fetch.delta as u64)),
    }
}

/// A fetch's number (`size` 1 to 8 bytes), widened to 64 bits as its sign says; none where
/// memory could not be read. What a record, a weight and a filter read alike.
#[inline(always)]
pub(crate) fn fetched_number(context: *const u8, pc: u64, fetch: &Fetch) -> Option<u64> {
    let address = address_of(context, pc, fetch)?;
    let value = match (fetch.kind, fetch.size) {
        (fetch::WORD | fetch::CONSTANT, _) => Ok(address),
        (_, 1) => unsafe { bpf_probe_read_user(address as *const u8) }.map(u64::from),
        (_, 2) => unsafe { bpf_probe_read_user(address as *const u16) }.map(u64::from),
        (_, 4) => unsafe { bpf_probe_read_user(address as *const u32) }.map(u64::from),
        _ => unsafe { bpf_probe_read_user(address as *const u64) },
    };
    value.ok().map(|value| extended(value, fetch))
}

/// A number of the fetch's size widened to 64 bits as its sign says (a register's upper bits
/// are whatever the code left there).
#[inline(always)]
fn extended(value: u64, fetch: &Fetch) -> u64 {
    let shift = match fetch.size {
        1 | 2 | 4 => 64 - u32::from(fetch.size) * 8,
        _ => return value,
    };
    match fetch.signed {
        0 => value << shift >> shift,
        _ => ((value << shift) as i64 >> shift) as u64,
    }
}
