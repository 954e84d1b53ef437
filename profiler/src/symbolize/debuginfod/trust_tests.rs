//! What the client trusts and what it refuses: the environment's odd values, redirects, a cache
//! directory others may write, symlinks in the cache, a fetch thread gone, the state map's bound.
use std::os::unix::fs::{symlink, PermissionsExt as _};

use super::*;

#[test]
fn huge_times_from_the_environment_are_bounded() {
    let env = vars(&[
        ("DEBUGINFOD_URLS", "http://a.example"),
        ("DEBUGINFOD_TIMEOUT", "18446744073709551615"),
        ("DEBUGINFOD_MAXTIME", "99999999999"),
        ("BPFPROF_CACHE", "/srv/cache"),
    ]);
    let config = Config::from_vars(&[], env).unwrap().unwrap();
    println!("{:?} {:?}", config.stall_timeout, config.max_time);
    let hour = Duration::from_secs(3600);
    assert_eq!((config.stall_timeout, config.max_time), (hour, hour));
}

#[test]
fn a_deadline_beyond_what_an_instant_holds_neither_kills_the_fetch_thread_nor_leaves_ids_pending() {
    let work = tempfile::tempdir().unwrap();
    let none = serve(|_| Reply::Status(404));
    let client = Debuginfod::start(Config {
        max_time: Duration::MAX,
        ..config(&[&none], &work.path().join("cache"))
    })
    .unwrap();
    let answer = fetched(&client, &id(A));
    println!("{answer:?}; asked {:?}; {:?}", none.asked(), client.stats());
    assert!(matches!(answer, Lookup::Missing(Some(_))));
    assert_eq!(none.asked().len(), 1);
}

#[test]
fn other_kinds_of_url_in_the_environment_are_left_out_not_fatal() {
    let env = vars(&[(
        "DEBUGINFOD_URLS",
        "file:///var/cache/debuginfod ima:enforcing http://local:8002",
    )]);
    let config = Config::from_vars(&[], env).unwrap().unwrap();
    assert_eq!(config.urls, ["http://local:8002"]);
    // Given as a flag, it is still refused.
    assert!(refused(&["file:///x".into()], &[]).contains("not an http:// or https:// URL"));
}

#[test]
fn a_miss_is_asked_again_after_its_time_a_failure_sooner_an_odd_id_never() {
    let work = tempfile::tempdir().unwrap();
    let none = serve(|_| Reply::Status(404));
    let broken = serve(|_| Reply::Status(500));
    let missing = Debuginfod::start(config(&[&none], &work.path().join("a"))).unwrap();
    let failing = Debuginfod::start(config(&[&broken], &work.path().join("b"))).unwrap();
    let now = Instant::now();
    let retry = |answer: Lookup| match answer {
        Lookup::Missing(Some(at)) => at.saturating_duration_since(now),
        other => panic!("{other:?}"),
    };
    let (miss, failure) = (retry(fetched(&missing, &id(A))), retry(fetched(&failing, &id(A))));
    println!("asked again in {miss:?} after a 404, {failure:?} after a 500");
    assert!(miss > Duration::from_secs(590) && miss < Duration::from_secs(605));
    assert!(failure > Duration::from_secs(50) && failure < Duration::from_secs(65));
    assert_eq!(missing.lookup(&[]), Lookup::Missing(None));
}

#[test]
fn redirects_are_not_followed_from_plain_http() {
    let work = tempfile::tempdir().unwrap();
    let elf = elf_with_build_id(work.path(), A);
    let server = serve(move |path| match path.starts_with("/elsewhere") {
        true => Reply::Body(elf.clone()),
        false => Reply::Redirect("/elsewhere".into()),
    });
    let client = Debuginfod::start(config(&[&server], &work.path().join("cache"))).unwrap();
    let answer = fetched(&client, &id(A));
    println!("{answer:?}; asked {:?}; {:?}", server.asked(), client.stats());
    assert!(matches!(answer, Lookup::Missing(_)));
    assert_eq!(server.asked(), [format!("/buildid/{A}/debuginfo")]);
    assert_eq!(client.stats().failed, 1);
}

#[test]
fn no_cache_in_a_shared_directory() {
    assert_eq!(cache::default_dir_for(&vars(&[]), false), None, "not under /tmp");
    assert_eq!(
        cache::default_dir_for(&vars(&[("HOME", "/home/u")]), false),
        Some(PathBuf::from("/home/u/.cache/bpfprof/debuginfod"))
    );
    let work = tempfile::tempdir().unwrap();
    let open = work.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let err = Debuginfod::start(config(&[], &open)).err().unwrap().to_string();
    println!("{err}");
    assert!(err.contains("writable by others than its owner"), "{err}");
    let link = work.path().join("link");
    symlink(work.path(), &link).unwrap();
    let err = Debuginfod::start(config(&[], &link)).err().unwrap().to_string();
    assert!(err.contains("not a directory"), "{err}");
}

#[test]
fn symlinks_in_the_cache_are_not_followed() {
    let work = tempfile::tempdir().unwrap();
    let none = serve(|_| Reply::Status(404));
    let cache = work.path().join("cache");
    let elsewhere = work.path().join("elsewhere");
    std::fs::create_dir_all(&cache).unwrap();
    std::fs::create_dir_all(&elsewhere).unwrap();
    // A's directory is a symlink: its miss is not written through it.
    symlink(&elsewhere, cache.join(A)).unwrap();
    // B's file is a symlink to an ELF file with B's build id: not taken as cached.
    std::fs::write(elsewhere.join("b.elf"), elf_with_build_id(work.path(), B)).unwrap();
    std::fs::create_dir(cache.join(B)).unwrap();
    symlink(elsewhere.join("b.elf"), cache.join(B).join("debuginfo")).unwrap();
    let client = Debuginfod::start(config(&[&none], &cache)).unwrap();
    let (a, b) = (fetched(&client, &id(A)), fetched(&client, &id(B)));
    println!(
        "{a:?} {b:?}; elsewhere {:?}; asked {:?}",
        listing(&elsewhere),
        none.asked()
    );
    assert!(matches!((a, b), (Lookup::Missing(_), Lookup::Missing(_))));
    assert_eq!(listing(&elsewhere), ["b.elf"]);
    assert_eq!(none.asked().len(), 2, "both asked of the server");
}

#[test]
fn the_state_map_is_bounded_and_keeps_what_is_being_fetched() {
    let mut states = HashMap::new();
    states.insert(vec![0], State::Pending);
    let until = Instant::now();
    for i in 1..STATES as u32 {
        states.insert(i.to_le_bytes().to_vec(), State::Missing(until));
    }
    insert_state(&mut states, b"new", State::Pending);
    println!("{} states after one more than {STATES}", states.len());
    assert_eq!(states.len(), 2);
    assert!(matches!(states.get(&vec![0]), Some(State::Pending)));
}
