//! Lock mode: which locks the targets wait for, from which call stacks, for how long, and the
//! stacks that held or released them meanwhile; folded from the lock source's records (see
//! `sources::locks` for where waits are seen: futex, pthread probes, the kernel).
//!
//! A lock's identity is its address: for a futex the futex word, which for a pthread mutex is
//! the mutex itself, so a global or static lock is named by its symbol; for the pthread source
//! memory reused for a new lock after `pthread_*_destroy` is a new lock (its instance); static
//! kernel locks are named from `/proc/kallsyms`.
use std::collections::HashMap;

mod condvar;
mod kind;

use kind::kind_of;
pub use kind::WaitClass;

use profiler_common::lock::kernel;
use serde::Serialize;

use crate::model::{frames_of, RunMeta, Stack, StackReport, Weight};
pub use crate::sources::locks::{DrainedRecord, Holds, LockBatch, LockRecord, Role};
use crate::{
    cli::{LockSource, Waits},
    process::{FileId, FileTable, Processes},
    profile::{Health, RawProfile, RawSample, StackRead},
    symbolize::{
        data::{DataSymbols, KernelData},
        Frame, Symbols,
    },
};

/// Waiting and holder stacks listed per lock (the rest are summed in the lock's totals).
const STACKS_PER_LOCK: usize = 10;

#[derive(Debug, Default)]
pub struct LockCollection {
    pub records: Vec<LockRecord>,
    /// Each record's stack, weighted by its wait, keyed by tid = record index (so no two merge).
    pub stacks: RawProfile,
    /// pthread source: holds per (pid, address, instance) for the locks still followed.
    pub holds: HashMap<(u32, u64, u32), Holds>,
    /// Futex source: per (pid, address) of a thread's `clear_child_tid`, that thread.
    pub threads_joinable: HashMap<(u32, u64), u32>,
    /// Records added with `add_merged`, by what they are and their stacks as read.
    merged: HashMap<MergeKey, u32>,
}

/// A record's identity apart from its stack's id: its role, process, image, lock, instance and
/// flags, and its stacks' frames as the kernel recorded them.
type MergeKey = (Role, u32, u32, u64, u32, u32, StackRead, StackRead);

impl LockCollection {
    /// One read of the lock records: each added to the record of the same lock and stacks.
    pub fn add_batch(&mut self, batch: LockBatch, procs: &Processes) {
        for drained in batch.records {
            self.add_merged(drained.record, drained.user, drained.kernel, procs);
        }
        self.holds.extend(batch.holds);
        if let Some(joinable) = batch.joinable {
            self.threads_joinable = joinable;
        }
    }

    /// Add one record with its stack (resolved against the process's map now).
    pub fn add(&mut self, record: LockRecord, user: StackRead, kernel: StackRead, procs: &Processes) {
        self.add_stack(self.records.len() as u32, &record, user, kernel, procs);
        self.records.push(record);
    }

    /// The stack of record `index`, weighted by `record`'s wait.
    fn add_stack(
        &mut self,
        index: u32,
        record: &LockRecord,
        user: StackRead,
        kernel: StackRead,
        procs: &Processes,
    ) {
        self.stacks.add(
            RawSample {
                pid: record.pid,
                tid: index,
                comm: String::new(),
                user,
                kernel,
                count: record.time.total_ns,
                exec_generation: record.exec_generation,
                event: 0,
                deltas: Default::default(),
                user_objects: Vec::new(),
            },
            procs,
        );
    }

