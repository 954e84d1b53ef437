//! Is there a hardware PMU? Asked the way it will be used: by opening a cycles counter.
use std::{
    io,
    os::fd::{FromRawFd as _, OwnedFd},
};

/// Why hardware counters cannot be used here, or `None` when they can.
pub fn missing_reason() -> Option<String> {
    match open_cycles_counter() {
        Ok(()) => None,
        Err(err) => Some(match err.raw_os_error() {
            Some(libc::ENOENT) | Some(libc::EOPNOTSUPP) | Some(libc::ENODEV) => format!(
                "no hardware PMU: the kernel cannot count CPU cycles here (perf_event_open: {err}); \
                 typical of VMs without a virtual PMU"
            ),
            Some(libc::EACCES) | Some(libc::EPERM) => {
                format!("hardware counters are not permitted (perf_event_open: {err}): run as root")
            }
            _ => format!("hardware counters are unavailable (perf_event_open: {err})"),
        }),
    }
}

fn open_cycles_counter() -> io::Result<()> {
    open_counter(0 /* PERF_TYPE_HARDWARE */, 0 /* CPU_CYCLES */, 0, -1).map(drop)
}

/// A counting (not sampling) perf event: of process `pid` on any CPU, or of every process on
/// `cpu` with pid -1.
pub fn open_counter(kind: u32, config: u64, pid: i32, cpu: i32) -> io::Result<OwnedFd> {
    // perf_event_attr with only the fields a counting event needs; the kernel accepts the
    // version-0 size (64 bytes).
    #[repr(C)]
    struct Attr {
        kind: u32,
        size: u32,
        config: u64,
        rest: [u64; 6],
    }
    const _: () = assert!(std::mem::size_of::<Attr>() == 64);
    let attr = Attr {
        kind,
        size: 64,
        config,
        rest: [0; 6],
    };
    const PERF_FLAG_FD_CLOEXEC: u64 = 8;
    // SAFETY: perf_event_open reads `size` bytes of the attribute; it returns a new fd or -1.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            &attr as *const Attr,
            pid,
            cpu,
            -1,
            PERF_FLAG_FD_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor that we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

#[cfg(test)]
mod tests {
    #[test]
    fn answers_either_way_with_a_reason() {
        // Whatever the machine, the answer is consistent with a direct look at sysfs: a VM without a
        // PMU has no cpu/events/cpu-cycles.
        let reason = super::missing_reason();
        let sysfs = std::path::Path::new("/sys/bus/event_source/devices/cpu/events/cpu-cycles").exists()
            || std::path::Path::new("/sys/bus/event_source/devices/cpu_core/events/cpu-cycles").exists();
        if let Some(reason) = &reason {
            assert!(reason.contains("perf_event_open"), "{reason}");
        }
        if !sysfs {
            assert!(
                reason.is_some(),
                "no cycles event in sysfs, yet cycles could be opened"
            );
        }
    }
}
