//! The terminal report: health first, then top functions by self and total, then hot stacks.
use std::io::{self, Write};

use super::{
    human_ns,
    names::{describe, short_module, short_name},
    percent, Renderer,
};
use crate::{
    cli::LockSource,
    model::{FunctionStat, StackReport},
    modes::{
        lock::{lock_label, LockReport, LockStat, WaitClass},
        sched::SchedReport,
        topdown::TopdownReport,
    },
};

pub struct Text;

const TOP_FUNCTIONS: usize = 25;
const TOP_STACKS: usize = 10;
const MAX_FRAMES_SHOWN: usize = 48;
/// The function column of the function tables.
const FUNCTION_WIDTH: usize = 40;
/// A lock's name (its symbol, or its address and the function that waited for it).
const LOCK_NAME_WIDTH: usize = 60;

const TOP_TASKS: usize = 30;
const TOP_LOCKS: usize = 10;
const LOCK_STACKS_SHOWN: usize = 3;
/// Frames of a waiter or holder stack shown under each lock (the callers that matter are near
/// the leaf; --format json has them all).
const LOCK_FRAMES_SHOWN: usize = 8;

impl Renderer for Text {
    fn lock(&self, r: &LockReport, out: &mut dyn Write) -> io::Result<()> {
        let m = &r.meta;
        let contended: Vec<&LockStat> = r.of_class(WaitClass::Contention).collect();
        let events: Vec<&LockStat> = r.of_class(WaitClass::Waiting).collect();
        let total = |locks: &[&LockStat]| locks.iter().fold(0u64, |t, l| t.saturating_add(l.total_wait_ns));
        let worst = match contended.first() {
            Some(lock) => format!(", worst {} ({})", lock_name(lock), human_ns(lock.total_wait_ns)),
            None => String::new(),
        };
        writeln!(
            out,
            "bpfprof lock ({} waits): {} | {:.1} s | {} contended locks, {} waited in all{worst}",
            r.source.name(),
            m.target,
            m.duration_s,
            contended.len(),
            human_ns(total(&contended))
        )?;
        if !events.is_empty() {
            writeln!(
                out,
                "  apart: {} waits for events (condition variables, joins, barriers), {} waited in all",
                events.len(),
                human_ns(total(&events))
            )?;
        }
        for note in &m.notes {
            writeln!(out, "note: {note}")?;
        }
        for warning in r.health.warnings() {
            writeln!(out, "warning: {warning}")?;
        }
        if contended.is_empty() {
            writeln!(
                out,
                "\nNo contended lock: no thread waited for a lock another thread held during the run."
            )?;
        } else {
            writeln!(out, "\nContention: locks by total wait (stacks leaf first)")?;
            lock_entries(r, &contended, out)?;
        }
        if !events.is_empty() {
            writeln!(
                out,
                "\nWaiting for events, not contention: threads with nothing to do until a condition variable \
                 is signalled, a thread exits or a barrier fills (stacks leaf first)"
            )?;
            lock_entries(r, &events, out)?;
        }
        Ok(())
    }

