//! The client against tiny HTTP servers of the tests' own (a thread on 127.0.0.1), serving small
//! ELF files whose build ids the test chose (`cc -Wl,--build-id=0x…`): what is kept, refused,
//! remembered and evicted, and how long a server that never answers costs.
use std::{
    io::{Read as _, Write as _},
    net::{TcpListener, TcpStream},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use super::*;

/// What a test server answers to a path.
#[derive(Clone)]
enum Reply {
    Status(u16),
    /// With its Content-Length.
    Body(Vec<u8>),
    /// Without a length: the body ends when the connection closes.
    Unsized(Vec<u8>),
    /// Reads the request, then says nothing (for a minute).
    Silent,
    /// 302 to this path on the same server.
    Redirect(String),
}

struct Server {
    url: String,
    /// The paths asked for, in order.
    asked: Arc<Mutex<Vec<String>>>,
}

impl Server {
    fn asked(&self) -> Vec<String> {
        self.asked.lock().unwrap().clone()
    }
}

fn serve(route: impl Fn(&str) -> Reply + Send + Sync + 'static) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let asked = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&asked);
    let route = Arc::new(route);
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let (log, route) = (Arc::clone(&log), Arc::clone(&route));
            std::thread::spawn(move || answer(stream, &log, &*route));
        }
    });
    Server { url, asked }
}

fn answer(mut stream: TcpStream, log: &Mutex<Vec<String>>, route: &dyn Fn(&str) -> Reply) {
    let mut head = Vec::new();
    let mut byte = [0];
    while !head.ends_with(b"\r\n\r\n") && head.len() < 8192 && stream.read(&mut byte).unwrap_or(0) == 1 {
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head);
    let path = head.split(' ').nth(1).unwrap_or("").to_string();
    log.lock().unwrap().push(path.clone());
    let mut location = String::new();
    let (status, length, body) = match route(&path) {
        Reply::Status(status) => (status, Some(0), Vec::new()),
        Reply::Body(body) => (200, Some(body.len()), body),
        Reply::Unsized(body) => (200, None, body),
        Reply::Silent => return std::thread::sleep(Duration::from_secs(60)),
        Reply::Redirect(to) => {
            location = format!("Location: {to}\r\n");
            (302, Some(0), Vec::new())
        }
    };
    let length = length.map_or(String::new(), |n| format!("Content-Length: {n}\r\n"));
    let head = format!("HTTP/1.1 {status} X\r\n{length}{location}Connection: close\r\n\r\n");
    let _ = stream
        .write_all(head.as_bytes())
        .and_then(|_| stream.write_all(&body));
}

/// A small ELF executable with this build id (hex), built by the C compiler.
fn elf_with_build_id(dir: &Path, hex: &str) -> Vec<u8> {
    let out = dir.join(format!("elf-{hex}"));
    let mut cc = std::process::Command::new("cc")
        .args(["-x", "c", "-", "-o"])
        .arg(&out)
        .arg(format!("-Wl,--build-id=0x{hex}"))
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("cc");
    cc.stdin
        .take()
        .unwrap()
        .write_all(b"int main(void) { return 0; }\n")
        .unwrap();
    assert!(cc.wait().unwrap().success());
    std::fs::read(out).unwrap()
}

fn id(hex: &str) -> Vec<u8> {
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect()
}

fn config(urls: &[&Server], cache: &Path) -> Config {
    Config {
        urls: urls.iter().map(|s| s.url.clone()).collect(),
        cache_dir: cache.to_path_buf(),
        cache_max: 1 << 30,
        max_size: 1 << 30,
        connect_timeout: Duration::from_secs(5),
        stall_timeout: Duration::from_secs(5),
        max_time: Duration::from_secs(10),
        miss_ttl: Duration::from_secs(600),
        roots: None,
    }
}

/// Ask, wait (bounded) for the fetch, ask again: the answer once settled.
fn fetched(client: &Debuginfod, build_id: &[u8]) -> Lookup {
    let first = client.lookup(build_id);
    assert!(client.wait(Duration::from_secs(20)), "still pending after 20 s");
    match first {
        Lookup::Pending => client.lookup(build_id),
        settled => settled,
    }
}

/// What is in the cache directory (partial downloads included), by path relative to it.
fn listing(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        match entry.path().is_dir() {
            true => found.extend(listing(&entry.path()).into_iter().map(|f| format!("{name}/{f}"))),
            false => found.push(name),
        }
    }
    found.sort();
    found
}

const A: &str = "aa00000000000000000000000000000000000001";
const B: &str = "bb00000000000000000000000000000000000002";
const C: &str = "cc00000000000000000000000000000000000003";

