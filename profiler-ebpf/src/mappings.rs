//! A target's code mapped or moved while it runs (a library loaded, text remapped in place onto
//! huge pages or from another file) is announced as the call returns, so that user space reads
//! its memory map again at once: the unwinder has the new file's tables before a stack walks
//! through it, and code replaced in place (the same range, another file or an anonymous copy),
//! which no pc outside the known mappings would reveal, is not named from what was there.
//! Only processes whose map is kept are announced: a named target, or a process already sampled
//! (a machine-wide run's processes are read at their first sample, whatever they mapped before).
use aya_ebpf::{macros::map, maps::LruHashMap, programs::TracePointContext};
use profiler_common::ProcessEventKind;

use crate::{
    sampling::{announce, captured},
    targets::{current_ids, is_named_target},
};

/// `mmap`'s `prot` bit of executable code and its flags (the same on x86-64 and arm64).
const PROT_EXEC: u64 = 4;
const MAP_FIXED: u64 = 0x10;
const MAP_ANONYMOUS: u64 = 0x20;
/// `mremap`'s flag of a move to a given address (what a remapper moving a copy over code does;
/// `realloc` of a large block moves without it).
const MREMAP_FIXED: u64 = 2;

/// Where a `sys_enter_*` tracepoint has its system call's argument `n`, and `sys_exit_*` its
/// return value: after the 8-byte common header and the `int __syscall_nr` padded to 8 (the
/// layout of every system call's tracepoint, on every architecture).
const fn argument(n: usize) -> usize {
    16 + 8 * n
}

/// Threads inside a system call that changes their process's code mappings.
#[map(name = "MAPPING_CALLS")]
static CALLS: LruHashMap<u32, u8> = LruHashMap::with_max_entries(1024, 0);

/// Whether the process's map is kept by user space (see the module's note).
#[inline(always)]
fn watched(tgid: u32) -> bool {
    is_named_target(tgid) || captured(tgid)
}

#[inline(always)]
fn note_call(ctx: &TracePointContext, changes_code: impl FnOnce(&TracePointContext) -> Option<bool>) {
    let (tgid, tid) = current_ids();
    if watched(tgid) && changes_code(ctx) == Some(true) {
        let _ = CALLS.insert(tid, 1, 0);
    }
}

tracepoint! {
/// `mmap(addr, len, prot, flags, fd, off)`: code from a file, or code put over a fixed place.
pub fn mapping_mmap(ctx: TracePointContext) -> u32 {
    note_call(&ctx, |ctx| {
        let prot: u64 = unsafe { ctx.read_at(argument(2)) }.ok()?;
        let flags: u64 = unsafe { ctx.read_at(argument(3)) }.ok()?;
        Some(prot & PROT_EXEC != 0 && (flags & MAP_ANONYMOUS == 0 || flags & MAP_FIXED != 0))
    });
    crate::PASS_ON
}
}

tracepoint! {
/// `mremap(addr, old_len, new_len, flags, new_addr)`: a move over a given place.
pub fn mapping_mremap(ctx: TracePointContext) -> u32 {
    note_call(&ctx, |ctx| {
        let flags: u64 = unsafe { ctx.read_at(argument(3)) }.ok()?;
        Some(flags & MREMAP_FIXED != 0)
    });
    crate::PASS_ON
}
}

tracepoint! {
/// The return of either: announced if it succeeded.
pub fn mapping_done(ctx: TracePointContext) -> u32 {
    let (tgid, tid) = current_ids();
    if unsafe { CALLS.get(tid) }.is_some() {
        let _ = CALLS.remove(tid);
        let ret: i64 = unsafe { ctx.read_at(argument(0)) }.unwrap_or(-1);
        if !(-4095..0).contains(&ret) {
            announce(tgid, ProcessEventKind::MappingsChanged);
        }
    }
    crate::PASS_ON
}
}
