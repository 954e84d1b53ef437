//! Time a hypervisor took from this machine's CPUs (steal, from /proc/stat). A clock-driven
//! figure (cpu-clock samples, task-clock, the thread states' running time) runs through it; a
//! thread's own CPU clock does not (the kernel's paravirtual steal accounting). A report says
//! how much was stolen during its run when it was enough to show in its figures.
use std::time::Duration;

/// Steal of at least this share of the CPUs' time is said in the report.
const WORTH_SAYING: f64 = 0.01;

/// The machine's steal so far, read at a run's start.
pub struct Steal {
    ticks: Option<u64>,
}

impl Steal {
    pub fn now() -> Steal {
        Steal { ticks: read_ticks() }
    }

    /// What was stolen since `self`, as a report note, if at least `WORTH_SAYING` of `cpus`
    /// CPUs over `elapsed` (None: too little, or no /proc/stat).
    pub fn note_since(&self, cpus: u32, elapsed: Duration) -> Option<String> {
        let ticks = read_ticks()?.checked_sub(self.ticks?)?;
        let stolen = ticks.saturating_mul(crate::collect::clock_tick_ns()?) as f64 / 1e9;
        let available = cpus.max(1) as f64 * elapsed.as_secs_f64();
        let share = stolen / available;
        (available > 0.0 && share >= WORTH_SAYING).then(|| {
            format!(
                "the hypervisor took {stolen:.2} s of the {cpus} CPUs' time during the run ({:.1}%): \
                 CPU time measured by a clock (cpu-clock samples, task-clock, running time) includes it, \
                 a thread's own CPU clock does not",
                100.0 * share
            )
        })
    }
}

fn read_ticks() -> Option<u64> {
    parse_steal(&std::fs::read_to_string("/proc/stat").ok()?)
}

/// The steal column of /proc/stat's `cpu` line: user nice system idle iowait irq softirq steal.
fn parse_steal(stat: &str) -> Option<u64> {
    let cpu = stat.lines().find(|l| l.starts_with("cpu "))?;
    cpu.split_whitespace().nth(8)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steal_is_the_eighth_column_of_the_cpu_line() {
        let stat = "cpu  100 2 30 4000 5 6 7 250 0 0\ncpu0 50 1 15 2000 2 3 3 125 0 0\n";
        assert_eq!(parse_steal(stat), Some(250));
        assert_eq!(parse_steal("cpu  1 2 3\n"), None);
        assert_eq!(parse_steal("intr 5\n"), None);
    }

    #[test]
    fn too_little_steal_is_not_said() {
        let never = Steal { ticks: None };
        assert_eq!(never.note_since(2, Duration::from_secs(1)), None);
        // Steal cannot go backwards: a reading from the future says nothing.
        let future = Steal {
            ticks: Some(u64::MAX),
        };
        assert_eq!(future.note_since(2, Duration::from_secs(1)), None);
    }
}
