//! Topdown mode. With a hardware PMU: TMA level 1 and IPC for the run and per hot function (the
//! counters read at each sample). Without one (this VM, most cloud VMs): say so in one line, then
//! give where each thread's time went instead, clearly labelled: running, runnable (waiting for a CPU), sleeping, blocked (uninterruptible,
//! usually I/O), from the scheduler tracepoints. PMU numbers are never made up.

use std::collections::BTreeMap;

use serde::Serialize;

use super::sched::{OpenState, SchedCollection};
use crate::{
    counters::{
        events::CounterSet,
        tma::{self, Count, Counts, Level1, Machine, Tma},
    },
    model::{RunMeta, StackReport},
    profile::Health,
};

/// Functions shown in the per-function table (by own samples).
pub const TOP_FUNCTIONS: usize = 25;

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ThreadState {
    pub pid: u32,
    pub tid: u32,
    pub comm: String,
    pub running_ns: u64,
    pub runnable_ns: u64,
    pub sleeping_ns: u64,
    pub blocked_ns: u64,
}

impl ThreadState {
    pub fn total_ns(&self) -> u64 {
        self.running_ns + self.runnable_ns + self.sleeping_ns + self.blocked_ns
    }

    fn add(&mut self, other: &ThreadState) {
        self.running_ns += other.running_ns;
        self.runnable_ns += other.runnable_ns;
        self.sleeping_ns += other.sleeping_ns;
        self.blocked_ns += other.blocked_ns;
    }
}

/// One counter's total over the run, scaled for multiplexing.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct CounterValue {
    pub event: String,
    pub value: f64,
    /// Share of the run the counter was on the PMU (1 = not multiplexed).
    pub running: f64,
}

/// One hot function: what the counters advanced in the intervals sampled in it (as the leaf),
/// and for the topdown set its level-1 split and IPC from those deltas.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FunctionCounters {
    pub function: String,
    pub module: String,
    pub samples: u64,
    pub level1: Option<Level1>,
    pub ipc: Option<f64>,
    pub metrics: BTreeMap<String, f64>,
    /// Each counter's deltas in this function, scaled where it was multiplexed.
    pub counters: BTreeMap<String, u64>,
}

#[derive(Clone, Debug)]
pub struct TopdownReport {
    pub meta: RunMeta,
    pub health: Health,
    /// "pmu" when level 1 comes from hardware counters, else "thread-state".
    pub source: &'static str,
    /// Why the PMU split is not shown (empty when it is).
    pub reason: String,
    /// The CPU, its topdown method and the PMUs the kernel exposes (live runs only).
    pub cpu: String,
    /// The PMU analysis, when counters were available.
    pub tma: Option<Tma>,
    /// The counter set counted over the whole run (`--preset`), if any, and its totals.
    pub preset: Option<&'static str>,
    pub counters: Vec<CounterValue>,
    /// The counter set read at each sample, per function, hottest first (empty when the set
    /// cannot be counted here).
    pub functions: Vec<FunctionCounters>,
    /// What the functions' samples were taken on ("cycles", "cpu-clock"), and how many.
    pub sampled_on: Option<String>,
    pub samples: u64,
    /// Most running time first.
    pub threads: Vec<ThreadState>,
    /// Per process (tid = 0, comm of its first thread), most running time first.
    pub processes: Vec<ThreadState>,
}

/// Where each thread's time went during the run, including the interval it was in at the end.
pub fn thread_states(meta: RunMeta, health: Health, c: &SchedCollection, reason: String) -> TopdownReport {
    let mut threads: Vec<ThreadState> = c
        .tasks
        .iter()
        .map(|t| {
            let mut s = ThreadState {
                pid: t.pid,
                tid: t.tid,
                comm: t.comm.clone(),
                running_ns: t.running_ns,
                runnable_ns: t.total_delay_ns,
                sleeping_ns: t.sleeping_ns,
                blocked_ns: t.blocked_ns,
            };
            match t.open {
                Some((OpenState::Running, ns)) => s.running_ns += ns,
                Some((OpenState::Runnable, ns)) => s.runnable_ns += ns,
                Some((OpenState::Sleeping, ns)) => s.sleeping_ns += ns,
                Some((OpenState::Blocked, ns)) => s.blocked_ns += ns,
                None => {}
            }
            s
        })
        .filter(|s| s.total_ns() > 0)
        .collect();
    threads.sort_by(|a, b| b.running_ns.cmp(&a.running_ns).then(a.tid.cmp(&b.tid)));

    let mut by_pid: BTreeMap<u32, ThreadState> = BTreeMap::new();
    for t in &threads {
        let p = by_pid.entry(t.pid).or_insert_with(|| ThreadState {
            pid: t.pid,
            comm: t.comm.clone(),
            ..Default::default()
        });
        p.add(t);
    }
    let mut processes: Vec<ThreadState> = by_pid.into_values().collect();
    processes.sort_by(|a, b| b.running_ns.cmp(&a.running_ns).then(a.pid.cmp(&b.pid)));
    TopdownReport {
        meta,
        health,
        source: "thread-state",
        reason,
        cpu: crate::counters::cpu::describe(),
        tma: None,
        preset: None,
        counters: Vec::new(),
        functions: Vec::new(),
        sampled_on: None,
        samples: 0,
        threads,
        processes,
    }
}

