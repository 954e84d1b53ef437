//! The system-call summary (`bpfprof trace -s`): every call of the target threads, timed from
//! the kernel's raw `sys_enter` to its `sys_exit` and summed in the kernel per (thread, call,
//! errno), so nothing crosses to user space per call. Read once, at the end (the programs
//! detached first): each sum, and the calls threads were still in when collection stopped.
use aya::{
    maps::{HashMap as BpfHashMap, Map, MapData},
    programs::raw_trace_point::RawTracePointLink,
};
use profiler_common::{
    names,
    syscalls::{SyscallEntry, SyscallKey, SyscallTotals},
};

use super::{AttachContext, Attached, Batch, Source};
use crate::{
    bpf::{LoadOptions, Loaded},
    collect::take_map,
    process::Processes,
};

/// The summary needs nothing decided beforehand but its maps.
pub struct Spec;

impl Spec {
    pub fn needs(&self, options: &mut LoadOptions<'_>) {
        options.use_maps([&names::SYSCALL_THREADS, &names::SYSCALL_TOTALS]);
    }

    pub fn attach(self, kernel: &mut Loaded, _context: &AttachContext<'_>) -> anyhow::Result<Attached> {
        let links = vec![
            kernel.raw_tracepoint_link(names::PROG_SYSCALL_ENTER, "sys_enter")?,
            kernel.raw_tracepoint_link(names::PROG_SYSCALL_EXIT, "sys_exit")?,
        ];
        Ok(Attached {
            source: Box::new(SyscallSource {
                threads: take_map(&mut kernel.ebpf, names::SYSCALL_THREADS)?,
                totals: take_map(&mut kernel.ebpf, names::SYSCALL_TOTALS)?,
                links,
            }),
            doing: Some("timing every system call".into()),
            note: None,
        })
    }
}

/// What the kernel summed, as it stood at the stop.
#[derive(Clone, Debug, Default)]
pub struct SyscallBatch {
    /// Per (thread, call, errno): its calls, their time, the thread's name.
    pub totals: Vec<(SyscallKey, SyscallTotals)>,
    /// (process, thread, call) of each call a thread was still in at the stop.
    pub in_progress: Vec<(u32, u32, u32)>,
}

struct SyscallSource {
    threads: Map,
    totals: Map,
    /// The programs' attachments, dropped (detached) when collection stops: the sums and the
    /// calls in progress are then read as they stood at that moment.
    links: Vec<RawTracePointLink>,
}

impl Source for SyscallSource {
    fn stopping(&mut self) {
        self.links.clear();
    }

    fn finish(&mut self, _stopped_ns: u64, _procs: &mut Processes) -> anyhow::Result<Option<Batch>> {
        let totals = BpfHashMap::<&MapData, SyscallKey, SyscallTotals>::try_from(&self.totals)?;
        let threads = BpfHashMap::<&MapData, u32, SyscallEntry>::try_from(&self.threads)?;
        Ok(Some(Batch::Syscalls(SyscallBatch {
            totals: totals.iter().filter_map(Result::ok).collect(),
            in_progress: threads
                .iter()
                .filter_map(Result::ok)
                .filter(|(_, entry)| entry.entered_ns != 0)
                .map(|(tid, entry)| (entry.tgid, tid, entry.nr))
                .collect(),
        })))
    }
}
