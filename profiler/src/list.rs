//! `bpfprof list`: what this machine can count and sample, grouped as `perf list` groups it,
//! each marked where it cannot open here and why.
use std::io::Write;

use serde::Serialize;

use crate::{
    cli::{format_for, Format, ListArgs},
    counters::language::{cache_names, Catalog, ARM_COMMON, HARDWARE, SOFTWARE},
    error::UserError,
};

/// One name `-e` takes.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Listed {
    pub name: String,
    pub group: String,
    pub description: String,
    /// Why it cannot be opened here; none where it can.
    pub unavailable: Option<String>,
}

pub fn run(args: ListArgs) -> anyhow::Result<i32> {
    let format = format_for(args.format, None)?;
    if !matches!(format, Format::Text | Format::Json) {
        return Err(UserError::FormatUnavailable {
            format: format.name(),
            mode: "list",
        }
        .into());
    }
    if let (Some(file), Some(function)) = (&args.probes, &args.lines) {
        return lines(file, function, format);
    }
    let mut listed = match &args.probes {
        Some(file) => probe_entries(file)?,
        None => {
            let no_pmu = crate::counters::pmu::missing_reason();
            let mut listed = catalog_entries(&Catalog::here(), no_pmu.as_deref());
            listed.extend(probe_forms());
            listed.extend(tracepoints(crate::preflight::tracefs_root()));
            listed
        }
    };
    if let Some(filter) = &args.filter {
        let filter = filter.to_ascii_lowercase();
        listed.retain(|l| l.name.to_ascii_lowercase().contains(&filter) || l.group.contains(&filter));
    }
    written(format, &listed, |out| text(&listed, out))
}

/// `listed` to standard output, as JSON or by `text`; a closed pipe ends it quietly.
fn written<T: Serialize>(
    format: Format,
    listed: &T,
    text: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> anyhow::Result<i32> {
    let mut out = std::io::stdout().lock();
    let written = match format {
        Format::Json => serde_json::to_writer_pretty(&mut out, listed)
            .map_err(std::io::Error::other)
            .and_then(|()| writeln!(out)),
        _ => text(&mut out),
    };
    match written {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(0),
        other => other.map(|()| 0).map_err(Into::into),
    }
}

/// `list --probes FILE --lines FUNCTION`: the function's source, each line that has code numbered
/// (`perf probe -L`).
fn lines(file: &str, function: &str, format: Format) -> anyhow::Result<i32> {
    let (source, lines) = crate::counters::probe::function_lines(file, function)
        .map_err(|e| UserError::Usage(format!("--lines {e}")))?;
    let name = source
        .file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned();
    written(format, &lines, |out| {
        writeln!(
            out,
            "{function}, {} (probe a numbered line as uprobe:{file}:{name}:LINE):",
            source.display()
        )?;
        for line in &lines {
            let number = line
                .probe
                .as_ref()
                .map_or(String::new(), |_| line.line.to_string());
            let text = line.text.as_deref().unwrap_or("");
            writeln!(out, "{}", format!("  {number:>6}  {text}").trim_end())?;
        }
        Ok(())
    })
}

/// The generic, cache and software events, each PMU's sysfs events and Arm's architected ones.
pub fn catalog_entries(catalog: &Catalog, no_pmu: Option<&str>) -> Vec<Listed> {
    let entry = |name: &str, group: &str, description: &str, hardware: bool| Listed {
        name: name.to_string(),
        group: group.to_string(),
        description: description.to_string(),
        unavailable: hardware.then(|| no_pmu.map(String::from)).flatten(),
    };
    let mut listed: Vec<Listed> = HARDWARE
        .iter()
        .map(|(n, _, d)| entry(n, "hardware", d, true))
        .chain(cache_names().map(|n| entry(&n, "hardware cache", "a generic cache event", true)))
        .chain(SOFTWARE.iter().map(|(n, _, d)| entry(n, "software", d, false)))
        .collect();
    for pmu in catalog.pmus().iter().filter(|p| p.name != "software") {
        for name in pmu.event_names() {
            listed.push(entry(
                &format!("{}/{name}/", pmu.name),
                &format!("pmu {}", pmu.name),
                "",
                true,
            ));
        }
    }
    if catalog.arm() {
        for (name, number) in ARM_COMMON {
            let description = format!("Arm architected common event {number:#06x}");
            listed.push(entry(name, "arm common events", &description, true));
        }
    }
    listed
}

/// How probes are spelled: user probes (any function of any file: `list --probes FILE` lists
/// them), and kernel probes, unavailable where the kernel has no kprobe PMU.
fn probe_forms() -> Vec<Listed> {
    let user =
        "user probes (FILE: a path, a program or a library's name; list --probes FILE shows its functions)";
    let kernel = "kernel probes (FUNCTION: as /proc/kallsyms names it)";
    let no_kprobes = (!std::path::Path::new("/sys/bus/event_source/devices/kprobe").exists())
        .then(|| "this kernel has no kprobes (no kprobe PMU)".to_string());
    [
        (
            user,
            "uprobe:FILE:FUNCTION",
            "at the function's entry (FUNCTION+OFFSET, or 0xADDRESS)",
        ),
        (user, "uretprobe:FILE:FUNCTION", "at the function's returns"),
        (
            user,
            "usdt:FILE:PROVIDER:NAME",
            "a static probe the program was built with",
        ),
        (
            kernel,
            "kprobe:FUNCTION",
            "at a kernel function's entry (FUNCTION+OFFSET inside it)",
        ),
        (kernel, "kretprobe:FUNCTION", "at a kernel function's returns"),
    ]
    .into_iter()
    .map(|(group, name, description)| Listed {
        name: name.to_string(),
        group: group.into(),
        description: description.to_string(),
        unavailable: (group == kernel).then(|| no_kprobes.clone()).flatten(),
    })
    .collect()
}

/// The functions of `file` a user probe can name.
fn probe_entries(file: &str) -> Result<Vec<Listed>, UserError> {
    let refused = |e: crate::counters::probe::ProbeError| UserError::Usage(format!("--probes {e}"));
    let (path, functions) = crate::counters::probe::functions(file).map_err(refused)?;
    let usdt = crate::counters::probe::usdt_probes(file).map_err(refused)?;
    let entry = |(name, description): (String, String), group: &str| Listed {
        name,
        group: group.to_string(),
        description,
        unavailable: None,
    };
    let usdt_group = format!("USDT probes of {} (usdt:{file}:PROVIDER:NAME)", path.display());
    let function_group = format!("functions of {} (uprobe:{file}:FUNCTION)", path.display());
    Ok((usdt.into_iter().map(|n| entry(n, &usdt_group)))
        .chain((functions.into_iter()).map(|n| entry((n, String::new()), &function_group)))
        .collect())
}

/// The tracepoints under `tracefs/events`, by subsystem.
fn tracepoints(tracefs: &std::path::Path) -> Vec<Listed> {
    let mut listed = Vec::new();
    let mut groups: Vec<_> = std::fs::read_dir(tracefs.join("events"))
        .into_iter()
        .flatten()
        .flatten()
        .collect();
    groups.sort_by_key(|g| g.file_name());
    for group in groups.iter().filter(|g| g.path().is_dir()) {
        let system = group.file_name().to_string_lossy().into_owned();
        let mut events: Vec<String> = std::fs::read_dir(group.path())
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.path().is_dir())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        events.sort();
        for event in events {
            listed.push(Listed {
                name: format!("{system}:{event}"),
                group: format!("tracepoint {system}"),
                description: String::new(),
                unavailable: None,
            });
        }
    }
    listed
}

