//! Latency heatmap (as in Brendan Gregg's heat maps): time across, wait-time buckets up, colour =
//! how many waits ended in that second and bucket.
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
        let h = &r.heatmap;
        let rows: Vec<usize> = (0..h.row_lower_ns.len())
            .filter(|&row| h.columns.iter().any(|c| c[row] > 0))
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
            r#"<text x="{}" y="20" text-anchor="middle" font-size="15">bpfprof run-queue latency heatmap: {}</text>"#,
            width / 2,
            escape(&shorten(&r.meta.target, 70))
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
                    r#"<rect x="{x}" y="{y}" width="{cell_w}" height="{CELL_H}" fill="rgb({red},{green},{blue})"><title>{}s: {count} waits of {} .. {}</title></rect>"#,
                    t,
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
                r#"<text x="{x}" y="{}">{t}s</text>"#,
                TOP + n_rows * CELL_H + 16
            )?;
        }
        writeln!(
            out,
            r#"<text x="{}" y="{}" text-anchor="middle">time (s); rows: wait before getting a CPU; colour: number of waits</text></svg>"#,
            width / 2,
            height - 6
        )
    }
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
