//! Types shared by the kernel programs (`profiler-ebpf`) and user space (`profiler`).
//!
//! Everything here is `#[repr(C)]` with explicit padding, and its size is asserted, because both
//! sides read the same bytes out of BPF maps. Map sizes and stack depth live here once.
#![no_std]

#[cfg(test)]
extern crate std;

use core::mem::size_of;

/// Deepest stack `bpf_get_stackid` records (the kernel's `PERF_MAX_STACK_DEPTH`).
pub const MAX_STACK_DEPTH: usize = 127;
/// Distinct stacks per epoch (per stack map). Each entry is `MAX_STACK_DEPTH * 8` bytes.
pub const STACK_MAP_ENTRIES: u32 = 16 * 1024;
/// Distinct (thread, user stack, kernel stack) keys per epoch.
pub const SAMPLE_MAP_ENTRIES: u32 = 32 * 1024;
/// Processes that may be targeted at once (the `-p` list plus their descendants).
pub const TARGET_MAP_ENTRIES: u32 = 8 * 1024;
/// Processes remembered as "already announced to user space" (LRU).
pub const SEEN_MAP_ENTRIES: u32 = 16 * 1024;
/// Threads whose counter deltas wait for their next sample (LRU: threads that exit lose theirs).
pub const PENDING_DELTA_ENTRIES: u32 = 16 * 1024;
/// Ring buffer for process announcements.
pub const EVENT_RING_BYTES: u32 = 64 * 1024;
/// Length of `task_struct::comm`.
pub const COMM_LEN: usize = 16;

/// The two epoch slots: the kernel writes into one pair of maps while user space drains the other.
pub const EPOCH_SLOTS: u32 = 2;

/// Key of the sample-count maps: one per (thread, user stack, kernel stack).
///
/// A negative stack id is the kernel's error for that stack (for example `-EFAULT` when there is
/// no user stack, `-EEXIST` on a stack-map collision); user space decides what each means.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SampleKey {
    pub tgid: u32,
    pub tid: u32,
    pub user_stack_id: i32,
    pub kernel_stack_id: i32,
    pub comm: [u8; COMM_LEN],
    /// 1: `user_stack_id` names a table-unwound stack in `USER_STACKS_n`; 0: a frame-pointer
    /// stack in the stack-trace map.
    pub user_unwound: u32,
    /// How many times the process exec'd since the run started (`EXEC_GENERATIONS`): which of
    /// its memory maps the user addresses belong to.
    pub exec_generation: u32,
}
const _: () = assert!(size_of::<SampleKey>() == 40);

/// Counters whose deltas the sampling program attributes to the sampled stack: room for the
/// largest topdown set (7 events on Intel ICL+ and AMD Zen 4/5, with cycles and instructions).
pub const MAX_COUNTERS: usize = 8;

/// Value of the sample maps: how often a stack was sampled.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SampleValue {
    pub count: u64,
}
const _: () = assert!(size_of::<SampleValue>() == 8);

/// Value of the counter-delta maps (same key as the sample maps; shrunk to one entry when no
/// counter is in use): how much each counter advanced on that CPU between a sample of this stack
/// and the previous sample of the same thread there, and for how long it was on the PMU in those
/// intervals. `value × enabled_ns / running_ns[k]` estimates a multiplexed counter, as perf does.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CounterDeltas {
    /// Length of the intervals (time the counters were enabled).
    pub enabled_ns: u64,
    pub values: [u64; MAX_COUNTERS],
    pub running_ns: [u64; MAX_COUNTERS],
}
const _: () = assert!(size_of::<CounterDeltas>() == 8 + 16 * MAX_COUNTERS);

impl CounterDeltas {
    pub fn add(&mut self, other: &CounterDeltas) {
        self.enabled_ns += other.enabled_ns;
        for k in 0..MAX_COUNTERS {
            self.values[k] += other.values[k];
            self.running_ns[k] += other.running_ns[k];
        }
    }

    /// Counter `k`'s estimate over these intervals: as counted when it ran all the time (or when
    /// no times were recorded), scaled by enabled / running when it was multiplexed, none when it
    /// never ran.
    pub fn estimate(&self, k: usize) -> Option<u64> {
        let (value, running) = (self.values[k], self.running_ns[k]);
        match (running, self.enabled_ns) {
            (0, 0) => Some(value),
            (0, _) => None,
            (r, e) if r >= e => Some(value),
            (r, e) => Some((value as u128 * e as u128 / r as u128) as u64),
        }
    }

