//! Names in the text reports: function names short enough for a column of a table (C++ and Rust
//! names with their template arguments and argument lists are too long to line up; JSON, pprof
//! and folded keep the full names), and a stack's frame as a line.
use crate::symbolize::Frame;

/// `name` without template arguments (`std::vector<…>::push_back`), argument lists or a function
/// template's return type, cut to `width` characters with `…` where it was cut. Operators
/// (`operator<<`, `operator()`), `(anonymous namespace)`, lambdas (`{lambda(int)#1}`) and Rust's
/// `<T as Trait>::f` stay as they read.
pub(crate) fn short_name(name: &str, width: usize) -> String {
    let short = without_arguments(name);
    // Only a demangled signature (something was dropped) has a return type to drop.
    let short = match short == name {
        true => &short,
        false => without_return_type(&short),
    };
    super::cut(short, width)
}

/// A function's name in a stack (its file and line follow it).
const STACK_NAME_WIDTH: usize = 80;

/// A frame of a stack as a line: its function (shortened), then where it is.
pub(super) fn describe(frame: &Frame) -> String {
    let mut s = short_name(&frame.function, STACK_NAME_WIDTH);
    if frame.inlined {
        s.push_str(" (inlined)");
    }
    match (&frame.file, frame.line) {
        (Some(file), Some(line)) => s.push_str(&format!("  {}:{line}", short_module(file))),
        // Not named: where it is, in the file's own addresses where known (what objdump shows).
        _ if frame.is_unknown() => {
            let vaddr = frame.object.as_ref().and_then(|o| o.vaddr);
            s.push_str(&format!(
                "  {} {:#x}",
                short_module(&frame.module),
                vaddr.unwrap_or(frame.address)
            ))
        }
        // A module that is no file (`[jit]`) is bracketed already.
        _ if frame.module.starts_with('[') => s.push_str(&format!("  {}", frame.module)),
        _ if !frame.module.is_empty() => s.push_str(&format!("  [{}]", short_module(&frame.module))),
        _ => {}
    }
    s
}

/// Samples whose leaf frame has no name: (placed in a function by its file's unwind table,
/// neither named nor placed).
pub(crate) fn unnamed_leaves(stacks: &[crate::model::Stack]) -> (u64, u64) {
    let mut counts = (0u64, 0u64);
    for stack in stacks {
        match stack.frames.last() {
            Some(leaf) if leaf.is_unplaced() => counts.1 = counts.1.saturating_add(stack.count),
            Some(leaf) if leaf.is_unknown() => counts.0 = counts.0.saturating_add(stack.count),
            _ => {}
        }
    }
    counts
}

/// What the report says of its unnamed leaves, if it has any.
pub(crate) fn unnamed_leaves_note(stacks: &[crate::model::Stack], samples: u64) -> Option<String> {
    let (placed, unplaced) = unnamed_leaves(stacks);
    if placed + unplaced == 0 {
        return None;
    }
    Some(format!(
        "{} of {samples} samples ({:.1}%) end in code without a name: {placed} placed in a function by its file's unwind table (module+0x<start>), {unplaced} ({:.1}%) neither named nor placed",
        placed + unplaced,
        super::percent(placed + unplaced, samples),
        super::percent(unplaced, samples),
    ))
}

/// A path's file name.
pub(crate) fn short_module(module: &str) -> &str {
    module.rsplit('/').next().unwrap_or(module)
}

/// The C++ operators that can follow `operator`, longest first so that `<<=` is not read as `<`.
const OPERATORS: &[&str] = &[
    "<=>", "<<=", ">>=", "->*", "()", "[]", "<<", ">>", "<=", ">=", "->", "==", "!=", "&&", "||", "++", "--",
    "+=", "-=", "*=", "/=", "%=", "&=", "|=", "^=", "<", ">", "+", "-", "*", "/", "%", "^", "&", "|", "~",
    "!", "=", ",",
];

/// Qualifiers that may follow a member function's argument list; dropped with it.
const QUALIFIERS: &[&str] = &[" const", " volatile", " &&", " &", " noexcept"];

fn without_arguments(name: &str) -> String {
    let chars: Vec<char> = name.chars().collect();
    let mut out = String::with_capacity(name.len());
    // Where the last `operator…` token ended in `out`: a `<` after it (and a space) opens
    // template arguments, as in `std::operator<< <std::char_traits<char> >`.
    let mut operator_end = None;
    // Open `{…}` (lambdas, closures) and Rust `<T as Trait>` paths: parentheses inside them
    // are part of the name, not an argument list.
    let (mut braces, mut paths) = (0usize, 0usize);
    let mut i = 0;
    while i < chars.len() {
        if let Some(len) = operator_at(&chars, i) {
            out.extend(&chars[i..i + len]);
            operator_end = Some(out.len());
            i += len;
            continue;
        }
        let after_name = follows_name(&out) || operator_end == Some(out.trim_end().len());
        match chars[i] {
            '-' if chars.get(i + 1) == Some(&'>') => {
                out.push_str("->");
                i += 2;
                continue;
            }
            '<' if after_name => {
                out.push_str("<…>");
                i = group_end(&chars, i);
                continue;
            }
            '(' if after_name && braces == 0 && paths == 0 => {
                i = qualifiers_end(&chars, group_end(&chars, i));
                continue;
            }
            '{' => braces += 1,
            '}' => braces = braces.saturating_sub(1),
            '<' => paths += 1,
            '>' => paths = paths.saturating_sub(1),
            _ => {}
        }
        out.push(chars[i]);
        i += 1;
    }
    out
}

