//! Which CPU this is and which topdown method its family has, from /proc/cpuinfo and the PMUs the
//! kernel exposes in /sys/bus/event_source/devices. Event tables per family live in `events`.
use serde::Serialize;

use super::tma::ArmCore;

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CpuId {
    pub vendor: String,
    pub family: u32,
    pub model: u32,
    /// Arm: implementer, part number, variant and revision (the MIDR's fields; 0 elsewhere).
    pub arm_implementer: u32,
    pub arm_part: u32,
    pub arm_variant: u32,
    pub arm_revision: u32,
    pub name: String,
}

/// A number as /proc/cpuinfo and sysfs write them: decimal, or hexadecimal with `0x`.
pub fn parse_number(text: &str) -> Option<u64> {
    let text = text.trim();
    match text.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => text.parse().ok(),
    }
}

/// The first processor's identity in a /proc/cpuinfo text.
pub fn parse_cpuinfo(text: &str) -> Option<CpuId> {
    let mut cpu = CpuId::default();
    let number = |v: &str| parse_number(v).and_then(|n| u32::try_from(n).ok());
    for line in text.lines() {
        if line.trim().is_empty() && (!cpu.vendor.is_empty() || cpu.arm_part != 0) {
            break; // end of the first processor's block
        }
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        match key.trim() {
            "vendor_id" => cpu.vendor = value.trim().to_string(),
            "cpu family" => cpu.family = number(value)?,
            "model" => cpu.model = number(value).unwrap_or(0),
            "model name" => cpu.name = value.trim().to_string(),
            "CPU implementer" => {
                cpu.arm_implementer = number(value)?;
                cpu.vendor = "ARM".into();
            }
            "CPU part" => cpu.arm_part = number(value)?,
            "CPU variant" => cpu.arm_variant = number(value)?,
            "CPU revision" => cpu.arm_revision = number(value)?,
            _ => {}
        }
    }
    (!cpu.vendor.is_empty()).then_some(cpu)
}

/// A CPU family's way to level 1 (TOPDOWN.md); its events are in `events`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// Intel before Ice Lake: 4 slots per cycle, IDQ_UOPS_NOT_DELIVERED.
    IntelPreIcl,
    /// Intel Ice Lake and later: the `slots` fixed counter and the topdown metric events.
    IntelIcl {
        slots: u32,
    },
    /// AMD Zen 4 (6 slots) and Zen 5 (8): de_no_dispatch_per_slot.
    AmdZen {
        slots: u32,
    },
    /// AMD Zen 3 and older: no per-slot dispatch events, IPC only.
    AmdNoSlots,
    /// Arm Neoverse V1, N2, V2 and later: STALL_SLOT_*, by the core's formula.
    ArmSlots {
        core: ArmCore,
    },
    /// Arm Neoverse N1: stall cycles only, no four-way split.
    ArmCycles,
    Unknown,
}

impl Method {
    /// Pipeline slots per cycle, where the family fixes it (Arm reads it from the PMU's caps).
    pub fn slots(self) -> Option<u32> {
        match self {
            Method::IntelPreIcl => Some(4),
            Method::IntelIcl { slots } | Method::AmdZen { slots } => Some(slots),
            Method::ArmSlots { core } => core.slots(),
            _ => None,
        }
    }

    /// This machine's method.
    pub fn here() -> Method {
        this_cpu().map_or(Method::Unknown, |cpu| topdown_method(&cpu).1)
    }

    pub fn describe(self) -> String {
        match self {
            Method::IntelPreIcl => "Intel pre-ICL: 4 slots, IDQ_UOPS_NOT_DELIVERED".into(),
            Method::IntelIcl { slots } => {
                format!("Intel ICL+: slots and topdown metric events ({slots} slots)")
            }
            Method::AmdZen { slots } => format!("AMD Zen: {slots} slots, de_no_dispatch_per_slot"),
            Method::AmdNoSlots => {
                "none: no per-slot dispatch events on this AMD core, so no level-1 split (IPC only)".into()
            }
            Method::ArmSlots { core } => format!("Arm slots: STALL_SLOT_*, {core:?} formula"),
            Method::ArmCycles => "Arm N1: stall cycles only, no four-way split".into(),
            Method::Unknown => "unknown: check perf list for topdown events".into(),
        }
    }
}

