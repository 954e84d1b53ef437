//! Python frames in profiles: the pysplit workload (tests/workloads/pysplit.py) run by each
//! interpreter the machine has whose frames are read (pyenv's shared 3.10 to 3.13, and
//! Debian's static 3.11; on the arm64 guest, Debian's arm64 3.11), its functions' shares checked
//! against the CPU time each thread measured around each call; off-CPU and lock-mode stacks; a
//! process in its own pid namespace.
use bpfprof_tests::*;
use serde_json::Value;

const PYENV: &str = "/root/.pyenv/versions";
const DEBIAN: &str = "/usr/bin/python3.11";

/// How long pysplit runs. Under the guest's emulation bpfprof takes longer to read a new
/// process's unwind tables, and samples taken before they are ready are walked by frame pointers
/// (no Python frames): a longer run keeps that start a small part of it.
const RUN_SECONDS: &str = if cfg!(target_arch = "x86_64") { "2" } else { "5" };

/// A 3.12 (pyenv's) where the machine has one, else Debian's 3.11 (the arm64 guest).
fn a_python() -> String {
    match cfg!(target_arch = "x86_64") {
        true => format!("{PYENV}/3.12.1/bin/python3.12"),
        false => DEBIAN.into(),
    }
}

/// Each interpreter, as the command that starts it: 3.12 and 3.13 also under `-X perf`, where
/// a trampoline in anonymous memory runs between the loop and its caller (and the process
/// writes a perf map naming it).
/// On the arm64 guest, Debian's python3.11 alone (pyenv is the host's).
fn interpreters() -> Vec<Vec<String>> {
    let pyenv = [
        "3.10.13/bin/python3.10",
        "3.11.7/bin/python3.11",
        "3.12.1/bin/python3.12",
        "3.13.0/bin/python3.13",
    ];
    let mut found: Vec<String> = match cfg!(target_arch = "x86_64") {
        true => pyenv.iter().map(|p| format!("{PYENV}/{p}")).collect(),
        false => Vec::new(),
    };
    found.push(DEBIAN.into());
    for python in &found {
        assert!(
            std::path::Path::new(python).exists(),
            "{python} is missing: cargo xtask setup installs it"
        );
    }
    let with_perf = (found.iter())
        .filter(|p| p.ends_with("3.12") || p.ends_with("3.13"))
        .map(|p| vec![p.clone(), "-X".into(), "perf".into()]);
    let mut commands: Vec<Vec<String>> = found.iter().map(|p| vec![p.clone()]).collect();
    commands.extend(with_perf.collect::<Vec<_>>());
    commands
}

fn script() -> String {
    format!("{}/workloads/pysplit.py", env!("CARGO_MANIFEST_DIR"))
}

/// The frames of a stack, outermost first, as (function, kind) with the frame itself.
fn frames(stack: &Value) -> Vec<&Value> {
    stack["frames"].as_array().unwrap().iter().collect()
}