/// A function template's name without the return type the demangler writes before it
/// (`unsigned int std::__to_chars_len<…>`): from the last space outside brackets before any
/// `operator`, unless a `[clone .cold]` follows it, and only when a qualified name is left.
fn without_return_type(name: &str) -> &str {
    let end = name.find("operator").unwrap_or(name.len());
    let (mut depth, mut previous, mut start) = (0i32, ' ', 0);
    for (i, c) in name[..end].char_indices() {
        match c {
            '(' | '[' | '{' | '<' => depth += 1,
            ')' | ']' | '}' => depth -= 1,
            '>' if previous != '-' => depth -= 1,
            ' ' if depth == 0 && !name[i + 1..].starts_with('[') => start = i + 1,
            _ => {}
        }
        previous = c;
    }
    let rest = &name[start..];
    match rest.contains("::") || rest.contains("<…>") {
        true => rest,
        false => name,
    }
}

/// Whether what came before ends a name, so that `<` or `(` after it opens its template or
/// argument list (not a Rust `<T as Trait>` path or `(anonymous namespace)`).
fn follows_name(out: &str) -> bool {
    out.chars()
        .next_back()
        .is_some_and(|c| c.is_alphanumeric() || matches!(c, '_' | '>' | ']' | ')' | '$'))
}

fn is_word(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The length of an `operator` token at `i` (`operator<<`, `operator()`), if one starts there.
fn operator_at(chars: &[char], i: usize) -> Option<usize> {
    const WORD: [char; 8] = ['o', 'p', 'e', 'r', 'a', 't', 'o', 'r'];
    if !chars[i..].starts_with(&WORD) || i > 0 && is_word(chars[i - 1]) {
        return None;
    }
    let rest = &chars[i + WORD.len()..];
    OPERATORS
        .iter()
        .find(|op| rest.iter().copied().take(op.len()).eq(op.chars()))
        .map(|op| WORD.len() + op.len())
}

/// The index just past the group (`<…>` or `(…)`) opening at `start`, or the end of the name
/// when it never closes. `->` closes nothing; angle brackets inside parentheses are not counted.
fn group_end(chars: &[char], start: usize) -> usize {
    let (mut angles, mut parens) = (0usize, 0usize);
    let angle_group = chars[start] == '<';
    let mut i = start;
    while i < chars.len() {
        match chars[i] {
            '-' if chars.get(i + 1) == Some(&'>') => i += 1,
            '(' => parens += 1,
            ')' => parens = parens.saturating_sub(1),
            '<' if parens == 0 => angles += 1,
            '>' if parens == 0 => angles = angles.saturating_sub(1),
            _ => {}
        }
        i += 1;
        let closed = match angle_group {
            true => angles == 0 && parens == 0,
            false => parens == 0,
        };
        if closed {
            return i;
        }
    }
    chars.len()
}

/// Past any ` const`, ` &` … after an argument list at `i`.
fn qualifiers_end(chars: &[char], mut i: usize) -> usize {
    'next: loop {
        for q in QUALIFIERS {
            let len = q.chars().count();
            let matches = chars[i..].iter().copied().take(len).eq(q.chars());
            let word_ends = chars.get(i + len).is_none_or(|&c| !is_word(c));
            if matches && word_ends {
                i += len;
                continue 'next;
            }
        }
        return i;
    }
}

#[cfg(test)]
mod tests {
    use super::short_name;

    fn short(name: &str) -> String {
        short_name(name, 200)
    }

    #[test]
    fn template_arguments_and_argument_lists_are_dropped() {
        let cases = [
            (
                "std::vector<int, std::allocator<int> >::push_back(int const&)",
                "std::vector<…>::push_back",
            ),
            (
                "std::vector<int, std::allocator<int>>::push_back",
                "std::vector<…>::push_back",
            ),
            (
                "std::_Hashtable<std::pair<int const, std::map<int, std::less<int>>>, \
                 std::hash<int>>::_M_find_before_node(unsigned long, int const&, unsigned long) const",
                "std::_Hashtable<…>::_M_find_before_node",
            ),
            ("Foo::bar() const &", "Foo::bar"),
            ("foo(int) [clone .cold]", "foo [clone .cold]"),
            ("plain_c_function", "plain_c_function"),
            ("[unknown]", "[unknown]"),
        ];
        for (name, want) in cases {
            assert_eq!(short(name), want, "{name}");
        }
    }

