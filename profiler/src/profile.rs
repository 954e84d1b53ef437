//! The stages' data, from raw kernel records to an aggregated, not yet symbolized profile:
//! `RawSample` (collect) → `StackKey` + count in `RawProfile` (aggregate).
use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use profiler_common::CounterDeltas;

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
    /// What each requested counter advanced while this stack was sampled (see `--counter`).
    pub deltas: CounterDeltas,
    /// Per user frame, leaf first, the kernel's own (build ID, file offset) where it resolved
    /// one: frame-pointer stacks of processes without tables. Empty for most samples.
    pub user_objects: Vec<Option<ObjectOffset>>,
}

/// Why frames are missing from a stack; shown as a frame so the sample is never misattributed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LostStack {
    Collision,
    Error,
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
}

/// Health of the run: everything lost or damaged, so the report can say so.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Health {
    /// Samples recorded (before symbolization).
    pub samples: u64,
    /// Samples that found the CPU idle.
    pub idle: u64,
    /// Samples dropped because the sample map was full.
    pub lost_map_full: u64,
    pub user_stack_collisions: u64,
    pub kernel_stack_collisions: u64,
    pub user_stack_errors: u64,
    pub kernel_stack_errors: u64,
    /// New-process notifications dropped (those processes may symbolize as `[unknown]`).
    pub process_events_lost: u64,
    pub target_map_full: u64,
    /// Processes with samples whose memory map could not be captured before they exited.
    pub processes_not_captured: u64,
    /// User frames of processes without a captured map there, resolved by the kernel's build ID
    /// and file offset through a file another process maps.
    pub user_frames_by_build_id: u64,
    /// How many times the kernel maps were drained.
    pub drains: u64,
    /// Sched mode: context switches seen, and what could not be recorded.
    pub sched_switches: u64,
    /// Switch-ins of a task whose switch-out no tracepoint showed (settled from the kernel's
    /// totals at the switch-in; its time off the CPU between is unknown).
    pub switch_outs_missed: u64,
    pub task_map_full: u64,
    pub slow_events: u64,
    pub slow_events_lost: u64,
    pub offcpu_map_full: u64,
    pub exited_map_full: u64,
    /// Samples whose counter deltas were dropped (delta map full).
    pub delta_map_full: u64,
    /// User stacks walked through unwind tables; of those, how many hit the depth limit, ended
    /// early (an unreadable return address, a frame with no usable rule), or were lost.
    pub unwind_walks: u64,
    pub unwind_truncated: u64,
    pub unwind_failed: u64,
    pub unwind_stacks_lost: u64,
    /// Samples taken before their process's tables were given to the walker (it had just
    /// started or exec'd): user stacks by frame pointers.
    pub unwind_before_tables: u64,
    /// Executables and libraries without a usable unwind table (walked with frame pointers),
    /// and which: "path: reason".
    pub files_without_tables: u64,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub files_without_tables_named: Vec<String>,
    /// Lock mode: futex waits timed, and waits lost because a lock map was full.
    pub lock_waits: u64,
    pub lock_map_full: u64,
}

impl Health {
    /// What the sampling counters (cumulative in the kernel) grew by since `earlier`: one
    /// window's share of a long run.
    pub fn sampling_since(&self, earlier: &Health) -> Health {
        let d = |now: u64, then: u64| now.saturating_sub(then);
        Health {
            samples: d(self.samples, earlier.samples),
            idle: d(self.idle, earlier.idle),
            lost_map_full: d(self.lost_map_full, earlier.lost_map_full),
            user_stack_collisions: d(self.user_stack_collisions, earlier.user_stack_collisions),
            kernel_stack_collisions: d(self.kernel_stack_collisions, earlier.kernel_stack_collisions),
            user_stack_errors: d(self.user_stack_errors, earlier.user_stack_errors),
            kernel_stack_errors: d(self.kernel_stack_errors, earlier.kernel_stack_errors),
            process_events_lost: d(self.process_events_lost, earlier.process_events_lost),
            unwind_walks: d(self.unwind_walks, earlier.unwind_walks),
            unwind_truncated: d(self.unwind_truncated, earlier.unwind_truncated),
            unwind_failed: d(self.unwind_failed, earlier.unwind_failed),
            unwind_stacks_lost: d(self.unwind_stacks_lost, earlier.unwind_stacks_lost),
            unwind_before_tables: d(self.unwind_before_tables, earlier.unwind_before_tables),
            ..Health::default()
        }
    }

    pub fn lost(&self) -> u64 {
        self.lost_map_full
    }

    pub fn collisions(&self) -> u64 {
        self.user_stack_collisions + self.kernel_stack_collisions
    }