/// By group; a reason every entry of a group shares is said once, at its head.
fn text(listed: &[Listed], out: &mut dyn Write) -> std::io::Result<()> {
    let mut start = 0;
    while start < listed.len() {
        let group = &listed[start].group;
        let end = start + listed[start..].iter().take_while(|l| &l.group == group).count();
        let entries = &listed[start..end];
        let shared = entries[0]
            .unavailable
            .as_ref()
            .filter(|why| entries.iter().all(|l| l.unavailable.as_ref() == Some(*why)));
        // A blank line between groups, none before the first.
        let gap = if start == 0 { "" } else { "\n" };
        match shared {
            Some(why) => writeln!(out, "{gap}{group}: not here: {why}")?,
            None => writeln!(out, "{gap}{group}:")?,
        }
        for l in entries {
            let mark = match (&l.unavailable, shared) {
                (Some(why), None) => format!("  [not here: {why}]"),
                _ => String::new(),
            };
            let line = format!("  {:<40} {}{mark}", l.name, l.description);
            writeln!(out, "{}", line.trim_end())?;
        }
        start = end;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_pmu_hardware_events_say_why_and_software_ones_do_not() {
        let listed = catalog_entries(&Catalog::here(), Some("no hardware PMU"));
        let find = |name: &str| listed.iter().find(|l| l.name == name).unwrap();
        assert_eq!(find("cycles").unavailable.as_deref(), Some("no hardware PMU"));
        assert_eq!(
            find("L1-dcache-load-misses").unavailable.as_deref(),
            Some("no hardware PMU")
        );
        assert_eq!(find("page-faults").unavailable, None);
        // Everything listed parses as `-e` takes it.
        let catalog = Catalog::here();
        for l in &listed {
            catalog
                .parse(&l.name)
                .unwrap_or_else(|e| panic!("{}: {e}", l.name));
        }
    }
}
