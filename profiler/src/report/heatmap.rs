//! Latency heatmap (as in Brendan Gregg's heat maps): time across, latency buckets up, colour =
//! how many waits (sched mode) or intervals (`latency`) ended in that column and bucket.
use std::io::{self, Write};

use super::{human_ns, Renderer};
use crate::{model::StackReport, modes::sched::SchedReport};

pub struct Heatmap;

const CELL_H: usize = 14;
const LEFT: usize = 80;
const TOP: usize = 40;

impl Renderer for Heatmap {
    fn hotspot(&self, _: &StackReport, _: &mut dyn Write) -> io::Result<()> {
        Err(io::Error::other("the heatmap format is for --mode sched"))
    }

    fn sched(&self, r: &SchedReport, out: &mut dyn Write) -> io::Result<()> {
        let caption = Caption {
            title: format!("run-queue latency heatmap: {}", r.meta.target),
            rows: "wait before getting a CPU",
            counted: "waits",
        };
        svg(&r.heatmap, &caption, out)
    }
}

/// What a heatmap shows: its title, what its rows measure and what its colour counts.
pub struct Caption {
    pub title: String,
    /// `wait before getting a CPU`.
    pub rows: &'static str,
    /// `waits`.
    pub counted: &'static str,
}

/// The heatmap as SVG: a column per `column_s` seconds, a row per bucket that any column has.
pub fn svg(h: &crate::modes::sched::Heatmap, caption: &Caption, out: &mut dyn Write) -> io::Result<()> {
    let rows: Vec<usize> = (0..h.row_lower_ns.len())
        .filter(|&row| h.columns.iter().any(|c| c.get(row).is_some_and(|&n| n > 0)))
        .collect();
    let (low, high) = match (rows.first(), rows.last()) {
        (Some(&l), Some(&h)) => (l, h),
        _ => (0, 0),
    };
    let columns = h.columns.len().max(1);
    let cell_w = (900 / columns).clamp(4, 120);
    let n_rows = high - low + 1;
    // Wide enough for the title and the axis caption however short the run.
    let width = (LEFT + columns * cell_w + 20).max(760);
    let height = TOP + n_rows * CELL_H + 40;
    let max = h.columns.iter().flatten().copied().max().unwrap_or(0).max(1) as f64;
    writeln!(
        out,
        r#"<?xml version="1.0" standalone="no"?><svg version="1.1" width="{width}" height="{height}" xmlns="http://www.w3.org/2000/svg" font-family="Verdana" font-size="11">"#
    )?;
    writeln!(out, r##"<rect width="100%" height="100%" fill="#f8f8f8"/>"##)?;
    writeln!(
        out,
        r#"<text x="{}" y="20" text-anchor="middle" font-size="15">bpfprof {}</text>"#,
        width / 2,
        escape(&shorten(&caption.title, 110))
    )?;
    for (t, column) in h.columns.iter().enumerate() {
        for (row, &count) in column.iter().enumerate().take(high + 1).skip(low) {
            if count == 0 {
                continue;
            }
            // Log scale, so a few long waits stay visible next to many short ones.
            let level = ((count as f64).ln_1p() / max.ln_1p()).clamp(0.0, 1.0);
            let (red, green, blue) = (255, (230.0 * (1.0 - level)) as u8, (200.0 * (1.0 - level)) as u8);
            let x = LEFT + t * cell_w;
            let y = TOP + (high - row) * CELL_H;
            writeln!(
                out,
                r#"<rect x="{x}" y="{y}" width="{cell_w}" height="{CELL_H}" fill="rgb({red},{green},{blue})"><title>{}s: {count} {} of {} .. {}</title></rect>"#,
                seconds(t as f64 * h.column_s),
                caption.counted,
                human_ns(h.row_lower_ns[row]),
                human_ns(h.row_lower_ns.get(row + 1).copied().unwrap_or(u64::MAX))
            )?;
        }
    }
    for row in (low..=high).step_by(2) {
        let y = TOP + (high - row) * CELL_H + CELL_H - 3;
        writeln!(
            out,
            r#"<text x="{}" y="{y}" text-anchor="end">{}</text>"#,
            LEFT - 4,
            human_ns(h.row_lower_ns[row])
        )?;
    }
    let step = (columns / 10).max(1);
    for t in (0..columns).step_by(step) {
        let x = LEFT + t * cell_w;
        writeln!(
            out,
            r#"<text x="{x}" y="{}">{}s</text>"#,
            TOP + n_rows * CELL_H + 16,
            seconds(t as f64 * h.column_s)
        )?;
    }
    writeln!(
        out,
        r#"<text x="{}" y="{}" text-anchor="middle">time (s); rows: {}; colour: number of {}</text></svg>"#,
        width / 2,
        height - 6,
        escape(caption.rows),
        caption.counted
    )
}

/// `3`, `0.25`: a column's start in seconds, as short as it reads.
fn seconds(s: f64) -> String {
    let text = format!("{s:.2}");
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

fn shorten(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((cut, _)) => format!("{}...", &s[..cut]),
        None => s.to_string(),
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}
