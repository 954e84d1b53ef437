//! The locator's search order, on files made here with cc, objcopy and strip.
use std::{fs::File, process::Command, sync::Mutex};

use super::{facts::plain_name, *};

fn run(program: &str, args: &[&str]) {
    let status = Command::new(program).args(args).status().unwrap();
    assert!(status.success(), "{program} {args:?}");
}

/// In `dir`: `prog` (with DWARF and a build id), `prog.debug` (its debug file), `stripped`
/// (no symbols) and `linked` (stripped, with a debug link to `prog.debug`).
fn fixture(dir: &Path, source: &str) -> PathBuf {
    fixture_with(dir, source, "-Wl,--build-id")
}

/// The fixture, linked with this build-id flag (`-Wl,--build-id=none`: without one).
fn fixture_with(dir: &Path, source: &str, build_id: &str) -> PathBuf {
    let c = dir.join("prog.c");
    std::fs::write(&c, source).unwrap();
    let at = |name: &str| dir.join(name).to_str().unwrap().to_string();
    run("cc", &["-g", "-O1", build_id, "-o", &at("prog"), &at("prog.c")]);
    run("objcopy", &["--only-keep-debug", &at("prog"), &at("prog.debug")]);
    run("strip", &["--strip-all", "-o", &at("stripped"), &at("prog")]);
    // objcopy reads the debug file named by the link, from the current directory.
    let link = Command::new("objcopy")
        .current_dir(dir)
        .args(["--add-gnu-debuglink=prog.debug", "stripped", "linked"])
        .status()
        .unwrap();
    assert!(link.success());
    dir.join("prog")
}

const PROG: &str = "int f(int x) { return x * 3; }\nint main(int argc, char **argv) { return f(argc); }\n";

fn build_id_path(root: &Path, prog: &Path) -> PathBuf {
    let id = crate::process::build_id_bytes(&File::open(prog).unwrap()).unwrap();
    root.join(format!(".build-id/{:02x}/{}.debug", id[0], hex(&id[1..])))
}

fn place(from: &Path, to: &Path) {
    std::fs::create_dir_all(to.parent().unwrap()).unwrap();
    std::fs::copy(from, to).unwrap();
}

fn locate(locator: &DebugLocator, binary: &Path) -> Located {
    let located = locator.locate(binary, binary.to_str().unwrap());
    println!(
        "{}: {:?} {:?} {:?}",
        binary.display(),
        located.origin,
        located.debug_file,
        located.problems
    );
    located
}

#[test]
fn a_binary_with_its_own_dwarf_needs_no_debug_file() {
    let tmp = tempfile::tempdir().unwrap();
    let prog = fixture(tmp.path(), PROG);
    let located = locate(&DebugLocator::default(), &prog);
    assert_eq!((located.origin, located.debug_file), (Origin::OwnSymbols, None));
    let stripped = locate(&DebugLocator::default(), &tmp.path().join("stripped"));
    // cc's PIE imports its C library's functions: a `.dynsym` without any of its own.
    assert_eq!(
        (stripped.origin, stripped.fallback),
        (Origin::Dynsym, Origin::Dynsym)
    );
    assert!(stripped.vaddr_of(0).is_some(), "its segments are read");
}

#[test]
fn build_id_dirs_are_searched_the_users_first_then_the_systems() {
    let tmp = tempfile::tempdir().unwrap();
    let prog = fixture(tmp.path(), PROG);
    let (user, system) = (tmp.path().join("user"), tmp.path().join("system"));
    let debug = tmp.path().join("prog.debug");
    place(&debug, &build_id_path(&user, &prog));
    place(&debug, &build_id_path(&system, &prog));
    let stripped = tmp.path().join("stripped");

    let both = DebugLocator::with_system(vec![user.clone()], None, &system);
    let found = locate(&both, &stripped);
    assert_eq!(found.origin, Origin::BuildIdDir);
    assert_eq!(found.debug_file, Some(build_id_path(&user, &prog)));

    let system_only = DebugLocator::with_system(Vec::new(), None, &system);
    assert_eq!(
        locate(&system_only, &stripped).debug_file,
        Some(build_id_path(&system, &prog))
    );
    let neither = DebugLocator::with_system(Vec::new(), None, &tmp.path().join("none"));
    assert_eq!(locate(&neither, &stripped).origin, Origin::Dynsym);
}

