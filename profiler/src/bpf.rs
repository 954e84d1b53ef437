//! Loading the embedded kernel programs and setting their globals; what every source attaches
//! with (a program by name, tracepoints, a table walker's slot). Everything attached belongs to
//! [`Loaded`]; dropping it detaches and unloads, on every exit path.
use std::{collections::BTreeSet, path::Path};

use anyhow::Context as _;
use aya::{
    maps::{HashMap as BpfHashMap, MapData},
    programs::{
        raw_trace_point::RawTracePointLink, trace_point::TracePointLink, BtfTracePoint, ProgramError,
        RawTracePoint, TracePoint,
    },
    Ebpf, EbpfLoader,
};
use profiler_common::{
    lock::ThreadOffsets, names, offcpu_stacks, ExecOffsets, ExitOffsets, ForkOffsets, OffCpuSampling,
    TaskOffsets,
};

use crate::{collect::take_map, preflight::tracepoint_field_offset};

static BPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/profiler"));

pub struct Loaded {
    pub ebpf: Ebpf,
    targets: BpfHashMap<MapData, u32, u8>,
    /// What must stay open while the programs run (the counters the sampling program reads,
    /// the table walkers' slots taken out of `ebpf`); closed with everything else.
    held: Vec<Box<dyn std::any::Any>>,
    /// The programs' log ring (aya-log), until the driver watches it.
    pub kernel_logs: Option<KernelLogs>,
}

/// The reader of the programs' log lines, which it writes to bpfprof's own log.
pub type KernelLogs = aya_log::EbpfLogger<&'static dyn log::Log>;

/// The kernel programs' log level: the user side's (`RUST_LOG`), as aya-log numbers it (the same
/// numbers as `log::LevelFilter`: 0 off, 1 error ... 4 debug, 5 trace).
fn kernel_log_level() -> u8 {
    log::max_level() as usize as u8
}

/// `BPFPROF_CHECK_STACK_REUSE=1`: every sleep's stack is walked, and each walk that differs from
/// the stack reuse would have given is counted (`offcpu_stack_reuse_wrong`): how the tests hold
/// reuse exact.
fn reuse_check() -> u32 {
    u32::from(std::env::var_os("BPFPROF_CHECK_STACK_REUSE").is_some_and(|v| v == "1"))
}

/// Field offsets of the sched tracepoints on the running kernel.
pub fn tracepoint_offsets(tracefs: &Path) -> anyhow::Result<(ForkOffsets, ExitOffsets, u32)> {
    let field = |event: &str, name: &str| {
        tracepoint_field_offset(tracefs, "sched", event, name)
            .with_context(|| format!("sched:{event} has no field `{name}` in its tracefs format"))
    };
    let fork = ForkOffsets {
        parent_pid: field("sched_process_fork", "parent_pid")?,
        child_pid: field("sched_process_fork", "child_pid")?,
    };
    let exit = ExitOffsets {
        pid: field("sched_process_exit", "pid")?,
        group_dead: tracepoint_field_offset(tracefs, "sched", "sched_process_exit", "group_dead")
            .unwrap_or(u32::MAX),
    };
    // The thread that execs, under the tid it had (another than the leader's it takes on).
    let exec_old_pid =
        tracepoint_field_offset(tracefs, "sched", "sched_process_exec", "old_pid").unwrap_or(u32::MAX);
    Ok((fork, exit, exec_old_pid))
}

