//! Push: each window sent from a thread of its own, through a bounded queue, to a
//! Pyroscope-compatible server (`POST /ingest?format=pprof`, the CPU profile as a multipart
//! `profile` field) or to an OTLP/HTTP endpoint (`POST …/v1development/profiles`, every signal's
//! profile in one `ExportProfilesServiceRequest`), or the same request over OTLP/gRPC.
//! A down or slow server costs at most `capacity` windows of memory and never delays a window:
//! attempts time out, failures back off, and the oldest window is dropped when the queue is full.
use std::{
    collections::VecDeque,
    sync::{atomic::Ordering::Relaxed, Arc, Condvar, Mutex},
    thread::JoinHandle,
    time::{Duration, Instant},
};

use bytes::Bytes;

use super::metrics::{Metrics, PushCounters};

/// Attempts per window before it is given up on.
const MAX_ATTEMPTS: u32 = 5;
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(60);
const BOUNDARY: &str = "bpfprof-pprof-upload-7f3a9c";

#[derive(Clone, Debug)]
pub struct PushConfig {
    /// Pyroscope: the server's base URL (`http://host:4040`); OTLP: the export URL.
    pub url: String,
    pub destination: Destination,
    pub capacity: usize,
    pub timeout: Duration,
    /// Headers (auth) sent with every attempt, and the roots for https.
    pub credentials: super::credentials::Credentials,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Destination {
    Pyroscope {
        /// The application name, with labels in braces.
        name: String,
        frequency_hz: u64,
    },
    /// OTLP/HTTP: the URL is the export URL.
    Otlp,
    /// OTLP/gRPC: the URL is `http://host:port`, or `https://` (TLS) with the `https` feature.
    OtlpGrpc,
}

pub struct Upload {
    pub from_unix_s: u64,
    pub until_unix_s: u64,
    /// Pyroscope: the gzipped pprof; OTLP: the encoded export request.
    pub body: Bytes,
}

struct Queue {
    uploads: VecDeque<(Upload, u32)>,
    closed: bool,
}

pub struct Pusher {
    shared: Arc<(Mutex<Queue>, Condvar)>,
    capacity: usize,
    metrics: Arc<Metrics>,
    destination: Destination,
    thread: Option<JoinHandle<()>>,
}

/// The counters of a destination.
fn counters<'a>(metrics: &'a Metrics, destination: &Destination) -> &'a PushCounters {
    match destination {
        Destination::Pyroscope { .. } => &metrics.push,
        Destination::Otlp | Destination::OtlpGrpc => &metrics.otlp,
    }
}

impl Pusher {
    pub fn start(config: PushConfig, metrics: Arc<Metrics>) -> Pusher {
        let shared = Arc::new((
            Mutex::new(Queue {
                uploads: VecDeque::new(),
                closed: false,
            }),
            Condvar::new(),
        ));
        let thread = {
            let (shared, metrics, config) = (shared.clone(), metrics.clone(), config.clone());
            std::thread::Builder::new()
                .name("bpfprof-push".into())
                .spawn(move || push_loop(&config, &shared, &metrics))
                .expect("starting the push thread")
        };
        Pusher {
            shared,
            capacity: config.capacity.max(1),
            metrics,
            destination: config.destination,
            thread: Some(thread),
        }
    }

    /// Queue a window; the oldest waiting one makes room when the queue is full.
    pub fn enqueue(&self, upload: Upload) {
        let (lock, wake) = &*self.shared;
        let mut queue = lock.lock().unwrap_or_else(|e| e.into_inner());
        let counters = counters(&self.metrics, &self.destination);
        if queue.uploads.len() >= self.capacity {
            queue.uploads.pop_front();
            counters.dropped.fetch_add(1, Relaxed);
        }
        queue.uploads.push_back((upload, 0));
        counters.queue.store(queue.uploads.len() as u64, Relaxed);
        wake.notify_all();
    }

