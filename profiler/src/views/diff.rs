//! `bpfprof diff BEFORE AFTER`: what changed between two profiles. Every share is of its own
//! profile's total, so runs of different lengths (or rates) compare: a function that took 20% of
//! the samples before and 60% after grew by 40 points, however many samples each run had.
//! Rendered as a table of the functions that moved most, a differential flamegraph (inferno:
//! widths from AFTER, red where a frame grew, blue where it shrank), two-count folded lines, or
//! JSON.
use std::{
    collections::{BTreeMap, HashMap, HashSet},
    io::{self, Write},
};

use inferno::flamegraph::{self, Options};
use serde::Serialize;

use crate::{
    cli::Format,
    error::UserError,
    model::{StackReport, Weight},
    report::folded_lines,
};

/// One function's share of each profile, as fractions of that profile's total.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FunctionChange {
    pub function: String,
    pub module: String,
    pub self_before: f64,
    pub self_after: f64,
    pub total_before: f64,
    pub total_after: f64,
}

impl FunctionChange {
    /// Change of the self share, in percentage points.
    pub fn self_change_pp(&self) -> f64 {
        100.0 * (self.self_after - self.self_before)
    }

    pub fn total_change_pp(&self) -> f64 {
        100.0 * (self.total_after - self.total_before)
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Side {
    pub name: String,
    pub mode: &'static str,
    pub total: u64,
    pub duration_s: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Diff {
    pub before: Side,
    pub after: Side,
    pub unit: &'static str,
    /// Largest change of self share first (then of total share).
    pub functions: Vec<FunctionChange>,
    /// Folded stack, BEFORE scaled to AFTER's total, AFTER: inferno's differential input.
    #[serde(skip)]
    pub stacks: Vec<(String, u64, u64)>,
}

fn unit(weight: Weight) -> &'static str {
    match weight {
        Weight::Samples => "samples",
        Weight::OffCpuNanoseconds => "off-CPU ns",
        Weight::LockWaitNanoseconds => "lock-wait ns",
    }
}

/// Compare two profiles of the same kind (samples with samples, off-CPU time with off-CPU time).
pub fn diff(
    (before_name, before): (&str, &StackReport),
    (after_name, after): (&str, &StackReport),
) -> Result<Diff, UserError> {
    if before.weight != after.weight {
        return Err(UserError::Usage(format!(
            "{before_name} counts {} and {after_name} counts {}: compare profiles of the same kind",
            unit(before.weight),
            unit(after.weight)
        )));
    }
    let share = |n: u64, total: u64| if total == 0 { 0.0 } else { n as f64 / total as f64 };
    // Keyed by name alone: the same function read from a folded file has no module.
    let mut by_name: BTreeMap<&str, FunctionChange> = BTreeMap::new();
    for (report, is_after) in [(before, false), (after, true)] {
        for f in &report.functions {
            let entry = by_name.entry(&f.function).or_insert_with(|| FunctionChange {
                function: f.function.clone(),
                module: f.module.clone(),
                self_before: 0.0,
                self_after: 0.0,
                total_before: 0.0,
                total_after: 0.0,
            });
            let (own, total) = (
                share(f.self_samples, report.samples),
                share(f.total_samples, report.samples),
            );
            // Two modules with one name (rare) add up: the name is what the table shows.
            match is_after {
                false => (entry.self_before += own, entry.total_before += total),
                true => (entry.self_after += own, entry.total_after += total),
            };
            if entry.module.is_empty() {
                entry.module = f.module.clone();
            }
        }
    }
    let mut functions: Vec<FunctionChange> = by_name.into_values().collect();
    functions.sort_by(|a, b| {
        let key = |f: &FunctionChange| (f.self_change_pp().abs(), f.total_change_pp().abs());
        key(b)
            .partial_cmp(&key(a))
            .unwrap_or(std::cmp::Ordering::Equal)
            .then_with(|| a.function.cmp(&b.function))
    });
    Ok(Diff {
        before: side(before_name, before),
        after: side(after_name, after),
        unit: unit(after.weight),
        functions,
        stacks: differential_stacks(before, after),
    })
}

fn side(name: &str, report: &StackReport) -> Side {
    Side {
        name: name.to_string(),
        mode: report.meta.mode,
        total: report.samples,
        duration_s: report.meta.duration_s,
    }
}

fn counts(report: &StackReport) -> HashMap<String, u64> {
    folded_lines(report)
        .into_iter()
        .filter_map(|line| {
            let (stack, count) = line.rsplit_once(' ')?;
            Some((stack.to_string(), count.parse().ok()?))
        })
        .collect()
}

/// Every stack of either profile with both counts, BEFORE's scaled so both totals match (as
/// `inferno-diff-folded --normalize` does): colours then show shares, not run lengths.
fn differential_stacks(before: &StackReport, after: &StackReport) -> Vec<(String, u64, u64)> {
    let (old, new) = (counts(before), counts(after));
    let scale = match before.samples {
        0 => 0.0,
        n => after.samples as f64 / n as f64,
    };
    let names: HashSet<&String> = old.keys().chain(new.keys()).collect();
    let mut stacks: Vec<(String, u64, u64)> = names
        .into_iter()
        .map(|name| {
            let was = old.get(name).map_or(0, |&n| (n as f64 * scale).round() as u64);
            (name.clone(), was, new.get(name).copied().unwrap_or(0))
        })
        .collect();
    stacks.sort();
    stacks
}

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
    let limit = how.limit;
    match how.format {
        Format::Text => text(diff, limit, out),
        Format::Svg => svg(diff, how.before_widths, out),
        Format::Folded => {
            for (stack, before, after) in &diff.stacks {
                writeln!(out, "{stack} {before} {after}")?;
            }
            Ok(())
        }
        Format::Json => {
            let mut shown = diff.clone();
            shown.functions.truncate(limit);
            crate::report::json::write_json(out, &shown)
        }
        other => Err(io::Error::other(format!(
            "format `{}` is not available for diff (text, svg, folded or json)",
            other.name()
        ))),
    }
}

/// Fits 80 columns: a profile's path and a function's name are cut, never the numbers.
fn text(diff: &Diff, limit: usize, out: &mut dyn Write) -> io::Result<()> {
    for (label, side) in [("before", &diff.before), ("after", &diff.after)] {
        let what = format!(
            " ({}, {} {}, {:.1} s)",
            side.mode, side.total, diff.unit, side.duration_s
        );
        let room = 80usize.saturating_sub(8 + what.chars().count()).max(12);
        writeln!(
            out,
            "{label:>6}: {}{what}",
            crate::report::cut_start(&side.name, room)
        )?;
    }
    writeln!(
        out,
        "Shares of each profile's own total; Δ = after - before, in percentage points.\n"
    )?;
    writeln!(
        out,
        "{:>8} {:>7} {:>7} {:>8}  function",
        "self Δ", "before", "after", "total Δ"
    )?;
    let moved: Vec<&FunctionChange> = diff
        .functions
        .iter()
        .filter(|f| f.self_change_pp().abs() >= 0.005 || f.total_change_pp().abs() >= 0.005)
        .take(limit)
        .collect();
    for f in &moved {
        let line = format!(
            "{:>+6.2}pp {:>6.2}% {:>6.2}% {:>+6.2}pp  {}",
            f.self_change_pp(),
            100.0 * f.self_before,
            100.0 * f.self_after,
            f.total_change_pp(),
            f.function
        );
        writeln!(out, "{}", crate::report::cut(&line, 80))?;
    }
    if moved.is_empty() {
        writeln!(out, "(no function's share changed)")?;
    }
    Ok(())
}

/// Frames are as wide as AFTER has them (what runs now), or, with `before_widths`, as BEFORE had
/// them (what was there, including what is gone now); red grew, blue shrank either way.
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
    let lines: Vec<String> = diff
        .stacks
        .iter()
        .filter(|(_, before, after)| before + after > 0)
        .map(|(stack, before, after)| match before_widths {
            false => format!("{stack} {before} {after}"),
            true => format!("{stack} {after} {before}"),
        })
        .collect();
    if lines.iter().all(|l| l.ends_with(" 0")) {
        // Nothing to draw at these widths (inferno refuses empty input).
        return flamegraph::from_lines(&mut options, ["[empty profile] 0 1"], out).map_err(io::Error::other);
    }
    flamegraph::from_lines(&mut options, lines.iter().map(String::as_str), out).map_err(io::Error::other)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{model::tests::stack, report::tests::sample_report};

