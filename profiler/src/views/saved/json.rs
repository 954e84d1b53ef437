//! Our JSON reports read back (docs/json.md): a hotspot report's stacks, and the sched and lock
//! reports whole, each field where the JSON renderer put it, so that rendering one again gives
//! what the run gave. Fields are only ever added within a format version: one missing reads as
//! zero or empty.
use profiler_common::CpuWaits;
use serde_json::Value;

use super::{meta, stack_report, static_name, Saved};
use crate::{
    cli::LockSource,
    model::{RunMeta, Stack, Weight},
    modes::{
        lock::{HolderStat, Holds, LockReport, LockStat, WaitClass, WaiterStat},
        sched::{
            Bucket, CpuHolder, CpuLatency, Heatmap, OffCpuStack, SchedReport, SlowWait, TaskLatency, TaskRef,
        },
    },
    profile::Health,
    symbolize::{Frame, NameKind, ObjectRef, UNKNOWN},
};

pub(super) fn from_json(bytes: &[u8]) -> Result<Saved, String> {
    let mut doc: Value = serde_json::from_slice(bytes).map_err(|e| format!("not valid JSON: {e}"))?;
    let newest = crate::report::json::FORMAT_VERSION;
    if let Some(version) = doc["format_version"].as_u64().filter(|&v| v > newest as u64) {
        return Err(format!(
            "written by a newer bpfprof (format_version {version}; this one reads up to {newest}): read it with that version"
        ));
    }
    let table = Table::take(&mut doc)?;
    match doc["mode"].as_str().unwrap_or("") {
        "hotspot" => hotspot(&doc, &table).map(Saved::Stacks),
        "sched" => sched(&doc, &table).map(Saved::Sched),
        "lock" => lock(&doc, &table).map(Saved::Lock),
        "topdown" => Err("a topdown report has no stacks (use a hotspot, sched or lock profile)".into()),
        other => Err(format!("not a bpfprof report (mode `{other}`)")),
    }
}

fn num(v: &Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or(0)
}

fn text(v: &Value, key: &str) -> String {
    v[key].as_str().unwrap_or("").to_string()
}

fn list<'a>(v: &'a Value, key: &str) -> &'a [Value] {
    v[key].as_array().map(Vec::as_slice).unwrap_or(&[])
}

/// Each item of the list `key` of `v`, read by `read`.
fn each<T>(v: &Value, key: &str, read: impl Fn(&Value) -> Result<T, String>) -> Result<Vec<T>, String> {
    list(v, key).iter().map(read).collect()
}

/// The header every report has; `event` for those that do not say theirs.
fn run_meta(doc: &Value, mode: &str, event: &str) -> RunMeta {
    let mut meta = meta(mode, doc["event"].as_str().unwrap_or(event), text(doc, "target"));
    meta.frequency_hz = num(doc, "frequency_hz");
    meta.period = doc["period"].as_u64();
    meta.duration_s = doc["duration_s"].as_f64().unwrap_or(0.0);
    meta.cpus = num(doc, "cpus") as u32;
    meta.notes = list(doc, "notes")
        .iter()
        .filter_map(|n| n.as_str().map(str::to_string))
        .collect();
    meta.weight = doc["weight"].as_str().map(str::to_string);
    meta
}

fn health(doc: &Value) -> Result<Health, String> {
    match doc.get("health") {
        None | Some(Value::Null) => Ok(Health::default()),
        Some(health) => serde_json::from_value(health.clone()).map_err(|e| format!("its health: {e}")),
    }
}

fn hotspot(doc: &Value, table: &Table) -> Result<crate::model::StackReport, String> {
    let stacks = each(doc, "stacks", |s| stack(s, "count", table))?;
    let meta = run_meta(doc, "hotspot", "");
    Ok(stack_report(Weight::Samples, meta, health(doc)?, stacks))
}

fn stack(s: &Value, count: &str, table: &Table) -> Result<Stack, String> {
    Ok(Stack {
        pid: num(s, "pid") as u32,
        tid: num(s, "tid") as u32,
        comm: text(s, "comm"),
        count: s[count].as_u64().ok_or("a stack without its count")?,
        counters: Vec::new(),
        frames: table.frames(&s["frames"])?,
    })
}

