//! CPU samples: the sampling program on a perf event of every CPU (any event perf's language
//! names, at a frequency or every N events) records each sample's stacks into the epoch's slot,
//! with the deltas of the counters it reads at each sample (`--counter`, topdown per function);
//! drained at each flip.
use std::os::fd::{AsFd as _, AsRawFd as _, OwnedFd, RawFd};

use anyhow::Context as _;
use aya::{
    maps::{Array, HashMap as BpfHashMap, MapData, StackTraceMap},
    Ebpf,
};
use profiler_common::{
    names, unwind::UserStack, BuildIdKey, BuildIdStack, CounterDeltas, SampleKey, SampleValue,
};

use super::{
    hooks::{open_at_hits, Hook},
    AttachContext, Attached, Batch, Source, Wants,
};
use crate::{
    bpf::{map_update, LoadOptions, Loaded},
    collect::{clear_stacks, comm_string, object_offsets, read_stack, read_unwound, take_map, Flip},
    counters::{
        counting::{Counting, CountingError, Scope},
        language::Event,
        pmu::Attr,
    },
    error::UserError,
    map_ops::take_all,
    process::Processes,
    profile::RawSample,
};

/// How often a sample is taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rate {
    /// This many times a second per CPU (for the CPU and task clocks, every 1/HZ s of it).
    Frequency(u64),
    /// Every this many occurrences of the event (perf's -c).
    Period(u64),
}

/// As reports say it: `at 99 Hz`, `every event`, `every 1000 events`.
impl std::fmt::Display for Rate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Rate::Frequency(hz) => write!(f, "at {hz} Hz"),
            Rate::Period(1) => write!(f, "every event"),
            Rate::Period(n) => write!(f, "every {n} events"),
        }
    }
}

/// What is sampled, and what is read at each sample.
pub struct Spec {
    /// The sampling events (each sample says which took it: its place here).
    pub events: Vec<Event>,
    pub rate: Rate,
    /// Counters whose deltas each sample carries, opened as one group per CPU when `group`.
    pub counters: Vec<Event>,
    pub group: bool,
    /// What a tracing event's sample counts (`--weight`; none: one).
    pub weight: Option<Weighed>,
    /// Per event, what its hits must pass (`--filter`; none: every hit).
    pub filters: Vec<crate::counters::filter::SiteTerms>,
}

impl Spec {
    pub fn needs(&self, options: &mut LoadOptions<'_>) {
        options.use_maps(names::SAMPLES.iter().chain(&names::STACKS));
        if self.events.iter().any(Event::is_traced) {
            options.use_maps([&names::HITS]);
        }
        if !self.counters.is_empty() {
            options.use_maps(names::DELTAS.iter().chain([&names::PENDING_DELTAS]));
            options.counters = self.counters.len() as u32;
        }
        if options.unwind_tables {
            options.use_maps(names::USER_STACKS.iter().chain(&names::BUILD_ID_STACKS));
            options.use_maps(&names::UNWIND_TABLES);
        }
    }

    pub fn attach(self, kernel: &mut Loaded, context: &AttachContext<'_>) -> anyhow::Result<Attached> {
        let traced: Vec<(usize, String)> = (self.events.iter().enumerate())
            .filter(|(_, e)| e.is_traced())
            .map(|(index, e)| (index, e.spelled()))
            .collect();
        let maps = SampleMaps::take(&mut kernel.ebpf, !self.counters.is_empty(), !traced.is_empty())?;
        super::hooks::set_filters(kernel, &self.filters)?;
        if let Some(weight) = &self.weight {
            weight.set(kernel)?;
        }
        // The sampler opens before the counters read at each sample: created first, it is
        // scheduled first, so a cycles sampler takes the PMU's dedicated cycle counter where
        // there is one, and the counters share the general-purpose ones.
        let mut links = Vec::new();
        for (index, event) in self.events.iter().enumerate() {
            let hook = Hook::of(event);
            let program = load_sampler(hook, kernel, context.unwind_tables)?;
            links.extend(attach_sampling(
                program,
                (index, event),
                self.rate,
                hook.scope(event, context)?,
            )?);
        }
        if !self.counters.is_empty() {
            open_counters(kernel, &self.counters, self.group)?;
        }
        let rate = self.rate;
        Ok(Attached {
            doing: Some(format!(
                "sampling {} ({})",
                match traced.is_empty() {
                    true => rate.to_string(),
                    false => rate.to_string().replace("event", "hit"),
                },
                Event::spelled_list(&self.events, ", ")
            )),
            source: Box::new(SampleSource {
                links,
                maps,
                traced,
                period: hit_period(rate),
                weight: self.weight.map(|w| w.name),
            }),
            note: None,
        })
    }
}

