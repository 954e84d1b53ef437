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

/// Atomic add on a shared map value that returns what was there before: BPF's `FETCH | ADD`
/// (kernel 5.12), written out because LLVM selects it only for the v3 instruction set, which
/// rustc does not let a build script ask for (it links for `generic`).
#[inline(always)]
pub fn atomic_fetch_add(dst: *mut u64, value: u64) -> u64 {
    #[cfg(target_arch = "bpf")]
    unsafe {
        let mut old = value;
        core::arch::asm!(
            "{old} = atomic_fetch_add((u64 *)({dst} + 0), {old})",
            dst = in(reg) dst,
            old = inout(reg) old,
            options(nostack),
        );
        old
    }
    #[cfg(not(target_arch = "bpf"))]
    unsafe {
        let before = *dst;
        *dst += value;
        before
    }
}
