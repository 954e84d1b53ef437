//! CPython frames in table walks (see `profiler_common::python`): where the native walk reaches
//! the evaluation loop, the Python frames its activation runs are put in its place, one per
//! step of the walk, from the walked thread's own thread state.
use aya_ebpf::{
    bindings::bpf_pidns_info,
    helpers::{bpf_get_ns_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_user},
    macros::map,
    maps::{HashMap, LruHashMap, PerCpuArray},
};
use profiler_common::{
    python::{
        mode, model, py_frame, PyOffsets, PyProcess, NOT_LOOKED, NO_CFRAME, NO_MORE, OWNED_BY_CSTACK,
        PY_ANNOUNCES_PER_WINDOW, PY_ANNOUNCE_WINDOW_NS, PY_CODES_SEEN, PY_NO_OFFSET, PY_PROCESSES,
        PY_THREADS, PY_THREADS_SEARCHED,
    },
    unwind::{stop, Walk},
    HealthCounter, ProcessEventKind,
};

use crate::{health::bump, sampling::announce_value, unwind::push};

/// Per process, its interpreter (user space gives it with the process's tables).
#[map(name = "PY_PROCESSES")]
static PY_PROCESSES_MAP: HashMap<u32, PyProcess> = HashMap::with_max_entries(PY_PROCESSES, 0);

/// Per thread, its thread state as last found (checked against the tid before each use).
#[map(name = "PY_THREADS")]
static PY_THREADS_MAP: LruHashMap<u32, u64> = LruHashMap::with_max_entries(PY_THREADS, 0);

/// Per CPU, the code objects announced lately (see `PY_CODES_SEEN`).
#[map(name = "PY_CODES_SEEN")]
static PY_CODES_SEEN_MAP: PerCpuArray<u64> = PerCpuArray::with_max_entries(PY_CODES_SEEN + 2, 0);

/// The slots past the remembered code objects: the current announcement window, and how many
/// were announced in it.
const WINDOW: u32 = PY_CODES_SEEN;
const ANNOUNCED: u32 = PY_CODES_SEEN + 1;

/// Tell user space about a code object this CPU has not put in a stack lately, so it is named
/// while it exists (a module's top-level code, run once, is freed soon after).
#[inline(always)]
fn note_code(tgid: u32, code: u64) {
    let key = code ^ ((tgid as u64) << 48);
    let slot = ((code >> 4) ^ (code >> 17) ^ tgid as u64) as u32 & (PY_CODES_SEEN - 1);
    if let Some(seen) = PY_CODES_SEEN_MAP.get_ptr_mut(slot) {
        let seen = unsafe { &mut *seen };
        if *seen != key && may_announce() {
            *seen = key;
            announce_value(tgid, ProcessEventKind::PythonCode, code);
        }
    }
}

/// Whether this CPU may announce one more code object in the current window (the drain names
/// the others): a burst of new code, or processes thrashing the memory of them, must not fill
/// the ring new processes are announced through.
#[inline(always)]
fn may_announce() -> bool {
    let (Some(window), Some(announced)) = (
        PY_CODES_SEEN_MAP.get_ptr_mut(WINDOW),
        PY_CODES_SEEN_MAP.get_ptr_mut(ANNOUNCED),
    ) else {
        return false;
    };
    let now = unsafe { bpf_ktime_get_ns() } / PY_ANNOUNCE_WINDOW_NS;
    let (window, announced) = unsafe { (&mut *window, &mut *announced) };
    if *window != now {
        *window = now;
        *announced = 0;
    }
    *announced += 1;
    *announced <= PY_ANNOUNCES_PER_WINDOW
}

/// The process's interpreter, if it has one the walker knows.
#[inline(always)]
pub fn interpreter(tgid: u32) -> Option<&'static PyProcess> {
    PY_PROCESSES_MAP.get_ptr(tgid).map(|p| unsafe { &*p })
}

/// Its tables are gone (exit, exec): so is its interpreter.
#[inline(always)]
pub fn forget_process(tgid: u32) {
    let _ = PY_PROCESSES_MAP.remove(tgid);
}

/// Where the process's evaluation loop is, as (start, length): empty where it has none.
#[inline(always)]
pub fn eval_range(py: Option<&PyProcess>) -> EvalRange {
    match py {
        Some(py) => (py.eval_start, py.eval_end.wrapping_sub(py.eval_start)),
        None => (0, 0),
    }
}

pub type EvalRange = (u64, u64);

/// Whether `pc` is in the evaluation loop. (One comparison: each more in the native step, which
/// every walker unrolls, costs the verifier a third of its budget; the loop's split-off `.cold`
/// part is not looked for.)
#[inline(always)]
pub fn in_eval(eval: &EvalRange, pc: u64) -> bool {
    pc.wrapping_sub(eval.0) < eval.1
}