/// The frames table of a report (format_version 2: each distinct frame once, stacks naming them
/// by index), read once; and how many frames its stacks may still take.
struct Table {
    frames: Vec<Frame>,
    left: std::cell::Cell<usize>,
}

impl Table {
    fn take(doc: &mut Value) -> Result<Table, String> {
        let frames = match doc.as_object_mut().and_then(|d| d.remove("frames")) {
            Some(Value::Array(table)) => table.iter().map(frame).collect::<Result<_, _>>()?,
            _ => Vec::new(),
        };
        Ok(Table {
            frames,
            left: std::cell::Cell::new(super::MAX_FRAMES),
        })
    }

    /// A stack's frames: objects (format_version 1) or indices into the table. Each index is a
    /// copy of its frame: a report naming frames millions of times over would take without
    /// bound, so all stacks together hold at most `MAX_FRAMES`.
    fn frames(&self, value: &Value) -> Result<Vec<Frame>, String> {
        let list = value.as_array().ok_or("a stack without frames")?;
        let left = self
            .left
            .get()
            .checked_sub(list.len())
            .ok_or_else(super::too_many_frames)?;
        self.left.set(left);
        list.iter()
            .map(|f| match f.as_u64() {
                Some(i) => self.frames.get(i as usize).cloned().ok_or_else(|| {
                    format!(
                        "a stack names frame {i}, which the frames table of {} entries does not hold",
                        self.frames.len()
                    )
                }),
                None => frame(f),
            })
            .collect()
    }
}

fn frame(f: &Value) -> Result<Frame, String> {
    let hex = |v: &Value| {
        v.as_str()
            .and_then(|s| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok())
    };
    let function = f["function"].as_str().ok_or("a frame without a function")?;
    // Written before frames said how they were named: named unless `[unknown]`.
    let kind = f["kind"]
        .as_str()
        .and_then(NameKind::parse)
        .unwrap_or(match function {
            UNKNOWN => NameKind::None,
            _ => NameKind::Symbol,
        });
    let object = ObjectRef {
        build_id: f["build_id"].as_str().map(str::to_string),
        file_offset: hex(&f["file_offset"]),
        vaddr: hex(&f["vaddr"]),
    };
    let placed = object.build_id.is_some() || object.file_offset.is_some() || object.vaddr.is_some();
    Ok(Frame {
        function: function.to_string(),
        module: text(f, "module"),
        file: f["file"].as_str().map(str::to_string),
        line: f["line"].as_u64().map(|l| l as u32),
        kernel: f["kernel"].as_bool().unwrap_or(false),
        inlined: f["inlined"].as_bool().unwrap_or(false),
        address: hex(&f["address"]).unwrap_or(0),
        start: hex(&f["start"]),
        offset: f["offset"].as_u64(),
        kind,
        object: placed.then_some(object),
    })
}

fn sched(doc: &Value, table: &Table) -> Result<SchedReport, String> {
    let meta = run_meta(doc, "sched", "off-cpu");
    let health = health(doc)?;
    let offcpu_stacks = each(doc, "offcpu", |s| offcpu_stack(s, table))?;
    let stacks = each(doc, "offcpu", |s| stack(s, "total_ns", table))?;
    Ok(SchedReport {
        offcpu: stack_report(Weight::OffCpuNanoseconds, meta.clone(), health.clone(), stacks),
        meta,
        health,
        tasks: each(doc, "tasks", task)?,
        cpus: each(doc, "per_cpu", |c| {
            Ok(CpuLatency {
                cpu: num(c, "cpu") as u32,
                waits: num(c, "waits"),
                total_delay_ns: num(c, "total_delay_ns"),
                avg_delay_ns: num(c, "avg_delay_ns"),
                max_delay_ns: num(c, "max_delay_ns"),
                idle_ns: c["idle_ns"].as_u64(),
            })
        })?,
        unplaced: CpuWaits {
            waits: num(doc, "unplaced_waits"),
            delay_ns: num(doc, "unplaced_delay_ns"),
            max_delay_ns: 0,
        },
        idle_window_ns: num(doc, "idle_window_ns"),
        offcpu_stacks,
        slow_threshold_ns: num(doc, "slow_threshold_ns"),
        slow_total: num(doc, "slow_total"),
        slow: each(doc, "slow_events", slow_wait)?,
        // Not in the JSON: a saved profile is not drawn as a heatmap.
        heatmap: Heatmap {
            column_s: 1.0,
            row_lower_ns: Vec::new(),
            columns: Vec::new(),
        },
    })
}

