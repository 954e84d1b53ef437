//! Table-based unwinding (x86-64 and AArch64): rows built from `.eh_frame` in user space, walked
//! in BPF. "sp" and "fp" are rsp and rbp on x86-64, sp and x29 on AArch64.
use core::mem::size_of;

/// Rows in the shared row array (all files' tables, 16 bytes each).
pub const ROWS: u32 = 1 << 20;
/// Executable mappings with tables per process.
pub const MAX_MAPPINGS: usize = 64;
/// Processes with tables at once.
pub const PROCESSES: u32 = 4096;
/// Deepest user stack walked (like `bpf_get_stackid`'s limit).
pub const MAX_FRAMES: usize = 127;
/// Frames unwound per program run; the walk continues in a tail call of itself.
pub const FRAMES_PER_RUN: usize = 12;
/// Distinct table-unwound user stacks per epoch.
pub const STACK_ENTRIES: u32 = 8 * 1024;
/// Binary-search steps: enough for `ROWS` rows and `MAX_MAPPINGS` mappings.
pub const ROW_SEARCH_STEPS: usize = 21;
pub const MAPPING_SEARCH_STEPS: usize = 7;
/// Slot of the unwinding program in the program array.
pub const PROGRAM_SLOT: u32 = 0;

/// How the canonical frame address (the caller's stack pointer) is found at a pc.
pub mod cfa {
    /// No rule bpfprof can follow (an expression): try the frame pointer instead.
    pub const UNSUPPORTED: u8 = 0;
    pub const SP: u8 = 1;
    pub const FP: u8 = 2;
    /// PLT stubs' standard expression: rsp + 8, plus 8 past the stub's push.
    pub const PLT: u8 = 3;
    /// The return address is undefined here: the outermost frame (`_start`, thread start).
    pub const END: u8 = 4;
    /// No table covers this pc (a gap between functions).
    pub const NONE: u8 = 5;
}

/// Where the caller's frame pointer was saved.
pub mod fp {
    /// Not saved: unchanged in the caller.
    pub const SAME: u8 = 0;
    /// At CFA + offset.
    pub const AT_CFA: u8 = 1;
}

/// One row: from `pc` (the file's virtual address) to the next row's pc.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Row {
    pub pc: u64,
    pub cfa_offset: i16,
    pub fp_offset: i16,
    pub cfa: u8,
    pub fp: u8,
    /// Where the return address was saved, from the CFA (x86-64: always -8, the call's push);
    /// 0: not saved, still in the link register (x30 of an AArch64 function that calls nothing,
    /// or before its prologue): only the innermost frame can be there.
    pub ra_offset: i16,
}
const _: () = assert!(size_of::<Row>() == 16);

/// An executable mapping: runtime address = file virtual address + `bias`. `rows` = 0: no
/// table (walked with frame pointers).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    pub bias: u64,
    pub first_row: u32,
    pub rows: u32,
}
const _: () = assert!(size_of::<Mapping>() == 32);

/// A process's executable mappings, sorted by start.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ProcessMappings {
    pub count: u32,
    /// Set by the walker when a pc fell outside every mapping (a library loaded since, or
    /// a mapping gone) and it asked user space to capture the process again; a fresh value
    /// from user space clears it, so that is asked once per version.
    pub missed: u32,
    /// Different in every value user space gives (of any process): a stack walked with one
    /// version is walked the same with it while the stack's words are the same (`StackReuse`).
    /// The rows a version's mappings point at stay until the process stops mapping their file.
    pub version: u64,
    pub mappings: [Mapping; MAX_MAPPINGS],
}
const _: () = assert!(size_of::<ProcessMappings>() == 16 + 32 * MAX_MAPPINGS);

/// Stack words a walk may read and still be reused (`StackReuse`): eleven frames on x86-64
/// (a return address and a saved frame pointer each), more where frames save no pointer.
pub const REUSE_READS: usize = 24;
/// Bytes above the stack pointer the words of a reusable walk lie in: read back at once.
pub const REUSE_SPAN: usize = 2048;
/// The `ProcessMappings::version` of a process's mappings given again, unchanged, just before
/// its interpreter (user space numbers every other version from 1): a walk made under it may have
/// passed natively through an evaluation loop the walker is about to know, so it is never kept.
pub const VERSION_UNKEPT: u64 = 0;
/// `StackReuse::reads` of a walk that cannot be reused: it read more words, or one out of the
/// span, or Python's frames (the interpreter's memory, not the stack).
pub const NOT_REUSABLE: u32 = u32::MAX;

/// The user registers a walk starts from.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WalkStart {
    pub ip: u64,
    pub sp: u64,
    pub fp: u64,
    pub lr: u64,
}
const _: () = assert!(size_of::<WalkStart>() == 32);

/// A walk's inputs besides the tables: its registers and each stack word it read (at `read_at`
/// bytes above `from.sp`). Per thread (in its `TaskSched`), the last off-CPU walk that reached the
/// stack's end: a thread that goes to sleep again with the same registers, in the same process
/// with the same mappings (`version`), in the same epoch, and whose words all read the same, has
/// the same stack (the walk is a function of exactly these), so its id is taken again.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct StackReuse {
    pub from: WalkStart,
    pub version: u64,
    pub tgid: u32,
    pub generation: u32,
    pub stack_id: i32,
    /// Words logged (`NOT_REUSABLE`: the walk cannot be reused).
    pub reads: u32,
    /// Bytes from `from.sp` through the highest word read.
    pub span: u32,
    pub _pad: u32,
    pub read_at: [u16; REUSE_READS],
    pub read_value: [u64; REUSE_READS],
}
const _: () = assert!(size_of::<StackReuse>() == 64 + 2 * REUSE_READS + 8 * REUSE_READS);