    /// Add one record, or add its time to the record with the same lock and stacks (drains
    /// that see the same waits again, under a stack id that may have changed meanwhile).
    pub fn add_merged(&mut self, record: LockRecord, user: StackRead, kernel: StackRead, procs: &Processes) {
        let key: MergeKey = (
            record.role,
            record.pid,
            record.exec_generation,
            record.address,
            record.instance,
            record.flags,
            user.clone(),
            kernel.clone(),
        );
        let Some(&index) = self.merged.get(&key) else {
            self.merged.insert(key, self.records.len() as u32);
            return self.add(record, user, kernel, procs);
        };
        self.records[index as usize].in_progress += record.in_progress;
        let time = &mut self.records[index as usize].time;
        time.count += record.time.count;
        time.total_ns += record.time.total_ns;
        time.max_ns = time.max_ns.max(record.time.max_ns);
        self.add_stack(index, &record, user, kernel, procs);
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct WaiterStat {
    pub frames: Vec<Frame>,
    pub contentions: u64,
    pub total_wait_ns: u64,
    pub max_wait_ns: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct HolderStat {
    pub frames: Vec<Frame>,
    /// Waits that ended with a wake from this stack.
    pub wakes: u64,
    /// The wait those waiters spent.
    pub total_wait_ns: u64,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct LockStat {
    pub pid: u32,
    pub comm: String,
    #[serde(serialize_with = "crate::symbolize::hex")]
    pub address: u64,
    /// pthread source: locks destroyed at this address before this one (its memory reused).
    #[serde(skip_serializing_if = "is_zero")]
    pub instance: u32,
    /// Which of the process's images the address belongs to (for naming it).
    #[serde(skip)]
    pub exec_generation: u32,
    /// Kernel source: the flags of all its waits (for its type).
    #[serde(skip)]
    pub flags: u32,
    /// The global or static variable at the address (None: heap or stack memory).
    pub symbol: Option<String>,
    /// A join: the thread joined (whose exit the kernel signals at this address).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub thread: Option<u32>,
    /// The program's own function that waited longest for it (the innermost frame of its
    /// most-waited stack outside the C library): what tells a lock without a symbol (heap
    /// memory) apart.
    pub waited_in: Option<String>,
    /// What waited on it, from the waiters' stacks: mutex, rwlock, condvar, semaphore, barrier,
    /// join, or futex when no pthread or semaphore function was seen; for kernel locks the
    /// type from the contention flags (spinlock, mutex, rwsem:R, ...).
    pub kind: &'static str,
    /// Contention (a lock held by another thread) or waiting for an event; from the kind.
    pub class: WaitClass,
    pub contentions: u64,
    /// Of the contentions, the waits still going when the run stopped: each counted up to the
    /// stop (a thread stuck on this lock).
    pub waiting_at_stop: u64,
    pub total_wait_ns: u64,
    pub max_wait_ns: u64,
    pub avg_wait_ns: u64,
    /// Waits no wake was seen for (futex: timeouts, signals, or a lock released before the
    /// waiter slept; pthread: the hand-over between a release and the next acquisition, or a
    /// holder that took the lock where nothing is probed; kernel: all, holders are not seen):
    /// part of the total, not of any holder.
    pub unattributed_wait_ns: u64,
    /// pthread source: how long the lock was held (exclusive holds).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub holds: Option<Holds>,
    /// Most wait first.
    pub waiters: Vec<WaiterStat>,
    pub holders: Vec<HolderStat>,
}

#[derive(Clone, Debug)]
pub struct LockReport {
    pub meta: RunMeta,
    pub source: LockSource,
    pub health: Health,
    /// Contention first, then waits for events; each by most total wait first.
    pub locks: Vec<LockStat>,
    /// The waiting stacks weighted by wait, with the lock as the leaf, of the classes `--waits`
    /// asked for: for the stack formats.
    pub waits: StackReport,
}

impl LockReport {
    /// Only the stacks that waited (or held) longest per lock, for a report read by a person;
    /// the rest stay in the lock's totals.
    pub fn limit_stacks(mut self) -> LockReport {
        for lock in &mut self.locks {
            lock.waiters.truncate(STACKS_PER_LOCK);
            lock.holders.truncate(STACKS_PER_LOCK);
        }
        self
    }

    /// The entries of one class, most waited first.
    pub fn of_class(&self, class: WaitClass) -> impl Iterator<Item = &LockStat> {
        self.locks.iter().filter(move |l| l.class == class)
    }
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// What a lock report needs of the processes it names: their names, and the files each image
/// maps with where to read them (to name static and global locks). A run asks its `Processes`;
/// the agent's renderer, a snapshot taken as the window closed.
pub trait LockContext {
    fn comm(&self, pid: u32) -> String;
    /// See `Processes::mapped_files`.
    fn mapped_files(&self, pid: u32, generation: u32) -> Vec<(FileId, u64, u64)>;
    fn files(&self) -> &dyn FileTable;
}

impl LockContext for Processes {
    fn comm(&self, pid: u32) -> String {
        self.name(pid).unwrap_or("").to_string()
    }

    fn mapped_files(&self, pid: u32, generation: u32) -> Vec<(FileId, u64, u64)> {
        Processes::mapped_files(self, pid, generation)
    }

    fn files(&self) -> &dyn FileTable {
        self
    }
}

/// Fold the records into one entry per lock, every stack kept (see `LockReport::limit_stacks`).
pub fn report(
    mut meta: RunMeta,
    source: LockSource,
    waits: Waits,
    health: Health,
    collection: &LockCollection,
    symbols: &Symbols,
    context: &dyn LockContext,
) -> LockReport {
    let kernel_data = (source == LockSource::Kernel).then(KernelData::read);
    meta.notes.extend(kernel_data.as_ref().and_then(KernelData::note));
    let mut locks: Vec<LockStat> = by_lock(collection, symbols, context)
        .into_values()
        .filter(|l| l.contentions > 0)
        .collect();
    for lock in &mut locks {
        lock.kind = match kernel_data {
            Some(_) => kernel::lock_kind(lock.flags),
            None => kind_of(&lock.waiters, lock.flags),
        };
    }
    if source == LockSource::Futex {
        locks = condvar::one_entry_per_condvar(locks, context);
    }
    let mut data = DataSymbols::default();
    for lock in &mut locks {
        lock.symbol = match &kernel_data {
            Some(kernel) => kernel.name(lock.address),
            None => {
                let mapped = context.mapped_files(lock.pid, lock.exec_generation);
                data.name(context.files(), &mapped, lock.address)
            }
        };
        lock.class = WaitClass::of_kind(lock.kind);
        if lock.kind == "join" {
            lock.thread = collection
                .threads_joinable
                .get(&(lock.pid, lock.address))
                .copied();
        }
        settle(lock);
    }
    locks.sort_by(|a, b| {
        a.class
            .cmp(&b.class)
            .then_with(|| b.total_wait_ns.cmp(&a.total_wait_ns))
            .then_with(|| a.address.cmp(&b.address))
    });
    let shown: Vec<&LockStat> = locks.iter().filter(|l| l.class.shown_in(waits)).collect();
    let waits = flame(meta.clone(), health.clone(), &shown);
    LockReport {
        meta,
        source,
        health,
        locks,
        waits,
    }
}

/// Every record under its lock (pid, address, instance), with its stack's frames.
fn by_lock(
    collection: &LockCollection,
    symbols: &Symbols,
    context: &dyn LockContext,
) -> HashMap<(u32, u64, u32), LockStat> {
    let mut frames_by_record: HashMap<u32, Vec<Frame>> = HashMap::new();
    for key in collection.stacks.stacks.keys() {
        frames_by_record.insert(key.tid, frames_of(key, symbols));
    }
    let mut locks: HashMap<(u32, u64, u32), LockStat> = HashMap::new();
    for (index, record) in collection.records.iter().enumerate() {
        let frames = frames_by_record
            .get(&(index as u32))
            .cloned()
            .unwrap_or_else(|| vec![Frame::marker("no stack", false)]);
        let id = (record.pid, record.address, record.instance);
        let lock = locks.entry(id).or_insert_with(|| LockStat {
            pid: record.pid,
            comm: context.comm(record.pid),
            address: record.address,
            instance: record.instance,
            exec_generation: record.exec_generation,
            kind: "futex",
            holds: collection.holds.get(&id).copied(),
            ..LockStat::default()
        });
        lock.flags |= record.flags;
        match record.role {
            Role::Waiter => {
                lock.contentions += record.time.count;
                lock.waiting_at_stop += record.in_progress;
                lock.total_wait_ns += record.time.total_ns;
                lock.max_wait_ns = lock.max_wait_ns.max(record.time.max_ns);
                lock.waiters.push(WaiterStat {
                    frames,
                    contentions: record.time.count,
                    total_wait_ns: record.time.total_ns,
                    max_wait_ns: record.time.max_ns,
                });
            }
            Role::Holder => lock.holders.push(HolderStat {
                frames,
                wakes: record.time.count,
                total_wait_ns: record.time.total_ns,
            }),
        }
    }
    locks
}

/// A lock's figures from its stacks: average, what no holder explains, stacks by most wait,
/// and the program's function that waited longest.
fn settle(lock: &mut LockStat) {
    lock.avg_wait_ns = lock.total_wait_ns / lock.contentions.max(1);
    let attributed: u64 = lock.holders.iter().map(|h| h.total_wait_ns).sum();
    lock.unattributed_wait_ns = lock.total_wait_ns.saturating_sub(attributed);
    lock.waiters.sort_by(|a, b| {
        b.total_wait_ns
            .cmp(&a.total_wait_ns)
            .then_with(|| a.frames.cmp(&b.frames))
    });
    lock.holders.sort_by(|a, b| {
        b.total_wait_ns
            .cmp(&a.total_wait_ns)
            .then_with(|| a.frames.cmp(&b.frames))
    });
    lock.waited_in = lock
        .waiters
        .first()
        .and_then(|w| program_caller(&w.frames))
        .map(str::to_string);
}

/// How a lock is shown: its symbol, else the thread a join waits for, else its address and the
/// function that waited for it longest.
pub fn lock_label(lock: &LockStat) -> String {
    match (&lock.symbol, lock.thread, &lock.waited_in) {
        (Some(symbol), _, _) => symbol.clone(),
        (None, Some(tid), _) => format!("thread {tid}"),
        (None, None, Some(function)) => format!("{:#x} in {function}", lock.address),
        (None, None, None) => format!("{:#x}", lock.address),
    }
}

/// The innermost frame of a waiting stack that is the program's own: outside the kernel, the C
/// library and the thread library.
pub fn program_caller(frames: &[Frame]) -> Option<&str> {
    frames
        .iter()
        .rev()
        .find(|f| {
            !f.kernel
                && !f.module.contains("libc")
                && !f.module.contains("libpthread")
                && !f.function.starts_with('[')
        })
        .map(|f| f.function.as_str())
}

/// Every waiting stack, weighted by its wait, with the lock as a frame below the leaf.
pub(crate) fn flame(meta: RunMeta, health: Health, locks: &[&LockStat]) -> StackReport {
    let mut stacks: Vec<Stack> = Vec::new();
    for lock in locks {
        for waiter in &lock.waiters {
            let mut frames = waiter.frames.clone();
            frames.push(Frame::marker(&format!("lock {}", lock_label(lock)), false));
            stacks.push(Stack {
                pid: lock.pid,
                tid: lock.pid,
                comm: lock.comm.clone(),
                count: waiter.total_wait_ns,
                counters: Vec::new(),
                frames,
            });
        }
    }
    stacks.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.frames.cmp(&b.frames)));
    StackReport {
        meta,
        weight: Weight::LockWaitNanoseconds,
        health,
        samples: crate::model::total_count(&stacks),
        functions: crate::model::function_stats(&stacks),
        stacks,
        symbols: Vec::new(),
    }
}

#[cfg(test)]
mod tests;
