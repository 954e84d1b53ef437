//! perf's event language, as `-e`, `--counter` and `stat -e` take it: the generic hardware and
//! cache events, every software event, any PMU's events by name (bare, or qualified by the PMU:
//! `armv8_pmuv3_0/l1d_cache_refill/`), format terms (`cpu/event=0xc4,umask=0x00/`), raw codes
//! (`r01c4`), and the modifiers `:u`, `:k` and `:p`. Names come from the kernel's sysfs
//! (`/sys/bus/event_source/devices/*/events/`) and, on Arm, from the architected common events
//! whose numbers the architecture fixes (a PMU's sysfs may list only a few).
use std::path::{Path, PathBuf};

pub use crate::counters::names::{cache_names, ARM_COMMON, HARDWARE, SOFTWARE};
use crate::counters::{
    events::{self, EventSpec, Pmu, SYSFS_PMUS},
    names::cache_config,
    pmu::Attr,
    probe::{self, Probe, ProbeError},
    tracepoint,
};

const PERF_TYPE_HARDWARE: u32 = 0;
const PERF_TYPE_SOFTWARE: u32 = 1;
const PERF_TYPE_HW_CACHE: u32 = 3;
const PERF_TYPE_RAW: u32 = 4;

/// One event, resolved for `perf_event_open`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// How reports name it: as given, without its modifiers.
    pub name: String,
    /// `perf_event_attr.type` and `.config`.
    pub kind: u32,
    pub config: u64,
    /// `:u` (only user space) and `:k` (only the kernel).
    pub exclude_kernel: bool,
    pub exclude_user: bool,
    /// `:p`, `:pp`, `:ppp`: the precision asked of sampling.
    pub precise: u8,
    /// Counted by a hardware PMU (none in most VMs).
    pub hardware: bool,
    /// A user probe's file and offset (`config1`, `config2`).
    pub probe: Option<Probe>,
    /// A tracepoint's filter, in the kernel's filter language (`stat --filter`).
    pub filter: Option<String>,
}

impl Event {
    /// One of bpfprof's own tables' events (topdown's sets), resolved on the core PMU.
    pub fn from_spec(spec: &EventSpec, core: Option<&Pmu>) -> Result<Event, String> {
        let (kind, config) = events::resolve(spec, core)?;
        Ok(Event {
            name: spec.name.to_string(),
            kind,
            config,
            exclude_kernel: false,
            exclude_user: false,
            precise: 0,
            hardware: !matches!(spec.source, events::Source::Software(_)),
            probe: None,
            filter: None,
        })
    }

    /// Several events as the user wrote them, between `separator`s (`,` gives `-e`'s own
    /// spelling back).
    pub fn spelled_list(events: &[Event], separator: &str) -> String {
        events
            .iter()
            .map(Event::spelled)
            .collect::<Vec<_>>()
            .join(separator)
    }

    /// A tracepoint (`SUBSYSTEM:NAME`, see `tracepoint`).
    pub fn is_tracepoint(&self) -> bool {
        self.kind == tracepoint::PERF_TYPE_TRACEPOINT
    }

    /// A tracing event (a tracepoint or a probe): its program runs at every hit, so it is
    /// sampled every Nth hit (`-c N`, every hit by default), never at a frequency.
    pub fn is_traced(&self) -> bool {
        self.is_tracepoint() || self.probe.is_some()
    }

    /// Its `perf_event_attr`s' type and configuration (the caller sets the rest): one, or a
    /// probe's one per site, each with the site's index (its cookie says it: `with_site`).
    pub fn attrs(&self) -> Vec<(Attr, u8)> {
        let attr = Attr {
            kind: self.kind,
            config: self.config,
            ..Attr::default()
        };
        let Some(probe) = &self.probe else {
            return vec![(attr, 0)];
        };
        (probe.sites.iter().enumerate())
            .map(|(index, site)| {
                let at_site = Attr {
                    config: site.config,
                    config1: probe.target.as_ptr() as u64,
                    config2: site.offset,
                    ..attr
                };
                (at_site, index as u8)
            })
            .collect()
    }

    /// `perf_event_attr` flag bits for `:u` and `:k`: exclude_user (bit 4), exclude_kernel (5).
    pub fn exclude_flags(&self) -> u64 {
        u64::from(self.exclude_user) << 4 | u64::from(self.exclude_kernel) << 5
    }

    /// `perf_event_attr` flag bits for `:p` (precise_ip, bits 15-16): sampling only.
    pub fn precise_flags(&self) -> u64 {
        u64::from(self.precise.min(3)) << 15
    }

