//! What a push or an export carries besides its body: credentials, read from files at start (never
//! taken on the command line, where `ps` shows them to every user), and with the `https` feature
//! the roots a server's certificate is checked against.
use std::path::Path;

use base64::Engine as _;

use crate::error::UserError;

/// Header lines sent with every push or export, e.g. `Authorization: Bearer …`.
pub type Headers = Vec<(String, String)>;

/// The roots an https push or export checks its server against (nothing without the feature).
#[cfg(feature = "https")]
pub type Roots = std::sync::Arc<Vec<ureq::tls::Certificate<'static>>>;
#[cfg(not(feature = "https"))]
pub type Roots = ();

/// An HTTP client that checks https servers against `roots` (the system's, or `--push-ca`),
/// from a configuration otherwise complete.
pub(crate) fn http_agent(
    builder: ureq::config::ConfigBuilder<ureq::typestate::AgentScope>,
    roots: Option<&Roots>,
) -> ureq::Agent {
    #[cfg(feature = "https")]
    let builder = match roots {
        Some(roots) => builder.tls_config(
            ureq::tls::TlsConfig::builder()
                .provider(ureq::tls::TlsProvider::Rustls)
                .root_certs(ureq::tls::RootCerts::Specific(roots.clone()))
                .build(),
        ),
        None => builder,
    };
    #[cfg(not(feature = "https"))]
    let _ = roots;
    builder.build().into()
}

/// What every push and export of the agent sends with its body, and trusts.
#[derive(Clone, Debug, Default)]
pub struct Credentials {
    pub headers: Headers,
    /// Read once at start when some URL is https.
    pub roots: Option<Roots>,
}

impl Credentials {
    /// From the agent's flags, for these destination URLs: every file is read now, so a missing
    /// or malformed one stops the agent at start rather than failing every push later.
    pub fn read(
        header_file: Option<&Path>,
        basic_auth: Option<&Path>,
        ca: Option<&Path>,
        urls: &[&str],
    ) -> Result<Credentials, UserError> {
        let mut headers = match header_file {
            Some(path) => self::header_file(path)?,
            None => Headers::new(),
        };
        if let Some(path) = basic_auth {
            headers.push(basic_auth_file(path)?);
        }
        let https = urls.iter().any(|u| u.starts_with("https://"));
        let roots = match (https, ca) {
            (true, _) => Some(load_roots(ca)?),
            (false, Some(path)) => {
                return Err(UserError::Usage(format!(
                    "--push-ca {}: only for https:// URLs",
                    path.display()
                )))
            }
            (false, None) => None,
        };
        Ok(Credentials { headers, roots })
    }
}

#[cfg(not(feature = "https"))]
fn load_roots(_ca: Option<&Path>) -> Result<Roots, UserError> {
    Err(UserError::Usage(WITHOUT_HTTPS.into()))
}

#[cfg(feature = "https")]
fn load_roots(ca: Option<&Path>) -> Result<Roots, UserError> {
    tls_roots(ca).map(std::sync::Arc::new)
}

const WITHOUT_HTTPS: &str = "this bpfprof was built without https (`cargo xtask build --https`, or `cargo build --release --features https`, adds it); or send through a local TLS proxy";

/// Where the system keeps its trusted roots: Debian and Ubuntu, Fedora and RHEL, Alpine and others.
#[cfg(feature = "https")]
const SYSTEM_ROOTS: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
];

fn read(flag: &str, path: &Path) -> Result<String, UserError> {
    std::fs::read_to_string(path).map_err(|e| UserError::Usage(format!("{flag} {}: {e}", path.display())))
}

/// `--push-header-file`: one `Name: value` per line; blank lines and `#` comments are skipped.
pub fn header_file(path: &Path) -> Result<Headers, UserError> {
    parse_headers(&read("--push-header-file", path)?)
        .map_err(|why| UserError::Usage(format!("--push-header-file {}: {why}", path.display())))
}

fn parse_headers(text: &str) -> Result<Headers, String> {
    let mut headers = Headers::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let valid_name = |name: &str| {
            !name.is_empty()
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_".contains(&b))
        };
        match line.split_once(':') {
            Some((name, value)) if valid_name(name.trim()) && !value.trim().is_empty() => {
                headers.push((name.trim().to_string(), value.trim().to_string()))
            }
            // The line itself is not repeated: it may hold a secret.
            _ => return Err(format!("line {} is not `Name: value`", n + 1)),
        }
    }
    Ok(headers)
}