#[test]
fn a_file_is_fetched_from_the_first_server_that_has_it_and_cached_under_its_build_id() {
    let work = tempfile::tempdir().unwrap();
    let elf = elf_with_build_id(work.path(), A);
    let none = serve(|_| Reply::Status(404));
    let served = elf.clone();
    let has = serve(move |path| match path == format!("/buildid/{A}/debuginfo") {
        true => Reply::Body(served.clone()),
        false => Reply::Status(404),
    });
    let cache = work.path().join("cache");
    let client = Debuginfod::start(config(&[&none, &has], &cache)).unwrap();
    let want = cache.join(A).join("debuginfo");
    assert_eq!(fetched(&client, &id(A)), Lookup::Ready(want.clone()));
    let stats = client.stats();
    println!(
        "fetched {} bytes ({} served), asked {:?} then {:?}; {stats:?}",
        std::fs::metadata(&want).unwrap().len(),
        elf.len(),
        none.asked(),
        has.asked()
    );
    assert_eq!(std::fs::read(&want).unwrap(), elf);
    assert_eq!(none.asked(), vec![format!("/buildid/{A}/debuginfo")]);
    assert_eq!(has.asked(), none.asked());
    assert_eq!(
        (stats.fetched, stats.bytes, stats.cache_bytes),
        (1, elf.len() as u64, elf.len() as u64)
    );
    assert_eq!(listing(&cache), vec![format!("{A}/debuginfo")]);
    // Asked again, by this client or the next run's: from the cache, no request.
    assert_eq!(client.lookup(&id(A)), Lookup::Ready(want.clone()));
    drop(client);
    let next = Debuginfod::start(config(&[&none, &has], &cache)).unwrap();
    assert_eq!(next.lookup(&id(A)), Lookup::Ready(want));
    assert_eq!(has.asked().len(), 1);
}

#[test]
fn a_build_id_no_server_has_is_missing_and_remembered() {
    let work = tempfile::tempdir().unwrap();
    let none = serve(|_| Reply::Status(404));
    let cache = work.path().join("cache");
    let client = Debuginfod::start(config(&[&none], &cache)).unwrap();
    assert!(matches!(fetched(&client, &id(A)), Lookup::Missing(_)));
    assert!(matches!(client.lookup(&id(A)), Lookup::Missing(_)));
    let stats = client.stats();
    println!("asked {:?}; {stats:?}; cache {:?}", none.asked(), listing(&cache));
    assert_eq!((stats.missed, stats.fetched, stats.failed), (1, 0, 0));
    assert_eq!(none.asked().len(), 1);
    assert_eq!(listing(&cache), vec![format!("{A}/miss")]);
    drop(client);
    // The next run remembers it too, until the miss time has passed.
    let next = Debuginfod::start(config(&[&none], &cache)).unwrap();
    assert!(matches!(next.lookup(&id(A)), Lookup::Missing(_)));
    assert_eq!(none.asked().len(), 1);
    let expired = Debuginfod::start(Config {
        miss_ttl: Duration::ZERO,
        ..config(&[&none], &cache)
    })
    .unwrap();
    assert_eq!(
        expired.lookup(&id(A)),
        Lookup::Pending,
        "asked again once the miss expired"
    );
    assert!(expired.wait(Duration::from_secs(20)));
    assert_eq!((expired.stats().missed, none.asked().len()), (1, 2));
}

/// A download that cannot be kept: nothing cached, no partial file left, `failed` counted.
fn assert_refused(reply: Reply, config_of: impl Fn(&Server, &Path) -> Config) {
    let work = tempfile::tempdir().unwrap();
    let server = serve(move |_| reply.clone());
    let cache = work.path().join("cache");
    let client = Debuginfod::start(config_of(&server, &cache)).unwrap();
    let started = Instant::now();
    assert!(matches!(fetched(&client, &id(A)), Lookup::Missing(_)));
    let stats = client.stats();
    println!(
        "refused in {:?}: {stats:?}; cache {:?}",
        started.elapsed(),
        listing(&cache)
    );
    assert_eq!((stats.failed, stats.fetched, stats.cache_bytes), (1, 0, 0));
    assert!(listing(&cache).is_empty(), "{:?}", listing(&cache));
}

#[test]
fn a_file_with_another_build_id_or_not_elf_is_refused() {
    let work = tempfile::tempdir().unwrap();
    let other = elf_with_build_id(work.path(), B);
    assert_refused(Reply::Body(other), |s, c| config(&[s], c));
    assert_refused(Reply::Body(b"<html>not found</html>".to_vec()), |s, c| {
        config(&[s], c)
    });
}

