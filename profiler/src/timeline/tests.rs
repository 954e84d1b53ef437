use profiler_common::{
    timeline::{event_kind, SchedEvent, TaskSnap},
    KernelTotals, SchedInfoHead,
};

use super::{
    file::{Event, Reader, Task, What, REORDER_NS},
    map::code,
    timehist::{Run, Timeline},
};

fn snap(tid: u32, pcount: u64, run_delay_ns: u64, sum_exec_ns: u64) -> TaskSnap {
    TaskSnap {
        tid,
        tgid: tid,
        comm: *b"w\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0",
        totals: KernelTotals {
            sched_info: SchedInfoHead { pcount, run_delay_ns },
            sum_exec_ns,
        },
        target: 1,
        _pad: 0,
    }
}

fn switch(t: u64, prev: TaskSnap, next: TaskSnap, arg: u64) -> Event {
    Event::from_kernel(&SchedEvent {
        time_ns: t,
        cpu: 1,
        kind: event_kind::SWITCH,
        a: prev,
        b: next,
        arg,
    })
    .unwrap()
}

const SLEEPING: u64 = 1;
const PREEMPTED: u64 = 1 << 32;

/// Each run's delay and run time are the growth of the kernel's totals between the task's
/// switch-outs, the first from its switch-in; its wait is the time off the CPU less the delay.
#[test]
fn runs_are_the_growth_of_the_kernels_totals() {
    let idle = TaskSnap::default();
    let mut timeline = Timeline::new(true);
    let events = [
        // In at 100 with 5 us of delay so far (its wait now ending is added after).
        switch(100, idle, snap(7, 3, 5_000, 40_000), SLEEPING),
        // Out at 400: the kernel added 20 ns of delay and 290 ns of running.
        switch(400, snap(7, 4, 5_020, 40_290), idle, SLEEPING),
        switch(1_000, idle, snap(7, 4, 5_020, 40_290), SLEEPING),
        switch(1_500, snap(7, 5, 5_070, 40_780), idle, PREEMPTED),
    ];
    let runs: Vec<Run> = events.iter().filter_map(|e| timeline.step(e)).collect();
    assert_eq!(runs.len(), 2);
    assert_eq!(
        (runs[0].delay_ns, runs[0].run_ns, runs[0].wait_ns),
        (20, 290, None)
    );
    // Off the CPU from 400 to 1000, 50 ns of it runnable.
    assert_eq!(
        (runs[1].delay_ns, runs[1].run_ns, runs[1].wait_ns),
        (50, 490, Some(550))
    );
    assert_eq!(runs[1].end_ns, 1_500);
}

/// Without the kernel's figures: the tracepoints' times, the delay from the wake-up (or the
/// preemption) to the switch-in.
#[test]
fn without_the_kernels_figures_runs_are_timed_at_the_tracepoints() {
    let idle = TaskSnap::default();
    let zero = snap(7, 0, 0, 0);
    let mut timeline = Timeline::new(false);
    let woken = Event::from_kernel(&SchedEvent {
        time_ns: 900,
        cpu: 0,
        kind: event_kind::WAKEUP,
        a: zero,
        b: snap(9, 0, 0, 0),
        arg: 0,
    })
    .unwrap();
    let events = [
        switch(100, idle, zero, 0),
        switch(400, zero, idle, SLEEPING),
        woken,
        switch(1_000, idle, zero, 0),
        switch(1_500, zero, idle, PREEMPTED),
        switch(1_600, idle, zero, 0),
        switch(1_700, zero, idle, SLEEPING),
    ];
    let runs: Vec<Run> = events.iter().filter_map(|e| timeline.step(e)).collect();
    let figures: Vec<_> = runs.iter().map(|r| (r.delay_ns, r.run_ns, r.wait_ns)).collect();
    assert_eq!(
        figures,
        [(0, 300, None), (100, 500, Some(500)), (100, 100, Some(0))]
    );
}

/// A task whose run began before the recording has no line for that run: its start is unknown.
#[test]
fn a_run_begun_before_the_recording_has_no_line() {
    let mut timeline = Timeline::new(true);
    let out = switch(400, snap(7, 4, 5_020, 40_290), TaskSnap::default(), SLEEPING);
    assert_eq!(timeline.step(&out), None);
}

#[test]
fn states_are_perfs_letters() {
    let state = |arg| match switch(1, snap(1, 0, 0, 0), snap(2, 0, 0, 0), arg).what {
        What::Switch { state, .. } => state,
        _ => unreachable!(),
    };
    assert_eq!(state(0), "R");
    assert_eq!(state(1), "S");
    assert_eq!(state(2), "D");
    assert_eq!(state(0x402), "I");
    assert_eq!(state(0x80), "X");
    assert_eq!(state(1 | PREEMPTED), "R");
    assert_eq!(state(0x40), "P");
    assert_eq!(state(0x1000), "D");
}

#[test]
fn codes_run_as_perfs_then_stop() {
    assert_eq!(code(0), "A0");
    assert_eq!(code(25), "Z0");
    assert_eq!(code(26), "A1");
    assert_eq!(code(259), "Z9");
    assert_eq!(code(260), "a0");
    assert_eq!(code(519), "z9");
    assert_eq!(code(520), "**");
}

