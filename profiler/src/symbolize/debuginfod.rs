//! Debug files by build id from debuginfod servers (`DEBUGINFOD_URLS`, or URLs the caller gives):
//! `GET {url}/buildid/{hex}/debuginfo`, servers in order, into bpfprof's own cache. A thread of
//! its own downloads them, so symbolizing never waits on the network: `lookup` answers at once
//! (and starts a fetch), and only a one-shot run `wait`s, for a bounded time, before it names.
//!
//! Bounds: a connect timeout, a stall timeout and a deadline per file, a size limit per file, a
//! total size for the cache (least recently used files go first) and a bounded queue. A file is
//! kept only if it is an ELF file with the build id asked for. Misses are remembered for a while,
//! on disk too, so the next run does not ask again. The default build speaks http only; https
//! needs the `https` feature (`cargo xtask build --https`).
mod cache;
mod http;
#[cfg(test)]
mod tests;

use std::{
    collections::HashMap,
    path::PathBuf,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering::Relaxed},
        mpsc, Arc, Condvar, Mutex, MutexGuard,
    },
    time::{Duration, Instant},
};

use crate::{agent::credentials, error::UserError};

use cache::Cache;

/// Build ids longer than this are not asked for (GNU ld writes 16 or 20 bytes).
const MAX_BUILD_ID: usize = 64;

/// Build ids waiting for the fetch thread; past this, a lookup says `Missing` without asking.
const QUEUE: usize = 256;

/// Build ids whose state is kept; past this, all but those being fetched are forgotten (and
/// found again in the cache on disk).
const STATES: usize = 1 << 16;

/// The longest a time from the environment may be (`DEBUGINFOD_TIMEOUT`, `DEBUGINFOD_MAXTIME`).
const MAX_SECONDS: u64 = 3600;

/// Where a debug file for a build id stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// In the cache, at this path (an ELF file with the build id asked for).
    Ready(PathBuf),
    /// Being fetched: ask again later, or `wait` for it.
    Pending,
    /// No server has it (or none answered), for now: asked again from then on (`None`: never).
    Missing(Option<Instant>),
}

/// How the client is set up: from the environment and the caller's flags (`Config::from_env`).
#[derive(Clone, Debug)]
pub struct Config {
    /// URL prefixes, tried in this order; no trailing `/`.
    pub urls: Vec<String>,
    pub cache_dir: PathBuf,
    /// The cache's total size bound, in bytes.
    pub cache_max: u64,
    /// A file larger than this is refused (`DEBUGINFOD_MAXSIZE`); never more than `cache_max`.
    pub max_size: u64,
    pub connect_timeout: Duration,
    /// A download that receives nothing for this long is given up (`DEBUGINFOD_TIMEOUT`).
    pub stall_timeout: Duration,
    /// One file's whole time, all servers together (`DEBUGINFOD_MAXTIME`).
    pub max_time: Duration,
    /// How long a miss is remembered before the servers are asked again.
    pub miss_ttl: Duration,
    /// Trusted roots for https URLs (read once, at start).
    pub roots: Option<credentials::Roots>,
}

pub const DEFAULT_CACHE_MAX: u64 = 2 << 30;
const DEFAULT_MAX_SIZE: u64 = 1 << 30;
const DEFAULT_CONNECT: Duration = Duration::from_secs(5);
const DEFAULT_STALL: Duration = Duration::from_secs(10);
const DEFAULT_MAX_TIME: Duration = Duration::from_secs(30);
const MISS_TTL: Duration = Duration::from_secs(600);
/// A failure (no answer, a refused file) is remembered for less: the server may be back soon.
const FAILURE_TTL: Duration = Duration::from_secs(60);

impl Config {
    /// The client's setup, or `None` when no server is configured: `urls` (the caller's flag)
    /// if given, else `DEBUGINFOD_URLS` (space-separated). An https URL in a build without
    /// https is an error when given as a flag, and left out with a warning from the variable.
    pub fn from_env(urls: &[String]) -> Result<Option<Config>, UserError> {
        Config::from_vars(urls, |name| std::env::var(name).ok())
    }

