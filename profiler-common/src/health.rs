//! The health counters, declared once: every way a record can be lost or damaged, and what was
//! recorded, so reports state them instead of hiding them. [`health_table!`] holds the one
//! declaration of each (its field name, its slot in the kernel's per-CPU `HEALTH` array if the
//! kernel counts it, which source it belongs to, its `/metrics` name, its help text and when it
//! warns); this crate makes [`HealthCounter`] of it for the kernel programs, and user space its
//! `Health` fields, the window arithmetic, the warnings, the agent's `/metrics` lines and the
//! check of docs/json.md.

/// Hands the table of every health counter to `$make!`. Each kernel row is
/// `Variant = slot, field, source, "metric", "help", |h| warning`; each user row (counted by
/// user space) is the same without `Variant = slot`. `source` is `samples`, `sched`, `locks`,
/// `syscalls`, `latency` or `common`; a metric name shared by two rows is one `/metrics` line, their sum; a warning is an
/// expression of type `fn(&Health) -> Option<String>` (user space's `Health`).
#[macro_export]
macro_rules! health_table {
    ($make:ident) => {
        $make! {
            kernel {
                Samples = 0, samples, samples, "samples_total",
                    "samples recorded (before symbolization; idle and filtered-out samples are not included)",
                    |_| None;
                Idle = 1, idle, samples, "idle_samples_total",
                    "samples that found a CPU idle (system-wide), counted but not recorded",
                    |_| None;
                SampleMapFull = 2, lost_map_full, samples, "samples_lost_total",
                    "samples dropped in the kernel because the sample map was full between drains",
                    |h| (h.lost_map_full > 0).then(|| format!(
                        "{} samples lost ({:.1}%): the sample map was full between drains",
                        h.lost_map_full,
                        100.0 * h.lost_map_full as f64 / (h.samples + h.lost_map_full) as f64
                    ));
                UserStackCollision = 3, user_stack_collisions, common, "stack_collisions_total",
                    "user stacks lost to stack-map hash collisions",
                    |h| (h.collisions() > 0).then(|| format!(
                        "{} stacks lost to stack-map collisions ({} user, {} kernel; shown as [lost stack])",
                        h.collisions(), h.user_stack_collisions, h.kernel_stack_collisions
                    ));
                KernelStackCollision = 4, kernel_stack_collisions, common, "stack_collisions_total",
                    "kernel stacks lost to stack-map hash collisions",
                    |_| None;
                UserStackError = 5, user_stack_errors, common, "stack_errors_total",
                    "user stacks the kernel could not take (another error than a collision or no user stack)",
                    |h| (h.user_stack_errors + h.kernel_stack_errors > 0).then(|| format!(
                        "{} stacks could not be read ({} user, {} kernel; shown as [lost stack])",
                        h.user_stack_errors + h.kernel_stack_errors, h.user_stack_errors, h.kernel_stack_errors
                    ));
                KernelStackError = 6, kernel_stack_errors, common, "stack_errors_total",
                    "kernel stacks the kernel could not take (another error than a sample in user mode)",
                    |_| None;
                EventLost = 7, process_events_lost, common, "process_events_lost_total",
                    "new-process notifications dropped because their ring was full (those processes may symbolize as [unknown])",
                    |h| (h.process_events_lost > 0).then(|| format!(
                        "{} new-process notifications lost: some processes may show [unknown] frames",
                        h.process_events_lost
                    ));
                TargetMapFull = 8, target_map_full, common, "target_map_full_total",
                    "child processes of the targets not followed because the target map was full",
                    |h| (h.target_map_full > 0).then(|| format!(
                        "{} child processes of the targets were not followed: the target map was full",
                        h.target_map_full
                    ));
                SchedSwitches = 9, sched_switches, sched, "sched_switches_total",
                    "context switches the scheduler's programs saw (every task, before filtering)",
                    |_| None;
                TaskMapFull = 10, task_map_full, sched, "task_map_full_total",
                    "threads not followed because the per-task map was full",
                    |h| (h.task_map_full > 0).then(|| format!(
                        "{} tasks were not tracked: the per-task map was full",
                        h.task_map_full
                    ));
                SlowEventLost = 11, slow_events_lost, sched, "slow_events_lost_total",
                    "slow waits not reported one by one because their ring was full",
                    |h| (h.slow_events_lost > 0).then(|| format!(
                        "{} slow waits were not reported individually: their ring buffer was full",
                        h.slow_events_lost
                    ));
                OffCpuMapFull = 12, offcpu_map_full, sched, "offcpu_map_full_total",
                    "sleeps (off-CPU intervals) not recorded because the off-CPU map was full",
                    |h| (h.offcpu_map_full > 0).then(|| format!(
                        "{} off-CPU intervals were not recorded: the off-CPU map was full",
                        h.offcpu_map_full
                    ));
                ExitedMapFull = 13, exited_map_full, sched, "exited_map_full_total",
                    "exited threads whose records (and their last sleeps without stacks) were dropped because too many exited within a drain",
                    |h| (h.exited_map_full > 0).then(|| format!(
                        "{} exited tasks are missing: too many exited within a second",
                        h.exited_map_full
                    ));
                DeltaMapFull = 14, delta_map_full, samples, "delta_map_full_total",
                    "samples whose counter deltas were dropped because the delta map was full",
                    |h| (h.delta_map_full > 0).then(|| format!(
                        "{} samples carry no counter deltas: the delta map was full between drains",
                        h.delta_map_full
                    ));
                UnwindTruncated = 15, unwind_truncated, common, "unwind_truncated_total",
                    "table walks that reached the depth limit (their outermost frames are missing)",
                    |h| (h.unwind_truncated > 0).then(|| format!(
                        "{} user stacks were deeper than {} frames: their outermost frames are missing",
                        h.unwind_truncated, $crate::unwind::MAX_FRAMES
                    ));
                UnwindFailed = 16, unwind_failed, common, "unwind_failed_total",
                    "table walks that ended early: an unreadable return address, or a frame with neither a rule nor a frame pointer (kept as far as they went)",
                    |h| (h.unwind_failed > 0).then(|| format!(
                        "{} of {} table-unwound user stacks ended early (a return address could not be read, or a frame had no unwind rule and no frame pointer): they are kept as far as they go",
                        h.unwind_failed, h.unwind_walks
                    ));
                UnwindWalks = 17, unwind_walks, common, "unwind_walks_total",
                    "user stacks walked through unwind tables (samples, sleeps, lock waits)",
                    |_| None;
                UnwindStackLost = 18, unwind_stacks_lost, common, "unwind_stacks_lost_total",
                    "table-unwound stacks lost to a hash collision or a full stack map",
                    |h| (h.unwind_stacks_lost > 0).then(|| format!(
                        "{} table-unwound user stacks were lost (hash collision or stack map full; shown as [lost user stack])",
                        h.unwind_stacks_lost
                    ));
                LockWaits = 19, lock_waits, locks, "lock_waits_timed_total",
                    "lock waits the kernel timed (each once, whether its record was kept or not)",
                    |_| None;
                LockMapFull = 20, lock_map_full, locks, "lock_map_full_total",
                    "lock waits not recorded because a lock map was full",
                    |h| (h.lock_map_full > 0).then(|| format!(
                        "{} lock waits were not recorded (a lock map was full): the totals are low by that many waits",
                        h.lock_map_full
                    ));
                BuildIdMapFull = 21, build_id_map_full, samples, "build_id_map_full_total",
                    "frame-pointer stacks not resolved by build ID because their map was full",
                    |h| (h.build_id_map_full > 0).then(|| format!(
                        "{} frame-pointer stacks were not resolved by build ID (their map was full): frames of processes gone before their map was read may show as [unknown]",
                        h.build_id_map_full
                    ));
                // A command's or an exec's first sample or two always come before its tables:
                // said only where it is a share worth knowing (many short-lived processes).
                UnwindBeforeTables = 22, unwind_before_tables, samples, "samples_before_unwind_tables_total",
                    "samples taken before their process's unwind tables were loaded (it had just started or exec'd): user stacks by frame pointers",
                    |h| (h.unwind_before_tables > 0 && h.unwind_before_tables * 100 >= h.samples).then(|| format!(
                        "{} user stacks (of samples, or of traced hits) were taken before their process's unwind tables were loaded (it had just started or exec'd): they come from frame pointers and may stop early",
                        h.unwind_before_tables
                    ));
                SwitchOutsMissed = 23, switch_outs_missed, sched, "switch_outs_missed_total",
                    "switch-ins of a task whose switch-out the kernel's tracepoint never showed; that run and its wait are settled from the kernel's own totals at the switch-in",
                    |h| (h.switch_outs_missed > 0).then(|| format!(
                        "{} switch-outs were never shown by the kernel's tracepoint (the task was seen switched in again): those runs and waits are the kernel's own totals, settled at the next switch-in; the time off the CPU between is not known",
                        h.switch_outs_missed
                    ));
                SyscallThreadsFull = 24, syscall_threads_full, syscalls, "syscall_threads_full_total",
                    "system calls not timed because the per-thread map of calls in progress was full",
                    |h| (h.syscall_threads_full > 0).then(|| format!(
                        "{} system calls were not counted: the map of threads in a call was full",
                        h.syscall_threads_full
                    ));
                SyscallTotalsFull = 25, syscall_totals_full, syscalls, "syscall_totals_full_total",
                    "system calls not counted because the map of sums per thread and call was full",
                    |h| (h.syscall_totals_full > 0).then(|| format!(
                        "{} system calls were not counted: the map of sums per thread and call was full",
                        h.syscall_totals_full
                    ));
                LatencyStartsFull = 26, latency_starts_full, latency, "latency_starts_full_total",
                    "starts of `latency` not kept because the map of starts waiting for their end was full",
                    |h| (h.latency_starts_full > 0).then(|| format!(
                        "{} starts were not timed: the map of starts waiting for their end was full (starts that never end fill it)",
                        h.latency_starts_full
                    ));
                SlowCallsLost = 27, slow_calls_lost, syscalls, "slow_calls_lost_total",
                    "calls over `trace --duration-min` not listed because their ring was full",
                    |h| (h.slow_calls_lost > 0).then(|| format!(
                        "{} calls over the --duration-min threshold were not listed: their ring buffer was full (they are in the summary)",
                        h.slow_calls_lost
                    ));
                SlowIntervalsLost = 28, slow_intervals_lost, latency, "slow_intervals_lost_total",
                    "intervals over `latency --duration-min` not listed because their ring was full",
                    |h| (h.slow_intervals_lost > 0).then(|| format!(
                        "{} intervals over the --duration-min threshold were not listed: their ring buffer was full (they are in the histogram)",
                        h.slow_intervals_lost
                    ));
                PythonFrames = 29, python_frames, common, "python_frames_total",
                    "Python frames read from interpreters' memory into walked user stacks",
                    |_| None;
                PythonCut = 30, python_cut, common, "python_stacks_cut_total",
                    "walked stacks whose Python frames stopped early: the thread's state was not found (a subinterpreter's thread) or a frame could not be read (the evaluation loop's frame is kept)",
                    |h| (h.python_cut > 0).then(|| format!(
                        "{} stacks lost their Python frames from some point on: the thread's state was not found (a subinterpreter's thread?) or a frame could not be read; the interpreter's own frame stands there instead",
                        h.python_cut
                    ));
                SwitchInsMissed = 31, switch_ins_missed, sched, "switch_ins_missed_total",
                    "switch-outs (and exits) of a task whose last switch-in the kernel's tracepoint never showed; its open sleep is closed there, at the wake-up that ended it, or there where none was seen",
                    |h| (h.switch_ins_missed > 0).then(|| format!(
                        "{} switch-ins were never shown by the kernel's tracepoint (the task was seen switched out again, or exiting, while asleep): each of those sleeps ends at its wake-up, or at that switch-out where none was seen, with the stack it began on",
                        h.switch_ins_missed
                    ));
                StacksReused = 32, offcpu_stacks_reused, sched, "offcpu_stacks_reused_total",
                    "sleeps whose user stack was the thread's previous one, taken again without a walk: the same registers, mappings and epoch, and every stack word the walk read unchanged",
                    |_| None;
                StackReuseWrong = 33, offcpu_stack_reuse_wrong, sched, "offcpu_stack_reuse_wrong_total",
                    "with BPFPROF_CHECK_STACK_REUSE=1 (every sleep walked, reuse only checked): walks whose stack was not the one reuse would have given",
                    |h| (h.offcpu_stack_reuse_wrong > 0).then(|| format!(
                        "{} walked off-CPU stacks differed from the stack reuse would have given them (BPFPROF_CHECK_STACK_REUSE): a bpfprof bug, please report it",
                        h.offcpu_stack_reuse_wrong
                    ));
                // A command's loader maps its libraries moments after the exec announced it:
                // said only where it is a share worth knowing, like the walks before tables.
                UnwindStale = 34, unwind_stale, common, "unwind_stale_total",
                    "table walks that began in code mapped since their process's tables were given (a library just loaded; the tables are read again): from there by frame pointers",
                    |h| (h.unwind_stale > 0 && h.unwind_stale * 100 >= h.unwind_walks).then(|| format!(
                        "{} of {} table-unwound user stacks began in code mapped after their process's unwind tables were given (a library just loaded; the tables were read again): they come from frame pointers from there and may stop early",
                        h.unwind_stale, h.unwind_walks
                    ));
                // CPython 3.11 and 3.12 point the thread at the evaluation loop's new C frame a
                // few instructions before writing the Python frame into it: a sample there reads
                // a stale word. Counted apart from `python_cut`, which stays a sign of a fault.
                PythonEntering = 35, python_entering, common, "python_stacks_entering_total",
                    "walked stacks whose innermost function was the evaluation loop and whose first Python frame could not be read (3.11 and 3.12 publish it a few instructions after entering the loop): the loop's own frame stands for their Python frames",
                    |h| (h.python_entering > 0 && h.python_entering * 100 >= h.unwind_walks).then(|| format!(
                        "{} stacks were taken as the evaluation loop was entering a Python call, before it published the frame: their Python frames were not read (the loop's own frame stands there)",
                        h.python_entering
                    ));
                ProcessesLabelled = 36, processes_labelled, common, "processes_labelled_total",
                    "processes announced for their labels alone (executable, name, cgroup), once per image: at their exec, or first preempted (a process seen only running and waiting for a CPU has no other announcement)",
                    |_| None;
            }
            user {
                processes_not_captured, common, "processes_not_captured_total",
                    "processes with samples whose memory map could not be read before they exited",
                    |h| (h.processes_not_captured > 0).then(|| format!(
                        "{} processes exited before their memory map could be read: their user frames are [unknown] where the kernel could not name the file by build ID",
                        h.processes_not_captured
                    ));
                user_frames_by_build_id, common, "user_frames_by_build_id_total",
                    "user frames outside every memory map read, named by the kernel's build ID and file offset through a file another process maps",
                    |h| (h.user_frames_by_build_id > 0).then(|| format!(
                        "{} user frames outside any memory map read (processes gone before it was, a child before its exec) were resolved by the kernel's build ID and file offset",
                        h.user_frames_by_build_id
                    ));
                python_unnamed, common, "python_frames_unnamed_total",
                    "Python frames not named (shown as [unknown] in [unmapped]): their process exited before their code object was read, or past the bounds on names kept",
                    |h| (h.python_unnamed > 0).then(|| format!(
                        "{} Python frames could not be named (shown as [unknown] in [unmapped]): their process exited before their code object was read, or past the bounds on names kept",
                        h.python_unnamed
                    ));
                drains, common, "drains_total",
                    "how many times the kernel maps were drained",
                    |_| None;
                program_runs_missed, common, "bpf_program_runs_missed_total",
                    "runs of bpfprof's programs the kernel skipped because a BPF program was already running on that CPU (a tracepoint hit inside another program): each a sample, switch or event not seen",
                    |h| (h.program_runs_missed > 0).then(|| format!(
                        "{} runs of bpfprof's programs were skipped by the kernel (a BPF program was already running on that CPU): as many samples, switches or events are missing",
                        h.program_runs_missed
                    ));
                slow_events, sched, "slow_events_total",
                    "run-queue waits over the slow threshold",
                    |_| None;
                files_without_tables, common, "files_without_tables",
                    "executables and libraries without a usable unwind table (walked with frame pointers)",
                    |h| (h.files_without_tables > 0).then(|| {
                        const SHOWN: usize = 3;
                        let named = &h.files_without_tables_named;
                        let more = match named.len().saturating_sub(SHOWN) {
                            0 => String::new(),
                            n => format!(" and {n} more"),
                        };
                        format!(
                            "{} executables or libraries have no usable unwind table, their frames were walked with frame pointers: {}{more}",
                            h.files_without_tables,
                            named[..named.len().min(SHOWN)].join("; ")
                        )
                    });
            }
        }
    };
}

/// Makes the kernel's enum of the table's kernel rows.
macro_rules! health_counter_enum {
    (
        kernel { $($variant:ident = $slot:literal, $field:ident, $source:ident, $metric:literal, $help:literal, $warn:expr;)* }
        user { $($user:ident, $usource:ident, $umetric:literal, $uhelp:literal, $uwarn:expr;)* }
    ) => {
        /// Slots of the per-CPU `HEALTH` array the kernel programs count in (see `health_table!`).
        #[repr(u32)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum HealthCounter {
            $(#[doc = $help] $variant = $slot,)*
        }

        impl HealthCounter {
            pub const ALL: [HealthCounter; HEALTH_COUNTERS as usize] = [$(HealthCounter::$variant,)*];
        }

        /// How many health counters the kernel keeps.
        pub const HEALTH_COUNTERS: u32 = [$($slot,)*].len() as u32;
    };
}

health_table!(health_counter_enum);

// The slots are 0..N in order, as the per-CPU array is indexed.
const _: () = {
    let mut i = 0;
    while i < HealthCounter::ALL.len() {
        assert!(HealthCounter::ALL[i] as usize == i);
        i += 1;
    }
};
