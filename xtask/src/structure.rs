//! The user-space crate's structure, checked: no two of its modules import each other, directly
//! or round a circle (`crate::` paths in the source, tests left out), and no file is over 700
//! lines. A unit test, so the suite says when a change grows a circle back.
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