/// What the loader sets before the object is loaded: the globals, and which maps are used.
/// The start path fills it from the run's sources (each sets its own part, see `Spec::needs`).
pub struct LoadOptions<'a> {
    pub tracefs: &'a Path,
    /// Keep only processes in the target set (else: the whole system).
    pub filter: bool,
    /// User stacks of processes with unwind tables are walked through them.
    pub unwind_tables: bool,
    /// Where the running kernel keeps the `task_struct` fields the sched programs read.
    pub task_offsets: TaskOffsets,
    /// Where the kernel says a task is in the middle of an exec.
    pub exec_offsets: ExecOffsets,
    /// Waits at least this long are reported one by one.
    pub slow_threshold_ns: u64,
    /// Which stacks record where threads go to sleep (`offcpu_stacks::*`).
    pub offcpu_stacks: u32,
    /// 1: the scheduler programs keep per-CPU history, heatmap and wakers (0: the agent).
    pub sched_detail: u32,
    /// Which sleeps get their off-CPU stacks taken.
    pub offcpu_sampling: OffCpuSampling,
    /// How many counters' deltas the sampling program reads.
    pub counters: u32,
    /// pthread source: offset of `task_struct.nvcsw` (`u32::MAX`: unknown), to tell a lock call
    /// that slept.
    pub nvcsw_offset: u32,
    /// Futex source: the `task_struct` fields read at thread creation (to tell a join).
    pub thread_offsets: ThreadOffsets,
    /// `latency`: each side's key.
    pub latency_keys: profiler_common::latency::LatencyKeys,
    /// `record -g`: each record with its stacks.
    pub record_stacks: u32,
    /// `trace --duration-min`: calls at least this long are sent whole (0: none).
    pub slow_call_ns: u64,
    /// `latency --duration-min`: intervals at least this long are sent whole (0: none).
    pub latency_slow_ns: u64,
    /// Of the maps only some runs use (`OPTIONAL_MAPS`), those this one does; the others shrink
    /// to one entry, so they cost (almost) no kernel memory.
    pub maps: BTreeSet<&'static str>,
    /// Entries of each sample map, where not the default (a test of a full map).
    pub sample_map_entries: Option<u32>,
}

/// The maps only some sources use.
pub const OPTIONAL_MAPS: [&str; 41] = [
    names::SAMPLES[0],
    names::SAMPLES[1],
    names::STACKS[0],
    names::STACKS[1],
    names::DELTAS[0],
    names::DELTAS[1],
    names::PENDING_DELTAS,
    names::USER_STACKS[0],
    names::USER_STACKS[1],
    names::BUILD_ID_STACKS[0],
    names::BUILD_ID_STACKS[1],
    names::OFFCPU_USER_STACKS[0],
    names::OFFCPU_USER_STACKS[1],
    names::UNWIND_ROWS,
    names::UNWIND_PROCESSES,
    names::PY_PROCESSES,
    names::PY_THREADS,
    names::PY_CODES_SEEN,
    names::TASK_STATS,
    names::EXITED,
    names::OFFCPU[0],
    names::OFFCPU[1],
    names::OFFCPU_STACKS[0],
    names::OFFCPU_STACKS[1],
    names::LOCK_WAITERS,
    names::LOCK_WAITING,
    names::LOCK_WAKES,
    names::LOCK_JOINABLE,
    names::LOCK_HOLDERS,
    names::LOCK_STATES,
    names::LOCK_CALLS,
    names::LOCK_KERNEL_WAITING,
    names::LOCK_STACKS,
    names::LOCK_USER_STACKS,
    names::SYSCALL_THREADS,
    names::SYSCALL_TOTALS,
    names::LATENCY_STARTS,
    names::LATENCY_HIST,
    names::LATENCY_STACKS,
    names::LATENCY_USER_STACKS,
    names::VALUE_COUNTS,
];

impl<'a> LoadOptions<'a> {
    /// Nothing used yet: the globals' values for a run with no sources.
    pub fn new(tracefs: &'a Path, filter: bool, unwind_tables: bool) -> Self {
        LoadOptions {
            tracefs,
            filter,
            unwind_tables,
            task_offsets: TaskOffsets::default(),
            exec_offsets: ExecOffsets::default(),
            slow_threshold_ns: u64::MAX,
            sched_detail: 1,
            offcpu_sampling: OffCpuSampling::EVERY_SLEEP,
            offcpu_stacks: offcpu_stacks::NONE,
            counters: 0,
            nvcsw_offset: u32::MAX,
            thread_offsets: ThreadOffsets {
                clear_child_tid: u32::MAX,
                ..Default::default()
            },
            latency_keys: Default::default(),
            record_stacks: 0,
            slow_call_ns: 0,
            latency_slow_ns: 0,
            maps: BTreeSet::new(),
            sample_map_entries: None,
        }
    }

    /// These maps are used.
    pub fn use_maps<'b>(&mut self, maps: impl IntoIterator<Item = &'b &'static str>) {
        self.maps.extend(maps.into_iter().copied());
    }

    /// Some source walks user stacks through unwind tables.
    pub fn walks_tables(&self) -> bool {
        self.maps.contains(names::UNWIND_ROWS)
    }

    /// The optional maps this run does not use.
    pub fn unused_maps(&self) -> Vec<&'static str> {
        OPTIONAL_MAPS
            .into_iter()
            .filter(|m| !self.maps.contains(m))
            .collect()
    }
}