fn task(t: &Value) -> Result<TaskLatency, String> {
    Ok(TaskLatency {
        pid: num(t, "pid") as u32,
        tid: num(t, "tid") as u32,
        comm: text(t, "comm"),
        runs: num(t, "runs"),
        waits: num(t, "waits"),
        total_delay_ns: num(t, "total_delay_ns"),
        avg_delay_ns: num(t, "avg_delay_ns"),
        p50_delay_ns: num(t, "p50_delay_ns"),
        p99_delay_ns: num(t, "p99_delay_ns"),
        max_delay_ns: num(t, "max_delay_ns"),
        max_at_s: t["max_at_s"].as_f64().unwrap_or(0.0),
        running_ns: num(t, "running_ns"),
        sleeping_ns: num(t, "sleeping_ns"),
        blocked_ns: num(t, "blocked_ns"),
        histogram: each(t, "histogram", |b| {
            Ok(Bucket {
                le_ns: num(b, "le_ns"),
                count: num(b, "count"),
            })
        })?,
    })
}

fn offcpu_stack(s: &Value, table: &Table) -> Result<OffCpuStack, String> {
    let stack = stack(s, "total_ns", table)?;
    Ok(OffCpuStack {
        pid: stack.pid,
        tid: stack.tid,
        comm: stack.comm,
        total_ns: stack.count,
        count: num(s, "count"),
        frames: stack.frames,
    })
}

fn slow_wait(e: &Value) -> Result<SlowWait, String> {
    Ok(SlowWait {
        pid: num(e, "pid") as u32,
        tid: num(e, "tid") as u32,
        comm: text(e, "comm"),
        cpu: e["cpu"].as_u64().map(|c| c as u32),
        delay_ns: num(e, "delay_ns"),
        at_s: e["at_s"].as_f64().unwrap_or(0.0),
        waker: e["waker"].as_object().map(|_| TaskRef {
            pid: num(&e["waker"], "pid") as u32,
            tid: num(&e["waker"], "tid") as u32,
            comm: text(&e["waker"], "comm"),
        }),
        holders_complete: e["holders_complete"].as_bool().unwrap_or(false),
        cpu_holders: each(e, "cpu_holders", |h| {
            Ok(CpuHolder {
                tid: num(h, "tid") as u32,
                comm: text(h, "comm"),
                held_ns: num(h, "held_ns"),
            })
        })?,
    })
}

fn lock(doc: &Value, table: &Table) -> Result<LockReport, String> {
    let meta = run_meta(doc, "lock", "lock-wait");
    let health = health(doc)?;
    let source = match doc["source"].as_str() {
        Some("pthread") => LockSource::Pthread,
        Some("kernel") => LockSource::Kernel,
        _ => LockSource::Futex,
    };
    let locks = each(doc, "locks", |l| lock_stat(l, table))?;
    Ok(LockReport {
        waits: crate::modes::lock::flame(meta.clone(), health.clone(), &locks.iter().collect::<Vec<_>>()),
        meta,
        source,
        health,
        locks,
    })
}

/// The kinds of lock the lock report names (user-space waits, then the kernel's lock types).
const KINDS: [&str; 13] = [
    "mutex",
    "rwlock",
    "condvar",
    "semaphore",
    "barrier",
    "join",
    "spinlock",
    "park",
    "futex",
    "rtmutex",
    "rwlock-rt",
    "rwsem",
    "pcpu-sem",
];