/// The microarchitecture and its topdown method.
pub fn topdown_method(cpu: &CpuId) -> (&'static str, Method) {
    match (cpu.vendor.as_str(), cpu.family) {
        ("GenuineIntel", 6) => match cpu.model {
            0x4e | 0x5e | 0x55 | 0x8e | 0x9e | 0xa5 | 0xa6 => ("Skylake-class", Method::IntelPreIcl),
            0x6a | 0x6c | 0x7d | 0x7e | 0x8c | 0x8d | 0xa7 => {
                ("Ice Lake-class", Method::IntelIcl { slots: 5 })
            }
            0x8f | 0xcf | 0xad | 0xae | 0x97 | 0x9a | 0xb7 | 0xba | 0xbf | 0xaa | 0xac | 0xc5 | 0xc6 => (
                "Sapphire Rapids / Alder Lake or later",
                Method::IntelIcl { slots: 6 },
            ),
            _ => ("Intel family 6 (model not in bpfprof's table)", Method::Unknown),
        },
        ("AuthenticAMD", 0x19) => match cpu.model {
            0x10..=0x1f | 0x60..=0x7f | 0xa0..=0xaf => ("Zen 4", Method::AmdZen { slots: 6 }),
            _ => ("Zen 3", Method::AmdNoSlots),
        },
        ("AuthenticAMD", 0x1a) => ("Zen 5", Method::AmdZen { slots: 8 }),
        ("AuthenticAMD", _) => ("AMD before Zen 3", Method::AmdNoSlots),
        ("ARM", _) => match cpu.arm_part {
            0xd0c => ("Neoverse N1", Method::ArmCycles),
            0xd40 => ("Neoverse V1", Method::ArmSlots { core: ArmCore::V1 }),
            0xd49 => {
                // r0p0..r0p2 have the STALL_SLOT erratum; r0p3 and later do not.
                let erratum = cpu.arm_variant == 0 && cpu.arm_revision <= 2;
                (
                    "Neoverse N2",
                    Method::ArmSlots {
                        core: ArmCore::N2 { erratum },
                    },
                )
            }
            0xd4f => ("Neoverse V2", Method::ArmSlots { core: ArmCore::V2 }),
            _ => (
                "Arm core (part not in bpfprof's table)",
                Method::ArmSlots {
                    core: ArmCore::Unlisted,
                },
            ),
        },
        _ => ("unknown CPU", Method::Unknown),
    }
}

/// This machine's CPU, from /proc/cpuinfo.
pub fn this_cpu() -> Option<CpuId> {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| parse_cpuinfo(&t))
}

