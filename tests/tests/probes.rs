//! Probes on what a user names in their own program: a source line (`uprobe:FILE:SOURCE:LINE`,
//! from the DWARF line tables, listed by `list --probes FILE --lines FUNCTION`), and each hit
//! recorded with the values fetched there (`record`, `script`); tracepoints by a glob. Ground
//! truth: the events workload's `lines N` runs one marked line exactly N times and prints the sum
//! of the values it stored there; `writes N` makes N one-byte writes.
use std::collections::HashMap;

use bpfprof_tests::*;

fn events_bin() -> String {
    workload("events").to_str().unwrap().to_string()
}

/// The number of the workload's line marked `/* PROBE-LINE */`, read from its source.
fn marked_line() -> usize {
    line_marked("PROBE-LINE")
}

/// The number of the workload's line marked `/* MARK */`.
fn line_marked(mark: &str) -> usize {
    let source = concat!(env!("CARGO_MANIFEST_DIR"), "/workloads/events.c");
    let text = std::fs::read_to_string(source).unwrap();
    let mark = format!("/* {mark} */");
    1 + text
        .lines()
        .position(|l| l.contains(&mark))
        .expect("the marked line")
}

/// A source line the compiler copied into two functions (inlined) is probed in both, as one
/// event: counted exactly as often as it ran, and a global fetched there (at each copy's own
/// distance from it) reads what the workload stored.
#[test]
fn a_line_inlined_into_two_functions_is_probed_in_both() {
    let bin = events_bin();
    let event = format!("uprobe:{bin}:events.c:{}", line_marked("INLINED-LINE"));
    let (report, out) = stat(&["-e", &event], &[&bin, "inlined", "10000"]);
    let truth = truth(&out);
    let counted = counter(&report, &event)["value"].as_f64();
    println!(
        "ran {} times ({} in bump_odd, {} in bump_even), counted {counted:?}",
        truth["inlined"], truth["odd"], truth["even"]
    );
    assert_eq!(counted, Some(truth["inlined"]));
    let (hits, totals, truth, _) = record(&["-e", &event, "--fetch", "line_value"], &["inlined", "10000"]);
    let sum: f64 = hits
        .iter()
        .map(|h| h["fields"]["line_value"].as_f64().unwrap())
        .sum();
    println!(
        "{} hits, line_value sums to {sum} (the workload's {}); totals {totals}",
        hits.len(),
        truth["before_sum"]
    );
    assert_eq!(hits.len() as f64, truth["inlined"]);
    // Sampled at every hit: each copy's samples are under its own function.
    let (report, _, truth) = sample_hits(&["-e", &event], &[&bin, "inlined", "10000"]);
    let pid = truth["pid"] as u32;
    let under = |function| report.total_share(pid, function) * report.samples_of(pid) as f64;
    println!(
        "{} samples: {} under bump_odd, {} under bump_even",
        report.samples_of(pid),
        under("bump_odd"),
        under("bump_even")
    );
    assert_eq!(
        (under("bump_odd"), under("bump_even")),
        (truth["odd"], truth["even"])
    );
    assert_eq!(sum, truth["before_sum"]);
    assert_no_programs_left();
}

/// A probe on a source line inside a loop counts the loop's trips exactly; `list --lines` numbers
/// that line (it has code) and not the loop's closing brace; a line without code, or a source
/// file the binary was not built from, is refused naming what is near.
#[test]
fn a_source_line_in_a_loop_is_counted_exactly() {
    let bin = events_bin();
    let line = marked_line();
    let event = format!("uprobe:{bin}:events.c:{line}");
    let (report, out) = stat(&["-e", &event], &[&bin, "lines", "12345"]);
    let truth = truth(&out);
    let counted = counter(&report, &event)["value"].as_f64();
    println!("line {line}: ran {} times, counted {counted:?}", truth["lines"]);
    assert_eq!(counted, Some(truth["lines"]));

    let out = run(&["list", "--probes", &bin, "--lines", "lines"]);
    let listing = stdout(&out);
    println!("{listing}");
    assert!(out.status.success(), "{}", stderr(&out));
    let numbered = |n: usize| {
        listing
            .lines()
            .any(|l| l.split_whitespace().next() == Some(&n.to_string()))
    };
    assert!(numbered(line), "{listing}");
    assert!(
        !numbered(line + 2),
        "the loop's closing brace has no code: {listing}"
    );
    assert!(
        listing.contains(&format!("uprobe:{bin}:events.c:LINE")),
        "{listing}"
    );

    refused_in_one_line(
        &[
            "stat",
            "-e",
            &format!("uprobe:{bin}:events.c:{}", line + 2),
            "--",
            "true",
        ],
        &format!("has no code in {bin}: did you mean events.c:{line}"),
    );
    refused_in_one_line(
        &[
            "stat",
            "-e",
            &format!("uprobe:{bin}:event.c:{line}"),
            "--",
            "true",
        ],
        "no source file `event.c`",
    );
    refused_in_one_line(
        &["list", "--probes", &bin, "--lines", "linez"],
        "did you mean lines",
    );
    assert_no_programs_left();
}