/// Each Python function's total share of the process's samples is the share of the process's
/// CPU time its thread measured in it, within `SHARE_TOLERANCE_PP` (and the host's steal); each sample of a thread
/// shows that thread's own Python frames (the spinning thread's never the main thread's, and
/// the other way round); every frame of alpha_work is named from its code object (its file,
/// a line of its body, or its `def` line while the frame has not started); Python frames sit
/// between native ones (the sort's C frames on top of beta_work, the interpreter's entry below
/// `<module>`); no stack lost its Python frames; the caller chain of each work function is
/// whole on at least 95% of its samples.
#[test]
fn python_functions_get_the_cpu_time_they_measured() {
    for command in interpreters() {
        let python = command.join(" ");
        let path = temp_path(&format!("python-{}.json", rand_suffix()));
        let script = script();
        let mut args: Vec<&str> = vec!["-F", "999", "-o", path.to_str().unwrap(), "--"];
        args.extend(command.iter().map(String::as_str));
        args.extend([script.as_str(), RUN_SECONDS]);
        let (out, stolen) = stolen_during(|| run(&args));
        assert!(out.status.success(), "{python}: {}", stderr(&out));
        let truth = truth(&stdout(&out));
        let report = Report::read(&path);
        let pid = truth["pid"] as u32;
        let _ = std::fs::remove_file(format!("/tmp/perf-{pid}.map"));
        let process = truth["process_cpu"];
        // Samples are timed by a clock that runs through stolen time, the threads' by theirs
        // that does not: a share can move by at most what was stolen against the process's CPU.
        let tolerance = SHARE_TOLERANCE_PP + 100.0 * stolen / process;
        for name in ["alpha", "beta", "gamma"] {
            let got = 100.0 * report.total_share(pid, &format!("{name}_work"));
            let want = 100.0 * truth[&format!("{name}_cpu")] / process;
            println!(
                "{python}: {name}_work {got:.2}% of the samples, {want:.2}% of the CPU time by its clock"
            );
            if (got - want).abs() > tolerance {
                print_heaviest_stacks(&report, pid, &python);
                panic!("{python}: {name}_work {got:.2}% vs {want:.2}% (report kept: {path:?})");
            }
        }
        assert_threads_own_frames(&report, pid, &truth, &python);
        assert_chains_whole(&report, pid, &python);
        assert_named_and_interleaved(&report, pid, &truth, &python, &script);
        let health = &report.0["health"];
        println!("{python}: health {health}");
        assert!(
            health["python_frames"].as_u64().unwrap() > 0,
            "{python}: {health}"
        );
        assert_eq!(
            health["python_cut"], 0,
            "{python}: no stack lost its Python frames"
        );
        assert_entering_rare(health, report.samples_of(pid), &command[0]);
        std::fs::remove_file(&path).unwrap();
    }
}

/// A stack taken as 3.11's or 3.12's evaluation loop was entering a call, before it wrote the
/// frame it points the thread at, has no Python frames (`python_entering`): at most one sample
/// in 500 (the loop's first ~20 instructions, of every Python call under `-X perf`); never on
/// other versions, which publish the frame in one store.
fn assert_entering_rare(health: &Value, samples: u64, python: &str) {
    let entering = health["python_entering"].as_u64().unwrap();
    let publishes_late = python.ends_with("3.11") || python.ends_with("3.12");
    assert!(
        entering == 0 || publishes_late && entering * 500 <= samples,
        "{python}: {entering} of {samples} samples entering the evaluation loop lost their Python frames"
    );
}

/// What a failed share check needs to be understood: the process's health and its heaviest
/// stacks, thread and frames.
fn print_heaviest_stacks(report: &Report, pid: u32, python: &str) {
    println!("{python}: health {}", report.0["health"]);
    let mut stacks = report.stacks_of(pid);
    stacks.sort_by_key(|s| std::cmp::Reverse(s["count"].as_u64().unwrap()));
    for stack in stacks.iter().take(8) {
        println!(
            "{python}: {} samples on tid {}: {:?}",
            stack["count"],
            stack["tid"],
            Report::frames(stack)
        );
    }
}

fn assert_threads_own_frames(
    report: &Report,
    pid: u32,
    truth: &std::collections::HashMap<String, f64>,
    python: &str,
) {
    let (main, gamma) = (truth["main_tid"], truth["gamma_tid"]);
    let of_thread = |tid: f64| -> Vec<&Value> {
        (report.stacks_of(pid).into_iter())
            .filter(|s| s["tid"].as_f64() == Some(tid))
            .collect()
    };
    let has = |s: &Value, f: &str| Report::frames(s).contains(&f);
    let count = |stacks: &[&Value], keep: &dyn Fn(&Value) -> bool| -> u64 {
        (stacks.iter())
            .filter(|s| keep(s))
            .map(|s| s["count"].as_u64().unwrap())
            .sum()
    };
    let (mains, gammas) = (of_thread(main), of_thread(gamma));
    let gamma_samples = count(&gammas, &|_| true);
    let gamma_in_work = count(&gammas, &|s| has(s, "gamma_work"));
    println!("{python}: the spinning thread has {gamma_samples} samples, {gamma_in_work} in gamma_work");
    assert!(gamma_samples > 100 && gamma_in_work as f64 >= 0.95 * gamma_samples as f64);
    assert_eq!(
        count(&gammas, &|s| has(s, "alpha_work") || has(s, "beta_work")),
        0
    );
    assert_eq!(
        count(&mains, &|s| has(s, "gamma_work")),
        0,
        "{python}: the main thread's frames are its own"
    );
}