    /// Share of these intervals counter `k` was on the PMU (1 when not multiplexed).
    pub fn running_share(&self, k: usize) -> f64 {
        match self.enabled_ns {
            0 => 1.0,
            e => (self.running_ns[k] as f64 / e as f64).min(1.0),
        }
    }
}

/// Per CPU: the counter readings at the previous sample, and whose sample it was.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CounterBaseline {
    pub tid: u32,
    pub _pad: u32,
    pub values: [u64; MAX_COUNTERS],
    pub enabled_ns: [u64; MAX_COUNTERS],
    pub running_ns: [u64; MAX_COUNTERS],
}
const _: () = assert!(size_of::<CounterBaseline>() == 8 + 24 * MAX_COUNTERS);

/// Lock mode: waits by lock and stack, and the stacks that held the locks meanwhile, from one of
/// three sources (futex syscalls, pthread probes, kernel lock tracepoints).
pub mod lock {
    use core::mem::size_of;

    pub const WAIT_ENTRIES: u32 = 16 * 1024;
    pub const WAKE_ENTRIES: u32 = 16 * 1024;
    /// Locks whose holder and waiters the pthread source follows at once (LRU).
    pub const STATE_ENTRIES: u32 = 16 * 1024;

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

        /// Registers an argument can be found in at a probe, as numbered in the cookie.
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
    }
    const _: () = assert!(size_of::<Waiting>() == 24);

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
        /// Kernel source: the contention flags.
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
        /// pthread source: the wait to add under the walked stack.
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
}

/// Table-based unwinding (x86-64): rows built from `.eh_frame` in user space, walked in BPF.
pub mod unwind {
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
        pub const RSP: u8 = 1;
        pub const RBP: u8 = 2;
        /// PLT stubs' standard expression: rsp + 8, plus 8 past the stub's push.
        pub const PLT: u8 = 3;
        /// The return address is undefined here: the outermost frame (`_start`, thread start).
        pub const END: u8 = 4;
        /// No table covers this pc (a gap between functions).
        pub const NONE: u8 = 5;
    }

    /// Where the caller's rbp was saved.
    pub mod rbp {
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
        pub rbp_offset: i16,
        pub cfa: u8,
        pub rbp: u8,
        pub _pad: u16,
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
        pub mappings: [Mapping; MAX_MAPPINGS],
    }
    const _: () = assert!(size_of::<ProcessMappings>() == 8 + 32 * MAX_MAPPINGS);

    /// A walk in progress (per CPU): the registers of the frame being stepped, and the stack so
    /// far (stored as it is once the walk ends).
    #[repr(C)]
    #[derive(Clone, Copy, Debug)]
    pub struct Walk {
        pub ip: u64,
        pub sp: u64,
        pub bp: u64,
        pub tgid: u32,
        pub tid: u32,
        pub stack: UserStack,
    }
    const _: () = assert!(size_of::<Walk>() == 32 + size_of::<UserStack>());

    /// Why a walk ended.
    pub mod stop {
        pub const WALKING: u32 = 0;
        /// Reached the outermost frame (clean end).
        pub const END: u32 = 1;
        /// MAX_FRAMES reached.
        pub const TRUNCATED: u32 = 2;
        /// A return address could not be read, or led nowhere (frame pointer chain ended).
        pub const FAILED: u32 = 3;
    }

    /// A table-unwound stack as stored: the full hash (the map key is its low bits), the
    /// frames, and how the walk ended.
    #[repr(C)]
    #[derive(Clone, Copy, Debug)]
    pub struct UserStack {
        pub hash: u64,
        pub len: u32,
        pub stop: u32,
        pub frames: [u64; MAX_FRAMES],
    }
    const _: () = assert!(size_of::<UserStack>() == 16 + 8 * MAX_FRAMES);
}

/// Why user space should look at a process now, while it is alive.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProcessEventKind {
    /// The first sample of a process in this run (or since its last exec): capture its memory
    /// map for symbolization.
    FirstSample = 1,
    /// A sampled pc lies outside the mappings the unwinder was given: capture it again.
    MappingsChanged = 2,
}

/// Sent through the event ring buffer; rare (once per process), never per sample.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcessEvent {
    pub tgid: u32,
    pub kind: u32,
}
const _: () = assert!(size_of::<ProcessEvent>() == 8);

