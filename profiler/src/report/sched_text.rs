//! The sched mode's terminal report: run-queue delay per task, a compact wait histogram of the
//! most delayed tasks, where tasks blocked off-CPU, and the slowest waits.
use std::io::{self, Write};

use profiler_common::{hist_bucket, HIST_BUCKETS};

use super::{human_ns, names::describe};
use crate::modes::sched::{Bucket, SchedReport, TaskLatency};

const TOP_TASKS: usize = 30;
const HISTOGRAM_TASKS: usize = 3;
const TOP_OFFCPU: usize = 10;
const TOP_SLOW: usize = 15;
/// Frames shown of each off-CPU stack.
const MAX_FRAMES_SHOWN: usize = 48;
/// The longest bar of a histogram.
const BAR_WIDTH: u64 = 40;

pub(super) fn render(r: &SchedReport, out: &mut dyn Write) -> io::Result<()> {
    let m = &r.meta;
    writeln!(
        out,
        "bpfprof sched: {} | {:.1} s | {} CPUs | {} context switches",
        m.target, m.duration_s, m.cpus, r.health.sched_switches
    )?;
    for note in &m.notes {
        writeln!(out, "note: {note}")?;
    }
    for warning in r.health.warnings() {
        writeln!(out, "warning: {warning}")?;
    }
    task_table(r, out)?;
    cpu_table(r, out)?;
    histograms(r, out)?;
    offcpu(r, out)?;
    slowest(r, out)
}

fn task_table(r: &SchedReport, out: &mut dyn Write) -> io::Result<()> {
    writeln!(
        out,
        "\nRun-queue delay per task (time runnable but waiting for a CPU), most total delay first"
    )?;
    writeln!(
        out,
        "{:<16} {:>7} {:>7} {:>7} {:>10} {:>10} {:>10} {:>10} {:>10} {:>8}",
        "task", "pid", "tid", "runs", "total", "avg", "p50", "p99", "max", "max at"
    )?;
    for t in r.tasks.iter().take(TOP_TASKS) {
        writeln!(
            out,
            "{:<16} {:>7} {:>7} {:>7} {:>10} {:>10} {:>10} {:>10} {:>10} {:>7.2}s",
            t.comm,
            t.pid,
            t.tid,
            t.runs,
            human_ns(t.total_delay_ns),
            human_ns(t.avg_delay_ns),
            human_ns(t.p50_delay_ns),
            human_ns(t.p99_delay_ns),
            human_ns(t.max_delay_ns),
            t.max_at_s
        )?;
    }
    if r.tasks.len() > TOP_TASKS {
        writeln!(
            out,
            "... {} more tasks (all of them in --format json)",
            r.tasks.len() - TOP_TASKS
        )?;
    }
    Ok(())
}

/// Each CPU's share of the waits, and its idle time: where the machine queues.
fn cpu_table(r: &SchedReport, out: &mut dyn Write) -> io::Result<()> {
    if r.cpus.is_empty() {
        return Ok(());
    }
    writeln!(
        out,
        "\nRun-queue delay per CPU (all traced tasks' waits, by the CPU each ended on); idle: the CPU's idle and I/O-wait time"
    )?;
    writeln!(
        out,
        "{:>4} {:>8} {:>10} {:>10} {:>10} {:>17}",
        "cpu", "waits", "total", "avg", "max", "idle"
    )?;
    let or_dash = |ns: u64, waits: u64| if waits == 0 { "-".to_string() } else { human_ns(ns) };
    let window = r.idle_window_ns as f64;
    for c in &r.cpus {
        let idle = match c.idle_ns {
            Some(ns) if window > 0.0 => format!("{} ({:.0}%)", human_ns(ns), 100.0 * ns as f64 / window),
            Some(ns) => human_ns(ns),
            None => "-".to_string(),
        };
        writeln!(
            out,
            "{:>4} {:>8} {:>10} {:>10} {:>10} {idle:>17}",
            c.cpu,
            c.waits,
            or_dash(c.total_delay_ns, c.waits),
            or_dash(c.avg_delay_ns, c.waits),
            or_dash(c.max_delay_ns, c.waits),
        )?;
    }
    if r.unplaced.waits > 0 {
        writeln!(
            out,
            "  and {} waits ({}) in no CPU's row: settled after a switch-out the kernel did not show",
            r.unplaced.waits,
            human_ns(r.unplaced.delay_ns)
        )?;
    }
    Ok(())
}