impl Loaded {
    pub fn load(options: &LoadOptions<'_>) -> anyhow::Result<Loaded> {
        let (fork, exit, exec_old_pid) = tracepoint_offsets(options.tracefs)?;
        let filter = u32::from(options.filter);
        let unwind = u32::from(options.unwind_tables);
        let reuse_check = reuse_check();
        let mut loader = EbpfLoader::new();
        loader
            .override_global(names::G_FILTER, &filter, true)
            .override_global(names::G_FORK, &fork, true)
            .override_global(names::G_EXIT, &exit, true)
            .override_global(names::G_EXEC_OLD_PID, &exec_old_pid, true)
            .override_global(names::G_TASK_OFFSETS, &options.task_offsets, true)
            .override_global(names::G_EXEC_OFFSETS, &options.exec_offsets, true)
            .override_global(names::G_SLOW_NS, &options.slow_threshold_ns, true)
            .override_global(names::G_OFFCPU_STACKS, &options.offcpu_stacks, true)
            .override_global(names::G_SCHED_DETAIL, &options.sched_detail, true)
            .override_global(names::G_OFFCPU_SAMPLING, &options.offcpu_sampling, true)
            .override_global(names::G_REUSE_CHECK, &reuse_check, true)
            .override_global(names::G_COUNTERS, &options.counters, true)
            .override_global(names::G_UNWIND, &unwind, true)
            .override_global(names::G_NVCSW, &options.nvcsw_offset, true)
            .override_global(names::G_THREAD_OFFSETS, &options.thread_offsets, true)
            .override_global(names::G_LATENCY_KEYS, &options.latency_keys, true)
            .override_global(names::G_RECORD_STACKS, &options.record_stacks, true)
            .override_global(names::G_SLOW_CALL_NS, &options.slow_call_ns, true)
            .override_global(names::G_LATENCY_SLOW_NS, &options.latency_slow_ns, true);
        // Fixed at load: below debug the verifier sees a constant and prunes every kernel log
        // site as dead code, and the log ring shrinks to one page (it stays empty).
        let log_level = kernel_log_level();
        loader.override_global(aya_log::LEVEL, &log_level, true);
        let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
            .ok()
            .flatten()
            .unwrap_or(4096) as u32;
        if log_level < log::LevelFilter::Debug as usize as u8 {
            loader.map_max_entries(names::KERNEL_LOGS, page);
        }
        // A ring's size is a multiple of the page: `record`'s shrinks to one where unused.
        if !options.maps.contains(names::RECORDS) {
            loader.map_max_entries(names::RECORDS, page);
        } else if options.record_stacks != 0 {
            // Records with stacks are nearly four times as large, and naming a new file's
            // frames holds the reader up: room for about 31,000 of them.
            loader.map_max_entries(names::RECORDS, 4 * profiler_common::records::RECORD_RING_BYTES);
        }
        for ring in [names::SLOW_CALLS, names::LATENCY_SLOW, names::SCHED_TIMELINE] {
            if !options.maps.contains(ring) {
                loader.map_max_entries(ring, page);
            }
        }
        for map in options.unused_maps() {
            loader.map_max_entries(map, 1);
        }
        if let Some(entries) = options.sample_map_entries {
            for map in names::SAMPLES {
                loader.map_max_entries(map, entries.max(1));
            }
        }
        let mut ebpf = loader
            .load(BPF_OBJECT)
            .context("loading the BPF programs into the kernel")?;
        let targets = take_map(&mut ebpf, names::TARGETS)?;
        let targets = BpfHashMap::try_from(targets)?;
        let kernel_logs =
            aya_log::EbpfLogger::init(&mut ebpf).context("reading the BPF programs' log ring")?;
        Ok(Loaded {
            ebpf,
            targets,
            held: Vec::new(),
            kernel_logs: Some(kernel_logs),
        })
    }

    /// Keep `thing` open until everything is detached.
    pub fn hold(&mut self, thing: impl std::any::Any) {
        self.held.push(Box::new(thing));
    }

    pub fn add_target(&mut self, pid: u32) -> anyhow::Result<()> {
        self.targets
            .insert(pid, 1, 0)
            .with_context(|| format!("adding pid {pid} to the targets"))
    }

