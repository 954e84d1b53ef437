//! Where a file's names are when the file itself lacks them: a separate debug file found by
//! build id (`--debug-dir` dirs, then /usr/lib/debug: `.build-id/xx/rest.debug`, then any ELF
//! file under a `--debug-dir` with that build id), by `.gnu_debuglink` (its CRC checked here,
//! before blazesym sees the file: blazesym fails a whole file on a mismatch), or by a debuginfod
//! fetcher; else what the file carries (`.gnu_debugdata` MiniDebugInfo, `.symtab`, `.dynsym`).
//! A debug file is used only if its build id is the binary's. Results are kept per build id.
use std::{
    cell::{OnceCell, RefCell},
    collections::HashMap,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use serde::{Deserialize, Serialize};

use blazesym::symbolize::{
    source::{Elf, Source},
    Input, Reason, Symbolized, Symbolizer as Blazesym,
};

use super::debuginfod::{hex, Debuginfod, Lookup};
use crate::unwind::Segment;
use candidate::{accept, open_regular, Crcs, Links};
use facts::Facts;

mod candidate;
mod facts;
mod later;
pub use later::name_later;

/// Where distributions install debug files (Debian's -dbgsym, Fedora's -debuginfo packages).
pub const SYSTEM_DEBUG_DIR: &str = "/usr/lib/debug";

/// Bounds of the build-id index of a `--debug-dir`: files looked at, and directory depth.
const INDEX_FILES: usize = 20_000;
const INDEX_DEPTH: usize = 6;
/// Build ids whose answer is kept; beyond, the answers are forgotten and found again.
const CACHED_BUILD_IDS: usize = 4096;

/// A source of debug files by build id that may fetch them in the background: debuginfod.
pub trait Fetcher: Send + Sync {
    /// Where the file stands, at once (never waiting on the network); a lookup of a file it
    /// has marks it used.
    fn lookup(&self, build_id: &[u8]) -> Lookup;
    /// Wait until nothing is being fetched, or `budget` has passed; true if nothing is left.
    fn wait(&self, _budget: Duration) -> bool {
        true
    }
}

impl Fetcher for Debuginfod {
    fn lookup(&self, build_id: &[u8]) -> Lookup {
        Debuginfod::lookup(self, build_id)
    }

    fn wait(&self, budget: Duration) -> bool {
        Debuginfod::wait(self, budget)
    }
}

/// Where a file's names came from, for the report.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Origin {
    /// The file's own `.symtab` or DWARF.
    OwnSymbols,
    /// `DIR/.build-id/xx/rest.debug` under a debug dir.
    BuildIdDir,
    /// An ELF file with the same build id somewhere under a `--debug-dir`.
    DebugDir,
    /// The file its `.gnu_debuglink` names, with the CRC it records.
    Debuglink,
    Debuginfod,
    /// The xz-compressed `.symtab` in `.gnu_debugdata` (Fedora's MiniDebugInfo).
    Minidebuginfo,
    /// Only the dynamic symbols (exported functions).
    Dynsym,
    /// Go's own table, `.gopclntab` (a Go binary without `.symtab`, or with names blazesym
    /// did not give).
    GoTable,
    /// No symbols at all.
    None,
}

impl Origin {
    /// What names a file whose frames Go's table named (`go`): that table, unless the file's
    /// symbols or a debug file did.
    pub fn or_go_table(self, go: bool) -> Origin {
        match self {
            Origin::Dynsym | Origin::None if go => Origin::GoTable,
            other => other,
        }
    }

    fn words(self) -> &'static str {
        match self {
            Origin::OwnSymbols => "own symbols",
            Origin::BuildIdDir => "build-id debug file",
            Origin::DebugDir => "debug dir",
            Origin::Debuglink => "debug link",
            Origin::Debuginfod => "debuginfod",
            Origin::Minidebuginfo => "MiniDebugInfo",
            Origin::Dynsym => ".dynsym only",
            Origin::GoTable => "Go's .gopclntab",
            Origin::None => "no symbols",
        }
    }
}