    fn from_vars(urls: &[String], var: impl Fn(&str) -> Option<String>) -> Result<Option<Config>, UserError> {
        let urls = match urls.is_empty() {
            false => checked_urls(urls.iter().map(String::as_str), "--debuginfod", true)?,
            true => {
                let listed = var("DEBUGINFOD_URLS").unwrap_or_default();
                checked_urls(listed.split_whitespace(), "DEBUGINFOD_URLS", false)?
            }
        };
        if urls.is_empty() {
            return Ok(None);
        }
        let https: Vec<&str> = urls
            .iter()
            .map(String::as_str)
            .filter(|u| u.starts_with("https://"))
            .collect();
        let roots = credentials::Credentials::read(None, None, None, &https)?.roots;
        let max_size = match seconds_or_bytes(&var, "DEBUGINFOD_MAXSIZE")? {
            Some(0) | None => DEFAULT_MAX_SIZE,
            Some(n) => n,
        };
        let seconds = |name| -> Result<Option<Duration>, UserError> {
            Ok(seconds_or_bytes(&var, name)?
                .filter(|&s| s > 0)
                .map(|s| Duration::from_secs(s.min(MAX_SECONDS))))
        };
        let cache_dir = cache::default_dir(&var).ok_or_else(|| {
            UserError::Usage(
                "debuginfod needs a cache directory and neither BPFPROF_CACHE, XDG_CACHE_HOME nor HOME is set: set BPFPROF_CACHE".into(),
            )
        })?;
        Ok(Some(Config {
            urls,
            cache_dir,
            cache_max: DEFAULT_CACHE_MAX,
            max_size,
            connect_timeout: DEFAULT_CONNECT,
            stall_timeout: seconds("DEBUGINFOD_TIMEOUT")?.unwrap_or(DEFAULT_STALL),
            max_time: seconds("DEBUGINFOD_MAXTIME")?.unwrap_or(DEFAULT_MAX_TIME),
            miss_ttl: MISS_TTL,
            roots,
        }))
    }
}

/// The URLs bpfprof can use, without their trailing `/`. Anything but http(s) is refused when
/// given as a flag (`strict`), and left out with a warning from the variable (which other
/// debuginfod clients read too, with their own kinds of URL).
fn checked_urls<'a>(
    urls: impl Iterator<Item = &'a str>,
    from: &str,
    strict: bool,
) -> Result<Vec<String>, UserError> {
    let mut kept = Vec::new();
    for url in urls {
        let https = url.starts_with("https://");
        if !https && !url.starts_with("http://") {
            let why = format!("{from} {url}: not an http:// or https:// URL");
            if strict {
                return Err(UserError::Usage(format!(
                    "{why}; give the server's URL prefix, e.g. http://debuginfod.example:8002"
                )));
            }
            log::warn!("{why}: left out");
            continue;
        }
        if https && !cfg!(feature = "https") {
            let why = "this bpfprof was built without https (`cargo xtask build --https` adds it)";
            if strict {
                return Err(UserError::Usage(format!("{from} {url}: {why}")));
            }
            log::warn!("{from}: {url} left out: {why}");
            continue;
        }
        kept.push(url.trim_end_matches('/').to_string());
    }
    Ok(kept)
}

/// A whole number from the environment (seconds or bytes), or why it is not one.
fn seconds_or_bytes(var: &impl Fn(&str) -> Option<String>, name: &str) -> Result<Option<u64>, UserError> {
    match var(name) {
        None => Ok(None),
        Some(v) if v.trim().is_empty() => Ok(None),
        Some(v) => {
            v.trim().parse().map(Some).map_err(|_| {
                UserError::Usage(format!("{name}={v}: not a whole number; give one, or unset it"))
            })
        }
    }
}

/// What the client has done: the agent's metrics and a run's wait.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Fetches started (build ids asked of the servers).
    pub started: u64,
    /// Files downloaded and kept.
    pub fetched: u64,
    /// Build ids no server had.
    pub missed: u64,
    /// Downloads that failed: no answer in time, refused, too large, not the file asked for.
    pub failed: u64,
    /// Bytes of the files kept.
    pub bytes: u64,
    /// Bytes in the cache now.
    pub cache_bytes: u64,
    /// Build ids being fetched or waiting to be.
    pub pending: u64,
}

