//! OTLP profiles: a window's profiles as one `ExportProfilesServiceRequest`, for OTLP/HTTP
//! (`POST …/v1development/profiles`, `application/x-protobuf`).
//!
//! Pinned to the `opentelemetry.proto.profiles.v1development` schema as PyPI's
//! `opentelemetry-proto` 1.45.2 ships it (the field numbers below are its descriptors'; the
//! agent's end-to-end test decodes what is sent with that package). One dictionary is shared by
//! every profile of the request; index 0 of each of its tables is the zero value, as the schema
//! asks.
use std::collections::HashMap;

use prost::Message as _;

use super::Signal;
use crate::report::pprof::proto as pprof;

/// The messages that bpfprof sends.
pub mod proto {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ExportProfilesServiceRequest {
        #[prost(message, repeated, tag = "1")]
        pub resource_profiles: Vec<ResourceProfiles>,
        #[prost(message, optional, tag = "2")]
        pub dictionary: Option<ProfilesDictionary>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ResourceProfiles {
        #[prost(message, optional, tag = "1")]
        pub resource: Option<Resource>,
        #[prost(message, repeated, tag = "2")]
        pub scope_profiles: Vec<ScopeProfiles>,
    }
    /// `opentelemetry.proto.resource.v1.Resource`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Resource {
        #[prost(message, repeated, tag = "1")]
        pub attributes: Vec<KeyValue>,
    }
    /// `opentelemetry.proto.common.v1.KeyValue`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct KeyValue {
        #[prost(string, tag = "1")]
        pub key: String,
        #[prost(message, optional, tag = "2")]
        pub value: Option<AnyValue>,
    }
    /// `opentelemetry.proto.common.v1.AnyValue`: the two kinds sent.
    #[derive(Clone, PartialEq, Eq, Hash, prost::Message)]
    pub struct AnyValue {
        #[prost(oneof = "any_value::Value", tags = "1, 3")]
        pub value: Option<any_value::Value>,
    }
    pub mod any_value {
        #[derive(Clone, PartialEq, Eq, Hash, prost::Oneof)]
        pub enum Value {
            #[prost(string, tag = "1")]
            StringValue(String),
            #[prost(int64, tag = "3")]
            IntValue(i64),
        }
    }
    /// `opentelemetry.proto.common.v1.InstrumentationScope`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct InstrumentationScope {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(string, tag = "2")]
        pub version: String,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ScopeProfiles {
        #[prost(message, optional, tag = "1")]
        pub scope: Option<InstrumentationScope>,
        #[prost(message, repeated, tag = "2")]
        pub profiles: Vec<Profile>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Profile {
        #[prost(message, optional, tag = "1")]
        pub sample_type: Option<ValueType>,
        #[prost(message, repeated, tag = "2")]
        pub samples: Vec<Sample>,
        #[prost(fixed64, tag = "3")]
        pub time_unix_nano: u64,
        #[prost(uint64, tag = "4")]
        pub duration_nano: u64,
        #[prost(message, optional, tag = "5")]
        pub period_type: Option<ValueType>,
        #[prost(int64, tag = "6")]
        pub period: i64,
        #[prost(bytes = "vec", tag = "7")]
        pub profile_id: Vec<u8>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ValueType {
        #[prost(int32, tag = "1")]
        pub type_strindex: i32,
        #[prost(int32, tag = "2")]
        pub unit_strindex: i32,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Sample {
        #[prost(int32, tag = "1")]
        pub stack_index: i32,
        #[prost(int32, repeated, tag = "2")]
        pub attribute_indices: Vec<i32>,
        #[prost(int64, repeated, tag = "4")]
        pub values: Vec<i64>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ProfilesDictionary {
        #[prost(message, repeated, tag = "1")]
        pub mapping_table: Vec<Mapping>,
        #[prost(message, repeated, tag = "2")]
        pub location_table: Vec<Location>,
        #[prost(message, repeated, tag = "3")]
        pub function_table: Vec<Function>,
        #[prost(message, repeated, tag = "4")]
        pub link_table: Vec<Link>,
        #[prost(string, repeated, tag = "5")]
        pub string_table: Vec<String>,
        #[prost(message, repeated, tag = "6")]
        pub attribute_table: Vec<KeyValueAndUnit>,
        #[prost(message, repeated, tag = "7")]
        pub stack_table: Vec<Stack>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Mapping {
        #[prost(uint64, tag = "1")]
        pub memory_start: u64,
        #[prost(uint64, tag = "2")]
        pub memory_limit: u64,
        #[prost(uint64, tag = "3")]
        pub file_offset: u64,
        #[prost(int32, tag = "4")]
        pub filename_strindex: i32,
        #[prost(int32, repeated, tag = "5")]
        pub attribute_indices: Vec<i32>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Location {
        #[prost(int32, tag = "1")]
        pub mapping_index: i32,
        #[prost(uint64, tag = "2")]
        pub address: u64,
        #[prost(message, repeated, tag = "3")]
        pub lines: Vec<Line>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Line {
        #[prost(int32, tag = "1")]
        pub function_index: i32,
        #[prost(int64, tag = "2")]
        pub line: i64,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Function {
        #[prost(int32, tag = "1")]
        pub name_strindex: i32,
        #[prost(int32, tag = "2")]
        pub system_name_strindex: i32,
        #[prost(int32, tag = "3")]
        pub filename_strindex: i32,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Link {}
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Stack {
        #[prost(int32, repeated, tag = "1")]
        pub location_indices: Vec<i32>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct KeyValueAndUnit {
        #[prost(int32, tag = "1")]
        pub key_strindex: i32,
        #[prost(message, optional, tag = "2")]
        pub value: Option<AnyValue>,
    }
}

use proto::any_value::Value;

/// The shared tables, each with its zero value at index 0.
/// A location by what makes it one: its mapping, its address, and its lines (function, line).
type LocationKey = (i32, u64, Vec<(i32, i64)>);

struct Dictionary {
    tables: proto::ProfilesDictionary,
    strings: HashMap<String, i32>,
    /// By file name, build ID and range (a file's addresses, or a runtime mapping's).
    mappings: HashMap<(i32, i32, u64, u64, u64), i32>,
    /// By name, system name (which says how bpfprof named the frame) and file.
    functions: HashMap<(i32, i32, i32), i32>,
    locations: HashMap<LocationKey, i32>,
    stacks: HashMap<Vec<i32>, i32>,
    attributes: HashMap<(i32, Value), i32>,
}

impl Dictionary {
    fn new() -> Dictionary {
        let mut d = Dictionary {
            tables: proto::ProfilesDictionary {
                mapping_table: vec![Default::default()],
                location_table: vec![Default::default()],
                function_table: vec![Default::default()],
                link_table: vec![Default::default()],
                string_table: Vec::new(),
                attribute_table: vec![Default::default()],
                stack_table: vec![Default::default()],
            },
            strings: HashMap::new(),
            mappings: HashMap::new(),
            functions: HashMap::new(),
            locations: HashMap::new(),
            stacks: HashMap::new(),
            attributes: HashMap::new(),
        };
        d.string("");
        d
    }

    fn string(&mut self, s: &str) -> i32 {
        if let Some(&i) = self.strings.get(s) {
            return i;
        }
        let i = self.tables.string_table.len() as i32;
        self.tables.string_table.push(s.to_string());
        self.strings.insert(s.to_string(), i);
        i
    }

    fn intern<K: std::hash::Hash + Eq, T>(
        map: &mut HashMap<K, i32>,
        table: &mut Vec<T>,
        key: K,
        value: impl FnOnce() -> T,
    ) -> i32 {
        *map.entry(key).or_insert_with(|| {
            table.push(value());
            table.len() as i32 - 1
        })
    }

    fn attribute(&mut self, key: &str, value: Value) -> i32 {
        let key_strindex = self.string(key);
        Self::intern(
            &mut self.attributes,
            &mut self.tables.attribute_table,
            (key_strindex, value.clone()),
            || proto::KeyValueAndUnit {
                key_strindex,
                value: Some(proto::AnyValue { value: Some(value) }),
            },
        )
    }

    /// A pprof profile's location (by its id) as an index of the shared table.
    fn location(&mut self, from: &pprof::Profile, id: u64) -> i32 {
        let Some(location) = from.location.iter().find(|l| l.id == id) else {
            return 0;
        };
        let text = |i: i64| from.string_table.get(i as usize).map_or("", String::as_str);
        let mapping_index = match from.mapping.iter().find(|m| m.id == location.mapping_id) {
            Some(mapping) => {
                let filename = self.string(text(mapping.filename));
                let build_id = text(mapping.build_id);
                // The file's GNU build ID, as OpenTelemetry's semantic conventions name it.
                let attribute_indices = match build_id.is_empty() {
                    true => Vec::new(),
                    false => vec![self.attribute(
                        "process.executable.build_id.gnu",
                        Value::StringValue(build_id.to_string()),
                    )],
                };
                let (start, limit, offset) =
                    (mapping.memory_start, mapping.memory_limit, mapping.file_offset);
                let key = (
                    filename,
                    attribute_indices.first().copied().unwrap_or(0),
                    start,
                    limit,
                    offset,
                );
                Self::intern(&mut self.mappings, &mut self.tables.mapping_table, key, || {
                    proto::Mapping {
                        memory_start: start,
                        memory_limit: limit,
                        file_offset: offset,
                        filename_strindex: filename,
                        attribute_indices,
                    }
                })
            }
            None => 0,
        };
        let mut lines = Vec::with_capacity(location.line.len());
        for line in &location.line {
            let Some(function) = from.function.iter().find(|f| f.id == line.function_id) else {
                continue;
            };
            let name = self.string(text(function.name));
            let system_name = self.string(text(function.system_name));
            let filename = self.string(text(function.filename));
            let index = Self::intern(
                &mut self.functions,
                &mut self.tables.function_table,
                (name, system_name, filename),
                || proto::Function {
                    name_strindex: name,
                    system_name_strindex: system_name,
                    filename_strindex: filename,
                },
            );
            lines.push((index, line.line));
        }
        Self::intern(
            &mut self.locations,
            &mut self.tables.location_table,
            (mapping_index, location.address, lines.clone()),
            || proto::Location {
                mapping_index,
                address: location.address,
                lines: lines
                    .iter()
                    .map(|&(function_index, line)| proto::Line { function_index, line })
                    .collect(),
            },
        )
    }

    fn stack(&mut self, locations: Vec<i32>) -> i32 {
        Self::intern(
            &mut self.stacks,
            &mut self.tables.stack_table,
            locations.clone(),
            || proto::Stack {
                location_indices: locations,
            },
        )
    }
}

/// The semantic-convention name of one of bpfprof's pprof labels, and its value as sent (an
/// executable's path also gives `process.executable.name`).
fn attributes_of(
    key: &str,
    label: &pprof::Label,
    text: &dyn Fn(i64) -> String,
) -> Vec<(&'static str, Value)> {
    match key {
        "pid" => vec![("process.pid", Value::IntValue(label.num))],
        "tid" => vec![("thread.id", Value::IntValue(label.num))],
        "comm" => vec![("thread.name", Value::StringValue(text(label.str)))],
        "executable" => {
            let path = text(label.str);
            let name = crate::report::short_module(&path).to_string();
            vec![
                ("process.executable.path", Value::StringValue(path)),
                ("process.executable.name", Value::StringValue(name)),
            ]
        }
        "container_id" => vec![("container.id", Value::StringValue(text(label.str)))],
        "cgroup" => vec![("bpfprof.cgroup", Value::StringValue(text(label.str)))],
        "lock" => vec![("bpfprof.lock", Value::StringValue(text(label.str)))],
        "lock_kind" => vec![("bpfprof.lock.kind", Value::StringValue(text(label.str)))],
        "wait_class" => vec![("bpfprof.lock.wait_class", Value::StringValue(text(label.str)))],
        _ => Vec::new(),
    }
}

/// One window's profiles (pprof, as the agent writes them) as an OTLP export request from
/// `host`. Each becomes one OTLP profile per sample type it exports ([`exported_types`]).
pub fn export_request(profiles: &[(Signal, pprof::Profile)], host: &str) -> Vec<u8> {
    let mut d = Dictionary::new();
    let mut out = Vec::with_capacity(profiles.len());
    let chosen = profiles.iter().flat_map(|(signal, from)| {
        exported_types(*signal, from)
            .into_iter()
            .map(move |index| (*signal, from, index))
    });
    for (signal, from, index) in chosen {
        let text = |i: i64| from.string_table.get(i as usize).cloned().unwrap_or_default();
        let value_type = |d: &mut Dictionary, t: &pprof::ValueType| proto::ValueType {
            type_strindex: d.string(&text(t.r#type)),
            unit_strindex: d.string(&text(t.unit)),
        };
        let sample_type = from.sample_type.get(index).map(|t| value_type(&mut d, t));
        let period_type = from.period_type.as_ref().map(|t| value_type(&mut d, t));
        let mut samples = Vec::with_capacity(from.sample.len());
        for sample in &from.sample {
            let locations = sample
                .location_id
                .iter()
                .map(|&id| d.location(from, id))
                .collect();
            let stack_index = d.stack(locations);
            let mut attribute_indices = Vec::with_capacity(sample.label.len() + 1);
            for label in &sample.label {
                for (key, value) in attributes_of(&text(label.key), label, &text) {
                    attribute_indices.push(d.attribute(key, value));
                }
            }
            samples.push(proto::Sample {
                stack_index,
                attribute_indices,
                values: sample.value.get(index).copied().into_iter().collect(),
            });
        }
        out.push(proto::Profile {
            sample_type,
            samples,
            time_unix_nano: from.time_nanos.max(0) as u64,
            duration_nano: from.duration_nanos.max(0) as u64,
            period_type,
            period: from.period,
            profile_id: profile_id(from, signal, index),
        });
    }
    let string = |key: &str, value: &str| proto::KeyValue {
        key: key.into(),
        value: Some(proto::AnyValue {
            value: Some(Value::StringValue(value.into())),
        }),
    };
    proto::ExportProfilesServiceRequest {
        resource_profiles: vec![proto::ResourceProfiles {
            resource: Some(proto::Resource {
                attributes: vec![string("host.name", host), string("service.name", "bpfprof")],
            }),
            scope_profiles: vec![proto::ScopeProfiles {
                scope: Some(proto::InstrumentationScope {
                    name: "bpfprof".into(),
                    version: env!("CARGO_PKG_VERSION").into(),
                }),
                profiles: out,
            }],
        }],
        dictionary: Some(d.tables),
    }
    .encode_to_vec()
}

/// 16 bytes that differ per window and signal (the schema wants them unique and non-zero).
fn profile_id(profile: &pprof::Profile, signal: Signal, index: usize) -> Vec<u8> {
    let mut id = Vec::with_capacity(16);
    id.extend_from_slice(&(profile.time_nanos as u64).to_be_bytes());
    id.extend_from_slice(&((signal as u64 + 1) << 8 | index as u64).to_be_bytes());
    id
}

/// Which of a profile's sample types are exported, each as one OTLP profile: the first, but
/// for locks the delay (Go's mutex profile puts contentions first), and for the counters signal
/// each counter (cycles, instructions), not the samples or the CPU time they share with `cpu`.
fn exported_types(signal: Signal, profile: &pprof::Profile) -> Vec<usize> {
    let name = |t: &pprof::ValueType| {
        profile
            .string_table
            .get(t.r#type as usize)
            .map_or("", |s| s.as_str())
    };
    match signal {
        Signal::Lock => vec![1],
        Signal::Counters => (profile.sample_type.iter().enumerate())
            .filter(|(_, t)| !["samples", "cpu"].contains(&name(t)))
            .map(|(index, _)| index)
            .collect(),
        _ => vec![0],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_share_one_dictionary_whose_tables_start_with_their_zero_value() {
        let labels = |pid| -> Vec<(&'static str, String)> {
            match pid {
                7 => vec![
                    ("executable", "/usr/bin/app".into()),
                    ("container_id", "abc".into()),
                ],
                _ => Vec::new(),
            }
        };
        let threads = [crate::report::pprof::ThreadValue {
            pid: 7,
            tid: 8,
            comm: "worker",
            process: "app",
            value: 1500,
            count: 3,
        }];
        let runqueue = crate::report::pprof::per_thread_profile(
            ("delay", "nanoseconds"),
            ("waits", "count"),
            &threads,
            &labels,
        );
        let bytes = export_request(
            &[(Signal::RunQueue, runqueue.clone()), (Signal::OffCpu, runqueue)],
            "box",
        );
        let request = proto::ExportProfilesServiceRequest::decode(&bytes[..]).unwrap();
        let d = request.dictionary.unwrap();
        assert_eq!(d.string_table[0], "");
        assert_eq!(d.stack_table[0], proto::Stack::default());
        assert_eq!(
            d.location_table.len(),
            3,
            "the zero location and two, shared by both profiles"
        );
        let profiles = &request.resource_profiles[0].scope_profiles[0].profiles;
        assert_eq!(profiles.len(), 2);
        let sample = &profiles[0].samples[0];
        assert_eq!(sample.values, [1500]);
        let text = |i: i32| d.string_table[i as usize].as_str();
        let stack = &d.stack_table[sample.stack_index as usize];
        let leaf = &d.location_table[stack.location_indices[0] as usize];
        assert_eq!(
            text(d.function_table[leaf.lines[0].function_index as usize].name_strindex),
            "worker (8)"
        );
        let attributes: HashMap<&str, &Value> = sample
            .attribute_indices
            .iter()
            .map(|&i| {
                let a = &d.attribute_table[i as usize];
                (
                    text(a.key_strindex),
                    a.value.as_ref().unwrap().value.as_ref().unwrap(),
                )
            })
            .collect();
        assert_eq!(attributes["process.pid"], &Value::IntValue(7));
        assert_eq!(attributes["thread.name"], &Value::StringValue("worker".into()));
        assert_eq!(
            attributes["process.executable.name"],
            &Value::StringValue("app".into())
        );
        assert_eq!(attributes["container.id"], &Value::StringValue("abc".into()));
        assert_ne!(profiles[0].profile_id, profiles[1].profile_id);
    }

    /// The counters signal's profile is exported once per counter (each OTLP profile has one
    /// sample type), not for the samples and CPU time the cpu signal exports.
    #[test]
    fn counters_export_one_profile_per_counter() {
        let mut report = crate::report::tests::sample_report();
        report.meta.counters = vec!["cycles".into(), "instructions".into()];
        for stack in &mut report.stacks {
            stack.counters = vec![3 * stack.count, 2 * stack.count];
        }
        let pprof = crate::report::pprof::hotspot_profile(&report);
        let bytes = export_request(&[(Signal::Counters, pprof)], "box");
        let request = proto::ExportProfilesServiceRequest::decode(&bytes[..]).unwrap();
        let d = request.dictionary.unwrap();
        let profiles = &request.resource_profiles[0].scope_profiles[0].profiles;
        let text = |i: i32| d.string_table[i as usize].as_str();
        let exported: Vec<(&str, i64)> = (profiles.iter())
            .map(|p| {
                let total = p.samples.iter().map(|s| s.values[0]).sum();
                (text(p.sample_type.as_ref().unwrap().type_strindex), total)
            })
            .collect();
        assert_eq!(exported, [("cycles", 300), ("instructions", 200)]);
        assert_ne!(profiles[0].profile_id, profiles[1].profile_id);
    }
}