/// A file's debug file, if one was found, and where its names come from.
#[derive(Clone, Debug)]
pub struct Located {
    pub origin: Origin,
    /// The file blazesym reads instead of the binary, with virtual addresses.
    pub debug_file: Option<PathBuf>,
    /// What the binary itself offers: the names if the debug file fails.
    pub fallback: Origin,
    pub build_id: Option<Vec<u8>>,
    /// The binary's loadable segments.
    segments: Vec<Segment>,
    /// Candidates refused and why ("…/x.debug: CRC 0x… where the link says 0x…").
    pub problems: Vec<String>,
    /// A fetcher is still fetching: names may come later, so frames are not kept.
    pub pending: bool,
    /// When the fetcher may answer otherwise (a miss asked again): until then, this answer.
    pub retry_at: Option<Instant>,
    /// Whether blazesym may read the binary's own debug information: not when the binary has
    /// none but a debug link no candidate passed (blazesym would follow the link itself).
    debug_syms: bool,
    /// The binary could not be parsed, or its program headers overflow
    /// (`Facts::headers_overflow`): not read by blazesym, which checks less.
    headers_overflow: bool,
}

impl Located {
    fn unreadable() -> Located {
        Located {
            origin: Origin::None,
            debug_file: None,
            fallback: Origin::None,
            build_id: None,
            segments: Vec::new(),
            problems: Vec::new(),
            pending: false,
            retry_at: None,
            debug_syms: true,
            headers_overflow: true,
        }
    }

    /// Whether this answer stands for good: nothing being fetched, no miss to ask again. Frames
    /// named from an answer that is not final are not to be cached.
    pub fn is_final(&self) -> bool {
        !self.pending && self.retry_at.is_none()
    }

    /// The virtual address of a file offset, from the binary's own segments (a debug file's
    /// text segment has no bytes in the file, so offsets cannot be translated in it).
    pub fn vaddr_of(&self, offset: u64) -> Option<u64> {
        self.segments.iter().find_map(|s| s.vaddr(offset))
    }

    /// The file's line for the report.
    pub fn source(self, module: &str, origin: Origin, addresses: usize, named: usize) -> NameSource {
        let from_debug_file = !matches!(
            origin,
            Origin::OwnSymbols | Origin::Minidebuginfo | Origin::Dynsym | Origin::None
        );
        NameSource {
            module: module.to_string(),
            build_id: self.build_id_hex(),
            source: origin,
            path: self
                .debug_file
                .filter(|_| from_debug_file)
                .map(|p| p.display().to_string()),
            addresses: addresses as u64,
            named: named as u64,
            problems: self.problems,
        }
    }

    /// Lowercase hex, as `.build-id` paths and debuginfod spell it.
    pub fn build_id_hex(&self) -> Option<String> {
        self.build_id.as_deref().map(hex)
    }
}

/// Finds debug files. One per symbolizer: it keeps what it found per build id.
pub struct DebugLocator {
    /// `--debug-dir` dirs, in order.
    user: Vec<PathBuf>,
    /// The user's then the system's: where `.build-id/` trees are looked for.
    dirs: Vec<PathBuf>,
    fetcher: Option<Arc<dyn Fetcher>>,
    index: OnceCell<HashMap<Vec<u8>, Vec<PathBuf>>>,
    found: RefCell<HashMap<Claim, Located>>,
    crcs: Crcs,
}

/// What an answer is kept under: the build id with what the binary says of itself. A binary
/// whose note claims another's build id (crafted, or a collision) is not given that one's
/// answer: its own segments, symbols and link are its own.
#[derive(PartialEq, Eq, Hash)]
struct Claim {
    build_id: Vec<u8>,
    text: Option<(u64, u64)>,
    segments: Vec<Segment>,
    /// DWARF, `.symtab`, `.gnu_debugdata`, `.dynsym`.
    sections: [bool; 4],
    debuglink: Option<(String, u32)>,
}

impl Claim {
    fn of(facts: &Facts) -> Option<Claim> {
        Some(Claim {
            build_id: facts.build_id.clone()?,
            text: facts.text,
            segments: facts.segments.clone(),
            sections: [facts.dwarf, facts.symtab, facts.debugdata, facts.dynsym],
            debuglink: facts.debuglink.clone(),
        })
    }
}

impl Default for DebugLocator {
    fn default() -> Self {
        Self::new(Vec::new(), None)
    }
}

impl DebugLocator {
    /// `dirs` (`--debug-dir`) are searched before /usr/lib/debug.
    pub fn new(dirs: Vec<PathBuf>, fetcher: Option<Arc<dyn Fetcher>>) -> Self {
        Self::with_system(dirs, fetcher, Path::new(SYSTEM_DEBUG_DIR))
    }

