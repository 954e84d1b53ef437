//! Sampling: the sample and stack maps' keys and values, counters read at samples, the
//! processes followed (fork, exit, announcements) and the health counters every mode reports.
use core::mem::size_of;

/// Deepest stack `bpf_get_stackid` records (the kernel's `PERF_MAX_STACK_DEPTH`).
pub const MAX_STACK_DEPTH: usize = 127;
/// Distinct stacks per epoch (per stack map). Each entry is `MAX_STACK_DEPTH * 8` bytes.
pub const STACK_MAP_ENTRIES: u32 = 16 * 1024;
/// Distinct (thread, user stack, kernel stack) keys per epoch.
pub const SAMPLE_MAP_ENTRIES: u32 = 32 * 1024;
/// Processes that may be targeted at once (the `-p` list plus their descendants).
pub const TARGET_MAP_ENTRIES: u32 = 8 * 1024;
/// Processes remembered as "already announced to user space" (LRU).
pub const SEEN_MAP_ENTRIES: u32 = 16 * 1024;
/// Threads whose counter deltas wait for their next sample (LRU: threads that exit lose theirs).
pub const PENDING_DELTA_ENTRIES: u32 = 16 * 1024;
/// Ring buffer for process announcements.
pub const EVENT_RING_BYTES: u32 = 256 * 1024;
/// Length of `task_struct::comm`.
pub const COMM_LEN: usize = 16;

/// The two epoch slots: the kernel writes into one pair of maps while user space drains the other.
pub const EPOCH_SLOTS: u32 = 2;

/// Key of the sample-count maps: one per (thread, user stack, kernel stack).
///
/// A negative stack id is the kernel's error for that stack (for example `-EFAULT` when there is
/// no user stack, `-EEXIST` on a stack-map collision); user space decides what each means.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SampleKey {
    pub tgid: u32,
    pub tid: u32,
    pub user_stack_id: i32,
    pub kernel_stack_id: i32,
    pub comm: [u8; COMM_LEN],
    /// 1: `user_stack_id` names a table-unwound stack in `USER_STACKS_n`; 0: a frame-pointer
    /// stack in the stack-trace map. Off-CPU keys add `BEGAN_EARLIER`.
    pub user_unwound: u16,
    /// Which of the run's sampling events took the sample (its perf event's BPF cookie: the
    /// event's place in `-e`); 0 for off-CPU keys.
    pub event: u16,
    /// How many times the process exec'd since the run started (`EXEC_GENERATIONS`): which of
    /// its memory maps the user addresses belong to.
    pub exec_generation: u32,
}
const _: () = assert!(size_of::<SampleKey>() == 40);

/// In an off-CPU key's `user_unwound`: the sleep began in an earlier epoch than it ended in, so
/// its stack ids name stacks of that epoch's slot (long cleared: user space kept them by tid).
pub const BEGAN_EARLIER: u16 = 2;
/// In an off-CPU key's `user_unwound`: its stacks were taken for one of the thread's sleeps
/// drawn at random (`OffCpuSampling`); it stands for the sleeps drawn against too.
pub const STACK_DRAWN: u16 = 4;
/// In an off-CPU key's `user_unwound`: sleeps whose stacks were not taken (`OffCpuSampling`);
/// their time is the thread's, spread over its drawn sleeps of the interval.
pub const STACK_SKIPPED: u16 = 8;
/// With `STACK_SKIPPED`: sleeps of at least `OffCpuSampling::long_ns` each, shown apart (not
/// spread): a thread's rare long sleep may be somewhere else than its frequent short ones.
pub const SKIPPED_LONG: u16 = 16;

/// Sampling events one run takes at once (each sample's `event` is its place among them).
pub const MAX_SAMPLING_EVENTS: usize = 8;

/// The cookie of a tracing event's sampler (a tracepoint, a user probe): its place among the
/// run's events in the low 16 bits (as every sampler's), above them how many of the targets'
/// hits make one sample (`-c N`, at most `MAX_HIT_PERIOD`), and in the top 8 bits which of a
/// probe's sites it is (`with_site`). Such a program runs at every hit, whatever the perf
/// event's period, so it counts and picks the Nth itself.
pub fn hit_cookie(event: u16, period: u64) -> u64 {
    u64::from(event) | (period & MAX_HIT_PERIOD) << 16
}