/// Hardware PMUs the kernel exposes (software, tracepoint and probe PMUs left out).
pub fn hardware_pmus() -> Vec<String> {
    const NOT_HARDWARE: [&str; 7] = [
        "software",
        "tracepoint",
        "breakpoint",
        "uprobe",
        "kprobe",
        "msr",
        "power",
    ];
    let mut pmus: Vec<String> = std::fs::read_dir("/sys/bus/event_source/devices")
        .map(|dir| {
            dir.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    pmus.retain(|p| !NOT_HARDWARE.contains(&p.as_str()));
    pmus.sort();
    pmus
}

/// One line naming the CPU, its topdown method, and the hardware PMUs this kernel exposes.
pub fn describe() -> String {
    let cpu = this_cpu();
    let pmus = hardware_pmus();
    let pmus = if pmus.is_empty() {
        "none".to_string()
    } else {
        pmus.join(", ")
    };
    match cpu {
        Some(cpu) => {
            let (uarch, method) = topdown_method(&cpu);
            format!(
                "CPU: {} ({uarch}; family {:#x} model {:#x}); topdown method: {}; hardware PMUs exposed: {pmus}",
                if cpu.name.is_empty() { &cpu.vendor } else { &cpu.name },
                cpu.family,
                cpu.model,
                method.describe()
            )
        }
        None => format!("CPU: unknown; hardware PMUs exposed: {pmus}"),
    }
}

/// The ids of the online CPUs.
pub fn online_ids() -> anyhow::Result<Vec<u32>> {
    aya::util::online_cpus().map_err(|(what, e)| anyhow::anyhow!("{what}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amd_zen3_here_and_zen4() {
        let zen3 = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 1\nmodel name\t: AMD EPYC\n\nprocessor\t: 1\n";
        let cpu = parse_cpuinfo(zen3).unwrap();
        assert_eq!(
            (cpu.vendor.as_str(), cpu.family, cpu.model),
            ("AuthenticAMD", 25, 1)
        );
        assert_eq!(topdown_method(&cpu).0, "Zen 3");
        let zen4 = CpuId { model: 0x11, ..cpu };
        assert_eq!(topdown_method(&zen4).1, Method::AmdZen { slots: 6 });
    }

    #[test]
    fn intel_generations() {
        let mut cpu = CpuId {
            vendor: "GenuineIntel".into(),
            family: 6,
            model: 0x55,
            ..Default::default()
        };
        assert_eq!(topdown_method(&cpu).0, "Skylake-class");
        cpu.model = 0x6a;
        assert_eq!(topdown_method(&cpu).1, Method::IntelIcl { slots: 5 });
        cpu.model = 0x8f;
        assert_eq!(topdown_method(&cpu).1, Method::IntelIcl { slots: 6 });
    }

    #[test]
    fn arm_neoverse_parts_by_midr() {
        let n2 = "processor\t: 0\nBogoMIPS\t: 50.00\nCPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x0\nCPU part\t: 0xd49\nCPU revision\t: 1\n\n";
        let cpu = parse_cpuinfo(n2).unwrap();
        assert_eq!(
            (
                cpu.arm_implementer,
                cpu.arm_part,
                cpu.arm_variant,
                cpu.arm_revision
            ),
            (0x41, 0xd49, 0, 1)
        );
        assert_eq!(
            topdown_method(&cpu),
            (
                "Neoverse N2",
                Method::ArmSlots {
                    core: ArmCore::N2 { erratum: true }
                }
            )
        );
        let r0p3 = CpuId {
            arm_revision: 3,
            ..cpu.clone()
        };
        assert_eq!(
            topdown_method(&r0p3).1,
            Method::ArmSlots {
                core: ArmCore::N2 { erratum: false }
            }
        );
        assert_eq!(topdown_method(&r0p3).1.slots(), Some(5));
        let part = |arm_part| {
            topdown_method(&CpuId {
                arm_part,
                ..cpu.clone()
            })
        };
        assert_eq!(part(0xd0c), ("Neoverse N1", Method::ArmCycles));
        assert_eq!(
            part(0xd40),
            ("Neoverse V1", Method::ArmSlots { core: ArmCore::V1 })
        );
        assert_eq!(
            part(0xd4f),
            ("Neoverse V2", Method::ArmSlots { core: ArmCore::V2 })
        );
        assert_eq!(part(0xd40).1.slots(), Some(8));
        assert_eq!(
            part(0xd81).1.slots(),
            None,
            "an unlisted core's slots come from its PMU"
        );
    }

    #[test]
    fn this_machine_is_described() {
        let line = describe();
        assert!(
            line.starts_with("CPU: ") && line.contains("hardware PMUs exposed"),
            "{line}"
        );
    }
}
