//! pthread source: which file of a target to probe, and where in each lock function.
//!
//! A uprobe on a function's first instruction makes the kernel single-step that instruction out
//! of line (~7.6 µs per call on a VM); one on an instruction the kernel emulates (a `push`, a
//! direct jump, call or conditional branch) costs ~0.9 µs. So each function's straight-line
//! start is decoded up to the first such instruction, tracking where the lock's address is (the
//! argument register, or a register it was copied to) and how far the stack pointer moved (the
//! caller's return address is that far above it). Functions that also get a return probe need
//! the stack pointer unmoved: the kernel finds the return address to divert at the stack pointer.
use std::path::{Path, PathBuf};

use iced_x86::{
    Code, Decoder, DecoderOptions, FlowControl, InstructionInfoFactory, Mnemonic, OpAccess, OpKind, Register,
};
use object::{Object as _, ObjectSymbol as _};
use profiler_common::lock::call::{self, reg};

use crate::{
    error::UserError,
    process::{exec_mappings, MapsLine},
    unwind::segments_of,
};

/// Instructions decoded from a function's start before giving up on an emulated one.
const SCAN: usize = 24;

/// The functions probed: (name, what it does to the lock, the argument holding the lock).
const FUNCTIONS: [(&str, u32, Register); 13] = [
    ("pthread_mutex_lock", call::MUTEX_LOCK, Register::RDI),
    ("pthread_mutex_timedlock", call::MUTEX_TIMEDLOCK, Register::RDI),
    ("pthread_mutex_clocklock", call::MUTEX_TIMEDLOCK, Register::RDI),
    ("pthread_mutex_trylock", call::MUTEX_TRYLOCK, Register::RDI),
    ("pthread_mutex_unlock", call::MUTEX_UNLOCK, Register::RDI),
    ("pthread_rwlock_rdlock", call::RWLOCK_RDLOCK, Register::RDI),
    ("pthread_rwlock_wrlock", call::RWLOCK_WRLOCK, Register::RDI),
    ("pthread_rwlock_unlock", call::RWLOCK_UNLOCK, Register::RDI),
    ("pthread_cond_wait", call::COND_WAIT, Register::RSI),
    ("pthread_cond_timedwait", call::COND_WAIT, Register::RSI),
    ("pthread_cond_clockwait", call::COND_WAIT, Register::RSI),
    ("pthread_mutex_destroy", call::MUTEX_DESTROY, Register::RDI),
    ("pthread_rwlock_destroy", call::RWLOCK_DESTROY, Register::RDI),
];

/// Where to put one function's probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProbePoint {
    /// Bytes from the function's start.
    pub offset: u64,
    /// `call::reg::*` holding the lock's address there.
    pub register: u32,
    /// Bytes pushed on the stack before it.
    pub pushed: u32,
    /// On an instruction the kernel emulates (else: the first, single-stepped).
    pub emulated: bool,
}

impl ProbePoint {
    /// The function's first instruction, where the lock argument is still where the call put it.
    fn entry(argument: Register) -> ProbePoint {
        ProbePoint {
            offset: 0,
            register: cookie_register(argument).unwrap_or(reg::RDI),
            pushed: 0,
            emulated: false,
        }
    }
}

/// One probe to attach: on `path` at `file_offset`, with its cookie; a return probe too when
/// `returns`.
#[derive(Clone, Debug)]
pub struct LockProbe {
    pub function: &'static str,
    pub file_offset: u64,
    pub cookie: u64,
    pub returns: bool,
    pub emulated: bool,
}

/// The file of a process that has the pthread lock functions, and the probes for them.
#[derive(Clone, Debug)]
pub struct LockLibrary {
    /// As the process maps it.
    pub display: String,
    /// Where to open it (the mapping itself, so another mount namespace or a deleted file work).
    pub path: PathBuf,
    pub probes: Vec<LockProbe>,
}

impl LockLibrary {
    /// Lock and unlock functions probed on their first instruction (each call single-stepped:
    /// slower). Destroy functions are left out: rare calls.
    pub fn single_stepped(&self) -> Vec<&'static str> {
        let mut names: Vec<_> = self
            .probes
            .iter()
            .filter(|p| !p.emulated && !call::destroys(call::kind(p.cookie)))
            .map(|p| p.function)
            .collect();
        names.dedup();
        names
    }
}

