//! The sources table and each source's needs, checked without root: a run's plan is a value.
use std::{collections::BTreeSet, path::Path};

use clap::Parser as _;
use profiler_common::names;

use super::*;
use crate::{bpf::OPTIONAL_MAPS, cli::Cli, plan::Plan, sources::locks::Reading, start::Targets};

/// The maps a run of this command line uses, of those only some runs use.
fn maps_of(args: &[&str]) -> BTreeSet<&'static str> {
    maps_of_plan(Plan::from_cli(Cli::try_parse_from(args).unwrap()).unwrap())
}

/// The maps a plan's run uses, system-wide.
fn maps_of_plan(plan: Plan) -> BTreeSet<&'static str> {
    let recipe = plan.recipe(Reading::AtEnd).unwrap();
    let targets = Targets {
        system_wide: true,
        pids: &[],
        command: None,
    };
    recipe
        .load_options(Path::new("/sys/kernel/tracing"), &targets)
        .maps
}

/// The maps `bpfprof trace -s -a` uses.
fn trace_maps() -> BTreeSet<&'static str> {
    let args = crate::cli::TraceArgs {
        summary: true,
        duration_min_ms: None,
        scope: crate::cli::ScopeArgs {
            system_wide: true,
            ..Default::default()
        },
        report: Default::default(),
    };
    maps_of_plan(Plan::for_trace(&args).unwrap())
}

/// The maps `bpfprof latency --duration-min 10` uses (whatever its two events: its needs alone).
fn latency_maps() -> BTreeSet<&'static str> {
    let event = crate::counters::language::Catalog::here()
        .parse("page-faults")
        .unwrap();
    let spec = Spec::Latency(Box::new(latency::Spec {
        from: event.clone(),
        to: event,
        keys: Default::default(),
        key: "thread".into(),
        filter: None,
        heatmap: false,
        slow_ns: Some(10_000_000),
    }));
    let mut options = crate::bpf::LoadOptions::new(Path::new("/"), true, true);
    spec.needs(&mut options);
    options.maps
}

/// The maps `bpfprof stat --by` uses (whatever its events: its needs alone).
fn values_maps() -> BTreeSet<&'static str> {
    let spec = Spec::Values(values::Spec {
        events: Vec::new(),
        fields: Vec::new(),
        filters: Vec::new(),
    });
    let mut options = crate::bpf::LoadOptions::new(Path::new("/"), true, true);
    spec.needs(&mut options);
    options.maps
}

fn kinds_of(args: &[&str]) -> Vec<Kind> {
    let plan = Plan::from_cli(Cli::try_parse_from(args).unwrap()).unwrap();
    plan.recipe(Reading::AtEnd)
        .unwrap()
        .specs
        .iter()
        .map(Spec::kind)
        .collect()
}

#[test]
fn every_mode_and_signal_has_its_sources_and_every_source_is_used() {
    for mode in [Mode::Hotspot, Mode::Topdown, Mode::Lock, Mode::Sched] {
        assert!(!of_mode(mode).is_empty(), "{mode:?} uses no source");
    }
    let used: BTreeSet<Kind> = MODE_SOURCES
        .iter()
        .flat_map(|(_, kinds)| kinds.iter().copied())
        .chain(SIGNAL_SOURCES.iter().map(|(_, kind)| *kind))
        .collect();
    assert_eq!(
        used,
        BTreeSet::from([
            Kind::Locks,
            Kind::CpuSamples,
            Kind::Sched,
            Kind::Counting,
            Kind::Stat,
            Kind::Values,
            Kind::Syscalls,
            Kind::Latency,
            Kind::Records,
            Kind::Timeline
        ])
    );
    // Two signals of one source: the source once.
    assert_eq!(of_signals(&[Signal::RunQueue, Signal::OffCpu]), [Kind::Sched]);
    assert_eq!(
        of_signals(&Signal::ALL),
        [Kind::Locks, Kind::CpuSamples, Kind::Sched],
        "in attach order"
    );
}