#[test]
fn a_body_over_the_size_bound_is_refused_with_or_without_a_length() {
    let work = tempfile::tempdir().unwrap();
    let elf = elf_with_build_id(work.path(), A);
    let bound = elf.len() as u64 - 1;
    println!("file of {} bytes, bound {bound}", elf.len());
    let small = |s: &Server, c: &Path| Config {
        max_size: bound,
        ..config(&[s], c)
    };
    assert_refused(Reply::Body(elf.clone()), small);
    assert_refused(Reply::Unsized(elf.clone()), small);
    // The cache's own bound caps a file too.
    assert_refused(Reply::Unsized(elf.clone()), |s, c| Config {
        cache_max: bound,
        ..config(&[s], c)
    });
    // One byte more and the same body is kept: the bound, not something else, refused it.
    let work = tempfile::tempdir().unwrap();
    let server = serve(move |_| Reply::Unsized(elf.clone()));
    let cache = work.path().join("cache");
    let client = Debuginfod::start(Config {
        max_size: bound + 1,
        ..config(&[&server], &cache)
    })
    .unwrap();
    assert!(matches!(fetched(&client, &id(A)), Lookup::Ready(_)));
}

/// How long a fetch from a server that never answers takes to be given up, the lookup's own time.
fn silent_fetch(set: impl Fn(Config) -> Config) -> (Duration, Duration, Stats) {
    let work = tempfile::tempdir().unwrap();
    let silent = serve(|_| Reply::Silent);
    let client = Debuginfod::start(set(config(&[&silent], &work.path().join("cache")))).unwrap();
    let started = Instant::now();
    assert_eq!(client.lookup(&id(A)), Lookup::Pending);
    let lookup = started.elapsed();
    assert!(client.wait(Duration::from_secs(20)));
    let took = started.elapsed();
    assert!(matches!(client.lookup(&id(A)), Lookup::Missing(_)));
    (lookup, took, client.stats())
}

#[test]
fn a_server_that_never_answers_costs_at_most_the_bound_and_never_the_lookup() {
    let second = Duration::from_secs(1);
    let by_deadline = |c| Config {
        max_time: second,
        ..c
    };
    let (lookup, took, stats) = silent_fetch(by_deadline);
    println!("deadline 1 s: lookup {lookup:?}, given up after {took:?}; {stats:?}");
    assert!(took >= second && took < second * 2, "{took:?}");
    assert!(lookup < Duration::from_millis(50), "{lookup:?}");
    assert_eq!(stats.failed, 1);
    let by_stall = |c| Config {
        stall_timeout: second,
        ..c
    };
    let (lookup, took, stats) = silent_fetch(by_stall);
    println!("stall 1 s: lookup {lookup:?}, given up after {took:?}; {stats:?}");
    assert!(took >= second && took < second * 2, "{took:?}");
    // The wait itself is bounded too, whatever the fetch does.
    let work = tempfile::tempdir().unwrap();
    let silent = serve(|_| Reply::Silent);
    let client = Debuginfod::start(config(&[&silent], &work.path().join("cache"))).unwrap();
    let started = Instant::now();
    client.lookup(&id(A));
    assert!(!client.wait(Duration::from_millis(300)));
    let waited = started.elapsed();
    println!(
        "wait(300 ms) on a 10 s fetch returned after {waited:?}, {:?}",
        client.stats()
    );
    assert!(
        waited >= Duration::from_millis(300) && waited < Duration::from_secs(1),
        "{waited:?}"
    );
    assert_eq!(client.stats().pending, 1);
}

#[test]
fn the_cache_stays_within_its_bound_least_recently_used_first() {
    let work = tempfile::tempdir().unwrap();
    let files: HashMap<String, Vec<u8>> = [A, B, C]
        .iter()
        .map(|hex| {
            (
                format!("/buildid/{hex}/debuginfo"),
                elf_with_build_id(work.path(), hex),
            )
        })
        .collect();
    let size = files.values().map(Vec::len).max().unwrap() as u64;
    let served = files.clone();
    let server = serve(move |path| {
        served
            .get(path)
            .map_or(Reply::Status(404), |f| Reply::Body(f.clone()))
    });
    let cache = work.path().join("cache");
    let bound = size * 5 / 2;
    let client = Debuginfod::start(Config {
        cache_max: bound,
        ..config(&[&server], &cache)
    })
    .unwrap();
    let path = |hex: &str| cache.join(hex).join("debuginfo");
    assert_eq!(fetched(&client, &id(A)), Lookup::Ready(path(A)));
    assert_eq!(fetched(&client, &id(B)), Lookup::Ready(path(B)));
    // A is used again (touched), so B is now the least recently used.
    assert_eq!(client.lookup(&id(A)), Lookup::Ready(path(A)));
    assert_eq!(fetched(&client, &id(C)), Lookup::Ready(path(C)));
    let stats = client.stats();
    let on_disk: u64 = [A, B, C]
        .iter()
        .filter_map(|h| std::fs::metadata(path(h)).ok())
        .map(|m| m.len())
        .sum();
    println!(
        "files of {size} bytes, bound {bound}: cache {:?}, {on_disk} bytes on disk; {stats:?}",
        listing(&cache)
    );
    assert_eq!(
        listing(&cache),
        vec![format!("{A}/debuginfo"), format!("{C}/debuginfo")]
    );
    assert_eq!(stats.cache_bytes, on_disk);
    assert!(on_disk <= bound);
    // The evicted file is fetched again when asked for (a fourth request, made by the fetch
    // thread after the lookup: counted once it is over).
    assert_eq!(server.asked().len(), 3);
    assert_eq!(fetched(&client, &id(B)), Lookup::Ready(path(B)));
    assert_eq!(server.asked().len(), 4);
}

