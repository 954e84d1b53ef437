//! A stripped binary, symbolized while it runs: built here with cc (`-no-pie`, so that its file
//! offsets are not its virtual addresses), its symbols read from the unstripped build as the
//! truth.
use std::{
    collections::VecDeque,
    path::{Path, PathBuf},
    process::{Child, Command},
    sync::{Arc, Mutex},
};

use object::{Object as _, ObjectSegment as _, ObjectSymbol as _};

use super::{debug_files::Fetcher, debuginfod::Lookup, *};
use crate::{process::Processes, profile::RawSample};

const PROG: &str = "#include <unistd.h>\n\
    __attribute__((noinline)) int triple_it(int x) { return x * 3 + 1; }\n\
    __attribute__((noinline)) int quintuple_it(int x) { return x * 5 + 2; }\n\
    int main(int argc, char **argv) {\n\
        if (argc > 5) return triple_it(argc) + quintuple_it(argc);\n\
        pause();\n\
        return 0;\n\
    }\n";

fn run(program: &str, args: &[&str], dir: &Path) {
    let status = Command::new(program)
        .current_dir(dir)
        .args(args)
        .status()
        .unwrap();
    assert!(status.success(), "{program} {args:?}");
}

/// `prog` (symbols, DWARF, build id), `prog.debug` and `stripped`, in `dir`.
fn build(dir: &Path) {
    std::fs::write(dir.join("prog.c"), PROG).unwrap();
    let cc = ["-g", "-O1", "-no-pie", "-Wl,--build-id", "-o", "prog", "prog.c"];
    run("cc", &cc, dir);
    run("objcopy", &["--only-keep-debug", "prog", "prog.debug"], dir);
    run("strip", &["--strip-all", "-o", "stripped", "prog"], dir);
}

/// A function's virtual address, and the file offset of `vaddr + 1` by the file's segments.
fn truth(prog: &Path, function: &str) -> (u64, u64) {
    let data = std::fs::read(prog).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let start = file
        .symbols()
        .find(|s| s.name() == Ok(function))
        .unwrap()
        .address();
    let inside = start + 1;
    let offset = file
        .segments()
        .find_map(|s| {
            let (off, size) = s.file_range();
            let within = inside.checked_sub(s.address()).filter(|&d| d < size)?;
            Some(off + within)
        })
        .unwrap();
    (start, offset)
}

/// The stripped binary, running (paused), captured.
struct Running {
    child: Child,
    procs: Processes,
}

