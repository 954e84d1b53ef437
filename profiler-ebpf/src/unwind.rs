//! Table-based user-stack unwinding (x86-64). User space builds rows from each file's
//! `.eh_frame` and lists each process's executable mappings; here a thread's user registers are
//! walked through them, `FRAMES_PER_RUN` frames per program run, continuing in a tail call of
//! the same program until the stack ends. Where a mapping has no table (or a row has a rule we do
//! not follow), that frame is stepped with the frame pointer instead.
//!
//! Seven walkers share the walk: for samples (a perf-event program, tail-called from the sampling
//! program, and a tracepoint and a uprobe program for the samples of tracing events), for
//! threads going to sleep (a raw-tracepoint program, tail-called from the switch program), for
//! futex waits and wakes (a tracepoint program), for pthread lock calls (a uprobe program) and
//! for slow system calls (a raw-tracepoint program, tail-called from `sys_exit`).
//! A tail call only reaches programs of its caller's type, and each has its own per-CPU
//! scratch: a sample can interrupt a switch or a syscall on the same CPU.
use aya_ebpf::{
    bindings::{pt_regs, BPF_F_MMAPABLE, BPF_NOEXIST},
    helpers::{bpf_get_current_task_btf, bpf_probe_read_user},
    macros::{btf_tracepoint, map, perf_event, raw_tracepoint, uprobe},
    maps::{Array, HashMap, PerCpuArray, ProgramArray},
    programs::{
        tracing::StackIdContext, BtfTracePointContext, PerfEventContext, ProbeContext, RawTracePointContext,
        TracePointContext,
    },
    EbpfContext,
};
use profiler_common::{
    python::{self, PY_STEPS_PER_RUN},
    unwind::{
        cfa, fp, stop, Mapping, ProcessMappings, Row, UserStack, Walk, FRAMES_PER_RUN, LOST_AT_LEAST,
        MAPPING_SEARCH_STEPS, MAX_FRAMES, MAX_MAPPINGS, PROCESSES, PROGRAM_SLOT, ROWS, ROW_SEARCH_STEPS,
        STACK_ENTRIES,
    },
    HealthCounter, ProcessEventKind,
};

use crate::{
    arch::{self, UserRegisters},
    health::bump,
    sampling::{announce, record_sample, EPOCH},
};

const EEXIST: i32 = 17;
const ENOSPC: i32 = 28;

/// Set by user space when tables are in use.
#[unsafe(no_mangle)]
static UNWIND_ENABLED: u32 = 0;

#[map(name = "UNWIND_ROWS")]
static UNWIND_ROWS: Array<Row> = Array::with_max_entries(ROWS, BPF_F_MMAPABLE);
#[map(name = "UNWIND_PROCESSES")]
static UNWIND_PROCESSES: HashMap<u32, ProcessMappings> = HashMap::with_max_entries(PROCESSES, 0);
#[map(name = "UNWIND_PROGRAMS")]
static UNWIND_PROGRAMS: ProgramArray = ProgramArray::with_max_entries(1, 0);
#[map(name = "WALK")]
static WALK: PerCpuArray<Walk> = PerCpuArray::with_max_entries(1, 0);
#[map(name = "USER_STACKS_0")]
static USER_STACKS_0: HashMap<u32, UserStack> = HashMap::with_max_entries(STACK_ENTRIES, 0);
#[map(name = "USER_STACKS_1")]
static USER_STACKS_1: HashMap<u32, UserStack> = HashMap::with_max_entries(STACK_ENTRIES, 0);

#[map(name = "OFFCPU_UNWIND_PROGRAMS")]
static OFFCPU_UNWIND_PROGRAMS: ProgramArray = ProgramArray::with_max_entries(1, 0);
#[map(name = "OFFCPU_WALK")]
static OFFCPU_WALK: PerCpuArray<Walk> = PerCpuArray::with_max_entries(1, 0);
/// Where threads went to sleep, in the epoch slot of the moment they did (as the off-CPU
/// stack-trace maps).
#[map(name = "OFFCPU_USER_STACKS_0")]
static OFFCPU_USER_STACKS_0: HashMap<u32, UserStack> = HashMap::with_max_entries(STACK_ENTRIES, 0);
#[map(name = "OFFCPU_USER_STACKS_1")]
static OFFCPU_USER_STACKS_1: HashMap<u32, UserStack> = HashMap::with_max_entries(STACK_ENTRIES, 0);

