//! The sampling program: on each perf event, record (thread, user stack, kernel stack) += 1.
//!
//! Maps come in two epoch slots. User space flips `EPOCH` and drains the idle slot, so a long run
//! never fills a map and never races a read against an increment.
use aya_ebpf::{
    bindings::{bpf_perf_event_value, BPF_F_CURRENT_CPU, BPF_F_USER_BUILD_ID, BPF_F_USER_STACK, BPF_NOEXIST},
    helpers::{bpf_get_attach_cookie, bpf_get_current_cgroup_id, bpf_get_current_comm, bpf_get_stack},
    macros::{map, perf_event, raw_tracepoint},
    maps::{Array, HashMap, LruHashMap, PerCpuArray, PerfEventArray, RingBuf, StackTrace},
    programs::{tracing::StackIdContext, PerfEventContext, RawTracePointContext},
};
use profiler_common::{
    said, seen, BuildIdKey, BuildIdStack, CounterBaseline, CounterDeltas, FileId, HealthCounter,
    ProcessEvent, ProcessEventKind, SampleKey, SampleValue, BUILD_ID_STACK_ENTRIES, COMM_LEN,
    EVENT_RING_BYTES, MAX_COUNTERS, PENDING_DELTA_ENTRIES, SAMPLE_MAP_ENTRIES, SEEN_MAP_ENTRIES,
    STACK_MAP_ENTRIES,
};

use crate::{
    atomic::atomic_add,
    health::bump,
    targets::{current_ids, is_target},
};

const EFAULT: i64 = 14;
const EEXIST: i64 = 17;

/// The value of `key` in a hash map (plain or LRU: they share no trait), inserted as zero if
/// absent; none when the map is full.
macro_rules! get_or_insert {
    ($map:expr, $key:expr, $value:ty) => {{
        match $map.get_ptr_mut($key) {
            Some(value) => Some(value),
            None => {
                // Either new, or another CPU inserted the same key first: insert-if-absent
                // (BPF_NOEXIST), then look again.
                let _ = $map.insert($key, <$value>::default(), 1);
                $map.get_ptr_mut($key)
            }
        }
    }};
}

/// The epoch's generation, counted up at every flip; its low bit is the slot being written.
#[map(name = "EPOCH")]
pub(crate) static EPOCH: Array<u32> = Array::with_max_entries(1, 0);
#[map(name = "SAMPLES_0")]
static SAMPLES_0: HashMap<SampleKey, SampleValue> = HashMap::with_max_entries(SAMPLE_MAP_ENTRIES, 0);
#[map(name = "SAMPLES_1")]
static SAMPLES_1: HashMap<SampleKey, SampleValue> = HashMap::with_max_entries(SAMPLE_MAP_ENTRIES, 0);

/// How many of the COUNTER_n arrays user space filled (0: no counter deltas).
#[unsafe(no_mangle)]
static COUNTERS_IN_USE: u32 = 0;
/// Per-CPU counting events, one array per counter, read with bpf_perf_event_read_value.
#[map(name = "COUNTER_0")]
static COUNTER_0: PerfEventArray<u32> = PerfEventArray::new(0);
#[map(name = "COUNTER_1")]
static COUNTER_1: PerfEventArray<u32> = PerfEventArray::new(0);
#[map(name = "COUNTER_2")]
static COUNTER_2: PerfEventArray<u32> = PerfEventArray::new(0);
#[map(name = "COUNTER_3")]
static COUNTER_3: PerfEventArray<u32> = PerfEventArray::new(0);
#[map(name = "COUNTER_4")]
static COUNTER_4: PerfEventArray<u32> = PerfEventArray::new(0);
#[map(name = "COUNTER_5")]
static COUNTER_5: PerfEventArray<u32> = PerfEventArray::new(0);
#[map(name = "COUNTER_6")]
static COUNTER_6: PerfEventArray<u32> = PerfEventArray::new(0);
#[map(name = "COUNTER_7")]
static COUNTER_7: PerfEventArray<u32> = PerfEventArray::new(0);
/// Counter deltas per sample key, beside the counts (user space shrinks them to one entry when
/// no counter is in use, so plain sampling pays no memory for them).
#[map(name = "DELTAS_0")]
static DELTAS_0: HashMap<SampleKey, CounterDeltas> = HashMap::with_max_entries(SAMPLE_MAP_ENTRIES, 0);
#[map(name = "DELTAS_1")]
static DELTAS_1: HashMap<SampleKey, CounterDeltas> = HashMap::with_max_entries(SAMPLE_MAP_ENTRIES, 0);
#[map(name = "COUNTER_BASELINE")]
static COUNTER_BASELINE: PerCpuArray<CounterBaseline> = PerCpuArray::with_max_entries(1, 0);
/// Per CPU, what the counters advanced over every interval a target thread ran: the run's
/// totals, from the same counters as the samples' deltas. A second set of counters for the
/// totals would compete with these for the PMU's few counters (and, counted per thread, lose:
/// the kernel schedules per-CPU events first).
#[map(name = "COUNTER_TOTALS")]
static COUNTER_TOTALS: PerCpuArray<CounterDeltas> = PerCpuArray::with_max_entries(1, 0);
#[map(name = "STACKS_0")]
static STACKS_0: StackTrace = StackTrace::with_max_entries(STACK_MAP_ENTRIES, 0);
#[map(name = "STACKS_1")]
static STACKS_1: StackTrace = StackTrace::with_max_entries(STACK_MAP_ENTRIES, 0);
/// Frame-pointer user stacks the kernel resolved to (build ID, file offset), per process: what
/// symbolizes a process that exits before user space reads its memory map.
#[map(name = "BUILD_ID_STACKS_0")]
static BUILD_ID_STACKS_0: HashMap<BuildIdKey, BuildIdStack> =
    HashMap::with_max_entries(BUILD_ID_STACK_ENTRIES, 0);
