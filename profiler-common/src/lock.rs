//! Lock mode: waits by lock and stack, and the stacks that held the locks meanwhile, from one of
//! three sources (futex syscalls, pthread probes, kernel lock tracepoints).
use core::mem::size_of;

pub const WAIT_ENTRIES: u32 = 16 * 1024;
pub const WAKE_ENTRIES: u32 = 16 * 1024;
/// Locks whose holder and waiters the pthread source follows at once (LRU).
pub const STATE_ENTRIES: u32 = 16 * 1024;

/// -EFAULT, a stack id for "no stack (yet)", as the stack helper says for a kernel thread's
/// user stack.
pub const NO_STACK: i32 = -14;

/// `futex(2)` operations (the command bits of `op`).
pub mod futex {
    pub const CMD_MASK: u64 = 0x7f;
    pub const WAIT: u64 = 0;
    pub const WAKE: u64 = 1;
    pub const WAKE_OP: u64 = 5;
    pub const LOCK_PI: u64 = 6;
    pub const UNLOCK_PI: u64 = 7;
    pub const WAIT_BITSET: u64 = 9;
    pub const WAKE_BITSET: u64 = 10;
    pub const LOCK_PI2: u64 = 13;
    /// The operation puts the caller to sleep until the futex is released.
    pub const fn waits(cmd: u64) -> bool {
        matches!(cmd, WAIT | WAIT_BITSET | LOCK_PI | LOCK_PI2)
    }
    /// The operation releases waiters of the futex.
    pub const fn wakes(cmd: u64) -> bool {
        matches!(cmd, WAKE | WAKE_BITSET | WAKE_OP | UNLOCK_PI)
    }
}

/// Futex source: what a wait's own arguments and the kernel say it is, where its stack may not
/// (one cut short, or one in a binary without symbols). Recorded per wait in `LockKey::flags`.
pub mod futex_hint {
    /// The futex is a thread's `clear_child_tid` (glibc: `&pd->tid`), which the kernel clears and
    /// wakes when that thread exits: the waiter is joining it.
    pub const JOIN: u32 = 1 << 0;
    /// A priority-inheritance lock (`FUTEX_LOCK_PI`): a mutex.
    pub const PI_LOCK: u32 = 1 << 1;
    /// It slept while the word read 2, the "locked, with waiters" state of glibc's low-level lock
    /// (every mutex) and of Rust's std mutex.
    pub const LOCK_WORD: u32 = 1 << 2;
}

/// Offsets in `task_struct` (from BTF) the futex source reads at thread creation: where the
/// new thread's `clear_child_tid` is (see `futex_hint::JOIN`), and its process id.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThreadOffsets {
    /// `u32::MAX`: unknown (joins are then told from their stacks only).
    pub clear_child_tid: u32,
    pub tgid: u32,
    pub pid: u32,
    pub _pad: u32,
}
const _: () = assert!(size_of::<ThreadOffsets>() == 16);

/// Threads whose exit a joiner may wait for (per `LockId` of their `clear_child_tid`).
pub const JOINABLE_ENTRIES: u32 = 16 * 1024;

/// pthread source: what the probed function does to the lock. The attach cookie of each
/// probe carries it with where the lock's address is and how far the stack pointer has moved
/// at the probed instruction (probes sit a few instructions in, on one the kernel emulates,
/// rather than on the first, which it would single-step).
pub mod call {
    pub const MUTEX_LOCK: u32 = 0;
    pub const MUTEX_TIMEDLOCK: u32 = 1;
    pub const MUTEX_TRYLOCK: u32 = 2;
    pub const RWLOCK_RDLOCK: u32 = 3;
    pub const RWLOCK_WRLOCK: u32 = 4;
    pub const MUTEX_UNLOCK: u32 = 5;
    pub const RWLOCK_UNLOCK: u32 = 6;
    /// Releases the mutex (second argument) while it waits, takes it again before returning.
    pub const COND_WAIT: u32 = 7;
    pub const MUTEX_DESTROY: u32 = 8;
    pub const RWLOCK_DESTROY: u32 = 9;

