//! `bpfprof record`: each sampled hit of a tracing event crosses to user space whole, through a
//! ring buffer (`HitRecord`): when, who, on which CPU, and what was read there. A tracepoint's
//! record is copied (its fields, as its tracefs format lays them out); a probe's record holds
//! what user space asked to fetch at it (`Fetch`, up to `MAX_FETCHES`): registers (arguments,
//! the return value), a global of the probed file, numbers or strings.
use core::mem::size_of;

/// Values fetched at each probe hit.
pub const MAX_FETCHES: usize = 4;
/// Bytes of each fetched string (the last a NUL): a longer one keeps its first 127 and is
/// marked `cut`.
pub const STRING_BYTES: usize = 128;
/// Bytes of the fetched strings, one slot each.
pub const RECORD_STRING_BYTES: usize = MAX_FETCHES * STRING_BYTES;
/// Bytes of a tracepoint's record copied.
pub const RECORD_DATA_BYTES: usize = 256;
/// The ring's size: about 20,000 records between two drains.
pub const RECORD_RING_BYTES: u32 = 16 << 20;

/// One hit, as the kernel saw it.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct HitRecord {
    /// `bpf_ktime_get_ns`: CLOCK_MONOTONIC, as perf's own records.
    pub time_ns: u64,
    pub tgid: u32,
    pub tid: u32,
    pub cpu: u32,
    /// The event's place in the run.
    pub event: u16,
    /// Bit n: fetch n could not be read (a fault: memory paged out, a bad pointer); all set: the
    /// tracepoint's record could not be copied.
    pub failed: u8,
    /// Bit n: fetch n is a string longer than its slot, cut to `STRING_BYTES - 1`.
    pub cut: u8,
    pub comm: [u8; 16],
    /// Each fetch's number (a register's whole value, or the bytes read, zero-extended).
    pub values: [u64; MAX_FETCHES],
    /// Each fetched string, in its slot of `STRING_BYTES`.
    pub strings: [u8; RECORD_STRING_BYTES],
    /// A tracepoint's record, from its start.
    pub data: [u8; RECORD_DATA_BYTES],
}
const _: () = assert!(size_of::<HitRecord>() == 72 + RECORD_STRING_BYTES + RECORD_DATA_BYTES);
// A bit of `failed` and of `cut` each, and `failed`'s all-set left to mean "not copied".
const _: () = assert!(MAX_FETCHES < 8);

/// Kernel frames kept with a recorded hit (`record -g`).
pub const RECORD_KERNEL_FRAMES: usize = 64;

/// A hit with the stacks it was hit on (`record -g`): the user stack walked through the
/// process's unwind tables where it has them (as the sampler walks it), else by frame pointers
/// as `bpf_get_stack` walks it (as `perf record -g` does), and the kernel's.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct StackedRecord {
    pub hit: HitRecord,
    /// Bytes of `user` and `kernel` written, or the negative error `bpf_get_stack` returned.
    pub user_bytes: i32,
    pub kernel_bytes: i32,
    /// Which image of the process the user stack is of (see `SampleKey::exec_generation`).
    pub exec_generation: u32,
    pub _pad: u32,
    /// Leaf first.
    pub user: [u64; crate::unwind::MAX_FRAMES],
    pub kernel: [u64; RECORD_KERNEL_FRAMES],
}
const _: () = assert!(
    size_of::<StackedRecord>()
        == size_of::<HitRecord>() + 16 + 8 * (crate::unwind::MAX_FRAMES + RECORD_KERNEL_FRAMES)
);

/// What a probe's record reads at each hit, one per fetch (`RECORD_FETCHES`, at
/// `(event * MAX_PROBE_SITES + site) * MAX_FETCHES + n`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fetch {
    /// `fetch::NONE`, `WORD`, `GLOBAL`, `MEMORY` or `CONSTANT`.
    pub kind: u8,
    /// Bytes of a number read from memory (1, 2, 4 or 8); 0: a string, into the string slot `n`
    /// (where a word points, or at the global itself: a `char` array).
    pub size: u8,
    /// A word of the program's context, by its byte offset: a register in a probe's `pt_regs`
    /// (`hit_weight::register_offset`), a field in a tracepoint's record (a number, or a
    /// pointer to a string).
    pub word: u16,
    /// A number of `size` bytes is sign-extended to 64 bits (else zero-extended): a probe's
    /// sites may size one argument differently, and the record shows it one way.
    pub signed: u8,
    pub _pad: [u8; 3],
    /// A global's address less the probed instruction's: both are in the same file, which the
    /// loader maps whole at one offset, so the global is at the hit's address plus this. For
    /// `MEMORY`, what is added to the word; for `CONSTANT`, the value.
    pub delta: i64,
}
const _: () = assert!(size_of::<Fetch>() == 16);

pub mod fetch {
    pub const NONE: u8 = 0;
    /// A word of the context: the number itself (`size` > 0), or the string it points at.
    pub const WORD: u8 = 1;
    /// A global of the probed file.
    pub const GLOBAL: u8 = 2;
    /// Memory at a word of the context (a register) plus `delta`: a USDT argument the compiler
    /// left on the stack. A string (`size` 0) is where the word read there points.
    pub const MEMORY: u8 = 3;
    /// `delta` itself: a USDT argument the compiler knew.
    pub const CONSTANT: u8 = 4;
}
