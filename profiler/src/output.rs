//! Where the report goes. A file is written next to its destination and renamed into place, so a
//! failed write never leaves half a report; a broken pipe on stdout is not an error.
use std::{
    fs::File,
    io::{self, BufWriter, Write},
    path::{Path, PathBuf},
};

use crate::error::UserError;

/// Fail before profiling, not after, when the report could not be written.
pub fn check_writable(path: &Path) -> Result<(), UserError> {
    let err = |reason: String| UserError::Output {
        path: path.to_path_buf(),
        reason,
    };
    if path.is_dir() {
        return Err(err("it is a directory".into()));
    }
    let probe = temp_path(path);
    File::create(&probe).map_err(|e| err(e.to_string()))?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

fn temp_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.bpfprof-{}", std::process::id()))
}

/// Write the report with `render`. On a file error the report is saved in the temp directory
/// instead, and the error names that place.
pub fn write_report(
    path: Option<&Path>,
    render: &dyn Fn(&mut dyn Write) -> io::Result<()>,
) -> Result<(), UserError> {
    let Some(path) = path else {
        let stdout = io::stdout();
        let mut out = BufWriter::new(stdout.lock());
        return match render(&mut out).and_then(|()| out.flush()) {
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
            Err(e) => Err(UserError::Output {
                path: "standard output".into(),
                reason: e.to_string(),
            }),
            Ok(()) => Ok(()),
        };
    };
    match write_atomically(path, render) {
        Ok(()) => Ok(()),
        Err(e) => {
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let fallback = std::env::temp_dir().join(format!("bpfprof-{}-{name}", std::process::id()));
            let saved = match write_atomically(&fallback, render) {
                Ok(()) => format!("; the report was saved to {} instead", fallback.display()),
                Err(_) => String::new(),
            };
            Err(UserError::Output {
                path: path.to_path_buf(),
                reason: format!("{e}{saved}"),
            })
        }
    }
}

/// Write `path` whole or not at all: into a temporary file beside it, synced, then renamed.
pub fn write_atomically(path: &Path, render: &dyn Fn(&mut dyn Write) -> io::Result<()>) -> io::Result<()> {
    let temp = temp_path(path);
    let result = (|| {
        let mut out = BufWriter::new(File::create(&temp)?);
        render(&mut out)?;
        out.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        std::fs::rename(&temp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_whole_file_or_says_why() {
        let dir = std::env::temp_dir().join(format!("bpfprof-output-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let target = dir.join("r.txt");
        assert!(check_writable(&target).is_ok());
        write_report(Some(&target), &|w| w.write_all(b"hello")).unwrap();
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "hello");
        assert!(matches!(check_writable(&dir), Err(UserError::Output { .. })));
        let missing = dir.join("no/such/dir/r.txt");
        let err = check_writable(&missing).unwrap_err().to_string();
        assert!(err.contains("cannot write the report"), "{err}");
        let failed = write_report(Some(&missing), &|w| w.write_all(b"kept"))
            .unwrap_err()
            .to_string();
        assert!(failed.contains("saved to"), "{failed}");
        let fallback = std::env::temp_dir().join(format!("bpfprof-{}-r.txt", std::process::id()));
        assert_eq!(std::fs::read_to_string(&fallback).unwrap(), "kept");
        std::fs::remove_file(&fallback).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
