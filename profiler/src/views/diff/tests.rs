use super::*;
use crate::{cli::Format, model::tests::stack, report::tests::sample_report, symbolize::Frame, views::saved};

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

/// A hotspot profile of cpu-clock at 99 Hz whose leaves under main;run have these counts.
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

fn at(mut report: StackReport, event: &'static str, hz: u64) -> StackReport {
    report.meta.event = event.to_string();
    report.meta.frequency_hz = hz;
    report
}

fn find<'a>(d: &'a Diff, name: &str) -> &'a FunctionChange {
    d.functions
        .iter()
        .find(|f| f.function == name)
        .unwrap_or_else(|| panic!("{name} not in {:?}", d.functions))
}

fn rendered(d: &Diff, format: Format) -> String {
    let how = Rendering {
        format,
        limit: 20,
        before_widths: false,
    };
    let mut out = Vec::new();
    render(d, how, &mut out).unwrap();
    String::from_utf8(out).unwrap()
}

#[test]
fn shares_are_normalised_so_runs_of_any_length_compare() {
    // Before: a 60%, b 40% of 100 samples. After: a 20%, b 80% of 1000 samples.
    let before = profile(&[("a", 60), ("b", 40)]);
    let after = profile(&[("a", 200), ("b", 800)]);
    let d = diff(("before", &before), ("after", &after)).unwrap();
    let a = find(&d, "a");
    assert!((a.self_change_pp() + 40.0).abs() < 1e-9, "{a:?}");
    assert_eq!(find(&d, "run").total_change_pp(), 0.0);
    // Folded: each profile's own counts.
    assert!(
        d.stacks.contains(&("w;main;run;a".into(), 60, 200)),
        "{:?}",
        d.stacks
    );
    assert!(
        d.stacks.contains(&("w;main;run;b".into(), 40, 800)),
        "{:?}",
        d.stacks
    );
    assert!(rendered(&d, Format::Folded).contains("w;main;run;b 40 800\n"));
}

#[test]
fn after_a_speed_up_unchanged_code_keeps_its_time_while_its_share_grows() {
    // zlib 3x faster: 300 -> 100 samples; the interpreter unchanged at 100, its share 25% -> 50%.
    let before = profile(&[("zlib", 300), ("interp", 100)]);
    let after = profile(&[("zlib", 100), ("interp", 100)]);
    let d = diff(("before", &before), ("after", &after)).unwrap();
    let period = (1_000_000_000 / 99) as f64 / 1e9;
    let interp = find(&d, "interp");
    assert_eq!(
        (
            interp.counts.self_before,
            interp.counts.self_after,
            interp.counts.self_change
        ),
        (100, 100, 0)
    );
    assert_eq!(interp.seconds.unwrap().self_change, 0.0);
    assert!((interp.self_change_pp() - 25.0).abs() < 1e-9);
    let zlib = find(&d, "zlib");
    assert_eq!(zlib.counts.self_change, -200);
    assert!((zlib.seconds.unwrap().self_change + 200.0 * period).abs() < 1e-12);
    assert_eq!(d.ranked_by, Ranking::Seconds);
    assert_eq!(
        d.functions[0].function, "zlib",
        "the largest absolute change first"
    );
    assert_eq!(d.before.total_seconds, Some(400.0 * period));

    let table = rendered(&d, Format::Text);
    assert!(
        table.contains("        hotspot, 1.0 s run: 400 samples of cpu-clock at 99 Hz = 4.04 s on CPU\n"),
        "{table}"
    );
    assert!(
        table.contains("Ranked by the change in self time, then total time"),
        "{table}"
    );
    assert!(table.contains("self time (s)"), "{table}");
    assert!(
        table.contains("   3.030    1.010    -2.020   75.0%  50.0%     -2.020  zlib\n"),
        "{table}"
    );
    assert!(
        table.contains("   1.010    1.010    +0.000   25.0%  50.0%     +0.000  interp\n"),
        "{table}"
    );

    let json: serde_json::Value = serde_json::from_str(&rendered(&d, Format::Json)).unwrap();
    assert_eq!(json["ranked_by"], "seconds");
    assert_eq!(json["before"]["total"], 400);
    let first = &json["functions"][0];
    assert_eq!(
        (
            first["function"].as_str(),
            first["counts"]["self_change"].as_i64()
        ),
        (Some("zlib"), Some(-200))
    );
}

