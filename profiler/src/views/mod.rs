//! Views on profiles beyond one report: comparing two saved runs (`diff`), and where inside a
//! function its time went (`annotate`).
pub mod annotate;
pub mod diff;
pub mod saved;

use crate::{
    cli::{format_for, DiffArgs, Format, ReportArgs},
    error::UserError,
    output, report,
};

/// `bpfprof diff BEFORE AFTER`.
pub fn run_diff(args: DiffArgs) -> anyhow::Result<i32> {
    let format = format_for(args.format, args.output.as_deref())?;
    if !matches!(format, Format::Text | Format::Svg | Format::Folded | Format::Json) {
        return Err(UserError::Usage(format!(
            "diff writes text, svg, folded or json, not {}",
            format.name()
        ))
        .into());
    }
    output::check_destination(format, args.output.as_deref())?;
    if let Some(code) = counter_diff(&args, format)? {
        return Ok(code);
    }
    let before = saved::load(&args.before)?;
    let after = saved::load(&args.after)?;
    let names = (
        args.before.display().to_string(),
        args.after.display().to_string(),
    );
    let compared = diff::diff((&names.0, &before), (&names.1, &after))?;
    let how = diff::Rendering {
        format,
        limit: args.limit,
        before_widths: args.widths == crate::cli::Widths::Before,
    };
    output::write_report(args.output.as_deref(), &|out| diff::render(&compared, how, out))?;
    if let Some(path) = &args.output {
        eprintln!("bpfprof: wrote {}", path.display());
    }
    Ok(0)
}

/// Two counter reports (`stat`'s JSON, `perf stat -x,`): their counters compared; none when
/// they are profiles.
fn counter_diff(args: &DiffArgs, format: Format) -> anyhow::Result<Option<i32>> {
    use diff::counters;
    let (before, after) = (counters::read(&args.before)?, counters::read(&args.after)?);
    let (before, after) = match (before, after) {
        (Some(before), Some(after)) => (before, after),
        (None, None) => return Ok(None),
        _ => {
            return Err(UserError::Usage(
                "diff compares two profiles, or two counter reports (bpfprof stat -o x.json, perf stat -x,): not one of each"
                    .into(),
            )
            .into())
        }
    };
    let compared = counters::diff(&before, &after)?;
    output::write_report(args.output.as_deref(), &|out| match format {
        Format::Json => counters::json(&compared, out),
        _ => counters::text(&compared, out),
    })?;
    Ok(Some(0))
}

/// `bpfprof report PROFILE [--annotate FUNCTION]`.
pub fn run_report(args: ReportArgs) -> anyhow::Result<i32> {
    let format = format_for(args.format, args.output.as_deref())?;
    if args.annotate.is_some() && format != Format::Text {
        return Err(UserError::Usage("--annotate writes text".into()).into());
    }
    if format == Format::Heatmap {
        return Err(
            UserError::Usage("a saved profile has no run-queue waits to draw as a heatmap".into()).into(),
        );
    }
    output::check_destination(format, args.output.as_deref())?;
    let mut profile = saved::load_saved(&args.input)?;
    // Frames left unnamed at the run, named now if their debug files are here (the --debug-dir
    // dirs, /usr/lib/debug) or at a debuginfod server (waited for, a bounded time).
    let debuginfod = crate::symbolize::debuginfod::Debuginfod::shared(args.names.debuginfod()?.as_ref())?;
    let fetcher = debuginfod.map(|d| d as std::sync::Arc<dyn crate::symbolize::debug_files::Fetcher>);
    profile.name_later(&crate::symbolize::DebugLocator::new(
        args.names.checked_dirs()?,
        fetcher,
    ));
    match &args.annotate {
        Some(function) => {
            let annotation = annotate::annotate(&profile.into_stacks(), function)?;
            output::write_report(args.output.as_deref(), &|out| {
                annotate::render(&annotation, ANNOTATE_LINES, out)
            })?;
        }
        None if profile.is_bare_time_stacks() && matches!(format, Format::Text | Format::Json) => {
            return Err(UserError::Usage(format!(
                "this {} profile holds its stacks only (pprof and folded keep no more): render them with -o FILE.svg, .folded or .pb.gz; a run saved with -o FILE.json gives its {} report again",
                profile.mode(),
                profile.mode()
            ))
            .into());
        }
        None => {
            let renderer = report::renderer(format);
            output::write_report(args.output.as_deref(), &|out| profile.render(&*renderer, out))?;
        }
    }
    if let Some(path) = &args.output {
        eprintln!("bpfprof: wrote {}", path.display());
    }
    Ok(0)
}

/// Source lines an annotation lists.
pub const ANNOTATE_LINES: usize = 15;
