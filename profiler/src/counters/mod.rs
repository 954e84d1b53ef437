//! Hardware and software counters: what the CPU is and which topdown method it has (`cpu`), the
//! PMUs and events the kernel exposes (`pmu`, `events`), counting them over a run (`counting`)
//! and the topdown analysis of their totals (`tma`), also from `perf stat` output (`perf_csv`);
//! perf's event language (`language`), tracepoints, user probes and USDT probes among its
//! events (`tracepoint`, `probe`, `usdt`), source lines as probe sites (`lines`), what is read
//! (`fetch`) and judged (`filter`) at their hits; probes counted in whatever the targets start
//! are defined in tracefs for the run (`defined`).
pub mod counting;
pub mod cpu;
pub mod defined;
pub mod events;
pub mod fetch;
pub mod filter;
pub mod language;
pub mod lines;
pub mod names;
pub mod perf_csv;
pub mod pmu;
pub mod probe;
pub mod tma;
pub mod tracepoint;
pub mod usdt;
