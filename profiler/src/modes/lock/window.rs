//! Lock waits drained as they end (the agent's lock signal). At each drain every (lock, stack)
//! record is taken out of the kernel's maps in one step (lookup-and-delete), so a drain holds
//! exactly the waits that ended since the one before, and the maps never fill. The stacks the
//! records name stay in their maps: waits still going and wakes not yet matched name them too.
//! A stack is freed once nothing has named it for `IDLE_SWEEPS` sweeps; one reused after that
//! gets the same id back (ids are hashes of the frames), so freeing costs nothing but a rare
//! stack lost in the instant between a sweep's scan and its delete (counted, not hidden).
use std::collections::HashMap;

use aya::{
    maps::{HashMap as BpfHashMap, Map, MapData, StackTraceMap},
    Ebpf,
};
use profiler_common::{
    lock::{stack, LastWake, LockId, LockKey, LockTime, Waiting},
    names,
    unwind::UserStack,
};

use super::{record_stacks, LockCollection, LockRecord, Role};
use crate::{collect::take_entry, process::Processes, profile::StackRead};

/// Drains between sweeps of the stack maps (a sweep reads every wait in flight and every
/// remembered wake: a few thousand entries on a busy machine).
const SWEEP_EVERY: u64 = 10;
/// Sweeps a stack must go unnamed in before it is freed.
const IDLE_SWEEPS: u64 = 3;
/// A remembered wake older than this is forgotten at a sweep: the wait it ended has long been
/// counted (a woken thread runs within milliseconds), and its stack can go.
const WAKE_KEPT_NS: u64 = 10_000_000_000;

/// Which stack map an id is in: frame-pointer stacks, or stacks walked through unwind tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum StackMap {
    FramePointers,
    Unwound,
}

impl StackMap {
    /// Kernel stacks are in `LOCK_STACKS` too.
    fn of_key(key: &LockKey) -> StackMap {
        match key.stack_kind {
            stack::USER_UNWOUND => StackMap::Unwound,
            _ => StackMap::FramePointers,
        }
    }

    fn of_unwound(unwound: u32) -> StackMap {
        match unwound {
            0 => StackMap::FramePointers,
            _ => StackMap::Unwound,
        }
    }
}

/// One record taken out of the kernel's maps, with its stacks as read then.
#[derive(Clone, Debug)]
pub struct DrainedRecord {
    pub record: LockRecord,
    pub user: StackRead,
    pub kernel: StackRead,
}

impl DrainedRecord {
    pub fn add_to(&self, collection: &mut LockCollection, procs: &Processes) {
        collection.add_merged(self.record.clone(), self.user.clone(), self.kernel.clone(), procs);
    }
}

/// What a lock drain saw go wrong, cumulative.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DrainHealth {
    /// Stacks freed by the sweeps.
    pub stacks_freed: u64,
    /// Records whose stack was gone when read (freed as a new wait took it, or never stored).
    pub stacks_lost: u64,
    /// Entries the kernel refused to hand over.
    pub read_errors: u64,
    /// Remembered wakes forgotten for their age (`WAKE_KEPT_NS`).
    pub wakes_forgotten: u64,
    /// Stacks held in the kernel's maps after the last sweep.
    pub stacks_stored: u64,
}

/// The futex source's maps, drained at every tick.
pub struct LockDrain {
    waiters: Map,
    holders: Map,
    stacks: StackTraceMap<MapData>,
    user_stacks: BpfHashMap<MapData, u32, UserStack>,
    waiting: BpfHashMap<MapData, u32, Waiting>,
    wakes: BpfHashMap<MapData, LockId, LastWake>,
    /// Per stack, the sweep that last saw it named.
    named: HashMap<(StackMap, u32), u64>,
    drains: u64,
    sweeps: u64,
    pub health: DrainHealth,
}

/// A hash map's keys and, to take its entries out, its descriptor.
fn keys_and_data(map: &Map) -> anyhow::Result<(Vec<LockKey>, &MapData)> {
    let keys = BpfHashMap::<&MapData, LockKey, LockTime>::try_from(map)?
        .keys()
        .filter_map(Result::ok)
        .collect();
    match map {
        Map::HashMap(data) => Ok((keys, data)),
        _ => anyhow::bail!("a lock record map that is not a hash map"),
    }
}