/// `record -o FILE ... -- events ARGS`: the saved hits (each a JSON line), the totals (the
/// last line), the workload's truth.
fn record(options: &[&str], args: &[&str]) -> Recorded {
    let bin = events_bin();
    record_command(options, &[&[bin.as_str()], args].concat())
}

/// The saved hits, the totals, the command's truth and the saved file.
type Recorded = (
    Vec<serde_json::Value>,
    serde_json::Value,
    std::collections::HashMap<String, f64>,
    std::path::PathBuf,
);

/// `record -o FILE OPTIONS -- COMMAND`, as `record`.
fn record_command(options: &[&str], command: &[&str]) -> Recorded {
    let path = temp_path(&format!("record-{}.json", rand_suffix()));
    let mut all = vec!["record", "-o", path.to_str().unwrap()];
    all.extend_from_slice(options);
    all.push("--");
    all.extend_from_slice(command);
    let out = run(&all);
    assert!(out.status.success(), "{all:?}: {}", stderr(&out));
    println!("{}", stderr(&out));
    let text = std::fs::read_to_string(&path).unwrap();
    let mut lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let totals = lines.pop().expect("the totals line")["totals"].clone();
    assert!(totals.is_object(), "the last line is the totals: {totals}");
    (lines, totals, truth(&stdout(&out)), path)
}

/// The hits of `event` in a saved run.
fn hits_of<'a>(hits: &'a [serde_json::Value], event: &str) -> Vec<&'a serde_json::Value> {
    hits.iter().filter(|h| h["event"] == event).collect()
}

