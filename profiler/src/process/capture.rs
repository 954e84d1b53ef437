//! Reading a process from `/proc` while it lives: its map and label when the kernel announces it
//! (whole, or its label alone), again when its map changed, and what is not asked again.
use std::{
    collections::{HashMap, HashSet},
    io,
};

use super::{
    find,
    info::Announced,
    maps::{exec_mappings, MapsLine},
    proc_dir::LazyDir,
    ProcDir, ProcessInfo, Processes, Region,
};

/// When a capture reads a process's label again.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Relabel {
    /// A first capture, or one after samples fell outside the map: the pid may be another
    /// process's by now (announced anew after the old one exited).
    Always,
    /// A map the process changed (a loader mapping libraries, a dlopen): the same process,
    /// labelled again only if it exec'd since.
    NewImage,
}

/// `refresh` reads a process's map at most this often: a pc that stays outside every mapping
/// (code bpfprof cannot see the mapping of) must not turn into a `/proc` read per sample.
const REFRESH_INTERVAL: std::time::Duration = std::time::Duration::from_millis(250);

/// Processes something was found of within `REFRESH_INTERVAL`, so that it is not asked again.
#[derive(Debug, Default)]
pub(super) struct Lately(HashMap<u32, std::time::Instant>, Option<std::time::Instant>);

/// Processes a `Lately` keeps before the old ones are swept.
const LATELY_KEPT: usize = 1024;

impl Lately {
    fn note(&mut self, pid: u32) {
        let now = std::time::Instant::now();
        // Swept of what aged out once it holds `LATELY_KEPT`, at most once per interval: at most
        // `LATELY_KEPT` and an interval's new processes are kept.
        if self.0.len() >= LATELY_KEPT && self.1.is_none_or(|at| now.duration_since(at) >= REFRESH_INTERVAL) {
            self.0.retain(|_, at| now.duration_since(*at) < REFRESH_INTERVAL);
            self.1 = Some(now);
        }
        self.0.insert(pid, now);
    }

    fn remove(&mut self, pid: u32) {
        self.0.remove(&pid);
    }

    pub(super) fn forget(&mut self, pids: &HashSet<u32>) {
        self.0.retain(|pid, _| !pids.contains(pid));
    }

    fn holds(&self, pid: u32) -> bool {
        self.0.get(&pid).is_some_and(|at| at.elapsed() < REFRESH_INTERVAL)
    }
}

impl Processes {
    /// Read the process's executable mappings and open its files. Fails if it is gone.
    pub fn capture(&mut self, pid: u32) -> io::Result<()> {
        let (generation, lines) = match self.read_maps(pid, Relabel::Always) {
            Ok(read) => read,
            Err(e) => {
                self.gone.note(pid);
                return Err(e);
            }
        };
        self.gone.remove(pid);
        self.install_captured(pid, generation, lines);
        Ok(())
    }

    /// Capture the process again now if its map is not the one installed for its image. The
    /// kernel's walker announces a pc outside every mapping it was given once per table load,
    /// so that announcement must never be dropped (a library loaded moments after another
    /// capture would be walked without its tables until the next drain noticed); and a map
    /// that has not changed is not installed again, because the tables it would load could
    /// not place that pc either.
    pub fn refresh_changed(&mut self, pid: u32) -> io::Result<()> {
        let (generation, lines) = self.read_maps(pid, Relabel::NewImage)?;
        let installed = self.maps.get(&(pid, generation));
        if installed.is_some_and(|maps| self.same_map(maps, &lines)) {
            return Ok(());
        }
        self.install_captured(pid, generation, lines);
        Ok(())
    }

    /// The executable mappings of `pid` and the exec generation they belong to; with its
    /// label (name, executable, cgroup) read again as `relabel` says.
    fn read_maps(&mut self, pid: u32, relabel: Relabel) -> io::Result<(u32, Vec<MapsLine>)> {
        // The generation read on both sides of the map: equal, the map belongs to it (an exec
        // in between would have changed it).
        let dir = ProcDir::open(pid)?;
        let (mut lines, mut generation) = (Vec::new(), 0);
        for _ in 0..3 {
            let before = self.current_generation(pid);
            lines = exec_mappings(dir.open_file("maps")?)?;
            generation = self.current_generation(pid);
            if before == generation {
                break;
            }
        }
        // A process that has exited (a zombie) has no map and no executable left: what was
        // captured while it lived stays.
        if lines.is_empty() && self.is_known(pid) {
            return Err(io::Error::new(io::ErrorKind::NotFound, "exited"));
        }
        // (Labelled moments ago, the same image: what the kernel said as it announced it.)
        let relabel = match relabel {
            Relabel::Always => !(self.labelled.holds(pid) && self.knows_who(pid, generation)),
            Relabel::NewImage => !self.knows_who(pid, generation),
        };
        if relabel {
            if let Some(info) = ProcessInfo::read_in(&LazyDir::from(dir))
                .filter(|i| i.executable.is_some() || !self.is_known(pid))
            {
                self.info.insert(pid, (generation, info));
            }
        }
        Ok((generation, lines))
    }

