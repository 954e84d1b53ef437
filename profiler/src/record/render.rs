//! `record`'s and `script`'s text: a line per hit, as `perf script` prints them (the command's
//! name, pid/tid, CPU, the time in seconds, the event, its fields), and the totals.
use std::io::{self, Write};

use serde_json::Value;

use super::{hit::Hit, stacks::StackFrame, Totals};

/// `           prog  4242/4242  [001]  5123.456789: uprobe:./prog:prog.c:42: n=7 name="step"`.
pub fn hit_line(hit: &Hit, out: &mut dyn Write) -> io::Result<()> {
    write!(
        out,
        "{:>16} {:>7}/{:<7} [{:03}] {:>6}.{:06}: {}:",
        hit.comm,
        hit.pid,
        hit.tid,
        hit.cpu,
        hit.time_ns / 1_000_000_000,
        hit.time_ns % 1_000_000_000 / 1000,
        hit.event
    )?;
    for (name, value) in &hit.fields.0 {
        let cut = if hit.cut.contains(name) { "..." } else { "" };
        write!(out, " {name}={}{cut}", shown(value))?;
    }
    writeln!(out)?;
    if let Some(stack) = &hit.stack {
        stack_lines(stack, out)?;
    }
    Ok(())
}

/// A stack as perf script shows one: a frame a line, innermost first, then a blank line.
pub fn stack_lines(stack: &[StackFrame], out: &mut dyn Write) -> io::Result<()> {
    for frame in stack {
        let at = frame.address.trim_start_matches("0x");
        writeln!(out, "\t{at:>16} {} ({})", frame.function, frame.module)?;
    }
    writeln!(out)
}

/// A value as a line shows it: numbers bare, text quoted, `?` where it could not be read.
fn shown(value: &Value) -> String {
    match value {
        Value::Null => "?".into(),
        Value::Array(values) => {
            let values: Vec<String> = values.iter().map(shown).collect();
            format!("[{}]", values.join(","))
        }
        Value::String(text) if text.starts_with("0x") || text.ends_with(" bytes") => text.clone(),
        other => other.to_string(),
    }
}

/// What the run recorded, and what it could not: each event's hits, the records lost.
pub fn totals(totals: &Totals, out: &mut dyn Write) -> io::Result<()> {
    for event in &totals.events {
        let every = match event.every {
            1 => String::new(),
            n => format!(", 1 in {n} recorded"),
        };
        writeln!(out, "{}: {} hits by the targets{every}", event.event, event.hits)?;
    }
    writeln!(
        out,
        "{} hits recorded in {:.3} s ({}); {} lost",
        totals.records, totals.seconds, totals.target, totals.lost
    )?;
    if totals.lost > 0 {
        writeln!(
            out,
            "note: {} records were lost: the ring was full between two reads; record every Nth hit (-c N) or fewer events",
            totals.lost
        )?;
    }
    for note in &totals.notes {
        writeln!(out, "note: {note}")?;
    }
    Ok(())
}