/// The largest `-c N` of a tracing event: what its cookie has room for.
pub const MAX_HIT_PERIOD: u64 = (1 << 40) - 1;

/// Sites one probe fires at, at most (a USDT probe's, a source line's inlined copies): each
/// site's perf event carries its index in its cookie, and what is read at a hit is read each
/// site's own way (a USDT argument where that site's note puts it, a global at that site's
/// distance from it): `RECORD_FETCHES`, `WEIGHT_FETCHES` and `HIT_FILTERS` hold one entry per
/// event and site, at `event * MAX_PROBE_SITES + site`.
pub const MAX_PROBE_SITES: usize = 64;

/// `cookie` for site `site` of its event.
pub fn with_site(cookie: u64, site: u8) -> u64 {
    cookie | u64::from(site) << 56
}

/// A tracing sampler's cookie read back: (event, period of at least 1).
pub fn hit_cookie_parts(cookie: u64) -> (u16, u64) {
    (
        cookie as u16,
        match (cookie >> 16) & MAX_HIT_PERIOD {
            0 => 1,
            period => period,
        },
    )
}

/// The probe site a cookie names (`with_site`).
pub fn cookie_site(cookie: u64) -> u8 {
    (cookie >> 56) as u8
}

/// Comparisons a hit must pass to count (`--filter` when sampling or recording), per event.
pub const MAX_FILTER_TERMS: usize = 4;

/// One comparison of a hit's filter (`HIT_FILTERS`, at `(event * MAX_PROBE_SITES + site) *
/// MAX_FILTER_TERMS + n`): a number of the hit against `value`. All of an event's terms must
/// pass (`&&`); the first with `op` `filter_op::NONE` ends them.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FilterTerm {
    /// The number, read as a record's fetch reads it: a word of the context (a tracepoint's
    /// field, a probe's register) or a USDT argument where its site's note puts it; 1, 2, 4 or 8
    /// bytes, widened to 64 bits as its sign says (and compared so).
    pub fetch: crate::records::Fetch,
    pub op: u8,
    pub _pad: [u8; 7],
    pub value: u64,
}
const _: () = assert!(size_of::<FilterTerm>() == 32);

pub mod filter_op {
    pub const NONE: u8 = 0;
    pub const EQ: u8 = 1;
    pub const NE: u8 = 2;
    pub const LT: u8 = 3;
    pub const LE: u8 = 4;
    pub const GT: u8 = 5;
    pub const GE: u8 = 6;
    /// Any bit of `value` set.
    pub const AND: u8 = 7;
}

/// The `size`-byte number (1 to 8) at the start of `raw` (a context's 8 bytes at a field or a
/// register, little-endian as read): unsigned, and sign-extended.
#[inline(always)]
pub fn sized(raw: u64, size: u8) -> (u64, i64) {
    let shift = 64 - u32::from(size.clamp(1, 8)) * 8;
    ((raw << shift) >> shift, ((raw << shift) as i64) >> shift)
}

impl FilterTerm {
    /// Whether `number` (the fetch's, widened) passes.
    pub fn passes(&self, number: u64) -> bool {
        let order = match self.fetch.signed {
            0 => number.cmp(&self.value),
            _ => (number as i64).cmp(&(self.value as i64)),
        };
        match self.op {
            filter_op::EQ => order.is_eq(),
            filter_op::NE => order.is_ne(),
            filter_op::LT => order.is_lt(),
            filter_op::LE => order.is_le(),
            filter_op::GT => order.is_gt(),
            filter_op::GE => order.is_ge(),
            filter_op::AND => number & self.value != 0,
            _ => true,
        }
    }
}

/// A function's arguments and return value in a probe's registers, as fetches, filters, keys
/// and weights name them (`ARG0 + n`, `RETVAL`; see `register_offset`).
pub mod hit_weight {
    /// Arguments 1 to 6: `ARG0 + n`.
    pub const ARG0: u32 = 0;
    pub const MAX_ARG: u32 = 6;
    /// The return value (a uretprobe's).
    pub const RETVAL: u32 = 7;