fn lock_stat(l: &Value, table: &Table) -> Result<LockStat, String> {
    let holds = l["holds"].as_object().map(|_| Holds {
        holds: num(&l["holds"], "holds"),
        total_hold_ns: num(&l["holds"], "total_hold_ns"),
        max_hold_ns: num(&l["holds"], "max_hold_ns"),
        avg_hold_ns: num(&l["holds"], "avg_hold_ns"),
    });
    let address = l["address"].as_str().unwrap_or("");
    Ok(LockStat {
        pid: num(l, "pid") as u32,
        comm: text(l, "comm"),
        address: u64::from_str_radix(address.trim_start_matches("0x"), 16)
            .map_err(|_| format!("a lock whose address is not hex: {:?}", l["address"]))?,
        instance: num(l, "instance") as u32,
        exec_generation: 0,
        flags: 0,
        symbol: l["symbol"].as_str().map(str::to_string),
        thread: l["thread"].as_u64().map(|t| t as u32),
        waited_in: l["waited_in"].as_str().map(str::to_string),
        kind: static_name(l["kind"].as_str().unwrap_or(""), &KINDS),
        class: match l["class"].as_str() {
            Some("waiting") => WaitClass::Waiting,
            _ => WaitClass::Contention,
        },
        contentions: num(l, "contentions"),
        waiting_at_stop: num(l, "waiting_at_stop"),
        total_wait_ns: num(l, "total_wait_ns"),
        max_wait_ns: num(l, "max_wait_ns"),
        avg_wait_ns: num(l, "avg_wait_ns"),
        unattributed_wait_ns: num(l, "unattributed_wait_ns"),
        holds,
        waiters: each(l, "waiters", |w| {
            Ok(WaiterStat {
                frames: table.frames(&w["frames"])?,
                contentions: num(w, "contentions"),
                total_wait_ns: num(w, "total_wait_ns"),
                max_wait_ns: num(w, "max_wait_ns"),
            })
        })?,
        holders: each(l, "holders", |h| {
            Ok(HolderStat {
                frames: table.frames(&h["frames"])?,
                wakes: num(h, "wakes"),
                total_wait_ns: num(h, "total_wait_ns"),
            })
        })?,
    })
}

#[cfg(test)]
mod tests {
    use super::super::{parse_saved, stack_report, Saved};
    use super::*;
    use crate::{
        cli::Format,
        model::tests::frame,
        report::{renderer, tests::sample_report},
    };

    fn meta(mode: &'static str) -> RunMeta {
        RunMeta {
            mode,
            target: "command ./w".into(),
            notes: vec!["the command exited with status 3".into()],
            duration_s: 2.5,
            ..sample_report().meta
        }
    }

    fn health() -> Health {
        Health {
            sched_switches: 4812,
            offcpu_map_full: 3,
            lock_waits: 90,
            ..Health::default()
        }
    }

    fn sched_report() -> SchedReport {
        let meta = meta("sched");
        let task = |tid: u32, total: u64| TaskLatency {
            pid: 10,
            tid,
            comm: format!("worker-{tid}"),
            runs: 120 + tid as u64,
            waits: 100,
            total_delay_ns: total,
            avg_delay_ns: total / 100,
            p50_delay_ns: 30_000,
            p99_delay_ns: 900_000,
            max_delay_ns: 1_250_000,
            max_at_s: 1.75,
            running_ns: 1_000_000_000,
            sleeping_ns: 2_000,
            blocked_ns: 7,
            histogram: vec![
                Bucket {
                    le_ns: 32_768,
                    count: 60,
                },
                Bucket {
                    le_ns: 1_048_576,
                    count: 40,
                },
            ],
        };
        let mut stack = vec![frame("main"), frame("wait_here")];
        stack[1].file = Some("/src/w.c".into());
        stack[1].line = Some(12);
        SchedReport {
            offcpu: stack_report(Weight::OffCpuNanoseconds, meta.clone(), health(), Vec::new()),
            meta,
            health: health(),
            tasks: vec![task(11, 9_000_000), task(12, 4_000_000)],
            cpus: vec![
                CpuLatency {
                    cpu: 0,
                    waits: 150,
                    total_delay_ns: 9_000_000,
                    avg_delay_ns: 60_000,
                    max_delay_ns: 1_250_000,
                    idle_ns: Some(20_000_000),
                },
                CpuLatency {
                    cpu: 1,
                    waits: 50,
                    total_delay_ns: 3_000_000,
                    avg_delay_ns: 60_000,
                    max_delay_ns: 900_000,
                    idle_ns: None,
                },
            ],
            unplaced: CpuWaits {
                waits: 1,
                delay_ns: 1_000_000,
                max_delay_ns: 0,
            },
            idle_window_ns: 2_000_000_000,
            offcpu_stacks: vec![OffCpuStack {
                pid: 10,
                tid: 12,
                comm: "worker-12".into(),
                total_ns: 2_000_000_000,
                count: 4,
                frames: stack,
            }],
            slow_threshold_ns: 1_000_000,
            slow_total: 2,
            slow: vec![
                SlowWait {
                    pid: 10,
                    tid: 11,
                    comm: "worker-11".into(),
                    cpu: Some(1),
                    delay_ns: 1_250_000,
                    at_s: 1.75,
                    waker: Some(TaskRef {
                        pid: 10,
                        tid: 12,
                        comm: "worker-12".into(),
                    }),
                    holders_complete: true,
                    cpu_holders: vec![CpuHolder {
                        tid: 99,
                        comm: "hog".into(),
                        held_ns: 1_200_000,
                    }],
                },
                SlowWait {
                    waker: None,
                    holders_complete: false,
                    cpu_holders: Vec::new(),
                    ..sched_report_slow_base()
                },
            ],
            heatmap: Heatmap {
                column_s: 1.0,
                row_lower_ns: Vec::new(),
                columns: Vec::new(),
            },
        }
    }

