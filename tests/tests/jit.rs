//! JIT code named by its runtime's perf map (`/tmp/perf-PID.map`): the jit workload writes a
//! loop's machine code into anonymous memory, names it `jitted_spin` in its perf map, and times
//! it, a C function and an unnamed copy of the loop by its own clock. Then real runtimes with
//! the flags the README gives them: Node.js (jssplit.js) and the JVM (JavaSplit.java), each
//! timing three functions by its own clock.
use std::collections::HashMap;

use bpfprof_tests::*;
use serde_json::Value;

/// The share of one thread's samples each of `names` (its outermost frame of that name, itself
/// and its callees) has among the samples of any of them, and the samples of each with a frame
/// `caller` picks further out: each printed against the workload's share of `truth`'s `keys`,
/// each within `SHARE_TOLERANCE_PP`, and `caller` below at least 95% of each.
fn assert_runtime_split(
    label: &str,
    report: &Report,
    tid: u32,
    names: &[&str],
    truth: &HashMap<String, f64>,
    keys: &[&str],
    caller: (&str, &dyn Fn(&Value) -> bool),
) {
    let (caller, is_caller) = caller;
    let mut samples = vec![0u64; names.len()];
    let mut called = vec![0u64; names.len()];
    for stack in report.stacks().iter().filter(|s| s["tid"] == tid) {
        let frames = stack["frames"].as_array().unwrap();
        let count = stack["count"].as_u64().unwrap();
        for (i, name) in names.iter().enumerate() {
            if let Some(at) = frames.iter().position(|f| f["function"] == *name) {
                samples[i] += count;
                if frames[..at].iter().any(is_caller) {
                    called[i] += count;
                }
            }
        }
    }
    let all: u64 = samples.iter().sum();
    let measured: f64 = keys.iter().map(|k| truth[*k]).sum();
    assert!(all > 500, "{label}: {all} samples of thread {tid} in {names:?}");
    for (i, name) in names.iter().enumerate() {
        let got = 100.0 * samples[i] as f64 / all as f64;
        let want = 100.0 * truth[keys[i]] / measured;
        println!(
            "{label}: {name} {got:.2}% of {all} samples, {want:.2}% of the time by the workload's clock; \
             {} of {} under {caller}",
            called[i], samples[i]
        );
        // Sampling's own error counts too: three binomial standard errors of the share, where
        // they pass the usual tolerance (1434 samples at 60%: 3.9 pp).
        let p = want / 100.0;
        let sampling = 300.0 * (p * (1.0 - p) / all as f64).sqrt();
        assert!(
            (got - want).abs() <= SHARE_TOLERANCE_PP.max(sampling),
            "{label}: {name} {got:.2}% vs {want:.2}% (sampling error: {sampling:.2} pp)"
        );
        assert!(
            called[i] as f64 >= 0.95 * samples[i] as f64,
            "{label}: {name} under {caller} in {} of {} samples",
            called[i],
            samples[i]
        );
    }
}

/// The JIT frames (module `[jit]`) named `function` in `report`'s stacks of `tid`.
fn jit_frames_named<'a>(report: &'a Report, tid: u32, function: &str) -> Vec<&'a Value> {
    (report.stacks().iter().filter(|s| s["tid"] == tid))
        .flat_map(|s| s["frames"].as_array().unwrap())
        .filter(|f| f["function"] == function && f["module"] == "[jit]")
        .collect()
}

