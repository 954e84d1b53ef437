//! `--filter` where a program judges each hit itself (sampling, `record`, `latency`, `stat
//! --by`; and `stat --by`'s number, placed as a filter's): comparisons of a
//! hit's numbers, all of which must pass, compiled into `FilterTerm`s the kernel program checks
//! before it counts the hit. A tracepoint's number fields (where its tracefs `format` puts
//! them), a probe's `arg1`..`arg6` at a function's entry and `retval` at a return, a USDT
//! probe's `arg0`.. where each site's note puts them. `stat` counts with the kernel's own
//! filter, which takes its whole language.
use profiler_common::{
    filter_op, hit_weight,
    records::{fetch, Fetch},
    values::ByField,
    FilterTerm, MAX_FILTER_TERMS,
};

use super::{language::Event, tracepoint::Field};

/// What the kernel program can judge, said when a filter asks more.
const SUBSET: &str = "where bpfprof's program judges each hit (sampling, record, latency, stat --by), a filter is up to 4 comparisons of numbers joined by && (FIELD OP NUMBER, OP one of == != < <= > >= &); `bpfprof stat --filter` without --by takes the kernel's whole filter language";

/// An event's filter as each of its sites reads it (a tracepoint has one): per site, its terms.
pub type SiteTerms = Vec<Vec<FilterTerm>>;

/// `text` for `event` (a tracepoint with `fields`, or a probe).
pub fn compile(text: &str, event: &Event, fields: &[Field]) -> Result<SiteTerms, String> {
    if text.contains("||") || text.contains(['(', ')', '"', '~']) || text.replace("!=", "").contains('!') {
        return Err(SUBSET.into());
    }
    let terms: Vec<&str> = text.split("&&").map(str::trim).collect();
    if terms.len() > MAX_FILTER_TERMS {
        return Err(SUBSET.into());
    }
    let per_term = (terms.into_iter())
        .map(|term| compile_term(term, event, fields))
        .collect::<Result<Vec<Vec<FilterTerm>>, String>>()?;
    let sites = per_term.first().map_or(0, Vec::len);
    Ok((0..sites)
        .map(|site| per_term.iter().map(|term| term[site]).collect())
        .collect())
}

/// One comparison, at each of the event's sites.
fn compile_term(text: &str, event: &Event, fields: &[Field]) -> Result<Vec<FilterTerm>, String> {
    const OPS: [(&str, u8); 7] = [
        ("==", filter_op::EQ),
        ("!=", filter_op::NE),
        ("<=", filter_op::LE),
        (">=", filter_op::GE),
        ("<", filter_op::LT),
        (">", filter_op::GT),
        ("&", filter_op::AND),
    ];
    let (name, op, number) = OPS
        .iter()
        .find_map(|(spelled, op)| {
            let (name, number) = text.split_once(spelled)?;
            Some((name.trim(), *op, number.trim()))
        })
        .ok_or_else(|| format!("`{text}`: {SUBSET}"))?;
    let (negative, magnitude) =
        kernel_number(number).ok_or_else(|| format!("`{text}`: `{number}` is not a number ({SUBSET})"))?;
    (numbers_at_sites(name, event, fields)?.into_iter())
        .map(|fetch| {
            let signed = fetch.signed != 0;
            let value = fitted(negative, magnitude, fetch.size, signed).ok_or_else(|| {
                format!(
                    "`{text}`: {number} is not a value of {name} (a {}{}-bit number)",
                    if signed { "signed " } else { "" },
                    fetch.size * 8
                )
            })?;
            Ok(FilterTerm {
                fetch,
                op,
                value,
                ..FilterTerm::default()
            })
        })
        .collect()
}

/// Where `name` is at each site of `event`: a word of the program's context (`place`), or a
/// USDT probe's argument where each site's note puts it (a register, memory, a constant).
fn numbers_at_sites(name: &str, event: &Event, fields: &[Field]) -> Result<Vec<Fetch>, String> {
    if let Some(probe) = event.probe.as_ref().filter(|p| p.is_usdt()) {
        let spec = super::fetch::parse_list(name)?.remove(0);
        let (last, sites) = (probe.sites.iter())
            .map(|s| super::usdt::split_args(s.usdt_args.as_deref().unwrap_or("")).len())
            .fold((0, 0), |(most, n), args| (most.max(args), n + 1));
        if !matches!(spec.source, super::fetch::Source::Arg(_)) || sites == 0 {
            return Err(format!(
                "{name}: a USDT probe's numbers are its arguments (arg0..arg{})",
                last.max(1) - 1
            ));
        }
        let fetched = super::fetch::resolve(std::slice::from_ref(&spec), event, fields)?.remove(0);
        if fetched.ty == super::fetch::Type::Str {
            return Err(format!("{name}: a number, not a string"));
        }
        return Ok(fetched.fetches);
    }
    let (offset, size, signed) = place(name, event, fields)?;
    let word = Fetch {
        kind: fetch::WORD,
        size,
        word: offset,
        signed: u8::from(signed),
        ..Fetch::default()
    };
    Ok(vec![word; event.probe.as_ref().map_or(1, |p| p.sites.len())])
}