/// Indexes into the per-CPU `COUNTERS` array. Every way a sample can be lost or damaged has one,
/// so reports can state them instead of hiding them.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counter {
    /// Samples recorded into the sample map (idle and filtered-out samples are not included).
    Samples = 0,
    /// Samples taken while the CPU was idle (pid 0), counted but not recorded.
    Idle = 1,
    /// Samples dropped because the sample map was full.
    SampleMapFull = 2,
    /// User stacks lost to a stack-map hash collision (`-EEXIST`).
    UserStackCollision = 3,
    /// Kernel stacks lost to a stack-map hash collision (`-EEXIST`).
    KernelStackCollision = 4,
    /// User stacks that failed for another reason than "no user stack" (e.g. stack map full).
    UserStackError = 5,
    /// Kernel stacks that failed for another reason than "sample taken in user mode".
    KernelStackError = 6,
    /// Process announcements dropped because the event ring buffer was full.
    EventLost = 7,
    /// Descendants of targets that could not be added because the target map was full.
    TargetMapFull = 8,
    /// Context switches seen by the sched programs (all tasks, before filtering).
    SchedSwitches = 9,
    /// Tasks not tracked because the per-task map was full.
    TaskMapFull = 10,
    /// Slow scheduling events dropped because their ring buffer was full.
    SlowEventLost = 11,
    /// Off-CPU intervals not recorded because the off-CPU map was full.
    OffCpuMapFull = 12,
    /// Exited tasks whose stats were dropped because the exited-task map was full.
    ExitedMapFull = 13,
    /// Samples whose counter deltas were dropped because the delta map was full.
    DeltaMapFull = 14,
    /// Table-unwound user stacks that reached MAX_FRAMES.
    UnwindTruncated = 15,
    /// Table-unwound user stacks that ended early: a return address could not be read or a
    /// frame had no usable rule (the stack is kept as far as it got).
    UnwindFailed = 16,
    /// User stacks walked through the unwind tables.
    UnwindWalks = 17,
    /// Table-unwound stacks lost to a hash collision or a full stack map.
    UnwindStackLost = 18,
    /// Lock waits timed (futex waits of targets that returned).
    LockWaits = 19,
    /// Lock waits not recorded because a lock map was full.
    LockMapFull = 20,
}
pub const COUNTER_COUNT: u32 = 21;

impl Counter {
    pub const ALL: [Counter; COUNTER_COUNT as usize] = [
        Counter::Samples,
        Counter::Idle,
        Counter::SampleMapFull,
        Counter::UserStackCollision,
        Counter::KernelStackCollision,
        Counter::UserStackError,
        Counter::KernelStackError,
        Counter::EventLost,
        Counter::TargetMapFull,
        Counter::SchedSwitches,
        Counter::TaskMapFull,
        Counter::SlowEventLost,
        Counter::OffCpuMapFull,
        Counter::ExitedMapFull,
        Counter::DeltaMapFull,
        Counter::UnwindTruncated,
        Counter::UnwindFailed,
        Counter::UnwindWalks,
        Counter::UnwindStackLost,
        Counter::LockWaits,
        Counter::LockMapFull,
    ];
}

/// Latency histograms: log-linear, 2^HIST_SUB_BITS sub-buckets per power of two, so a bucket is
/// at most 1/16 (6.25%) wide relative to its values: fine enough for honest p50/p99.
pub const HIST_SUB_BITS: u32 = 4;
const HIST_SUB: u64 = 1 << HIST_SUB_BITS;
/// Covers 0 ns .. 2^40 ns (18 minutes); larger values land in the last bucket.
pub const HIST_BUCKETS: usize = 37 * 16;

/// The histogram bucket of a value (nanoseconds). Branch-light and loop-free for the verifier.
#[inline(always)]
pub fn hist_bucket(value: u64) -> usize {
    if value < HIST_SUB {
        return value as usize;
    }
    let exp = 63 - value.leading_zeros() as u64; // >= HIST_SUB_BITS
    let sub = (value >> (exp - HIST_SUB_BITS as u64)) & (HIST_SUB - 1);
    let index = ((exp - HIST_SUB_BITS as u64 + 1) * HIST_SUB + sub) as usize;
    if index < HIST_BUCKETS {
        index
    } else {
        HIST_BUCKETS - 1
    }
}

