//! One build id's download: each server in turn (`404` → the next), the body into a part file in
//! the cache within the size bound and the file's deadline, kept only if it is an ELF file with
//! the build id asked for.
use std::{
    io::{self, Read as _},
    path::PathBuf,
    time::{Duration, Instant},
};

use super::{cache::Cache, Config};

pub(super) enum Failure {
    /// Every server answered 404.
    NotFound,
    /// Some server failed otherwise (what each said).
    Error(String),
}

/// The HTTP client of the fetch thread: status codes as answers, connect and stall timeouts.
pub(super) fn agent(config: &Config) -> ureq::Agent {
    // A redirect is followed only from https to https (within a few hops); plain http is not
    // redirected at all.
    let https = config.urls.iter().all(|u| u.starts_with("https://"));
    let builder = ureq::Agent::config_builder()
        .max_redirects(if https { 3 } else { 0 })
        .https_only(https)
        .http_status_as_error(false)
        .timeout_connect(Some(config.connect_timeout))
        .timeout_per_read(Some(config.stall_timeout))
        .user_agent(concat!("bpfprof/", env!("CARGO_PKG_VERSION")));
    crate::agent::credentials::http_agent(builder, config.roots.as_ref())
}

/// The build id's debug file from the first server that has it, kept in the cache: its path
/// and size. All servers together get `config.max_time`.
pub(super) fn fetch(
    agent: &ureq::Agent,
    config: &Config,
    cache: &Cache,
    build_id: &[u8],
    hex: &str,
) -> Result<(PathBuf, u64), Failure> {
    let deadline = super::later(config.max_time);
    let mut errors = Vec::new();
    for url in &config.urls {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            errors.push(format!(
                "{url}: not asked, the {:?} per file had passed",
                config.max_time
            ));
            continue;
        }
        let started = Instant::now();
        match download(agent, config, cache, url, (build_id, hex), left) {
            Ok(found) => return Ok(found),
            Err(Failure::NotFound) => {}
            Err(Failure::Error(why)) => errors.push(format!(
                "{url}: {why} (after {:.1} s)",
                started.elapsed().as_secs_f64()
            )),
        }
    }
    match errors.is_empty() {
        true => Err(Failure::NotFound),
        false => Err(Failure::Error(errors.join("; "))),
    }
}

fn download(
    agent: &ureq::Agent,
    config: &Config,
    cache: &Cache,
    url: &str,
    (build_id, hex): (&[u8], &str),
    left: Duration,
) -> Result<(PathBuf, u64), Failure> {
    let error = |what: &str, e: &dyn std::fmt::Display| Failure::Error(format!("{what}: {e}"));
    let response = agent
        .get(format!("{url}/buildid/{hex}/debuginfo"))
        .config()
        .timeout_global(Some(left))
        .build()
        .call()
        .map_err(|e| error("request", &e))?;
    match response.status().as_u16() {
        200 => {}
        404 => return Err(Failure::NotFound),
        status => return Err(Failure::Error(format!("HTTP status {status}"))),
    }
    let limit = config.max_size.min(config.cache_max);
    let announced = response.body().content_length();
    if announced.is_some_and(|n| n > limit) {
        return Err(too_large(limit));
    }
    let mut part = cache.part().map_err(|e| error("cache", &e))?;
    let mut body = response.into_body().into_reader().take(limit.saturating_add(1));
    let bytes = io::copy(&mut body, part.as_file_mut()).map_err(|e| error("download", &e))?;
    if bytes > limit {
        return Err(too_large(limit));
    }
    match crate::process::build_id_bytes(part.as_file()) {
        Some(id) if id == build_id => {}
        Some(id) => {
            let got = super::hex(&id);
            return Err(Failure::Error(format!(
                "served a file with build id {got}, not {hex}: not kept"
            )));
        }
        None => {
            return Err(Failure::Error(
                "served a file that is not ELF with a build id: not kept".into(),
            ))
        }
    }
    let path = cache.keep(part, hex).map_err(|e| error("cache", &e))?;
    Ok((path, bytes))
}

fn too_large(limit: u64) -> Failure {
    Failure::Error(format!(
        "larger than {limit} bytes (DEBUGINFOD_MAXSIZE and the cache's size bound): not kept"
    ))
}