/// Node.js 20 with `--perf-basic-prof --interpreted-frames-native-stack` (the README's flags;
/// `--no-turbo-inlining` keeps each function a frame of its own), run in a directory of its
/// own (those flags make V8 write a log file where it runs): the main thread's three functions
/// split as its clock measured, each under the script's `main` (a JIT frame, not node's own C
/// `main`), each named by its own name (V8's tier mark dropped: one row whichever tier compiled
/// it) with the script as its file, in the module `[jit]`.
#[test]
fn node_functions_are_named_and_split_as_measured() {
    let script = format!("{}/workloads/jssplit.js", env!("CARGO_MANIFEST_DIR"));
    let dir = temp_path(&format!("node-{}", rand_suffix()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("profile.json");
    let out = bpfprof()
        .args(["-F", "999", "-o", path.to_str().unwrap(), "--"])
        .args(["node", "--perf-basic-prof", "--interpreted-frames-native-stack"])
        .args(["--no-turbo-inlining", &script, "3"])
        .current_dir(&dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let truth = truth(&stdout(&out));
    let pid = truth["pid"] as u32;
    let _ = std::fs::remove_file(format!("/tmp/perf-{pid}.map"));
    let report = Report::read(&path);
    let _ = std::fs::remove_dir_all(&dir);
    let is_main = |f: &Value| f["function"] == "main" && f["module"] == "[jit]";
    assert_runtime_split(
        "node",
        &report,
        pid,
        &["alphaWork", "betaWork", "gammaWork"],
        &truth,
        &["alpha_ns", "beta_ns", "gamma_ns"],
        ("the script's main", &is_main),
    );
    for function in ["alphaWork", "main"] {
        let frames = jit_frames_named(&report, pid, function);
        assert!(!frames.is_empty(), "no JIT frame named {function}");
        for frame in frames {
            assert_eq!(
                (&frame["kind"], &frame["file"]),
                (&"perf_map".into(), &script.as_str().into()),
                "{frame}"
            );
        }
    }
}

/// OpenJDK 17 with `-XX:+PreserveFramePointer` and `jcmd PID Compiler.perfmap` (which the
/// workload runs on itself once its functions are compiled): the main thread's three
/// functions split as its CPU clock measured, named `Class.method(ARGS)` (the return type
/// dropped), each walked through the interpreter's and the compiled code's frames down to the
/// launcher's `JavaMain`.
#[test]
fn java_methods_are_named_and_split_as_measured() {
    let classes = temp_path(&format!("javasplit-{}", rand_suffix()));
    let source = format!("{}/workloads/JavaSplit.java", env!("CARGO_MANIFEST_DIR"));
    let compiled = std::process::Command::new("javac")
        .arg("-d")
        .arg(&classes)
        .arg(&source)
        .status()
        .expect("javac (cargo xtask setup installs it)");
    assert!(compiled.success(), "javac {source} failed");
    let (out, path) = profile_workload(
        "999",
        &format!("java-{}.json", rand_suffix()),
        &[
            "java",
            "-XX:+PreserveFramePointer",
            "-XX:CompileCommand=quiet",
            "-XX:CompileCommand=dontinline,JavaSplit::*Work",
            "-cp",
            classes.to_str().unwrap(),
            "JavaSplit",
            "4",
        ],
    );
    let truth = truth(&stdout(&out));
    let pid = truth["pid"] as u32;
    let _ = std::fs::remove_file(format!("/tmp/perf-{pid}.map"));
    let _ = std::fs::remove_dir_all(&classes);
    assert_eq!(truth["perfmap"], 0.0, "jcmd Compiler.perfmap failed");
    let report = Report::read(&path);
    assert_runtime_split(
        "java",
        &report,
        truth["main_tid"] as u32,
        &[
            "JavaSplit.alphaWork(int)",
            "JavaSplit.betaWork(int)",
            "JavaSplit.gammaWork(int)",
        ],
        &truth,
        &["alpha_cpu", "beta_cpu", "gamma_cpu"],
        ("JavaMain", &|f: &Value| f["function"] == "JavaMain"),
    );
}

/// Each function's self share of the samples is the workload's own share of time within
/// `SHARE_TOLERANCE_PP`: the named JIT code under its perf map's name (module `[jit]`, named by
/// `perf_map`), the unnamed copy as `[unknown]` in `[anon]` (never under a neighbour's name).
/// The map's garbage line is skipped.
#[test]
fn jit_code_is_named_from_its_perf_map() {
    let bin = workload("jit");
    let (out, path) = profile_workload(
        "499",
        &format!("jit-{}.json", rand_suffix()),
        &[bin.to_str().unwrap(), "3000"],
    );
    let truth = truth(&stdout(&out));
    let pid = truth["pid"] as u32;
    let _ = std::fs::remove_file(format!("/tmp/perf-{pid}.map"));
    let report = Report::read(&path);
    let shares = truth_shares(&truth, &["jitted_spin", "native_spin", "anon"]);
    for name in ["jitted_spin", "native_spin"] {
        let (got, want) = (report.self_share(pid, name) * 100.0, shares[name] * 100.0);
        println!("{name}: {got:.2}% self, the workload measured {want:.2}%");
        assert!(
            (got - want).abs() <= SHARE_TOLERANCE_PP,
            "{name}: {got:.2}% vs {want:.2}%"
        );
    }
    let leaves: Vec<&serde_json::Value> = (report.stacks_of(pid).into_iter())
        .filter_map(|s| s["frames"].as_array()?.last())
        .collect();
    let jitted = leaves
        .iter()
        .find(|f| f["function"] == "jitted_spin")
        .expect("a jitted_spin leaf");
    assert_eq!(
        (&jitted["module"], &jitted["kind"]),
        (&"[jit]".into(), &"perf_map".into()),
        "{jitted}"
    );
    let samples = report.samples_of(pid) as f64;
    let anon: u64 = (report.stacks_of(pid).iter())
        .filter(|s| {
            s["frames"]
                .as_array()
                .and_then(|f| f.last())
                .is_some_and(|f| f["module"] == "[anon]")
        })
        .map(|s| s["count"].as_u64().unwrap())
        .sum();
    let want = shares["anon"] * 100.0;
    let got = 100.0 * anon as f64 / samples;
    println!("unnamed JIT code: {got:.2}% of {samples} samples in [anon], the workload measured {want:.2}%");
    assert!(
        (got - want).abs() <= SHARE_TOLERANCE_PP,
        "{got:.2}% vs {want:.2}%"
    );
}
