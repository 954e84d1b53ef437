//! The crates' structure, checked: no two modules of the user-space crate (or of xtask) import
//! each other, directly or round a circle (`crate::` paths in the source, tests left out); no
//! file is over 700 lines; no function of the user-space crate is over `FUNCTION_BUDGET` lines
//! unless `LONG_FUNCTIONS` lists it with its reason. A unit test, so the suite says when a change
//! grows a circle or a long function back.
use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

/// A module's path inside the crate: `["modes", "lock"]` for `modes/lock/mod.rs`.
type Module = Vec<String>;

/// The modules of the crate rooted at `src`: the file and the source (its tests cut off) of each.
fn modules(src: &Path) -> BTreeMap<Module, (PathBuf, String)> {
    let mut found = BTreeMap::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                let text = match text.find("#[cfg(test)]\nmod tests") {
                    Some(end) => text[..end].to_string(),
                    None => text,
                };
                found.insert(module_of(src, &path), (path, text));
            }
        }
    }
    found
}

fn module_of(src: &Path, file: &Path) -> Module {
    let relative: PathBuf = file.strip_prefix(src).unwrap_or(file).with_extension("");
    let mut parts: Module = relative
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib" | "main")) {
        parts.pop();
    }
    parts
}

/// Every path named after `crate::`, with `{a, b::{c}}` groups spread out.
fn crate_paths(text: &str) -> Vec<Vec<String>> {
    let code: String = text
        .lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    let bytes = code.as_bytes();
    let mut paths = Vec::new();
    let mut from = 0;
    while let Some(at) = code[from..].find("crate::") {
        from = parse_tree(bytes, from + at + "crate::".len(), &[], &mut paths);
    }
    paths
}

/// The use-tree at `i` under `prefix`, into `out`; returns where it ends.
fn parse_tree(s: &[u8], mut i: usize, prefix: &[String], out: &mut Vec<Vec<String>>) -> usize {
    let skip_space = |mut i: usize| {
        while s.get(i).is_some_and(u8::is_ascii_whitespace) {
            i += 1;
        }
        i
    };
    i = skip_space(i);
    if s.get(i) == Some(&b'{') {
        i += 1;
        loop {
            i = skip_space(i);
            if s.get(i) == Some(&b'}') {
                return i + 1;
            }
            let end = parse_tree(s, i, prefix, out);
            if end == i {
                return i;
            }
            i = skip_space(end);
            match s.get(i) {
                Some(b',') => i += 1,
                Some(b'}') => return i + 1,
                _ => return i,
            }
        }
    }
    let start = i;
    while s.get(i).is_some_and(|c| c.is_ascii_alphanumeric() || *c == b'_') {
        i += 1;
    }
    if i == start {
        return i;
    }
    let mut path = prefix.to_vec();
    path.push(String::from_utf8_lossy(&s[start..i]).into_owned());
    match s[i..].starts_with(b"::") {
        true => parse_tree(s, i + 2, &path, out),
        false => {
            out.push(path);
            i
        }
    }
}

/// Which module imports which: the longest module a path names, between modules where neither
/// contains the other (a module and its own children are one room).
fn imports(modules: &BTreeMap<Module, (PathBuf, String)>) -> BTreeMap<Module, BTreeSet<Module>> {
    let mut edges: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    for (module, (_, text)) in modules {
        for path in crate_paths(text) {
            let Some(target) = (1..=path.len())
                .rev()
                .map(|n| path[..n].to_vec())
                .find(|m| modules.contains_key(m))
            else {
                continue;
            };
            if target.starts_with(module) || module.starts_with(&target) {
                continue;
            }
            edges.entry(module.clone()).or_default().insert(target);
        }
    }
    edges
}

/// The circles among `edges` (strongly connected groups of two or more), each sorted.
fn circles(edges: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<Vec<Module>> {
    let reaches = |from: &Module| -> BTreeSet<Module> {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.clone()];
        while let Some(m) = todo.pop() {
            for next in edges.get(&m).into_iter().flatten() {
                if seen.insert(next.clone()) {
                    todo.push(next.clone());
                }
            }
        }
        seen
    };
    let mut groups: Vec<Vec<Module>> = Vec::new();
    for module in edges.keys() {
        if groups.iter().any(|g| g.contains(module)) {
            continue;
        }
        let forward = reaches(module);
        let group: Vec<Module> = forward
            .iter()
            .filter(|other| *other == module || reaches(other).contains(module))
            .cloned()
            .collect();
        if group.len() > 1 {
            groups.push(group);
        }
    }
    groups
}

