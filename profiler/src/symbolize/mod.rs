//! Addresses to functions with blazesym: one long-lived `Symbolizer`, addresses batched per file
//! (user) or in one batch (kernel). An address that fails becomes an `[unknown]` frame; it never
//! fails the report.
mod bounds;
mod cache;
pub mod data;
pub mod debug_files;
pub mod debuginfod;
mod frame;
mod tracing;
mod unnamed;
mod vdso;

pub use bounds::FunctionBounds;
pub use cache::FrameCache;
pub use debug_files::{name_later, names_note, DebugLocator, NameSource};
pub(crate) use frame::hex;
#[cfg(test)]
pub(crate) use frame::tests::stripped_frames;
pub use frame::{lower_hex, Frame, NameKind, ObjectRef};

use std::{
    cell::RefCell,
    collections::{BTreeMap, HashMap, HashSet},
    path::{Path, PathBuf},
};

use blazesym::symbolize::{
    evict,
    source::{Kernel, Source},
    CodeInfo, Input, Sym, Symbolized, Symbolizer as BlazeSymbolizer,
};

use crate::{
    process::{FileId, FileTable, UserAddr},
    profile::RawProfile,
};

/// What a frame is called when nothing better is known. Unknown frames are kept, never dropped.
pub const UNKNOWN: &str = "[unknown]";
pub const KERNEL_MODULE: &str = "[kernel.kallsyms]";

/// Symbols for every address of a profile; each address maps to its frames, outermost first
/// (more than one where functions were inlined).
#[derive(Debug, Default)]
pub struct Symbols {
    user: HashMap<UserAddr, Vec<Frame>>,
    kernel: HashMap<u64, Vec<Frame>>,
    /// Kernel addresses that are the tracing machinery's (see `tracing`).
    machinery: HashMap<u64, tracing::Machinery>,
    /// Batches that failed as a whole (e.g. an unreadable file), for the report's health line.
    pub failures: Vec<String>,
    /// Where each file's names came from (files symbolized in this pass; none from a
    /// long-lived symbolizer, which sees only the addresses its frame cache lacks).
    pub names: Vec<NameSource>,
}

impl Symbols {
    pub fn user(&self, addr: &UserAddr) -> Vec<Frame> {
        self.user
            .get(addr)
            .cloned()
            .unwrap_or_else(|| vec![Frame::unknown("", addr.addr(), false)])
    }

    pub fn kernel(&self, addr: u64) -> Vec<Frame> {
        self.kernel
            .get(&addr)
            .cloned()
            .unwrap_or_else(|| vec![Frame::unknown(KERNEL_MODULE, addr, true)])
    }

    fn insert_kernel(&mut self, addr: u64, frames: Vec<Frame>) {
        if let Some(role) = frames.first().and_then(tracing::machinery) {
            self.machinery.insert(addr, role);
        }
        self.kernel.insert(addr, frames);
    }

    /// A kernel stack's frames, outermost first, from its addresses leaf first: without the
    /// tracing machinery a stack taken inside a BPF program begins with (see `tracing`), so
    /// every kernel stack of every mode starts at the function traced.
    pub fn kernel_stack(&self, leaf_first: &[u64]) -> Vec<Frame> {
        let roles: Vec<Option<tracing::Machinery>> = leaf_first
            .iter()
            .map(|addr| self.machinery.get(addr).copied())
            .collect();
        let cut = tracing::leading_machinery(&roles);
        leaf_first[cut..]
            .iter()
            .rev()
            .flat_map(|&addr| self.kernel(addr))
            .collect()
    }
}

pub struct Symbolizer {
    /// For user files. A long-lived caller releases it after every profile (`release_files`).
    inner: RefCell<BlazeSymbolizer>,
    /// For the kernel: one source, bounded (kallsyms and modules), parsed once and kept.
    kernel: RefCell<BlazeSymbolizer>,
    /// For a long-running caller (the agent): frames kept across profiles, and a bound on what
    /// blazesym keeps.
    cache: Option<RefCell<LongLived>>,
    /// Finds the debug files of stripped binaries.
    locator: DebugLocator,
    /// Files' tables for code nothing names, kept across batches (see `unnamed`).
    layouts: RefCell<unnamed::Layouts>,
}

/// What a long-lived symbolizer may keep of frames (as `FrameCache::entry_bytes` counts them):
/// some ten thousand addresses, enough for the hot code of a busy machine.
pub const FRAME_CACHE_BYTES: usize = 4 << 20;

