//! Counter-level A/B: two `stat` reports (or `perf stat -x,` files), each counter's and
//! metric's change, whether it is beyond the runs' own spread, and the question behind it in one
//! line: did cycles grow because the instruction count grew or because IPC dropped
//! (cycles = instructions × CPI, so the cycles' ratio is the product of the other two), and which
//! stall class moved.
use std::{io::Write, path::Path};

use serde::Serialize;
use serde_json::Value;

use crate::{error::UserError, stat::render::grouped};

/// One side's figures: each counter and metric with its relative spread where runs give one.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CounterSide {
    pub name: String,
    pub runs: usize,
    pub counters: Vec<(String, f64, Option<f64>)>,
    pub metrics: Vec<(String, f64, Option<f64>)>,
}

/// A counters file: `stat`'s JSON, or `perf stat -x,` output. None: another kind of file (a
/// profile), for the stack diff.
pub fn read(path: &Path) -> Result<Option<CounterSide>, UserError> {
    let fail = |reason: String| UserError::SavedProfile {
        path: path.to_path_buf(),
        reason,
    };
    let bytes = crate::views::saved::read_bounded(path).map_err(fail)?;
    let name = path.display().to_string();
    if let Ok(doc) = serde_json::from_slice::<Value>(&bytes) {
        return Ok((doc["mode"] == "stat").then(|| from_stat(name, &doc)));
    }
    let text = String::from_utf8_lossy(&bytes);
    let csv_like = text
        .lines()
        .any(|l| l.split(',').count() >= 3 && !l.starts_with('#'));
    if !csv_like || bytes.starts_with(&[0x1f, 0x8b]) {
        return Ok(None);
    }
    match crate::counters::perf_csv::parse_perf_csv(&text) {
        Ok(counts) => {
            let mut counters: Vec<(String, f64, Option<f64>)> = counts
                .events
                .iter()
                .map(|(n, c)| (n.clone(), c.value, None))
                .collect();
            counters.sort_by(|a, b| a.0.cmp(&b.0));
            Ok(Some(CounterSide {
                name,
                runs: 1,
                counters,
                metrics: Vec::new(),
            }))
        }
        Err(_) => Ok(None),
    }
}

fn from_stat(name: String, doc: &Value) -> CounterSide {
    let figures = |key: &str, label: &str| -> Vec<(String, f64, Option<f64>)> {
        (doc[key].as_array().into_iter().flatten())
            .filter_map(|c| {
                Some((
                    c[label].as_str()?.to_string(),
                    c["value"].as_f64()?,
                    c["spread_pct"].as_f64(),
                ))
            })
            .collect()
    };
    CounterSide {
        name,
        runs: doc["runs"].as_u64().unwrap_or(1) as usize,
        counters: figures("counters", "event"),
        metrics: figures("metrics", "name"),
    }
}

/// One figure before and after.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Change {
    pub name: String,
    pub before: f64,
    pub after: f64,
    /// After over before, less one, in percent (`null` where before is 0).
    pub change_pct: Option<f64>,
    /// The change is more than twice the runs' combined standard error (`null`: a side has no
    /// spread, as from one run).
    pub beyond_spread: Option<bool>,
}

/// Two counter reports compared.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct CounterDiff {
    pub before: String,
    pub after: String,
    pub runs_before: usize,
    pub runs_after: usize,
    pub counters: Vec<Change>,
    pub metrics: Vec<Change>,
    /// Cycles' change as the instruction count's times CPI's, and what moved; where both sides
    /// counted cycles and instructions.
    pub answer: Option<String>,
}

type Figures = [(String, f64, Option<f64>)];

/// The figures both sides have, in the after side's order.
fn changes(before: &Figures, after: &Figures) -> Vec<Change> {
    after
        .iter()
        .filter_map(|(name, a, a_spread)| {
            let (_, b, b_spread) = before.iter().find(|(n, _, _)| n == name)?;
            let beyond_spread = match (b_spread, a_spread) {
                (Some(bs), Some(as_)) => {
                    let error = ((b * bs / 100.0).powi(2) + (a * as_ / 100.0).powi(2)).sqrt();
                    Some((a - b).abs() > 2.0 * error)
                }
                _ => None,
            };
            Some(Change {
                name: name.clone(),
                before: *b,
                after: *a,
                change_pct: (*b != 0.0).then(|| 100.0 * (a / b - 1.0)),
                beyond_spread,
            })
        })
        .collect()
}

