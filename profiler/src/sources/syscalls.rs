//! The system-call summary (`bpfprof trace -s`): every call of the target threads, timed from
//! the kernel's raw `sys_enter` to its `sys_exit` and summed in the kernel per (thread, call,
//! errno), so nothing crosses to user space per call. Read once, at the end (the programs
//! detached first): each sum, and the calls threads were still in when collection stopped.
//!
//! With `--duration-min`, each call at least that long comes through the `SLOW_CALLS` ring with
//! its arguments, result and user stack; read at every drain, its process's memory map read
//! then too, so its frames can still be named once the process is gone.
use aya::{
    maps::{HashMap as BpfHashMap, Map, MapData, RingBuf},
    programs::{raw_trace_point::RawTracePointLink, RawTracePoint},
};
use profiler_common::{
    names,
    syscalls::{SlowCall, SlowCallHeader, SyscallEntry, SyscallKey, SyscallTotals},
};

use super::{
    records::{stack_read, Stacks},
    AttachContext, Attached, Batch, Source, Wants,
};
use crate::{
    bpf::{LoadOptions, Loaded},
    collect::{monotonic_ns, next_record, take_map, Flip},
    process::Processes,
    profile::{StackKey, StackRead},
    record::stacks::PlacedStacks,
};

/// Slow calls kept for the report; past this they are counted, not listed.
pub const MAX_SLOW_CALLS: usize = 10_000;

/// Which calls are also sent one by one: those at least `slow_ns` long (none: only the summary).
#[derive(Clone, Debug, Default)]
pub struct Spec {
    pub slow_ns: Option<u64>,
}

impl Spec {
    pub fn needs(&self, options: &mut LoadOptions<'_>) {
        options.use_maps([&names::SYSCALL_THREADS, &names::SYSCALL_TOTALS]);
        if let Some(ns) = self.slow_ns {
            options.use_maps([&names::SLOW_CALLS]);
            options.slow_call_ns = ns;
            if options.unwind_tables {
                options.use_maps(&names::UNWIND_TABLES);
            }
        }
    }

    pub fn attach(self, kernel: &mut Loaded, _context: &AttachContext<'_>) -> anyhow::Result<Attached> {
        let slow = match self.slow_ns {
            Some(_) => {
                // The walker of a slow call's stack: through tables where the process has them,
                // by frame pointers where it has none.
                let walker: &mut RawTracePoint = kernel.program(names::PROG_UNWIND_SYSCALL)?;
                walker.load()?;
                kernel.install_walker(names::PROG_UNWIND_SYSCALL, names::SYSCALL_UNWIND_PROGRAMS)?;
                Some(RingBuf::try_from(take_map(&mut kernel.ebpf, names::SLOW_CALLS)?)?)
            }
            None => None,
        };
        let links = vec![
            kernel.raw_tracepoint_link(names::PROG_SYSCALL_ENTER, "sys_enter")?,
            kernel.raw_tracepoint_link(names::PROG_SYSCALL_EXIT, "sys_exit")?,
        ];
        Ok(Attached {
            source: Box::new(SyscallSource {
                threads: take_map(&mut kernel.ebpf, names::SYSCALL_THREADS)?,
                totals: take_map(&mut kernel.ebpf, names::SYSCALL_TOTALS)?,
                links,
                slow,
                calls: SlowCalls {
                    started_ns: monotonic_ns(),
                    ..SlowCalls::default()
                },
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
    /// `--duration-min`: the calls at least that long.
    pub slow: SlowCalls,
}

/// The slow calls of the run, in the order they ended (on each CPU).
#[derive(Clone, Debug, Default)]
pub struct SlowCalls {
    /// When collection began (`CLOCK_MONOTONIC`, as the kernel's times).
    pub started_ns: u64,
    pub calls: Vec<SlowCallRead>,
    /// Calls past `MAX_SLOW_CALLS`, not kept.
    pub not_kept: u64,
    /// Their stacks, placed in their processes' files as they came.
    pub stacks: PlacedStacks,
}

/// One slow call and the user stack it was made from.
#[derive(Clone, Debug)]
pub struct SlowCallRead {
    pub call: SlowCallHeader,
    /// Its place in `SlowCalls::stacks`.
    pub stack: StackKey,
    /// How the stack's walk ended (`unwind::stop`), and whether it went through tables.
    pub stop: u32,
    pub tables: bool,
}

struct SyscallSource {
    threads: Map,
    totals: Map,
    /// The programs' attachments, dropped (detached) when collection stops: the sums and the
    /// calls in progress are then read as they stood at that moment.
    links: Vec<RawTracePointLink>,
    slow: Option<RingBuf<MapData>>,
    calls: SlowCalls,
}

impl SyscallSource {
    /// The slow calls in the ring now, each process's map read while it is alive.
    fn read_slow(&mut self, procs: &mut Processes) {
        let Some(ring) = &mut self.slow else {
            return;
        };
        while let Some(slow) = next_record::<SlowCall>(ring) {
            if self.calls.calls.len() >= MAX_SLOW_CALLS {
                self.calls.not_kept += 1;
                continue;
            }
            let stacks = Stacks {
                user: stack_read(slow.user_bytes, &slow.user),
                kernel: StackRead::Absent,
                exec_generation: slow.exec_generation,
            };
            self.calls.calls.push(SlowCallRead {
                call: slow.call,
                stack: self.calls.stacks.place(slow.call.tgid, &stacks, procs),
                stop: slow.stop,
                tables: slow.tables != 0,
            });
        }
    }
}

impl Source for SyscallSource {
    fn drain(&mut self, _flip: Flip, _wants: Wants, procs: &mut Processes) -> anyhow::Result<Option<Batch>> {
        self.read_slow(procs);
        Ok(None)
    }

    fn stopping(&mut self) {
        self.links.clear();
    }

    fn finish(&mut self, _stopped_ns: u64, procs: &mut Processes) -> anyhow::Result<Option<Batch>> {
        self.read_slow(procs);
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
            slow: std::mem::take(&mut self.calls),
        })))
    }
}