/// `--push-basic-auth-file`: `user:password` on its first line, sent as HTTP basic auth.
pub fn basic_auth_file(path: &Path) -> Result<(String, String), UserError> {
    let text = read("--push-basic-auth-file", path)?;
    basic_auth(&text).ok_or_else(|| {
        UserError::Usage(format!(
            "--push-basic-auth-file {}: the first line must be `user:password`",
            path.display()
        ))
    })
}

fn basic_auth(text: &str) -> Option<(String, String)> {
    let line = text.lines().next()?.trim_end_matches('\r');
    line.split_once(':').filter(|(user, _)| !user.is_empty())?;
    let encoded = base64::engine::general_purpose::STANDARD.encode(line);
    Some(("Authorization".to_string(), format!("Basic {encoded}")))
}

/// A push or export URL this build can send to: http always, https with the `https` feature.
pub fn check_scheme(flag: &str, url: &str) -> Result<(), UserError> {
    let https = url.starts_with("https://");
    if !https && !url.starts_with("http://") {
        return Err(UserError::Usage(format!(
            "{flag} {url}: give an http:// or https:// URL"
        )));
    }
    if https && !cfg!(feature = "https") {
        return Err(UserError::Usage(format!("{flag} {url}: {WITHOUT_HTTPS}")));
    }
    Ok(())
}

/// The roots a server's certificate is checked against: `--push-ca` if given, else the
/// system's bundle (so a company's own CA, installed the distribution's way, is trusted).
#[cfg(feature = "https")]
fn tls_roots(ca: Option<&Path>) -> Result<Vec<ureq::tls::Certificate<'static>>, UserError> {
    let path = match ca {
        Some(path) => path.to_path_buf(),
        None => std::env::var_os("SSL_CERT_FILE")
            .map(std::path::PathBuf::from)
            .or_else(|| {
                SYSTEM_ROOTS
                    .iter()
                    .map(std::path::PathBuf::from)
                    .find(|p| p.is_file())
            })
            .ok_or_else(|| {
                UserError::Usage(format!(
                    "https: no trusted roots found (looked in {}): give a PEM file with --push-ca",
                    SYSTEM_ROOTS.join(", ")
                ))
            })?,
    };
    let pem =
        std::fs::read(&path).map_err(|e| UserError::Usage(format!("--push-ca {}: {e}", path.display())))?;
    let roots: Vec<_> = ureq::tls::parse_pem(&pem)
        .filter_map(|item| match item {
            Ok(ureq::tls::PemItem::Certificate(cert)) => Some(cert),
            _ => None,
        })
        .collect();
    if roots.is_empty() {
        return Err(UserError::Usage(format!(
            "--push-ca {}: no PEM certificate in it",
            path.display()
        )));
    }
    Ok(roots)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_lines_are_read_and_a_bad_one_is_refused_without_echoing_it() {
        let headers =
            parse_headers("# tenant\nX-Scope-OrgID: team-a\n\nAuthorization: Bearer abc:def\n").unwrap();
        assert_eq!(
            headers,
            [
                ("X-Scope-OrgID".to_string(), "team-a".to_string()),
                ("Authorization".to_string(), "Bearer abc:def".to_string())
            ]
        );
        let err = parse_headers("Authorization Bearer s3cret\n").unwrap_err();
        assert!(err.contains("line 1") && !err.contains("s3cret"), "{err}");
        assert!(parse_headers("Bad Name: x").is_err());
    }

    #[test]
    fn basic_auth_is_the_first_line_base64_encoded() {
        // RFC 7617's example.
        let (name, value) = basic_auth("Aladdin:open sesame\nignored").unwrap();
        assert_eq!(name, "Authorization");
        assert_eq!(value, "Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ==");
        assert!(basic_auth("no-colon").is_none());
        assert!(basic_auth(":password").is_none());
    }

    #[test]
    fn https_is_taken_only_by_a_build_that_speaks_it() {
        assert!(check_scheme("--push", "http://h:4040").is_ok());
        assert!(check_scheme("--push", "ftp://h").is_err());
        assert_eq!(
            check_scheme("--push", "https://h").is_ok(),
            cfg!(feature = "https")
        );
    }
}
