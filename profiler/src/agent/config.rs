//! The agent's settings, from its command line: checked whole before anything is loaded.
use std::{net::SocketAddr, time::Duration};

use super::{
    credentials::{self, Credentials},
    push::{Destination, PushConfig},
};
use crate::{
    cli::{AgentArgs, LockSource, OffCpuStacks, OtlpProtocol, Signal, Signals, Unwind},
    counters::language::{Catalog, Event},
    error::UserError,
    preflight,
    sources::{self, locks, samples, sched, Kind, Spec},
    start::Recipe,
};

/// What the `counters` signal reads at each sample (perf's generic names: every PMU maps them).
pub const COUNTERS: [&str; 2] = ["cycles", "instructions"];

pub struct Config {
    pub frequency_hz: u64,
    pub window: Duration,
    pub listen: Option<SocketAddr>,
    pub push: Option<PushConfig>,
    pub otlp: Option<PushConfig>,
    pub unwind: Unwind,
    pub signals: Signals,
    /// Off-CPU stacks for one sleep in this many, past each thread's first ones of a second.
    pub offcpu_sample: u32,
    pub sample_map_entries: Option<u32>,
    pub debug_dirs: Vec<std::path::PathBuf>,
    /// `--debuginfod` or `DEBUGINFOD_URLS`: where debug files are fetched from by build id.
    pub debuginfod: Option<crate::symbolize::debuginfod::Config>,
}

impl Config {
    /// What the agent collects: the source of each signal (`sources::SIGNAL_SOURCES`), set for
    /// a machine profiled all the time (the CPU clock, no slow waits, off-CPU stacks only for
    /// the off-CPU signal, lock records drained as they end).
    pub fn recipe(&self) -> Recipe {
        let signals: Vec<Signal> = Signal::ALL.into_iter().filter(|s| self.signals.has(*s)).collect();
        let specs = sources::of_signals(&signals)
            .into_iter()
            .filter_map(|kind| match kind {
                Kind::CpuSamples => Some(Spec::CpuSamples(samples::Spec {
                    events: vec![Catalog::here()
                        .parse("cpu-clock")
                        .expect("cpu-clock is always known")],
                    rate: samples::Rate::Frequency(self.frequency_hz),
                    counters: self.counter_events(),
                    group: true,
                    weight: None,
                    filters: Vec::new(),
                })),
                Kind::Sched => Some(Spec::Sched(sched::Spec::for_profiles(
                    match self.signals.offcpu {
                        true => OffCpuStacks::Auto,
                        false => OffCpuStacks::None,
                    },
                    self.offcpu_sample,
                ))),
                Kind::Locks => Some(Spec::Locks(locks::Spec::new(
                    LockSource::Futex,
                    locks::Reading::Drained,
                ))),
                Kind::Counting
                | Kind::Stat
                | Kind::Values
                | Kind::Syscalls
                | Kind::Latency
                | Kind::Records
                | Kind::Timeline => None,
            })
            .collect();
        Recipe {
            specs,
            unwind_tables: self.unwind == Unwind::Tables,
            sample_map_entries: self.sample_map_entries,
        }
    }

    /// The counters read at each sample: the `counters` signal's cycles and instructions,
    /// read together (one group per CPU), so their ratio is each stack's IPC.
    pub fn counter_events(&self) -> Vec<Event> {
        match self.signals.counters {
            true => COUNTERS
                .iter()
                .map(|name| {
                    Catalog::here()
                        .parse(name)
                        .expect("generic events are always known")
                })
                .collect(),
            false => Vec::new(),
        }
    }

