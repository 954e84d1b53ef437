//! Types shared by the kernel programs (`profiler-ebpf`) and user space (`profiler`).
//!
//! Everything here is `#[repr(C)]` with explicit padding, and its size is asserted, because both
//! sides read the same bytes out of BPF maps. Map sizes and stack depth live here once.
#![no_std]

use core::mem::size_of;

/// Deepest stack `bpf_get_stackid` records (the kernel's `PERF_MAX_STACK_DEPTH`).
pub const MAX_STACK_DEPTH: usize = 127;
/// Distinct stacks per epoch (per stack map). Each entry is `MAX_STACK_DEPTH * 8` bytes.
pub const STACK_MAP_ENTRIES: u32 = 16 * 1024;
/// Distinct (thread, user stack, kernel stack) keys per epoch.
pub const SAMPLE_MAP_ENTRIES: u32 = 32 * 1024;
/// Processes that may be targeted at once (the `-p` list plus their descendants).
pub const TARGET_MAP_ENTRIES: u32 = 8 * 1024;
/// Processes remembered as "already announced to user space" (LRU).
pub const SEEN_MAP_ENTRIES: u32 = 16 * 1024;
/// Ring buffer for process announcements.
pub const EVENT_RING_BYTES: u32 = 64 * 1024;
/// Length of `task_struct::comm`.
pub const COMM_LEN: usize = 16;

/// The two epoch slots: the kernel writes into one pair of maps while user space drains the other.
pub const EPOCH_SLOTS: u32 = 2;

/// Key of the sample-count maps: one per (thread, user stack, kernel stack).
///
/// A negative stack id is the kernel's error for that stack (for example `-EFAULT` when there is
/// no user stack, `-EEXIST` on a stack-map collision); user space decides what each means.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SampleKey {
    pub tgid: u32,
    pub tid: u32,
    pub user_stack_id: i32,
    pub kernel_stack_id: i32,
    pub comm: [u8; COMM_LEN],
}
const _: () = assert!(size_of::<SampleKey>() == 32);

/// Why user space should look at a process now, while it is alive.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProcessEventKind {
    /// The first sample of a process in this run (or since its last exec): capture its memory
    /// map for symbolization.
    FirstSample = 1,
}

/// Sent through the event ring buffer; rare (once per process), never per sample.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcessEvent {
    pub tgid: u32,
    pub kind: u32,
}
const _: () = assert!(size_of::<ProcessEvent>() == 8);

/// Indexes into the per-CPU `COUNTERS` array. Every way a sample can be lost or damaged has one,
/// so reports can state them instead of hiding them.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counter {
    /// Samples recorded into the sample map (idle and filtered-out samples are not included).
    Samples = 0,
    /// Samples taken while the CPU was idle (pid 0), counted but not recorded.
    Idle = 1,
    /// Samples dropped because the sample map was full.
    SampleMapFull = 2,
    /// User stacks lost to a stack-map hash collision (`-EEXIST`).
    UserStackCollision = 3,
    /// Kernel stacks lost to a stack-map hash collision (`-EEXIST`).
    KernelStackCollision = 4,
    /// User stacks that failed for another reason than "no user stack" (e.g. stack map full).
    UserStackError = 5,
    /// Kernel stacks that failed for another reason than "sample taken in user mode".
    KernelStackError = 6,
    /// Process announcements dropped because the event ring buffer was full.
    EventLost = 7,
    /// Descendants of targets added to the target map.
    TargetsFollowed = 8,
    /// Descendants of targets that could not be added because the target map was full.
    TargetMapFull = 9,
}
pub const COUNTER_COUNT: u32 = 10;

impl Counter {
    pub const ALL: [Counter; COUNTER_COUNT as usize] = [
        Counter::Samples,
        Counter::Idle,
        Counter::SampleMapFull,
        Counter::UserStackCollision,
        Counter::KernelStackCollision,
        Counter::UserStackError,
        Counter::KernelStackError,
        Counter::EventLost,
        Counter::TargetsFollowed,
        Counter::TargetMapFull,
    ];
}

/// Offsets of the `sched:sched_process_fork` fields we read, taken at start-up from the tracefs
/// format file because they differ between kernels (`parent_comm` became `__data_loc` in 6.x).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ForkOffsets {
    pub parent_pid: u32,
    pub child_pid: u32,
}
const _: () = assert!(size_of::<ForkOffsets>() == 8);

/// Offsets of the `sched:sched_process_exit` fields we read.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExitOffsets {
    pub pid: u32,
    /// Offset of `group_dead`, or `u32::MAX` on kernels without it.
    pub group_dead: u32,
}
const _: () = assert!(size_of::<ExitOffsets>() == 8);

/// Names of maps and programs, used by both sides so a rename cannot silently break loading.
pub mod names {
    pub const SAMPLES: [&str; 2] = ["SAMPLES_0", "SAMPLES_1"];
    pub const STACKS: [&str; 2] = ["STACKS_0", "STACKS_1"];
    pub const EPOCH: &str = "EPOCH";
    pub const TARGETS: &str = "TARGETS";
    pub const COUNTERS: &str = "COUNTERS";
    pub const EVENTS: &str = "EVENTS";
    pub const SEEN: &str = "SEEN";
    pub const PROG_SAMPLE: &str = "sample_stack";
    pub const PROG_FORK: &str = "follow_fork";
    pub const PROG_EXIT: &str = "forget_exit";
    pub const PROG_EXEC: &str = "announce_exec";
    /// Globals set by the loader.
    pub const G_FILTER: &str = "FILTER_BY_TARGET";
    pub const G_FORK: &str = "FORK_OFFSETS";
    pub const G_EXIT: &str = "EXIT_OFFSETS";
}

#[cfg(feature = "user")]
mod pod {
    use super::*;
    // SAFETY: plain old data, `#[repr(C)]`, no padding bytes (sizes asserted above).
    unsafe impl aya::Pod for SampleKey {}
    unsafe impl aya::Pod for ProcessEvent {}
    unsafe impl aya::Pod for ForkOffsets {}
    unsafe impl aya::Pod for ExitOffsets {}
}