/// What each sample of a tracing event counts instead of one (`--weight`): a number read at
/// the hit, as `record --fetch` reads it.
#[derive(Clone, Debug)]
pub struct Weighed {
    /// As spelled (`arg1`, `bytes`).
    pub name: String,
    /// Per event, the fetch at each of its sites (one for a tracepoint).
    pub fetches: Vec<Vec<profiler_common::records::Fetch>>,
}

impl Weighed {
    /// Into the kernel's `WEIGHT_FETCHES`, at `event * MAX_PROBE_SITES + site`.
    fn set(&self, kernel: &mut Loaded) -> anyhow::Result<()> {
        let mut table: aya::maps::Array<aya::maps::MapData, profiler_common::records::Fetch> =
            aya::maps::Array::try_from(crate::collect::take_map(&mut kernel.ebpf, names::WEIGHT_FETCHES)?)?;
        for (event, fetches) in self.fetches.iter().enumerate() {
            for (site, fetch) in fetches.iter().enumerate() {
                let slot = event * profiler_common::MAX_PROBE_SITES + site;
                table.set(slot as u32, fetch, 0)?;
            }
        }
        kernel.hold(table);
        Ok(())
    }
}

/// What a weighted sample counts, as the hits note says it.
fn weighed(weight: Option<&str>) -> String {
    match weight {
        None => String::new(),
        Some(name) => format!("; each sample counts {name} (the report's counts are its sums)"),
    }
}

/// How many of a tracing event's hits make one sample.
fn hit_period(rate: Rate) -> u64 {
    match rate {
        Rate::Period(n) => n.max(1),
        Rate::Frequency(_) => 1,
    }
}

/// The sampling program of an event's kind and (its stack walker), each loaded once: the
/// program's fd.
fn load_sampler(hook: Hook, kernel: &mut Loaded, tables: bool) -> anyhow::Result<RawFd> {
    let sampler = match hook {
        Hook::Overflow => names::PROG_SAMPLE,
        Hook::Tracepoint => names::PROG_SAMPLE_TRACEPOINT,
        Hook::Probe => names::PROG_SAMPLE_PROBE,
    };
    if tables {
        hook.load_walker(kernel)?;
    }
    hook.load_once(kernel, sampler)
        .context("loading the sampling program")
}

/// `perf_event_attr.freq`: `sample_period` is a frequency.
const FLAG_FREQ: u64 = 1 << 10;

/// One sampling event per place (`(pid, cpu)`: every online CPU, or each probed process), each
/// running `program_fd` with the event's place in `-e` as the program's cookie (the samples'
/// `event`; a tracing event's also carries its period: `hit_cookie`). Each (link, perf event):
/// dropping them stops the sampling.
fn attach_sampling(
    program_fd: RawFd,
    (index, event): (usize, &Event),
    rate: Rate,
    places: Vec<(i32, i32)>,
) -> anyhow::Result<Vec<(OwnedFd, OwnedFd)>> {
    let (period, freq, cookie) = match rate {
        // A tracing event's program runs at every hit and samples every Nth itself.
        _ if event.is_traced() => (0, 0, profiler_common::hit_cookie(index as u16, hit_period(rate))),
        // The clocks count nanoseconds: a fixed period is exact and needs no warm-up.
        Rate::Frequency(hz) if event.is_clock() => (1_000_000_000 / hz.max(1), 0, index as u64),
        Rate::Frequency(hz) => (hz, FLAG_FREQ, index as u64),
        Rate::Period(n) => (n, 0, index as u64),
    };
    let flags = freq | event.exclude_flags() | event.precise_flags();
    let fill = |attr| Attr {
        sample_period: period,
        flags,
        ..attr
    };
    open_at_hits(program_fd, event, fill, cookie, places)
}

