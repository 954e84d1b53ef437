//! Flamegraph SVG, drawn by inferno from the folded stacks.
use std::io::{self, Write};

use inferno::flamegraph::{self, Options};

use super::{folded_lines, Renderer};
use crate::model::{StackReport, Weight};

pub struct Svg;

impl Renderer for Svg {
    fn hotspot(&self, report: &StackReport, out: &mut dyn Write) -> io::Result<()> {
        let lines = within_u64(folded_lines(report));
        let mut options = Options::default();
        options.title = match report.weight {
            Weight::Samples => format!(
                "bpfprof hotspot: {} ({}, {:.1} s)",
                report.meta.target,
                report
                    .meta
                    .sampling()
                    .unwrap_or_else(|| report.meta.event.clone()),
                report.meta.duration_s
            ),
            Weight::OffCpuNanoseconds => {
                format!(
                    "bpfprof off-CPU time: {} ({:.1} s)",
                    report.meta.target, report.meta.duration_s
                )
            }
            Weight::LockWaitNanoseconds => {
                format!(
                    "bpfprof lock wait time: {} ({:.1} s)",
                    report.meta.target, report.meta.duration_s
                )
            }
        };
        options.count_name = match report.weight {
            Weight::Samples => "samples".to_string(),
            Weight::OffCpuNanoseconds | Weight::LockWaitNanoseconds => "ns".to_string(),
        };
        if lines.is_empty() {
            // inferno refuses empty input; an empty profile is still a valid answer.
            options.subtitle = Some("no samples were collected".to_string());
            return flamegraph::from_lines(&mut options, ["[no samples] 1"], out).map_err(io::Error::other);
        }
        flamegraph::from_lines(&mut options, lines.iter().map(String::as_str), out).map_err(io::Error::other)
    }
}

/// A stack as inferno must read it: a last frame ending in a space and a number (a saved
/// profile's names are anyone's) would be read as a count, the line as a differential one; that
/// space becomes a no-break space.
pub(crate) fn unambiguous(stack: &str) -> std::borrow::Cow<'_, str> {
    match stack.rsplit_once(' ') {
        Some((head, tail)) if tail.parse::<f64>().is_ok() => format!("{head}\u{a0}{tail}").into(),
        _ => stack.into(),
    }
}

/// inferno adds the counts up (an overflow is a panic in a checked build): where they would
/// pass u64::MAX (a saved profile may claim any count), each is cut to its share of it.
fn within_u64(lines: Vec<String>) -> Vec<String> {
    let lines: Vec<String> = (lines.into_iter())
        .map(|line| match line.rsplit_once(' ') {
            Some((stack, count)) => format!("{} {count}", unambiguous(stack)),
            None => line,
        })
        .collect();
    let count = |line: &str| {
        line.rsplit_once(' ')
            .and_then(|(_, n)| n.parse::<u64>().ok())
            .unwrap_or(0)
    };
    if lines
        .iter()
        .try_fold(0u64, |total, l| total.checked_add(count(l)))
        .is_some()
    {
        return lines;
    }
    let most = u64::MAX / lines.len() as u64;
    lines
        .iter()
        .map(|line| match line.rsplit_once(' ') {
            Some((stack, _)) => format!("{stack} {}", count(line).min(most)),
            None => line.clone(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{unambiguous, within_u64};

    /// A frame named like a count (from a saved profile) is not read by inferno as one.
    #[test]
    fn a_last_frame_ending_in_a_number_keeps_it_in_its_name() {
        assert_eq!(unambiguous("main;work 42"), "main;work\u{a0}42");
        assert_eq!(
            unambiguous("main;operator new(unsigned long)"),
            "main;operator new(unsigned long)"
        );
        let lines = within_u64(vec!["a;sched_ba 09223372036854775807 7".into()]);
        assert_eq!(lines, ["a;sched_ba\u{a0}09223372036854775807 7"]);
    }
    use crate::{cli::Format, report::tests::*};

    #[test]
    fn counts_past_u64_are_cut_to_their_share() {
        let max = u64::MAX;
        let lines = within_u64(vec![format!("a;b {max}"), format!("a;c {max}")]);
        assert_eq!(lines, [format!("a;b {}", max / 2), format!("a;c {}", max / 2)]);
        let fine = vec!["a;b 3".to_string(), "a;c 4".to_string()];
        assert_eq!(within_u64(fine.clone()), fine);
    }

    #[test]
    fn svg_names_the_functions() {
        let svg = String::from_utf8(render(Format::Svg, &sample_report())).unwrap();
        assert!(svg.starts_with("<?xml"), "{}", &svg[..50]);
        assert!(svg.contains("hot_a"));
        assert!(svg.contains("ksys_read"));
        assert!(svg.trim_end().ends_with("</svg>"));
    }
}
