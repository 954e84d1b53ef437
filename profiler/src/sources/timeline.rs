//! The scheduler's events one by one (`bpfprof sched record`): programs on the switch,
//! wake-up, migration, fork and exit tracepoints send each through the `SCHED_TIMELINE` ring
//! with the kernel's totals of the tasks it names (see `profiler_common::timeline`). Drained at
//! every drain; at the end, the events a full ring dropped.
use aya::{
    maps::{MapData, PerCpuArray, RingBuf},
    programs::raw_trace_point::RawTracePointLink,
};
use profiler_common::{names, timeline::SchedEvent, TaskOffsets};

use super::{AttachContext, Attached, Batch, Source, Wants};
use crate::{
    bpf::{LoadOptions, Loaded},
    collect::{take_map, Flip},
    error::UserError,
    process::Processes,
};

/// The programs and the tracepoints they are attached to.
const PROGRAMS: [(&str, &str); 6] = [
    (names::PROG_TIMELINE_SWITCH, "sched_switch"),
    (names::PROG_TIMELINE_WAKEUP, "sched_wakeup"),
    (names::PROG_TIMELINE_WAKEUP_NEW, "sched_wakeup_new"),
    (names::PROG_TIMELINE_MIGRATE, "sched_migrate_task"),
    (names::PROG_TIMELINE_FORK, "sched_process_fork"),
    (names::PROG_TIMELINE_EXIT, "sched_process_exit"),
];

/// What the recording needs: where the kernel keeps the fields its programs read.
#[derive(Clone, Debug, Default)]
pub struct Spec {
    pub offsets: Option<TaskOffsets>,
}

impl Spec {
    pub fn prepare(&mut self) -> Result<(), UserError> {
        self.offsets = Some(super::sched::task_offsets()?);
        Ok(())
    }

    pub fn needs(&self, options: &mut LoadOptions<'_>) {
        options.use_maps([&names::SCHED_TIMELINE]);
        options.task_offsets = self.offsets.unwrap_or_default();
    }

    pub fn attach(self, kernel: &mut Loaded, _context: &AttachContext<'_>) -> anyhow::Result<Attached> {
        let mut links = Vec::new();
        for (prog, event) in PROGRAMS {
            links.push(kernel.raw_tracepoint_link(prog, event)?);
        }
        Ok(Attached {
            source: Box::new(TimelineSource {
                ring: RingBuf::try_from(take_map(&mut kernel.ebpf, names::SCHED_TIMELINE)?)?,
                lost: PerCpuArray::try_from(take_map(&mut kernel.ebpf, names::SCHED_TIMELINE_LOST)?)?,
                links,
            }),
            doing: Some(
                "recording every scheduler switch, and the targets' wake-ups, migrations, forks and exits"
                    .into(),
            ),
            note: self
                .offsets
                .is_some_and(|o| !o.kernel_accounting())
                .then(|| super::sched::TRACEPOINT_CLOCKS_NOTE.to_string()),
        })
    }
}

/// The events since the last drain (in the ring's order: by CPU, each CPU's in time order);
/// at the end, the events lost.
#[derive(Clone, Debug, Default)]
pub struct TimelineBatch {
    pub events: Vec<SchedEvent>,
    pub lost: Option<u64>,
}

struct TimelineSource {
    ring: RingBuf<MapData>,
    lost: PerCpuArray<MapData, u64>,
    /// Dropped (detached) when collection stops, so the last drain has everything.
    links: Vec<RawTracePointLink>,
}

impl TimelineSource {
    fn read(&mut self) -> Vec<SchedEvent> {
        let mut events = Vec::new();
        while let Some(item) = self.ring.next() {
            if item.len() >= std::mem::size_of::<SchedEvent>() {
                // SAFETY: the kernel wrote a whole `SchedEvent` (checked long enough); read
                // unaligned, as the ring promises only 8-byte alignment.
                events.push(unsafe { std::ptr::read_unaligned(item.as_ptr() as *const SchedEvent) });
            }
        }
        events
    }
}

impl Source for TimelineSource {
    fn drain(&mut self, _flip: Flip, _wants: Wants, _procs: &mut Processes) -> anyhow::Result<Option<Batch>> {
        Ok(Some(Batch::Timeline(TimelineBatch {
            events: self.read(),
            lost: None,
        })))
    }

    fn stopping(&mut self) {
        self.links.clear();
    }

    fn finish(&mut self, _stopped_ns: u64, _procs: &mut Processes) -> anyhow::Result<Option<Batch>> {
        let lost = self.lost.get(&0, 0).map_or(0, |values| values.iter().sum());
        Ok(Some(Batch::Timeline(TimelineBatch {
            events: self.read(),
            lost: Some(lost),
        })))
    }
}