#[test]
fn samples_compare_by_count_only_at_one_rate_of_one_event() {
    let (before, after) = (
        profile(&[("a", 60), ("b", 40)]),
        profile(&[("a", 20), ("b", 980)]),
    );
    let ranked = |b: &StackReport, a: &StackReport| {
        let d = diff(("b", b), ("a", a)).unwrap();
        (d.ranked_by, d.ranking_reason)
    };
    let same = ranked(
        &at(before.clone(), "cycles", 99),
        &at(after.clone(), "cycles", 99),
    );
    assert_eq!(
        same,
        (Ranking::Samples, "both profiles sampled cycles at 99 Hz".into())
    );
    let rates = ranked(
        &at(before.clone(), "cycles", 99),
        &at(after.clone(), "cycles", 999),
    );
    assert_eq!(rates.0, Ranking::Share, "{rates:?}");
    let unknown = ranked(&at(before.clone(), "other", 0), &after);
    assert_eq!(
        unknown,
        (
            Ranking::Share,
            "BEFORE does not say how often it was sampled".into()
        )
    );
    // The CPU clock at two rates: both are CPU time.
    assert_eq!(ranked(&before, &at(after, "cpu-clock", 999)).0, Ranking::Seconds);
}

#[test]
fn ranked_by_share_the_table_shows_samples_and_says_why() {
    let before = at(profile(&[("a", 60), ("b", 40)]), "other", 0);
    let after = at(profile(&[("a", 200), ("b", 800)]), "other", 0);
    let d = diff(("before", &before), ("after", &after)).unwrap();
    assert_eq!(d.ranked_by, Ranking::Share);
    assert!(d.functions.iter().all(|f| f.seconds.is_none()));
    let table = rendered(&d, Format::Text);
    assert!(
        table.contains("100 samples (sampling rate not recorded)\n"),
        "{table}"
    );
    assert!(
        table.contains("self share, then total share: BEFORE does not say"),
        "{table}"
    );
    assert!(
        table.contains("      60      200      +140   60.0%  20.0%       +140  a\n"),
        "{table}"
    );
}

#[test]
fn off_cpu_time_shows_in_seconds() {
    let mut before = profile(&[("wait", 2_000_000_000), ("poll", 500_000_000)]);
    let mut after = profile(&[("wait", 500_000_000), ("poll", 500_000_000)]);
    for report in [&mut before, &mut after] {
        report.weight = Weight::OffCpuNanoseconds;
        report.meta.mode = "sched";
    }
    let d = diff(("b", &before), ("a", &after)).unwrap();
    assert_eq!(d.ranked_by, Ranking::Seconds);
    assert_eq!(find(&d, "wait").seconds.unwrap().self_change, -1.5);
    let table = rendered(&d, Format::Text);
    assert!(
        table.contains("        sched, 1.0 s run: 2.50 s off CPU\n"),
        "{table}"
    );
    assert!(
        table.contains("   0.500    0.500    +0.000   20.0%  50.0%     +0.000  poll\n"),
        "{table}"
    );
}

/// Stacks main;run;[unknown] in two libraries, and how many samples each.
fn unknowns(lzma: u64, libc: u64) -> StackReport {
    let mut report = profile(&[("x", lzma), ("y", libc)]);
    let libraries = [
        "/usr/lib/x86_64-linux-gnu/liblzma.so.5",
        "/usr/lib/x86_64-linux-gnu/libc.so.6",
    ];
    for (stack, module) in report.stacks.iter_mut().zip(libraries) {
        *stack.frames.last_mut().unwrap() = Frame::unknown(module, 0x1234, false);
    }
    report.functions = crate::model::function_stats(&report.stacks);
    report
}

