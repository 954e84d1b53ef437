//! Where the names of stripped binaries are looked for: flags shared by every command that
//! symbolizes (a run, `top`, `report`, the agent).
use std::path::PathBuf;

use clap::Args;

use crate::error::UserError;

#[derive(Clone, Debug, Default, Args)]
pub struct NamesArgs {
    /// Look for debug files here, before /usr/lib/debug (repeatable): DIR/.build-id/xx/rest.debug,
    /// the file a binary's .gnu_debuglink names, or any ELF file under DIR with the binary's
    /// build id (a folder of unstripped builds).
    #[arg(long = "debug-dir", value_name = "DIR")]
    pub debug_dirs: Vec<PathBuf>,
    /// Fetch debug files by build id from this debuginfod server (repeatable, tried in order;
    /// replaces DEBUGINFOD_URLS). Kept in $BPFPROF_CACHE/debuginfod (2 GiB at most). http://
    /// only, unless bpfprof was built with https.
    #[arg(long = "debuginfod", value_name = "URL")]
    pub debuginfod: Vec<String>,
}

impl NamesArgs {
    /// The directories, each checked to be one.
    pub fn checked_dirs(&self) -> Result<Vec<PathBuf>, UserError> {
        for dir in &self.debug_dirs {
            if !dir.is_dir() {
                return Err(UserError::Usage(format!(
                    "--debug-dir {}: not a directory (give a directory of debug files)",
                    dir.display()
                )));
            }
        }
        Ok(self.debug_dirs.clone())
    }

    /// The debuginfod client's setup (`--debuginfod`, else `DEBUGINFOD_URLS`), checked;
    /// `None` when no server is given.
    pub fn debuginfod(&self) -> Result<Option<crate::symbolize::debuginfod::Config>, UserError> {
        crate::symbolize::debuginfod::Config::from_env(&self.debuginfod)
    }
}