#[map(name = "LOCK_UNWIND_PROGRAMS")]
static LOCK_UNWIND_PROGRAMS: ProgramArray = ProgramArray::with_max_entries(1, 0);
#[map(name = "LOCK_WALK")]
static LOCK_WALK: PerCpuArray<Walk> = PerCpuArray::with_max_entries(1, 0);
/// Stacks of lock waiters and wakers: kept for the whole run.
#[map(name = "LOCK_USER_STACKS")]
static LOCK_USER_STACKS: HashMap<u32, UserStack> = HashMap::with_max_entries(STACK_ENTRIES, 0);

#[map(name = "PTHREAD_UNWIND_PROGRAMS")]
static PTHREAD_UNWIND_PROGRAMS: ProgramArray = ProgramArray::with_max_entries(1, 0);
#[map(name = "PTHREAD_WALK")]
static PTHREAD_WALK: PerCpuArray<Walk> = PerCpuArray::with_max_entries(1, 0);

#[map(name = "TRACEPOINT_HIT_UNWIND_PROGRAMS")]
static TRACEPOINT_HIT_UNWIND_PROGRAMS: ProgramArray = ProgramArray::with_max_entries(1, 0);
#[map(name = "TRACEPOINT_HIT_WALK")]
static TRACEPOINT_HIT_WALK: PerCpuArray<Walk> = PerCpuArray::with_max_entries(1, 0);
#[map(name = "PROBE_HIT_UNWIND_PROGRAMS")]
static PROBE_HIT_UNWIND_PROGRAMS: ProgramArray = ProgramArray::with_max_entries(1, 0);
#[map(name = "PROBE_HIT_WALK")]
static PROBE_HIT_WALK: PerCpuArray<Walk> = PerCpuArray::with_max_entries(1, 0);

/// `latency --duration-min`: the table-walked user stacks of starts, for the whole run.
#[map(name = "LATENCY_USER_STACKS")]
static LATENCY_USER_STACKS: HashMap<u32, UserStack> = HashMap::with_max_entries(STACK_ENTRIES, 0);

#[map(name = "SYSCALL_UNWIND_PROGRAMS")]
static SYSCALL_UNWIND_PROGRAMS: ProgramArray = ProgramArray::with_max_entries(1, 0);
#[map(name = "SYSCALL_WALK")]
static SYSCALL_WALK: PerCpuArray<Walk> = PerCpuArray::with_max_entries(1, 0);

/// Tables are in use for this run (whether or not a given process has them yet).
#[inline(always)]
pub fn tables_in_use() -> bool {
    unsafe { core::ptr::read_volatile(&UNWIND_ENABLED) != 0 }
}

/// The process has tables: its user stacks are walked through them.
#[inline(always)]
pub fn has_tables(tgid: u32) -> bool {
    tables_version(tgid).is_some()
}

/// The version of the process's mappings (`ProcessMappings::version`), where it has tables.
#[inline(always)]
pub fn tables_version(tgid: u32) -> Option<u64> {
    let enabled = unsafe { core::ptr::read_volatile(&UNWIND_ENABLED) };
    if enabled == 0 {
        return None;
    }
    let mappings = UNWIND_PROCESSES.get_ptr(tgid)?;
    Some(unsafe { core::ptr::read_volatile(&(*mappings).version) })
}

/// A finished walk's frames into `to` (a record's): the bytes copied, or the negative error.
#[inline(always)]
pub fn copy_walked(walk: &Walk, to: &mut [u64; MAX_FRAMES]) -> i32 {
    let frames = (walk.stack.len as usize).min(MAX_FRAMES);
    let copied = unsafe {
        let to = core::slice::from_raw_parts_mut(to.as_mut_ptr() as *mut u8, 8 * MAX_FRAMES);
        aya_ebpf::helpers::bpf_probe_read_kernel_buf(walk.stack.frames.as_ptr() as *const u8, to)
    };
    match copied {
        Ok(()) => (frames * 8) as i32,
        Err(e) => e as i32,
    }
}

/// The process has tables and they covered every pc walked so far (a pc outside them marks them
/// stale until user space reads its mappings again).
#[inline(always)]
pub fn has_current_tables(tgid: u32) -> bool {
    let enabled = unsafe { core::ptr::read_volatile(&UNWIND_ENABLED) };
    enabled != 0
        && UNWIND_PROCESSES
            .get_ptr(tgid)
            .is_some_and(|m| unsafe { (*m).missed } == 0)
}