    /// The call may block until another thread releases the lock.
    pub const fn waits(kind: u32) -> bool {
        matches!(kind, MUTEX_LOCK | MUTEX_TIMEDLOCK | RWLOCK_RDLOCK | RWLOCK_WRLOCK)
    }
    /// Returning 0, the call holds the lock.
    pub const fn acquires(kind: u32) -> bool {
        waits(kind) || matches!(kind, MUTEX_TRYLOCK | COND_WAIT)
    }
    pub const fn releases(kind: u32) -> bool {
        matches!(kind, MUTEX_UNLOCK | RWLOCK_UNLOCK | COND_WAIT)
    }
    pub const fn destroys(kind: u32) -> bool {
        matches!(kind, MUTEX_DESTROY | RWLOCK_DESTROY)
    }

    /// Registers an argument can be found in at a probe, as numbered in the cookie. On AArch64
    /// the number is the register's own (x0..x30): the first four arguments, x0..x3, have the
    /// numbers of their x86-64 counterparts here.
    pub mod reg {
        pub const RDI: u32 = 0;
        pub const RSI: u32 = 1;
        pub const RDX: u32 = 2;
        pub const RCX: u32 = 3;
        pub const R8: u32 = 4;
        pub const R9: u32 = 5;
        pub const RAX: u32 = 6;
        pub const RBX: u32 = 7;
        pub const R10: u32 = 8;
        pub const R11: u32 = 9;
        pub const R12: u32 = 10;
        pub const R13: u32 = 11;
        pub const R14: u32 = 12;
        pub const R15: u32 = 13;
    }

    /// kind in bits 0..8, register in 8..16, stack bytes pushed in 16..32.
    pub const fn cookie(kind: u32, register: u32, pushed: u32) -> u64 {
        (kind as u64 & 0xff) | (register as u64 & 0xff) << 8 | (pushed as u64 & 0xffff) << 16
    }
    pub const fn kind(cookie: u64) -> u32 {
        (cookie & 0xff) as u32
    }
    pub const fn register(cookie: u64) -> u32 {
        (cookie >> 8 & 0xff) as u32
    }
    pub const fn pushed(cookie: u64) -> u32 {
        (cookie >> 16 & 0xffff) as u32
    }
}

/// `lock:contention_begin` flags (kernel source).
pub mod kernel {
    pub const SPIN: u32 = 1 << 0;
    pub const READ: u32 = 1 << 1;
    pub const WRITE: u32 = 1 << 2;
    pub const RT: u32 = 1 << 3;
    pub const PERCPU: u32 = 1 << 4;
    pub const MUTEX: u32 = 1 << 5;

    /// The lock's type from the flags of all its waits (readers and writers of one rwsem
    /// wait with different flags).
    pub const fn lock_kind(flags: u32) -> &'static str {
        let rw = flags & (READ | WRITE) != 0;
        if flags & PERCPU != 0 {
            "pcpu-sem"
        } else if flags & SPIN != 0 {
            if rw {
                "rwlock"
            } else {
                "spinlock"
            }
        } else if flags & RT != 0 {
            if rw {
                "rwlock-rt"
            } else {
                "rtmutex"
            }
        } else if flags & MUTEX != 0 {
            "mutex"
        } else if rw {
            "rwsem"
        } else {
            "semaphore"
        }
    }
}

/// A thread waiting: in a futex wait (futex source), or for a kernel lock (kernel source).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Waiting {
    pub uaddr: u64,
    pub start_ns: u64,
    pub stack_id: i32,
    /// Futex source: 1 when `stack_id` names a table-unwound stack in `LOCK_USER_STACKS`.
    /// Kernel source: the contention flags.
    pub aux: u32,
    /// Futex source: `futex_hint::*`.
    pub hints: u32,
    /// Futex source: 1 while the stack is to be walked again as the wait ends (if the process
    /// has tables by then): walked by frame pointers (no tables yet), or through tables that
    /// missed a library mapped since they were given (`Walk::stale`).
    pub walk_again: u32,
}
const _: () = assert!(size_of::<Waiting>() == 32);

/// One lock of one process (or, for nested kernel waits, one lock of one thread).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct LockId {
    pub tgid: u32,
    pub _pad: u32,
    pub uaddr: u64,
}
const _: () = assert!(size_of::<LockId>() == 16);

/// The last wake of a futex: who released it, from where.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct LastWake {
    pub at_ns: u64,
    pub tid: u32,
    pub user_stack_id: i32,
    pub user_unwound: u32,
    pub _pad: u32,
}
const _: () = assert!(size_of::<LastWake>() == 24);