    fn with_system(user: Vec<PathBuf>, fetcher: Option<Arc<dyn Fetcher>>, system: &Path) -> Self {
        let mut dirs = user.clone();
        dirs.push(system.to_path_buf());
        Self {
            user,
            dirs,
            fetcher,
            index: OnceCell::new(),
            found: RefCell::new(HashMap::new()),
            crcs: Crcs::default(),
        }
    }

    /// The binary read at `read_path` (mapped as `seen_path` by its process, whose root is not
    /// known here: its directory is taken only as this process reaches the file).
    pub fn locate(&self, read_path: &Path, seen_path: &str) -> Located {
        self.locate_in(read_path, seen_path, None)
    }

    /// As `locate`, with the process's root directory (`/proc/<pid>/root`) if known: the
    /// directory it saw the binary in is then searched for its debug link too, under that root.
    pub fn locate_in(&self, read_path: &Path, seen_path: &str, root: Option<&Path>) -> Located {
        let Some(facts) = Facts::read(read_path) else {
            return Located::unreadable();
        };
        if let Some(hit) = self.cached(&facts) {
            return hit;
        }
        let located = self.search(&facts, &binary_dirs(read_path, seen_path, root));
        if let (Some(claim), false) = (Claim::of(&facts), located.pending) {
            let mut found = self.found.borrow_mut();
            if found.len() >= CACHED_BUILD_IDS {
                found.clear();
            }
            found.insert(claim, located.clone());
        }
        located
    }

    /// The answer kept for the binary (its build id and `Claim`), if it still stands: a miss
    /// not yet to be asked again; a fetched file the fetcher still has at that path (asking
    /// marks it used).
    fn cached(&self, facts: &Facts) -> Option<Located> {
        let claim = Claim::of(facts)?;
        let hit = self.found.borrow().get(&claim).cloned()?;
        if hit.retry_at.is_some_and(|at| Instant::now() >= at) {
            return None;
        }
        if hit.origin == Origin::Debuginfod {
            let fetcher = self.fetcher.as_ref()?;
            if fetcher.lookup(&claim.build_id) != Lookup::Ready(hit.debug_file.clone()?) {
                return None;
            }
        }
        Some(hit)
    }

    fn search(&self, facts: &Facts, binary_dirs: &[PathBuf]) -> Located {
        let mut located = Located {
            origin: facts.own(),
            debug_file: None,
            fallback: facts.own(),
            build_id: facts.build_id.clone(),
            segments: facts.segments.clone(),
            problems: Vec::new(),
            pending: false,
            retry_at: None,
            debug_syms: facts.dwarf || facts.debuglink.is_none(),
            headers_overflow: facts.headers_overflow,
        };
        // A file with its own DWARF needs nothing else; one with only `.symtab` may still have
        // a debug file with lines and inlined functions.
        if facts.dwarf {
            return located;
        }
        let found = self
            .by_build_id(facts, &mut located.problems)
            .or_else(|| self.by_debuglink(facts, binary_dirs, &mut located.problems))
            .or_else(|| self.by_fetcher(facts, &mut located));
        if let Some((origin, path)) = found {
            located.origin = origin;
            located.debug_file = Some(path);
        }
        located
    }

    fn by_build_id(&self, facts: &Facts, problems: &mut Vec<String>) -> Option<(Origin, PathBuf)> {
        let id = facts.build_id.as_deref().filter(|id| id.len() >= 2)?;
        let rest = format!(".build-id/{:02x}/{}.debug", id[0], hex(&id[1..]));
        let accepted = |path: &Path, problems: &mut Vec<String>| {
            accept(&self.crcs, path, facts, (None, Links::Follow), problems)
        };
        for dir in &self.dirs {
            let path = dir.join(&rest);
            if accepted(&path, problems) {
                return Some((Origin::BuildIdDir, path));
            }
        }
        // The binary's own stripped copy may lie there too: the one with symbols is taken.
        let path = self.index().get(id)?.iter().find(|p| accepted(p, problems))?;
        Some((Origin::DebugDir, path.clone()))
    }

    fn by_debuglink(
        &self,
        facts: &Facts,
        binary_dirs: &[PathBuf],
        problems: &mut Vec<String>,
    ) -> Option<(Origin, PathBuf)> {
        let (name, crc) = facts.debuglink.as_ref()?;
        debuglink_candidates(name, &self.user, binary_dirs, Path::new(SYSTEM_DEBUG_DIR))
            .into_iter()
            .find(|path| accept(&self.crcs, path, facts, (Some(*crc), Links::Refuse), problems))
            .map(|path| (Origin::Debuglink, path))
    }