/// The smallest value in a bucket; the bucket holds values up to the next bucket's lower bound.
pub fn hist_lower_bound(index: usize) -> u64 {
    let index = index as u64;
    if index < HIST_SUB {
        return index;
    }
    let exp = index / HIST_SUB - 1 + HIST_SUB_BITS as u64;
    let sub = index % HIST_SUB;
    (HIST_SUB + sub) << (exp - HIST_SUB_BITS as u64)
}

/// Coarse buckets of the heatmap: 2 per power of two (every 8th histogram bucket).
pub const HEAT_BUCKETS: usize = HIST_BUCKETS / 8;

/// Key of `EXITED`: a task's stats move there when it exits, so its tid can be reused at once.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ExitedKey {
    pub tid: u32,
    pub _pad: u32,
    pub exited_at_ns: u64,
}
const _: () = assert!(size_of::<ExitedKey>() == 16);

/// When and why a task became runnable.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Enqueued {
    pub at_ns: u64,
    /// The task that woke it; 0 when it was preempted (still runnable).
    pub waker_tid: u32,
    pub waker_tgid: u32,
    /// The waker's `task_struct`; its name is read from it only for a slow wait.
    pub waker_task: u64,
    pub waker_comm: [u8; COMM_LEN],
}
const _: () = assert!(size_of::<Enqueued>() == 40);

/// When a task went to sleep, and where.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct OffCpuStart {
    pub at_ns: u64,
    pub user_stack_id: i32,
    pub kernel_stack_id: i32,
    /// Why it left the CPU: a `switch_reason`.
    pub reason: u32,
    pub tgid: u32,
    /// 1: `user_stack_id` names a table-unwound stack in `OFFCPU_USER_STACKS`.
    pub user_unwound: u32,
    pub _pad: u32,
}
const _: () = assert!(size_of::<OffCpuStart>() == 32);

/// Per-task scheduling statistics, keyed by tid in `TASK_STATS`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct TaskSched {
    pub tgid: u32,
    pub tid: u32,
    pub comm: [u8; COMM_LEN],
    /// Times the task was switched in (its timeslices).
    pub runs: u64,
    /// Run-queue waits measured (switch-ins after a wake-up or preemption seen by bpfprof).
    pub delays: u64,
    pub total_delay_ns: u64,
    pub max_delay_ns: u64,
    /// `bpf_ktime_get_ns()` when the longest wait ended.
    pub max_at_ns: u64,
    /// Time spent switched out while sleeping (S) and blocked (D).
    pub sleeping_ns: u64,
    pub blocked_ns: u64,
    /// Time on a CPU, from switch-in to switch-out.
    pub running_ns: u64,
    /// When it was last switched in.
    pub last_in_ns: u64,
    /// Runnable since (0: not waiting for a CPU). Kept in the task's own entry, not a map of its
    /// own: wake-up, switch and exit of one task are serialized by its run-queue lock, so plain
    /// field writes replace hash-map inserts and deletes on the hottest path of the kernel.
    pub enqueued: Enqueued,
    /// Blocked since (0: not off CPU).
    pub offcpu: OffCpuStart,
    pub hist: [u32; HIST_BUCKETS],
}
const _: () = assert!(size_of::<TaskSched>() == 96 + 40 + 32 + 4 * HIST_BUCKETS);

/// Total blocked time per (thread, stacks): the value of `OFFCPU`, keyed by `SampleKey`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct OffCpuTime {
    pub total_ns: u64,
    pub count: u64,
}
const _: () = assert!(size_of::<OffCpuTime>() == 16);

/// One stretch of a CPU's time held by one task.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuRun {
    pub tid: u32,
    pub _pad: u32,
    /// Its `task_struct`, to read its name only if a slow wait needs it (all-zero name when
    /// the task has gone since: user space then asks /proc).
    pub task: u64,
    pub start_ns: u64,
    pub end_ns: u64,
    pub comm: [u8; COMM_LEN],
}
const _: () = assert!(size_of::<CpuRun>() == 48);

/// Recent tasks on one CPU (a small ring), to name who held the CPU while a task waited.
pub const CPU_HISTORY: usize = 8;
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CpuHistory {
    pub next: u64,
    pub last_switch_ns: u64,
    pub runs: [CpuRun; CPU_HISTORY],
}
const _: () = assert!(size_of::<CpuHistory>() == 16 + 48 * CPU_HISTORY);

/// How many CPU holders a slow event names.
pub const SLOW_CULPRITS: usize = 4;

