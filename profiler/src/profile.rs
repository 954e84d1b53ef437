//! The stages' data, from raw kernel records to an aggregated, not yet symbolized profile:
//! `RawSample` (collect) → `StackKey` + count in `RawProfile` (aggregate).
use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use profiler_common::{python::py_frame_parts, CounterDeltas};

use crate::process::{ObjectOffset, Processes, UserAddr};

/// One stack as read from a stack map.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum StackRead {
    /// Instruction pointers, leaf first, as the kernel records them.
    Frames(Vec<u64>),
    /// No such stack: a kernel thread has no user stack, a sample in user mode no kernel stack.
    Absent,
    /// The stack was lost to a hash collision in the stack map.
    Collision,
    /// The kernel returned another error (e.g. stack map full).
    Error(i32),
    /// Not taken: a sleep whose stacks were left to others drawn at random (the agent's
    /// off-CPU sampling), where none of its thread's could stand for it.
    NotSampled,
}

impl StackRead {
    /// Its frames, where it has them.
    pub fn frames(&self) -> Option<&[u64]> {
        match self {
            StackRead::Frames(ips) => Some(ips),
            _ => None,
        }
    }
}

/// One entry of a drained sample map: a thread, its two stacks, and how often they were seen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawSample {
    pub pid: u32,
    pub tid: u32,
    pub comm: String,
    pub user: StackRead,
    pub kernel: StackRead,
    pub count: u64,
    /// Which of the process's images (see `SampleKey::exec_generation`).
    pub exec_generation: u32,
    /// Which of the run's sampling events took it (its place in `-e`; 0 for other sources).
    pub event: u16,
    /// What each requested counter advanced while this stack was sampled (see `--counter`).
    pub deltas: CounterDeltas,
    /// Per user frame, leaf first, the kernel's own (build ID, file offset) where it resolved
    /// one: frame-pointer stacks of processes without tables. Empty for most samples.
    pub user_objects: Vec<Option<ObjectOffset>>,
}

impl RawSample {
    /// One sample of a user stack alone (`ips`, leaf first) on the process's main thread: what
    /// replays, tests and fuzz targets make.
    pub fn of_user_stack(pid: u32, comm: &str, ips: Vec<u64>, count: u64) -> RawSample {
        RawSample {
            pid,
            tid: pid,
            comm: comm.into(),
            user: StackRead::Frames(ips),
            kernel: StackRead::Absent,
            count,
            exec_generation: 0,
            event: 0,
            deltas: Default::default(),
            user_objects: Vec::new(),
        }
    }
}

/// Why frames are missing from a stack; shown as a frame so the sample is never misattributed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LostStack {
    Collision,
    Error,
    NotSampled,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct StackKey {
    pub pid: u32,
    pub tid: u32,
    pub comm: String,
    /// Leaf first. Callers' addresses are already moved back into the call instruction.
    pub user: Vec<UserAddr>,
    pub user_lost: Option<LostStack>,
    /// Leaf first, adjusted like `user`.
    pub kernel: Vec<u64>,
    pub kernel_lost: Option<LostStack>,
    /// Which of the run's sampling events took these samples (their place in `-e`).
    pub event: u16,
}

pub use crate::health::Health;

/// Samples aggregated by stack, with user addresses resolved to files (not yet to symbols).
#[derive(Clone, Debug, Default)]
pub struct RawProfile {
    pub stacks: HashMap<StackKey, u64>,
    /// Counter deltas per stack, for the stacks that have any.
    pub counters: HashMap<StackKey, CounterDeltas>,
    pub health: Health,
}

impl RawProfile {
    /// How many different addresses (user and kernel) its stacks hold: what symbolizing it means.
    pub fn distinct_addresses(&self) -> usize {
        let user: std::collections::HashSet<_> = self.stacks.keys().flat_map(|k| &k.user).collect();
        let kernel: std::collections::HashSet<_> = self.stacks.keys().flat_map(|k| &k.kernel).collect();
        user.len() + kernel.len()
    }

    pub fn new() -> Self {
        Self::default()
    }