#[derive(Default)]
struct Counters {
    started: AtomicU64,
    fetched: AtomicU64,
    missed: AtomicU64,
    failed: AtomicU64,
    bytes: AtomicU64,
    cache_bytes: AtomicU64,
}

enum State {
    Pending,
    Ready(PathBuf),
    /// Not asked again until then.
    Missing(Instant),
}

/// What the fetch thread and the lookups share.
struct Shared {
    config: Config,
    cache: Cache,
    states: Mutex<HashMap<Vec<u8>, State>>,
    /// Notified whenever a fetch ends.
    done: Condvar,
    counters: Counters,
    stop: AtomicBool,
}

impl Shared {
    fn states(&self) -> MutexGuard<'_, HashMap<Vec<u8>, State>> {
        self.states.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The client: a fetch thread, the state of each build id asked for, and the cache.
pub struct Debuginfod {
    shared: Arc<Shared>,
    queue: mpsc::SyncSender<Vec<u8>>,
}

impl Debuginfod {
    /// The client for `config`, with its cache directory made and its fetch thread started.
    pub fn start(config: Config) -> Result<Debuginfod, UserError> {
        let cache = Cache::open(&config.cache_dir, config.cache_max, config.miss_ttl).map_err(|e| {
            UserError::Usage(format!(
                "debuginfod cache {}: {e}; set BPFPROF_CACHE to a writable directory",
                config.cache_dir.display()
            ))
        })?;
        let (queue, receiver) = mpsc::sync_channel(QUEUE);
        let shared = Arc::new(Shared {
            config,
            cache,
            states: Mutex::new(HashMap::new()),
            done: Condvar::new(),
            counters: Counters::default(),
            stop: AtomicBool::new(false),
        });
        let thread = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("debuginfod".into())
            .spawn(move || run_fetch_thread(&thread, receiver))
            .map_err(|e| UserError::Usage(format!("cannot start the debuginfod thread: {e}")))?;
        Ok(Debuginfod { shared, queue })
    }

    /// The client of a checked setup, if any, to share (a `DebugLocator` holds it).
    pub fn shared(config: Option<&Config>) -> Result<Option<Arc<Debuginfod>>, UserError> {
        Ok(config.cloned().map(Debuginfod::start).transpose()?.map(Arc::new))
    }

    /// Where the debug file of `build_id` stands, at once. Starts a fetch when nothing is known
    /// (or a miss is older than the miss time); a cached file is touched, so it is kept longer.
    pub fn lookup(&self, build_id: &[u8]) -> Lookup {
        if build_id.is_empty() || build_id.len() > MAX_BUILD_ID {
            return Lookup::Missing(None);
        }
        let shared = &self.shared;
        let mut states = shared.states();
        match states.get(build_id) {
            Some(State::Pending) => return Lookup::Pending,
            Some(State::Ready(path)) if cache::touch(path) => return Lookup::Ready(path.clone()),
            Some(&State::Missing(until)) if Instant::now() < until => return Lookup::Missing(Some(until)),
            _ => {}
        }
        let hex = hex(build_id);
        if let Some(path) = shared.cache.ready(&hex) {
            insert_state(&mut states, build_id, State::Ready(path.clone()));
            return Lookup::Ready(path);
        }
        if let Some(until) = shared.cache.missed(&hex) {
            insert_state(&mut states, build_id, State::Missing(until));
            return Lookup::Missing(Some(until));
        }
        match self.queue.try_send(build_id.to_vec()) {
            Ok(()) => {
                shared.counters.started.fetch_add(1, Relaxed);
                insert_state(&mut states, build_id, State::Pending);
                Lookup::Pending
            }
            // A full queue (or no fetch thread): not remembered, so a later lookup asks again.
            Err(_) => Lookup::Missing(Some(Instant::now())),
        }
    }