/// A run-queue wait longer than the threshold, sent to user space as it happens.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct SlowEvent {
    pub tid: u32,
    pub tgid: u32,
    pub cpu: u32,
    pub culprit_count: u32,
    pub delay_ns: u64,
    pub at_ns: u64,
    pub comm: [u8; COMM_LEN],
    pub waker: Enqueued,
    pub culprits: [CpuRun; SLOW_CULPRITS],
}
const _: () = assert!(size_of::<SlowEvent>() == 48 + 40 + 48 * SLOW_CULPRITS);

/// Where the running kernel keeps what the raw sched tracepoints read from a `task_struct`,
/// from its BTF at start-up.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TaskOffsets {
    pub pid: u32,
    pub comm: u32,
    /// `__state` (`state` before 5.14): read only where `sched_switch` does not pass it.
    pub state: u32,
    /// 1 when `sched_switch` passes `prev_state` as its fourth argument (5.18 and later).
    pub switch_has_state_arg: u32,
}
const _: () = assert!(size_of::<TaskOffsets>() == 16);

/// The scheduler's raw task states (`include/linux/sched.h`), as `sched_switch` sees them.
pub mod task_state {
    pub const UNINTERRUPTIBLE: u64 = 0x2;
    pub const DEAD: u64 = 0x80;
    /// With UNINTERRUPTIBLE: `TASK_IDLE`, an idle kernel thread, not I/O.
    pub const NOLOAD: u64 = 0x400;
    /// A sleeping lock on PREEMPT_RT: uninterruptible.
    pub const RTLOCK_WAIT: u64 = 0x1000;
}

/// Which stacks the switch program walks when a task goes to sleep (`OFFCPU_STACKS_ENABLED`).
pub mod offcpu_stacks {
    pub const NONE: u32 = 0;
    /// User stacks; kernel stacks only for uninterruptible sleeps and kernel threads.
    pub const AUTO: u32 = 1;
    pub const ALL: u32 = 2;
}

/// How a task left the CPU, reduced from its raw state by the switch program.
pub mod switch_reason {
    pub const PREEMPTED: u32 = 0;
    /// Waiting for an event; also stopped, traced, parked and idle kernel threads.
    pub const SLEEPING: u32 = 1;
    /// Uninterruptible sleep (I/O, kernel locks), not counting idle kernel threads.
    pub const BLOCKED: u32 = 2;
    pub const EXITING: u32 = 3;

    /// The reason for a switch-out from `sched_switch`'s `preempt` and `prev_state`. A preempted
    /// task stays runnable whatever its state says (it was preempted on its way to sleep).
    #[inline(always)]
    pub const fn classify(preempt: bool, prev_state: u64) -> u32 {
        use super::task_state::*;
        if preempt || prev_state == 0 {
            PREEMPTED
        } else if prev_state & DEAD != 0 {
            EXITING
        } else if prev_state & RTLOCK_WAIT != 0
            || (prev_state & UNINTERRUPTIBLE != 0 && prev_state & NOLOAD == 0)
        {
            BLOCKED
        } else {
            SLEEPING
        }
    }
}

/// Offsets of the `sched:sched_process_fork` fields we read, taken at start-up from the tracefs
/// format file because they differ between kernels (`parent_comm` became `__data_loc` in 6.x).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ForkOffsets {
    pub parent_pid: u32,
    pub child_pid: u32,
}
const _: () = assert!(size_of::<ForkOffsets>() == 8);

/// Offsets of the `sched:sched_process_exit` fields we read.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExitOffsets {
    pub pid: u32,
    /// Offset of `group_dead`, or `u32::MAX` on kernels without it.
    pub group_dead: u32,
}
const _: () = assert!(size_of::<ExitOffsets>() == 8);

