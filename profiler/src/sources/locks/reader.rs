//! The one reader of lock records, for every lock source and every product. A run reads the
//! records once, at the end (`Reading::AtEnd`). `top` and the agent take them out at every drain
//! (`Reading::Drained`): every (lock, stack) record is taken out of the kernel's maps in one
//! step (lookup-and-delete), so a drain holds exactly the waits that ended since the one before,
//! and the maps never fill. The stacks the records name stay in their maps: waits still going
//! and wakes not yet matched name them too. A stack is freed once nothing has named it for
//! `IDLE_SWEEPS` sweeps; one reused after that gets the same id back (ids are hashes of the
//! frames), so freeing costs nothing but a rare stack lost in the instant between a sweep's scan
//! and its delete (counted, not hidden).
use std::collections::HashMap;

use aya::{
    maps::{HashMap as BpfHashMap, Map, MapData, StackTraceMap},
    Ebpf,
};
use profiler_common::{
    lock::{
        futex, futex_hint, stack, LastWake, LockId, LockKey, LockState, LockTime, Waiting, NO_STACK,
        WAIT_ENTRIES,
    },
    names,
    unwind::UserStack,
};

use super::{DrainedRecord, Holds, LockBatch, LockRecord, Role};
use crate::{
    collect::{read_stack, read_unwound},
    map_ops::{read_all, take_all},
    process::Processes,
    profile::StackRead,
};

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

/// How a lock source's records are read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reading {
    /// Once, at the end, as they stand (a run: its maps only grow, and no update can be lost
    /// to a concurrent delete).
    AtEnd,
    /// Taken out at every drain (`top`, the agent): each drain holds exactly the waits that
    /// ended since the last, the maps never fill, unnamed stacks are swept.
    Drained,
}

/// The lock programs' maps: the one reader of lock records, for run, `top` and the agent.
pub struct LockReader {
    reading: Reading,
    waiters: Map,
    holders: Map,
    stacks: StackTraceMap<MapData>,
    user_stacks: BpfHashMap<MapData, u32, UserStack>,
    /// pthread source: per lock, its holds (empty for the other sources).
    states: BpfHashMap<MapData, LockId, LockState>,
    /// Futex source: the thread whose exit each `clear_child_tid` futex stands for.
    joinable: BpfHashMap<MapData, LockId, u32>,
    /// Futex source: the waits in flight and the last wake of each lock (what the sweeps keep).
    waiting: BpfHashMap<MapData, u32, Waiting>,
    wakes: BpfHashMap<MapData, LockId, LastWake>,
    /// Per stack, the sweep that last saw it named.
    named: HashMap<(StackMap, u32), u64>,
    /// The programs' attachments, dropped at the stop so the last read sees the maps settled.
    links: Vec<Box<dyn std::any::Any>>,
    drains: u64,
    sweeps: u64,
    pub health: DrainHealth,
}

impl LockReader {
    pub fn take(ebpf: &mut Ebpf, reading: Reading) -> anyhow::Result<Self> {
        let mut take = |name: &str| crate::collect::take_map(ebpf, name);
        Ok(LockReader {
            reading,
            waiters: take(names::LOCK_WAITERS)?,
            holders: take(names::LOCK_HOLDERS)?,
            stacks: StackTraceMap::try_from(take(names::LOCK_STACKS)?)?,
            user_stacks: BpfHashMap::try_from(take(names::LOCK_USER_STACKS)?)?,
            states: BpfHashMap::try_from(take(names::LOCK_STATES)?)?,
            joinable: BpfHashMap::try_from(take(names::LOCK_JOINABLE)?)?,
            waiting: BpfHashMap::try_from(take(names::LOCK_WAITING)?)?,
            wakes: BpfHashMap::try_from(take(names::LOCK_WAKES)?)?,
            named: HashMap::new(),
            links: Vec::new(),
            drains: 0,
            sweeps: 0,
            health: DrainHealth::default(),
        })
    }

    pub fn reading(&self) -> Reading {
        self.reading
    }

