use profiler_common::syscalls::{SyscallKey, SyscallTotals, NO_RETURN};

use super::*;

fn totals(calls: u64, total_ns: u64, min_ns: u64, max_ns: u64) -> SyscallTotals {
    let mut comm = [0u8; 16];
    comm[..2].copy_from_slice(b"dd");
    SyscallTotals {
        calls,
        total_ns,
        min_ns,
        max_ns,
        comm,
    }
}

fn key(tid: u32, name: &str, errno: u32) -> SyscallKey {
    let nr = syscalls::Sysno::from_str(name).unwrap().id() as u32;
    SyscallKey {
        tgid: 100,
        tid,
        nr,
        errno,
    }
}

use std::str::FromStr as _;

#[test]
fn a_threads_rows_fold_errnos_and_calls_that_did_not_return_into_one_line_per_call() {
    let batch = SyscallBatch {
        totals: vec![
            (key(100, "openat", 0), totals(5, 5_000, 500, 2_000)),
            (key(100, "openat", 2), totals(3, 900, 200, 400)),
            (key(100, "openat", 13), totals(1, 300, 300, 300)),
            (key(100, "read", 0), totals(10, 50_000, 1_000, 20_000)),
            (key(100, "exit_group", NO_RETURN), totals(1, 0, 0, 0)),
            (key(101, "write", 0), totals(2, 100, 50, 50)),
        ],
        in_progress: vec![(100, 101, key(0, "futex", 0).nr)],
        ..SyscallBatch::default()
    };
    let report = TraceReport::of("command `dd`".into(), 1.0, &batch, Vec::new());
    assert_eq!(report.calls, 5 + 3 + 1 + 10 + 1 + 2 + 1);
    let main = &report.threads[0];
    assert_eq!((main.tid, main.calls, main.comm.as_str()), (100, 20, "dd"));
    let names: Vec<&str> = main.syscalls.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(
        names,
        ["read", "openat", "exit_group"],
        "the longest in total first"
    );
    let openat = &main.syscalls[1];
    assert_eq!((openat.calls, openat.errors), (9, 4));
    assert_eq!(
        openat.errnos,
        BTreeMap::from([("EACCES".into(), 1), ("ENOENT".into(), 3)])
    );
    assert_eq!(
        (openat.total_ns, openat.min_ns, openat.max_ns, openat.avg_ns),
        (6_200, 200, 2_000, 688)
    );
    let exit = &main.syscalls[2];
    assert_eq!((exit.calls, exit.no_return, exit.total_ns), (1, 1, 0));
    let worker = &report.threads[1];
    assert_eq!((worker.tid, worker.calls), (101, 3));
    let futex = worker.syscalls.iter().find(|c| c.name == "futex").unwrap();
    assert_eq!((futex.calls, futex.in_progress, futex.min_ns), (1, 1, 0));

    let mut text = Vec::new();
    render::text(&report, &mut text).unwrap();
    let text = String::from_utf8(text).unwrap();
    println!("{text}");
    assert!(text.contains("23 calls by 2 threads"), "{text}");
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with("openat"))
        .unwrap();
    assert!(line.contains("EACCES 1, ENOENT 3"), "{line}");
    assert!(text
        .lines()
        .any(|l| l.contains("exit_group") && l.ends_with("1 never returned")));
    assert!(text
        .lines()
        .any(|l| l.contains("futex") && l.ends_with("1 in progress at the stop")));
}

#[test]
fn unknown_numbers_keep_their_number() {
    assert_eq!(syscall_name(100_000), "syscall_100000");
    assert_eq!(errno_name(2), "ENOENT");
    assert_eq!(errno_name(4000), "errno 4000");
    assert_eq!(errno_name(512), "ERESTARTSYS");
    assert_eq!(errno_name(516), "ERESTART_RESTARTBLOCK");
}

fn param(name: &str, declared: &str) -> crate::counters::tracepoint::Field {
    crate::counters::tracepoint::Field {
        name: name.into(),
        offset: 16,
        size: 8,
        array: false,
        signed: false,
        declared: declared.into(),
    }
}

#[test]
fn a_slow_calls_arguments_are_shown_as_the_kernel_declares_them() {
    let params = [
        param("dfd", "int"),
        param("filename", "const char *"),
        param("flags", "int"),
        param("mode", "umode_t"),
    ];
    let values = [0xdead_0000_ffff_ff9c, 0x7ffc_0000_1000, 0x80000, 0o644, 9, 9];
    let shown: Vec<(String, String)> = (slow::args(&values, Some(&params)).into_iter())
        .map(|a| (a.name, a.value))
        .collect();
    let expected = [
        ("dfd", "-100"),
        ("filename", "0x7ffc00001000"),
        ("flags", "524288"),
        ("mode", "420"),
    ];
    assert_eq!(
        shown,
        expected.map(|(n, v)| (n.to_string(), v.to_string())),
        "an int from the register's low half, whatever the high one holds"
    );
    let params = [
        param("rmtp", "struct __kernel_timespec *"),
        param("offset", "loff_t"),
    ];
    let shown: Vec<String> = (slow::args(&[0, (-4096i64) as u64, 0, 0, 0, 0], Some(&params)).into_iter())
        .map(|a| a.value)
        .collect();
    assert_eq!(shown, ["NULL", "-4096"]);
    assert!(
        slow::args(&[1; 6], Some(&[])).is_empty(),
        "a call that takes none"
    );
    let unknown = slow::args(&[1, 2, 3, 4, 5, 0xff], None);
    assert_eq!(unknown.len(), 6, "every register where the call is not described");
    assert_eq!(
        (unknown[5].name.as_str(), unknown[5].value.as_str()),
        ("arg6", "0xff")
    );
}
