//! The machine registers the programs read, per architecture: the rest of the programs ask for
//! a pc, a stack pointer, a frame pointer, a return value or a numbered register, never for a
//! field of `pt_regs` by name.
//!
//! Both supported architectures keep the same frame record where frame pointers are kept: the
//! caller's frame pointer at the frame pointer, the return address above it (x86-64: rbp and
//! the call's push; AArch64: x29 and x30 stored as a pair), so a frame-pointer step is shared.
use aya_ebpf::{bindings::pt_regs, helpers::bpf_probe_read_kernel};

/// One field of a `pt_regs` the kernel's BTF types (`bpf_task_pt_regs`): the verifier lets the
/// program load it directly (a fault reads 0), where `bpf_probe_read_kernel` costs a helper call.
/// Volatile: one load of the field's own size, as the verifier checks it against the BTF.
#[inline(always)]
unsafe fn load<T: Copy>(field: *const T) -> T {
    unsafe { core::ptr::read_volatile(field) }
}

/// The registers a user stack walk starts from.
#[derive(Clone, Copy)]
pub struct UserRegisters {
    pub pc: u64,
    pub sp: u64,
    pub fp: u64,
    /// AArch64's link register: the return address of a frame that has not saved it yet. 0
    /// where unknown, and on x86-64 (the call pushes it).
    pub lr: u64,
}

#[cfg(bpf_target_arch = "x86_64")]
mod imp {
    use super::*;

    /// Addresses at or above this are the kernel's (or non-canonical), never a user pc.
    pub const USER_SPACE_END: u64 = 0x0000_8000_0000_0000;

    #[inline(always)]
    pub fn in_user_mode(regs: &pt_regs) -> bool {
        regs.cs & 3 == 3
    }

    /// A return address read from the stack, as the code address it is.
    #[inline(always)]
    pub fn code_address(saved: u64) -> u64 {
        saved
    }

    #[inline(always)]
    pub fn registers(regs: &pt_regs) -> UserRegisters {
        UserRegisters {
            pc: regs.rip,
            sp: regs.rsp,
            fp: regs.rbp,
            lr: 0,
        }
    }

    #[inline(always)]
    pub fn pc(regs: &pt_regs) -> u64 {
        regs.rip
    }

    #[inline(always)]
    pub fn return_value(regs: &pt_regs) -> u64 {
        regs.rax
    }

    /// The register numbered `n` in `profiler_common::lock::call::reg`. Copied out first: the
    /// verifier refuses a context load at a computed offset.
    #[inline(always)]
    pub fn register(regs: &pt_regs, n: u32) -> u64 {
        let all = [
            regs.rdi, regs.rsi, regs.rdx, regs.rcx, regs.r8, regs.r9, regs.rax, regs.rbx, regs.r10, regs.r11,
            regs.r12, regs.r13, regs.r14, regs.r15,
        ];
        all.get(n as usize).copied().unwrap_or(0)
    }

    /// The caller's registers at a probe in a function's prologue, after `pushed` bytes were
    /// pushed: the return address the call pushed sits above them, and the frame pointer is still
    /// the caller's (the probe point is chosen before any write to rbp).
    #[inline(always)]
    pub fn caller_at_prologue(regs: &pt_regs, pushed: u64) -> Option<UserRegisters> {
        let sp = regs.rsp + pushed;
        let return_address = unsafe { aya_ebpf::helpers::bpf_probe_read_user(sp as *const u64) }.ok()?;
        Some(UserRegisters {
            pc: return_address,
            sp: sp + 8,
            fp: regs.rbp,
            lr: 0,
        })
    }

    /// A system call's six arguments at `sys_enter` (rdi, rsi, rdx, r10, r8, r9), read in one
    /// copy of the registers from r10 to rdi, which `pt_regs` keeps side by side.
    #[inline(always)]
    pub fn syscall_args(regs: *const pt_regs) -> [u64; 6] {
        let from = unsafe { core::ptr::addr_of!((*regs).r10) } as *const [u64; 8];
        match unsafe { bpf_probe_read_kernel(from) } {
            // r10, r9, r8, ax, cx, dx, si, di
            Ok(r) => [r[7], r[6], r[5], r[0], r[2], r[1]],
            Err(_) => [0; 6],
        }
    }

