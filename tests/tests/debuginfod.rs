//! Names from a debuginfod server (#39), end to end against elfutils' own `debuginfod` (Debian's
//! package; `cargo xtask setup` installs it): the stripped 60/30/10 workload is named from the
//! debug file the server holds, then from bpfprof's cache with the server stopped, and a server
//! that never answers costs a run no more than its bounded wait. Host only: the arm64 guest has
//! no debuginfod. These load BPF: run as root (`cargo xtask test`).
use std::{
    collections::HashMap,
    net::TcpListener,
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use bpfprof_tests::*;

const BURNS: [&str; 3] = ["burn_a", "burn_b", "burn_c"];

/// The build id of an ELF file as binutils reads it (lowercase hex).
fn build_id(path: &Path) -> String {
    let out = Command::new("readelf")
        .arg("-n")
        .arg(path)
        .output()
        .expect("readelf");
    let notes = String::from_utf8_lossy(&out.stdout).into_owned();
    notes
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: "))
        .unwrap_or_else(|| panic!("no build id in {}: {notes}", path.display()))
        .to_string()
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// elfutils' server over `files`, once it serves `id`'s debug info (polled, at most 20 s): the
/// process (killed on drop: only this pid) and its address.
fn start_debuginfod(work: &Path, files: &Path, id: &str) -> (Running, String) {
    let port = free_port().to_string();
    let log = std::fs::File::create(work.join("debuginfod.log")).unwrap();
    let db = work.join("db.sqlite");
    let server = Running::spawn(
        Command::new("debuginfod")
            .args([
                "-F",
                "-p",
                &port,
                "-d",
                db.to_str().unwrap(),
                "-t",
                "0",
                "-g",
                "0",
            ])
            .arg(files)
            .stdout(Stdio::null())
            .stderr(log),
    );
    let address = format!("127.0.0.1:{port}");
    let path = format!("/buildid/{id}/debuginfo");
    let started = Instant::now();
    wait_until(
        &format!("debuginfod serving {path}"),
        Duration::from_secs(20),
        || http_get(&address, &path).is_ok_and(|(status, _)| status == 200),
    );
    println!(
        "debuginfod (pid {}) served {path} after {:?}",
        server.pid(),
        started.elapsed()
    );
    (server, address)
}

/// bpfprof on the stripped workload with this debuginfod URL and cache: its report, the
/// workload's truth, bpfprof's stderr and how long the whole run took.
fn profile(url: &str, cache: &Path, name: &str) -> (Report, HashMap<String, f64>, String, Duration) {
    let json = temp_path(name);
    let stripped = workload("stripme-stripped");
    let started = Instant::now();
    let out = bpfprof()
        .env("DEBUGINFOD_URLS", url)
        .env("BPFPROF_CACHE", cache)
        // A stalled transfer is given up after this (default 10 s, the same as a run's wait at
        // its end, so which bound ended a silent server's fetch was a race): over the wait.
        .env("DEBUGINFOD_TIMEOUT", "30")
        .args(["-F", "997", "-o", json.to_str().unwrap(), "--"])
        .arg(&stripped)
        .args(["split", "2"])
        .output()
        .expect("starting bpfprof");
    let took = started.elapsed();
    assert_no_programs_left();
    assert!(out.status.success(), "bpfprof failed: {}", stderr(&out));
    let report = Report::read(&json);
    report.assert_consistent();
    (report, truth(&stdout(&out)), stderr(&out), took)
}

/// The report's account of where the stripped binary's names came from.
fn naming_of_stripped(report: &Report) -> serde_json::Value {
    let sources = report.0["symbols"].as_array().cloned().unwrap_or_default();
    sources
        .into_iter()
        .find(|s| {
            s["module"]
                .as_str()
                .is_some_and(|m| m.ends_with("stripme-stripped"))
        })
        .unwrap_or_else(|| panic!("no naming for stripme-stripped in {}", report.0["symbols"]))
}

#[test]
fn names_come_from_debuginfod_then_from_its_cache_with_the_server_stopped() {
    let work = temp_path("debuginfod");
    let (files, cache) = (work.join("files"), work.join("cache"));
    std::fs::create_dir_all(&files).unwrap();
    let debug = workload("stripme.debug");
    std::fs::copy(&debug, files.join("stripme.debug")).unwrap();
    let id = build_id(&workload("stripme-stripped"));
    assert_eq!(build_id(&debug), id);
    let (server, address) = start_debuginfod(&work, &files, &id);
    let url = format!("http://{address}");

    let (report, truth, _, took) = profile(&url, &cache, "debuginfod-fetch.json");
    let cached = cache.join("debuginfod").join(&id).join("debuginfo");
    let naming = naming_of_stripped(&report);
    println!("fetched: run took {took:?}; naming {naming}");
    report.assert_self_shares("fetched", truth["pid"] as u32, &truth, &BURNS);
    assert_eq!(naming["source"], "debuginfod");
    assert_eq!(naming["path"], cached.to_str().unwrap());
    assert_eq!(std::fs::read(&cached).unwrap(), std::fs::read(&debug).unwrap());

    drop(server);
    assert!(
        http_get(&address, "/metrics").is_err(),
        "the server still answers"
    );
    let (report, truth, _, took) = profile(&url, &cache, "debuginfod-cached.json");
    let naming = naming_of_stripped(&report);
    println!("cached, server stopped: run took {took:?}; naming {naming}");
    report.assert_self_shares("cached", truth["pid"] as u32, &truth, &BURNS);
    assert_eq!(naming["path"], cached.to_str().unwrap());
}

#[test]
fn a_server_that_never_answers_delays_a_run_by_the_bounded_wait_at_most() {
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", silent.local_addr().unwrap());
    // Connections are taken and held, never answered.
    std::thread::spawn(move || {
        let held: Vec<_> = silent.incoming().collect();
        drop(held);
    });
    let cache = temp_path("debuginfod-silent");
    let (report, truth, errors, took) = profile(&url, &cache, "debuginfod-silent.json");
    let pid = truth["pid"] as u32;
    let named: f64 = BURNS.iter().map(|n| report.self_share(pid, n)).sum();
    println!(
        "silent server: run of a 2 s workload took {took:?}; burn_* named in {:.1}% of samples",
        named * 100.0
    );
    println!("stderr: {errors}");
    // The wait is 10 s; the fetch's own deadline (30 s) would be over 2 + 30 s. The rest is
    // loading and naming, which a busy machine (`cargo xtask test --noise`) slows: 7 s seen.
    assert!(took < Duration::from_secs(2 + 10 + 15), "{took:?}");
    assert!(
        took >= Duration::from_secs(2 + 10),
        "{took:?}: did it wait at all?"
    );
    assert_eq!(named, 0.0);
    assert!(errors.contains("not fetched within"), "{errors}");
}