pub fn diff(before: &CounterSide, after: &CounterSide) -> Result<CounterDiff, UserError> {
    let counters = changes(&before.counters, &after.counters);
    if counters.is_empty() {
        return Err(UserError::Usage(format!(
            "{} and {} count no event in common: nothing to compare",
            before.name, after.name
        )));
    }
    Ok(CounterDiff {
        before: before.name.clone(),
        after: after.name.clone(),
        runs_before: before.runs,
        runs_after: after.runs,
        answer: answer(&counters),
        metrics: changes(&before.metrics, &after.metrics),
        counters,
    })
}

const CYCLES: [&str; 3] = ["cycles", "cpu-cycles", "cpu_cycles"];
const INSTRUCTIONS: [&str; 2] = ["instructions", "inst_retired"];
/// Stall counts, each a share of the cycles.
const STALLS: [&str; 7] = [
    "stall_frontend",
    "stall_backend",
    "stall_backend_mem",
    "stalled-cycles-frontend",
    "stalled-cycles-backend",
    "stall_slot_frontend",
    "stall_slot_backend",
];

/// `cycles +12.00% = instructions +11.50% × CPI +0.45%: the instruction count grew; stall_backend
/// moved most (+3.10 pp of the cycles)`.
fn answer(counters: &[Change]) -> Option<String> {
    // By the event's name without its modifiers (`cpu_cycles:u`).
    let base = |c: &Change| c.name.split(':').next().unwrap_or_default().to_string();
    let find = |names: &[&str]| counters.iter().find(|c| names.contains(&base(c).as_str()));
    let (cycles, instructions) = (find(&CYCLES)?, find(&INSTRUCTIONS)?);
    if [
        cycles.before,
        cycles.after,
        instructions.before,
        instructions.after,
    ]
    .contains(&0.0)
    {
        return None;
    }
    let cycles_ratio = cycles.after / cycles.before;
    let instructions_ratio = instructions.after / instructions.before;
    let cpi_ratio = cycles_ratio / instructions_ratio;
    let pct = |ratio: f64| format!("{:+.2}%", 100.0 * (ratio - 1.0));
    let cause = match instructions_ratio.ln().abs() >= cpi_ratio.ln().abs() {
        true if instructions_ratio > 1.0 => "the instruction count grew",
        true => "the instruction count fell",
        false if cpi_ratio > 1.0 => "CPI grew (IPC dropped)",
        false => "CPI fell (IPC rose)",
    };
    let mut line = format!(
        "{} {} = {} {} × CPI {}: {cause}",
        cycles.name,
        pct(cycles_ratio),
        instructions.name,
        pct(instructions_ratio),
        pct(cpi_ratio)
    );
    let moved = (counters.iter())
        .filter(|c| STALLS.contains(&base(c).as_str()))
        .map(|c| (c, 100.0 * (c.after / cycles.after - c.before / cycles.before)))
        .max_by(|a, b| a.1.abs().total_cmp(&b.1.abs()));
    if let Some((stall, pp)) = moved.filter(|(_, pp)| pp.abs() >= 0.01) {
        line += &format!("; {} moved most ({pp:+.2} pp of the cycles)", stall.name);
    }
    Some(line)
}

pub fn text(d: &CounterDiff, out: &mut dyn Write) -> std::io::Result<()> {
    let runs = |n: usize| match n {
        1 => "1 run".to_string(),
        n => format!("{n} runs"),
    };
    writeln!(
        out,
        "bpfprof diff: counters of {} ({}) and {} ({})\n",
        d.before,
        runs(d.runs_before),
        d.after,
        runs(d.runs_after)
    )?;
    let rows = |out: &mut dyn Write, title: &str, changes: &[Change], whole: bool| -> std::io::Result<()> {
        writeln!(
            out,
            "  {title:<28} {:>18} {:>18} {:>10}  beyond the runs' spread",
            "before", "after", "change"
        )?;
        for c in changes {
            let value = |v: f64| match whole {
                true => grouped(v),
                false => format!("{v:.4}"),
            };
            let change = c
                .change_pct
                .map_or_else(|| "-".to_string(), |p| format!("{p:+.2}%"));
            let beyond = match c.beyond_spread {
                Some(true) => "yes",
                Some(false) => "no",
                None => "not known (one run)",
            };
            writeln!(
                out,
                "  {:<28} {:>18} {:>18} {change:>10}  {beyond}",
                c.name,
                value(c.before),
                value(c.after)
            )?;
        }
        Ok(())
    };
    rows(out, "counter", &d.counters, true)?;
    if !d.metrics.is_empty() {
        writeln!(out)?;
        rows(out, "metric", &d.metrics, false)?;
    }
    if let Some(answer) = &d.answer {
        writeln!(out, "\n{answer}")?;
    }
    Ok(())
}

