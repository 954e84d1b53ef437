//! The tracing machinery on kernel stacks. A stack taken inside a BPF program (at a tracepoint,
//! a kprobe, a trampoline: every off-CPU stack, taken at `sched_switch`) begins with bpfprof's
//! own frames: the program's JITed code (under whatever kallsyms symbol precedes it once the
//! program is unloaded), the helpers it called, and what ran it (`bpf_trace_run4`,
//! `trace_call_bpf`, `__traceiter_*`, kprobe handlers). How many depends on the kernel, so they
//! are recognized by name here and cut off, leaving the function that was traced
//! (`__schedule`) at the top.
use super::Frame;

/// No kernel function is this long: an address this far past a symbol is in none (JITed code
/// past the kernel's last symbol).
const MAX_FUNCTION_BYTES: u64 = 1 << 20;

/// A frame whose function runs BPF programs lies at most this deep below the leaf (the
/// program, its subprograms and the helpers they called come first); the frames before it
/// are the program's, however kallsyms names them.
const MAX_PROGRAM_FRAMES: usize = 6;

/// What one kernel frame is to the tracing machinery.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Machinery {
    /// BPF code: a JITed program or trampoline (named `bpf_prog_*`, or in no symbol), or the
    /// interpreter.
    Program,
    /// What runs a BPF program: `bpf_trace_run*`, `trace_call_bpf`, a trampoline's enter.
    Runner,
    /// Around them: helpers, tracepoint iterators, perf and probe handlers.
    Glue,
    /// Nothing known (kallsyms had no symbol below): machinery only between the others.
    Unknown,
}

const PROGRAM: &[&str] = &[
    "bpf_prog_",
    "bpf_trampoline_",
    "bpf_dispatcher_",
    "___bpf_prog_run",
    "__bpf_prog_run",
];
const RUNNER: &[&str] = &[
    "bpf_trace_run",
    "__bpf_trace_run",
    "trace_call_bpf",
    "__bpf_prog_enter",
    "__bpf_prog_exit",
    // A tracepoint's perf handler: where a tracepoint program's stack begins (the registers
    // its stacks are taken from are fetched there).
    "perf_trace_",
    "perf_syscall_enter",
    "perf_syscall_exit",
    "perf_call_bpf_",
];
const GLUE: &[&str] = &[
    "bpf_",
    "__bpf_",
    "____bpf_",
    "__traceiter_",
    "perf_callchain",
    "get_perf_callchain",
    "kprobe_",
    "kretprobe_",
    "__kretprobe_",
    "pre_handler_kretprobe",
    "aggr_pre_handler",
    "opt_pre_handler",
    "optimized_callback",
    "rethook_",
    "arch_rethook_",
    "arch_ftrace_ops_list_func",
    "ftrace_ops_",
    "uprobe_dispatcher",
    "uretprobe_dispatcher",
    "__uprobe_perf_func",
];

/// What a kernel address's (outermost) frame is to the tracing machinery, if anything.
pub fn machinery(frame: &Frame) -> Option<Machinery> {
    let name = frame.function.as_str();
    let starts = |prefixes: &[&str]| prefixes.iter().any(|p| name.starts_with(p));
    if frame.is_unknown() {
        Some(Machinery::Unknown)
    } else if starts(PROGRAM) || frame.offset.is_some_and(|o| o >= MAX_FUNCTION_BYTES) {
        Some(Machinery::Program)
    } else if starts(RUNNER) {
        Some(Machinery::Runner)
    } else if starts(GLUE) {
        Some(Machinery::Glue)
    } else {
        None
    }
}

/// How many of a kernel stack's leading frames (leaf first, one entry per address) are the
/// tracing machinery. A leading run of machinery frames is cut only if it holds a program or a
/// runner: helpers and unknown frames alone are the kernel's own BPF code at work (the verifier,
/// a map update) or a kernel that could not be symbolized, and stay. The frames before a
/// runner near the leaf are cut whatever their names (a program JITed next to a module takes
/// that module's last symbol).
pub fn leading_machinery(stack: &[Option<Machinery>]) -> usize {
    let runner = stack
        .iter()
        .take(MAX_PROGRAM_FRAMES)
        .position(|m| *m == Some(Machinery::Runner));
    let from = runner.unwrap_or(0);
    let end = from + stack[from..].iter().take_while(|m| m.is_some()).count();
    let evidence = stack[..end]
        .iter()
        .any(|m| matches!(m, Some(Machinery::Program | Machinery::Runner)));
    if evidence {
        end
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Machinery::*;

    fn frame(function: &str, offset: u64) -> Frame {
        let mut frame = Frame::unknown(super::super::KERNEL_MODULE, 0xffff_ffff_8100_0000 + offset, true);
        frame.function = function.to_string();
        frame.offset = Some(offset);
        frame
    }

    #[test]
    fn frames_of_the_machinery_are_told_by_name_and_by_a_symbol_they_are_not_in() {
        // As seen on 6.18: the program's JITed code, after the program was unloaded, under the
        // last kallsyms symbol a gigabyte below it.
        assert_eq!(
            machinery(&frame("__stop_runtime_ptr_USER_PTR_MAX", 0x3c50_4aed)),
            Some(Program)
        );
        assert_eq!(
            machinery(&frame("bpf_prog_ce210dfc0194dbcd_sched_switch", 0x2c)),
            Some(Program)
        );
        assert_eq!(machinery(&frame("bpf_trace_run4", 0xfb)), Some(Runner));
        assert_eq!(machinery(&frame("trace_call_bpf", 0x40)), Some(Runner));
        assert_eq!(machinery(&frame("__traceiter_sched_switch", 0x3e)), Some(Glue));
        assert_eq!(machinery(&frame("bpf_get_stackid_raw_tp", 0x60)), Some(Glue));
        assert_eq!(machinery(&frame("perf_syscall_enter", 0x1a0)), Some(Runner));
        assert_eq!(machinery(&frame("perf_trace_sched_switch", 0x10)), Some(Runner));
        assert_eq!(machinery(&frame("__schedule", 0x4c7)), None);
        assert_eq!(machinery(&frame("futex_wait_queue", 0x60)), None);
        assert_eq!(machinery(&Frame::unknown("", 1, true)), Some(Unknown));
    }

    #[test]
    fn the_leading_machinery_is_cut_and_nothing_else() {
        // sched_switch on 6.18: program, runner, then the scheduler.
        assert_eq!(leading_machinery(&[Some(Program), Some(Runner), None, None]), 2);
        // A kernel that shows the helper and the tracepoint iterator too.
        let longer = [
            Some(Glue),
            Some(Program),
            Some(Runner),
            Some(Glue),
            None,
            Some(Glue),
        ];
        assert_eq!(leading_machinery(&longer), 4);
        // The program misnamed after a module's function: cut because a runner follows it.
        assert_eq!(leading_machinery(&[None, Some(Runner), Some(Glue), None]), 3);
        assert_eq!(leading_machinery(&[None, Some(Runner), None]), 2);
        // A kernel stack without a program or runner at its top is the kernel's own: kept,
        // even when it is the kernel's BPF code (the verifier) or could not be symbolized.
        assert_eq!(leading_machinery(&[Some(Glue), Some(Glue), None]), 0);
        assert_eq!(leading_machinery(&[Some(Unknown), Some(Unknown)]), 0);
        assert_eq!(leading_machinery(&[None, None, None]), 0);
        assert_eq!(leading_machinery(&[]), 0);
        // A runner deep in the stack is not at its top.
        let deep = [None, None, None, None, None, None, Some(Runner), None];
        assert_eq!(leading_machinery(&deep), 0);
    }
}