/// The frame at `pc` (as looked up) is the evaluation loop's: the walk puts the activation's
/// Python frames in its place next (its own frame `ip` kept aside in case none can be read).
#[inline(always)]
pub fn enter(walk: &mut Walk) {
    walk.py_eval = walk.ip;
    walk.py_mode = mode::FRAMES;
}

/// The evaluation loop's frame was stepped (`entered`): the native steps of this run end here,
/// the Python frames come first in the next. Where the step ended the walk, the loop's own frame
/// is kept instead (the Python frames would have no native frames after them).
#[inline(always)]
pub fn stepped_eval(walk: &mut Walk) {
    if walk.stack.stop == stop::WALKING {
        walk.stack.stop = stop::PYTHON;
    } else {
        end_activation(walk);
    }
}

/// One step of the Python part of a walk: a thread state looked at, or a frame put in the stack.
#[inline(always)]
pub fn step(walk: &mut Walk, py: Option<&PyProcess>) {
    let Some(py) = py else {
        end_activation(walk);
        return;
    };
    let done = match (walk.py_mode, walk.py_frame) {
        (mode::SEARCH, _) | (_, NOT_LOOKED) => search(walk, py),
        _ => frame(walk, py),
    };
    if done.is_err() {
        bump(match entering(walk, py) {
            true => HealthCounter::PythonEntering,
            false => HealthCounter::PythonCut,
        });
        walk.py_frame = NO_MORE;
        end_activation(walk);
    }
}

/// A read failed at the first Python frame of a stack whose innermost function is the
/// evaluation loop, on an interpreter whose thread points at the loop's C frame (3.11, 3.12):
/// that loop sets the pointer a few instructions before it writes the frame there, and a sample
/// between them reads a stale word.
#[inline(always)]
fn entering(walk: &Walk, py: &PyProcess) -> bool {
    walk.py_mode == mode::FRAMES
        && walk.py_eval != 0
        && walk.stack.len == 0
        && py.offsets.cframe_frame != NO_CFRAME
}

#[inline(always)]
fn read<T>(at: u64) -> Result<T, ()> {
    unsafe { bpf_probe_read_user(at as *const T) }.map_err(|_| ())
}

/// Look at one thread state: the walked thread's, its current frame is where `FRAMES` starts.
/// First the one found for the thread before, else the interpreter's first and on.
#[inline(always)]
fn search(walk: &mut Walk, py: &PyProcess) -> Result<(), ()> {
    let o = &py.offsets;
    if walk.py_frame == NOT_LOOKED {
        walk.py_searched = 0;
        walk.py_mode = mode::SEARCH;
        walk.py_tid = tid_in_namespace(py, walk.tid);
        if let Some(&cached) = unsafe { PY_THREADS_MAP.get(walk.tid) } {
            if native_id(cached, o) == Ok(walk.py_tid as u64) {
                return found(walk, py, cached);
            }
            let _ = PY_THREADS_MAP.remove(walk.tid);
        }
        walk.py_frame = first_thread(py)?;
        return Ok(());
    }
    let tstate = walk.py_frame;
    walk.py_searched += 1;
    // A state whose thread cannot be read (3.10's made for a thread not started yet holds no
    // `pthread_t`) is not the thread's: the search goes on.
    if native_id(tstate, o) == Ok(walk.py_tid as u64) {
        let _ = PY_THREADS_MAP.insert(walk.tid, tstate, 0);
        return found(walk, py, tstate);
    }
    let next: u64 = read(tstate + o.tstate_next as u64)?;
    if next == 0 || walk.py_searched >= PY_THREADS_SEARCHED {
        return Err(());
    }
    walk.py_frame = next;
    Ok(())
}

/// The tid of the thread whose state is `tstate`: held there (3.11 and later), or in the C
/// library's descriptor of the thread its `pthread_t` points at (3.10).
#[inline(always)]
fn native_id(tstate: u64, o: &PyOffsets) -> Result<u64, ()> {
    let id: u64 = read(tstate + o.tstate_native_id as u64)?;
    match (o.pthread_tid, id) {
        (0, id) => Ok(id),
        (_, 0) => Err(()),
        (at, id) => read::<u32>(id.wrapping_add(at as u64)).map(u64::from),
    }
}

/// The walked thread's (the current task's) tid in the process's pid namespace: a container's
/// process sees its own tids, and its thread states hold them. The global tid where the
/// namespace is unknown or the kernel cannot say.
#[inline(always)]
fn tid_in_namespace(py: &PyProcess, tid: u32) -> u32 {
    if py.pidns_ino == 0 {
        return tid;
    }
    let mut info = bpf_pidns_info { pid: 0, tgid: 0 };
    let size = core::mem::size_of::<bpf_pidns_info>() as u32;
    match unsafe { bpf_get_ns_current_pid_tgid(py.pidns_dev, py.pidns_ino, &mut info, size) } {
        0 => info.pid,
        _ => tid,
    }
}