#[test]
fn a_debug_link_is_looked_for_in_the_order_gdb_uses() {
    let user = [PathBuf::from("/d1")];
    let bin = [PathBuf::from("/opt/app/bin")];
    let got = debuglink_candidates("x.debug", &user, &bin, Path::new("/usr/lib/debug"));
    let want = [
        "/d1/x.debug",
        "/d1/opt/app/bin/x.debug",
        "/opt/app/bin/x.debug",
        "/opt/app/bin/.debug/x.debug",
        "/usr/lib/debug/opt/app/bin/x.debug",
    ];
    assert_eq!(got, want.map(PathBuf::from));
    for bad in ["", ".", "..", "../x.debug", "a/b"] {
        assert_eq!(plain_name(bad.as_bytes()), None, "{bad:?}");
    }
}

#[test]
fn a_debug_link_with_a_wrong_crc_is_refused_and_the_search_goes_on() {
    let tmp = tempfile::tempdir().unwrap();
    // Without build ids, the CRC is all that tells the files apart.
    fixture_with(tmp.path(), PROG, "-Wl,--build-id=none");
    let good = tmp.path().join("good.debug");
    std::fs::rename(tmp.path().join("prog.debug"), &good).unwrap();
    // Beside the binary: another CRC (one byte more).
    let mut bytes = std::fs::read(&good).unwrap();
    bytes.push(0);
    std::fs::write(tmp.path().join("prog.debug"), bytes).unwrap();
    let linked = tmp.path().join("linked");
    let found = locate(&DebugLocator::default(), &linked);
    assert_eq!((found.origin, found.debug_file.clone()), (Origin::Dynsym, None));
    assert!(found.problems[0].contains("CRC"), "{:?}", found.problems);

    // The right file in the binary's .debug/, after the wrong one.
    place(&good, &tmp.path().join(".debug/prog.debug"));
    let found = locate(&DebugLocator::default(), &linked);
    assert_eq!(found.origin, Origin::Debuglink);
    assert_eq!(found.debug_file, Some(tmp.path().join(".debug/prog.debug")));
    assert_eq!(found.problems.len(), 1, "the wrong one is still said");
}

#[test]
fn a_debug_file_of_another_build_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let prog = fixture(tmp.path(), PROG);
    let other_dir = tmp.path().join("other");
    std::fs::create_dir(&other_dir).unwrap();
    fixture(&other_dir, "int main(void) { return 7; }\n");
    let user = tmp.path().join("user");
    place(&other_dir.join("prog.debug"), &build_id_path(&user, &prog));
    let found = locate(&DebugLocator::new(vec![user], None), &tmp.path().join("stripped"));
    assert_eq!(found.debug_file, None);
    assert!(found.problems[0].contains("build id"), "{:?}", found.problems);
}

/// A debug file whose build-id note was made to claim the binary's (a crafted file, or a
/// collision) is still another binary's: its `.text` is elsewhere or of another size. Refused.
#[test]
fn a_debug_file_whose_build_id_lies_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let prog = fixture(tmp.path(), PROG);
    let other_dir = tmp.path().join("other");
    std::fs::create_dir(&other_dir).unwrap();
    fixture(
        &other_dir,
        "static volatile int v;\nvoid g(void) { for (int i = 0; i < 100; i++) v += i * v; }\nint main(void) { g(); return v; }\n",
    );
    let user = tmp.path().join("user");
    let placed = build_id_path(&user, &prog);
    std::fs::create_dir_all(placed.parent().unwrap()).unwrap();
    claiming(&other_dir.join("prog.debug"), &prog, &placed);
    let found = locate(&DebugLocator::new(vec![user], None), &tmp.path().join("stripped"));
    assert_eq!(found.debug_file, None);
    assert!(found.problems[0].contains(".text"), "{:?}", found.problems);
}

fn build_id(path: &Path) -> Vec<u8> {
    crate::process::build_id_bytes(&File::open(path).unwrap()).unwrap()
}

/// Write to `to` a copy of the ELF file `from` whose build-id note claims `victim`'s.
fn claiming(from: &Path, victim: &Path, to: &Path) {
    let (ours, theirs) = (build_id(victim), build_id(from));
    let mut lying = std::fs::read(from).unwrap();
    let at = (lying.windows(theirs.len()))
        .position(|w| w == theirs.as_slice())
        .expect("the build id's bytes");
    lying[at..at + ours.len()].copy_from_slice(&ours);
    std::fs::write(to, &lying).unwrap();
    assert_eq!(
        build_id(to),
        ours,
        "the crafted note claims {}'s id",
        victim.display()
    );
}

