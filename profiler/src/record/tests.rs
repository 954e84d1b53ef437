use profiler_common::records::{
    fetch, Fetch, HitRecord, MAX_FETCHES, RECORD_DATA_BYTES, RECORD_STRING_BYTES, STRING_BYTES,
};
use serde_json::Value;

use super::{hit::*, render, Line, Totals};
use crate::{
    counters::{
        fetch::{Fetched, Type},
        language::{Catalog, Event},
        tracepoint::PERF_TYPE_TRACEPOINT,
    },
    sources::records::Spec,
};

fn record(event: u16) -> HitRecord {
    let mut comm = [0u8; 16];
    comm[..4].copy_from_slice(b"prog");
    HitRecord {
        time_ns: 5_123_456_789_012,
        tgid: 42,
        tid: 43,
        cpu: 1,
        event,
        failed: 0,
        cut: 0,
        comm,
        values: [0; MAX_FETCHES],
        strings: [0; RECORD_STRING_BYTES],
        data: [0; RECORD_DATA_BYTES],
    }
}

/// A tracefs whose one tracepoint has a number, a signed number, an in-place string, an array
/// and a `__data_loc` string.
fn tracefs() -> std::path::PathBuf {
    let root = std::env::temp_dir().join(format!("bpfprof-record-{}", std::process::id()));
    let dir = root.join("events/test/hit");
    std::fs::create_dir_all(&dir).unwrap();
    let format = "name: hit\nformat:\n\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\
        \tfield:unsigned long count;\toffset:8;\tsize:8;\tsigned:0;\n\
        \tfield:int ret;\toffset:16;\tsize:4;\tsigned:1;\n\
        \tfield:char comm[16];\toffset:20;\tsize:16;\tsigned:0;\n\
        \tfield:unsigned long args[2];\toffset:40;\tsize:16;\tsigned:0;\n\
        \tfield:__data_loc char[] filename;\toffset:56;\tsize:4;\tsigned:0;\n\
        \tfield:unsigned int odd[2];\toffset:60;\tsize:0;\tsigned:0;\n";
    std::fs::write(dir.join("format"), format).unwrap();
    root
}

fn spec(events: Vec<Event>, fetches: Vec<Vec<Fetched>>) -> Spec {
    Spec {
        events,
        period: 1,
        fetches,
        stacks: false,
        filters: Vec::new(),
    }
}

/// Each field read where its format says, as its type reads: numbers, a negative number, text in
/// place and where a `__data_loc` word points, an array; the common fields left out.
#[test]
fn a_tracepoints_record_reads_as_its_fields() {
    let event = Event {
        name: "test:hit".into(),
        kind: PERF_TYPE_TRACEPOINT,
        ..Catalog::here().parse("page-faults").unwrap()
    };
    let decoders = Decoders::new(&spec(vec![event], vec![Vec::new()]), &tracefs());
    let mut r = record(0);
    r.data[8..16].copy_from_slice(&4096u64.to_ne_bytes());
    r.data[16..20].copy_from_slice(&(-2i32).to_ne_bytes());
    r.data[20..25].copy_from_slice(b"bash\0");
    r.data[40..48].copy_from_slice(&7u64.to_ne_bytes());
    r.data[48..56].copy_from_slice(&9u64.to_ne_bytes());
    r.data[56..60].copy_from_slice(&(64u32 | 11 << 16).to_ne_bytes());
    r.data[64..75].copy_from_slice(b"/etc/hosts\0");
    let hit = decoders.hit(&r);
    let fields: Vec<(&str, Value)> = hit
        .fields
        .0
        .iter()
        .map(|(k, v)| (k.as_str(), v.clone()))
        .collect();
    assert_eq!(
        fields,
        [
            ("count", Value::from(4096)),
            ("ret", Value::from(-2)),
            ("comm", Value::from("bash")),
            ("args", Value::from(vec![7, 9])),
            ("filename", Value::from("/etc/hosts")),
            // A crafted format: an array of no bytes reads as nothing, without a panic.
            ("odd", Value::from(0)),
        ]
    );
    assert_eq!(
        (hit.pid, hit.tid, hit.cpu, hit.comm.as_str()),
        (42, 43, 1, "prog")
    );
    // A record whose bytes could not be copied: every field unknown.
    r.failed = u8::MAX;
    assert!(decoders.hit(&r).fields.0.iter().all(|(_, v)| v.is_null()));
}