pub fn json(d: &CounterDiff, out: &mut dyn Write) -> std::io::Result<()> {
    #[derive(Serialize)]
    struct Doc<'a> {
        format_version: u32,
        mode: &'static str,
        #[serde(flatten)]
        diff: &'a CounterDiff,
    }
    let doc = Doc {
        format_version: crate::report::json::FORMAT_VERSION,
        mode: "counter-diff",
        diff: d,
    };
    serde_json::to_writer_pretty(&mut *out, &doc).map_err(std::io::Error::other)?;
    writeln!(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn side(name: &str, runs: usize, counters: &[(&str, f64, Option<f64>)]) -> CounterSide {
        CounterSide {
            name: name.into(),
            runs,
            counters: counters.iter().map(|(n, v, s)| (n.to_string(), *v, *s)).collect(),
            metrics: Vec::new(),
        }
    }

    #[test]
    fn cycles_change_is_the_instruction_counts_times_cpis() {
        let before = side(
            "before",
            5,
            &[
                ("cpu_cycles", 1.0e9, Some(0.1)),
                ("inst_retired", 1.0e9, Some(0.1)),
                ("stall_backend", 1.0e8, Some(1.0)),
            ],
        );
        // 10% more instructions at the same IPC: 10% more cycles, stalls in proportion.
        let more_work = side(
            "after",
            5,
            &[
                ("cpu_cycles", 1.1e9, Some(0.1)),
                ("inst_retired", 1.1e9, Some(0.1)),
                ("stall_backend", 1.1e8, Some(1.0)),
            ],
        );
        let d = diff(&before, &more_work).unwrap();
        let answer = d.answer.clone().unwrap();
        println!("{answer}");
        assert_eq!(
            answer,
            "cpu_cycles +10.00% = inst_retired +10.00% × CPI +0.00%: the instruction count grew"
        );
        assert_eq!(d.counters[0].beyond_spread, Some(true));
        assert!((d.counters[0].change_pct.unwrap() - 10.0).abs() < 1e-9);
        // The same instructions in 20% more cycles: IPC dropped, and the back end stalled more.
        let slower = side(
            "after",
            5,
            &[
                ("cpu_cycles", 1.2e9, Some(0.1)),
                ("inst_retired", 1.0e9, Some(0.1)),
                ("stall_backend", 3.0e8, Some(1.0)),
            ],
        );
        let answer = diff(&before, &slower).unwrap().answer.unwrap();
        println!("{answer}");
        assert!(answer
            .starts_with("cpu_cycles +20.00% = inst_retired +0.00% × CPI +20.00%: CPI grew (IPC dropped)"));
        assert!(
            answer.ends_with("stall_backend moved most (+15.00 pp of the cycles)"),
            "{answer}"
        );
    }

    #[test]
    fn a_change_within_the_runs_spread_is_said_so_and_one_run_has_none() {
        let before = side("b", 5, &[("page-faults", 1000.0, Some(1.0))]);
        let within = side("a", 5, &[("page-faults", 1010.0, Some(1.0))]);
        assert_eq!(
            diff(&before, &within).unwrap().counters[0].beyond_spread,
            Some(false)
        );
        let one_run = side("a", 1, &[("page-faults", 1010.0, None)]);
        let d = diff(&before, &one_run).unwrap();
        assert_eq!(d.counters[0].beyond_spread, None);
        assert_eq!(d.answer, None, "no cycles, no answer");
        let mut text = Vec::new();
        super::text(&d, &mut text).unwrap();
        let text = String::from_utf8(text).unwrap();
        assert!(
            text.contains("+1.00%") && text.contains("not known (one run)"),
            "{text}"
        );
        let nothing = side("a", 1, &[("cycles", 1.0, None)]);
        assert!(diff(&before, &nothing).is_err(), "nothing in common");
    }
}