/// blazesym keeps every file it has opened (its mapping, and the debug information it parsed:
/// decompressed sections, line tables) for as long as it lives. A long-lived caller lets go,
/// after each profile, of every binary it read and of every debug file the last
/// `BLAZESYM_IDLE_PROFILES` profiles did not need (`release_files`); within one profile, of
/// every file once it holds this many. Frames of hot addresses survive in `FrameCache`.
const BLAZESYM_FILES: usize = 256;

/// A debug file no profile has needed for this many profiles is let go. A binary is let go
/// after each profile: read again, it is a mapping of pages that stay in the page cache. A
/// distribution's debug file has compressed sections, inflated whenever it is parsed (the C
/// library's: 15 MB, over half the agent's rendering time under process churn when it was
/// parsed anew for every window's few new addresses); it is kept while profiles keep needing it.
const BLAZESYM_IDLE_PROFILES: u64 = 4;

/// And every this many profiles, blazesym starts afresh whatever it holds: a bound on what it
/// opened on its own (a debug link it followed), which no path handed to it names.
const BLAZESYM_FRESH_EVERY: u64 = 64;

struct LongLived {
    frames: FrameCache,
    /// The paths blazesym has been handed (a binary, its debug file), each with the last
    /// profile it is kept through.
    held: HashMap<PathBuf, u64>,
    /// Profiles symbolized so far.
    profile: u64,
}

/// How much a long-lived symbolizer holds, for the agent's metrics.
#[derive(Clone, Copy, Debug, Default)]
pub struct CacheSize {
    pub frames: usize,
    pub frame_bytes: usize,
    pub files: usize,
    /// Files whose tables for unnamed code are kept.
    pub layouts: usize,
}

impl Default for Symbolizer {
    fn default() -> Self {
        Self::new(DebugLocator::default())
    }
}

impl Symbolizer {
    pub fn new(locator: DebugLocator) -> Self {
        Self {
            inner: RefCell::new(Self::blazesym()),
            kernel: RefCell::new(Self::blazesym()),
            cache: None,
            locator,
            layouts: RefCell::default(),
        }
    }

    /// For a caller that symbolizes profile after profile for as long as it runs: frames are
    /// cached per executable (not per process: a thousand short-lived processes of one binary
    /// share them), at most `FRAME_CACHE_BYTES` of them, and blazesym's own caches are bounded
    /// too.
    pub fn long_lived(locator: DebugLocator) -> Self {
        Self::long_lived_with(FRAME_CACHE_BYTES, locator)
    }

    fn long_lived_with(frame_bytes: usize, locator: DebugLocator) -> Self {
        Self {
            inner: RefCell::new(Self::blazesym()),
            kernel: RefCell::new(Self::blazesym()),
            cache: Some(RefCell::new(LongLived {
                frames: FrameCache::new(frame_bytes),
                held: HashMap::new(),
                profile: 0,
            })),
            locator,
            layouts: RefCell::default(),
        }
    }

    fn blazesym() -> BlazeSymbolizer {
        BlazeSymbolizer::builder()
            .enable_code_info(true)
            .enable_inlined_fns(true)
            .enable_demangling(true)
            .build()
    }

    /// For a long-lived caller, between profiles: lets go of every binary blazesym holds, and of
    /// every debug file no recent profile needed (`BLAZESYM_IDLE_PROFILES`). Their mappings and
    /// parsed debug information are what a profiler running for weeks under process churn would
    /// otherwise accumulate (megabytes a file), while the frames they gave stay in the frame
    /// cache. A file every profile needs
    /// (the C library's debug file, whose compressed sections are inflated when it is parsed)
    /// stays parsed: each profile's few new addresses in it cost a lookup, not a parse.
    pub fn release_files(&self) {
        self.layouts.borrow_mut().release();
        let Some(cache) = &self.cache else { return };
        let mut cache = cache.borrow_mut();
        let profile = cache.profile;
        let mut inner = self.inner.borrow_mut();
        cache.held.retain(|path, through| {
            let needed = *through > profile;
            if !needed {
                // Not an error when blazesym holds nothing of the path.
                let _ = inner.evict(&evict::Elf::new(path).into());
            }
            needed
        });
        cache.profile += 1;
        if cache.profile % BLAZESYM_FRESH_EVERY == 0 {
            *inner = Self::blazesym();
            cache.held.clear();
        }
    }