/// "A probe on a source line inside a loop of known trip count, with a fetched value as the
/// workload printed it": every trip of the loop recorded at the marked line and at the function
/// it calls, each with the global the line just stored (the sum of the values is the workload's
/// own), and at the function's entry its arguments, a number and a string; `script` prints each
/// as a line, nothing is lost.
#[test]
fn each_hit_is_recorded_with_the_values_fetched_there() {
    let bin = events_bin();
    let line = format!("uprobe:{bin}:events.c:{}", marked_line());
    let step = format!("uprobe:{bin}:step");
    let (hits, totals, truth, path) = record(
        &["-e", &format!("{line},{step}"), "--fetch", "line_value"],
        &["lines", "2000"],
    );
    let sum = |hits: &[&serde_json::Value], field: &str| -> f64 {
        hits.iter().map(|h| h["fields"][field].as_f64().unwrap()).sum()
    };
    let (at_line, at_step) = (hits_of(&hits, &line), hits_of(&hits, &step));
    println!(
        "{} trips, values summing to {}: at the line {} hits summing to {}, at step {} summing to {}; totals {totals}",
        truth["lines"],
        truth["values_sum"],
        at_line.len(),
        sum(&at_line, "line_value"),
        at_step.len(),
        sum(&at_step, "line_value")
    );
    assert_eq!(at_line.len() as f64, truth["lines"]);
    assert_eq!(at_step.len() as f64, truth["lines"]);
    assert_eq!(sum(&at_line, "line_value"), truth["values_sum"]);
    assert_eq!(sum(&at_step, "line_value"), truth["values_sum"]);
    assert!(hits
        .iter()
        .all(|h| h["pid"] == truth["pid"] && h["comm"] == "events"));
    assert_eq!(totals["lost"], 0);
    assert_eq!(totals["records"], 2.0 * truth["lines"]);
    assert_eq!(totals["events"][0]["hits"], truth["lines"]);

    let out = run(&["script", path.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let printed = stdout(&out);
    assert_eq!(
        printed
            .lines()
            .filter(|l| l.contains(&format!("{line}: line_value=")))
            .count() as f64,
        truth["lines"]
    );
    assert!(stderr(&out).contains("0 lost"), "{}", stderr(&out));

    let (hits, _, truth, _) = record(&["-e", &step, "--fetch", "arg1,arg2:str"], &["lines", "1000"]);
    let at_step = hits_of(&hits, &step);
    assert_eq!(at_step.len() as f64, truth["lines"]);
    assert_eq!(sum(&at_step, "arg1"), truth["values_sum"]);
    assert!(
        at_step.iter().all(|h| h["fields"]["arg2"] == "step"),
        "{:?}",
        at_step[0]
    );
    assert_no_programs_left();
}

/// A USDT probe's own arguments, wherever each site's note says the compiler put them: the
/// workload's `events:step` fires from two sites, with an int in a register at one and on the
/// stack at the other, a global in memory (x86-64: relative to each probed instruction,
/// `line_value(%rip)`; AArch64: at a register), the site's number as a constant and a string's
/// address; each hit recorded with them, their sums and each site's count the workload's own.
/// The workload fires only while the probe's semaphore is raised: every step is seen. An
/// argument the probe does not have, or a return value, is refused naming what it has.
#[test]
fn a_usdt_probes_own_arguments_are_recorded_at_each_of_its_sites() {
    let event = format!("usdt:{}:events:step", events_bin());
    let (hits, totals, truth, _) = record(
        &["-e", &event, "--fetch", "arg0,arg1,arg2,arg3:str"],
        &["usdt", "3000"],
    );
    let sum = |field: &str| -> f64 { hits.iter().map(|h| h["fields"][field].as_f64().unwrap()).sum() };
    let at_site = |n: u64| hits.iter().filter(|h| h["fields"]["arg2"] == n).count() as f64;
    println!(
        "{} hits, {} at site 1 and {} at site 2 (the workload's {} and {}): arg0 sums to {} (its ints {}), arg1 to {} (its globals {}); totals {totals}",
        hits.len(),
        at_site(1),
        at_site(2),
        truth["site1"],
        truth["site2"],
        sum("arg0"),
        truth["ints_sum"],
        sum("arg1"),
        truth["globals_sum"]
    );
    assert_eq!(hits.len() as f64, truth["usdt"]);
    assert_eq!((at_site(1), at_site(2)), (truth["site1"], truth["site2"]));
    assert_eq!(sum("arg0"), truth["ints_sum"]);
    assert!(
        hits.iter().any(|h| h["fields"]["arg0"].as_i64().unwrap() < 0),
        "signed"
    );
    assert_eq!(sum("arg1"), truth["globals_sum"]);
    assert!(hits.iter().all(|h| h["fields"]["arg3"] == "usdt-step"));
    assert_eq!(totals["lost"], 0);
    let (report, out) = stat(&["-e", &event], &[&events_bin(), "usdt", "3000"]);
    let counted = counter(&report, &event)["value"].as_f64();
    println!("stat counted {counted:?}");
    assert_eq!(counted, Some(bpfprof_tests::truth(&out)["usdt"]));
    let listed = stdout(&run(&["list", "--probes", &events_bin()]));
    let line = listed
        .lines()
        .find(|l| l.contains("events:step"))
        .unwrap_or_default();
    assert!(
        line.contains("arg0..arg3: -4@") && line.contains("(2 sites)"),
        "listed as {line:?}"
    );
    for (fetch, said) in [
        ("arg4", "this USDT probe has arg0..arg3"),
        ("retval", "a USDT probe has its own arguments"),
        ("arg2:str", "a constant is not a string's address"),
    ] {
        refused_in_one_line(&["record", "-e", &event, "--fetch", fetch, "--", "true"], said);
    }
    assert_no_programs_left();
}

/// Debian's python3.11, a program no one here wrote: `gc__start`'s generation (which its note
/// puts on the stack, `-4@112(%rsp)`) for each collection, as many of generations 0 and 1 as
/// Python's own `gc.get_stats()` says (generation 2 also collects at exit, after the script's
/// last word); `function__entry`'s file, function and line (two strings and an int in
/// registers) for each call of the script's `target`, its line the code object's own. Python
/// 3.11 fires its function probes only while a profile or trace function is set. The script's
/// path is longer than a record's strings: each keeps its first 127 bytes and says it was cut.
#[test]
fn pythons_usdt_arguments_are_its_own() {
    let python = "/usr/bin/python3.11";
    let dir = temp_path(&"a-directory-with-a-long-name-".repeat(4));
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join(format!("usdt-{}.py", rand_suffix()));
    std::fs::write(
        &script,
        "import gc, sys\ngc.disable()\nsys.setprofile(lambda *a: None)\n\
         def target(n):\n    return n + 1\n\
         for i in range(int(sys.argv[1])):\n    target(i)\n\
         for g in (0, 1, 1, 0, 1, 0, 0):\n    gc.collect(g)\n\
         s = gc.get_stats()\n\
         print('TRUTH calls=%s line=%d gen0=%d gen1=%d' % (sys.argv[1], target.__code__.co_firstlineno, s[0]['collections'], s[1]['collections']))\n",
    )
    .unwrap();
    let script = script.to_str().unwrap();
    let (start, entry) = (
        format!("usdt:{python}:python:gc__start"),
        format!("usdt:{python}:python:function__entry"),
    );
    let (hits, totals, truth, _) = record_command(
        &["-e", &entry, "--fetch", "arg0:str,arg1:str,arg2"],
        &[python, script, "37"],
    );
    let calls: Vec<_> = (hits_of(&hits, &entry).into_iter())
        .filter(|h| h["fields"]["arg1"] == "target")
        .collect();
    println!(
        "{} calls of target: {} recorded; totals {totals}",
        truth["calls"],
        calls.len()
    );
    assert_eq!(calls.len() as f64, truth["calls"]);
    assert!(script.len() > 127);
    assert!(calls.iter().all(|h| h["fields"]["arg0"] == script[..127]
        && h["cut"] == serde_json::json!(["arg0"])
        && h["fields"]["arg2"] == truth["line"]));
    let said = totals["notes"].to_string();
    let cut = hits.iter().filter(|h| h.get("cut").is_some()).count();
    assert!(
        said.contains(&format!("{cut} fetched strings were longer")),
        "{said}"
    );
    let (hits, _, truth, _) = record_command(&["-e", &start, "--fetch", "arg0"], &[python, script, "1"]);
    let generation = |g: i64| hits.iter().filter(|h| h["fields"]["arg0"] == g).count() as f64;
    println!(
        "collections of generation 0: {} recorded, {} said; 1: {} recorded, {} said; 2: {} recorded",
        generation(0),
        truth["gen0"],
        generation(1),
        truth["gen1"],
        generation(2)
    );
    assert_eq!(generation(0), truth["gen0"]);
    assert_eq!(generation(1), truth["gen1"]);
    assert_no_programs_left();
}

/// `record -g`: each hit with its stacks, innermost first. At the probe on `step` (called by
/// `lines`, called by `main`), every recorded stack starts at `step` and reaches `main`; walked
/// through the process's unwind tables once they are ready, its caller `lines` is there too (a
/// frame-pointer walk from a function's first instruction skips it). At the workload's writes,
/// the kernel's frames come first, then the user's. `script` prints them under each hit.
#[test]
fn each_hit_is_recorded_with_its_stacks() {
    let step = format!("uprobe:{}:step", events_bin());
    let (hits, totals, truth, path) = record(&["-g", "-c", "10", "-e", &step], &["lines", "100000"]);
    let functions = |hit: &serde_json::Value| -> Vec<String> {
        (hit["stack"].as_array().into_iter().flatten())
            .map(|f| f["function"].as_str().unwrap_or_default().to_string())
            .collect()
    };
    let stacks: Vec<Vec<String>> = hits.iter().map(functions).collect();
    let with_caller = stacks
        .iter()
        .filter(|s| s.get(1).is_some_and(|f| f == "lines"))
        .count();
    println!(
        "{} trips, every 10th recorded: {} records ({} lost), {with_caller} with step's caller `lines`; first stack {:?}; notes {}",
        truth["lines"],
        hits.len(),
        totals["lost"],
        stacks.first(),
        totals["notes"]
    );
    assert_eq!(
        hits.len() as f64 + totals["lost"].as_f64().unwrap(),
        truth["lines"] / 10.0
    );
    assert!(
        stacks
            .iter()
            .all(|s| s.first().is_some_and(|f| f == "step") && s.iter().take(3).any(|f| f == "main")),
        "{:?}",
        stacks.iter().find(|s| s.first().is_none_or(|f| f != "step"))
    );
    assert!(with_caller > 0, "no stack walked through the tables");
    let printed = stdout(&run(&["script", path.to_str().unwrap()]));
    assert!(
        printed
            .lines()
            .any(|l| l.starts_with('\t') && l.contains(" step (")),
        "{printed:.500}"
    );

    let (hits, _, truth, _) = record(&["-g", "-e", "syscalls:sys_enter_write"], &["writes", "300"]);
    let mine: Vec<_> = (hits.iter())
        .filter(|h| h["pid"] == truth["pid"] && h["fields"]["count"] == 1)
        .collect();
    // The kernel's frames (none where a syscall tracepoint hands the program the user's
    // registers: arm64's 6.1), then at least one of the user's.
    let kernel_then_user = |hit: &serde_json::Value| {
        let frames = hit["stack"].as_array().cloned().unwrap_or_default();
        let kernel = frames.iter().take_while(|f| f["kernel"] == true).count();
        kernel < frames.len() && frames[kernel..].iter().all(|f| f.get("kernel").is_none())
    };
    println!(
        "{} writes: {} recorded, first {}",
        truth["writes"],
        mine.len(),
        mine[0]["stack"]
    );
    assert_eq!(mine.len() as f64, truth["writes"]);
    assert!(mine.iter().all(|h| kernel_then_user(h)), "{}", mine[0]["stack"]);
    assert_no_programs_left();
}

/// A tracepoint's hits each with its fields read where its format puts them: the workload's
/// one-byte writes (and the longer TRUTH line), each with its count and descriptor, and the
/// string its buffer pointer points at (`--fetch buf:str`): the "x" the workload writes.
#[test]
fn a_tracepoints_hits_are_recorded_with_their_fields() {
    let (hits, totals, truth, _) = record(
        &["-e", "syscalls:sys_enter_write", "--fetch", "buf:str"],
        &["writes", "500"],
    );
    let mine: Vec<_> = (hits.iter()).filter(|h| h["pid"] == truth["pid"]).collect();
    let one_byte = (mine.iter())
        .filter(|h| h["fields"]["count"] == 1 && h["fields"]["buf"] == "x")
        .count();
    println!(
        "{} writes of one byte and the TRUTH line: {} recorded, {one_byte} of one byte; totals {totals}",
        truth["writes"],
        mine.len()
    );
    assert_eq!(one_byte as f64, truth["writes"]);
    assert_eq!(mine.len() as f64, truth["writes"] + 1.0);
    let descriptors: std::collections::BTreeSet<String> = (mine.iter())
        .filter(|h| h["fields"]["count"] == 1)
        .map(|h| h["fields"]["fd"].to_string())
        .collect();
    assert_eq!(
        descriptors.len(),
        1,
        "one descriptor for /dev/null: {descriptors:?}"
    );
    assert_eq!(totals["lost"], 0);
    assert_no_programs_left();
}

/// `record --filter`: only the hits it passes are counted and recorded: the workload's 500
/// one-byte writes with `count == 1`, its one longer write (the TRUTH line) with `count > 1`.
#[test]
fn a_filter_records_only_the_hits_it_passes() {
    for (filter, expected) in [("count == 1", "writes"), ("count > 1 && count < 4096", "one")] {
        let (hits, totals, truth, _) = record(
            &["-e", "syscalls:sys_enter_write", "--filter", filter],
            &["writes", "500"],
        );
        let expected = match expected {
            "writes" => truth["writes"],
            _ => 1.0,
        };
        let mine: Vec<_> = hits.iter().filter(|h| h["pid"] == truth["pid"]).collect();
        println!("--filter '{filter}': {} records, totals {totals}", mine.len());
        assert_eq!(mine.len() as f64, expected, "{filter}");
        assert_eq!(totals["events"][0]["hits"].as_f64(), Some(expected), "{filter}");
    }
    refused_in_one_line(
        &[
            "record",
            "-e",
            "syscalls:sys_enter_write",
            "--filter",
            "cuont > 1",
            "--",
            "true",
        ],
        "did you mean count",
    );
    assert_no_programs_left();
}

/// A filter on a USDT probe's arguments, read where each site's note puts them: `events:step`'s
/// int is in a register at one site and on the stack at the other, its third argument the
/// site's number. Recorded and sampled, exactly the steps the workload counted pass.
#[test]
fn a_filter_on_a_usdt_argument_reads_it_at_each_site() {
    let step = format!("usdt:{}:events:step", events_bin());
    for (filter, expected) in [
        ("arg0 < 0", "negatives"),
        ("arg2 == 2", "site2"),
        ("arg2 == 1", "site1"),
    ] {
        let (hits, totals, truth, _) = record(&["-e", &step, "--filter", filter], &["usdt", "3000"]);
        println!(
            "--filter '{filter}': {} records (the workload's {}), totals {totals}",
            hits.len(),
            truth[expected]
        );
        assert_eq!(hits.len() as f64, truth[expected], "{filter}");
        assert_eq!(
            totals["events"][0]["hits"].as_f64(),
            Some(truth[expected]),
            "{filter}"
        );
    }
    let (report, notes, truth) = sample_hits(
        &["-e", &step, "--filter", "arg0 < 0"],
        &[&events_bin(), "usdt", "3000"],
    );
    let samples = report.samples_of(truth["pid"] as u32) as f64;
    println!(
        "sampled with --filter 'arg0 < 0': {samples} samples (the workload's {}); {notes}",
        truth["negatives"]
    );
    assert_eq!(samples, truth["negatives"]);
    refused_in_one_line(
        &["record", "-e", &step, "--filter", "line_value > 1", "--", "true"],
        "a USDT probe's numbers are its arguments (arg0..arg3)",
    );
    assert_no_programs_left();
}

/// Every hit is recorded or counted lost, never neither: 300,000 writes as fast as a thread can
/// make them (more than the ring holds between two reads on a busy machine).
#[test]
fn every_hit_is_recorded_or_counted_lost() {
    let (hits, totals, truth, _) = record(&["-e", "syscalls:sys_enter_write"], &["writes", "300000"]);
    println!("{} writes and the TRUTH line: totals {totals}", truth["writes"]);
    let lost = totals["lost"].as_f64().unwrap();
    assert_eq!(totals["events"][0]["hits"], truth["writes"] + 1.0);
    assert_eq!(hits.len() as f64 + lost, truth["writes"] + 1.0);
    assert_eq!(totals["records"], hits.len());
}

/// What cannot be fetched or recorded is refused in one line naming what exists nearby, before
/// anything is loaded; a file that is not a saved run is refused by `script` with its line.
#[test]
fn what_cannot_be_recorded_is_refused_in_one_line() {
    let bin = events_bin();
    let step = format!("uprobe:{bin}:step");
    refused_in_one_line(
        &["record", "-e", &step, "--fetch", "line_valu", "--", "true"],
        "did you mean line_value",
    );
    refused_in_one_line(
        &["record", "-e", &step, "--fetch", "retval", "--", "true"],
        "retval is a uretprobe's",
    );
    refused_in_one_line(
        &["record", "-e", &step, "--fetch", "arg9", "--", "true"],
        "arg1..arg6",
    );
    let line = format!("uprobe:{bin}:events.c:{}", marked_line());
    refused_in_one_line(
        &["record", "-e", &line, "--fetch", "arg1", "--", "true"],
        "arguments are in their registers at a function's entry only",
    );
    refused_in_one_line(
        &["record", "-e", "cpu-clock", "--", "true"],
        "not a tracepoint or a probe",
    );
    let corrupt = temp_path("not-a-record.json");
    std::fs::write(&corrupt, "{\"time_ns\": 1}\n").unwrap();
    refused_in_one_line(&["script", corrupt.to_str().unwrap()], "line 1 is not a hit");
    assert_no_programs_left();
}

/// A glob names every tracepoint it matches, each counted apart: the workload's writes under
/// `sys_enter_write`, none under `sys_enter_writev`; a glob matching nothing is refused.
#[test]
fn a_glob_counts_each_tracepoint_it_names() {
    let bin = events_bin();
    let (report, out) = stat(&["-e", "syscalls:sys_enter_wri*"], &[&bin, "writes", "1000"]);
    let truth = truth(&out);
    let counted: Vec<(String, f64)> = (report["counters"].as_array().unwrap().iter())
        .map(|c| {
            (
                c["event"].as_str().unwrap().to_string(),
                c["value"].as_f64().unwrap(),
            )
        })
        .collect();
    println!("{} writes and the TRUTH line: {counted:?}", truth["writes"]);
    assert!(counted.contains(&("syscalls:sys_enter_write".into(), truth["writes"] + 1.0)));
    assert!(counted.contains(&("syscalls:sys_enter_writev".into(), 0.0)));
    assert!(counted
        .iter()
        .all(|(name, _)| name.starts_with("syscalls:sys_enter_wri")));
    refused_in_one_line(
        &["stat", "-e", "syscalls:sys_enter_nope*", "--", "true"],
        "no tracepoint matches it",
    );
}

/// At a function's returns, its return value; typed fetches; and between its entry and its
/// returns, keyed by thread. The workload's `request_submit(id)` returns its id: 1..N, then
/// -(N+1). Recorded at `uretprobe:` with `retval`, every return is there with its id (untyped,
/// the register's 64 bits: the negative id as u64); typed `:u32`, the negative id reads as its
/// 32-bit pattern, `:s32` as itself.
/// `stat --by retval:log2` counts each power-of-two range as the ids fill it. `latency` from
/// the entry to the return times every call.
#[test]
fn a_functions_return_value_is_read_at_its_returns() {
    let bin = events_bin();
    let ret = format!("uretprobe:{bin}:request_submit");
    let fetched = |ty: &str| -> (Vec<i64>, HashMap<String, f64>) {
        let (hits, _, truth, _) = record(
            &["-e", &ret, "--fetch", &format!("retval{ty}")],
            &["requests", "1000"],
        );
        // Untyped, a register's 64 bits as they are (perf's default too): a negative id's
        // pattern, which as i64 is the id.
        let value = |h: &serde_json::Value| match h["fields"]["retval"].as_u64() {
            Some(unsigned) => unsigned as i64,
            None => h["fields"]["retval"].as_i64().unwrap(),
        };
        let values = hits.iter().map(value).collect();
        (values, truth)
    };
    let (returned, truth) = fetched("");
    let n = truth["requests"] as i64;
    let ids: Vec<i64> = (1..n).chain([-n]).collect();
    let (as_u32, _) = fetched(":u32");
    let (as_s32, _) = fetched(":s32");
    println!(
        "{n} returns of request_submit: {} recorded, retval summing to {} (ids: {}); the last as u32 {:?}, as s32 {:?}",
        returned.len(),
        returned.iter().sum::<i64>(),
        ids.iter().sum::<i64>(),
        as_u32.last(),
        as_s32.last()
    );
    assert_eq!(returned, ids);
    assert_eq!(as_s32, ids);
    assert_eq!(as_u32.last(), Some(&(n.wrapping_neg() as u32 as i64)));
    assert_eq!(as_u32[..n as usize - 1], ids[..n as usize - 1]);

    let (report, _) = stat(&["-e", &ret, "--by", "retval:log2"], &[&bin, "requests", "1000"]);
    let ranges = report["by_value"][0]["values"].as_array().unwrap().clone();
    let in_range = |from: i64, to: i64| ids.iter().filter(|&&id| id >= from && id <= to).count() as f64;
    println!("by retval:log2: {ranges:?}");
    assert!(!ranges.is_empty());
    for range in &ranges {
        let (from, to) = (range["from"].as_i64().unwrap(), range["to"].as_i64().unwrap());
        assert_eq!(range["count"].as_f64().unwrap(), in_range(from, to), "{range}");
    }
    let counted: f64 = ranges.iter().map(|r| r["count"].as_f64().unwrap()).sum();
    assert_eq!(counted, n as f64);

    let path = temp_path("calls.json");
    let entry = format!("uprobe:{bin}:request_submit");
    let out = run(&[
        "latency",
        "--from",
        &entry,
        "--to",
        &ret,
        "-o",
        path.to_str().unwrap(),
        "--",
        &bin,
        "requests",
        "1000",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let report = read_json(&path);
    println!(
        "latency entry to return: count {}, p50 {} ns, unmatched {}",
        report["count"], report["p50_ns"], report["unmatched"]
    );
    assert_eq!(report["count"].as_i64(), Some(n));
    assert_eq!(report["unmatched"].as_i64(), Some(0));
    assert_no_programs_left();
}

/// `uprobe:FILE:FUNCTION+OFFSET`: at an instruction inside a function. The workload's
/// `offset_target` is nops then a return, so its third instruction is at +2 (x86-64) or +8
/// (AArch64): counted as often as the function was called, and so is an offset given in hex.
#[test]
fn a_probe_at_an_offset_into_a_function_counts_each_pass() {
    let bin = events_bin();
    let third = if cfg!(target_arch = "x86_64") { 2 } else { 8 };
    let events = format!("uprobe:{bin}:offset_target+{third},uprobe:{bin}:offset_target+{third:#x}");
    let (report, out) = stat(&["-e", &events], &[&bin, "offsets", "3000"]);
    let truth = truth(&out);
    let counted: Vec<f64> = (report["counters"].as_array().unwrap().iter())
        .map(|c| c["value"].as_f64().unwrap())
        .collect();
    println!(
        "{} calls of offset_target: counted at +{third} {counted:?}",
        truth["calls"]
    );
    assert_eq!(counted, [truth["calls"]; 2]);
}

/// With `-p`, a library named without a path is the one the target maps: a workload run with
/// its own copy of libc (as a container runs its own) is counted in that copy by
/// `uprobe:libc:malloc`, where a probe on the system's libc, which it does not map, counts none.
#[test]
fn a_library_by_name_is_the_one_the_target_maps() {
    let system_libc = own_libc();
    let dir = temp_path("own-libc");
    std::fs::create_dir_all(&dir).unwrap();
    let copy = dir.join(system_libc.rsplit('/').next().unwrap());
    std::fs::copy(&system_libc, &copy).unwrap();
    let workload = Running::spawn(
        std::process::Command::new(events_bin())
            .args(["mallocs", "1000000000"])
            .env("LD_LIBRARY_PATH", &dir)
            .stdout(std::process::Stdio::null()),
    );
    let pid = workload.pid().to_string();
    // Ready when the loader has mapped the copy.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .unwrap_or_default()
        .contains(copy.to_str().unwrap())
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the workload never mapped {}",
            copy.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let count = |event: &str| {
        let path = temp_path(&format!("own-libc-{}.json", rand_suffix()));
        let out = run(&[
            "stat",
            "-e",
            event,
            "-p",
            &pid,
            "-d",
            "1",
            "-o",
            path.to_str().unwrap(),
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
        counter(&read_json(&path), event)["value"].as_f64().unwrap()
    };
    let by_name = count("uprobe:libc:malloc");
    let system = count(&format!("uprobe:{system_libc}:malloc"));
    println!(
        "mallocs in 1 s: {by_name} by `libc` (the copy it maps, {}), {system} in {system_libc}",
        copy.display()
    );
    assert!(by_name > 0.0);
    assert_eq!(system, 0.0);
}

/// A USDT probe's semaphore is raised while bpfprof is attached and lowered after, whichever
/// way it attached: counted (`stat -p`, a probe defined in tracefs), sampled (`-e`, the probe
/// PMU) and recorded (`record`). The workload watches its own semaphore every millisecond and,
/// after all three runs, says it was raised and is now 0.
#[test]
fn a_usdt_semaphore_is_restored_after_each_run() {
    let bin = events_bin();
    let probe = format!("usdt:{bin}:events:step");
    let workload = start_workload("events", &["semaphore", "0"]);
    let pid = workload.pid().to_string();
    let json = temp_path(&format!("semaphore-{}.json", rand_suffix()));
    let json = json.to_str().unwrap();
    for args in [
        vec!["stat", "-e", &probe],
        vec!["-e", &probe],
        vec!["record", "-e", &probe],
    ] {
        let mut all = args.clone();
        all.extend(["-p", &pid, "-d", "1", "-o", json]);
        let out = run(&all);
        assert!(out.status.success(), "{all:?}: {}", stderr(&out));
    }
    let truth = truth(&workload.stop());
    println!(
        "the workload's semaphore: raised for {} ticks, at most {}, now {}",
        truth["raised_ticks"], truth["most"], truth["semaphore_now"]
    );
    assert!(truth["raised_ticks"] > 0.0 && truth["most"] >= 1.0, "{truth:?}");
    assert_eq!(truth["semaphore_now"], 0.0);
}
