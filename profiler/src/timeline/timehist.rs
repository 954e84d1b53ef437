//! `bpfprof sched timehist FILE`: a line per run of each task, as `perf sched timehist` prints
//! them: when it left its CPU, where, its wait (off the CPU, before it was woken), its
//! run-queue delay (woken, waiting for a CPU) and its run time. The delay and run time are the
//! growth of the kernel's own totals between the task's switch-outs, as `/proc/PID/schedstat`
//! counts them, where the kernel keeps them; else the tracepoints' times. `-w` adds wake-ups,
//! `-M` migrations, `-V` a column per CPU, `-s` a summary per task.
use std::{
    collections::HashMap,
    io::{self, Write},
};

use super::{
    file::{Event, Reader, Task, What},
    task_name,
};
use crate::cli::TimehistArgs;

/// One run of a task, as a line shows it.
#[derive(Clone, Debug, PartialEq)]
pub struct Run {
    /// When it left the CPU, ns since the recording started.
    pub end_ns: u64,
    pub cpu: u32,
    pub task: Task,
    /// Off the CPU before it was woken (none: its previous switch-out was not recorded).
    pub wait_ns: Option<u64>,
    pub delay_ns: u64,
    pub run_ns: u64,
}

/// What is known of a task between its events.
#[derive(Default)]
struct Thread {
    /// Its totals (runs, delay, run time) when it last left a CPU (or, before that, when it
    /// first came on one).
    base: Option<(u64, u64, u64)>,
    last_out: Option<u64>,
    /// When it became runnable (woken, or preempted) and came on a CPU.
    ready_at: Option<u64>,
    in_at: Option<u64>,
    last_cpu: Option<u32>,
    /// Some event showed it a target (a group's last thread leaves the target set at its exit,
    /// before its last switch-out).
    target: bool,
}

/// Follows the events in time order: the runs they end, one by one.
pub struct Timeline {
    threads: HashMap<u32, Thread>,
    kernel_figures: bool,
    /// Runs whose switch-in no event showed (see `switch_out`).
    pub unseen_starts: u64,
}

impl Timeline {
    pub fn new(kernel_figures: bool) -> Timeline {
        Timeline {
            threads: HashMap::new(),
            kernel_figures,
            unseen_starts: 0,
        }
    }

    /// The run this event ends, if it ends one whose start was recorded.
    pub fn step(&mut self, event: &Event) -> Option<Run> {
        match &event.what {
            What::Switch { prev, next, state } => {
                let run = (prev.tid != 0)
                    .then(|| self.switch_out(event, prev, state))
                    .flatten();
                if next.tid != 0 {
                    self.switch_in(event, next);
                }
                run
            }
            What::Wakeup { task, .. } => {
                let thread = self.threads.entry(task.tid).or_default();
                thread.ready_at.get_or_insert(event.t);
                thread.target |= task.target;
                None
            }
            // A new task: whatever its tid held before was another's.
            What::Fork { child: task, .. } | What::WakeupNew { task, .. } => {
                let thread = self.threads.entry(task.tid).or_default();
                *thread = Thread {
                    ready_at: Some(event.t),
                    target: task.target,
                    ..Thread::default()
                };
                None
            }
            What::Migrate { task, to } => {
                self.threads.entry(task.tid).or_default().last_cpu = Some(*to);
                None
            }
            // Its last switch-out (state X) still comes, and forgets the task.
            What::Exit { .. } => None,
        }
    }

    fn switch_in(&mut self, event: &Event, next: &Task) {
        let thread = self.threads.entry(next.tid).or_default();
        thread.in_at = Some(event.t);
        thread.last_cpu = Some(event.cpu);
        thread.target |= next.target;
        // A base left by a task that had this tid before (its end unseen) is not this one's:
        // the kernel's totals of one task never go back.
        if thread.base.is_none_or(|(pcount, ..)| next.pcount < pcount) {
            thread.base = Some((next.pcount, next.run_delay_ns, next.sum_exec_ns));
        }
    }

