//! `bpfprof latency --from A --to B`: the time from each hit of A to the next hit of B with the
//! same key (the thread, or the values of some of the tracepoints' fields), as a histogram
//! summed in the kernel (`crate::hist_bucket`'s buckets).
use core::mem::size_of;

use crate::sched::HIST_BUCKETS;

/// Starts waiting for their end.
pub const LATENCY_START_ENTRIES: u32 = 64 * 1024;
/// `--duration-min`: distinct stacks of starts (each kind: frame-pointer and kernel stacks, and
/// table-walked user stacks).
pub const LATENCY_STACK_ENTRIES: u32 = 16 * 1024;
/// The bytes of the ring of intervals at least `--duration-min` long: about 3,600 of them
/// between two drains.
pub const SLOW_INTERVAL_RING_BYTES: u32 = 256 << 10;

/// The attach cookie of each side's program.
pub const FROM: u64 = 0;
pub const TO: u64 = 1;

/// Slots of the per-CPU `LATENCY_HIST` array: the histogram's buckets, then these.
pub mod slot {
    use super::HIST_BUCKETS;
    /// Of every latency: the sum (ns) and the longest (ns).
    pub const SUM: u32 = HIST_BUCKETS as u32;
    pub const MAX: u32 = SUM + 1;
    /// Ends with no start of the same key (begun before the run, or by another thread).
    pub const UNMATCHED: u32 = SUM + 2;
    /// Starts that replaced a start of their key not ended yet.
    pub const REPLACED: u32 = SUM + 3;
    pub const SLOTS: u32 = SUM + 4;
}

/// What a start is matched to its end by: the thread (`a` its tid), or up to two fields' values.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct LatencyKey {
    pub a: u64,
    pub b: u64,
}
const _: () = assert!(size_of::<LatencyKey>() == 16);

/// Where one side's tracepoint keeps the key's fields (`fields` 0: keyed by thread).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KeyFields {
    pub fields: u32,
    /// Bit i: field i is signed (compared as read either way: user space shows it so).
    pub signed: u32,
    /// Offset in the tracepoint's record and size (1, 2, 4 or 8 bytes) of each field.
    pub offsets: [u32; 2],
    pub sizes: [u32; 2],
}
const _: () = assert!(size_of::<KeyFields>() == 24);

/// Each side's key: `[from, to]`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LatencyKeys {
    pub sides: [KeyFields; 2],
}
const _: () = assert!(size_of::<LatencyKeys>() == 48);

/// A start waiting for its end: when, and with `--duration-min` who started it and where.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LatencyStart {
    pub started_ns: u64,
    pub tgid: u32,
    pub tid: u32,
    /// The starter's user stack: an id in `LATENCY_USER_STACKS` (walked through its process's
    /// tables) where `user_tables` is 1, else in `LATENCY_STACKS` (frame pointers); negative:
    /// the error.
    pub user_stack: i32,
    /// An id in `LATENCY_STACKS`, or the negative error (`-EFAULT`: none, a start in user code).
    pub kernel_stack: i32,
    pub user_tables: u32,
    /// Which image of its process the user stack is of (see `SampleKey::exec_generation`).
    pub exec_generation: u32,
    pub comm: [u8; 16],
}
const _: () = assert!(size_of::<LatencyStart>() == 48);

/// An interval at least `--duration-min` long: its start, key and length.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlowInterval {
    pub start: LatencyStart,
    pub key: LatencyKey,
    pub took_ns: u64,
}
const _: () = assert!(size_of::<SlowInterval>() == 72);