    fn topdown(&self, r: &TopdownReport, out: &mut dyn Write) -> io::Result<()> {
        if r.threads.is_empty() {
            // From a counters file: no run, no threads.
            if let Some(tma) = &r.tma {
                return tma_text(r, tma, out);
            }
        }
        let m = &r.meta;
        writeln!(
            out,
            "bpfprof topdown: {} | {:.1} s | {} CPUs",
            m.target, m.duration_s, m.cpus
        )?;
        if r.source != "pmu" {
            writeln!(out, "No pipeline-slot breakdown: {}.", r.reason)?;
        }
        writeln!(out, "{}", r.cpu)?;
        for note in &m.notes {
            writeln!(out, "note: {note}")?;
        }
        for warning in r.health.warnings() {
            writeln!(out, "warning: {warning}")?;
        }
        if let Some(tma) = &r.tma {
            tma_sections(tma, out)?;
        }
        if let Some(preset) = r.preset {
            writeln!(
                out,
                "
Counters ({preset} set, whole run, scaled where multiplexed)"
            )?;
            for c in &r.counters {
                writeln!(
                    out,
                    "  {:<44} {:>18.0}  {:>5.1}% of the time counted",
                    c.event,
                    c.value,
                    c.running * 100.0
                )?;
            }
        }
        match r.sampled_on.as_deref() {
            Some(event) => topdown_functions(r, event, out)?,
            None => writeln!(
                out,
                "\nPer function: not sampled, as the counter set cannot be counted here (--preset software gives software counters per function)."
            )?,
        }
        writeln!(
            out,
            "
Where each thread's time went (thread states from the scheduler, not PMU counters):"
        )?;
        for (title, rows) in [("Per process", &r.processes), ("Per thread", &r.threads)] {
            writeln!(out, "\n{title}")?;
            writeln!(
                out,
                "{:<16} {:>7} {:>7} {:>17} {:>17} {:>17} {:>17}",
                "task", "pid", "tid", "running", "runnable", "sleeping", "blocked (D)"
            )?;
            for t in rows.iter().take(TOP_TASKS) {
                let total = t.total_ns();
                let cell = |ns: u64| format!("{} {:>5.1}%", human_ns(ns), percent(ns, total));
                let tid = if t.tid == 0 {
                    "-".to_string()
                } else {
                    t.tid.to_string()
                };
                writeln!(
                    out,
                    "{:<16} {:>7} {:>7} {:>17} {:>17} {:>17} {:>17}",
                    t.comm,
                    t.pid,
                    tid,
                    cell(t.running_ns),
                    cell(t.runnable_ns),
                    cell(t.sleeping_ns),
                    cell(t.blocked_ns)
                )?;
            }
        }
        writeln!(
            out,
            "\nrunnable = ready but waiting for a CPU (CPU contention); blocked = uninterruptible sleep, usually I/O."
        )
    }

    fn sched(&self, r: &SchedReport, out: &mut dyn Write) -> io::Result<()> {
        super::sched_text::render(r, out)
    }

    fn hotspot(&self, r: &StackReport, out: &mut dyn Write) -> io::Result<()> {
        let m = &r.meta;
        writeln!(out, "bpfprof hotspot: {}", hotspot_header(m))?;
        write!(out, "{} samples", r.samples)?;
        if r.health.idle > 0 {
            let samples = match r.health.idle {
                1 => "sample",
                _ => "samples",
            };
            write!(out, " (plus {} {samples} on idle CPUs, not shown)", r.health.idle)?;
        }
        writeln!(
            out,
            ", {} lost, {} stack collisions",
            r.health.lost(),
            r.health.collisions()
        )?;
        for note in &m.notes {
            writeln!(out, "note: {note}")?;
        }
        if let Some(note) = super::names::unnamed_leaves_note(&r.stacks, r.samples) {
            writeln!(out, "note: {note}")?;
        }
        for warning in r.health.warnings() {
            writeln!(out, "warning: {warning}")?;
        }
        if r.samples == 0 {
            writeln!(
                out,
                "\nNo samples: the targets did not run on a CPU while bpfprof was sampling."
            )?;
            return Ok(());
        }

        let mut by_self: Vec<&FunctionStat> = r.functions.iter().filter(|f| f.self_samples > 0).collect();
        by_self.sort_by(|a, b| {
            b.self_samples
                .cmp(&a.self_samples)
                .then(b.total_samples.cmp(&a.total_samples))
        });
        writeln!(out, "\nTop functions by self samples")?;
        function_table(out, r, &by_self, Column::SelfFirst)?;

        let mut by_total: Vec<&FunctionStat> = r.functions.iter().collect();
        by_total.sort_by(|a, b| {
            b.total_samples
                .cmp(&a.total_samples)
                .then(b.self_samples.cmp(&a.self_samples))
        });
        writeln!(out, "\nTop functions by total samples (self + callees)")?;
        function_table(out, r, &by_total, Column::TotalFirst)?;

        for (k, counter) in r.meta.counters.iter().enumerate() {
            let total = (r.functions.iter().filter_map(|f| f.counters.get(k)))
                .fold(0u64, |t, n| t.saturating_add(*n));
            let mut rows: Vec<&FunctionStat> = r
                .functions
                .iter()
                .filter(|f| f.counters.get(k).is_some_and(|&c| c > 0))
                .collect();
            rows.sort_by_key(|f| std::cmp::Reverse(f.counters[k]));
            writeln!(out, "\n{counter} by function (counted on the CPU between samples of the same thread; {total} in all)")?;
            for f in rows.iter().take(TOP_FUNCTIONS) {
                writeln!(
                    out,
                    "{:>6.2}% {:>12}  {:<FUNCTION_WIDTH$} {}",
                    percent(f.counters[k], total),
                    f.counters[k],
                    short_name(&f.function, FUNCTION_WIDTH),
                    short_module(&f.module)
                )?;
            }
        }

        writeln!(out, "\nHottest stacks (leaf first)")?;
        for (i, stack) in r.stacks.iter().take(TOP_STACKS).enumerate() {
            writeln!(
                out,
                "[{}] {} samples ({:.2}%)  pid {} tid {} {}",
                i + 1,
                stack.count,
                percent(stack.count, r.samples),
                stack.pid,
                stack.tid,
                stack.comm
            )?;
            for frame in stack.frames.iter().rev().take(MAX_FRAMES_SHOWN) {
                writeln!(out, "      {}", describe(frame))?;
            }
            if stack.frames.len() > MAX_FRAMES_SHOWN {
                writeln!(
                    out,
                    "      ... {} more frames",
                    stack.frames.len() - MAX_FRAMES_SHOWN
                )?;
            }
        }
        Ok(())
    }
}

