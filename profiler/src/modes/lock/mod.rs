//! Lock mode: which locks the targets wait for, from which call stacks, for how long, and the
//! stacks that held or released them meanwhile.
//!
//! Futex source: a contended lock (mutex, rwlock, condition variable, semaphore: glibc builds
//! them all on futexes) sleeps in `futex(2)`; an uncontended one never enters the kernel and
//! costs nothing. The lock's identity is the futex address, which for a pthread mutex is the
//! mutex itself, so a global or static lock is named by its symbol.
//!
//! pthread source: probes on the lock functions (see `probes`) follow every acquisition and
//! release, so a holder is known exactly, hold times are measured, and memory reused for a new
//! lock after `pthread_*_destroy` is a new lock; each lock call costs a probe trap.
//!
//! Kernel source: the kernel's contention tracepoints, kernel stacks, lock types from their
//! flags, static kernel locks named from `/proc/kallsyms`.
use std::collections::HashMap;

pub mod probes;

use aya::{
    maps::{HashMap as BpfHashMap, MapData, StackTraceMap},
    Ebpf,
};
use profiler_common::{
    lock::{kernel, stack, LockId, LockKey, LockState, LockTime},
    names,
    unwind::UserStack,
};
use serde::Serialize;

use crate::model::{frames_of, RunMeta, Stack, StackReport, Weight};
use crate::{
    cli::LockSource,
    collect::{read_stack, read_unwound},
    process::Processes,
    profile::{Health, RawProfile, RawSample, StackRead},
    symbolize::{
        data::{DataSymbols, KernelData},
        Frame, Symbols,
    },
};

/// Waiting and holder stacks listed per lock (the rest are summed in the lock's totals).
const STACKS_PER_LOCK: usize = 10;

/// The kernel maps of the lock programs. They only grow during a run (one entry per lock and
/// stack), so they are read once, at the end.
pub struct LockMaps {
    waiters: BpfHashMap<MapData, LockKey, LockTime>,
    holders: BpfHashMap<MapData, LockKey, LockTime>,
    stacks: StackTraceMap<MapData>,
    user_stacks: BpfHashMap<MapData, u32, UserStack>,
    /// pthread source: per lock, its holds (empty for the other sources).
    states: BpfHashMap<MapData, LockId, LockState>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Waiter,
    Holder,
}

/// One (lock, stack) record; its stack is the entry of `LockCollection::stacks` whose tid is
/// the record's index.
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
}

/// pthread source: the exclusive holds of one lock that ended during the run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Holds {
    pub holds: u64,
    pub total_hold_ns: u64,
    pub max_hold_ns: u64,
    pub avg_hold_ns: u64,
}

#[derive(Debug, Default)]
pub struct LockCollection {
    pub records: Vec<LockRecord>,
    /// Each record's stack, weighted by its wait, keyed by tid = record index (so no two merge).
    pub stacks: RawProfile,
    /// pthread source: holds per (pid, address, instance) for the locks still followed.
    pub holds: HashMap<(u32, u64, u32), Holds>,
}

impl LockCollection {
    /// Add one record with its stack (resolved against the process's map now).
    pub fn add(&mut self, record: LockRecord, user: StackRead, kernel: StackRead, procs: &Processes) {
        let index = self.records.len() as u32;
        self.stacks.add(
            RawSample {
                pid: record.pid,
                tid: index,
                comm: String::new(),
                user,
                kernel,
                count: record.time.total_ns,
                exec_generation: record.exec_generation,
                deltas: Default::default(),
                user_objects: Vec::new(),
            },
            procs,
        );
        self.records.push(record);
    }
}

impl LockMaps {
    pub fn take(ebpf: &mut Ebpf) -> anyhow::Result<Self> {
        let mut take = |name: &str| crate::collect::take_map(ebpf, name);
        Ok(LockMaps {
            waiters: BpfHashMap::try_from(take(names::LOCK_WAITERS)?)?,
            holders: BpfHashMap::try_from(take(names::LOCK_HOLDERS)?)?,
            stacks: StackTraceMap::try_from(take(names::LOCK_STACKS)?)?,
            user_stacks: BpfHashMap::try_from(take(names::LOCK_USER_STACKS)?)?,
            states: BpfHashMap::try_from(take(names::LOCK_STATES)?)?,
        })
    }

