//! What `record --fetch` reads at each hit of a probe: an argument (`arg1`..`arg6`) or the
//! return value (`retval`) from the calling convention's registers, a USDT probe's own
//! arguments (`arg0`..`arg11`, where its note says the compiler put them), or a global variable
//! of the probed file by its symbol (`line_value`); each shown as a type (`:u8`..`:u64`,
//! `:s8`..`:s64`, `:x8`..`:x64` in hex, `:str` a NUL-terminated string). A register is 64 bits
//! (`u64`), a USDT argument as its note sizes it and a global as large as its symbol unless
//! typed; a global whose size is not a number's is text.
use profiler_common::{
    hit_weight,
    records::{fetch, Fetch, MAX_FETCHES},
};
use serde_json::Value;

use super::{
    language::Event,
    probe::{Probe, ProbeSite},
    tracepoint::Field,
    usdt::{self, Location},
};

/// How a fetched value is shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Type {
    Unsigned(u8),
    Signed(u8),
    Hex(u8),
    Str,
}

/// What to fetch, as spelled: `NAME[:TYPE]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FetchSpec {
    pub name: String,
    pub source: Source,
    pub ty: Option<Type>,
}

/// What a fetch's name says it reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// `argN` as spelled: a function's `arg1`..`arg6`, a USDT probe's `arg0`..`arg11`.
    Arg(u32),
    Retval,
    /// A global variable (or, at a tracepoint, a field) by this name.
    Named,
}

/// One fetch resolved for one event: the kernel's instructions at each of its sites (one for a
/// tracepoint), and how to show what it read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fetched {
    /// As spelled (`arg1`, `line_value`): what the value is called in each record.
    pub name: String,
    pub fetches: Vec<Fetch>,
    pub ty: Type,
}

/// `--fetch arg1,arg2:str,line_value:s32`.
pub fn parse_list(text: &str) -> Result<Vec<FetchSpec>, String> {
    let specs: Vec<FetchSpec> = text
        .split(',')
        .map(str::trim)
        .map(parse_one)
        .collect::<Result<_, _>>()?;
    if specs.len() > MAX_FETCHES {
        return Err(format!("at most {MAX_FETCHES} values are fetched at a hit"));
    }
    // Each value is named in each record by its name alone.
    if let Some(twice) =
        (specs.iter().enumerate()).find(|(n, spec)| specs[..*n].iter().any(|s| s.name == spec.name))
    {
        return Err(format!(
            "`{}` is fetched twice: a record names each value once",
            twice.1.name
        ));
    }
    Ok(specs)
}

fn parse_one(text: &str) -> Result<FetchSpec, String> {
    let (name, ty) = match text.split_once(':') {
        Some((name, ty)) => (name, Some(parse_type(ty)?)),
        None => (text, None),
    };
    let arg = (name.strip_prefix("arg"))
        .filter(|n| n.len() <= 2 && n.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|n| n.parse::<u32>().ok())
        .filter(|n| *n < usdt::MAX_ARGS as u32);
    let is_symbol = !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.');
    let source = match (name, arg) {
        ("retval", _) => Source::Retval,
        (_, Some(n)) => Source::Arg(n),
        _ if is_symbol && !name.starts_with("arg") => Source::Named,
        _ => {
            let (last, usdt_last) = (hit_weight::MAX_ARG, usdt::MAX_ARGS - 1);
            let what =
                format!("arg1..arg{last} (a USDT probe's arg0..arg{usdt_last}), retval, a tracepoint's field or a global's name");
            return Err(format!("`{name}`: a value read at a hit is {what}"));
        }
    };
    Ok(FetchSpec {
        name: name.to_string(),
        source,
        ty,
    })
}

pub(crate) fn parse_type(text: &str) -> Result<Type, String> {
    let bits = |digits: &str| match digits {
        "8" => Some(1),
        "16" => Some(2),
        "32" => Some(4),
        "64" => Some(8),
        _ => None,
    };
    let ty = match text {
        "str" | "string" => Some(Type::Str),
        _ => (text.strip_prefix('u').and_then(bits).map(Type::Unsigned))
            .or_else(|| text.strip_prefix('s').and_then(bits).map(Type::Signed))
            .or_else(|| text.strip_prefix('x').and_then(bits).map(Type::Hex)),
    };
    ty.ok_or_else(|| format!("`:{text}`: a type is u8..u64, s8..s64, x8..x64 (hex) or str"))
}