/// `stat --by FIELD[:log2]` for `event`: where its number is, read as a filter reads it.
pub fn by_field(text: &str, event: &Event, fields: &[Field]) -> Result<ByField, String> {
    let (name, log2) = match text.strip_suffix(":log2") {
        Some(name) => (name, true),
        None => (text, false),
    };
    let (offset, size, signed) = place(name.trim(), event, fields)?;
    Ok(ByField {
        offset,
        size,
        signed: u8::from(signed),
        log2: u8::from(log2),
        _pad: [0; 3],
    })
}

/// A number as the kernel's filters read one: an optional `-`, then hex after `0x`, octal after
/// a leading `0`, else decimal.
fn kernel_number(text: &str) -> Option<(bool, u64)> {
    let (negative, digits) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let magnitude = match (
        digits.strip_prefix("0x").or_else(|| digits.strip_prefix("0X")),
        digits,
    ) {
        (Some(hex), _) => u64::from_str_radix(hex, 16).ok()?,
        (None, octal) if octal.len() > 1 && octal.starts_with('0') => {
            u64::from_str_radix(&octal[1..], 8).ok()?
        }
        (None, decimal) => decimal.parse().ok()?,
    };
    Some((negative, magnitude))
}

/// The number as a value of a `size`-byte field, if it is one (no negative value for an unsigned
/// field, nothing past its width), as the term compares it.
fn fitted(negative: bool, magnitude: u64, size: u8, signed: bool) -> Option<u64> {
    let bits = u32::from(size) * 8;
    let limit = |b: u32| if b >= 64 { u64::MAX } else { (1u64 << b) - 1 };
    match (signed, negative) {
        (false, true) => None,
        (false, false) => (magnitude <= limit(bits)).then_some(magnitude),
        (true, false) => (magnitude <= limit(bits - 1)).then_some(magnitude),
        (true, true) => (magnitude <= limit(bits - 1) + 1).then(|| (magnitude as i64).wrapping_neg() as u64),
    }
}

