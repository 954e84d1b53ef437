//! bpfprof's kernel programs. Entry points are thin; the work is in `try_*` functions in one module
//! per program family, next to the maps they own.
#![no_std]
#![no_main]
#![cfg_attr(target_arch = "bpf", feature(core_intrinsics))]
#![cfg_attr(target_arch = "bpf", allow(internal_features))]

mod arch;
mod counters;
mod lock;
mod sampling;
mod sched;
mod targets;
mod unwind;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
