//! docs/json.md against real output: every mode and `diff` run on the test workloads, and each
//! JSON report must carry `format_version`, every field its section of the page names (example or
//! table), and no field the page never names. A field added to the code without the page, or a
//! page describing a field the code dropped, fails here.
//! These load BPF for real: run as root (`cargo xtask test`).
use std::collections::BTreeSet;

use bpfprof_tests::*;
use serde_json::Value;

/// The schema version this test was written against (docs/json.md says it too).
const FORMAT_VERSION: u64 = 2;

/// Fields the page names that a run only writes under some condition, and why they are absent
/// from these runs.
const CONDITIONAL: &[(&str, &str)] = &[
    (
        "files_without_tables_named",
        "written only when some file has no usable unwind table",
    ),
    (
        "weight",
        "written only when probe samples are weighted (--weight)",
    ),
];

/// Objects whose keys are data (counter and metric names), not fields.
const KEYED_BY_DATA: &[&str] = &["metrics", "multiplexed", "counters"];

/// What one `## ` section of the page says.
#[derive(Default, Debug)]
struct Section {
    /// Keys of its example and names in its tables' first column: what must appear.
    documented: BTreeSet<String>,
    /// Every name in backquotes anywhere in it, and the example's keys: what may appear.
    mentioned: BTreeSet<String>,
}

fn is_field_name(s: &str) -> bool {
    s.starts_with(|c: char| c.is_ascii_lowercase())
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

/// The field names in a backquoted span like `stacks[].frames` or `health.lock_waits`.
fn names_in(span: &str) -> impl Iterator<Item = String> + '_ {
    span.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|s| is_field_name(s))
        .map(str::to_string)
}

/// The spans between backquotes in a line.
fn quoted(line: &str) -> impl Iterator<Item = &str> {
    line.split('`').skip(1).step_by(2)
}

/// The keys of a JSON example, which may hold `...` placeholders and so is not parsed as JSON:
/// every string followed by a colon.
fn example_keys(text: &str) -> Vec<String> {
    let parts: Vec<&str> = text.split('"').collect();
    (1..parts.len())
        .step_by(2)
        .filter(|&i| {
            parts
                .get(i + 1)
                .is_some_and(|after| after.trim_start().starts_with(':'))
        })
        .map(|i| parts[i])
        .filter(|k| is_field_name(k))
        .map(str::to_string)
        .collect()
}

/// The page's sections by title word (`Hotspot`, `Sched`, `Lock`, `Topdown`, `Frames`, `Health`,
/// `Diff`).
fn read_page() -> Vec<(String, Section)> {
    let page = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/json.md")).unwrap();
    let mut sections: Vec<(String, Section)> = Vec::new();
    let mut in_example = false;
    let mut example = String::new();
    for line in page.lines() {
        if let Some(title) = line.strip_prefix("## ") {
            let word = title.split_whitespace().next().unwrap().to_string();
            sections.push((word, Section::default()));
            continue;
        }
        let Some((_, section)) = sections.last_mut() else {
            continue;
        };
        if line.starts_with("```") {
            if in_example {
                for key in example_keys(&example) {
                    section.documented.insert(key.clone());
                    section.mentioned.insert(key);
                }
                example.clear();
            }
            in_example = !in_example;
            continue;
        }
        if in_example {
            example.push_str(line);
            example.push('\n');
            continue;
        }
        for span in quoted(line) {
            section.mentioned.extend(names_in(span));
        }
        let is_row = line.starts_with("| ") && !line.starts_with("| field") && !line.starts_with("|---");
        if let Some(first_cell) = line.split('|').nth(1).filter(|_| is_row) {
            for span in quoted(first_cell) {
                section.documented.extend(names_in(span));
            }
        }
    }
    sections
}