#[map(name = "BUILD_ID_STACKS_1")]
static BUILD_ID_STACKS_1: HashMap<BuildIdKey, BuildIdStack> =
    HashMap::with_max_entries(BUILD_ID_STACK_ENTRIES, 0);
/// Where a build-ID stack is written before it is inserted (too big for the BPF stack).
#[map(name = "BUILD_ID_SCRATCH")]
static BUILD_ID_SCRATCH: PerCpuArray<BuildIdStack> = PerCpuArray::with_max_entries(1, 0);
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
    let (tgid, tid) = current_ids();
    if tid == 0 {
        bump(HealthCounter::Idle);
        return Ok(());
    }
    if !is_target(tgid) {
        return Ok(());
    }
    announce_once(tgid);
    // Hands the sample to the table walker if the process has tables (no return then).
    crate::unwind::start(ctx, tgid, tid);
    record_sample(ctx, tgid, tid, None, 1);
    Ok(())
}

/// Record one sample, with the table walker's user stack (its id, or the negative error) or,
/// without one, the frame-pointer walk's.
#[inline(always)]
pub fn record_sample<C: StackIdContext>(ctx: &C, tgid: u32, tid: u32, unwound: Option<i32>, weight: u64) {
    let slot = EPOCH.get(0).copied().unwrap_or(0) & 1;
    let _ = if slot == 0 {
        record(
            ctx,
            (tgid, tid),
            (&STACKS_0, &BUILD_ID_STACKS_0),
            &SAMPLES_0,
            &DELTAS_0,
            (unwound, weight),
        )
    } else {
        record(
            ctx,
            (tgid, tid),
            (&STACKS_1, &BUILD_ID_STACKS_1),
            &SAMPLES_1,
            &DELTAS_1,
            (unwound, weight),
        )
    };
}

#[inline(always)]
fn record<C: StackIdContext>(
    ctx: &C,
    (tgid, tid): (u32, u32),
    (stacks, build_ids): (&StackTrace, &HashMap<BuildIdKey, BuildIdStack>),
    samples: &HashMap<SampleKey, SampleValue>,
    deltas: &HashMap<SampleKey, CounterDeltas>,
    (unwound, weight): (Option<i32>, u64),
) -> Result<(), i64> {
    let (user_stack_id, user_unwound) = match unwound {
        Some(id) => (id, 1),
        None => {
            let id = stack_id(ctx, stacks, BPF_F_USER_STACK as u64, true);
            record_build_ids(ctx, tgid, id, build_ids);
            (id, 0)
        }
    };
    let kernel_stack_id = stack_id(ctx, stacks, 0, false);
    let key = SampleKey {
        tgid,
        tid,
        user_stack_id,
        kernel_stack_id,
        comm: bpf_get_current_comm().unwrap_or([0; 16]),
        user_unwound,
        // The event's place in the run's `-e` list, set when it was attached.
        event: unsafe { bpf_get_attach_cookie(ctx.as_ptr()) } as u16,
        exec_generation: crate::targets::exec_generation(tgid),
    };
    let Some(value) = get_or_insert!(samples, &key, SampleValue) else {
        bump(HealthCounter::SampleMapFull);
        kernel_log!("sample map full: a sample of pid {} tid {} dropped", tgid, tid);
        return Ok(());
    };
    unsafe { atomic_add(&mut (*value).count, weight) };
    add_counter_deltas(tid, &key, deltas);
    bump(HealthCounter::Samples);
    Ok(())
}