    /// The name with its modifiers, as given.
    pub fn spelled(&self) -> String {
        let mut modifiers = String::new();
        match (self.exclude_kernel, self.exclude_user) {
            (true, false) => modifiers.push('u'),
            (false, true) => modifiers.push('k'),
            _ => {}
        }
        modifiers.extend(std::iter::repeat_n('p', self.precise as usize));
        match modifiers.is_empty() {
            true => self.name.clone(),
            false => format!("{}:{modifiers}", self.name),
        }
    }

    /// The CPU's clock in nanoseconds: its samples are time.
    pub fn is_cpu_clock(&self) -> bool {
        (self.kind, self.config) == (PERF_TYPE_SOFTWARE, 0)
    }

    /// The CPU's or the task's clock: they count nanoseconds.
    pub fn is_clock(&self) -> bool {
        self.kind == PERF_TYPE_SOFTWARE && self.config <= 1
    }
}

/// Events counted together, as one perf group read at once (`{a,b}` in perf's language), or
/// each apart.
#[derive(Clone, Debug)]
pub struct Group {
    pub events: Vec<Event>,
    pub together: bool,
}

/// A tracepoint found by its id, or the nearest of its subsystem's names.
pub(crate) fn tracepoint_event(text: &str, found: Result<u64, Vec<String>>) -> Result<Event, EventError> {
    match found {
        Ok(id) => Ok(Event {
            name: text.to_string(),
            kind: tracepoint::PERF_TYPE_TRACEPOINT,
            config: id,
            exclude_kernel: false,
            exclude_user: false,
            precise: 0,
            hardware: false,
            probe: None,
            filter: None,
        }),
        Err(known) => Err(EventError::Unknown {
            given: text.to_string(),
            near: nearest(text, &known),
        }),
    }
}

/// Why an event cannot be had.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EventError {
    #[error("unknown event `{given}`{}", did_you_mean(.near))]
    Unknown { given: String, near: Vec<String> },
    #[error("event `{given}`: {reason}")]
    Invalid { given: String, reason: String },
}

fn did_you_mean(near: &[String]) -> String {
    match near {
        [] => ": `bpfprof list` shows what this machine has".to_string(),
        [one] => format!(": did you mean {one}?"),
        more => format!(": did you mean one of {}?", more.join(", ")),
    }
}

/// What this machine's kernel describes: its PMUs and their events.
pub struct Catalog {
    /// Every PMU in sysfs, the CPU's core PMU first.
    pmus: Vec<Pmu>,
    /// Where tracepoints are looked up (`SUBSYSTEM:NAME`), if anywhere.
    tracefs: Option<PathBuf>,
    /// The core PMU is Arm's PMUv3: the architected events are known by name.
    arm: bool,
    /// The processes a run targets (`-p`): a probe's library or program named without a path is
    /// the one they map (`probe::in_targets`).
    targets: Vec<u32>,
}

impl Catalog {
    /// This machine's.
    pub fn here() -> Catalog {
        Catalog::at(Path::new(SYSFS_PMUS)).with_tracefs(tracepoint::tracefs_root())
    }

    /// The same, with the tracepoints of this tracefs.
    pub fn with_tracefs(self, tracefs: &Path) -> Catalog {
        Catalog {
            tracefs: Some(tracefs.to_path_buf()),
            ..self
        }
    }

