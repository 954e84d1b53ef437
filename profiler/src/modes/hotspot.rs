//! Hotspot mode: sampled call stacks, one count per sample on CPU, folded into the stack model;
//! with several sampling events, one report per event.
use std::path::{Path, PathBuf};

use crate::{
    model::{self, RunMeta, StackReport, Weight},
    profile::RawProfile,
    symbolize::Symbols,
};

/// Fold a symbolized CPU profile into stacks and per-function self/total samples.
pub fn report(meta: RunMeta, raw: &RawProfile, symbols: &Symbols) -> StackReport {
    model::stack_report(meta, raw, symbols, Weight::Samples)
}

/// The samples event `index` of the run's `-e` list took (with the run's health).
pub fn of_event(raw: &RawProfile, index: u16) -> RawProfile {
    let mine = |key: &&crate::profile::StackKey| key.event == index;
    RawProfile {
        stacks: (raw.stacks.iter())
            .filter(|(key, _)| mine(key))
            .map(|(key, count)| (key.clone(), *count))
            .collect(),
        counters: (raw.counters.iter())
            .filter(|(key, _)| mine(key))
            .map(|(key, deltas)| (key.clone(), *deltas))
            .collect(),
        health: raw.health.clone(),
    }
}

/// Where one event's report goes when a run samples several: the file asked for with the event
/// in its name before the extension (`p.json` → `p.cycles.json`, `p.pb.gz` → `p.cycles.pb.gz`).
pub fn event_path(path: &Path, event: &str) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tag: String = event
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let tag = tag.trim_matches('_');
    let named = match name.split_once('.') {
        Some((stem, extension)) => format!("{stem}.{tag}.{extension}"),
        None => format!("{name}.{tag}"),
    };
    path.with_file_name(named)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_events_file_carries_its_name_before_the_extension() {
        let at = |p: &str, e: &str| event_path(Path::new(p), e).display().to_string();
        assert_eq!(at("/tmp/p.json", "cycles"), "/tmp/p.cycles.json");
        assert_eq!(at("p.pb.gz", "instructions:u"), "p.instructions_u.pb.gz");
        assert_eq!(
            at("out/p", "armv8_pmuv3/event=0x8/"),
            "out/p.armv8_pmuv3_event_0x8"
        );
    }
}
