//! The reader for `perf stat -x,` output, so a topdown report can be computed from counts taken
//! on another machine.

use super::tma::{Count, Counts, TmaError};

/// Read `perf stat -x,` output: `value,unit,event,run time,running %,metric,metric unit` per line
/// (a leading `CPUn` column, from -A, is accepted; counts of one event are then summed).
pub fn parse_perf_csv(text: &str) -> Result<Counts, TmaError> {
    let mut counts = Counts::default();
    let mut seen_any = false;
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut fields: Vec<&str> = line.split(',').collect();
        if fields
            .first()
            .is_some_and(|f| f.starts_with("CPU") || f.starts_with("S") && f.contains("-D"))
        {
            fields.remove(0);
        }
        let not_perf = || TmaError::NotPerfCsv {
            line: i + 1,
            text: line.chars().take(80).collect(),
        };
        if fields.len() < 5 {
            return Err(not_perf());
        }
        let event = normalize(fields[2]);
        if event.is_empty() {
            return Err(not_perf());
        }
        if fields[0].starts_with('<') {
            counts.not_counted.push(event);
            seen_any = true;
            continue;
        }
        let value: f64 = fields[0].parse().map_err(|_| not_perf())?;
        let running = match fields[4].trim() {
            "" => 1.0,
            pct => pct.parse::<f64>().map_err(|_| not_perf())? / 100.0,
        };
        let entry = counts
            .events
            .entry(event)
            .or_insert(Count { value: 0.0, running });
        entry.value += value;
        entry.running = entry.running.min(running);
        seen_any = true;
    }
    if !seen_any {
        return Err(TmaError::NotPerfCsv {
            line: 1,
            text: "no counter lines".into(),
        });
    }
    Ok(counts)
}

/// `cpu_core/topdown-retiring/u` → `topdown-retiring`; `INST_RETIRED.ANY:k` → `inst_retired.any`.
fn normalize(event: &str) -> String {
    let event = event.trim();
    let event = match (event.find('/'), event.rfind('/')) {
        (Some(a), Some(b)) if b > a => &event[a + 1..b],
        _ => event,
    };
    let event = event.split(':').next().unwrap_or(event);
    event.to_ascii_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_cpu_rows_are_summed_and_prefixes_stripped() {
        let csv = "CPU0,100,,cpu_core/cycles/,10,100.00,,\nCPU1,300,,cpu_core/cycles/,10,100.00,,\n";
        let c = parse_perf_csv(csv).unwrap();
        assert_eq!(c.events["cycles"].value, 400.0);
    }

    #[test]
    fn not_perf_csv_is_refused_with_the_line() {
        assert!(matches!(
            parse_perf_csv("hello world\n"),
            Err(TmaError::NotPerfCsv { line: 1, .. })
        ));
        assert!(matches!(
            parse_perf_csv("12,,cycles,1,abc,,\n"),
            Err(TmaError::NotPerfCsv { line: 1, .. })
        ));
        assert!(matches!(parse_perf_csv(""), Err(TmaError::NotPerfCsv { .. })));
    }
}
