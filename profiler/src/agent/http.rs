//! Pull: the endpoint fleet profilers scrape. `/debug/pprof/profile?seconds=N` is the convention
//! Parca and Pyroscope scrape and `go tool pprof` fetches (CPU, N seconds from now, all
//! processes); `/debug/pprof/offcpu?seconds=N` the same for time off the CPU, and
//! `/debug/pprof/mutex?seconds=N` for lock waits (as Go's mutex profile, which its clients read);
//! `/debug/pprof/latest?signal=S` the last finished window's profile of a signal; `/metrics` the
//! agent's own health and the run-queue histogram; `/healthz`; `/debug/unwind` which files hold
//! rows of the kernel's unwind table array.
use std::{convert::Infallible, sync::Arc, time::Duration};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{body::Incoming, server::conn::http1, service::service_fn, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::{mpsc, oneshot, Notify, Semaphore};

use super::{
    metrics::{Metrics, OwnUsage},
    render::Latest,
    Signal,
};
use crate::cli::Signals;
use crate::unwind::FileWithRows;
use std::sync::atomic::Ordering::Relaxed;

/// Profiles no longer than this are served (a scrape is a window, not a recording).
pub const MAX_SECONDS: u64 = 300;
/// Go's default for `/debug/pprof/profile`.
const DEFAULT_SECONDS: u64 = 30;
/// Connections served at once; more wait in the kernel's backlog.
const MAX_CONNECTIONS: usize = 16;

/// A request for a profile of the next `seconds`, answered by the agent's loop.
pub struct PullRequest {
    pub signal: Signal,
    pub seconds: u64,
    pub reply: oneshot::Sender<Result<Bytes, String>>,
}

pub struct Endpoint {
    pub pulls: mpsc::Sender<PullRequest>,
    /// Wakes the agent's loop to start a pull at once, not at its next regular drain: the pull
    /// then holds the samples of exactly the seconds asked for.
    pub wake: Arc<Notify>,
    pub latest: Latest,
    pub metrics: Arc<Metrics>,
    /// The files holding unwind rows as of the last window's end (none: tables are off).
    pub unwind_files: Arc<std::sync::Mutex<Option<Vec<FileWithRows>>>>,
    /// The window length: `/healthz` fails when no window ended for twice that.
    pub window: Duration,
    /// What the agent profiles: the others are not served.
    pub signals: Signals,
}

impl Endpoint {
    /// The agent was started with this signal.
    fn serves(&self, signal: Signal) -> bool {
        self.signals.has(signal)
    }
}

pub async fn serve(listener: tokio::net::TcpListener, endpoint: Arc<Endpoint>) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of descriptors, for one: wait rather than spin.
                log::warn!("endpoint: accepting a connection: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let endpoint = endpoint.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request| handle(request, endpoint.clone()));
            let _ = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_secs(10))
                .keep_alive(false)
                .serve_connection(TokioIo::new(stream), service)
                .await;
            drop(permit);
        });
    }
}

fn reply(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("Content-Type", content_type)
        .body(Full::new(body.into()))
        .expect("a valid response")
}

fn text(status: StatusCode, body: impl Into<String>) -> Response<Full<Bytes>> {
    reply(status, "text/plain; charset=utf-8", body.into())
}

fn pprof(body: Bytes) -> Response<Full<Bytes>> {
    let mut response = reply(StatusCode::OK, "application/octet-stream", body);
    response.headers_mut().insert(
        "Content-Disposition",
        "attachment; filename=\"profile.pb.gz\""
            .parse()
            .expect("a valid header"),
    );
    response
}

async fn handle(
    request: Request<Incoming>,
    endpoint: Arc<Endpoint>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    if request.method() != hyper::Method::GET {
        return Ok(text(StatusCode::METHOD_NOT_ALLOWED, "GET only\n"));
    }
    let query = request.uri().query();
    let response = match request.uri().path() {
        "/" => text(
            StatusCode::OK,
            "bpfprof agent\n/debug/pprof/profile?seconds=N  CPU profile of the next N seconds (pprof)\n/debug/pprof/offcpu?seconds=N  off-CPU time of the next N seconds (pprof, ns by stack)\n/debug/pprof/mutex?seconds=N  futex waits ending in the next N seconds (pprof, Go's mutex profile: contentions, delay by stack and lock)\n/debug/pprof/counters?seconds=N  on-CPU stacks of the next N seconds weighted by cycles and instructions (pprof)\n/debug/pprof/latest?signal=cpu|offcpu|runqueue|lock|counters  the last window (pprof)\n/metrics  agent health and run-queue delay (Prometheus)\n/healthz\n/debug/unwind  files holding unwind table rows\n",
        ),
        "/debug/pprof/profile" => pull(&endpoint, Signal::Cpu, query).await,
        "/debug/pprof/offcpu" => pull(&endpoint, Signal::OffCpu, query).await,
        "/debug/pprof/mutex" => pull(&endpoint, Signal::Lock, query).await,
        "/debug/pprof/counters" => pull(&endpoint, Signal::Counters, query).await,
        "/debug/pprof/latest" => {
            let signal = match parameter(query, "signal") {
                None => Some(Signal::Cpu),
                Some(name) => Signal::parse(name),
            };
            let latest = endpoint.latest.lock().unwrap_or_else(|e| e.into_inner());
            match signal {
                None => text(StatusCode::BAD_REQUEST, "signal: give cpu, offcpu, runqueue, lock or counters\n"),
                Some(signal) if !endpoint.serves(signal) => {
                    off(signal)
                }
                Some(signal) => match latest.get(&signal) {
                    Some(bytes) => pprof(bytes.clone()),
                    None => text(StatusCode::NOT_FOUND, "no window has ended yet\n"),
                },
            }
        }
        "/metrics" => reply(
            StatusCode::OK,
            "text/plain; version=0.0.4",
            endpoint.metrics.render(OwnUsage::read()),
        ),
        "/debug/unwind" => text(
            StatusCode::OK,
            unwind_listing(endpoint.unwind_files.lock().unwrap_or_else(|e| e.into_inner()).as_deref()),
        ),
        "/healthz" => {
            let metrics = &endpoint.metrics;
            let last = metrics.last_window_unix_s.load(Relaxed);
            let now = super::unix_ms(std::time::SystemTime::now()) / 1000;
            let young = metrics.started.elapsed() < endpoint.window * 2;
            match young || now.saturating_sub(last) <= (endpoint.window * 2).as_secs().max(2) {
                true => text(StatusCode::OK, "ok\n"),
                false => text(StatusCode::SERVICE_UNAVAILABLE, "no window ended for two window lengths\n"),
            }
        }
        _ => text(StatusCode::NOT_FOUND, "not found: try /\n"),
    };
    Ok(response)
}