/// The lock functions of the file `pid` maps them from: its executable if statically linked,
/// else the libc (or libpthread) it loaded.
pub fn for_process(pid: u32) -> Result<LockLibrary, UserError> {
    let maps = std::fs::File::open(format!("/proc/{pid}/maps"))
        .and_then(exec_mappings)
        .map_err(|_| UserError::NoSuchProcess(pid))?;
    let mut searched = Vec::new();
    for line in unique_files(&maps) {
        let open = PathBuf::from(line.map_files_path(pid));
        if let Some(library) = read(&open, &line.path) {
            return Ok(library);
        }
        searched.push(line.path.clone());
    }
    Err(UserError::NoPthread {
        target: format!("pid {pid}"),
        searched: searched.join(", "),
    })
}

/// For a command not yet started: its own executable if it has the functions; else, if it is
/// dynamically linked, the libc bpfprof itself runs with (the same machine's loader will give
/// it the same one).
pub fn for_command(program: &Path) -> Result<LockLibrary, UserError> {
    let display = program.display().to_string();
    if let Some(library) = read(program, &display) {
        return Ok(library);
    }
    let no_pthread = |searched: String| UserError::NoPthread {
        target: display.clone(),
        searched,
    };
    if !has_interpreter(program) {
        return Err(no_pthread(display.clone()));
    }
    let maps = std::fs::File::open("/proc/self/maps")
        .and_then(exec_mappings)
        .unwrap_or_default();
    let mut searched = vec![display.clone()];
    for line in unique_files(&maps) {
        let name = Path::new(&line.path)
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("");
        if name.starts_with("libc.so") || name.starts_with("libpthread.so") {
            if let Some(library) = read(Path::new(&line.path), &line.path) {
                return Ok(library);
            }
            searched.push(line.path.clone());
        }
    }
    Err(no_pthread(searched.join(", ")))
}

/// The executable names a program interpreter (the dynamic loader): it will load a libc.
fn has_interpreter(program: &Path) -> bool {
    use object::read::elf::{ElfFile64, ProgramHeader as _};
    let Ok(bytes) = std::fs::read(program) else {
        return false;
    };
    let Ok(elf) = ElfFile64::<object::Endianness>::parse(&*bytes) else {
        return false;
    };
    let endian = elf.endian();
    elf.elf_program_headers()
        .iter()
        .any(|header| header.p_type(endian) == object::elf::PT_INTERP)
}

/// The first executable mapping of each file, in address order.
fn unique_files(lines: &[MapsLine]) -> Vec<&MapsLine> {
    let mut seen = std::collections::HashSet::new();
    lines
        .iter()
        .filter(|l| l.path.starts_with('/') && seen.insert((l.dev, l.inode)))
        .collect()
}

/// The probes for the file at `open`, if it defines `pthread_mutex_lock` and `_unlock`.
fn read(open: &Path, display: &str) -> Option<LockLibrary> {
    let bytes = std::fs::read(open).ok()?;
    let file = object::File::parse(&*bytes).ok()?;
    let segments = segments_of(&file);
    let mut probes = Vec::new();
    let mut placed = std::collections::HashSet::new();
    for symbol in file.dynamic_symbols().chain(file.symbols()) {
        if symbol.is_undefined() || symbol.size() == 0 {
            continue;
        }
        let Ok(name) = symbol.name() else { continue };
        let Some(&(function, kind, argument)) = FUNCTIONS.iter().find(|f| f.0 == name) else {
            continue;
        };
        // Aliases and symbol versions of one function: one probe.
        if !placed.insert(symbol.address()) {
            continue;
        }
        let Some(offset) = segments.iter().find_map(|s| s.file_offset(symbol.address())) else {
            continue;
        };
        let code = bytes.get(offset as usize..offset.checked_add(symbol.size())? as usize)?;
        let returns = call::acquires(kind);
        let point = match file.architecture() {
            // The arguments are in x0.. at the first instruction, numbered as x86-64's first
            // four (`call::reg`: 0..3 are x0..x3 there), and nothing is pushed yet.
            object::Architecture::Aarch64 => ProbePoint::entry(argument),
            _ => probe_point(code, argument, returns),
        };
        probes.push(LockProbe {
            function,
            file_offset: offset + point.offset,
            cookie: call::cookie(kind, point.register, point.pushed),
            returns,
            emulated: point.emulated,
        });
    }
    let has = |kind| probes.iter().any(|p| call::kind(p.cookie) == kind);
    if !has(call::MUTEX_LOCK) || !has(call::MUTEX_UNLOCK) {
        return None;
    }
    probes.sort_by_key(|p| (p.function, p.file_offset));
    Some(LockLibrary {
        display: display.to_string(),
        path: open.to_path_buf(),
        probes,
    })
}