    /// Follow targets' children, forget exited threads, re-announce processes that exec, and
    /// with `mappings` (user stacks walked through tables) those that map or move code (see
    /// `profiler-ebpf/src/mappings.rs`).
    pub fn attach_process_tracking(&mut self, mappings: bool) -> anyhow::Result<()> {
        self.attach_tracepoints(&[
            (names::PROG_FORK, "sched", "sched_process_fork"),
            (names::PROG_EXIT, "sched", "sched_process_exit"),
            (names::PROG_EXEC, "sched", "sched_process_exec"),
        ])?;
        if !mappings {
            return Ok(());
        }
        // Without system-call tracepoints (a kernel without CONFIG_FTRACE_SYSCALLS), code
        // mapped is still found by the first pc outside the known mappings, as before.
        // The exits first: an entry attached without its exit would note calls no one ends.
        if let Err(e) = self.attach_tracepoints(&[
            (names::PROG_MAPPING_DONE, "syscalls", "sys_exit_mmap"),
            (names::PROG_MAPPING_DONE, "syscalls", "sys_exit_mremap"),
            (names::PROG_MAPPING_MMAP, "syscalls", "sys_enter_mmap"),
            (names::PROG_MAPPING_MREMAP, "syscalls", "sys_enter_mremap"),
        ]) {
            log::info!("code mapped by targets is found at their first stack in it: {e:#}");
        }
        Ok(())
    }

    /// Load `prog` and attach it to the raw tracepoint `event`.
    pub fn attach_raw_tracepoint(&mut self, prog: &str, event: &str) -> anyhow::Result<()> {
        // Held for the run: a dropped link detaches its program.
        let link = self.raw_tracepoint_link(prog, event)?;
        self.hold(link);
        Ok(())
    }

    /// The same, the attachment handed over: dropping it detaches the program (a source that
    /// must stop its programs before it reads their maps at the end).
    pub fn raw_tracepoint_link(&mut self, prog: &str, event: &str) -> anyhow::Result<RawTracePointLink> {
        let program: &mut RawTracePoint = self.program(prog)?;
        program.load().with_context(|| format!("loading {prog}"))?;
        let link = program
            .attach(event)
            .with_context(|| format!("attaching {prog} to the raw tracepoint {event}"))?;
        Ok(program.take_link(link)?)
    }

    /// Load each (program, event) as a BTF tracepoint (its arguments typed by the kernel's BTF,
    /// so the program reads their fields with plain loads) and attach it for the run.
    pub fn attach_btf_tracepoints(
        &mut self,
        btf: &aya::Btf,
        programs: &[(&str, &str)],
    ) -> anyhow::Result<()> {
        for &(prog, event) in programs {
            self.load_btf_tracepoint(btf, prog, event)?;
            let program: &mut BtfTracePoint = self.program(prog)?;
            let link = program
                .attach()
                .with_context(|| format!("attaching {prog} to the BTF tracepoint {event}"))?;
            // Held for the run: a dropped link detaches its program.
            let link = program.take_link(link)?;
            self.hold(link);
        }
        Ok(())
    }

    /// Load `prog` as a BTF tracepoint of `event`: attached, or only tail-called from one.
    pub fn load_btf_tracepoint(&mut self, btf: &aya::Btf, prog: &str, event: &str) -> anyhow::Result<()> {
        let program: &mut BtfTracePoint = self.program(prog)?;
        program
            .load(event, btf)
            .with_context(|| format!("loading {prog} for the BTF tracepoint {event}"))
    }

    /// Load and attach each (program, category, event) for the run.
    pub fn attach_tracepoints(&mut self, programs: &[(&str, &str, &str)]) -> anyhow::Result<()> {
        for link in self.tracepoint_links(programs)? {
            self.hold(link);
        }
        Ok(())
    }

    /// The same, the attachments handed over: dropping them detaches the programs (a source
    /// that must stop its programs before it reads their maps at the end).
    pub fn tracepoint_links(
        &mut self,
        programs: &[(&str, &str, &str)],
    ) -> anyhow::Result<Vec<TracePointLink>> {
        let mut links = Vec::new();
        for &(prog, category, event) in programs {
            let program: &mut TracePoint = self.program(prog)?;
            if program.fd().is_err() {
                program.load().with_context(|| format!("loading {prog}"))?;
            }
            let link = program
                .attach(category, event)
                .with_context(|| format!("attaching to {category}:{event}"))?;
            links.push(program.take_link(link)?);
        }
        Ok(links)
    }

