//! What a plan allows tracing events (tracepoints, probes) to do: sampled at their hits, not
//! read as counters; weighed by any number read at a hit, filtered on their fields, registers or
//! USDT arguments; timed from one to another (`latency`) by keys both have.
use std::path::Path;

use profiler_common::latency::LatencyKeys;

use crate::{
    cli::{Cli, Mode},
    counters::language::{Catalog, Event, Group},
    error::UserError,
};

/// A counter read at each sample is a PMU's or the kernel's count; a tracing event's hits are
/// counted by `stat`, or sampled with `-e`.
pub(super) fn not_traced(event: &Event, flag: &str) -> Result<(), UserError> {
    match event.is_traced() {
        true => Err(UserError::Usage(format!(
            "{flag} {0}: a tracepoint or probe is not read at samples: `bpfprof stat -e {0}` counts it, `-e {0}` samples its hits",
            event.spelled()
        ))),
        false => Ok(()),
    }
}

/// `--weight`: what each sample of a tracing event counts, read at each hit as `record
/// --fetch` reads it (each probe site its own way).
pub(super) fn hit_weight(
    events: &[Event],
    weight: Option<&crate::counters::fetch::FetchSpec>,
) -> Result<Option<crate::sources::samples::Weighed>, UserError> {
    let Some(spec) = weight else {
        return Ok(None);
    };
    let fetches = (events.iter())
        .map(|event| {
            let fields = tracepoint_fields(event);
            crate::counters::fetch::number(spec, event, &fields)
                .map_err(|why| UserError::Usage(format!("--weight with -e {}: {why}", event.spelled())))
        })
        .collect::<Result<_, _>>()?;
    Ok(Some(crate::sources::samples::Weighed {
        name: spec.name.clone(),
        fetches,
    }))
}

/// `--filter` when sampling or recording: each event's terms, judged by its program at each hit.
pub(super) fn hit_filters(
    events: &[Event],
    filter: Option<&str>,
) -> Result<Vec<crate::counters::filter::SiteTerms>, UserError> {
    let Some(filter) = filter else {
        return Ok(Vec::new());
    };
    events
        .iter()
        .map(|event| match event.is_traced() {
            false => Err(UserError::Usage(format!(
                "--filter with -e {}: only tracepoints and probes are filtered at their hits",
                event.spelled()
            ))),
            true => crate::counters::filter::compile(filter, event, &tracepoint_fields(event))
                .map_err(|why| UserError::Usage(format!("--filter with -e {}: {why}", event.spelled()))),
        })
        .collect()
}

/// Tracing events (tracepoints, probes) are sampled every Nth hit, in hotspot mode, and not
/// beside events sampled at a frequency or a period of their own (one rate per run).
pub(super) fn traced_events_fit(events: &[Event], cli: &Cli) -> Result<(), UserError> {
    let traced = events.iter().filter(|e| e.is_traced()).count();
    if traced == 0 {
        return Ok(());
    }
    let spelled = Event::spelled_list(events, ",");
    if traced < events.len() {
        return Err(UserError::Usage(format!(
            "-e {spelled}: tracepoints and probes are sampled at their hits, other events at a rate: sample them in separate runs"
        )));
    }
    if cli.frequency.is_some() {
        return Err(UserError::Usage(format!(
            "-e {spelled}: a tracepoint or probe is sampled at its hits, not at a frequency: -c N samples every Nth hit (every hit without it)"
        )));
    }
    if cli.mode != Mode::Hotspot {
        return Err(UserError::Usage(format!(
            "-e {spelled}: tracepoints and probes are sampled in --mode hotspot"
        )));
    }
    if !cli.counters_events.is_empty() {
        return Err(UserError::Usage(
            "--counter is read at CPU samples, not at tracepoint or probe hits".into(),
        ));
    }
    hit_period_fits(cli.period)
}