/// The report for counts read from a `perf stat -x,` file.
pub fn from_counters(meta: RunMeta, tma: Tma) -> TopdownReport {
    TopdownReport {
        meta,
        health: Health::default(),
        source: "pmu",
        reason: String::new(),
        cpu: String::new(),
        tma: Some(tma),
        preset: None,
        counters: Vec::new(),
        functions: Vec::new(),
        sampled_on: None,
        samples: 0,
        threads: Vec::new(),
        processes: Vec::new(),
    }
}

/// Add what a counter set counted over the run. For the topdown set, level 1 where the CPU
/// family has one (then the source is "pmu"), else IPC and derived metrics with the reason.
pub fn with_counts(
    mut report: TopdownReport,
    set: &CounterSet,
    counts: &Counts,
    machine: Machine,
) -> TopdownReport {
    let preset = set.name;
    let mut counters: Vec<CounterValue> = counts
        .events
        .iter()
        .map(|(event, c)| CounterValue {
            event: event.clone(),
            value: c.value,
            running: c.running,
        })
        .collect();
    counters.sort_by(|a, b| a.event.cmp(&b.event));
    let tma = if preset != "topdown" {
        tma::derived_only(counts)
    } else {
        match tma::analyze(counts, machine) {
            Ok(tma) => {
                report.source = "pmu";
                report.reason.clear();
                tma
            }
            Err(e) => {
                report.reason = e.to_string();
                tma::derived_only(counts)
            }
        }
    };
    // A hardware counter that ran the whole time and read exactly 0 is an event this CPU does
    // not count (the stall events of QEMU's emulated PMU), not a measured zero: no share or
    // split is made of it.
    let silent = counts.silent();
    let tma = match (set.hardware, silent.is_empty()) {
        (true, false) => {
            report.meta.notes.push(format!(
                "counted nothing over the whole run (each read exactly 0: this CPU does not count them), so nothing is derived from them: {}",
                silent.join(", ")
            ));
            tma::without_silent(tma, &silent)
        }
        _ => tma,
    };
    if !counts.not_counted.is_empty() {
        report.meta.notes.push(format!(
            "never counted (multiplexed out, or the targets never ran): {}",
            counts.not_counted.join(", ")
        ));
    }
    let hardware = tma.ipc.is_some() || !tma.metrics.is_empty() || tma.level1.is_some();
    report.tma = hardware.then_some(tma);
    report.preset = Some(preset);
    report.counters = counters;
    report
}

