//! Profiles saved with `-o`, read back. Our JSON reports come back whole (hotspot; sched and lock
//! with everything their text report shows), so `bpfprof report` renders them again in any
//! format, text included; pprof (`.pb.gz`, ours or any other tool's) and folded text come back as
//! their stacks. What the views (diff, annotate) compare is the stacks all of these hold.
use std::{
    io::{self, Write},
    path::Path,
};

use flate2::read::GzDecoder;

use crate::{
    error::UserError,
    model::{function_stats, RunMeta, Stack, StackReport, Weight},
    modes::{lock::LockReport, sched::SchedReport},
    profile::Health,
    report::Renderer,
    symbolize::Frame,
};

mod json;
mod pprof;

/// A saved profile, as the report it was rendered from (as far as its format kept it).
pub enum Saved {
    /// A hotspot report, or the stacks of any mode where the format kept no more (pprof, folded).
    Stacks(StackReport),
    Sched(SchedReport),
    Lock(LockReport),
}

impl Saved {
    /// Its stacks: the report's own, sched's off-CPU stacks or lock's waiting stacks.
    pub fn into_stacks(self) -> StackReport {
        match self {
            Saved::Stacks(report) => report,
            Saved::Sched(report) => report.offcpu,
            Saved::Lock(report) => report.waits,
        }
    }

    /// Rendered again as its mode's report, by `renderer`.
    pub fn render(&self, renderer: &dyn Renderer, out: &mut dyn Write) -> io::Result<()> {
        match self {
            Saved::Stacks(report) => renderer.hotspot(report, out),
            Saved::Sched(report) => renderer.sched(report, out),
            Saved::Lock(report) => renderer.lock(report, out),
        }
    }

    /// Stacks weighted by time with nothing of their report around them (a sched or lock profile
    /// saved as pprof or folded): the text and JSON reports have nothing to show of them.
    pub fn is_bare_time_stacks(&self) -> bool {
        matches!(self, Saved::Stacks(r) if r.weight != Weight::Samples)
    }

    /// Frames left unnamed at the run, named now from debug files found by their build id
    /// (`bpfprof report --debug-dir`); stacks only (a hotspot report, or any pprof or folded one).
    pub fn name_later(&mut self, locator: &crate::symbolize::DebugLocator) {
        let Saved::Stacks(report) = self else { return };
        let frames: std::collections::HashSet<&Frame> =
            report.stacks.iter().flat_map(|s| &s.frames).collect();
        let frames: Vec<&Frame> = frames.into_iter().collect();
        let (named, sources) = crate::symbolize::name_later(locator, &frames);
        for stack in &mut report.stacks {
            let frames = std::mem::take(&mut stack.frames);
            stack.frames = frames
                .into_iter()
                .flat_map(|f| named.get(&f).cloned().unwrap_or_else(|| vec![f]))
                .collect();
        }
        report.functions = function_stats(&report.stacks);
        report.meta.notes.extend(crate::symbolize::names_note(&sources));
        report.symbols = sources;
    }

    pub fn mode(&self) -> &'static str {
        match self {
            Saved::Stacks(report) => report.meta.mode,
            Saved::Sched(_) => "sched",
            Saved::Lock(_) => "lock",
        }
    }
}

/// A saved profile's stacks (for the views).
pub fn load(path: &Path) -> Result<StackReport, UserError> {
    load_saved(path).map(Saved::into_stacks)
}

/// A saved profile, as whole as its format kept it.
pub fn load_saved(path: &Path) -> Result<Saved, UserError> {
    let fail = |reason: String| UserError::SavedProfile {
        path: path.to_path_buf(),
        reason,
    };
    let bytes = read_bounded(path).map_err(fail)?;
    let name = path.display().to_string();
    parse_saved(&bytes, &name).map_err(fail)
}

/// No saved profile bpfprof reads is larger, on disk or ungzipped (its own reports of a busy
/// machine's day are tens of megabytes): a larger one is refused, never read into memory.
pub const MAX_SAVED_BYTES: u64 = 256 << 20;

/// The file's bytes, if it holds at most `MAX_SAVED_BYTES`.
pub fn read_bounded(path: &Path) -> Result<Vec<u8>, String> {
    use std::io::Read as _;
    let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    // A regular file says its size: refused before a byte is read. (A pipe is read up to it.)
    if file.metadata().is_ok_and(|m| m.len() > MAX_SAVED_BYTES) {
        return Err(too_large());
    }
    let mut bytes = Vec::new();
    file.take(MAX_SAVED_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| e.to_string())?;
    match bytes.len() as u64 > MAX_SAVED_BYTES {
        true => Err(too_large()),
        false => Ok(bytes),
    }
}

/// The frames all stacks of a saved profile hold together, at most: some hundreds of bytes each
/// in memory, a gigabyte in all (a report of 30,000 stacks of 127 frames holds 3.8 million).
pub const MAX_FRAMES: usize = 4 << 20;

