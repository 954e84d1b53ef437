//! The time at a scheduler switch or wake-up, from the clock the scheduler itself just read.
//!
//! `bpf_ktime_get_ns` is a serialising read of the TSC: at a switch it waits for every load the
//! program issued before it (the task entries, the switching tasks' fields) and costs about 70 ns
//! of a switch program's ~300 here, a quarter of the agent's whole cost. `__schedule` has already
//! brought its run queue's clock (`rq->clock`, `sched_clock` time) up to date, or left it at the
//! wake-up that asked for this switch: the kernel's own stamp for the moment, the one it starts
//! the incoming task's run and ends its wait with. That is three plain loads from the outgoing
//! task (`se.cfs_rq->rq->clock`). A wake-up likewise reads the clock of the woken task's run
//! queue, which it brought up to date to enqueue the task. Every time the programs keep is
//! `CLOCK_MONOTONIC` (`bpf_ktime_get_ns`), as user space's: the stamp is moved there by the offset
//! between the two clocks, measured on each CPU at most every `CHECK_NS` (a stamp the kernel left
//! at a wake-up is behind, which makes a measure larger, never smaller: the offset follows a
//! smaller measure at once and rises only to the least of a `WINDOW_NS` window), so the clocks'
//! drift (NTP slews `CLOCK_MONOTONIC`) is followed within a window. User space gives the offsets
//! only where `sched_clock` is the CPU's own stable counter (clock source `tsc`,
//! `arch_sys_counter`).
use aya_ebpf::{helpers::bpf_ktime_get_ns, macros::map, maps::PerCpuArray};
use profiler_common::TaskOffsets;

/// How often a CPU measures the offset, and over how long it takes the least.
const CHECK_NS: u64 = 1_000_000;
const WINDOW_NS: u64 = 20_000_000;

/// Per CPU: `CLOCK_MONOTONIC` − `rq->clock` as in use, and the window being measured.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ClockSync {
    /// The offset in use (wrapping: either clock may be ahead); 0 before the first measure.
    offset: u64,
    /// The least offset seen in the window (as `i64`), and where the window ends.
    window_least: u64,
    window_end: u64,
    /// The next measure, in `rq->clock` time.
    next_check: u64,
}

#[map(name = "CLOCK_SYNC")]
static CLOCK_SYNC: PerCpuArray<ClockSync> = PerCpuArray::with_max_entries(1, 0);

/// `CLOCK_MONOTONIC` now, at a `sched_switch` run by `current` (the outgoing task, `prev_tid`)
/// on its CPU.
#[inline(always)]
pub fn switch_now(current: *const u8, prev_tid: u32, off: &TaskOffsets) -> u64 {
    // A switch from the idle task follows a wake-up that asked for it: the clock is as the
    // wake-up left it, behind, and no measure of the offset.
    match run_queue_clock(current, off) {
        Some(clock) => monotonic(clock, prev_tid != 0).unwrap_or_else(ktime),
        None => ktime(),
    }
}

/// `CLOCK_MONOTONIC` now, at a `sched_wakeup` of `task`: its run queue's clock, which the
/// wake-up brought up to date to enqueue it (on whichever CPU runs this: every CPU's clock is
/// the one counter where these are used). Never a measure of the offset: a task waking itself
/// (`p == current`) is stamped with a clock no wake-up updated, which may be far behind.
#[inline(always)]
pub fn wakeup_now(task: *const u8, off: &TaskOffsets) -> u64 {
    match run_queue_clock(task, off) {
        Some(clock) => monotonic(clock, false).unwrap_or_else(ktime),
        None => ktime(),
    }
}

#[inline(always)]
fn ktime() -> u64 {
    unsafe { bpf_ktime_get_ns() }
}

/// `current->se.cfs_rq->rq->clock`, where the kernel's BTF says where they are. Plain loads from
/// a task the verifier knows by its BTF type (a bad pointer reads 0, it does not fault).
#[inline(always)]
fn run_queue_clock(current: *const u8, off: &TaskOffsets) -> Option<u64> {
    if off.rq_clock == 0 {
        return None;
    }
    unsafe {
        let cfs_rq = core::ptr::read(current.wrapping_add(off.se_cfs_rq as usize) as *const *const u8);
        let rq = core::ptr::read(cfs_rq.wrapping_add(off.cfs_rq_rq as usize) as *const *const u8);
        let clock = core::ptr::read(rq.wrapping_add(off.rq_clock as usize) as *const u64);
        (clock != 0).then_some(clock)
    }
}

/// The run queue's `clock` moved to `CLOCK_MONOTONIC`. The offset follows a measure below it at
/// once (a stamp is then never ahead of `bpf_ktime_get_ns` by more than the clocks drift apart in
/// `CHECK_NS`) and rises only to the least of a window (a behind clock's measure is too high).
#[inline(always)]
fn monotonic(clock: u64, may_measure: bool) -> Option<u64> {
    let sync = unsafe { &mut *CLOCK_SYNC.get_ptr_mut(0)? };
    let never = sync.offset == 0;
    if never && !may_measure {
        // Nothing measured yet, and this clock may be behind: `bpf_ktime_get_ns` this once.
        return None;
    }
    if never || (may_measure && clock >= sync.next_check) {
        let sample = ktime().wrapping_sub(clock);
        let below = |a: u64, b: u64| (a as i64) < (b as i64);
        // Never measured, or not for a whole window (an idle CPU): what was kept is too old.
        if never || clock >= sync.window_end.saturating_add(WINDOW_NS) {
            sync.offset = sample;
            sync.window_least = sample;
            sync.window_end = clock + WINDOW_NS;
        } else {
            if below(sample, sync.offset) {
                sync.offset = sample;
            }
            if below(sample, sync.window_least) {
                sync.window_least = sample;
            }
            if clock >= sync.window_end {
                sync.offset = sync.window_least;
                sync.window_least = sample;
                sync.window_end = clock + WINDOW_NS;
            }
        }
        sync.next_check = clock + CHECK_NS;
    }
    Some(clock.wrapping_add(sync.offset))
}
