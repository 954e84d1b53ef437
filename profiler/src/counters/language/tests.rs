//! The event language against sysfs trees as the kernel lays them out.
use std::path::PathBuf;

use super::*;

/// A PMU as sysfs describes it: (name, type, formats, events).
type FakePmu<'a> = (&'a str, u32, &'a [(&'a str, &'a str)], &'a [(&'a str, &'a str)]);

/// A sysfs `event_source/devices` with these PMUs.
fn sysfs(tag: &str, pmus: &[FakePmu<'_>]) -> PathBuf {
    // One tree per call: the tests run at once, and each removes what it is about to build.
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let root = std::env::temp_dir().join(format!("bpfprof-language-{}-{tag}-{call}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    for (name, kind, formats, events) in pmus {
        let dir = root.join(name);
        std::fs::create_dir_all(dir.join("format")).unwrap();
        std::fs::create_dir_all(dir.join("events")).unwrap();
        std::fs::write(dir.join("type"), format!("{kind}\n")).unwrap();
        for (f, v) in *formats {
            std::fs::write(dir.join("format").join(f), format!("{v}\n")).unwrap();
        }
        for (e, v) in *events {
            std::fs::write(dir.join("events").join(e), format!("{v}\n")).unwrap();
        }
    }
    root
}

/// The emulated Neoverse N1's PMU: sysfs lists four events, Arm's table has the rest.
fn neoverse() -> Catalog {
    let root = sysfs(
        "arm",
        &[
            (
                "armv8_pmuv3",
                8,
                &[("event", "config:0-15"), ("long", "config1:0")],
                &[
                    ("cpu_cycles", "event=0x0011"),
                    ("inst_retired", "event=0x0008"),
                    ("sw_incr", "event=0x0000"),
                    ("br_mis_pred", "event=0x0010"),
                ],
            ),
            ("software", 1, &[], &[]),
        ],
    );
    Catalog::at(&root)
}

fn intel() -> Catalog {
    let root = sysfs(
        "x86",
        &[(
            "cpu",
            4,
            &[
                ("event", "config:0-7"),
                ("umask", "config:8-15"),
                ("cmask", "config:24-31"),
            ],
            &[
                ("cpu-cycles", "event=0x3c"),
                ("mem-loads", "event=0xcd,umask=0x1,ldlat=3"),
            ],
        )],
    );
    Catalog::at(&root)
}

fn resolved(catalog: &Catalog, text: &str) -> (u32, u64) {
    let event = catalog.parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
    (event.kind, event.config)
}

#[test]
fn generic_software_and_cache_events_are_perfs_own_numbers() {
    let here = intel();
    assert_eq!(resolved(&here, "cycles"), (0, 0));
    assert_eq!(resolved(&here, "branch-misses"), (0, 5));
    assert_eq!(resolved(&here, "ref-cycles"), (0, 9));
    assert_eq!(resolved(&here, "page-faults"), (1, 2));
    assert_eq!(resolved(&here, "cs"), (1, 3));
    assert_eq!(resolved(&here, "emulation-faults"), (1, 8));
    // perf's encoding: cache | op << 8 | result << 16.
    assert_eq!(resolved(&here, "L1-dcache-load-misses"), (3, 0x1_0000));
    assert_eq!(resolved(&here, "LLC-store-misses"), (3, 0x1_0102));
    assert_eq!(resolved(&here, "dTLB-load-misses"), (3, 0x1_0003));
    assert_eq!(resolved(&here, "branch-loads"), (3, 0x5));
    assert!(!here.parse("task-clock").unwrap().hardware);
    assert!(here.parse("instructions").unwrap().hardware);
    assert!(here.parse("cpu-clock").unwrap().is_cpu_clock());
}

#[test]
fn pmu_events_by_name_by_terms_and_raw() {
    let here = intel();
    assert_eq!(resolved(&here, "cpu/event=0xc4,umask=0x00/"), (4, 0xc4));
    assert_eq!(
        resolved(&here, "cpu/event=0xd1,umask=0x20,cmask=1/"),
        (4, 0x0100_20d1)
    );
    assert_eq!(resolved(&here, "cpu/config=0x1234/"), (4, 0x1234));
    assert_eq!(resolved(&here, "cpu/cpu-cycles/"), (4, 0x3c));
    assert_eq!(resolved(&here, "r01c4"), (4, 0x1c4));
    assert_eq!(resolved(&here, "r10"), (4, 0x10));
    // A term this PMU's format has not, and a value that does not fit.
    let error = here.parse("cpu/event=0xc4,any=1/").unwrap_err().to_string();
    assert!(error.contains("no `any` format field"), "{error}");
    assert!(here.parse("cpu/umask=0x1ff/").is_err());
    assert!(here
        .parse("cpu/event=zz/")
        .unwrap_err()
        .to_string()
        .contains("not a number"));
    // An alias with a term outside `config` is refused, not mis-encoded.
    assert!(here.parse("mem-loads").is_err());
}

#[test]
fn arm_events_by_their_architected_numbers_where_sysfs_lists_few() {
    let here = neoverse();
    assert!(here.arm());
    assert_eq!(resolved(&here, "inst_retired"), (8, 0x08), "from sysfs");
    assert_eq!(resolved(&here, "l1d_cache_refill"), (8, 0x03), "from the table");
    assert_eq!(resolved(&here, "br_mis_pred_retired"), (8, 0x22));
    assert_eq!(
        resolved(&here, "STALL_BACKEND"),
        (8, 0x24),
        "Arm's manuals spell them upper case"
    );
    assert_eq!(resolved(&here, "armv8_pmuv3/event=0x8/"), (8, 0x08));
    assert_eq!(resolved(&here, "armv8_pmuv3/l1d_cache_refill/"), (8, 0x03));
    // Not on x86.
    assert!(matches!(
        intel().parse("l1d_cache_refill"),
        Err(EventError::Unknown { .. })
    ));
}

#[test]
fn modifiers() {
    let here = neoverse();
    let user = here.parse("cycles:u").unwrap();
    assert!(user.exclude_kernel && !user.exclude_user && user.name == "cycles");
    let kernel = here.parse("armv8_pmuv3/event=0x8/:k").unwrap();
    assert!(kernel.exclude_user && kernel.name == "armv8_pmuv3/event=0x8/");
    assert_eq!(here.parse("inst_retired:pp").unwrap().precise, 2);
    assert_eq!(here.parse("cycles:upp").unwrap().spelled(), "cycles:upp");
    for bad in ["cycles:uk", "cycles:x", "cycles:pppp"] {
        let error = here.parse(bad).unwrap_err();
        println!("{bad}: {error}");
        assert!(matches!(error, EventError::Invalid { .. }), "{bad}");
    }
}

/// `:p` where it can be honoured only: a PMU's caps/max_precise says how far (x86's PEBS);
/// Arm's PMUv3 has none; a software event is exact already.
#[test]
fn precise_sampling_only_where_the_pmu_offers_it() {
    let arm = neoverse();
    for text in [
        "inst_retired:p",
        "cycles:p",
        "armv8_pmuv3/event=0x8/:p",
        "page-faults:p",
    ] {
        let why = arm.imprecise(&arm.parse(text).unwrap());
        println!("{text}: {why:?}");
        assert!(why.is_some(), "{text}");
    }
    assert_eq!(arm.imprecise(&arm.parse("inst_retired").unwrap()), None);
    let root = sysfs("x86-pebs", &[("cpu", 4, &[("event", "config:0-7")], &[])]);
    std::fs::create_dir_all(root.join("cpu/caps")).unwrap();
    std::fs::write(root.join("cpu/caps/max_precise"), "2\n").unwrap();
    let x86 = Catalog::at(&root);
    for (text, honoured) in [("cycles:pp", true), ("r00c0:p", true), ("cycles:ppp", false)] {
        let why = x86.imprecise(&x86.parse(text).unwrap());
        println!("{text}: {why:?}");
        assert_eq!(why.is_none(), honoured, "{text}: {why:?}");
    }
    let why = x86.imprecise(&x86.parse("cycles:ppp").unwrap()).unwrap();
    assert!(why.contains("up to :pp"), "{why}");
}

#[test]
fn an_unknown_event_names_the_closest_known_ones() {
    let here = neoverse();
    for (given, expected) in [
        ("l1d_cache_refil", "l1d_cache_refill"),
        ("cache-miss", "cache-misses"),
        ("br_mispred_retired", "br_mis_pred_retired"),
        ("pagefaults", "page-faults"),
    ] {
        let error = here.parse(given).unwrap_err().to_string();
        println!("{error}");
        assert!(
            error.contains(&format!("did you mean {expected}")) || error.contains(expected),
            "{error}"
        );
    }
    let nothing = here.parse("xyzzy-plugh").unwrap_err().to_string();
    assert!(nothing.contains("bpfprof list"), "{nothing}");
    let pmu = here.parse("armv8_pmu/event=0x8/").unwrap_err().to_string();
    assert!(pmu.contains("armv8_pmuv3"), "{pmu}");
}

#[test]
fn this_machine_parses_its_own_events() {
    let here = Catalog::here();
    for name in ["cpu-clock", "task-clock", "page-faults", "cycles"] {
        here.parse(name).unwrap();
    }
    let names = here.known_names();
    assert!(names.contains(&"context-switches".to_string()));
    println!(
        "{} names known here; core PMU {:?}",
        names.len(),
        here.core().map(|p| &p.name)
    );
}

#[test]
fn event_lists_with_groups_and_commas_inside_a_pmus_terms() {
    let here = intel();
    let groups = here
        .parse_list("cycles,instructions,{cpu/event=0xc4,umask=0x00/,branch-misses},page-faults")
        .unwrap();
    let shape: Vec<(bool, Vec<String>)> = groups
        .iter()
        .map(|g| (g.together, g.events.iter().map(|e| e.name.clone()).collect()))
        .collect();
    assert_eq!(
        shape,
        [
            (false, vec!["cycles".to_string(), "instructions".to_string()]),
            (
                true,
                vec![
                    "cpu/event=0xc4,umask=0x00/".to_string(),
                    "branch-misses".to_string()
                ]
            ),
            (false, vec!["page-faults".to_string()]),
        ]
    );
    assert_eq!(groups[1].events[0].config, 0xc4);
    for bad in ["{cycles", "cycles}", "{}", "{{cycles}}", "cycles,nosuch"] {
        assert!(here.parse_list(bad).is_err(), "{bad}");
    }
}

/// A probe's file path has slashes that are not a PMU's: the comma after it still ends it,
/// whether the path has an odd or an even number of them.
#[test]
fn a_probes_path_is_not_a_pmus_terms() {
    let here = intel();
    let exe = std::env::current_exe().unwrap();
    for path in [exe.display().to_string(), format!("/.{}", exe.display())] {
        let probe = format!("uprobe:{path}:main");
        match here.parse_list(&format!("{probe},cycles")) {
            // This catalog has no uprobe PMU: the probe alone is refused.
            Err(EventError::Invalid { given, reason }) => assert_eq!(given, probe, "{reason}"),
            other => panic!("{other:?}"),
        }
    }
}

/// Tracepoints through the language: `SUBSYSTEM:NAME` is a tracepoint event by its tracefs id,
/// a misspelt one names its subsystem's nearest; `cycles:u` stays an event with a modifier.
#[test]
fn tracepoints_are_events_by_their_tracefs_id() {
    let root = sysfs("tracefs", &[]);
    let dir = root.join("events/sched/sched_switch");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("id"), "316\n").unwrap();
    let catalog = neoverse().with_tracefs(&root);
    let switch = catalog.parse("sched:sched_switch").unwrap();
    assert_eq!(
        (switch.kind, switch.config, switch.spelled()),
        (2, 316, "sched:sched_switch".into())
    );
    assert!(switch.is_tracepoint() && !switch.hardware);
    let error = catalog.parse("sched:sched_swich").unwrap_err();
    assert!(
        error.to_string().contains("did you mean sched:sched_switch?"),
        "{error}"
    );
    assert!(!catalog.parse("cycles:u").unwrap().is_tracepoint());
}
