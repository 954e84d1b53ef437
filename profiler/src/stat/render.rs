//! `stat`'s report as text (perf stat's layout) and as JSON (docs/json.md).
use std::io::{self, Write};

use super::{Figure, Interval, StatReport};

/// `1234567.0` → `1,234,567`.
pub fn grouped(value: f64) -> String {
    let digits = format!("{:.0}", value.max(0.0));
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `( +-  0.53% )` with more than one run.
fn spread(figure: &Figure) -> String {
    figure
        .spread_pct
        .map_or_else(String::new, |pct| format!("  ( +- {pct:5.2}% )"))
}

/// A count as perf prints it: the clocks in milliseconds, the rest in whole events.
fn count(event: &str, value: f64) -> String {
    match event {
        "task-clock" | "cpu-clock" => format!("{:>18.2} msec", value / 1e6),
        _ => format!("{:>18}     ", grouped(value)),
    }
}

pub fn text(r: &StatReport, out: &mut dyn Write) -> io::Result<()> {
    let runs = match r.runs {
        1 => String::new(),
        n => format!(" ({n} runs)"),
    };
    writeln!(out, "\n Counter stats for {}{runs}:\n", r.target)?;
    for c in &r.counters {
        let running = match c.running < 0.999 {
            true => format!("  ({:.2}% of the run on the PMU, scaled)", 100.0 * c.running),
            false => String::new(),
        };
        writeln!(
            out,
            "{}  {:<28}{}{running}",
            count(&c.event, c.figure.value),
            c.event,
            spread(&c.figure)
        )?;
    }
    for event in &r.not_counted {
        writeln!(out, "{:>18}       {event:<28}(never on the PMU)", "<not counted>")?;
    }
    super::values::text(&r.by_value, out)?;
    if !r.metrics.is_empty() {
        writeln!(out)?;
        for m in &r.metrics {
            let mark = m.assessment.map_or_else(String::new, |a| format!("  {a}"));
            writeln!(
                out,
                "{:>18.4}       {:<28}{mark}{}",
                m.figure.value,
                m.name,
                spread(&m.figure)
            )?;
        }
    }
    let seconds = match r.seconds.spread_pct {
        Some(pct) => format!(
            "{:.4} +- {:.4} seconds time elapsed  ( +- {pct:.2}% )",
            r.seconds.value,
            r.seconds.value * pct / 100.0
        ),
        None => format!("{:.4} seconds time elapsed", r.seconds.value),
    };
    writeln!(out, "\n       {seconds}\n")?;
    for note in &r.notes {
        writeln!(out, "note: {note}")?;
    }
    Ok(())
}

/// One interval's lines (`-I`), as they come.
pub fn interval_lines(interval: &Interval, out: &mut dyn Write) -> io::Result<()> {
    for (event, value) in &interval.counts {
        writeln!(
            out,
            "{:>12.3} {} {event}",
            interval.at_s,
            count(event, *value).trim_end()
        )?;
    }
    Ok(())
}
