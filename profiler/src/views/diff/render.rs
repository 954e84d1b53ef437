//! A diff written out: a table of the functions that moved most (text), a differential
//! flamegraph (inferno: widths from AFTER, red where a frame's share grew, blue where it shrank),
//! two-count folded lines (each profile's own counts), or JSON.
use std::io::{self, Write};

use inferno::flamegraph::{self, Options};

use super::{Diff, FunctionChange, Ranking, Side};
use crate::{
    cli::Format,
    model::Weight,
    report::{cut, cut_start, human_ns, svg::unambiguous},
};

/// How the comparison is written.
#[derive(Clone, Copy, Debug)]
pub struct Rendering {
    pub format: Format,
    /// Functions in the table (and JSON).
    pub limit: usize,
    /// Flamegraph widths from BEFORE instead of AFTER.
    pub before_widths: bool,
}

/// Writes the comparison in its format (text, svg, folded or json).
pub fn render(diff: &Diff, how: Rendering, out: &mut dyn Write) -> io::Result<()> {
    match how.format {
        Format::Text => text(diff, how.limit, out),
        Format::Svg => svg(diff, how.before_widths, out),
        Format::Folded => {
            for (stack, before, after) in &diff.stacks {
                writeln!(out, "{stack} {before} {after}")?;
            }
            Ok(())
        }
        Format::Json => {
            let mut shown = diff.clone();
            shown.functions.truncate(how.limit);
            crate::report::json::write_json(out, &shown)
        }
        other => Err(io::Error::other(format!(
            "format `{}` is not available for diff (text, svg, folded or json)",
            other.name()
        ))),
    }
}

const WIDTH: usize = 80;

/// Fits 80 columns: a profile's path and a function's name are cut, never the numbers.
fn text(diff: &Diff, limit: usize, out: &mut dyn Write) -> io::Result<()> {
    for (label, side) in [("before", &diff.before), ("after", &diff.after)] {
        writeln!(out, "{label:>6}: {}", cut_start(&side.name, WIDTH - 8))?;
        writeln!(out, "        {}", cut(&describe(side, diff.weight), WIDTH - 8))?;
    }
    let what = match diff.ranked_by {
        Ranking::Seconds => "time",
        Ranking::Samples => "samples",
        Ranking::Share => "share",
    };
    let ranking = format!(
        "Ranked by the change in self {what}, then total {what}: {}. Shares are of each profile's own total.",
        diff.ranking_reason
    );
    for line in wrap(&ranking, WIDTH) {
        writeln!(out, "{line}")?;
    }
    let moved: Vec<&FunctionChange> = diff.functions.iter().filter(|f| moved(f)).take(limit).collect();
    let scale = Scale::of(diff.ranked_by, &moved);
    writeln!(
        out,
        "\n{:^27}  {:^13}  {:>9}",
        format!("self {}", scale.heading),
        "self share",
        "total"
    )?;
    writeln!(
        out,
        "{:>8} {:>8} {:>9}  {:>6} {:>6}  {:>9}  function",
        "before", "after", "change", "before", "after", "change"
    )?;
    for f in &moved {
        let [own0, own1, own, all] = scale.figures(f);
        let share = |s: f64| format!("{:.1}%", 100.0 * s);
        let line = format!(
            "{own0:>8} {own1:>8} {own:>9}  {:>6} {:>6}  {all:>9}  {}",
            share(f.self_before),
            share(f.self_after),
            f.function
        );
        writeln!(out, "{}", cut(&line, WIDTH))?;
    }
    if moved.is_empty() {
        writeln!(out, "(no function changed)")?;
    }
    Ok(())
}

/// Whether a function's figures or shares differ at all between the profiles.
fn moved(f: &FunctionChange) -> bool {
    f.counts.self_change != 0
        || f.counts.total_change != 0
        || f.self_change_pp().abs() >= 0.005
        || f.total_change_pp().abs() >= 0.005
}

/// "hotspot, 3.0 s run: 2990 samples of cpu-clock at 997 Hz = 3.00 s on CPU".
fn describe(side: &Side, weight: Weight) -> String {
    let run = match side.duration_s > 0.0 {
        true => format!("{:.1} s run", side.duration_s),
        false => "run length not recorded".to_string(),
    };
    let seconds = side
        .total_seconds
        .map_or_else(String::new, |s| human_ns((s * 1e9).round() as u64));
    let figures = match weight {
        Weight::OffCpuNanoseconds => format!("{seconds} off CPU"),
        Weight::LockWaitNanoseconds => format!("{seconds} waiting for locks"),
        Weight::Samples => {
            let rate = match side.sampling() {
                Some(sampling) => format!(" of {sampling}"),
                None => " (sampling rate not recorded)".to_string(),
            };
            let time = match side.total_seconds {
                Some(_) => format!(" = {seconds} on CPU"),
                None => String::new(),
            };
            format!("{} samples{rate}{time}", side.total)
        }
    };
    format!("{}, {run}: {figures}", side.mode)
}

