//! Unwind rows from a Go table's stack-pointer deltas (pcsp: the bytes a function has pushed
//! below its return address at each pc), with the stack roots and stack switches Go's own
//! traceback knows by name.
use profiler_common::unwind::{cfa, fp, Row};

use object::Object as _;

use super::pclntab::{Func, Pclntab, Version, SPWRITE, TOPFRAME};

/// A file's Go rows past this many fall back to frame-pointer steps for ordinary Go code
/// (a quarter of the row array all files share).
pub const BUDGET: usize = 256 * 1024;
/// Past this many rows with frame-pointer steps for ordinary Go code (half the row array), a
/// file keeps no Go rows at all.
pub const HYBRID_BUDGET: usize = 2 * BUDGET;

/// Rows for the Go functions of a table, and the ranges they cover (where other unwind
/// information of the file is not used).
pub struct GoRows {
    pub rows: Vec<Row>,
    covered: Vec<(u64, u64)>,
}

impl GoRows {
    /// Go's ranges take their rows from its table (which knows its stacks' roots and where RBP
    /// was saved); C code linked in (cgo) keeps its `.eh_frame`.
    pub fn replace_in(self, rows: &mut Vec<Row>) {
        rows.retain(|r| !self.covers(r.pc));
        rows.extend(self.rows);
    }

