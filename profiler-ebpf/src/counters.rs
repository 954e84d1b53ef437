//! Per-CPU health counters: every lost or damaged sample is counted here and shown in the report.
use aya_ebpf::{macros::map, maps::PerCpuArray};
use profiler_common::{Counter, COUNTER_COUNT};

#[map(name = "COUNTERS")]
static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(COUNTER_COUNT, 0);

#[inline(always)]
pub fn bump(counter: Counter) {
    if let Some(slot) = COUNTERS.get_ptr_mut(counter as u32) {
        // Per-CPU slot: no other CPU writes it, and BPF programs do not nest on one CPU here.
        unsafe { *slot += 1 };
    }
}

/// Atomic add on a shared map value (a BPF `lock add`; `AtomicU64::fetch_add` is not available
/// for the BPF target).
#[inline(always)]
pub fn atomic_add(dst: *mut u64, value: u64) {
    #[cfg(target_arch = "bpf")]
    unsafe {
        core::intrinsics::atomic_xadd::<u64, u64, { core::intrinsics::AtomicOrdering::Relaxed }>(dst, value);
    }
    #[cfg(not(target_arch = "bpf"))]
    unsafe {
        *dst += value
    };
}