/// Names of maps and programs, used by both sides so a rename cannot silently break loading.
pub mod names {
    pub const SAMPLES: [&str; 2] = ["SAMPLES_0", "SAMPLES_1"];
    pub const STACKS: [&str; 2] = ["STACKS_0", "STACKS_1"];
    pub const EPOCH: &str = "EPOCH";
    pub const TARGETS: &str = "TARGETS";
    pub const COUNTERS: &str = "COUNTERS";
    pub const EVENTS: &str = "EVENTS";
    pub const SEEN: &str = "SEEN";
    pub const EXEC_GENERATIONS: &str = "EXEC_GENERATIONS";
    pub const PROG_SAMPLE: &str = "sample_stack";
    pub const PROG_FORK: &str = "follow_fork";
    pub const PROG_EXIT: &str = "forget_exit";
    pub const PROG_EXEC: &str = "announce_exec";
    pub const PROG_SWITCH: &str = "sched_switch";
    pub const PROG_COUNTER_SWITCH: &str = "counter_switch";
    pub const PROG_WAKEUP: &str = "sched_wakeup";
    pub const PROG_WAKEUP_NEW: &str = "sched_wakeup_new";
    pub const TASK_STATS: &str = "TASK_STATS";
    pub const EXITED: &str = "EXITED";
    pub const OFFCPU: &str = "OFFCPU";
    pub const OFFCPU_STACKS: &str = "OFFCPU_STACKS";
    pub const HEAT: &str = "HEAT";
    pub const SLOW_EVENTS: &str = "SLOW_EVENTS";
    pub const G_TASK_OFFSETS: &str = "TASK_OFFSETS";
    pub const G_SLOW_NS: &str = "SLOW_THRESHOLD_NS";
    pub const G_OFFCPU_STACKS: &str = "OFFCPU_STACKS_ENABLED";
    pub const G_COUNTERS: &str = "COUNTERS_IN_USE";
    pub const G_UNWIND: &str = "UNWIND_ENABLED";
    pub const G_NVCSW: &str = "TASK_NVCSW_OFFSET";
    pub const COUNTER_READERS: [&str; super::MAX_COUNTERS] = [
        "COUNTER_0",
        "COUNTER_1",
        "COUNTER_2",
        "COUNTER_3",
        "COUNTER_4",
        "COUNTER_5",
        "COUNTER_6",
        "COUNTER_7",
    ];
    pub const DELTAS: [&str; 2] = ["DELTAS_0", "DELTAS_1"];
    pub const PENDING_DELTAS: &str = "PENDING_DELTAS";
    pub const USER_STACKS: [&str; 2] = ["USER_STACKS_0", "USER_STACKS_1"];
    pub const UNWIND_ROWS: &str = "UNWIND_ROWS";
    pub const UNWIND_PROCESSES: &str = "UNWIND_PROCESSES";
    pub const UNWIND_PROGRAMS: &str = "UNWIND_PROGRAMS";
    pub const PROG_UNWIND: &str = "unwind_user";
    pub const OFFCPU_USER_STACKS: &str = "OFFCPU_USER_STACKS";
    pub const OFFCPU_UNWIND_PROGRAMS: &str = "OFFCPU_UNWIND_PROGRAMS";
    pub const PROG_UNWIND_OFFCPU: &str = "unwind_offcpu";
    pub const LOCK_USER_STACKS: &str = "LOCK_USER_STACKS";
    pub const LOCK_UNWIND_PROGRAMS: &str = "LOCK_UNWIND_PROGRAMS";
    pub const PROG_UNWIND_LOCK: &str = "unwind_lock";
    pub const PROG_FUTEX_ENTER: &str = "futex_enter";
    pub const PROG_FUTEX_EXIT: &str = "futex_exit";
    pub const LOCK_WAITERS: &str = "LOCK_WAITERS";
    pub const LOCK_HOLDERS: &str = "LOCK_HOLDERS";
    pub const LOCK_STACKS: &str = "LOCK_STACKS";
    pub const LOCK_WAITING: &str = "LOCK_WAITING";
    pub const LOCK_WAKES: &str = "LOCK_WAKES";
    pub const LOCK_STATES: &str = "LOCK_STATES";
    pub const LOCK_CALLS: &str = "LOCK_CALLS";
    pub const LOCK_KERNEL_WAITING: &str = "LOCK_KERNEL_WAITING";
    pub const PROG_PTHREAD_ENTER: &str = "pthread_enter";
    pub const PROG_PTHREAD_RETURN: &str = "pthread_return";
    pub const PROG_UNWIND_PTHREAD: &str = "unwind_pthread";
    pub const PTHREAD_UNWIND_PROGRAMS: &str = "PTHREAD_UNWIND_PROGRAMS";
    pub const PROG_CONTENTION_BEGIN: &str = "contention_begin";
    pub const PROG_CONTENTION_END: &str = "contention_end";
    /// Globals set by the loader.
    pub const G_FILTER: &str = "FILTER_BY_TARGET";
    pub const G_FORK: &str = "FORK_OFFSETS";
    pub const G_EXIT: &str = "EXIT_OFFSETS";
}