/// Each work function's samples have its callers down to the thread's native start: the main
/// thread's `_start -> ... <module> -> main -> nested -> alpha_work` (and `beta_work`), the
/// spinning thread's `clone3 -> ... Thread.run -> ... gamma_work`, on at least 95% of them. (On
/// the arm64 guest the C library and Debian's python3.11 have no symbol table: the roots are
/// not named there, and the Python callers are what is checked.) 3.10's code objects have no
/// qualified name: `run` for `Thread.run`.
fn assert_chains_whole(report: &Report, pid: u32, python: &str) {
    let chains: [(&str, &[&str]); 3] = [
        ("alpha_work", &["_start", "<module>", "main", "nested"]),
        ("beta_work", &["_start", "<module>", "main"]),
        ("gamma_work", &["clone3", "Thread.run", "main.<locals>.gamma"]),
    ];
    let named_roots = cfg!(target_arch = "x86_64");
    for (function, callers) in chains {
        let callers = &callers[usize::from(!named_roots)..];
        let (mut all, mut whole) = (0, 0);
        for stack in report.stacks_of(pid) {
            let frames = Report::frames(stack);
            let Some(at) = frames.iter().position(|f| *f == function) else {
                continue;
            };
            let count = stack["count"].as_u64().unwrap();
            all += count;
            // In order, outermost first.
            // 3.10's names only: the others have their qualified ones.
            let short = |name: &str| match python.contains("3.10") {
                true => name.rsplit('.').next().unwrap_or(name).to_string(),
                false => name.to_string(),
            };
            let mut rest = frames[..at].iter();
            if callers.iter().all(|c| rest.any(|f| f == c || *f == short(c))) {
                whole += count;
            }
        }
        println!("{python}: {function} has its callers {callers:?} on {whole} of {all} samples");
        assert!(
            all > 50 && whole as f64 >= 0.95 * all as f64,
            "{python}: {function}'s chain whole on {whole} of {all} samples"
        );
    }
}

fn assert_named_and_interleaved(
    report: &Report,
    pid: u32,
    truth: &std::collections::HashMap<String, f64>,
    python: &str,
    script: &str,
) {
    let stacks = report.stacks_of(pid);
    let (mut alpha_frames, mut alpha_samples, mut at_def) = (0, 0, 0);
    let weighed = stacks
        .iter()
        .flat_map(|s| frames(s).into_iter().map(|f| (f, s["count"].as_u64().unwrap())));
    for (frame, count) in weighed {
        if frame["function"] != "alpha_work" {
            continue;
        }
        alpha_frames += 1;
        alpha_samples += count;
        assert_eq!(
            (&frame["kind"], &frame["file"]),
            (&"python".into(), &script.into()),
            "{frame}"
        );
        assert_eq!(frame["module"], "pysplit.py");
        let line = frame["line"].as_f64().unwrap();
        assert!(
            line >= truth["alpha_first"] && line <= truth["alpha_last"],
            "{python}: alpha_work at line {line}, not in its body or its def ({}-{})",
            truth["alpha_first"],
            truth["alpha_last"]
        );
        if line == truth["alpha_first"] {
            at_def += count;
        }
    }
    assert!(alpha_frames > 0);
    // The `def` line is only the moment a call begins: nearly every sample is in the body.
    assert!(
        at_def * 100 <= alpha_samples,
        "{python}: {at_def} of alpha_work's {alpha_samples} samples at its def line"
    );
    let interleaved = stacks.iter().any(|s| {
        let frames = frames(s);
        let at = |name: &str| frames.iter().position(|f| f["function"] == name);
        let (Some(module), Some(beta)) = (at("<module>"), at("beta_work")) else {
            return false;
        };
        let native = |f: &&Value| f["kind"] != "python";
        module > 0 && native(&frames[module - 1]) && frames[beta + 1..].iter().any(native)
    });
    assert!(
        interleaved,
        "{python}: no stack with native frames below <module> and above beta_work"
    );
}

/// `bpfprof --mode MODE -o FILE -- PYTHON -c SCRIPT`, which must succeed: the script's truth,
/// the report, and its file.
/// A stack's frames as `function:line` (a native frame's line unknown: its name alone).
fn names(frames: &Value) -> String {
    let frames = frames.as_array().map(Vec::as_slice).unwrap_or_default();
    let name = |f: &Value| match (f["function"].as_str(), f["line"].as_u64()) {
        (Some(function), Some(line)) if f["kind"] == "python" => format!("{function}:{line}"),
        (Some(function), _) => function.to_string(),
        _ => "?".to_string(),
    };
    frames.iter().map(name).collect::<Vec<_>>().join(";")
}

