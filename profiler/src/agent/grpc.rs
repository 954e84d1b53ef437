//! OTLP/gRPC: one unary call of the profiles service's `Export` per window, over HTTP/2 without
//! TLS (h2c, as collectors listen on 4317) or, with the `https` feature, over TLS (ALPN `h2`). The
//! message is the same `ExportProfilesServiceRequest` OTLP/HTTP sends; gRPC adds a 5-byte frame and
//! reports its outcome in `grpc-status`.
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::{client::conn::http2, HeaderMap, Request};
use hyper_util::rt::{TokioExecutor, TokioIo};

/// The method's path (package, service, method as the proto declares them).
pub const EXPORT_PATH: &str = "/opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export";

/// A message as gRPC carries it: not compressed (0), its length (big-endian), the message.
pub fn frame(message: &[u8]) -> Vec<u8> {
    let mut framed = Vec::with_capacity(message.len() + 5);
    framed.push(0);
    framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
    framed.extend_from_slice(message);
    framed
}

/// The call's outcome from its `grpc-status` (in the trailers, or in the headers of a reply that
/// has only those) and `grpc-message`.
pub fn outcome(headers: &HeaderMap, trailers: Option<&HeaderMap>) -> Result<(), String> {
    let field = |name: &str| {
        trailers
            .and_then(|t| t.get(name))
            .or_else(|| headers.get(name))
            .and_then(|v| v.to_str().ok())
    };
    match field("grpc-status") {
        Some("0") => Ok(()),
        Some(code) => Err(format!(
            "gRPC status {code}{}",
            field("grpc-message").map_or(String::new(), |m| format!(": {m}"))
        )),
        None => Err("no gRPC status in the reply (is this an OTLP/gRPC endpoint?)".into()),
    }
}

/// How the connection is made: plain (h2c), or TLS checked against the configured roots.
pub enum Transport {
    Plain,
    #[cfg(feature = "https")]
    Tls(std::sync::Arc<tokio_rustls::rustls::ClientConfig>),
}

/// The TLS client of `https://` gRPC exports: the push's roots, HTTP/2 by ALPN.
#[cfg(feature = "https")]
pub fn tls_transport(roots: &super::credentials::Roots) -> Result<Transport, String> {
    use tokio_rustls::rustls;
    let mut store = rustls::RootCertStore::empty();
    for cert in roots.iter() {
        store
            .add(rustls::pki_types::CertificateDer::from(cert.der().to_vec()))
            .map_err(|e| format!("a trusted root: {e}"))?;
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(store)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Transport::Tls(std::sync::Arc::new(config)))
}

/// Send one export request to `authority` (`host:port`).
pub async fn export(
    authority: &str,
    transport: &Transport,
    headers: &[(String, String)],
    message: Bytes,
) -> Result<(), String> {
    let stream = tokio::net::TcpStream::connect(authority)
        .await
        .map_err(|e| format!("connecting to {authority}: {e}"))?;
    let mut request = Request::post(EXPORT_PATH)
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    // gRPC metadata: HTTP/2 wants the names in lower case.
    for (name, value) in headers {
        request = request.header(name.to_ascii_lowercase(), value);
    }
    match transport {
        Transport::Plain => {
            let request = request
                .uri(format!("http://{authority}{EXPORT_PATH}"))
                .body(Full::new(Bytes::from(frame(&message))))
                .map_err(|e| e.to_string())?;
            call(authority, TokioIo::new(stream), request).await
        }
        #[cfg(feature = "https")]
        Transport::Tls(config) => {
            let host = authority.rsplit_once(':').map_or(authority, |(host, _)| host);
            let host = host.trim_start_matches('[').trim_end_matches(']');
            let name = tokio_rustls::rustls::pki_types::ServerName::try_from(host.to_string())
                .map_err(|e| format!("{host}: {e}"))?;
            let stream = tokio_rustls::TlsConnector::from(config.clone())
                .connect(name, stream)
                .await
                .map_err(|e| format!("TLS with {authority}: {e}"))?;
            let request = request
                .uri(format!("https://{authority}{EXPORT_PATH}"))
                .body(Full::new(Bytes::from(frame(&message))))
                .map_err(|e| e.to_string())?;
            call(authority, TokioIo::new(stream), request).await
        }
    }
}

/// The call itself, over a connection made either way.
async fn call<IO>(authority: &str, io: IO, request: Request<Full<Bytes>>) -> Result<(), String>
where
    IO: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, connection) = http2::handshake(TokioExecutor::new(), io)
        .await
        .map_err(|e| format!("HTTP/2 with {authority}: {e}"))?;
    let connection = tokio::spawn(connection);
    let result = async {
        let reply = sender.send_request(request).await.map_err(|e| e.to_string())?;
        if !reply.status().is_success() {
            return Err(format!("HTTP status {}", reply.status()));
        }
        let headers = reply.headers().clone();
        let body = reply.into_body().collect().await.map_err(|e| e.to_string())?;
        outcome(&headers, body.trailers())
    }
    .await;
    connection.abort();
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_framed_and_statuses_read_from_trailers_or_headers() {
        assert_eq!(frame(b"abc"), [0, 0, 0, 0, 3, b'a', b'b', b'c']);
        assert_eq!(frame(&[7; 300])[..5], [0, 0, 0, 1, 44]);
        let mut ok = HeaderMap::new();
        ok.insert("grpc-status", "0".parse().unwrap());
        let mut refused = HeaderMap::new();
        refused.insert("grpc-status", "3".parse().unwrap());
        refused.insert("grpc-message", "bad profile".parse().unwrap());
        let empty = HeaderMap::new();
        assert_eq!(outcome(&empty, Some(&ok)), Ok(()));
        assert_eq!(outcome(&ok, None), Ok(()), "a trailers-only reply");
        assert_eq!(
            outcome(&empty, Some(&refused)).unwrap_err(),
            "gRPC status 3: bad profile"
        );
        assert!(outcome(&empty, None).unwrap_err().contains("no gRPC status"));
    }
}
