//! pprof's encoding, read back.
use std::io::Read;

use flate2::read::GzDecoder;
use prost::Message;

use super::proto;
use crate::{cli::Format, report::tests::*};

#[test]
fn pprof_decodes_and_keeps_counts_and_leaves() {
    let bytes = render(Format::Pprof, &sample_report());
    let mut raw = Vec::new();
    GzDecoder::new(&bytes[..]).read_to_end(&mut raw).unwrap();
    let p = proto::Profile::decode(&raw[..]).unwrap();
    assert_eq!(p.string_table[0], "");
    assert_eq!(p.sample.len(), 3);
    let total: i64 = p.sample.iter().map(|s| s.value[0]).sum();
    assert_eq!(total, 100);
    let name_of_location = |id: u64| {
        let loc = p.location.iter().find(|l| l.id == id).unwrap();
        let f = p
            .function
            .iter()
            .find(|f| f.id == loc.line[0].function_id)
            .unwrap();
        p.string_table[f.name as usize].clone()
    };
    let hottest = p.sample.iter().max_by_key(|s| s.value[0]).unwrap();
    assert_eq!(
        name_of_location(hottest.location_id[0]),
        "hot_a",
        "leaf comes first"
    );
    assert_eq!(name_of_location(*hottest.location_id.last().unwrap()), "main");
    assert_eq!(hottest.value[1], 60 * (1_000_000_000 / 99));
}

/// The counters read at each sample (`--counter`, the agent's counters signal) are sample types
/// of their own, each stack carrying what its samples counted.
#[test]
fn counters_read_at_each_sample_are_sample_types_with_each_stacks_counts() {
    let mut report = sample_report();
    report.meta.counters = vec!["cycles".into(), "instructions".into()];
    for (k, stack) in report.stacks.iter_mut().enumerate() {
        stack.counters = vec![1000 * (k as u64 + 1), 500 * (k as u64 + 1)];
    }
    report.stacks[2].counters.clear();
    let p = decoded(&report);
    let types: Vec<(&str, &str)> = (p.sample_type.iter())
        .map(|t| {
            (
                &p.string_table[t.r#type as usize][..],
                &p.string_table[t.unit as usize][..],
            )
        })
        .collect();
    assert_eq!(
        types,
        [
            ("samples", "count"),
            ("cpu", "nanoseconds"),
            ("cycles", "count"),
            ("instructions", "count")
        ]
    );
    let values: Vec<&[i64]> = p.sample.iter().map(|s| &s.value[2..]).collect();
    assert_eq!(
        values,
        [&[1000, 500][..], &[2000, 1000], &[0, 0]],
        "a stack without counts reads 0"
    );
    assert!(p.sample.iter().all(|s| s.value.len() == 4));
}

fn decoded(report: &crate::model::StackReport) -> proto::Profile {
    let mut raw = Vec::new();
    GzDecoder::new(&render(Format::Pprof, report)[..])
        .read_to_end(&mut raw)
        .unwrap();
    proto::Profile::decode(&raw[..]).unwrap()
}

/// xz's hottest stack ends in libz; the dynamic loader and the kernel have samples too: the
/// first mapping (what `go tool pprof` prints as `File:`) is xz itself, and every location
/// still names the file its frame is in.
#[test]
fn the_main_executable_is_the_first_mapping() {
    use crate::symbolize::Frame;
    let mut report = sample_report();
    let in_module = |name: &str, module: &str| Frame::named(name.into(), module);
    let libz = "/usr/lib/x86_64-linux-gnu/libz.so.1.2.13";
    let loader = "/usr/lib64/ld-linux-x86-64.so.2";
    let stacks = [
        (
            vec![in_module("main", "/usr/bin/xz"), in_module("deflate", libz)],
            50,
        ),
        (
            vec![in_module("_dl_start", loader), in_module("_dl_relocate", loader)],
            30,
        ),
        (
            vec![
                in_module("main", "/usr/bin/xz"),
                in_module("encode", "/usr/bin/xz"),
            ],
            15,
        ),
        (vec![in_module("ksys_read", "[kernel.kallsyms]")], 5),
    ];
    report.stacks = stacks
        .into_iter()
        .map(|(frames, count)| crate::model::Stack {
            count,
            frames,
            ..report.stacks[0].clone()
        })
        .collect();
    let p = decoded(&report);
    let file = |m: &proto::Mapping| p.string_table[m.filename as usize].as_str();
    assert_eq!((p.mapping[0].id, file(&p.mapping[0])), (1, "/usr/bin/xz"));
    let ids: Vec<u64> = p.mapping.iter().map(|m| m.id).collect();
    assert_eq!(ids, (1..=p.mapping.len() as u64).collect::<Vec<_>>());
    for location in &p.location {
        let mapping = p.mapping.iter().find(|m| m.id == location.mapping_id).unwrap();
        let function = p
            .function
            .iter()
            .find(|f| f.id == location.line[0].function_id)
            .unwrap();
        let module = match p.string_table[function.name as usize].as_str() {
            "deflate" => libz,
            "_dl_start" | "_dl_relocate" => loader,
            "ksys_read" => "[kernel.kallsyms]",
            _ => "/usr/bin/xz",
        };
        assert_eq!(file(mapping), module);
    }
}

#[test]
fn the_header_comment_reads_back_as_written() {
    let mut meta = sample_report().meta;
    meta.target = "command ./a | b".into();
    let sampled = super::header_comment(&meta, crate::model::Weight::Samples);
    assert_eq!(
        sampled,
        "bpfprof hotspot: command ./a | b | cpu-clock at 99 Hz | 2 CPUs"
    );
    let header = super::read_header_comment(&sampled).unwrap();
    assert_eq!(
        (
            header.mode.as_str(),
            header.target.as_str(),
            header.event.as_str()
        ),
        ("hotspot", "command ./a | b", "cpu-clock")
    );
    assert_eq!((header.frequency_hz, header.cpus), (99, 2));
    meta.mode = "sched";
    let timed = super::header_comment(&meta, crate::model::Weight::OffCpuNanoseconds);
    let header = super::read_header_comment(&timed).unwrap();
    assert_eq!(
        (header.target.as_str(), header.event.as_str()),
        ("command ./a | b", "")
    );
    assert_eq!((header.mode.as_str(), header.cpus), ("sched", 2));
    // Sampled every N events.
    meta.mode = "hotspot";
    meta.event = "l1d_cache_refill:u".into();
    meta.period = Some(10_000);
    let counted = super::header_comment(&meta, crate::model::Weight::Samples);
    assert!(
        counted.contains("| l1d_cache_refill:u every 10000 events |"),
        "{counted}"
    );
    let header = super::read_header_comment(&counted).unwrap();
    assert_eq!(
        (header.event.as_str(), header.period, header.frequency_hz),
        ("l1d_cache_refill:u", Some(10_000), 0)
    );
    meta.period = Some(1);
    let each = super::header_comment(&meta, crate::model::Weight::Samples);
    assert!(each.contains("| l1d_cache_refill:u every event |"), "{each}");
    assert_eq!(super::read_header_comment(&each).unwrap().period, Some(1));
    assert_eq!(super::read_header_comment("3 samples lost"), None);
    assert_eq!(super::read_header_comment("bpfprof lock (futex): pid 3"), None);
}