/// The most delayed tasks' waits in power-of-two buckets; JSON has the fine buckets.
fn histograms(r: &SchedReport, out: &mut dyn Write) -> io::Result<()> {
    let tasks: Vec<&TaskLatency> = r
        .tasks
        .iter()
        .filter(|t| t.waits > 0)
        .take(HISTOGRAM_TASKS)
        .collect();
    if tasks.is_empty() {
        return Ok(());
    }
    writeln!(
        out,
        "\nWait histograms (power-of-two buckets in binary units: 1 us = 2^10 ns, 1 ms = 2^20 ns, \
         1 s = 2^30 ns; finer buckets in --format json)"
    )?;
    for t in tasks {
        writeln!(out, "{} (tid {}), {} waits", t.comm, t.tid, t.waits)?;
        histogram_lines(&t.histogram, out)?;
    }
    Ok(())
}

/// A fine histogram as power-of-two rows, each with its count and a bar.
pub(crate) fn histogram_lines(histogram: &[Bucket], out: &mut dyn Write) -> io::Result<()> {
    let rows = log2_rows(histogram);
    let max = rows.iter().map(|row| row.count).max().unwrap_or(1).max(1);
    for row in rows {
        let (lower, upper) = row.labels();
        let bar = "#".repeat((row.count * BAR_WIDTH).div_ceil(max) as usize);
        let line = format!("  {lower:>6} .. {upper:<6} {:>8} {bar}", row.count);
        writeln!(out, "{}", line.trim_end())?;
    }
    Ok(())
}

fn offcpu(r: &SchedReport, out: &mut dyn Write) -> io::Result<()> {
    writeln!(
        out,
        "\nOff-CPU: where tasks blocked (sleeping or waiting for I/O), leaf first"
    )?;
    if r.offcpu_stacks.is_empty() {
        writeln!(out, "  (no blocking observed)")?;
    }
    for (i, s) in r.offcpu_stacks.iter().take(TOP_OFFCPU).enumerate() {
        writeln!(
            out,
            "[{}] {} in {} blocks  pid {} tid {} {}",
            i + 1,
            human_ns(s.total_ns),
            s.count,
            s.pid,
            s.tid,
            s.comm
        )?;
        for frame in s.frames.iter().rev().take(MAX_FRAMES_SHOWN) {
            writeln!(out, "      {}", describe(frame))?;
        }
    }
    Ok(())
}

fn slowest(r: &SchedReport, out: &mut dyn Write) -> io::Result<()> {
    writeln!(
        out,
        "\nSlowest waits (>= {}): {} in total{}",
        human_ns(r.slow_threshold_ns),
        r.slow_total,
        if r.slow_total as usize > r.slow.len() {
            format!(", the {} longest listed", r.slow.len())
        } else {
            String::new()
        }
    )?;
    for e in r.slow.iter().take(TOP_SLOW) {
        let waker = match &e.waker {
            Some(w) => format!("woken by {} (tid {})", w.comm, w.tid),
            None => "preempted".to_string(),
        };
        let holders: Vec<String> = e
            .cpu_holders
            .iter()
            .map(|h| format!("{} (tid {}) {}", h.comm, h.tid, human_ns(h.held_ns)))
            .collect();
        let (cpu, holders) = match e.cpu {
            Some(cpu) if holders.is_empty() => (cpu.to_string(), "-".to_string()),
            Some(cpu) if !e.holders_complete => (
                cpu.to_string(),
                format!("{}, … (earlier ones not kept)", holders.join(", ")),
            ),
            Some(cpu) => (cpu.to_string(), holders.join(", ")),
            None => ("?".to_string(), "not known".to_string()),
        };
        writeln!(
            out,
            "  {:>10}  {} (tid {}) on CPU {} at {:.2}s; {waker}; CPU held by: {}",
            human_ns(e.delay_ns),
            e.comm,
            e.tid,
            cpu,
            e.at_s,
            holders
        )?;
    }
    Ok(())
}