impl LockDrain {
    pub fn take(ebpf: &mut Ebpf) -> anyhow::Result<Self> {
        let mut take = |name: &str| crate::collect::take_map(ebpf, name);
        Ok(LockDrain {
            waiters: take(names::LOCK_WAITERS)?,
            holders: take(names::LOCK_HOLDERS)?,
            stacks: StackTraceMap::try_from(take(names::LOCK_STACKS)?)?,
            user_stacks: BpfHashMap::try_from(take(names::LOCK_USER_STACKS)?)?,
            waiting: BpfHashMap::try_from(take(names::LOCK_WAITING)?)?,
            wakes: BpfHashMap::try_from(take(names::LOCK_WAKES)?)?,
            named: HashMap::new(),
            drains: 0,
            sweeps: 0,
            health: DrainHealth::default(),
        })
    }

    /// The waits that ended since the last drain, and the wakes that ended them.
    pub fn drain(&mut self, procs: &mut Processes) -> Vec<DrainedRecord> {
        self.drains += 1;
        let mut drained = Vec::new();
        for role in [Role::Waiter, Role::Holder] {
            let map = match role {
                Role::Waiter => &self.waiters,
                Role::Holder => &self.holders,
            };
            // Keys first: a hash map's iteration restarts when the key it stands on is deleted.
            let Ok((keys, map)) = keys_and_data(map) else {
                self.health.read_errors += 1;
                continue;
            };
            for key in keys {
                let time: LockTime = match take_entry(map, &key) {
                    Ok(Some(time)) => time,
                    Ok(None) => continue,
                    Err(_) => {
                        self.health.read_errors += 1;
                        continue;
                    }
                };
                let (user, kernel) = record_stacks(&key, &self.stacks, &self.user_stacks, procs);
                if key.stack_id >= 0 {
                    self.named
                        .insert((StackMap::of_key(&key), key.stack_id as u32), self.sweeps);
                }
                // A valid id whose stack is gone (not a walk that failed in the kernel).
                let gone = |read: &StackRead| matches!(read, StackRead::Error(id) if *id >= 0);
                if gone(&user) || gone(&kernel) {
                    self.health.stacks_lost += 1;
                }
                drained.push(DrainedRecord {
                    record: LockRecord::of(&key, role, time),
                    user,
                    kernel,
                });
            }
        }
        if self.drains.is_multiple_of(SWEEP_EVERY) {
            self.sweep();
        }
        drained
    }

    /// Free the stacks nothing has named for `IDLE_SWEEPS` sweeps: no record drained, no wait in
    /// flight, no remembered wake (wakes older than `WAKE_KEPT_NS` are forgotten first).
    fn sweep(&mut self) {
        self.sweeps += 1;
        let sweep = self.sweeps;
        for (_, waiting) in self.waiting.iter().filter_map(Result::ok) {
            if waiting.stack_id >= 0 {
                let map = StackMap::of_unwound(waiting.aux);
                self.named.insert((map, waiting.stack_id as u32), sweep);
            }
        }
        let old = crate::collect::monotonic_ns().saturating_sub(WAKE_KEPT_NS);
        let wakes: Vec<(LockId, LastWake)> = self.wakes.iter().filter_map(Result::ok).collect();
        for (id, wake) in wakes {
            if wake.at_ns < old {
                let _ = self.wakes.remove(&id);
                self.health.wakes_forgotten += 1;
            } else if wake.user_stack_id >= 0 {
                let map = StackMap::of_unwound(wake.user_unwound);
                self.named.insert((map, wake.user_stack_id as u32), sweep);
            }
        }
        let stored: Vec<(StackMap, u32)> = (self.stacks.stack_ids().filter_map(Result::ok))
            .map(|id| (StackMap::FramePointers, id))
            .chain(
                self.user_stacks
                    .keys()
                    .filter_map(Result::ok)
                    .map(|id| (StackMap::Unwound, id)),
            )
            .collect();
        self.health.stacks_stored = stored.len() as u64;
        for id in stored {
            let last = *self.named.entry(id).or_insert(sweep);
            if sweep - last < IDLE_SWEEPS {
                continue;
            }
            let freed = match id.0 {
                StackMap::FramePointers => self.stacks.remove(&id.1),
                StackMap::Unwound => self.user_stacks.remove(&id.1),
            };
            if freed.is_ok() {
                self.health.stacks_freed += 1;
                self.health.stacks_stored -= 1;
            }
            self.named.remove(&id);
        }
        // Ids no longer stored are forgotten too, so this map is bounded by the kernel's.
        self.named.retain(|_, last| sweep - *last < IDLE_SWEEPS + 1);
    }
}