/// Where `name` is in the program's context: (offset, size, signed). A probe's register is a
/// signed 64-bit number unless typed (`retval:s32`: a function returning `int` leaves its upper
/// half clear).
pub(crate) fn place(name: &str, event: &Event, fields: &[Field]) -> Result<(u16, u8, bool), String> {
    let (name, ty) = match name.split_once(':') {
        Some((name, ty)) => (name, Some(super::fetch::parse_type(ty)?)),
        None => (name, None),
    };
    let Some(probe) = &event.probe else {
        if ty.is_some() {
            return Err(format!(
                "{name}: a tracepoint's field is compared as its format types it"
            ));
        }
        let Some(field) = fields.iter().find(|f| f.name == name) else {
            let names: Vec<String> = fields.iter().map(|f| f.name.clone()).collect();
            return Err(super::probe::ProbeError::Missing {
                what: format!("{} has no field `{name}`", event.name),
                near: super::language::nearest(name, &names),
            }
            .to_string());
        };
        if field.array || ![1, 2, 4, 8].contains(&field.size) || field.offset > 504 {
            return Err(format!(
                "{name}: not a number of the record's first 512 bytes ({SUBSET})"
            ));
        }
        return Ok((field.offset as u16, field.size as u8, field.signed));
    };
    let register = match name {
        "retval" if probe.ret => hit_weight::RETVAL,
        _ if probe.ret || !probe.entry || probe.is_usdt() => {
            return Err(format!(
                "{name}: a probe's numbers are a function's arguments at its entry (arg1..arg{}) and its return value at a return (retval)",
                hit_weight::MAX_ARG
            ))
        }
        _ => match name.strip_prefix("arg").and_then(|n| n.parse::<u32>().ok()) {
            Some(n @ 1..=hit_weight::MAX_ARG) => hit_weight::ARG0 + n,
            _ => return Err(format!("`{name}`: a probe's numbers are arg1..arg{}", hit_weight::MAX_ARG)),
        },
    };
    let offset = hit_weight::register_offset(register, cfg!(target_arch = "aarch64")).unwrap_or(0);
    let (size, signed) = match ty {
        None => (8, true),
        Some(super::fetch::Type::Signed(n)) => (n, true),
        Some(super::fetch::Type::Unsigned(n) | super::fetch::Type::Hex(n)) => (n, false),
        Some(super::fetch::Type::Str) => return Err(format!("{name}: a number, not a string")),
    };
    Ok((offset as u16, size, signed))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(name: &str, offset: u32, size: u32, signed: bool) -> Field {
        Field {
            name: name.into(),
            offset,
            size,
            array: false,
            signed,
            declared: "long".into(),
        }
    }

    fn tracepoint() -> Event {
        crate::counters::language::tracepoint_event("syscalls:sys_enter_write", Ok(0)).unwrap()
    }

    #[test]
    fn comparisons_joined_by_and_become_terms() {
        let fields = [
            field("fd", 16, 8, false),
            field("count", 32, 8, false),
            field("ret", 8, 4, true),
        ];
        let terms = compile(
            "count > 4096 && fd == 1 && ret < -1 && count & 0x10",
            &tracepoint(),
            &fields,
        )
        .unwrap()
        .remove(0);
        let ops: Vec<_> = terms
            .iter()
            .map(|t| (t.fetch.word, t.op, t.value as i64))
            .collect();
        assert_eq!(
            ops,
            [
                (32, filter_op::GT, 4096),
                (16, filter_op::EQ, 1),
                (8, filter_op::LT, -1),
                (32, filter_op::AND, 16)
            ]
        );
        assert!(
            terms[2].passes(-2i64 as u64) && !terms[2].passes(0),
            "an int -2 is below -1"
        );
        assert_eq!((terms[2].fetch.size, terms[2].fetch.signed), (4, 1));
        assert!(terms[0].passes(4097) && !terms[0].passes(4096));
        for bad in [
            "count > 1 || fd == 1",
            "(count > 1)",
            "!fd",
            "count",
            "count > x",
            "comm == \"dd\"",
        ] {
            assert!(compile(bad, &tracepoint(), &fields).is_err(), "{bad}");
        }
        // Numbers as the kernel's filters read them, and only values the field can hold.
        let value = |filter: &str| compile(filter, &tracepoint(), &fields).map(|t| t[0][0].value);
        assert_eq!(value("fd == 0644"), Ok(0o644));
        assert_eq!(value("fd == 0x10"), Ok(16));
        assert_eq!(value("ret == -2147483648"), Ok((-2147483648i64) as u64));
        for bad in [
            "fd == -1",
            "ret == 2147483648",
            "fd == --1",
            "fd == 09",
            "fd:s32 == 1",
        ] {
            assert!(compile(bad, &tracepoint(), &fields).is_err(), "{bad}");
        }
        let missing = compile("cuont > 1", &tracepoint(), &fields).unwrap_err();
        assert!(missing.contains("did you mean count"), "{missing}");
        assert!(compile(
            "fd == 1 && fd == 1 && fd == 1 && fd == 1 && fd == 1",
            &tracepoint(),
            &fields
        )
        .is_err());
    }

    /// A function returning `int` leaves -1 as 0xffffffff in its 64-bit register: `retval:s32`
    /// compares the low half, signed; untyped, the whole register.
    #[test]
    fn a_register_is_compared_as_typed() {
        let mut event = tracepoint();
        event.probe = Some(crate::counters::probe::Probe {
            target: std::ffi::CString::new("/bin/true").unwrap(),
            kernel: false,
            ret: true,
            entry: false,
            sites: vec![Default::default()],
        });
        // The kernel widens what it read as its fetch says: 0xffffffff as s32 is -1.
        let typed = compile("retval:s32 < 0", &event, &[]).unwrap().remove(0);
        assert_eq!((typed[0].fetch.size, typed[0].fetch.signed), (4, 1));
        assert!(typed[0].passes(u64::MAX));
        let whole = compile("retval < 0", &event, &[]).unwrap().remove(0);
        assert!(!whole[0].passes(0xffff_ffff) && whole[0].passes(u64::MAX));
        assert!(
            compile("arg1 > 0", &event, &[]).is_err(),
            "no argument at a return"
        );
        assert!(compile("retval:str == 1", &event, &[]).is_err());
    }

    /// A USDT probe's argument is compared where each site's note puts it, as that site sizes it.
    #[test]
    fn a_usdt_argument_is_compared_where_each_site_has_it() {
        let mut event = tracepoint();
        let site = |args: &str| crate::counters::probe::ProbeSite {
            usdt_args: Some(args.into()),
            ..Default::default()
        };
        event.probe = Some(crate::counters::probe::Probe {
            target: std::ffi::CString::new("/bin/true").unwrap(),
            kernel: false,
            ret: false,
            entry: false,
            sites: vec![site("-4@%eax 8@%rbx"), site("8@-52(%rbp) 8@%rbx")],
        });
        let sites = compile("arg0 > 5 && arg1 == 7", &event, &[]).unwrap();
        let placed: Vec<Vec<(u8, u8, u8)>> = (sites.iter())
            .map(|terms| {
                terms
                    .iter()
                    .map(|t| (t.fetch.kind, t.fetch.size, t.fetch.signed))
                    .collect()
            })
            .collect();
        assert_eq!(
            placed,
            [
                [(fetch::WORD, 4, 1), (fetch::WORD, 8, 0)],
                [(fetch::MEMORY, 8, 0), (fetch::WORD, 8, 0)]
            ]
        );
        // -1 is no value of the second site's unsigned argument.
        assert!(compile("arg0 == -1", &event, &[])
            .unwrap_err()
            .contains("not a value of arg0"));
        let refused = compile("line_value > 1", &event, &[]).unwrap_err();
        assert!(refused.contains("its arguments (arg0..arg1)"), "{refused}");
        assert!(compile("arg0:str == 1", &event, &[]).is_err());
    }
}