/// `-c N` of tracing events: at most what their programs' cookies hold.
pub(super) fn hit_period_fits(period: Option<u64>) -> Result<(), UserError> {
    use profiler_common::MAX_HIT_PERIOD;
    match period {
        Some(n) if n > MAX_HIT_PERIOD => Err(UserError::Usage(format!(
            "-c {n}: a tracepoint or probe is sampled at most every {MAX_HIT_PERIOD} hits"
        ))),
        _ => Ok(()),
    }
}

/// `stat --by FIELD[:log2]`: each tracing event of the groups (at most `MAX_SAMPLING_EVENTS`),
/// with where its number is; a tracepoint's `--filter` judged by the counting program too (the
/// kernel's own filter does not apply to programs), so its values add up to its count.
pub(super) fn by_values(
    groups: &[Group],
    by: &str,
    filter: Option<&str>,
) -> Result<crate::sources::values::Spec, UserError> {
    use profiler_common::MAX_SAMPLING_EVENTS;
    let events: Vec<Event> = (groups.iter().flat_map(|g| g.events.iter()))
        .filter(|e| e.is_traced())
        .cloned()
        .collect();
    if events.is_empty() {
        return Err(UserError::Usage(
            "--by counts a tracepoint's or probe's hits per value, and -e names none".into(),
        ));
    }
    if events.len() > MAX_SAMPLING_EVENTS {
        return Err(UserError::Usage(format!(
            "--by: at most {MAX_SAMPLING_EVENTS} tracepoints or probes, and -e names {} (per system call: -e raw_syscalls:sys_enter --by id)",
            events.len()
        )));
    }
    let fields = (events.iter())
        .map(|event| {
            crate::counters::filter::by_field(by, event, &tracepoint_fields(event))
                .map_err(|why| UserError::Usage(format!("--by with -e {}: {why}", event.spelled())))
        })
        .collect::<Result<_, _>>()?;
    let filters = (events.iter())
        .map(|event| match (filter, event.is_tracepoint()) {
            (Some(filter), true) => {
                crate::counters::filter::compile(filter, event, &tracepoint_fields(event))
                    .map_err(|why| UserError::Usage(format!("--filter with --by: {why}")))
            }
            _ => Ok(Vec::new()),
        })
        .collect::<Result<_, _>>()?;
    Ok(crate::sources::values::Spec {
        events,
        fields,
        filters,
    })
}

/// `stat --filter`: on every tracepoint of the groups, each checked to name only its fields.
pub(super) fn filter_tracepoints(groups: &mut [Group], filter: &str) -> Result<(), UserError> {
    use crate::counters::tracepoint;
    let tracefs = tracepoint::tracefs_root();
    let tracepoints = groups
        .iter_mut()
        .flat_map(|g| g.events.iter_mut())
        .filter(|e| e.is_tracepoint());
    let mut filtered = 0;
    for event in tracepoints {
        let fields = tracepoint::fields(tracefs, &event.name);
        if let Some(name) = tracepoint::unknown_field(filter, &fields) {
            return Err(no_field("--filter", &event.name, name, &fields));
        }
        event.filter = Some(filter.to_string());
        filtered += 1;
    }
    match filtered {
        0 => Err(UserError::Usage(
            "--filter applies to tracepoints, and -e names none".into(),
        )),
        _ => Ok(()),
    }
}

/// `OPTION: TRACEPOINT has no field `NAME` (did you mean ...?); its fields: ...`.
pub(super) fn no_field(option: &str, tracepoint: &str, name: &str, fields: &[String]) -> UserError {
    let near = match crate::counters::language::nearest(name, fields).first() {
        Some(near) => format!(" (did you mean {near}?)"),
        None => String::new(),
    };
    UserError::Usage(format!(
        "{option}: {tracepoint} has no field `{name}`{near}; its fields: {}",
        fields.join(", ")
    ))
}

