//! `trace --duration-min MS`: each call at least that long, as `perf trace --duration` lists it:
//! when it began, how long it took, which thread, the call with its arguments named as the
//! kernel's own `syscalls:sys_enter_*` tracepoint names them, its result, and the user stack it
//! was made from.
use std::{collections::HashMap, path::Path};

use profiler_common::syscalls::{errno_of, SlowCallHeader};
use serde::Serialize;

use super::{errno_name, syscall_name};
use crate::{
    collect::comm_string,
    counters::tracepoint::{layout, Field},
    process::Processes,
    record::stacks::StackFrame,
    sources::syscalls::SlowCalls,
    symbolize::{DebugLocator, Symbolizer},
};

/// The calls at least `min_ms` long, in the order they began.
#[derive(Clone, Debug, Serialize)]
pub struct SlowCallsReport {
    pub min_ms: f64,
    pub calls: Vec<SlowCallReport>,
    /// Calls that were as long but not listed: past the most a report keeps, or dropped by a
    /// full ring (counted in the notes too).
    pub not_listed: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct SlowCallReport {
    /// When it began, in seconds since collection began.
    pub at_s: f64,
    pub took_ns: u64,
    pub pid: u32,
    pub tid: u32,
    pub comm: String,
    pub cpu: u32,
    pub name: String,
    pub nr: u32,
    pub args: Vec<CallArg>,
    /// What it returned: a number, an address, or `-errno`.
    pub ret: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub errno: Option<String>,
    /// The user stack it was made from, leaf first.
    pub stack: Vec<StackFrame>,
    /// Why the stack may be incomplete, if it may.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stack_note: Option<String>,
}

/// One argument, named and shown as the call's tracepoint declares it: an address in hex
/// (`NULL` for 0), a signed type in decimal, the others in decimal.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CallArg {
    pub name: String,
    pub value: String,
}

impl SlowCallsReport {
    pub fn of(min_ns: u64, slow: &SlowCalls, lost: u64, tracefs: &Path, procs: &Processes) -> Self {
        let named = (slow.stacks).named(&Symbolizer::long_lived(DebugLocator::default()), procs);
        let mut declared = HashMap::new();
        let mut calls: Vec<SlowCallReport> = (slow.calls.iter())
            .map(|c| {
                let params = declared
                    .entry(c.call.nr)
                    .or_insert_with(|| parameters(tracefs, c.call.nr));
                let mut call = call_report(&c.call, slow.started_ns, params.as_deref(), named(&c.stack));
                call.stack_note = stack_note(c.stop, c.tables);
                call
            })
            .collect();
        calls.sort_by(|a, b| a.at_s.total_cmp(&b.at_s).then(a.tid.cmp(&b.tid)));
        SlowCallsReport {
            min_ms: min_ns as f64 / 1e6,
            calls,
            not_listed: slow.not_kept + lost,
        }
    }
}

fn call_report(
    call: &SlowCallHeader,
    started_ns: u64,
    params: Option<&[Field]>,
    stack: Vec<StackFrame>,
) -> SlowCallReport {
    let errno = errno_of(call.ret);
    SlowCallReport {
        at_s: call.entered_ns.saturating_sub(started_ns) as f64 / 1e9,
        took_ns: call.took_ns,
        pid: call.tgid,
        tid: call.tid,
        comm: comm_string(&call.comm),
        cpu: call.cpu,
        name: syscall_name(call.nr),
        nr: call.nr,
        args: args(&call.args, params),
        ret: call.ret,
        errno: (errno != 0).then(|| errno_name(errno)),
        stack,
        stack_note: None,
    }
}

/// What a walk that ended as `stop` (through tables or not) may lack.
fn stack_note(stop: u32, tables: bool) -> Option<String> {
    use profiler_common::unwind::stop;
    match (stop, tables) {
        (stop::WALKING, _) => Some("its stack could not be walked".into()),
        (stop::TRUNCATED, _) => Some(format!(
            "its outermost frames are missing: deeper than the {} frames a walk takes",
            profiler_common::unwind::MAX_FRAMES
        )),
        (_, false) => Some(
            "walked by frame pointers, which frameless code (most libraries) does not keep: its process's unwind tables were not loaded yet, or did not cover its code (it had just started, exec'd or loaded a library)"
                .into(),
        ),
        (stop::FAILED, true) => {
            Some("the walk ended early: a frame had no unwind rule and no frame pointer".into())
        }
        _ => None,
    }
}

/// The call's parameters, from its `sys_enter` tracepoint's format (after `__syscall_nr`): none
/// for a call that takes none (`pause`), unknown where tracefs does not describe it.
fn parameters(tracefs: &Path, nr: u32) -> Option<Vec<Field>> {
    let name = syscall_name(nr);
    let fields = layout(tracefs, &format!("syscalls:sys_enter_{}", tracepoint_name(&name)));
    let at = fields.iter().position(|f| f.name == "__syscall_nr")?;
    Some(fields[at + 1..].to_vec())
}

/// The kernel names some calls' tracepoints after their implementation (`sys_enter_newfstat`
/// for `fstat`).
fn tracepoint_name(call: &str) -> &str {
    match call {
        "fstat" => "newfstat",
        "stat" => "newstat",
        "lstat" => "newlstat",
        "uname" => "newuname",
        "sendfile" => "sendfile64",
        "umount2" => "umount",
        call => call,
    }
}

/// Each argument the call takes, named and shown as declared; all six as `arg1`.. in hex where
/// the call's declaration is not known.
pub(super) fn args(values: &[u64; 6], params: Option<&[Field]>) -> Vec<CallArg> {
    let Some(params) = params else {
        return (values.iter().enumerate())
            .map(|(i, v)| CallArg {
                name: format!("arg{}", i + 1),
                value: format!("{v:#x}"),
            })
            .collect();
    };
    (params.iter().zip(values))
        .map(|(param, &v)| CallArg {
            name: param.name.clone(),
            value: shown(&param.declared, v),
        })
        .collect()
}

/// A register as its declared type: an address in hex (`NULL`), a number in decimal, signed
/// where its type is; a 32-bit type from the register's low half (the ABI leaves the high one
/// undefined). The tracepoint's own `signed` says nothing here: it stores every argument as an
/// `unsigned long`.
fn shown(declared: &str, v: u64) -> String {
    const SIGNED_32: [&str; 8] = [
        "int",
        "pid_t",
        "s32",
        "__s32",
        "clockid_t",
        "key_serial_t",
        "mqd_t",
        "rwf_t",
    ];
    const UNSIGNED_32: [&str; 6] = ["unsigned int", "unsigned", "u32", "__u32", "uid_t", "gid_t"];
    const SIGNED_64: [&str; 5] = ["long", "loff_t", "off_t", "ssize_t", "time_t"];
    let declared = declared.trim_start_matches("const ").trim();
    match declared {
        _ if is_address(declared) && v == 0 => "NULL".to_string(),
        _ if is_address(declared) => format!("{v:#x}"),
        _ if SIGNED_32.contains(&declared) => (v as u32 as i32).to_string(),
        _ if UNSIGNED_32.contains(&declared) => (v as u32).to_string(),
        _ if SIGNED_64.contains(&declared) => (v as i64).to_string(),
        _ => v.to_string(),
    }
}

/// A pointer, or one of the kernel's pointer typedefs.
fn is_address(declared: &str) -> bool {
    declared.contains('*') || declared.starts_with("cap_user_")
}