    pub fn cache_size(&self) -> CacheSize {
        self.cache.as_ref().map_or_else(CacheSize::default, |c| {
            let c = c.borrow();
            CacheSize {
                frames: c.frames.len(),
                frame_bytes: c.frames.bytes(),
                files: c.held.len(),
                layouts: self.layouts.borrow().len(),
            }
        })
    }

    /// Notes what blazesym is handed for this profile, a binary and its debug file if it has
    /// one; past `BLAZESYM_FILES`, blazesym starts afresh.
    fn hand_to_blazesym(&self, cache: &mut LongLived, binary: PathBuf, debug: Option<&Path>) {
        let new = [Some(binary.as_path()), debug]
            .into_iter()
            .flatten()
            .filter(|p| !cache.held.contains_key(*p))
            .count();
        if cache.held.len() + new > BLAZESYM_FILES {
            *self.inner.borrow_mut() = Self::blazesym();
            cache.held.clear();
        }
        let profile = cache.profile;
        cache.held.entry(binary).or_insert(profile);
        if let Some(debug) = debug {
            cache
                .held
                .insert(debug.to_path_buf(), profile + BLAZESYM_IDLE_PROFILES);
        }
    }

    /// Frames for some offsets of one file, from the cache where it has them.
    fn file_frames(
        &self,
        mapped: &crate::process::MappedFile,
        addrs: &[UserAddr],
        offsets: &[u64],
        failures: &mut Vec<String>,
        names: &mut Vec<NameSource>,
    ) -> Vec<Vec<Frame>> {
        // Only a long-lived symbolizer caches, and only files it can tell apart.
        let cached = self.cache.as_ref().zip(mapped.identity);
        let mut out: Vec<Option<Vec<Frame>>> = vec![None; addrs.len()];
        if let Some((cache, identity)) = cached {
            let mut cache = cache.borrow_mut();
            for (i, &offset) in offsets.iter().enumerate() {
                out[i] = cache
                    .frames
                    .get(&(identity, offset))
                    .map(|frames| with_address(frames, addrs[i].addr()));
            }
        }
        let missing: Vec<usize> = (0..addrs.len()).filter(|&i| out[i].is_none()).collect();
        if !missing.is_empty() {
            let wanted: Vec<u64> = missing.iter().map(|&i| offsets[i]).collect();
            let read_path = mapped.read_path();
            let mut located = self.locator.locate(&read_path, &mapped.path);
            if let Some((cache, _)) = cached {
                let debug = located.debug_file.as_deref();
                self.hand_to_blazesym(&mut cache.borrow_mut(), read_path.clone(), debug);
            }
            let inner = self.inner.borrow();
            let (results, origin) = debug_files::symbolize_file(&inner, read_path, &mut located, &wanted);
            // Names still being fetched (debuginfod), or a miss to be asked again, may come
            // later: frames are not cached until the locator's answer is final.
            let keep = results.is_ok() && located.is_final();
            if let Err(err) = &results {
                failures.push(format!("{}: {err}", mapped.path));
            }
            // What blazesym leaves unnamed is named or placed from the file's own tables.
            let place = unnamed::Place::new(&located);
            let mut layouts = self.layouts.borrow_mut();
            let mut unnamed = unnamed::Unnamed::new(mapped, &place, &mut layouts);
            for (k, &i) in missing.iter().enumerate() {
                let address = addrs[i].addr();
                let frames = match &results {
                    Ok(results) if !matches!(results[k], Symbolized::Unknown(_)) => {
                        let object = Some(place.object(offsets[i]));
                        frames_of(&results[k], &mapped.path, address, false, object)
                    }
                    _ => unnamed.frames(offsets[i], address),
                };
                // A whole-file failure may be passing (the file unreadable for a moment): not
                // cached.
                if let (Some((cache, identity)), true) = (cached, keep) {
                    cache
                        .borrow_mut()
                        .frames
                        .insert((identity, offsets[i]), frames.clone());
                }
                out[i] = Some(frames);
            }
            unnamed.finish(&mut layouts);
            drop(layouts);
            let is_named = |i: &&usize| {
                out[**i]
                    .as_ref()
                    .is_some_and(|f| f.iter().any(|f| !f.is_unknown()))
            };
            // A long-lived symbolizer sees only the addresses its frame cache lacks: counts of
            // those would misstate the file, so it says nothing of names.
            if self.cache.is_none() {
                let named = missing.iter().filter(is_named).count();
                let go = missing.iter().any(|&i| {
                    out[i]
                        .as_ref()
                        .is_some_and(|f| f.iter().any(|f| f.kind == NameKind::GoTable))
                });
                let origin = origin.or_go_table(go);
                names.push(located.source(&mapped.path, origin, missing.len(), named));
            }
        }
        out.into_iter().map(Option::unwrap_or_default).collect()
    }

