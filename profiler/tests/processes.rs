//! What is captured of a process while it lives survives its exit: a capture asked for once it
//! is a zombie (a stack of its drained late, its exit announced) keeps its map and executable,
//! which name its samples and label its windows.
use std::{process::Command, time::Duration};

use profiler::process::{Processes, UserAddr};

fn state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(") ")?.1.chars().next()
}

#[test]
fn a_zombie_keeps_its_map_and_executable() {
    let mut child = Command::new("sleep").arg("1").spawn().unwrap();
    let pid = child.id();
    let mut procs = Processes::new();
    // Captured once it runs `sleep`: just after the fork its map is still ours, or empty during
    // the exec itself.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let _ = procs.capture(pid);
        let runs_sleep = procs
            .info(pid)
            .and_then(|i| i.executable.as_deref())
            .is_some_and(|e| e.ends_with("/sleep"));
        if runs_sleep && !procs.mapped_files(pid, 0).is_empty() {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "sleep never started");
        procs = Processes::new();
        std::thread::sleep(Duration::from_millis(10));
    }
    let executable = procs.info(pid).and_then(|i| i.executable.clone());
    let (file, start, _) = procs.mapped_files(pid, 0)[0];
    // Not reaped: it stays a zombie.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while state(pid) != Some('Z') {
        assert!(std::time::Instant::now() < deadline, "never became a zombie");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(procs.capture(pid).is_err(), "nothing to capture of a zombie");
    let _ = procs.refresh_changed(pid);
    assert_eq!(procs.info(pid).and_then(|i| i.executable.clone()), executable);
    assert!(matches!(procs.normalize(pid, 0, start), UserAddr::File { file: f, .. } if f == file));
    child.wait().unwrap();
}