/// The thread's state is `tstate`: its Python frames start at its current frame.
#[inline(always)]
fn found(walk: &mut Walk, py: &PyProcess, tstate: u64) -> Result<(), ()> {
    let o = &py.offsets;
    let mut current: u64 = read(tstate + o.tstate_frame as u64)?;
    if o.cframe_frame != NO_CFRAME && current != 0 {
        current = read(current + o.cframe_frame as u64)?;
    }
    walk.py_frame = if current == 0 { NO_MORE } else { current };
    walk.py_mode = mode::FRAMES;
    Ok(())
}

/// The interpreter's first thread state (the most recent interpreter's: the main one unless
/// subinterpreters were made, whose threads are then not found).
#[inline(always)]
fn first_thread(py: &PyProcess) -> Result<u64, ()> {
    let interp: u64 = read(py.runtime + py.offsets.runtime_interpreters as u64)?;
    let first: u64 = read(interp + py.offsets.interp_threads as u64)?;
    match first {
        0 => Err(()),
        first => Ok(first),
    }
}

/// Put the next frame of the activation in the stack; the activation ends at its entry frame.
#[inline(always)]
fn frame(walk: &mut Walk, py: &PyProcess) -> Result<(), ()> {
    let o = &py.offsets;
    let at = walk.py_frame;
    if at == NO_MORE {
        end_activation(walk);
        return Ok(());
    }
    let previous: u64 = read(at + o.frame_previous as u64)?;
    // 3.10's frames have no marker: every one ends its activation.
    let marker: u8 = match o.model {
        model::ONE_FRAME => 0,
        _ => read(at + o.frame_marker as u64)?,
    };
    let next = if previous == 0 { NO_MORE } else { previous };
    if o.model == model::CSTACK_FRAME && marker == OWNED_BY_CSTACK {
        walk.py_frame = next;
        end_activation(walk);
        return Ok(());
    }
    let code: u64 = read(at + o.frame_code as u64)?;
    let offset = match o.model {
        // An index of 2-byte units into the bytecode; -1 before the first instruction, which
        // CPython gives the function's first line.
        model::ONE_FRAME => match read::<i32>(at + o.frame_instr as u64)? {
            lasti if lasti < 0 => PY_NO_OFFSET,
            lasti => lasti as u64 * 2,
        },
        _ => read::<u64>(at + o.frame_instr as u64)?.wrapping_sub(code),
    };
    push(walk, py_frame(code, offset));
    bump(HealthCounter::PythonFrames);
    note_code(walk.tgid, code);
    walk.py_eval = 0;
    walk.py_frame = next;
    if next == NO_MORE || o.model == model::ONE_FRAME || (o.model == model::ENTRY_FLAG && marker != 0) {
        end_activation(walk);
    }
    Ok(())
}

/// Past the activation's frames, where the evaluation loop returns to: under `python -X perf`
/// (3.12+) that is a copy of CPython's perf trampoline in anonymous memory (`sub $8,%rsp; call
/// *%rcx; add $8,%rsp; ret` on x86-64), which keeps no frame pointer: it is stepped over by its
/// one fixed rule (its caller's return address 8 bytes above, the stack 16 bytes up), known by
/// its whole code around the return address. Its perf-map name would only repeat the Python
/// frame's. (AArch64's trampoline keeps a frame record: the frame-pointer step walks it.)
#[cfg(bpf_target_arch = "x86_64")]
#[inline(always)]
pub fn past_trampoline(walk: &mut Walk) {
    // The trampoline's bytes from `sub` to `ret`: the return address is past the call's 6th.
    const TRAMPOLINE: [u8; 11] = [0x48, 0x83, 0xec, 0x08, 0xff, 0xd1, 0x48, 0x83, 0xc4, 0x08, 0xc3];
    const CALL_END: u64 = 6;
    if read::<[u8; 11]>(walk.ip.wrapping_sub(CALL_END)) != Ok(TRAMPOLINE) {
        return;
    }
    match read::<u64>(walk.sp.wrapping_add(8)) {
        Ok(caller) => {
            walk.ip = caller;
            walk.sp = walk.sp.wrapping_add(16);
        }
        Err(()) => walk.stack.stop = stop::FAILED,
    }
}

#[cfg(not(bpf_target_arch = "x86_64"))]
#[inline(always)]
pub fn past_trampoline(_walk: &mut Walk) {}

/// Back to native frames; the evaluation loop's own frame is kept if no Python frame stood for
/// it.
#[inline(always)]
fn end_activation(walk: &mut Walk) {
    walk.py_mode = mode::NATIVE;
    if walk.py_eval != 0 {
        let eval = walk.py_eval;
        walk.py_eval = 0;
        push(walk, eval);
    }
}
