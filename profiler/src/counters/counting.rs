//! Whole-target counting, as `perf stat` does it: one set of counters per thread of the targets
//! (inherited by the threads and processes they start) or per CPU for the whole system, grouped
//! where the CPU requires it, each scaled by its enabled / running time when the kernel had to
//! multiplex it.
use std::{
    io,
    os::fd::{AsRawFd as _, OwnedFd},
};

use crate::{
    counters::defined::DefinedSite,
    counters::language::{Event, Group},
    counters::pmu::{perf_event_open, Attr},
    counters::tma::{Count, Counts},
};

const FORMAT_TOTAL_TIME_ENABLED: u64 = 1;
const FORMAT_TOTAL_TIME_RUNNING: u64 = 2;
const FORMAT_GROUP: u64 = 8;
const FLAG_DISABLED: u64 = 1;
const FLAG_INHERIT: u64 = 1 << 1;
const IOC_ENABLE: libc::c_ulong = 0x2400;
const IOC_FLAG_GROUP: libc::c_ulong = 1;

/// What to count.
#[derive(Clone, Debug)]
pub enum Scope {
    /// These threads, and whatever they start from now on.
    Threads(Vec<u32>),
    /// Everything on these CPUs.
    Cpus(Vec<u32>),
}

/// The counters of one group on one thread or CPU: one perf group, or one fd per event (a
/// probe's one per site, summed).
struct Instance {
    /// The CPU, for a per-CPU instance (-1 for a thread's).
    cpu: i32,
    fds: Vec<OwnedFd>,
    /// Each fd's event, from `first`.
    members: Vec<usize>,
    grouped: bool,
    /// The index of its first event among all the events counted.
    first: usize,
}

pub struct Counting {
    names: Vec<String>,
    instances: Vec<Instance>,
    /// The probe sites counted as tracepoints of their own (`defined`), removed after the
    /// counters that hold them are closed (fields drop in order).
    _defined: Vec<DefinedSite>,
}

/// Per group, per event, per site: the tracepoint id a probe site is counted as (see
/// `defined`), or none (counted as itself).
type SiteIds = Vec<Vec<Vec<Option<u64>>>>;

#[derive(Debug, thiserror::Error)]
pub enum CountingError {
    #[error("event `{event}` cannot be counted here: {reason}")]
    Unsupported { event: String, reason: String },
    #[error("opening the {event} counter: {source}")]
    Open { event: String, source: io::Error },
    #[error("defining {event} in tracefs, to count it in whatever the targets start ({source}): count it system-wide with -a, or sample it with -e")]
    Define { event: String, source: io::Error },
    #[error("the kernel refused the filter `{filter}` of {event} ({source}): see its fields in /sys/kernel/tracing/events/.../format")]
    Filter {
        event: String,
        filter: String,
        source: io::Error,
    },
}

impl Counting {
    /// Open and start `events` on every thread or CPU of `scope`, as one group each when `group`.
    pub fn start(events: &[Event], group: bool, scope: &Scope) -> Result<Counting, CountingError> {
        let group = Group {
            events: events.to_vec(),
            together: group,
        };
        Counting::start_groups(std::slice::from_ref(&group), scope)
    }

    /// Open and start each group on every thread or CPU of `scope`. A thread that exits before
    /// its counters open is skipped; anything else the kernel refuses is an error that names the
    /// event.
    pub fn start_groups(groups: &[Group], scope: &Scope) -> Result<Counting, CountingError> {
        let targets: Vec<(i32, i32)> = match scope {
            Scope::Threads(tids) => tids.iter().map(|&t| (t as i32, -1)).collect(),
            Scope::Cpus(cpus) => cpus.iter().map(|&c| (-1, c as i32)).collect(),
        };
        let inherit = matches!(scope, Scope::Threads(_));
        let (defined, ids) = match inherit {
            true => define_probe_sites(groups)?,
            false => (Vec::new(), Vec::new()),
        };
        let mut instances = Vec::new();
        for (pid, cpu) in targets {
            let mut first = 0;
            let mut opened = Vec::new();
            for (n, group) in groups.iter().enumerate() {
                match open_group(group, ids.get(n), pid, cpu, inherit)? {
                    Some((fds, members)) => opened.push(Instance {
                        cpu,
                        fds,
                        members,
                        grouped: group.together,
                        first,
                    }),
                    // The thread exited before its counters opened.
                    None => {
                        opened.clear();
                        break;
                    }
                }
                first += group.events.len();
            }
            instances.extend(opened);
        }
        Ok(Counting {
            names: groups
                .iter()
                .flat_map(|g| g.events.iter().map(Event::spelled))
                .collect(),
            instances,
            _defined: defined,
        })
    }