impl Running {
    /// Captured once the exec is over (until then its maps may read as empty).
    fn start(binary: &Path) -> Running {
        let child = Command::new(binary).spawn().unwrap();
        let exe = PathBuf::from(format!("/proc/{}/exe", child.id()));
        let mut procs = Processes::new();
        for _ in 0..200 {
            procs = Processes::new();
            let exec_over = std::fs::read_link(&exe).is_ok_and(|p| p == binary);
            if exec_over && procs.capture(child.id()).is_ok() && !procs.mapped_files(child.id(), 0).is_empty()
            {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        println!("pid {}: {:?}", child.id(), procs.mapped_files(child.id(), 0));
        Running { child, procs }
    }

    /// A profile of one stack: `ip` (a `-no-pie` binary runs at its own virtual addresses).
    fn profile(&self, ip: u64) -> RawProfile {
        let pid = self.child.id();
        let mut profile = RawProfile::new();
        profile.add(
            RawSample::of_user_stack(pid, "stripped", vec![ip], 1),
            &self.procs,
        );
        profile
    }

    fn frames(&self, symbolizer: &Symbolizer, ip: u64) -> Vec<Frame> {
        let profile = self.profile(ip);
        let key = profile.stacks.keys().next().unwrap().clone();
        let frames = symbolizer.symbolize(&profile, &self.procs).user(&key.user[0]);
        println!("{ip:#x}: {frames:?}");
        frames
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A debuginfod that answers from a list, the last answer for good.
struct Answers(Mutex<VecDeque<Lookup>>);

impl Fetcher for Answers {
    fn lookup(&self, _build_id: &[u8]) -> Lookup {
        let mut answers = self.0.lock().unwrap();
        if answers.len() > 1 {
            answers.pop_front().unwrap()
        } else {
            answers[0].clone()
        }
    }
}

#[test]
fn frames_are_cached_only_once_the_debug_file_fetch_is_over() {
    let tmp = tempfile::tempdir().unwrap();
    build(tmp.path());
    let (start, offset) = truth(&tmp.path().join("prog"), "triple_it");
    println!("f at {start:#x}, f+1 at file offset {offset:#x}");
    assert_ne!(offset, start + 1, "a file whose offsets are not its addresses");
    let answers = [Lookup::Pending, Lookup::Ready(tmp.path().join("prog.debug"))];
    let fetcher = Arc::new(Answers(Mutex::new(answers.into())));
    let symbolizer = Symbolizer::long_lived_with(1 << 20, DebugLocator::new(Vec::new(), Some(fetcher)));
    let running = Running::start(&tmp.path().join("stripped"));

    let first = running.frames(&symbolizer, start + 1);
    assert_eq!((first.len(), first[0].kind), (1, NameKind::Fde), "{first:?}");
    assert_eq!(first[0].start, Some(start));
    let object = first[0].object.clone().unwrap();
    assert_eq!(
        (object.file_offset, object.vaddr),
        (Some(offset), Some(start + 1))
    );
    assert_eq!(symbolizer.cache_size().frames, 0, "not cached while pending");

    let second = running.frames(&symbolizer, start + 1);
    assert_eq!(
        (second[0].function.as_str(), second[0].kind),
        ("triple_it", NameKind::Symbol)
    );
    assert_eq!(second[0].object, Some(object), "the same place in the file");
    assert_eq!(symbolizer.cache_size().frames, 1);
}

#[test]
fn a_files_tables_are_read_once_and_kept_across_batches() {
    let tmp = tempfile::tempdir().unwrap();
    build(tmp.path());
    let (f, _) = truth(&tmp.path().join("prog"), "triple_it");
    let (g, _) = truth(&tmp.path().join("prog"), "quintuple_it");
    let symbolizer = Symbolizer::long_lived_with(1 << 20, DebugLocator::default());
    let running = Running::start(&tmp.path().join("stripped"));
    let placed = |ip: u64, start: u64| {
        let frames = running.frames(&symbolizer, ip);
        assert_eq!((frames[0].kind, frames[0].start), (NameKind::Fde, Some(start)));
    };
    placed(f + 1, f);
    // The Go table (none) and the function bounds, once.
    let reads = symbolizer.layouts.borrow().reads;
    println!("tables read: {reads}");
    assert_eq!((reads, symbolizer.cache_size().layouts), (2, 1));
    placed(g + 1, g);
    symbolizer.release_files();
    placed(g + 2, g);
    assert_eq!(symbolizer.layouts.borrow().reads, reads, "not read again");
}

#[test]
fn named_frames_read_no_tables_and_a_long_lived_symbolizer_says_nothing_of_names() {
    let tmp = tempfile::tempdir().unwrap();
    build(tmp.path());
    let (f, offset) = truth(&tmp.path().join("prog"), "triple_it");
    let running = Running::start(&tmp.path().join("prog"));
    let once = Symbolizer::default();
    let profile = running.profile(f + 1);
    let symbols = once.symbolize(&profile, &running.procs);
    println!("names: {:?}", symbols.names);
    assert_eq!(
        symbols.names.len(),
        1,
        "a one-shot symbolizer says where names came from"
    );
    let key = profile.stacks.keys().next().unwrap();
    let frame = &symbols.user(&key.user[0])[0];
    let object = frame.object.as_ref().unwrap();
    assert_eq!(
        (frame.function.as_str(), object.file_offset, object.vaddr),
        ("triple_it", Some(offset), Some(f + 1))
    );
    assert_eq!(once.layouts.borrow().reads, 0, "no table read for a named frame");
    assert_eq!(once.cache_size().layouts, 0);

    let long_lived = Symbolizer::long_lived_with(1 << 20, DebugLocator::default());
    let symbols = long_lived.symbolize(&profile, &running.procs);
    assert!(symbols.names.is_empty(), "{:?}", symbols.names);
}

/// How many of this process's descriptors are open on `path` (blazesym holds each file it has
/// parsed open).
fn descriptors_on(path: &Path) -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .filter(|fd| std::fs::read_link(fd.path()).is_ok_and(|target| target == path))
        .count()
}

#[test]
fn a_debug_file_profiles_need_stays_parsed_and_one_no_longer_needed_is_let_go() {
    let tmp = tempfile::tempdir().unwrap();
    build(tmp.path());
    let debug = tmp.path().join("prog.debug");
    let (f, _) = truth(&tmp.path().join("prog"), "triple_it");
    let (g, _) = truth(&tmp.path().join("prog"), "quintuple_it");
    let fetcher = Arc::new(Answers(Mutex::new([Lookup::Ready(debug.clone())].into())));
    let symbolizer = Symbolizer::long_lived_with(1 << 20, DebugLocator::new(Vec::new(), Some(fetcher)));
    let running = Running::start(&tmp.path().join("stripped"));
    let named = |ip: u64, function: &str| {
        let frames = running.frames(&symbolizer, ip);
        assert_eq!(
            (frames[0].function.as_str(), frames[0].kind),
            (function, NameKind::Symbol)
        );
    };
    assert_eq!(descriptors_on(&debug), 0);
    named(f + 1, "triple_it");
    assert_eq!(descriptors_on(&debug), 1, "parsed and held");
    symbolizer.release_files();
    assert_eq!(descriptors_on(&debug), 1, "needed by the profile just done: kept");
    assert_eq!(
        symbolizer.cache_size().files,
        1,
        "its debug file (the binary is let go)"
    );
    // The next profile needs it again, for an address the frame cache lacks.
    named(g + 1, "quintuple_it");
    symbolizer.release_files();
    // Profiles that do not need it: kept for a few, then let go.
    for _ in 0..BLAZESYM_IDLE_PROFILES {
        assert_eq!(descriptors_on(&debug), 1, "needed lately: kept");
        symbolizer.release_files();
    }
    assert_eq!(
        descriptors_on(&debug),
        0,
        "needed by none of the last profiles: closed"
    );
    assert_eq!(symbolizer.cache_size().files, 0);
    named(g + 2, "quintuple_it");
}
