//! The scheduler's records of one thread and of one slow wait, as user space keeps them.
use profiler_common::{switch_reason, TaskSched, HIST_BUCKETS};

use crate::{collect::comm_string, process::tgid_of};

/// How many slow waits a report keeps (the longest).
pub const SLOW_EVENTS_KEPT: usize = 50;

/// One task's scheduling statistics as collected (several entries for a reused tid).
#[derive(Clone, Debug)]
pub struct TaskRecord {
    pub pid: u32,
    pub tid: u32,
    pub comm: String,
    pub runs: u64,
    pub delays: u64,
    pub total_delay_ns: u64,
    pub max_delay_ns: u64,
    pub max_at_ns: u64,
    pub running_ns: u64,
    pub sleeping_ns: u64,
    pub blocked_ns: u64,
    pub hist: Vec<u32>,
    /// The state a task was still in when the run ended, and for how long so far.
    pub open: Option<(OpenState, u64)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenState {
    Running,
    Runnable,
    Sleeping,
    Blocked,
}

impl TaskRecord {
    fn add_wait(&mut self, delay: u64, ended_ns: u64) {
        self.delays += 1;
        self.total_delay_ns += delay;
        if delay > self.max_delay_ns {
            (self.max_delay_ns, self.max_at_ns) = (delay, ended_ns);
        }
        if let Some(count) = self.hist.get_mut(profiler_common::hist_bucket(delay)) {
            *count += 1;
        }
    }

    /// A task still alive at `now`: what it was doing, since when.
    pub(super) fn with_open_interval(mut self, t: &TaskSched, now: u64) -> Self {
        let since = |at: u64| now.saturating_sub(at);
        if t.enqueued.at_ns != 0 && t.offcpu.at_ns != 0 && t.enqueued.at_ns > t.offcpu.at_ns {
            // Woken, not yet on a CPU: the sleep before the wake-up is over.
            let slept = t.enqueued.at_ns - t.offcpu.at_ns;
            match t.offcpu.reason {
                switch_reason::BLOCKED => self.blocked_ns += slept,
                _ => self.sleeping_ns += slept,
            }
        }
        self.open = if t.enqueued.at_ns != 0 {
            Some((OpenState::Runnable, since(t.enqueued.at_ns)))
        } else if t.offcpu.at_ns != 0 {
            let state = match t.offcpu.reason {
                switch_reason::BLOCKED => OpenState::Blocked,
                _ => OpenState::Sleeping,
            };
            Some((state, since(t.offcpu.at_ns)))
        } else if t.last_in_ns != 0 {
            if let Some(delay) = open_wait(t) {
                self.add_wait(delay, t.last_in_ns);
                self.runs += 1;
            }
            Some((OpenState::Running, since(t.last_in_ns)))
        } else {
            None
        };
        self
    }
}

/// The wait before the run of a task still running at the end, on its `last_cpu`: the kernel's
/// figures for a run and the wait before it are read as the run ends, which this one has not,
/// so the wait as the tracepoints timed it (none: not running, or no wait seen before the run).
pub(super) fn open_wait(t: &TaskSched) -> Option<u64> {
    let running = t.last_in_ns != 0 && t.enqueued.at_ns == 0 && t.offcpu.at_ns == 0;
    // (The arrival is the run queue's clock, which a wake-up onto an idle CPU leaves where it read
    // it before the wake-up's own stamp: a wait of none.)
    let waited = t.kernel_accounting != 0 && t.last_wait.at_ns != 0;
    (running && waited).then(|| t.last_in_ns.saturating_sub(t.last_wait.at_ns))
}

#[cfg(test)]
impl TaskRecord {
    /// A task of pid 1 that waited these times for a CPU, each wait followed by a run.
    pub(crate) fn with_waits(tid: u32, comm: &str, waits: &[u64]) -> TaskRecord {
        let mut hist = vec![0u32; profiler_common::HIST_BUCKETS];
        for &w in waits {
            hist[profiler_common::hist_bucket(w)] += 1;
        }
        TaskRecord {
            pid: 1,
            tid,
            comm: comm.to_string(),
            runs: waits.len() as u64,
            delays: waits.len() as u64,
            total_delay_ns: waits.iter().sum(),
            max_delay_ns: waits.iter().copied().max().unwrap_or(0),
            max_at_ns: 0,
            running_ns: 0,
            sleeping_ns: 0,
            blocked_ns: 0,
            hist,
            open: None,
        }
    }
}

impl From<&TaskSched> for TaskRecord {
    fn from(t: &TaskSched) -> Self {
        TaskRecord {
            // A thread that never switched out under bpfprof (the kernel side learns a tgid
            // only then): its process, while it is alive.
            pid: if t.tgid != 0 {
                t.tgid
            } else {
                tgid_of(t.tid).unwrap_or(0)
            },
            tid: t.tid,
            comm: comm_string(&t.comm),
            runs: t.runs,
            delays: t.delays,
            total_delay_ns: t.total_delay_ns,
            max_delay_ns: t.max_delay_ns,
            max_at_ns: t.max_at_ns,
            running_ns: t.running_ns,
            sleeping_ns: t.sleeping_ns,
            blocked_ns: t.blocked_ns,
            hist: t.hist.to_vec(),
            open: None,
        }
    }
}

/// A run-queue wait above the threshold, as the kernel reported it.
#[derive(Clone, Debug)]
pub struct SlowRecord {
    pub pid: u32,
    pub tid: u32,
    pub comm: String,
    /// None: settled away from the CPU it waited for (its holders are not known either).
    pub cpu: Option<u32>,
    pub delay_ns: u64,
    pub at_ns: u64,
    pub waker: Option<(u32, u32, String)>,
    /// (tid, name, start, end) of each task that held the CPU during the wait.
    pub holders: Vec<(u32, String, u64, u64)>,
}

/// A name the kernel side read; where it could not (the task had gone), what /proc says now.
pub(super) fn name_or_proc(comm: &[u8], tid: u32) -> String {
    let name = comm_string(comm);
    if !name.is_empty() || tid == 0 {
        return name;
    }
    crate::process::comm_of(tid).unwrap_or_else(|| "?".into())
}

/// Threads that neither woke, switched nor exited during the run: the kernel side never saw them,
/// yet they are part of the answer (the idle workers of a server are most of its threads). No
/// event means no change of state, so the state /proc shows now is the state of the whole run.
pub(super) fn add_quiet_threads(
    live: &mut Vec<TaskRecord>,
    threads_at_start: &[(u32, u32)],
    started_ns: u64,
    now_ns: u64,
) {
    let seen: std::collections::HashSet<u32> = live.iter().map(|t| t.tid).collect();
    let whole_run = now_ns.saturating_sub(started_ns);
    for &(pid, tid) in threads_at_start {
        if seen.contains(&tid) {
            continue;
        }
        let Ok(stat) = crate::process::read_proc(&format!("/proc/{pid}/task/{tid}/stat")) else {
            continue; // gone before tracing began (an exit during the run is an event)
        };
        let Some((comm, state)) = comm_and_state(&stat) else {
            continue;
        };
        let state = match state {
            'R' => OpenState::Running,
            'D' => OpenState::Blocked,
            // As `switch_reason::classify`: stopped, traced, parked and idle count as sleeping.
            _ => OpenState::Sleeping,
        };
        live.push(TaskRecord {
            pid,
            tid,
            comm,
            runs: 0,
            delays: 0,
            total_delay_ns: 0,
            max_delay_ns: 0,
            max_at_ns: 0,
            running_ns: 0,
            sleeping_ns: 0,
            blocked_ns: 0,
            hist: vec![0; HIST_BUCKETS],
            open: Some((state, whole_run)),
        });
    }
}

/// The name and state letter of a `/proc/PID/task/TID/stat` line: `tid (comm) S ...`, where the
/// name may itself hold spaces and parentheses.
fn comm_and_state(stat: &str) -> Option<(String, char)> {
    let (comm, fields) = crate::process::split_stat(stat)?;
    Some((comm.to_string(), fields.chars().next()?))
}

/// Only the longest `SLOW_EVENTS_KEPT` slow waits.
pub fn keep_longest(slow: &mut Vec<SlowRecord>) {
    slow.sort_by_key(|e| std::cmp::Reverse(e.delay_ns));
    slow.truncate(SLOW_EVENTS_KEPT);
}

#[cfg(test)]
mod tests {
    use super::*;
    use profiler_common::hist_bucket;

