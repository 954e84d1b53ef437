//! The vDSO: the image bpfprof's own process maps, read once, and whether another process's is
//! the same.

use super::exec_mappings;

/// The vDSO as the kernel maps it into this process: the image every 64-bit process maps (an ELF
/// file with `.dynsym` and `.eh_frame`), where it is and its bytes. It never moves nor changes:
/// read once, for the unwinder, the names and the check of each process's.
pub struct OwnVdso {
    pub range: std::ops::Range<u64>,
    pub image: Vec<u8>,
}

pub fn own_vdso() -> Option<&'static OwnVdso> {
    static OWN: std::sync::OnceLock<Option<OwnVdso>> = std::sync::OnceLock::new();
    OWN.get_or_init(|| {
        use std::os::unix::fs::FileExt as _;
        let maps = exec_mappings(std::fs::File::open("/proc/self/maps").ok()?).ok()?;
        let line = maps.into_iter().find(|l| l.path == "[vdso]")?;
        let mut image = vec![0u8; (line.end - line.start) as usize];
        let mem = std::fs::File::open("/proc/self/mem").ok()?;
        mem.read_exact_at(&mut image, line.start).ok()?;
        Some(OwnVdso {
            range: line.start..line.end,
            image,
        })
    })
    .as_ref()
}

/// Whether `pid`'s vDSO, at `start`, is the image bpfprof's own is: a 32-bit process maps
/// another, whose code bpfprof's would misname; its frames stay unnamed. A vDSO above 4 GiB is
/// a 64-bit process's (a 32-bit one's whole memory is below), and a kernel has one 64-bit vDSO:
/// bpfprof's. Below, its ELF header is read and compared, in one system call (opening
/// `/proc/PID/mem` costs three, and the open most of all); through `/proc/PID/mem` where that
/// call fails (a kernel without it, a seccomp filter refusing it, a pid of another namespace
/// than the caller's).
pub(super) fn same_vdso(pid: u32, start: u64) -> bool {
    own_vdso().is_some() && start > u64::from(u32::MAX) || reads_as_own_vdso(pid, start)
}

/// Whether the 64 bytes at `start` in `pid`'s memory are the first of bpfprof's own vDSO.
pub(super) fn reads_as_own_vdso(pid: u32, start: u64) -> bool {
    use std::os::unix::fs::FileExt as _;
    let Some(own) = own_vdso().and_then(|own| own.image.get(..64)) else {
        return false;
    };
    let mut theirs = [0u8; 64];
    let local = libc::iovec {
        iov_base: theirs.as_mut_ptr().cast(),
        iov_len: theirs.len(),
    };
    let remote = libc::iovec {
        iov_base: start as *mut libc::c_void,
        iov_len: theirs.len(),
    };
    // SAFETY: `local` is the 64 bytes of `theirs`, which outlive the call; the kernel checks
    // `remote` against the other process's memory.
    let read = unsafe { libc::process_vm_readv(pid as libc::pid_t, &local, 1, &remote, 1, 0) };
    // (Gone: no other way to it either.)
    let gone = || read < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
    let read = read == theirs.len() as isize
        || !gone()
            && std::fs::File::open(format!("/proc/{pid}/mem"))
                .and_then(|mem| mem.read_exact_at(&mut theirs, start))
                .is_ok();
    read && theirs == own
}
