//! Lock waits, from one of three places (`--lock-source`):
//! - futex: a contended lock (mutex, rwlock, condition variable, semaphore: glibc builds them
//!   all on futexes) sleeps in `futex(2)`, timed at its syscall tracepoints with who woke it;
//! - pthread: probes on the lock functions (see `probes`) follow every acquisition and release,
//!   so a holder is known exactly and hold times are measured;
//! - kernel: the kernel's contention tracepoints, with kernel stacks and lock types.
//!
//! Each source's records are (lock, stack) → wait time, read by one [`LockReader`].
use std::{collections::HashMap, num::NonZeroU32};

use anyhow::Context as _;
use aya::programs::{
    trace_point::TracePointLink,
    uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeLink, UProbeScope},
    TracePoint, UProbe,
};
use profiler_common::{
    lock::{LockKey, LockTime, ThreadOffsets},
    names,
};
use serde::Serialize;

pub mod probes;
mod reader;

pub use reader::{DrainHealth, LockReader, Reading};

use super::{AttachContext, Attached, Batch, Source, Wants};
use crate::{
    bpf::{LoadOptions, Loaded},
    cli::LockSource,
    collect::Flip,
    process::Processes,
    profile::StackRead,
};
use probes::LockLibrary;

/// Where lock waits are seen, and how their records are read.
pub struct Spec {
    pub source: LockSource,
    pub reading: Reading,
    /// pthread source: each target's library with the lock functions (by `prepare`).
    pub libraries: Vec<(u32, LockLibrary)>,
}

impl Spec {
    pub fn new(source: LockSource, reading: Reading) -> Spec {
        Spec {
            source,
            reading,
            libraries: Vec::new(),
        }
    }

    /// pthread source: which file of each target has its lock functions, known before anything
    /// is loaded (`command`: a command started paused, with the program it runs).
    pub fn prepare(&mut self, pids: &[u32], command: Option<(u32, &std::path::Path)>) -> anyhow::Result<()> {
        if self.source != LockSource::Pthread {
            return Ok(());
        }
        for &pid in pids {
            self.libraries.push((pid, probes::for_process(pid)?));
        }
        if let Some((pid, program)) = command {
            self.libraries.push((pid, probes::for_command(program)?));
        }
        Ok(())
    }

    pub fn needs(&self, options: &mut LoadOptions<'_>) {
        options.use_maps([&names::LOCK_WAITERS]);
        match self.source {
            LockSource::Futex => {
                options.use_maps([
                    &names::LOCK_WAITING,
                    &names::LOCK_WAKES,
                    &names::LOCK_JOINABLE,
                    &names::LOCK_HOLDERS,
                    &names::LOCK_STACKS,
                ]);
                options.thread_offsets = thread_offsets();
                if options.unwind_tables {
                    options.use_maps([&names::LOCK_USER_STACKS]);
                    options.use_maps(&names::UNWIND_TABLES);
                }
            }
            LockSource::Pthread => {
                options.use_maps([
                    &names::LOCK_HOLDERS,
                    &names::LOCK_STATES,
                    &names::LOCK_CALLS,
                    &names::LOCK_USER_STACKS,
                ]);
                if options.unwind_tables {
                    options.use_maps(&names::UNWIND_TABLES);
                }
                if !self.libraries.is_empty() {
                    options.nvcsw_offset = nvcsw_offset().unwrap_or(u32::MAX);
                }
            }
            LockSource::Kernel => options.use_maps([&names::LOCK_KERNEL_WAITING, &names::LOCK_STACKS]),
        }
    }