    fn by_fetcher(&self, facts: &Facts, located: &mut Located) -> Option<(Origin, PathBuf)> {
        let (fetcher, id) = self.fetcher.as_ref().zip(facts.build_id.as_ref())?;
        match fetcher.lookup(id) {
            Lookup::Ready(path) => accept(
                &self.crcs,
                &path,
                facts,
                (None, Links::Follow),
                &mut located.problems,
            )
            .then_some((Origin::Debuginfod, path)),
            Lookup::Pending => {
                located.pending = true;
                located.retry_at = Some(Instant::now());
                None
            }
            Lookup::Missing(retry_at) => {
                located.retry_at = retry_at;
                None
            }
        }
    }

    /// Every ELF file under the `--debug-dir` dirs by build id (a folder of unstripped builds),
    /// read once, bounded.
    fn index(&self) -> &HashMap<Vec<u8>, Vec<PathBuf>> {
        self.index.get_or_init(|| {
            let mut index = HashMap::new();
            let mut budget = INDEX_FILES;
            for dir in &self.user {
                index_dir(dir, INDEX_DEPTH, &mut budget, &mut index);
            }
            index
        })
    }
}

/// The directories the binary lies in, as this process reaches them: where `read_path` leads
/// (the link `/proc/self/fd/N` is to the file as this process sees it), and the directory its
/// process saw it in under that process's `root`, if known (a path in another mount namespace
/// means nothing here without it).
fn binary_dirs(read_path: &Path, seen_path: &str, root: Option<&Path>) -> Vec<PathBuf> {
    let here = std::fs::read_link(read_path).unwrap_or_else(|_| read_path.to_path_buf());
    let here = PathBuf::from(here.to_string_lossy().trim_end_matches(" (deleted)"));
    let seen = Path::new(seen_path.trim_end_matches(" (deleted)"));
    let seen = root.map(|root| root.join(seen.strip_prefix("/").unwrap_or(seen)));
    let mut dirs: Vec<PathBuf> = Vec::new();
    for path in [Some(here.as_path()), seen.as_deref()].into_iter().flatten() {
        if let Some(dir) = path.parent().filter(|d| d.is_absolute()) {
            if !dirs.iter().any(|d| d == dir) {
                dirs.push(dir.to_path_buf());
            }
        }
    }
    dirs
}

/// Where a debug link's file is looked for, in order: each `--debug-dir` (flat, then with the
/// binary's directory under it), the binary's directory, its `.debug/`, and the system's debug
/// dir with the binary's directory under it (as gdb does).
fn debuglink_candidates(
    name: &str,
    user: &[PathBuf],
    binary_dirs: &[PathBuf],
    system: &Path,
) -> Vec<PathBuf> {
    let under = |root: &Path, dir: &Path| root.join(dir.strip_prefix("/").unwrap_or(dir)).join(name);
    let mut out = Vec::new();
    for root in user {
        out.push(root.join(name));
        out.extend(binary_dirs.iter().map(|dir| under(root, dir)));
    }
    for dir in binary_dirs {
        out.push(dir.join(name));
        out.push(dir.join(".debug").join(name));
    }
    out.extend(binary_dirs.iter().map(|dir| under(system, dir)));
    out
}

/// Adds the ELF files under `dir` to the index by build id, depth first, within the budget.
fn index_dir(dir: &Path, depth: usize, budget: &mut usize, index: &mut HashMap<Vec<u8>, Vec<PathBuf>>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        if *budget == 0 {
            return;
        }
        *budget -= 1;
        let Ok(kind) = entry.file_type() else { continue };
        let path = entry.path();
        if kind.is_dir() && depth > 0 {
            index_dir(&path, depth - 1, budget, index);
        } else if kind.is_file() {
            let file = open_regular(&path, Links::Refuse);
            if let Some(id) = file.and_then(|(f, _)| crate::process::build_id_bytes(&f)) {
                index.entry(id).or_default().push(path);
            }
        }
    }
}