/// Its mappings are gone (exit) or stale (exec): until user space gives new ones, its stacks are
/// walked with frame pointers rather than through another program's tables.
#[inline(always)]
pub fn forget_process(tgid: u32) {
    if unsafe { core::ptr::read_volatile(&UNWIND_ENABLED) } != 0 {
        let _ = UNWIND_PROCESSES.remove(tgid);
        crate::python::forget_process(tgid);
    }
}

/// Start a table walk of the sampled thread's user stack when its process has tables. Returns
/// only if the walk could not start (the caller then records a frame-pointer stack).
#[inline(always)]
pub fn start(ctx: &PerfEventContext, tgid: u32, tid: u32) {
    if !tables_for_sample(tgid) {
        return;
    }
    let regs = unsafe { &(*ctx.ctx).regs };
    let registers = match arch::in_user_mode(regs) {
        true => Some(arch::registers(regs)),
        false => saved_user_registers(),
    };
    launch(ctx, &WALK, &UNWIND_PROGRAMS, registers, None, tgid, tid);
}

/// Start a table walk of the current thread's user stack at a sampled tracepoint hit, from the
/// registers it entered the kernel with. Returns only if the walk could not start.
#[inline(always)]
pub fn start_tracepoint_hit(ctx: &TracePointContext, tgid: u32, tid: u32) {
    if tables_for_sample(tgid) {
        launch(
            ctx,
            &TRACEPOINT_HIT_WALK,
            &TRACEPOINT_HIT_UNWIND_PROGRAMS,
            saved_user_registers(),
            None,
            tgid,
            tid,
        );
    }
}

/// The same at a probe's sampled hit: from a user probe's own registers (user space's), or
/// from those a kernel probe's thread entered the kernel with.
#[inline(always)]
pub fn start_probe_hit(ctx: &ProbeContext, tgid: u32, tid: u32) {
    if tables_for_sample(tgid) {
        let regs = unsafe { &*ctx.regs };
        let registers = match arch::in_user_mode(regs) {
            true => Some(arch::registers(regs)),
            false => saved_user_registers(),
        };
        launch(
            ctx,
            &PROBE_HIT_WALK,
            &PROBE_HIT_UNWIND_PROGRAMS,
            registers,
            None,
            tgid,
            tid,
        );
    }
}

/// Whether a sample's user stack is walked through tables: they are in use and the process has
/// them. Counted when it has none yet, because such a stack stops at the first frame without a
/// frame pointer: a report must say how much of it was taken before user space gave the tables.
#[inline(always)]
fn tables_for_sample(tgid: u32) -> bool {
    if unsafe { core::ptr::read_volatile(&UNWIND_ENABLED) } == 0 {
        return false;
    }
    if UNWIND_PROCESSES.get_ptr(tgid).is_none() {
        bump(HealthCounter::UnwindBeforeTables);
        return false;
    }
    true
}

/// Start a table walk of the stack of the thread going to sleep (`current`: the switch runs as
/// it), with its process's mappings at `version`; `expect`: the stack reuse would have given
/// (checked at the end: `reuse`), or -1. Must be the switch program's last act: a tail call does
/// not return. Returns only if the walk could not start.
#[inline(always)]
pub fn start_offcpu(ctx: &BtfTracePointContext, tgid: u32, tid: u32, version: u64, expect: i32) {
    if let Some(walk) = OFFCPU_WALK.get_ptr_mut(0) {
        unsafe {
            (*walk).reuse.version = version;
            (*walk).expect = expect;
        }
    }
    launch(
        ctx,
        &OFFCPU_WALK,
        &OFFCPU_UNWIND_PROGRAMS,
        saved_user_registers(),
        None,
        tgid,
        tid,
    );
}

/// Start a walk of the stack a slow system call was made from (`current`, at `sys_exit`):
/// through its process's tables where it has them, else by frame pointers. Returns only if the
/// walk could not start.
#[inline(always)]
pub fn start_syscall(ctx: &RawTracePointContext, tgid: u32, tid: u32) {
    launch(
        ctx,
        &SYSCALL_WALK,
        &SYSCALL_UNWIND_PROGRAMS,
        saved_user_registers(),
        None,
        tgid,
        tid,
    );
}

