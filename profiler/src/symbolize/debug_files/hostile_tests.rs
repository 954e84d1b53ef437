//! Answers that change (a fetcher's misses, an evicted file), naming later, and files the profiled
//! program may have put in the way: a FIFO named like its debug link, a huge file, a directory
//! it sees that this process does not.
use std::{
    sync::mpsc,
    time::{Duration, Instant},
};

use object::{Object as _, ObjectSymbol as _};

use super::*;
use crate::symbolize::{Frame, ObjectRef};

/// `work` on a thread of its own, or `None` if it is not over within 10 s (it hangs).
fn within_10s<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(work());
    });
    rx.recv_timeout(Duration::from_secs(10)).ok()
}

#[test]
fn a_miss_is_kept_until_its_retry_time_then_asked_again() {
    let tmp = tempfile::tempdir().unwrap();
    fixture(tmp.path(), PROG);
    let debug = tmp.path().join("prog.debug");
    let retry = Instant::now() + Duration::from_millis(300);
    let fake = Fake::new(vec![Lookup::Missing(Some(retry)), Lookup::Ready(debug.clone())]);
    let locator = DebugLocator::new(Vec::new(), Some(fake.clone()));
    let stripped = tmp.path().join("stripped");
    let first = locate(&locator, &stripped);
    assert_eq!((first.debug_file.clone(), first.retry_at), (None, Some(retry)));
    assert!(!first.is_final(), "a miss may still change");
    assert_eq!(locate(&locator, &stripped).debug_file, None);
    assert_eq!(fake.asked(), 1, "not asked again before the retry time");
    std::thread::sleep(retry.saturating_duration_since(Instant::now()));
    let later = locate(&locator, &stripped);
    println!("asked {} times: {:?}", fake.asked(), later.debug_file);
    assert_eq!(
        (later.origin, later.debug_file),
        (Origin::Debuginfod, Some(debug))
    );
}

#[test]
fn a_fetched_file_the_fetcher_no_longer_has_is_looked_for_again() {
    let tmp = tempfile::tempdir().unwrap();
    fixture(tmp.path(), PROG);
    let debug = tmp.path().join("prog.debug");
    let fake = Fake::new(vec![Lookup::Ready(debug.clone()), Lookup::Missing(None)]);
    let locator = DebugLocator::new(Vec::new(), Some(fake.clone()));
    let stripped = tmp.path().join("stripped");
    assert_eq!(locate(&locator, &stripped).debug_file, Some(debug));
    // Evicted from the fetcher's cache: the kept path is dead.
    let after = locate(&locator, &stripped);
    println!("asked {} times", fake.asked());
    assert_eq!((after.origin, after.debug_file.clone()), (Origin::Dynsym, None));
    assert!(after.is_final());
    assert_eq!(fake.asked(), 3, "once to touch the file, once to look again");
}

/// The virtual address of `work` in the unstripped `prog` (a name no demangler reads as a type,
/// as it reads `f` as "float").
fn address_of_work(prog: &Path) -> u64 {
    let data = std::fs::read(prog).unwrap();
    let elf = object::File::parse(&*data).unwrap();
    let f = elf.symbols().find(|s| s.name() == Ok("work")).unwrap();
    f.address()
}

const WORK: &str =
    "int work(int x) { return x * 3; }\nint main(int argc, char **argv) { return work(argc); }\n";

/// A frame left unnamed at the run, in `work` of a stripped copy of the fixture built in `dir`
/// (its debug file beside it, as `prog.debug`).
fn unnamed_work_frame(dir: &std::path::Path) -> Frame {
    let prog = fixture(dir, WORK);
    let id = crate::process::build_id_bytes(&File::open(&prog).unwrap()).unwrap();
    let f = address_of_work(&prog) + 1;
    let mut frame = Frame::unknown("/opt/stripped", 0x5555_0000_0000 + f, false);
    frame.object = Some(ObjectRef {
        build_id: Some(hex(&id)),
        file_offset: None,
        vaddr: Some(f),
    });
    frame
}

#[test]
fn naming_later_waits_for_files_being_fetched() {
    let tmp = tempfile::tempdir().unwrap();
    let frame = unnamed_work_frame(tmp.path());
    let debug = tmp.path().join("prog.debug");
    let fake = Fake::new(vec![Lookup::Pending, Lookup::Ready(debug.clone())]);
    let nowhere = tmp.path().join("no-system-dir");
    let locator = DebugLocator::with_system(Vec::new(), Some(fake.clone()), &nowhere);
    let (named, sources) = name_later(&locator, &[&frame]);
    println!("{named:?} {sources:?}");
    let frames = named.get(&frame).expect("named once the fetch is over");
    assert_eq!(frames.last().unwrap().function, "work");
    assert_eq!(sources[0].path, Some(debug.display().to_string()));
    assert_eq!(fake.asked(), 2);
}

