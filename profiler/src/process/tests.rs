use super::*;

const MAPS: &str = "\
55d0c0a00000-55d0c0a01000 r--p 00000000 fd:01 1234 /usr/bin/prog
55d0c0a01000-55d0c0a05000 r-xp 00001000 fd:01 1234 /usr/bin/prog
7f0000000000-7f0000100000 r-xp 00028000 fd:01 99 /usr/lib/x86_64-linux-gnu/libc.so.6
7f0000200000-7f0000201000 rwxp 00000000 00:00 0 
7ffd00000000-7ffd00002000 r-xp 00000000 00:00 0                          [vdso]
7ffd10000000-7ffd10002000 rw-p 00000000 00:00 0                          [stack]
";

#[test]
fn parses_executable_mappings_only() {
    let lines = parse_maps(MAPS);
    assert_eq!(lines.len(), 4);
    assert_eq!(lines[0].start, 0x55d0c0a01000);
    assert_eq!(lines[0].file_offset, 0x1000);
    assert_eq!(lines[0].path, "/usr/bin/prog");
    assert_eq!(lines[2].path, "");
    assert_eq!(lines[3].path, "[vdso]");
}

/// A `sleep 30` of a test, killed and reaped however the test ends.
struct Child(std::process::Child);

impl Child {
    fn sleeping() -> Child {
        Child(std::process::Command::new("sleep").arg("30").spawn().unwrap())
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The executable mappings asked of the kernel one at a time are the text's executable lines (its
/// `[vsyscall]` page aside), of this process and of another: the same ranges, offsets, devices,
/// inodes and paths. A kernel of 6.11 or later answers (`PROCMAP_QUERY`); an older one's text
/// is read.
#[test]
fn the_kernels_answers_are_the_texts_lines() {
    let child = Child::sleeping();
    let release = nix::sys::utsname::uname()
        .unwrap()
        .release()
        .to_string_lossy()
        .into_owned();
    let mut version = release.split(['.', '-']).map(|n| n.parse::<u32>().unwrap_or(0));
    let answers = (version.next(), version.next()) >= (Some(6), Some(11));
    for pid in [std::process::id(), child.0.id()] {
        let maps = || File::open(format!("/proc/{pid}/maps")).unwrap();
        let text = || -> Vec<MapsLine> {
            let text = parse_maps(&std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap());
            text.into_iter().filter(|l| l.path != "[vsyscall]").collect()
        };
        // (Read until the map holds still around the kernel's answers: the child execs, this
        // process's other tests may map code.)
        let (asked, read) = (0..50)
            .find_map(|_| {
                let before = text();
                let asked = (
                    maps::query::exec_mappings(&maps()),
                    exec_mappings(maps()).unwrap(),
                );
                (text() == before).then_some((asked, before))
            })
            .expect("a map that holds still");
        assert_eq!(asked.1, read, "pid {pid}");
        assert!(read.iter().any(|l| l.path == "[vdso]") && read.iter().any(|l| l.dev != 0 && l.inode != 0));
        match asked.0 {
            Ok(lines) => assert_eq!(lines, read, "pid {pid}"),
            Err(e) => assert!(!answers, "kernel {release} answers PROCMAP_QUERY, yet: {e}"),
        }
    }
}

/// A program that copied its text to anonymous memory in place (huge pages): the file on
/// both sides at one bias makes it the file's text again; JIT code placed beside a library
/// (one side only, or another bias) stays anonymous.
#[test]
fn text_remapped_to_anonymous_memory_is_its_files() {
    let lines = parse_maps(
        "\
55d0c0a00000-55d0c0a01000 r--p 00000000 fd:01 1234 /usr/bin/prog
55d0c0a01000-55d0c0a05000 r-xp 00000000 00:00 0 
55d0c0a05000-55d0c0a07000 r--p 00005000 fd:01 1234 /usr/bin/prog
55d0c0a08000-55d0c0a09000 rw-p 00007000 fd:01 1234 /usr/bin/prog
7eff00000000-7eff00010000 r-xp 00000000 00:00 0 
7f0000000000-7f0000028000 r--p 00000000 fd:01 99 /usr/lib/x86_64-linux-gnu/libc.so.6
7f0000028000-7f0000100000 r-xp 00028000 fd:01 99 /usr/lib/x86_64-linux-gnu/libc.so.6
7f0000100000-7f0000140000 r--p 00100000 fd:01 99 /usr/lib/x86_64-linux-gnu/libc.so.6
7f0000140000-7f0000150000 rwxp 00000000 00:00 0 
7f0000150000-7f0000151000 rw-p 00140000 fd:01 99 /usr/lib/x86_64-linux-gnu/libc.so.6
",
    );
    let text = &lines[0];
    assert_eq!(
        (text.start, text.file_offset, text.inode, text.path.as_str()),
        (0x55d0c0a01000, 0x1000, 1234, "/usr/bin/prog")
    );
    assert_eq!(text.opened_through, (0x55d0c0a00000, 0x55d0c0a01000));
    assert_eq!(
        text.map_files_path(7),
        "/proc/7/map_files/55d0c0a00000-55d0c0a01000"
    );
    let anonymous: Vec<_> = lines.iter().filter(|l| l.inode == 0).map(|l| l.start).collect();
    assert_eq!(
        anonymous,
        [0x7eff00000000, 0x7f0000140000],
        "JIT code below a library, and between two of its mappings at different biases"
    );
    assert_eq!(lines[2].opened_through, (lines[2].start, lines[2].end));
}

#[test]
fn normalizes_to_file_offsets_and_shares_files() {
    let mut procs = Processes::new();
    procs.insert_maps(10, parse_maps(MAPS));
    procs.insert_maps(11, parse_maps(MAPS));
    assert_eq!(procs.file_count(), 2, "files are shared across processes");
    match procs.normalize(10, 0, 0x55d0c0a01234) {
        UserAddr::File { offset, .. } => assert_eq!(offset, 0x1234),
        other => panic!("{other:?}"),
    }
    match procs.normalize(11, 0, 0x7f0000000010) {
        UserAddr::File { file, offset, .. } => {
            assert_eq!(offset, 0x28010);
            assert!(procs.file(file).unwrap().path.ends_with("libc.so.6"));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        procs.normalize(10, 0, 0x7f0000200010),
        UserAddr::Anon { addr: 0x7f0000200010 }
    );
    assert_eq!(
        procs.normalize(10, 0, 0x7ffd00000010),
        UserAddr::Vdso {
            offset: 0x10,
            addr: 0x7ffd00000010
        }
    );
    assert_eq!(
        procs.normalize(10, 0, 0x1000),
        UserAddr::Unmapped { addr: 0x1000 }
    );
    assert_eq!(
        procs.normalize(99, 0, 0x55d0c0a01234),
        UserAddr::Unmapped { addr: 0x55d0c0a01234 }
    );
    assert!(procs.covers(10, 0, &[0x55d0c0a01234, 0x7f0000000010]));
    assert!(!procs.covers(10, 0, &[0x1000]));
}

#[test]
fn a_process_only_labelled_is_known_until_forgotten() {
    let mut procs = Processes::new();
    let me = std::process::id();
    procs.label_unknown([me]);
    let exe = std::env::current_exe().unwrap();
    assert_eq!(
        procs.info(me).and_then(|i| i.executable.clone()),
        Some(exe.to_string_lossy().into_owned())
    );
    assert_eq!(
        procs.pids(),
        HashSet::from([me]),
        "known, so forgotten once it exits"
    );
    procs.forget(&HashSet::from([me]));
    assert!(procs.pids().is_empty() && procs.info(me).is_none());
}

/// A process announced for its labels: the name the kernel gave taken only for the image it was
/// announced in (a fork announced before its exec is named as its parent), its executable read;
/// one gone before it was read (its generation forgotten with it) named as the kernel said, by
/// its latest image.
#[test]
fn a_label_takes_the_kernels_name_for_the_image_it_was_announced_in() {
    let generations = std::sync::Arc::new(std::sync::Mutex::new(HashMap::new()));
    let current = generations.clone();
    let with_generations = move || {
        let mut procs = Processes::new();
        let current = current.clone();
        procs.with_generations(move |pid| current.lock().unwrap().get(&pid).copied().unwrap_or(0));
        procs
    };
    let said = |name: &str, generation| Announced {
        comm: Some(name.into()),
        cgroup_id: 0,
        generation,
        executable: None,
    };
    let me = std::process::id();
    generations.lock().unwrap().insert(me, 1);
    let own = comm_of(me).unwrap();
    let exe = std::env::current_exe().unwrap().to_string_lossy().into_owned();
    let mut procs = with_generations();
    procs.label(me, &said("parent", 0));
    assert_eq!(procs.name(me), Some(own.as_str()), "exec'd since: its name read");
    assert_eq!(
        procs.info(me).and_then(|i| i.executable.clone()),
        Some(exe.clone())
    );
    procs.label(me, &said("other", 1));
    assert_eq!(
        procs.name(me),
        Some(own.as_str()),
        "read moments ago for this image: kept"
    );
    let mut procs = with_generations();
    procs.label(me, &said("kernel's", 1));
    assert_eq!(
        procs.name(me),
        Some("kernel's"),
        "this image's: the kernel's name"
    );
    assert_eq!(procs.info(me).and_then(|i| i.executable.clone()), Some(exe));

    let mut child = std::process::Command::new("true").spawn().unwrap();
    let gone = child.id();
    child.wait().unwrap();
    procs.label(gone, &said("parent", 0));
    assert_eq!(procs.name(gone), Some("parent"));
    procs.label(gone, &said("child", 1));
    assert_eq!(procs.name(gone), Some("child"), "the later image's");
    procs.label(gone, &said("parent", 0));
    assert_eq!(procs.name(gone), Some("child"), "not an earlier image's");
    assert_eq!(procs.info(gone).and_then(|i| i.executable.clone()), None);
}

/// A process the kernel announced with all its labels (name, cgroup, executable file) is read
/// from `/proc` only for an executable file not seen before: others' labels, and its capture
/// moments later, take what the kernel said.
#[test]
fn a_label_the_kernel_said_whole_reads_only_an_executable_not_seen_before() {
    use std::os::unix::fs::MetadataExt as _;
    let me = std::process::id();
    let exe = std::fs::read_link("/proc/self/exe").unwrap();
    let meta = std::fs::metadata(&exe).unwrap();
    let (major, minor) = (
        nix::sys::stat::major(meta.dev()),
        nix::sys::stat::minor(meta.dev()),
    );
    let own_file = profiler_common::FileId {
        inode: meta.ino(),
        dev: (major << 20 | minor) as u32,
        generation: 3,
    };
    let said = |name: &str, executable| Announced {
        comm: Some(name.into()),
        cgroup_id: 0,
        generation: 2,
        executable: Some(executable),
    };
    let mut procs = Processes::new();
    procs.with_generations(|_| 2);
    procs.label(me, &said("kernel's", own_file));
    let exe = exe.to_string_lossy().into_owned();
    let label = |procs: &Processes, pid| procs.info(pid).map(|i| (i.comm.clone(), i.executable.clone()));
    assert_eq!(label(&procs, me), Some(("kernel's".into(), Some(exe.clone()))));
    // Captured now: its label is not read again (the name would be this test's).
    procs.capture(me).unwrap();
    assert_eq!(label(&procs, me), Some(("kernel's".into(), Some(exe.clone()))));

    let mut child = std::process::Command::new("true").spawn().unwrap();
    let gone = child.id();
    child.wait().unwrap();
    procs.label(gone, &said("same file", own_file));
    assert_eq!(
        label(&procs, gone),
        Some(("same file".into(), Some(exe))),
        "a file seen before: its path kept"
    );
    // Its next image, in a file not known, announced after it was gone: that image's name
    // without an executable, not the name with the image's before (`env` exec'ing `true`).
    let next = Announced {
        generation: 3,
        ..said("next image", own_file)
    };
    procs.label(
        gone,
        &Announced {
            executable: Some(profiler_common::FileId {
                generation: 5,
                ..own_file
            }),
            ..next
        },
    );
    assert_eq!(label(&procs, gone), Some(("next image".into(), None)));
    // An earlier image's announcement, read after the later one's: not over it.
    procs.label(
        me,
        &Announced {
            generation: 1,
            ..said("earlier image", own_file)
        },
    );
    assert_eq!(procs.name(me), Some("kernel's"));
    // Exec'd since it was announced, into a file not known yet: all of its label read from
    // /proc (the name the kernel gave is the image's before).
    let mut fresh = Processes::new();
    fresh.with_generations(|_| 2);
    fresh.label(
        me,
        &Announced {
            generation: 1,
            ..said("before its exec", own_file)
        },
    );
    assert_eq!(fresh.name(me), comm_of(me).as_deref());
    let another = |generation| profiler_common::FileId {
        generation,
        ..own_file
    };
    procs.forget(&HashSet::from([gone]));
    procs.label(gone, &said("reused inode", another(4)));
    assert_eq!(
        label(&procs, gone),
        Some(("reused inode".into(), None)),
        "another file (the inode's number reused): not known, and nothing left to read"
    );
    procs.forget(&HashSet::from([gone]));
    procs.label(gone, &said("kernel thread", Default::default()));
    assert_eq!(label(&procs, gone), Some(("kernel thread".into(), None)));
}

#[test]
fn forgetting_processes_closes_only_files_no_one_maps() {
    let mut procs = Processes::new();
    procs.insert_maps(10, parse_maps(MAPS));
    procs.insert_maps(
        11,
        parse_maps("1000-2000 r-xp 00000000 fd:01 99 /usr/lib/x86_64-linux-gnu/libc.so.6\n"),
    );
    let snapshot = procs.snapshot([0, 1]);
    procs.forget(&HashSet::from([10]));
    assert_eq!(procs.pids(), HashSet::from([11]));
    assert_eq!(procs.file_count(), 1, "libc stays, mapped by 11");
    assert!(procs.file(0).is_none() && procs.file(1).is_some());
    assert!(snapshot.file(0).is_some(), "a snapshot outlives the forgetting");
    // A new file never reuses a forgotten one's id.
    procs.insert_maps(12, parse_maps("1000-2000 r-xp 00000000 fd:01 7 /bin/new\n"));
    assert!(procs.file(2).is_some());
    procs.forget(&HashSet::from([11, 12]));
    assert_eq!(procs.file_count(), 0);
    assert_eq!(procs.process_count(), 0);
}

#[test]
fn frames_the_kernel_resolved_find_their_file_by_build_id() {
    let mut procs = Processes::new();
    let own = std::process::id();
    procs.capture(own).unwrap();
    let build_id = build_id_of(&File::open("/proc/self/exe").unwrap())
        .expect("the test binary has a build ID (the linker's default here)");
    let here = frames_the_kernel_resolved_find_their_file_by_build_id as *const () as u64;
    let UserAddr::File { file, offset, .. } = procs.normalize(own, 0, here) else {
        panic!("own code is in a file");
    };
    // As the kernel reports a caller's frame: the return address's offset, moved back one.
    let object = ObjectOffset {
        build_id,
        offset: offset + 1,
    };
    assert_eq!(
        procs.resolve_object(&object, here, 1),
        Some(UserAddr::File {
            file,
            offset,
            addr: here
        })
    );
    let unknown = ObjectOffset {
        build_id: [7; 20],
        offset,
    };
    assert_eq!(
        procs.resolve_object(&unknown, here, 0),
        None,
        "a build ID no open file has"
    );
    // Once no process maps the file, its build ID is forgotten with it.
    procs.forget(&HashSet::from([own]));
    assert_eq!(procs.resolve_object(&object, here, 1), None);
}

#[test]
fn a_library_mapped_moments_after_a_capture_is_captured_at_once() {
    let own = std::process::id();
    let mut procs = Processes::new();
    procs.record_captures();
    procs.capture(own).unwrap();
    procs.take_captured();
    // What a dlopen leaves behind: an executable mapping of a file, well within the
    // interval that limits refreshes after the capture above.
    let file = File::open("/bin/true").unwrap();
    // SAFETY: a fresh private read-only mapping of an open file, unmapped below.
    let addr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_EXEC,
            libc::MAP_PRIVATE,
            std::os::fd::AsRawFd::as_raw_fd(&file),
            0,
        )
    };
    assert_ne!(addr, libc::MAP_FAILED);
    procs.refresh_changed(own).unwrap();
    let captured = procs.take_captured();
    // SAFETY: the mapping made above, used by nothing else.
    unsafe { libc::munmap(addr, 4096) };
    assert!(
        captured
            .iter()
            .flat_map(|(_, lines)| lines)
            .any(|line| line.start == addr as u64 && line.path.ends_with("true")),
        "the new mapping is captured for the walker: {captured:?}"
    );
}

#[test]
fn only_the_latest_capture_of_the_current_image_goes_to_the_unwinder() {
    let own = std::process::id();
    let mut procs = Processes::new();
    procs.record_captures();
    procs.capture(own).unwrap();
    procs.capture(own).unwrap();
    assert_eq!(procs.take_captured().len(), 1, "one process, one map to load");
    assert!(procs.take_captured().is_empty());

    // Read under generation 0, then the process exec'd: its next announcement brings the map.
    let generation = std::rc::Rc::new(std::cell::Cell::new(0));
    let current = generation.clone();
    procs.with_generations(move |_| current.get());
    procs.capture(own).unwrap();
    generation.set(1);
    assert!(
        procs.take_captured().is_empty(),
        "a map from before the exec is not loaded"
    );
    procs.capture(own).unwrap();
    assert_eq!(procs.take_captured().len(), 1);
}

#[test]
fn an_unchanged_map_is_not_installed_again() {
    let mut procs = Processes::new();
    procs.insert_maps(10, parse_maps(MAPS));
    let installed = procs.maps[&(10, 0)].clone();
    let mut lines = parse_maps(MAPS);
    assert!(procs.same_map(&installed, &lines));
    lines[0].end += 0x1000;
    assert!(!procs.same_map(&installed, &lines), "a range that grew");
    lines = parse_maps(MAPS);
    lines[0].inode += 1;
    assert!(
        !procs.same_map(&installed, &lines),
        "another file at the same place"
    );
    lines = parse_maps(MAPS);
    lines.pop();
    assert!(!procs.same_map(&installed, &lines), "a mapping fewer");
}

#[test]
fn captures_own_process() {
    let mut procs = Processes::new();
    procs.capture(std::process::id()).unwrap();
    let here = captures_own_process as *const () as u64;
    assert!(matches!(
        procs.normalize(std::process::id(), 0, here),
        UserAddr::File { .. }
    ));
    assert!(procs.capture(u32::MAX - 1).is_err());
    let info = procs.info(std::process::id()).unwrap();
    assert!(
        info.executable.as_deref().unwrap().contains("profiler"),
        "{info:?}"
    );
    let file = procs.snapshot(procs.mapped_files(std::process::id(), 0).iter().map(|f| f.0));
    assert!(file.0.values().any(|f| f.identity.is_some()));
}

/// A map the process changed (a loader's libraries) keeps the label its image was read with;
/// a capture (a first announcement: the pid may be another process's by now) reads it anew.
/// Seen through this process's own name, renamed for the test and renamed back.
#[test]
fn a_changed_map_keeps_its_images_label_and_a_capture_reads_it_anew() {
    let own = std::process::id();
    let rename = |name: &str| std::fs::write(format!("/proc/{own}/comm"), name).unwrap();
    let before = comm_of(own).unwrap();
    let mut procs = Processes::new();
    procs.with_generations(|_| 0);
    procs.capture(own).unwrap();
    rename("relabel-test");
    procs.refresh_changed(own).unwrap();
    let after_refresh = procs.name(own).map(str::to_string);
    procs.capture(own).unwrap();
    let after_capture = procs.name(own).map(str::to_string);
    rename(&before);
    assert_eq!(after_refresh, Some(before), "the same image: not read again");
    assert_eq!(after_capture.as_deref(), Some("relabel-test"), "read anew");
}

/// Another process's vDSO is this one's image (the same kernel's), read from its memory; the first
/// bytes of its executable's code are not, nor is the vDSO of a process that is gone. (A 64-bit
/// process's is taken as the same without the read.)
#[test]
fn another_process_maps_the_same_vdso_and_nothing_else_is_taken_for_it() {
    let child = Child::sleeping();
    let pid = child.0.id();
    // Its map once the exec is done: its executable (as /proc names it: a multi-call binary's
    // path is not "sleep") and the vDSO mapped anew after it.
    let mapped = |lines: &[MapsLine], exe: &str| {
        let start = |path: &str| lines.iter().find(|l| l.path == path).map(|l| l.start);
        start(exe).zip(start("[vdso]"))
    };
    let own = std::env::current_exe().unwrap();
    let look = || {
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok()?;
        // (Before its exec, the child is still this test's image.)
        let exe = Some(exe).filter(|e| *e != own)?;
        let text = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
        mapped(&parse_maps(&text), exe.to_str()?)
    };
    let (executable, vdso) = (0..400)
        .find_map(|_| {
            let found = look();
            if found.is_none() {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            found
        })
        .expect("sleep started");
    let answers = (
        vdso::reads_as_own_vdso(pid, vdso),
        vdso::reads_as_own_vdso(pid, executable),
    );
    drop(child);
    assert_eq!(
        answers,
        (true, false),
        "vDSO at {vdso:#x}, sleep at {executable:#x}"
    );
    assert!(!vdso::reads_as_own_vdso(pid, vdso), "gone");
    assert!(
        vdso > u64::from(u32::MAX) && vdso::same_vdso(pid, vdso),
        "a 64-bit process's, not read"
    );
}