    pub fn symbolize(&self, profile: &RawProfile, files: &dyn FileTable) -> Symbols {
        let mut symbols = Symbols::default();
        let mut by_file: BTreeMap<FileId, HashSet<UserAddr>> = BTreeMap::new();
        let mut kernel: HashSet<u64> = HashSet::new();
        let mut vdso: Vec<UserAddr> = Vec::new();
        for key in profile.stacks.keys() {
            for addr in &key.user {
                match *addr {
                    UserAddr::File { file, .. } => {
                        by_file.entry(file).or_default().insert(*addr);
                    }
                    UserAddr::Vdso { .. } => vdso.push(*addr),
                    UserAddr::Anon { addr: a } => {
                        symbols
                            .user
                            .insert(*addr, vec![Frame::unknown("[anon]", a, false)]);
                    }
                    UserAddr::Jit { symbol, addr: a } => {
                        let frame = match files.jit(symbol) {
                            Some(jit) => jit_frame(&jit, a),
                            None => Frame::unknown("[anon]", a, false),
                        };
                        symbols.user.insert(*addr, vec![frame]);
                    }
                    UserAddr::Truncated { slot } => {
                        symbols.user.insert(*addr, vec![truncated_frame(slot)]);
                    }
                    UserAddr::Unmapped { addr: a } => {
                        symbols
                            .user
                            .insert(*addr, vec![Frame::unknown("[unmapped]", a, false)]);
                    }
                }
            }
            kernel.extend(key.kernel.iter().copied());
        }

        for (file, addrs) in by_file {
            let addrs: Vec<UserAddr> = addrs.into_iter().collect();
            let Some(mapped) = files.file(file) else {
                for addr in addrs {
                    symbols
                        .user
                        .insert(addr, vec![Frame::unknown("", addr.addr(), false)]);
                }
                continue;
            };
            let offsets: Vec<u64> = addrs
                .iter()
                .map(|a| match a {
                    UserAddr::File { offset, .. } => *offset,
                    _ => unreachable!("grouped by file"),
                })
                .collect();
            let frames = self.file_frames(
                mapped,
                &addrs,
                &offsets,
                &mut symbols.failures,
                &mut symbols.names,
            );
            symbols.user.extend(addrs.into_iter().zip(frames));
        }

        vdso.sort_unstable();
        vdso.dedup();
        let frames = self.vdso_frames(&vdso);
        symbols.user.extend(vdso.into_iter().zip(frames));

        let kernel: Vec<u64> = kernel.into_iter().collect();
        if !kernel.is_empty() {
            let source = Source::Kernel(Kernel::default());
            match self.kernel.borrow().symbolize(&source, Input::AbsAddr(&kernel)) {
                Ok(results) => {
                    for (addr, result) in kernel.iter().zip(&results) {
                        let module = match result {
                            Symbolized::Sym(Sym { module: Some(m), .. }) => module_name(&m.to_string_lossy()),
                            _ => KERNEL_MODULE.to_string(),
                        };
                        symbols.insert_kernel(*addr, frames_of(result, &module, *addr, true, None));
                    }
                }
                Err(err) => symbols.failures.push(format!("kernel: {err}")),
            }
        }
        symbols
    }
}

/// Cached frames, for another address of the same offset (another process's mapping of the file).
fn with_address(frames: Vec<Frame>, address: u64) -> Vec<Frame> {
    frames
        .into_iter()
        .map(|frame| Frame { address, ..frame })
        .collect()
}

/// blazesym names kernel modules by path or name; the kernel proper gets perf's name.
fn module_name(module: &str) -> String {
    if module.is_empty() || module.contains("vmlinux") || module.contains("kallsyms") {
        KERNEL_MODULE.to_string()
    } else {
        format!("[{}]", module.trim_matches(|c| c == '[' || c == ']'))
    }
}

