//! `stat --by FIELD`: each counted tracing event's hits by the targets, per value of one of its
//! numbers (or per power-of-two range of it). A program at each event's hits adds one to the
//! value's count in a per-CPU hash; read once, at the end, with the programs detached first.
use std::{collections::BTreeMap, os::fd::OwnedFd};

use aya::maps::{Array, Map, MapData, PerCpuArray, PerCpuHashMap};
use profiler_common::{
    names,
    values::{ByField, ValueKey},
};

use super::{
    hooks::{open_traced, set_filters},
    AttachContext, Attached, Batch, Source,
};
use crate::{
    bpf::{LoadOptions, Loaded},
    collect::take_map,
    counters::language::Event,
    process::Processes,
};

/// The counted events, each with where its number is and its `--filter`'s terms.
#[derive(Clone, Debug)]
pub struct Spec {
    pub events: Vec<Event>,
    pub fields: Vec<ByField>,
    pub filters: Vec<crate::counters::filter::SiteTerms>,
}

impl Spec {
    pub fn needs(&self, options: &mut LoadOptions<'_>) {
        options.use_maps([&names::VALUE_COUNTS]);
    }

    pub fn attach(self, kernel: &mut Loaded, context: &AttachContext<'_>) -> anyhow::Result<Attached> {
        set_filters(kernel, &self.filters)?;
        let mut fields: Array<MapData, ByField> =
            Array::try_from(take_map(&mut kernel.ebpf, names::BY_FIELDS)?)?;
        for (n, field) in self.fields.iter().enumerate() {
            fields.set(n as u32, *field, 0)?;
        }
        kernel.hold(fields);
        let mut links = Vec::new();
        let programs = (names::PROG_COUNT_TRACEPOINT, names::PROG_COUNT_PROBE);
        for (n, event) in self.events.iter().enumerate() {
            links.extend(open_traced(kernel, event, programs, n as u64, context)?);
        }
        Ok(Attached {
            source: Box::new(ValueSource {
                events: self.events.len(),
                counts: take_map(&mut kernel.ebpf, names::VALUE_COUNTS)?,
                lost: PerCpuArray::try_from(take_map(&mut kernel.ebpf, names::VALUE_COUNTS_LOST)?)?,
                links,
            }),
            doing: None,
            note: None,
        })
    }
}

/// Each counted event's hits per value, at the end.
#[derive(Clone, Debug, Default)]
pub struct ValueBatch {
    /// By the event's place in the run: each value (or range) with its hits, in order.
    pub values: Vec<BTreeMap<u64, u64>>,
    /// By the event's place: hits of values the full hash had no room for.
    pub lost: Vec<u64>,
}

struct ValueSource {
    events: usize,
    counts: Map,
    lost: PerCpuArray<MapData, u64>,
    /// Each event's (link, perf event): dropped (detached) when collection stops.
    links: Vec<(OwnedFd, OwnedFd)>,
}

impl Source for ValueSource {
    fn stopping(&mut self) {
        self.links.clear();
    }

    fn finish(&mut self, _stopped_ns: u64, _procs: &mut Processes) -> anyhow::Result<Option<Batch>> {
        let counts = PerCpuHashMap::<&MapData, ValueKey, u64>::try_from(&self.counts)?;
        let mut batch = ValueBatch {
            values: vec![BTreeMap::new(); self.events],
            lost: (0..self.events as u32)
                .map(|n| self.lost.get(&n, 0).map_or(0, |v| v.iter().sum()))
                .collect(),
        };
        for (key, per_cpu) in counts.iter().filter_map(Result::ok) {
            if let Some(values) = batch.values.get_mut(key.event as usize) {
                *values.entry(key.value).or_default() += per_cpu.iter().sum::<u64>();
            }
        }
        Ok(Some(Batch::Values(batch)))
    }
}