#[cfg(feature = "user")]
mod pod {
    use super::*;
    // SAFETY: plain old data, `#[repr(C)]`, no padding bytes (sizes asserted above).
    unsafe impl aya::Pod for SampleKey {}
    unsafe impl aya::Pod for SampleValue {}
    unsafe impl aya::Pod for CounterDeltas {}
    unsafe impl aya::Pod for unwind::Row {}
    unsafe impl aya::Pod for unwind::ProcessMappings {}
    unsafe impl aya::Pod for unwind::UserStack {}
    unsafe impl aya::Pod for ExitedKey {}
    unsafe impl aya::Pod for ProcessEvent {}
    unsafe impl aya::Pod for ForkOffsets {}
    unsafe impl aya::Pod for ExitOffsets {}
    unsafe impl aya::Pod for TaskSched {}
    unsafe impl aya::Pod for OffCpuTime {}
    unsafe impl aya::Pod for TaskOffsets {}
    unsafe impl aya::Pod for SlowEvent {}
    unsafe impl aya::Pod for lock::LockKey {}
    unsafe impl aya::Pod for lock::LockTime {}
    unsafe impl aya::Pod for lock::LockId {}
    unsafe impl aya::Pod for lock::LockState {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multiplexed_deltas_scale_by_enabled_over_running() {
        let mut d = CounterDeltas {
            enabled_ns: 100,
            ..Default::default()
        };
        d.values[0] = 1000;
        d.running_ns[0] = 100;
        d.values[1] = 300;
        d.running_ns[1] = 25;
        d.values[2] = 7;
        let mut sum = CounterDeltas::default();
        sum.add(&d);
        sum.add(&d);
        assert_eq!(sum.estimate(0), Some(2000), "ran all the time: as counted");
        assert_eq!(
            sum.estimate(1),
            Some(2400),
            "ran a quarter of the time: times four"
        );
        assert_eq!(sum.estimate(2), None, "never ran: no estimate");
        assert_eq!(sum.running_share(1), 0.25);
        let untimed = CounterDeltas {
            values: [5; MAX_COUNTERS],
            ..Default::default()
        };
        assert_eq!(
            untimed.estimate(3),
            Some(5),
            "values without times are taken as they are"
        );
    }

    #[test]
    fn switch_reasons_follow_the_kernels_task_states() {
        use switch_reason::*;
        // TASK_RUNNING, and a task preempted after it set TASK_INTERRUPTIBLE: still runnable.
        assert_eq!(classify(false, 0), PREEMPTED);
        assert_eq!(classify(true, 0x1), PREEMPTED);
        assert_eq!(classify(false, 0x1), SLEEPING);
        // TASK_KILLABLE = WAKEKILL | UNINTERRUPTIBLE: blocked; TASK_IDLE = UNINTERRUPTIBLE | NOLOAD: not.
        assert_eq!(classify(false, 0x100 | 0x2), BLOCKED);
        assert_eq!(classify(false, 0x2 | 0x400), SLEEPING);
        assert_eq!(classify(false, 0x1000), BLOCKED);
        // Stopped, parked, and the final switch of a dying task.
        assert_eq!(classify(false, 0x4), SLEEPING);
        assert_eq!(classify(false, 0x40), SLEEPING);
        assert_eq!(classify(false, 0x80), EXITING);
    }

    #[test]
    fn histogram_buckets_are_monotonic_and_narrow() {
        let mut last = 0;
        for v in [
            0u64,
            1,
            15,
            16,
            17,
            31,
            32,
            100,
            1_000,
            65_535,
            1_000_000,
            123_456_789,
            1 << 39,
        ] {
            let b = hist_bucket(v);
            assert!(b >= last, "bucket of {v} went backwards");
            last = b;
            let lo = hist_lower_bound(b);
            let hi = hist_lower_bound(b + 1);
            assert!(lo <= v && v < hi, "{v} not in [{lo}, {hi}) of bucket {b}");
            assert!(
                (hi - lo) as f64 <= (lo as f64 / 16.0).max(1.0),
                "bucket {b} too wide: [{lo}, {hi})"
            );
        }
        assert_eq!(hist_bucket(u64::MAX), HIST_BUCKETS - 1);
        for b in 0..HIST_BUCKETS - 1 {
            assert_eq!(
                hist_bucket(hist_lower_bound(b)),
                b,
                "lower bound of {b} maps back"
            );
        }
    }
}
