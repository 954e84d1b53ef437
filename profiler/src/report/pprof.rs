//! pprof (`profile.proto`, gzipped), as read by `go tool pprof`, speedscope, Parca and Pyroscope.
use std::io::{self, Write};

use flate2::{write::GzEncoder, Compression};
use foldhash::{HashMap, HashMapExt as _};
use prost::Message;

use super::Renderer;
use crate::{
    model::{RunMeta, StackReport, Weight},
    modes::lock::{lock_label, LockReport, WaitClass},
    symbolize::{Frame, NameKind},
};

/// The messages of pprof's `profile.proto` that bpfprof writes (field numbers from that schema).
pub mod proto {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Profile {
        #[prost(message, repeated, tag = "1")]
        pub sample_type: Vec<ValueType>,
        #[prost(message, repeated, tag = "2")]
        pub sample: Vec<Sample>,
        #[prost(message, repeated, tag = "3")]
        pub mapping: Vec<Mapping>,
        #[prost(message, repeated, tag = "4")]
        pub location: Vec<Location>,
        #[prost(message, repeated, tag = "5")]
        pub function: Vec<Function>,
        #[prost(string, repeated, tag = "6")]
        pub string_table: Vec<String>,
        #[prost(int64, tag = "9")]
        pub time_nanos: i64,
        #[prost(int64, tag = "10")]
        pub duration_nanos: i64,
        #[prost(message, optional, tag = "11")]
        pub period_type: Option<ValueType>,
        #[prost(int64, tag = "12")]
        pub period: i64,
        #[prost(int64, repeated, tag = "13")]
        pub comment: Vec<i64>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ValueType {
        #[prost(int64, tag = "1")]
        pub r#type: i64,
        #[prost(int64, tag = "2")]
        pub unit: i64,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Sample {
        #[prost(uint64, repeated, tag = "1")]
        pub location_id: Vec<u64>,
        #[prost(int64, repeated, tag = "2")]
        pub value: Vec<i64>,
        #[prost(message, repeated, tag = "3")]
        pub label: Vec<Label>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Label {
        #[prost(int64, tag = "1")]
        pub key: i64,
        #[prost(int64, tag = "2")]
        pub str: i64,
        #[prost(int64, tag = "3")]
        pub num: i64,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Mapping {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(uint64, tag = "2")]
        pub memory_start: u64,
        #[prost(uint64, tag = "3")]
        pub memory_limit: u64,
        #[prost(uint64, tag = "4")]
        pub file_offset: u64,
        #[prost(int64, tag = "5")]
        pub filename: i64,
        #[prost(int64, tag = "6")]
        pub build_id: i64,
        #[prost(bool, tag = "7")]
        pub has_functions: bool,
        #[prost(bool, tag = "8")]
        pub has_filenames: bool,
        #[prost(bool, tag = "9")]
        pub has_line_numbers: bool,
        #[prost(bool, tag = "10")]
        pub has_inline_frames: bool,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Location {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(uint64, tag = "2")]
        pub mapping_id: u64,
        #[prost(uint64, tag = "3")]
        pub address: u64,
        #[prost(message, repeated, tag = "4")]
        pub line: Vec<Line>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Line {
        #[prost(uint64, tag = "1")]
        pub function_id: u64,
        #[prost(int64, tag = "2")]
        pub line: i64,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Function {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(int64, tag = "2")]
        pub name: i64,
        #[prost(int64, tag = "3")]
        pub system_name: i64,
        #[prost(int64, tag = "4")]
        pub filename: i64,
    }
}

pub struct Pprof;

impl Renderer for Pprof {
    fn hotspot(&self, report: &StackReport, out: &mut dyn Write) -> io::Result<()> {
        write_gz(&hotspot_profile(report), out)
    }
}

/// A profile as pprof files hold it: the encoded message, gzipped at the fastest level (as Go's
/// runtime/pprof writes them: the agent compresses a profile per signal every window).
pub fn write_gz(profile: &proto::Profile, out: &mut dyn Write) -> io::Result<()> {
    let mut gz = GzEncoder::new(out, Compression::fast());
    gz.write_all(&profile.encode_to_vec())?;
    gz.finish()?;
    Ok(())
}

/// Interns strings, functions, mappings and locations; index 0 of the string table is "".
#[derive(Default)]
struct Builder {
    profile: proto::Profile,
    strings: HashMap<String, i64>,
    functions: HashMap<(String, Option<String>, NameKind), u64>,
    mappings: HashMap<(String, Option<String>), u64>,
    locations: HashMap<Frame, u64>,
}

/// Where a frame's location is: in a mapping of its module whose addresses are the file's own
/// (virtual addresses, pprof's `start 0, limit ^0, offset 0` convention) where the frame knows
/// its place in the file, else at its runtime address in a mapping named by its module only.
fn file_address(frame: &Frame) -> Option<(u64, Option<&str>)> {
    let object = frame.object.as_ref()?;
    Some((object.vaddr?, object.build_id.as_deref()))
}

impl Builder {
    fn new() -> Self {
        let mut b = Self::default();
        b.string("");
        b
    }

    fn string(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.strings.get(s) {
            return i;
        }
        let i = self.profile.string_table.len() as i64;
        self.profile.string_table.push(s.to_string());
        self.strings.insert(s.to_string(), i);
        i
    }

    fn value_type(&mut self, kind: &str, unit: &str) -> proto::ValueType {
        proto::ValueType {
            r#type: self.string(kind),
            unit: self.string(unit),
        }
    }

    /// The mapping of a frame's module; for frames that know their place in their file, one
    /// per build ID whose addresses are the file's (see `file_address`).
    fn mapping(&mut self, frame: &Frame) -> u64 {
        let place = file_address(frame);
        let key = (
            frame.module.clone(),
            place.map(|(_, id)| id.unwrap_or("").to_string()),
        );
        if let Some(&id) = self.mappings.get(&key) {
            return id;
        }
        let id = self.profile.mapping.len() as u64 + 1;
        let filename = self.string(&frame.module);
        let build_id = self.string(place.and_then(|(_, id)| id).unwrap_or(""));
        self.profile.mapping.push(proto::Mapping {
            id,
            memory_limit: if place.is_some() { u64::MAX } else { 0 },
            filename,
            build_id,
            has_functions: true,
            has_filenames: true,
            has_line_numbers: true,
            has_inline_frames: true,
            ..Default::default()
        });
        self.mappings.insert(key, id);
        id
    }

    /// A frame's function; its `system_name` also says how it was named (`NameKind::system_name`),
    /// so that a frame placed at its function's start reads back as placed by its FDE.
    fn function(&mut self, frame: &Frame) -> u64 {
        let key = (frame.function.clone(), frame.file.clone(), frame.kind);
        if let Some(&id) = self.functions.get(&key) {
            return id;
        }
        let id = self.profile.function.len() as u64 + 1;
        let name = self.string(&frame.function);
        let system_name = self.string(&frame.kind.system_name(&frame.function));
        let filename = self.string(frame.file.as_deref().unwrap_or(""));
        self.profile.function.push(proto::Function {
            id,
            name,
            system_name,
            filename,
        });
        self.functions.insert(key, id);
        id
    }

    /// A sample's labels: its thread (`pid`, `tid` where known, `comm`) and its process's
    /// `labels`.
    fn thread_labels(
        &mut self,
        pid: u32,
        tid: Option<u32>,
        comm: &str,
        labels: &ProcessLabels<'_>,
    ) -> Vec<proto::Label> {
        let number = |key, num: u32| proto::Label {
            key,
            num: num as i64,
            ..Default::default()
        };
        let mut label = vec![number(self.string("pid"), pid)];
        if let Some(tid) = tid {
            label.push(number(self.string("tid"), tid));
        }
        label.push(proto::Label {
            key: self.string("comm"),
            str: self.string(comm),
            ..Default::default()
        });
        for (key, value) in labels(pid) {
            label.push(proto::Label {
                key: self.string(key),
                str: self.string(&value),
                ..Default::default()
            });
        }
        label
    }

    /// One location per distinct frame; an inlined frame is its own location at the same address.
    fn location(&mut self, frame: &Frame) -> u64 {
        if let Some(&id) = self.locations.get(frame) {
            return id;
        }
        let id = self.profile.location.len() as u64 + 1;
        let mapping_id = self.mapping(frame);
        let place = file_address(frame);
        if place.is_some() && frame.is_unknown() {
            // Not named here: `go tool pprof` names a mapping's addresses again from the binary
            // (`-symbolize=local`, PPROF_BINARY_PATH) only if it does not say it has names.
            let mapping = &mut self.profile.mapping[mapping_id as usize - 1];
            mapping.has_functions = false;
            mapping.has_filenames = false;
            mapping.has_line_numbers = false;
            mapping.has_inline_frames = false;
        }
        let function_id = self.function(frame);
        self.profile.location.push(proto::Location {
            id,
            mapping_id,
            address: place.map_or(frame.address, |(vaddr, _)| vaddr),
            line: vec![proto::Line {
                function_id,
                line: frame.line.unwrap_or(0) as i64,
            }],
        });
        self.locations.insert(frame.clone(), id);
        id
    }
}

pub fn hotspot_profile(report: &StackReport) -> proto::Profile {
    hotspot_profile_labeled(report, &|_| Vec::new())
}

/// Labels for a process's samples besides pid, tid and comm (e.g. its executable, container).
pub type ProcessLabels<'a> = dyn Fn(u32) -> Vec<(&'static str, String)> + 'a;

/// The hotspot profile with more labels per process, and the report's health problems and notes
/// as comments (a fleet tool shows them next to the profile).
pub fn hotspot_profile_labeled(report: &StackReport, labels: &ProcessLabels<'_>) -> proto::Profile {
    let mut b = Builder::new();
    let timed = report.weight != Weight::Samples;
    let cpu_clock = report.meta.event == "cpu-clock" && !timed;
    let period_ns = 1_000_000_000 / report.meta.frequency_hz.max(1) as i64;
    let samples = match report.weight {
        Weight::OffCpuNanoseconds => b.value_type("off-cpu", "nanoseconds"),
        Weight::LockWaitNanoseconds => b.value_type("lock-wait", "nanoseconds"),
        // A probe's samples weighted by a register: its sums (`arg1`, e.g. bytes asked).
        Weight::Samples => match &report.meta.weight {
            Some(register) => b.value_type(register, "value"),
            None => b.value_type("samples", "count"),
        },
    };
    b.profile.sample_type.push(samples.clone());
    // Each sample stands for this many of its event: the CPU clock's nanoseconds, or `-c N`
    // (not of a weighted sample: its value is the register's, not a count).
    let weighted = report.meta.weight.is_some();
    let (unit_of_sample, each) = match (cpu_clock, report.meta.period) {
        _ if weighted => (None, 1),
        (true, period) => (
            Some(b.value_type("cpu", "nanoseconds")),
            period.map_or(period_ns, |n| n as i64),
        ),
        (false, Some(n)) if !timed => (Some(b.value_type(&report.meta.event, "count")), n as i64),
        _ => (None, 1),
    };
    match unit_of_sample {
        Some(unit) => {
            b.profile.sample_type.push(unit.clone());
            b.profile.period_type = Some(unit);
            b.profile.period = each;
        }
        None => {
            b.profile.period_type = Some(samples);
            b.profile.period = 1;
        }
    }
    let weighted = b.profile.sample_type.len() > 1;
    // The counters read at each sample (`--counter`, the agent's counters signal): one value
    // each, what the stack's samples counted of it (cycles and instructions: IPC by stack).
    for name in &report.meta.counters {
        let counter = b.value_type(name, "count");
        b.profile.sample_type.push(counter);
    }
    for stack in &report.stacks {
        let location_id = stack.frames.iter().rev().map(|f| b.location(f)).collect();
        let mut value = vec![stack.count as i64];
        if weighted {
            value.push((stack.count as i64).saturating_mul(each));
        }
        let counters = (0..report.meta.counters.len()).map(|k| stack.counters.get(k).copied().unwrap_or(0));
        value.extend(counters.map(|n| n as i64));
        let label = b.thread_labels(stack.pid, Some(stack.tid), &stack.comm, labels);
        b.profile.sample.push(proto::Sample {
            location_id,
            value,
            label,
        });
    }
    b.profile.duration_nanos = (report.meta.duration_s * 1e9) as i64;
    b.profile.time_nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64 - b.profile.duration_nanos)
        .unwrap_or(0);
    let comment = b.string(&header_comment(&report.meta, report.weight));
    b.profile.comment.push(comment);
    for text in report.health.warnings().iter().chain(&report.meta.notes) {
        let comment = b.string(text);
        b.profile.comment.push(comment);
    }
    main_executable_first(&mut b.profile);
    b.profile
}

/// The report's header as the profile's first comment, so that it is read back whole (and
/// `go tool pprof -comments` shows it): `bpfprof hotspot: pid 1234 | cpu-clock at 99 Hz | 2
/// CPUs`; the event only for sampled profiles (a time profile was not sampled at a frequency).
pub fn header_comment(meta: &RunMeta, weight: Weight) -> String {
    let event = match (weight, meta.sampling()) {
        (Weight::Samples, Some(sampling)) => format!(" | {sampling}"),
        _ => String::new(),
    };
    format!(
        "bpfprof {}: {}{event} | {} CPUs",
        meta.mode, meta.target, meta.cpus
    )
}

/// What a `header_comment` says, read back: `None` when the comment is not one.
pub fn read_header_comment(comment: &str) -> Option<Header> {
    let (mode, rest) = comment.strip_prefix("bpfprof ")?.split_once(": ")?;
    let (rest, cpus) = rest.rsplit_once(" | ")?;
    let cpus = cpus.strip_suffix(" CPUs")?.parse().ok()?;
    let sampled = rest.rsplit_once(" | ").and_then(|(target, sampling)| {
        if let Some(event) = sampling.strip_suffix(" every event") {
            return Some((target, event, 0, Some(1)));
        }
        if let Some((event, n)) = sampling
            .strip_suffix(" events")
            .and_then(|s| s.rsplit_once(" every "))
        {
            return Some((target, event, 0, Some(n.parse().ok()?)));
        }
        let (event, hz) = sampling.strip_suffix(" Hz")?.rsplit_once(" at ")?;
        Some((target, event, hz.parse().ok()?, None))
    });
    let (target, event, frequency_hz, period) = sampled.unwrap_or((rest, "", 0, None));
    Some(Header {
        mode: mode.to_string(),
        target: target.to_string(),
        event: event.to_string(),
        frequency_hz,
        period,
        cpus,
    })
}

/// A report's header as its pprof profile carries it.
#[derive(Debug, PartialEq)]
pub struct Header {
    pub mode: String,
    pub target: String,
    /// Empty for a time profile.
    pub event: String,
    pub frequency_hz: u64,
    /// Sampled every this many events (then no frequency).
    pub period: Option<u64>,
    pub cpus: u32,
}

/// `go tool pprof` (and other readers) name a profile after its first mapping (`File:`): that
/// is the main executable with the most samples, not whichever library the first stack's leaf
/// was in. Mappings are renumbered so that it is mapping 1.
fn main_executable_first(profile: &mut proto::Profile) {
    let mut weight: HashMap<u64, i64> = HashMap::new();
    let mapping_of: HashMap<u64, u64> = profile.location.iter().map(|l| (l.id, l.mapping_id)).collect();
    for sample in &profile.sample {
        let mut seen: Vec<u64> = sample
            .location_id
            .iter()
            .filter_map(|l| mapping_of.get(l).copied())
            .collect();
        seen.sort_unstable();
        seen.dedup();
        for mapping in seen {
            // A saved profile's values may be anything (a crafted one: i64::MAX twice).
            let entry = weight.entry(mapping).or_default();
            *entry = entry.saturating_add(sample.value.first().copied().unwrap_or(0));
        }
    }
    let strings = &profile.string_table;
    let main = profile
        .mapping
        .iter()
        .filter(|m| is_executable(strings.get(m.filename as usize).map_or("", String::as_str)))
        .max_by_key(|m| (weight.get(&m.id).copied().unwrap_or(0), std::cmp::Reverse(m.id)))
        .map(|m| m.id);
    let Some(main) = main else { return };
    let Some(at) = profile.mapping.iter().position(|m| m.id == main) else {
        return;
    };
    let first = profile.mapping.remove(at);
    profile.mapping.insert(0, first);
    let renumbered: HashMap<u64, u64> = profile
        .mapping
        .iter()
        .enumerate()
        .map(|(i, m)| (m.id, i as u64 + 1))
        .collect();
    for mapping in &mut profile.mapping {
        mapping.id = renumbered[&mapping.id];
    }
    for location in &mut profile.location {
        location.mapping_id = renumbered.get(&location.mapping_id).copied().unwrap_or(0);
    }
}

/// A file a process was started from, by its path: not a shared object (`libz.so.1`,
/// `ld-linux-x86-64.so.2`), nor the kernel, the vDSO or anonymous memory (`[...]`).
fn is_executable(module: &str) -> bool {
    let name = super::short_module(module);
    module.starts_with('/') && !name.ends_with(".so") && !name.contains(".so.")
}

/// One thread's figure in a per-thread profile.
pub struct ThreadValue<'a> {
    pub pid: u32,
    pub tid: u32,
    pub comm: &'a str,
    /// What the process is called (its executable's name, or its main thread's).
    pub process: &'a str,
    pub value: i64,
    pub count: i64,
}

/// A profile of one figure per thread (e.g. time waiting for a CPU), with no stacks to go by:
/// each thread's sample sits under a frame for its process and one for itself, so a flamegraph
/// shows processes, then their threads; labels as a hotspot profile's.
pub fn per_thread_profile(
    value: (&str, &str),
    count: (&str, &str),
    threads: &[ThreadValue<'_>],
    labels: &ProcessLabels<'_>,
) -> proto::Profile {
    let mut b = Builder::new();
    let value_type = b.value_type(value.0, value.1);
    let count_type = b.value_type(count.0, count.1);
    b.profile.sample_type = vec![value_type.clone(), count_type];
    b.profile.period_type = Some(value_type);
    b.profile.period = 1;
    for thread in threads {
        let process = Frame::named(format!("{} ({})", thread.process, thread.pid), "[process]");
        let process = b.location(&process);
        let own = b.location(&Frame::named(
            format!("{} ({})", thread.comm, thread.tid),
            "[thread]",
        ));
        let label = b.thread_labels(thread.pid, Some(thread.tid), thread.comm, labels);
        b.profile.sample.push(proto::Sample {
            location_id: vec![own, process],
            value: vec![thread.value, thread.count],
            label,
        });
    }
    b.profile
}

/// Lock waits as Go's mutex profile has them (`contentions`/count, `delay`/nanoseconds, so
/// `go tool pprof` shows the delay by default): one sample per waiting stack of each lock, the
/// lock as its leaf frame, and labelled with the lock, its kind and its class (contention, or
/// waiting for an event).
pub fn lock_profile(report: &LockReport, labels: &ProcessLabels<'_>) -> proto::Profile {
    let mut b = Builder::new();
    let contentions = b.value_type("contentions", "count");
    let delay = b.value_type("delay", "nanoseconds");
    b.profile.sample_type = vec![contentions.clone(), delay];
    b.profile.period_type = Some(contentions);
    b.profile.period = 1;
    for lock in &report.locks {
        let name = lock_label(lock);
        let leaf = b.location(&Frame::marker(&format!("lock {name}"), false));
        let class = match lock.class {
            WaitClass::Contention => "contention",
            WaitClass::Waiting => "waiting",
        };
        for waiter in &lock.waiters {
            let mut location_id = vec![leaf];
            location_id.extend(waiter.frames.iter().rev().map(|f| b.location(f)));
            let mut label = b.thread_labels(lock.pid, None, &lock.comm, labels);
            for (key, value) in [
                ("lock", name.as_str()),
                ("lock_kind", lock.kind),
                ("wait_class", class),
            ] {
                label.push(proto::Label {
                    key: b.string(key),
                    str: b.string(value),
                    ..Default::default()
                });
            }
            b.profile.sample.push(proto::Sample {
                location_id,
                value: vec![waiter.contentions as i64, waiter.total_wait_ns as i64],
                label,
            });
        }
    }
    b.profile.duration_nanos = (report.meta.duration_s * 1e9) as i64;
    let comment = b.string(&format!(
        "bpfprof lock ({}): {}",
        report.source.name(),
        report.meta.target
    ));
    b.profile.comment.push(comment);
    for text in report.health.warnings().iter().chain(&report.meta.notes) {
        let comment = b.string(text);
        b.profile.comment.push(comment);
    }
    main_executable_first(&mut b.profile);
    b.profile
}

#[cfg(test)]
mod tests;
