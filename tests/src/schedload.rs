//! The `schedload` workload (tests/workloads/schedload.c): its path, and the truth its threads
//! print (`TASK` lines: each thread's own schedstat, read as its last act).
use std::collections::HashMap;

/// A thread's schedstat as it read it: run-queue delay, timeslices and time on a CPU (ns), and
/// the sleeper's time asleep.
pub struct Task {
    pub tid: u32,
    pub role: String,
    pub run_delay: f64,
    pub pcount: f64,
    pub oncpu: f64,
    pub slept: f64,
    /// The CPU it was pinned to, and its run-queue delay before its own code first ran, which
    /// may have ended elsewhere (`schedload crowd`).
    pub cpu: Option<u32>,
    pub early: f64,
}

pub fn tasks(stdout: &str) -> Vec<Task> {
    let tasks: Vec<Task> = stdout
        .lines()
        .filter(|l| l.starts_with("TASK "))
        .map(|l| {
            let kv: HashMap<&str, &str> = l[5..]
                .split_whitespace()
                .filter_map(|kv| kv.split_once('='))
                .collect();
            Task {
                tid: kv["tid"].parse().unwrap(),
                role: kv["role"].to_string(),
                run_delay: kv["run_delay"].parse().unwrap(),
                pcount: kv["pcount"].parse().unwrap(),
                oncpu: kv["oncpu"].parse().unwrap(),
                slept: kv["slept"].parse().unwrap(),
                cpu: kv.get("cpu").map(|c| c.parse().unwrap()),
                early: kv.get("early").map_or(0.0, |e| e.parse().unwrap()),
            }
        })
        .collect();
    assert!(!tasks.is_empty(), "no TASK lines in {stdout:?}");
    tasks
}

pub fn schedload() -> String {
    super::workload("schedload").to_str().unwrap().to_string()
}
