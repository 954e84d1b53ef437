//! The counter sets bpfprof counts, as data: one table per CPU family for topdown (TOPDOWN.md),
//! and the generic presets (branches, cache, TLB, software). Names are the ones `tma` computes
//! with; encodings are turned into `perf_event_attr` type and config here, through the core PMU's
//! sysfs `events/` aliases where the kernel has them and its `format/` bit layout otherwise.
use std::{
    collections::HashMap,
    path::{Path, PathBuf},
};

use crate::counters::cpu::{parse_number, Method};

/// How the kernel is asked for one event.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Source {
    /// PERF_TYPE_HARDWARE with this generic config.
    Hardware(u64),
    /// PERF_TYPE_HW_CACHE: cache | op << 8 | result << 16.
    HwCache(u64),
    /// PERF_TYPE_SOFTWARE.
    Software(u64),
    /// On the core PMU: its `events/<name>` alias if there is one, else these format terms
    /// (event, umask, cmask, ...).
    Raw(&'static [(&'static str, u64)]),
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EventSpec {
    pub name: &'static str,
    pub source: Source,
}

pub(crate) const fn hw(name: &'static str, config: u64) -> EventSpec {
    EventSpec {
        name,
        source: Source::Hardware(config),
    }
}
const fn raw(name: &'static str, terms: &'static [(&'static str, u64)]) -> EventSpec {
    EventSpec {
        name,
        source: Source::Raw(terms),
    }
}
const fn cache(name: &'static str, cache: u64, miss: bool) -> EventSpec {
    EventSpec {
        name,
        source: Source::HwCache(cache | if miss { 1 << 16 } else { 0 }),
    }
}
pub(crate) const fn sw(name: &'static str, config: u64) -> EventSpec {
    EventSpec {
        name,
        source: Source::Software(config),
    }
}

const CYCLES: EventSpec = hw("cycles", 0);
const INSTRUCTIONS: EventSpec = hw("instructions", 1);

/// A named set of counters, counted together.
#[derive(Clone, Copy, Debug)]
pub struct CounterSet {
    pub name: &'static str,
    pub events: &'static [EventSpec],
    /// The events must be one perf group read at once (Intel's topdown metrics, led by `slots`).
    pub group: bool,
    /// Needs a hardware PMU.
    pub hardware: bool,
}

const INTEL_PRE_ICL: &[EventSpec] = &[
    raw("cpu_clk_unhalted.thread", &[("event", 0x3c)]),
    INSTRUCTIONS,
    raw("idq_uops_not_delivered.core", &[("event", 0x9c), ("umask", 0x01)]),
    raw("uops_issued.any", &[("event", 0x0e), ("umask", 0x01)]),
    raw("uops_retired.retire_slots", &[("event", 0xc2), ("umask", 0x02)]),
    raw(
        "int_misc.recovery_cycles",
        &[("event", 0x0d), ("umask", 0x03), ("cmask", 1)],
    ),
];
/// `slots` leads: the metric events are fractions of it, valid only read in its group.
const INTEL_ICL: &[EventSpec] = &[
    raw("slots", &[("event", 0x00), ("umask", 0x04)]),
    raw("topdown-retiring", &[("event", 0x00), ("umask", 0x80)]),
    raw("topdown-bad-spec", &[("event", 0x00), ("umask", 0x81)]),
    raw("topdown-fe-bound", &[("event", 0x00), ("umask", 0x82)]),
    raw("topdown-be-bound", &[("event", 0x00), ("umask", 0x83)]),
    CYCLES,
    INSTRUCTIONS,
];
const AMD_ZEN: &[EventSpec] = &[
    raw("ls_not_halted_cyc", &[("event", 0x76)]),
    INSTRUCTIONS,
    raw(
        "de_no_dispatch_per_slot.no_ops_from_frontend",
        &[("event", 0x1a0), ("umask", 0x01)],
    ),
    raw(
        "de_no_dispatch_per_slot.backend_stalls",
        &[("event", 0x1a0), ("umask", 0x1e)],
    ),
    raw(
        "de_no_dispatch_per_slot.smt_contention",
        &[("event", 0x1a0), ("umask", 0x60)],
    ),
    raw("de_src_op_disp.all", &[("event", 0xaa), ("umask", 0x07)]),
    raw("ex_ret_ops", &[("event", 0xc1)]),
];
const IPC_ONLY: &[EventSpec] = &[CYCLES, INSTRUCTIONS];
const ARM_SLOTS: &[EventSpec] = &[
    raw("cpu_cycles", &[("event", 0x11)]),
    raw("inst_retired", &[("event", 0x08)]),
    raw("stall_slot_frontend", &[("event", 0x3e)]),
    raw("stall_slot_backend", &[("event", 0x3d)]),
    raw("stall_slot", &[("event", 0x3f)]),
    raw("op_retired", &[("event", 0x3a)]),
    raw("op_spec", &[("event", 0x3b)]),
    raw("br_mis_pred", &[("event", 0x10)]),
];
const ARM_CYCLES: &[EventSpec] = &[
    raw("cpu_cycles", &[("event", 0x11)]),
    raw("inst_retired", &[("event", 0x08)]),
    raw("stall_frontend", &[("event", 0x23)]),
    raw("stall_backend", &[("event", 0x24)]),
];

/// The topdown counter set of a CPU family.
pub fn topdown_set(method: Method) -> CounterSet {
    let (events, group) = match method {
        Method::IntelPreIcl => (INTEL_PRE_ICL, false),
        Method::IntelIcl { .. } => (INTEL_ICL, true),
        Method::AmdZen { .. } => (AMD_ZEN, false),
        Method::ArmSlots { .. } => (ARM_SLOTS, false),
        Method::ArmCycles => (ARM_CYCLES, false),
        Method::AmdNoSlots | Method::Unknown => (IPC_ONLY, false),
    };
    CounterSet {
        name: "topdown",
        events,
        group,
        hardware: true,
    }
}

// PERF_COUNT_HW_CACHE_*: L1D 0, LL 2, DTLB 3, ITLB 4; op READ 0; result ACCESS 0, MISS 1.
const L1D: u64 = 0;
const LL: u64 = 2;
const DTLB: u64 = 3;
const ITLB: u64 = 4;

const BRANCHES: &[EventSpec] = &[CYCLES, INSTRUCTIONS, hw("branches", 4), hw("branch-misses", 5)];
const CACHE: &[EventSpec] = &[
    cache("l1-dcache-loads", L1D, false),
    cache("l1-dcache-load-misses", L1D, true),
    cache("llc-loads", LL, false),
    cache("llc-load-misses", LL, true),
];
const TLB: &[EventSpec] = &[
    cache("dtlb-loads", DTLB, false),
    cache("dtlb-load-misses", DTLB, true),
    cache("itlb-loads", ITLB, false),
    cache("itlb-load-misses", ITLB, true),
];
// Arm's common events by their architected numbers and names (Arm ARM, PMU event list; the names
// Neoverse telemetry specifications and `perf list` use): the kernel's generic cache events
// leave out L2 and the TLB walks, and map LL reads on some cores only.
const ARM_BRANCHES: &[EventSpec] = &[
    raw("cpu_cycles", &[("event", 0x11)]),
    raw("inst_retired", &[("event", 0x08)]),
    raw("br_retired", &[("event", 0x21)]),
    raw("br_mis_pred_retired", &[("event", 0x22)]),
];
const ARM_CACHE: &[EventSpec] = &[
    raw("l1d_cache", &[("event", 0x04)]),
    raw("l1d_cache_refill", &[("event", 0x03)]),
    raw("l2d_cache", &[("event", 0x16)]),
    raw("l2d_cache_refill", &[("event", 0x17)]),
    raw("ll_cache_rd", &[("event", 0x36)]),
    raw("ll_cache_miss_rd", &[("event", 0x37)]),
];
const ARM_TLB: &[EventSpec] = &[
    raw("l1d_tlb", &[("event", 0x25)]),
    raw("dtlb_walk", &[("event", 0x34)]),
    raw("l1i_tlb", &[("event", 0x26)]),
    raw("itlb_walk", &[("event", 0x35)]),
];

/// Counted by the kernel itself: works everywhere, including VMs without a PMU.
const SOFTWARE: &[EventSpec] = &[
    sw("task-clock", 1),
    sw("context-switches", 3),
    sw("cpu-migrations", 4),
    sw("page-faults", 2),
];

/// `--preset` names, for the CLI.
pub const PRESETS: &[&str] = &["topdown", "branches", "cache", "tlb", "software"];

/// A preset by name; `topdown` depends on the CPU family, and on Arm the others are Arm's own
/// events (their derived metrics are Arm's: `tma::RATIOS`).
pub fn preset(name: &str, method: Method) -> Option<CounterSet> {
    let arm = matches!(method, Method::ArmSlots { .. } | Method::ArmCycles);
    let set = |name, events| CounterSet {
        name,
        events,
        group: false,
        hardware: true,
    };
    Some(match name {
        "topdown" => topdown_set(method),
        "branches" => set("branches", if arm { ARM_BRANCHES } else { BRANCHES }),
        "cache" => set("cache", if arm { ARM_CACHE } else { CACHE }),
        "tlb" => set("tlb", if arm { ARM_TLB } else { TLB }),
        "software" => CounterSet {
            hardware: false,
            ..set("software", SOFTWARE)
        },
        _ => return None,
    })
}

pub const SYSFS_PMUS: &str = "/sys/bus/event_source/devices";

/// A PMU as sysfs describes it: its perf type, and where each format term's bits go in `config`.
#[derive(Clone, Debug)]
pub struct Pmu {
    pub name: String,
    pub kind: u32,
    dir: PathBuf,
    /// term → bit ranges (low, high) of `config`, in order from the value's low bits.
    formats: HashMap<String, Vec<(u32, u32)>>,
}

impl Pmu {
    pub fn open(root: &Path, name: &str) -> Option<Pmu> {
        let dir = root.join(name);
        let kind = std::fs::read_to_string(dir.join("type"))
            .ok()?
            .trim()
            .parse()
            .ok()?;
        let mut formats = HashMap::new();
        for entry in std::fs::read_dir(dir.join("format")).ok()?.flatten() {
            let Ok(text) = std::fs::read_to_string(entry.path()) else {
                continue;
            };
            // Only `config` terms: the events here need nothing in config1/config2.
            if let Some(ranges) = text.trim().strip_prefix("config:").and_then(parse_ranges) {
                formats.insert(entry.file_name().to_string_lossy().into_owned(), ranges);
            }
        }
        Some(Pmu {
            name: name.to_string(),
            kind,
            dir,
            formats,
        })
    }

    /// The CPU's core PMU: `cpu` on x86, `cpu_core` on hybrid Intel, `armv8_pmuv3*` on Arm.
    pub fn core(root: &Path) -> Option<Pmu> {
        let mut names: Vec<String> = std::fs::read_dir(root)
            .ok()?
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        let pick = ["cpu", "cpu_core"]
            .iter()
            .map(|s| s.to_string())
            .find(|n| names.contains(n))
            .or_else(|| names.into_iter().find(|n| n.starts_with("armv8_pmuv3")))?;
        Pmu::open(root, &pick)
    }

    /// Slots per cycle the PMU reports (Arm's `caps/slots`; 0 in KVM guests means unknown).
    pub fn slots(&self) -> Option<u32> {
        let text = std::fs::read_to_string(self.dir.join("caps/slots")).ok()?;
        let slots = u32::try_from(parse_number(&text)?).ok()?;
        (slots > 0).then_some(slots)
    }

    /// The most precise sampling (`:p` levels) the PMU offers: its `caps/max_precise` (x86's
    /// PEBS); a PMU without that file (Arm's PMUv3) offers none.
    pub fn max_precise(&self) -> u8 {
        let text = std::fs::read_to_string(self.dir.join("caps/max_precise")).unwrap_or_default();
        parse_number(&text).map_or(0, |n| n.min(3) as u8)
    }

    /// `config` for these terms, placed by the format files.
    pub fn encode(&self, terms: &[(&str, u64)]) -> Result<u64, String> {
        let mut config = 0u64;
        for &(term, value) in terms {
            let ranges = self
                .formats
                .get(term)
                .ok_or_else(|| format!("the {} PMU has no `{term}` format field", self.name))?;
            let mut rest = value;
            for &(lo, hi) in ranges {
                let width = hi - lo + 1;
                let mask = if width >= 64 { u64::MAX } else { (1 << width) - 1 };
                config |= (rest & mask) << lo;
                rest = if width >= 64 { 0 } else { rest >> width };
            }
            if rest != 0 {
                return Err(format!(
                    "{term}={value:#x} does not fit the {} PMU's format",
                    self.name
                ));
            }
        }
        Ok(config)
    }

    /// The names of its `events/` aliases (without perf's `.scale` and `.unit` companions).
    pub fn event_names(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.dir.join("events"))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| !n.contains('.'))
            .collect();
        names.sort();
        names
    }

    /// The kernel's own alias, `events/<name>` (e.g. `event=0x00,umask=0x80`), encoded.
    pub fn alias(&self, name: &str) -> Option<Result<u64, String>> {
        let text = std::fs::read_to_string(self.dir.join("events").join(name)).ok()?;
        let mut terms = Vec::new();
        for term in text.trim().split(',') {
            let (key, value) = term.split_once('=').unwrap_or((term, "1"));
            match parse_number(value) {
                Some(v) => terms.push((key.trim().to_string(), v)),
                None => return Some(Err(format!("cannot read {}/events/{name}: {text}", self.name))),
            }
        }
        let terms: Vec<(&str, u64)> = terms.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        Some(self.encode(&terms))
    }
}

