//! Latency between two events (`bpfprof latency --from A --to B`): a program at each side's hits
//! (a tracepoint's or a probe's type, see `hooks`) notes each start under its key and takes each
//! end's time since into a per-CPU histogram; nothing crosses to user space per hit. The
//! histogram is read at each drain, for the heatmap's column of the latencies that ended since
//! (coarser rows: `HEAT_BUCKETS`), and at the end (the programs detached first) whole, with the
//! starts still waiting for their end.
//!
//! With `--duration-min`, the intervals at least that long come through the `LATENCY_SLOW` ring
//! with their starts' stacks, read at every drain (`SlowReader`).
use std::os::fd::OwnedFd;

use aya::maps::{HashMap as BpfHashMap, Map, MapData, PerCpuArray};
use profiler_common::{
    latency::{slot, LatencyKey, LatencyKeys, LatencyStart, FROM, TO},
    names, HEAT_BUCKETS, HIST_BUCKETS,
};

use super::{hooks::open_traced, AttachContext, Attached, Batch, Source, Wants};
use crate::{
    bpf::{LoadOptions, Loaded},
    collect::{take_map, Flip},
    counters::language::Event,
    process::Processes,
};

mod slow;
pub use slow::{SlowIntervalRead, SlowIntervals};

/// The two events, and each one's key (decided by the plan from their tracefs formats).
#[derive(Clone, Debug)]
pub struct Spec {
    pub from: Event,
    pub to: Event,
    pub keys: LatencyKeys,
    /// How the key reads (`thread`, `dev,sector`).
    pub key: String,
    /// `--filter`: which starts are timed, as written and as the kernel judges it.
    pub filter: Option<(String, crate::counters::filter::SiteTerms)>,
    /// A heatmap is drawn: the histogram is read at each drain too, for its columns.
    pub heatmap: bool,
    /// `--duration-min`: intervals at least this long are listed with their starts' stacks.
    pub slow_ns: Option<u64>,
}

impl Spec {
    pub fn needs(&self, options: &mut LoadOptions<'_>) {
        options.use_maps([&names::LATENCY_STARTS, &names::LATENCY_HIST]);
        options.latency_keys = self.keys;
        if let Some(ns) = self.slow_ns {
            options.use_maps([
                &names::LATENCY_SLOW,
                &names::LATENCY_STACKS,
                &names::LATENCY_USER_STACKS,
            ]);
            options.latency_slow_ns = ns;
            if options.unwind_tables {
                options.use_maps(&names::UNWIND_TABLES);
            }
        }
    }

    pub fn attach(self, kernel: &mut Loaded, context: &AttachContext<'_>) -> anyhow::Result<Attached> {
        if let Some((_, terms)) = &self.filter {
            // The start's side is the filter table's event 0 (`FROM`).
            super::hooks::set_filters(kernel, std::slice::from_ref(terms))?;
        }
        if self.slow_ns.is_some() && context.unwind_tables {
            // The start's walker (the one each side's hook has, for its program type).
            super::hooks::Hook::of(&self.from).load_walker(kernel)?;
        }
        let slow = match self.slow_ns {
            Some(_) => Some(slow::SlowReader::take(kernel)?),
            None => None,
        };
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
                heatmap: self.heatmap,
                drained: Vec::new(),
                columns: Vec::new(),
                stopped: false,
                last_begun: false,
                slow,
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
    /// One per drain (`DRAIN_EVERY`), and the last, shorter one: per heatmap row (a
    /// `HEAT_BUCKETS` bucket, eight of the histogram's), the latencies that ended in it.
    pub columns: Vec<Vec<u64>>,
    /// `--duration-min`: the intervals at least that long.
    pub slow: SlowIntervals,
}

struct LatencySource {
    starts: Map,
    hist: PerCpuArray<MapData, u64>,
    /// Each side's (link, perf event), dropped (detached) when collection stops: the histogram
    /// and the starts are then read as they stood at that moment.
    links: Vec<(OwnedFd, OwnedFd)>,
    /// Whether each drain reads the histogram (for the heatmap: else only the end does).
    heatmap: bool,
    /// The histogram at the last drain, and a heatmap column per drain since the start.
    drained: Vec<u64>,
    columns: Vec<Vec<u64>>,
    /// Collection stopped (`stopping`): the drains and the read that follow add to one last
    /// column, begun by the first of them.
    stopped: bool,
    last_begun: bool,
    slow: Option<slow::SlowReader>,
}

impl LatencySource {
    /// One slot, summed over the CPUs (the largest of them for `MAX`); none where it could not be
    /// read.
    fn try_read(&self, at: u32) -> Option<u64> {
        let values = self.hist.get(&at, 0).ok()?;
        let values = values.iter().copied();
        Some(match at {
            slot::MAX => values.max().unwrap_or(0),
            _ => values.sum(),
        })
    }

    fn read(&self, at: u32) -> u64 {
        self.try_read(at).unwrap_or(0)
    }

    /// The histogram now (a bucket that could not be read as it was), and into the heatmap what
    /// it gained since the last drain: a new column, or after the stop the last one.
    fn column(&mut self) -> Vec<u64> {
        let then = |b: usize| self.drained.get(b).copied().unwrap_or(0);
        let now: Vec<u64> = (0..HIST_BUCKETS)
            .map(|b| self.try_read(b as u32).unwrap_or(then(b)))
            .collect();
        let mut column = vec![0; HEAT_BUCKETS];
        for (b, &n) in now.iter().enumerate() {
            column[(b / 8).min(HEAT_BUCKETS - 1)] += n.saturating_sub(then(b));
        }
        match (self.last_begun, self.columns.last_mut()) {
            (true, Some(last)) => last.iter_mut().zip(column).for_each(|(cell, n)| *cell += n),
            _ => {
                self.columns.push(column);
                self.last_begun = self.stopped;
            }
        }
        self.drained.clone_from(&now);
        now
    }
}

impl Source for LatencySource {
    fn drain(&mut self, _flip: Flip, _wants: Wants, procs: &mut Processes) -> anyhow::Result<Option<Batch>> {
        if self.heatmap {
            self.column();
        }
        if let Some(slow) = &mut self.slow {
            slow.read(procs);
        }
        Ok(None)
    }

    fn stopping(&mut self) {
        self.links.clear();
        self.stopped = true;
    }

    fn finish(&mut self, _stopped_ns: u64, procs: &mut Processes) -> anyhow::Result<Option<Batch>> {
        let hist = self.column();
        let slow = match &mut self.slow {
            Some(reader) => {
                reader.read(procs);
                std::mem::take(&mut reader.intervals)
            }
            None => SlowIntervals::default(),
        };
        let starts = BpfHashMap::<&MapData, LatencyKey, LatencyStart>::try_from(&self.starts)?;
        Ok(Some(Batch::Latency(LatencyBatch {
            hist,
            sum_ns: self.read(slot::SUM),
            max_ns: self.read(slot::MAX),
            unmatched: self.read(slot::UNMATCHED),
            replaced: self.read(slot::REPLACED),
            pending: starts.keys().filter_map(Result::ok).count() as u64,
            columns: std::mem::take(&mut self.columns),
            slow,
        })))
    }
}