/// The frames of one address: the function and those inlined into it there, each with where
/// the address is in its file (`object`, for a frame of a file).
fn frames_of(
    result: &Symbolized<'_>,
    module: &str,
    address: u64,
    kernel: bool,
    object: Option<ObjectRef>,
) -> Vec<Frame> {
    let Symbolized::Sym(sym) = result else {
        return vec![Frame {
            object,
            ..Frame::unknown(module, address, kernel)
        }];
    };
    let (file, line) = location(sym.code_info.as_deref());
    let mut frames = vec![Frame {
        function: sym.name.to_string(),
        module: module.to_string(),
        file,
        line,
        kernel,
        inlined: false,
        address,
        start: Some(sym.addr),
        offset: Some(sym.offset as u64),
        kind: NameKind::Symbol,
        object: object.clone(),
    }];
    for inlined in sym.inlined.iter() {
        let (file, line) = location(inlined.code_info.as_ref());
        frames.push(Frame {
            function: inlined.name.to_string(),
            module: module.to_string(),
            file,
            line,
            kernel,
            inlined: true,
            address,
            start: None,
            offset: None,
            kind: NameKind::Symbol,
            object: object.clone(),
        });
    }
    frames
}

fn location(info: Option<&CodeInfo<'_>>) -> (Option<String>, Option<u32>) {
    match info {
        Some(info) => {
            let path = match &info.dir {
                Some(dir) => dir.join(&*info.file).to_string_lossy().into_owned(),
                None => info.file.to_string_lossy().into_owned(),
            };
            (Some(path), info.line)
        }
        None => (None, None),
    }
}

#[cfg(test)]
mod stripped_tests;

/// A frame of JIT code its perf map names: the function, in the module `[jit]`, with its file
/// where the name says (V8's); or a Python frame (a file and the line running).
fn jit_frame(jit: &crate::process::JitSymbol, addr: u64) -> Frame {
    match (&jit.file, jit.line) {
        (Some(file), Some(line)) => python_frame(&jit.name, file, line, addr),
        (file, _) => Frame {
            function: jit.name.to_string(),
            start: Some(jit.start),
            offset: Some(addr - jit.start),
            kind: NameKind::PerfMap,
            file: file.as_ref().map(|file| file.to_string()),
            ..Frame::unknown(JIT_MODULE, addr, false)
        },
    }
}

/// The frame standing for the outermost frames a walk did not keep (deeper than it keeps):
/// `[truncated: 80 frames]`, `[truncated: 300+ frames]` where the walk ran out before the
/// stack's end, `[truncated]` where the count is not known.
fn truncated_frame(slot: u64) -> Frame {
    let function = match profiler_common::unwind::truncation(slot).flatten() {
        Some((lost, false)) => format!("[truncated: {lost} frames]"),
        Some((lost, true)) => format!("[truncated: {lost}+ frames]"),
        None => TRUNCATED.to_string(),
    };
    Frame {
        function,
        ..Frame::unknown(TRUNCATED, 0, false)
    }
}

/// The name and module of `truncated_frame`.
pub const TRUNCATED: &str = "[truncated]";

/// The module of JIT code a perf map names.
pub const JIT_MODULE: &str = "[jit]";