    /// Sentences for the top of a report, one per problem; empty when all is well.
    pub fn warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        let total = self.samples + self.lost_map_full;
        let pct = |n: u64| {
            if total == 0 {
                0.0
            } else {
                100.0 * n as f64 / total as f64
            }
        };
        if self.lost_map_full > 0 {
            out.push(format!(
                "{} samples lost ({:.1}%): the sample map was full between drains",
                self.lost_map_full,
                pct(self.lost_map_full)
            ));
        }
        if self.collisions() > 0 {
            out.push(format!(
                "{} stacks lost to stack-map collisions ({} user, {} kernel; shown as [lost stack])",
                self.collisions(),
                self.user_stack_collisions,
                self.kernel_stack_collisions
            ));
        }
        if self.user_stack_errors + self.kernel_stack_errors > 0 {
            out.push(format!(
                "{} stacks could not be read ({} user, {} kernel; shown as [lost stack])",
                self.user_stack_errors + self.kernel_stack_errors,
                self.user_stack_errors,
                self.kernel_stack_errors
            ));
        }
        if self.process_events_lost > 0 {
            out.push(format!(
                "{} new-process notifications lost: some processes may show [unknown] frames",
                self.process_events_lost
            ));
        }
        if self.processes_not_captured > 0 {
            out.push(format!(
                "{} processes exited before their memory map could be read: their user frames are [unknown] where the kernel could not name the file by build ID",
                self.processes_not_captured
            ));
        }
        if self.user_frames_by_build_id > 0 {
            out.push(format!(
                "{} user frames outside any memory map read (processes gone before it was, a child before its exec) were resolved by the kernel's build ID and file offset",
                self.user_frames_by_build_id
            ));
        }
        if self.switch_outs_missed > 0 {
            out.push(format!(
                "{} switch-outs were never shown by the kernel's tracepoint (the task was seen switched in again): those runs and waits are the kernel's own totals, settled at the next switch-in; the time off the CPU between is not known",
                self.switch_outs_missed
            ));
        }
        if self.task_map_full > 0 {
            out.push(format!(
                "{} tasks were not tracked: the per-task map was full",
                self.task_map_full
            ));
        }
        if self.offcpu_map_full > 0 {
            out.push(format!(
                "{} off-CPU intervals were not recorded: the off-CPU map was full",
                self.offcpu_map_full
            ));
        }
        if self.slow_events_lost > 0 {
            out.push(format!(
                "{} slow waits were not reported individually: their ring buffer was full",
                self.slow_events_lost
            ));
        }
        if self.exited_map_full > 0 {
            out.push(format!(
                "{} exited tasks are missing: too many exited within a second",
                self.exited_map_full
            ));
        }
        if self.lock_map_full > 0 {
            out.push(format!(
                "{} lock waits were not recorded (a lock map was full): the totals are low by that many waits",
                self.lock_map_full
            ));
        }
        if self.files_without_tables > 0 {
            const SHOWN: usize = 3;
            let named = &self.files_without_tables_named;
            let more = match named.len().saturating_sub(SHOWN) {
                0 => String::new(),
                n => format!(" and {n} more"),
            };
            out.push(format!(
                "{} executables or libraries have no usable unwind table, their frames were walked with frame pointers: {}{more}",
                self.files_without_tables,
                named[..named.len().min(SHOWN)].join("; ")
            ));
        }
        if self.unwind_stacks_lost > 0 {
            out.push(format!(
                "{} table-unwound user stacks were lost (hash collision or stack map full; shown as [lost user stack])",
                self.unwind_stacks_lost
            ));
        }
        if self.unwind_truncated > 0 {
            out.push(format!(
                "{} user stacks were deeper than {} frames: their outermost frames are missing",
                self.unwind_truncated,
                profiler_common::unwind::MAX_FRAMES
            ));
        }
        if self.unwind_failed > 0 {
            out.push(format!(
                "{} of {} table-unwound user stacks ended early (a return address could not be read, or a frame had no unwind rule and no frame pointer): they are kept as far as they go",
                self.unwind_failed, self.unwind_walks
            ));
        }
        // A command's or an exec's first sample or two always come before its tables: said
        // only where it is a share worth knowing (many short-lived processes), not on every run.
        if self.unwind_before_tables > 0 && self.unwind_before_tables * 100 >= self.samples {
            out.push(format!(
                "{} samples were taken before their process's unwind tables were loaded (it had just started or exec'd): their user stacks come from frame pointers and may stop early",
                self.unwind_before_tables
            ));
        }
        if self.delta_map_full > 0 {
            out.push(format!(
                "{} samples carry no counter deltas: the delta map was full between drains",
                self.delta_map_full
            ));
        }
        if self.target_map_full > 0 {
            out.push(format!(
                "{} child processes of the targets were not followed: the target map was full",
                self.target_map_full
            ));
        }
        out
    }
}

/// Samples aggregated by stack, with user addresses resolved to files (not yet to symbols).
#[derive(Debug, Default)]
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
                        resolved.unwrap_or(at)
                    })
                    .collect();
                (user, None)
            }
            StackRead::Absent => (Vec::new(), None),
            StackRead::Collision => (Vec::new(), Some(LostStack::Collision)),
            StackRead::Error(_) => (Vec::new(), Some(LostStack::Error)),
        };
        let (kernel, kernel_lost) = match sample.kernel {
            StackRead::Frames(ips) => (adjust_callers(&ips).collect(), None),
            StackRead::Absent => (Vec::new(), None),
            StackRead::Collision => (Vec::new(), Some(LostStack::Collision)),
            StackRead::Error(_) => (Vec::new(), Some(LostStack::Error)),
        };
        let key = StackKey {
            pid: sample.pid,
            tid: sample.tid,
            comm: sample.comm,
            user,
            user_lost,
            kernel,
            kernel_lost,
        };
        if sample.deltas != CounterDeltas::default() {
            self.counters.entry(key.clone()).or_default().add(&sample.deltas);
        }
        *self.stacks.entry(key).or_default() += sample.count;
    }

    pub fn total_samples(&self) -> u64 {
        self.stacks.values().sum()
    }
}

/// Every frame but the leaf holds a return address, which points after the call: step back
/// one byte so it resolves to the calling line (and the right function after a noreturn call).
fn adjust_callers(ips: &[u64]) -> impl Iterator<Item = u64> + '_ {
    ips.iter()
        .enumerate()
        .map(|(i, &ip)| if i == 0 { ip } else { ip.saturating_sub(1) })
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
            warnings.len() == 1 && warnings[0].starts_with("10 samples were taken before"),
            "{warnings:?}"
        );
    }
}
