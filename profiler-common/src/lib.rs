//! Types shared by the kernel programs (`profiler-ebpf`) and user space (`profiler`).
//!
//! Everything here is `#[repr(C)]` with explicit padding, and its size is asserted, because both
//! sides read the same bytes out of BPF maps. Map sizes and stack depth live here once.
#![no_std]

#[cfg(test)]
extern crate std;

pub mod health;
pub mod latency;
pub mod lock;
pub mod names;
pub mod python;
pub mod records;
pub mod sampling;
pub mod sched;
pub mod syscalls;
pub mod timeline;
pub mod unwind;
pub mod values;

// The families' types at the root, where both sides have always found them.
pub use health::*;
pub use sampling::*;
pub use sched::*;

#[cfg(feature = "user")]
mod pod {
    use super::*;
    // SAFETY: plain old data, `#[repr(C)]`, no padding bytes (sizes asserted above).
    unsafe impl aya::Pod for SampleKey {}
    unsafe impl aya::Pod for SampleValue {}
    unsafe impl aya::Pod for BuildIdStack {}
    unsafe impl aya::Pod for BuildIdKey {}
    unsafe impl aya::Pod for CounterDeltas {}
    unsafe impl aya::Pod for unwind::Row {}
    unsafe impl aya::Pod for unwind::ProcessMappings {}
    unsafe impl aya::Pod for unwind::UserStack {}
    unsafe impl aya::Pod for python::PyProcess {}
    unsafe impl aya::Pod for ExitedKey {}
    unsafe impl aya::Pod for ProcessEvent {}
    unsafe impl aya::Pod for ForkOffsets {}
    unsafe impl aya::Pod for ExitOffsets {}
    unsafe impl aya::Pod for TaskSched {}
    unsafe impl aya::Pod for CpuHistory {}
    unsafe impl aya::Pod for OffCpuTime {}
    unsafe impl aya::Pod for TaskOffsets {}
    unsafe impl aya::Pod for ExecOffsets {}
    unsafe impl aya::Pod for OffCpuSampling {}
    unsafe impl aya::Pod for Running {}
    unsafe impl aya::Pod for SlowEvent {}
    unsafe impl aya::Pod for lock::LockKey {}
    unsafe impl aya::Pod for lock::LockTime {}
    unsafe impl aya::Pod for lock::LockId {}
    unsafe impl aya::Pod for lock::LockState {}
    unsafe impl aya::Pod for lock::ThreadOffsets {}
    unsafe impl aya::Pod for lock::Waiting {}
    unsafe impl aya::Pod for lock::LastWake {}
    unsafe impl aya::Pod for syscalls::SyscallEntry {}
    unsafe impl aya::Pod for latency::LatencyKey {}
    unsafe impl aya::Pod for latency::LatencyKeys {}
    unsafe impl aya::Pod for latency::LatencyStart {}
    unsafe impl aya::Pod for syscalls::SyscallKey {}
    unsafe impl aya::Pod for syscalls::SyscallTotals {}
    unsafe impl aya::Pod for records::HitRecord {}
    unsafe impl aya::Pod for records::Fetch {}
    unsafe impl aya::Pod for FilterTerm {}
    unsafe impl aya::Pod for values::ByField {}
    unsafe impl aya::Pod for values::ValueKey {}
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A function's arguments and return value: x86-64's System V order in `struct pt_regs` (rdi at 112 ... r9 at
    /// 64, rax at 80), AArch64's x0-x5 at 8 bytes each (the return value in x0).
    #[test]
    fn weights_read_the_calling_conventions_registers() {
        use hit_weight::*;
        assert_eq!(register_offset(ARG0 + 1, false), Some(112));
        assert_eq!(register_offset(ARG0 + 6, false), Some(64));
        assert_eq!(register_offset(RETVAL, false), Some(80));
        assert_eq!(register_offset(ARG0 + 3, true), Some(16));
        assert_eq!(register_offset(RETVAL, true), Some(0));
        assert_eq!(register_offset(ARG0, false), None);
    }

    #[test]
    fn multiplexed_deltas_scale_by_enabled_over_running() {
        let mut d = CounterDeltas {
            enabled_ns: 100,
            ..Default::default()
        };
        d.values[0] = 1000;
        d.running_ns[0] = 100;
        d.values[1] = 300;
        d.running_ns[1] = 25;
        d.values[2] = 7;
        let mut sum = CounterDeltas::default();
        sum.add(&d);
        sum.add(&d);
        assert_eq!(sum.estimate(0), Some(2000), "ran all the time: as counted");
        assert_eq!(
            sum.estimate(1),
            Some(2400),
            "ran a quarter of the time: times four"
        );
        assert_eq!(sum.estimate(2), None, "never ran: no estimate");
        assert_eq!(sum.running_share(1), 0.25);
        // A run's share of running sums: the later reading less the earlier one.
        let run = sum.since(&d);
        assert_eq!(run, d, "two intervals summed, less the first");
        assert_eq!(d.since(&sum).values[0], 0, "never below zero");
        let untimed = CounterDeltas {
            values: [5; MAX_COUNTERS],
            ..Default::default()
        };
        assert_eq!(
            untimed.estimate(3),
            Some(5),
            "values without times are taken as they are"
        );
    }

    #[test]
    fn switch_reasons_follow_the_kernels_task_states() {
        use switch_reason::*;
        // TASK_RUNNING, and a task preempted after it set TASK_INTERRUPTIBLE: still runnable.
        assert_eq!(classify(false, 0), PREEMPTED);
        assert_eq!(classify(true, 0x1), PREEMPTED);
        assert_eq!(classify(false, 0x1), SLEEPING);
        // TASK_KILLABLE = WAKEKILL | UNINTERRUPTIBLE: blocked; TASK_IDLE = UNINTERRUPTIBLE | NOLOAD: not.
        assert_eq!(classify(false, 0x100 | 0x2), BLOCKED);
        assert_eq!(classify(false, 0x2 | 0x400), SLEEPING);
        assert_eq!(classify(false, 0x1000), BLOCKED);
        // Stopped, parked, and the final switch of a dying task.
        assert_eq!(classify(false, 0x4), SLEEPING);
        assert_eq!(classify(false, 0x40), SLEEPING);
        assert_eq!(classify(false, 0x80), EXITING);
    }

    #[test]
    fn histogram_buckets_are_monotonic_and_narrow() {
        let mut last = 0;
        for v in [
            0u64,
            1,
            15,
            16,
            17,
            31,
            32,
            100,
            1_000,
            65_535,
            1_000_000,
            123_456_789,
            1 << 39,
        ] {
            let b = hist_bucket(v);
            assert!(b >= last, "bucket of {v} went backwards");
            last = b;
            let lo = hist_lower_bound(b);
            let hi = hist_lower_bound(b + 1);
            assert!(lo <= v && v < hi, "{v} not in [{lo}, {hi}) of bucket {b}");
            assert!(
                (hi - lo) as f64 <= (lo as f64 / 16.0).max(1.0),
                "bucket {b} too wide: [{lo}, {hi})"
            );
        }
        assert_eq!(hist_bucket(u64::MAX), HIST_BUCKETS - 1);
        for b in 0..HIST_BUCKETS - 1 {
            assert_eq!(
                hist_bucket(hist_lower_bound(b)),
                b,
                "lower bound of {b} maps back"
            );
        }
    }
}