#[cfg(test)]
mod tests {
    use prost::Message as _;

    use super::*;
    use crate::{
        cli::{LockSource, Waits},
        modes::lock::build,
        profile::Health,
        report::pprof::{self, proto},
        symbolize::Symbols,
    };

    fn drained(role: Role, ips: &[u64], (count, total_ns, max_ns): (u64, u64, u64)) -> DrainedRecord {
        DrainedRecord {
            record: LockRecord {
                pid: 7,
                exec_generation: 0,
                address: 0x1000,
                instance: 0,
                flags: 0,
                role,
                time: LockTime {
                    count,
                    total_ns,
                    max_ns,
                },
            },
            user: StackRead::Frames(ips.to_vec()),
            kernel: StackRead::Absent,
        }
    }

    /// Two drains see the same lock and waiting stack: one record with both drains' waits, as
    /// one sample of Go's mutex profile; another stack and the releasing stack stay apart.
    #[test]
    fn drains_merge_by_lock_and_stack_into_one_mutex_profile_sample_each() {
        let procs = Processes::new();
        let mut window = LockCollection::default();
        let first = [drained(Role::Waiter, &[0x10, 0x20], (2, 300, 200))];
        let second = [
            drained(Role::Waiter, &[0x10, 0x20], (1, 100, 150)),
            drained(Role::Waiter, &[0x30], (1, 50, 50)),
            drained(Role::Holder, &[0x40], (3, 450, 0)),
        ];
        for record in first.iter().chain(&second) {
            record.add_to(&mut window, &procs);
        }
        assert_eq!(window.records.len(), 3);
        assert_eq!(
            window.records[0].time,
            LockTime {
                count: 3,
                total_ns: 400,
                max_ns: 200
            }
        );
        let weight_of = |tid: u32| -> u64 {
            window
                .stacks
                .stacks
                .iter()
                .filter(|(k, _)| k.tid == tid)
                .map(|(_, n)| n)
                .sum()
        };
        assert_eq!((weight_of(0), weight_of(1), weight_of(2)), (400, 50, 450));

        let meta = crate::report::tests::sample_report().meta;
        let report = build(
            meta,
            LockSource::Futex,
            Waits::All,
            Health::default(),
            &window,
            &Symbols::default(),
            &procs,
        );
        assert_eq!(report.locks.len(), 1);
        let lock = &report.locks[0];
        assert_eq!(
            (lock.contentions, lock.total_wait_ns, lock.max_wait_ns),
            (4, 450, 200)
        );
        assert_eq!(
            (lock.waiters.len(), lock.holders.len(), lock.unattributed_wait_ns),
            (2, 1, 0)
        );

        let profile = pprof::lock_profile(&report, &|_| vec![("executable", "/bin/server".to_string())]);
        let profile = proto::Profile::decode(&*profile.encode_to_vec()).unwrap();
        let text = |i: i64| profile.string_table[i as usize].as_str();
        let types: Vec<(&str, &str)> = profile
            .sample_type
            .iter()
            .map(|t| (text(t.r#type), text(t.unit)))
            .collect();
        assert_eq!(types, [("contentions", "count"), ("delay", "nanoseconds")]);
        assert_eq!(
            profile.sample.len(),
            2,
            "one sample per waiting stack; holders are not waits"
        );
        let values: Vec<&[i64]> = profile.sample.iter().map(|s| &s.value[..]).collect();
        assert_eq!(values, [&[3, 400][..], &[1, 50][..]]);
        for sample in &profile.sample {
            let labels: HashMap<&str, &str> = sample
                .label
                .iter()
                .filter(|l| l.str != 0)
                .map(|l| (text(l.key), text(l.str)))
                .collect();
            assert_eq!(labels["lock"], "0x1000");
            assert_eq!(labels["lock_kind"], "futex");
            assert_eq!(labels["wait_class"], "waiting");
            assert_eq!(labels["executable"], "/bin/server");
            assert!(sample.label.iter().any(|l| text(l.key) == "pid" && l.num == 7));
            assert!(
                sample.label.iter().all(|l| text(l.key) != "tid"),
                "no thread: records are per process"
            );
            // The lock is the leaf.
            let leaf = &profile.location[sample.location_id[0] as usize - 1];
            let function = &profile.function[leaf.line[0].function_id as usize - 1];
            assert_eq!(text(function.name), "[lock 0x1000]");
        }
    }
}
