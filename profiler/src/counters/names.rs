//! perf's names of the generic hardware, cache and software events, and Arm's architected
//! common events by the numbers the architecture fixes: the tables the event language
//! (`language`) and `list` read.

/// The generic hardware events (PERF_TYPE_HARDWARE), with perf's aliases.
pub const HARDWARE: [(&str, u64, &str); 12] = [
    ("cycles", 0, "CPU cycles"),
    ("cpu-cycles", 0, "CPU cycles"),
    ("instructions", 1, "instructions retired"),
    ("cache-references", 2, "cache accesses (usually the last level)"),
    ("cache-misses", 3, "cache misses (usually the last level)"),
    ("branches", 4, "branch instructions retired"),
    ("branch-instructions", 4, "branch instructions retired"),
    ("branch-misses", 5, "mispredicted branches"),
    ("bus-cycles", 6, "bus cycles"),
    ("stalled-cycles-frontend", 7, "cycles the front end stalled"),
    ("stalled-cycles-backend", 8, "cycles the back end stalled"),
    ("ref-cycles", 9, "reference cycles (not scaled by frequency)"),
];

/// The software events (PERF_TYPE_SOFTWARE), with perf's aliases.
pub const SOFTWARE: [(&str, u64, &str); 14] = [
    ("cpu-clock", 0, "the CPU's clock, in nanoseconds"),
    ("task-clock", 1, "the task's clock, in nanoseconds"),
    ("page-faults", 2, "page faults"),
    ("faults", 2, "page faults"),
    ("context-switches", 3, "context switches"),
    ("cs", 3, "context switches"),
    ("cpu-migrations", 4, "migrations to another CPU"),
    ("migrations", 4, "migrations to another CPU"),
    ("minor-faults", 5, "page faults served without I/O"),
    ("major-faults", 6, "page faults that needed I/O"),
    ("alignment-faults", 7, "unaligned accesses fixed up by the kernel"),
    ("emulation-faults", 8, "instructions the kernel emulated"),
    ("dummy", 9, "counts nothing"),
    ("cgroup-switches", 11, "switches between cgroups"),
];

/// The caches of PERF_TYPE_HW_CACHE, as perf names them.
const CACHES: [(&str, u64); 7] = [
    ("L1-dcache", 0),
    ("L1-icache", 1),
    ("LLC", 2),
    ("dTLB", 3),
    ("iTLB", 4),
    ("branch", 5),
    ("node", 6),
];

/// Operation and result of a cache event: (suffix, op << 8 | result << 16).
const CACHE_OPS: [(&str, u64); 6] = [
    ("loads", 0),
    ("load-misses", 1 << 16),
    ("stores", 1 << 8),
    ("store-misses", 1 << 8 | 1 << 16),
    ("prefetches", 2 << 8),
    ("prefetch-misses", 2 << 8 | 1 << 16),
];

/// Arm's architected common events: their numbers are fixed by the architecture (Arm ARM, "PMU
/// events and event numbers"), whatever a PMU's sysfs lists.
pub const ARM_COMMON: [(&str, u64); 64] = [
    ("sw_incr", 0x00),
    ("l1i_cache_refill", 0x01),
    ("l1i_tlb_refill", 0x02),
    ("l1d_cache_refill", 0x03),
    ("l1d_cache", 0x04),
    ("l1d_tlb_refill", 0x05),
    ("ld_retired", 0x06),
    ("st_retired", 0x07),
    ("inst_retired", 0x08),
    ("exc_taken", 0x09),
    ("exc_return", 0x0a),
    ("cid_write_retired", 0x0b),
    ("pc_write_retired", 0x0c),
    ("br_immed_retired", 0x0d),
    ("br_return_retired", 0x0e),
    ("unaligned_ldst_retired", 0x0f),
    ("br_mis_pred", 0x10),
    ("cpu_cycles", 0x11),
    ("br_pred", 0x12),
    ("mem_access", 0x13),
    ("l1i_cache", 0x14),
    ("l1d_cache_wb", 0x15),
    ("l2d_cache", 0x16),
    ("l2d_cache_refill", 0x17),
    ("l2d_cache_wb", 0x18),
    ("bus_access", 0x19),
    ("memory_error", 0x1a),
    ("inst_spec", 0x1b),
    ("ttbr_write_retired", 0x1c),
    ("bus_cycles", 0x1d),
    ("chain", 0x1e),
    ("l1d_cache_allocate", 0x1f),
    ("l2d_cache_allocate", 0x20),
    ("br_retired", 0x21),
    ("br_mis_pred_retired", 0x22),
    ("stall_frontend", 0x23),
    ("stall_backend", 0x24),
    ("l1d_tlb", 0x25),
    ("l1i_tlb", 0x26),
    ("l2i_cache", 0x27),
    ("l2i_cache_refill", 0x28),
    ("l3d_cache_allocate", 0x29),
    ("l3d_cache_refill", 0x2a),
    ("l3d_cache", 0x2b),
    ("l3d_cache_wb", 0x2c),
    ("l2d_tlb_refill", 0x2d),
    ("l2i_tlb_refill", 0x2e),
    ("l2d_tlb", 0x2f),
    ("l2i_tlb", 0x30),
    ("remote_access", 0x31),
    ("ll_cache", 0x32),
    ("ll_cache_miss", 0x33),
    ("dtlb_walk", 0x34),
    ("itlb_walk", 0x35),
    ("ll_cache_rd", 0x36),
    ("ll_cache_miss_rd", 0x37),
    ("remote_access_rd", 0x38),
    ("l1d_cache_lmiss_rd", 0x39),
    ("op_retired", 0x3a),
    ("op_spec", 0x3b),
    ("stall", 0x3c),
    ("stall_slot_backend", 0x3d),
    ("stall_slot_frontend", 0x3e),
    ("stall_slot", 0x3f),
];

/// `L1-dcache-load-misses` and the like.
pub fn cache_config(name: &str) -> Option<u64> {
    CACHES.iter().find_map(|(cache, id)| {
        let op = name.strip_prefix(cache)?.strip_prefix('-')?;
        CACHE_OPS
            .iter()
            .find(|(suffix, _)| *suffix == op)
            .map(|(_, bits)| id | bits)
    })
}

/// Every generic cache event's name.
pub fn cache_names() -> impl Iterator<Item = String> {
    CACHES
        .iter()
        .flat_map(|(cache, _)| CACHE_OPS.iter().map(move |(op, _)| format!("{cache}-{op}")))
}