    /// The PMUs under `root` (a sysfs `event_source/devices`, or a test's copy of one).
    pub fn at(root: &Path) -> Catalog {
        let core = Pmu::core(root);
        let mut names: Vec<String> = std::fs::read_dir(root)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| core.as_ref().is_none_or(|c| &c.name != n))
            .collect();
        names.sort();
        let arm = core.as_ref().is_some_and(|c| c.name.starts_with("armv8_pmuv3"));
        let pmus = core
            .into_iter()
            .chain(names.iter().filter_map(|n| Pmu::open(root, n)))
            .collect();
        Catalog {
            pmus,
            arm,
            tracefs: None,
            targets: Vec::new(),
        }
    }

    /// The same, naming probes' files as these processes map them (`-p`).
    pub fn with_targets(self, pids: &[u32]) -> Catalog {
        Catalog {
            targets: pids.to_vec(),
            ..self
        }
    }

    /// The CPU's core PMU, if the kernel exposes one.
    pub fn core(&self) -> Option<&Pmu> {
        self.pmus
            .first()
            .filter(|p| p.name == "cpu" || p.name == "cpu_core" || p.name.starts_with("armv8_pmuv3"))
    }

    /// Why `event`'s `:p` cannot be honoured here, if it cannot: a software event is exact
    /// already, and a PMU samples precisely only to the level its `caps/max_precise` says.
    pub fn imprecise(&self, event: &Event) -> Option<String> {
        if event.precise == 0 {
            return None;
        }
        if !event.hardware {
            return Some("a software event is sampled exactly already: `:p` asks a hardware PMU for precise sampling; drop it".into());
        }
        // perf's generic hardware, cache and raw events are the core PMU's.
        let generic = [PERF_TYPE_HARDWARE, PERF_TYPE_HW_CACHE, PERF_TYPE_RAW].contains(&event.kind);
        let pmu = match generic {
            true => self.core(),
            false => self.pmus.iter().find(|p| p.kind == event.kind),
        };
        let max = pmu.map_or(0, Pmu::max_precise);
        let name = pmu.map_or("this", |p| p.name.as_str());
        (event.precise > max).then(|| match max {
            0 => format!("the {name} PMU cannot sample precisely (it has no caps/max_precise): drop the :p"),
            n => format!(
                "the {name} PMU samples precisely up to :{}",
                "p".repeat(n as usize)
            ),
        })
    }

    /// The tracepoints a glob names (`syscalls:sys_enter_*`), or the one event written; none for
    /// nothing written.
    fn parse_glob(&self, text: &str) -> Result<Vec<Event>, EventError> {
        if text.is_empty() {
            return Ok(Vec::new());
        }
        let expanded = (self.tracefs.as_deref()).and_then(|root| tracepoint::expand(root, text));
        match expanded {
            None => Ok(vec![self.parse(text)?]),
            Some(names) if names.is_empty() => Err(EventError::Invalid {
                given: text.to_string(),
                reason: "no tracepoint matches it (`bpfprof list SUBSYSTEM:` shows them)".into(),
            }),
            Some(names) => names.iter().map(|name| self.parse(name)).collect(),
        }
    }

    /// One event as written: `name[:modifiers]`, `pmu/name/`, `pmu/term=value,.../` or `rHEX`.
    pub fn parse(&self, text: &str) -> Result<Event, EventError> {
        let text = text.trim();
        if let Some(spelled) = probe::spelling(text) {
            return self.probe_event(text, probe::resolve(spelled, &self.targets));
        }
        if let Some(found) = (self.tracefs.as_deref()).and_then(|root| tracepoint::id(root, text)) {
            return tracepoint_event(text, found);
        }
        let (body, modifiers) = split_modifiers(text);
        let invalid = |reason: String| EventError::Invalid {
            given: text.to_string(),
            reason,
        };
        let mut event = match body.split_once('/') {
            Some((pmu, rest)) => self.qualified(pmu, rest.strip_suffix('/').unwrap_or(rest), body)?,
            None => self.bare(body)?,
        };
        for m in modifiers.chars() {
            match m {
                'u' => event.exclude_kernel = true,
                'k' => event.exclude_user = true,
                'p' if event.precise < 3 => event.precise += 1,
                'p' => return Err(invalid("at most :ppp".into())),
                other => {
                    return Err(invalid(format!(
                        "no modifier `{other}` here: `u` (user space only), `k` (kernel only), `p` (precise, repeated up to 3 times)"
                    )))
                }
            }
        }
        if event.exclude_kernel && event.exclude_user {
            return Err(invalid(":u and :k together count nothing".into()));
        }
        Ok(event)
    }

    /// A probe, on the kernel's `uprobe` or `kprobe` PMU.
    fn probe_event(&self, text: &str, found: Result<Probe, ProbeError>) -> Result<Event, EventError> {
        let invalid = |reason: String| EventError::Invalid {
            given: text.to_string(),
            reason,
        };
        let mut probe = found.map_err(|e| invalid(e.to_string()))?;
        let name = if probe.kernel { "kprobe" } else { "uprobe" };
        let pmu = (self.pmus.iter().find(|p| p.name == name)).ok_or_else(|| {
            invalid(format!(
                "this kernel has no {name}s (no {name} PMU in /sys/bus/event_source/devices)"
            ))
        })?;
        for site in &mut probe.sites {
            let mut terms = vec![("retprobe", u64::from(probe.ret))];
            terms.extend(site.semaphore.map(|offset| ("ref_ctr_offset", offset)));
            site.config = pmu.encode(&terms).map_err(invalid)?;
        }
        Ok(Event {
            name: text.to_string(),
            kind: pmu.kind,
            config: probe.sites.first().map_or(0, |site| site.config),
            exclude_kernel: false,
            exclude_user: false,
            precise: 0,
            hardware: false,
            probe: Some(probe),
            filter: None,
        })
    }

    /// A name without a PMU: the generic and software events, then the PMUs' own names (the core
    /// PMU's first), then Arm's architected events, then a raw code.
    fn bare(&self, name: &str) -> Result<Event, EventError> {
        let event = |kind, config, hardware| Event {
            name: name.to_string(),
            kind,
            config,
            exclude_kernel: false,
            exclude_user: false,
            precise: 0,
            hardware,
            probe: None,
            filter: None,
        };
        if let Some((_, config, _)) = SOFTWARE.iter().find(|(n, _, _)| *n == name) {
            return Ok(event(PERF_TYPE_SOFTWARE, *config, false));
        }
        if let Some((_, config, _)) = HARDWARE.iter().find(|(n, _, _)| *n == name) {
            return Ok(event(PERF_TYPE_HARDWARE, *config, true));
        }
        if let Some(config) = cache_config(name) {
            return Ok(event(PERF_TYPE_HW_CACHE, config, true));
        }
        let lower = name.to_ascii_lowercase();
        for pmu in &self.pmus {
            if let Some(config) = pmu.alias(&lower) {
                let config = config.map_err(|reason| EventError::Invalid {
                    given: name.to_string(),
                    reason,
                })?;
                return Ok(event(pmu.kind, config, true));
            }
        }
        if let (true, Some(core)) = (self.arm, self.core()) {
            if let Some((_, number)) = ARM_COMMON.iter().find(|(n, _)| *n == lower) {
                let config = core
                    .encode(&[("event", *number)])
                    .map_err(|reason| EventError::Invalid {
                        given: name.to_string(),
                        reason,
                    })?;
                return Ok(event(core.kind, config, true));
            }
        }
        if let Some(code) = raw_code(name) {
            return Ok(event(PERF_TYPE_RAW, code, true));
        }
        Err(EventError::Unknown {
            given: name.to_string(),
            near: nearest(name, &self.known_names()),
        })
    }

    /// `pmu/name/` or `pmu/term=value,.../`.
    fn qualified(&self, pmu_name: &str, inside: &str, given: &str) -> Result<Event, EventError> {
        let invalid = |reason: String| EventError::Invalid {
            given: given.to_string(),
            reason,
        };
        let pmu = self.pmus.iter().find(|p| p.name == pmu_name).ok_or_else(|| {
            let names: Vec<String> = self.pmus.iter().map(|p| p.name.clone()).collect();
            EventError::Unknown {
                given: format!("{pmu_name}/"),
                near: nearest(pmu_name, &names),
            }
        })?;
        let config = match inside.contains('=') {
            true => {
                let mut terms = Vec::new();
                for term in inside.split(',').map(str::trim) {
                    let (key, value) = term.split_once('=').unwrap_or((term, "1"));
                    let value = parse_value(value)
                        .ok_or_else(|| invalid(format!("`{value}` is not a number (give 0x… or decimal)")))?;
                    terms.push((key.to_string(), value));
                }
                let terms: Vec<(&str, u64)> = terms.iter().map(|(k, v)| (k.as_str(), *v)).collect();
                match terms.as_slice() {
                    [("config", value)] => *value,
                    _ => pmu.encode(&terms).map_err(invalid)?,
                }
            }
            false => {
                let lower = inside.to_ascii_lowercase();
                match pmu.alias(&lower) {
                    Some(config) => config.map_err(invalid)?,
                    None => match ARM_COMMON.iter().find(|(n, _)| *n == lower) {
                        Some((_, number)) if pmu.name.starts_with("armv8_pmuv3") => {
                            pmu.encode(&[("event", *number)]).map_err(invalid)?
                        }
                        _ => {
                            return Err(EventError::Unknown {
                                given: given.to_string(),
                                near: nearest(inside, &pmu.event_names()),
                            })
                        }
                    },
                }
            }
        };
        Ok(Event {
            name: given.to_string(),
            kind: pmu.kind,
            config,
            exclude_kernel: false,
            exclude_user: false,
            precise: 0,
            hardware: true,
            probe: None,
            filter: None,
        })
    }

    /// Every name `parse` knows without a PMU prefix.
    pub fn known_names(&self) -> Vec<String> {
        let mut names: Vec<String> = SOFTWARE
            .iter()
            .map(|e| e.0)
            .chain(HARDWARE.iter().map(|e| e.0))
            .map(String::from)
            .chain(cache_names())
            .collect();
        for pmu in &self.pmus {
            names.extend(pmu.event_names());
        }
        if self.arm {
            names.extend(ARM_COMMON.iter().map(|(n, _)| n.to_string()));
        }
        names.sort();
        names.dedup();
        names
    }

    /// The PMUs, the core first.
    pub fn pmus(&self) -> &[Pmu] {
        &self.pmus
    }

    /// Arm's architected events are known here.
    pub fn arm(&self) -> bool {
        self.arm
    }
}

