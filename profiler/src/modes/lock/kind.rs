//! What a futex wait was for, from the functions it waited in: a lock another thread held
//! (contention) or an event (a condition variable, a join, a barrier).
use profiler_common::lock::futex_hint;
use serde::Serialize;

use super::WaiterStat;
use crate::cli::Waits;

/// Two different answers: a thread that waits for a lock another thread holds is contention (what
/// an investigation of lock contention is after); one that waits for an event (a condition
/// variable's signal, a thread's exit, a barrier's last arrival) is a thread with nothing to do,
/// however long it waits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum WaitClass {
    Contention,
    #[default]
    Waiting,
}

impl WaitClass {
    pub(super) fn of_kind(kind: &str) -> WaitClass {
        match kind {
            "condvar" | "join" | "barrier" | "park" | "futex" => WaitClass::Waiting,
            _ => WaitClass::Contention,
        }
    }

    /// Whether a view of `waits` carries this class.
    pub fn shown_in(self, waits: Waits) -> bool {
        waits == Waits::All || self == WaitClass::Contention
    }
}

/// What the waiters waited in. A join is told by the kernel (the futex is a thread's
/// `clear_child_tid`); otherwise by the innermost frame that names a lock or wait function (glibc's
/// pthread and semaphore functions, Rust's std and parking_lot), so that a mutex taken again
/// inside `pthread_cond_wait` is a mutex; then by what the wait's arguments say (a PI lock, or a
/// word in glibc's "locked, with waiters" state: a mutex), for stacks cut short or without
/// symbols; else a bare futex wait.
pub(super) fn kind_of(waiters: &[WaiterStat], hints: u32) -> &'static str {
    if hints & futex_hint::JOIN != 0 {
        return "join";
    }
    for waiter in waiters {
        // Frames the C library has no names for (no debug symbols), between the wait and the
        // innermost named function.
        let mut unnamed_below = false;
        for frame in waiter.frames.iter().rev() {
            match kind_of_function(&frame.function) {
                // The mutex `pthread_cond_wait` takes again as it returns, in internal functions
                // a libc without debug symbols cannot name: its futex holds "locked, with
                // waiters" (a condition variable's signal word does not hold 2 in glibc to 2.40).
                Some("condvar") if unnamed_below && hints & futex_hint::LOCK_WORD != 0 => return "mutex",
                Some(kind) => return kind,
                None => unnamed_below |= frame.function.starts_with('[') || frame.is_unknown(),
            }
        }
    }
    if hints & (futex_hint::PI_LOCK | futex_hint::LOCK_WORD) != 0 {
        return "mutex";
    }
    "futex"
}