    pub fn covers(&self, pc: u64) -> bool {
        let i = self.covered.partition_point(|&(start, _)| start <= pc);
        i > 0 && pc < self.covered[i - 1].1
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    X86_64,
    Aarch64,
}

/// What one function's rows are.
#[derive(Debug, PartialEq, Eq)]
enum Rule {
    /// A stack's root (or a switch bpfprof does not follow): the walk ends here, complete.
    End,
    /// Frame-pointer step (ordinary Go code over the row budget).
    FramePointer,
    /// A move to the system stack by a function with a frame, which keeps its frame record on
    /// the goroutine's stack in the frame pointer: pcsp deltas where nothing is pushed yet (the
    /// entry, before the frame pointer is saved), frame-pointer steps past that (where the
    /// stack pointer may be on the other stack; its later adjustments count as pushes).
    SwitchesStack,
    /// pcsp deltas; `frame`: the caller's frame pointer is saved at CFA - 16 (x86-64 Go code).
    Deltas { frame: bool },
}

/// The rows of a Go binary's own table (pcsp deltas, its stacks' roots), if it has one.
pub fn of_file(file: &object::File<'_>) -> Option<GoRows> {
    let arch = match file.architecture() {
        object::Architecture::X86_64 => Arch::X86_64,
        object::Architecture::Aarch64 => Arch::Aarch64,
        _ => return None,
    };
    match super::find(file) {
        Ok(found) => rows(&found.table, arch),
        Err(super::NoTable::Absent) => None,
        Err(e) => {
            log::info!("{e}: its CFI only");
            None
        }
    }
}

/// The rows of every function with a pcsp table. Over `BUDGET`, ordinary Go functions get one
/// frame-pointer row each and only assembly and the callers of assembly that uses the frame
/// pointer as a register keep their deltas; over `HYBRID_BUDGET` even so, none.
pub fn rows(table: &Pclntab<'_>, arch: Arch) -> Option<GoRows> {
    rows_within(table, arch, BUDGET, HYBRID_BUDGET)
}

pub(super) fn rows_within(
    table: &Pclntab<'_>,
    arch: Arch,
    budget: usize,
    hybrid_budget: usize,
) -> Option<GoRows> {
    if let Some(full) = build(table, arch, false, budget) {
        return Some(full);
    }
    let hybrid = build(table, arch, true, hybrid_budget);
    match &hybrid {
        Some(h) => log::info!(
            "Go table: over the budget of {budget} rows: frame pointers for ordinary Go code ({} rows)",
            h.rows.len()
        ),
        None => log::info!(
            "Go table: over {hybrid_budget} rows even with frame pointers for Go code: its Go rows are left out"
        ),
    }
    hybrid
}

/// The rows, or None as soon as there are more than `limit` (or more functions).
pub(super) fn build(table: &Pclntab<'_>, arch: Arch, hybrid: bool, limit: usize) -> Option<GoRows> {
    let mut out = GoRows {
        rows: Vec::new(),
        covered: Vec::new(),
    };
    for (examined, func) in table.funcs().enumerate() {
        // Each function costs its name and file even where it gets no rows.
        if examined > limit {
            return None;
        }
        let rule = rule(table, &func, arch, hybrid);
        let first = out.rows.len();
        match rule {
            Rule::End => out.rows.push(whole(func.entry, cfa::END)),
            Rule::FramePointer => out.rows.push(whole(func.entry, cfa::UNSUPPORTED)),
            Rule::SwitchesStack => {
                for (start, _, sp) in table.pc_values(func.pcsp, &func) {
                    out.rows.push(match sp {
                        0 => delta_row(start, 0, arch, false),
                        _ => whole(start, cfa::UNSUPPORTED),
                    });
                    if out.rows.len() > limit {
                        return None;
                    }
                }
            }
            Rule::Deltas { frame } => {
                for (start, _, sp) in table.pc_values(func.pcsp, &func) {
                    out.rows.push(delta_row(start, sp, arch, frame));
                    if out.rows.len() > limit {
                        return None;
                    }
                }
            }
        }
        if out.rows.len() == first {
            continue; // no pcsp table: not Go's to unwind (C code linked in).
        }
        out.rows.push(whole(func.end, cfa::NONE));
        match out.covered.last_mut() {
            Some(last) if last.1 == func.entry => last.1 = func.end,
            _ => out.covered.push((func.entry, func.end)),
        }
        if out.rows.len() > limit {
            return None;
        }
    }
    Some(out)
}

fn whole(pc: u64, kind: u8) -> Row {
    Row {
        pc,
        cfa: kind,
        ..Row::default()
    }
}

fn rule(table: &Pclntab<'_>, func: &Func, arch: Arch, hybrid: bool) -> Rule {
    let name = table.name(func).unwrap_or("");
    let name = name.strip_suffix(".abi0").unwrap_or(name);
    const ROOTS: [&str; 4] = [
        "runtime.goexit",
        "runtime.mstart",
        "runtime.rt0_go",
        "runtime.sigtramp",
    ];
    // mcall and morestack switch to the system stack for good: the goroutine's frames are in its
    // saved context (g.sched), which the walker does not read.
    const SWITCHES: [&str; 2] = ["runtime.mcall", "runtime.morestack"];
    if func.flag & TOPFRAME != 0 || ROOTS.contains(&name) || SWITCHES.contains(&name) {
        return Rule::End;
    }
    let file = table.file(func, func.entry).unwrap_or("");
    let assembly = file.ends_with(".s");
    let switches = match name {
        // No frame of its own (its stack pointer, from the switch on, is the system stack's):
        // frame-pointer steps throughout.
        "runtime.systemstack" => Some(Rule::FramePointer),
        _ if assembly && calls_the_vdso(name, table.version) => Some(Rule::SwitchesStack),
        _ => None,
    };
    if let Some(rule) = switches {
        // The frame-pointer chain goes on to the goroutine's stack; arm64 Go before 1.21 kept no
        // reliable frame pointers (1.20's table does not say which it is: 1.16-1.19 end here).
        return match (arch, table.version) {
            (Arch::Aarch64, Version::Go116 | Version::Go118) => Rule::End,
            _ => rule,
        };
    }
    // Functions that write SP (gogo, asmcgocall...) have no pcsp to trust after the write: Go's
    // traceback stops at them too, past the stack switches above and cgocallback (whose frame
    // it keeps valid on both stacks: Go clears its flag).
    if func.flag & SPWRITE != 0 && name != "runtime.cgocallback" {
        return Rule::End;
    }
    if hybrid && !assembly && !CLOBBERED.iter().any(|f| file.ends_with(f)) {
        return Rule::FramePointer;
    }
    Rule::Deltas {
        frame: arch == Arch::X86_64 && !assembly,
    }
}

/// The assembly that calls into the vDSO: it moves to the system stack (so it is SPWRITE), with
/// its frame record on the goroutine's stack still in the frame pointer, as systemstack's is.
/// Before, a walk ended there as if at a root, and a program reading the clock lost every
/// caller of `time.Now` (4% of a Go program's samples cut off, a [vdso] root of their own).
/// Only from Go 1.18's table on: 1.16's assembly pointed the frame pointer at its locals
/// (`MOVQ SP, BP`), and 1.17 shares its table's version. Elsewhere (`time.now` is Go code on
/// arm64) these names are ordinary functions.
fn calls_the_vdso(name: &str, version: Version) -> bool {
    const VDSO_CALLERS: [&str; 4] = [
        "runtime.nanotime1",
        "runtime.walltime",
        "runtime.vgetrandom1",
        "time.now",
    ];
    version != Version::Go116 && VDSO_CALLERS.contains(&name)
}

/// Go files whose functions call assembly that uses RBP as a register: their callers need RBP
/// restored from the frame (after OpenTelemetry's eBPF profiler, elfgopclntab.go).
const CLOBBERED: [&str; 8] = [
    "/src/crypto/sha1/sha1.go",
    "/src/crypto/sha256/sha256.go",
    "/src/crypto/sha512/sha512.go",
    "/src/crypto/elliptic/p256_asm.go",
    "/src/internal/cpu/cpu_arm64.go",
    "/src/internal/cpu/cpu_x86.go",
    "golang.org/x/crypto/curve25519/curve25519_amd64.go",
    "golang.org/x/crypto/chacha20poly1305/chacha20poly1305_amd64.go",
];

/// x86-64: CFA = SP + delta + 8, the return address at CFA - 8; Go code (not assembly) with a
/// frame saved the caller's RBP right below the return address. arm64: at delta 0 the return
/// address is still in x30; after the prologue it is at the bottom of the frame, [SP].
fn delta_row(pc: u64, sp: i32, arch: Arch, frame: bool) -> Row {
    let unsupported = whole(pc, cfa::UNSUPPORTED);
    let Ok(sp) = i16::try_from(sp) else {
        return unsupported;
    };
    if sp < 0 {
        return unsupported;
    }
    match arch {
        Arch::X86_64 => {
            let Some(cfa_offset) = sp.checked_add(8) else {
                return unsupported;
            };
            let (fp, fp_offset) = if frame && cfa_offset >= 16 {
                (fp::AT_CFA, -16)
            } else {
                (fp::SAME, 0)
            };
            Row {
                pc,
                cfa: cfa::SP,
                cfa_offset,
                fp,
                fp_offset,
                ra_offset: -8,
            }
        }
        Arch::Aarch64 => Row {
            pc,
            cfa: cfa::SP,
            cfa_offset: sp,
            ra_offset: -sp,
            ..Row::default()
        },
    }
}