/// The most lines a function of the user-space crate may take.
const FUNCTION_BUDGET: usize = 100;

/// Functions over the budget, and why they stay whole: (file under profiler/src, name, reason).
const LONG_FUNCTIONS: &[(&str, &str, &str)] = &[];

/// Whether module `module` is compiled for tests only (`#[cfg(test)] mod name;` in its parent).
fn test_only(modules: &BTreeMap<Module, (PathBuf, String)>, module: &Module) -> bool {
    let Some((name, parent)) = module.split_last() else {
        return false;
    };
    let Some((_, text)) = modules.get(parent) else {
        return false;
    };
    text.contains(&format!("#[cfg(test)]\nmod {name};"))
        || text.contains(&format!("#[cfg(test)]\npub mod {name};"))
}

/// The source with comments, strings and character literals blanked (newlines kept), so braces
/// and `fn` are only code's.
fn code_only(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    while i < chars.len() {
        let (c, next) = (chars[i], chars.get(i + 1).copied());
        let end = match (c, next) {
            ('/', Some('/')) => (i..chars.len())
                .find(|&j| chars[j] == '\n')
                .unwrap_or(chars.len()),
            ('/', Some('*')) => (i + 2..chars.len())
                .find(|&j| chars[j] == '*' && chars.get(j + 1) == Some(&'/'))
                .map_or(chars.len(), |j| j + 2),
            ('r', Some('"' | '#')) if i == 0 || !chars[i - 1].is_alphanumeric() => raw_string_end(&chars, i),
            ('"', _) => string_end(&chars, i + 1),
            ('\'', Some('\\')) => (i + 2..chars.len())
                .find(|&j| chars[j] == '\'')
                .map_or(chars.len(), |j| j + 1),
            ('\'', Some(_)) if chars.get(i + 2) == Some(&'\'') => i + 3,
            _ => {
                out.push(c);
                i += 1;
                continue;
            }
        };
        out.extend(chars[i..end].iter().map(|&c| blank(c)));
        i = end;
    }
    out
}

/// Where a string whose text starts at `from` ends (after its closing quote).
fn string_end(chars: &[char], mut from: usize) -> usize {
    while from < chars.len() {
        match chars[from] {
            '\\' => from += 2,
            '"' => return from + 1,
            _ => from += 1,
        }
    }
    chars.len()
}

/// Where a raw string `r#"..."#` starting at `at` ends.
fn raw_string_end(chars: &[char], at: usize) -> usize {
    let hashes = chars[at + 1..].iter().take_while(|&&c| c == '#').count();
    let open = at + 1 + hashes;
    if chars.get(open) != Some(&'"') {
        return at + 1;
    }
    let close: String = std::iter::once('"')
        .chain(std::iter::repeat_n('#', hashes))
        .collect();
    let rest: String = chars[open + 1..].iter().collect();
    match rest.find(&close) {
        Some(k) => open + 1 + rest[..k].chars().count() + close.chars().count(),
        None => chars.len(),
    }
}

