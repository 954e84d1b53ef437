//! Profiles saved with `-o`, read back as stacks: the JSON of the hotspot, sched (off-CPU
//! stacks) and lock (waiting stacks) modes, pprof (`.pb.gz`, ours or any other tool's) and
//! folded text. What the views (diff, annotate) compare is whatever these hold in common.
use std::path::Path;

use flate2::read::GzDecoder;
use prost::Message as _;
use serde_json::Value;

use crate::{
    error::UserError,
    model::{function_stats, RunMeta, Stack, StackReport, Weight},
    profile::Health,
    report::pprof::proto,
    symbolize::Frame,
};

/// A saved profile, as the report it was rendered from (as far as the format kept it).
pub fn load(path: &Path) -> Result<StackReport, UserError> {
    let fail = |reason: String| UserError::SavedProfile {
        path: path.to_path_buf(),
        reason,
    };
    let bytes = std::fs::read(path).map_err(|e| fail(e.to_string()))?;
    let name = path.display().to_string();
    parse(&bytes, &name).map_err(fail)
}

/// The format is told by the content, not the name: gzip (pprof), `{` (JSON), else folded.
pub fn parse(bytes: &[u8], name: &str) -> Result<StackReport, String> {
    let (weight, meta, stacks) = if bytes.starts_with(&[0x1f, 0x8b]) {
        let mut raw = Vec::new();
        std::io::Read::read_to_end(&mut GzDecoder::new(bytes), &mut raw)
            .map_err(|e| format!("not a gzipped pprof profile: {e}"))?;
        from_pprof(&raw, name)?
    } else if bytes.trim_ascii_start().starts_with(b"{") {
        from_json(bytes)?
    } else {
        let text = std::str::from_utf8(bytes)
            .map_err(|_| "neither JSON, pprof nor folded stacks (not text)".to_string())?;
        from_folded(text, name)?
    };
    Ok(report(weight, meta, stacks))
}

fn report(weight: Weight, meta: RunMeta, mut stacks: Vec<Stack>) -> StackReport {
    stacks.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.frames.cmp(&b.frames)));
    StackReport {
        meta,
        weight,
        health: Health::default(),
        samples: stacks.iter().map(|s| s.count).sum(),
        functions: function_stats(&stacks),
        stacks,
    }
}

fn meta(mode: &str, event: &str, target: String) -> RunMeta {
    RunMeta {
        mode: static_name(mode, &["hotspot", "sched", "lock", "topdown"]),
        event: static_name(
            event,
            &["cpu-clock", "cycles", "instructions", "off-cpu", "lock-wait"],
        ),
        frequency_hz: 0,
        duration_s: 0.0,
        target,
        cpus: 0,
        notes: Vec::new(),
        counters: Vec::new(),
    }
}