/// Beside a frame-pointer stack, the same stack as (build ID, file offset) per frame, once per
/// process and stack in an epoch. Only while tables are in use: then this path is taken only by
/// processes user space has not captured yet, and some of those exit before it can (a vfork
/// child before its exec runs in its parent's memory, which is never captured for it).
#[inline(always)]
fn record_build_ids<C: StackIdContext>(
    ctx: &C,
    tgid: u32,
    stack_id: i32,
    build_ids: &HashMap<BuildIdKey, BuildIdStack>,
) {
    if stack_id < 0 || !crate::unwind::tables_in_use() {
        return;
    }
    let key = BuildIdKey {
        tgid,
        stack_id: stack_id as u32,
    };
    if build_ids.get_ptr(key).is_some() {
        return;
    }
    let Some(scratch) = BUILD_ID_SCRATCH.get_ptr_mut(0) else {
        return;
    };
    // The kernel walks the same registers as the stack id's walk, and zeroes what it leaves.
    let written = unsafe {
        bpf_get_stack(
            ctx.as_ptr(),
            scratch.cast(),
            core::mem::size_of::<BuildIdStack>() as u32,
            (BPF_F_USER_STACK | BPF_F_USER_BUILD_ID) as u64,
        )
    };
    if written <= 0 {
        return;
    }
    // By reference: a 1 KiB value would not fit the BPF stack.
    #[allow(clippy::needless_borrows_for_generic_args)]
    let inserted = build_ids.insert(key, unsafe { &*scratch }, BPF_NOEXIST as u64);
    match inserted {
        Ok(()) => {}
        // Another CPU recorded the same stack first.
        Err(e) if i64::from(e) == -EEXIST => {}
        Err(_) => bump(HealthCounter::BuildIdMapFull),
    }
}

/// The baseline was taken at a context switch: the interval since belongs to the thread that
/// switch put on the CPU, which is whichever thread the next sample here finds running.
const SWITCHED_IN: u32 = u32::MAX;

/// Per thread, what the counters advanced while it ran since its last sample, up to the switches
/// that took it off a CPU: its next sample (on any CPU) takes it.
#[map(name = "PENDING_DELTAS")]
static PENDING_DELTAS: LruHashMap<u32, CounterDeltas> =
    LruHashMap::with_max_entries(PENDING_DELTA_ENTRIES, 0);

/// Attached to `sched_switch` while counters are read at samples. The counters count per CPU, so
/// every switch ends the interval of the thread leaving (kept for it in `PENDING_DELTAS`) and
/// starts a fresh one: a sample's deltas then hold exactly its own thread's counts since its
/// previous sample, never those of threads that ran in between.
#[raw_tracepoint(tracepoint = "sched_switch")]
pub fn counter_switch(_ctx: RawTracePointContext) -> u32 {
    let _ = try_counter_switch();
    0
}

fn try_counter_switch() -> Result<(), ()> {
    let base = unsafe { &mut *COUNTER_BASELINE.get_ptr_mut(0).ok_or(())? };
    // In the switch, `current` is still the thread leaving the CPU.
    let (tgid, tid) = current_ids();
    let owned = tid != 0 && owns_interval(base, tid) && is_target(tgid);
    let pending = match owned {
        true => get_or_insert!(PENDING_DELTAS, tid, CounterDeltas).unwrap_or(core::ptr::null_mut()),
        false => core::ptr::null_mut(),
    };
    base.tid = SWITCHED_IN;
    advance_counters(base, pending, owned);
    Ok(())
}

/// Whether the interval since the CPU's baseline is `tid`'s: the baseline is its own previous
/// sample here, or the switch that put it on the CPU.
#[inline(always)]
fn owns_interval(base: &CounterBaseline, tid: u32) -> bool {
    base.tid == tid || base.tid == SWITCHED_IN
}