    /// Whether this image of `pid` was labelled already (with its executable: a zombie's
    /// label has none). Without exec generations (every image is 0), never.
    fn knows_who(&self, pid: u32, generation: u32) -> bool {
        self.generations.is_some()
            && self
                .info
                .get(&pid)
                .is_some_and(|(known, info)| *known == generation && info.executable.is_some())
    }

    /// Capture again because its map seems to have changed (an address outside it), unless it
    /// was captured moments ago.
    pub fn refresh(&mut self, pid: u32) -> io::Result<()> {
        match self.captured_at.get(&pid) {
            Some(at) if at.elapsed() < REFRESH_INTERVAL => Ok(()),
            _ => self.capture(pid),
        }
    }

    /// Whether the memory map of this image of `pid` was read.
    pub fn knows(&self, pid: u32, generation: u32) -> bool {
        self.maps.contains_key(&(pid, generation))
    }

    /// Capture the process again (see `refresh`) when a stack of one of its images falls
    /// outside that image's known map: it may have loaded a library since. Where it falls in
    /// JIT code its perf map does not name (yet), that map is read again.
    pub fn refresh_unless_covered(&mut self, pid: u32, generation: u32, addrs: &[u64]) -> io::Result<()> {
        let refreshed = match self.covers(pid, generation, addrs) {
            true => Ok(()),
            false => self.refresh(pid),
        };
        // JIT code: its map read for what was appended, or rewritten (a reused range renamed).
        let maps = self.maps.get(&(pid, generation));
        let in_jit = |a: u64| {
            maps.and_then(|m| find(m, a))
                .is_some_and(|m| m.region == Region::Anon)
        };
        if addrs.iter().any(|&a| in_jit(a)) {
            self.jit.refresh(pid);
        }
        self.python.read(pid, addrs);
        refreshed
    }

    /// Make sure a stack of `pid`'s image `generation`, taken moments ago, can be placed later,
    /// even after the process is gone: read an image not read yet while it is still the
    /// process's current one, or read it again where the stack falls outside it (a library
    /// loaded since). A process gone keeps what was read.
    pub fn cover_stack(&mut self, pid: u32, generation: u32, user: Option<&[u64]>) {
        let _ = match (self.knows(pid, generation), user) {
            (false, _) if !self.gone.holds(pid) && self.current_generation(pid) == generation => {
                self.capture(pid)
            }
            (true, Some(ips)) => self.refresh_unless_covered(pid, generation, ips),
            _ => Ok(()),
        };
    }

    /// Label now (executable, cgroup: `/proc`) each of `pids` that has no label yet: a process
    /// the kernel never announced, whose threads only ran and waited for a CPU and never slept,
    /// has its label for the run-queue profile. (Forgotten as any process once it has exited.)
    pub fn label_unknown(&mut self, pids: impl IntoIterator<Item = u32>) {
        for pid in pids {
            if !self.info.contains_key(&pid) {
                self.label(pid, &Announced::default());
            }
        }
    }

    /// Read who `pid` is now (name, executable, cgroup), without its map, taking what the kernel
    /// said as it announced it for its labels alone (`ProcessEventKind::Labelled`). A zombie's
    /// label (no executable left) does not replace the one read while it lived.
    pub fn label(&mut self, pid: u32, said: &Announced) {
        let dir = LazyDir::new(pid);
        // What the kernel said in full is of the image it said it in; what is read from `/proc`,
        // of the image the process runs now: an executable not known yet is read only while the
        // process still runs the image announced, else all of its label is read.
        let current = self.current_generation(pid);
        let complete = said.complete() && (self.kept.knows_executable(said) || current == said.generation);
        let generation = match complete {
            true => said.generation,
            // Gone already (a process that lived a millisecond, its generation forgotten with
            // it; a zombie's too, announced in a later image than its forgotten 0): what the
            // kernel said of it, in the image it said it for.
            false if dir.get().is_none() || said.generation > current => said.generation,
            false => current,
        };
        if self.labelled.holds(pid) && self.knows_who(pid, generation) {
            return;
        }
        // What of the announcement is this image's: all of it where complete; else its cgroup,
        // and its name unless it exec'd since (a fork announced before its exec).
        let this_image = Announced {
            comm: said.comm.clone().filter(|_| said.generation == generation),
            executable: said.executable.filter(|_| complete),
            cgroup_id: said.cgroup_id,
            generation: said.generation,
        };
        let Some(info) = ProcessInfo::read_announced(&dir, &this_image, &mut self.kept) else {
            return;
        };
        // Never over a later image's label (an announcement read after a capture of the image
        // the process exec'd into); over an earlier one's always, even without its executable
        // (its process gone before the path was read: its name is this image's); a zombie's
        // label (no executable left) does not replace one read while the image lived.
        let replaces = match self.info.get(&pid) {
            None => true,
            Some((known, _)) if generation < *known => false,
            Some((known, _)) if generation > *known => true,
            Some((_, label)) => info.executable.is_some() || label.executable.is_none(),
        };
        if replaces {
            self.info.insert(pid, (generation, info));
            // (Read across an exec: its image may be either; read again when announced again.)
            if complete || self.current_generation(pid) == generation {
                self.labelled.note(pid);
            }
        }
    }
}
