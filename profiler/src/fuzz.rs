//! The fuzz targets' entry points: one per parser bpfprof drives with bytes it does not trust,
//! each called the way bpfprof calls it. A target passes an input when it neither panics nor
//! allocates without bound. `profiler/fuzz` wraps each in a libFuzzer target (`cargo xtask
//! fuzz`); the inputs that once failed, kept under `profiler/fuzz/regressions/TARGET/`, are
//! replayed by a unit test (`regressions_pass`) in every build.
/// A target's entry: the input, as bytes.
pub type Entry = fn(&[u8]);

/// Every target: its name (the fuzz target's, and its regression directory's) and entry.
pub const TARGETS: &[(&str, Entry)] = &[
    ("unwind_rows", unwind_rows),
    ("elf", elf),
    ("gopclntab", gopclntab),
    ("btf", btf),
    ("saved_profile", saved_profile),
    ("perf_csv", perf_csv),
    ("maps", maps),
    ("perf_map", perf_map),
    ("tracefs_format", tracefs_format),
    ("usdt_args", usdt_args),
    ("python_lines", python_lines),
    ("python_code", python_code),
    ("symbolize", symbolize),
    ("annotate", annotate),
    ("sched_record", sched_record),
];

/// An ELF file's unwind rows (`.eh_frame`, `.debug_frame`, compressed or not, Go's table, the
/// AArch64 PLT), as built for every file a profiled process maps.
pub fn unwind_rows(data: &[u8]) {
    let _ = crate::unwind::rows_of(data);
}

/// Everything else bpfprof reads of an ELF file it is handed: its build ID, each section
/// (decompressed), the functions its unwind table bounds, a Python interpreter's symbols and
/// self-description, Go's table, USDT notes, and the DWARF lines a probe on a source line reads.
pub fn elf(data: &[u8]) {
    let Ok(file) = object::File::parse(data) else {
        return;
    };
    use object::Object as _;
    let _ = crate::process::elf_build_id(&file);
    for section in file.sections().take(64) {
        let _ = crate::process::section_data(&section);
    }
    let _ = crate::unwind::fde_ranges(&file);
    let _ = crate::python::Interpreter::of(&file);
    if let Ok(found) = crate::golang::find(&file) {
        walk_pclntab(&found.table);
    }
    let _ = crate::counters::usdt::sites(&file, data);
    // Through a file, as the debug-file index and debuginfod's replies are read.
    if let Some(file) = memfd() {
        use std::os::unix::fs::FileExt as _;
        if file.write_all_at(data, 0).is_ok() {
            let _ = crate::process::build_id_bytes(&file);
        }
    }
    let path = std::path::Path::new("fuzz.elf");
    let _ = crate::counters::lines::sites(&file, path, "a.c", 3);
    let _ = crate::counters::lines::function_lines(&file, path, "a.c", "main");
}

/// Go's `.gopclntab` on its own (its text at Go's usual address), read as the names and the
/// rows are: every function's name, file, lines and pcsp values.
pub fn gopclntab(data: &[u8]) {
    let Some((&arch, table)) = data.split_first() else {
        return;
    };
    let Ok(table) = crate::golang::Pclntab::parse(table, 0x401000) else {
        return;
    };
    walk_pclntab(&table);
    let arch = match arch & 1 {
        0 => crate::golang::rows::Arch::X86_64,
        _ => crate::golang::rows::Arch::Aarch64,
    };
    let _ = crate::golang::rows::rows(&table, arch);
}

fn walk_pclntab(table: &crate::golang::Pclntab<'_>) {
    for func in table.funcs().take(4096) {
        let _ = table.name(&func);
        let _ = table.file(&func, func.entry);
        let _ = table.line(&func, func.entry);
        let _ = table.pc_values(func.pcsp, &func).take(4096).count();
        let _ = table.find(func.entry);
    }
}

/// The kernel's BTF as bpfprof reads it (the offsets of the fields its programs read).
pub fn btf(data: &[u8]) {
    let Ok(btf) = crate::btf::Btf::parse(data) else {
        return;
    };
    // The names of the seed (`seeds/btf/outer.btf`) and of the kernel's.
    for member in ["x", "y", "z", "name"] {
        let _ = btf.member_offset("outer", member);
    }
    let _ = btf.member_offset("task_struct", "pid");
    let _ = btf.fn_pointer_params("btf_trace_ev");
}