/// A Python function at a line of its file; its module is the file's name (as a native
/// function's is its library's).
fn python_frame(name: &str, file: &str, line: u32, addr: u64) -> Frame {
    let module = file.rsplit('/').next().unwrap_or(file);
    Frame {
        function: name.to_string(),
        file: Some(file.to_string()),
        line: Some(line),
        kind: NameKind::Python,
        ..Frame::unknown(module, addr, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{process::Processes, profile::RawSample};

    #[inline(never)]
    fn known_function_for_symbolizer_test() -> u64 {
        std::hint::black_box(42)
    }

    /// This process, captured, and a profile of one stack: values below 0x10 are offsets into
    /// `known_function_for_symbolizer_test`, others are addresses as they are.
    fn own_profile(stack: &[u64]) -> (Processes, RawProfile) {
        known_function_for_symbolizer_test();
        let pid = std::process::id();
        let mut procs = Processes::new();
        procs.capture(pid).unwrap();
        let here = known_function_for_symbolizer_test as *const () as u64;
        let ips = stack
            .iter()
            .map(|&a| if a < 0x10 { here + a } else { a })
            .collect();
        let mut profile = RawProfile::new();
        profile.add(RawSample::of_user_stack(pid, "t", ips, 1), &procs);
        (procs, profile)
    }

    #[test]
    fn symbolizes_own_code_and_keeps_unknown_frames() {
        // leaf first; the second address is not mapped anywhere.
        let (procs, profile) = own_profile(&[4, 0x10]);
        let symbols = Symbolizer::default().symbolize(&profile, &procs);
        let key = profile.stacks.keys().next().unwrap();
        let leaf = symbols.user(&key.user[0]);
        assert!(
            leaf.iter()
                .any(|f| f.function.ends_with("known_function_for_symbolizer_test")),
            "{leaf:?}"
        );
        assert!(leaf[0].module.contains("profiler"), "{leaf:?}");
        let unknown = symbols.user(&key.user[1]);
        assert_eq!(unknown.len(), 1);
        assert!(unknown[0].is_unknown());
    }

    #[test]
    fn kernel_stacks_begin_at_the_function_traced_not_in_the_tracing_machinery() {
        let kernel = |function: &str, address: u64, start: u64| Frame {
            function: function.to_string(),
            start: Some(start),
            offset: Some(address - start),
            ..Frame::unknown(KERNEL_MODULE, address, true)
        };
        let mut symbols = Symbols::default();
        // An off-CPU stack of `sleep` on 6.18, leaf first, its program already unloaded.
        let stack = [
            0xffffffffc002b22d,
            0xffffffff814ba96b,
            0xffffffff821facd7,
            0xffffffff821fb642,
        ];
        symbols.insert_kernel(
            stack[0],
            vec![kernel(
                "__stop_runtime_ptr_USER_PTR_MAX",
                stack[0],
                0xffffffff83b26734,
            )],
        );
        symbols.insert_kernel(
            stack[1],
            vec![kernel("bpf_trace_run4", stack[1], 0xffffffff814ba870)],
        );
        symbols.insert_kernel(stack[2], vec![kernel("__schedule", stack[2], 0xffffffff821fa810)]);
        symbols.insert_kernel(stack[3], vec![kernel("schedule", stack[3], 0xffffffff821fb600)]);
        let names = |frames: Vec<Frame>| -> Vec<String> { frames.into_iter().map(|f| f.function).collect() };
        assert_eq!(names(symbols.kernel_stack(&stack)), ["schedule", "__schedule"]);
        // A stack of the kernel's own (a CPU sample in the scheduler) is whole.
        assert_eq!(
            names(symbols.kernel_stack(&stack[2..])),
            ["schedule", "__schedule"]
        );
        // Addresses the kernel symbolizer never answered for stay, as unknown frames.
        let unanswered = names(symbols.kernel_stack(&[1, 2]));
        assert_eq!(unanswered, [UNKNOWN, UNKNOWN]);
    }

    #[test]
    fn a_long_lived_symbolizer_answers_again_from_its_cache() {
        let (procs, profile) = own_profile(&[4]);
        let key = profile.stacks.keys().next().unwrap().clone();
        let symbolizer = Symbolizer::long_lived_with(1 << 20, DebugLocator::default());
        let first = symbolizer.symbolize(&profile, &procs).user(&key.user[0]);
        let cached = symbolizer.cache_size();
        assert_eq!((cached.frames, cached.files), (1, 1));
        let again = symbolizer.symbolize(&profile, &procs).user(&key.user[0]);
        assert_eq!(first, again);
        assert!(again
            .iter()
            .any(|f| f.function.ends_with("known_function_for_symbolizer_test")));
        assert_eq!(symbolizer.cache_size().frames, 1);
    }

    #[test]
    fn releasing_files_keeps_frames_and_a_new_address_is_still_symbolized() {
        let (procs, profile) = own_profile(&[4]);
        let key = profile.stacks.keys().next().unwrap().clone();
        let symbolizer = Symbolizer::long_lived_with(1 << 20, DebugLocator::default());
        let first = symbolizer.symbolize(&profile, &procs).user(&key.user[0]);
        symbolizer.release_files();
        let released = symbolizer.cache_size();
        assert_eq!((released.frames, released.files), (1, 0), "a binary is let go");
        assert_eq!(symbolizer.symbolize(&profile, &procs).user(&key.user[0]), first);
        assert_eq!(symbolizer.cache_size().files, 0, "answered from the frame cache");

        // Another address of the same file: blazesym opens the file again.
        let (procs, other) = own_profile(&[8]);
        let key = other.stacks.keys().next().unwrap().clone();
        let frames = symbolizer.symbolize(&other, &procs).user(&key.user[0]);
        assert!(frames
            .iter()
            .any(|f| f.function.ends_with("known_function_for_symbolizer_test")));
        assert_eq!(symbolizer.cache_size().files, 1);
    }
}