    /// Per-CPU instances: each CPU with its counters, in event order (one fd per event: a
    /// counter read at samples is never a probe, whose sites each have one).
    pub fn per_cpu(&self) -> Vec<(u32, Vec<&OwnedFd>)> {
        let mut cpus: Vec<(u32, Vec<&OwnedFd>)> = Vec::new();
        for instance in self.instances.iter().filter(|i| i.cpu >= 0) {
            let cpu = instance.cpu as u32;
            match cpus.iter_mut().find(|(c, _)| *c == cpu) {
                Some((_, fds)) => fds.extend(&instance.fds),
                None => cpus.push((cpu, instance.fds.iter().collect())),
            }
        }
        cpus
    }

    /// Every event's total so far, scaled for multiplexing, with the share of time it ran.
    pub fn read(&self) -> io::Result<Counts> {
        let mut readings = vec![Reading::default(); self.names.len()];
        for instance in &self.instances {
            let events = instance.members.iter().map(|m| instance.first + m);
            if instance.grouped {
                // nr, time_enabled, time_running, then one value per member.
                let words = read_words(&instance.fds[0], 3 + instance.fds.len())?;
                for (member, event) in events.enumerate() {
                    readings[event].add(words[3 + member], words[1], words[2]);
                }
            } else {
                for (fd, event) in instance.fds.iter().zip(events) {
                    let words = read_words(fd, 3)?;
                    readings[event].add(words[0], words[1], words[2]);
                }
            }
        }
        let names: Vec<&str> = self.names.iter().map(String::as_str).collect();
        Ok(counts_of(&names, &readings))
    }
}

/// A group's counters opened: the fds, and each one's event in the group.
type Opened = (Vec<OwnedFd>, Vec<usize>);

/// Every site of the groups' user and kernel probes defined in tracefs, and each one's id.
fn define_probe_sites(groups: &[Group]) -> Result<(Vec<DefinedSite>, SiteIds), CountingError> {
    let probed = (groups.iter().flat_map(|g| g.events.iter())).any(|e| e.probe.is_some());
    if probed {
        crate::counters::defined::remove_the_dead_runs();
    }
    let mut defined = Vec::new();
    let mut ids = Vec::new();
    for (g, group) in groups.iter().enumerate() {
        let mut of_group = Vec::new();
        for (e, event) in group.events.iter().enumerate() {
            let mut of_event = Vec::new();
            let Some(probe) = &event.probe else {
                of_group.push(of_event);
                continue;
            };
            for (s, site) in probe.sites.iter().enumerate() {
                let site = DefinedSite::define(probe, site, &format!("g{g}e{e}s{s}")).map_err(|source| {
                    CountingError::Define {
                        event: event.spelled(),
                        source,
                    }
                })?;
                of_event.push(Some(site.id));
                defined.push(site);
            }
            of_group.push(of_event);
        }
        ids.push(of_group);
    }
    Ok((defined, ids))
}

/// One group's counters on one thread (`pid`) or CPU, each with its event's place in the
/// group; none when the thread has exited. A probe's site with an id in `ids` is counted as
/// that tracepoint.
fn open_group(
    group: &Group,
    ids: Option<&Vec<Vec<Option<u64>>>>,
    pid: i32,
    cpu: i32,
    inherit: bool,
) -> Result<Option<Opened>, CountingError> {
    let together = group.together;
    let mut fds: Vec<OwnedFd> = Vec::new();
    let mut members = Vec::new();
    let sites = (group.events.iter().enumerate()).flat_map(|(i, event)| {
        event
            .attrs()
            .into_iter()
            .map(move |(attr, site)| (i, event, attr, site))
    });
    for (i, event, attr, site) in sites {
        let defined = ids.and_then(|ids| *ids.get(i)?.get(usize::from(site))?);
        let attr = match defined {
            Some(id) => Attr {
                kind: crate::counters::tracepoint::PERF_TYPE_TRACEPOINT,
                config: id,
                ..Attr::default()
            },
            None => attr,
        };
        let attr = Attr {
            read_format: FORMAT_TOTAL_TIME_ENABLED
                | FORMAT_TOTAL_TIME_RUNNING
                | if together { FORMAT_GROUP } else { 0 },
            // A group starts disabled and is enabled whole once complete: members added to a
            // running leader would only join at its next context switch.
            flags: if inherit { FLAG_INHERIT } else { 0 }
                | if together && fds.is_empty() {
                    FLAG_DISABLED
                } else {
                    0
                }
                | event.exclude_flags(),
            ..attr
        };
        let leader = match (together, fds.first()) {
            (true, Some(leader)) => leader.as_raw_fd(),
            _ => -1,
        };
        match perf_event_open(&attr, pid, cpu, leader) {
            Ok(fd) => {
                if let Some(filter) = &event.filter {
                    set_filter(&fd, filter).map_err(|source| CountingError::Filter {
                        event: event.spelled(),
                        filter: filter.clone(),
                        source,
                    })?;
                }
                fds.push(fd);
                members.push(i);
            }
            Err(e) if pid > 0 && e.raw_os_error() == Some(libc::ESRCH) => return Ok(None),
            Err(e) => {
                let event = event.spelled();
                return Err(match e.raw_os_error() {
                    Some(libc::ENOENT | libc::EOPNOTSUPP | libc::ENODEV) => CountingError::Unsupported {
                        event,
                        reason: format!("the kernel does not support it on this CPU ({e})"),
                    },
                    _ => CountingError::Open { event, source: e },
                });
            }
        }
    }
    // SAFETY: an ioctl without arguments beyond the flag, on our own fd.
    if together && unsafe { libc::ioctl(fds[0].as_raw_fd(), IOC_ENABLE, IOC_FLAG_GROUP) } < 0 {
        return Err(CountingError::Open {
            event: group.events[0].spelled(),
            source: io::Error::last_os_error(),
        });
    }
    Ok(Some((fds, members)))
}

