//! `bpfprof trace -s`: the system calls of a command, processes or the whole system, per
//! thread, as `perf trace -s` and `strace -c` give them: calls, errors by errno, total, average,
//! shortest and longest time. Collected by the `syscalls` source (summed in the kernel); this
//! module is its sink and its report. With `--duration-min`, each call at least that long is
//! listed too (`slow`).
use std::collections::BTreeMap;

use profiler_common::syscalls::{SyscallTotals, NO_RETURN};
use serde::Serialize;

use crate::{
    cli::TraceArgs,
    collect::comm_string,
    plan::Plan,
    report::command,
    session::run_to_end,
    sources::{syscalls::SyscallBatch, Batch},
};
use slow::SlowCallsReport;

pub mod render;
pub mod slow;
#[cfg(test)]
mod tests;

pub fn run(args: TraceArgs) -> anyhow::Result<i32> {
    let format = command::checked_format(&args.report, "trace", &[])?;
    let plan = Plan::for_trace(&args)?;
    let mut ended = run_to_end(&plan)?;
    let batch = ended
        .take(|batch| match batch {
            Batch::Syscalls(batch) => Some(batch),
            _ => None,
        })
        .unwrap_or_default();
    let mut report = TraceReport::of(plan.target_description(), ended.seconds, &batch, ended.notes);
    if let Some(min_ns) = plan.syscalls.slow_ns {
        let tracefs = crate::counters::tracepoint::tracefs_root();
        let lost = ended.health.slow_calls_lost;
        report.slow = Some(SlowCallsReport::of(
            min_ns,
            &batch.slow,
            lost,
            tracefs,
            &ended.procs,
        ));
    }
    command::write(plan.output.as_deref(), format, "trace", &report, render::text)?;
    Ok(ended.exit_code)
}

/// The summary: every thread that made a call, the busiest first.
#[derive(Clone, Debug, Serialize)]
pub struct TraceReport {
    pub target: String,
    pub seconds: f64,
    /// Every call counted, of every thread.
    pub calls: u64,
    pub threads: Vec<ThreadCalls>,
    /// `--duration-min`: each call at least that long.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slow: Option<SlowCallsReport>,
    pub notes: Vec<String>,
}

/// One thread's calls, the longest in total first.
#[derive(Clone, Debug, Serialize)]
pub struct ThreadCalls {
    pub pid: u32,
    pub tid: u32,
    pub comm: String,
    pub calls: u64,
    pub syscalls: Vec<CallStat>,
}

/// One system call of one thread.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct CallStat {
    pub name: String,
    pub nr: u32,
    /// Every call: returned, never returned and still in progress at the stop.
    pub calls: u64,
    /// Calls that returned an error, and how many of each errno (`ENOENT`).
    pub errors: u64,
    pub errnos: BTreeMap<String, u64>,
    /// Of the calls that returned: their time.
    pub total_ns: u64,
    pub min_ns: u64,
    pub avg_ns: u64,
    pub max_ns: u64,
    /// Calls that never returned: `exit`, `exit_group`.
    pub no_return: u64,
    /// Calls the thread was still in when tracing stopped (not timed).
    pub in_progress: u64,
}

impl CallStat {
    /// The calls that returned (and were timed).
    pub(crate) fn returned(&self) -> u64 {
        self.calls - self.no_return - self.in_progress
    }

    /// One of the kernel's sums (all of them before any call in progress is added).
    fn add(&mut self, errno: u32, totals: &SyscallTotals) {
        let returned_before = self.returned();
        self.calls += totals.calls;
        match errno {
            NO_RETURN => self.no_return += totals.calls,
            errno => {
                let first = returned_before == 0;
                if errno != 0 {
                    self.errors += totals.calls;
                    *self.errnos.entry(errno_name(errno)).or_default() += totals.calls;
                }
                self.total_ns += totals.total_ns;
                self.max_ns = self.max_ns.max(totals.max_ns);
                self.min_ns = match first {
                    true => totals.min_ns,
                    false => self.min_ns.min(totals.min_ns),
                };
                self.avg_ns = self.total_ns / self.returned();
            }
        }
    }
}

/// Per (process, thread, call), its row.
type Rows = BTreeMap<(u32, u32, u32), CallStat>;
/// Per (process, thread), its names and on how many calls it had each.
type Names = BTreeMap<(u32, u32), BTreeMap<String, u64>>;