    /// A program of the object, as its kind.
    pub fn program<'a, P>(&'a mut self, name: &str) -> anyhow::Result<&'a mut P>
    where
        &'a mut P: TryFrom<&'a mut aya::programs::Program, Error = ProgramError>,
    {
        let program = self
            .ebpf
            .program_mut(name)
            .with_context(|| format!("program {name} missing"))?;
        Ok(program.try_into()?)
    }

    /// Put a loaded walker into the program array its walks tail-call (kept open for the run).
    pub fn install_walker(&mut self, walker: &str, array: &str) -> anyhow::Result<()> {
        let fd = self
            .ebpf
            .program(walker)
            .with_context(|| format!("program {walker} missing"))?
            .fd()?
            .try_clone()?;
        let programs = take_map(&mut self.ebpf, array)?;
        let mut programs = aya::maps::ProgramArray::try_from(programs)?;
        programs.set(profiler_common::unwind::PROGRAM_SLOT, &fd, 0)?;
        self.hold(programs);
        Ok(())
    }
}

/// Runs of this process's BPF programs the kernel skipped because a BPF program was already
/// running on that CPU: each program's `recursion_misses` (5.12 and later; none before), read
/// from its descriptor's fdinfo, each program once.
pub fn program_runs_missed() -> u64 {
    let Ok(fds) = std::fs::read_dir("/proc/self/fdinfo") else {
        return 0;
    };
    let programs: std::collections::HashMap<u64, u64> = (fds.filter_map(Result::ok))
        .filter_map(|fd| recursion_misses(&std::fs::read_to_string(fd.path()).ok()?))
        .collect();
    programs.values().sum()
}

/// A program descriptor's id and `recursion_misses` by its fdinfo (none: not a program's).
fn recursion_misses(fdinfo: &str) -> Option<(u64, u64)> {
    let field = |name: &str| -> Option<u64> {
        let line = fdinfo
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))?;
        line.trim().parse().ok()
    };
    field("prog_type")?;
    Some((field("prog_id")?, field("recursion_misses").unwrap_or(0)))
}