    /// Own the programs' attachments (detached by `stop_programs`).
    pub fn hold<L: 'static>(&mut self, links: Vec<L>) {
        (self.links).extend(links.into_iter().map(|l| Box::new(l) as Box<dyn std::any::Any>));
    }

    pub fn stop_programs(&mut self) {
        self.links.clear();
    }

    /// Futex source, once attached: the waits already going in `pids`' threads, read from
    /// /proc, as if they began now (their stacks are taken as they end). A wait the tracepoints
    /// already saw is left as they saw it; one that ends unseen (the thread returned between the
    /// read and the entry) is let go at the thread's next futex call, or found gone at the stop
    /// (`in_progress`). At most half the map's entries, for the waits to come. Returns how many
    /// were entered.
    pub fn enter_waits_in_progress(&mut self, pids: &[u32]) -> u64 {
        let mut entered = 0;
        for &pid in pids {
            for tid in crate::process::threads_of(pid) {
                if entered >= u64::from(WAIT_ENTRIES / 2) {
                    return entered;
                }
                entered += u64::from(self.enter_wait(pid, tid));
            }
        }
        entered
    }

    /// One thread's wait in progress (see `enter_waits_in_progress`). A stopped thread (a
    /// debugger's, SIGSTOP) shows the call it was in, but is not waiting in it.
    fn enter_wait(&mut self, pid: u32, tid: u32) -> bool {
        let Some(wait) = futex_wait_of(pid, tid) else {
            return false;
        };
        let mut hints = wait.hints;
        let id = LockId {
            tgid: pid,
            _pad: 0,
            uaddr: wait.uaddr,
        };
        if self.joinable.get(&id, 0).is_ok() {
            hints |= futex_hint::JOIN;
        }
        let waiting = Waiting {
            uaddr: wait.uaddr,
            start_ns: crate::collect::monotonic_ns(),
            stack_id: NO_STACK,
            aux: 0,
            hints,
            walk_again: 1,
        };
        // BPF_NOEXIST: a wait the tracepoints saw begin is theirs.
        self.waiting.insert(tid, waiting, 1).is_ok()
    }

    /// Futex source: each wait still going, timed up to `stopped_ns`, under the stack walked as
    /// it began. A thread that exited meanwhile left no entry (its wait ended with it).
    pub fn in_progress(&self, stopped_ns: u64, procs: &mut Processes) -> Vec<DrainedRecord> {
        let mut records = Vec::new();
        for (tid, waiting) in read_all(&self.waiting) {
            let Some(tgid) = crate::process::tgid_of(tid) else {
                continue;
            };
            // Begun after the stop; or entered at the start, never seen to end, and no longer
            // going (it ended unseen).
            let gone = waiting.stack_id == NO_STACK
                && futex_wait_of(tgid, tid).is_none_or(|now| now.uaddr != waiting.uaddr);
            if waiting.start_ns >= stopped_ns || gone {
                continue;
            }
            let key = LockKey {
                tgid,
                stack_id: waiting.stack_id,
                uaddr: waiting.uaddr,
                stack_kind: match StackMap::of_unwound(waiting.aux) {
                    StackMap::FramePointers => stack::USER_FP,
                    StackMap::Unwound => stack::USER_UNWOUND,
                },
                exec_generation: procs.current_generation(tgid),
                flags: waiting.hints,
                ..Default::default()
            };
            let wait = stopped_ns.saturating_sub(waiting.start_ns);
            let time = LockTime {
                count: 1,
                total_ns: wait,
                max_ns: wait,
            };
            let (user, kernel) = record_stacks(&key, &self.stacks, &self.user_stacks, procs);
            records.push(DrainedRecord {
                record: LockRecord {
                    in_progress: 1,
                    ..LockRecord::of(&key, Role::Waiter, time)
                },
                user,
                kernel,
            });
        }
        records
    }

    /// Everything recorded, as it stands (`Reading::AtEnd`): every (lock, stack) record, the
    /// holds of the locks followed, the threads joins wait for. Processes whose stacks fall
    /// outside their captured map are captured again first (they may have loaded a library).
    pub fn read_all(&self, procs: &mut Processes) -> LockBatch {
        let mut records = Vec::new();
        for (map, role) in [(&self.waiters, Role::Waiter), (&self.holders, Role::Holder)] {
            let Ok(map) = BpfHashMap::<&MapData, LockKey, LockTime>::try_from(map) else {
                continue;
            };
            for (key, time) in map.iter().filter_map(Result::ok) {
                let (user, kernel) = record_stacks(&key, &self.stacks, &self.user_stacks, procs);
                records.push(DrainedRecord {
                    record: LockRecord::of(&key, role, time),
                    user,
                    kernel,
                });
            }
        }
        let mut holds = HashMap::new();
        for (id, state) in self.states.iter().filter_map(Result::ok) {
            if state.holds > 0 {
                let hold = Holds {
                    holds: state.holds,
                    total_hold_ns: state.hold_total_ns,
                    max_hold_ns: state.hold_max_ns,
                    avg_hold_ns: state.hold_total_ns / state.holds,
                };
                holds.insert((id.tgid, id.uaddr, state.instance), hold);
            }
        }
        LockBatch {
            records,
            holds,
            joinable: Some(self.joinable()),
            health: self.health,
        }
    }

    /// Per (pid, address) of a thread's `clear_child_tid`, that thread.
    fn joinable(&self) -> HashMap<(u32, u64), u32> {
        (read_all(&self.joinable).into_iter())
            .map(|(id, tid)| ((id.tgid, id.uaddr), tid))
            .collect()
    }

    /// `Reading::Drained`: the waits that ended since the last drain, and the wakes that ended
    /// them; with the threads joins wait for when asked (`current`).
    pub fn drain(&mut self, current: bool, procs: &mut Processes) -> LockBatch {
        LockBatch {
            records: self.take_records(procs),
            holds: HashMap::new(),
            joinable: current.then(|| self.joinable()),
            health: self.health,
        }
    }

    /// Each (lock, stack) record taken out of the kernel's maps in one step.
    fn take_records(&mut self, procs: &mut Processes) -> Vec<DrainedRecord> {
        self.drains += 1;
        let mut drained = Vec::new();
        for role in [Role::Waiter, Role::Holder] {
            let map = match role {
                Role::Waiter => &self.waiters,
                Role::Holder => &self.holders,
            };
            let Ok(map) = BpfHashMap::<&MapData, LockKey, LockTime>::try_from(map) else {
                self.health.read_errors += 1;
                continue;
            };
            let taken = take_all(&map);
            self.health.read_errors += taken.failed;
            for (key, time) in taken.entries {
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
        for (_, waiting) in read_all(&self.waiting) {
            if waiting.stack_id >= 0 {
                let map = StackMap::of_unwound(waiting.aux);
                self.named.insert((map, waiting.stack_id as u32), sweep);
            }
        }
        let old = crate::collect::monotonic_ns().saturating_sub(WAKE_KEPT_NS);
        let wakes: Vec<(LockId, LastWake)> = read_all(&self.wakes);
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

/// The futex wait a thread is in now, if it is in one (and not stopped in it).
fn futex_wait_of(pid: u32, tid: u32) -> Option<FutexWait> {
    let task = format!("/proc/{pid}/task/{tid}");
    let wait = FutexWait::parse(&std::fs::read_to_string(format!("{task}/syscall")).ok()?)?;
    let stat = std::fs::read_to_string(format!("{task}/stat")).ok()?;
    let state = crate::process::split_stat(&stat)?.1.chars().next()?;
    (!matches!(state, 'T' | 't')).then_some(wait)
}

/// A futex wait as /proc/<tid>/syscall shows a thread in it: "nr uaddr op val ... sp pc".
#[derive(Debug, PartialEq, Eq)]
struct FutexWait {
    uaddr: u64,
    hints: u32,
}

impl FutexWait {
    fn parse(line: &str) -> Option<FutexWait> {
        let mut fields = line.split_whitespace();
        if fields.next()?.parse::<i64>().ok()? != libc::SYS_futex {
            return None;
        }
        let mut arg = || u64::from_str_radix(fields.next()?.strip_prefix("0x")?, 16).ok();
        let (uaddr, op, val) = (arg()?, arg()?, arg()?);
        let cmd = op & futex::CMD_MASK;
        let hints = match cmd {
            futex::LOCK_PI | futex::LOCK_PI2 => futex_hint::PI_LOCK,
            _ if val as u32 == 2 => futex_hint::LOCK_WORD,
            _ => 0,
        };
        futex::waits(cmd).then_some(FutexWait { uaddr, hints })
    }
}

/// A record's (user, kernel) stacks, from the map its `stack_kind` names. A process whose user
/// stack falls outside its captured map is captured again first (it may have loaded a library).
fn record_stacks(
    key: &LockKey,
    stacks: &StackTraceMap<MapData>,
    user_stacks: &BpfHashMap<MapData, u32, UserStack>,
    procs: &mut Processes,
) -> (StackRead, StackRead) {
    let (user, kernel) = match key.stack_kind {
        stack::USER_FP => (read_stack(stacks, key.stack_id), StackRead::Absent),
        stack::USER_UNWOUND => (read_unwound(user_stacks, key.stack_id), StackRead::Absent),
        _ => (StackRead::Absent, read_stack(stacks, key.stack_id)),
    };
    if let StackRead::Frames(ips) = &user {
        let _ = procs.refresh_unless_covered(key.tgid, key.exec_generation, ips);
    }
    (user, kernel)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_futex_wait_is_read_from_its_syscall_line() {
        let line = |nr: i64, op: u64, val: u64| {
            format!("{nr} 0x7f0012345678 {op:#x} {val:#x} 0x0 0x0 0x0 0x7ffd0000 0x7f00aaaa\n")
        };
        let futex = libc::SYS_futex;
        // A mutex's wait (private, locked with waiters), a condvar's (bitset), a PI lock.
        let mutex = FutexWait::parse(&line(futex, 0x80, 2)).unwrap();
        assert_eq!(
            (mutex.uaddr, mutex.hints),
            (0x7f0012345678, futex_hint::LOCK_WORD)
        );
        assert_eq!(FutexWait::parse(&line(futex, 0x189, 7)).unwrap().hints, 0);
        assert_eq!(
            FutexWait::parse(&line(futex, 0x86, 0)).unwrap().hints,
            futex_hint::PI_LOCK
        );
        // A wake, another call, a thread running, a truncated line: no wait.
        assert_eq!(FutexWait::parse(&line(futex, 0x81, 1)), None);
        assert_eq!(FutexWait::parse(&line(futex + 1, 0x80, 2)), None);
        assert_eq!(FutexWait::parse("running\n"), None);
        assert_eq!(FutexWait::parse(&format!("{futex} 0x1000")), None);
    }
}
