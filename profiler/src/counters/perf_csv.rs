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

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    /// `perf stat -x, -e ...` on a Graviton (Neoverse N1), Arm's event names as perf lists them.
    const GRAVITON_CSV: &str = "\
3000000000,,cpu_cycles,1000000000,100.00,,
4500000000,,inst_retired,1000000000,100.00,1.50,insn per cycle
600000000,,stall_backend,1000000000,100.00,,
300000000,,stall_frontend,1000000000,100.00,,
50000000,,br_retired,1000000000,50.00,,
1000000,,br_mis_pred_retired,1000000000,50.00,,
2000000000,,l1d_cache,1000000000,50.00,,
40000000,,l1d_cache_refill,1000000000,50.00,,
40000000,,l2d_cache,1000000000,50.00,,
10000000,,l2d_cache_refill,1000000000,50.00,,
8000000,,ll_cache_rd,1000000000,50.00,,
2000000,,ll_cache_miss_rd,1000000000,50.00,,
1000000000,,l1d_tlb,1000000000,50.00,,
3000000,,dtlb_walk,1000000000,50.00,,
";

    #[test]
    fn arm_event_names_give_arms_derived_metrics() {
        let c = parse_perf_csv(GRAVITON_CSV).unwrap();
        let tma = crate::counters::tma::derived_only(&c);
        assert!(close(tma.ipc.unwrap(), 1.5));
        let metric = |name: &str| {
            tma.metrics
                .iter()
                .find(|(n, _)| n == name)
                .unwrap_or_else(|| panic!("{name} in {:?}", tma.metrics))
                .1
        };
        // Worked by hand from the counts above.
        assert!(close(metric("frontend_stall_cycles"), 0.10));
        assert!(close(metric("backend_stall_cycles"), 0.20));
        assert!(close(metric("branch_mispredict_rate"), 0.02));
        assert!(close(metric("l1d_miss_rate"), 0.02));
        assert!(close(metric("l2_miss_rate"), 0.25));
        assert!(close(metric("llc_miss_rate"), 0.25));
        assert!(close(metric("dtlb_walk_rate"), 0.003));
        // No l1i_tlb / itlb_walk counted: no iTLB figure rather than a made-up one.
        assert!(tma.metrics.iter().all(|(n, _)| n != "itlb_walk_rate"));
        assert_eq!(crate::counters::tma::assess("dtlb_walk_rate", 0.003), "ok");
    }
}