/// The table's absolute columns: seconds (in s, ms or us, as its largest figure reads best) when
/// ranked by time, else samples.
struct Scale {
    heading: &'static str,
    /// Seconds per shown unit; `None` for counts.
    per: Option<f64>,
}

impl Scale {
    fn of(ranked_by: Ranking, shown: &[&FunctionChange]) -> Scale {
        if ranked_by != Ranking::Seconds {
            return Scale {
                heading: "samples",
                per: None,
            };
        }
        let largest = shown
            .iter()
            .filter_map(|f| f.seconds)
            .flat_map(|s| [s.self_before, s.self_after, s.total_before, s.total_after])
            .fold(0.0, f64::max);
        let (heading, per) = match largest {
            s if s >= 1.0 => ("time (s)", 1.0),
            s if s >= 1e-3 => ("time (ms)", 1e-3),
            _ => ("time (us)", 1e-6),
        };
        Scale {
            heading,
            per: Some(per),
        }
    }

    /// Self before, after and change, and total change, as the table shows them.
    fn figures(&self, f: &FunctionChange) -> [String; 4] {
        match (self.per, f.seconds) {
            (Some(per), Some(s)) => [
                format!("{:.3}", s.self_before / per),
                format!("{:.3}", s.self_after / per),
                format!("{:+.3}", s.self_change / per),
                format!("{:+.3}", s.total_change / per),
            ],
            _ => [
                f.counts.self_before.to_string(),
                f.counts.self_after.to_string(),
                format!("{:+}", f.counts.self_change),
                format!("{:+}", f.counts.total_change),
            ],
        }
    }
}

/// Words in lines of at most `width` characters (a longer word alone on its line).
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    for word in text.split_whitespace() {
        match lines.last_mut() {
            Some(line) if line.chars().count() + 1 + word.chars().count() <= width => {
                line.push(' ');
                line.push_str(word);
            }
            _ => lines.push(word.to_string()),
        }
    }
    lines
}

/// Frames are as wide as AFTER has them (what runs now), or, with `before_widths`, as BEFORE had
/// them (what was there, including what is gone now); red grew, blue shrank either way. Colours
/// show shares: BEFORE is scaled to AFTER's total (as `inferno-diff-folded --normalize` does).
fn svg(diff: &Diff, before_widths: bool, out: &mut dyn Write) -> io::Result<()> {
    let mut options = Options::default();
    options.title = format!("bpfprof diff: {} → {}", diff.before.name, diff.after.name);
    let widths = if before_widths {
        &diff.before.name
    } else {
        &diff.after.name
    };
    options.subtitle = Some(format!(
        "widths: {widths}; red grew, blue shrank (shares of each profile's total)"
    ));
    options.count_name = diff.unit.to_string();
    // inferno draws the second count and colours by second - first (negated: first - second).
    options.negate_differentials = before_widths;
    let scale = match diff.before.total {
        0 => 0.0,
        n => diff.after.total as f64 / n as f64,
    };
    // inferno adds the counts up and scales their differences by 150 in an isize: no sum of
    // them may pass that (a saved profile may claim any count), so each is cut to its share of
    // it (a no-op for any real profile's).
    let most = (isize::MAX as u64 / 150) / (2 * diff.stacks.len().max(1) as u64);
    let lines: Vec<String> = diff
        .stacks
        .iter()
        .map(|(stack, before, after)| {
            let before = ((*before as f64 * scale).round() as u64).min(most);
            (stack, before, (*after).min(most))
        })
        .filter(|(_, before, after)| *before > 0 || *after > 0)
        .map(|(stack, before, after)| match before_widths {
            false => format!("{} {before} {after}", unambiguous(stack)),
            true => format!("{} {after} {before}", unambiguous(stack)),
        })
        .collect();
    if lines.iter().all(|l| l.ends_with(" 0")) {
        // Nothing to draw at these widths (inferno refuses empty input).
        return flamegraph::from_lines(&mut options, ["[empty profile] 0 1"], out).map_err(io::Error::other);
    }
    flamegraph::from_lines(&mut options, lines.iter().map(String::as_str), out).map_err(io::Error::other)
}