/// What was sampled, how often, for how long, on how many CPUs: each part a profile read back
/// knows (a folded file or another tool's pprof knows none of them but the name).
fn hotspot_header(m: &crate::model::RunMeta) -> String {
    let mut parts = vec![m.target.clone()];
    parts.extend(m.sampling());
    if m.duration_s > 0.0 {
        parts.push(format!("{:.1} s", m.duration_s));
    }
    if m.cpus > 0 {
        parts.push(format!("{} CPUs", m.cpus));
    }
    parts.join(" | ")
}

#[derive(Clone, Copy, PartialEq)]
enum Column {
    SelfFirst,
    TotalFirst,
}

fn function_table(
    out: &mut dyn Write,
    r: &StackReport,
    rows: &[&FunctionStat],
    order: Column,
) -> io::Result<()> {
    let (first, second) = match order {
        Column::SelfFirst => ("self%", "total%"),
        Column::TotalFirst => ("total%", "self%"),
    };
    writeln!(
        out,
        "{first:>7} {:>9} {second:>7}  {:<FUNCTION_WIDTH$} module",
        "samples", "function"
    )?;
    for f in rows.iter().take(TOP_FUNCTIONS) {
        let (lead, other) = match order {
            Column::SelfFirst => (f.self_samples, f.total_samples),
            Column::TotalFirst => (f.total_samples, f.self_samples),
        };
        writeln!(
            out,
            "{:>6.2}% {lead:>9} {:>6.2}%  {:<FUNCTION_WIDTH$} {}",
            percent(lead, r.samples),
            percent(other, r.samples),
            short_name(&f.function, FUNCTION_WIDTH),
            short_module(&f.module)
        )?;
    }
    Ok(())
}

/// A lock's label with a C++ or Rust function in it shortened.
fn lock_name(lock: &LockStat) -> String {
    short_name(&lock_label(lock), LOCK_NAME_WIDTH)
}

/// Why part of a lock's wait has no holder.
fn unattributed_why(source: LockSource, lock: &LockStat) -> &'static str {
    match (source, lock.kind) {
        (LockSource::Futex, "join") => "ended by the thread's exit (the kernel's wake, not a call)",
        (LockSource::Futex, _) if lock.waiting_at_stop > 0 => {
            "no wake seen (still waiting at the stop, timeouts, signals, or released before the waiter slept)"
        }
        (LockSource::Futex, _) => "no wake seen (timeouts, signals, or released before the waiter slept)",
        (LockSource::Pthread, _) => "no holder (the hand-over from a release to the next acquisition)",
        (LockSource::Kernel, _) => "holder not observable with the kernel source",
    }
}