    pub(super) fn from_args(args: &AgentArgs) -> Result<Config, UserError> {
        preflight::check_frequency(args.frequency)?;
        if let Some(reason) = args
            .signals
            .counters
            .then(crate::counters::pmu::missing_reason)
            .flatten()
        {
            return Err(UserError::NoPmuForCounters(reason));
        }
        if args.window < 1.0 {
            return Err(UserError::Usage("--window: at least 1 second".into()));
        }
        let listen = match args.listen.as_str() {
            "off" | "none" => None,
            address => Some(address.parse().map_err(|_| UserError::Listen {
                address: address.into(),
                reason: "not an address (e.g. 127.0.0.1:7071, or [::1]:7071)".into(),
            })?),
        };
        // The URLs first: a wrong one is said with its flag, before any credential file is read.
        if let Some(url) = &args.push {
            credentials::check_scheme("--push", url)?;
        }
        let otlp = args
            .otlp
            .as_deref()
            .map(|url| otlp_destination(url, args.otlp_protocol))
            .transpose()?;
        let urls: Vec<&str> = args.push.iter().chain(&args.otlp).map(String::as_str).collect();
        let credentials = Credentials::read(
            args.push_header_file.as_deref(),
            args.push_basic_auth_file.as_deref(),
            args.push_ca.as_deref(),
            &urls,
        )?;
        let to = |url: String, destination| PushConfig {
            url,
            destination,
            capacity: args.push_queue.max(1),
            timeout: Duration::from_secs_f64(args.push_timeout),
            credentials: credentials.clone(),
        };
        let push = args.push.as_ref().map(|url| {
            let destination = Destination::Pyroscope {
                name: args.push_name.clone(),
                frequency_hz: args.frequency,
            };
            to(url.clone(), destination)
        });
        let otlp = otlp.map(|(url, destination)| to(url, destination));
        Ok(Config {
            frequency_hz: args.frequency,
            window: Duration::from_secs_f64(args.window),
            listen,
            push,
            otlp,
            unwind: args.unwind,
            signals: args.signals,
            offcpu_sample: args.offcpu_sample,
            sample_map_entries: args.sample_map_entries,
            debug_dirs: args.names.checked_dirs()?,
            debuginfod: args.names.debuginfod()?,
        })
    }
}

/// Where and how `--otlp` exports: OTLP/HTTP to the export URL (`/v1development/profiles` added
/// to a URL without a path), or OTLP/gRPC to `http://host:port` (by `protocol`, else by the port:
/// 4317 is gRPC's).
fn otlp_destination(url: &str, protocol: Option<OtlpProtocol>) -> Result<(String, Destination), UserError> {
    let usage = |why: &str| UserError::Usage(format!("--otlp {url}: {why}"));
    let (scheme, rest) = url
        .split_once("://")
        .filter(|(scheme, _)| ["http", "https"].contains(scheme))
        .ok_or_else(|| usage("give the http:// URL of an OTLP endpoint (e.g. http://collector:4318 for HTTP, :4317 for gRPC)"))?;
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    let path = path.trim_end_matches('/');
    let grpc = protocol.map_or(authority.ends_with(":4317"), |p| p == OtlpProtocol::Grpc);
    credentials::check_scheme("--otlp", url)?;
    match (grpc, path) {
        (true, "") => Ok((format!("{scheme}://{authority}"), Destination::OtlpGrpc)),
        (true, _) => Err(usage(
            "OTLP/gRPC takes no path: give http://host:port (or https://)",
        )),
        (false, "") => Ok((
            format!("{scheme}://{authority}/v1development/profiles"),
            Destination::Otlp,
        )),
        (false, _) => Ok((url.to_string(), Destination::Otlp)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn otlp_speaks_grpc_on_its_port_or_when_told_and_http_otherwise() {
        let to = |url: &str, protocol| otlp_destination(url, protocol).map_err(|e| e.to_string());
        assert_eq!(
            to("http://c:4318", None),
            Ok(("http://c:4318/v1development/profiles".into(), Destination::Otlp))
        );
        assert_eq!(
            to("http://c:4318/custom/", None),
            Ok(("http://c:4318/custom/".into(), Destination::Otlp))
        );
        assert_eq!(
            to("http://c:4317/", None),
            Ok(("http://c:4317".into(), Destination::OtlpGrpc))
        );
        assert_eq!(
            to("http://c:9000", Some(OtlpProtocol::Grpc)),
            Ok(("http://c:9000".into(), Destination::OtlpGrpc))
        );
        assert_eq!(
            to("http://c:4317", Some(OtlpProtocol::Http)),
            Ok(("http://c:4317/v1development/profiles".into(), Destination::Otlp))
        );
        assert!(to("http://c:4317/v1/x", None)
            .unwrap_err()
            .contains("takes no path"));
        assert!(to("ftp://c:4318", None).unwrap_err().contains("http://"));
        match cfg!(feature = "https") {
            true => {
                assert_eq!(
                    to("https://c", None),
                    Ok(("https://c/v1development/profiles".into(), Destination::Otlp))
                );
                assert_eq!(
                    to("https://c:4317", None),
                    Ok(("https://c:4317".into(), Destination::OtlpGrpc))
                );
            }
            false => {
                assert!(to("https://c", None).unwrap_err().contains("--features https"));
                assert!(to("https://c:4317", None)
                    .unwrap_err()
                    .contains("--features https"));
            }
        }
    }
}