/// `0-7,32-35` or `21`.
fn parse_ranges(text: &str) -> Option<Vec<(u32, u32)>> {
    text.split(',')
        .map(|part| {
            let (lo, hi) = part.split_once('-').unwrap_or((part, part));
            Some((lo.trim().parse().ok()?, hi.trim().parse().ok()?))
        })
        .collect()
}

/// perf_event_attr type and config for an event.
pub fn resolve(spec: &EventSpec, core: Option<&Pmu>) -> Result<(u32, u64), String> {
    const PERF_TYPE_HARDWARE: u32 = 0;
    const PERF_TYPE_SOFTWARE: u32 = 1;
    const PERF_TYPE_HW_CACHE: u32 = 3;
    match spec.source {
        Source::Hardware(config) => Ok((PERF_TYPE_HARDWARE, config)),
        Source::Software(config) => Ok((PERF_TYPE_SOFTWARE, config)),
        Source::HwCache(config) => Ok((PERF_TYPE_HW_CACHE, config)),
        Source::Raw(terms) => {
            let pmu = core.ok_or_else(|| {
                format!(
                    "{} needs the CPU's PMU, which this kernel does not expose",
                    spec.name
                )
            })?;
            let config = match pmu.alias(spec.name) {
                Some(alias) => alias?,
                None => pmu.encode(terms)?,
            };
            Ok((pmu.kind, config))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sysfs PMU directory as the kernel lays it out.
    fn fake_pmu(name: &str, kind: u32, formats: &[(&str, &str)], events: &[(&str, &str)]) -> PathBuf {
        let root = std::env::temp_dir().join(format!("bpfprof-pmu-{}-{name}", std::process::id()));
        let dir = root.join(name);
        std::fs::create_dir_all(dir.join("format")).unwrap();
        std::fs::create_dir_all(dir.join("events")).unwrap();
        std::fs::write(dir.join("type"), format!("{kind}\n")).unwrap();
        for (f, v) in formats {
            std::fs::write(dir.join("format").join(f), format!("{v}\n")).unwrap();
        }
        for (e, v) in events {
            std::fs::write(dir.join("events").join(e), format!("{v}\n")).unwrap();
        }
        root
    }

    #[test]
    fn amd_event_selects_above_0xff_split_across_config_bits() {
        let root = fake_pmu(
            "cpu",
            4,
            &[
                ("event", "config:0-7,32-35"),
                ("umask", "config:8-15"),
                ("cmask", "config:24-31"),
            ],
            &[],
        );
        let pmu = Pmu::core(&root).unwrap();
        let spec = AMD_ZEN
            .iter()
            .find(|e| e.name == "de_no_dispatch_per_slot.backend_stalls")
            .unwrap();
        // perf's own encoding of amd_core/event=0x1a0,umask=0x1e/: 0x100001ea0.
        assert_eq!(resolve(spec, Some(&pmu)), Ok((4, 0x1_0000_1ea0)));
        assert!(pmu.encode(&[("umask", 0x1ff)]).is_err(), "umask is 8 bits");
        assert!(pmu.encode(&[("any", 1)]).unwrap_err().contains("no `any`"));
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn kernel_aliases_win_over_the_table() {
        let root = fake_pmu(
            "cpu_core",
            8,
            &[("event", "config:0-7"), ("umask", "config:8-15")],
            &[
                ("topdown-retiring", "event=0x00,umask=0x80"),
                ("slots", "event=0x00,umask=0x4"),
            ],
        );
        let pmu = Pmu::core(&root).unwrap();
        let set = topdown_set(Method::IntelIcl { slots: 5 });
        assert!(
            set.group && set.events[0].name == "slots",
            "slots leads the group"
        );
        let resolved: Vec<_> = set
            .events
            .iter()
            .map(|e| resolve(e, Some(&pmu)).unwrap())
            .collect();
        assert_eq!(resolved[0], (8, 0x0400));
        assert_eq!(resolved[1], (8, 0x8000));
        assert_eq!(resolved[5], (0, 0), "cycles stays generic");
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn every_family_has_the_events_its_formula_needs() {
        use crate::counters::tma::{analyze, Count, Counts, Machine};
        for method in [
            Method::IntelPreIcl,
            Method::IntelIcl { slots: 5 },
            Method::AmdZen { slots: 6 },
            Method::ArmSlots {
                core: crate::counters::tma::ArmCore::V1,
            },
        ] {
            // Each family's own table, every counter 1000 (metric events 64 each): level 1 must
            // come out, so the table and the formula agree on names.
            let events = topdown_set(method)
                .events
                .iter()
                .map(|e| {
                    let value = if e.name.starts_with("topdown-") {
                        64.0
                    } else {
                        1000.0
                    };
                    (e.name.to_string(), Count { value, running: 1.0 })
                })
                .collect();
            let counts = Counts {
                events,
                not_counted: Vec::new(),
            };
            let tma = analyze(&counts, Machine::with_slots(Some(5))).unwrap();
            assert!(tma.level1.is_some(), "{method:?}");
            assert!(tma.ipc.is_some(), "{method:?} has IPC");
        }
    }

    #[test]
    fn presets_and_no_pmu() {
        for name in PRESETS {
            assert!(preset(name, Method::Unknown).is_some(), "{name}");
        }
        assert!(preset("nonsense", Method::Unknown).is_none());
        let software = preset("software", Method::Unknown).unwrap();
        assert!(!software.hardware);
        assert!(software.events.iter().all(|e| resolve(e, None).is_ok()));
        let raw = &INTEL_PRE_ICL[0];
        assert!(resolve(raw, None).unwrap_err().contains("does not expose"));
    }

    #[test]
    fn arm_presets_count_arms_events_and_give_arms_metrics() {
        use crate::counters::tma::{derived_only, Count, Counts};
        for name in ["branches", "cache", "tlb"] {
            let set = preset(name, Method::ArmCycles).unwrap();
            assert!(
                set.events.iter().all(|e| matches!(e.source, Source::Raw(_))),
                "{name}"
            );
            // Every event of the set feeds one of the metrics derived from it.
            let mut counts = Counts::default();
            for event in set.events {
                let count = Count {
                    value: 1000.0,
                    running: 1.0,
                };
                counts.events.insert(event.name.to_string(), count);
            }
            let tma = derived_only(&counts);
            let expected = match name {
                "branches" => 1,
                "cache" => 3,
                _ => 2,
            };
            assert_eq!(tma.metrics.len(), expected, "{name}: {:?}", tma.metrics);
        }
        assert_eq!(preset("cache", Method::Unknown).unwrap().events, CACHE);
    }
}
