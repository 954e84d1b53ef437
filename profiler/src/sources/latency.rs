//! Latency between two events (`bpfprof latency --from A --to B`): a program at each side's hits
//! (a tracepoint's or a probe's type, see `hooks`) notes each start under its key and takes each
//! end's time since into a per-CPU histogram; nothing crosses to user space per hit. Read once,
//! at the end (the programs detached first), with the starts still waiting for their end.
use std::os::fd::OwnedFd;

use aya::maps::{HashMap as BpfHashMap, Map, MapData, PerCpuArray};
use profiler_common::{
    latency::{slot, LatencyKey, LatencyKeys, FROM, TO},
    names, HIST_BUCKETS,
};

use super::{hooks::open_traced, AttachContext, Attached, Batch, Source};
use crate::{
    bpf::{LoadOptions, Loaded},
    collect::take_map,
    counters::language::Event,
    process::Processes,
};

/// The two events, and each one's key (decided by the plan from their tracefs formats).
#[derive(Clone, Debug)]
pub struct Spec {
    pub from: Event,
    pub to: Event,
    pub keys: LatencyKeys,
    /// How the key reads (`thread`, `dev,sector`).
    pub key: String,
    /// `--filter`: which starts are timed, as written and as the kernel judges it.
    pub filter: Option<(String, Vec<profiler_common::FilterTerm>)>,
}

impl Spec {
    pub fn needs(&self, options: &mut LoadOptions<'_>) {
        options.use_maps([&names::LATENCY_STARTS, &names::LATENCY_HIST]);
        options.latency_keys = self.keys;
    }

    pub fn attach(self, kernel: &mut Loaded, context: &AttachContext<'_>) -> anyhow::Result<Attached> {
        if let Some((_, terms)) = &self.filter {
            // The start's side is the filter table's event 0 (`FROM`).
            super::hooks::set_filters(kernel, std::slice::from_ref(terms))?;
        }
        let mut links = Vec::new();
        let programs = (names::PROG_LATENCY_TRACEPOINT, names::PROG_LATENCY_PROBE);
        for (side, event) in [(FROM, &self.from), (TO, &self.to)] {
            links.extend(open_traced(kernel, event, programs, side, context)?);
        }
        Ok(Attached {
            doing: Some(format!(
                "timing {}{} to {} by {}",
                self.from.spelled(),
                (self.filter.as_ref()).map_or(String::new(), |(text, _)| format!(" where {text}")),
                self.to.spelled(),
                self.key
            )),
            source: Box::new(LatencySource {
                starts: take_map(&mut kernel.ebpf, names::LATENCY_STARTS)?,
                hist: PerCpuArray::try_from(take_map(&mut kernel.ebpf, names::LATENCY_HIST)?)?,
                links,
            }),
            note: None,
        })
    }
}

/// What the kernel summed, at the end.
#[derive(Clone, Debug, Default)]
pub struct LatencyBatch {
    /// Per bucket of `profiler_common::hist_bucket`, how many latencies.
    pub hist: Vec<u64>,
    pub sum_ns: u64,
    pub max_ns: u64,
    /// Ends with no start of their key.
    pub unmatched: u64,
    /// Starts that replaced an unended start of their key.
    pub replaced: u64,
    /// Starts with no end yet.
    pub pending: u64,
}

struct LatencySource {
    starts: Map,
    hist: PerCpuArray<MapData, u64>,
    /// Each side's (link, perf event), dropped (detached) when collection stops: the histogram
    /// and the starts are then read as they stood at that moment.
    links: Vec<(OwnedFd, OwnedFd)>,
}

impl LatencySource {
    /// One slot, summed over the CPUs (the largest of them for `MAX`).
    fn read(&self, at: u32) -> u64 {
        let values = self
            .hist
            .get(&at, 0)
            .map(|v| v.iter().copied().collect::<Vec<u64>>());
        let values = values.unwrap_or_default().into_iter();
        match at {
            slot::MAX => values.max().unwrap_or(0),
            _ => values.sum(),
        }
    }
}

impl Source for LatencySource {
    fn stopping(&mut self) {
        self.links.clear();
    }

    fn finish(&mut self, _stopped_ns: u64, _procs: &mut Processes) -> anyhow::Result<Option<Batch>> {
        let starts = BpfHashMap::<&MapData, LatencyKey, u64>::try_from(&self.starts)?;
        Ok(Some(Batch::Latency(LatencyBatch {
            hist: (0..HIST_BUCKETS as u32).map(|b| self.read(b)).collect(),
            sum_ns: self.read(slot::SUM),
            max_ns: self.read(slot::MAX),
            unmatched: self.read(slot::UNMATCHED),
            replaced: self.read(slot::REPLACED),
            pending: starts.keys().filter_map(Result::ok).count() as u64,
        })))
    }
}
