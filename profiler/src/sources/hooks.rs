//! How a kernel program runs at an event's hits, shared by the sources that put programs on
//! any event of `-e`'s language (the sampler, `latency`): each kind of event's program type, where
//! its perf events are opened, and the link that hands the program a cookie.
use std::os::fd::{AsFd as _, AsRawFd as _, FromRawFd as _, OwnedFd, RawFd};

use anyhow::Context as _;
use profiler_common::{names, with_site};

use super::AttachContext;
use crate::{
    bpf::Loaded,
    counters::{
        filter::SiteTerms,
        language::Event,
        pmu::{perf_event_open, Attr},
    },
    error::UserError,
};

/// How a program runs at an event: at a perf event's overflows (the CPU sampler's type), or at
/// each hit of a tracing event (a tracepoint's program type, or a probe's: user and kernel).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Hook {
    Overflow,
    Tracepoint,
    Probe,
}

impl Hook {
    pub(crate) fn of(event: &Event) -> Hook {
        match (event.is_tracepoint(), event.probe.is_some()) {
            (true, _) => Hook::Tracepoint,
            (_, true) => Hook::Probe,
            _ => Hook::Overflow,
        }
    }

    pub(crate) fn program<'a>(kernel: &'a Loaded, name: &str) -> anyhow::Result<&'a aya::programs::Program> {
        (kernel.ebpf.program(name)).with_context(|| format!("program {name} missing"))
    }

    /// The table walker a program at this hook hands a stack to (see `unwind`), loaded once and
    /// put where the hook's programs tail-call it.
    pub(crate) fn load_walker(self, kernel: &mut Loaded) -> anyhow::Result<()> {
        let (walker, walkers) = match self {
            Hook::Overflow => (names::PROG_UNWIND, names::UNWIND_PROGRAMS),
            Hook::Tracepoint => (
                names::PROG_UNWIND_TRACEPOINT_HIT,
                names::TRACEPOINT_HIT_UNWIND_PROGRAMS,
            ),
            Hook::Probe => (names::PROG_UNWIND_PROBE_HIT, names::PROBE_HIT_UNWIND_PROGRAMS),
        };
        if !self.loaded(kernel, walker)? {
            self.load_program(kernel, walker)
                .context("loading the stack unwinding program")?;
            kernel.install_walker(walker, walkers)?;
        }
        Ok(())
    }

    pub(crate) fn loaded(self, kernel: &Loaded, name: &str) -> anyhow::Result<bool> {
        Ok(Self::program(kernel, name)?.fd().is_ok())
    }

    /// Load one of its programs (its type's own `load`).
    pub(crate) fn load_program(self, kernel: &mut Loaded, name: &str) -> anyhow::Result<()> {
        use aya::programs::{PerfEvent, TracePoint, UProbe};
        match self {
            Hook::Overflow => kernel.program::<PerfEvent>(name)?.load()?,
            Hook::Tracepoint => kernel.program::<TracePoint>(name)?.load()?,
            Hook::Probe => kernel.program::<UProbe>(name)?.load()?,
        }
        Ok(())
    }

    /// Where its perf events are opened, as `(pid, cpu)`. The CPU sampler's on every CPU. A
    /// tracing event's program runs at every hit on any CPU, whichever CPU its perf event was
    /// opened on (and the kernel takes a tracepoint's program once), so once: for a user probe
    /// of `-p` processes once per process, which plants the probe in their memory only (one
    /// opened system-wide traps in every process that maps the file). A kernel probe's program
    /// runs at every hit whatever process the perf event names: once.
    pub(crate) fn scope(self, event: &Event, context: &AttachContext<'_>) -> anyhow::Result<Vec<(i32, i32)>> {
        let cpus = crate::counters::cpu::online_ids()?;
        let any_cpu = vec![(-1, cpus.first().copied().unwrap_or(0) as i32)];
        let per_process = !context.system_wide && context.command.is_none();
        Ok(match self {
            Hook::Overflow => cpus.into_iter().map(|cpu| (-1, cpu as i32)).collect(),
            Hook::Probe if per_process && !event.probe.as_ref().is_some_and(|p| p.kernel) => {
                context.pids.iter().map(|&pid| (pid as i32, -1)).collect()
            }
            Hook::Tracepoint | Hook::Probe => any_cpu,
        })
    }

    /// Program `name` (of this type), loaded once: its fd.
    pub(crate) fn load_once(self, kernel: &mut Loaded, name: &str) -> anyhow::Result<RawFd> {
        if !self.loaded(kernel, name)? {
            self.load_program(kernel, name)
                .with_context(|| format!("loading {name}"))?;
        }
        Ok(Self::program(kernel, name)?.fd()?.as_fd().as_raw_fd())
    }
}