/// One row of the compact histogram: the power-of-two buckets `first..=last` and the waits in
/// them. Bucket 0 holds 0 ns; bucket `j` > 0 holds [2^(j-1), 2^j) ns.
#[derive(Debug, PartialEq)]
struct Row {
    first: u32,
    last: u32,
    count: u64,
    /// It holds the fine histogram's last bucket, which has no upper bound.
    open: bool,
}

/// The power-of-two bucket of a value: its bit length.
fn log2_bucket(ns: u64) -> u32 {
    u64::BITS - ns.leading_zeros()
}

/// The fine buckets (each within one power of two, see `profiler_common::hist_bucket`) added
/// into power-of-two buckets, from the first non-empty one to the last, each run of empty ones
/// between them one row.
fn log2_rows(histogram: &[Bucket]) -> Vec<Row> {
    let mut counts = [0u64; u64::BITS as usize + 1];
    let mut open = None;
    for b in histogram.iter().filter(|b| b.count > 0) {
        let j = log2_bucket(b.le_ns);
        counts[j as usize] = counts[j as usize].saturating_add(b.count);
        if hist_bucket(b.le_ns) == HIST_BUCKETS - 1 {
            open = Some(j);
        }
    }
    let Some(first) = counts.iter().position(|&c| c > 0) else {
        return Vec::new();
    };
    let last = counts.iter().rposition(|&c| c > 0).unwrap_or(first);
    let mut rows: Vec<Row> = Vec::new();
    for j in first as u32..=last as u32 {
        let count = counts[j as usize];
        match rows.last_mut() {
            Some(empty) if count == 0 && empty.count == 0 => empty.last = j,
            _ => rows.push(Row {
                first: j,
                last: j,
                count,
                open: open == Some(j),
            }),
        }
    }
    rows
}

impl Row {
    /// The lower and upper edges, as powers of two of nanoseconds in binary units.
    fn labels(&self) -> (String, String) {
        let lower = match self.first {
            0 => "0 ns".to_string(),
            j => power_of_two(j - 1),
        };
        let upper = match self.open {
            true => "∞".to_string(),
            false => power_of_two(self.last),
        };
        (lower, upper)
    }
}

/// 2^k ns in binary units: 512 ns, 1 us (2^10 ns), 2 ms (2^21 ns), 4 s (2^32 ns).
fn power_of_two(k: u32) -> String {
    let (unit, shift) = match k {
        0..=9 => ("ns", 0),
        10..=19 => ("us", 10),
        20..=29 => ("ms", 20),
        _ => ("s", 30),
    };
    format!("{} {unit}", 1u64 << (k - shift).min(63))
}

#[cfg(test)]
mod tests {
    use profiler_common::{hist_lower_bound, HIST_BUCKETS};

    use super::*;
    use crate::modes::sched::{latencies, TaskRecord};

    fn task_of(waits: &[u64]) -> TaskLatency {
        latencies(&[TaskRecord::with_waits(2, "hog", waits)], 0).remove(0)
    }

    /// The values a row holds: [lower, upper), upper `None` for no bound.
    fn bounds(row: &Row) -> (u64, Option<u64>) {
        let lower = match row.first {
            0 => 0,
            j => 1 << (j - 1),
        };
        (lower, (!row.open).then(|| 1 << row.last))
    }

    #[test]
    fn every_fine_bucket_lies_in_one_power_of_two_bucket() {
        for i in 0..HIST_BUCKETS - 1 {
            let (lowest, highest) = (hist_lower_bound(i), hist_lower_bound(i + 1) - 1);
            assert_eq!(
                log2_bucket(lowest),
                log2_bucket(highest),
                "fine bucket {i}: {lowest}..={highest}"
            );
        }
        // The last fine bucket has no upper bound: its row says so.
        let rows = log2_rows(&task_of(&[1 << 45]).histogram);
        assert_eq!(rows.len(), 1);
        assert!(rows[0].open && bounds(&rows[0]).0 <= hist_lower_bound(HIST_BUCKETS - 1));
        assert_eq!(rows[0].labels(), ("512 s".to_string(), "∞".to_string()));
    }

