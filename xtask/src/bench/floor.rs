//! The floor of a tracing bench: a program that returns at once, attached to the same
//! tracepoints as the profiler measured (as raw tracepoints: the kernel calls BTF and raw ones
//! the same way, through `bpf_trace_run`). What any program there costs (the kernel's way into
//! BPF, its retpolines) is below it; what a profiler costs above it is its own work.
//!
//! Loaded with bare `bpf(2)` calls, one load and one attach per tracepoint (two instructions
//! need no object file, no loader crate), and held by a process of its own until it is
//! interrupted, as the profilers are.
use std::{ffi::CString, os::fd::FromRawFd as _, os::fd::OwnedFd};

use anyhow::{bail, Context as _, Result};

/// The tracepoints a scheduler tracer runs on at every switch and wake-up.
pub const SCHED_TRACEPOINTS: [&str; 3] = ["sched_switch", "sched_wakeup", "sched_wakeup_new"];

const BPF_PROG_LOAD: i64 = 5;
const BPF_RAW_TRACEPOINT_OPEN: i64 = 17;
const BPF_PROG_TYPE_RAW_TRACEPOINT: u32 = 17;

/// `r0 = 0; exit` (opcodes 0xb7 and 0x95, every other field zero).
const RETURN_ZERO: [u64; 2] = [0xb7, 0x95];

/// The head of `union bpf_attr` for `BPF_PROG_LOAD`; the kernel takes the rest as zero.
#[repr(C)]
struct ProgLoad {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
}

/// `union bpf_attr` for `BPF_RAW_TRACEPOINT_OPEN`.
#[repr(C)]
struct RawTracepointOpen {
    name: u64,
    prog_fd: u32,
    _pad: u32,
}

/// `bpf(cmd, attr)`: the new descriptor.
fn bpf<T>(cmd: i64, attr: &T, what: &str) -> Result<OwnedFd> {
    // SAFETY: `attr` is a live `#[repr(C)]` value of the size passed, laid out as the kernel's
    // union for `cmd`; every pointer in it outlives the call.
    let fd = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr as *const T, size_of::<T>()) };
    if fd < 0 {
        bail!("{what}: {}", std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor the kernel just returned, owned by no one else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Attach the empty program to each tracepoint and hold it there until the process is
/// interrupted.
pub fn hold(tracepoints: &[String]) -> Result<()> {
    // SIGINT stops it, even where a shell started it with the signal ignored.
    // SAFETY: no handler is installed, only the default action restored.
    unsafe { libc::signal(libc::SIGINT, libc::SIG_DFL) };
    let license = c"GPL";
    let mut prog_name = [0u8; 16];
    prog_name[..11].copy_from_slice(b"bench_floor");
    let prog = bpf(
        BPF_PROG_LOAD,
        &ProgLoad {
            prog_type: BPF_PROG_TYPE_RAW_TRACEPOINT,
            insn_cnt: RETURN_ZERO.len() as u32,
            insns: RETURN_ZERO.as_ptr() as u64,
            license: license.as_ptr() as u64,
            log_level: 0,
            log_size: 0,
            log_buf: 0,
            kern_version: 0,
            prog_flags: 0,
            prog_name,
        },
        "loading the empty program",
    )?;
    let mut links = Vec::new();
    for tracepoint in tracepoints {
        let name = CString::new(tracepoint.as_str()).context("a tracepoint name")?;
        let attr = RawTracepointOpen {
            name: name.as_ptr() as u64,
            prog_fd: std::os::fd::AsRawFd::as_raw_fd(&prog) as u32,
            _pad: 0,
        };
        links.push(bpf(
            BPF_RAW_TRACEPOINT_OPEN,
            &attr,
            &format!("attaching to raw tracepoint {tracepoint}"),
        )?);
    }
    // The bench waits for this line, as it does for bpfprof's.
    eprintln!("an empty program on {}: Ctrl-C to stop", tracepoints.join(", "));
    loop {
        // Until SIGINT ends the process; the kernel then detaches everything.
        std::thread::park();
    }
}
