//! CPython frames in walked user stacks. User space finds a process's interpreter (its
//! `_PyEval_EvalFrameDefault` and `_PyRuntime`, and the layout of its version) and gives it to
//! the walker as a [`PyProcess`]. Where the native walk reaches a frame of the evaluation loop,
//! the walker puts the Python frames that activation runs in its place, innermost first, read
//! from the thread's own interpreter frames, then goes on natively from the loop's caller.
//!
//! A Python frame is one stack slot: [`PY_FRAME`] set (no user address has it), the code
//! object's address in the low 48 bits, and where in the code object the frame was (its current
//! instruction's address less the code object's, in bytes) in the 15 bits between; user space
//! reads the code object's names and line table from the process.
use core::mem::size_of;

/// Marks a stack slot as a Python frame.
pub const PY_FRAME: u64 = 1 << 63;
/// The code object's address: the low 48 bits.
pub const PY_CODE_MASK: u64 = (1 << 48) - 1;
/// The instruction's place in the code object, in bytes: 15 bits above the address. Where it
/// does not fit, the field holds `PY_NO_OFFSET`. The field's all-ones value is no offset's:
/// a slot with the top 16 bits set is a truncation mark (`unwind::truncation`), never a Python
/// frame, whatever its code object's address (on arm64 a user address may fill all 48 bits).
pub const PY_OFFSET_SHIFT: u32 = 48;
const PY_OFFSET_FIELD: u64 = (1 << 15) - 1;
pub const PY_NO_OFFSET: u64 = PY_OFFSET_FIELD - 1;

/// One Python frame's stack slot.
#[inline(always)]
pub fn py_frame(code: u64, offset: u64) -> u64 {
    let offset = if offset < PY_NO_OFFSET {
        offset
    } else {
        PY_NO_OFFSET
    };
    PY_FRAME | (offset << PY_OFFSET_SHIFT) | (code & PY_CODE_MASK)
}

/// A slot's (code object, offset), if it is a Python frame.
#[inline(always)]
pub fn py_frame_parts(slot: u64) -> Option<(u64, u64)> {
    let offset = (slot >> PY_OFFSET_SHIFT) & PY_OFFSET_FIELD;
    let frame = slot & PY_FRAME != 0 && offset != PY_OFFSET_FIELD;
    frame.then_some((slot & PY_CODE_MASK, offset))
}

/// How the interpreter chains its frames.
pub mod model {
    /// 3.11: `_PyInterpreterFrame`s; an activation's first frame is marked `is_entry` (a byte).
    pub const ENTRY_FLAG: u8 = 1;
    /// 3.12 and later: an activation pushes a frame of its own, owned by the C stack (`owner`
    /// byte equal to `CSTACK`), before the frames it runs.
    pub const CSTACK_FRAME: u8 = 2;
    /// 3.10: `PyFrameObject`s chained by `f_back`, one an activation; the instruction is an
    /// index (`f_lasti`, an `int` counting 2-byte code units), not a pointer.
    pub const ONE_FRAME: u8 = 3;
}

/// `FRAME_OWNED_BY_CSTACK` (3.12, 3.13).
pub const OWNED_BY_CSTACK: u8 = 3;

/// Where the walker reads what it needs, in bytes from the start of each structure.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PyOffsets {
    /// `_PyRuntimeState.interpreters.head`.
    pub runtime_interpreters: u16,
    /// `PyInterpreterState.threads.head`.
    pub interp_threads: u16,
    /// `PyThreadState.next`.
    pub tstate_next: u16,
    /// `PyThreadState.native_thread_id` (the thread's tid), or where `pthread_tid` is set,
    /// `thread_id` (its `pthread_t`: 3.10).
    pub tstate_native_id: u16,
    /// `PyThreadState.cframe` (3.11, 3.12) or `current_frame` (3.13).
    pub tstate_frame: u16,
    /// `_PyCFrame.current_frame`, or `NO_CFRAME` where the thread state points at the frame.
    pub cframe_frame: u16,
    /// `_PyInterpreterFrame`'s code object, previous frame, current instruction pointer and the
    /// byte that ends an activation (`is_entry` or `owner`, by `model`).
    pub frame_code: u16,
    pub frame_previous: u16,
    pub frame_instr: u16,
    pub frame_marker: u16,
    /// Where the thread state holds a `pthread_t` (3.10): the tid's place in the C library's
    /// thread descriptor (glibc's `struct pthread`); 0 where it holds the tid itself.
    pub pthread_tid: u16,
    pub model: u8,
    pub _pad: [u8; 1],
}
const _: () = assert!(size_of::<PyOffsets>() == 24);

