//! Names of maps and programs, used by both sides so a rename cannot silently break loading.
pub const SAMPLES: [&str; 2] = ["SAMPLES_0", "SAMPLES_1"];
pub const STACKS: [&str; 2] = ["STACKS_0", "STACKS_1"];
pub const BUILD_ID_STACKS: [&str; 2] = ["BUILD_ID_STACKS_0", "BUILD_ID_STACKS_1"];
pub const EPOCH: &str = "EPOCH";
pub const TARGETS: &str = "TARGETS";
/// aya-log's ring of the programs' log lines.
pub const KERNEL_LOGS: &str = "AYA_LOGS";
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
pub const OFFCPU: [&str; 2] = ["OFFCPU_0", "OFFCPU_1"];
pub const OFFCPU_STACKS: [&str; 2] = ["OFFCPU_STACKS_0", "OFFCPU_STACKS_1"];
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
pub const COUNTER_TOTALS: &str = "COUNTER_TOTALS";
pub const USER_STACKS: [&str; 2] = ["USER_STACKS_0", "USER_STACKS_1"];
pub const UNWIND_ROWS: &str = "UNWIND_ROWS";
pub const UNWIND_PROCESSES: &str = "UNWIND_PROCESSES";
/// The unwind tables every table walker reads.
pub const UNWIND_TABLES: [&str; 2] = [UNWIND_ROWS, UNWIND_PROCESSES];
pub const UNWIND_PROGRAMS: &str = "UNWIND_PROGRAMS";
pub const PROG_UNWIND: &str = "unwind_user";
pub const OFFCPU_USER_STACKS: [&str; 2] = ["OFFCPU_USER_STACKS_0", "OFFCPU_USER_STACKS_1"];
pub const OFFCPU_UNWIND_PROGRAMS: &str = "OFFCPU_UNWIND_PROGRAMS";
pub const PROG_UNWIND_OFFCPU: &str = "unwind_offcpu";
pub const LOCK_USER_STACKS: &str = "LOCK_USER_STACKS";
pub const LOCK_UNWIND_PROGRAMS: &str = "LOCK_UNWIND_PROGRAMS";
pub const PROG_UNWIND_LOCK: &str = "unwind_lock";
pub const PROG_FUTEX_ENTER: &str = "futex_enter";
pub const PROG_FUTEX_EXIT: &str = "futex_exit";
pub const PROG_THREAD_NEW: &str = "lock_thread_new";
pub const LOCK_JOINABLE: &str = "LOCK_JOINABLE";
pub const G_THREAD_OFFSETS: &str = "LOCK_THREAD_OFFSETS";
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