fn too_many_frames() -> String {
    format!("its stacks hold more than {MAX_FRAMES} frames, more than bpfprof reads of a saved profile")
}

fn too_large() -> String {
    format!(
        "larger than the {} MiB bpfprof reads of a saved profile",
        MAX_SAVED_BYTES >> 20
    )
}

/// The stacks of a saved profile given as bytes.
pub fn parse(bytes: &[u8], name: &str) -> Result<StackReport, String> {
    parse_saved(bytes, name).map(Saved::into_stacks)
}

/// The format is told by the content, not the name: gzip (pprof), `{` (JSON), else folded.
pub fn parse_saved(bytes: &[u8], name: &str) -> Result<Saved, String> {
    if bytes.starts_with(&[0x1f, 0x8b]) {
        let mut raw = Vec::new();
        let gunzipped = std::io::Read::take(GzDecoder::new(bytes), MAX_SAVED_BYTES + 1);
        std::io::Read::read_to_end(&mut { gunzipped }, &mut raw)
            .map_err(|e| format!("not a gzipped pprof profile: {e}"))?;
        if raw.len() as u64 > MAX_SAVED_BYTES {
            return Err(too_large());
        }
        pprof::from_pprof(&raw, name).map(Saved::Stacks)
    } else if bytes.trim_ascii_start().starts_with(b"{") {
        json::from_json(bytes)
    } else {
        let text = std::str::from_utf8(bytes)
            .map_err(|_| "neither JSON, pprof nor folded stacks (not text)".to_string())?;
        from_folded(text, name).map(Saved::Stacks)
    }
}

/// Stacks as a report of them: heaviest first, with their functions.
fn stack_report(weight: Weight, meta: RunMeta, health: Health, mut stacks: Vec<Stack>) -> StackReport {
    stacks.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.frames.cmp(&b.frames)));
    StackReport {
        meta,
        weight,
        health,
        samples: crate::model::total_count(&stacks),
        functions: function_stats(&stacks),
        stacks,
        symbols: Vec::new(),
    }
}

fn meta(mode: &str, event: &str, target: String) -> RunMeta {
    RunMeta {
        mode: static_name(mode, &["hotspot", "sched", "lock", "topdown"]),
        event: match event {
            "" => "other".to_string(),
            event => event.to_string(),
        },
        frequency_hz: 0,
        period: None,
        duration_s: 0.0,
        target,
        cpus: 0,
        notes: Vec::new(),
        counters: Vec::new(),
        weight: None,
    }
}

/// Report headers name modes and events with static strings: the known ones, else "other".
fn static_name(name: &str, known: &[&'static str]) -> &'static str {
    known.iter().copied().find(|k| *k == name).unwrap_or("other")
}

/// `comm;outer;...;leaf count` lines (ours, or any stackcollapse tool's): the first element is
/// the process name; `_[k]` marks a kernel frame.
fn from_folded(text: &str, name: &str) -> Result<StackReport, String> {
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
    let meta = meta("hotspot", "", name.to_string());
    Ok(stack_report(Weight::Samples, meta, Health::default(), stacks))
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
    fn what_has_no_stacks_is_refused_with_the_reason() {
        let topdown = parse(br#"{"mode":"topdown","threads":[]}"#, "t").unwrap_err();
        assert!(topdown.contains("no stacks"), "{topdown}");
        assert!(parse(b"\x1f\x8bnot gzip", "x").unwrap_err().contains("pprof"));
        assert!(parse(b"main;run 12\nbroken line\n", "x")
            .unwrap_err()
            .contains("line 2"));
        assert!(parse(b"", "x").is_err());
    }

    /// Counts a file claims are added without overflowing (a panic in a checked build, a
    /// wrapped total in a release one).
    #[test]
    fn counts_that_would_overflow_saturate() {
        let max = u64::MAX;
        let report = parse(
            format!("a;main;work {max}\na;main;work {max}\nb;idle {max}\n").as_bytes(),
            "x",
        )
        .unwrap();
        assert_eq!(report.samples, max);
        let work = report.functions.iter().find(|f| f.function == "work").unwrap();
        assert_eq!((work.self_samples, work.total_samples), (max, max));
    }

    /// A gzip stream that inflates past what bpfprof reads is refused, not inflated whole.
    #[test]
    fn a_pprof_that_inflates_past_the_bound_is_refused() {
        use std::io::Write as _;
        // 256 MiB + 1 of zeros compresses to a quarter of a megabyte.
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        let chunk = vec![0u8; 1 << 20];
        for _ in 0..(MAX_SAVED_BYTES >> 20) {
            gz.write_all(&chunk).unwrap();
        }
        gz.write_all(&[0]).unwrap();
        let err = parse(&gz.finish().unwrap(), "bomb.pb.gz").unwrap_err();
        assert!(err.contains("larger than"), "{err}");
    }
}