/// Start a table walk of the current thread's user stack from a syscall tracepoint, when its
/// process has tables. Returns only if the walk could not start.
#[inline(always)]
pub fn start_lock(ctx: &TracePointContext, tgid: u32, tid: u32) {
    if !has_tables(tgid) {
        return;
    }
    launch(
        ctx,
        &LOCK_WALK,
        &LOCK_UNWIND_PROGRAMS,
        saved_user_registers(),
        None,
        tgid,
        tid,
    );
}

/// Start a walk of a pthread lock call's stack: `leaf` (in the lock function) and then from its
/// caller's `registers`. Through the tables where the process has them, else by frame
/// pointers from the caller on (which a frame-pointer walk from inside the lock function would
/// skip). Must be the probe's last act; returns only if the walk could not start.
#[inline(always)]
pub fn start_pthread<C: EbpfContext>(ctx: &C, tgid: u32, tid: u32, leaf: u64, registers: UserRegisters) {
    launch(
        ctx,
        &PTHREAD_WALK,
        &PTHREAD_UNWIND_PROGRAMS,
        Some(registers),
        Some(leaf),
        tgid,
        tid,
    );
}

/// Set up a walk from `registers` (after `leaf`, if given, as the first frame) in this walker's
/// scratch and tail-call the walker. Returns only if it could not start (no user registers: a
/// kernel thread).
#[inline(always)]
fn launch<C: EbpfContext>(
    ctx: &C,
    scratch: &PerCpuArray<Walk>,
    walker: &ProgramArray,
    registers: Option<UserRegisters>,
    leaf: Option<u64>,
    tgid: u32,
    tid: u32,
) {
    let Some(registers) = registers else {
        return;
    };
    let Some(walk) = scratch.get_ptr_mut(0) else {
        return;
    };
    let walk = unsafe { &mut *walk };
    walk.ip = registers.pc;
    walk.sp = registers.sp;
    walk.fp = registers.fp;
    walk.lr = registers.lr;
    crate::reuse::begin(walk, &registers);
    walk.tgid = tgid;
    walk.tid = tid;
    walk.stack.len = 0;
    walk.stack.lost = 0;
    walk.native = 0;
    walk.stale = 0;
    walk.py_frame = python::NOT_LOOKED;
    walk.py_eval = 0;
    walk.py_mode = python::mode::NATIVE;
    if let Some(leaf) = leaf {
        walk.stack.frames[0] = leaf;
        walk.stack.len = 1;
        walk.native = 1;
    }
    walk.stack.stop = stop::WALKING;
    unsafe { walker.tail_call(ctx, PROGRAM_SLOT) };
}

/// The user registers saved when the current thread entered the kernel. None for kernel threads.
#[inline(always)]
pub(crate) fn saved_user_registers() -> Option<UserRegisters> {
    let task = unsafe { bpf_get_current_task_btf() };
    let saved = unsafe { aya_ebpf::helpers::generated::bpf_task_pt_regs(task) } as *const pt_regs;
    if saved.is_null() {
        return None;
    }
    arch::saved(saved)
}

#[perf_event]
pub fn unwind_user(ctx: PerfEventContext) -> u32 {
    let _ = try_unwind_user(&ctx);
    0
}

fn try_unwind_user(ctx: &PerfEventContext) -> Result<(), ()> {
    walk_sample(
        ctx,
        &WALK,
        &UNWIND_PROGRAMS,
        1,
        None::<fn(&PerfEventContext, &Walk)>,
    )
}

tracepoint! {
/// Loaded beside the tracepoint sampler (never attached): it is only tail-called.
pub fn unwind_tracepoint_hit(ctx: TracePointContext) -> u32 {
    let recorded = crate::records::walked_tracepoint;
    let _ = walk_sample(
        &ctx,
        &TRACEPOINT_HIT_WALK,
        &TRACEPOINT_HIT_UNWIND_PROGRAMS,
        crate::hits::walked_weight(crate::hits::TRACEPOINT_WALK),
        Some(recorded),
    );
    // A tail call's return is the tracepoint program's (see `PASS_ON`).
    crate::PASS_ON
}
}