/// Every object key in a report, but not the keys of objects that are keyed by data.
fn keys(value: &Value, into: &mut BTreeSet<String>) {
    match value {
        Value::Object(map) => {
            for (key, inner) in map {
                into.insert(key.clone());
                if !(KEYED_BY_DATA.contains(&key.as_str()) && inner.is_object()) {
                    keys(inner, into);
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|item| keys(item, into)),
        _ => {}
    }
}

/// Run bpfprof with `args` and `-o NAME`, and read the JSON it wrote.
fn report(name: &str, args: &[&str]) -> Value {
    let path = temp_path(name);
    let path = path.to_str().unwrap();
    let mut all = vec!["-o", path];
    all.extend_from_slice(args);
    let out = run(&all);
    assert!(out.status.success(), "bpfprof {all:?} failed: {}", stderr(&out));
    let value: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    assert_eq!(
        value["format_version"], FORMAT_VERSION,
        "{name}: format_version missing or changed (update docs/json.md and this test together)"
    );
    value
}

fn bin(name: &str) -> String {
    workload(name).to_str().unwrap().to_string()
}

/// Sections that describe an object wherever it appears: (its key in a report, section word).
const SHARED: &[(&str, &str)] = &[("health", "Health"), ("frames", "Frames")];

/// The keys inside every value found under `key`, at any depth.
fn keys_under(value: &Value, key: &str, into: &mut BTreeSet<String>) {
    match value {
        Value::Object(map) => {
            for (k, inner) in map {
                match k == key {
                    true => keys(inner, into),
                    false => keys_under(inner, key, into),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|item| keys_under(item, key, into)),
        _ => {}
    }
}

/// Check one mode's reports against its section, and against the shared sections of the
/// objects they hold.
fn check(mode: &str, reports: &[Value], page: &[(String, Section)], problems: &mut Vec<String>) {
    let section = |word: &str| &page.iter().find(|(w, _)| w == word).unwrap().1;
    let own = section(mode);
    let mut seen = BTreeSet::new();
    reports.iter().for_each(|r| keys(r, &mut seen));
    let mut documented = own.documented.clone();
    let mut mentioned = own.mentioned.clone();
    for (key, word) in SHARED {
        let mut inside = BTreeSet::new();
        reports.iter().for_each(|r| keys_under(r, key, &mut inside));
        if !inside.is_empty() {
            documented.extend(section(word).documented.iter().cloned());
            mentioned.extend(section(word).mentioned.iter().cloned());
        }
    }
    let conditional = |f: &String| CONDITIONAL.iter().any(|(name, _)| name == f);
    let missing: Vec<_> = documented
        .iter()
        .filter(|f| !seen.contains(*f) && !conditional(f))
        .collect();
    if !missing.is_empty() {
        problems.push(format!(
            "{mode}: docs/json.md names fields the report lacks: {missing:?}"
        ));
    }
    let unnamed: Vec<_> = seen.iter().filter(|f| !mentioned.contains(*f)).collect();
    if !unnamed.is_empty() {
        problems.push(format!(
            "{mode}: the report has fields docs/json.md never names: {unnamed:?}"
        ));
    }
}

/// Every index array under a `frames` key (a stack), at any depth below the top.
fn stacks_in<'a>(value: &'a Value, top: bool, into: &mut Vec<&'a Vec<Value>>) {
    match value {
        Value::Object(map) => {
            for (key, inner) in map {
                match (key.as_str(), inner) {
                    ("frames", Value::Array(stack)) if !top => into.push(stack),
                    _ => stacks_in(inner, false, into),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|item| stacks_in(item, false, into)),
        _ => {}
    }
}

/// Version 2's frames table: each distinct frame once, every stack indices into it, and every
/// frame of the table used by some stack.
fn check_frame_table(mode: &str, report: &Value, problems: &mut Vec<String>) {
    let Some(table) = report["frames"].as_array() else {
        return problems.push(format!("{mode}: no top-level frames table"));
    };
    let distinct: BTreeSet<String> = table.iter().map(Value::to_string).collect();
    if distinct.len() != table.len() {
        problems.push(format!("{mode}: the frames table repeats frames"));
    }
    let mut stacks = Vec::new();
    stacks_in(report, true, &mut stacks);
    let mut used = BTreeSet::new();
    for index in stacks.iter().flat_map(|s| s.iter()) {
        match index.as_u64().filter(|&i| (i as usize) < table.len()) {
            Some(i) => drop(used.insert(i)),
            None => problems.push(format!(
                "{mode}: a stack names {index}, not an index of the frames table"
            )),
        }
    }
    if used.len() != table.len() || mode == "Hotspot" && table.is_empty() {
        problems.push(format!(
            "{mode}: {} stacks use {} of the {} frames of the table",
            stacks.len(),
            used.len(),
            table.len()
        ));
    }
}

#[test]
fn every_report_and_docs_json_name_the_same_fields() {
    let page = read_page();
    for word in [
        "Hotspot", "Sched", "Lock", "Topdown", "Frames", "Health", "Diff", "Stat",
    ] {
        let found = page.iter().find(|(w, _)| w == word);
        assert!(
            found.is_some_and(|(_, s)| !s.documented.is_empty()),
            "docs/json.md has no section `## {word}` with fields: {page:?}"
        );
    }
    let hotspot = bin("hotspot");
    let hotspot_report = report(
        "schema-hotspot.json",
        &[
            "-F",
            "199",
            "--counter",
            "page-faults",
            "--",
            &hotspot,
            "split",
            "1",
        ],
    );
    let sched = report(
        "schema-sched.json",
        &[
            "--mode",
            "sched",
            "--slow-threshold",
            "1",
            "--",
            &bin("schedload"),
            "1",
            "4",
        ],
    );
    let lock_futex = report(
        "schema-lock-futex.json",
        &["--mode", "lock", "--", &bin("lockload"), "3", "1"],
    );
    let lock_pthread = report(
        "schema-lock-pthread.json",
        &[
            "--mode",
            "lock",
            "--lock-source",
            "pthread",
            "--",
            &bin("lockload"),
            "reuse",
            "2",
        ],
    );
    let topdown = report(
        "schema-topdown.json",
        &[
            "--mode", "topdown", "--preset", "software", "--", &hotspot, "split", "1",
        ],
    );
    let stat_path = temp_path("schema-stat.json");
    let stat = run(&[
        "stat",
        "-o",
        stat_path.to_str().unwrap(),
        "-r",
        "2",
        "-I",
        "200",
        "-e",
        "page-faults,{task-clock,context-switches}",
        "--",
        &hotspot,
        "split",
        "1",
    ]);
    assert!(stat.status.success(), "stat failed: {}", stderr(&stat));
    let stat: Value = serde_json::from_slice(&std::fs::read(&stat_path).unwrap()).unwrap();
    assert_eq!(stat["format_version"], FORMAT_VERSION, "stat: {stat}");
    let counter_diff = run(&[
        "diff",
        stat_path.to_str().unwrap(),
        stat_path.to_str().unwrap(),
        "--format",
        "json",
    ]);
    assert!(
        counter_diff.status.success(),
        "counter diff failed: {}",
        stderr(&counter_diff)
    );
    let counter_diff: Value = serde_json::from_str(&stdout(&counter_diff)).unwrap();
    assert_eq!(
        counter_diff["format_version"], FORMAT_VERSION,
        "counter diff: {counter_diff}"
    );
    let before = temp_path("schema-hotspot.json");
    let before = before.to_str().unwrap();
    let diff = run(&["diff", before, before, "--format", "json"]);
    assert!(diff.status.success(), "diff failed: {}", stderr(&diff));
    let diff: Value = serde_json::from_str(&stdout(&diff)).unwrap();
    assert_eq!(diff["format_version"], FORMAT_VERSION, "diff: {diff}");

    let mut problems = Vec::new();
    check_frame_table("Hotspot", &hotspot_report, &mut problems);
    check_frame_table("Sched", &sched, &mut problems);
    check_frame_table("Lock", &lock_futex, &mut problems);
    check_frame_table("Lock (pthread)", &lock_pthread, &mut problems);
    check("Hotspot", &[hotspot_report], &page, &mut problems);
    check("Sched", &[sched], &page, &mut problems);
    check("Lock", &[lock_futex, lock_pthread], &page, &mut problems);
    check("Topdown", &[topdown], &page, &mut problems);
    check("Diff", &[diff], &page, &mut problems);
    check("Stat", &[stat], &page, &mut problems);
    check("Counter", &[counter_diff], &page, &mut problems);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The page's reader itself, on a made-up section: example keys and first-column names are
/// documented; names quoted elsewhere are only mentioned.
#[test]
fn the_page_reader_tells_documented_from_mentioned() {
    let keys = example_keys(r#"{"mode": "x", "health": {...}, "frames": [{"function": "main", "...": 0}]}"#);
    assert_eq!(keys, ["mode", "health", "frames", "function"]);
    assert_eq!(
        names_in("stacks[].frames").collect::<Vec<_>>(),
        ["stacks", "frames"]
    );
    assert_eq!(names_in("--counter EVENT").collect::<Vec<_>>(), ["counter"]);
}
