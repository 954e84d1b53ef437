//! The one start path, for a run, `top` and the agent alike: what needs the system is resolved
//! (lock libraries, the kernel's offsets), the object is loaded with every source's globals and
//! maps, the targets are added, processes are followed, then each source attaches in the order
//! of `sources::Kind`. The only place that knows that order.
use std::path::Path;

use crate::{
    bpf::LoadOptions,
    driver::Driver,
    sources::{AttachContext, Kind, Spec},
};

/// What a run collects, decided before anything is loaded: a value a unit test can inspect.
pub struct Recipe {
    /// Each source's settings (attached in the order of their kinds).
    pub specs: Vec<Spec>,
    /// User stacks are walked through unwind tables where a process has them.
    pub unwind_tables: bool,
    /// Entries of each sample map, where not the default (a test of a full map).
    pub sample_map_entries: Option<u32>,
}

impl Recipe {
    /// The sampling source's settings, if it samples.
    pub fn samples(&self) -> Option<&crate::sources::samples::Spec> {
        self.specs.iter().find_map(|spec| match spec {
            Spec::CpuSamples(samples) => Some(samples),
            _ => None,
        })
    }

    /// What the loader is to set for these sources, with `targets` (no privileges needed: the
    /// specs must be prepared first, where they need the system).
    pub fn load_options<'a>(&self, tracefs: &'a Path, targets: &Targets<'_>) -> LoadOptions<'a> {
        let mut options = LoadOptions::new(tracefs, !targets.system_wide, self.unwind_tables);
        options.sample_map_entries = self.sample_map_entries;
        for spec in &self.specs {
            spec.needs(&mut options);
        }
        options
    }
}

/// Whom a run profiles.
pub struct Targets<'a> {
    pub system_wide: bool,
    /// `-p` processes (with all their threads).
    pub pids: &'a [u32],
    /// A command started paused, and the program it runs.
    pub command: Option<(u32, &'a Path)>,
}

/// A driver with every source attached.
pub(crate) struct Started {
    pub driver: Driver,
    /// What the run does, one phrase per source that says one ("sampling at 99 Hz (cpu-clock)").
    pub doing: Vec<String>,
    /// What a report must say of how its figures were taken.
    pub notes: Vec<String>,
}

/// Load, add the targets, follow processes, attach every source.
pub(crate) fn start(recipe: Recipe, targets: &Targets<'_>, tracefs: &Path) -> anyhow::Result<Started> {
    let Recipe {
        mut specs,
        unwind_tables,
        sample_map_entries,
    } = recipe;
    specs.sort_by_key(Spec::kind);
    let unwind_tables = unwind_tables && specs.iter().any(Spec::walks_user_stacks);
    // What needs the system, before anything is loaded: which file of each target has its lock
    // functions; the kernel's offsets (missing BTF is the first thing said).
    for spec in &mut specs {
        spec.prepare(targets.pids, targets.command)?;
    }
    let recipe = Recipe {
        specs,
        unwind_tables,
        sample_map_entries,
    };
    let mut driver = Driver::load(&recipe.load_options(tracefs, targets))?;
    for &pid in targets.pids {
        driver.kernel.add_target(pid)?;
        for tid in crate::process::threads_of(pid) {
            driver.kernel.add_target(tid)?;
        }
        let _ = driver.sources.procs.capture(pid);
    }
    driver.sources.give_tables();
    if let Some((pid, _)) = targets.command {
        driver.kernel.add_target(pid)?;
    }
    driver.kernel.attach_process_tracking(unwind_tables)?;
    let context = AttachContext {
        system_wide: targets.system_wide,
        pids: targets.pids,
        command: targets.command.map(|(pid, _)| pid),
        unwind_tables,
    };
    let (mut doing, mut notes) = (Vec::new(), Vec::new());
    for spec in recipe.specs {
        let kind = spec.kind();
        let attached = spec.attach(&mut driver.kernel, &context)?;
        driver.sources.add(attached.source);
        match (attached.doing, kind) {
            // The scheduler's phrase first: its records cover all else the run does.
            (Some(phrase), Kind::Sched) => doing.insert(0, phrase),
            (Some(phrase), _) => doing.push(phrase),
            (None, _) => {}
        }
        notes.extend(attached.note);
    }
    Ok(Started { driver, doing, notes })
}
