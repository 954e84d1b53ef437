//! Hotspot mode: sampled call stacks, one count per sample on CPU, folded into the stack model.
use crate::{
    model::{self, RunMeta, StackReport, Weight},
    profile::RawProfile,
    symbolize::Symbols,
};

/// Fold a symbolized CPU profile into stacks and per-function self/total samples.
pub fn report(meta: RunMeta, raw: &RawProfile, symbols: &Symbols) -> StackReport {
    model::stack_report(meta, raw, symbols, Weight::Samples)
}