/// A walk in progress (per CPU): the registers of the frame being stepped, and the stack so
/// far (stored as it is once the walk ends).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Walk {
    pub ip: u64,
    pub sp: u64,
    pub fp: u64,
    /// The link register (AArch64 x30) while the innermost frame is stepped; 0 after it, and
    /// always on x86-64.
    pub lr: u64,
    pub tgid: u32,
    pub tid: u32,
    /// Python (see `python`): the next interpreter frame to put in the stack, or in `SEARCH`
    /// the next thread state to look at; `python::NOT_LOOKED` until the thread's state was
    /// looked for, `python::NO_MORE` once there are no more.
    pub py_frame: u64,
    /// The evaluation loop's own frame while its Python frames are put in its place: kept if
    /// none can be.
    pub py_eval: u64,
    /// `python::mode`.
    pub py_mode: u32,
    /// Thread states looked at (`python::PY_THREADS_SEARCHED`).
    pub py_searched: u32,
    /// Native frames stepped so far (the stack's length counts Python frames too, and not the
    /// evaluation loop's they stand for).
    pub native: u32,
    /// The walked thread's tid in its process's pid namespace (what its thread state holds),
    /// once looked for.
    pub py_tid: u32,
    /// 1 when the innermost pc was in none of the process's mappings given to the walker: its
    /// map changed since (a library just loaded), and the stack was cut there. A walk worth
    /// doing again where the same user registers can still be read (a wait's end).
    pub stale: u32,
    /// With `OFFCPU_REUSE_CHECK`: the stack id reuse would have given this walk (-1: none).
    pub expect: i32,
    /// The walk's registers and the stack words it read, kept in the thread's `TaskSched`.
    pub reuse: StackReuse,
    pub stack: UserStack,
}
const _: () = assert!(size_of::<Walk>() == 80 + size_of::<StackReuse>() + size_of::<UserStack>());

/// The slot user space puts at the outer end of a stack the walker truncated (its outermost
/// frames were not kept): the frame that says so in every report, with how many were lost
/// where that is known (`truncated_slot`); this one where it is not.
pub const TRUNCATED_SLOT: u64 = u64::MAX;

/// The truncation slots: the top 32 bits set (no Python frame has: its offset field is never
/// all ones), the low 32 bits `UserStack::lost`. (No user address has bit 63 either; a garbage
/// one that does is cut by user space where it reads the stack.)
const TRUNCATED_BASE: u64 = 0xffff_ffff << 32;

/// `UserStack::lost`'s top bit: the walk ran out of runs before the stack's end, so at least
/// that many frames were lost.
pub const LOST_AT_LEAST: u32 = 1 << 31;

/// The truncation slot of a stack that lost `lost` frames (`UserStack::lost`).
#[inline(always)]
pub fn truncated_slot(lost: u32) -> u64 {
    match lost {
        0 => TRUNCATED_SLOT,
        lost => TRUNCATED_BASE | lost as u64,
    }
}

/// Whether `slot` is a truncation slot, and the frames it says were lost: `Some(None)` where
/// that is not known, `Some(Some((count, at_least)))` where it is.
#[inline(always)]
pub fn truncation(slot: u64) -> Option<Option<(u32, bool)>> {
    if slot >> 32 != TRUNCATED_BASE >> 32 {
        return None;
    }
    let lost = slot as u32;
    Some((slot != TRUNCATED_SLOT && lost != 0).then_some((lost & !LOST_AT_LEAST, lost & LOST_AT_LEAST != 0)))
}

/// Whether a user stack's slot is an address: not a Python frame (`python`), not the
/// truncation mark (both have the top bit set, which no user address has).
#[inline(always)]
pub fn is_address(slot: u64) -> bool {
    slot >> 63 == 0
}

/// Why a walk ended.
pub mod stop {
    pub const WALKING: u32 = 0;
    /// Reached the outermost frame (clean end).
    pub const END: u32 = 1;
    /// Frames were lost: walked past the `MAX_FRAMES` kept (`UserStack::lost` says how many),
    /// or the walk ran out of runs.
    pub const TRUNCATED: u32 = 2;
    /// A return address could not be read, or led nowhere (frame pointer chain ended).
    pub const FAILED: u32 = 3;
    /// Not an end: the walk reached Python's evaluation loop, whose Python frames come next
    /// (only while a run of the walker lasts).
    pub const PYTHON: u32 = 4;
}

/// A table-unwound stack as stored: the full hash (the map key is its low bits), the
/// frames, and how the walk ended.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct UserStack {
    pub hash: u64,
    pub len: u32,
    pub stop: u32,
    /// Frames walked past the last kept (`MAX_FRAMES`): counted to the stack's end, or with
    /// `LOST_AT_LEAST` where the walk ran out of runs first.
    pub lost: u32,
    pub _pad: u32,
    pub frames: [u64; MAX_FRAMES],
}
const _: () = assert!(size_of::<UserStack>() == 24 + 8 * MAX_FRAMES);