/// `specs` for `event`. At a probe: registers where it fires at a function's entry (arguments)
/// or return (`retval`); a USDT site's own arguments where its note puts them; globals where it
/// fires in the file that has them (a user probe's entry, line or USDT site: at a return the
/// program is in the caller's code). At a tracepoint (its `fields`): the string a pointer field
/// points at (`filename:str`); its numbers are in its record.
///
/// A probe's sites may place an argument differently (and globals lie at a different distance
/// from each): each site reads its own places. A value whose sites size it differently shows as
/// 64 bits, each widened by its site.
pub fn resolve(specs: &[FetchSpec], event: &Event, fields: &[Field]) -> Result<Vec<Fetched>, String> {
    let Some(probe) = &event.probe else {
        return specs.iter().map(|spec| pointed_string(spec, fields)).collect();
    };
    let per_site = (probe.sites.iter())
        .map(|site| (specs.iter()).map(|spec| at_site(spec, probe, site)).collect())
        .collect::<Result<Vec<Vec<(Fetch, Type)>>, String>>()?;
    let shown = |n: usize| {
        let mut types = per_site.iter().map(|fetches| fetches[n].1);
        let first = types.next().unwrap_or(Type::Unsigned(8));
        match types.all(|ty| ty == first) {
            true => first,
            false if per_site.iter().any(|f| matches!(f[n].1, Type::Signed(_))) => Type::Signed(8),
            false => Type::Unsigned(8),
        }
    };
    (specs.iter().enumerate())
        .map(|(n, spec)| {
            let fetches = (per_site.iter())
                .map(|fetches| sized(fetches[n].0, spec.ty.unwrap_or(fetches[n].1), spec))
                .collect::<Result<_, _>>()?;
            Ok(Fetched {
                name: spec.name.clone(),
                fetches,
                ty: spec.ty.unwrap_or_else(|| shown(n)),
            })
        })
        .collect()
}

/// One spec at one site of a probe: what the kernel reads there, and its natural type.
fn at_site(spec: &FetchSpec, probe: &Probe, site: &ProbeSite) -> Result<(Fetch, Type), String> {
    match (spec.source, &site.usdt_args) {
        (Source::Named, _) => global(spec, probe, site),
        (Source::Arg(n), Some(args)) => {
            let arg = usdt::parse_arg_at(args, n as usize, cfg!(target_arch = "aarch64"))
                .map_err(|e| format!("{}: {e}", spec.name))?;
            usdt_arg(&arg, probe, site)
        }
        (_, Some(_)) => Err(format!(
            "{}: a USDT probe has its own arguments (arg0..), no return",
            spec.name
        )),
        (_, None) => register(spec, probe, cfg!(target_arch = "aarch64")),
    }
}

/// A fetch read as `ty`: a number of its size, widened by its sign, or a string.
fn sized(fetch: Fetch, ty: Type, spec: &FetchSpec) -> Result<Fetch, String> {
    let (size, signed) = match ty {
        Type::Str if fetch.kind == fetch::CONSTANT => {
            return Err(format!("{}: a constant is not a string's address", spec.name))
        }
        Type::Str => (0, false),
        Type::Signed(n) => (n, true),
        Type::Unsigned(n) | Type::Hex(n) => (n, false),
    };
    Ok(Fetch {
        size,
        signed: u8::from(signed),
        ..fetch
    })
}

/// A function's argument at its entry, or its return value at a return: a register.
fn register(spec: &FetchSpec, probe: &Probe, aarch64: bool) -> Result<(Fetch, Type), String> {
    let register = match spec.source {
        Source::Retval if !probe.ret => return Err("retval is a uretprobe's or kretprobe's".into()),
        Source::Retval => hit_weight::RETVAL,
        Source::Arg(_) if probe.ret => {
            return Err(format!(
                "{}: at a return the argument registers hold whatever the function left in them",
                spec.name
            ))
        }
        Source::Arg(_) if !probe.entry => {
            return Err(format!(
                "{}: arguments are in their registers at a function's entry only: probe the function itself (not an offset, an address or a source line)",
                spec.name
            ))
        }
        Source::Arg(n @ 1..=hit_weight::MAX_ARG) => hit_weight::ARG0 + n,
        _ => {
            return Err(format!(
                "{}: a function's arguments are arg1..arg{}",
                spec.name,
                hit_weight::MAX_ARG
            ))
        }
    };
    let offset = hit_weight::register_offset(register, aarch64).unwrap_or(0);
    let fetch = Fetch {
        kind: fetch::WORD,
        word: offset as u16,
        ..Fetch::default()
    };
    Ok((fetch, Type::Unsigned(8)))
}

