//! `latency`'s report as text: the figures, then the histogram in power-of-two rows.
use std::io::{self, Write};

use super::{slow::SlowIntervalsReport, Interval, LatencyReport};
use crate::{
    record::render::stack_lines,
    report::{human_ns, sched_text::histogram_lines},
};

pub fn text(r: &LatencyReport, out: &mut dyn Write) -> io::Result<()> {
    let i = &r.interval;
    writeln!(
        out,
        "\n Latency from {} to {}, by {}, of {} ({:.3} s)\n",
        i.start(),
        i.to,
        i.key,
        r.target,
        r.seconds
    )?;
    if r.count == 0 {
        writeln!(out, "   no interval ended")?;
    } else {
        writeln!(
            out,
            "   count {}   avg {}   p50 {}   p90 {}   p99 {}   max {}\n",
            r.count,
            human_ns(r.avg_ns),
            human_ns(r.p50_ns),
            human_ns(r.p90_ns),
            human_ns(r.p99_ns),
            human_ns(r.max_ns)
        )?;
        histogram_lines(&r.histogram, out)?;
    }
    writeln!(out)?;
    if let Some(slow) = &r.slow {
        slow_intervals(slow, i, out)?;
    }
    if r.unmatched > 0 {
        writeln!(
            out,
            "note: {} ends of {} had no start (begun before the run, or of another {}{})",
            r.unmatched,
            i.to,
            i.key,
            if i.filter.is_some() {
                ", or filtered out"
            } else {
                ""
            }
        )?;
    }
    if r.replaced > 0 {
        writeln!(
            out,
            "note: {} starts came before the previous start of their {} had ended: timed from the later one",
            r.replaced, i.key
        )?;
    }
    if r.pending > 0 {
        writeln!(
            out,
            "note: {} starts had not ended when the run stopped",
            r.pending
        )?;
    }
    for note in &r.notes {
        writeln!(out, "note: {note}")?;
    }
    Ok(())
}

/// `-o lat.heatmap.svg`: time across, the latencies' buckets up.
pub fn heatmap(r: &LatencyReport, out: &mut dyn Write) -> io::Result<()> {
    let i = &r.interval;
    let caption = crate::report::heatmap::Caption {
        title: format!(
            "latency heatmap: {} to {} by {}, {}",
            i.start(),
            i.to,
            i.key,
            r.target
        ),
        rows: "latency",
        counted: "intervals",
    };
    crate::report::heatmap::svg(&r.heatmap, &caption, out)
}

/// `--duration-min`: each interval (when it began, how long, who started it, its key), then the
/// stacks it was started from.
fn slow_intervals(slow: &SlowIntervalsReport, i: &Interval, out: &mut dyn Write) -> io::Result<()> {
    let more = match slow.not_listed {
        0 => String::new(),
        n => format!(" listed, {n} more not listed"),
    };
    writeln!(
        out,
        " Intervals of at least {} ms: {}{more}\n",
        slow.min_ms,
        slow.intervals.len()
    )?;
    for interval in &slow.intervals {
        let key = match i.key.as_str() {
            "thread" => String::new(),
            // A number the sides name differently (`retval=arg1`) by its start's name.
            names => (names.split(',').zip(&interval.key))
                .map(|(name, value)| format!(" {}={value}", name.split('=').next().unwrap_or(name)))
                .collect(),
        };
        writeln!(
            out,
            "{:>10.3} ({:>9.3} ms): {}/{}{key}",
            interval.at_s * 1e3,
            interval.took_ns as f64 / 1e6,
            interval.comm,
            interval.tid
        )?;
        if let Some(note) = &interval.stack_note {
            writeln!(out, "\t({note})")?;
        }
        stack_lines(&interval.stack, out)?;
    }
    Ok(())
}
