//! The plan's checks that need no privileges.
use super::*;
use profiler_common::latency::LatencyKeys;

/// A tracefs with two tracepoints whose key fields sit at different offsets, one of them with
/// a field of another size.
fn tracefs() -> PathBuf {
    let root = std::env::temp_dir().join(format!("bpfprof-latency-keys-{}", std::process::id()));
    let format = |fields: &str| {
        format!(
            "name: x\nformat:\n\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n{fields}"
        )
    };
    for (name, fields) in [
        ("issue", "\tfield:dev_t dev;\toffset:8;\tsize:4;\tsigned:0;\n\tfield:sector_t sector;\toffset:16;\tsize:8;\tsigned:0;\n\tfield:char comm[16];\toffset:24;\tsize:16;\tsigned:0;\n"),
        ("complete", "\tfield:sector_t sector;\toffset:8;\tsize:8;\tsigned:0;\n\tfield:dev_t dev;\toffset:16;\tsize:4;\tsigned:0;\n"),
        ("other", "\tfield:int dev;\toffset:8;\tsize:4;\tsigned:1;\n"),
    ] {
        let dir = root.join("events/test").join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("format"), format(fields)).unwrap();
    }
    root
}

fn tracepoint(name: &str) -> Event {
    Event {
        name: format!("test:{name}"),
        kind: crate::counters::tracepoint::PERF_TYPE_TRACEPOINT,
        ..Catalog::here().parse("page-faults").unwrap()
    }
}

#[test]
fn latency_keys_read_each_sides_fields_where_its_format_says() {
    let root = tracefs();
    let (issue, complete) = (tracepoint("issue"), tracepoint("complete"));
    let (keys, key) = latency_keys(&root, [&issue, &complete], "dev,sector").unwrap();
    assert_eq!(key, "dev,sector");
    assert_eq!(
        (keys.sides[0].fields, keys.sides[0].offsets, keys.sides[0].sizes),
        (2, [8, 16], [4, 8])
    );
    assert_eq!(
        (keys.sides[1].fields, keys.sides[1].offsets, keys.sides[1].sizes),
        (2, [16, 8], [4, 8])
    );
    assert_eq!(
        latency_keys(&root, [&issue, &complete], "thread").unwrap().0,
        LatencyKeys::default()
    );
    // FROM=TO: a number each side names differently, checked alike.
    let (crossed, key) = latency_keys(&root, [&issue, &complete], "dev=dev,sector=sector").unwrap();
    assert_eq!((crossed, key.as_str()), (keys, "dev=dev,sector=sector"));
    let why = match latency_keys(&root, [&issue, &complete], "sector=dev") {
        Err(UserError::Usage(why)) => why,
        other => panic!("{other:?}"),
    };
    assert!(
        why.contains("8-byte number on test:issue and an unsigned 4-byte"),
        "{why}"
    );
    let refused = |sides: [&Event; 2], key: &str| match latency_keys(&root, sides, key) {
        Err(UserError::Usage(why)) => why,
        other => panic!("{key}: {other:?}"),
    };
    assert!(refused([&issue, &complete], "dev,sector,comm").contains("one or two fields"));
    assert!(refused([&issue, &complete], "comm").contains("not a number"));
    assert!(refused([&issue, &complete], "sectr").contains("did you mean sector?"));
    let why = refused([&issue, &tracepoint("other")], "dev");
    assert!(
        why.contains("an unsigned 4-byte number on test:issue and a signed 4-byte number"),
        "{why}"
    );
}