fn write_file(lines: &[String]) -> tempfile::NamedTempFile {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    for line in lines {
        std::io::Write::write_all(&mut file, format!("{line}\n").as_bytes()).unwrap();
    }
    file
}

fn event_line(t: u64, cpu: u32) -> String {
    let event = Event {
        t,
        cpu,
        what: What::Exit {
            task: Task {
                tid: 1,
                pid: 1,
                comm: "x".into(),
                ..Default::default()
            },
        },
    };
    serde_json::to_string(&event).unwrap()
}

const HEADER: &str = r#"{"sched_record":{"started_ns":0,"cpus":2,"kernel_figures":true}}"#;

/// Events come out in time order when the file has them out of order within the window; the
/// totals are kept.
#[test]
fn events_are_read_in_time_order() {
    let file = write_file(&[
        HEADER.into(),
        event_line(30, 0),
        event_line(10, 1),
        event_line(20, 0),
        event_line(REORDER_NS * 3, 0),
        r#"{"totals":{"target":"x","seconds":1.0,"events":4,"lost":0,"notes":[]}}"#.into(),
    ]);
    let mut reader = Reader::open(file.path()).unwrap();
    let mut times = Vec::new();
    while let Some(event) = reader.next_event().unwrap() {
        times.push(event.t);
    }
    assert_eq!(times, [10, 20, 30, REORDER_NS * 3]);
    assert_eq!(reader.totals.unwrap().events, 4);
}

/// A file that is not a recording, a line that is no event, an absurd CPU count, an endless
/// line: an error naming the file and line, never a panic or an unbounded allocation.
#[test]
fn bad_files_are_refused_naming_the_line() {
    let refused = |lines: &[String]| -> String {
        let file = write_file(lines);
        let mut reader = match Reader::open(file.path()) {
            Ok(reader) => reader,
            Err(e) => return e.to_string(),
        };
        loop {
            match reader.next_event() {
                Ok(Some(_)) => {}
                Ok(None) => panic!("read whole: {lines:?}"),
                Err(e) => return e.to_string(),
            }
        }
    };
    assert!(refused(&[r#"{"mode":"sched"}"#.into()]).contains("first line is not a header"));
    let huge = HEADER.replace("\"cpus\":2", "\"cpus\":4000000000");
    assert!(refused(&[huge]).contains("first line is not a header"));
    assert!(refused(&[HEADER.into(), event_line(1, 0), "{\"t\":1}".into()]).contains("line 3: not an event"));
    assert!(refused(&[HEADER.into(), "x".repeat(200_000)]).contains("line 2: longer than"));
    assert!(refused(&[HEADER.into(), HEADER.into()]).contains("line 2: a second header"));
}

/// The kernel now and then switches a task in with no `sched_switch` event: its next switch-out
/// still ends a run the kernel counted (its `pcount` grew), with the kernel's figures for it.
#[test]
fn a_run_whose_switch_in_was_not_seen_is_the_kernels() {
    let idle = TaskSnap::default();
    let mut timeline = Timeline::new(true);
    let events = [
        switch(100, idle, snap(7, 3, 5_000, 40_000), SLEEPING),
        switch(400, snap(7, 4, 5_020, 40_290), idle, PREEMPTED),
        // In again unseen; out at 900.
        switch(900, snap(7, 5, 5_100, 40_500), idle, SLEEPING),
        // Out again with no run between (a lost switch-in and the same totals): no line.
        switch(950, snap(7, 5, 5_100, 40_500), idle, SLEEPING),
    ];
    let runs: Vec<Run> = events.iter().filter_map(|e| timeline.step(e)).collect();
    let figures: Vec<_> = runs.iter().map(|r| (r.delay_ns, r.run_ns, r.wait_ns)).collect();
    assert_eq!(figures, [(20, 290, None), (80, 210, None)]);
    assert_eq!(timeline.unseen_starts, 1);
}

/// A group's last thread leaves the target set at its exit, before its last switch-out: that
/// run is still the target's. A tid reused by a new task (its fork seen) starts afresh.
#[test]
fn a_target_stays_one_to_its_end_and_a_reused_tid_starts_afresh() {
    let idle = TaskSnap::default();
    let mut timeline = Timeline::new(true);
    let gone = TaskSnap {
        target: 0,
        ..snap(7, 5, 5_100, 40_500)
    };
    let fork = Event::from_kernel(&SchedEvent {
        time_ns: 2_000,
        cpu: 0,
        kind: event_kind::FORK,
        a: snap(7, 0, 0, 0),
        b: snap(3, 9, 9, 9),
        arg: 0,
    })
    .unwrap();
    let events = [
        switch(100, idle, snap(7, 4, 5_020, 40_290), SLEEPING),
        switch(400, gone, idle, 0x80),
        fork,
        switch(2_100, idle, snap(7, 0, 0, 0), 0),
        switch(2_300, snap(7, 1, 40, 150), idle, SLEEPING),
    ];
    let runs: Vec<Run> = events.iter().filter_map(|e| timeline.step(e)).collect();
    let figures: Vec<_> = runs
        .iter()
        .map(|r| (r.task.target, r.delay_ns, r.run_ns))
        .collect();
    assert_eq!(figures, [(true, 80, 210), (true, 40, 150)]);
}