/// Loaded beside the probe sampler (never attached): it is only tail-called.
#[uprobe]
pub fn unwind_probe_hit(ctx: ProbeContext) -> u32 {
    let weight = crate::hits::walked_weight(crate::hits::PROBE_WALK);
    let recorded = crate::records::walked_probe;
    let _ = walk_sample(
        &ctx,
        &PROBE_HIT_WALK,
        &PROBE_HIT_UNWIND_PROGRAMS,
        weight,
        Some(recorded),
    );
    0
}

/// A sample's walk, one run of it: once it has ended, the stack goes to the epoch's user
/// stacks and the sample is recorded with it, as the sampler would have with a frame-pointer
/// stack. Every sampler's walker, each with its own scratch (a CPU sample may interrupt a
/// tracepoint's walk) and program type. A tracing hit's walk for `record -g` ends in its
/// record instead (`recorded`), and a `latency --duration-min` start's in the start.
#[inline(always)]
fn walk_sample<C: StackIdContext>(
    ctx: &C,
    scratch: &PerCpuArray<Walk>,
    programs: &ProgramArray,
    weight: u64,
    recorded: Option<impl FnOnce(&C, &Walk)>,
) -> Result<(), ()> {
    let walk = unsafe { &mut *scratch.get_ptr_mut(0).ok_or(())? };
    advance::<_, false>(ctx, walk, programs);
    if recorded.is_some() && crate::latency::walks_starts() {
        crate::latency::walked_start(store(&LATENCY_USER_STACKS, walk));
        return Ok(());
    }
    if let Some(recorded) = recorded.filter(|_| crate::records::recording_stacks()) {
        note_end(walk);
        recorded(ctx, walk);
        return Ok(());
    }
    let stacks = match EPOCH.get(0).copied().unwrap_or(0) & 1 {
        0 => &USER_STACKS_0,
        _ => &USER_STACKS_1,
    };
    let stack_id = store(stacks, walk);
    record_sample(ctx, walk.tgid, walk.tid, Some(stack_id), weight);
    Ok(())
}

/// Loaded beside the switch program, as its kind (a BTF tracepoint of `sched_switch`), never
/// attached: it is only tail-called.
#[btf_tracepoint(function = "sched_switch")]
pub fn unwind_offcpu(ctx: BtfTracePointContext) -> u32 {
    let _ = try_unwind_offcpu(&ctx);
    0
}

fn try_unwind_offcpu(ctx: &BtfTracePointContext) -> Result<(), ()> {
    let walk = unsafe { &mut *OFFCPU_WALK.get_ptr_mut(0).ok_or(())? };
    advance::<_, true>(ctx, walk, &OFFCPU_UNWIND_PROGRAMS);
    // The slot the switch program took the sleep's other stack in, even if the epoch moved since.
    let generation = crate::sched::offcpu_generation(walk.tid);
    let stacks = match generation & 1 {
        0 => &OFFCPU_USER_STACKS_0,
        _ => &OFFCPU_USER_STACKS_1,
    };
    let stack_id = store(stacks, walk);
    crate::sched::offcpu_walked(walk, stack_id, generation);
    Ok(())
}

/// Loaded beside the system-call programs (never attached): it is only tail-called.
#[raw_tracepoint(tracepoint = "sys_exit")]
pub fn unwind_syscall(ctx: RawTracePointContext) -> u32 {
    let _ = try_unwind_syscall(&ctx);
    0
}

fn try_unwind_syscall(ctx: &RawTracePointContext) -> Result<(), ()> {
    let walk = unsafe { &mut *SYSCALL_WALK.get_ptr_mut(0).ok_or(())? };
    advance::<_, false>(ctx, walk, &SYSCALL_UNWIND_PROGRAMS);
    note_end(walk);
    crate::syscalls::send_slow(Some(walk));
    Ok(())
}

tracepoint! {
/// Loaded beside the futex programs (never attached): it is only tail-called.
pub fn unwind_lock(ctx: TracePointContext) -> u32 {
    let _ = try_unwind_lock(&ctx);
    crate::PASS_ON
}
}

fn try_unwind_lock(ctx: &TracePointContext) -> Result<(), ()> {
    let walk = unsafe { &mut *LOCK_WALK.get_ptr_mut(0).ok_or(())? };
    advance::<_, false>(ctx, walk, &LOCK_UNWIND_PROGRAMS);
    let stack_id = store(&LOCK_USER_STACKS, walk);
    crate::lock::futex::user_stack_walked(walk.tgid, walk.tid, stack_id, Some(walk));
    Ok(())
}