    #[test]
    fn each_row_counts_exactly_the_waits_within_its_edges() {
        let waits: Vec<u64> = [
            0, 1, 2, 3, 700, 1023, 1024, 1500, 2047, 2048, 90_000, 5_000_000, 5_100_000,
        ]
        .into_iter()
        .chain((1..400).map(|i| i * 977))
        .collect();
        let task = task_of(&waits);
        let rows = log2_rows(&task.histogram);
        let full: u64 = task.histogram.iter().map(|b| b.count).sum();
        assert_eq!(rows.iter().map(|r| r.count).sum::<u64>(), full);
        assert_eq!(full, waits.len() as u64);
        for row in &rows {
            let (lower, upper) = bounds(row);
            let truth = waits
                .iter()
                .filter(|&&w| w >= lower && upper.is_none_or(|u| w < u))
                .count() as u64;
            assert_eq!(row.count, truth, "{row:?}: [{lower}, {upper:?})");
        }
        // Contiguous, first and last non-empty, empty runs folded into one row each.
        assert!(rows.windows(2).all(|w| w[1].first == w[0].last + 1));
        assert!(rows.first().unwrap().count > 0 && rows.last().unwrap().count > 0);
        assert!(rows.windows(2).all(|w| w[0].count > 0 || w[1].count > 0));
    }

    fn report_of(tasks: Vec<TaskLatency>) -> SchedReport {
        let offcpu = crate::report::tests::sample_report();
        SchedReport {
            meta: offcpu.meta.clone(),
            health: Default::default(),
            tasks,
            cpus: Vec::new(),
            unplaced: Default::default(),
            idle_window_ns: 0,
            offcpu,
            offcpu_stacks: Vec::new(),
            slow_threshold_ns: 10_000_000,
            slow_total: 0,
            slow: Vec::new(),
            heatmap: crate::modes::sched::Heatmap {
                column_s: 1.0,
                row_lower_ns: Vec::new(),
                columns: Vec::new(),
            },
        }
    }

    #[test]
    fn three_hogs_give_a_short_report_whose_histograms_add_up() {
        // Waits spread from 1 us to 27 ms, as CPU hogs sharing CPUs see them.
        let waits: Vec<u64> = (0..3000u64).map(|i| 1_000 + i * i * 3).collect();
        let report = report_of((0..3).map(|_| task_of(&waits)).collect());
        let mut out = Vec::new();
        crate::report::renderer(crate::cli::Format::Text)
            .sched(&report, &mut out)
            .unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.lines().count() < 70, "{text}");
        let histograms = text.split("\nWait histograms").nth(1).expect("histograms");
        let histograms = histograms.split("\nOff-CPU").next().unwrap();
        for task in histograms.split("hog (tid 2), 3000 waits\n").skip(1) {
            let rows: Vec<&str> = task.lines().filter(|l| l.contains(" .. ")).collect();
            assert_eq!(
                rows[0].split_whitespace().take(5).collect::<Vec<_>>(),
                ["512", "ns", "..", "1", "us"]
            );
            assert!(rows.iter().any(|r| r.ends_with(&"#".repeat(40))), "{task}");
            let counts: u64 = rows
                .iter()
                .map(|r| r.split_whitespace().nth(5).unwrap().parse::<u64>().unwrap())
                .sum();
            assert_eq!(counts, 3000, "{task}");
        }
        assert_eq!(histograms.matches("3000 waits").count(), 3);
    }

    #[test]
    fn edges_read_in_binary_units() {
        let labels = |first, last| {
            Row {
                first,
                last,
                count: 1,
                open: false,
            }
            .labels()
        };
        assert_eq!(labels(0, 0), ("0 ns".into(), "1 ns".into()));
        assert_eq!(labels(10, 10), ("512 ns".into(), "1 us".into()));
        assert_eq!(labels(11, 13), ("1 us".into(), "8 us".into()));
        assert_eq!(labels(21, 31), ("1 ms".into(), "2 s".into()));
        assert_eq!(power_of_two(64), "17179869184 s");
    }
}