/// What blazesym answers for a file's offsets, and where the names came from: the debug file
/// (virtual addresses, from the binary's segments; an offset in no segment is unknown) if one
/// was found, else the binary itself; if blazesym fails the binary as a whole (DWARF it cannot
/// read), the binary again without debug information, so its `.symtab`/`.dynsym` names are not
/// lost with it. A debug link no candidate passed is never followed by blazesym.
pub(super) fn symbolize_file<'s>(
    inner: &'s Blazesym,
    read_path: PathBuf,
    located: &mut Located,
    offsets: &[u64],
) -> (blazesym::Result<Vec<Symbolized<'s>>>, Origin) {
    if located.headers_overflow {
        let why = "not an ELF file bpfprof can parse, or a program header ends past 2^64: not read for names";
        let error = std::io::Error::new(std::io::ErrorKind::InvalidData, why);
        return (Err(error.into()), Origin::None);
    }
    if let Some(debug) = &located.debug_file {
        match by_vaddr(inner, debug, located, offsets) {
            Ok(results) => return (Ok(results), located.origin),
            Err(err) => located
                .problems
                .push(format!("{}: {err}, ignored", debug.display())),
        }
    }
    let mut primary = Elf::new(read_path.clone());
    primary.debug_syms = located.debug_syms;
    let first = match inner.symbolize(&Source::Elf(primary), Input::FileOffset(offsets)) {
        Ok(results) => return (Ok(results), located.fallback),
        Err(err) => err,
    };
    if !located.debug_syms {
        return (Err(first), Origin::None);
    }
    let mut without = Elf::new(read_path);
    without.debug_syms = false;
    match inner.symbolize(&Source::Elf(without), Input::FileOffset(offsets)) {
        Ok(results) => {
            log::debug!("named without debug information: {first}");
            if located.problems.is_empty() {
                located
                    .problems
                    .push(format!("{first}: named from its symbol tables"));
            }
            (Ok(results), located.fallback)
        }
        Err(_) => (Err(first), Origin::None),
    }
}

/// The offsets named from the debug file by virtual address; those in no segment unknown.
fn by_vaddr<'s>(
    inner: &'s Blazesym,
    debug: &Path,
    located: &Located,
    offsets: &[u64],
) -> blazesym::Result<Vec<Symbolized<'s>>> {
    let vaddrs: Vec<Option<u64>> = offsets.iter().map(|&o| located.vaddr_of(o)).collect();
    let known: Vec<u64> = vaddrs.iter().flatten().copied().collect();
    let mut named = inner
        .symbolize(&Source::Elf(Elf::new(debug)), Input::VirtOffset(&known))?
        .into_iter();
    Ok(vaddrs
        .iter()
        .map(|v| {
            v.and_then(|_| named.next())
                .unwrap_or(Symbolized::Unknown(Reason::InvalidFileOffset))
        })
        .collect())
}

/// One file's naming, for the report: where its names came from and how many of its addresses
/// got one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NameSource {
    pub module: String,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub build_id: Option<String>,
    pub source: Origin,
    /// The debug file the names came from.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub path: Option<String>,
    pub addresses: u64,
    pub named: u64,
    /// Debug files found and refused, and why.
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub problems: Vec<String>,
}

/// Files listed by name in the note at most.
const NOTE_FILES: usize = 6;

/// The report's one line on names: said only when some file was not named from its own
/// symbols, or a debug file was refused.
pub fn names_note(sources: &[NameSource]) -> Option<String> {
    let own = sources.iter().filter(|s| s.source == Origin::OwnSymbols).count();
    let others: Vec<&NameSource> = sources
        .iter()
        .filter(|s| s.source != Origin::OwnSymbols)
        .collect();
    let problems: Vec<String> = sources
        .iter()
        .flat_map(|s| {
            s.problems
                .iter()
                .map(move |p| format!("{}: {p}", short(&s.module)))
        })
        .collect();
    if others.is_empty() && problems.is_empty() {
        return None;
    }
    let mut parts: Vec<String> = others
        .iter()
        .take(NOTE_FILES)
        .map(|s| {
            let from = s.path.as_deref().map(|p| format!(" {p}")).unwrap_or_default();
            format!(
                "{} from {}{from} ({} of {} addresses named)",
                short(&s.module),
                s.source.words(),
                s.named,
                s.addresses
            )
        })
        .collect();
    if others.len() > NOTE_FILES {
        parts.push(format!(
            "{} more without their own symbols",
            others.len() - NOTE_FILES
        ));
    }
    if own > 0 {
        parts.push(format!("{own} files from their own symbols"));
    }
    parts.extend(problems.into_iter().take(NOTE_FILES));
    Some(format!("names: {}", parts.join("; ")))
}

fn short(module: &str) -> &str {
    module.rsplit('/').next().unwrap_or(module)
}

#[cfg(test)]
mod tests;
