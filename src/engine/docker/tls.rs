//! A remote daemon over TCP: its TLS files as the docker CLI names them, a rustls client that
//! trusts only the operator's CA, bollard's custom transport, and TLS errors in a chain.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bollard::errors::Error as BollardError;
use bollard::Docker;

use super::REQUEST_TIMEOUT_SECONDS;

/// The files of a TLS connection, as the docker CLI names them in its certificate folder.
#[derive(Debug, Clone)]
pub(super) struct TlsFiles {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl TlsFiles {
    pub(super) fn in_dir(dir: &Path) -> TlsFiles {
        TlsFiles {
            ca: dir.join("ca.pem"),
            cert: dir.join("cert.pem"),
            key: dir.join("key.pem"),
        }
    }

    /// The client certificate file or key file that is missing, if one is.
    pub(super) fn missing_client_file(&self) -> Option<&Path> {
        [&self.cert, &self.key]
            .into_iter()
            .find(|p| !p.exists())
            .map(PathBuf::as_path)
    }

    /// A TLS client that trusts only `ca.pem` and presents `cert.pem` and `key.pem` (none
    /// when they are missing: the daemon then says whether it requires one).
    fn client_config(&self) -> Result<rustls::ClientConfig, String> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let read_certs = |path: &Path, what: &str| {
            CertificateDer::pem_file_iter(path)
                .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
                .map_err(|e| format!("cannot read the {what} {}: {e}", path.display()))
        };
        let mut roots = rustls::RootCertStore::empty();
        for ca in read_certs(&self.ca, "CA certificate")? {
            roots.add(ca).map_err(|e| {
                format!("the CA certificate {} is unusable: {e}", self.ca.display())
            })?;
        }
        if roots.is_empty() {
            return Err(format!("{} holds no certificate", self.ca.display()));
        }
        let no_client_certificate = self.missing_client_file().is_some();
        // Without a client certificate, TLS 1.2: a daemon that requires one then refuses in
        // the handshake, where codebox always sees its alert. Under TLS 1.3 the refusal comes
        // after the handshake and sometimes reaches codebox only as a closed connection
        // ("connection was not ready"). The daemon's certificate is verified either way.
        let versions: &[&rustls::SupportedProtocolVersion] = if no_client_certificate {
            &[&rustls::version::TLS12]
        } else {
            rustls::DEFAULT_VERSIONS
        };
        let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_protocol_versions(versions)
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots);
        if no_client_certificate {
            return Ok(builder.with_no_client_auth());
        }
        let certs = read_certs(&self.cert, "client certificate")?;
        let key = PrivateKeyDer::from_pem_file(&self.key)
            .map_err(|e| format!("cannot read the client key {}: {e}", self.key.display()))?;
        builder.with_client_auth_cert(certs, key).map_err(|e| {
            format!(
                "the client certificate {} is unusable: {e}",
                self.cert.display()
            )
        })
    }
}

/// A client for `tcp://HOST:PORT`, over TLS when `tls` is given, through bollard's custom
/// transport: bollard's own TLS client would also trust the system's certificate
/// authorities, and neither of its TCP clients sets `TCP_NODELAY` or keeps connections.
pub(super) fn tcp_client(address: &str, tls: Option<&TlsFiles>) -> Result<Docker, String> {
    let host_port = address
        .trim_start_matches("tcp://")
        .trim_end_matches('/')
        .to_string();
    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.enforce_http(false);
    // Without it the end of each request waits for the daemon's delayed ACK: about 40 ms
    // per Engine API call, measured.
    http.set_nodelay(true);
    match tls {
        Some(files) => {
            let https = hyper_rustls::HttpsConnectorBuilder::new()
                .with_tls_config(files.client_config()?)
                .https_only()
                .enable_http1()
                .wrap_connector(http);
            custom_transport(https, format!("https://{host_port}"))
        }
        None => custom_transport(http, format!("http://{host_port}")),
    }
}

/// A bollard client whose requests go through a hyper client on `connector`. Idle
/// connections are kept a while: a new TCP connection and TLS handshake per Engine API call
/// cost a remote run several milliseconds each.
fn custom_transport<C>(connector: C, base: String) -> Result<Docker, String>
where
    C: hyper_util::client::legacy::connect::Connect + Clone + Send + Sync + 'static,
{
    let client = Arc::new(
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .pool_timer(hyper_util::rt::TokioTimer::new())
            .build(connector),
    );
    let transport = move |request: bollard::BollardRequest| {
        let client = client.clone();
        async move { client.request(request).await.map_err(BollardError::from) }
    };
    Docker::connect_with_custom_transport(
        transport,
        Some(base),
        REQUEST_TIMEOUT_SECONDS,
        bollard::API_DEFAULT_VERSION,
    )
    .map_err(|e| e.to_string())
}

/// An error and each of its causes, outermost first. An I/O error's `source` skips the
/// error it wraps (rustls's, or another I/O error): the chain goes through it instead.
fn causes<'a>(
    e: &'a (dyn std::error::Error + 'static),
) -> impl Iterator<Item = &'a (dyn std::error::Error + 'static)> {
    std::iter::successors(Some(e), |e| match e.downcast_ref::<std::io::Error>() {
        Some(io) => io
            .get_ref()
            .map(|inner| inner as &(dyn std::error::Error + 'static)),
        None => e.source(),
    })
}

/// The TLS error somewhere in an error's chain.
pub(super) fn tls_error<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    causes(e).find_map(|e| e.downcast_ref::<rustls::Error>())
}

/// A connection error in one line, down to its root ("client error (Connect): tcp connect
/// error: Connection refused (os error 111)"), each cause said once.
pub(super) fn connection_detail(e: &BollardError) -> String {
    let mut text = String::new();
    for cause in causes(e) {
        let said = cause.to_string();
        if !text.contains(&said) {
            if !text.is_empty() {
                text.push_str(": ");
            }
            text.push_str(&said);
        }
    }
    text
}

/// Whether a `tcp://HOST:PORT` address is on this machine.
pub(super) fn is_loopback(address: &str) -> bool {
    let host = address
        .trim_start_matches("tcp://")
        .rsplit_once(':')
        .map_or("", |(h, _)| h)
        .trim_matches(['[', ']']);
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}