fn run_script(
    mode: &str,
    python: &str,
    script: &str,
) -> (std::collections::HashMap<String, f64>, Value, std::path::PathBuf) {
    let path = temp_path(&format!("python-{mode}-{}.json", rand_suffix()));
    let out = run(&[
        "--mode",
        mode,
        "-o",
        path.to_str().unwrap(),
        "--",
        python,
        "-c",
        script,
    ]);
    assert!(out.status.success(), "{python}: {}", stderr(&out));
    (truth(&stdout(&out)), read_json(&path), path)
}

/// Off-CPU stacks (sched mode) show the Python function that slept, at the line of its sleep:
/// a function that naps 200 ms ten times has the thread's off-CPU time under it. (It starts
/// after a first sleep, by which the process's tables are loaded: a stack taken before is
/// walked by frame pointers, without Python frames.)
#[test]
fn python_functions_show_in_off_cpu_stacks() {
    const NAPPER: &str = "import os, time\n\
        def napper():\n    for _ in range(10):\n        time.sleep(0.2)\n\
        time.sleep(0.3)\n\
        napper()\n\
        print(f'TRUTH pid={os.getpid()}', flush=True)\n";
    let (truth, report, path) = run_script("sched", &a_python(), NAPPER);
    let pid = truth["pid"] as u32;
    let (mut under, mut all, mut seen) = (0.0, 0.0, String::new());
    for stack in report["offcpu"].as_array().unwrap() {
        if stack["pid"] != pid {
            continue;
        }
        let ns = stack["total_ns"].as_f64().unwrap();
        all += ns;
        let frames = stack["frames"].as_array().unwrap();
        let names: Vec<&str> = frames.iter().filter_map(|f| f["function"].as_str()).collect();
        seen += &format!(
            "\n  {:.3} s in {} sleeps: {}",
            ns / 1e9,
            stack["count"],
            names.join(";")
        );
        let napper = frames.iter().find(|f| f["function"] == "napper");
        if let Some(frame) = napper {
            assert_eq!(
                (&frame["kind"], &frame["file"], &frame["line"]),
                (&"python".into(), &"<string>".into(), &4.into())
            );
            under += ns;
        }
    }
    println!("{:.3} s off CPU under napper of {:.3} s", under / 1e9, all / 1e9);
    assert!(
        (2.0e9..=2.2e9).contains(&under),
        "{under} ns under napper for ten 200 ms naps; the process's off-CPU stacks:{seen}\nhealth: {}",
        report["health"]
    );
    std::fs::remove_file(&path).unwrap();
}