    /// The fill colour of the first frame named `name` in an inferno SVG; empty when absent.
    fn fill(svg: &str, name: &str) -> Vec<u32> {
        let Some(at) = svg.find(&format!("<title>{name} (")) else {
            return Vec::new();
        };
        let rest = &svg[at..];
        let fill = &rest[rest.find("fill=\"rgb(").unwrap() + 10..];
        fill[..fill.find(')').unwrap()]
            .split(',')
            .map(|c| c.trim().parse().unwrap())
            .collect()
    }

    fn profile(split: &[(&str, u64)]) -> StackReport {
        let mut report = sample_report();
        report.stacks = split
            .iter()
            .map(|(leaf, n)| stack(&["main", "run", leaf], *n))
            .collect();
        report.samples = split.iter().map(|(_, n)| n).sum();
        report.functions = crate::model::function_stats(&report.stacks);
        report
    }

    #[test]
    fn shares_are_normalised_so_runs_of_any_length_compare() {
        // Before: a 60%, b 40% of 100 samples. After: a 20%, b 80% of 1000 samples.
        let before = profile(&[("a", 60), ("b", 40)]);
        let after = profile(&[("a", 200), ("b", 800)]);
        let d = diff(("before", &before), ("after", &after)).unwrap();
        let a = &d.functions.iter().find(|f| f.function == "a").unwrap();
        assert!((a.self_change_pp() + 40.0).abs() < 1e-9, "{a:?}");
        assert!((d.functions[0].self_change_pp().abs() - 40.0).abs() < 1e-9);
        let run = d.functions.iter().find(|f| f.function == "run").unwrap();
        assert_eq!(run.total_change_pp(), 0.0);
        // Folded: BEFORE scaled to AFTER's total.
        assert!(
            d.stacks.contains(&("w;main;run;a".into(), 600, 200)),
            "{:?}",
            d.stacks
        );
        assert!(
            d.stacks.contains(&("w;main;run;b".into(), 400, 800)),
            "{:?}",
            d.stacks
        );
    }