    /// The user registers the kernel saved for the current thread (`bpf_task_pt_regs`: typed
    /// by the kernel's BTF, so read with plain loads).
    #[inline(always)]
    pub fn saved(saved: *const pt_regs) -> Option<UserRegisters> {
        // Its low 16 bits: the whole field before Linux 6.9, since then `cs` of a union with
        // FRED's wider view, which a wider load would reach past.
        let cs = unsafe { load(core::ptr::addr_of!((*saved).cs) as *const u16) };
        if cs & 3 != 3 {
            return None;
        }
        let ip = unsafe { load(core::ptr::addr_of!((*saved).rip)) };
        let sp = unsafe { load(core::ptr::addr_of!((*saved).rsp)) };
        let fp = unsafe { load(core::ptr::addr_of!((*saved).rbp)) };
        Some(UserRegisters {
            pc: ip,
            sp,
            fp,
            lr: 0,
        })
    }
}

#[cfg(bpf_target_arch = "aarch64")]
mod imp {
    use super::*;

    /// User addresses have at most 52 bits (48 on most kernels); the kernel's start with 0xffff.
    pub const USER_SPACE_END: u64 = 1 << 52;

    /// PSTATE.M[3:0] is 0 (EL0t) in user mode; bit 4 set is a 32-bit task, which is not walked.
    const MODE_MASK: u64 = 0x1f;

    #[inline(always)]
    pub fn in_user_mode(regs: &pt_regs) -> bool {
        regs.pstate & MODE_MASK == 0
    }

    /// A return address read from the stack, as the code address it is: with pointer
    /// authentication (-mbranch-protection) its signature fills the bits above the 48-bit
    /// address.
    #[inline(always)]
    pub fn code_address(saved: u64) -> u64 {
        saved & ((1 << 48) - 1)
    }

    #[inline(always)]
    pub fn registers(regs: &pt_regs) -> UserRegisters {
        UserRegisters {
            pc: regs.pc,
            sp: regs.sp,
            fp: regs.regs[29],
            lr: regs.regs[30],
        }
    }

    #[inline(always)]
    pub fn pc(regs: &pt_regs) -> u64 {
        regs.pc
    }

    #[inline(always)]
    pub fn return_value(regs: &pt_regs) -> u64 {
        regs.regs[0]
    }

    /// x`n` (31 and above: 0). A match, not an index: the verifier refuses a context load at a
    /// computed offset, and copying all 31 registers out would take half the BPF stack.
    #[inline(always)]
    pub fn register(regs: &pt_regs, n: u32) -> u64 {
        macro_rules! pick {
            ($($i:literal)*) => {
                match n {
                    $($i => regs.regs[$i],)*
                    _ => 0,
                }
            };
        }
        pick!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30)
    }

    /// The caller's registers at a probe on a function's first instruction: the return address
    /// is still in x30 and nothing is pushed yet (probes on AArch64 are placed at entry).
    #[inline(always)]
    pub fn caller_at_prologue(regs: &pt_regs, pushed: u64) -> Option<UserRegisters> {
        if pushed != 0 {
            return None;
        }
        // The caller has called: its own return address is saved in its frame, not in x30.
        Some(UserRegisters {
            pc: regs.regs[30],
            sp: regs.sp,
            fp: regs.regs[29],
            lr: 0,
        })
    }

    /// A system call's six arguments at `sys_enter`: x0 to x5 (x0 is overwritten only by the
    /// return value).
    #[inline(always)]
    pub fn syscall_args(regs: *const pt_regs) -> [u64; 6] {
        let from = unsafe { core::ptr::addr_of!((*regs).regs) } as *const [u64; 6];
        unsafe { bpf_probe_read_kernel(from) }.unwrap_or([0; 6])
    }

    /// The user registers the kernel saved for the current thread (`bpf_task_pt_regs`: typed
    /// by the kernel's BTF, so read with plain loads; the kernel's `pt_regs` begins with the
    /// user-visible `user_pt_regs`).
    #[inline(always)]
    pub fn saved(saved: *const pt_regs) -> Option<UserRegisters> {
        let pstate = unsafe { load(core::ptr::addr_of!((*saved).pstate)) };
        if pstate & MODE_MASK != 0 {
            return None;
        }
        let ip = unsafe { load(core::ptr::addr_of!((*saved).pc)) };
        let sp = unsafe { load(core::ptr::addr_of!((*saved).sp)) };
        let fp = unsafe { load(core::ptr::addr_of!((*saved).regs[29])) };
        // Where the thread entered the kernel (a syscall, a fault) x30 may still hold the
        // return address of a function that has not saved it: a leaf making a syscall.
        let lr = unsafe { load(core::ptr::addr_of!((*saved).regs[30])) };
        Some(UserRegisters { pc: ip, sp, fp, lr })
    }
}

pub use imp::*;