/// A global of the probed file, at a user probe that fires in its code.
fn global(spec: &FetchSpec, probe: &Probe, site: &ProbeSite) -> Result<(Fetch, Type), String> {
    if probe.kernel || probe.ret {
        return Err(format!(
            "{}: a global is fetched at a user probe's entry or line, in the file it is in",
            spec.name
        ));
    }
    let (delta, size) = super::probe::global_from(probe, site, &spec.name).map_err(|e| e.to_string())?;
    let natural = match size {
        1 | 2 | 4 | 8 => Type::Signed(size as u8),
        _ => Type::Str,
    };
    let fetch = Fetch {
        kind: fetch::GLOBAL,
        delta,
        ..Fetch::default()
    };
    Ok((fetch, natural))
}

/// A USDT probe's argument `n`, where its note says it is; typed as the note sizes it.
fn usdt_arg(arg: &usdt::Arg, probe: &Probe, site: &ProbeSite) -> Result<(Fetch, Type), String> {
    let word = |offset: u16| Fetch {
        word: offset,
        ..Fetch::default()
    };
    let fetch = match &arg.at {
        Location::Register(at) => Fetch {
            kind: fetch::WORD,
            ..word(*at)
        },
        Location::Memory { base, offset } => Fetch {
            kind: fetch::MEMORY,
            delta: *offset,
            ..word(*base)
        },
        Location::Constant(value) => Fetch {
            kind: fetch::CONSTANT,
            delta: *value,
            ..Fetch::default()
        },
        // x86-64's `counter(%rip)`: at the probed instruction's address (the hit's `ip`) plus
        // the global's distance from it.
        Location::Global { symbol, offset } => {
            let (delta, _) = super::probe::global_from(probe, site, symbol).map_err(|e| e.to_string())?;
            Fetch {
                kind: fetch::MEMORY,
                delta: delta.wrapping_add(*offset),
                ..word(usdt::X86_64_IP)
            }
        }
    };
    let natural = match arg.signed {
        true => Type::Signed(arg.size),
        false => Type::Unsigned(arg.size),
    };
    Ok((fetch, natural))
}

/// `spec` as one number read at each hit of `event` (what a sample weighs): a tracepoint's
/// number field, as its record holds it, or what `resolve` reads at a probe; a fetch for each of
/// the probe's sites.
pub fn number(spec: &FetchSpec, event: &Event, fields: &[Field]) -> Result<Vec<Fetch>, String> {
    if !event.is_traced() {
        return Err("only a tracepoint's or a probe's samples weigh a number read at the hit".into());
    }
    if spec.ty == Some(Type::Str) {
        return Err(format!("{}: a number is asked, not text", spec.name));
    }
    if event.probe.is_some() {
        let fetched = resolve(std::slice::from_ref(spec), event, fields)?;
        return match fetched.first() {
            Some(fetched) if fetched.ty != Type::Str => Ok(fetched.fetches.clone()),
            _ => Err(format!("{}: a number is asked, not text", spec.name)),
        };
    }
    let numeric = |f: &&Field| {
        matches!(f.size, 1 | 2 | 4 | 8) && !f.is_text() && !f.is_dynamic() && !f.array && f.offset + 8 <= 512
    };
    let refused = || {
        let names: Vec<&str> = (fields.iter().filter(numeric))
            .map(|f| f.name.as_str())
            .filter(|name| !name.starts_with("common_"))
            .collect();
        format!(
            "{}: a tracepoint's numbers are its number fields ({})",
            spec.name,
            names.join(", ")
        )
    };
    if spec.source != Source::Named {
        return Err(refused());
    }
    let field = field_named(spec, fields)?;
    if !numeric(&field) {
        return Err(refused());
    }
    let natural = match field.signed {
        true => Type::Signed(field.size as u8),
        false => Type::Unsigned(field.size as u8),
    };
    let word = Fetch {
        kind: fetch::WORD,
        word: field.offset as u16,
        ..Fetch::default()
    };
    Ok(vec![sized(word, spec.ty.unwrap_or(natural), spec)?])
}

/// The tracepoint field `spec` names; a missing one names the nearest.
fn field_named<'a>(spec: &FetchSpec, fields: &'a [Field]) -> Result<&'a Field, String> {
    fields.iter().find(|f| f.name == spec.name).ok_or_else(|| {
        let names: Vec<String> = fields.iter().map(|f| f.name.clone()).collect();
        super::probe::ProbeError::Missing {
            what: format!("no field `{}`", spec.name),
            near: super::language::nearest(&spec.name, &names),
        }
        .to_string()
    })
}

