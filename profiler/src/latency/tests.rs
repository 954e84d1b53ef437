use profiler_common::{hist_bucket, HIST_BUCKETS};

use super::*;

/// 200 latencies of about 1.05 ms and 50 of about 20.1 ms: the figures and the histogram's
/// power-of-two rows say them (1 ms .. 2 ms: 200; 16 ms .. 32 ms: 50).
#[test]
fn the_report_counts_every_interval_and_its_percentiles_fall_in_their_buckets() {
    let mut batch = LatencyBatch {
        hist: vec![0; HIST_BUCKETS],
        unmatched: 3,
        pending: 1,
        ..Default::default()
    };
    let values: Vec<u64> = (0..200)
        .map(|i| 1_050_000 + i * 100)
        .chain((0..50).map(|i| 20_100_000 + i * 1000))
        .collect();
    for &v in &values {
        batch.hist[hist_bucket(v)] += 1;
        batch.sum_ns += v;
        batch.max_ns = batch.max_ns.max(v);
    }
    let interval = Interval {
        from: "syscalls:sys_enter_clock_nanosleep".into(),
        to: "syscalls:sys_exit_clock_nanosleep".into(),
        key: "thread".into(),
        filter: None,
    };
    let r = LatencyReport::of(interval, "command `x`".into(), 1.5, &batch, Vec::new());
    assert_eq!(r.count, 250);
    assert_eq!(r.avg_ns, values.iter().sum::<u64>() / 250);
    let near = |got: u64, truth: u64| (got as f64 / truth as f64 - 1.0).abs() < 0.0625;
    assert!(near(r.p50_ns, 1_060_000), "{}", r.p50_ns);
    assert!(near(r.p90_ns, 20_100_000), "{}", r.p90_ns);
    assert!(r.p99_ns <= r.max_ns && near(r.p99_ns, 20_150_000), "{}", r.p99_ns);
    let mut text = Vec::new();
    render::text(&r, &mut text).unwrap();
    let text = String::from_utf8(text).unwrap();
    println!("{text}");
    assert!(text.contains("count 250"), "{text}");
    let row = |label: &str| {
        let line = text.lines().find(|l| l.trim_start().starts_with(label)).unwrap();
        line.split_whitespace().nth(5).unwrap().parse::<u64>().unwrap()
    };
    assert_eq!(row("1 ms .. 2 ms"), 200);
    assert_eq!(row("16 ms .. 32 ms"), 50);
    assert!(text.contains("3 ends of syscalls:sys_exit_clock_nanosleep had no start"));
    assert!(text.contains("1 starts had not ended"));
}

/// The heatmap's cells are the batch's columns: one rect per non-empty (second, row), titled
/// with its count; its title says what was timed.
#[test]
fn a_heatmap_draws_each_columns_counts() {
    use profiler_common::HEAT_BUCKETS;
    let mut columns = vec![vec![0; HEAT_BUCKETS]; 2];
    columns[0][hist_bucket(1_050_000) / 8] = 97;
    columns[1][hist_bucket(1_050_000) / 8] = 3;
    columns[1][hist_bucket(20_100_000) / 8] = 25;
    let batch = LatencyBatch {
        hist: vec![0; HIST_BUCKETS],
        columns,
        ..LatencyBatch::default()
    };
    let interval = Interval {
        from: "syscalls:sys_enter_clock_nanosleep".into(),
        to: "syscalls:sys_exit_clock_nanosleep".into(),
        key: "thread".into(),
        filter: Some("which_clock == 0".into()),
    };
    let r = LatencyReport::of(interval, "command `x`".into(), 1.5, &batch, Vec::new());
    let mut svg = Vec::new();
    render::heatmap(&r, &mut svg).unwrap();
    let svg = String::from_utf8(svg).unwrap();
    assert!(svg.contains("latency heatmap: syscalls:sys_enter_clock_nanosleep where which_clock == 0 to"));
    for cell in [
        "<title>0s: 97 intervals of",
        "<title>1s: 3 intervals of",
        "<title>1s: 25 intervals of",
    ] {
        assert!(svg.contains(cell), "{cell}: {svg}");
    }
    assert_eq!(svg.matches("<title>").count(), 3);
}