/// The kind of wait a function is, when its name says.
fn kind_of_function(function: &str) -> Option<&'static str> {
    // C library entry points (and their internal names), by prefix once leading '_' are gone.
    const PREFIXES: [(&str, &str); 14] = [
        ("pthread_mutex", "mutex"),
        ("lll_lock_wait", "mutex"),
        ("lll_clocklock_wait", "mutex"),
        ("pthread_rwlock", "rwlock"),
        ("pthread_cond", "condvar"),
        ("pthread_barrier", "barrier"),
        ("pthread_join", "join"),
        ("pthread_clockjoin", "join"),
        ("pthread_timedjoin", "join"),
        ("pthread_tryjoin", "join"),
        ("sem_", "semaphore"),
        ("new_sem_wait", "semaphore"),
        ("old_sem_wait", "semaphore"),
        ("pthread_spin", "spinlock"),
    ];
    // Rust (std, parking_lot) and C++ (libstdc++ waits on futexes itself for atomics).
    const PATHS: [(&str, &str); 8] = [
        ("::Mutex::lock_contended", "mutex"),
        ("raw_mutex::RawMutex::lock_slow", "mutex"),
        ("::RwLock::", "rwlock"),
        ("raw_rwlock::RawRwLock::", "rwlock"),
        ("::Condvar::wait", "condvar"),
        ("condvar::Condvar::wait", "condvar"),
        ("std::thread::park", "park"),
        ("::JoinInner", "join"),
    ];
    let bare = function.trim_start_matches('_');
    PREFIXES
        .iter()
        .find(|(prefix, _)| bare.starts_with(prefix))
        .or_else(|| PATHS.iter().find(|(path, _)| function.contains(path)))
        .map(|(_, kind)| *kind)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiter(functions: &[&str]) -> WaiterStat {
        WaiterStat {
            frames: functions.iter().map(|f| crate::model::tests::frame(f)).collect(),
            contentions: 1,
            total_wait_ns: 1,
            max_wait_ns: 1,
        }
    }

    #[test]
    fn kind_comes_from_the_library_function_waited_in() {
        let mutex = waiter(&["main", "work", "___pthread_mutex_lock", "__lll_lock_wait"]);
        assert_eq!(kind_of(&[mutex], 0), "mutex");
        let cond = waiter(&[
            "main",
            "consumer",
            "___pthread_cond_wait",
            "__futex_abstimed_wait_common",
        ]);
        assert_eq!(kind_of(&[cond], 0), "condvar");
        // The mutex taken again as the condition variable's wait returns is contention.
        let retaken = waiter(&[
            "consumer",
            "___pthread_cond_wait",
            "__pthread_mutex_cond_lock",
            "__lll_lock_wait",
        ]);
        assert_eq!(kind_of(&[retaken], 0), "mutex");
        // The same without the C library's debug symbols: told by the futex's value.
        let unnamed = || waiter(&["consumer", "pthread_cond_wait", "[unknown]", "[unknown]"]);
        assert_eq!(kind_of(&[unnamed()], futex_hint::LOCK_WORD), "mutex");
        assert_eq!(kind_of(&[unnamed()], 0), "condvar");
        let join = waiter(&["main", "__pthread_clockjoin_ex", "__futex_abstimed_wait_common"]);
        assert_eq!(kind_of(&[join], 0), "join");
        let rust = waiter(&[
            "worker",
            "std::sys::sync::mutex::futex::Mutex::lock_contended",
            "syscall",
        ]);
        assert_eq!(kind_of(&[rust], 0), "mutex");
        assert_eq!(kind_of(&[waiter(&["main", "syscall"])], 0), "futex");
    }

    #[test]
    fn a_cut_stack_is_told_by_what_the_kernel_and_the_arguments_say() {
        let cut = || waiter(&["__futex_abstimed_wait_common"]);
        assert_eq!(kind_of(&[cut()], futex_hint::JOIN), "join");
        // The kernel's word beats a stack: the futex is a thread's clear_child_tid.
        assert_eq!(
            kind_of(
                &[waiter(&["main", "syscall"])],
                futex_hint::JOIN | futex_hint::LOCK_WORD
            ),
            "join"
        );
        assert_eq!(kind_of(&[cut()], futex_hint::LOCK_WORD), "mutex");
        assert_eq!(kind_of(&[cut()], futex_hint::PI_LOCK), "mutex");
        assert_eq!(kind_of(&[cut()], 0), "futex");
    }

    #[test]
    fn contention_and_waiting_for_events_are_apart() {
        for kind in ["mutex", "rwlock", "spinlock", "semaphore", "rwsem:R", "rtmutex"] {
            assert_eq!(WaitClass::of_kind(kind), WaitClass::Contention, "{kind}");
        }
        for kind in ["condvar", "join", "barrier", "futex", "park"] {
            assert_eq!(WaitClass::of_kind(kind), WaitClass::Waiting, "{kind}");
        }
        assert!(WaitClass::Waiting.shown_in(Waits::All));
        assert!(!WaitClass::Waiting.shown_in(Waits::Contention));
        assert!(WaitClass::Contention.shown_in(Waits::Contention));
    }
}