/// `PyOffsets::cframe_frame` where there is no `_PyCFrame` (3.13).
pub const NO_CFRAME: u16 = u16::MAX;

/// A process's interpreter: where its evaluation loop's code is and its runtime state, as
/// mapped into that process.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PyProcess {
    pub eval_start: u64,
    pub eval_end: u64,
    pub runtime: u64,
    /// The process's pid namespace (`/proc/PID/ns/pid`: device and inode): thread states hold
    /// the tid the thread has there.
    pub pidns_dev: u64,
    pub pidns_ino: u64,
    pub offsets: PyOffsets,
}
const _: () = assert!(size_of::<PyProcess>() == 64);

/// Processes with an interpreter the walker knows.
pub const PY_PROCESSES: u32 = 4096;
/// Threads whose thread state was found (a cache: checked again at each use).
pub const PY_THREADS: u32 = 16384;
/// Code objects each CPU announces at most in `PY_ANNOUNCE_WINDOW_NS` (what the drain names
/// anyway): the event ring is shared with new processes' announcements.
pub const PY_ANNOUNCES_PER_WINDOW: u64 = 64;
pub const PY_ANNOUNCE_WINDOW_NS: u64 = 10_000_000;

/// Code objects each CPU remembers having announced (direct-mapped: a slot holds the last one
/// announced of those that fall in it).
pub const PY_CODES_SEEN: u32 = 4096;

/// Python frames (or thread states looked at) per run of a walker, before its native frames.
pub const PY_STEPS_PER_RUN: usize = 16;
/// Thread states looked at to find a thread's own, at most.
pub const PY_THREADS_SEARCHED: u32 = 256;

/// `Walk::py_frame` before the thread's state was looked for.
pub const NOT_LOOKED: u64 = 0;
/// `Walk::py_frame` when there are no more Python frames (or they could not be read).
pub const NO_MORE: u64 = 1;

/// What a walk does with Python frames (`Walk::py_mode`).
pub mod mode {
    /// Native frames.
    pub const NATIVE: u32 = 0;
    /// Putting an activation's Python frames in its place.
    pub const FRAMES: u32 = 1;
    /// Looking for the thread's state among its interpreter's (`Walk::py_frame` is the next
    /// one to look at), before `FRAMES`.
    pub const SEARCH: u32 = 2;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_slot_keeps_its_code_object_and_offset() {
        let slot = py_frame(0x7f12_3456_7890, 0x1a2);
        assert_eq!(py_frame_parts(slot), Some((0x7f12_3456_7890, 0x1a2)));
        assert_eq!(
            py_frame_parts(py_frame(0x1000, 1 << 20)),
            Some((0x1000, PY_NO_OFFSET))
        );
        assert_eq!(py_frame_parts(0x7fff_ffff_f000), None);
        assert_eq!(py_frame_parts(crate::unwind::TRUNCATED_SLOT), None);
    }

    /// A truncation slot says how many frames were lost, and is never a Python frame (nor a
    /// Python frame one: its code object's address is a user one, below bit 47).
    #[test]
    fn truncation_slots_keep_their_count_apart_from_python_frames() {
        use crate::unwind::{truncated_slot, truncation, LOST_AT_LEAST, TRUNCATED_SLOT};
        assert_eq!(truncation(truncated_slot(80)), Some(Some((80, false))));
        assert_eq!(
            truncation(truncated_slot(300 | LOST_AT_LEAST)),
            Some(Some((300, true)))
        );
        assert_eq!(truncation(truncated_slot(0)), Some(None));
        assert_eq!(truncated_slot(0), TRUNCATED_SLOT);
        assert_eq!(truncation(TRUNCATED_SLOT), Some(None));
        for slot in [truncated_slot(1), truncated_slot(u32::MAX >> 1), TRUNCATED_SLOT] {
            assert_eq!(py_frame_parts(slot), None);
        }
        // arm64's user addresses may fill all 48 bits (mmap's at 0xffff_xxxx_xxxx).
        for code in [0x7fff_ffff_ffff, 0xffff_9a3c_1230, 0xffff_ffff_fff0] {
            for offset in [0, 0x7ffd, PY_NO_OFFSET, 1 << 20] {
                let slot = py_frame(code, offset);
                assert_eq!(truncation(slot), None, "{slot:#x}");
                assert_eq!(py_frame_parts(slot), Some((code, offset.min(PY_NO_OFFSET))));
            }
        }
        assert_eq!(truncation(0x7fff_1234_5678), None);
    }
}
