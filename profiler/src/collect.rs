//! Draining kernel maps into plain Rust values. The kernel writes into one epoch slot while we
//! drain the other, so nothing is read while it is being incremented and no map fills up on a
//! long run. A replay source with the same interface makes the later stages testable without BPF.
use std::time::Duration;

use anyhow::Context as _;
use aya::{
    maps::{Array, HashMap as BpfHashMap, MapData, PerCpuArray, StackTraceMap},
    Ebpf,
};
use profiler_common::{names, unwind::UserStack, BuildIdStack, BUILD_ID_VALID};

use crate::{
    process::{ObjectOffset, Processes},
    profile::{Health, RawProfile, RawSample, StackRead},
};

/// How often the kernel maps are drained, in a run, `top` and the agent alike: often enough that
/// a map never fills, rarely enough to cost nothing.
pub const DRAIN_EVERY: Duration = Duration::from_secs(1);

/// A map the loaded object must have, taken out of it (the caller owns it from now on).
pub fn take_map(ebpf: &mut Ebpf, name: &str) -> anyhow::Result<aya::maps::Map> {
    ebpf.take_map(name).with_context(|| format!("map {name} missing"))
}

const EFAULT: i32 = 14;
const EEXIST: i32 = 17;

/// One switch of the epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Flip {
    /// The slot to drain now (the one written until the switch).
    pub slot: usize,
    /// The generation written from now on (the drained slot's is the one before).
    pub generation: u32,
    /// When the kernel was switched (CLOCK_MONOTONIC ns, as `bpf_ktime_get_ns`).
    pub at_ns: u64,
}

/// The length of a clock tick (USER_HZ: what /proc/stat counts in), in ns; none if unknown.
pub(crate) fn clock_tick_ns() -> Option<u64> {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(ticks)
        .ok()
        .filter(|&t| t > 0)
        .map(|t| 1_000_000_000 / t)
}

/// CLOCK_MONOTONIC, the clock of `bpf_ktime_get_ns()`.
pub(crate) fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// What every source shares in the kernel: the epoch every two-slot map follows, and the health
/// counters every program bumps. The kernel's, or (in tests) fixed ones.
pub trait Commons {
    /// Switch the kernel to the other epoch slot. Every map with two slots is drained from the
    /// slot this returns.
    fn flip(&mut self) -> anyhow::Result<Flip>;
    /// The kernel's counters of what was recorded, lost and damaged, cumulative.
    fn health(&self) -> anyhow::Result<Health>;
}

/// The kernel's epoch and health counters.
pub struct KernelCommons {
    epoch: Array<MapData, u32>,
    /// The health counters, per CPU.
    counters: PerCpuArray<MapData, u64>,
    /// The generation being written (its low bit: the slot).
    generation: u32,
}

impl KernelCommons {
    pub fn take(ebpf: &mut Ebpf) -> anyhow::Result<Self> {
        Ok(KernelCommons {
            epoch: Array::try_from(take_map(ebpf, names::EPOCH)?)?,
            counters: PerCpuArray::try_from(take_map(ebpf, names::HEALTH)?)?,
            generation: 0,
        })
    }
}

impl Commons for KernelCommons {
    /// A program that read the old epoch just before the switch may still be writing into it: it
    /// runs for microseconds, so the wait here is generous.
    fn flip(&mut self) -> anyhow::Result<Flip> {
        let slot = (self.generation & 1) as usize;
        self.generation = self.generation.wrapping_add(1);
        self.epoch
            .set(0, self.generation, 0)
            .context("switching the epoch")?;
        let at_ns = monotonic_ns();
        std::thread::sleep(Duration::from_millis(2));
        Ok(Flip {
            slot,
            generation: self.generation,
            at_ns,
        })
    }

    fn health(&self) -> anyhow::Result<Health> {
        Health::from_kernel(|c| Ok(self.counters.get(&(c as u32), 0)?.iter().sum()))
    }
}

/// Empty one epoch slot's stack maps (frame-pointer and table-unwound) for its next interval.
pub(crate) fn clear_stacks(
    stacks: &mut StackTraceMap<MapData>,
    user_stacks: &mut BpfHashMap<MapData, u32, UserStack>,
) {
    let ids: Vec<u32> = stacks.stack_ids().filter_map(Result::ok).collect();
    for id in ids {
        let _ = stacks.remove(&id);
    }
    crate::map_ops::take_all(user_stacks);
}

/// The kernel's build-ID frames of a stack, leaf first: a file offset where it found the file.
pub(crate) fn object_offsets(stack: &BuildIdStack) -> Vec<Option<ObjectOffset>> {
    let used = stack
        .frames
        .iter()
        .rposition(|f| f.status != 0)
        .map_or(0, |last| last + 1);
    stack.frames[..used]
        .iter()
        .map(|f| {
            (f.status == BUILD_ID_VALID).then_some(ObjectOffset {
                build_id: f.build_id,
                offset: f.offset,
            })
        })
        .collect()
}

pub(crate) fn read_stack(map: &StackTraceMap<MapData>, id: i32) -> StackRead {
    match id {
        id if id >= 0 => match map.get(&(id as u32), 0) {
            Ok(trace) => StackRead::Frames(
                trace
                    .frames()
                    .iter()
                    .map(|f| f.ip)
                    .filter(|&ip| ip != 0)
                    .collect(),
            ),
            Err(_) => StackRead::Error(id),
        },
        id if id == -EFAULT => StackRead::Absent,
        id if id == -EEXIST => StackRead::Collision,
        id => StackRead::Error(id),
    }
}

