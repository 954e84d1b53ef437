//! Each sampled hit of tracing events, whole (`bpfprof record`): a program at each event's hits
//! (a tracepoint's or a probe's type, see `hooks`) counts the targets' hits in `HITS` and puts
//! every Nth in the `RECORDS` ring, a tracepoint's record copied, a probe's fetches read
//! (`RECORD_FETCHES`). Drained at every drain; at the end, each event's hits and the records a
//! full ring dropped.
use std::os::fd::OwnedFd;

use aya::maps::{Array, MapData, PerCpuArray, RingBuf};
use profiler_common::{
    hit_cookie, names,
    records::{Fetch, HitRecord, StackedRecord, MAX_FETCHES},
    MAX_PROBE_SITES,
};

use super::{hooks::open_traced, AttachContext, Attached, Batch, Source, Wants};
use crate::{
    bpf::{LoadOptions, Loaded},
    collect::{take_map, Flip},
    counters::{fetch::Fetched, language::Event},
    process::Processes,
    profile::StackRead,
};

/// The events, every how many hits each is recorded, and what each probe fetches.
#[derive(Clone, Debug)]
pub struct Spec {
    pub events: Vec<Event>,
    pub period: u64,
    /// Per event (none for a tracepoint).
    pub fetches: Vec<Vec<Fetched>>,
    /// Each hit with its user and kernel stacks (`-g`).
    pub stacks: bool,
    /// Per event, what its hits must pass (`--filter`; none: every hit).
    pub filters: Vec<crate::counters::filter::SiteTerms>,
}

impl Spec {
    pub fn needs(&self, options: &mut LoadOptions<'_>) {
        options.use_maps([&names::RECORDS]);
        options.record_stacks = u32::from(self.stacks);
        if self.stacks && options.unwind_tables {
            options.use_maps(&names::UNWIND_TABLES);
        }
    }

    pub fn attach(self, kernel: &mut Loaded, context: &AttachContext<'_>) -> anyhow::Result<Attached> {
        let mut table: Array<MapData, Fetch> =
            Array::try_from(take_map(&mut kernel.ebpf, names::RECORD_FETCHES)?)?;
        for (event, fetches) in self.fetches.iter().enumerate() {
            for (n, fetched) in fetches.iter().enumerate() {
                for (site, fetch) in fetched.fetches.iter().enumerate() {
                    let slot = event * MAX_PROBE_SITES + site;
                    table.set((slot * MAX_FETCHES + n) as u32, fetch, 0)?;
                }
            }
        }
        kernel.hold(table);
        super::hooks::set_filters(kernel, &self.filters)?;
        if self.stacks && context.unwind_tables {
            for event in &self.events {
                super::hooks::Hook::of(event).load_walker(kernel)?;
            }
        }
        let mut links = Vec::new();
        let programs = (names::PROG_RECORD_TRACEPOINT, names::PROG_RECORD_PROBE);
        for (index, event) in self.events.iter().enumerate() {
            let cookie = hit_cookie(index as u16, self.period);
            links.extend(open_traced(kernel, event, programs, cookie, context)?);
        }
        let every = match self.period {
            1 => "every hit".to_string(),
            n => format!("every {n} hits"),
        };
        Ok(Attached {
            doing: Some(format!(
                "recording {every} of {}",
                Event::spelled_list(&self.events, ",")
            )),
            source: Box::new(RecordSource {
                ring: RingBuf::try_from(take_map(&mut kernel.ebpf, names::RECORDS)?)?,
                lost: PerCpuArray::try_from(take_map(&mut kernel.ebpf, names::RECORDS_LOST)?)?,
                hits: Array::try_from(take_map(&mut kernel.ebpf, names::HITS)?)?,
                events: self.events.len(),
                links,
            }),
            note: None,
        })
    }
}

/// The records since the last drain; at the end, the run's totals too.
#[derive(Clone, Debug, Default)]
pub struct RecordBatch {
    pub records: Vec<Recorded>,
    pub totals: Option<RecordTotals>,
}

/// One hit as the kernel wrote it, and its stacks (leaf first) where they were asked for.
#[derive(Clone, Debug)]
pub struct Recorded {
    pub hit: HitRecord,
    pub stacks: Option<Stacks>,
}

/// A hit's user and kernel stacks, and which image of its process the user stack is of.
#[derive(Clone, Debug)]
pub struct Stacks {
    pub user: StackRead,
    pub kernel: StackRead,
    pub exec_generation: u32,
}

/// Each event's hits by the targets, and the records the full ring had no room for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecordTotals {
    pub hits: Vec<u64>,
    pub lost: u64,
}

struct RecordSource {
    ring: RingBuf<MapData>,
    lost: PerCpuArray<MapData, u64>,
    hits: Array<MapData, u64>,
    events: usize,
    /// Each event's (link, perf event), dropped (detached) when collection stops.
    links: Vec<(OwnedFd, OwnedFd)>,
}

impl RecordSource {
    /// Everything in the ring now.
    fn read(&mut self) -> Vec<Recorded> {
        let mut records = Vec::new();
        while let Some(item) = self.ring.next() {
            // SAFETY: the kernel wrote a whole `StackedRecord` or `HitRecord` (checked long
            // enough); read unaligned, as the ring promises only 8-byte alignment.
            if item.len() >= std::mem::size_of::<StackedRecord>() {
                let stacked = unsafe { std::ptr::read_unaligned(item.as_ptr() as *const StackedRecord) };
                records.push(Recorded {
                    hit: stacked.hit,
                    stacks: Some(Stacks {
                        user: stack_read(stacked.user_bytes, &stacked.user),
                        kernel: stack_read(stacked.kernel_bytes, &stacked.kernel),
                        exec_generation: stacked.exec_generation,
                    }),
                });
            } else if item.len() >= std::mem::size_of::<HitRecord>() {
                records.push(Recorded {
                    hit: unsafe { std::ptr::read_unaligned(item.as_ptr() as *const HitRecord) },
                    stacks: None,
                });
            }
        }
        records
    }

    /// A per-CPU slot, summed.
    fn sum(array: &PerCpuArray<MapData, u64>, at: u32) -> u64 {
        array.get(&at, 0).map_or(0, |values| values.iter().sum())
    }
}

impl Source for RecordSource {
    fn drain(&mut self, _flip: Flip, _wants: Wants, _procs: &mut Processes) -> anyhow::Result<Option<Batch>> {
        Ok(Some(Batch::Records(RecordBatch {
            records: self.read(),
            totals: None,
        })))
    }

    fn stopping(&mut self) {
        self.links.clear();
    }

    fn finish(&mut self, _stopped_ns: u64, _procs: &mut Processes) -> anyhow::Result<Option<Batch>> {
        Ok(Some(Batch::Records(RecordBatch {
            records: self.read(),
            totals: Some(RecordTotals {
                hits: (0..self.events as u32)
                    .map(|e| self.hits.get(&e, 0).unwrap_or(0))
                    .collect(),
                lost: Self::sum(&self.lost, 0),
            }),
        })))
    }
}

/// What `bpf_get_stack` (or a table walk) wrote: `bytes` of frames (none: no such stack, a kernel thread's user
/// side or a hit in user code's kernel side), or its error.
pub(super) fn stack_read(bytes: i32, frames: &[u64]) -> StackRead {
    match bytes {
        0 => StackRead::Absent,
        n if n < 0 => StackRead::Error(n),
        n => StackRead::Frames(frames[..(n as usize / 8).min(frames.len())].to_vec()),
    }
}
