//! The system-call summary (`bpfprof trace -s`): each target thread's calls timed from the
//! kernel's `sys_enter` to its `sys_exit`, summed in the kernel per thread, call and errno; with
//! `--duration-min`, each call at least that long also sent whole (`SlowCall`) with its stack.
use core::mem::size_of;

use crate::unwind::MAX_FRAMES;

/// Threads whose current call is remembered (one entry per target thread that made a call).
pub const SYSCALL_THREAD_ENTRIES: u32 = 16 * 1024;
/// Sums per (thread, call, errno).
pub const SYSCALL_TOTAL_ENTRIES: u32 = 32 * 1024;
/// The `errno` of a call that never returned: `exit`, `exit_group`. Counted once, at the thread's
/// exit, with no time. (A call a fatal signal interrupts returns first, with the kernel-internal
/// `ERESTARTSYS` or another of 512-516.)
pub const NO_RETURN: u32 = u32::MAX;
/// A return value in `-MAX_ERRNO..0` is an error (the kernel's own rule).
pub const MAX_ERRNO: i64 = 4095;

/// The bytes of the ring of slow calls: about 3,600 of them between two drains.
pub const SLOW_CALL_RING_BYTES: u32 = 4 << 20;

/// The call a thread is in (`entered_ns` 0: none), and its arguments where slow calls are sent.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SyscallEntry {
    pub entered_ns: u64,
    pub nr: u32,
    pub tgid: u32,
    pub args: [u64; 6],
}
const _: () = assert!(size_of::<SyscallEntry>() == 64);

/// One call that took at least the threshold: when, who, which, with what, and what it returned.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlowCallHeader {
    pub entered_ns: u64,
    pub took_ns: u64,
    pub args: [u64; 6],
    pub ret: i64,
    pub tgid: u32,
    pub tid: u32,
    pub nr: u32,
    pub cpu: u32,
    pub comm: [u8; 16],
}
const _: () = assert!(size_of::<SlowCallHeader>() == 104);

/// A slow call and the user stack it was made from (leaf first), as the ring carries it.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SlowCall {
    pub call: SlowCallHeader,
    /// Which image of its process the stack is of (see `SampleKey::exec_generation`).
    pub exec_generation: u32,
    /// Bytes of `user` walked (0: none, a kernel thread), or the negative error.
    pub user_bytes: i32,
    /// How the walk ended (`unwind::stop`).
    pub stop: u32,
    /// 1: walked through its process's unwind tables; 0: by frame pointers (none loaded yet, or
    /// they did not cover a pc walked: a library loaded since).
    pub tables: u32,
    pub user: [u64; MAX_FRAMES],
}
const _: () = assert!(size_of::<SlowCall>() == 120 + 8 * MAX_FRAMES);

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SyscallKey {
    pub tgid: u32,
    pub tid: u32,
    pub nr: u32,
    /// 0: returned without error; `NO_RETURN`; else the errno it returned.
    pub errno: u32,
}
const _: () = assert!(size_of::<SyscallKey>() == 16);

/// One (thread, call, errno)'s calls and their time, and the thread's name at its first.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SyscallTotals {
    pub calls: u64,
    pub total_ns: u64,
    pub min_ns: u64,
    pub max_ns: u64,
    pub comm: [u8; 16],
}
const _: () = assert!(size_of::<SyscallTotals>() == 48);

/// The error a return value says, if any (`MAX_ERRNO`).
pub const fn errno_of(ret: i64) -> u32 {
    match ret < 0 && ret >= -MAX_ERRNO {
        true => (-ret) as u32,
        false => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_last_4095_negative_values_are_errors() {
        assert_eq!(errno_of(0), 0);
        assert_eq!(errno_of(512), 0);
        assert_eq!(errno_of(-2), 2);
        assert_eq!(errno_of(-4095), 4095);
        assert_eq!(errno_of(-4096), 0, "an address, not an error");
    }
}
