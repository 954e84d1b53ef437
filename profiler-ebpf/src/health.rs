//! The per-CPU health counters: every lost or damaged record is counted here and shown in the
//! report (declared once, in `profiler_common::health_table!`).
use aya_ebpf::{macros::map, maps::PerCpuArray};
use profiler_common::{HealthCounter, HEALTH_COUNTERS};

#[map(name = "HEALTH")]
static HEALTH: PerCpuArray<u64> = PerCpuArray::with_max_entries(HEALTH_COUNTERS, 0);

#[inline(always)]
pub fn bump(counter: HealthCounter) {
    if let Some(slot) = HEALTH.get_ptr_mut(counter as u32) {
        // Per CPU, added to atomically: a perf event's program (in an NMI) may interrupt another's
        // bump on its CPU, and a uprobe's program runs preemptible where the kernel allows it.
        crate::atomic::atomic_add(slot, 1);
    }
}

/// `bump` for a counter only `sched_switch` adds to: that program runs with the run queue locked
/// and interrupts off, never interrupted by another run of itself on its CPU (a perf event's, in
/// an NMI, adds to other counters), so a plain add is exact where the locked one costs a fence
/// at every switch.
#[inline(always)]
pub fn bump_in_switch(counter: HealthCounter) {
    if let Some(slot) = HEALTH.get_ptr_mut(counter as u32) {
        unsafe { *slot += 1 };
    }
}