    /// Fold one drained sample in. `procs` must already hold the process's memory map if it
    /// could be captured; addresses are resolved against it now, because it may change later
    /// (exec, dlopen).
    pub fn add(&mut self, sample: RawSample, procs: &Processes) {
        let (count, deltas) = (sample.count, sample.deltas);
        let key = self.key(sample, procs);
        if deltas != CounterDeltas::default() {
            self.counters.entry(key.clone()).or_default().add(&deltas);
        }
        *self.stacks.entry(key).or_default() += count;
    }

    /// The stack a sample was taken on, its addresses resolved (see `add`).
    pub fn key(&mut self, sample: RawSample, procs: &Processes) -> StackKey {
        let (user, user_lost) = match sample.user {
            StackRead::Frames(ips) => {
                let objects = &sample.user_objects;
                let user: Vec<UserAddr> = adjust_callers(&ips)
                    .zip(&ips)
                    .enumerate()
                    .map(|(i, (addr, &raw))| {
                        let at = procs.normalize(sample.pid, sample.exec_generation, addr);
                        let resolved = match (at, objects.get(i).and_then(Option::as_ref)) {
                            (UserAddr::Unmapped { .. }, Some(object)) => {
                                procs.resolve_object(object, addr, raw - addr)
                            }
                            _ => None,
                        };
                        self.health.user_frames_by_build_id += u64::from(resolved.is_some());
                        let unnamed = matches!(at, UserAddr::Unmapped { .. })
                            && py_frame_parts(raw).is_some()
                            && procs.runs_python(sample.pid);
                        self.health.python_unnamed += u64::from(unnamed);
                        resolved.unwrap_or(at)
                    })
                    .collect();
                (user, None)
            }
            StackRead::Absent => (Vec::new(), None),
            StackRead::Collision => (Vec::new(), Some(LostStack::Collision)),
            StackRead::Error(_) => (Vec::new(), Some(LostStack::Error)),
            StackRead::NotSampled => (Vec::new(), Some(LostStack::NotSampled)),
        };
        let (kernel, kernel_lost) = match sample.kernel {
            StackRead::Frames(ips) => (adjust_callers(&ips).collect(), None),
            StackRead::Absent => (Vec::new(), None),
            StackRead::Collision => (Vec::new(), Some(LostStack::Collision)),
            StackRead::Error(_) => (Vec::new(), Some(LostStack::Error)),
            StackRead::NotSampled => (Vec::new(), Some(LostStack::NotSampled)),
        };
        StackKey {
            pid: sample.pid,
            tid: sample.tid,
            comm: sample.comm,
            user,
            user_lost,
            kernel,
            kernel_lost,
            event: sample.event,
        }
    }

    pub fn total_samples(&self) -> u64 {
        self.stacks.values().sum()
    }
}

