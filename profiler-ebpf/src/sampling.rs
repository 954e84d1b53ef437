//! The sampling program: on each perf event, record (thread, user stack, kernel stack) += 1.
//!
//! Maps come in two epoch slots. User space flips `EPOCH` and drains the idle slot, so a long run
//! never fills a map and never races a read against an increment.
use aya_ebpf::{
    bindings::BPF_F_USER_STACK,
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid},
    macros::{map, perf_event},
    maps::{Array, HashMap, LruHashMap, RingBuf, StackTrace},
    programs::{tracing::StackIdContext as _, PerfEventContext},
};
use profiler_common::{
    Counter, ProcessEvent, ProcessEventKind, SampleKey, EVENT_RING_BYTES, SAMPLE_MAP_ENTRIES,
    SEEN_MAP_ENTRIES, STACK_MAP_ENTRIES,
};

use crate::{
    counters::{atomic_add, bump},
    targets::is_target,
};

const EFAULT: i64 = 14;
const EEXIST: i64 = 17;

#[map(name = "EPOCH")]
pub(crate) static EPOCH: Array<u32> = Array::with_max_entries(1, 0);
#[map(name = "SAMPLES_0")]
static SAMPLES_0: HashMap<SampleKey, u64> = HashMap::with_max_entries(SAMPLE_MAP_ENTRIES, 0);
#[map(name = "SAMPLES_1")]
static SAMPLES_1: HashMap<SampleKey, u64> = HashMap::with_max_entries(SAMPLE_MAP_ENTRIES, 0);
#[map(name = "STACKS_0")]
static STACKS_0: StackTrace = StackTrace::with_max_entries(STACK_MAP_ENTRIES, 0);
#[map(name = "STACKS_1")]
static STACKS_1: StackTrace = StackTrace::with_max_entries(STACK_MAP_ENTRIES, 0);
/// Processes already announced to user space.
#[map(name = "SEEN")]
pub(crate) static SEEN: LruHashMap<u32, u8> = LruHashMap::with_max_entries(SEEN_MAP_ENTRIES, 0);
#[map(name = "EVENTS")]
static EVENTS: RingBuf = RingBuf::with_byte_size(EVENT_RING_BYTES, 0);

#[perf_event]
pub fn sample_stack(ctx: PerfEventContext) -> u32 {
    match try_sample_stack(&ctx) {
        Ok(()) => 0,
        Err(_) => 0,
    }
}

fn try_sample_stack(ctx: &PerfEventContext) -> Result<(), i64> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let (tgid, tid) = ((pid_tgid >> 32) as u32, pid_tgid as u32);
    if tid == 0 {
        bump(Counter::Idle);
        return Ok(());
    }
    if !is_target(tgid) {
        return Ok(());
    }
    announce_once(tgid);
    let slot = EPOCH.get(0).copied().unwrap_or(0);
    if slot == 0 {
        record(ctx, tgid, tid, &STACKS_0, &SAMPLES_0)
    } else {
        record(ctx, tgid, tid, &STACKS_1, &SAMPLES_1)
    }
}

#[inline(always)]
fn record(
    ctx: &PerfEventContext,
    tgid: u32,
    tid: u32,
    stacks: &StackTrace,
    samples: &HashMap<SampleKey, u64>,
) -> Result<(), i64> {
    let user_stack_id = stack_id(ctx, stacks, BPF_F_USER_STACK as u64, true);
    let kernel_stack_id = stack_id(ctx, stacks, 0, false);
    let key = SampleKey {
        tgid,
        tid,
        user_stack_id,
        kernel_stack_id,
        comm: bpf_get_current_comm().unwrap_or([0; 16]),
    };
    if let Some(count) = samples.get_ptr_mut(key) {
        atomic_add(count, 1);
    } else if samples.insert(key, 1, 0).is_err() {
        // Either the map is full, or another CPU inserted the same key first: retry once.
        match samples.get_ptr_mut(key) {
            Some(count) => atomic_add(count, 1),
            None => {
                bump(Counter::SampleMapFull);
                return Ok(());
            }
        }
    }
    bump(Counter::Samples);
    Ok(())
}

/// The stack id, or the negative error, counted when it is a real failure. `-EFAULT` is normal:
/// no user stack for a kernel thread, no kernel stack for a sample taken in user mode.
#[inline(always)]
fn stack_id(ctx: &PerfEventContext, stacks: &StackTrace, flags: u64, user: bool) -> i32 {
    match ctx.get_stackid(stacks, flags) {
        Ok(id) => id as i32,
        Err(err) => {
            let err = err as i64;
            if err == -EEXIST {
                bump(if user {
                    Counter::UserStackCollision
                } else {
                    Counter::KernelStackCollision
                });
            } else if err != -EFAULT {
                bump(if user {
                    Counter::UserStackError
                } else {
                    Counter::KernelStackError
                });
            }
            err as i32
        }
    }
}

/// Announce a process the first time it is seen (again after an exec).
#[inline(always)]
pub fn announce_once(tgid: u32) {
    if SEEN.get_ptr(tgid).is_none() {
        let _ = SEEN.insert(tgid, 1, 0);
        announce(tgid, ProcessEventKind::FirstSample);
    }
}

/// Tell user space about a process while it is alive, so its memory map can be captured.
#[inline(always)]
fn announce(tgid: u32, kind: ProcessEventKind) {
    let event = ProcessEvent {
        tgid,
        kind: kind as u32,
    };
    if EVENTS.output::<ProcessEvent>(&event, 0).is_err() {
        bump(Counter::EventLost);
    }
}
