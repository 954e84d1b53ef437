//! bpfprof's kernel programs. Entry points are thin; the work is in `try_*` functions in one module
//! per program family, next to the maps they own.
#![no_std]
#![no_main]
#![cfg_attr(target_arch = "bpf", feature(core_intrinsics))]
#![cfg_attr(target_arch = "bpf", allow(internal_features))]

/// A line for bpfprof's log from a rare kernel path (a full map, a failed read, an unwinder
/// bail-out), each already counted for the report: at debug, under the target `bpfprof::kernel`
/// (`RUST_LOG=bpfprof::kernel=debug`). User space sets the programs' level at load from its own,
/// so below debug a site costs one load and compare, on a path that only runs when something was
/// already lost. The log takes no context: it only reserves in its own ring.
macro_rules! kernel_log {
    ($($arg:tt)+) => {
        aya_log_ebpf::debug!(&(), target: "bpfprof::kernel", $($arg)+)
    };
}

mod arch;
mod atomic;
mod health;
mod hits;
mod latency;
mod lock;
mod records;
mod sampling;
mod sched;
mod syscalls;
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