impl Catalog {
    /// A list as `stat -e` takes it: `a,b,{c,d},pmu/event=1,umask=2/`. Loose events are counted
    /// apart; each `{...}` is one group, on the PMU together.
    pub fn parse_list(&self, text: &str) -> Result<Vec<Group>, EventError> {
        let invalid = |reason: &str| EventError::Invalid {
            given: text.to_string(),
            reason: reason.to_string(),
        };
        let mut groups: Vec<Group> = Vec::new();
        let (mut name, mut in_pmu, mut in_group, mut members) = (String::new(), false, false, Vec::new());
        for c in text.chars().chain([',']) {
            match c {
                // A PMU's `pmu/terms/`; a probe's file path is not one.
                '/' if probe::spelling(&name).is_none() => {
                    in_pmu = !in_pmu;
                    name.push(c);
                }
                ',' if in_pmu => name.push(c),
                '{' if !in_group && name.trim().is_empty() => in_group = true,
                '{' => return Err(invalid("a group inside a group")),
                '}' if in_group => {
                    members.push(std::mem::take(&mut name));
                    in_group = false;
                    let events = members
                        .drain(..)
                        .filter(|m| !m.trim().is_empty())
                        .map(|m| self.parse(&m));
                    let events = events.collect::<Result<Vec<_>, _>>()?;
                    if events.is_empty() {
                        return Err(invalid("an empty group"));
                    }
                    groups.push(Group {
                        events,
                        together: true,
                    });
                }
                '}' => return Err(invalid("a `}` without its `{`")),
                ',' if in_group => members.push(std::mem::take(&mut name)),
                ',' => {
                    let loose = std::mem::take(&mut name);
                    for event in self.parse_glob(loose.trim())? {
                        match groups.last_mut() {
                            Some(group) if !group.together => group.events.push(event),
                            _ => groups.push(Group {
                                events: vec![event],
                                together: false,
                            }),
                        }
                    }
                }
                c => name.push(c),
            }
        }
        if in_group {
            return Err(invalid("a `{` without its `}`"));
        }
        Ok(groups)
    }
}

