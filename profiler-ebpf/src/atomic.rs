//! What the BPF target lacks of `core::sync::atomic`.

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