    pub fn attach(self, kernel: &mut Loaded, context: &AttachContext<'_>) -> anyhow::Result<Attached> {
        let mut reader = LockReader::take(&mut kernel.ebpf, self.reading)?;
        let mut note = None;
        let doing = match self.source {
            LockSource::Futex => {
                reader.hold(attach_futex(kernel, context.unwind_tables)?);
                let pids = match context.system_wide {
                    true => crate::process::all_pids(),
                    false => context.pids.to_vec(),
                };
                let going = reader.enter_waits_in_progress(&pids);
                note = (going > 0).then(|| {
                    format!("futex waits already going at the start: {going}, each counted from it")
                });
                "timing futex waits (contended locks)".to_string()
            }
            LockSource::Kernel => {
                let links = kernel
                    .tracepoint_links(&[
                        (names::PROG_CONTENTION_BEGIN, "lock", "contention_begin"),
                        (names::PROG_CONTENTION_END, "lock", "contention_end"),
                    ])
                    .context("--lock-source kernel needs the lock:contention_begin/end tracepoints (Linux 5.19 or later)")?;
                reader.hold(links);
                "timing kernel lock contention".to_string()
            }
            LockSource::Pthread => {
                reader.hold(attach_pthread(kernel, &self.libraries)?);
                warn_single_stepped(&self.libraries);
                let probed: Vec<&str> = self.libraries.iter().map(|(_, l)| l.display.as_str()).collect();
                format!("probing the pthread lock functions of {}", probed.join(", "))
            }
        };
        Ok(Attached {
            source: Box::new(reader),
            doing: Some(doing),
            note,
        })
    }
}

/// Time targets' futex waits and record who wakes them (the timing programs' attachments
/// handed over).
fn attach_futex(kernel: &mut Loaded, unwind_tables: bool) -> anyhow::Result<Vec<TracePointLink>> {
    if unwind_tables {
        let program: &mut TracePoint = kernel.program(names::PROG_UNWIND_LOCK)?;
        program
            .load()
            .context("loading the lock stack unwinding program")?;
        kernel.install_walker(names::PROG_UNWIND_LOCK, names::LOCK_UNWIND_PROGRAMS)?;
    }
    // Before the waits: a thread's creation records what joining it waits on.
    kernel.attach_raw_tracepoint(names::PROG_THREAD_NEW, "sched_process_fork")?;
    kernel
        .tracepoint_links(&[
            (names::PROG_FUTEX_ENTER, "syscalls", "sys_enter_futex"),
            (names::PROG_FUTEX_EXIT, "syscalls", "sys_exit_futex"),
        ])
        .context("lock mode times futex waits at the syscall tracepoints (the kernel needs CONFIG_FTRACE_SYSCALLS)")
}

/// Probe the pthread lock functions of each target's library, for that process only (the
/// attachments handed over).
fn attach_pthread(kernel: &mut Loaded, libraries: &[(u32, LockLibrary)]) -> anyhow::Result<Vec<UProbeLink>> {
    let mut links = Vec::new();
    let walker: &mut UProbe = kernel.program(names::PROG_UNWIND_PTHREAD)?;
    walker
        .load()
        .context("loading the pthread stack unwinding program")?;
    kernel.install_walker(names::PROG_UNWIND_PTHREAD, names::PTHREAD_UNWIND_PROGRAMS)?;
    for name in [names::PROG_PTHREAD_ENTER, names::PROG_PTHREAD_RETURN] {
        let program: &mut UProbe = kernel.program(name)?;
        program.load().with_context(|| format!("loading {name}"))?;
    }
    for (pid, library) in libraries {
        let scope = UProbeScope::OneProcess(NonZeroU32::new(*pid).context("pid 0 is not a process")?);
        for probe in &library.probes {
            let point = || UProbeAttachPoint {
                location: UProbeAttachLocation::AbsoluteOffset(probe.file_offset),
                cookie: Some(probe.cookie),
            };
            let mut programs = vec![names::PROG_PTHREAD_ENTER];
            if probe.returns {
                programs.push(names::PROG_PTHREAD_RETURN);
            }
            for name in programs {
                let program: &mut UProbe = kernel.program(name)?;
                let link = program.attach(point(), &library.path, scope).with_context(|| {
                    format!(
                        "probing {} in {} (offset {:#x}) for pid {pid}",
                        probe.function, library.display, probe.file_offset
                    )
                })?;
                links.push(program.take_link(link)?);
            }
        }
    }
    Ok(links)
}

/// Functions probed on their first instruction cost a single-step trap per call: said once.
fn warn_single_stepped(libraries: &[(u32, LockLibrary)]) {
    for (_, library) in libraries {
        let slow = library.single_stepped();
        if !slow.is_empty() {
            eprintln!(
                "bpfprof: warning: {} in {} probed on their first instruction (single-stepped by the kernel: several µs per call)",
                slow.join(", "),
                library.display
            );
        }
    }
}