    fn switch_out(&mut self, event: &Event, prev: &Task, state: &str) -> Option<Run> {
        let kernel_figures = self.kernel_figures;
        let mut unseen_start = false;
        let thread = self.threads.entry(prev.tid).or_default();
        let task = Task {
            target: prev.target || thread.target,
            ..prev.clone()
        };
        let run = match (thread.in_at, thread.base) {
            // Its switch-in was not seen (the kernel now and then counts an arrival with no
            // `sched_switch` event): the kernel's totals still say what the run was, not when
            // it began.
            (None, Some((pcount, run_delay, sum_exec))) if kernel_figures && prev.pcount > pcount => {
                unseen_start = true;
                Some(Run {
                    end_ns: event.t,
                    cpu: event.cpu,
                    task: task.clone(),
                    wait_ns: None,
                    delay_ns: prev.run_delay_ns.saturating_sub(run_delay),
                    run_ns: prev.sum_exec_ns.saturating_sub(sum_exec),
                })
            }
            (Some(in_at), Some((_, run_delay, sum_exec))) => {
                let (delay_ns, run_ns) = match kernel_figures {
                    true => (
                        prev.run_delay_ns.saturating_sub(run_delay),
                        prev.sum_exec_ns.saturating_sub(sum_exec),
                    ),
                    false => (
                        thread.ready_at.map_or(0, |ready| in_at.saturating_sub(ready)),
                        event.t.saturating_sub(in_at),
                    ),
                };
                Some(Run {
                    end_ns: event.t,
                    cpu: event.cpu,
                    task: task.clone(),
                    wait_ns: thread
                        .last_out
                        .map(|out| in_at.saturating_sub(out).saturating_sub(delay_ns)),
                    delay_ns,
                    run_ns,
                })
            }
            _ => None,
        };
        thread.base = Some((prev.pcount, prev.run_delay_ns, prev.sum_exec_ns));
        thread.last_out = Some(event.t);
        thread.in_at = None;
        // Preempted: runnable from now on.
        thread.ready_at = (state == "R").then_some(event.t);
        if state == "X" || state == "Z" {
            self.threads.remove(&prev.tid);
        }
        self.unseen_starts += u64::from(unseen_start);
        run
    }

    /// The CPU the task was last seen on.
    pub fn last_cpu(&self, tid: u32) -> Option<u32> {
        self.threads.get(&tid).and_then(|t| t.last_cpu)
    }
}

/// Per task, `-s`'s figures.
#[derive(Default)]
struct Summary {
    task: Task,
    runs: u64,
    run_ns: u64,
    min_run_ns: u64,
    max_run_ns: u64,
    delay_ns: u64,
    max_delay_ns: u64,
    migrations: u64,
}

pub fn run(args: TimehistArgs) -> anyhow::Result<i32> {
    let mut reader = Reader::open(&args.input)?;
    super::show(&mut reader, |reader, out| print(&args, reader, out))
}

/// The lines, then the summary if asked. A `UserError` inside an `io::Error`: the file.
pub(crate) fn print(args: &TimehistArgs, reader: &mut Reader, out: &mut dyn Write) -> io::Result<()> {
    let started = reader.header.started_ns;
    let cpus = reader.header.cpus as usize;
    let visual = args.cpu_visual.then_some(cpus);
    let mut timeline = Timeline::new(reader.header.kernel_figures);
    let mut summaries: HashMap<u32, Summary> = HashMap::new();
    let shown = |task: &Task, t: u64| {
        task.target
            && (args.tids.is_empty() || args.tids.contains(&task.tid))
            && args
                .since
                .is_none_or(|s| t >= started.saturating_add((s * 1e9) as u64))
            && args
                .until
                .is_none_or(|u| t <= started.saturating_add((u * 1e9) as u64))
    };
    if !args.summary_only {
        header(out, visual)?;
    }
    while let Some(event) = reader.next_event().map_err(io::Error::other)? {
        let since = event.t.saturating_sub(started);
        if let What::Migrate { task, to } = &event.what {
            let from = timeline.last_cpu(task.tid);
            if shown(task, event.t) {
                summaries.entry(task.tid).or_default().migrations += 1;
                if args.migrations && !args.summary_only {
                    let from = from.map_or("?".to_string(), |c| c.to_string());
                    let what = format!("migrated: {} cpu {from} => {to}", task_name(task));
                    note_line(out, since, event.cpu, visual, 'm', &what)?;
                }
            }
        }
        if let What::Wakeup { task, waker } | What::WakeupNew { task, waker } = &event.what {
            if args.wakeups && !args.summary_only && shown(task, event.t) {
                let what = format!("{}  awakened: {}", task_name(waker), task_name(task));
                note_line(out, since, event.cpu, visual, 'w', &what)?;
            }
        }
        let Some(run) = timeline.step(&event) else {
            continue;
        };
        if !shown(&run.task, event.t) {
            continue;
        }
        add(summaries.entry(run.task.tid).or_default(), &run);
        if !args.summary_only {
            run_line(out, &run, started, visual)?;
        }
    }
    if args.summary || args.summary_only {
        summary(out, summaries)?;
    }
    if timeline.unseen_starts > 0 {
        eprintln!(
            "bpfprof: {} runs began with no switch event from the kernel: their delay and run time are the kernel's totals, their wait unknown (-)",
            timeline.unseen_starts
        );
    }
    Ok(())
}

