//! Table-based user-stack unwinding (x86-64). User space builds rows from each file's
//! `.eh_frame` and lists each process's executable mappings; here a sample's user registers are
//! walked through them, `FRAMES_PER_RUN` frames per program run, continuing in a tail call of
//! this program until the stack ends. Where a mapping has no table (or a row has a rule we do
//! not follow), that frame is stepped with the frame pointer instead.
use aya_ebpf::{
    bindings::{pt_regs, BPF_F_MMAPABLE},
    helpers::{bpf_get_current_task_btf, bpf_probe_read_kernel, bpf_probe_read_user},
    macros::{map, perf_event},
    maps::{Array, HashMap, PerCpuArray, ProgramArray},
    programs::PerfEventContext,
};
use profiler_common::{
    unwind::{
        cfa, rbp, stop, Mapping, ProcessMappings, Row, UserStack, Walk, FRAMES_PER_RUN, MAPPING_SEARCH_STEPS,
        MAX_FRAMES, MAX_MAPPINGS, PROCESSES, PROGRAM_SLOT, ROWS, ROW_SEARCH_STEPS, STACK_ENTRIES,
    },
    Counter,
};

use crate::{
    counters::bump,
    sampling::{record_sample, EPOCH},
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

/// Start a table walk of the sampled thread's user stack when its process has tables. Returns
/// only if the walk could not start (the caller then records a frame-pointer stack).
#[inline(always)]
pub fn start(ctx: &PerfEventContext, tgid: u32, tid: u32) {
    if unsafe { core::ptr::read_volatile(&UNWIND_ENABLED) } == 0 {
        return;
    }
    if UNWIND_PROCESSES.get_ptr(tgid).is_none() {
        return;
    }
    let Some((ip, sp, bp)) = user_registers(ctx) else {
        return;
    };
    let Some(walk) = WALK.get_ptr_mut(0) else {
        return;
    };
    let walk = unsafe { &mut *walk };
    walk.ip = ip;
    walk.sp = sp;
    walk.bp = bp;
    walk.tgid = tgid;
    walk.tid = tid;
    walk.stack.len = 0;
    walk.stack.stop = stop::WALKING;
    unsafe { UNWIND_PROGRAMS.tail_call(ctx, PROGRAM_SLOT) };
}

/// The user registers: the sample's own when it interrupted user code, else those saved when
/// the thread entered the kernel. None for kernel threads.
#[inline(always)]
fn user_registers(ctx: &PerfEventContext) -> Option<(u64, u64, u64)> {
    let regs = unsafe { &(*ctx.ctx).regs };
    if regs.cs & 3 == 3 {
        return Some((regs.rip, regs.rsp, regs.rbp));
    }
    let task = unsafe { bpf_get_current_task_btf() };
    let saved = unsafe { aya_ebpf::helpers::generated::bpf_task_pt_regs(task) } as *const pt_regs;
    if saved.is_null() {
        return None;
    }
    let cs = unsafe { bpf_probe_read_kernel(&(*saved).cs) }.ok()?;
    if cs & 3 != 3 {
        return None;
    }
    let ip = unsafe { bpf_probe_read_kernel(&(*saved).rip) }.ok()?;
    let sp = unsafe { bpf_probe_read_kernel(&(*saved).rsp) }.ok()?;
    let bp = unsafe { bpf_probe_read_kernel(&(*saved).rbp) }.ok()?;
    Some((ip, sp, bp))
}

#[perf_event]
pub fn unwind_user(ctx: PerfEventContext) -> u32 {
    let _ = try_unwind_user(&ctx);
    0
}

fn try_unwind_user(ctx: &PerfEventContext) -> Result<(), ()> {
    let walk = unsafe { &mut *WALK.get_ptr_mut(0).ok_or(())? };
    let Some(mappings) = UNWIND_PROCESSES.get_ptr(walk.tgid) else {
        // The process exited between the sample and now: what was walked is still true.
        walk.stack.stop = stop::FAILED;
        return finish(ctx, walk);
    };
    let mappings = unsafe { &*mappings };
    for _ in 0..FRAMES_PER_RUN {
        if walk.stack.stop != stop::WALKING {
            break;
        }
        step(walk, mappings);
    }
    if walk.stack.stop == stop::WALKING {
        unsafe { UNWIND_PROGRAMS.tail_call(ctx, PROGRAM_SLOT) };
        // Out of tail calls: keep what was walked.
        walk.stack.stop = stop::TRUNCATED;
    }
    finish(ctx, walk)
}

/// Record the current frame and step to its caller.
#[inline(always)]
fn step(walk: &mut Walk, mappings: &ProcessMappings) {
    let len = walk.stack.len as usize;
    let Some(slot) = walk.stack.frames.get_mut(len) else {
        walk.stack.stop = stop::TRUNCATED;
        return;
    };
    *slot = walk.ip;
    walk.stack.len += 1;
    if len + 1 >= MAX_FRAMES {
        walk.stack.stop = stop::TRUNCATED;
        return;
    }
    // A return address points after its call: look up the call itself.
    let pc = if len == 0 { walk.ip } else { walk.ip - 1 };
    let mut rule = Row {
        cfa: cfa::UNSUPPORTED,
        ..Row::default()
    };
    if let Some(mapping) = find_mapping(mappings, pc) {
        if mapping.rows > 0 {
            if let Some(row) = find_row(mapping, pc.wrapping_sub(mapping.bias)) {
                rule = row;
            }
        }
    }
    let cfa = match rule.cfa {
        cfa::END => {
            walk.stack.stop = stop::END;
            return;
        }
        cfa::RSP => walk.sp.wrapping_add(rule.cfa_offset as i64 as u64),
        cfa::RBP => walk.bp.wrapping_add(rule.cfa_offset as i64 as u64),
        cfa::PLT => {
            let past_push = (pc & 15) >= rule.cfa_offset as u64;
            walk.sp + 8 + if past_push { 8 } else { 0 }
        }
        _ => {
            // No table here: the frame pointer's frame (saved rbp at rbp, return address above).
            if walk.bp == 0 {
                walk.stack.stop = stop::FAILED;
                return;
            }
            rule.rbp = rbp::AT_CFA;
            rule.rbp_offset = -16;
            walk.bp + 16
        }
    };
    let Ok(return_address) = (unsafe { bpf_probe_read_user((cfa - 8) as *const u64) }) else {
        walk.stack.stop = stop::FAILED;
        return;
    };
    if rule.rbp == rbp::AT_CFA {
        match unsafe { bpf_probe_read_user(cfa.wrapping_add(rule.rbp_offset as i64 as u64) as *const u64) } {
            Ok(bp) => walk.bp = bp,
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

/// Store the walked stack (keyed by its hash) and record the sample with it.
#[inline(always)]
fn finish(ctx: &PerfEventContext, walk: &mut Walk) -> Result<(), ()> {
    bump(Counter::UnwindWalks);
    match walk.stack.stop {
        stop::TRUNCATED => bump(Counter::UnwindTruncated),
        stop::FAILED => bump(Counter::UnwindFailed),
        _ => {}
    }
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325 ^ walk.stack.len as u64;
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
    let stacks = match EPOCH.get(0).copied().unwrap_or(0) {
        0 => &USER_STACKS_0,
        _ => &USER_STACKS_1,
    };
    let stack_id = match stacks.get_ptr(id) {
        Some(stored) if unsafe { (*stored).hash } == hash => id as i32,
        Some(_) => {
            bump(Counter::UnwindStackLost);
            -EEXIST
        }
        // By reference: the stack is 1 KiB, twice the BPF stack.
        #[allow(clippy::needless_borrows_for_generic_args)]
        None => match stacks.insert(id, &walk.stack, 0) {
            Ok(()) => id as i32,
            Err(_) => {
                bump(Counter::UnwindStackLost);
                -ENOSPC
            }
        },
    };
    record_sample(ctx, walk.tgid, walk.tid, Some(stack_id));
    Ok(())
}
