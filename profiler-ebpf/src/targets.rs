//! Which processes are profiled: the target set, kept current as targets fork, exec and exit.
//!
//! User space seeds `TARGETS` with the `-p` pids or the command it starts; from then on the kernel
//! follows descendants itself, so a child that lives for a millisecond is still profiled.
use aya_ebpf::{
    helpers::bpf_get_current_pid_tgid,
    macros::map,
    maps::{HashMap, LruHashMap},
    programs::TracePointContext,
};
use profiler_common::{ExitOffsets, ForkOffsets, HealthCounter, SEEN_MAP_ENTRIES, TARGET_MAP_ENTRIES};

use crate::{health::bump, sampling::SEEN};

/// Set by the loader: 0 = profile everything (`-a`), 1 = only processes in `TARGETS`.
#[unsafe(no_mangle)]
static FILTER_BY_TARGET: u32 = 0;
#[unsafe(no_mangle)]
static FORK_OFFSETS: ForkOffsets = ForkOffsets {
    parent_pid: 12,
    child_pid: 20,
};
#[unsafe(no_mangle)]
static EXIT_OFFSETS: ExitOffsets = ExitOffsets {
    pid: 24,
    group_dead: 32,
};
/// Offset of `sched_process_exec`'s `old_pid` (`u32::MAX`: unknown).
#[unsafe(no_mangle)]
static EXEC_OLD_PID_OFFSET: u32 = 16;

/// Target tgids (and, transiently, tids of targets' new threads: see `try_follow_fork`).
#[map(name = "TARGETS")]
pub static TARGETS: HashMap<u32, u8> = HashMap::with_max_entries(TARGET_MAP_ENTRIES, 0);

/// Per process, how many times it exec'd during the run (absent: never). Samples carry it, so
/// that user space resolves each against the memory map of the image that was running.
#[map(name = "EXEC_GENERATIONS")]
static EXEC_GENERATIONS: LruHashMap<u32, u32> = LruHashMap::with_max_entries(SEEN_MAP_ENTRIES, 0);

/// The process's exec generation (see `EXEC_GENERATIONS`).
#[inline(always)]
pub fn exec_generation(tgid: u32) -> u32 {
    unsafe { EXEC_GENERATIONS.get(tgid) }.copied().unwrap_or(0)
}

/// Whether this process was named a target (or followed from one): false in a machine-wide run.
#[inline(always)]
pub fn is_named_target(tgid: u32) -> bool {
    filtering() && TARGETS.get_ptr(tgid).is_some()
}

#[inline(always)]
fn filtering() -> bool {
    unsafe { core::ptr::read_volatile(&FILTER_BY_TARGET) != 0 }
}

/// Whether samples of this process are wanted.
#[inline(always)]
pub fn is_target(tgid: u32) -> bool {
    !filtering() || TARGETS.get_ptr(tgid).is_some()
}

tracepoint! {
pub fn follow_fork(ctx: TracePointContext) -> u32 {
    let _ = try_follow_fork(&ctx);
    crate::PASS_ON
}
}

/// A target's clone adds the child. The tracepoint does not say whether the child is a thread
/// or a process; a thread's tid in the set is harmless (tids are looked up as tgids only) and is
/// removed again when the thread exits.
fn try_follow_fork(ctx: &TracePointContext) -> Result<(), i64> {
    if !filtering() {
        return Ok(());
    }
    let parent_tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if TARGETS.get_ptr(parent_tgid).is_none() {
        return Ok(());
    }
    let offsets = unsafe { core::ptr::read_volatile(&FORK_OFFSETS) };
    let child: i32 = unsafe { ctx.read_at(offsets.child_pid as usize) }.map_err(|e| e as i64)?;
    if TARGETS.insert(child as u32, 1, 0).is_err() {
        bump(HealthCounter::TargetMapFull);
        kernel_log!(
            "target map full: child {} of pid {} not followed",
            child,
            parent_tgid
        );
    }
    Ok(())
}

tracepoint! {
pub fn forget_exit(ctx: TracePointContext) -> u32 {
    let _ = try_forget_exit(&ctx);
    crate::PASS_ON
}
}

/// The current task's (process id, thread id).
#[inline(always)]
pub fn current_ids() -> (u32, u32) {
    let pid_tgid = bpf_get_current_pid_tgid();
    ((pid_tgid >> 32) as u32, pid_tgid as u32)
}

/// Drop exited threads' tids, so that a reused pid does not inherit target status. The tgid of a
/// process stays until the whole group is dead, because its other threads are still targets.
fn try_forget_exit(ctx: &TracePointContext) -> Result<(), i64> {
    let (tgid, tid) = current_ids();
    crate::sched::forget_task(tgid, tid);
    crate::lock::forget_thread(tgid, tid);
    crate::syscalls::forget_thread(tid);
    crate::latency::forget_thread(tid);
    let offsets = unsafe { core::ptr::read_volatile(&EXIT_OFFSETS) };
    let group_dead = match offsets.group_dead {
        u32::MAX => None,
        at => Some(unsafe { ctx.read_at::<u8>(at as usize) }.map_err(|e| e as i64)? != 0),
    };
    // Without the field (older kernels) the leader's exit stands for the group's here: at worst
    // its other threads' stacks are walked with frame pointers from then on.
    if group_dead.unwrap_or(tid == tgid) {
        crate::unwind::forget_process(tgid);
        let _ = EXEC_GENERATIONS.remove(tgid);
        // A process that reuses the pid is another process: announced again at its first sample,
        // so its own map is captured (pids are reused within minutes where pid_max is 32768).
        let _ = SEEN.remove(tgid);
    }
    if !filtering() {
        return Ok(());
    }
    if tid != tgid {
        let _ = TARGETS.remove(tid);
    }
    if group_dead == Some(true) {
        let _ = TARGETS.remove(tgid);
    }
    Ok(())
}

tracepoint! {
/// After exec the old memory map is gone and the new one is not built yet (the loader has not
/// mapped the libraries): forget the process, so its next sample announces it again. It also has
/// a new name (and, where the scheduler is traced, its labels are announced now).
pub fn announce_exec(ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    // A thread other than the leader that execs takes on the leader's tid: what is kept under
    // its old tid (a system call in progress, a start keyed by thread) moves with it.
    let at = unsafe { core::ptr::read_volatile(&EXEC_OLD_PID_OFFSET) };
    if at != u32::MAX {
        if let Ok(old) = unsafe { ctx.read_at::<u32>(at as usize) } {
            if old != pid_tgid as u32 {
                crate::syscalls::moved_thread(old, pid_tgid as u32);
                crate::latency::moved_thread(old, pid_tgid as u32);
            }
        }
    }
    let _ = SEEN.remove(tgid);
    crate::unwind::forget_process(tgid);
    if is_target(tgid) {
        let _ = EXEC_GENERATIONS.insert(tgid, exec_generation(tgid) + 1, 0);
    }
    crate::sched::exec_done(tgid, pid_tgid as u32);
    crate::PASS_ON
}
}