/// Loaded beside the pthread probes (never attached): it is only tail-called.
#[uprobe]
pub fn unwind_pthread(ctx: ProbeContext) -> u32 {
    let _ = try_unwind_pthread(&ctx);
    0
}

fn try_unwind_pthread(ctx: &ProbeContext) -> Result<(), ()> {
    let walk = unsafe { &mut *PTHREAD_WALK.get_ptr_mut(0).ok_or(())? };
    advance::<_, false>(ctx, walk, &PTHREAD_UNWIND_PROGRAMS);
    let stack_id = store(&LOCK_USER_STACKS, walk);
    crate::lock::pthread::stack_walked(walk.tgid, walk.tid, stack_id);
    Ok(())
}

/// Walk up to `FRAMES_PER_RUN` frames; if the stack goes on, continue in a tail call of the
/// program (no return). Returns once the walk has ended.
#[inline(always)]
fn advance<C: EbpfContext, const KEEP: bool>(ctx: &C, walk: &mut Walk, programs: &ProgramArray) {
    // No tables (none given, or the process exited or exec'd since the walk began): frame
    // pointers all the way. (Two loops: the verifier wants the mappings pointer checked once.)
    match UNWIND_PROCESSES.get_ptr_mut(walk.tgid) {
        Some(mappings) => {
            let mappings = unsafe { &mut *mappings };
            // A run puts either Python frames in the stack (where the last run reached the
            // evaluation loop) or native frames (until the stack ends or reaches the loop again),
            // never both: the verifier's paths through the two then add up, not multiply.
            let py = crate::python::interpreter(walk.tgid);
            match walk.py_mode {
                python::mode::NATIVE => {
                    let eval = crate::python::eval_range(py);
                    for _ in 0..FRAMES_PER_RUN {
                        if walk.stack.stop != stop::WALKING {
                            break;
                        }
                        step::<KEEP>(walk, mappings, &eval);
                    }
                }
                _ => {
                    crate::reuse::not_reusable(walk);
                    for _ in 0..PY_STEPS_PER_RUN {
                        if walk.stack.stop != stop::WALKING || walk.py_mode == python::mode::NATIVE {
                            break;
                        }
                        crate::python::step(walk, py);
                    }
                    if walk.py_mode == python::mode::NATIVE && walk.stack.stop == stop::WALKING {
                        crate::python::past_trampoline(walk);
                    }
                }
            }
        }
        None => {
            for _ in 0..FRAMES_PER_RUN {
                if walk.stack.stop != stop::WALKING {
                    break;
                }
                let pc = push_frame(walk, walk.native == 0);
                step_by::<KEEP>(walk, UNSUPPORTED, pc);
            }
        }
    }
    // At the evaluation loop: its Python frames in the next run.
    if walk.stack.stop == stop::PYTHON {
        walk.stack.stop = stop::WALKING;
    }
    if walk.stack.stop == stop::WALKING {
        unsafe { programs.tail_call(ctx, PROGRAM_SLOT) };
        // Out of tail calls: keep what was walked.
        walk.stack.stop = stop::TRUNCATED;
    }
    // Frames walked past the kept ones: the stack is truncated, by that many (at least, where
    // the walk did not reach the stack's end).
    if walk.stack.lost > 0 {
        if walk.stack.stop != stop::END {
            walk.stack.lost |= LOST_AT_LEAST;
        }
        walk.stack.stop = stop::TRUNCATED;
    }
}

/// A rule-less row: step by the frame pointer.
const UNSUPPORTED: Row = Row {
    pc: 0,
    cfa_offset: 0,
    fp_offset: 0,
    cfa: cfa::UNSUPPORTED,
    fp: 0,
    ra_offset: 0,
};

/// The pc to look the current frame's rule up by: a return address points after its call, so
/// a caller's is the call itself. (`first`: no native frame was stepped yet.)
#[inline(always)]
fn lookup_pc(walk: &Walk, first: bool) -> u64 {
    match first {
        true => walk.ip,
        false => walk.ip.wrapping_sub(1),
    }
}

/// Record the current frame. Returns the pc to look its caller up by.
#[inline(always)]
fn push_frame(walk: &mut Walk, first: bool) -> u64 {
    let pc = lookup_pc(walk, first);
    walk.native = 1;
    push(walk, walk.ip);
    pc
}