fn add(summary: &mut Summary, run: &Run) {
    summary.task = run.task.clone();
    summary.min_run_ns = match summary.runs {
        0 => run.run_ns,
        _ => summary.min_run_ns.min(run.run_ns),
    };
    summary.runs += 1;
    summary.run_ns = summary.run_ns.saturating_add(run.run_ns);
    summary.max_run_ns = summary.max_run_ns.max(run.run_ns);
    summary.delay_ns = summary.delay_ns.saturating_add(run.delay_ns);
    summary.max_delay_ns = summary.max_delay_ns.max(run.delay_ns);
}

fn ms(ns: u64) -> String {
    format!("{:.3}", ns as f64 / 1e6)
}

fn seconds(ns: u64) -> String {
    format!("{:.6}", ns as f64 / 1e9)
}

/// The CPU column of `-V`: a mark at the event's CPU.
fn visual_column(cpus: usize, cpu: u32, mark: char) -> String {
    (0..cpus)
        .map(|c| if c == cpu as usize { mark } else { ' ' })
        .collect()
}

fn header(out: &mut dyn Write, visual: Option<usize>) -> io::Result<()> {
    let v = visual.map_or(String::new(), |n| format!(" {:<n$}", ""));
    let dashes = visual.map_or(String::new(), |n| format!(" {}", "-".repeat(n)));
    writeln!(
        out,
        "{:>15}  {:>6}{v}  {:<32}  {:>9}  {:>9}  {:>9}",
        "time", "cpu", "task name", "wait time", "sch delay", "run time"
    )?;
    writeln!(
        out,
        "{:>15}  {:>6}{v}  {:<32}  {:>9}  {:>9}  {:>9}",
        "(s)", "", "[tid/pid]", "(msec)", "(msec)", "(msec)"
    )?;
    writeln!(
        out,
        "{} {}{dashes}  {}  {}  {}  {}",
        "-".repeat(15),
        "-".repeat(7),
        "-".repeat(32),
        "-".repeat(9),
        "-".repeat(9),
        "-".repeat(9)
    )
}

fn run_line(out: &mut dyn Write, run: &Run, started: u64, visual: Option<usize>) -> io::Result<()> {
    let v = visual.map_or(String::new(), |n| format!(" {}", visual_column(n, run.cpu, 's')));
    writeln!(
        out,
        "{:>15}  [{:04}]{v}  {:<32}  {:>9}  {:>9}  {:>9}",
        seconds(run.end_ns.saturating_sub(started)),
        run.cpu,
        task_name(&run.task),
        run.wait_ns.map_or("-".to_string(), ms),
        ms(run.delay_ns),
        ms(run.run_ns)
    )
}

fn note_line(
    out: &mut dyn Write,
    since: u64,
    cpu: u32,
    visual: Option<usize>,
    mark: char,
    what: &str,
) -> io::Result<()> {
    let v = visual.map_or(String::new(), |n| format!(" {}", visual_column(n, cpu, mark)));
    writeln!(out, "{:>15}  [{cpu:04}]{v}  {what}", seconds(since))
}

fn summary(out: &mut dyn Write, summaries: HashMap<u32, Summary>) -> io::Result<()> {
    let mut rows: Vec<Summary> = summaries.into_values().filter(|s| s.runs > 0).collect();
    rows.sort_by_key(|s| (std::cmp::Reverse(s.run_ns), s.task.tid));
    writeln!(out, "\nRuntime summary")?;
    writeln!(
        out,
        "{:<32}  {:>8}  {:>12}  {:>9}  {:>9}  {:>9}  {:>12}  {:>9}  {:>5}",
        "task name [tid/pid]", "runs", "run (msec)", "min", "avg", "max", "delay (msec)", "max", "migr"
    )?;
    for s in &rows {
        writeln!(
            out,
            "{:<32}  {:>8}  {:>12}  {:>9}  {:>9}  {:>9}  {:>12}  {:>9}  {:>5}",
            task_name(&s.task),
            s.runs,
            ms(s.run_ns),
            ms(s.min_run_ns),
            ms(s.run_ns / s.runs),
            ms(s.max_run_ns),
            ms(s.delay_ns),
            ms(s.max_delay_ns),
            s.migrations
        )?;
    }
    let (runs, run_ns): (u64, u64) =
        (rows.iter()).fold((0, 0), |(r, t), s| (r + s.runs, t.saturating_add(s.run_ns)));
    writeln!(
        out,
        "\n{} tasks, {runs} runs, {} msec run time",
        rows.len(),
        ms(run_ns)
    )
}
