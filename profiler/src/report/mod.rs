//! Renderers: one per output format behind one trait, each writing to any `Write`.
use std::io::{self, Write};

use crate::{
    cli::Format,
    model::StackReport,
    modes::{lock::LockReport, sched::SchedReport, topdown::TopdownReport},
};

pub mod command;
mod folded;
mod frame_table;
pub mod heatmap;
pub mod json;
mod names;
pub mod pprof;
pub(crate) mod sched_text;
pub(crate) mod svg;
mod text;

pub use folded::{folded_lines, unknown_frame_name};
pub(crate) use names::{short_module, short_name};
pub use pprof::proto as pprof_proto;

pub trait Renderer {
    fn hotspot(&self, report: &StackReport, out: &mut dyn Write) -> io::Result<()>;

    /// Stack formats (folded, flamegraph, pprof) show the off-CPU stacks, weighted by time.
    fn sched(&self, report: &SchedReport, out: &mut dyn Write) -> io::Result<()> {
        self.hotspot(&report.offcpu, out)
    }

    /// Stack formats show the waiting stacks, weighted by wait, with the lock below the leaf.
    fn lock(&self, report: &LockReport, out: &mut dyn Write) -> io::Result<()> {
        self.hotspot(&report.waits, out)
    }
    /// Topdown has no stacks: only text and JSON render it (the command line checks this first).
    fn topdown(&self, _: &TopdownReport, _: &mut dyn Write) -> io::Result<()> {
        Err(io::Error::other(
            "this format is not available for --mode topdown",
        ))
    }
}

pub fn renderer(format: Format) -> Box<dyn Renderer> {
    match format {
        Format::Text => Box::new(text::Text),
        Format::Json => Box::new(json::Json),
        Format::Folded => Box::new(folded::Folded),
        Format::Svg => Box::new(svg::Svg),
        Format::Pprof => Box::new(pprof::Pprof),
        Format::Heatmap => Box::new(heatmap::Heatmap),
    }
}

/// A duration for people: 850 ns, 12.3 us, 4.56 ms, 1.23 s.
pub(crate) fn human_ns(ns: u64) -> String {
    let ns = ns as f64;
    if ns < 1e3 {
        format!("{ns:.0} ns")
    } else if ns < 1e6 {
        format!("{:.1} us", ns / 1e3)
    } else if ns < 1e9 {
        format!("{:.2} ms", ns / 1e6)
    } else {
        format!("{:.2} s", ns / 1e9)
    }
}

/// At most `width` characters: a longer line ends in `…` where it was cut.
pub(crate) fn cut(line: &str, width: usize) -> String {
    if line.chars().count() <= width {
        return line.to_string();
    }
    let mut cut: String = line.chars().take(width.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

/// At most `width` characters, cut at the start: a longer text starts with `…` where it was
/// cut, so a path keeps its file name.
pub(crate) fn cut_start(text: &str, width: usize) -> String {
    let count = text.chars().count();
    if count <= width {
        return text.to_string();
    }
    let kept: String = text.chars().skip(count - width.saturating_sub(1)).collect();
    format!("…{kept}")
}

/// `a / b` as a percentage, 0 when `b` is 0.
pub(crate) fn percent(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        100.0 * a as f64 / b as f64
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::{
        model::{function_stats, tests::stack, RunMeta},
        profile::Health,
    };

    pub fn sample_report() -> StackReport {
        let mut stacks = vec![
            stack(&["main", "run", "hot_a"], 60),
            stack(&["main", "run", "hot_b"], 30),
            stack(&["main", "hot_c"], 10),
        ];
        stacks[2].pid = 2;
        stacks[2].frames.push(crate::symbolize::Frame {
            kernel: true,
            module: "[kernel.kallsyms]".into(),
            ..crate::model::tests::frame("ksys_read")
        });
        StackReport {
            weight: crate::model::Weight::Samples,
            meta: RunMeta {
                mode: "hotspot",
                event: "cpu-clock".to_string(),
                frequency_hz: 99,
                period: None,
                duration_s: 1.0,
                target: "system-wide".into(),
                cpus: 2,
                notes: vec![],
                counters: vec![],
                weight: None,
            },
            health: Health {
                samples: 100,
                idle: 5,
                ..Default::default()
            },
            samples: 100,
            functions: function_stats(&stacks),
            stacks,
            symbols: Vec::new(),
        }
    }

    #[test]
    fn lines_are_cut_to_a_width_in_characters() {
        assert_eq!(cut("abc", 3), "abc");
        assert_eq!(cut("abcdef", 3), "ab…");
        assert_eq!(cut("é€xyz", 3), "é€…");
    }

    pub fn render(format: Format, report: &StackReport) -> Vec<u8> {
        let mut out = Vec::new();
        renderer(format).hotspot(report, &mut out).unwrap();
        out
    }
}
