//! Top-down microarchitecture analysis, level 1, from counter values: the formulas per CPU family
//! (../shared/TOPDOWN.md, after pmu-tools and the kernel's perf events), and the reader for
//! `perf stat -x,` output, so a report can be computed from counts taken on another machine.
use std::collections::HashMap;

use serde::Serialize;

/// One counter as perf reports it: already scaled by time_enabled / time_running.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Count {
    pub value: f64,
    /// Share of the measurement the counter was actually running (1.0 without multiplexing).
    pub running: f64,
}

/// Counter values by normalized event name (lower case, no PMU prefix or modifiers).
#[derive(Clone, Debug, Default)]
pub struct Counts {
    pub events: HashMap<String, Count>,
    /// Events perf listed but could not count ("<not counted>", "<not supported>").
    pub not_counted: Vec<String>,
}

impl Counts {
    fn get(&self, name: &str) -> Option<f64> {
        self.events.get(name).filter(|c| c.running > 0.0).map(|c| c.value)
    }

    /// Counters that ran and read exactly 0, by name.
    pub fn silent(&self) -> Vec<String> {
        let mut silent: Vec<String> = self
            .events
            .iter()
            .filter(|(_, c)| c.running > 0.0 && c.value == 0.0)
            .map(|(name, _)| name.clone())
            .collect();
        silent.sort();
        silent
    }

    fn need(&self, names: &[&str]) -> Result<Vec<f64>, TmaError> {
        let missing: Vec<String> = names
            .iter()
            .filter(|n| self.get(n).is_none())
            .map(|n| n.to_string())
            .collect();
        if !missing.is_empty() {
            return Err(TmaError::Missing(missing));
        }
        Ok(names.iter().map(|n| self.get(n).unwrap()).collect())
    }
}

#[derive(Debug, PartialEq, thiserror::Error)]
pub enum TmaError {
    #[error("the counters needed for topdown are missing or never ran: {}", .0.join(", "))]
    Missing(Vec<String>),
    #[error("{0}")]
    Unsupported(String),
    #[error("line {line}: not `perf stat -x,` output: {text}")]
    NotPerfCsv { line: usize, text: String },
}

/// The CPU families with a level-1 method, each with the events it needs.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub enum Family {
    /// Skylake/Cascade Lake and older big cores: 4 slots per cycle.
    IntelPreIcl,
    /// Ice Lake and later: the `slots` fixed counter and the topdown metric events.
    IntelIcl,
    /// Zen 4 (6 slots) and Zen 5 (8 slots).
    AmdZen { slots: u32 },
    /// Neoverse V1, N2, V2 and later: slot-based stall events, by each core's own formula.
    ArmSlots { slots: u32, core: ArmCore },
    /// Neoverse N1: stall cycles only, no four-way split.
    ArmCycles,
}

/// The Arm cores whose level-1 formulas differ (Arm's telemetry specification of each).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub enum ArmCore {
    /// Neoverse V1: 8 slots; a mispredict costs the front end 4 slots.
    V1,
    /// Neoverse N2 (5 slots); before r0p3 STALL_SLOT and STALL_SLOT_FRONTEND count one slot per
    /// cycle too many (erratum).
    N2 { erratum: bool },
    /// Neoverse V2 (8 slots).
    V2,
    /// An Arm core not in bpfprof's table (and a counters file's): V2's formula, Arm's current
    /// one, with the slot count the PMU gives (caps/slots, or `--slots`), never a guessed one.
    #[default]
    Unlisted,
}

impl ArmCore {
    /// Slots per cycle, where the core fixes it.
    pub fn slots(self) -> Option<u32> {
        match self {
            ArmCore::V1 | ArmCore::V2 => Some(8),
            ArmCore::N2 { .. } => Some(5),
            ArmCore::Unlisted => None,
        }
    }
}