/// Report headers name modes and events with static strings: the known ones, else "other".
fn static_name(name: &str, known: &[&'static str]) -> &'static str {
    known.iter().copied().find(|k| *k == name).unwrap_or("other")
}

fn from_json(bytes: &[u8]) -> Result<(Weight, RunMeta, Vec<Stack>), String> {
    let doc: Value = serde_json::from_slice(bytes).map_err(|e| format!("not valid JSON: {e}"))?;
    let mode = doc["mode"].as_str().unwrap_or("");
    let mut meta = meta(
        mode,
        doc["event"].as_str().unwrap_or(""),
        doc["target"].as_str().unwrap_or("").to_string(),
    );
    meta.frequency_hz = doc["frequency_hz"].as_u64().unwrap_or(0);
    meta.duration_s = doc["duration_s"].as_f64().unwrap_or(0.0);
    meta.cpus = doc["cpus"].as_u64().unwrap_or(0) as u32;
    let list = |key: &str| doc[key].as_array().map(Vec::as_slice).unwrap_or(&[]);
    let stack = |s: &Value, count: &str| -> Result<Stack, String> {
        Ok(Stack {
            pid: s["pid"].as_u64().unwrap_or(0) as u32,
            tid: s["tid"].as_u64().unwrap_or(0) as u32,
            comm: s["comm"].as_str().unwrap_or("").to_string(),
            count: s[count].as_u64().ok_or("a stack without its count")?,
            counters: Vec::new(),
            frames: frames(&s["frames"])?,
        })
    };
    match mode {
        "hotspot" => {
            let stacks = list("stacks")
                .iter()
                .map(|s| stack(s, "count"))
                .collect::<Result<_, _>>()?;
            Ok((Weight::Samples, meta, stacks))
        }
        "sched" => {
            let stacks = list("offcpu")
                .iter()
                .map(|s| stack(s, "total_ns"))
                .collect::<Result<_, _>>()?;
            Ok((Weight::OffCpuNanoseconds, meta, stacks))
        }
        "lock" => {
            let mut stacks = Vec::new();
            for lock in list("locks") {
                let label = match lock["symbol"].as_str() {
                    Some(symbol) => symbol.to_string(),
                    None => lock["address"].as_str().unwrap_or("?").to_string(),
                };
                for waiter in lock["waiters"].as_array().map(Vec::as_slice).unwrap_or(&[]) {
                    // As the lock report draws it: the lock below the waiting leaf.
                    let mut waiting = stack(waiter, "total_wait_ns")?;
                    waiting.pid = lock["pid"].as_u64().unwrap_or(0) as u32;
                    waiting.tid = waiting.pid;
                    waiting.comm = lock["comm"].as_str().unwrap_or("").to_string();
                    waiting
                        .frames
                        .push(Frame::marker(&format!("lock {label}"), false));
                    stacks.push(waiting);
                }
            }
            Ok((Weight::LockWaitNanoseconds, meta, stacks))
        }
        "topdown" => Err("a topdown report has no stacks (use a hotspot, sched or lock profile)".into()),
        other => Err(format!("not a bpfprof report (mode `{other}`)")),
    }
}

fn frames(value: &Value) -> Result<Vec<Frame>, String> {
    let hex = |v: &Value| {
        v.as_str()
            .and_then(|s| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok())
    };
    value
        .as_array()
        .ok_or("a stack without frames")?
        .iter()
        .map(|f| {
            Ok(Frame {
                function: f["function"]
                    .as_str()
                    .ok_or("a frame without a function")?
                    .to_string(),
                module: f["module"].as_str().unwrap_or("").to_string(),
                file: f["file"].as_str().map(str::to_string),
                line: f["line"].as_u64().map(|l| l as u32),
                kernel: f["kernel"].as_bool().unwrap_or(false),
                inlined: f["inlined"].as_bool().unwrap_or(false),
                address: hex(&f["address"]).unwrap_or(0),
                start: hex(&f["start"]),
                offset: f["offset"].as_u64(),
            })
        })
        .collect()
}

fn from_pprof(raw: &[u8], name: &str) -> Result<(Weight, RunMeta, Vec<Stack>), String> {
    let p = proto::Profile::decode(raw).map_err(|e| format!("not a pprof profile: {e}"))?;
    let string = |i: i64| p.string_table.get(i as usize).map_or("", String::as_str);
    let kind = p.sample_type.first().map_or("", |t| string(t.r#type));
    let weight = match kind {
        "off-cpu" => Weight::OffCpuNanoseconds,
        "lock-wait" | "contentions" | "delay" => Weight::LockWaitNanoseconds,
        _ => Weight::Samples,
    };
    let mode = match weight {
        Weight::Samples => "hotspot",
        Weight::OffCpuNanoseconds => "sched",
        Weight::LockWaitNanoseconds => "lock",
    };
    let mut meta = meta(mode, kind, name.to_string());
    meta.duration_s = p.duration_nanos as f64 / 1e9;
    let functions: std::collections::HashMap<u64, &proto::Function> =
        p.function.iter().map(|f| (f.id, f)).collect();
    let mappings: std::collections::HashMap<u64, &proto::Mapping> =
        p.mapping.iter().map(|m| (m.id, m)).collect();
    let locations: std::collections::HashMap<u64, &proto::Location> =
        p.location.iter().map(|l| (l.id, l)).collect();
    let mut stacks = Vec::with_capacity(p.sample.len());
    for sample in &p.sample {
        let mut frames = Vec::new();
        // pprof lists the leaf first, and within a location the innermost inlined function first.
        for id in sample.location_id.iter().rev() {
            let location = locations
                .get(id)
                .ok_or("a sample names a location that is not there")?;
            let module = mappings
                .get(&location.mapping_id)
                .map_or("", |m| string(m.filename));
            let kernel = module.starts_with("[kernel") || module == "[vmlinux]";
            if location.line.is_empty() {
                // Not symbolized by the tool that wrote it: kept, as the address it is.
                frames.push(Frame::unknown(module, location.address, kernel));
            }
            for (k, line) in location.line.iter().rev().enumerate() {
                let function = functions.get(&line.function_id);
                frames.push(Frame {
                    function: function.map_or("[unknown]", |f| string(f.name)).to_string(),
                    module: module.to_string(),
                    file: function
                        .map(|f| string(f.filename))
                        .filter(|f| !f.is_empty())
                        .map(str::to_string),
                    line: (line.line > 0).then_some(line.line as u32),
                    kernel,
                    inlined: k > 0,
                    address: location.address,
                    start: None,
                    offset: None,
                });
            }
        }
        let label = |key: &str| sample.label.iter().find(|l| string(l.key) == key);
        stacks.push(Stack {
            pid: label("pid").map_or(0, |l| l.num as u32),
            tid: label("tid").map_or(0, |l| l.num as u32),
            comm: label("comm").map_or("", |l| string(l.str)).to_string(),
            count: sample.value.first().copied().unwrap_or(0).max(0) as u64,
            counters: Vec::new(),
            frames,
        });
    }
    Ok((weight, meta, stacks))
}

/// `comm;outer;...;leaf count` lines (ours, or any stackcollapse tool's): the first element is
/// the process name; `_[k]` marks a kernel frame.
fn from_folded(text: &str, name: &str) -> Result<(Weight, RunMeta, Vec<Stack>), String> {
    let mut stacks = Vec::new();
    for (n, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let bad = || format!("line {}: not `frame;frame;... count`: {line:?}", n + 1);
        let (stack, count) = line.trim_end().rsplit_once(' ').ok_or_else(bad)?;
        let count: u64 = count.parse().map_err(|_| bad())?;
        let mut names = stack.split(';');
        let comm = names.next().unwrap_or("").to_string();
        let frames = names
            .map(|name| {
                let (function, kernel) = match name.strip_suffix("_[k]") {
                    Some(function) => (function, true),
                    None => (name, false),
                };
                Frame {
                    function: function.to_string(),
                    ..Frame::unknown("", 0, kernel)
                }
            })
            .collect();
        stacks.push(Stack {
            pid: 0,
            tid: 0,
            comm,
            count,
            counters: Vec::new(),
            frames,
        });
    }
    if stacks.is_empty() {
        return Err("no stacks in it".into());
    }
    Ok((Weight::Samples, meta("hotspot", "", name.to_string()), stacks))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        cli::Format,
        report::{renderer, tests::sample_report},
    };

    fn round_trip(format: Format) -> StackReport {
        let original = sample_report();
        let mut bytes = Vec::new();
        renderer(format).hotspot(&original, &mut bytes).unwrap();
        parse(&bytes, "saved").unwrap()
    }

    fn leaves(report: &StackReport) -> Vec<(String, u64)> {
        let mut leaves: Vec<(String, u64)> = report
            .stacks
            .iter()
            .map(|s| (s.frames.last().unwrap().function.clone(), s.count))
            .collect();
        leaves.sort();
        leaves
    }

    #[test]
    fn every_stack_format_reads_back_as_written() {
        let want = leaves(&sample_report());
        for format in [Format::Json, Format::Pprof, Format::Folded] {
            let loaded = round_trip(format);
            assert_eq!(leaves(&loaded), want, "{format:?}");
            assert_eq!(loaded.samples, 100, "{format:?}");
            assert_eq!(loaded.weight, Weight::Samples);
            let kernel = loaded
                .stacks
                .iter()
                .flat_map(|s| &s.frames)
                .find(|f| f.function == "ksys_read");
            assert!(kernel.is_some_and(|f| f.kernel), "{format:?}: kernel frame kept");
        }
        // Folded keeps the exact lines it was read from.
        let folded = round_trip(Format::Folded);
        assert_eq!(
            crate::report::folded_lines(&folded),
            crate::report::folded_lines(&sample_report())
        );
    }

    #[test]
    fn json_keeps_where_each_frame_is() {
        let mut original = sample_report();
        let leaf = original.stacks[0].frames.last_mut().unwrap();
        leaf.file = Some("/src/w.c".into());
        leaf.line = Some(42);
        leaf.address = 0x5555_0000_1234;
        leaf.start = Some(0x1200);
        leaf.offset = Some(0x34);
        let want = leaf.clone();
        let mut bytes = Vec::new();
        renderer(Format::Json).hotspot(&original, &mut bytes).unwrap();
        let loaded = parse(&bytes, "saved").unwrap();
        assert!(loaded.stacks.iter().any(|s| s.frames.last() == Some(&want)));
    }

    const FRAME: &str = r#"{"function":"wait_here","module":"/bin/w","file":null,"line":null,"kernel":false,"inlined":false,"address":"0x10"}"#;

    #[test]
    fn sched_reports_give_their_off_cpu_stacks_weighted_by_time() {
        let json = format!(
            r#"{{"mode":"sched","target":"pid 10","duration_s":2.0,"tasks":[],
                "offcpu":[{{"pid":10,"tid":12,"comm":"worker","total_ns":2000,"count":4,"frames":[{FRAME}]}},
                          {{"pid":10,"tid":13,"comm":"worker","total_ns":500,"count":1,"frames":[{FRAME}]}}]}}"#
        );
        let loaded = parse(json.as_bytes(), "s.json").unwrap();
        assert_eq!(loaded.weight, Weight::OffCpuNanoseconds);
        assert_eq!((loaded.samples, loaded.stacks.len()), (2500, 2));
        assert_eq!(loaded.meta.mode, "sched");
        assert_eq!(loaded.functions[0].function, "wait_here");
    }

    #[test]
    fn lock_reports_give_their_waiting_stacks_with_the_lock_below_the_leaf() {
        let json = format!(
            r#"{{"mode":"lock","source":"futex","target":"pid 7","duration_s":1.0,
                "locks":[{{"pid":7,"comm":"server","address":"0x5581c0a014c0","symbol":"shared_lock","kind":"mutex",
                           "waiters":[{{"frames":[{FRAME}],"contentions":3,"total_wait_ns":900,"max_wait_ns":500}}],"holders":[]}},
                         {{"pid":7,"comm":"server","address":"0x7f00","symbol":null,"kind":"futex",
                           "waiters":[{{"frames":[{FRAME}],"contentions":1,"total_wait_ns":100,"max_wait_ns":100}}],"holders":[]}}]}}"#
        );
        let loaded = parse(json.as_bytes(), "l.json").unwrap();
        assert_eq!(loaded.weight, Weight::LockWaitNanoseconds);
        assert_eq!(loaded.samples, 1000);
        let leaves: Vec<&str> = loaded
            .stacks
            .iter()
            .map(|s| s.frames.last().unwrap().function.as_str())
            .collect();
        assert_eq!(leaves, ["[lock shared_lock]", "[lock 0x7f00]"]);
        assert!(loaded.stacks.iter().all(|s| s.pid == 7 && s.comm == "server"));
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
        let mut gz = Vec::new();
        crate::report::pprof::write_gz(&profile, &mut gz).unwrap();
        let loaded = parse(&gz, "p.pb.gz").unwrap();
        let frame = &loaded.stacks[0].frames[0];
        assert_eq!(
            (frame.function.as_str(), frame.address, loaded.samples),
            ("[unknown]", 0x1234, 7)
        );
        assert_eq!(frame.module, "/bin/x");
    }

    #[test]
    fn what_has_no_stacks_is_refused_with_the_reason() {
        let topdown = parse(br#"{"mode":"topdown","threads":[]}"#, "t").unwrap_err();
        assert!(topdown.contains("no stacks"), "{topdown}");
        assert!(parse(b"\x1f\x8bnot gzip", "x").unwrap_err().contains("pprof"));
        assert!(parse(b"main;run 12\nbroken line\n", "x")
            .unwrap_err()
            .contains("line 2"));
        assert!(parse(b"", "x").is_err());
    }
}
