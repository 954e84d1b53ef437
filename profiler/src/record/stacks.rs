//! `record -g` and `trace --duration-min`: each hit's or call's stacks named as the sampling
//! reports name theirs. The addresses of a
//! drain's records are resolved against their processes' memory maps now (a process may exit or
//! map other files later) and symbolized in one batch by one long-lived `Symbolizer`; a frame
//! that cannot be named keeps its module and address, and a stack the kernel could not read is
//! a marker frame that says so.
use serde::{Deserialize, Serialize};

use crate::{
    model::frames_of,
    process::{Processes, UserAddr},
    profile::{RawProfile, RawSample, StackKey},
    sources::records::Stacks,
    symbolize::{DebugLocator, Frame, Symbolizer},
};

/// One frame of a recorded hit's stack.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct StackFrame {
    /// The instruction looked up (a caller's return address moved back into its call).
    pub address: String,
    pub function: String,
    pub module: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<u32>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub kernel: bool,
    /// Inlined into the frame after it (its caller), at the same address.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub inlined: bool,
}

/// Names the stacks of each drain's records.
pub struct StackNamer {
    symbolizer: Symbolizer,
    /// User stacks none of whose frames could be placed in a file of their process: it exited
    /// before its memory map was read.
    pub unplaced: u64,
}

impl Default for StackNamer {
    fn default() -> Self {
        Self {
            symbolizer: Symbolizer::long_lived(DebugLocator::default()),
            unplaced: 0,
        }
    }
}

impl StackNamer {
    /// Each stack's frames, leaf first (none where there is none), given with its process.
    pub fn name<'s>(
        &mut self,
        stacks: impl IntoIterator<Item = (u32, Option<&'s Stacks>)>,
        procs: &mut Processes,
    ) -> Vec<Option<Vec<StackFrame>>> {
        let mut placed = PlacedStacks::default();
        let keys: Vec<Option<StackKey>> = (stacks.into_iter())
            .map(|(pid, stacks)| {
                let key = placed.place(pid, stacks?, procs);
                let in_file = |a: &UserAddr| !matches!(a, UserAddr::Unmapped { .. });
                self.unplaced += u64::from(!key.user.is_empty() && !key.user.iter().any(in_file));
                Some(key)
            })
            .collect();
        let named = placed.named(&self.symbolizer, procs);
        keys.into_iter().map(|key| key.map(|key| named(&key))).collect()
    }
}

/// Stacks placed in their processes' files as they come, each while its process's memory map is
/// still the one it was taken under (a pid reused, a library replaced, would name it wrongly
/// later), to be named together at the end (`trace` and `latency --duration-min`).
#[derive(Clone, Debug, Default)]
pub struct PlacedStacks {
    profile: RawProfile,
}

impl PlacedStacks {
    /// The stack's key: each user address as a file and offset of the process `pid`.
    pub fn place(&mut self, pid: u32, stacks: &Stacks, procs: &mut Processes) -> StackKey {
        let generation = stacks.exec_generation;
        procs.cover_stack(pid, generation, stacks.user.frames());
        let sample = RawSample {
            pid,
            tid: 0,
            comm: String::new(),
            user: stacks.user.clone(),
            kernel: stacks.kernel.clone(),
            count: 1,
            exec_generation: generation,
            event: 0,
            deltas: Default::default(),
            user_objects: Vec::new(),
        };
        let key = self.profile.key(sample, procs);
        *self.profile.stacks.entry(key.clone()).or_default() += 1;
        key
    }

    /// Every placed stack symbolized in one batch: a key's frames, leaf first.
    pub fn named(&self, symbolizer: &Symbolizer, procs: &Processes) -> impl Fn(&StackKey) -> Vec<StackFrame> {
        let symbols = match self.profile.stacks.is_empty() {
            true => Default::default(),
            false => symbolizer.symbolize(&self.profile, procs),
        };
        move |key| {
            frames_of(key, &symbols)
                .iter()
                .rev()
                .map(StackFrame::from)
                .collect()
        }
    }
}

impl From<&Frame> for StackFrame {
    fn from(frame: &Frame) -> Self {
        Self {
            address: format!("{:#x}", frame.address),
            function: frame.function.clone(),
            module: frame.module.clone(),
            file: frame.file.clone(),
            line: frame.line,
            kernel: frame.kernel,
            inlined: frame.inlined,
        }
    }
}
