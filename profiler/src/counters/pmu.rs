//! Is there a hardware PMU? Asked the way it will be used: by opening a cycles counter. Also the
//! one `perf_event_open` wrapper the counting paths share.
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
    let attr = Attr {
        kind,
        config,
        ..Attr::default()
    };
    perf_event_open(&attr, pid, cpu, -1)
}

/// perf_event_attr up to config2 (PERF_ATTR_SIZE_VER1): what counting events need.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Attr {
    pub kind: u32,
    pub size: u32,
    pub config: u64,
    pub sample_period: u64,
    pub sample_type: u64,
    pub read_format: u64,
    pub flags: u64,
    pub wakeup_events: u32,
    pub bp_type: u32,
    pub config1: u64,
    pub config2: u64,
}
const _: () = assert!(std::mem::size_of::<Attr>() == 72);

impl Default for Attr {
    fn default() -> Attr {
        Attr {
            kind: 0,
            size: std::mem::size_of::<Attr>() as u32,
            config: 0,
            sample_period: 0,
            sample_type: 0,
            read_format: 0,
            flags: 0,
            wakeup_events: 0,
            bp_type: 0,
            config1: 0,
            config2: 0,
        }
    }
}

/// `perf_event_open(2)`, close-on-exec; `group` is the leader's fd or -1.
pub fn perf_event_open(attr: &Attr, pid: i32, cpu: i32, group: i32) -> io::Result<OwnedFd> {
    const PERF_FLAG_FD_CLOEXEC: u64 = 8;
    // SAFETY: the kernel reads `attr.size` bytes of the attribute and returns a new fd or -1.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            attr as *const Attr,
            pid,
            cpu,
            group,
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