/// A probe's fetches by their types; one that faulted is unknown (null, `?` in text), and the
/// line reads as perf script's.
#[test]
fn a_probes_record_reads_as_its_fetches_and_prints_as_a_line() {
    let event = Catalog::here().parse("page-faults").unwrap();
    let fetched = |name: &str, ty| Fetched {
        name: name.into(),
        fetches: vec![Fetch {
            kind: fetch::WORD,
            ..Fetch::default()
        }],
        ty,
    };
    let fetches = vec![
        fetched("arg1", Type::Signed(4)),
        fetched("arg2", Type::Str),
        fetched("arg3", Type::Hex(8)),
    ];
    let decoders = Decoders::new(&spec(vec![event], vec![fetches]), &tracefs());
    let mut r = record(0);
    r.values[0] = 0xffff_fff9;
    r.strings[STRING_BYTES..STRING_BYTES + 5].copy_from_slice(b"step\0");
    r.failed = 1 << 2;
    let hit = decoders.hit(&r);
    let mut line = Vec::new();
    render::hit_line(&hit, &mut line).unwrap();
    assert_eq!(
        String::from_utf8(line).unwrap(),
        "            prog      42/43      [001]   5123.456789: page-faults: arg1=-7 arg2=\"step\" arg3=?\n"
    );
    assert!(hit.cut.is_empty());
    // A string longer than its slot: its start, named as cut.
    r.cut = 1 << 1;
    assert_eq!(decoders.hit(&r).cut, ["arg2"]);
}

/// A hit written as a JSON line reads back the same, its fields in their order (not sorted); the
/// totals line reads as totals.
#[test]
fn saved_lines_read_back_as_written() {
    let hit = Hit {
        time_ns: 1,
        pid: 2,
        tid: 3,
        cpu: 0,
        comm: "x".into(),
        event: "e".into(),
        fields: Fields(vec![
            ("zeta".into(), Value::from(1)),
            ("alpha".into(), Value::from("a")),
        ]),
        stack: Some(vec![
            frame("0xffffffff8225a85e", "do_syscall_64", "[kernel.kallsyms]", true),
            frame("0x55c4af8e06a0", "step", "/tmp/prog", false),
        ]),
        cut: vec!["alpha".into()],
    };
    let text = serde_json::to_string(&hit).unwrap();
    assert!(text.find("zeta") < text.find("alpha"), "{text}");
    // As perf script: each frame a line under the hit, innermost first, then a blank line.
    let mut printed = Vec::new();
    super::render::hit_line(&hit, &mut printed).unwrap();
    assert!(
        String::from_utf8(printed).unwrap().ends_with(
            ": e: zeta=1 alpha=\"a\"...\n\tffffffff8225a85e do_syscall_64 ([kernel.kallsyms])\n\t    55c4af8e06a0 step (/tmp/prog)\n\n"
        )
    );
    match serde_json::from_str::<Line>(&text).unwrap() {
        Line::Hit(back) => assert_eq!(back, hit),
        Line::Totals { .. } => panic!("a hit read as totals"),
    }
    let totals = Totals {
        records: 5,
        lost: 1,
        ..Totals::default()
    };
    let text = serde_json::to_string(&Line::Totals {
        totals: totals.clone(),
    })
    .unwrap();
    match serde_json::from_str::<Line>(&text).unwrap() {
        Line::Totals { totals: back } => assert_eq!(back, totals),
        Line::Hit(_) => panic!("totals read as a hit"),
    }
    assert!(serde_json::from_str::<Line>("{\"time_ns\": \"x\"}").is_err());
}

fn frame(address: &str, function: &str, module: &str, kernel: bool) -> super::stacks::StackFrame {
    super::stacks::StackFrame {
        address: address.into(),
        function: function.into(),
        module: module.into(),
        file: None,
        line: None,
        kernel,
        inlined: false,
    }
}
