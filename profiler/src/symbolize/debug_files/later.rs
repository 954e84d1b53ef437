//! Naming a saved profile's frames later (`bpfprof report p.json`): a frame left unnamed at the
//! run kept its file's build id and its virtual address, which is all a debug file needs; the
//! binary itself is not. Found by build id only (a debug link is in the binary); files still
//! being fetched are waited for, a bounded time.
use std::{
    collections::{BTreeMap, HashMap},
    path::PathBuf,
    time::Duration,
};

use blazesym::symbolize::{
    source::{Elf, Source},
    Input, Symbolized,
};

use super::{DebugLocator, Facts, NameSource, Origin};
use crate::symbolize::{frames_of, Frame, Symbolizer};

/// How long naming later waits for the fetcher's files, all together.
const FETCH_WAIT: Duration = Duration::from_secs(10);

/// A build id's debug file, if found; or that it is still being fetched.
type Found = (Option<(Origin, PathBuf)>, bool);

/// A build id's debug file, if found, and the files refused on the way.
type FoundWithProblems = (Option<(Origin, PathBuf)>, Vec<String>);

impl DebugLocator {
    /// A debug file for this build id, without the binary: the build-id trees, the index of the
    /// `--debug-dir`s, the fetcher; and whether the fetcher is still at it.
    fn for_build_id(&self, build_id: &[u8], problems: &mut Vec<String>) -> Found {
        let facts = Facts {
            build_id: Some(build_id.to_vec()),
            debuglink: None,
            dwarf: false,
            symtab: false,
            debugdata: false,
            dynsym: false,
            segments: Vec::new(),
            text: None,
            headers_overflow: false,
        };
        if let Some(found) = self.by_build_id(&facts, problems) {
            return (Some(found), false);
        }
        let mut located = super::Located::unreadable();
        located.build_id = facts.build_id.clone();
        let found = self.by_fetcher(&facts, &mut located);
        problems.append(&mut located.problems);
        (found, located.pending)
    }

    /// Each build id's debug file; those being fetched asked again after a bounded wait.
    fn for_build_ids(&self, ids: &[&str]) -> Vec<FoundWithProblems> {
        let find = |id: &str| {
            let mut problems = Vec::new();
            let (found, pending) = unhex(id).map_or((None, false), |b| self.for_build_id(&b, &mut problems));
            ((found, problems), pending)
        };
        let mut found: Vec<_> = ids.iter().map(|id| find(id)).collect();
        if let (true, Some(fetcher)) = (found.iter().any(|(_, pending)| *pending), &self.fetcher) {
            if !fetcher.wait(FETCH_WAIT) {
                log::warn!(
                    "debuginfod: debug files not fetched within {FETCH_WAIT:?}: their functions stay unnamed"
                );
            }
            for (i, id) in ids.iter().enumerate() {
                if found[i].1 {
                    found[i] = find(id);
                }
            }
        }
        found.into_iter().map(|(found, _)| found).collect()
    }
}

/// What the frames not named at the run are named now: each such frame (with a build id and a
/// virtual address) to its frames, outermost first; and where the names of each file came from.
pub fn name_later(
    locator: &DebugLocator,
    frames: &[&Frame],
) -> (HashMap<Frame, Vec<Frame>>, Vec<NameSource>) {
    let mut by_build_id: BTreeMap<&str, Vec<&Frame>> = BTreeMap::new();
    for &frame in frames.iter().filter(|f| f.is_unknown() && !f.kernel) {
        let object = frame.object.as_ref();
        if let Some(id) = object
            .filter(|o| o.vaddr.is_some())
            .and_then(|o| o.build_id.as_deref())
        {
            by_build_id.entry(id).or_default().push(frame);
        }
    }
    let blazesym = Symbolizer::blazesym();
    let ids: Vec<&str> = by_build_id.keys().copied().collect();
    let located = locator.for_build_ids(&ids);
    let mut named = HashMap::new();
    let mut sources = Vec::new();
    for ((id, frames), (found, problems)) in by_build_id.into_iter().zip(located) {
        let mut source = NameSource {
            module: frames[0].module.clone(),
            build_id: Some(id.to_string()),
            source: Origin::None,
            path: None,
            addresses: frames.len() as u64,
            named: 0,
            problems,
        };
        if let Some((origin, path)) = found {
            let vaddrs: Vec<u64> = frames.iter().filter_map(|f| f.object.as_ref()?.vaddr).collect();
            match blazesym.symbolize(&Source::Elf(Elf::new(&path)), Input::VirtOffset(&vaddrs)) {
                Ok(results) => {
                    for (frame, result) in frames.iter().zip(&results) {
                        if matches!(result, Symbolized::Sym(_)) {
                            let object = frame.object.clone();
                            named.insert(
                                (*frame).clone(),
                                frames_of(result, &frame.module, frame.address, false, object),
                            );
                            source.named += 1;
                        }
                    }
                    (source.source, source.path) = (origin, Some(path.display().to_string()));
                }
                Err(err) => source
                    .problems
                    .push(format!("{}: {err}, ignored", path.display())),
            }
        }
        // Without a debug file found, these frames' file was named at the run as it could be
        // (from its own symbols, say): what is known here is only of its frames left unnamed,
        // and to say "from no symbols" of the file would misstate it.
        if source.source != Origin::None || !source.problems.is_empty() {
            sources.push(source);
        }
    }
    (named, sources)
}

/// Hex text to bytes; `None` for anything else.
fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || !text.is_ascii() {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_ids_are_read_from_hex_and_nothing_else() {
        assert_eq!(unhex("6c14ff"), Some(vec![0x6c, 0x14, 0xff]));
        for bad in ["6c1", "zz", "6c-1", "é1"] {
            assert_eq!(unhex(bad), None, "{bad}");
        }
    }
}
