//! Python frames in profiles: the pysplit workload (tests/workloads/pysplit.py) run by each
//! interpreter the machine has whose frames are read (pyenv's shared 3.11, 3.12 and 3.13, and
//! Debian's static 3.11), its functions' shares checked against the CPU time each thread
//! measured around each call.
use bpfprof_tests::*;
use serde_json::Value;

const PYENV: &str = "/root/.pyenv/versions";

fn interpreters() -> Vec<String> {
    let mut found: Vec<String> = [
        "3.11.7/bin/python3.11",
        "3.12.1/bin/python3.12",
        "3.13.0/bin/python3.13",
    ]
    .iter()
    .map(|p| format!("{PYENV}/{p}"))
    .collect();
    found.push("/usr/bin/python3.11".into());
    for python in &found {
        assert!(
            std::path::Path::new(python).exists(),
            "{python} is missing: cargo xtask setup installs it"
        );
    }
    found
}

fn script() -> String {
    format!("{}/workloads/pysplit.py", env!("CARGO_MANIFEST_DIR"))
}

/// The frames of a stack, outermost first, as (function, kind) with the frame itself.
fn frames(stack: &Value) -> Vec<&Value> {
    stack["frames"].as_array().unwrap().iter().collect()
}

/// Each Python function's total share of the process's samples is the share of the process's
/// CPU time its thread measured in it, within `SHARE_TOLERANCE_PP`; each sample of a thread
/// shows that thread's own Python frames (the spinning thread's never the main thread's, and
/// the other way round); every frame of alpha_work is named from its code object (its file,
/// a line of its body); Python frames sit between native ones (the sort's C frames on top of
/// beta_work, the interpreter's entry below `<module>`); no stack lost its Python frames.
#[test]
fn python_functions_get_the_cpu_time_they_measured() {
    for python in interpreters() {
        let path = temp_path(&format!("python-{}.json", rand_suffix()));
        let script = script();
        let out = run(&[
            "-F",
            "999",
            "-o",
            path.to_str().unwrap(),
            "--",
            &python,
            &script,
            "2",
        ]);
        assert!(out.status.success(), "{python}: {}", stderr(&out));
        let truth = truth(&stdout(&out));
        let report = Report::read(&path);
        let pid = truth["pid"] as u32;
        let process = truth["process_cpu"];
        for name in ["alpha", "beta", "gamma"] {
            let got = 100.0 * report.total_share(pid, &format!("{name}_work"));
            let want = 100.0 * truth[&format!("{name}_cpu")] / process;
            println!(
                "{python}: {name}_work {got:.2}% of the samples, {want:.2}% of the CPU time by its clock"
            );
            assert!(
                (got - want).abs() <= SHARE_TOLERANCE_PP,
                "{python}: {name}_work {got:.2}% vs {want:.2}%"
            );
        }
        assert_threads_own_frames(&report, pid, &truth, &python);
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
        std::fs::remove_file(&path).unwrap();
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

fn assert_named_and_interleaved(
    report: &Report,
    pid: u32,
    truth: &std::collections::HashMap<String, f64>,
    python: &str,
    script: &str,
) {
    let stacks = report.stacks_of(pid);
    let mut alpha_frames = 0;
    for frame in stacks.iter().flat_map(|s| frames(s)) {
        if frame["function"] != "alpha_work" {
            continue;
        }
        alpha_frames += 1;
        assert_eq!(
            (&frame["kind"], &frame["file"]),
            (&"python".into(), &script.into()),
            "{frame}"
        );
        assert_eq!(frame["module"], "pysplit.py");
        let line = frame["line"].as_f64().unwrap();
        assert!(
            line >= truth["alpha_first"] && line <= truth["alpha_last"],
            "{python}: alpha_work at line {line}, not in its body ({}-{})",
            truth["alpha_first"],
            truth["alpha_last"]
        );
    }
    assert!(alpha_frames > 0);
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
    let python = format!("{PYENV}/3.12.1/bin/python3.12");
    let path = temp_path(&format!("python-sched-{}.json", rand_suffix()));
    let out = run(&[
        "--mode",
        "sched",
        "-o",
        path.to_str().unwrap(),
        "--",
        &python,
        "-c",
        NAPPER,
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let pid = truth(&stdout(&out))["pid"] as u32;
    let report = read_json(&path);
    let (mut under, mut all) = (0.0, 0.0);
    for stack in report["offcpu"].as_array().unwrap() {
        if stack["pid"] != pid {
            continue;
        }
        let ns = stack["total_ns"].as_f64().unwrap();
        all += ns;
        let napper = stack["frames"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["function"] == "napper");
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
        "{under} ns under napper for ten 200 ms naps"
    );
    std::fs::remove_file(&path).unwrap();
}

/// A Python process in a pid namespace of its own (as in a container) numbers its threads
/// there, and its thread states hold those numbers: its frames are found all the same.
#[test]
fn a_python_process_in_its_own_pid_namespace_shows_its_frames() {
    let python = format!("{PYENV}/3.12.1/bin/python3.12");
    let path = temp_path(&format!("python-ns-{}.json", rand_suffix()));
    let script = script();
    let command = [
        "unshare",
        "--pid",
        "--fork",
        "--mount-proc",
        &python,
        &script,
        "1",
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