/// A tracepoint's pointer field, fetched as the string it points at in user memory.
fn pointed_string(spec: &FetchSpec, fields: &[Field]) -> Result<Fetched, String> {
    let field = field_named(spec, fields)?;
    if field.offset + 8 > 512 {
        return Err(format!(
            "{}: past the record's first 512 bytes, where fetches read",
            spec.name
        ));
    }
    if !field.declared.contains('*') || field.size != 8 || spec.ty != Some(Type::Str) {
        return Err(format!(
            "{}: a tracepoint's fields are in its record already; what a pointer field (`const char * filename`) points at is fetched as NAME:str",
            spec.name
        ));
    }
    Ok(Fetched {
        name: spec.name.clone(),
        fetches: vec![Fetch {
            kind: fetch::WORD,
            word: field.offset as u16,
            ..Fetch::default()
        }],
        ty: Type::Str,
    })
}

impl Type {
    /// What was read (`value`, or the string's bytes up to their NUL) as this type shows it.
    pub fn show(self, value: u64, string: &[u8]) -> Value {
        let bits = |n: u8| u32::from(n) * 8;
        match self {
            Type::Str => {
                let end = string.iter().position(|&b| b == 0).unwrap_or(string.len());
                Value::String(String::from_utf8_lossy(&string[..end]).into_owned())
            }
            Type::Unsigned(n) => Value::from(truncate(value, bits(n))),
            Type::Hex(n) => Value::String(format!("{:#x}", truncate(value, bits(n)))),
            Type::Signed(n) => {
                let shift = 64 - bits(n);
                Value::from(((value << shift) as i64) >> shift)
            }
        }
    }
}

fn truncate(value: u64, bits: u32) -> u64 {
    match bits {
        64 => value,
        bits => value & ((1 << bits) - 1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fetches_are_registers_or_globals_each_typed() {
        let specs = parse_list("arg1,arg2:str,retval:s32,line_value:x16").unwrap();
        assert_eq!(specs[0].source, Source::Arg(1));
        assert_eq!(specs[1].ty, Some(Type::Str));
        assert_eq!(specs[2].source, Source::Retval);
        assert_eq!(
            (specs[3].source, specs[3].ty),
            (Source::Named, Some(Type::Hex(2)))
        );
        assert_eq!(parse_list("arg0,arg11").unwrap()[1].source, Source::Arg(11));
        for bad in [
            "arg12",
            "arg01x",
            "args",
            "x:u12",
            "x:ü8",
            "x:",
            "1abc",
            "a b",
            "arg1,arg2,arg3,arg4,arg5",
            "retval,retval:u32",
        ] {
            assert!(parse_list(bad).is_err(), "{bad}");
        }
    }

    /// Each site reads an argument where its own note puts it; one sized differently shows as
    /// 64 bits, each site widening its own as its note sizes it.
    #[test]
    fn each_site_reads_its_own_places() {
        let mut event = crate::counters::language::Catalog::here()
            .parse("page-faults")
            .unwrap();
        let site = |args: &str| ProbeSite {
            usdt_args: Some(args.into()),
            ..ProbeSite::default()
        };
        event.probe = Some(Probe {
            target: std::ffi::CString::new("/bin/true").unwrap(),
            kernel: false,
            ret: false,
            entry: false,
            sites: vec![site("-4@%eax 8@%rbx"), site("8@-52(%rbp) 8@%rbx")],
        });
        let fetched = resolve(&parse_list("arg0,arg1").unwrap(), &event, &[]).unwrap();
        assert_eq!(
            (fetched[0].ty, fetched[1].ty),
            (Type::Signed(8), Type::Unsigned(8))
        );
        let arg0: Vec<(u8, u8, u8)> = fetched[0]
            .fetches
            .iter()
            .map(|f| (f.kind, f.size, f.signed))
            .collect();
        assert_eq!(arg0, [(fetch::WORD, 4, 1), (fetch::MEMORY, 8, 0)]);
        assert_eq!(fetched[1].fetches[0], fetched[1].fetches[1]);
        // Typed, every site reads it as the type says.
        let typed = resolve(&parse_list("arg0:s32").unwrap(), &event, &[]).unwrap();
        assert!(typed[0].fetches.iter().all(|f| (f.size, f.signed) == (4, 1)));
    }

    #[test]
    fn values_show_as_their_type() {
        assert_eq!(Type::Signed(4).show(0xffff_fffe, b""), Value::from(-2));
        assert_eq!(Type::Signed(8).show(u64::MAX, b""), Value::from(-1));
        assert_eq!(Type::Unsigned(1).show(0x1ff, b""), Value::from(0xff));
        assert_eq!(
            Type::Hex(8).show(0x3ff9affe000, b""),
            Value::from("0x3ff9affe000")
        );
        assert_eq!(Type::Str.show(0, b"step\0junk"), Value::from("step"));
    }
}