/// `bpf(BPF_MAP_UPDATE_ELEM)` for a perf event array: aya's own type for it only opens ring buffers.
pub(crate) fn map_update(
    map_fd: std::os::fd::BorrowedFd<'_>,
    key: u32,
    mut value: u32,
) -> std::io::Result<()> {
    const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
    crate::map_ops::map_elem_call(
        BPF_MAP_UPDATE_ELEM,
        map_fd,
        (&key as *const u32).cast(),
        (&mut value as *mut u32).cast(),
    )
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    /// 6.1's verifier refuses a program whose frame and its calls' frames pass 512 bytes, each
    /// rounded up to 32 (newer ones count as the host's does, and load it): a program's own frame
    /// past 480 bytes leaves no room for the smallest call, and only the arm64 guest would say
    /// so (`sched_switch` is at 480). Its frame: the deepest slot below r10 any of its
    /// instructions loads or stores, or hands a helper (`rX = r10; rX += -N`).
    #[test]
    fn every_programs_own_frame_leaves_room_for_a_call_under_6_1s_limit() {
        use object::{Object as _, ObjectSection as _};
        let file = object::File::parse(super::BPF_OBJECT).unwrap();
        let mut seen = 0;
        // A section per kind of program (`tracepoint` holds many), and `.text` their calls.
        for section in file.sections().filter(|s| s.kind() == object::SectionKind::Text) {
            let insns: Vec<&[u8]> = section.data().unwrap().chunks_exact(8).collect();
            let slot = |insn: &[u8]| {
                let (class, dst, src) = (insn[0] & 7, insn[1] & 0xf, insn[1] >> 4);
                let offset = i16::from_le_bytes([insn[2], insn[3]]);
                // ST and STX through r10, LDX from it.
                let on_stack = matches!((class, dst, src), (2 | 3, 10, _) | (1, _, 10));
                (on_stack && offset < 0).then(|| -i32::from(offset))
            };
            // `mov64 rX, r10` then `add64 rX, imm`.
            let handed = |pair: &[&[u8]]| {
                let (mov, add) = (pair[0], pair[1]);
                let imm = i32::from_le_bytes([add[4], add[5], add[6], add[7]]);
                let copied = mov[0] == 0xbf && mov[1] >> 4 == 10;
                (copied && add[0] == 0x07 && add[1] & 0xf == mov[1] & 0xf && imm < 0).then(|| -imm)
            };
            let frame = (insns.iter().filter_map(|i| slot(i)))
                .chain(insns.windows(2).filter_map(handed))
                .max()
                .unwrap_or(0);
            assert!(
                frame <= 480,
                "{}: a frame of {frame} bytes",
                section.name().unwrap()
            );
            seen += 1;
        }
        assert!(seen >= 10, "only {seen} sections of programs in the object");
    }

    #[test]
    fn a_programs_recursion_misses_from_its_fdinfo_and_nothing_from_a_link() {
        let program = "pos:\t0\nflags:\t02000002\nmnt_id:\t15\nino:\t1052\nprog_type:\t17\nprog_jited:\t1\n\
                       prog_tag:\t4f1a5b4c8e4e0b3a\nmemlock:\t4096\nprog_id:\t812\nrun_time_ns:\t0\nrun_cnt:\t0\n\
                       recursion_misses:\t3\nverified_insns:\t57\n";
        assert_eq!(super::recursion_misses(program), Some((812, 3)));
        let older = program.replace("recursion_misses:\t3\n", "");
        assert_eq!(
            super::recursion_misses(&older),
            Some((812, 0)),
            "a kernel before 5.12"
        );
        let link = "pos:\t0\nflags:\t02000000\nlink_type:\traw_tracepoint\nlink_id:\t9\nprog_tag:\t4f1a\nprog_id:\t812\n";
        assert_eq!(super::recursion_misses(link), None);
        assert_eq!(
            super::recursion_misses("map_type:\t2\nrecursion_misses:\t1\n"),
            None
        );
    }

    use object::{Object as _, ObjectSection as _, ObjectSymbol as _, SymbolKind};

    use super::*;

    /// The global symbols of the embedded object: (kind, its section's name, its name).
    fn symbols() -> Vec<(SymbolKind, String, String)> {
        let file = object::File::parse(BPF_OBJECT).expect("the embedded BPF object is an ELF file");
        file.symbols()
            .filter(|s| s.is_global())
            .filter_map(|s| {
                let section = file.section_by_index(s.section_index()?).ok()?;
                Some((
                    s.kind(),
                    section.name().ok()?.to_string(),
                    s.name().ok()?.to_string(),
                ))
            })
            .collect()
    }

    fn flat(lists: &[&[&str]]) -> BTreeSet<String> {
        lists
            .iter()
            .flat_map(|l| l.iter())
            .map(|n| n.to_string())
            .collect()
    }

    /// Every map, program and global user space opens by name is in the object under that name,
    /// and everything in the object is named on the user side (or said to be the kernel's own).
    #[test]
    fn the_objects_names_are_the_user_sides() {
        let symbols = symbols();
        let named = |pick: &dyn Fn(&SymbolKind, &str) -> bool| -> BTreeSet<String> {
            symbols
                .iter()
                .filter(|(kind, section, _)| pick(kind, section))
                .map(|(_, _, name)| name.clone())
                .collect()
        };
        let maps = named(&|kind, section| *kind == SymbolKind::Data && section == "maps");
        let programs = named(&|kind, section| *kind == SymbolKind::Text && section != ".text");
        let globals = named(&|kind, section| *kind == SymbolKind::Data && section == ".rodata");
        println!(
            "{} maps, {} programs, {} globals",
            maps.len(),
            programs.len(),
            globals.len()
        );
        let mut expected_maps = flat(names::MAPS);
        expected_maps.extend(names::KERNEL_ONLY_MAPS.map(String::from));
        assert_eq!(maps, expected_maps, "maps");
        assert_eq!(programs, flat(names::PROGRAMS), "programs");
        let mut expected_globals = flat(names::GLOBALS);
        expected_globals.insert(aya_log::LEVEL.to_string());
        assert_eq!(globals, expected_globals, "globals");
        // The optional maps are maps.
        assert!(OPTIONAL_MAPS.iter().all(|m| maps.contains(*m)));
    }
}