/// The entries of one section of the lock report, each with its waiting and releasing stacks.
fn lock_entries(r: &LockReport, locks: &[&LockStat], out: &mut dyn Write) -> io::Result<()> {
    for (i, lock) in locks.iter().take(TOP_LOCKS).enumerate() {
        let waits = match lock.class {
            WaitClass::Contention => "waits",
            WaitClass::Waiting => "waits for it",
        };
        writeln!(
            out,
            "\n[{}] {} ({}, {:#x}) pid {} {}: {} {waits}, total {}, avg {}, max {}",
            i + 1,
            lock_name(lock),
            lock.kind,
            lock.address,
            lock.pid,
            lock.comm,
            lock.contentions,
            human_ns(lock.total_wait_ns),
            human_ns(lock.avg_wait_ns),
            human_ns(lock.max_wait_ns)
        )?;
        if lock.waiting_at_stop > 0 {
            writeln!(
                out,
                "  {} of them still waiting at the stop (counted up to it)",
                lock.waiting_at_stop
            )?;
        }
        if lock.instance > 0 {
            writeln!(
                out,
                "  (lock number {} at this address: the memory of {} destroyed before it)",
                lock.instance + 1,
                match lock.instance {
                    1 => "one lock".to_string(),
                    n => format!("{n} locks"),
                }
            )?;
        }
        if let Some(h) = &lock.holds {
            writeln!(
                out,
                "  held {} times, avg {}, max {}",
                h.holds,
                human_ns(h.avg_hold_ns),
                human_ns(h.max_hold_ns)
            )?;
        }
        for w in lock.waiters.iter().take(LOCK_STACKS_SHOWN) {
            writeln!(
                out,
                "  waited {:>5.1}%  {} in {} waits (max {})",
                percent(w.total_wait_ns, lock.total_wait_ns),
                human_ns(w.total_wait_ns),
                w.contentions,
                human_ns(w.max_wait_ns)
            )?;
            for frame in w.frames.iter().rev().take(LOCK_FRAMES_SHOWN) {
                writeln!(out, "      {}", describe(frame))?;
            }
        }
        let (caused, events) = match (r.source, lock.class) {
            (LockSource::Pthread, _) => ("held during", "releases"),
            (_, WaitClass::Waiting) => ("signalled", "wakes"),
            _ => ("released", "wakes"),
        };
        for h in lock.holders.iter().take(LOCK_STACKS_SHOWN) {
            writeln!(
                out,
                "  {caused} {:>5.1}%  of the wait ({} over {} {events}), from",
                percent(h.total_wait_ns, lock.total_wait_ns),
                human_ns(h.total_wait_ns),
                h.wakes
            )?;
            for frame in h.frames.iter().rev().take(LOCK_FRAMES_SHOWN) {
                writeln!(out, "      {}", describe(frame))?;
            }
        }
        if lock.unattributed_wait_ns > 0 {
            let why = unattributed_why(r.source, lock);
            writeln!(out, "  {why}: {}", human_ns(lock.unattributed_wait_ns))?;
        }
    }
    if locks.len() > TOP_LOCKS {
        writeln!(
            out,
            "\n... {} more (all of them in --format json)",
            locks.len() - TOP_LOCKS
        )?;
    }
    Ok(())
}

/// The per-function table: the level-1 split and IPC where the set gives one, else the counters.
fn topdown_functions(r: &TopdownReport, event: &str, out: &mut dyn Write) -> io::Result<()> {
    writeln!(
        out,
        "\nPer function ({} samples on {event}; counter deltas of the intervals that ended in each, scaled where multiplexed)",
        r.samples
    )?;
    let Some(first) = r.functions.first() else {
        return writeln!(out, "  (no samples of the targets)");
    };
    let name_width = 44;
    if r.functions.iter().any(|f| f.level1.is_some()) {
        writeln!(
            out,
            "{:<name_width$} {:>8} {:>9} {:>9} {:>9} {:>9} {:>6}",
            "function", "samples", "retiring", "bad spec", "frontend", "backend", "IPC"
        )?;
        for f in &r.functions {
            let pct = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{:.1}%", v * 100.0));
            let l = f.level1;
            writeln!(
                out,
                "{:<name_width$} {:>8} {:>9} {:>9} {:>9} {:>9} {:>6}",
                short_name(&f.function, name_width),
                f.samples,
                pct(l.map(|l| l.retiring)),
                pct(l.map(|l| l.bad_speculation)),
                pct(l.map(|l| l.frontend_bound)),
                pct(l.map(|l| l.backend_bound)),
                f.ipc.map_or("-".to_string(), |v| format!("{v:.2}"))
            )?;
        }
        return Ok(());
    }
    let names: Vec<&String> = first.counters.keys().collect();
    write!(out, "{:<name_width$} {:>8}", "function", "samples")?;
    for name in &names {
        write!(out, " {:>16}", super::cut(name, 16))?;
    }
    writeln!(out)?;
    for f in &r.functions {
        write!(
            out,
            "{:<name_width$} {:>8}",
            short_name(&f.function, name_width),
            f.samples
        )?;
        for name in &names {
            write!(out, " {:>16}", f.counters.get(*name).copied().unwrap_or(0))?;
        }
        writeln!(out)?;
    }
    Ok(())
}