    fn sched_report_slow_base() -> SlowWait {
        SlowWait {
            pid: 10,
            tid: 12,
            comm: "worker-12".into(),
            cpu: Some(0),
            delay_ns: 1_100_000,
            at_s: 0.5,
            waker: None,
            cpu_holders: Vec::new(),
            holders_complete: false,
        }
    }

    fn lock_report() -> LockReport {
        let meta = meta("lock");
        let waiter = |leaf: &str, wait: u64| WaiterStat {
            frames: vec![frame("main"), frame(leaf), frame("__lll_lock_wait")],
            contentions: 7,
            total_wait_ns: wait,
            max_wait_ns: wait / 3,
        };
        let lock = |address: u64, kind: &'static str, class: WaitClass| LockStat {
            pid: 10,
            comm: "server".into(),
            address,
            kind,
            class,
            contentions: 14,
            total_wait_ns: 3_000_000,
            max_wait_ns: 1_000_000,
            avg_wait_ns: 214_285,
            unattributed_wait_ns: 500,
            waiters: vec![waiter("update", 2_000_000), waiter("flush", 1_000_000)],
            holders: vec![HolderStat {
                frames: vec![frame("main"), frame("update"), frame("pthread_mutex_unlock")],
                wakes: 13,
                total_wait_ns: 2_999_500,
            }],
            ..LockStat::default()
        };
        let contended = LockStat {
            symbol: Some("shared_lock".into()),
            instance: 1,
            holds: Some(Holds {
                holds: 40,
                total_hold_ns: 40_000_000,
                max_hold_ns: 2_000_000,
                avg_hold_ns: 1_000_000,
            }),
            ..lock(0x5581_c0a0_14c0, "mutex", WaitClass::Contention)
        };
        let waiting = LockStat {
            waited_in: Some("consumer".into()),
            ..lock(0x7ffd_0000_9088, "condvar", WaitClass::Waiting)
        };
        let joined = LockStat {
            thread: Some(13),
            ..lock(0x7f00_0000_0910, "join", WaitClass::Waiting)
        };
        LockReport {
            waits: stack_report(Weight::LockWaitNanoseconds, meta.clone(), health(), Vec::new()),
            meta,
            source: LockSource::Pthread,
            health: health(),
            locks: vec![contended, waiting, joined],
        }
    }

    fn rendered(format: Format, render: impl Fn(&dyn crate::report::Renderer, &mut Vec<u8>)) -> String {
        let mut out = Vec::new();
        render(&*renderer(format), &mut out);
        String::from_utf8(out).unwrap()
    }

    /// A sched report saved as JSON renders again as the same text report and the same JSON.
    #[test]
    fn a_sched_json_renders_again_as_its_text_report() {
        let original = sched_report();
        let json = rendered(Format::Json, |r, out| r.sched(&original, out).unwrap());
        let Ok(Saved::Sched(loaded)) = parse_saved(json.as_bytes(), "s.json") else {
            panic!("not read back as a sched report");
        };
        for format in [Format::Text, Format::Json] {
            let want = rendered(format, |r, out| r.sched(&original, out).unwrap());
            let got = rendered(format, |r, out| r.sched(&loaded, out).unwrap());
            assert_eq!(got, want, "{format:?}");
        }
        let text = rendered(Format::Text, |r, out| r.sched(&loaded, out).unwrap());
        assert!(
            text.contains("4812 context switches")
                && text.contains("worker-11")
                && text.contains("Run-queue delay per CPU")
                && text.contains("1 waits (1.00 ms) in no CPU's row"),
            "{text}"
        );
        assert!(
            text.contains("woken by worker-12") && text.contains("wait_here"),
            "{text}"
        );
        assert!(text.contains("warning: "), "the health's warnings: {text}");
        // The views see its off-CPU stacks, weighted by time.
        let stacks = Saved::Sched(loaded).into_stacks();
        assert_eq!(
            (stacks.weight, stacks.samples),
            (Weight::OffCpuNanoseconds, 2_000_000_000)
        );
    }

    /// A lock report saved as JSON renders again as the same text report and the same JSON.
    #[test]
    fn a_lock_json_renders_again_as_its_text_report() {
        let original = lock_report();
        let json = rendered(Format::Json, |r, out| r.lock(&original, out).unwrap());
        let Ok(Saved::Lock(loaded)) = parse_saved(json.as_bytes(), "l.json") else {
            panic!("not read back as a lock report");
        };
        for format in [Format::Text, Format::Json] {
            let want = rendered(format, |r, out| r.lock(&original, out).unwrap());
            let got = rendered(format, |r, out| r.lock(&loaded, out).unwrap());
            assert_eq!(got, want, "{format:?}");
        }
        let text = rendered(Format::Text, |r, out| r.lock(&loaded, out).unwrap());
        assert!(
            text.contains("bpfprof lock (pthread waits): command ./w"),
            "{text}"
        );
        assert!(text.contains("shared_lock (mutex, 0x5581c0a014c0)"), "{text}");
        assert!(text.contains("held 40 times"), "{text}");
        // The views see every waiting stack, the lock below its leaf.
        let stacks = Saved::Lock(loaded).into_stacks();
        assert_eq!(
            (stacks.weight, stacks.samples),
            (Weight::LockWaitNanoseconds, 9_000_000)
        );
        assert!(stacks
            .stacks
            .iter()
            .any(|s| s.frames.last().unwrap().function == "[lock thread 13]"));
    }
}