    /// The byte offset in x86-64's `struct pt_regs` of an argument's or the return value's
    /// register (rdi, rsi, rdx, rcx, r8, r9; rax), or in AArch64's (x0-x5; x0).
    pub const fn register_offset(weight: u32, aarch64: bool) -> Option<u32> {
        const X86_64_ARGS: [u32; 6] = [112, 104, 96, 88, 72, 64];
        const X86_64_RAX: u32 = 80;
        match (weight, aarch64) {
            (RETVAL, false) => Some(X86_64_RAX),
            (RETVAL, true) => Some(0),
            (n @ 1..=MAX_ARG, false) => Some(X86_64_ARGS[(n - 1) as usize]),
            (n @ 1..=MAX_ARG, true) => Some(8 * (n - 1)),
            _ => None,
        }
    }
}

/// Counters whose deltas the sampling program attributes to the sampled stack: room for the
/// largest topdown set (7 events on Intel ICL+ and AMD Zen 4/5, with cycles and instructions).
pub const MAX_COUNTERS: usize = 8;

/// Value of the sample maps: how often a stack was sampled.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SampleValue {
    pub count: u64,
}
const _: () = assert!(size_of::<SampleValue>() == 8);

/// Value of the counter-delta maps (same key as the sample maps; shrunk to one entry when no
/// counter is in use): how much each counter advanced on that CPU between a sample of this stack
/// and the previous sample of the same thread there, and for how long it was on the PMU in those
/// intervals. `value × enabled_ns / running_ns[k]` estimates a multiplexed counter, as perf does.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CounterDeltas {
    /// Length of the intervals (time the counters were enabled).
    pub enabled_ns: u64,
    pub values: [u64; MAX_COUNTERS],
    pub running_ns: [u64; MAX_COUNTERS],
}
const _: () = assert!(size_of::<CounterDeltas>() == 8 + 16 * MAX_COUNTERS);

impl CounterDeltas {
    /// What was added to these running sums since `earlier`, a reading of the same sums.
    pub fn since(&self, earlier: &CounterDeltas) -> CounterDeltas {
        let mut d = CounterDeltas {
            enabled_ns: self.enabled_ns.saturating_sub(earlier.enabled_ns),
            ..*self
        };
        for k in 0..MAX_COUNTERS {
            d.values[k] = self.values[k].saturating_sub(earlier.values[k]);
            d.running_ns[k] = self.running_ns[k].saturating_sub(earlier.running_ns[k]);
        }
        d
    }

    pub fn add(&mut self, other: &CounterDeltas) {
        self.enabled_ns += other.enabled_ns;
        for k in 0..MAX_COUNTERS {
            self.values[k] += other.values[k];
            self.running_ns[k] += other.running_ns[k];
        }
    }

    /// Counter `k`'s estimate over these intervals: as counted when it ran all the time (or when
    /// no times were recorded), scaled by enabled / running when it was multiplexed, none when it
    /// never ran.
    pub fn estimate(&self, k: usize) -> Option<u64> {
        let (value, running) = (self.values[k], self.running_ns[k]);
        match (running, self.enabled_ns) {
            (0, 0) => Some(value),
            (0, _) => None,
            (r, e) if r >= e => Some(value),
            (r, e) => Some((value as u128 * e as u128 / r as u128) as u64),
        }
    }

    /// Share of these intervals counter `k` was on the PMU (1 when not multiplexed).
    pub fn running_share(&self, k: usize) -> f64 {
        match self.enabled_ns {
            0 => 1.0,
            e => (self.running_ns[k] as f64 / e as f64).min(1.0),
        }
    }
}

/// Per CPU: the counter readings at the previous sample, and whose sample it was.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CounterBaseline {
    pub tid: u32,
    pub _pad: u32,
    pub values: [u64; MAX_COUNTERS],
    pub enabled_ns: [u64; MAX_COUNTERS],
    pub running_ns: [u64; MAX_COUNTERS],
}
const _: () = assert!(size_of::<CounterBaseline>() == 8 + 24 * MAX_COUNTERS);

/// Why user space should look at a process now, while it is alive.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProcessEventKind {
    /// The first sample of a process in this run (or since its last exec): capture its memory
    /// map for symbolization.
    FirstSample = 1,
    /// A sampled pc lies outside the mappings the unwinder was given: capture it again.
    MappingsChanged = 2,
    /// A walk put a Python code object (`ProcessEvent::value`) in a stack that this CPU had not
    /// seen lately: name it now, before it may be freed.
    PythonCode = 3,
    /// A process seen only running and being preempted so far (never asleep, never sampled):
    /// who it is (name, executable file, cgroup: the announcement carries them) for the run-queue
    /// profile's labels. Its map is captured when it first sleeps or is sampled (`FirstSample`),
    /// if it ever does: under process churn most short processes never do, and reading a map
    /// costs many times the labels.
    Labelled = 4,
}