type Vars = &'static [(&'static str, &'static str)];

fn vars(pairs: Vars) -> impl Fn(&str) -> Option<String> {
    move |name| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string())
}

fn refused(urls: &[String], pairs: Vars) -> String {
    Config::from_vars(urls, vars(pairs)).unwrap_err().to_string()
}

#[test]
fn the_setup_comes_from_the_flag_or_the_environment() {
    assert!(Config::from_vars(&[], vars(&[])).unwrap().is_none());
    assert!(Config::from_vars(&[], vars(&[("DEBUGINFOD_URLS", "  ")]))
        .unwrap()
        .is_none());
    let env = vars(&[
        ("DEBUGINFOD_URLS", "http://a.example:8002/ http://b.example"),
        ("DEBUGINFOD_TIMEOUT", "7"),
        ("DEBUGINFOD_MAXTIME", "12"),
        ("DEBUGINFOD_MAXSIZE", "1000"),
        ("BPFPROF_CACHE", "/srv/cache"),
    ]);
    let config = Config::from_vars(&[], &env).unwrap().unwrap();
    assert_eq!(config.urls, ["http://a.example:8002", "http://b.example"]);
    assert_eq!(
        (config.stall_timeout, config.max_time),
        (Duration::from_secs(7), Duration::from_secs(12))
    );
    assert_eq!((config.max_size, config.cache_max), (1000, DEFAULT_CACHE_MAX));
    assert_eq!(config.cache_dir, PathBuf::from("/srv/cache/debuginfod"));
    // The flag's URLs replace the variable's.
    let flag = ["http://c.example/".to_string()];
    assert_eq!(
        Config::from_vars(&flag, &env).unwrap().unwrap().urls,
        ["http://c.example"]
    );
    // Unset or 0: bpfprof's own bounds.
    let config = Config::from_vars(&flag, vars(&[("DEBUGINFOD_MAXSIZE", "0")]))
        .unwrap()
        .unwrap();
    assert_eq!(
        (config.max_size, config.max_time),
        (DEFAULT_MAX_SIZE, DEFAULT_MAX_TIME)
    );
    println!("{}", refused(&["ftp://x".into()], &[]));
    assert!(refused(&["ftp://x".into()], &[]).contains("ftp://x: not an http:// or https:// URL"));
    assert!(refused(&flag, &[("DEBUGINFOD_TIMEOUT", "soon")])
        .starts_with("DEBUGINFOD_TIMEOUT=soon: not a whole number"));
    #[cfg(not(feature = "https"))]
    {
        // https from the environment is left out in a build without it; asked for by flag, refused.
        let env = vars(&[("DEBUGINFOD_URLS", "https://debuginfod.debian.net http://local")]);
        assert_eq!(
            Config::from_vars(&[], env).unwrap().unwrap().urls,
            ["http://local"]
        );
        assert!(refused(&["https://x".into()], &[]).contains("built without https"));
    }
}

#[test]
fn odd_build_ids_are_missing_without_a_request() {
    let work = tempfile::tempdir().unwrap();
    let server = serve(|_| Reply::Status(404));
    let client = Debuginfod::start(config(&[&server], work.path())).unwrap();
    assert_eq!(client.lookup(&[]), Lookup::Missing(None), "never asked: for good");
    assert_eq!(client.lookup(&[7; MAX_BUILD_ID + 1]), Lookup::Missing(None));
    assert!(client.wait(Duration::from_secs(1)));
    assert!(server.asked().is_empty());
}

#[path = "trust_tests.rs"]
mod trust;