/// The first instruction of the function's straight-line start the kernel emulates, with where
/// the lock argument is and how much was pushed by then; the entry itself if there is none
/// (single-stepped, but right).
pub fn probe_point(code: &[u8], argument: Register, unmoved_stack: bool) -> ProbePoint {
    let entry = ProbePoint::entry(argument);
    let mut decoder = Decoder::with_ip(64, code, 0, DecoderOptions::NONE);
    let mut info = InstructionInfoFactory::new();
    let mut holding = vec![argument];
    let mut pushed: u32 = 0;
    for _ in 0..SCAN {
        if !decoder.can_decode() {
            break;
        }
        let instruction = decoder.decode();
        if instruction.is_invalid() {
            break;
        }
        if kernel_emulates(&instruction, &code[instruction.ip() as usize..])
            && (!unmoved_stack || pushed == 0)
        {
            if let Some(register) = holding.iter().find_map(|&r| cookie_register(r)) {
                return ProbePoint {
                    offset: instruction.ip(),
                    register,
                    pushed,
                    emulated: true,
                };
            }
        }
        if instruction.flow_control() != FlowControl::Next {
            break;
        }
        let copied = instruction.mnemonic() == Mnemonic::Mov
            && instruction.op_count() == 2
            && instruction.op0_kind() == OpKind::Register
            && instruction.op1_kind() == OpKind::Register
            && instruction.op0_register().is_gpr64()
            && holding.contains(&instruction.op1_register());
        let mut moves_stack = false;
        for used in info.info(&instruction).used_registers() {
            if !matches!(
                used.access(),
                OpAccess::Write | OpAccess::CondWrite | OpAccess::ReadWrite | OpAccess::ReadCondWrite
            ) {
                continue;
            }
            let full = used.register().full_register();
            if full == Register::RSP {
                moves_stack = true;
            }
            // The caller's frame pointer is what the walk continues with.
            if full == Register::RBP {
                return entry;
            }
            holding.retain(|&r| r != full);
        }
        if moves_stack {
            match stack_growth(&instruction) {
                Some(bytes) => pushed += bytes,
                None => break,
            }
        }
        if copied {
            holding.push(instruction.op0_register());
        }
        if holding.is_empty() {
            break;
        }
    }
    entry
}

/// The kernel's uprobe emulation on x86-64: `push reg` (0x50+r, REX.B allowed) and direct
/// branches (jmp, call, jcc) without an operand-size prefix.
fn kernel_emulates(instruction: &iced_x86::Instruction, bytes: &[u8]) -> bool {
    match instruction.code() {
        Code::Push_r64 => instruction.len() <= 2 && matches!(bytes.first(), Some(0x50..=0x57 | 0x41)),
        _ => {
            let direct = matches!(
                instruction.code(),
                Code::Jmp_rel8_64 | Code::Jmp_rel32_64 | Code::Call_rel32_64
            ) || instruction.is_jcc_short_or_near();
            direct && !matches!(bytes.first(), Some(0x66 | 0x67 | 0xf2 | 0xf3))
        }
    }
}

/// How much a stack-pointer change grows the stack: a push, or `sub rsp, imm`.
fn stack_growth(instruction: &iced_x86::Instruction) -> Option<u32> {
    match instruction.mnemonic() {
        Mnemonic::Push
            if instruction.op0_kind() == OpKind::Register && instruction.op0_register().is_gpr64() =>
        {
            Some(8)
        }
        Mnemonic::Sub
            if instruction.op0_register() == Register::RSP
                && matches!(
                    instruction.op1_kind(),
                    OpKind::Immediate8to64
                        | OpKind::Immediate32to64
                        | OpKind::Immediate8
                        | OpKind::Immediate32
                ) =>
        {
            u32::try_from(instruction.immediate(1)).ok()
        }
        _ => None,
    }
}

