use std::{collections::HashMap, process::Command};

use super::{
    code::{line_at, line_of_pairs},
    *,
};

/// The interpreters on this machine (pyenv's shared builds and Debian's static one).
const PYENV: &str = "/root/.pyenv/versions";

fn pyenv_lib(version: &str) -> String {
    let minor = version.rsplit_once('.').map(|(m, _)| m).unwrap_or(version);
    format!("{PYENV}/{version}/lib/libpython{minor}.so.1.0")
}

fn interpreter_of(path: &str) -> Option<Result<Interpreter, Unsupported>> {
    let data = std::fs::read(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    Interpreter::of(&object::File::parse(&*data).unwrap())
}

#[test]
fn interpreters_are_found_by_their_loop_runtime_and_version() {
    for (version, expected) in [
        ("3.10.13", (3, 10)),
        ("3.11.7", (3, 11)),
        ("3.12.1", (3, 12)),
        ("3.13.0", (3, 13)),
    ] {
        let found = interpreter_of(&pyenv_lib(version)).unwrap().unwrap();
        assert_eq!(found.layout.version, expected, "{version}");
        assert!(
            found.eval_end > found.eval_start && found.runtime > 0,
            "{found:?}"
        );
    }
    // Debian's python3.11 is built statically: the executable is the interpreter.
    let debian = interpreter_of("/usr/bin/python3.11").unwrap().unwrap();
    assert_eq!(debian.layout, layout((3, 11)).unwrap());
    // 3.9 says neither its version nor has 3.10's Py_Is (and is not read); libc is no
    // interpreter.
    assert_eq!(
        interpreter_of(&pyenv_lib("3.9.18")),
        Some(Err(Unsupported::NoVersion))
    );
    let libc = format!("/usr/lib/{}-linux-gnu/libc.so.6", std::env::consts::ARCH);
    assert_eq!(interpreter_of(&libc), None);
}

/// 3.13 describes its own layout at the start of `_PyRuntime`: what it says is the table's row
/// (which was taken from its headers), so the table is checked by the interpreter itself.
#[test]
fn what_3_13_says_of_its_layout_is_the_tables_row() {
    let data = std::fs::read(pyenv_lib("3.13.0")).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let runtime = (file.dynamic_symbols())
        .find(|s| s.name() == Ok("_PyRuntime"))
        .unwrap()
        .address();
    let bytes = read_at(&file, runtime, DEBUG_OFFSETS_READ).unwrap();
    assert_eq!(described(bytes, (3, 13)), Some(Ok(layout((3, 13)).unwrap())));
    // A later version's description is laid out differently: not guessed at.
    assert_eq!(described(bytes, (3, 14)), Some(Err(Unsupported::Version(3, 14))));
    let mut free_threaded = bytes.to_vec();
    free_threaded[16] = 1;
    assert_eq!(
        described(&free_threaded, (3, 13)),
        Some(Err(Unsupported::FreeThreaded(3, 13)))
    );
    assert_eq!(described(&bytes[8..], (3, 13)), None, "no cookie, no description");
}

/// The table's offsets are each version's own: `offsets.c`, built against the version's headers
/// (internal ones too), prints them (`offsetof`, `sizeof`).
#[test]
fn the_layouts_are_the_headers_offsets() {
    let source = concat!(env!("CARGO_MANIFEST_DIR"), "/src/python/offsets.c");
    for version in ["3.10.13", "3.11.7", "3.12.1", "3.13.0"] {
        let minor = version.rsplit_once('.').unwrap().0;
        let include = format!("{PYENV}/{version}/include/python{minor}");
        let exe = std::env::temp_dir().join(format!("bpfprof-offsets-{minor}-{}", std::process::id()));
        let built = Command::new("cc")
            .args(["-I", &include, "-I", &format!("{include}/internal"), "-o"])
            .arg(&exe)
            .arg(source)
            .output()
            .unwrap();
        assert!(
            built.status.success(),
            "{}",
            String::from_utf8_lossy(&built.stderr)
        );
        let out = Command::new(&exe).output().unwrap();
        let _ = std::fs::remove_file(&exe);
        let table = layout((minor[2..].parse::<u8>().map(|m| (3, m))).unwrap()).unwrap();
        let (w, c) = (table.walker, table.code);
        let ours: HashMap<&str, u16> = HashMap::from([
            ("runtime_interpreters", w.runtime_interpreters),
            ("interp_threads", w.interp_threads),
            ("tstate_next", w.tstate_next),
            ("tstate_native_id", w.tstate_native_id),
            ("tstate_frame", w.tstate_frame),
            ("cframe_frame", w.cframe_frame),
            ("frame_code", w.frame_code),
            ("frame_previous", w.frame_previous),
            ("frame_instr", w.frame_instr),
            ("frame_marker", w.frame_marker),
            ("qualname", c.qualname),
            ("bytecode", c.bytecode),
            ("filename", c.filename),
            ("first_line", c.first_line),
            ("line_table", c.line_table),
            ("ascii_header", c.ascii_header),
            ("compact_header", c.compact_header),
        ]);
        let text = String::from_utf8(out.stdout).unwrap();
        for line in text.lines() {
            let (name, value) = line.split_once(' ').unwrap();
            assert_eq!(Some(&value.parse().unwrap()), ours.get(name), "{version}: {name}");
        }
        assert!(text.lines().count() >= 14, "{version}: {text}");
    }
}

/// glibc's own word of where a thread's tid is in its descriptor (`_thread_db_pthread_tid`:
/// bits, count, offset) is `PTHREAD_TID`: the machine's C library, and the arm64 one the cross
/// compiler brings.
#[test]
fn the_tid_is_where_glibc_says() {
    let read = |path: &str| -> u32 {
        let data = std::fs::read(path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let file = object::File::parse(&*data).unwrap();
        let at = (file.dynamic_symbols())
            .find(|s| s.name() == Ok("_thread_db_pthread_tid"))
            .unwrap()
            .address();
        let bytes = read_at(&file, at, 12).unwrap();
        u32::from_le_bytes(bytes[8..12].try_into().unwrap())
    };
    assert_eq!(read("/lib/x86_64-linux-gnu/libc.so.6"), 720);
    assert_eq!(read("/usr/aarch64-linux-gnu/lib/libc.so.6"), 208);
    assert_eq!(
        u32::from(PTHREAD_TID),
        if cfg!(target_arch = "aarch64") { 208 } else { 720 }
    );
}

/// Each version's own line numbers (`co_lines()`: ranges of bytecode offsets and their line)
/// against `line_at` on its location table (3.10: `line_of_pairs` on its pairs), for every code
/// unit of a function with loops, a multi-line expression, a comprehension and an exception
/// handler.
#[test]
fn line_tables_give_each_instruction_the_line_python_gives_it() {
    const SCRIPT: &str = r#"
import sys
def sample(n):
    total = 0
    for i in range(n):
        if i % 3 == 0:
            total += (i *
                      2)
        else:
            try:
                total -= [j for j in range(i)][-1]
            except IndexError:
                total = None
    return total
codes = [sample.__code__] + [c for c in sample.__code__.co_consts if hasattr(c, "co_lines")]
for code in codes:
    lines = ",".join(f"{s}:{e}:{-1 if l is None else l}" for s, e, l in code.co_lines())
    print(code.co_firstlineno, code.co_linetable.hex(), lines)
"#;
    for version in ["3.10.13", "3.11.7", "3.12.1", "3.13.0"] {
        let minor = version.rsplit_once('.').unwrap().0;
        let python = format!("{PYENV}/{version}/bin/python{minor}");
        let line_of = |table: &[u8], first, byte: u64| match minor {
            "3.10" => line_of_pairs(table, first, byte),
            _ => line_at(table, first, byte / 2),
        };
        let out = Command::new(&python).args(["-c", SCRIPT]).output().unwrap();
        assert!(
            out.status.success(),
            "{python}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout).unwrap();
        let mut units = 0;
        for line in text.lines() {
            let mut fields = line.split(' ');
            let first: u32 = fields.next().unwrap().parse().unwrap();
            let table: Vec<u8> = (0..fields.next().unwrap().len() / 2)
                .map(|i| u8::from_str_radix(&line.split(' ').nth(1).unwrap()[2 * i..2 * i + 2], 16).unwrap())
                .collect();
            for range in fields.next().unwrap().split(',') {
                let v: Vec<i64> = range.split(':').map(|x| x.parse().unwrap()).collect();
                for byte in (v[0]..v[1]).step_by(2) {
                    let expected = u32::try_from(v[2]).ok();
                    assert_eq!(
                        line_of(&table, first, byte as u64),
                        expected,
                        "{version} offset {byte}: {line}"
                    );
                    units += 1;
                }
            }
        }
        assert!(units > 50, "{version}: {units} code units checked");
    }
}

/// A table cut short or of noise gives no line or some line, never a panic.
#[test]
fn a_broken_line_table_gives_no_line_not_a_panic() {
    assert_eq!(line_at(&[], 10, 0), None);
    assert_eq!(line_at(&[0x01, 0x02], 10, 0), None, "no entry start");
    assert_eq!(line_at(&[0xf8], 10, 0), None, "kind 15: no line");
    assert_eq!(line_at(&[0xe8], 10, 0), None, "a long entry cut before its line");
    assert_eq!(line_at(&[0xe8, 0x7f], 10, 0), None, "its varint cut short");
    assert_eq!(line_of_pairs(&[4, 1, 2], 10, 5), None, "a pair cut short");
    assert_eq!(line_of_pairs(&[4, 0x80], 10, 2), None, "a range without a line");
    assert_eq!(line_of_pairs(&[4, 0xff, 4, 0x80, 0, 100, 2, 3], 10, 9), Some(112));
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..2000 {
        let table: Vec<u8> = (0..(seed % 40))
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed as u8
            })
            .collect();
        for unit in 0..50 {
            let _ = line_at(&table, 1, unit);
            let _ = line_of_pairs(&table, u32::MAX, unit);
        }
    }
}

/// A code object in this process's own memory, as a Python process lays one out: its qualified
/// name and file (compact ASCII strings), first line and an empty line table.
struct FakeCode {
    object: Vec<u64>,
    _strings: Vec<Vec<u64>>,
}

fn ascii_string(layout: &Layout, text: &str) -> Vec<u64> {
    let header = layout.code.ascii_header as usize;
    let mut bytes = vec![0u8; header + text.len() + 8];
    bytes[16..24].copy_from_slice(&(text.len() as u64).to_le_bytes());
    // Kind 1, compact, ASCII.
    bytes[32..36].copy_from_slice(&((1u32 << 2) | (1 << 5) | (1 << 6)).to_le_bytes());
    bytes[header..header + text.len()].copy_from_slice(text.as_bytes());
    bytes
        .chunks(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
        .collect()
}

impl FakeCode {
    fn new(layout: &Layout, name: &str, first_line: u32) -> FakeCode {
        let c = &layout.code;
        let strings = vec![
            ascii_string(layout, name),
            ascii_string(layout, "x.py"),
            vec![0u64; 8],
        ];
        let mut object = vec![0u64; 64];
        let mut put = |offset: u16, value: u64| object[offset as usize / 8] = value;
        put(c.qualname, strings[0].as_ptr() as u64);
        put(c.filename, strings[1].as_ptr() as u64);
        put(c.first_line, first_line as u64);
        put(c.line_table, strings[2].as_ptr() as u64);
        FakeCode {
            object,
            _strings: strings,
        }
    }

    /// Another code object put where this one was.
    fn replaced_by(&mut self, other: &FakeCode) {
        self.object.copy_from_slice(&other.object);
    }

    fn at(&self) -> u64 {
        self.object.as_ptr() as u64
    }
}

/// A code object freed and another made at its address: the frames at that address are named
/// after the new one once it is checked again (`RECHECK`), not after the first for ever.
#[test]
fn a_code_object_reborn_at_the_same_address_is_named_anew() {
    let layout = layout((3, 11)).unwrap();
    let mut first = FakeCode::new(&layout, "Path", 10);
    let second = FakeCode::new(&layout, "gamma_work", 20);
    let mut codes = code::PyCodes::default();
    let pid = std::process::id();
    codes.found(pid, 0, layout);
    let slot = [profiler_common::python::py_frame(first.at(), 0)];
    codes.read(pid, &slot);
    assert_eq!(&*codes.code(pid, first.at()).unwrap().name, "Path");
    first.replaced_by(&second);
    // Checked at most every RECHECK: named as before until then.
    codes.read(pid, &slot);
    assert_eq!(&*codes.code(pid, first.at()).unwrap().name, "Path");
    std::thread::sleep(std::time::Duration::from_millis(250));
    codes.read(pid, &slot);
    let named = codes.code(pid, first.at()).unwrap();
    assert_eq!((&*named.name, named.first_line), ("gamma_work", 20));
}
