//! bpfprof's kernel programs. Entry points are thin; the work is in `try_*` functions in one module
//! per program family, next to the maps they own.
#![no_std]
#![no_main]
#![cfg_attr(target_arch = "bpf", feature(core_intrinsics))]
#![cfg_attr(target_arch = "bpf", feature(asm_experimental_arch))]
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

/// What every program at a tracepoint opened as a perf event (`#[tracepoint]`) returns: non-zero
/// lets the kernel go on to count and record the hit for the tracepoint's perf events, zero
/// would drop it for all of them (`perf_trace_run_bpf_submit`), machine-wide for as long as the
/// program is attached: another tool's `perf stat -e sched:sched_process_exec` or `perf record -e
/// syscalls:sys_enter_write` would see nothing, and neither would bpfprof's own `stat`.
pub const PASS_ON: u32 = 1;

/// A program at a tracepoint opened as a perf event, declared as aya's `#[tracepoint]` declares
/// one but returning what its function returns (aya's returns 0 whatever the function does):
/// each of ours returns `PASS_ON`.
macro_rules! tracepoint {
    ($(#[$attr:meta])* pub fn $name:ident($ctx:ident: TracePointContext) -> u32 $body:block) => {
        $(#[$attr])*
        #[unsafe(no_mangle)]
        #[unsafe(link_section = "tracepoint")]
        pub fn $name($ctx: *mut ::core::ffi::c_void) -> u32 {
            let $ctx = ::aya_ebpf::programs::TracePointContext::new($ctx);
            $body
        }
    };
}

mod arch;
mod atomic;
mod clock;
mod health;
mod hits;
mod latency;
mod lock;
mod mappings;
mod python;
mod records;
mod reuse;
mod sampling;
mod sched;
mod syscalls;
mod targets;
mod timeline;
mod unwind;
mod values;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