#[test]
fn each_mode_uses_its_sources_maps_and_no_other() {
    let hotspot = maps_of(&["bpfprof", "-a"]);
    println!("hotspot: {hotspot:?}");
    for map in names::SAMPLES
        .iter()
        .chain(&names::STACKS)
        .chain(&names::USER_STACKS)
    {
        assert!(hotspot.contains(map), "{map}");
    }
    assert!(hotspot.contains(names::UNWIND_ROWS));
    assert!(!hotspot.contains(names::DELTAS[0]), "no counters read");
    assert!(!hotspot
        .iter()
        .any(|m| m.starts_with("LOCK_") || m.starts_with("OFFCPU")));
    assert!(!hotspot.contains(names::TASK_STATS));

    let counters = maps_of(&["bpfprof", "-a", "--counter", "page-faults"]);
    assert!(counters.contains(names::DELTAS[1]) && counters.contains(names::PENDING_DELTAS));

    let frame_pointers = maps_of(&["bpfprof", "-a", "--unwind", "fp"]);
    assert!(frame_pointers.contains(names::SAMPLES[0]));
    for map in [
        names::UNWIND_ROWS,
        names::USER_STACKS[0],
        names::BUILD_ID_STACKS[0],
    ] {
        assert!(!frame_pointers.contains(map), "{map} without tables");
    }

    let sched = maps_of(&["bpfprof", "-a", "--mode", "sched"]);
    assert!(sched.contains(names::TASK_STATS) && sched.contains(names::OFFCPU_USER_STACKS[0]));
    assert!(!sched.contains(names::SAMPLES[0]) && !sched.contains(names::LOCK_WAITERS));
    let no_stacks = maps_of(&["bpfprof", "-a", "--mode", "sched", "--offcpu-stacks", "none"]);
    assert!(no_stacks.contains(names::OFFCPU[0]));
    assert!(!no_stacks.contains(names::OFFCPU_USER_STACKS[0]) && !no_stacks.contains(names::UNWIND_ROWS));

    let futex = maps_of(&["bpfprof", "-a", "--mode", "lock"]);
    for map in [
        names::LOCK_WAITERS,
        names::LOCK_WAKES,
        names::LOCK_JOINABLE,
        names::LOCK_USER_STACKS,
    ] {
        assert!(futex.contains(map), "{map}");
    }
    assert!(!futex.contains(names::LOCK_STATES) && !futex.contains(names::SAMPLES[0]));
    let kernel = maps_of(&["bpfprof", "-a", "--mode", "lock", "--lock-source", "kernel"]);
    assert!(kernel.contains(names::LOCK_KERNEL_WAITING) && kernel.contains(names::LOCK_STACKS));
    assert!(!kernel.contains(names::LOCK_USER_STACKS) && !kernel.contains(names::UNWIND_ROWS));
}

#[test]
fn every_optional_map_is_used_by_some_run() {
    let runs: [&[&str]; 6] = [
        &["bpfprof", "-a", "--counter", "page-faults"],
        &["bpfprof", "-a", "--mode", "sched"],
        &["bpfprof", "-a", "--mode", "lock"],
        &["bpfprof", "-a", "--mode", "lock", "--lock-source", "kernel"],
        &["bpfprof", "-p", "1", "--mode", "lock", "--lock-source", "pthread"],
        &["bpfprof", "-a", "--mode", "topdown"],
    ];
    let used: BTreeSet<&str> = runs
        .iter()
        .flat_map(|args| match args.contains(&"pthread") {
            // Its libraries are found by `prepare`, which needs the process: its needs alone.
            true => {
                let spec = Spec::Locks(locks::Spec::new(crate::cli::LockSource::Pthread, Reading::AtEnd));
                let mut options = crate::bpf::LoadOptions::new(Path::new("/"), true, true);
                spec.needs(&mut options);
                options.maps
            }
            false => maps_of(args),
        })
        .chain(trace_maps())
        .chain(latency_maps())
        .chain(values_maps())
        .collect();
    let unused: Vec<&str> = OPTIONAL_MAPS.into_iter().filter(|m| !used.contains(m)).collect();
    assert!(unused.is_empty(), "optional maps no run uses: {unused:?}");
}

#[test]
fn modes_take_the_sources_of_the_table_in_attach_order() {
    assert_eq!(kinds_of(&["bpfprof", "-a"]), [Kind::CpuSamples]);
    assert_eq!(kinds_of(&["bpfprof", "-a", "--mode", "lock"]), [Kind::Locks]);
    // Topdown samples only where its counter set can be counted (a PMU for `topdown`).
    let topdown = kinds_of(&["bpfprof", "-a", "--mode", "topdown", "--preset", "software"]);
    assert_eq!(topdown, [Kind::CpuSamples, Kind::Sched, Kind::Counting]);
    let topdown = kinds_of(&["bpfprof", "-a", "--mode", "topdown"]);
    let pmu = crate::counters::pmu::missing_reason().is_none();
    println!("topdown here (PMU: {pmu}): {topdown:?}");
    assert_eq!(topdown.contains(&Kind::CpuSamples), pmu);
    assert!(topdown.ends_with(&[Kind::Sched, Kind::Counting]));
}