/// Add a slot (a frame) to the stack; past `MAX_FRAMES`, count it lost (the walk goes on, to
/// say how many the stack lost).
#[inline(always)]
pub fn push(walk: &mut Walk, frame: u64) {
    let len = walk.stack.len as usize;
    match walk.stack.frames.get_mut(len) {
        Some(slot) => {
            *slot = frame;
            walk.stack.len += 1;
        }
        None => walk.stack.lost = walk.stack.lost.saturating_add(1),
    }
}

/// Record the current frame and step to its caller, through the tables. A frame of Python's
/// evaluation loop is recorded as the Python frames it runs, in the steps that follow.
#[inline(always)]
fn step<const KEEP: bool>(walk: &mut Walk, mappings: &mut ProcessMappings, eval: &crate::python::EvalRange) {
    let first = walk.native == 0;
    let pc = lookup_pc(walk, first);
    let python = crate::python::in_eval(eval, pc);
    if python {
        crate::python::enter(walk);
        crate::reuse::not_reusable(walk);
        walk.native = 1;
    } else {
        push_frame(walk, first);
    }
    let mut rule = UNSUPPORTED;
    match find_mapping(mappings, pc) {
        Some(mapping) if mapping.rows > 0 => {
            if let Some(row) = find_row(mapping, pc.wrapping_sub(mapping.bias)) {
                rule = row;
            }
        }
        Some(_) => {}
        // Only the interrupted pc itself surely runs code: a later frame's miss may be a
        // frame-pointer walk gone astray, not a new mapping.
        None if first && pc < arch::USER_SPACE_END => {
            walk.stale = 1;
            if mappings.missed == 0 {
                mappings.missed = 1;
                announce(walk.tgid, ProcessEventKind::MappingsChanged);
            }
        }
        None => {}
    }
    step_by::<KEEP>(walk, rule, pc);
    if python {
        crate::python::stepped_eval(walk);
    }
}

/// Step from the frame at `pc` to its caller by `rule` (a frame-pointer step where it has
/// none).
#[inline(always)]
fn step_by<const KEEP: bool>(walk: &mut Walk, mut rule: Row, pc: u64) {
    let cfa = match rule.cfa {
        cfa::END => {
            walk.stack.stop = stop::END;
            return;
        }
        cfa::SP => walk.sp.wrapping_add(rule.cfa_offset as i64 as u64),
        cfa::FP => walk.fp.wrapping_add(rule.cfa_offset as i64 as u64),
        cfa::PLT => {
            let past_push = (pc & 15) >= rule.cfa_offset as u64;
            walk.sp + 8 + if past_push { 8 } else { 0 }
        }
        _ => {
            // No table here: the frame record at the frame pointer (the caller's frame pointer
            // at fp, the return address above it; the same on both architectures).
            if walk.fp == 0 {
                walk.stack.stop = stop::FAILED;
                return;
            }
            rule.fp = fp::AT_CFA;
            rule.fp_offset = -16;
            rule.ra_offset = -8;
            walk.fp + 16
        }
    };
    let return_address = match rule.ra_offset {
        // Not saved yet: still in the link register, which only the innermost frame can use.
        0 if walk.lr != 0 => walk.lr,
        0 => {
            walk.stack.stop = stop::FAILED;
            return;
        }
        offset => {
            let at = cfa.wrapping_add(offset as i64 as u64);
            match unsafe { bpf_probe_read_user(at as *const u64) } {
                Ok(address) => {
                    if KEEP {
                        crate::reuse::read(walk, at, address);
                    }
                    arch::code_address(address)
                }
                Err(_) => {
                    walk.stack.stop = stop::FAILED;
                    return;
                }
            }
        }
    };
    walk.lr = 0;
    if rule.fp == fp::AT_CFA {
        let at = cfa.wrapping_add(rule.fp_offset as i64 as u64);
        match unsafe { bpf_probe_read_user(at as *const u64) } {
            Ok(bp) => {
                if KEEP {
                    crate::reuse::read(walk, at, bp);
                }
                walk.fp = bp
            }
            Err(_) => {
                walk.stack.stop = stop::FAILED;
                return;
            }
        }
    }
    walk.sp = cfa;
    walk.ip = return_address;
    if return_address == 0 {
        walk.stack.stop = stop::END;
    }
}

