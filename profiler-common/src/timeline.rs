//! `bpfprof sched record`: the scheduler's events one by one, through a ring (`SCHED_TIMELINE`):
//! every switch on every CPU (so a per-CPU map is whole), and the targets' wake-ups,
//! migrations, forks and exits, each with the kernel's own totals of the tasks it names
//! (`KernelTotals`: runs, run-queue delay, time on a CPU) as they stand at that event.
use core::mem::size_of;

use crate::{KernelTotals, COMM_LEN};

/// The ring's size: about 120,000 events between two drains.
pub const TIMELINE_RING_BYTES: u32 = 16 << 20;

/// A task as an event saw it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TaskSnap {
    pub tid: u32,
    pub tgid: u32,
    pub comm: [u8; COMM_LEN],
    /// All zero where the kernel does not keep them (see `TaskOffsets::kernel_accounting`).
    pub totals: KernelTotals,
    /// 1: a target of the run.
    pub target: u32,
    pub _pad: u32,
}
const _: () = assert!(size_of::<TaskSnap>() == 56);

/// One event. `a` and `b` by kind: a switch's outgoing task (its totals at the switch-out) and
/// incoming one (at the switch-in, before the kernel adds the wait it ends); the woken task and
/// its waker; the migrated task; the new child and its parent; the exiting task.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct SchedEvent {
    /// `bpf_ktime_get_ns`: CLOCK_MONOTONIC.
    pub time_ns: u64,
    pub cpu: u32,
    pub kind: u32,
    pub a: TaskSnap,
    pub b: TaskSnap,
    /// A switch: the outgoing task's state (`prev_state`), and bit 32 set if it was preempted; a
    /// migration: the CPU it goes to.
    pub arg: u64,
}
const _: () = assert!(size_of::<SchedEvent>() == 16 + 2 * 56 + 8);

pub mod event_kind {
    pub const SWITCH: u32 = 1;
    pub const WAKEUP: u32 = 2;
    pub const WAKEUP_NEW: u32 = 3;
    pub const MIGRATE: u32 = 4;
    pub const FORK: u32 = 5;
    pub const EXIT: u32 = 6;
}
