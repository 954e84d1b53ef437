//! `trace -s`'s summary as text: perf trace -s's columns, per thread.
use std::io::{self, Write};

use super::{
    slow::{SlowCallReport, SlowCallsReport},
    CallStat, ThreadCalls, TraceReport,
};
use crate::{record::render::stack_lines, stat::render::grouped};

pub fn text(r: &TraceReport, out: &mut dyn Write) -> io::Result<()> {
    let threads = match r.threads.len() {
        1 => "1 thread".to_string(),
        n => format!("{} threads", grouped(n as f64)),
    };
    writeln!(
        out,
        "\n System calls of {} ({:.3} s): {} calls by {threads}",
        r.target,
        r.seconds,
        grouped(r.calls as f64)
    )?;
    for thread in &r.threads {
        thread_table(thread, out)?;
    }
    writeln!(out)?;
    if let Some(slow) = &r.slow {
        slow_calls(slow, out)?;
    }
    for note in &r.notes {
        writeln!(out, "note: {note}")?;
    }
    Ok(())
}

fn thread_table(t: &ThreadCalls, out: &mut dyn Write) -> io::Result<()> {
    writeln!(
        out,
        "\n {} (pid {}, tid {}): {} calls\n",
        t.comm,
        t.pid,
        t.tid,
        grouped(t.calls as f64)
    )?;
    writeln!(
        out,
        "   {:<22} {:>11} {:>8} {:>12} {:>10} {:>10} {:>10}",
        "syscall", "calls", "errors", "total (ms)", "min (us)", "avg (us)", "max (us)"
    )?;
    writeln!(
        out,
        "   {:<22} {:>11} {:>8} {:>12} {:>10} {:>10} {:>10}",
        "-".repeat(22),
        "-".repeat(11),
        "-".repeat(8),
        "-".repeat(12),
        "-".repeat(10),
        "-".repeat(10),
        "-".repeat(10)
    )?;
    for call in &t.syscalls {
        writeln!(out, "{}", call_line(call).trim_end())?;
    }
    Ok(())
}

/// One call's row; the time columns blank where no call returned, the errnos and the calls that
/// did not return after it.
fn call_line(c: &CallStat) -> String {
    let times = match c.returned() {
        0 => format!("{:>12} {:>10} {:>10} {:>10}", "", "", "", ""),
        _ => format!(
            "{:>12.3} {:>10.3} {:>10.3} {:>10.3}",
            c.total_ns as f64 / 1e6,
            c.min_ns as f64 / 1e3,
            c.avg_ns as f64 / 1e3,
            c.max_ns as f64 / 1e3
        ),
    };
    let mut after = Vec::new();
    if !c.errnos.is_empty() {
        let errnos: Vec<String> = c.errnos.iter().map(|(name, n)| format!("{name} {n}")).collect();
        after.push(errnos.join(", "));
    }
    if c.no_return > 0 {
        after.push(format!("{} never returned", c.no_return));
    }
    if c.in_progress > 0 {
        after.push(format!("{} in progress at the stop", c.in_progress));
    }
    format!(
        "   {:<22} {:>11} {:>8} {times}  {}",
        c.name,
        grouped(c.calls as f64),
        grouped(c.errors as f64),
        after.join("; ")
    )
}

/// `--duration-min`: each call as perf trace lists it (when it began, how long it took, who,
/// the call and its result), then the stack it was made from.
fn slow_calls(slow: &SlowCallsReport, out: &mut dyn Write) -> io::Result<()> {
    writeln!(
        out,
        " Calls of at least {} ms: {}{}\n",
        slow.min_ms,
        grouped(slow.calls.len() as f64),
        match slow.not_listed {
            0 => String::new(),
            n => format!(" listed, {} more not listed", grouped(n as f64)),
        }
    )?;
    for call in &slow.calls {
        writeln!(out, "{}", call_header(call))?;
        if let Some(note) = &call.stack_note {
            writeln!(out, "\t({note})")?;
        }
        stack_lines(&call.stack, out)?;
    }
    Ok(())
}

/// `  0.512 (20.081 ms): events/1234 clock_nanosleep(which_clock: 0, ...) = 0`
fn call_header(c: &SlowCallReport) -> String {
    let args: Vec<String> = c
        .args
        .iter()
        .map(|a| format!("{}: {}", a.name, a.value))
        .collect();
    let ret = match &c.errno {
        Some(errno) => format!("-1 {errno}"),
        None => c.ret.to_string(),
    };
    format!(
        "{:>10.3} ({:>9.3} ms): {}/{} {}({}) = {ret}",
        c.at_s * 1e3,
        c.took_ns as f64 / 1e6,
        c.comm,
        c.tid,
        c.name,
        args.join(", ")
    )
}
