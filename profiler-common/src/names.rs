//! Names of the object's maps, programs and globals, declared once: user space finds each by
//! this name, the kernel programs declare theirs under the same (`#[map(name = "...")]`, the
//! function's name), and a unit test of the user crate reads the embedded object and holds the
//! two equal (`MAPS`, `PROGRAMS`, `GLOBALS`, and the maps only the kernel uses, `KERNEL_ONLY_MAPS`).

/// One constant per name (a string, or an array of them), and per section the list of them all.
macro_rules! names {
    ($($list:ident { $($(#[$doc:meta])* $name:ident = $value:tt;)* })*) => {
        $($(names!(@one $(#[$doc])* $name $value);)*
        pub const $list: &[&[&str]] = &[$(names!(@all $value)),*];)*
    };
    (@one $(#[$doc:meta])* $name:ident [$($value:literal),+ $(,)?]) => {
        $(#[$doc])* pub const $name: [&str; [$($value),+].len()] = [$($value),+];
    };
    (@one $(#[$doc:meta])* $name:ident $value:literal) => {
        $(#[$doc])* pub const $name: &str = $value;
    };
    (@all [$($value:literal),+ $(,)?]) => { &[$($value),+] };
    (@all $value:literal) => { &[$value] };
}

names! {
    MAPS {
        SAMPLES = ["SAMPLES_0", "SAMPLES_1"];
        STACKS = ["STACKS_0", "STACKS_1"];
        BUILD_ID_STACKS = ["BUILD_ID_STACKS_0", "BUILD_ID_STACKS_1"];
        EPOCH = "EPOCH";
        TARGETS = "TARGETS";
        /// aya-log's ring of the programs' log lines.
        KERNEL_LOGS = "AYA_LOGS";
        /// The per-CPU health counters (`HealthCounter`).
        HEALTH = "HEALTH";
        EVENTS = "EVENTS";
        SEEN = "SEEN";
        EXEC_GENERATIONS = "EXEC_GENERATIONS";
        TASK_STATS = "TASK_STATS";
        EXITED = "EXITED";
        OFFCPU = ["OFFCPU_0", "OFFCPU_1"];
        OFFCPU_STACKS = ["OFFCPU_STACKS_0", "OFFCPU_STACKS_1"];
        HEAT = "HEAT";
        /// Per CPU: its recent holders (kernel only) and the traced tasks' waits on it.
        CPU_HISTORY = "CPU_HISTORY";
        SLOW_EVENTS = "SLOW_EVENTS";
        /// Per CPU, the traced task on it and since when (the scheduler programs' lean path).
        RUNNING = "RUNNING";
        COUNTER_READERS = ["COUNTER_0", "COUNTER_1", "COUNTER_2", "COUNTER_3", "COUNTER_4", "COUNTER_5", "COUNTER_6", "COUNTER_7"];
        DELTAS = ["DELTAS_0", "DELTAS_1"];
        PENDING_DELTAS = "PENDING_DELTAS";
        COUNTER_TOTALS = "COUNTER_TOTALS";
        USER_STACKS = ["USER_STACKS_0", "USER_STACKS_1"];
        UNWIND_ROWS = "UNWIND_ROWS";
        UNWIND_PROCESSES = "UNWIND_PROCESSES";
        PY_PROCESSES = "PY_PROCESSES";
        PY_THREADS = "PY_THREADS";
        PY_CODES_SEEN = "PY_CODES_SEEN";
        UNWIND_PROGRAMS = "UNWIND_PROGRAMS";
        OFFCPU_USER_STACKS = ["OFFCPU_USER_STACKS_0", "OFFCPU_USER_STACKS_1"];
        OFFCPU_UNWIND_PROGRAMS = "OFFCPU_UNWIND_PROGRAMS";
        LOCK_USER_STACKS = "LOCK_USER_STACKS";
        LOCK_UNWIND_PROGRAMS = "LOCK_UNWIND_PROGRAMS";
        LOCK_JOINABLE = "LOCK_JOINABLE";
        LOCK_WAITERS = "LOCK_WAITERS";
        LOCK_HOLDERS = "LOCK_HOLDERS";
        LOCK_STACKS = "LOCK_STACKS";
        LOCK_WAITING = "LOCK_WAITING";
        LOCK_WAKES = "LOCK_WAKES";
        LOCK_STATES = "LOCK_STATES";
        LOCK_CALLS = "LOCK_CALLS";
        LOCK_KERNEL_WAITING = "LOCK_KERNEL_WAITING";
        PTHREAD_UNWIND_PROGRAMS = "PTHREAD_UNWIND_PROGRAMS";
        /// Per CPU, each tracing event's hits by the targets (`hit_cookie`).
        HITS = "HITS";
        /// Each tracing event's filter (`FilterTerm`s).
        HIT_FILTERS = "HIT_FILTERS";
        TRACEPOINT_HIT_UNWIND_PROGRAMS = "TRACEPOINT_HIT_UNWIND_PROGRAMS";
        PROBE_HIT_UNWIND_PROGRAMS = "PROBE_HIT_UNWIND_PROGRAMS";
        /// Per target thread, the system call it is in (`SyscallEntry`).
        SYSCALL_THREADS = "SYSCALL_THREADS";
        /// Per (thread, call, errno), the calls and their time (`SyscallTotals`).
        SYSCALL_TOTALS = "SYSCALL_TOTALS";
        /// `trace --duration-min`: the ring of calls at least that long (`SlowCall`).
        SLOW_CALLS = "SLOW_CALLS";
        SYSCALL_UNWIND_PROGRAMS = "SYSCALL_UNWIND_PROGRAMS";
        /// Starts of `latency` waiting for their end (`LatencyKey` → ns).
        LATENCY_STARTS = "LATENCY_STARTS";
        /// Per CPU, `latency`'s histogram and sums (`latency::slot`).
        LATENCY_HIST = "LATENCY_HIST";
        /// `latency --duration-min`: the intervals at least that long (`SlowInterval`), and the
        /// stacks of their starts (frame-pointer and kernel stacks; table-walked user stacks).
        LATENCY_SLOW = "LATENCY_SLOW";
        LATENCY_STACKS = "LATENCY_STACKS";
        LATENCY_USER_STACKS = "LATENCY_USER_STACKS";
        /// `record`'s ring of hits (`HitRecord`).
        RECORDS = "RECORDS";
        /// What `record` fetches at each probe's hits (`Fetch`).
        RECORD_FETCHES = "RECORD_FETCHES";
        /// What a sampled hit weighs (`--weight`): a number fetched as a record's is (`Fetch`).
        WEIGHT_FETCHES = "WEIGHT_FETCHES";
        /// Per CPU, the records the full ring had no room for.
        RECORDS_LOST = "RECORDS_LOST";
        /// `sched record`'s ring of scheduler events (`SchedEvent`), and per CPU the events a full
        /// ring had no room for.
        SCHED_TIMELINE = "SCHED_TIMELINE";
        SCHED_TIMELINE_LOST = "SCHED_TIMELINE_LOST";
        /// `stat --by`: where each event's counted number is (`ByField`).
        BY_FIELDS = "BY_FIELDS";
        /// Per CPU, each (event, value)'s hits (`ValueKey` → count).
        VALUE_COUNTS = "VALUE_COUNTS";
        /// Per CPU, each event's hits of values the full `VALUE_COUNTS` had no room for.
        VALUE_COUNTS_LOST = "VALUE_COUNTS_LOST";
    }
    PROGRAMS {
        PROG_SAMPLE = "sample_stack";
        PROG_FORK = "follow_fork";
        PROG_EXIT = "forget_exit";
        PROG_EXEC = "announce_exec";
        PROG_MAPPING_MMAP = "mapping_mmap";
        PROG_MAPPING_MREMAP = "mapping_mremap";
        PROG_MAPPING_DONE = "mapping_done";
        PROG_SWITCH = "sched_switch";
        PROG_COUNTER_SWITCH = "counter_switch";
        PROG_WAKEUP = "sched_wakeup";
        PROG_WAKEUP_NEW = "sched_wakeup_new";
        PROG_UNWIND = "unwind_user";
        PROG_UNWIND_OFFCPU = "unwind_offcpu";
        PROG_UNWIND_LOCK = "unwind_lock";
        PROG_FUTEX_ENTER = "futex_enter";
        PROG_FUTEX_EXIT = "futex_exit";
        PROG_THREAD_NEW = "lock_thread_new";
        PROG_PTHREAD_ENTER = "pthread_enter";
        PROG_PTHREAD_RETURN = "pthread_return";
        PROG_UNWIND_PTHREAD = "unwind_pthread";
        PROG_CONTENTION_BEGIN = "contention_begin";
        PROG_CONTENTION_END = "contention_end";
        PROG_SAMPLE_TRACEPOINT = "sample_tracepoint";
        PROG_SAMPLE_PROBE = "sample_probe";
        PROG_UNWIND_TRACEPOINT_HIT = "unwind_tracepoint_hit";
        PROG_UNWIND_PROBE_HIT = "unwind_probe_hit";
        PROG_SYSCALL_ENTER = "syscall_enter";
        PROG_SYSCALL_EXIT = "syscall_exit";
        PROG_UNWIND_SYSCALL = "unwind_syscall";
        PROG_LATENCY_TRACEPOINT = "latency_tracepoint";
        PROG_LATENCY_PROBE = "latency_probe";
        PROG_RECORD_TRACEPOINT = "record_tracepoint";
        PROG_RECORD_PROBE = "record_probe";
        PROG_COUNT_TRACEPOINT = "count_tracepoint_value";
        PROG_COUNT_PROBE = "count_probe_value";
        PROG_TIMELINE_SWITCH = "timeline_switch";
        PROG_TIMELINE_WAKEUP = "timeline_wakeup";
        PROG_TIMELINE_WAKEUP_NEW = "timeline_wakeup_new";
        PROG_TIMELINE_MIGRATE = "timeline_migrate";
        PROG_TIMELINE_FORK = "timeline_fork";
        PROG_TIMELINE_EXIT = "timeline_exit";
    }
    GLOBALS {
        G_TASK_OFFSETS = "TASK_OFFSETS";
        G_EXEC_OFFSETS = "EXEC_OFFSETS";
        G_SLOW_NS = "SLOW_THRESHOLD_NS";
        G_OFFCPU_STACKS = "OFFCPU_STACKS_ENABLED";
        /// 0: the scheduler programs keep only what the agent's profiles read (see `SCHED_DETAIL`).
        G_SCHED_DETAIL = "SCHED_DETAIL";
        /// Which sleeps get their off-CPU stacks taken (see `OffCpuSampling`).
        G_OFFCPU_SAMPLING = "OFFCPU_SAMPLING";
        /// 1: every sleep is walked, and a reuse that would have given another stack counted.
        G_REUSE_CHECK = "OFFCPU_REUSE_CHECK";
        G_COUNTERS = "COUNTERS_IN_USE";
        G_UNWIND = "UNWIND_ENABLED";
        G_NVCSW = "TASK_NVCSW_OFFSET";
        G_THREAD_OFFSETS = "LOCK_THREAD_OFFSETS";
        /// Globals set by the loader.
        G_FILTER = "FILTER_BY_TARGET";
        G_FORK = "FORK_OFFSETS";
        G_EXIT = "EXIT_OFFSETS";
        /// Offset of `sched_process_exec`'s `old_pid` (`u32::MAX`: unknown).
        G_EXEC_OLD_PID = "EXEC_OLD_PID_OFFSET";
        /// `latency`: each side's key (`LatencyKeys`).
        G_LATENCY_KEYS = "LATENCY_KEYS";
        /// `record -g`: each record with its stacks (`StackedRecord`).
        G_RECORD_STACKS = "RECORD_STACKS";
        /// `trace --duration-min`: calls at least this long are sent (0: none).
        G_SLOW_CALL_NS = "SLOW_CALL_NS";
        /// `latency --duration-min`: intervals at least this long are sent (0: none).
        G_LATENCY_SLOW_NS = "LATENCY_SLOW_NS";
    }
}

/// The maps only the kernel programs use (per-CPU scratch space, state between programs).
pub const KERNEL_ONLY_MAPS: [&str; 19] = [
    "BUILD_ID_SCRATCH",
    "CLOCK_SYNC",
    "COUNTER_BASELINE",
    "DRAWS",
    "HIT_WEIGHTS",
    "LATENCY_PENDING",
    "LOCK_WALK",
    "LOCK_WALK_FOR",
    "MAPPING_CALLS",
    "OFFCPU_WALK",
    "PROBE_HIT_WALK",
    "PTHREAD_WALK",
    "PTHREAD_WALK_FOR",
    "REUSE_WORDS",
    "SLOW_CALL_PENDING",
    "SYSCALL_WALK",
    "TASK_TEMPLATE",
    "TRACEPOINT_HIT_WALK",
    "WALK",
];

/// The unwind tables every table walker reads (and the interpreters it reads Python frames of).
pub const UNWIND_TABLES: [&str; 5] = [
    UNWIND_ROWS,
    UNWIND_PROCESSES,
    PY_PROCESSES,
    PY_THREADS,
    PY_CODES_SEEN,
];

const _: () = assert!(COUNTER_READERS.len() == super::MAX_COUNTERS);