fn tma_text(r: &TopdownReport, tma: &crate::counters::tma::Tma, out: &mut dyn Write) -> io::Result<()> {
    writeln!(out, "bpfprof topdown: {} | {}", r.meta.target, tma.family)?;
    for note in &r.meta.notes {
        writeln!(out, "note: {note}")?;
    }
    tma_sections(tma, out)
}

fn tma_sections(tma: &crate::counters::tma::Tma, out: &mut dyn Write) -> io::Result<()> {
    use crate::counters::tma::assess;
    match &tma.level1 {
        Some(l) => {
            writeln!(out, "\nLevel 1: where the pipeline slots went")?;
            for (name, label, value) in [
                ("retiring", "retiring", l.retiring),
                ("bad_speculation", "bad speculation", l.bad_speculation),
                ("frontend_bound", "frontend bound", l.frontend_bound),
                ("backend_bound", "backend bound", l.backend_bound),
            ] {
                let bar = "#".repeat((value * 40.0).round() as usize);
                writeln!(
                    out,
                    "  {label:<16} {:>6.1}%  {:<11} {bar}",
                    value * 100.0,
                    assess(name, value)
                )?;
            }
        }
        None => writeln!(
            out,
            "\nNo level-1 split: this CPU family has no slot events (stall cycles below)."
        )?,
    }
    if let Some(ipc) = tma.ipc {
        writeln!(out, "\nIPC {ipc:.2}  {}", assess("ipc", ipc))?;
    }
    if !tma.metrics.is_empty() {
        writeln!(out, "\nDerived metrics")?;
        for (name, value) in &tma.metrics {
            writeln!(
                out,
                "  {name:<24} {:>7.2}%  {}",
                value * 100.0,
                assess(name, *value)
            )?;
        }
    }
    if !tma.multiplexed.is_empty() {
        writeln!(
            out,
            "\nMultiplexed counters (values scaled by perf; share of the time each was counting):"
        )?;
        for (name, running) in &tma.multiplexed {
            writeln!(out, "  {name:<40} {:>5.1}%", running * 100.0)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::{cli::Format, report::tests::*};

    #[test]
    fn text_leads_with_counts_and_the_hottest_function() {
        let text = String::from_utf8(render(Format::Text, &sample_report())).unwrap();
        assert!(
            text.contains("100 samples (plus 5 samples on idle CPUs"),
            "{text}"
        );
        let self_section = text.split("Top functions by self").nth(1).unwrap();
        let first_row = self_section.lines().nth(2).unwrap();
        assert!(
            first_row.contains("hot_a") && first_row.contains("60.00%"),
            "{first_row}"
        );
        assert!(!text.contains("warning:"));
    }

    #[test]
    fn long_cpp_names_are_shortened_and_keep_the_columns() {
        let long = "std::vector<int, std::allocator<int> >::push_back(int const&)";
        let mut report = sample_report();
        for frame in report.stacks.iter_mut().flat_map(|s| &mut s.frames) {
            if frame.function == "hot_a" {
                frame.function = long.into();
            }
        }
        report.functions = crate::model::function_stats(&report.stacks);
        let text = String::from_utf8(render(Format::Text, &report)).unwrap();
        for title in [
            "Top functions by self samples\n",
            "Top functions by total samples (self + callees)\n",
        ] {
            let table = text.split(title).nth(1).unwrap().split("\n\n").next().unwrap();
            let mut lines = table.lines();
            let column = lines.next().unwrap().find("module").unwrap();
            for row in lines {
                let module: String = row.chars().skip(column).collect();
                assert!(
                    module == "w" || module == "[kernel.kallsyms]",
                    "{row:?} in\n{table}"
                );
            }
            assert!(table.contains("std::vector<…>::push_back "), "{table}");
        }
        assert!(text.contains("      std::vector<…>::push_back  [w]"), "{text}");
    }

    #[test]
    fn text_states_losses() {
        let mut report = sample_report();
        report.health.lost_map_full = 3;
        let text = String::from_utf8(render(Format::Text, &report)).unwrap();
        assert!(text.contains("3 lost"), "{text}");
        assert!(text.contains("warning: 3 samples lost"), "{text}");
    }
}