/// A table-unwound stack by id, or what its negative id says went wrong.
pub(crate) fn read_unwound(map: &BpfHashMap<MapData, u32, UserStack>, id: i32) -> StackRead {
    match id {
        id if id >= 0 => match map.get(&(id as u32), 0) {
            Ok(stack) => {
                let len = (stack.len as usize).min(stack.frames.len());
                // A walk gone astray may have read a value with the top 32 bits set (a kernel
                // pointer), which would read as a truncation mark: what follows it is no stack.
                let len = (stack.frames[..len].iter())
                    .position(|&f| profiler_common::unwind::truncation(f).is_some())
                    .unwrap_or(len);
                let mut frames = stack.frames[..len].to_vec();
                if stack.stop == profiler_common::unwind::stop::TRUNCATED {
                    frames.push(profiler_common::unwind::truncated_slot(stack.lost));
                }
                StackRead::Frames(frames)
            }
            Err(_) => StackRead::Error(id),
        },
        id if id == -EEXIST => StackRead::Collision,
        id => StackRead::Error(id),
    }
}

/// The next whole `T` (a `#[repr(C)]` record the kernel writes) in the ring, an item too short
/// for one skipped; none once the ring is empty.
pub(crate) fn next_record<T: Copy>(ring: &mut aya::maps::RingBuf<MapData>) -> Option<T> {
    while let Some(item) = ring.next() {
        if item.len() >= std::mem::size_of::<T>() {
            // SAFETY: the kernel wrote a whole `T` (checked long enough); read unaligned, as the
            // ring promises only 8-byte alignment.
            return Some(unsafe { std::ptr::read_unaligned(item.as_ptr() as *const T) });
        }
    }
    None
}

pub(crate) fn comm_string(comm: &[u8]) -> String {
    let end = comm.iter().position(|&b| b == 0).unwrap_or(comm.len());
    String::from_utf8_lossy(&comm[..end]).into_owned()
}

/// A fixed epoch and health, for tests of everything after collection.
#[cfg(test)]
pub struct ReplayCommons {
    pub health: Health,
}

#[cfg(test)]
impl Commons for ReplayCommons {
    fn flip(&mut self) -> anyhow::Result<Flip> {
        Ok(Flip {
            slot: 0,
            generation: 0,
            at_ns: 0,
        })
    }

    fn health(&self) -> anyhow::Result<Health> {
        Ok(self.health.clone())
    }
}

/// Fold drained samples into `profile`, capturing the memory map of any process whose addresses
/// are not covered yet (new process, exec, dlopen) while it is still alive.
pub fn add_batch(
    batch: Vec<RawSample>,
    profile: &mut RawProfile,
    procs: &mut Processes,
    not_captured: &mut std::collections::HashSet<u32>,
) {
    for sample in batch {
        if let StackRead::Frames(ips) = &sample.user {
            if procs
                .refresh_unless_covered(sample.pid, sample.exec_generation, ips)
                .is_err()
                && !procs.is_known(sample.pid)
            {
                not_captured.insert(sample.pid);
            }
        }
        profile.add(sample, procs);
    }
    profile.health.drains += 1;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::parse_maps;

    #[test]
    fn replayed_batches_aggregate_and_unknown_processes_are_counted() {
        let sample = |pid, ips: Vec<u64>, count| RawSample::of_user_stack(pid, "w", ips, count);
        let batches = [
            vec![sample(7, vec![0x1010], 2)],
            vec![sample(7, vec![0x1010], 3), sample(u32::MAX - 3, vec![0x5], 1)],
        ];
        let mut procs = Processes::new();
        procs.insert_maps(7, parse_maps("1000-2000 r-xp 00000000 fd:01 5 /bin/w\n"));
        let mut profile = RawProfile::new();
        let mut not_captured = Default::default();
        for batch in batches {
            add_batch(batch, &mut profile, &mut procs, &mut not_captured);
        }
        assert_eq!(profile.total_samples(), 6);
        assert_eq!(profile.stacks.len(), 2);
        assert_eq!(profile.health.drains, 2);
        assert!(
            not_captured.contains(&(u32::MAX - 3)),
            "a vanished process is reported"
        );
    }

    #[test]
    fn build_id_frames_are_read_leaf_first_up_to_the_last_reported() {
        let mut stack = BuildIdStack {
            frames: [Default::default(); profiler_common::BUILD_ID_FRAMES],
        };
        let frame = |status, offset| profiler_common::BuildIdFrame {
            status,
            build_id: [9; 20],
            offset,
        };
        // Resolved, then an address the kernel found no file for (status 2: an ip), resolved.
        stack.frames[0] = frame(BUILD_ID_VALID, 0x10);
        stack.frames[1] = frame(2, 0x7fff_0000);
        stack.frames[2] = frame(BUILD_ID_VALID, 0x30);
        let objects = object_offsets(&stack);
        assert_eq!(objects.len(), 3, "unused frames are not frames");
        assert_eq!(objects[0].map(|o| o.offset), Some(0x10));
        assert_eq!(objects[1], None);
        assert_eq!(objects[2].map(|o| (o.build_id, o.offset)), Some(([9; 20], 0x30)));
    }

    #[test]
    fn comm_stops_at_nul() {
        assert_eq!(comm_string(b"worker\0\0\0garbage"), "worker");
        assert_eq!(comm_string(b"0123456789abcdef"), "0123456789abcdef");
    }
}
