//! Each CPU over a sched run: the traced tasks' run-queue waits on it (the kernel side's per-CPU
//! sums, kept since tracing began) and its idle time (the kernel's own count, /proc/stat's idle
//! and iowait, in clock ticks: to 10 ms at the usual 100 a second).
use std::collections::BTreeMap;

use anyhow::Context as _;
use aya::maps::{MapData, PerCpuArray};
use profiler_common::{CpuHistory, CpuWaits};

/// One CPU over the run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CpuRecord {
    pub cpu: u32,
    /// Waits that ended on it.
    pub waits: CpuWaits,
    /// Waits settled on it whose CPU is not known (`CpuHistory::unplaced`).
    pub unplaced: CpuWaits,
    /// Idle (or waiting for I/O) within `idle_window_ns`; none where /proc/stat could not be
    /// read (or the CPU was offline at either end).
    pub idle_ns: Option<u64>,
    /// The span the idle time was measured over (the same for every CPU).
    pub idle_window_ns: u64,
}

/// Each CPU's idle time at one moment (`monotonic_ns`): none where /proc/stat cannot be read.
#[derive(Clone, Debug, Default)]
pub struct IdleAt {
    pub at_ns: u64,
    pub idle_ns: BTreeMap<u32, u64>,
}

impl IdleAt {
    pub fn now() -> Option<IdleAt> {
        let tick_ns = crate::collect::clock_tick_ns()?;
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        Some(IdleAt {
            at_ns: crate::collect::monotonic_ns(),
            idle_ns: idle_of(&stat, tick_ns),
        })
    }
}

/// The idle and iowait columns (the 4th and 5th after the name) of each `cpuN` line of a
/// /proc/stat, in ns. A line that does not parse is left out.
pub fn idle_of(stat: &str, tick_ns: u64) -> BTreeMap<u32, u64> {
    let cpu_line = |line: &str| -> Option<(u32, u64)> {
        let mut fields = line.split_ascii_whitespace();
        let cpu = fields.next()?.strip_prefix("cpu")?.parse().ok()?;
        let mut ticks = fields.skip(3).map(|f| f.parse::<u64>().ok());
        let (idle, iowait) = (ticks.next()??, ticks.next().flatten().unwrap_or(0));
        Some((cpu, idle.saturating_add(iowait).saturating_mul(tick_ns)))
    };
    stat.lines().filter_map(cpu_line).collect()
}

/// Each CPU's record: its waits as the kernel side summed them (`history`: `CPU_HISTORY`), the
/// waits still open at the end on the CPU each is on (`open`: (CPU, delay)), and its idle time
/// from `start` to `end`. Empty, said in the log, where the map cannot be read.
pub fn records(
    history: &PerCpuArray<MapData, CpuHistory>,
    open: impl IntoIterator<Item = (u32, u64)>,
    start: Option<&IdleAt>,
    end: Option<&IdleAt>,
) -> Vec<CpuRecord> {
    let read = || -> anyhow::Result<_> {
        let values = history.get(&0, 0)?;
        const POSSIBLE: &str = "/sys/devices/system/cpu/possible";
        let possible = std::fs::read_to_string(POSSIBLE).map(|list| cpu_list(&list));
        let possible = possible.with_context(|| format!("reading {POSSIBLE}"))?;
        // Per-CPU values come in the order of the possible CPUs.
        Ok(possible
            .into_iter()
            .zip(values.iter().copied())
            .collect::<Vec<_>>())
    };
    let per_cpu = match read() {
        Ok(per_cpu) => per_cpu,
        Err(e) => {
            log::warn!("the run-queue waits per CPU could not be read: {e:#}");
            return Vec::new();
        }
    };
    let online = aya::util::online_cpus().unwrap_or_default();
    let mut rows: Vec<CpuRecord> = per_cpu
        .into_iter()
        .map(|(cpu, history)| CpuRecord {
            cpu,
            waits: history.waits,
            unplaced: history.unplaced,
            idle_ns: idle_between(start, end, cpu),
            idle_window_ns: start.zip(end).map_or(0, |(s, e)| e.at_ns.saturating_sub(s.at_ns)),
        })
        .collect();
    for (cpu, delay) in open {
        if let Some(row) = rows.iter_mut().find(|r| r.cpu == cpu) {
            row.waits.add(delay);
        }
    }
    // A CPU offline all along has nothing to say.
    rows.retain(|r| online.contains(&r.cpu) || r.waits.waits > 0 || r.unplaced.waits > 0);
    rows
}

/// A kernel CPU list (`0-3,8,10-11`) as CPU numbers; what does not parse is left out, and no
/// range reaches past `MAX_CPUS`.
fn cpu_list(list: &str) -> Vec<u32> {
    const MAX_CPUS: u32 = 1 << 16;
    let range = |part: &str| -> Option<std::ops::RangeInclusive<u32>> {
        let (first, last) = part.split_once('-').unwrap_or((part, part));
        Some(first.trim().parse().ok()?..=last.trim().parse::<u32>().ok()?.min(MAX_CPUS))
    };
    list.trim().split(',').filter_map(range).flatten().collect()
}

fn idle_between(start: Option<&IdleAt>, end: Option<&IdleAt>, cpu: u32) -> Option<u64> {
    let (start, end) = (start?.idle_ns.get(&cpu)?, end?.idle_ns.get(&cpu)?);
    Some(end.saturating_sub(*start))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_is_the_idle_and_iowait_ticks_of_each_cpu_line() {
        let stat = "cpu  4028691 105930 304645 1301470 11057 0 3588 25750 0 0\n\
                    cpu0 1938109 41662 140250 752897 3855 0 968 12805 0 0\n\
                    cpu1 2090582 64268 164394 548573 7201 0 2620 12944 0 0\n\
                    cpu7 1 2 3 4\n\
                    cpux 1 2 3 4 5\n\
                    cpu2 1 2\n\
                    intr 1 2 3 4 5 6\n";
        let idle = idle_of(stat, 10_000_000);
        assert_eq!(
            idle.into_iter().collect::<Vec<_>>(),
            [
                (0, (752897 + 3855) * 10_000_000),
                (1, (548573 + 7201) * 10_000_000),
                // A kernel before iowait (2.5): idle alone.
                (7, 4 * 10_000_000)
            ],
            "the machine's line, a garbled name and a short line left out"
        );
    }

    #[test]
    fn idle_is_the_growth_between_two_readings_of_a_cpu_read_at_both() {
        let at = |at_ns, idle: &[(u32, u64)]| IdleAt {
            at_ns,
            idle_ns: idle.iter().copied().collect(),
        };
        let (start, end) = (at(10, &[(0, 100), (1, 50)]), at(90, &[(0, 130), (2, 7)]));
        assert_eq!(idle_between(Some(&start), Some(&end), 0), Some(30));
        assert_eq!(
            idle_between(Some(&start), Some(&end), 1),
            None,
            "offline at the end"
        );
        assert_eq!(
            idle_between(Some(&start), Some(&end), 2),
            None,
            "online only at the end"
        );
        assert_eq!(idle_between(None, Some(&end), 0), None);
    }

    #[test]
    fn cpu_lists_as_the_kernel_writes_them() {
        assert_eq!(cpu_list("0-3,8,10-11\n"), [0, 1, 2, 3, 8, 10, 11]);
        assert_eq!(cpu_list("0\n"), [0]);
        assert_eq!(cpu_list("x,2-1,4"), [4], "garbage and an empty range");
        assert_eq!(cpu_list("0-4294967295").len(), (1 << 16) + 1, "bounded");
    }
}