/// Where a record's stack is.
pub mod stack {
    /// User stack in `LOCK_STACKS` (frame pointers).
    pub const USER_FP: u32 = 0;
    /// User stack walked into `LOCK_USER_STACKS`.
    pub const USER_UNWOUND: u32 = 1;
    /// Kernel stack in `LOCK_STACKS`.
    pub const KERNEL: u32 = 2;
}

/// Key of the waiter and holder maps: (process, lock, stack). For waiters the stack that
/// waited; for holders the stack that released the lock to (futex) or while (pthread)
/// others waited.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct LockKey {
    pub tgid: u32,
    pub stack_id: i32,
    pub uaddr: u64,
    /// `stack::*`.
    pub stack_kind: u32,
    pub exec_generation: u32,
    /// pthread source: how many times a lock at this address was destroyed before (memory
    /// reused for a new lock is a new lock).
    pub instance: u32,
    /// Kernel source: the contention flags. Futex source: `futex_hint::*`.
    pub flags: u32,
}
const _: () = assert!(size_of::<LockKey>() == 32);

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LockTime {
    pub count: u64,
    pub total_ns: u64,
    pub max_ns: u64,
}
const _: () = assert!(size_of::<LockTime>() == 24);

/// What the lock stack walker's result is for (per CPU, set before the walk).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct WalkFor {
    pub uaddr: u64,
    /// pthread source: the wait to add under the walked stack; futex source, `WAITER_AT_EXIT`:
    /// the wait that ended.
    pub wait_ns: u64,
    /// `WAITER` or `WAKER`/`HOLDER`.
    pub role: u32,
    pub instance: u32,
}
const _: () = assert!(size_of::<WalkFor>() == 24);
pub const WAITER: u32 = 0;
pub const WAKER: u32 = 1;
pub const HOLDER: u32 = 1;
/// pthread source: a waiter's stack walked at entry, kept in its `LockCall` for the return.
pub const WAITER_AT_ENTRY: u32 = 2;
/// Futex source: a waiter whose process had no unwind tables when it began to wait, walked
/// again as the wait ends (the thread is still in the syscall: the same user stack) because the
/// tables came meanwhile; the wait is counted once the walk is done.
pub const WAITER_AT_EXIT: u32 = 3;

/// pthread source: one lock's holder and waiters (per `LockId`, LRU). The wait a release is
/// charged with is the waiting done since the last change of holder: `waiting_at_since`
/// threads waited all of it, the later arrivals since their own start.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct LockState {
    /// The thread holding it exclusively (mutex, write lock); 0: none seen.
    pub holder: u32,
    /// Destroyed this many times (see `LockKey::instance`).
    pub instance: u32,
    /// Read holds (rwlock; atomic).
    pub readers: u64,
    /// Threads in a lock call that found it held (atomic).
    pub waiting: u64,
    /// The sum of their start times (atomic).
    pub waiting_start_sum: u64,
    /// The last change of holder, and `waiting`/`waiting_start_sum` then.
    pub since_ns: u64,
    pub waiting_at_since: u64,
    pub start_sum_at_since: u64,
    /// When the exclusive holder took it.
    pub acquired_ns: u64,
    /// Exclusive holds that ended, their total and longest time.
    pub holds: u64,
    pub hold_total_ns: u64,
    pub hold_max_ns: u64,
}
const _: () = assert!(size_of::<LockState>() == 88);

/// pthread source: a thread inside a probed call (per tid), for its return.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct LockCall {
    pub uaddr: u64,
    pub entry_ns: u64,
    /// The probed instruction (in the lock function): the leaf frame of the waiter's stack.
    pub entry_ip: u64,
    pub kind: u32,
    /// `call_flags::*`.
    pub flags: u32,
    /// The thread's voluntary context switches at entry: more at the return means it slept
    /// in the call, waiting (a contention whose holder was not seen: one that had just
    /// taken the lock and not yet returned from the lock call).
    pub switches: u64,
    /// The waiter's stack, walked at entry when it found the lock held (while it waits,
    /// not inside its next hold); `NO_STACK` until then.
    pub stack_id: i32,
    pub _pad: u32,
}
const _: () = assert!(size_of::<LockCall>() == 48);

/// `LockCall::flags`.
pub mod call_flags {
    /// Counted among the lock's waiters (in `LockState::waiting`) until it returns.
    pub const WAITING: u32 = 1;
    /// It found the lock held by another thread.
    pub const FOUND_HELD: u32 = 2;
}
