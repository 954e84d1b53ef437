//! A recorded hit as user space keeps it (`Hit`): decoded from the kernel's record by each
//! event's `Decoder` (a tracepoint's fields where its tracefs format puts them, a probe's
//! fetches as their types show them), written as a JSON line, read back by `script`.
use std::path::Path;

use profiler_common::records::{HitRecord, STRING_BYTES};
use serde::{
    de::{MapAccess, Visitor},
    ser::SerializeMap,
    Deserialize, Deserializer, Serialize, Serializer,
};
use serde_json::Value;

use crate::{
    collect::comm_string,
    counters::{
        fetch::{Fetched, Type},
        tracepoint::{self, Field},
    },
    sources::records::Spec,
};

/// One hit.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Hit {
    /// CLOCK_MONOTONIC, as perf's records and `bpf_ktime_get_ns`.
    pub time_ns: u64,
    pub pid: u32,
    pub tid: u32,
    pub cpu: u32,
    pub comm: String,
    pub event: String,
    /// The tracepoint's fields or the probe's fetches, in their order; null where unreadable.
    pub fields: Fields,
    /// `record -g`: the stacks it was hit on, innermost first as perf script prints them: the
    /// kernel's frames (at a tracepoint), then the user's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stack: Option<Vec<super::stacks::StackFrame>>,
    /// The fields whose strings were longer than bpfprof reads (`STRING_BYTES - 1`): their
    /// values are the strings' starts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cut: Vec<String>,
}

/// Named values in order (a JSON object whose keys keep their order).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Fields(pub Vec<(String, Value)>);

impl Serialize for Fields {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (name, value) in &self.0 {
            map.serialize_entry(name, value)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for Fields {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct InOrder;
        impl<'de> Visitor<'de> for InOrder {
            type Value = Fields;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an object of fields")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Fields, A::Error> {
                let mut fields = Vec::new();
                while let Some(entry) = map.next_entry::<String, Value>()? {
                    fields.push(entry);
                }
                Ok(Fields(fields))
            }
        }
        deserializer.deserialize_map(InOrder)
    }
}

/// How one event's records read.
enum Decoder {
    /// The tracepoint's own fields (not the common ones), and the strings fetched where some of
    /// them point.
    Tracepoint(Vec<Field>, Vec<Fetched>),
    Probe(Vec<Fetched>),
}

/// Each event's name and decoder, by its place in the run.
pub struct Decoders(Vec<(String, Decoder)>);

impl Decoders {
    pub fn new(spec: &Spec, tracefs: &Path) -> Decoders {
        let decoders = (spec.events.iter().zip(&spec.fetches))
            .map(|(event, fetches)| {
                let decoder = match event.is_tracepoint() {
                    true => Decoder::Tracepoint(
                        (tracepoint::layout(tracefs, &event.name).into_iter())
                            .filter(|f| !f.name.starts_with("common_"))
                            .collect(),
                        fetches.clone(),
                    ),
                    false => Decoder::Probe(fetches.clone()),
                };
                (event.spelled(), decoder)
            })
            .collect();
        Decoders(decoders)
    }

    pub fn hit(&self, record: &HitRecord) -> Hit {
        let (event, fields, cut) = match self.0.get(record.event as usize) {
            Some((name, decoder)) => (name.clone(), decoder.fields(record), decoder.cut(record)),
            None => (format!("event {}", record.event), Fields::default(), Vec::new()),
        };
        Hit {
            time_ns: record.time_ns,
            pid: record.tgid,
            tid: record.tid,
            cpu: record.cpu,
            comm: comm_string(&record.comm),
            event,
            fields,
            stack: None,
            cut,
        }
    }
}

impl Decoder {
    /// The names of the record's fetched strings that were cut.
    fn cut(&self, record: &HitRecord) -> Vec<String> {
        let (Decoder::Tracepoint(_, fetches) | Decoder::Probe(fetches)) = self;
        (fetches.iter().enumerate())
            .filter(|(n, _)| record.cut & (1 << n.min(&7)) != 0)
            .map(|(_, f)| f.name.clone())
            .collect()
    }

    fn fields(&self, record: &HitRecord) -> Fields {
        Fields(match self {
            Decoder::Tracepoint(fields, fetches) => (fields.iter())
                .map(|f| {
                    let fetched = fetches.iter().position(|fetch| fetch.name == f.name);
                    let value = match (record.failed, fetched) {
                        (u8::MAX, _) => Value::Null,
                        (_, Some(n)) => fetched_value(record, n, &fetches[n]),
                        _ => field_value(f, &record.data),
                    };
                    (f.name.clone(), value)
                })
                .collect(),
            Decoder::Probe(fetches) => (fetches.iter().enumerate())
                .map(|(n, f)| (f.name.clone(), fetched_value(record, n, f)))
                .collect(),
        })
    }
}

/// Fetch `n` of a record as its type shows it; null where it could not be read.
fn fetched_value(record: &HitRecord, n: usize, fetched: &Fetched) -> Value {
    if record.failed & (1 << n.min(7)) != 0 {
        return Value::Null;
    }
    let string = (record.strings)
        .get(n * STRING_BYTES..(n + 1) * STRING_BYTES)
        .unwrap_or(&[]);
    fetched
        .ty
        .show(record.values.get(n).copied().unwrap_or(0), string)
}

/// A tracepoint field's value in its record's bytes (`data`, the first of them): a number, text,
/// or an array of numbers; null where it lies past the bytes recorded.
fn field_value(field: &Field, data: &[u8]) -> Value {
    let at = field.offset as usize;
    let size = field.size as usize;
    let Some(bytes) = data.get(at..at + size) else {
        return Value::Null;
    };
    if field.is_dynamic() {
        // `__data_loc`: the offset of the bytes in the record (low 16 bits) and their length.
        let word = u32::from_ne_bytes(bytes.get(..4).and_then(|b| b.try_into().ok()).unwrap_or([0; 4]));
        let (start, len) = ((word & 0xffff) as usize, (word >> 16) as usize);
        return match data.get(start..start + len) {
            Some(text) if field.is_text() => Type::Str.show(0, text),
            Some(_) => Value::from(format!("{len} bytes")),
            None => Value::Null,
        };
    }
    if field.is_text() {
        return Type::Str.show(0, bytes);
    }
    let count = (field.declared.split('[').nth(1))
        .and_then(|n| n.trim_end_matches(']').parse::<usize>().ok())
        .filter(|&n| n > 0 && size.is_multiple_of(n) && size / n > 0);
    match count {
        Some(n) if field.array => {
            Value::Array(bytes.chunks(size / n).map(|c| number(c, field.signed)).collect())
        }
        _ if field.declared.contains('*') => {
            Type::Hex(8).show(number(bytes, false).as_u64().unwrap_or(0), &[])
        }
        // A system call's argument is kept in a word whatever its C type: `int dfd` in 8 bytes,
        // AT_FDCWD (-100) in its low 4.
        _ if field.declared.trim_start_matches("const ") == "int" => number(&bytes[..size.min(4)], true),
        _ => number(bytes, field.signed),
    }
}

/// A number of 1, 2, 4 or 8 bytes in the machine's order.
fn number(bytes: &[u8], signed: bool) -> Value {
    let mut word = [0u8; 8];
    let n = bytes.len().min(8);
    word[..n].copy_from_slice(&bytes[..n]);
    let value = u64::from_ne_bytes(word);
    match (signed, n) {
        (true, 1 | 2 | 4 | 8) => Type::Signed(n as u8).show(value, &[]),
        _ => Value::from(value),
    }
}
