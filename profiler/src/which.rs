//! Finding a program by its name as a shell would: the first executable file of that name in a
//! directory of `$PATH` (a leaf: the launcher and the probes' file lookup both ask it).
use std::path::{Path, PathBuf};

/// `program` (a bare name) on `$PATH`.
pub fn on_path(program: &Path) -> Option<PathBuf> {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(program))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}
