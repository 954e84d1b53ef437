//! The reports of the commands on events (`stat`, `trace`, `latency`): text or JSON, the format
//! and the destination checked before anything is loaded.
use std::{
    io::{self, Write},
    path::Path,
};

use crate::{
    cli::{format_for, Format, ReportOutput},
    error::UserError,
    output,
};

/// Text, JSON or one of the command's `others`, and the output checked writable.
pub fn checked_format(
    report: &ReportOutput,
    command: &'static str,
    others: &[Format],
) -> anyhow::Result<Format> {
    let format = format_for(report.format, report.output.as_deref())?;
    if !matches!(format, Format::Text | Format::Json) && !others.contains(&format) {
        return Err(UserError::FormatUnavailable {
            format: format.name(),
            mode: command,
        }
        .into());
    }
    if let Some(path) = &report.output {
        output::check_writable(path)?;
    }
    Ok(format)
}

/// The report as JSON (its schema's version and its mode first) or as text by `text`, to `path`
/// or standard output.
pub fn write<R: serde::Serialize>(
    path: Option<&Path>,
    format: Format,
    mode: &'static str,
    report: &R,
    text: fn(&R, &mut dyn Write) -> io::Result<()>,
) -> Result<(), UserError> {
    output::write_report(path, &|out| match format {
        Format::Json => super::json::write_command_json(out, mode, report),
        _ => text(report, out),
    })
}