    /// Wait until no fetch is pending, or `budget` has passed; true if none is left.
    pub fn wait(&self, budget: Duration) -> bool {
        let deadline = later(budget);
        let mut states = self.shared.states();
        loop {
            if !states.values().any(|s| matches!(s, State::Pending)) {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            states = match self.shared.done.wait_timeout(states, left) {
                Ok((guard, _)) => guard,
                Err(e) => e.into_inner().0,
            };
        }
    }

    pub fn stats(&self) -> Stats {
        let c = &self.shared.counters;
        let pending = self
            .shared
            .states()
            .values()
            .filter(|s| matches!(s, State::Pending))
            .count();
        Stats {
            started: c.started.load(Relaxed),
            fetched: c.fetched.load(Relaxed),
            missed: c.missed.load(Relaxed),
            failed: c.failed.load(Relaxed),
            bytes: c.bytes.load(Relaxed),
            cache_bytes: c.cache_bytes.load(Relaxed),
            pending: pending as u64,
        }
    }

    pub fn config(&self) -> &Config {
        &self.shared.config
    }
}

impl Drop for Debuginfod {
    /// The thread ends after the download in flight (bounded by the deadline per file), without
    /// starting the rest; nobody waits for it.
    fn drop(&mut self) {
        self.shared.stop.store(true, Relaxed);
    }
}

/// `Instant::now() + wait`, or an hour from now when that is beyond what an `Instant` holds.
fn later(wait: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(wait)
        .or_else(|| now.checked_add(Duration::from_secs(MAX_SECONDS)))
        .unwrap_or(now)
}

/// A build id's new state; when the map is full, all but the pending are forgotten first.
fn insert_state(states: &mut HashMap<Vec<u8>, State>, build_id: &[u8], state: State) {
    if states.len() >= STATES && !states.contains_key(build_id) {
        states.retain(|_, s| matches!(s, State::Pending));
    }
    states.insert(build_id.to_vec(), state);
}

/// The fetch thread; whatever ends it (a panic included), no build id is left pending, and the
/// lookups after it find no thread to ask (so say missing, to be asked again).
fn run_fetch_thread(shared: &Shared, queue: mpsc::Receiver<Vec<u8>>) {
    let ended = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| fetch_thread(shared, queue)));
    if ended.is_err() {
        log::warn!("debuginfod: the fetch thread failed; no more debug files are fetched");
    }
    let retry = later(FAILURE_TTL);
    for state in shared.states().values_mut() {
        if matches!(state, State::Pending) {
            *state = State::Missing(retry);
        }
    }
    shared.done.notify_all();
}

fn fetch_thread(shared: &Shared, queue: mpsc::Receiver<Vec<u8>>) {
    let agent = http::agent(&shared.config);
    shared
        .counters
        .cache_bytes
        .store(shared.cache.trim(None), Relaxed);
    for build_id in queue {
        if shared.stop.load(Relaxed) {
            break;
        }
        let hex = hex(&build_id);
        let state = match http::fetch(&agent, &shared.config, &shared.cache, &build_id, &hex) {
            Ok((path, bytes)) => {
                shared.counters.fetched.fetch_add(1, Relaxed);
                shared.counters.bytes.fetch_add(bytes, Relaxed);
                State::Ready(path)
            }
            Err(http::Failure::NotFound) => {
                shared.counters.missed.fetch_add(1, Relaxed);
                shared.cache.remember_miss(&hex);
                State::Missing(later(shared.config.miss_ttl))
            }
            Err(http::Failure::Error(why)) => {
                log::warn!("debuginfod: no debug file for build id {hex}: {why}");
                shared.counters.failed.fetch_add(1, Relaxed);
                State::Missing(later(shared.config.miss_ttl.min(FAILURE_TTL)))
            }
        };
        // Misses leave files too: the cache is brought within its bounds after every fetch.
        let keep = match &state {
            State::Ready(path) => Some(path.as_path()),
            _ => None,
        };
        shared
            .counters
            .cache_bytes
            .store(shared.cache.trim(keep), Relaxed);
        insert_state(&mut shared.states(), &build_id, state);
        shared.done.notify_all();
    }
}

/// A build id as debuginfod names it: lowercase hex.
pub fn hex(bytes: &[u8]) -> String {
    super::lower_hex(bytes)
}