#[cfg(test)]
mod placed_tests {
    use super::{super::parse_saved, *};
    use crate::{
        cli::Format,
        report::{renderer, tests::sample_report},
        symbolize::stripped_frames,
    };

    #[test]
    fn placed_frames_keep_their_kind_and_place_through_json() {
        let mut report = sample_report();
        let frames = stripped_frames();
        report.stacks[0].frames.push(frames[1].clone());
        report.stacks[1].frames.extend(frames.clone());
        let mut json = Vec::new();
        renderer(Format::Json).hotspot(&report, &mut json).unwrap();
        let written: Value = serde_json::from_slice(&json).unwrap();
        let table = written["frames"].as_array().unwrap();
        let placed = table.iter().find(|f| f["kind"] == "fde").expect("a placed frame");
        println!("{placed}");
        assert_eq!(placed["build_id"], "72a44fc3");
        assert_eq!(placed["file_offset"], "0x1592b");
        assert_eq!(placed["vaddr"], "0x1692b");
        assert_eq!(placed["start"], "0x16900");
        // Leaves: 60 placed (stack 0), 30 neither named nor placed (stack 1), 10 named.
        assert_eq!(
            (
                written["placed_leaf_samples"].as_u64(),
                written["unplaced_leaf_samples"].as_u64()
            ),
            (Some(60), Some(30))
        );
        let Ok(Saved::Stacks(loaded)) = parse_saved(&json, "p.json") else {
            panic!("not read back as a hotspot report");
        };
        for (got, want) in loaded.stacks.iter().zip(&report.stacks) {
            assert_eq!(got.frames, want.frames);
        }
    }
}