/// The mapping holding `pc` (mappings are sorted by start).
#[inline(always)]
fn find_mapping(mappings: &ProcessMappings, pc: u64) -> Option<Mapping> {
    let (mut lo, mut hi) = (0usize, (mappings.count as usize).min(MAX_MAPPINGS));
    for _ in 0..MAPPING_SEARCH_STEPS {
        if lo >= hi {
            break;
        }
        let mid = (lo + hi) / 2;
        let m = mappings.mappings.get(mid)?;
        if m.start <= pc {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    let m = *mappings.mappings.get(lo.checked_sub(1)?)?;
    (pc < m.end).then_some(m)
}

/// The last row of the mapping's table at or before `pc` (a file virtual address).
#[inline(always)]
fn find_row(mapping: Mapping, pc: u64) -> Option<Row> {
    let (mut lo, mut hi) = (mapping.first_row, mapping.first_row.checked_add(mapping.rows)?);
    for _ in 0..ROW_SEARCH_STEPS {
        if lo >= hi {
            break;
        }
        let mid = lo + (hi - lo) / 2;
        let row = UNWIND_ROWS.get(mid)?;
        if row.pc <= pc {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    if lo == mapping.first_row {
        return None;
    }
    let row = *UNWIND_ROWS.get(lo - 1)?;
    (row.cfa != cfa::NONE).then_some(row)
}

/// Store the walked stack in `stacks`, keyed by its hash. Returns its id, or the negative error
/// that stands for it.
#[inline(always)]
fn store(stacks: &HashMap<u32, UserStack>, walk: &mut Walk) -> i32 {
    note_end(walk);
    stored(stacks, walk)
}

/// A walk counted in health, and a truncated or failed one said.
#[inline(always)]
fn note_end(walk: &Walk) {
    bump(HealthCounter::UnwindWalks);
    if walk.stale != 0 {
        bump(HealthCounter::UnwindStale);
    }
    match walk.stack.stop {
        stop::TRUNCATED => {
            bump(HealthCounter::UnwindTruncated);
            kernel_log!(
                "unwinding pid {} tid {} stopped at {} frames: its outermost frames are missing",
                walk.tgid,
                walk.tid,
                walk.stack.len
            );
        }
        stop::FAILED => {
            bump(HealthCounter::UnwindFailed);
            kernel_log!(
                "unwinding pid {} tid {} ended early after {} frames, at pc {:x}",
                walk.tgid,
                walk.tid,
                walk.stack.len,
                walk.ip
            );
        }
        _ => {}
    }
}

/// The walked stack's place in `stacks` (see `store`).
#[inline(always)]
fn stored(stacks: &HashMap<u32, UserStack>, walk: &mut Walk) -> i32 {
    // How it ended too: a whole stack of 127 frames is not one that ran out of runs there.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325
        ^ walk.stack.len as u64
        ^ ((walk.stack.lost as u64) << 32)
        ^ ((walk.stack.stop as u64) << 24);
    for i in 0..MAX_FRAMES {
        if i >= walk.stack.len as usize {
            break;
        }
        let Some(&frame) = walk.stack.frames.get(i) else {
            break;
        };
        hash = (hash ^ frame).wrapping_mul(0x0000_0100_0000_01b3);
        hash ^= hash >> 29;
    }
    walk.stack.hash = hash;
    let id = (hash & 0x7fff_ffff) as u32;
    match stacks.get_ptr(id) {
        Some(stored) if unsafe { (*stored).hash } == hash => id as i32,
        Some(_) => {
            bump(HealthCounter::UnwindStackLost);
            kernel_log!("unwound stack of tid {} lost: hash collision", walk.tid);
            -EEXIST
        }
        // By reference: the stack is 1 KiB, twice the BPF stack.
        #[allow(clippy::needless_borrows_for_generic_args)]
        // Only if still absent: another CPU may have stored a stack of this id meanwhile.
        None => match stacks.insert(id, &walk.stack, BPF_NOEXIST as u64) {
            Ok(()) => id as i32,
            Err(_) => match stacks.get_ptr(id) {
                Some(stored) if unsafe { (*stored).hash } == hash => id as i32,
                Some(_) => {
                    bump(HealthCounter::UnwindStackLost);
                    kernel_log!("unwound stack of tid {} lost: hash collision", walk.tid);
                    -EEXIST
                }
                None => {
                    bump(HealthCounter::UnwindStackLost);
                    kernel_log!("unwound stack of tid {} lost: stack map full", walk.tid);
                    -ENOSPC
                }
            },
        },
    }
}