/// `event` opened where its hits run a program (`scope`), which is `programs.0` for a tracepoint
/// and `programs.1` for a probe (loaded once), with `cookie`: each (link, perf event), dropping
/// which detaches it.
pub(crate) fn open_traced(
    kernel: &mut Loaded,
    event: &Event,
    programs: (&str, &str),
    cookie: u64,
    context: &AttachContext<'_>,
) -> anyhow::Result<Vec<(OwnedFd, OwnedFd)>> {
    let hook = Hook::of(event);
    let program = match hook {
        Hook::Tracepoint => programs.0,
        _ => programs.1,
    };
    let fd = hook.load_once(kernel, program)?;
    let flags = event.exclude_flags();
    open_at_hits(
        fd,
        event,
        |attr| Attr { flags, ..attr },
        cookie,
        hook.scope(event, context)?,
    )
}

/// Each event's filter into the kernel's table (`HIT_FILTERS`), as each of its sites reads it:
/// at `(event * MAX_PROBE_SITES + site) * MAX_FILTER_TERMS + n`.
pub(crate) fn set_filters(kernel: &mut Loaded, filters: &[SiteTerms]) -> anyhow::Result<()> {
    use profiler_common::{MAX_FILTER_TERMS, MAX_PROBE_SITES};
    if filters.iter().flatten().all(Vec::is_empty) {
        return Ok(());
    }
    let mut table: aya::maps::Array<aya::maps::MapData, profiler_common::FilterTerm> =
        aya::maps::Array::try_from(crate::collect::take_map(&mut kernel.ebpf, names::HIT_FILTERS)?)?;
    for (event, sites) in filters.iter().enumerate() {
        for (site, terms) in sites.iter().enumerate().take(MAX_PROBE_SITES) {
            for (n, term) in terms.iter().enumerate().take(MAX_FILTER_TERMS) {
                let slot = (event * MAX_PROBE_SITES + site) * MAX_FILTER_TERMS + n;
                table.set(slot as u32, *term, 0)?;
            }
        }
    }
    kernel.hold(table);
    Ok(())
}

/// Open `event` (each of its `attrs`, as `fill` completes them) at each of `places` (`(pid,
/// cpu)`), running `program_fd` at its hits with `cookie` (and each probe site's index): each
/// (link, perf event) handed over, dropping which detaches the program.
pub(crate) fn open_at_hits(
    program_fd: RawFd,
    event: &Event,
    fill: impl Fn(Attr) -> Attr,
    cookie: u64,
    places: Vec<(i32, i32)>,
) -> anyhow::Result<Vec<(OwnedFd, OwnedFd)>> {
    let mut opened = Vec::new();
    for (pid, cpu) in places {
        let place = match pid {
            -1 => format!("on CPU {cpu}"),
            pid => format!("in process {pid}"),
        };
        for (attr, site) in event.attrs() {
            let fd = perf_event_open(&fill(attr), pid, cpu, -1).map_err(|e| open_error(event, &place, e))?;
            let link = link_with_cookie(program_fd, fd.as_raw_fd(), with_site(cookie, site))
                .with_context(|| format!("running a program at {} events {place}", event.spelled()))?;
            opened.push((link, fd));
        }
    }
    Ok(opened)
}

/// `BPF_LINK_CREATE` of a perf-event program on a perf event, with a cookie the program reads
/// back (`bpf_get_attach_cookie`, kernel 5.15 and later); the link detaches when dropped. aya
/// attaches perf events it opens itself, without a cookie.
pub(crate) fn link_with_cookie(program_fd: RawFd, perf_fd: RawFd, cookie: u64) -> std::io::Result<OwnedFd> {
    /// `union bpf_attr`'s `link_create` with its `perf_event` member.
    #[repr(C)]
    struct LinkCreate {
        prog_fd: u32,
        target_fd: u32,
        attach_type: u32,
        flags: u32,
        bpf_cookie: u64,
    }
    const BPF_LINK_CREATE: libc::c_long = 28;
    const BPF_PERF_EVENT: u32 = 41;
    let attr = LinkCreate {
        prog_fd: program_fd as u32,
        target_fd: perf_fd as u32,
        attach_type: BPF_PERF_EVENT,
        flags: 0,
        bpf_cookie: cookie,
    };
    // SAFETY: bpf(2) reads `size` bytes of `attr`, which lives through the call.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_LINK_CREATE,
            &attr as *const LinkCreate,
            std::mem::size_of::<LinkCreate>() as u32,
        )
    };
    match fd {
        // SAFETY: a new fd the kernel just gave us, owned by nothing else.
        fd if fd >= 0 => Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) }),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// What a sampling event the kernel refused to open means for the user.
pub(crate) fn open_error(event: &Event, place: &str, e: std::io::Error) -> anyhow::Error {
    let missing = matches!(
        e.raw_os_error(),
        Some(libc::ENOENT | libc::EOPNOTSUPP | libc::ENODEV)
    );
    match (event.hardware, e.raw_os_error()) {
        (true, _) if missing && crate::counters::pmu::missing_reason().is_some() => UserError::NoPmu {
            event: event.spelled(),
        }
        .into(),
        (_, Some(libc::EINVAL | libc::EOPNOTSUPP)) if event.precise > 0 => UserError::Usage(format!(
            "-e {}: this PMU cannot sample that event precisely; drop the :p",
            event.spelled()
        ))
        .into(),
        _ => anyhow::Error::from(e).context(format!("opening the {} event {place}", event.spelled())),
    }
}