    #[test]
    fn a_function_only_in_one_profile_shows_from_zero() {
        let before = profile(&[("a", 50), ("gone", 50)]);
        let after = profile(&[("a", 50), ("new", 50)]);
        let d = diff(("b", &before), ("a", &after)).unwrap();
        let change = |name: &str| {
            d.functions
                .iter()
                .find(|f| f.function == name)
                .unwrap()
                .self_change_pp()
        };
        assert_eq!(change("new"), 50.0);
        assert_eq!(change("gone"), -50.0);
        assert_eq!(change("a"), 0.0);
        assert!(d.stacks.contains(&("w;main;run;gone".into(), 50, 0)));
        // Drawn at AFTER's widths, what is gone is not there; at BEFORE's, it is, and blue.
        let draw = |before_widths| {
            let mut svg = Vec::new();
            let how = Rendering {
                format: Format::Svg,
                limit: 20,
                before_widths,
            };
            render(&d, how, &mut svg).unwrap();
            String::from_utf8(svg).unwrap()
        };
        assert!(!draw(false).contains("<title>gone ("));
        let before = draw(true);
        assert!(
            fill(&before, "gone")[2] > fill(&before, "gone")[0],
            "gone shrank: blue"
        );
        assert!(fill(&before, "new").is_empty(), "not in BEFORE");
    }

    #[test]
    fn different_kinds_do_not_compare() {
        let before = profile(&[("a", 1)]);
        let mut after = profile(&[("a", 1)]);
        after.weight = Weight::OffCpuNanoseconds;
        assert!(diff(("x", &before), ("y", &after)).is_err());
    }

    #[test]
    fn table_fits_80_columns_and_svg_colours_by_change() {
        let before = profile(&[("a", 60), ("b_with_a_very_long_name_".repeat(5).as_str(), 40)]);
        let after = profile(&[("a", 20), ("b_with_a_very_long_name_".repeat(5).as_str(), 80)]);
        let deep = "/a/directory/some/levels/down/where/runs/are/kept/by/date/2026-11-23";
        let d = diff(
            (&format!("{deep}/before.json"), &before),
            (&format!("{deep}/after.json"), &after),
        )
        .unwrap();
        let how = |format| Rendering {
            format,
            limit: 20,
            before_widths: false,
        };
        let mut table = Vec::new();
        render(&d, how(Format::Text), &mut table).unwrap();
        let table = String::from_utf8(table).unwrap();
        assert!(table.lines().all(|l| l.chars().count() <= 80), "{table}");
        assert!(
            table.contains("/2026-11-23/before.json (hotspot,"),
            "a cut path keeps its file name: {table}"
        );
        assert!(
            table.contains("-40.00pp  60.00%  20.00% -40.00pp  a\n"),
            "{table}"
        );
        let mut svg = Vec::new();
        render(&d, how(Format::Svg), &mut svg).unwrap();
        let svg = String::from_utf8(svg).unwrap();
        // inferno colours a shrunken frame blue (rgb with blue highest) and a grown one red.
        let a = fill(&svg, "a");
        assert!(a[2] > a[0], "a shrank: blue, got {a:?}");
        let b = fill(&svg, &"b_with_a_very_long_name_".repeat(5));
        assert!(b[0] > b[2], "b grew: red, got {b:?}");
    }
}