/// What `SEEN` holds for a process: how far it was announced.
pub mod seen {
    /// Its labels only (`ProcessEventKind::Labelled`).
    pub const LABELLED: u8 = 1;
    /// Its memory map (`ProcessEventKind::FirstSample`).
    pub const CAPTURED: u8 = 2;
}

/// What a `ProcessEvent` says of its process's labels (`ProcessEvent::labels`).
pub mod said {
    /// Its cgroup id (in `value`), its exec generation, and its name where `comm` is not empty.
    pub const LABELS: u32 = 1;
    /// Its executable file too (`executable`; all 0: none).
    pub const EXECUTABLE: u32 = 2;
}

/// Sent through the event ring buffer; rare (once per process, or per code object), never per
/// sample.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcessEvent {
    pub tgid: u32,
    pub kind: u32,
    /// What the kind says more: a code object's address; where `labels` is 1, the process's
    /// cgroup (its cgroup v2 id, 0: not known).
    pub value: u64,
    /// Where `labels` is 1 (every `Labelled`, a `FirstSample` from the scheduler): the process's
    /// name (its leader's), the exec generation it was announced in, and its executable file.
    pub comm: [u8; COMM_LEN],
    pub generation: u32,
    pub labels: u32,
    pub executable: FileId,
}
const _: () = assert!(size_of::<ProcessEvent>() == 56);

/// A file as the kernel knows it: its filesystem's device (the kernel's `dev_t`: major in the
/// top 12 bits, minor in the low 20), its inode and the inode's generation (which tells an inode
/// number reused after a file was deleted from the file that had it). All 0: no file (a kernel
/// thread's executable).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FileId {
    pub inode: u64,
    pub dev: u32,
    pub generation: u32,
}
const _: () = assert!(size_of::<FileId>() == 16);

/// Innermost frames of a frame-pointer user stack the kernel also resolves to (build ID, file
/// offset): enough for the leaf and its callers, which is what a process that exits before its
/// memory map is read would otherwise lose.
pub const BUILD_ID_FRAMES: usize = 32;
/// Frame-pointer stacks resolved by build ID per epoch slot. Only processes without unwind
/// tables take this path (new, or gone before user space read their map), one entry per
/// distinct stack of each.
pub const BUILD_ID_STACK_ENTRIES: u32 = 512;
/// `BuildIdFrame::status` when the kernel found the file: `build_id` and `offset` hold.
pub const BUILD_ID_VALID: i32 = 1;

/// One frame as `bpf_get_stack(BPF_F_USER_BUILD_ID)` writes it (`struct bpf_stack_build_id`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BuildIdFrame {
    pub status: i32,
    /// Zero-padded: a build ID may be shorter than 20 bytes.
    pub build_id: [u8; 20],
    /// The file offset when `status` is `BUILD_ID_VALID`, else the address.
    pub offset: u64,
}
const _: () = assert!(size_of::<BuildIdFrame>() == 32);

/// The build-ID frames of one frame-pointer user stack, leaf first, in the order of the stack's
/// addresses (the same walk of the same registers); unused frames are zero.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BuildIdStack {
    pub frames: [BuildIdFrame; BUILD_ID_FRAMES],
}
const _: () = assert!(size_of::<BuildIdStack>() == 32 * BUILD_ID_FRAMES);

/// Which process's stack: stack ids are shared by every process with the same addresses, and
/// the same addresses in two processes can be two different files.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct BuildIdKey {
    pub tgid: u32,
    pub stack_id: u32,
}
const _: () = assert!(size_of::<BuildIdKey>() == 8);

/// Offsets of the `sched:sched_process_fork` fields we read, taken at start-up from the tracefs
/// format file because they differ between kernels (`parent_comm` became `__data_loc` in 6.x).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ForkOffsets {
    pub parent_pid: u32,
    pub child_pid: u32,
}
const _: () = assert!(size_of::<ForkOffsets>() == 8);

/// Offsets of the `sched:sched_process_exit` fields we read.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExitOffsets {
    pub pid: u32,
    /// Offset of `group_dead`, or `u32::MAX` on kernels without it.
    pub group_dead: u32,
}
const _: () = assert!(size_of::<ExitOffsets>() == 8);