/// What the formulas need to know of the CPU besides its counts.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Machine {
    /// Pipeline slots per cycle, where the family or the PMU says.
    pub slots: Option<u32>,
    /// The Arm core, from its MIDR (live runs; a counters file gets V2's formula).
    pub arm: Option<ArmCore>,
}

impl Machine {
    pub fn with_slots(slots: Option<u32>) -> Machine {
        Machine { slots, arm: None }
    }
}

impl Family {
    /// The family whose events a set of counts holds.
    pub fn detect(counts: &Counts, machine: Machine) -> Result<Family, TmaError> {
        let slots = machine.slots;
        let has = |n: &str| counts.events.contains_key(n);
        if has("topdown-retiring") || has("topdown-fe-bound") {
            Ok(Family::IntelIcl)
        } else if has("idq_uops_not_delivered.core") {
            Ok(Family::IntelPreIcl)
        } else if has("de_no_dispatch_per_slot.no_ops_from_frontend") {
            Ok(Family::AmdZen {
                slots: slots.unwrap_or(6),
            })
        } else if has("stall_slot_frontend") {
            match slots {
                Some(slots) if slots > 0 => Ok(Family::ArmSlots {
                    slots,
                    core: machine.arm.unwrap_or_default(),
                }),
                _ => Err(TmaError::Unsupported(
                    "Arm slot events need the core's slot count (caps/slots of the armv8 PMU): pass --slots N".into(),
                )),
            }
        } else if has("stall_frontend") && has("stall_backend") {
            Ok(Family::ArmCycles)
        } else {
            Err(TmaError::Unsupported(
                "no topdown events found (expected Intel topdown-*/idq_uops_not_delivered, AMD de_no_dispatch_per_slot, or Arm stall_slot_* events)".into(),
            ))
        }
    }

    pub fn name(self) -> String {
        match self {
            Family::IntelPreIcl => "Intel (Skylake-class, 4 slots)".into(),
            Family::IntelIcl => "Intel (Ice Lake and later)".into(),
            Family::AmdZen { slots } => format!("AMD Zen ({slots} slots)"),
            Family::ArmSlots { slots, core } => format!("Arm Neoverse ({core:?} formula, {slots} slots)"),
            Family::ArmCycles => "Arm Neoverse N1 (stall cycles)".into(),
        }
    }
}

/// Fractions of pipeline slots, 0..1, summing to 1.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Level1 {
    pub retiring: f64,
    pub bad_speculation: f64,
    pub frontend_bound: f64,
    pub backend_bound: f64,
}

