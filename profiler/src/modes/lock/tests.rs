//! Lock mode's folding of drained records.
use std::collections::HashMap;

use profiler_common::lock::LockTime;
use prost::Message as _;

use super::*;
use crate::{
    profile::StackRead,
    report::pprof::{self, proto},
    sources::locks::DrainHealth,
    symbolize::Symbols,
};

fn drained(role: Role, ips: &[u64], (count, total_ns, max_ns): (u64, u64, u64)) -> DrainedRecord {
    DrainedRecord {
        record: LockRecord {
            pid: 7,
            exec_generation: 0,
            address: 0x1000,
            instance: 0,
            flags: 0,
            role,
            time: LockTime {
                count,
                total_ns,
                max_ns,
            },
            in_progress: 0,
        },
        user: StackRead::Frames(ips.to_vec()),
        kernel: StackRead::Absent,
    }
}

/// Two drains see the same lock and waiting stack: one record with both drains' waits, as
/// one sample of Go's mutex profile; another stack and the releasing stack stay apart.
#[test]
fn drains_merge_by_lock_and_stack_into_one_mutex_profile_sample_each() {
    let procs = Processes::new();
    let mut window = LockCollection::default();
    let first = vec![drained(Role::Waiter, &[0x10, 0x20], (2, 300, 200))];
    let second = vec![
        drained(Role::Waiter, &[0x10, 0x20], (1, 100, 150)),
        drained(Role::Waiter, &[0x30], (1, 50, 50)),
        drained(Role::Holder, &[0x40], (3, 450, 0)),
    ];
    for records in [first, second] {
        let batch = LockBatch {
            records,
            holds: HashMap::new(),
            joinable: None,
            health: DrainHealth::default(),
        };
        window.add_batch(batch, &procs);
    }
    assert_eq!(window.records.len(), 3);
    assert_eq!(
        window.records[0].time,
        LockTime {
            count: 3,
            total_ns: 400,
            max_ns: 200
        }
    );
    let weight_of = |tid: u32| -> u64 {
        window
            .stacks
            .stacks
            .iter()
            .filter(|(k, _)| k.tid == tid)
            .map(|(_, n)| n)
            .sum()
    };
    assert_eq!((weight_of(0), weight_of(1), weight_of(2)), (400, 50, 450));

    let meta = crate::report::tests::sample_report().meta;
    let report = report(
        meta,
        LockSource::Futex,
        Waits::All,
        Health::default(),
        &window,
        &Symbols::default(),
        &procs,
    );
    assert_eq!(report.locks.len(), 1);
    let lock = &report.locks[0];
    assert_eq!(
        (lock.contentions, lock.total_wait_ns, lock.max_wait_ns),
        (4, 450, 200)
    );
    assert_eq!(
        (lock.waiters.len(), lock.holders.len(), lock.unattributed_wait_ns),
        (2, 1, 0)
    );

    let profile = pprof::lock_profile(&report, &|_| vec![("executable", "/bin/server".to_string())]);
    let profile = proto::Profile::decode(&*profile.encode_to_vec()).unwrap();
    let text = |i: i64| profile.string_table[i as usize].as_str();
    let types: Vec<(&str, &str)> = profile
        .sample_type
        .iter()
        .map(|t| (text(t.r#type), text(t.unit)))
        .collect();
    assert_eq!(types, [("contentions", "count"), ("delay", "nanoseconds")]);
    assert_eq!(
        profile.sample.len(),
        2,
        "one sample per waiting stack; holders are not waits"
    );
    let values: Vec<&[i64]> = profile.sample.iter().map(|s| &s.value[..]).collect();
    assert_eq!(values, [&[3, 400][..], &[1, 50][..]]);
    for sample in &profile.sample {
        let labels: HashMap<&str, &str> = sample
            .label
            .iter()
            .filter(|l| l.str != 0)
            .map(|l| (text(l.key), text(l.str)))
            .collect();
        assert_eq!(labels["lock"], "0x1000");
        assert_eq!(labels["lock_kind"], "futex");
        assert_eq!(labels["wait_class"], "waiting");
        assert_eq!(labels["executable"], "/bin/server");
        assert!(sample.label.iter().any(|l| text(l.key) == "pid" && l.num == 7));
        assert!(
            sample.label.iter().all(|l| text(l.key) != "tid"),
            "no thread: records are per process"
        );
        // The lock is the leaf.
        let leaf = &profile.location[sample.location_id[0] as usize - 1];
        let function = &profile.function[leaf.line[0].function_id as usize - 1];
        assert_eq!(text(function.name), "[lock 0x1000]");
    }
}