/// Add to the sample what each counter advanced for its thread since the thread's previous
/// sample: on this CPU since the baseline, plus what it counted elsewhere before switches (its
/// pending deltas). With the intervals' enabled and running time, so user space can scale a
/// multiplexed counter.
#[inline(always)]
fn add_counter_deltas(tid: u32, key: &SampleKey, deltas: &HashMap<SampleKey, CounterDeltas>) {
    if counters_in_use() == 0 {
        return;
    }
    let Some(base) = COUNTER_BASELINE.get_ptr_mut(0) else {
        return;
    };
    let base = unsafe { &mut *base };
    let ours = owns_interval(base, tid);
    base.tid = tid;
    let target = match get_or_insert!(deltas, key, CounterDeltas) {
        Some(t) => t,
        None => {
            bump(HealthCounter::DeltaMapFull);
            core::ptr::null_mut()
        }
    };
    if let Some(pending) = PENDING_DELTAS.get_ptr(tid) {
        if !target.is_null() {
            let (t, p) = unsafe { (&mut *target, &*pending) };
            atomic_add(&mut t.enabled_ns, p.enabled_ns);
            for k in 0..MAX_COUNTERS {
                atomic_add(&mut t.values[k], p.values[k]);
                atomic_add(&mut t.running_ns[k], p.running_ns[k]);
            }
        }
        let _ = PENDING_DELTAS.remove(tid);
    }
    advance_counters(base, if ours { target } else { core::ptr::null_mut() }, ours);
}

/// Read every counter in use on this CPU: add what each advanced since the baseline to `into`
/// (when not null) and, when a target thread `owned` the interval, to the run's totals; make the
/// readings the new baseline.
#[inline(always)]
fn advance_counters(base: &mut CounterBaseline, into: *mut CounterDeltas, owned: bool) {
    let totals = match owned {
        true => COUNTER_TOTALS.get_ptr_mut(0).unwrap_or(core::ptr::null_mut()),
        false => core::ptr::null_mut(),
    };
    let in_use = counters_in_use();
    // The interval's length: the first counter read's enabled time (0 until one is read).
    let mut enabled_delta: u64 = 0;
    let mut have_length = false;
    for k in 0..MAX_COUNTERS {
        if k >= in_use {
            break;
        }
        let reader: &PerfEventArray<u32> = match k {
            0 => &COUNTER_0,
            1 => &COUNTER_1,
            2 => &COUNTER_2,
            3 => &COUNTER_3,
            4 => &COUNTER_4,
            5 => &COUNTER_5,
            6 => &COUNTER_6,
            _ => &COUNTER_7,
        };
        let Some(now) = read_counter(reader) else {
            continue;
        };
        let (Some(value), Some(enabled), Some(running)) = (
            base.values.get_mut(k),
            base.enabled_ns.get_mut(k),
            base.running_ns.get_mut(k),
        ) else {
            continue;
        };
        if now.counter >= *value && now.enabled >= *enabled && now.running >= *running {
            // Every counter is enabled for the same intervals: one length per interval. Each
            // counter's time on the PMU is that length less its own time off it, so a counter
            // never multiplexed reads exactly the interval though it was read a moment later.
            let own_enabled = now.enabled - *enabled;
            if !have_length {
                enabled_delta = own_enabled;
                have_length = true;
            }
            let off_pmu = own_enabled.saturating_sub(now.running - *running);
            let on_pmu = enabled_delta.saturating_sub(off_pmu);
            for t in [into, totals] {
                if t.is_null() {
                    continue;
                }
                let t = unsafe { &mut *t };
                if let (Some(dv), Some(dr)) = (t.values.get_mut(k), t.running_ns.get_mut(k)) {
                    atomic_add(dv, now.counter - *value);
                    atomic_add(dr, on_pmu);
                }
            }
        }
        *value = now.counter;
        *enabled = now.enabled;
        *running = now.running;
    }
    for t in [into, totals] {
        if !t.is_null() {
            atomic_add(unsafe { &mut (*t).enabled_ns }, enabled_delta);
        }
    }
}

#[inline(always)]
fn counters_in_use() -> usize {
    unsafe { core::ptr::read_volatile(&COUNTERS_IN_USE) as usize }
}

#[inline(always)]
fn read_counter(reader: &PerfEventArray<u32>) -> Option<bpf_perf_event_value> {
    let mut v = bpf_perf_event_value {
        counter: 0,
        enabled: 0,
        running: 0,
    };
    let ret = unsafe {
        aya_ebpf::helpers::bpf_perf_event_read_value(
            reader as *const PerfEventArray<u32> as *mut core::ffi::c_void,
            BPF_F_CURRENT_CPU,
            &mut v,
            core::mem::size_of::<bpf_perf_event_value>() as u32,
        )
    };
    (ret == 0).then_some(v)
}