impl Level1 {
    /// False for the split of intervals with no cycles (0 / 0).
    pub fn is_finite(&self) -> bool {
        [
            self.retiring,
            self.bad_speculation,
            self.frontend_bound,
            self.backend_bound,
        ]
        .iter()
        .all(|v| v.is_finite())
    }
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Tma {
    pub family: String,
    pub level1: Option<Level1>,
    pub ipc: Option<f64>,
    /// Derived metrics (fractions), by name.
    pub metrics: Vec<(String, f64)>,
    /// Counters that ran less than the whole time (multiplexed), with their running share.
    pub multiplexed: Vec<(String, f64)>,
}

fn clamp(x: f64) -> f64 {
    x.clamp(0.0, 1.0)
}

pub fn level1(family: Family, c: &Counts) -> Result<Option<Level1>, TmaError> {
    Ok(Some(match family {
        Family::IntelPreIcl => {
            let v = c.need(&[
                "cpu_clk_unhalted.thread",
                "idq_uops_not_delivered.core",
                "uops_issued.any",
                "uops_retired.retire_slots",
                "int_misc.recovery_cycles",
            ])?;
            let slots = 4.0 * v[0];
            let frontend_bound = clamp(v[1] / slots);
            let bad_speculation = clamp((v[2] - v[3] + 4.0 * v[4]) / slots);
            let retiring = clamp(v[3] / slots);
            Level1 {
                retiring,
                bad_speculation,
                frontend_bound,
                backend_bound: clamp(1.0 - frontend_bound - bad_speculation - retiring),
            }
        }
        Family::IntelIcl => {
            let v = c.need(&[
                "slots",
                "topdown-retiring",
                "topdown-bad-spec",
                "topdown-fe-bound",
                "topdown-be-bound",
            ])?;
            let (slots, ret, fe, be) = (v[0], v[1], v[3], v[4]);
            let n = v[1] + v[2] + v[3] + v[4];
            let dropping = c.get("int_misc.uop_dropping").unwrap_or(0.0);
            let clears = c.get("int_misc.clears_count").unwrap_or(0.0);
            let frontend_bound = clamp(fe / n - dropping / slots);
            let backend_bound = clamp(be / n + 5.0 * clears / slots);
            let retiring = clamp(ret / n);
            Level1 {
                retiring,
                frontend_bound,
                backend_bound,
                bad_speculation: clamp(1.0 - frontend_bound - backend_bound - retiring),
            }
        }
        Family::AmdZen { slots } => {
            let v = c.need(&[
                "ls_not_halted_cyc",
                "de_no_dispatch_per_slot.no_ops_from_frontend",
                "de_no_dispatch_per_slot.backend_stalls",
                "de_src_op_disp.all",
                "ex_ret_ops",
            ])?;
            let total = slots as f64 * v[0];
            Level1 {
                frontend_bound: clamp(v[1] / total),
                backend_bound: clamp(v[2] / total),
                bad_speculation: clamp((v[3] - v[4]) / total),
                retiring: clamp(v[4] / total),
            }
        }
        Family::ArmSlots { slots, core } => {
            let v = c.need(&[
                "cpu_cycles",
                "stall_slot_frontend",
                "stall_slot_backend",
                "stall_slot",
                "op_retired",
                "op_spec",
                "br_mis_pred",
            ])?;
            let (cycles, mut fe_stall, be_stall, mut stall, retired, spec, mispredicts) =
                (v[0], v[1], v[2], v[3], v[4], v[5], v[6]);
            if core == (ArmCore::N2 { erratum: true }) {
                fe_stall -= cycles;
                stall -= cycles;
            }
            let total = slots as f64 * cycles;
            let mispredicts = mispredicts / cycles;
            let (frontend_bound, backend_bound) = match core {
                ArmCore::V1 => (fe_stall / total - 4.0 * mispredicts, be_stall / total),
                ArmCore::N2 { .. } | ArmCore::V2 | ArmCore::Unlisted => (
                    fe_stall / total - mispredicts,
                    be_stall / total - 3.0 * mispredicts,
                ),
            };
            let (frontend_bound, backend_bound) = (clamp(frontend_bound), clamp(backend_bound));
            let retiring = clamp((1.0 - stall / total) * retired / spec);
            Level1 {
                frontend_bound,
                backend_bound,
                retiring,
                bad_speculation: clamp(1.0 - frontend_bound - backend_bound - retiring),
            }
        }
        Family::ArmCycles => return Ok(None),
    }))
}

/// (metric name, numerator event, denominator event). Generic and Intel events first, then Arm's
/// by Arm's event names, as the Neoverse telemetry specifications define each ratio (a TLB
/// "miss" there is a walk: the access missed every level of the TLB).
const RATIOS: &[(&str, &str, &str)] = &[
    ("branch_mispredict_rate", "branch-misses", "branches"),
    ("l1d_miss_rate", "l1-dcache-load-misses", "l1-dcache-loads"),
    ("l2_miss_rate", "l2_rqsts.miss", "l2_rqsts.references"),
    ("llc_miss_rate", "llc-load-misses", "llc-loads"),
    ("dtlb_miss_rate", "dtlb-load-misses", "dtlb-loads"),
    ("itlb_miss_rate", "itlb-load-misses", "itlb-loads"),
    ("frontend_stall_cycles", "stall_frontend", "cpu_cycles"),
    ("backend_stall_cycles", "stall_backend", "cpu_cycles"),
    ("backend_memory_stall_cycles", "stall_backend_mem", "cpu_cycles"),
    ("branch_mispredict_rate", "br_mis_pred_retired", "br_retired"),
    ("l1d_miss_rate", "l1d_cache_refill", "l1d_cache"),
    ("l2_miss_rate", "l2d_cache_refill", "l2d_cache"),
    ("llc_miss_rate", "ll_cache_miss_rd", "ll_cache_rd"),
    ("dtlb_walk_rate", "dtlb_walk", "l1d_tlb"),
    ("itlb_walk_rate", "itlb_walk", "l1i_tlb"),
];

/// The cycle and instruction counters' names, by CPU family.
const CYCLES: &[&str] = &[
    "cycles",
    "cpu-cycles",
    "cpu_cycles",
    "cpu_clk_unhalted.thread",
    "ls_not_halted_cyc",
];
const INSTRUCTIONS: &[&str] = &["instructions", "inst_retired.any", "inst_retired"];

/// `tma` without what was derived from `silent` counters (see `Counts::silent`): the ratios with
/// one of them on either side, IPC if it is one of them, and the level-1 split (every event of a
/// level-1 set feeds it).
pub fn without_silent(mut tma: Tma, silent: &[String]) -> Tma {
    let is_silent = |event: &str| silent.iter().any(|s| s == event);
    tma.metrics.retain(|(metric, _)| {
        !RATIOS
            .iter()
            .any(|(name, num, den)| name == metric && (is_silent(num) || is_silent(den)))
    });
    if CYCLES.iter().chain(INSTRUCTIONS).any(|e| is_silent(e)) {
        tma.ipc = None;
    }
    if !silent.is_empty() {
        tma.level1 = None;
    }
    tma
}

pub fn analyze(counts: &Counts, machine: Machine) -> Result<Tma, TmaError> {
    let family = Family::detect(counts, machine)?;
    let level1 = level1(family, counts)?;
    Ok(Tma {
        family: family.name(),
        level1,
        ..derived_only(counts)
    })
}

/// IPC, derived metrics and multiplexing of counts that hold no level-1 set (a CPU without slot
/// events, or the branches/cache/TLB presets).
pub fn derived_only(counts: &Counts) -> Tma {
    let cycles = CYCLES.iter().find_map(|n| counts.get(n));
    let instructions = INSTRUCTIONS.iter().find_map(|n| counts.get(n));
    let ipc = match (instructions, cycles) {
        (Some(i), Some(c)) if c > 0.0 => Some(i / c),
        _ => None,
    };
    let metrics = RATIOS
        .iter()
        .filter_map(|(name, num, den)| match (counts.get(num), counts.get(den)) {
            (Some(n), Some(d)) if d > 0.0 => Some((name.to_string(), n / d)),
            _ => None,
        })
        .collect();
    let mut multiplexed: Vec<(String, f64)> = counts
        .events
        .iter()
        .filter(|(_, c)| c.running < 0.999)
        .map(|(n, c)| (n.clone(), c.running))
        .collect();
    multiplexed.sort_by(|a, b| a.0.cmp(&b.0));
    Tma {
        family: String::new(),
        level1: None,
        ipc,
        metrics,
        multiplexed,
    }
}

/// Healthy or worth investigating, by the usual level-1 rules of thumb (pmu-tools flags a node
/// when its share passes these; retiring is the one to maximize).
pub fn assess(name: &str, value: f64) -> &'static str {
    let investigate = match name {
        "frontend_bound" => value > 0.20,
        "bad_speculation" => value > 0.10,
        "backend_bound" => value > 0.30,
        "retiring" => value < 0.30,
        "ipc" => value < 1.0,
        "branch_mispredict_rate" => value > 0.02,
        "l1d_miss_rate" => value > 0.05,
        "llc_miss_rate" => value > 0.30,
        "dtlb_miss_rate" | "itlb_miss_rate" | "dtlb_walk_rate" | "itlb_walk_rate" => value > 0.01,
        _ => false,
    };
    if investigate {
        "investigate"
    } else {
        "ok"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::counters::perf_csv::parse_perf_csv;

    fn counts(pairs: &[(&str, f64)]) -> Counts {
        Counts {
            events: pairs
                .iter()
                .map(|(n, v)| {
                    (
                        n.to_string(),
                        Count {
                            value: *v,
                            running: 1.0,
                        },
                    )
                })
                .collect(),
            not_counted: vec![],
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    fn sums_to_one(l: &Level1) -> bool {
        close(
            l.retiring + l.bad_speculation + l.frontend_bound + l.backend_bound,
            1.0,
        )
    }

    #[test]
    fn counters_that_counted_nothing_give_no_shares() {
        // QEMU's Neoverse N1: cycles and instructions count, the stall events read 0.
        let c = counts(&[
            ("cpu_cycles", 3e9),
            ("inst_retired", 3e9),
            ("stall_frontend", 0.0),
            ("stall_backend", 0.0),
        ]);
        assert_eq!(c.silent(), ["stall_backend", "stall_frontend"]);
        let tma = analyze(&c, Machine::default()).unwrap();
        assert!(
            tma.metrics
                .iter()
                .any(|(m, v)| m == "frontend_stall_cycles" && *v == 0.0),
            "taken at face value, a 0% front-end stall share: {:?}",
            tma.metrics
        );
        let tma = without_silent(tma, &c.silent());
        assert!(tma.metrics.is_empty(), "{:?}", tma.metrics);
        assert_eq!(tma.ipc, Some(1.0));
        let tma = without_silent(derived_only(&c), &["inst_retired".to_string()]);
        assert_eq!(tma.ipc, None);
    }

    #[test]
    fn intel_skylake_class() {
        // 1e9 cycles = 4e9 slots: 1e9 not delivered (25%), 2.2e9 retired (55%),
        // issued 2.4e9 + 4 x 0.05e9 recovery = (2.4 - 2.2 + 0.2) / 4 = 10% bad speculation.
        let c = counts(&[
            ("cpu_clk_unhalted.thread", 1e9),
            ("idq_uops_not_delivered.core", 1e9),
            ("uops_issued.any", 2.4e9),
            ("uops_retired.retire_slots", 2.2e9),
            ("int_misc.recovery_cycles", 0.05e9),
        ]);
        let l = level1(Family::detect(&c, Machine::default()).unwrap(), &c)
            .unwrap()
            .unwrap();
        assert!(close(l.frontend_bound, 0.25) && close(l.retiring, 0.55) && close(l.bad_speculation, 0.10));
        assert!(close(l.backend_bound, 0.10) && sums_to_one(&l));
    }

    #[test]
    fn intel_ice_lake_metric_events() {
        let c = counts(&[
            ("slots", 5e9),
            ("topdown-retiring", 2e9),
            ("topdown-bad-spec", 0.5e9),
            ("topdown-fe-bound", 1e9),
            ("topdown-be-bound", 1.5e9),
            ("int_misc.uop_dropping", 0.25e9),
        ]);
        assert_eq!(Family::detect(&c, Machine::default()).unwrap(), Family::IntelIcl);
        let l = level1(Family::IntelIcl, &c).unwrap().unwrap();
        assert!(close(l.retiring, 0.4) && close(l.backend_bound, 0.3));
        assert!(
            close(l.frontend_bound, 0.2 - 0.05),
            "uop dropping moves out of frontend: {l:?}"
        );
        assert!(close(l.bad_speculation, 0.15) && sums_to_one(&l));
    }

    #[test]
    fn amd_zen4_and_zen5() {
        let c = counts(&[
            ("ls_not_halted_cyc", 1e9),
            ("de_no_dispatch_per_slot.no_ops_from_frontend", 1.2e9),
            ("de_no_dispatch_per_slot.backend_stalls", 1.8e9),
            ("de_src_op_disp.all", 3.0e9),
            ("ex_ret_ops", 2.4e9),
        ]);
        let l = level1(Family::detect(&c, Machine::default()).unwrap(), &c)
            .unwrap()
            .unwrap();
        assert!(close(l.frontend_bound, 0.2) && close(l.backend_bound, 0.3));
        assert!(close(l.bad_speculation, 0.1) && close(l.retiring, 0.4) && sums_to_one(&l));
        let zen5 = level1(Family::AmdZen { slots: 8 }, &c).unwrap().unwrap();
        assert!(close(zen5.retiring, 0.3));
    }

    /// One core's counts for 1e9 cycles, all worked out to the same split: front end 29% (26%
    /// on V1), back end 22% (25%), retiring 40.5%, bad speculation 8.5%.
    fn arm_split(core: ArmCore, frontend_stall: f64, backend_stall: f64, stall: f64) -> Level1 {
        let c = counts(&[
            ("cpu_cycles", 1e9),
            ("stall_slot_frontend", frontend_stall),
            ("stall_slot_backend", backend_stall),
            ("stall_slot", stall),
            ("op_retired", 0.9e9),
            ("op_spec", 1.0e9),
            ("br_mis_pred", 0.01e9),
        ]);
        let machine = Machine {
            slots: core.slots(),
            arm: Some(core),
        };
        let family = Family::detect(&c, machine).unwrap();
        assert_eq!(
            family,
            Family::ArmSlots {
                slots: core.slots().unwrap(),
                core
            }
        );
        let l = level1(family, &c).unwrap().unwrap();
        assert!(sums_to_one(&l), "{core:?}: {l:?}");
        l
    }

    #[test]
    fn arm_neoverse_v1_v2_and_n2_each_by_its_own_formula() {
        // V1, 8e9 slots: FE 2.4/8 = 30% - 4 x 1% mispredicts per cycle = 26%; BE 2.0/8 = 25%;
        // issued 1 - 4.4/8 = 45%, of which 0.9 retire: 40.5%; bad speculation the rest, 8.5%.
        let l = arm_split(ArmCore::V1, 2.4e9, 2.0e9, 4.4e9);
        assert!(
            close(l.frontend_bound, 0.26) && close(l.backend_bound, 0.25),
            "{l:?}"
        );
        assert!(
            close(l.retiring, 0.405) && close(l.bad_speculation, 0.085),
            "{l:?}"
        );
        // V2, 8e9 slots: FE 30% - 1% = 29%; BE 25% - 3 x 1% = 22%; retiring 40.5%; 8.5% left.
        let l = arm_split(ArmCore::V2, 2.4e9, 2.0e9, 4.4e9);
        assert!(
            close(l.frontend_bound, 0.29) && close(l.backend_bound, 0.22),
            "{l:?}"
        );
        assert!(
            close(l.retiring, 0.405) && close(l.bad_speculation, 0.085),
            "{l:?}"
        );
        // N2 r0p3, 5e9 slots: FE 1.5/5 - 1% = 29%; BE 1.25/5 - 3% = 22%; issued 1 - 2.75/5.
        let fixed = arm_split(ArmCore::N2 { erratum: false }, 1.5e9, 1.25e9, 2.75e9);
        assert!(close(fixed.frontend_bound, 0.29) && close(fixed.backend_bound, 0.22));
        assert!(close(fixed.retiring, 0.405) && close(fixed.bad_speculation, 0.085));
        // N2 r0p0..r0p2 count one more slot per cycle in STALL_SLOT and STALL_SLOT_FRONTEND.
        let erratum = arm_split(ArmCore::N2 { erratum: true }, 2.5e9, 1.25e9, 3.75e9);
        assert_eq!(erratum, fixed);
    }

    #[test]
    fn arm_slot_events_need_the_slot_count() {
        let c = counts(&[("cpu_cycles", 1e9), ("stall_slot_frontend", 1e9)]);
        assert!(
            matches!(
                Family::detect(&c, Machine::default()),
                Err(TmaError::Unsupported(_))
            ),
            "slots must be given"
        );
        assert_eq!(
            Family::detect(&c, Machine::with_slots(Some(6))).unwrap(),
            Family::ArmSlots {
                slots: 6,
                core: ArmCore::Unlisted
            },
            "a core not in the table: Arm's current formula, with the PMU's slot count"
        );
    }

    #[test]
    fn arm_n1_has_no_four_way_split_only_stall_shares() {
        let c = counts(&[
            ("cpu_cycles", 1e9),
            ("stall_frontend", 2e8),
            ("stall_backend", 4e8),
            ("instructions", 1.5e9),
        ]);
        let tma = analyze(&c, Machine::default()).unwrap();
        assert_eq!(tma.level1, None);
        assert!(close(tma.ipc.unwrap(), 1.5));
        assert!(tma.metrics.contains(&("backend_stall_cycles".to_string(), 0.4)));
    }

    #[test]
    fn missing_and_never_running_counters_are_named() {
        let mut c = counts(&[
            ("slots", 5e9),
            ("topdown-retiring", 2e9),
            ("topdown-fe-bound", 1e9),
            ("topdown-be-bound", 1e9),
        ]);
        c.events.insert(
            "topdown-bad-spec".into(),
            Count {
                value: 0.0,
                running: 0.0,
            },
        );
        let err = level1(Family::IntelIcl, &c).unwrap_err();
        assert_eq!(err, TmaError::Missing(vec!["topdown-bad-spec".into()]));
        assert!(err.to_string().contains("never ran"));
    }

    const PERF_CSV: &str = "\
# started on Sat Nov 21 10:00:00 2026

4000000000,,cpu_clk_unhalted.thread,1000000000,50.00,,
4000000000,,idq_uops_not_delivered.core,1000000000,50.00,,
9600000000,,uops_issued.any,1000000000,50.00,,
8800000000,,uops_retired.retire_slots,1000000000,50.00,,
200000000,,int_misc.recovery_cycles,1000000000,50.00,,
8000000000,,instructions:u,1000000000,100.00,2.00,insn per cycle
4000000000,,cycles:u,1000000000,100.00,,
10000,,branch-misses,1000000000,100.00,1.00,of all branches
1000000,,branches,1000000000,100.00,,
<not supported>,,topdown-heavy-ops,0,100.00,,
";

    #[test]
    fn perf_stat_csv_with_multiplexing() {
        let c = parse_perf_csv(PERF_CSV).unwrap();
        assert_eq!(c.not_counted, vec!["topdown-heavy-ops".to_string()]);
        let tma = analyze(&c, Machine::default()).unwrap();
        let l = tma.level1.unwrap();
        assert!(close(l.frontend_bound, 0.25) && close(l.retiring, 0.55) && close(l.bad_speculation, 0.10));
        assert!(close(tma.ipc.unwrap(), 2.0));
        assert_eq!(tma.metrics, vec![("branch_mispredict_rate".to_string(), 0.01)]);
        assert_eq!(
            tma.multiplexed.len(),
            5,
            "the five topdown events ran half the time: {:?}",
            tma.multiplexed
        );
        assert!(tma.multiplexed.iter().all(|(_, r)| close(*r, 0.5)));
    }

    #[test]
    fn assessments() {
        assert_eq!(assess("frontend_bound", 0.25), "investigate");
        assert_eq!(assess("retiring", 0.6), "ok");
        assert_eq!(assess("ipc", 0.5), "investigate");
    }
}