#[test]
fn unknown_frames_of_two_libraries_stay_two_rows_in_every_saved_format() {
    let original = (unknowns(70, 30), unknowns(10, 30));
    let saved = |report: &StackReport, format| {
        let mut bytes = Vec::new();
        crate::report::renderer(format)
            .hotspot(report, &mut bytes)
            .unwrap();
        saved::parse(&bytes, "saved").unwrap()
    };
    for format in [
        None,
        Some(Format::Json),
        Some(Format::Pprof),
        Some(Format::Folded),
    ] {
        let (before, after) = match format {
            None => original.clone(),
            Some(format) => (saved(&original.0, format), saved(&original.1, format)),
        };
        let d = diff(("b", &before), ("a", &after)).unwrap();
        let lzma = find(&d, "[liblzma.so.5]");
        assert_eq!(
            (lzma.counts.self_before, lzma.counts.self_after),
            (70, 10),
            "{format:?}"
        );
        let libc = find(&d, "[libc.so.6]");
        assert_eq!(
            (libc.counts.self_before, libc.counts.self_after),
            (30, 30),
            "{format:?}"
        );
        assert!(
            d.functions.iter().all(|f| f.function != "[unknown]"),
            "{format:?}"
        );
    }
    // A JSON profile against a folded one: the same rows.
    let d = diff(
        ("b", &saved(&original.0, Format::Json)),
        ("a", &saved(&original.1, Format::Folded)),
    )
    .unwrap();
    assert_eq!(find(&d, "[liblzma.so.5]").counts.self_change, -60);
}

#[test]
fn a_pprof_profile_of_the_cpu_clock_compares_by_time() {
    let mut bytes = Vec::new();
    crate::report::renderer(Format::Pprof)
        .hotspot(&profile(&[("a", 60)]), &mut bytes)
        .unwrap();
    let loaded = saved::parse(&bytes, "p.pb.gz").unwrap();
    let d = diff(("b", &loaded), ("a", &profile(&[("a", 30)]))).unwrap();
    assert_eq!(d.ranked_by, Ranking::Seconds, "{}", d.ranking_reason);
    assert_eq!(d.before.frequency_hz, 99);
    assert_eq!(find(&d, "a").counts.self_change, -30);
}

#[test]
fn a_function_only_in_one_profile_shows_from_zero() {
    let before = profile(&[("a", 50), ("gone", 50)]);
    let after = profile(&[("a", 50), ("new", 50)]);
    let d = diff(("b", &before), ("a", &after)).unwrap();
    let change = |name: &str| find(&d, name).self_change_pp();
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
fn table_fits_80_columns_and_svg_colours_by_share() {
    let long = "b_with_a_very_long_name_".repeat(5);
    // After runs ten times as long: every count grows, a's share shrinks.
    let before = profile(&[("a", 60), (long.as_str(), 40)]);
    let after = profile(&[("a", 200), (long.as_str(), 800)]);
    let deep = "/a/directory/some/levels/down/where/runs/are/kept/by/date/2026-11-23";
    let d = diff(
        (&format!("{deep}/before.json"), &before),
        (&format!("{deep}/after.json"), &after),
    )
    .unwrap();
    let table = rendered(&d, Format::Text);
    assert!(table.lines().all(|l| l.chars().count() <= 80), "{table}");
    assert!(
        table.contains("/2026-11-23/before.json\n        hotspot,"),
        "a cut path keeps its file name: {table}"
    );
    let svg = rendered(&d, Format::Svg);
    // inferno colours a shrunken frame blue (rgb with blue highest) and a grown one red.
    let a = fill(&svg, "a");
    assert!(a[2] > a[0], "a's share shrank: blue, got {a:?}");
    let b = fill(&svg, &long);
    assert!(b[0] > b[2], "b grew: red, got {b:?}");
}
