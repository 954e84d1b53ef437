//! bpfprof: an eBPF profiler. The data path is the architecture:
//! kernel maps → `collect` → `profile` (aggregate) → `symbolize` → `modes::*` (fold) → `report`.
pub mod agent;
pub mod bpf;
pub mod btf;
pub mod cli;
pub mod collect;
pub mod counting;
pub mod cpu;
pub mod error;
pub mod events;
pub mod launcher;
pub mod modes;
pub mod output;
pub mod pmu;
pub mod preflight;
pub mod process;
pub mod profile;
pub mod report;
pub mod session;
pub mod symbolize;
pub mod tma;
pub mod unwind;
pub mod views;

pub use session::run;