fn cookie_register(register: Register) -> Option<u32> {
    Some(match register {
        Register::RDI => reg::RDI,
        Register::RSI => reg::RSI,
        Register::RDX => reg::RDX,
        Register::RCX => reg::RCX,
        Register::R8 => reg::R8,
        Register::R9 => reg::R9,
        Register::RAX => reg::RAX,
        Register::RBX => reg::RBX,
        Register::R10 => reg::R10,
        Register::R11 => reg::R11,
        Register::R12 => reg::R12,
        Register::R13 => reg::R13,
        Register::R14 => reg::R14,
        Register::R15 => reg::R15,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(code: &[u8], argument: Register, unmoved: bool) -> ProbePoint {
        probe_point(code, argument, unmoved)
    }

    #[test]
    fn glibc_mutex_lock_is_probed_on_its_first_branch() {
        // mov 0x10(%rdi),%eax; mov %eax,%edx; and $0x17f,%edx; and $0x7c,%eax; jne ...; push %rbx
        let code = [
            0x8b, 0x47, 0x10, 0x89, 0xc2, 0x81, 0xe2, 0x7f, 0x01, 0x00, 0x00, 0x83, 0xe0, 0x7c, 0x0f, 0x85,
            0xac, 0x00, 0x00, 0x00, 0x53,
        ];
        let p = point(&code, Register::RDI, true);
        assert_eq!(
            p,
            ProbePoint {
                offset: 14,
                register: reg::RDI,
                pushed: 0,
                emulated: true
            }
        );
    }

    #[test]
    fn a_push_with_the_argument_copied_counts_the_stack_moved() {
        // push %rbp; mov %rdi,%r8; push %rbx; sub $0x8,%rsp; mov 0x18(%rdi),%edx (glibc's
        // rwlock_unlock), then clobber rdi: the probe on the first push sees rdi.
        let code = [0x55, 0x49, 0x89, 0xf8, 0x53, 0x48, 0x83, 0xec, 0x08];
        assert_eq!(
            point(&code, Register::RDI, false),
            ProbePoint {
                offset: 0,
                register: reg::RDI,
                pushed: 0,
                emulated: true
            }
        );
        // xor %edi,%edi after copying it to rbx; then push %r12: found in rbx, 0 pushed.
        let code = [0x48, 0x89, 0xfb, 0x31, 0xff, 0x41, 0x54];
        assert_eq!(
            point(&code, Register::RDI, false),
            ProbePoint {
                offset: 5,
                register: reg::RBX,
                pushed: 0,
                emulated: true
            }
        );
        // sub $0x18,%rsp; push %rbx: 0x18 pushed, but not when the stack must be unmoved.
        let code = [0x48, 0x83, 0xec, 0x18, 0x53];
        assert_eq!(point(&code, Register::RDI, false).pushed, 0x18);
        assert!(!point(&code, Register::RDI, true).emulated);
    }

    #[test]
    fn no_emulated_instruction_or_lost_argument_falls_back_to_the_entry() {
        // mov (%rdi),%rdi; push %rbx: the lock's address is gone.
        let code = [0x48, 0x8b, 0x3f, 0x53];
        assert_eq!(point(&code, Register::RDI, false).offset, 0);
        assert!(!point(&code, Register::RDI, false).emulated);
        // mov %rsp,%rbp before the push: the caller's frame pointer is gone.
        let code = [0x48, 0x89, 0xe5, 0x53];
        assert!(!point(&code, Register::RDI, false).emulated);
        // ret first.
        assert!(!point(&[0xc3, 0x53], Register::RDI, false).emulated);
    }

    #[test]
    fn this_machines_libc_has_its_lock_functions_probed_off_the_first_instruction() {
        let libc = exec_mappings(std::fs::File::open("/proc/self/maps").unwrap())
            .unwrap()
            .into_iter()
            .find(|l| l.path.contains("libc.so"))
            .expect("test binary maps libc");
        let library = read(Path::new(&libc.path), &libc.path).expect("libc has the pthread functions");
        for probe in &library.probes {
            if ["pthread_mutex_lock", "pthread_mutex_unlock"].contains(&probe.function) {
                assert!(probe.emulated, "{probe:?}");
            }
        }
    }
}