/// `latency --from`/`--to`: a tracing event (a tracepoint or a probe), whose program runs at its
/// every hit.
pub(super) fn traced_event(catalog: &Catalog, option: &str, text: &str) -> Result<Event, UserError> {
    let event = catalog.parse(text)?;
    match event.is_traced() {
        true => Ok(event),
        false => Err(UserError::Usage(format!(
            "{option} {text}: not a tracepoint or a probe (latency is timed from one hit of a tracing event to another; `bpfprof list` shows them)"
        ))),
    }
}

/// A tracepoint's fields, as its tracefs format lays them out (none for a probe).
pub(super) fn tracepoint_fields(event: &Event) -> Vec<crate::counters::tracepoint::Field> {
    use crate::counters::tracepoint;
    match event.is_tracepoint() {
        true => tracepoint::layout(tracepoint::tracefs_root(), &event.name),
        false => Vec::new(),
    }
}

/// Each side's key: the thread, or one or two numbers both events have (a tracepoint's fields,
/// read where its tracefs format says; a probe's arguments or return value, in its registers),
/// each of the same size and signedness on both. `FROM=TO` names a number each side calls
/// differently (`retval=arg1`: what the start returned, the end's first argument).
pub(super) fn latency_keys(
    tracefs: &Path,
    sides: [&Event; 2],
    key: &str,
) -> Result<(LatencyKeys, String), UserError> {
    if matches!(key, "thread" | "tid") {
        return Ok((LatencyKeys::default(), "thread".into()));
    }
    let names: Vec<&str> = key.split(',').map(str::trim).collect();
    let pairs: Vec<[&str; 2]> = (names.iter())
        .map(|name| match name.split_once('=') {
            Some((from, to)) => [from.trim(), to.trim()],
            None => [*name; 2],
        })
        .collect();
    if names.len() > 2 || pairs.iter().flatten().any(|n| n.is_empty()) {
        return Err(UserError::Usage(format!(
            "--key {key}: `thread`, or one or two fields both events have: tracepoints' numbers (`dev,sector`), probes' arguments (`arg1`) or return value (`retval`); FROM=TO where the sides name it differently (`retval=arg1`)"
        )));
    }
    let mut keys = LatencyKeys::default();
    let mut first: Vec<(u8, bool)> = Vec::new();
    for (side, event) in sides.into_iter().enumerate() {
        let fields = match event.is_tracepoint() {
            true => crate::counters::tracepoint::layout(tracefs, &event.name),
            false => Vec::new(),
        };
        for (i, pair) in pairs.iter().enumerate() {
            let name = pair[side];
            let (offset, size, signed) =
                crate::counters::filter::place(name, event, &fields).map_err(|why| {
                    // A tracepoint's message names it; a probe's does not.
                    UserError::Usage(match event.probe.is_some() {
                        true => format!("--key with {}: {why}, or key it by thread", event.spelled()),
                        false => format!("--key: {why}"),
                    })
                })?;
            match first.get(i) {
                Some(&other) if other != (size, signed) => {
                    return Err(UserError::Usage(format!(
                        "--key: `{name}` is {} on {} and {} on {}: the two would never be equal",
                        number_kind(other),
                        sides[0].spelled(),
                        number_kind((size, signed)),
                        event.spelled()
                    )));
                }
                Some(_) => {}
                None => first.push((size, signed)),
            }
            keys.sides[side].offsets[i] = u32::from(offset);
            keys.sides[side].sizes[i] = u32::from(size);
            keys.sides[side].signed |= u32::from(signed) << i;
        }
        keys.sides[side].fields = names.len() as u32;
    }
    Ok((keys, names.join(",")))
}

/// `a signed 4-byte number`, `an unsigned 8-byte number`.
pub(super) fn number_kind((size, signed): (u8, bool)) -> String {
    let sign = if signed { "a signed" } else { "an unsigned" };
    format!("{sign} {size}-byte number")
}