/// Open `events` on every CPU (one group per CPU when `group`) and hand them to the sampling
/// program, which reads them at each sample; they stay open as long as the programs.
fn open_counters(kernel: &mut Loaded, events: &[Event], group: bool) -> anyhow::Result<()> {
    anyhow::ensure!(
        events.len() <= names::COUNTER_READERS.len(),
        "at most {} counters per sample",
        names::COUNTER_READERS.len()
    );
    let counting = Counting::start(events, group, &Scope::Cpus(crate::counters::cpu::online_ids()?))
        .map_err(|e| match e {
            CountingError::Unsupported { event, .. }
                if events.iter().any(|s| s.spelled() == event && s.hardware) =>
            {
                anyhow::Error::from(UserError::NoPmu { event })
            }
            e => e.into(),
        })?;
    for (cpu, fds) in counting.per_cpu() {
        for (slot, fd) in fds.iter().enumerate() {
            let name = names::COUNTER_READERS[slot];
            let map = kernel
                .ebpf
                .map(name)
                .with_context(|| format!("map {name} missing"))?;
            let aya::maps::Map::PerfEventArray(data) = map else {
                anyhow::bail!("map {name} is not a perf event array");
            };
            map_update(data.fd().as_fd(), cpu, fd.as_raw_fd() as u32).with_context(|| {
                format!(
                    "handing the {} counter of CPU {cpu} to BPF",
                    events[slot].spelled()
                )
            })?;
        }
    }
    kernel.hold(counting);
    // The counters are per CPU: a fresh baseline at every context switch keeps each sample's
    // interval to the sampled thread's own time.
    kernel.attach_raw_tracepoint(names::PROG_COUNTER_SWITCH, "sched_switch")
}

/// The kernel maps of the sampling program.
pub struct SampleMaps {
    samples: [BpfHashMap<MapData, SampleKey, SampleValue>; 2],
    stacks: [StackTraceMap<MapData>; 2],
    /// Counter deltas, when the sampling program reads counters.
    deltas: Option<[BpfHashMap<MapData, SampleKey, CounterDeltas>; 2]>,
    /// Table-unwound user stacks (empty unless tables are in use).
    user_stacks: [BpfHashMap<MapData, u32, UserStack>; 2],
    /// Frame-pointer stacks the kernel also resolved by build ID (with tables in use).
    build_ids: [BpfHashMap<MapData, BuildIdKey, BuildIdStack>; 2],
    /// Each tracing event's hits by the targets (when one is sampled).
    hits: Option<Array<MapData, u64>>,
}

impl SampleMaps {
    fn take(ebpf: &mut Ebpf, with_deltas: bool, with_hits: bool) -> anyhow::Result<Self> {
        let mut take = |name: &str| take_map(ebpf, name);
        let mut pair = |names: [&str; 2]| -> anyhow::Result<[aya::maps::Map; 2]> {
            Ok([take(names[0])?, take(names[1])?])
        };
        let [s0, s1] = pair(names::SAMPLES)?;
        let [k0, k1] = pair(names::STACKS)?;
        let [u0, u1] = pair(names::USER_STACKS)?;
        let [b0, b1] = pair(names::BUILD_ID_STACKS)?;
        let deltas = match with_deltas {
            true => {
                let [d0, d1] = pair(names::DELTAS)?;
                Some([BpfHashMap::try_from(d0)?, BpfHashMap::try_from(d1)?])
            }
            false => None,
        };
        let hits = match with_hits {
            true => Some(Array::try_from(take(names::HITS)?)?),
            false => None,
        };
        Ok(Self {
            hits,
            samples: [BpfHashMap::try_from(s0)?, BpfHashMap::try_from(s1)?],
            stacks: [StackTraceMap::try_from(k0)?, StackTraceMap::try_from(k1)?],
            deltas,
            user_stacks: [BpfHashMap::try_from(u0)?, BpfHashMap::try_from(u1)?],
            build_ids: [BpfHashMap::try_from(b0)?, BpfHashMap::try_from(b1)?],
        })
    }

