//! Off-CPU stacks taken again instead of walked. A thread that blocks again and again usually
//! blocks at the same place: the same user registers over the same stack words. A table walk is
//! a function of its registers, the stack words it reads, the process's mappings (with their
//! tables) and the epoch its stack is stored in; so a thread's last walk that reached the
//! stack's end is kept with every word it read (`StackReuse`, in the thread's own `TaskSched`,
//! which the switch-out holds already), and a switch-out with the same registers, mappings
//! version and epoch reads those words back in one copy: all the same, its stack is the kept
//! stack's id, with no walk. A walk that read Python frames (the interpreter's memory), more
//! words than are kept, or ended early is not kept. A Python process's interpreter (where its
//! evaluation loop is) is given with its mappings, and before it their version moves to one
//! whose walks are never kept (`VERSION_UNKEPT`): a walk kept under one version never passed
//! through a loop the walker did not know, so it is a function of the inputs above alone.
//!
//! With `OFFCPU_REUSE_CHECK` every sleep is walked all the same, and a walk whose stack is not
//! the one reuse would have given is counted (`StackReuseWrong`): the proof that reuse is exact.
use aya_ebpf::{helpers::generated::bpf_probe_read_user, macros::map, maps::PerCpuArray};
use profiler_common::{
    unwind::{stop, StackReuse, Walk, NOT_REUSABLE, REUSE_READS, REUSE_SPAN, VERSION_UNKEPT},
    HealthCounter,
};

use crate::{arch::UserRegisters, health::bump};

/// The words of a kept walk's span, read back (per CPU: a switch does not nest on its CPU).
#[map(name = "REUSE_WORDS")]
static REUSE_WORDS: PerCpuArray<[u64; REUSE_SPAN / 8]> = PerCpuArray::with_max_entries(1, 0);

/// Set by the loader (`BPFPROF_CHECK_STACK_REUSE=1`): walk every sleep, and count reuse's errors.
#[unsafe(no_mangle)]
static OFFCPU_REUSE_CHECK: u32 = 0;

/// A walk about to start: its registers, no word read yet (only the off-CPU walker reads them:
/// the others are built without `read`, which would cost their verification).
#[inline(always)]
pub fn begin(walk: &mut Walk, registers: &UserRegisters) {
    let log = &mut walk.reuse;
    log.from.ip = registers.pc;
    log.from.sp = registers.sp;
    log.from.fp = registers.fp;
    log.from.lr = registers.lr;
    log.reads = 0;
    log.span = 0;
}

/// The walk read `value` at `at`: logged, or the walk marked not reusable.
#[inline(always)]
pub fn read(walk: &mut Walk, at: u64, value: u64) {
    let log = &mut walk.reuse;
    let n = log.reads as usize;
    let offset = at.wrapping_sub(log.from.sp);
    if n >= REUSE_READS || offset > (REUSE_SPAN - 8) as u64 || offset & 7 != 0 {
        log.reads = NOT_REUSABLE;
        return;
    }
    if let (Some(slot_at), Some(slot_value)) = (log.read_at.get_mut(n), log.read_value.get_mut(n)) {
        *slot_at = offset as u16;
        *slot_value = value;
        log.reads += 1;
    }
}

/// The walk read what the stack's words do not decide (Python's frames).
#[inline(always)]
pub fn not_reusable(walk: &mut Walk) {
    walk.reuse.reads = NOT_REUSABLE;
}

/// Whether every sleep is walked, reuse only checked.
#[inline(always)]
pub fn checking() -> bool {
    unsafe { core::ptr::read_volatile(&OFFCPU_REUSE_CHECK) != 0 }
}

/// The stack a thread's last kept walk found, if a walk from its user registers now would find
/// the same: the same process, mappings version and epoch, the same registers, every word the same.
#[inline(always)]
pub fn offcpu_stack(kept: &StackReuse, tgid: u32, version: u64, generation: u32) -> Option<i32> {
    // The registers read only where nothing cheaper already tells this walk apart.
    if kept.tgid != tgid || kept.version != version || kept.generation != generation {
        return None;
    }
    let from = crate::unwind::saved_user_registers()?;
    let same = kept.from.ip == from.pc
        && kept.from.sp == from.sp
        && kept.from.fp == from.fp
        && kept.from.lr == from.lr;
    // (A walk that read Python frames was not kept; a kept one was walked under the interpreter
    // given with its mappings' version: user space moves the version before it gives another.)
    if !same || kept.reads > REUSE_READS as u32 {
        return None;
    }
    if kept.span > 0 {
        let words = unsafe { &mut *REUSE_WORDS.get_ptr_mut(0)? };
        // 1 to REUSE_SPAN bytes, as the verifier can tell.
        let size = ((kept.span - 1) & (REUSE_SPAN as u32 - 1)) + 1;
        let copied = unsafe { bpf_probe_read_user(words.as_mut_ptr() as *mut _, size, from.sp as *const _) };
        if copied != 0 {
            return None;
        }
        for i in 0..REUSE_READS {
            if i >= kept.reads as usize {
                break;
            }
            let at = kept
                .read_at
                .get(i)
                .map(|&at| (at as usize / 8) & (REUSE_SPAN / 8 - 1))?;
            if words.get(at)? != kept.read_value.get(i)? {
                return None;
            }
        }
    }
    Some(kept.stack_id)
}

/// An off-CPU walk ended with `stack_id` (in `generation`'s slot): checked against what reuse
/// would have given, and kept in `keep` for the thread's next sleep if it reached the stack's end.
#[inline(always)]
pub fn walked_offcpu(walk: &mut Walk, stack_id: i32, generation: u32, keep: &mut StackReuse) {
    if walk.expect >= 0 && walk.expect != stack_id {
        bump(HealthCounter::StackReuseWrong);
        kernel_log!(
            "tid {}: walked stack {} where reuse gave {}",
            walk.tid,
            stack_id,
            walk.expect
        );
    }
    walk.expect = -1;
    let whole = walk.stack.stop == stop::END && walk.stack.lost == 0 && walk.stale == 0;
    if !whole || stack_id < 0 || walk.reuse.reads > REUSE_READS as u32 {
        return;
    }
    let mut span = 0;
    for i in 0..REUSE_READS {
        if i >= walk.reuse.reads as usize {
            break;
        }
        if let Some(&at) = walk.reuse.read_at.get(i) {
            span = span.max(u32::from(at) + 8);
        }
    }
    walk.reuse.span = span;
    walk.reuse.tgid = walk.tgid;
    walk.reuse.generation = generation;
    walk.reuse.stack_id = stack_id;
    // (Asked last: asked with the others above, the compiler folds the loop's bound into
    // `reads`, which the verifier cannot bound.)
    if walk.reuse.version != VERSION_UNKEPT {
        *keep = walk.reuse;
    }
}