/// A binary claiming the build id of one already located (libc, in a crafted program) gets an
/// answer of its own: its own symbols and segments, not the other's kept answer.
#[test]
fn a_binary_claiming_a_located_ones_build_id_is_located_for_itself() {
    let tmp = tempfile::tempdir().unwrap();
    let prog = fixture(tmp.path(), PROG);
    let other_dir = tmp.path().join("other");
    std::fs::create_dir(&other_dir).unwrap();
    let other = fixture(
        &other_dir,
        "int g(int x) { return x + 7; }\nint main(int c, char **v) { return g(c); }\n",
    );
    let liar = tmp.path().join("liar");
    claiming(&other, &prog, &liar);
    let locator = DebugLocator::default();
    let stripped = locate(&locator, &tmp.path().join("stripped"));
    assert_eq!(stripped.origin, Origin::Dynsym);
    let located = locate(&locator, &liar);
    assert_eq!(
        located.origin,
        Origin::OwnSymbols,
        "its own DWARF, not the stripped file's answer"
    );
    assert_eq!(located.segments, Facts::read(&liar).unwrap().segments);
}

#[test]
fn an_unstripped_copy_anywhere_under_a_debug_dir_is_found_by_build_id() {
    let tmp = tempfile::tempdir().unwrap();
    let prog = fixture(tmp.path(), PROG);
    let user = tmp.path().join("builds");
    place(&prog, &user.join("a/b/prog-unstripped"));
    place(&tmp.path().join("stripped"), &user.join("stripped-too"));
    let found = locate(
        &DebugLocator::new(vec![user.clone()], None),
        &tmp.path().join("stripped"),
    );
    assert_eq!(found.origin, Origin::DebugDir);
    assert_eq!(found.debug_file, Some(user.join("a/b/prog-unstripped")));
}

/// A fetcher answering from a list, the last answer for good; it counts the lookups.
struct Fake {
    answers: Mutex<Vec<Lookup>>,
    asked: std::sync::atomic::AtomicUsize,
}

impl Fake {
    fn new(answers: Vec<Lookup>) -> Arc<Fake> {
        Arc::new(Fake {
            answers: Mutex::new(answers),
            asked: Default::default(),
        })
    }

    fn asked(&self) -> usize {
        self.asked.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Fetcher for Fake {
    fn lookup(&self, _: &[u8]) -> Lookup {
        self.asked.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut answers = self.answers.lock().unwrap();
        match answers.len() {
            1 => answers[0].clone(),
            _ => answers.remove(0),
        }
    }
}

#[test]
fn a_fetch_in_flight_is_asked_again_and_a_fetched_file_is_used() {
    let tmp = tempfile::tempdir().unwrap();
    fixture(tmp.path(), PROG);
    let debug = tmp.path().join("prog.debug");
    let fake = Fake::new(vec![Lookup::Pending, Lookup::Ready(debug.clone())]);
    let locator = DebugLocator::new(Vec::new(), Some(fake.clone()));
    let stripped = tmp.path().join("stripped");
    let first = locate(&locator, &stripped);
    assert!(first.pending && first.debug_file.is_none() && !first.is_final());
    let second = locate(&locator, &stripped);
    assert_eq!(
        (second.origin, second.debug_file.clone()),
        (Origin::Debuginfod, Some(debug.clone()))
    );
    assert!(second.is_final());
    // Kept per build id: the fetcher is asked only to mark the file used.
    assert_eq!(locate(&locator, &stripped).debug_file, Some(debug));
    assert_eq!(fake.asked(), 3);
}

#[test]
fn the_note_names_files_without_their_own_symbols_and_the_problems() {
    let source = |module: &str, source, problems: Vec<String>| NameSource {
        module: module.into(),
        build_id: None,
        source,
        path: (source == Origin::Debuglink).then(|| "/x/w.debug".into()),
        addresses: 4,
        named: 3,
        problems,
    };
    assert_eq!(names_note(&[source("/bin/a", Origin::OwnSymbols, vec![])]), None);
    let note = names_note(&[
        source("/bin/a", Origin::OwnSymbols, vec![]),
        source("/bin/w", Origin::Debuglink, vec![]),
        source(
            "/lib/libz.so",
            Origin::Dynsym,
            vec!["/lib/z.debug: CRC 0x1 where the debug link says 0x2, ignored".into()],
        ),
    ]);
    assert_eq!(
        note.as_deref(),
        Some("names: w from debug link /x/w.debug (3 of 4 addresses named); libz.so from .dynsym only (3 of 4 addresses named); 1 files from their own symbols; libz.so: /lib/z.debug: CRC 0x1 where the debug link says 0x2, ignored")
    );
}

#[path = "hostile_tests.rs"]
mod hostile;