/// A tracepoint's filter, which the kernel applies before it counts a hit
/// (`PERF_EVENT_IOC_SET_FILTER`).
fn set_filter(fd: &OwnedFd, filter: &str) -> io::Result<()> {
    const PERF_EVENT_IOC_SET_FILTER: libc::c_ulong = 0x4008_2406;
    let filter = std::ffi::CString::new(filter).map_err(io::Error::other)?;
    // SAFETY: the kernel reads the NUL-terminated string, which lives through the call.
    match unsafe { libc::ioctl(fd.as_raw_fd(), PERF_EVENT_IOC_SET_FILTER, filter.as_ptr()) } {
        0 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

fn read_words(fd: &OwnedFd, n: usize) -> io::Result<Vec<u64>> {
    let mut words = vec![0u64; n];
    // SAFETY: reads at most n u64 words into a buffer of that size.
    let got = unsafe { libc::read(fd.as_raw_fd(), words.as_mut_ptr().cast(), n * 8) };
    if got < 0 {
        return Err(io::Error::last_os_error());
    }
    if (got as usize) < n * 8 {
        return Err(io::Error::other(format!(
            "short counter read: {got} of {} bytes",
            n * 8
        )));
    }
    Ok(words)
}

/// One event summed over threads or CPUs: the scaled estimate and the raw times.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Reading {
    scaled: f64,
    enabled: u64,
    running: u64,
}

impl Reading {
    pub fn add(&mut self, value: u64, enabled: u64, running: u64) {
        // Each instance is scaled by its own running share, as perf does: a counter that ran
        // half the time on one CPU counts double there, not elsewhere.
        if running > 0 {
            self.scaled += value as f64 * enabled as f64 / running as f64;
        }
        self.enabled += enabled;
        self.running += running;
    }
}

pub fn counts_of(names: &[&str], readings: &[Reading]) -> Counts {
    let mut counts = Counts::default();
    for (name, r) in names.iter().zip(readings) {
        if r.running == 0 {
            // Never scheduled onto the PMU (or the targets never ran): no number to give.
            counts.not_counted.push(name.to_string());
            continue;
        }
        counts.events.insert(
            name.to_string(),
            Count {
                value: r.scaled,
                running: r.running as f64 / r.enabled.max(1) as f64,
            },
        );
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multiplexed_instances_scale_each_by_its_own_share() {
        let mut cycles = Reading::default();
        // CPU 0 counted all the time, CPU 1 half of it.
        cycles.add(1000, 100, 100);
        cycles.add(400, 100, 50);
        let mut never = Reading::default();
        never.add(0, 100, 0);
        let counts = counts_of(&["cycles", "branches"], &[cycles, never]);
        let c = counts.events["cycles"];
        assert_eq!(c.value, 1800.0);
        assert_eq!(c.running, 0.75);
        assert_eq!(counts.not_counted, vec!["branches".to_string()]);
    }

    /// Software events through the same open/read path as hardware ones, in a group and not.
    #[test]
    fn software_counters_count_this_threads_work() {
        for group in [false, true] {
            let set =
                crate::counters::events::preset("software", crate::counters::cpu::Method::Unknown).unwrap();
            let events: Vec<Event> = set
                .events
                .iter()
                .map(|e| Event::from_spec(e, None).unwrap())
                .collect();
            let tid = unsafe { libc::gettid() } as u32;
            // As root (the test suite's requirement): perf_event_paranoid does not apply.
            let counting = Counting::start(&events, group, &Scope::Threads(vec![tid])).unwrap();
            let pages = 256;
            // Fresh pages from the kernel each time (a reused heap would not fault again).
            // SAFETY: a private anonymous mapping, written within its length, then unmapped.
            unsafe {
                let len = pages * 4096;
                let p = libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                ) as *mut u8;
                assert!(p as isize != -1);
                for page in 0..pages {
                    std::ptr::write_volatile(p.add(page * 4096), 1);
                }
                libc::munmap(p.cast(), len);
            }
            let counts = counting.read().unwrap();
            let faults = counts.events["page-faults"].value;
            assert!(
                faults >= pages as f64 * 0.9,
                "group={group}: {faults} faults for {pages} pages"
            );
            assert!(counts.events["task-clock"].value > 0.0);
            assert_eq!(
                counts.events["page-faults"].running, 1.0,
                "software counters never multiplex"
            );
        }
    }
}