/// Lock mode's waiting stacks show the Python function blocked on a `threading.Lock` (a POSIX
/// semaphore under it), at the line of its `acquire`, and the releasing stacks the function
/// that held it: a waiter blocked ten times while the main thread holds the lock 100 ms, its
/// waits summed by its own clock.
#[test]
fn a_python_function_blocked_on_a_lock_is_named_in_lock_mode() {
    const LOCKS: &str = "import os, threading, time\n\
        lock, held, done, waited = threading.Lock(), threading.Event(), threading.Event(), []\n\
        def waiter():\n\
        \x20   for _ in range(10):\n\
        \x20       held.wait(); held.clear(); start = time.monotonic()\n\
        \x20       lock.acquire()\n\
        \x20       waited.append(time.monotonic() - start); lock.release(); done.set()\n\
        def holder():\n\
        \x20   for _ in range(10):\n\
        \x20       lock.acquire(); held.set(); time.sleep(0.1); lock.release()\n\
        \x20       done.wait(); done.clear()\n\
        thread = threading.Thread(target=waiter); thread.start(); holder(); thread.join()\n\
        print(f'TRUTH pid={os.getpid()} waited_ns={sum(waited) * 1e9:.0f}', flush=True)\n";
    let mut pythons = vec![DEBIAN.to_string()];
    if cfg!(target_arch = "x86_64") {
        pythons.push(format!("{PYENV}/3.13.0/bin/python3.13"));
    }
    for python in pythons {
        let (truth, report, path) = run_script("lock", &python, LOCKS);
        let innermost_python = |frames: &Value| -> Option<(String, u64)> {
            let frame = (frames.as_array()?.iter()).rfind(|f| f["kind"] == "python")?;
            Some((frame["function"].as_str()?.to_string(), frame["line"].as_u64()?))
        };
        let wait = |v: &Value| v["total_wait_ns"].as_f64().unwrap();
        // The lock the waiter blocked on: the one whose waiting stacks have `waiter` innermost.
        let locks = report["locks"].as_array().unwrap();
        let lock = (locks.iter())
            .filter(|l| l["pid"] == truth["pid"] as u32)
            .find(|l| {
                (l["waiters"].as_array().unwrap().iter())
                    .any(|w| innermost_python(&w["frames"]).is_some_and(|(f, _)| f == "waiter"))
            })
            .unwrap_or_else(|| panic!("{python}: no lock waited on in waiter: {locks:#?}"));
        let in_waiter: f64 = (lock["waiters"].as_array().unwrap().iter())
            .filter(|w| innermost_python(&w["frames"]) == Some(("waiter".into(), 6)))
            .map(wait)
            .sum();
        let released_by_holder: f64 = (lock["holders"].as_array().unwrap().iter())
            .filter(|h| innermost_python(&h["frames"]).is_some_and(|(f, _)| f == "holder"))
            .map(wait)
            .sum();
        let measured = truth["waited_ns"];
        println!(
            "{python}: waiter blocked {:.1} ms at line 6 ({:.1} ms on the lock, {:.1} ms released by holder), \
             {:.1} ms by its clock",
            in_waiter / 1e6,
            wait(lock) / 1e6,
            released_by_holder / 1e6,
            measured / 1e6
        );
        assert!(
            measured > 0.8e9,
            "{python}: the waiter should have waited: {measured} ns"
        );
        let waiters: String = (lock["waiters"].as_array().unwrap().iter())
            .map(|w| format!("\n  {:.1} ms: {}", wait(w) / 1e6, names(&w["frames"])))
            .collect();
        assert!(
            (in_waiter - measured).abs() <= 0.05 * measured,
            "{python}: {in_waiter} ns in waiter at line 6, {measured} ns by its clock; \
             the lock's waiting stacks:{waiters}\nhealth: {}",
            report["health"]
        );
        assert!(
            released_by_holder >= 0.95 * wait(lock),
            "{python}: {released_by_holder} ns released by holder"
        );
        std::fs::remove_file(&path).unwrap();
    }
}

/// A Python process in a pid namespace of its own (as in a container) numbers its threads
/// there, and its thread states hold those numbers: its frames are found all the same.
#[test]
fn a_python_process_in_its_own_pid_namespace_shows_its_frames() {
    let python = a_python();
    let path = temp_path(&format!("python-ns-{}.json", rand_suffix()));
    let script = script();
    let command = [
        "unshare",
        "--pid",
        "--fork",
        "--mount-proc",
        &python,
        &script,
        "2",
    ];
    let mut args = vec!["-F", "499", "-o", path.to_str().unwrap(), "--"];
    args.extend(command);
    let out = run(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    let truth = truth(&stdout(&out));
    assert!(
        truth["pid"] < 10.0,
        "the workload ran as pid {} of its own namespace",
        truth["pid"]
    );
    let report = Report::read(&path);
    let of_python: Vec<&Value> = (report.stacks().iter())
        .filter(|s| s["comm"].as_str().is_some_and(|c| c.starts_with("python")))
        .collect();
    let samples = |keep: &dyn Fn(&Value) -> bool| -> u64 {
        (of_python.iter())
            .filter(|s| keep(s))
            .map(|s| s["count"].as_u64().unwrap())
            .sum()
    };
    let all = samples(&|_| true);
    let named = samples(&|s| {
        ["alpha_work", "beta_work", "gamma_work"]
            .iter()
            .any(|f| Report::frames(s).contains(f))
    });
    let health = &report.0["health"];
    println!(
        "in its own pid namespace: {named} of {all} samples under the workload's functions; health {health}"
    );
    assert!(all > 300 && named as f64 >= 0.9 * all as f64, "{named} of {all}");
    assert_eq!(health["python_cut"], 0);
    std::fs::remove_file(&path).unwrap();
}