    #[test]
    fn a_run_still_going_at_the_end_brings_its_wait_where_the_kernel_has_not_counted_it_yet() {
        // SAFETY: TaskSched is plain old data; all-zero is a task with nothing recorded.
        let mut t: TaskSched = unsafe { std::mem::zeroed() };
        t.tid = 7;
        t.tgid = 7;
        (t.runs, t.delays, t.total_delay_ns) = (3, 3, 9_000);
        t.last_wait.at_ns = 1_000;
        t.last_in_ns = 5_000;
        let counted = |kernel_accounting| {
            let mut t = t;
            t.kernel_accounting = kernel_accounting;
            TaskRecord::from(&t).with_open_interval(&t, 9_000)
        };
        // The kernel's figures: this run and the wait before it are read at its switch-out.
        let kernel = counted(1);
        assert_eq!(
            (kernel.runs, kernel.delays, kernel.total_delay_ns),
            (4, 4, 13_000)
        );
        assert_eq!(kernel.hist[hist_bucket(4_000)], 1);
        assert_eq!(kernel.open, Some((OpenState::Running, 4_000)));
        // Timed at the tracepoints: both were counted as the run began.
        let tracepoints = counted(0);
        assert_eq!(
            (tracepoints.runs, tracepoints.delays, tracepoints.total_delay_ns),
            (3, 3, 9_000)
        );
        assert_eq!(tracepoints.open, Some((OpenState::Running, 4_000)));
    }

    #[test]
    fn names_and_states_are_read_past_parentheses_in_the_name() {
        assert_eq!(
            comm_and_state("42 (a) b (c)) S 1 42 0"),
            Some(("a) b (c)".to_string(), 'S'))
        );
        assert_eq!(comm_and_state("7 (w) D 1"), Some(("w".to_string(), 'D')));
        assert_eq!(comm_and_state("garbage"), None);
    }
}