/// A signal the agent was not started with.
fn off(signal: Signal) -> Response<Full<Bytes>> {
    text(
        StatusCode::NOT_FOUND,
        format!(
            "the agent does not profile {0}: start it with --signals including {0}\n",
            signal.name()
        ),
    )
}

async fn pull(endpoint: &Endpoint, signal: Signal, query: Option<&str>) -> Response<Full<Bytes>> {
    if !endpoint.serves(signal) {
        return off(signal);
    }
    let seconds = match seconds(query) {
        Ok(seconds) => seconds,
        Err(message) => return text(StatusCode::BAD_REQUEST, message),
    };
    let (reply, answer) = oneshot::channel();
    if endpoint
        .pulls
        .try_send(PullRequest {
            signal,
            seconds,
            reply,
        })
        .is_err()
    {
        endpoint.metrics.pulls_refused.fetch_add(1, Relaxed);
        return text(
            StatusCode::SERVICE_UNAVAILABLE,
            "too many profiles being taken at once: retry later\n",
        );
    }
    endpoint.wake.notify_one();
    match answer.await {
        Ok(Ok(bytes)) => {
            endpoint.metrics.pulls_served.fetch_add(1, Relaxed);
            pprof(bytes)
        }
        Ok(Err(message)) => text(StatusCode::SERVICE_UNAVAILABLE, message + "\n"),
        Err(_) => text(StatusCode::SERVICE_UNAVAILABLE, "the agent is stopping\n"),
    }
}

/// One line per file holding rows of the unwind array (tab-separated, most rows first), so an
/// operator can see which binaries fill it; as of the last window's end.
fn unwind_listing(files: Option<&[FileWithRows]>) -> String {
    let Some(files) = files else {
        return "unwind tables are off (--unwind fp): stacks are walked by frame pointers\n".into();
    };
    let rows: u64 = files.iter().map(|f| u64::from(f.rows)).sum();
    let mut page = format!(
        "# {} files hold {rows} of {} unwind rows (as of the last window's end)\n# rows\tprocesses\tdevice\tinode\tpath\n",
        files.len(),
        profiler_common::unwind::ROWS
    );
    for f in files {
        // (The device as `/proc/PID/maps` writes it.)
        let (major, minor) = (libc::major(f.device), libc::minor(f.device));
        page += &format!(
            "{}\t{}\t{major:02x}:{minor:02x}\t{}\t{}\n",
            f.rows, f.processes, f.inode, f.path
        );
    }
    page
}

/// The value of `name=` in a query string.
fn parameter<'a>(query: Option<&'a str>, name: &str) -> Option<&'a str> {
    query
        .unwrap_or("")
        .split('&')
        .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))
}

/// `seconds=N` from a query string: 1 to `MAX_SECONDS`, 30 when absent.
fn seconds(query: Option<&str>) -> Result<u64, String> {
    let Some(value) = parameter(query, "seconds") else {
        return Ok(DEFAULT_SECONDS);
    };
    match value.parse::<u64>() {
        Ok(n) if (1..=MAX_SECONDS).contains(&n) => Ok(n),
        _ => Err(format!(
            "seconds={value}: give a whole number from 1 to {MAX_SECONDS}\n"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_parameter() {
        assert_eq!(seconds(None), Ok(30));
        assert_eq!(seconds(Some("debug=1&seconds=5")), Ok(5));
        assert!(seconds(Some("seconds=0")).is_err());
        assert!(seconds(Some("seconds=301")).is_err());
        assert!(seconds(Some("seconds=abc")).is_err());
    }

    #[test]
    fn unwind_listing_has_a_line_per_file() {
        let files = [FileWithRows {
            device: libc::makedev(0xfe, 1),
            inode: 42,
            path: "/usr/bin/app".into(),
            rows: 68,
            processes: 2,
        }];
        let page = unwind_listing(Some(&files));
        assert!(page.starts_with("# 1 files hold 68 of "), "{page}");
        assert!(page.ends_with("\n68\t2\tfe:01\t42\t/usr/bin/app\n"), "{page}");
        assert!(unwind_listing(None).contains("--unwind fp"));
    }
}