/// The stack id, or the negative error, counted when it is a real failure. `-EFAULT` is normal:
/// no user stack for a kernel thread, no kernel stack for a sample taken in user mode.
#[inline(always)]
pub(crate) fn stack_id<C: StackIdContext>(ctx: &C, stacks: &StackTrace, flags: u64, user: bool) -> i32 {
    match ctx.get_stackid(stacks, flags) {
        Ok(id) => id as i32,
        Err(err) => {
            let err = err as i64;
            if err == -EEXIST {
                bump(if user {
                    HealthCounter::UserStackCollision
                } else {
                    HealthCounter::KernelStackCollision
                });
            } else if err != -EFAULT {
                bump(if user {
                    HealthCounter::UserStackError
                } else {
                    HealthCounter::KernelStackError
                });
                let which = if user { "user" } else { "kernel" };
                kernel_log!("bpf_get_stackid failed for a {} stack: error {}", which, err);
            }
            err as i32
        }
    }
}

/// Announce a process the first time it is seen (again after an exec), for its memory map.
#[inline(always)]
pub fn announce_once(tgid: u32) {
    if !captured(tgid) {
        let _ = SEEN.insert(tgid, seen::CAPTURED, 0);
        announce(tgid, ProcessEventKind::FirstSample);
    }
}

/// The same from the process's own task, with its labels (which user space then need not read),
/// which `labels` writes into the announcement.
#[inline(always)]
pub fn announce_labelled_once(tgid: u32, labels: impl FnOnce(&mut ProcessEvent)) {
    if !captured(tgid) {
        let _ = SEEN.insert(tgid, seen::CAPTURED, 0);
        let _ = announce_with(tgid, ProcessEventKind::FirstSample, labels);
    }
}

/// Announce the current task's process for its labels alone, unless it was announced already.
#[inline(always)]
pub fn announce_labels_once(tgid: u32, labels: impl FnOnce(&mut ProcessEvent)) {
    if mark_first(tgid, seen::LABELLED) && announce_with(tgid, ProcessEventKind::Labelled, labels) {
        bump(HealthCounter::ProcessesLabelled);
    }
}

/// Mark a process announced as far as `level`, if it was not announced at all: whether it was
/// (not over a capture another CPU announced meanwhile).
#[inline(always)]
fn mark_first(tgid: u32, level: u8) -> bool {
    SEEN.get_ptr(tgid).is_none() && SEEN.insert(tgid, level, BPF_NOEXIST as u64).is_ok()
}

/// An announcement written in place in the ring (the scheduler's programs have no stack to spare
/// for a copy): its kind, then what `fill` says (labels, with the current task's cgroup). Whether
/// it was written.
#[inline(always)]
fn announce_with(tgid: u32, kind: ProcessEventKind, fill: impl FnOnce(&mut ProcessEvent)) -> bool {
    let Some(mut entry) = EVENTS.reserve::<ProcessEvent>(0) else {
        lost(tgid);
        return false;
    };
    let event = unsafe { &mut *entry.as_mut_ptr() };
    event.tgid = tgid;
    event.kind = kind as u32;
    event.value = unsafe { bpf_get_current_cgroup_id() };
    event.comm = [0; COMM_LEN];
    event.generation = 0;
    event.labels = said::LABELS;
    event.executable = FileId::default();
    fill(event);
    entry.submit(0);
    true
}

/// Whether the process's memory map was announced (and user space keeps it).
#[inline(always)]
pub fn captured(tgid: u32) -> bool {
    SEEN.get_ptr(tgid).map(|level| unsafe { *level }) == Some(seen::CAPTURED)
}

/// Tell user space about a process while it is alive, so its memory map can be captured.
#[inline(always)]
pub(crate) fn announce(tgid: u32, kind: ProcessEventKind) {
    announce_value(tgid, kind, 0);
}

/// The same, with what the kind says more.
#[inline(always)]
pub(crate) fn announce_value(tgid: u32, kind: ProcessEventKind, value: u64) {
    output(&ProcessEvent {
        tgid,
        kind: kind as u32,
        value,
        comm: [0; COMM_LEN],
        generation: 0,
        labels: 0,
        executable: FileId::default(),
    });
}

#[inline(always)]
fn output(event: &ProcessEvent) {
    if EVENTS.output::<ProcessEvent>(event, 0).is_err() {
        lost(event.tgid);
    }
}

#[inline(never)]
fn lost(tgid: u32) {
    bump(HealthCounter::EventLost);
    kernel_log!("process ring full: pid {} not announced", tgid);
}