#[test]
fn a_file_without_a_debug_file_is_not_said_to_be_named_from_no_symbols() {
    let tmp = tempfile::tempdir().unwrap();
    // No debug file found now: the locator looks in no directory and fetches nothing.
    let frame = unnamed_work_frame(tmp.path());
    let nowhere = tmp.path().join("no-system-dir");
    let locator = DebugLocator::with_system(Vec::new(), None, &nowhere);
    let (named, sources) = name_later(&locator, &[&frame]);
    assert!(named.is_empty(), "{named:?}");
    // The run's own account of where the file's names came from stands: nothing is added.
    assert!(sources.is_empty(), "{sources:?}");
    assert_eq!(crate::symbolize::names_note(&sources), None);
}

#[test]
fn a_fifo_named_like_the_debug_link_neither_hangs_the_search_nor_the_naming() {
    let tmp = tempfile::tempdir().unwrap();
    fixture(tmp.path(), PROG);
    let debug = tmp.path().join("prog.debug");
    std::fs::remove_file(&debug).unwrap();
    nix::unistd::mkfifo(&debug, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let linked = tmp.path().join("linked");
    let located = within_10s(move || locate(&DebugLocator::default(), &linked)).expect("the search hangs");
    assert_eq!(
        (located.origin, located.debug_file.clone()),
        (Origin::Dynsym, None)
    );
    let linked = tmp.path().join("linked");
    let named = within_10s(move || {
        let mut located = located;
        let blazesym = crate::symbolize::Symbolizer::blazesym();
        let (results, origin) = symbolize_file(&blazesym, linked, &mut located, &[0x1000]);
        (results.map(|r| r.len()).map_err(|e| e.to_string()), origin)
    })
    .expect("blazesym follows the debug link to the FIFO");
    println!("{named:?}");
    assert_eq!(named, (Ok(1), Origin::Dynsym));
}

#[test]
fn a_candidate_over_the_size_bound_is_refused_unread() {
    let tmp = tempfile::tempdir().unwrap();
    fixture(tmp.path(), PROG);
    let huge = File::create(tmp.path().join("prog.debug")).unwrap();
    huge.set_len(candidate::MAX_DEBUG_FILE + 1).unwrap();
    let found = locate(&DebugLocator::default(), &tmp.path().join("linked"));
    assert_eq!(found.debug_file, None);
    assert!(
        found.problems[0].contains("more than a debug file's bound"),
        "{:?}",
        found.problems
    );
}

#[test]
fn with_the_same_build_id_the_crc_is_not_needed() {
    let tmp = tempfile::tempdir().unwrap();
    fixture(tmp.path(), PROG);
    let debug = tmp.path().join("prog.debug");
    let mut bytes = std::fs::read(&debug).unwrap();
    bytes.push(0);
    std::fs::write(&debug, bytes).unwrap();
    let found = locate(&DebugLocator::default(), &tmp.path().join("linked"));
    assert_eq!((found.origin, found.debug_file), (Origin::Debuglink, Some(debug)));
    assert!(found.problems.is_empty(), "{:?}", found.problems);
}

#[test]
fn the_directory_the_process_saw_is_searched_only_under_its_root() {
    let tmp = tempfile::tempdir().unwrap();
    fixture(tmp.path(), PROG);
    let (bin, seen) = (tmp.path().join("bin"), tmp.path().join("seen"));
    place(&tmp.path().join("linked"), &bin.join("linked"));
    place(&tmp.path().join("prog.debug"), &seen.join("prog.debug"));
    let read = bin.join("linked");
    let seen_path = seen.join("linked");
    let seen_path = seen_path.to_str().unwrap();
    // Here, that path is in another mount namespace as far as the locator knows.
    let alone = DebugLocator::default().locate(&read, seen_path);
    assert_eq!(alone.debug_file, None);
    // Under the process's root (here "/", so the same path), it is searched.
    let rooted = DebugLocator::default().locate_in(&read, seen_path, Some(Path::new("/")));
    println!("{:?} then {:?}", alone.origin, rooted.debug_file);
    assert_eq!(rooted.debug_file, Some(seen.join("prog.debug")));
}
