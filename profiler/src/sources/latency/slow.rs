//! `latency --duration-min`: the intervals at least that long, read from their ring at every
//! drain with their starts' stacks (ids in the stack maps, which are never cleared during a
//! run), each placed in its process's files then, so its frames can be named at the end.
use aya::maps::{HashMap as BpfHashMap, MapData, RingBuf, StackTraceMap};
use profiler_common::{latency::SlowInterval, names, unwind::UserStack};

use crate::{
    bpf::Loaded,
    collect::{monotonic_ns, next_record, read_stack, read_unwound, take_map},
    process::Processes,
    profile::StackKey,
    record::stacks::PlacedStacks,
    sources::records::Stacks,
};

/// Intervals kept for the report; past this they are counted, not listed.
pub const MAX_SLOW_INTERVALS: usize = 10_000;

/// The run's slow intervals, in the order they ended (on each CPU).
#[derive(Clone, Debug, Default)]
pub struct SlowIntervals {
    /// When collection began (`CLOCK_MONOTONIC`, as the kernel's times).
    pub started_ns: u64,
    pub intervals: Vec<SlowIntervalRead>,
    /// Intervals past `MAX_SLOW_INTERVALS`, not kept.
    pub not_kept: u64,
    /// Their starts' stacks, placed in their processes' files as they came.
    pub stacks: PlacedStacks,
}

/// One slow interval, and the stacks of its start (its place in `SlowIntervals::stacks`).
#[derive(Clone, Debug)]
pub struct SlowIntervalRead {
    pub interval: SlowInterval,
    pub stack: StackKey,
}

pub(super) struct SlowReader {
    ring: RingBuf<MapData>,
    stacks: StackTraceMap<MapData>,
    user_stacks: BpfHashMap<MapData, u32, UserStack>,
    pub intervals: SlowIntervals,
}

impl SlowReader {
    pub fn take(kernel: &mut Loaded) -> anyhow::Result<Self> {
        Ok(SlowReader {
            ring: RingBuf::try_from(take_map(&mut kernel.ebpf, names::LATENCY_SLOW)?)?,
            stacks: StackTraceMap::try_from(take_map(&mut kernel.ebpf, names::LATENCY_STACKS)?)?,
            user_stacks: BpfHashMap::try_from(take_map(&mut kernel.ebpf, names::LATENCY_USER_STACKS)?)?,
            intervals: SlowIntervals {
                started_ns: monotonic_ns(),
                ..SlowIntervals::default()
            },
        })
    }

    /// The intervals in the ring now.
    pub fn read(&mut self, procs: &mut Processes) {
        while let Some(interval) = next_record::<SlowInterval>(&mut self.ring) {
            if self.intervals.intervals.len() >= MAX_SLOW_INTERVALS {
                self.intervals.not_kept += 1;
                continue;
            }
            let start = &interval.start;
            let user = match start.user_tables {
                0 => read_stack(&self.stacks, start.user_stack),
                _ => read_unwound(&self.user_stacks, start.user_stack),
            };
            let stacks = Stacks {
                user,
                kernel: read_stack(&self.stacks, start.kernel_stack),
                exec_generation: start.exec_generation,
            };
            let stack = self.intervals.stacks.place(start.tgid, &stacks, procs);
            self.intervals
                .intervals
                .push(SlowIntervalRead { interval, stack });
        }
    }
}