    /// Stop: what is queued gets one more attempt each (no back-off) within one timeout's time,
    /// then the thread ends; whatever is left is counted as dropped.
    pub fn finish(mut self) {
        {
            let (lock, wake) = &*self.shared;
            lock.lock().unwrap_or_else(|e| e.into_inner()).closed = true;
            wake.notify_all();
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn push_loop(config: &PushConfig, shared: &(Mutex<Queue>, Condvar), metrics: &Metrics) {
    let metrics = counters(metrics, &config.destination);
    let agent = http_agent(config);
    let grpc = match config.destination {
        Destination::OtlpGrpc => Some(GrpcClient::new(config)),
        _ => None,
    };
    let (lock, wake) = shared;
    let mut backoff = FIRST_BACKOFF;
    let mut closing_deadline: Option<Instant> = None;
    loop {
        let (body, from, until) = {
            let mut queue = lock.lock().unwrap_or_else(|e| e.into_inner());
            while queue.uploads.is_empty() && !queue.closed {
                queue = wake.wait(queue).unwrap_or_else(|e| e.into_inner());
            }
            if queue.closed {
                let deadline = *closing_deadline.get_or_insert_with(|| Instant::now() + config.timeout);
                if queue.uploads.is_empty() || Instant::now() >= deadline {
                    metrics.dropped.fetch_add(queue.uploads.len() as u64, Relaxed);
                    queue.uploads.clear();
                    metrics.queue.store(0, Relaxed);
                    return;
                }
            }
            let (upload, _) = queue.uploads.front().expect("not empty");
            (upload.body.clone(), upload.from_unix_s, upload.until_unix_s)
        };
        let result = send(&agent, grpc.as_ref(), config, &body, from, until);
        let mut queue = lock.lock().unwrap_or_else(|e| e.into_inner());
        // The front may have been dropped for room meanwhile: only the same upload is settled.
        let same = queue
            .uploads
            .front()
            .is_some_and(|(u, _)| u.from_unix_s == from && u.until_unix_s == until);
        match result {
            Ok(()) => {
                metrics.sent.fetch_add(1, Relaxed);
                if same {
                    queue.uploads.pop_front();
                }
                backoff = FIRST_BACKOFF;
            }
            Err(e) => {
                metrics.failures.fetch_add(1, Relaxed);
                log::warn!("pushing a window to {}: {e}", config.url);
                if same {
                    let attempts = {
                        let front = queue.uploads.front_mut().expect("same");
                        front.1 += 1;
                        front.1
                    };
                    if attempts >= MAX_ATTEMPTS || queue.closed {
                        queue.uploads.pop_front();
                        metrics.dropped.fetch_add(1, Relaxed);
                    }
                }
                if !queue.closed {
                    // Woken early only by closing.
                    let (q, _) = wake
                        .wait_timeout_while(queue, backoff, |q| !q.closed)
                        .unwrap_or_else(|e| e.into_inner());
                    queue = q;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
        metrics.queue.store(queue.uploads.len() as u64, Relaxed);
    }
}

/// The HTTP client of a push thread: its timeout, and for https the roots read at start.
fn http_agent(config: &PushConfig) -> ureq::Agent {
    let builder = ureq::Agent::config_builder().timeout_global(Some(config.timeout));
    super::credentials::http_agent(builder, config.credentials.roots.as_ref())
}

/// gRPC's client: an event loop of the push thread's own, and how it connects.
struct GrpcClient {
    runtime: tokio::runtime::Runtime,
    /// Plain (h2c), or TLS for an `https://` URL; why not, if its TLS could not be set up.
    transport: Result<super::grpc::Transport, String>,
}

impl GrpcClient {
    fn new(config: &PushConfig) -> GrpcClient {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("starting the push thread's event loop");
        let transport = match (config.url.starts_with("https://"), &config.credentials.roots) {
            #[cfg(feature = "https")]
            (true, Some(roots)) => super::grpc::tls_transport(roots),
            (true, _) => Err("https without trusted roots".to_string()),
            (false, _) => Ok(super::grpc::Transport::Plain),
        };
        GrpcClient { runtime, transport }
    }

    /// One export, within the push timeout (connection and TLS included).
    fn export(&self, config: &PushConfig, body: Bytes) -> Result<(), String> {
        let transport = self.transport.as_ref().map_err(Clone::clone)?;
        let authority = config
            .url
            .split_once("://")
            .map_or(&*config.url, |(_, rest)| rest);
        let authority = authority.trim_end_matches('/');
        // The timer is made inside the event loop: outside it there is no clock to arm.
        self.runtime
            .block_on(async {
                let export = super::grpc::export(authority, transport, &config.credentials.headers, body);
                tokio::time::timeout(config.timeout, export).await
            })
            .unwrap_or_else(|_| Err(format!("no answer within {:?}", config.timeout)))
    }
}

fn send(
    agent: &ureq::Agent,
    grpc: Option<&GrpcClient>,
    config: &PushConfig,
    body: &Bytes,
    from: u64,
    until: u64,
) -> Result<(), String> {
    let (url, content_type, body) = match &config.destination {
        Destination::Pyroscope { name, frequency_hz } => (
            ingest_url(&config.url, name, *frequency_hz, from, until),
            format!("multipart/form-data; boundary={BOUNDARY}"),
            multipart(body),
        ),
        Destination::Otlp => (
            config.url.clone(),
            "application/x-protobuf".to_string(),
            body.to_vec(),
        ),
        Destination::OtlpGrpc => {
            let grpc = grpc.expect("the push thread starts a gRPC client for gRPC");
            return grpc.export(config, body.clone());
        }
    };
    let mut request = agent.post(&url).header("Content-Type", content_type);
    for (name, value) in &config.credentials.headers {
        request = request.header(name, value);
    }
    request.send(&body[..]).map(|_| ()).map_err(|e| e.to_string())
}

/// `…/ingest?name=…&from=…&until=…&format=pprof`: the name gets the host as a label unless it
/// carries labels of its own.
pub fn ingest_url(base: &str, name: &str, frequency_hz: u64, from: u64, until: u64) -> String {
    let name = match name.contains('{') {
        true => name.to_string(),
        false => format!("{name}{{hostname={}}}", hostname()),
    };
    format!(
        "{}/ingest?name={}&from={from}&until={until}&format=pprof&sampleRate={frequency_hz}&spyName=bpfprof",
        base.trim_end_matches('/'),
        percent_encode(&name),
    )
}

fn multipart(pprof_gz: &[u8]) -> Vec<u8> {
    let mut body = Vec::with_capacity(pprof_gz.len() + 256);
    body.extend_from_slice(
        format!(
            "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"profile\"; filename=\"profile.pprof\"\r\nContent-Type: application/octet-stream\r\n\r\n"
        )
        .as_bytes(),
    );
    body.extend_from_slice(pprof_gz);
    body.extend_from_slice(format!("\r\n--{BOUNDARY}--\r\n").as_bytes());
    body
}

fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

pub fn hostname() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "unknown".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(url: &str, capacity: usize) -> PushConfig {
        PushConfig {
            url: url.into(),
            destination: Destination::Pyroscope {
                name: "app.cpu{env=test}".into(),
                frequency_hz: 19,
            },
            capacity,
            timeout: Duration::from_millis(300),
            credentials: Default::default(),
        }
    }

    #[test]
    fn url_and_body_follow_the_ingest_convention() {
        let url = ingest_url("http://h:4040/", "app.cpu{env=test}", 19, 10, 70);
        assert_eq!(
            url,
            "http://h:4040/ingest?name=app.cpu%7Benv%3Dtest%7D&from=10&until=70&format=pprof&sampleRate=19&spyName=bpfprof"
        );
        assert!(ingest_url("http://h", "bpfprof.cpu", 19, 1, 2).contains("name=bpfprof.cpu%7Bhostname%3D"));
        let body = multipart(b"\x1f\x8bDATA");
        let text = String::from_utf8_lossy(&body);
        assert!(
            text.starts_with(&format!("--{BOUNDARY}\r\n")) && text.ends_with(&format!("--{BOUNDARY}--\r\n"))
        );
        assert!(text.contains("name=\"profile\"") && text.contains("DATA"));
    }

    #[test]
    fn an_unreachable_server_never_grows_the_queue_and_shutdown_is_bounded() {
        // A port nothing listens on: every attempt fails at once.
        let metrics = Arc::new(Metrics::default());
        let pusher = Pusher::start(config("http://127.0.0.1:1", 2), metrics.clone());
        for i in 0..10 {
            pusher.enqueue(Upload {
                from_unix_s: i,
                until_unix_s: i + 1,
                body: Bytes::from_static(b"x"),
            });
            assert!(metrics.push.queue.load(Relaxed) <= 2);
        }
        let started = Instant::now();
        pusher.finish();
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(metrics.push.sent.load(Relaxed), 0);
        assert!(metrics.push.failures.load(Relaxed) >= 1);
        assert_eq!(
            metrics.push.dropped.load(Relaxed),
            10,
            "every window accounted for"
        );
        assert_eq!(metrics.push.queue.load(Relaxed), 0);
    }
}