    /// Everything recorded in one epoch slot, which is left empty.
    fn drain_slot(&mut self, slot: usize) -> anyhow::Result<Vec<RawSample>> {
        let mut deltas: std::collections::HashMap<_, _> = match &mut self.deltas {
            Some(maps) => take_all(&maps[slot]).entries.into_iter().collect(),
            None => Default::default(),
        };
        let objects: std::collections::HashMap<_, _> = (take_all(&self.build_ids[slot]).entries.into_iter())
            .map(|(key, stack)| ((key.tgid, key.stack_id), object_offsets(&stack)))
            .collect();
        let taken = take_all(&self.samples[slot]).entries;
        let mut out = Vec::with_capacity(taken.len());
        for (key, value) in taken {
            out.push(RawSample {
                pid: key.tgid,
                tid: key.tid,
                comm: comm_string(&key.comm),
                user: match key.user_unwound {
                    0 => read_stack(&self.stacks[slot], key.user_stack_id),
                    _ => read_unwound(&self.user_stacks[slot], key.user_stack_id),
                },
                kernel: read_stack(&self.stacks[slot], key.kernel_stack_id),
                count: value.count,
                exec_generation: key.exec_generation,
                event: key.event,
                deltas: deltas.remove(&key).unwrap_or_default(),
                user_objects: match (key.user_unwound, u32::try_from(key.user_stack_id)) {
                    (0, Ok(id)) => objects.get(&(key.tgid, id)).cloned().unwrap_or_default(),
                    _ => Vec::new(),
                },
            });
        }
        clear_stacks(&mut self.stacks[slot], &mut self.user_stacks[slot]);
        Ok(out)
    }

    /// Each event's hits by the targets so far (none when no tracing event is sampled).
    fn hits(&self, event: usize) -> Option<u64> {
        self.hits.as_ref()?.get(&(event as u32), 0).ok()
    }
}

/// The sampling source: its maps, and what its notes name.
pub struct SampleSource {
    /// The sampling events: closed at the stop, so that the last drains and the health read
    /// after them see every sample taken and no sample is counted that no report holds.
    links: Vec<(OwnedFd, OwnedFd)>,
    maps: SampleMaps,
    /// The tracing events as spelled, with their place among the run's (their samples' `event`).
    traced: Vec<(usize, String)>,
    /// A tracing event's hits per sample.
    period: u64,
    /// What each sample counts, by name (`--weight`; none: one).
    weight: Option<String>,
}

impl Source for SampleSource {
    fn drain(&mut self, flip: Flip, _wants: Wants, _procs: &mut Processes) -> anyhow::Result<Option<Batch>> {
        Ok(Some(Batch::Samples(self.maps.drain_slot(flip.slot)?)))
    }

    fn stopping(&mut self) {
        self.links.clear();
    }

    /// Each tracing event's hits, counted exactly in the kernel: what the event fired, of which
    /// the report's samples are every Nth.
    fn notes(&self) -> Vec<String> {
        let every = match self.period {
            1 => "each one sampled".to_string(),
            n => format!("1 in {n} sampled"),
        };
        (self.traced.iter())
            .filter_map(|(index, event)| Some((event, self.maps.hits(*index)?)))
            .map(|(event, hits)| {
                format!(
                    "{event}: {hits} hits by the targets, {every}{}",
                    weighed(self.weight.as_deref())
                )
            })
            .collect()
    }
}

/// Recorded batches of samples played back, for tests of everything after collection.
#[cfg(test)]
pub struct Replay {
    batches: std::collections::VecDeque<Vec<RawSample>>,
}

#[cfg(test)]
impl Replay {
    pub fn new(batches: Vec<Vec<RawSample>>) -> Self {
        Replay {
            batches: batches.into(),
        }
    }
}

#[cfg(test)]
impl Source for Replay {
    fn drain(&mut self, _flip: Flip, _wants: Wants, _procs: &mut Processes) -> anyhow::Result<Option<Batch>> {
        Ok(Some(Batch::Samples(self.batches.pop_front().unwrap_or_default())))
    }
}