    #[test]
    fn function_templates_lose_their_return_type() {
        let cases = [
            (
                "unsigned int std::__detail::__to_chars_len<unsigned int>(unsigned int, int)",
                "std::__detail::__to_chars_len<…>",
            ),
            (
                "void std::vector<int, std::allocator<int> >::_M_realloc_insert<int const&>(int const&)",
                "std::vector<…>::_M_realloc_insert<…>",
            ),
            (
                "void* Pool<int>::operator new(unsigned long)",
                "Pool<…>::operator new",
            ),
            (
                "Pool<int>::operator unsigned int() const",
                "Pool<…>::operator unsigned int",
            ),
            ("void foo<int>(int) [clone .cold]", "foo<…> [clone .cold]"),
            (
                "std::pair<int, int> (anonymous namespace)::make<int>()",
                "(anonymous namespace)::make<…>",
            ),
            // Not demangled signatures: left as they are.
            (
                "LazyCompile:*render app.js:10:5",
                "LazyCompile:*render app.js:10:5",
            ),
            ("[lost user stack: collision]", "[lost user stack: collision]"),
        ];
        for (name, want) in cases {
            assert_eq!(short(name), want, "{name}");
        }
    }

    #[test]
    fn operators_stay_whole() {
        let cases = [
            ("bool operator< <Key>(Key const&, Key const&)", "operator< <…>"),
            ("Point::operator<(Point const&) const", "Point::operator<"),
            ("Big::operator<=(Big const&)", "Big::operator<="),
            ("Big::operator<=>(Big const&)", "Big::operator<=>"),
            (
                "std::basic_ostream<char, std::char_traits<char> >& std::operator<< <std::char_traits<char> >\
                 (std::basic_ostream<char, std::char_traits<char> >&, char const*)",
                "std::operator<< <…>",
            ),
            ("Matrix::operator>>(int)", "Matrix::operator>>"),
            ("Callback::operator()(int) const", "Callback::operator()"),
            ("Iter::operator->() const", "Iter::operator->"),
            ("Vec::operator[](unsigned long)", "Vec::operator[]"),
            ("my_operator<int>(int)", "my_operator<…>"),
        ];
        for (name, want) in cases {
            assert_eq!(short(name), want, "{name}");
        }
    }

    #[test]
    fn anonymous_namespaces_lambdas_and_rust_paths_stay_readable() {
        let cases = [
            ("(anonymous namespace)::worker(int)", "(anonymous namespace)::worker"),
            ("ns::(anonymous namespace)::Pool<int>::run()", "ns::(anonymous namespace)::Pool<…>::run"),
            (
                "main::{lambda(int)#1}::operator()(int) const",
                "main::{lambda(int)#1}::operator()",
            ),
            (
                "run(std::vector<int, std::allocator<int> >&)::{lambda(std::vector<int, std::allocator<int> > const&)#2}::operator()",
                "run::{lambda(std::vector<…> const&)#2}::operator()",
            ),
            ("<T as core::fmt::Debug>::fmt", "<T as core::fmt::Debug>::fmt"),
            (
                "<alloc::vec::Vec<T,A> as core::ops::drop::Drop>::drop",
                "<alloc::vec::Vec<…> as core::ops::drop::Drop>::drop",
            ),
            (
                "<F as core::ops::function::FnOnce<(u32,)>>::call_once",
                "<F as core::ops::function::FnOnce<…>>::call_once",
            ),
            ("core::ptr::drop_in_place<std::thread::Packet<()>>", "core::ptr::drop_in_place<…>"),
            ("std::thread::spawn::{{closure}}", "std::thread::spawn::{{closure}}"),
            ("<fn() -> u32 as Task>::run", "<fn() -> u32 as Task>::run"),
            ("main.(*Server).handle", "main.(*Server).handle"),
        ];
        for (name, want) in cases {
            assert_eq!(short(name), want, "{name}");
        }
    }

    #[test]
    fn what_is_still_too_long_is_cut_to_the_width() {
        let name = "very::long::namespace::path::to::some::deeply::nested::function_name<int>(int)";
        let cut = short_name(name, 30);
        assert_eq!(cut.chars().count(), 30);
        assert!(
            cut.starts_with("very::long::namespace") && cut.ends_with('…'),
            "{cut}"
        );
        assert_eq!(short_name("short<int>", 30), "short<…>");
    }

    #[test]
    fn broken_names_give_an_answer() {
        for name in [
            "foo<int", "foo(", "operator", "a<<<", ")))", ">>", "x->", "<", "{lambda(", "é<ü>",
        ] {
            assert!(short(name).chars().count() <= name.chars().count() + 2, "{name}");
        }
        assert_eq!(short("foo<int"), "foo<…>");
        assert_eq!(short("é<ü>::ß()"), "é<…>::ß");
    }
}