/// A saved profile handed to `bpfprof diff` or `report`: JSON, gzipped pprof or folded stacks,
/// read and rendered again in every format.
pub fn saved_profile(data: &[u8]) {
    use crate::cli::Format;
    let Ok(saved) = crate::views::saved::parse_saved(data, "fuzz") else {
        return;
    };
    for format in [
        Format::Text,
        Format::Json,
        Format::Folded,
        Format::Svg,
        Format::Pprof,
    ] {
        let _ = saved.render(&*crate::report::renderer(format), &mut std::io::sink());
    }
    // And compared with itself, as `bpfprof diff` does.
    let stacks = saved.into_stacks();
    let Ok(diff) = crate::views::diff::diff(("a", &stacks), ("b", &stacks)) else {
        return;
    };
    for format in [Format::Text, Format::Json, Format::Folded, Format::Svg] {
        let how = crate::views::diff::Rendering {
            format,
            limit: 20,
            before_widths: false,
        };
        let _ = crate::views::diff::render(&diff, how, &mut std::io::sink());
    }
}

/// `perf stat -x,` output handed to topdown (`--counters FILE`).
pub fn perf_csv(data: &[u8]) {
    let _ = crate::counters::perf_csv::parse_perf_csv(&String::from_utf8_lossy(data));
}

/// A process's `/proc/PID/maps` (its paths are the process's to choose).
pub fn maps(data: &[u8]) {
    let _ = crate::process::parse_maps(&String::from_utf8_lossy(data));
}

/// A JIT runtime's `/tmp/perf-PID.map`, read as appended (in two reads, split where the first
/// byte says), then rewritten shorter from the start (as a runtime that restarts its map).
pub fn perf_map(data: &[u8]) {
    use std::os::unix::fs::FileExt as _;
    let Some((&split, data)) = data.split_first() else {
        return;
    };
    let Some(file) = memfd() else { return };
    let Ok(writer) = file.try_clone() else { return };
    let mut map = crate::process::PerfMap::from_file(file);
    let split = data.len() * split as usize / 255;
    let _ = writer.write_all_at(&data[..split], 0);
    map.refresh();
    let _ = writer.write_all_at(&data[split..], split as u64);
    map.refresh();
    let _ = writer.set_len(0);
    let _ = writer.write_all_at(&data[split..], 0);
    map.refresh();
    for chunk in data.chunks_exact(8).take(64) {
        let _ = map.find(u64::from_le_bytes(chunk.try_into().unwrap_or_default()));
    }
}

/// A tracepoint's `format` file (tracefs; the kernel writes it, a container may not).
pub fn tracefs_format(data: &[u8]) {
    let _ = crate::counters::tracepoint::parse_format(&String::from_utf8_lossy(data));
}

/// A USDT probe's argument string (`.note.stapsdt`: `-4@%edi 8@-16(%rbp)`), both architectures.
pub fn usdt_args(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let args = crate::counters::usdt::split_args(&text).len();
    for n in 0..args.min(16) {
        let _ = crate::counters::usdt::parse_arg_at(&text, n, false);
        let _ = crate::counters::usdt::parse_arg_at(&text, n, true);
    }
}

/// A code object's line table, read from a Python process's memory: 3.11+'s and 3.10's.
pub fn python_lines(data: &[u8]) {
    let Some((head, table)) = data.split_at_checked(8) else {
        return;
    };
    let first_line = u32::from_le_bytes(head[..4].try_into().unwrap_or_default());
    let offset = u32::from_le_bytes(head[4..].try_into().unwrap_or_default()) as u64;
    let _ = crate::python::code::line_at(table, first_line, offset);
    let _ = crate::python::code::line_of_pairs(table, first_line, offset);
}

/// A code object read from a Python process's memory (here a file standing for it): the first
/// byte picks the interpreter's layout (3.10-3.13), the next eight where the code object is,
/// the rest is the memory, from address 0.
pub fn python_code(data: &[u8]) {
    use std::os::unix::fs::FileExt as _;
    let (Some(&version), Some(at)) = (data.first(), data.get(1..9)) else {
        return;
    };
    let Some(layout) = crate::python::layout((3, 10 + version % 4)) else {
        return;
    };
    let code = u64::from_le_bytes(at.try_into().unwrap_or_default());
    let Some(mem) = memfd() else { return };
    if mem.write_all_at(&data[9..], 0).is_ok() {
        let _ = crate::python::code::read_code(&mem, &layout, code);
    }
}

/// An ELF file a profiled process maps, named as every profile names it: the debug-file search
/// (its build id, debug link), blazesym over its symbols and DWARF (lines, inlined functions),
/// then what blazesym leaves unnamed placed from its own tables (unwind bounds, Go's table).
/// The addresses: each function symbol's (as file offsets), and offsets the input's last 64
/// bytes give.
pub fn symbolize(data: &[u8]) {
    let _ = named_frames(data);
}