    /// Everything recorded. Processes whose stacks fall outside their captured map are captured
    /// again first (they may have loaded a library since).
    pub fn collect(&self, procs: &mut Processes) -> LockCollection {
        let mut collection = LockCollection::default();
        for (map, role) in [(&self.waiters, Role::Waiter), (&self.holders, Role::Holder)] {
            for (key, time) in map.iter().filter_map(Result::ok) {
                let (user, kernel) = match key.stack_kind {
                    stack::USER_FP => (read_stack(&self.stacks, key.stack_id), StackRead::Absent),
                    stack::USER_UNWOUND => (read_unwound(&self.user_stacks, key.stack_id), StackRead::Absent),
                    _ => (StackRead::Absent, read_stack(&self.stacks, key.stack_id)),
                };
                if let StackRead::Frames(ips) = &user {
                    let _ = procs.refresh_unless_covered(key.tgid, key.exec_generation, ips);
                }
                let record = LockRecord {
                    pid: key.tgid,
                    exec_generation: key.exec_generation,
                    address: key.uaddr,
                    instance: key.instance,
                    flags: key.flags,
                    role,
                    time,
                };
                collection.add(record, user, kernel, procs);
            }
        }
        for (id, state) in self.states.iter().filter_map(Result::ok) {
            if state.holds > 0 {
                let holds = Holds {
                    holds: state.holds,
                    total_hold_ns: state.hold_total_ns,
                    max_hold_ns: state.hold_max_ns,
                    avg_hold_ns: state.hold_total_ns / state.holds,
                };
                collection
                    .holds
                    .insert((id.tgid, id.uaddr, state.instance), holds);
            }
        }
        collection
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

#[derive(Clone, Debug, Serialize)]
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
    /// What waited on it, from the waiters' stacks: mutex, rwlock, condvar, semaphore, barrier,
    /// join, or futex when no pthread or semaphore function was seen; for kernel locks the
    /// type from the contention flags (spinlock, mutex, rwsem:R, ...).
    pub kind: &'static str,
    pub contentions: u64,
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
    /// Most total wait first.
    pub locks: Vec<LockStat>,
    /// The waiting stacks weighted by wait, with the lock as the leaf: for the stack formats.
    pub waits: StackReport,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// Fold the records into one entry per lock.
pub fn build(
    meta: RunMeta,
    source: LockSource,
    health: Health,
    collection: &LockCollection,
    symbols: &Symbols,
    procs: &Processes,
) -> LockReport {
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
            comm: procs.name(record.pid).unwrap_or("").to_string(),
            address: record.address,
            instance: record.instance,
            exec_generation: record.exec_generation,
            flags: 0,
            symbol: None,
            kind: "futex",
            contentions: 0,
            total_wait_ns: 0,
            max_wait_ns: 0,
            avg_wait_ns: 0,
            unattributed_wait_ns: 0,
            holds: collection.holds.get(&id).copied(),
            waiters: Vec::new(),
            holders: Vec::new(),
        });
        lock.flags |= record.flags;
        match record.role {
            Role::Waiter => {
                lock.contentions += record.time.count;
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
    let mut data = DataSymbols::default();
    let kernel_data = (source == LockSource::Kernel).then(KernelData::read);
    let mut locks: Vec<LockStat> = locks
        .into_values()
        .filter(|l| l.contentions > 0)
        .map(|mut lock| {
            match &kernel_data {
                Some(kernel) => {
                    lock.symbol = kernel.name(lock.address);
                    lock.kind = kernel::lock_kind(lock.flags);
                }
                None => {
                    lock.symbol = data.name(procs, lock.pid, lock.exec_generation, lock.address);
                    lock.kind = kind_of(&lock.waiters);
                }
            }
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
            lock
        })
        .collect();
    locks.sort_by(|a, b| {
        b.total_wait_ns
            .cmp(&a.total_wait_ns)
            .then_with(|| a.address.cmp(&b.address))
    });
    let waits = flame(meta.clone(), health.clone(), &locks);
    for lock in &mut locks {
        lock.waiters.truncate(STACKS_PER_LOCK);
        lock.holders.truncate(STACKS_PER_LOCK);
    }
    LockReport {
        meta,
        source,
        health,
        locks,
        waits,
    }
}

/// How a lock is shown: its symbol, else its address.
pub fn lock_label(lock: &LockStat) -> String {
    match &lock.symbol {
        Some(symbol) => symbol.clone(),
        None => format!("{:#x}", lock.address),
    }
}

/// Every waiting stack, weighted by its wait, with the lock as a frame below the leaf.
fn flame(meta: RunMeta, health: Health, locks: &[LockStat]) -> StackReport {
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
        samples: stacks.iter().map(|s| s.count).sum(),
        functions: crate::model::function_stats(&stacks),
        stacks,
    }
}

/// What kind of lock the waiters were in, from the library function they waited in.
fn kind_of(waiters: &[WaiterStat]) -> &'static str {
    const KINDS: [(&str, &str); 7] = [
        ("pthread_mutex", "mutex"),
        ("pthread_rwlock", "rwlock"),
        ("pthread_cond", "condvar"),
        ("pthread_barrier", "barrier"),
        ("pthread_join", "join"),
        ("sem_", "semaphore"),
        ("pthread_spin", "spinlock"),
    ];
    for waiter in waiters {
        for frame in waiter.frames.iter().rev() {
            let name = frame.function.trim_start_matches('_');
            if let Some((_, kind)) = KINDS.iter().find(|(prefix, _)| name.starts_with(prefix)) {
                return kind;
            }
        }
    }
    "futex"
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiter(functions: &[&str]) -> WaiterStat {
        WaiterStat {
            frames: functions.iter().map(|f| crate::model::tests::frame(f)).collect(),
            contentions: 1,
            total_wait_ns: 1,
            max_wait_ns: 1,
        }
    }

    #[test]
    fn kind_comes_from_the_library_function_waited_in() {
        let mutex = waiter(&["main", "work", "___pthread_mutex_lock", "__lll_lock_wait"]);
        assert_eq!(kind_of(&[mutex]), "mutex");
        let cond = waiter(&[
            "main",
            "consumer",
            "___pthread_cond_wait",
            "__futex_abstimed_wait_common",
        ]);
        assert_eq!(kind_of(&[cond]), "condvar");
        assert_eq!(kind_of(&[waiter(&["main", "syscall"])]), "futex");
    }
}