/// Each function with a body in `text`: its name, first line (1-based) and length in lines.
fn functions(text: &str) -> Vec<(String, usize, usize)> {
    let code = code_only(text);
    let bytes = code.as_bytes();
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(at) = code[from..].find("fn ").map(|k| from + k) {
        from = at + 3;
        if at > 0 && (bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_') {
            continue;
        }
        let name: String = code[at + 3..]
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let Some(open) = code[at..].find(['{', ';']).map(|k| at + k) else {
            break;
        };
        if name.is_empty() || bytes[open] == b';' {
            continue;
        }
        let mut depth = 0usize;
        let Some(close) = (open..bytes.len()).find(|&k| {
            match bytes[k] {
                b'{' => depth += 1,
                b'}' => depth -= 1,
                _ => {}
            }
            depth == 0
        }) else {
            break;
        };
        let line = code[..at].matches('\n').count() + 1;
        let lines = code[at..=close].matches('\n').count() + 1;
        found.push((name, line, lines));
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn src() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../profiler/src")
    }

    #[test]
    fn use_trees_spread_into_paths() {
        let paths = crate_paths("use crate::{a::{b, c::D}, e};\nlet x = crate::f::g(1); // crate::h\n");
        let names: Vec<String> = paths.iter().map(|p| p.join("::")).collect();
        assert_eq!(names, ["a::b", "a::c::D", "e", "f::g"]);
    }

    #[test]
    fn a_circle_is_found_and_a_chain_is_not() {
        let module = |s: &str| -> Module { s.split("::").map(String::from).collect() };
        let mut edges: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
        edges.entry(module("a")).or_default().insert(module("b::c"));
        edges.entry(module("b::c")).or_default().insert(module("d"));
        edges.entry(module("d")).or_default().insert(module("a"));
        edges.entry(module("d")).or_default().insert(module("e"));
        assert_eq!(
            circles(&edges),
            vec![vec![module("a"), module("b::c"), module("d")]]
        );
        edges.get_mut(&module("d")).unwrap().remove(&module("a"));
        assert!(circles(&edges).is_empty());
    }

    #[test]
    fn the_profiler_crate_has_no_import_circle() {
        let modules = modules(&src());
        assert!(modules.len() > 20, "read {} modules", modules.len());
        let found = circles(&imports(&modules));
        let said: Vec<String> = found
            .iter()
            .map(|g| g.iter().map(|m| m.join("::")).collect::<Vec<_>>().join(" <-> "))
            .collect();
        assert!(said.is_empty(), "modules that import each other: {said:#?}");
    }

    #[test]
    fn functions_are_measured_from_their_signature_to_their_closing_brace() {
        let text = "fn a() {\n    let s = \"}\"; // }\n    let c = '{';\n}\nfn b<'x>(v: &'x str) -> &'x str { v }\ntrait T { fn c(&self); }\n";
        let found = functions(text);
        assert_eq!(
            found,
            [("a".to_string(), 1, 4), ("b".to_string(), 5, 1)],
            "braces in strings, chars and comments are not code; a body-less fn is none"
        );
        assert_eq!(
            functions("let r = r#\"fn x() {\"#; fn y() {}"),
            [("y".to_string(), 1, 1)]
        );
    }

    #[test]
    fn no_profiler_function_is_over_the_budget_unless_listed_with_its_reason() {
        let modules = modules(&src());
        let mut long = Vec::new();
        for (module, (path, text)) in &modules {
            if test_only(&modules, module) {
                continue;
            }
            let file = path.strip_prefix(src()).unwrap_or(path).display().to_string();
            for (name, line, lines) in functions(text) {
                let listed = LONG_FUNCTIONS.iter().any(|(f, n, _)| *f == file && *n == name);
                if lines > FUNCTION_BUDGET && !listed {
                    long.push(format!("{file}:{line} {name}: {lines} lines"));
                }
            }
        }
        long.sort();
        assert!(
            long.is_empty(),
            "functions over {FUNCTION_BUDGET} lines: {long:#?}"
        );
        for (file, name, reason) in LONG_FUNCTIONS {
            let text = std::fs::read_to_string(src().join(file)).unwrap_or_default();
            let lines = functions(&text)
                .into_iter()
                .find(|(n, _, _)| n == name)
                .map(|f| f.2);
            assert!(
                lines.is_some_and(|l| l > FUNCTION_BUDGET),
                "{file} {name} ({reason}) is listed as long but is {lines:?} lines"
            );
        }
    }

    #[test]
    fn xtask_has_no_import_circle() {
        let modules = modules(Path::new(env!("CARGO_MANIFEST_DIR")).join("src").as_path());
        let found = circles(&imports(&modules));
        assert!(
            found.is_empty(),
            "xtask modules that import each other: {found:?}"
        );
    }

    #[test]
    fn no_profiler_file_is_over_700_lines() {
        let long: Vec<(PathBuf, usize)> = modules(&src())
            .into_values()
            .filter_map(|(path, _)| {
                let lines = std::fs::read_to_string(&path).ok()?.lines().count();
                (lines > 700).then_some((path, lines))
            })
            .collect();
        assert!(long.is_empty(), "files over 700 lines: {long:?}");
    }
}