/// `symbolize`'s work: how many of its addresses got a name.
fn named_frames(data: &[u8]) -> usize {
    use object::{Object as _, ObjectSymbol as _};
    use std::os::{fd::AsRawFd as _, unix::fs::FileExt as _};
    let Some(file) = memfd().filter(|f| f.write_all_at(data, 0).is_ok()) else {
        return 0;
    };
    let path = format!("/proc/self/fd/{}", file.as_raw_fd());
    let mut offsets: Vec<u64> = match object::File::parse(data) {
        Ok(elf) => elf.symbols().take(64).map(|s| s.address()).collect(),
        Err(_) => Vec::new(),
    };
    let tail = &data[data.len().saturating_sub(64)..];
    offsets.extend(
        tail.chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default())),
    );
    let maps = format!("0-ffffffffffffffff r-xp 00000000 00:01 1 {path}\n");
    let mut procs = crate::process::Processes::new();
    procs.insert_maps(1, crate::process::parse_maps(&maps));
    let mut profile = crate::profile::RawProfile::new();
    profile.add(
        crate::profile::RawSample::of_user_stack(
            1,
            "fuzz",
            offsets.iter().map(|o| o.saturating_add(1)).collect(),
            1,
        ),
        &procs,
    );
    let symbols = crate::symbolize::Symbolizer::default().symbolize(&profile, &procs);
    (profile.stacks.keys())
        .flat_map(|key| &key.user)
        .filter(|addr| symbols.user(addr).iter().any(|f| !f.is_unknown()))
        .count()
}

/// `--annotate`: a function's machine code decoded from the binary a profile names (x86-64 and
/// AArch64, by the file's own architecture), at each function symbol's address; and the bytes
/// as code of both architectures whatever they are.
pub fn annotate(data: &[u8]) {
    use object::{Object as _, ObjectSymbol as _};
    if let Ok(elf) = object::File::parse(data) {
        let sampled: std::collections::BTreeMap<(u64, u64), u64> =
            (elf.symbols().take(16)).map(|s| ((s.address(), 0), 1)).collect();
        let _ = crate::views::annotate::machine_code_in(data, "fuzz", &sampled);
    }
    let _ = crate::views::annotate::decode(data, 0, object::Architecture::X86_64);
    let _ = crate::views::annotate::decode(data, 0, object::Architecture::Aarch64);
}

/// A `sched record` file, through both views: `timehist -w -M -V -s` and `map`.
pub fn sched_record(data: &[u8]) {
    use std::os::{fd::AsRawFd as _, unix::fs::FileExt as _};
    let Some(file) = memfd() else { return };
    if file.write_all_at(data, 0).is_err() {
        return;
    }
    let path = std::path::PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
    let args = crate::cli::TimehistArgs {
        input: path.clone(),
        wakeups: true,
        migrations: true,
        cpu_visual: true,
        summary: true,
        summary_only: false,
        tids: Vec::new(),
        since: None,
        until: None,
    };
    if let Ok(mut reader) = crate::timeline::file::Reader::open(&path) {
        let _ = crate::timeline::timehist::print(&args, &mut reader, &mut std::io::sink());
    }
    if let Ok(mut reader) = crate::timeline::file::Reader::open(&path) {
        let shown: Vec<u32> = (0..reader.header.cpus.min(64)).collect();
        let _ = crate::timeline::map::draw(&mut reader, &shown, &mut std::io::sink());
    }
}

fn memfd() -> Option<std::fs::File> {
    use std::os::fd::FromRawFd as _;
    // SAFETY: a new descriptor this function owns from here on.
    let fd = unsafe { libc::memfd_create(c"bpfprof-fuzz".as_ptr(), libc::MFD_CLOEXEC) };
    (fd >= 0).then(|| unsafe { std::fs::File::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every input a target once failed on passes now. Where the inputs are kept:
    /// `profiler/fuzz/regressions/TARGET/`.
    #[test]
    fn regressions_pass() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/regressions");
        let mut replayed = 0;
        for (name, run) in TARGETS {
            let Ok(dir) = std::fs::read_dir(root.join(name)) else {
                continue;
            };
            for entry in dir {
                let path = entry.unwrap().path();
                eprintln!("{name}: {}", path.display());
                run(&std::fs::read(&path).unwrap());
                replayed += 1;
            }
        }
        eprintln!("{replayed} regression inputs replayed");
    }

    /// The symbolize target reaches the names: its file is read through the path it gives.
    #[test]
    fn the_symbolize_target_names_a_real_binary() {
        let exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let named = named_frames(&exe);
        println!("{named} addresses named");
        assert!(named > 10, "{named}");
    }

    /// The fuzz crate has one target per entry here, and nothing else.
    #[test]
    fn each_target_has_its_fuzz_target() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/fuzz_targets");
        let mut files: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| {
                e.unwrap()
                    .file_name()
                    .to_string_lossy()
                    .trim_end_matches(".rs")
                    .to_string()
            })
            .collect();
        files.sort();
        let mut names: Vec<String> = TARGETS.iter().map(|(n, _)| n.to_string()).collect();
        names.sort();
        assert_eq!(files, names);
    }
}
