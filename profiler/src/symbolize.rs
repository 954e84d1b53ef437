//! Addresses to functions with blazesym: one long-lived `Symbolizer`, addresses batched per file
//! (user) or in one batch (kernel). An address that fails becomes an `[unknown]` frame; it never
//! fails the report.
use std::collections::{BTreeMap, HashMap, HashSet};

use blazesym::symbolize::{
    source::{Elf, Kernel, Source},
    CodeInfo, Input, Sym, Symbolized, Symbolizer as BlazeSymbolizer,
};
use serde::Serialize;

use crate::{
    process::{FileId, Processes, UserAddr},
    profile::RawProfile,
};

/// What a frame is called when nothing better is known. Unknown frames are kept, never dropped.
pub const UNKNOWN: &str = "[unknown]";
pub const KERNEL_MODULE: &str = "[kernel.kallsyms]";

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct Frame {
    pub function: String,
    pub module: String,
    pub file: Option<String>,
    pub line: Option<u32>,
    pub kernel: bool,
    /// Inlined into the frame before it (its caller) at this address.
    pub inlined: bool,
    /// The address looked up (callers' return addresses moved back into the call).
    #[serde(serialize_with = "hex")]
    pub address: u64,
}

/// Serializes an address as "0x...".
pub(crate) fn hex<S: serde::Serializer>(v: &u64, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format!("{v:#x}"))
}

impl Frame {
    pub fn unknown(module: impl Into<String>, address: u64, kernel: bool) -> Frame {
        Frame {
            function: UNKNOWN.to_string(),
            module: module.into(),
            file: None,
            line: None,
            kernel,
            inlined: false,
            address,
        }
    }

    /// A placeholder standing for frames the kernel could not give us.
    pub fn marker(what: &str, kernel: bool) -> Frame {
        Frame {
            function: format!("[{what}]"),
            module: String::new(),
            file: None,
            line: None,
            kernel,
            inlined: false,
            address: 0,
        }
    }

    pub fn is_unknown(&self) -> bool {
        self.function == UNKNOWN
    }
}

/// Symbols for every address of a profile; each address maps to its frames, outermost first
/// (more than one where functions were inlined).
#[derive(Debug, Default)]
pub struct Symbols {
    user: HashMap<UserAddr, Vec<Frame>>,
    kernel: HashMap<u64, Vec<Frame>>,
    /// Batches that failed as a whole (e.g. an unreadable file), for the report's health line.
    pub failures: Vec<String>,
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
}

pub struct Symbolizer {
    inner: BlazeSymbolizer,
}

impl Default for Symbolizer {
    fn default() -> Self {
        Self::new()
    }
}

impl Symbolizer {
    pub fn new() -> Self {
        let inner = BlazeSymbolizer::builder()
            .enable_code_info(true)
            .enable_inlined_fns(true)
            .enable_demangling(true)
            .build();
        Self { inner }
    }

    pub fn symbolize(&self, profile: &RawProfile, procs: &Processes) -> Symbols {
        let mut symbols = Symbols::default();
        let mut by_file: BTreeMap<FileId, HashSet<UserAddr>> = BTreeMap::new();
        let mut kernel: HashSet<u64> = HashSet::new();
        for key in profile.stacks.keys() {
            for addr in &key.user {
                match *addr {
                    UserAddr::File { file, .. } => {
                        by_file.entry(file).or_default().insert(*addr);
                    }
                    UserAddr::Vdso { addr: a } => {
                        symbols
                            .user
                            .insert(*addr, vec![Frame::unknown("[vdso]", a, false)]);
                    }
                    UserAddr::Anon { addr: a } => {
                        symbols
                            .user
                            .insert(*addr, vec![Frame::unknown("[anon]", a, false)]);
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
            let mapped = procs.file(file);
            let addrs: Vec<UserAddr> = addrs.into_iter().collect();
            let offsets: Vec<u64> = addrs
                .iter()
                .map(|a| match a {
                    UserAddr::File { offset, .. } => *offset,
                    _ => unreachable!("grouped by file"),
                })
                .collect();
            let source = Source::Elf(Elf::new(mapped.read_path()));
            let results = self.inner.symbolize(&source, Input::FileOffset(&offsets));
            if let Err(err) = &results {
                symbols.failures.push(format!("{}: {err}", mapped.path));
            }
            for (i, addr) in addrs.iter().enumerate() {
                let frames = match &results {
                    Ok(results) => frames_of(&results[i], &mapped.path, addr.addr(), false),
                    Err(_) => vec![Frame::unknown(&mapped.path, addr.addr(), false)],
                };
                symbols.user.insert(*addr, frames);
            }
        }

        let kernel: Vec<u64> = kernel.into_iter().collect();
        if !kernel.is_empty() {
            let source = Source::Kernel(Kernel::default());
            match self.inner.symbolize(&source, Input::AbsAddr(&kernel)) {
                Ok(results) => {
                    for (addr, result) in kernel.iter().zip(&results) {
                        let module = match result {
                            Symbolized::Sym(Sym { module: Some(m), .. }) => module_name(&m.to_string_lossy()),
                            _ => KERNEL_MODULE.to_string(),
                        };
                        symbols
                            .kernel
                            .insert(*addr, frames_of(result, &module, *addr, true));
                    }
                }
                Err(err) => symbols.failures.push(format!("kernel: {err}")),
            }
        }
        symbols
    }
}

/// blazesym names kernel modules by path or name; the kernel proper gets perf's name.
fn module_name(module: &str) -> String {
    if module.is_empty() || module.contains("vmlinux") || module.contains("kallsyms") {
        KERNEL_MODULE.to_string()
    } else {
        format!("[{}]", module.trim_matches(|c| c == '[' || c == ']'))
    }
}

fn frames_of(result: &Symbolized<'_>, module: &str, address: u64, kernel: bool) -> Vec<Frame> {
    let Symbolized::Sym(sym) = result else {
        return vec![Frame::unknown(module, address, kernel)];
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
mod tests {
    use super::*;
    use crate::profile::{RawSample, StackRead};

    #[inline(never)]
    fn known_function_for_symbolizer_test() -> u64 {
        std::hint::black_box(42)
    }

    #[test]
    fn symbolizes_own_code_and_keeps_unknown_frames() {
        known_function_for_symbolizer_test();
        let pid = std::process::id();
        let mut procs = Processes::new();
        procs.capture(pid).unwrap();
        let here = known_function_for_symbolizer_test as *const () as u64;
        let mut profile = RawProfile::new();
        profile.add(
            RawSample {
                pid,
                tid: pid,
                comm: "t".into(),
                // leaf first; the second address is not mapped anywhere.
                user: StackRead::Frames(vec![here + 4, 0x10]),
                kernel: StackRead::Absent,
                count: 1,
                exec_generation: 0,
                deltas: Default::default(),
            },
            &procs,
        );
        let symbols = Symbolizer::new().symbolize(&profile, &procs);
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
}
