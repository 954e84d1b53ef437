//! Lock mode: per (process, lock, stack) the contended waits, and per (lock, stack) the wait
//! its holders or releasers caused. Three sources fill the same maps: futex syscalls, pthread
//! probes and the kernel's lock tracepoints.
use aya_ebpf::{
    macros::map,
    maps::{HashMap, StackTrace},
};
use profiler_common::{
    lock::{LockKey, LockTime, NO_STACK, WAIT_ENTRIES},
    HealthCounter, STACK_MAP_ENTRIES,
};

use crate::{atomic::atomic_add, health::bump};

pub mod futex;
pub mod kernel;
pub mod pthread;

#[map(name = "LOCK_WAITERS")]
static LOCK_WAITERS: HashMap<LockKey, LockTime> = HashMap::with_max_entries(WAIT_ENTRIES, 0);
#[map(name = "LOCK_HOLDERS")]
static LOCK_HOLDERS: HashMap<LockKey, LockTime> = HashMap::with_max_entries(WAIT_ENTRIES, 0);
#[map(name = "LOCK_STACKS")]
static LOCK_STACKS: StackTrace = StackTrace::with_max_entries(STACK_MAP_ENTRIES, 0);

/// Count one wait of `wait` ns under `key`.
#[inline(always)]
fn add(map: &HashMap<LockKey, LockTime>, key: LockKey, wait: u64) {
    if let Some(time) = map.get_ptr_mut(key) {
        unsafe {
            atomic_add(&mut (*time).count, 1);
            atomic_add(&mut (*time).total_ns, wait);
            // Racy between CPUs, and only ever low by a concurrent wait.
            if wait > (*time).max_ns {
                (*time).max_ns = wait;
            }
        }
        return;
    }
    let time = LockTime {
        count: 1,
        total_ns: wait,
        max_ns: wait,
    };
    // BPF_NOEXIST: a concurrent insert of the same key wins; add to it instead.
    if map.insert(key, time, 1).is_err() {
        match map.get_ptr_mut(key) {
            Some(existing) => unsafe {
                atomic_add(&mut (*existing).count, 1);
                atomic_add(&mut (*existing).total_ns, wait);
            },
            None => {
                bump(HealthCounter::LockMapFull);
                kernel_log!("lock map full: a wait of {} ns not recorded", wait);
            }
        }
    }
}

/// A thread that exits in a wait (killed) leaves no entry behind.
#[inline(always)]
pub fn forget_thread(tgid: u32, tid: u32) {
    futex::forget_thread(tid);
    pthread::forget_thread(tgid, tid);
}