/// Every frame but the leaf holds a return address, which points after the call: step back
/// one byte so it resolves to the calling line (and the right function after a noreturn call).
/// A slot that is no address (a Python frame, the truncation mark) is kept as it is.
fn adjust_callers(ips: &[u64]) -> impl Iterator<Item = u64> + '_ {
    ips.iter().enumerate().map(
        |(i, &ip)| match i == 0 || !profiler_common::unwind::is_address(ip) {
            true => ip,
            false => ip.saturating_sub(1),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::parse_maps;

    fn sample(user: StackRead, kernel: StackRead, count: u64) -> RawSample {
        RawSample {
            pid: 7,
            tid: 8,
            comm: "w".into(),
            user,
            kernel,
            count,
            exec_generation: 0,
            event: 0,
            deltas: CounterDeltas::default(),
            user_objects: Vec::new(),
        }
    }

    #[test]
    fn frames_outside_every_map_read_take_the_kernels_build_id_resolution() {
        let mut procs = Processes::new();
        procs.capture(std::process::id()).unwrap();
        let own = crate::process::ObjectOffset {
            build_id: build_id_of_self(),
            offset: 0x1234,
        };
        // A process never captured (gone before its map was read): its leaf the kernel resolved,
        // its caller it could not (status not valid: no object), its third frame not reported.
        let mut gone = sample(
            StackRead::Frames(vec![0x5000, 0x6001, 0x7001]),
            StackRead::Absent,
            3,
        );
        gone.pid = u32::MAX - 3;
        gone.user_objects = vec![Some(own), None];
        let mut caller = gone.clone();
        caller.user = StackRead::Frames(vec![0x5000, 0x6001]);
        caller.user_objects = vec![None, Some(own)];
        let mut profile = RawProfile::new();
        profile.add(gone, &procs);
        profile.add(caller, &procs);
        let stacks: Vec<&Vec<UserAddr>> = profile.stacks.keys().map(|k| &k.user).collect();
        let leaf_first = stacks.iter().find(|s| s.len() == 3).unwrap();
        assert!(matches!(
            leaf_first[0],
            UserAddr::File {
                offset: 0x1234,
                addr: 0x5000,
                ..
            }
        ));
        assert_eq!(leaf_first[1], UserAddr::Unmapped { addr: 0x6000 });
        assert_eq!(leaf_first[2], UserAddr::Unmapped { addr: 0x7000 });
        // A caller's return address is moved back one byte, its file offset with it.
        let caller_first = stacks.iter().find(|s| s.len() == 2).unwrap();
        assert!(matches!(
            caller_first[1],
            UserAddr::File {
                offset: 0x1233,
                addr: 0x6000,
                ..
            }
        ));
        assert_eq!(profile.health.user_frames_by_build_id, 2);
    }

    fn build_id_of_self() -> crate::process::BuildId {
        crate::process::build_id_of(&std::fs::File::open("/proc/self/exe").unwrap()).unwrap()
    }

    #[test]
    fn merges_equal_stacks_and_adjusts_return_addresses() {
        let mut procs = Processes::new();
        procs.insert_maps(7, parse_maps("1000-2000 r-xp 00000000 fd:01 5 /bin/w\n"));
        let mut profile = RawProfile::new();
        let user = StackRead::Frames(vec![0x1100, 0x1200]);
        profile.add(sample(user.clone(), StackRead::Absent, 3), &procs);
        profile.add(sample(user, StackRead::Absent, 4), &procs);
        assert_eq!(profile.stacks.len(), 1);
        assert_eq!(profile.total_samples(), 7);
        let key = profile.stacks.keys().next().unwrap();
        assert_eq!(
            key.user[0],
            UserAddr::File {
                file: 0,
                offset: 0x100,
                addr: 0x1100
            }
        );
        assert_eq!(
            key.user[1],
            UserAddr::File {
                file: 0,
                offset: 0x1ff,
                addr: 0x11ff
            }
        );
    }

    #[test]
    fn lost_stacks_are_kept_and_marked() {
        let procs = Processes::new();
        let mut profile = RawProfile::new();
        profile.add(
            sample(
                StackRead::Collision,
                StackRead::Frames(vec![0xffff_ffff_8100_0000]),
                2,
            ),
            &procs,
        );
        let key = profile.stacks.keys().next().unwrap();
        assert_eq!(key.user_lost, Some(LostStack::Collision));
        assert_eq!(key.kernel, vec![0xffff_ffff_8100_0000]);
        assert_eq!(profile.total_samples(), 2);
    }

    #[test]
    fn health_warns_only_about_real_problems() {
        let mut health = Health {
            samples: 1000,
            ..Default::default()
        };
        assert!(health.warnings().is_empty());
        health.lost_map_full = 10;
        health.user_stack_collisions = 2;
        let warnings = health.warnings();
        assert_eq!(warnings.len(), 2);
        assert!(warnings[0].contains("10 samples lost (1.0%)"), "{warnings:?}");
    }

    #[test]
    fn samples_before_the_tables_are_said_once_they_are_a_share_worth_knowing() {
        let mut health = Health {
            samples: 1000,
            unwind_before_tables: 3,
            ..Default::default()
        };
        assert!(health.warnings().is_empty(), "a command's first samples");
        health.unwind_before_tables = 10;
        let warnings = health.warnings();
        assert!(
            warnings.len() == 1
                && warnings[0]
                    .starts_with("10 user stacks (of samples, or of traced hits) were taken before"),
            "{warnings:?}"
        );
    }
}
