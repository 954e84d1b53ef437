//! `--filter` where a program judges each hit itself (sampling and `record`): comparisons of a
//! hit's numbers, all of which must pass, compiled into `FilterTerm`s the kernel program checks
//! before it counts the hit. A tracepoint's number fields (where its tracefs `format` puts
//! them), a probe's `arg1`..`arg6` at a function's entry and `retval` at a return. `stat`
//! counts with the kernel's own filter, which takes its whole language.
use profiler_common::{filter_op, hit_weight, FilterTerm, MAX_FILTER_TERMS};

use super::{language::Event, tracepoint::Field};

/// What the kernel program can judge, said when a filter asks more.
const SUBSET: &str = "when sampling or recording, a filter is up to 4 comparisons of numbers joined by && (FIELD OP NUMBER, OP one of == != < <= > >= &); `bpfprof stat --filter` takes the kernel's whole filter language";

/// `text` for `event` (a tracepoint with `fields`, or a probe).
pub fn compile(text: &str, event: &Event, fields: &[Field]) -> Result<Vec<FilterTerm>, String> {
    if text.contains("||") || text.contains(['(', ')', '"', '~']) || text.replace("!=", "").contains('!') {
        return Err(SUBSET.into());
    }
    let terms: Vec<&str> = text.split("&&").map(str::trim).collect();
    if terms.len() > MAX_FILTER_TERMS {
        return Err(SUBSET.into());
    }
    terms
        .into_iter()
        .map(|term| compile_term(term, event, fields))
        .collect()
}

fn compile_term(text: &str, event: &Event, fields: &[Field]) -> Result<FilterTerm, String> {
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
    let value = super::cpu::parse_number(number.trim_start_matches('-'))
        .map(|n| {
            if number.starts_with('-') {
                n.wrapping_neg()
            } else {
                n
            }
        })
        .ok_or_else(|| format!("`{text}`: `{number}` is not a number ({SUBSET})"))?;
    let (offset, size, signed) = place(name, event, fields)?;
    Ok(FilterTerm {
        offset,
        size,
        signed: u8::from(signed),
        op,
        value,
        ..FilterTerm::default()
    })
}

/// Where `name` is in the program's context: (offset, size, signed).
fn place(name: &str, event: &Event, fields: &[Field]) -> Result<(u16, u8, bool), String> {
    let Some(probe) = &event.probe else {
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
        _ if probe.ret || !probe.entry || probe.usdt_args.is_some() => {
            return Err(format!(
                "{name}: a probe is filtered on a function's arguments at its entry (arg1..arg{}) or on its return value at a return (retval)",
                hit_weight::MAX_ARG
            ))
        }
        _ => match name.strip_prefix("arg").and_then(|n| n.parse::<u32>().ok()) {
            Some(n @ 1..=hit_weight::MAX_ARG) => hit_weight::ARG0 + n,
            _ => return Err(format!("`{name}`: filter on arg1..arg{}", hit_weight::MAX_ARG)),
        },
    };
    let offset = hit_weight::register_offset(register, cfg!(target_arch = "aarch64")).unwrap_or(0);
    Ok((offset as u16, 8, true))
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
        .unwrap();
        let ops: Vec<_> = terms.iter().map(|t| (t.offset, t.op, t.value as i64)).collect();
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
            terms[2].passes(0xffff_fffe) && !terms[2].passes(0),
            "an int -2 is below -1"
        );
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
        let missing = compile("cuont > 1", &tracepoint(), &fields).unwrap_err();
        assert!(missing.contains("did you mean count"), "{missing}");
        assert!(compile(
            "fd == 1 && fd == 1 && fd == 1 && fd == 1 && fd == 1",
            &tracepoint(),
            &fields
        )
        .is_err());
    }
}
