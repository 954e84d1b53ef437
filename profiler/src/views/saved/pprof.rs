//! pprof profiles read back as stacks: ours, with the header their first comment carries, and any
//! other tool's, saying what the profile itself tells (what its values are, its period, its
//! duration) rather than a frequency and CPU count it never had.
use std::collections::HashMap;

use prost::Message as _;

use super::{meta, stack_report};
use crate::{
    model::{RunMeta, Stack, StackReport, Weight},
    profile::Health,
    report::pprof::{proto, read_header_comment},
    symbolize::{Frame, NameKind, ObjectRef, UNKNOWN},
};

pub(super) fn from_pprof(raw: &[u8], name: &str) -> Result<StackReport, String> {
    let p = proto::Profile::decode(raw).map_err(|e| format!("not a pprof profile: {e}"))?;
    let string = |i: i64| p.string_table.get(i as usize).map_or("", String::as_str);
    let types: Vec<&str> = p.sample_type.iter().map(|t| string(t.r#type)).collect();
    let (value, weight) = value_of(&types);
    let meta = header(&p, name, weight);
    let functions: HashMap<u64, &proto::Function> = p.function.iter().map(|f| (f.id, f)).collect();
    let mappings: HashMap<u64, &proto::Mapping> = p.mapping.iter().map(|m| (m.id, m)).collect();
    let locations: HashMap<u64, &proto::Location> = p.location.iter().map(|l| (l.id, l)).collect();
    let mut stacks = Vec::with_capacity(p.sample.len());
    // Each location is copied into every stack that names it (see `MAX_FRAMES`).
    let mut left = super::MAX_FRAMES;
    for sample in &p.sample {
        let mut frames = Vec::new();
        // pprof lists the leaf first, and within a location the innermost inlined function first.
        for id in sample.location_id.iter().rev() {
            let location = locations
                .get(id)
                .ok_or("a sample names a location that is not there")?;
            let mapping = mappings.get(&location.mapping_id);
            let module = mapping.map_or("", |m| string(m.filename));
            let kernel = module.starts_with("[kernel") || module == "[vmlinux]";
            let object = mapping.and_then(|m| object_of(m, location.address, string(m.build_id)));
            if location.line.is_empty() {
                // Not symbolized by the tool that wrote it: kept, as the address it is.
                frames.push(Frame {
                    object: object.clone(),
                    ..Frame::unknown(module, location.address, kernel)
                });
            }
            left = left
                .checked_sub(location.line.len().max(1))
                .ok_or_else(super::too_many_frames)?;
            for (k, line) in location.line.iter().rev().enumerate() {
                let function = functions.get(&line.function_id);
                let name = function.map_or(UNKNOWN, |f| string(f.name));
                let system_name = function.map_or("", |f| string(f.system_name));
                let (kind, start) = kind_of(module, name, system_name);
                frames.push(Frame {
                    function: name.to_string(),
                    module: module.to_string(),
                    file: function
                        .map(|f| string(f.filename))
                        .filter(|f| !f.is_empty())
                        .map(str::to_string),
                    line: (line.line > 0).then_some(line.line as u32),
                    kernel,
                    inlined: k > 0,
                    address: location.address,
                    start,
                    offset: start.map(|s| location.address.wrapping_sub(s)),
                    kind,
                    object: object.clone(),
                });
            }
        }
        let label = |key: &str| sample.label.iter().find(|l| string(l.key) == key);
        stacks.push(Stack {
            pid: label("pid").map_or(0, |l| l.num as u32),
            tid: label("tid").map_or(0, |l| l.num as u32),
            comm: label("comm").map_or("", |l| string(l.str)).to_string(),
            count: sample.value.get(value).copied().unwrap_or(0).max(0) as u64,
            counters: Vec::new(),
            frames,
        });
    }
    Ok(stack_report(weight, meta, Health::default(), stacks))
}

/// Where a location is in its file, for a mapping whose addresses are the file's own (pprof's
/// `start 0, limit ^0, offset 0`: what bpfprof writes for frames that know their place).
fn object_of(mapping: &proto::Mapping, address: u64, build_id: &str) -> Option<ObjectRef> {
    let file_addresses =
        mapping.memory_start == 0 && mapping.file_offset == 0 && mapping.memory_limit == u64::MAX;
    file_addresses.then(|| ObjectRef {
        build_id: Some(build_id.to_string()).filter(|id| !id.is_empty()),
        file_offset: None,
        vaddr: Some(address),
    })
}

/// How a frame was named, as bpfprof's `system_name` says (`NameKind::system_name`; a symbol
/// for another tool's), and for a frame placed by its file's unwind table, where that function
/// starts (its name, `module+0x<start>`).
fn kind_of(module: &str, name: &str, system_name: &str) -> (NameKind, Option<u64>) {
    let kind = match NameKind::from_system_name(name, system_name) {
        NameKind::Symbol if name == UNKNOWN => NameKind::None,
        kind => kind,
    };
    let start = (kind == NameKind::Fde)
        .then(|| Frame::placed_at(module, name))
        .flatten();
    (kind, start)
}

/// Which of each sample's values is read, and what it weighs: the nanoseconds of a time profile
/// (our off-CPU and lock-wait profiles; Go's mutex and block profiles, whose first value is a
/// count of contentions and whose `delay` is the time), else the first value.
fn value_of(types: &[&str]) -> (usize, Weight) {
    let timed = |kind: &str| match kind {
        "off-cpu" => Some(Weight::OffCpuNanoseconds),
        "lock-wait" | "delay" => Some(Weight::LockWaitNanoseconds),
        _ => None,
    };
    types
        .iter()
        .enumerate()
        .find_map(|(i, kind)| Some((i, timed(kind)?)))
        .unwrap_or((0, Weight::Samples))
}

/// The report's header: from our header comment, or what another tool's profile says of itself
/// (as a note; its frequency and CPUs are not known and are not made up). The other comments
/// (our warnings and notes, or the other tool's) are notes.
fn header(p: &proto::Profile, name: &str, weight: Weight) -> RunMeta {
    let string = |i: i64| p.string_table.get(i as usize).map_or("", String::as_str);
    let comments: Vec<&str> = p.comment.iter().map(|&c| string(c)).collect();
    let ours = comments.first().and_then(|c| read_header_comment(c));
    let mode = match weight {
        Weight::Samples => "hotspot",
        Weight::OffCpuNanoseconds => "sched",
        Weight::LockWaitNanoseconds => "lock",
    };
    let mut meta = match &ours {
        Some(header) => {
            let mut meta = meta(&header.mode, &header.event, header.target.clone());
            meta.frequency_hz = header.frequency_hz;
            meta.period = header.period;
            meta.cpus = header.cpus;
            if meta.mode == "other" {
                meta.mode = mode;
            }
            meta
        }
        None => {
            let mut meta = meta(mode, "", name.to_string());
            meta.notes.push(foreign_note(p));
            meta
        }
    };
    if meta.event == "other" {
        meta.event = match weight {
            Weight::Samples => "other",
            Weight::OffCpuNanoseconds => "off-cpu",
            Weight::LockWaitNanoseconds => "lock-wait",
        }
        .to_string();
    }
    meta.duration_s = p.duration_nanos.max(0) as f64 / 1e9;
    let skip = usize::from(ours.is_some());
    meta.notes
        .extend(comments[skip.min(comments.len())..].iter().map(|c| c.to_string()));
    meta
}

/// What a profile bpfprof did not write says of itself: what its values are and how often it
/// sampled.
fn foreign_note(p: &proto::Profile) -> String {
    let string = |i: i64| p.string_table.get(i as usize).map_or("", String::as_str);
    let values: Vec<String> = p
        .sample_type
        .iter()
        .map(|t| format!("{} ({})", string(t.r#type), string(t.unit)))
        .collect();
    let mut note = format!(
        "not written by bpfprof: its values are {}",
        if values.is_empty() {
            "unnamed".to_string()
        } else {
            values.join(", ")
        }
    );
    if let Some(period) = p.period_type.as_ref().filter(|_| p.period > 0) {
        note.push_str(&format!(
            "; one sample per {} {} of {}",
            p.period,
            string(period.unit),
            string(period.r#type)
        ));
    }
    note
}

#[cfg(test)]
mod tests {
    use super::super::parse;
    use super::*;
    use crate::{
        cli::Format,
        report::{renderer, tests::sample_report},
    };

    fn gzipped(profile: &proto::Profile) -> Vec<u8> {
        let mut gz = Vec::new();
        crate::report::pprof::write_gz(profile, &mut gz).unwrap();
        gz
    }

    #[test]
    fn unsymbolized_pprof_locations_stay_as_unknown_frames() {
        let profile = proto::Profile {
            sample_type: vec![proto::ValueType { r#type: 1, unit: 2 }],
            string_table: vec!["".into(), "samples".into(), "count".into(), "/bin/x".into()],
            mapping: vec![proto::Mapping {
                id: 1,
                filename: 3,
                ..Default::default()
            }],
            location: vec![proto::Location {
                id: 1,
                mapping_id: 1,
                address: 0x1234,
                line: vec![],
            }],
            sample: vec![proto::Sample {
                location_id: vec![1],
                value: vec![7],
                label: vec![],
            }],
            ..Default::default()
        };
        let loaded = parse(&gzipped(&profile), "p.pb.gz").unwrap();
        let frame = &loaded.stacks[0].frames[0];
        assert_eq!(
            (frame.function.as_str(), frame.address, loaded.samples),
            ("[unknown]", 0x1234, 7)
        );
        assert_eq!(frame.module, "/bin/x");
    }

    /// The header of a report read back from the pprof bpfprof wrote for it is the run's: its
    /// text report starts with the same line.
    #[test]
    fn our_pprof_reads_back_with_the_runs_header() {
        let mut original = sample_report();
        original.meta.target = "pid 42".into();
        original.meta.duration_s = 2.5;
        original.meta.notes = vec!["the target exited".into()];
        let mut bytes = Vec::new();
        renderer(Format::Pprof).hotspot(&original, &mut bytes).unwrap();
        let loaded = parse(&bytes, "own.pb.gz").unwrap();
        let m = &loaded.meta;
        assert_eq!(
            (m.mode, m.event.as_str(), m.target.as_str()),
            ("hotspot", "cpu-clock", "pid 42")
        );
        assert_eq!((m.frequency_hz, m.cpus, m.duration_s), (99, 2, 2.5));
        assert_eq!(m.notes, ["the target exited"]);
        let first_line = |report: &StackReport| {
            let mut text = Vec::new();
            renderer(Format::Text).hotspot(report, &mut text).unwrap();
            String::from_utf8(text)
                .unwrap()
                .lines()
                .next()
                .unwrap()
                .to_string()
        };
        assert_eq!(first_line(&loaded), first_line(&original));
        assert_eq!(
            first_line(&loaded),
            "bpfprof hotspot: pid 42 | cpu-clock at 99 Hz | 2.5 s | 2 CPUs"
        );
    }

    /// Go's CPU profile (as `runtime/pprof` writes it): what it is, its period and its duration;
    /// no frequency or CPU count made up.
    #[test]
    fn another_tools_pprof_says_what_it_knows() {
        let profile = proto::Profile {
            sample_type: vec![
                proto::ValueType { r#type: 1, unit: 2 },
                proto::ValueType { r#type: 3, unit: 4 },
            ],
            period_type: Some(proto::ValueType { r#type: 3, unit: 4 }),
            period: 10_000_000,
            duration_nanos: 30_000_000_000,
            string_table: ["", "samples", "count", "cpu", "nanoseconds", "main.work", "/app"]
                .map(String::from)
                .to_vec(),
            mapping: vec![proto::Mapping {
                id: 1,
                filename: 6,
                ..Default::default()
            }],
            function: vec![proto::Function {
                id: 1,
                name: 5,
                ..Default::default()
            }],
            location: vec![proto::Location {
                id: 1,
                mapping_id: 1,
                address: 0x10,
                line: vec![proto::Line {
                    function_id: 1,
                    line: 3,
                }],
            }],
            sample: vec![proto::Sample {
                location_id: vec![1],
                value: vec![12, 120_000_000],
                label: vec![],
            }],
            ..Default::default()
        };
        let loaded = parse(&gzipped(&profile), "go.pb.gz").unwrap();
        assert_eq!(loaded.samples, 12);
        let mut text = Vec::new();
        renderer(Format::Text).hotspot(&loaded, &mut text).unwrap();
        let text = String::from_utf8(text).unwrap();
        let mut lines = text.lines();
        assert_eq!(lines.next(), Some("bpfprof hotspot: go.pb.gz | 30.0 s"));
        assert!(
            text.contains(
                "note: not written by bpfprof: its values are samples (count), cpu (nanoseconds); \
                 one sample per 10000000 nanoseconds of cpu"
            ),
            "{text}"
        );
        assert!(!text.contains("0 Hz") && !text.contains("0 CPUs"), "{text}");
    }

    /// Go's mutex profile: `contentions` first, `delay` (the time) second.
    #[test]
    fn a_mutex_profile_is_weighed_by_its_delay() {
        let profile = proto::Profile {
            sample_type: vec![
                proto::ValueType { r#type: 1, unit: 2 },
                proto::ValueType { r#type: 3, unit: 4 },
            ],
            string_table: [
                "",
                "contentions",
                "count",
                "delay",
                "nanoseconds",
                "sync.(*Mutex).Lock",
            ]
            .map(String::from)
            .to_vec(),
            function: vec![proto::Function {
                id: 1,
                name: 5,
                ..Default::default()
            }],
            location: vec![proto::Location {
                id: 1,
                mapping_id: 0,
                address: 0x10,
                line: vec![proto::Line {
                    function_id: 1,
                    line: 0,
                }],
            }],
            sample: vec![proto::Sample {
                location_id: vec![1],
                value: vec![3, 4_500_000],
                label: vec![],
            }],
            ..Default::default()
        };
        let loaded = parse(&gzipped(&profile), "mutex.pb.gz").unwrap();
        assert_eq!(loaded.weight, Weight::LockWaitNanoseconds);
        assert_eq!(loaded.samples, 4_500_000);
    }

    /// What bpfprof's pprof says of a stripped file's frames reads back: the name, the kind
    /// (from `module+0x…`), the build ID and the file address.
    #[test]
    fn placed_frames_read_back_with_their_build_id_and_file_address() {
        let mut original = sample_report();
        let stripped = crate::symbolize::stripped_frames();
        original.stacks[1].frames.extend(stripped.clone());
        let mut bytes = Vec::new();
        renderer(Format::Pprof).hotspot(&original, &mut bytes).unwrap();
        let loaded = parse(&bytes, "p.pb.gz").unwrap();
        let stack = loaded.stacks.iter().find(|s| s.count == 30).unwrap();
        let read = &stack.frames[stack.frames.len() - 3..];
        for (got, want) in read.iter().zip(&stripped) {
            println!("{got:?}");
            assert_eq!((&got.function, got.kind), (&want.function, want.kind));
            assert_eq!((got.start, got.offset), (want.start, want.offset));
            let (got, want) = (got.object.as_ref().unwrap(), want.object.as_ref().unwrap());
            assert_eq!((&got.build_id, got.vaddr), (&want.build_id, want.vaddr));
        }
    }

    /// A frame placed by its FDE at the very start of its function (the address is the name's):
    /// the kind is what the profile says, not guessed from the name.
    #[test]
    fn a_frame_placed_at_its_functions_start_reads_back_as_placed_by_its_fde() {
        let mut original = sample_report();
        let stripped = crate::symbolize::stripped_frames();
        let at_start = Frame {
            function: "liblzma.so.5.4.1+0x16900".into(),
            offset: Some(0),
            address: 0x7f00_0001_6900,
            object: stripped[1].object.clone().map(|o| ObjectRef {
                file_offset: Some(0x15900),
                vaddr: Some(0x16900),
                ..o
            }),
            ..stripped[1].clone()
        };
        original.stacks[1].frames.push(at_start.clone());
        let mut bytes = Vec::new();
        renderer(Format::Pprof).hotspot(&original, &mut bytes).unwrap();
        let loaded = parse(&bytes, "p.pb.gz").unwrap();
        let stack = loaded.stacks.iter().find(|s| s.count == 30).unwrap();
        let got = stack.frames.last().unwrap();
        println!("{got:?}");
        assert_eq!((&got.function, got.kind), (&at_start.function, NameKind::Fde));
        assert_eq!((got.start, got.offset), (Some(0x16900), Some(0)));
    }

    /// A stripped library's frames: its mapping carries the build ID and the file's own
    /// addresses, and says it has no names, so `go tool pprof -symbolize=local` names them from
    /// the unstripped binary; a mapping of named frames only keeps saying it has names.
    #[test]
    fn frames_placed_in_a_file_are_at_its_addresses_in_a_mapping_with_its_build_id() {
        let mut report = sample_report();
        report.stacks[1]
            .frames
            .extend(crate::symbolize::stripped_frames());
        let mut bytes = Vec::new();
        renderer(Format::Pprof).hotspot(&report, &mut bytes).unwrap();
        let mut raw = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&bytes[..]), &mut raw).unwrap();
        let p = proto::Profile::decode(&raw[..]).unwrap();
        let text = |i: i64| p.string_table[i as usize].as_str();
        let lzma: Vec<&proto::Mapping> = p
            .mapping
            .iter()
            .filter(|m| text(m.filename).ends_with("liblzma.so.5.4.1"))
            .collect();
        assert_eq!(lzma.len(), 1, "{:?}", p.mapping);
        let m = lzma[0];
        println!("{m:?}");
        assert_eq!((m.memory_start, m.memory_limit, m.file_offset), (0, u64::MAX, 0));
        assert_eq!(text(m.build_id), "72a44fc3");
        assert!(!m.has_functions && !m.has_filenames && !m.has_line_numbers);
        let mut addresses: Vec<u64> = p
            .location
            .iter()
            .filter(|l| l.mapping_id == m.id)
            .map(|l| l.address)
            .collect();
        addresses.sort();
        assert_eq!(addresses, [0x4100, 0x4a10, 0x1692b], "the file's own addresses");
        let named = p.mapping.iter().find(|m| text(m.filename) == "/bin/w").unwrap();
        assert!(named.has_functions && named.memory_limit == 0 && named.build_id == 0);
    }
}