/// Add the per-function table: the hottest functions of the sampled stacks, each with the
/// counter deltas of its own samples and, for the topdown set, the level-1 split they give.
pub fn with_functions(
    mut report: TopdownReport,
    sampled: &StackReport,
    set: &str,
    machine: Machine,
) -> TopdownReport {
    let names = &sampled.meta.counters;
    report.functions = sampled
        .functions
        .iter()
        .filter(|f| f.self_samples > 0)
        .take(TOP_FUNCTIONS)
        .map(|f| {
            let counters: BTreeMap<String, u64> = names
                .iter()
                .zip(&f.counters)
                .map(|(name, &value)| (name.to_string(), value))
                .collect();
            let counts = Counts {
                events: counters
                    .iter()
                    .map(|(name, &value)| {
                        let count = Count {
                            value: value as f64,
                            running: 1.0,
                        };
                        (name.clone(), count)
                    })
                    .collect(),
                not_counted: Vec::new(),
            };
            // Level 1 needs cycles in the function's intervals; a function sampled only on
            // intervals another thread began has none, and gets no split rather than a wrong one.
            let tma = match set {
                "topdown" => tma::analyze(&counts, machine).unwrap_or_else(|_| tma::derived_only(&counts)),
                _ => tma::derived_only(&counts),
            };
            FunctionCounters {
                function: f.function.clone(),
                module: f.module.clone(),
                samples: f.self_samples,
                level1: tma.level1.filter(Level1::is_finite),
                ipc: tma.ipc.filter(|v| v.is_finite()),
                metrics: tma.metrics.into_iter().filter(|(_, v)| v.is_finite()).collect(),
                counters,
            }
        })
        .collect();
    report.sampled_on = Some(sampled.meta.event.clone());
    report.samples = sampled.samples;
    report.meta.notes.extend(
        sampled
            .meta
            .notes
            .iter()
            .filter(|n| !report.meta.notes.contains(n))
            .cloned()
            .collect::<Vec<_>>(),
    );
    report
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::modes::sched::TaskRecord;

    fn record(pid: u32, tid: u32, open: Option<(OpenState, u64)>) -> TaskRecord {
        TaskRecord {
            pid,
            tid,
            comm: "w".into(),
            runs: 1,
            delays: 1,
            total_delay_ns: 10,
            max_delay_ns: 10,
            max_at_ns: 0,
            running_ns: 100,
            sleeping_ns: 1000,
            blocked_ns: 5,
            hist: vec![],
            open,
        }
    }

    #[test]
    fn open_intervals_count_and_processes_sum_their_threads() {
        let collection = SchedCollection {
            tasks: vec![
                record(1, 1, Some((OpenState::Sleeping, 500))),
                record(1, 2, Some((OpenState::Running, 50))),
                record(3, 3, None),
            ],
            ..Default::default()
        };
        let meta = crate::report::tests::sample_report().meta;
        let r = thread_states(meta, Health::default(), &collection, "no PMU".into());
        let t1 = r.threads.iter().find(|t| t.tid == 1).unwrap();
        assert_eq!((t1.running_ns, t1.sleeping_ns), (100, 1500));
        assert_eq!(r.threads[0].tid, 2, "most running first");
        let p1 = r.processes.iter().find(|p| p.pid == 1).unwrap();
        assert_eq!(
            (p1.running_ns, p1.runnable_ns, p1.sleeping_ns, p1.blocked_ns),
            (250, 20, 2500, 10)
        );
        assert_eq!(r.processes.len(), 2);
    }

    /// Per-function level 1 from recorded counter deltas of a Skylake-class CPU (TOPDOWN.md's
    /// pre-ICL formulas), two functions with opposite profiles and one without cycles.
    #[test]
    fn functions_get_their_own_level1_and_ipc_from_their_deltas() {
        use crate::model::{function_stats, tests::stack};
        let names = [
            "cpu_clk_unhalted.thread",
            "instructions",
            "idq_uops_not_delivered.core",
            "uops_issued.any",
            "uops_retired.retire_slots",
            "int_misc.recovery_cycles",
        ];
        let with = |frames: &[&str], count, counters: Vec<u64>| {
            let mut s = stack(frames, count);
            s.counters = counters;
            s
        };
        let stacks = vec![
            // 1e6 cycles = 4e6 slots: 25% not delivered, 55% retired, (2.4 - 2.2 + 0.2) / 4 =
            // 10% bad speculation, so 10% backend; IPC 2.
            with(
                &["main", "compute"],
                60,
                vec![1_000_000, 2_000_000, 1_000_000, 2_400_000, 2_200_000, 50_000],
            ),
            // Split over two stacks that add up: 10% retiring, 5% frontend, 0% bad spec.
            with(
                &["main", "a", "wait_memory"],
                20,
                vec![1_000_000, 300_000, 200_000, 400_000, 400_000, 0],
            ),
            with(
                &["main", "b", "wait_memory"],
                20,
                vec![1_000_000, 300_000, 200_000, 400_000, 400_000, 0],
            ),
            with(&["main", "idle_looking"], 3, vec![0; 6]),
        ];
        let mut sampled = crate::report::tests::sample_report();
        sampled.meta.counters = names.iter().map(|n| n.to_string()).collect();
        sampled.functions = function_stats(&stacks);
        let meta = sampled.meta.clone();
        let report = with_functions(
            thread_states(
                meta,
                Health::default(),
                &SchedCollection::default(),
                String::new(),
            ),
            &sampled,
            "topdown",
            Machine::default(),
        );
        let get = |n: &str| report.functions.iter().find(|f| f.function == n).unwrap();
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;

        let compute = get("compute").level1.unwrap();
        assert!(close(compute.frontend_bound, 0.25) && close(compute.retiring, 0.55));
        assert!(close(compute.bad_speculation, 0.10) && close(compute.backend_bound, 0.10));
        assert!(close(get("compute").ipc.unwrap(), 2.0));

        let memory = get("wait_memory");
        assert_eq!(memory.samples, 40);
        assert_eq!(memory.counters["cpu_clk_unhalted.thread"], 2_000_000);
        let l = memory.level1.unwrap();
        assert!(close(l.retiring, 0.10) && close(l.frontend_bound, 0.05) && close(l.bad_speculation, 0.0));
        assert!(close(l.backend_bound, 0.85), "{l:?}");
        assert!(close(memory.ipc.unwrap(), 0.3));

        let idle = get("idle_looking");
        assert_eq!(
            (idle.level1, idle.ipc),
            (None, None),
            "no cycles: no made-up split"
        );
        assert_eq!(report.functions[0].function, "compute", "hottest first");
    }
}