impl TraceReport {
    pub fn of(target: String, seconds: f64, batch: &SyscallBatch, notes: Vec<String>) -> TraceReport {
        let (rows, names) = rows(batch);
        let threads = threads(rows, names);
        TraceReport {
            target,
            seconds,
            calls: threads.iter().map(|t| t.calls).sum(),
            threads,
            slow: None,
            notes,
        }
    }
}

/// The kernel's sums folded into one row per (thread, call), and each thread's names (its name
/// at the first call of each sum; a thread still in a call at the stop, as /proc says it now).
fn rows(batch: &SyscallBatch) -> (Rows, Names) {
    let mut rows = Rows::new();
    let mut names = Names::new();
    for (key, totals) in &batch.totals {
        let name = names.entry((key.tgid, key.tid)).or_default();
        *name.entry(comm_string(&totals.comm)).or_default() += totals.calls;
        call_of(&mut rows, key.tgid, key.tid, key.nr).add(key.errno, totals);
    }
    for &(tgid, tid, nr) in &batch.in_progress {
        let name = names.entry((tgid, tid)).or_default();
        *name
            .entry(crate::process::comm_of(tid).unwrap_or_default())
            .or_default() += 1;
        let stat = call_of(&mut rows, tgid, tid, nr);
        stat.calls += 1;
        stat.in_progress += 1;
    }
    (rows, names)
}

/// Each thread with its rows, named as it was on most of its calls; the most calls first, and
/// each thread's calls the longest in total first.
fn threads(rows: Rows, names: Names) -> Vec<ThreadCalls> {
    let mut threads: BTreeMap<(u32, u32), ThreadCalls> = names
        .into_iter()
        .map(|((pid, tid), names)| {
            let comm = names
                .into_iter()
                .max_by_key(|(_, calls)| *calls)
                .map(|(name, _)| name);
            let thread = ThreadCalls {
                pid,
                tid,
                comm: comm.unwrap_or_default(),
                calls: 0,
                syscalls: Vec::new(),
            };
            ((pid, tid), thread)
        })
        .collect();
    for ((tgid, tid, _), stat) in rows {
        let thread = threads
            .get_mut(&(tgid, tid))
            .expect("every call's thread is named");
        thread.calls += stat.calls;
        thread.syscalls.push(stat);
    }
    let mut threads: Vec<ThreadCalls> = threads.into_values().collect();
    for thread in &mut threads {
        thread
            .syscalls
            .sort_by(|a, b| b.total_ns.cmp(&a.total_ns).then(b.calls.cmp(&a.calls)));
    }
    threads.sort_by(|a, b| b.calls.cmp(&a.calls).then(a.tid.cmp(&b.tid)));
    threads
}

/// The row of one (process, thread, call), new if it has none yet.
fn call_of(rows: &mut Rows, tgid: u32, tid: u32, nr: u32) -> &mut CallStat {
    rows.entry((tgid, tid, nr)).or_insert_with(|| CallStat {
        name: syscall_name(nr),
        nr,
        ..CallStat::default()
    })
}

/// The running architecture's name of a call (`read`), or its number where the table has none.
pub fn syscall_name(nr: u32) -> String {
    syscalls::Sysno::new(nr as usize).map_or_else(|| format!("syscall_{nr}"), |s| s.name().to_string())
}

/// `ENOENT`; the kernel-internal errnos a call interrupted by a signal returns (`ERESTARTSYS`:
/// restarted, or cut short by a fatal signal); else the number.
pub fn errno_name(errno: u32) -> String {
    const KERNEL_INTERNAL: [&str; 5] = [
        "ERESTARTSYS",
        "ERESTARTNOINTR",
        "ERESTARTNOHAND",
        "ENOIOCTLCMD",
        "ERESTART_RESTARTBLOCK",
    ];
    if let Some(name) = errno
        .checked_sub(512)
        .and_then(|i| KERNEL_INTERNAL.get(i as usize))
    {
        return name.to_string();
    }
    match nix::errno::Errno::from_raw(errno as i32) {
        nix::errno::Errno::UnknownErrno => format!("errno {errno}"),
        known => format!("{known:?}"),
    }
}