/// `name:mods` → (name, mods); a `:` inside `pmu/.../` is the PMU's.
fn split_modifiers(text: &str) -> (&str, &str) {
    let after_pmu = text.rfind('/').map_or(0, |i| i + 1);
    match text[after_pmu..].rfind(':') {
        Some(i) => (&text[..after_pmu + i], &text[after_pmu + i + 1..]),
        None => (text, ""),
    }
}

/// `r1a8` → 0x1a8: perf's raw code (hexadecimal, no `0x`).
fn raw_code(name: &str) -> Option<u64> {
    let hex = name.strip_prefix('r')?;
    (!hex.is_empty() && hex.len() <= 16 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| u64::from_str_radix(hex, 16).ok())
        .flatten()
}

/// `0x1f`, `31`.
fn parse_value(text: &str) -> Option<u64> {
    let text = text.trim();
    match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => text.parse().ok(),
    }
}

/// The known names closest to `given` (at most three, within a few edits or sharing its start).
pub(crate) fn nearest(given: &str, known: &[String]) -> Vec<String> {
    let given = given.to_ascii_lowercase();
    let limit = (given.len() / 3).max(2);
    let mut scored: Vec<(usize, &String)> = known
        .iter()
        .map(|k| (distance(&given, &k.to_ascii_lowercase()), k))
        .filter(|(d, _)| *d <= limit)
        .collect();
    scored.sort();
    scored.into_iter().take(3).map(|(_, k)| k.clone()).collect()
}

/// Levenshtein distance.
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut previous = row[0];
        row[0] = i + 1;
        for j in 0..b.len() {
            let substitution = previous + usize::from(ca != b[j]);
            previous = row[j + 1];
            row[j + 1] = substitution.min(row[j] + 1).min(row[j + 1] + 1);
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests;
