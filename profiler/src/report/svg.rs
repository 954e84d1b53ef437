//! Flamegraph SVG, drawn by inferno from the folded stacks.
use std::io::{self, Write};

use inferno::flamegraph::{self, Options};

use super::{folded_lines, Renderer};
use crate::model::{StackReport, Weight};

pub struct Svg;

impl Renderer for Svg {
    fn hotspot(&self, report: &StackReport, out: &mut dyn Write) -> io::Result<()> {
        let lines = folded_lines(report);
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

#[cfg(test)]
mod tests {
    use crate::{cli::Format, report::tests::*};

    #[test]
    fn svg_names_the_functions() {
        let svg = String::from_utf8(render(Format::Svg, &sample_report())).unwrap();
        assert!(svg.starts_with("<?xml"), "{}", &svg[..50]);
        assert!(svg.contains("hot_a"));
        assert!(svg.contains("ksys_read"));
        assert!(svg.trim_end().ends_with("</svg>"));
    }
}
