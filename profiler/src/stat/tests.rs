//! `stat`'s figures and report, from counts made up here.
use std::collections::HashMap;

use super::*;
use crate::counters::tma::Count;

fn counts(values: &[(&str, f64, f64)]) -> Counts {
    Counts {
        events: values
            .iter()
            .map(|(name, value, running)| {
                (
                    name.to_string(),
                    Count {
                        value: *value,
                        running: *running,
                    },
                )
            })
            .collect::<HashMap<_, _>>(),
        not_counted: Vec::new(),
    }
}

fn plan(events: &str) -> Plan {
    let args = crate::cli::StatArgs {
        events: vec![events.to_string()],
        filter: None,
        by: None,
        repeat: 1,
        interval_ms: None,
        scope: crate::cli::ScopeArgs {
            system_wide: true,
            ..Default::default()
        },
        report: Default::default(),
    };
    Plan::for_stat(&args, String::new()).unwrap()
}

#[test]
fn the_spread_is_the_standard_error_of_the_mean_as_a_share_of_it() {
    let one = Figure::of(&[10.0]);
    assert_eq!((one.value, one.spread_pct), (10.0, None), "one run has no spread");
    // Mean 10, sample standard deviation 2 (values 8, 10, 12), standard error 2/sqrt(3).
    let three = Figure::of(&[8.0, 10.0, 12.0]);
    assert_eq!(three.value, 10.0);
    let expected = 100.0 * 2.0 / 3f64.sqrt() / 10.0;
    assert!((three.spread_pct.unwrap() - expected).abs() < 1e-9, "{three:?}");
    assert_eq!(Figure::of(&[5.0, 5.0]).spread_pct, Some(0.0));
}

#[test]
fn a_report_keeps_the_given_order_says_what_never_counted_and_derives_ipc() {
    let plan = plan("instructions,cycles,{branches,branch-misses},page-faults");
    let run = |scale: f64| Run {
        seconds: 2.0,
        counts: counts(&[
            ("instructions", 3000.0 * scale, 1.0),
            ("cycles", 2000.0 * scale, 0.5),
            ("branches", 100.0 * scale, 1.0),
            ("branch-misses", 5.0 * scale, 1.0),
        ]),
        values: None,
        intervals: Vec::new(),
        notes: Vec::new(),
    };
    let report = StatReport::of(&plan, &[run(1.0), run(1.2)]);
    let order: Vec<&str> = report.counters.iter().map(|c| c.event.as_str()).collect();
    assert_eq!(order, ["instructions", "cycles", "branches", "branch-misses"]);
    assert_eq!(report.not_counted, ["page-faults"]);
    assert_eq!(report.counters[1].running, 0.5);
    assert_eq!(report.counters[0].runs, [3000.0, 3600.0]);
    let metric = |name: &str| report.metrics.iter().find(|m| m.name == name).unwrap();
    assert!((metric("ipc").figure.value - 1.5).abs() < 1e-9);
    assert_eq!(
        metric("ipc").figure.spread_pct,
        Some(0.0),
        "the same IPC in both runs"
    );
    assert!((metric("branch_mispredict_rate").figure.value - 0.05).abs() < 1e-9);
    assert_eq!(metric("branch_mispredict_rate").assessment, Some("investigate"));
    let mut text = Vec::new();
    render::text(&report, &mut text).unwrap();
    let text = String::from_utf8(text).unwrap();
    println!("{text}");
    assert!(text.contains("(2 runs)"), "{text}");
    assert!(text.contains("3,300       instructions"), "{text}");
    assert!(text.contains("(50.00% of the run on the PMU, scaled)"), "{text}");
    assert!(text.contains("<not counted>       page-faults"), "{text}");
    let mut json = Vec::new();
    crate::report::json::write_command_json(&mut json, "stat", &report).unwrap();
    let json: serde_json::Value = serde_json::from_slice(&json).unwrap();
    assert_eq!(json["mode"], "stat");
    assert_eq!(json["counters"][0]["value"], 3300.0);
    assert!(json["counters"][0]["spread_pct"].as_f64().unwrap() > 0.0);
}

#[test]
fn intervals_are_the_differences_of_readings() {
    let mut sink = StatSink::new(
        Some(Duration::from_millis(100)),
        false,
        vec!["page-faults".into()],
    );
    for (at_s, total) in [(0.1, 40.0), (0.2, 100.0), (0.3, 100.0)] {
        let batch = StatBatch {
            counts: counts(&[("page-faults", total, 1.0)]),
            at_s,
            last: false,
        };
        sink.interval(&batch);
    }
    let each: Vec<f64> = sink.intervals.iter().map(|i| i.counts[0].1).collect();
    assert_eq!(each, [40.0, 60.0, 0.0]);
}

#[test]
fn counts_are_grouped_by_thousands() {
    assert_eq!(render::grouped(0.0), "0");
    assert_eq!(render::grouped(999.0), "999");
    assert_eq!(render::grouped(1000.0), "1,000");
    assert_eq!(render::grouped(1234567.4), "1,234,567");
}

/// `--by` over two runs: each value's mean (a value one run lacks counts 0 there), most first;
/// ranges in order, printed as their numbers; a system call's number named; what the kernel's
/// table could not keep said.
#[test]
fn values_are_averaged_over_the_runs_and_printed_with_their_shares() {
    use profiler_common::values::ByField;

    use crate::sources::values::ValueBatch;
    let batch = |values: &[(u64, u64)], lost: u64| ValueBatch {
        values: vec![values.iter().copied().collect()],
        lost: vec![lost],
    };
    let (one, two) = (batch(&[(3, 10), (1, 2)], 0), batch(&[(3, 30), (0, 4)], 2));
    let exact = ByField::default();
    let events = ["raw_syscalls:sys_enter".to_string()];
    let runs = [Some(&one), Some(&two)];
    let values = values::over_runs(&events, "id", &[exact], &runs);
    let shown: Vec<_> = (values[0].values.iter())
        .map(|v| (v.value, v.count, v.name.clone()))
        .collect();
    assert_eq!(
        shown,
        [
            (Some(3), 20.0, Some("close".into())),
            (Some(0), 2.0, Some("read".into())),
            (Some(1), 1.0, Some("write".into()))
        ]
    );
    assert_eq!(values[0].unkept, 1.0);
    let ranges = ByField {
        log2: 1,
        signed: 1,
        size: 8,
        ..ByField::default()
    };
    let negative = batch(&[(-3i64 as u64, 5), (0, 1), (13, 2)], 0);
    let values = values::over_runs(&events, "ret:log2", &[ranges], &[Some(&negative)]);
    let mut text = Vec::new();
    values::text(&values, &mut text).unwrap();
    let text = String::from_utf8(text).unwrap();
    println!("{text}");
    let order: Vec<_> = values[0].values.iter().map(|v| (v.from, v.to)).collect();
    assert_eq!(
        order,
        [(Some(-7), Some(-4)), (Some(0), Some(0)), (Some(4096), Some(8191))]
    );
    assert!(
        text.contains("62.50%  ret=-7..-4\n") && text.contains("ret=4096..8191\n"),
        "{text}"
    );
}