/// Offset of `task_struct.nvcsw` in the running kernel, if its BTF says: the pthread source
/// tells a lock call that slept by it.
fn nvcsw_offset() -> Option<u32> {
    let btf = crate::btf::Btf::from_file(&crate::btf::kernel_btf_path()).ok()?;
    btf.member_offset("task_struct", "nvcsw")
}

/// Where the running kernel keeps the `task_struct` fields the futex source reads at thread
/// creation (to tell a join). Without them (no BTF, or a kernel without the field) joins are told
/// from their stacks only.
fn thread_offsets() -> ThreadOffsets {
    let unknown = ThreadOffsets {
        clear_child_tid: u32::MAX,
        ..Default::default()
    };
    let Ok(btf) = crate::btf::Btf::from_file(&crate::btf::kernel_btf_path()) else {
        return unknown;
    };
    let field = |name: &str| btf.member_offset("task_struct", name);
    match (field("clear_child_tid"), field("tgid"), field("pid")) {
        (Some(clear_child_tid), Some(tgid), Some(pid)) => ThreadOffsets {
            clear_child_tid,
            tgid,
            pid,
            _pad: 0,
        },
        _ => unknown,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    Waiter,
    Holder,
}

/// One (lock, stack) record of the kernel's.
#[derive(Clone, Debug)]
pub struct LockRecord {
    pub pid: u32,
    pub exec_generation: u32,
    pub address: u64,
    /// pthread source: locks destroyed at this address before this one.
    pub instance: u32,
    /// Kernel source: the contention flags (the lock's type).
    pub flags: u32,
    pub role: Role,
    pub time: LockTime,
    /// Of `time.count`, the waits still going when the run stopped (timed up to the stop).
    pub in_progress: u64,
}

impl LockRecord {
    /// The record of one kernel map entry.
    pub fn of(key: &LockKey, role: Role, time: LockTime) -> LockRecord {
        LockRecord {
            pid: key.tgid,
            exec_generation: key.exec_generation,
            address: key.uaddr,
            instance: key.instance,
            flags: key.flags,
            role,
            time,
            in_progress: 0,
        }
    }
}

/// One record read from the kernel's maps, with its stacks as read then.
#[derive(Clone, Debug)]
pub struct DrainedRecord {
    pub record: LockRecord,
    pub user: StackRead,
    pub kernel: StackRead,
}

/// pthread source: the exclusive holds of one lock that ended during the run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Holds {
    pub holds: u64,
    pub total_hold_ns: u64,
    pub max_hold_ns: u64,
    pub avg_hold_ns: u64,
}

/// What one read of the lock records gives.
#[derive(Clone)]
pub struct LockBatch {
    pub records: Vec<DrainedRecord>,
    /// pthread source: holds per (pid, address, instance) for the locks still followed.
    pub holds: HashMap<(u32, u64, u32), Holds>,
    /// Futex source: per (pid, address) of a thread's `clear_child_tid`, that thread (when read).
    pub joinable: Option<HashMap<(u32, u64), u32>>,
    /// What the reads have lost and freed so far.
    pub health: DrainHealth,
}

impl Source for LockReader {
    fn drain(&mut self, _flip: Flip, wants: Wants, procs: &mut Processes) -> anyhow::Result<Option<Batch>> {
        Ok(match self.reading() {
            Reading::AtEnd => None,
            Reading::Drained => Some(Batch::Locks(self.drain(wants.current, procs))),
        })
    }

    fn stopping(&mut self) {
        self.stop_programs();
    }

    /// A run's records, with the waits still going at the stop (a stuck thread's included).
    fn finish(&mut self, stopped_ns: u64, procs: &mut Processes) -> anyhow::Result<Option<Batch>> {
        Ok(match self.reading() {
            Reading::AtEnd => {
                let mut batch = self.read_all(procs);
                batch.records.extend(self.in_progress(stopped_ns, procs));
                Some(Batch::Locks(batch))
            }
            Reading::Drained => None,
        })
    }
}
