//! The egress proxy: HTTP `CONNECT` tunnels and plain-HTTP forwarding to the operator's hosts
//! only (an install's index hosts, or `sandbox.egress_hosts` for programs), resolved by
//! codebox itself.
//!
//! # Security
//! The containers it serves have no network (`network_mode=none`): the proxy listens on a Unix
//! socket, `proxy.sock` in a directory of its own that the container gets read-only at
//! `/run/codebox-egress` (`crate::engine::posture::EGRESS_MOUNT`), and codebox-init's relay (`images/base/codebox-init-egress.c`) carries
//! the container's loopback connections to it. The directory is made for this proxy alone
//! (mode 0711 under codebox's private `data_dir/egress`, 0700), the socket is 0666 so that
//! every sandbox uid can connect, and both go when the proxy is dropped. The proxy admits a request only
//! when its host and port are one of the [`Allowed`] pairs the operator configured; it
//! refuses IP literals the operator did not write, and any name that resolves to a loopback,
//! link-local, private, shared, multicast or metadata address unless the operator's own entry
//! is such an address (`127.0.0.1`, `localhost`: a mirror on the host). Every byte it passes
//! back is counted against the install's download cap. One proxy serves one install and
//! ends with it.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::config::{split_host_port, Allowed};
use std::path::{Path, PathBuf};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, UnixListener};

/// The socket's name in the proxy's directory.
const SOCKET: &str = "proxy.sock";
use tokio::task::JoinSet;
use tokio_util::task::AbortOnDropHandle;

/// Longest request head the proxy reads.
const MAX_HEAD: usize = 16 * 1024;
/// How long a connection to an index may take to open.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Refusals a proxy keeps to report (the first ones; later ones are only counted): a program
/// may ask for thousands of hosts, and a programs' proxy lives as long as the server.
const KEPT_REFUSALS: usize = 16;
/// Most bytes of a request's own text (its host, its first line) a refusal repeats: a request
/// may name a host of 16 KiB.
const REQUEST_TEXT_BYTES: usize = 200;
/// Least time between two log lines of refusals; those in between are counted in the next.
const LOG_EVERY: Duration = Duration::from_secs(1);

/// The operator wrote a local or private address (or `localhost`) for this entry: it may
/// resolve to one.
fn local(a: &Allowed) -> bool {
    a.host == "localhost"
        || a.host
            .parse::<IpAddr>()
            .is_ok_and(|ip| forbidden_kind(ip).is_some())
}

/// Why the proxy refused a request.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Refusal {
    #[error("`{0}` is not one of the hosts this install may reach")]
    Host(String),
    #[error("{host} is admitted on port {allowed} only, not {port}")]
    Port {
        host: String,
        port: u16,
        allowed: String,
    },
    #[error("`{0}` is an IP address; only the configured host names are admitted")]
    IpLiteral(String),
    #[error("{host} resolves to {addr}, a {kind} address")]
    Address {
        host: String,
        addr: IpAddr,
        kind: &'static str,
    },
    #[error("{0} does not resolve")]
    Unresolved(String),
    #[error("the request is not an HTTP proxy request: {0}")]
    Malformed(String),
}

impl Refusal {
    /// The same refusal with the request's own text cut to [`REQUEST_TEXT_BYTES`].
    fn shortened(self) -> Refusal {
        let cut = |s: String| shortened(&s, REQUEST_TEXT_BYTES);
        match self {
            Refusal::Host(h) => Refusal::Host(cut(h)),
            Refusal::Port {
                host,
                port,
                allowed,
            } => Refusal::Port {
                host: cut(host),
                port,
                allowed,
            },
            Refusal::IpLiteral(h) => Refusal::IpLiteral(cut(h)),
            Refusal::Address { host, addr, kind } => Refusal::Address {
                host: cut(host),
                addr,
                kind,
            },
            Refusal::Unresolved(h) => Refusal::Unresolved(cut(h)),
            Refusal::Malformed(m) => Refusal::Malformed(cut(m)),
        }
    }
}

/// The kind of address no install may reach unless the operator named it.
fn forbidden_kind(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => v4_kind(v4),
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return v4_kind(v4);
            }
            let s = v6.segments();
            if v6.is_loopback() {
                Some("loopback")
            } else if v6.is_unspecified() {
                Some("unspecified")
            } else if s[0] & 0xffc0 == 0xfe80 {
                Some("link-local")
            } else if s[0] & 0xfe00 == 0xfc00 {
                Some("private")
            } else if v6.is_multicast() {
                Some("multicast")
            } else if v6 == Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254) {
                Some("metadata")
            } else {
                None
            }
        }
    }
}

fn v4_kind(v4: Ipv4Addr) -> Option<&'static str> {
    let o = v4.octets();
    if o == [169, 254, 169, 254] || o == [100, 100, 100, 200] {
        Some("metadata")
    } else if v4.is_loopback() {
        Some("loopback")
    } else if v4.is_link_local() {
        Some("link-local")
    } else if v4.is_private() {
        Some("private")
    } else if o[0] == 100 && (64..128).contains(&o[1]) {
        Some("shared (carrier-grade NAT)")
    } else if v4.is_unspecified() || o[0] == 0 {
        Some("unspecified")
    } else if v4.is_multicast() || v4.is_broadcast() || o[0] >= 240 {
        Some("multicast or reserved")
    } else {
        None
    }
}

/// What the proxy admits.
#[derive(Debug, Clone)]
pub struct Policy {
    pub allowed: Vec<Allowed>,
}

impl Policy {
    /// The entry a request for `host:port` falls under, or why none does.
    pub(crate) fn admit(&self, host: &str, port: u16) -> Result<&Allowed, Refusal> {
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_ascii_lowercase();
        let same_host: Vec<&Allowed> = self.allowed.iter().filter(|a| a.host == host).collect();
        if same_host.is_empty() {
            return Err(if host.parse::<IpAddr>().is_ok() {
                Refusal::IpLiteral(host)
            } else {
                Refusal::Host(host)
            });
        }
        same_host
            .iter()
            .find(|a| a.port == port)
            .copied()
            .ok_or_else(|| Refusal::Port {
                host: host.clone(),
                port,
                allowed: same_host
                    .iter()
                    .map(|a| a.port.to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
            })
    }

    /// The addresses to connect to for an admitted entry, resolved here; none of them of a
    /// forbidden kind unless the entry is local by the operator's own writing.
    pub async fn resolve(&self, a: &Allowed) -> Result<Vec<SocketAddr>, Refusal> {
        let addrs: Vec<SocketAddr> = match a.host.parse::<IpAddr>() {
            Ok(ip) => vec![SocketAddr::new(ip, a.port)],
            Err(_) => tokio::net::lookup_host((a.host.as_str(), a.port))
                .await
                .map_err(|_| Refusal::Unresolved(a.host.clone()))?
                .collect(),
        };
        checked(a, addrs)
    }
}

/// The addresses a name resolved to, unless one is of a forbidden kind and the operator did
/// not write a local entry (a public name resolving to a private address is DNS rebinding
/// or a misconfiguration: refused).
fn checked(a: &Allowed, addrs: Vec<SocketAddr>) -> Result<Vec<SocketAddr>, Refusal> {
    if addrs.is_empty() {
        return Err(Refusal::Unresolved(a.host.clone()));
    }
    if !local(a) {
        for addr in &addrs {
            if let Some(kind) = forbidden_kind(addr.ip()) {
                return Err(Refusal::Address {
                    host: a.host.clone(),
                    addr: addr.ip(),
                    kind,
                });
            }
        }
    }
    Ok(addrs)
}

/// What a proxy saw, shared with its connections.
#[derive(Default)]
struct Tally {
    downloaded: AtomicU64,
    over: AtomicBool,
    refusals: Mutex<Refusals>,
}

/// The refusals a proxy keeps: bounded in number and size, however many it makes.
#[derive(Default)]
struct Refusals {
    /// The first [`KEPT_REFUSALS`] (each repeats at most [`REQUEST_TEXT_BYTES`] of its request).
    kept: Vec<String>,
    /// How many more there were.
    more: u64,
    /// When the last log line was written, and refusals not logged since.
    logged_at: Option<std::time::Instant>,
    unlogged: u64,
}

impl Refusals {
    /// Keep `text` if there is room, else count it; whether to log it now, and how many
    /// refusals were not logged before it.
    fn record(&mut self, text: &str) -> Option<u64> {
        if self.kept.len() < KEPT_REFUSALS {
            self.kept.push(text.to_string());
        } else {
            self.more += 1;
        }
        let now = std::time::Instant::now();
        if self
            .logged_at
            .is_some_and(|t| now.duration_since(t) < LOG_EVERY)
        {
            self.unlogged += 1;
            return None;
        }
        self.logged_at = Some(now);
        Some(std::mem::take(&mut self.unlogged))
    }

    fn list(&self) -> Vec<String> {
        let mut out = self.kept.clone();
        if self.more > 0 {
            out.push(format!("{} more refusals", self.more));
        }
        out
    }
}

/// `text` cut to at most `max` bytes on a character boundary, marked when cut.
fn shortened(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}... ({} bytes)", &text[..end], text.len())
}

/// A running proxy; dropping it ends it and every connection through it, and removes its
/// directory.
pub(crate) struct Proxy {
    dir: PathBuf,
    tally: Arc<Tally>,
    _task: AbortOnDropHandle<()>,
}

/// The longest socket path a Unix socket takes (`sun_path`, less its NUL).
const MAX_SOCKET_PATH: usize = 107;

impl Proxy {
    /// Make the directory `dir` (its parent is made 0700 if missing), listen on
    /// `dir/proxy.sock` and serve `policy`, passing back at most `max_download` bytes in all.
    pub async fn start(dir: &Path, policy: Policy, max_download: u64) -> std::io::Result<Proxy> {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        let socket = dir.join(SOCKET);
        if socket.as_os_str().len() > MAX_SOCKET_PATH {
            return Err(std::io::Error::other(format!(
                "the socket path {} is longer than a Unix socket takes ({MAX_SOCKET_PATH} bytes): set a shorter data_dir",
                socket.display()
            )));
        }
        if let Some(parent) = dir.parent() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(parent)?;
        }
        // A directory left by a crash under this name: start afresh.
        let _ = std::fs::remove_dir_all(dir);
        std::fs::DirBuilder::new().mode(0o711).create(dir)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711))?;
        let listener = match UnixListener::bind(&socket) {
            Ok(l) => l,
            Err(e) => {
                let _ = std::fs::remove_dir_all(dir);
                return Err(e);
            }
        };
        std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666))?;
        let tally = Arc::new(Tally::default());
        let policy = Arc::new(policy);
        let t = tally.clone();
        let task = tokio::spawn(async move {
            let mut conns = JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        let Ok((stream, _)) = accepted else { continue };
                        conns.spawn(serve(stream, policy.clone(), t.clone(), max_download));
                    }
                    Some(_) = conns.join_next(), if !conns.is_empty() => {}
                }
            }
        });
        Ok(Proxy {
            dir: dir.to_path_buf(),
            tally,
            _task: AbortOnDropHandle::new(task),
        })
    }

    /// The directory holding the socket, mounted read-only into the containers it serves.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Bytes passed back so far.
    pub fn downloaded(&self) -> u64 {
        self.tally.downloaded.load(Ordering::Relaxed)
    }

    /// The download cap was reached (connections were cut).
    pub(super) fn over_cap(&self) -> bool {
        self.tally.over.load(Ordering::Relaxed)
    }

    /// What was refused, one sentence each: the first few, then how many more.
    pub fn refusals(&self) -> Vec<String> {
        self.tally
            .refusals
            .lock()
            .map(|r| r.list())
            .unwrap_or_default()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A client connection (the relay's, on the Unix socket; tests may use any stream).
trait Client: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Client for T {}

/// One client connection: read the request head, check it, then tunnel or forward.
async fn serve(mut client: impl Client, policy: Arc<Policy>, tally: Arc<Tally>, max: u64) {
    let (head, rest) = match read_head(&mut client).await {
        Ok(h) => h,
        Err(m) => return refuse(&mut client, &tally, Refusal::Malformed(m)).await,
    };
    let text = String::from_utf8_lossy(&head).to_string();
    let mut lines = text.split("\r\n");
    let first = lines.next().unwrap_or("");
    let mut parts = first.split(' ');
    let (method, target, version) = (
        parts.next().unwrap_or(""),
        parts.next().unwrap_or(""),
        parts.next().unwrap_or("HTTP/1.1"),
    );
    let connect = method.eq_ignore_ascii_case("CONNECT");
    let (authority, path, default_port) = if connect {
        (target.to_string(), String::new(), 443)
    } else if let Some(r) = target.strip_prefix("http://") {
        let (auth, path) = match r.find(['/', '?']) {
            Some(i) => (&r[..i], &r[i..]),
            None => (r, "/"),
        };
        let path = if path.starts_with('?') {
            format!("/{path}")
        } else {
            path.to_string()
        };
        (auth.to_string(), path, 80)
    } else {
        let m = format!("`{first}` (only CONNECT and absolute http:// requests are proxied)");
        return refuse(&mut client, &tally, Refusal::Malformed(m)).await;
    };
    if authority.contains('@') {
        let m = "credentials in the target".to_string();
        return refuse(&mut client, &tally, Refusal::Malformed(m)).await;
    }
    let Some((host, port)) = split_host_port(&authority, default_port) else {
        let m = format!("`{authority}` is not host:port");
        return refuse(&mut client, &tally, Refusal::Malformed(m)).await;
    };
    let admitted = match policy.admit(&host, port) {
        Ok(a) => a.clone(),
        Err(r) => return refuse(&mut client, &tally, r).await,
    };
    let addrs = match policy.resolve(&admitted).await {
        Ok(a) => a,
        Err(r) => return refuse(&mut client, &tally, r).await,
    };
    let upstream = match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(&addrs[..])).await
    {
        Ok(Ok(s)) => s,
        _ => {
            let _ = client
                .write_all(
                    b"HTTP/1.1 502 Bad Gateway\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
                )
                .await;
            return;
        }
    };
    let mut upstream = upstream;
    if connect {
        if client
            .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
            .await
            .is_err()
        {
            return;
        }
    } else {
        let mut out = format!("{method} {path} {version}\r\n");
        for line in lines.filter(|l| !l.is_empty()) {
            let name = line
                .split(':')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase();
            if !matches!(
                name.as_str(),
                "proxy-connection" | "proxy-authorization" | "connection" | "keep-alive"
            ) {
                out.push_str(line);
                out.push_str("\r\n");
            }
        }
        out.push_str("Connection: close\r\n\r\n");
        if upstream.write_all(out.as_bytes()).await.is_err() {
            return;
        }
    }
    if !rest.is_empty() && upstream.write_all(&rest).await.is_err() {
        return;
    }
    let (mut cr, mut cw) = tokio::io::split(client);
    let (mut ur, mut uw) = upstream.into_split();
    let up = async {
        let _ = tokio::io::copy(&mut cr, &mut uw).await;
        let _ = uw.shutdown().await;
    };
    let down = async {
        let _ = counted_copy(&mut ur, &mut cw, &tally, max).await;
        let _ = cw.shutdown().await;
    };
    tokio::join!(up, down);
}

/// Copy the index's answer to the client, counting it against the install's cap.
async fn counted_copy(
    from: &mut (impl AsyncRead + Unpin),
    to: &mut (impl AsyncWrite + Unpin),
    tally: &Tally,
    max: u64,
) -> std::io::Result<()> {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        let total = tally.downloaded.fetch_add(n as u64, Ordering::Relaxed) + n as u64;
        if total > max {
            tally.over.store(true, Ordering::Relaxed);
            return Ok(());
        }
        to.write_all(&buf[..n]).await?;
    }
}

/// The request head (up to the blank line) and whatever came after it.
async fn read_head(client: &mut impl Client) -> Result<(Vec<u8>, Vec<u8>), String> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buf.split_off(i + 4);
            buf.truncate(i);
            return Ok((buf, rest));
        }
        if buf.len() > MAX_HEAD {
            return Err("the request head is longer than 16 KiB".into());
        }
        let n = tokio::time::timeout(CONNECT_TIMEOUT, client.read(&mut chunk))
            .await
            .map_err(|_| "no request head within 10 s".to_string())?
            .map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("the connection closed before the request head ended".into());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

async fn refuse(client: &mut impl Client, tally: &Tally, why: Refusal) {
    let text = why.shortened().to_string();
    let log = tally.refusals.lock().ok().and_then(|mut r| r.record(&text));
    if let Some(unlogged) = log {
        tracing::info!(refused = %text, unlogged, "egress proxy");
    }
    let body = format!("codebox egress proxy refused this request: {text}\n");
    let _ = client
        .write_all(
            format!(
                "HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        )
        .await;
    let _ = client.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(entries: &[&str]) -> Policy {
        Policy {
            allowed: entries
                .iter()
                .map(|e| Allowed::from_url(e).unwrap())
                .collect(),
        }
    }

    /// A one-answer HTTP server on loopback: what it was asked, and its port.
    async fn upstream(body: &'static str) -> (u16, tokio::task::JoinHandle<String>) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let h = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let (head, _) = read_head(&mut s).await.unwrap();
            let answer = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            s.write_all(answer.as_bytes()).await.unwrap();
            let _ = s.shutdown().await;
            String::from_utf8(head).unwrap()
        });
        (port, h)
    }

    async fn ask(proxy: &Proxy, request: String) -> String {
        let mut s = tokio::net::UnixStream::connect(proxy.dir().join(SOCKET))
            .await
            .unwrap();
        s.write_all(request.as_bytes()).await.unwrap();
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await;
        String::from_utf8_lossy(&out).to_string()
    }

    #[test]
    fn urls_and_hosts_give_host_and_port() {
        let a = Allowed::from_url("https://PyPI.org/simple").unwrap();
        assert_eq!((a.host.as_str(), a.port), ("pypi.org", 443));
        let a = Allowed::from_url("http://127.0.0.1:3141/simple/").unwrap();
        assert_eq!((a.host.as_str(), a.port), ("127.0.0.1", 3141));
        let a = Allowed::from_url("http://[::1]:8080").unwrap();
        assert_eq!((a.host.as_str(), a.port), ("::1", 8080));
        assert_eq!(
            Allowed::from_host("files.pythonhosted.org").unwrap().port,
            443
        );
        for bad in ["ftp://x", "http://user@x/", "x", "http://", "http://a b/"] {
            assert!(Allowed::from_url(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn forbidden_kinds_cover_loopback_private_link_local_and_metadata() {
        for (ip, kind) in [
            ("127.0.0.1", "loopback"),
            ("10.1.2.3", "private"),
            ("172.17.0.1", "private"),
            ("192.168.1.1", "private"),
            ("169.254.1.1", "link-local"),
            ("169.254.169.254", "metadata"),
            ("::1", "loopback"),
            ("fe80::1", "link-local"),
            ("fd00::1", "private"),
            ("::ffff:127.0.0.1", "loopback"),
            ("0.0.0.0", "unspecified"),
        ] {
            assert_eq!(forbidden_kind(ip.parse().unwrap()), Some(kind), "{ip}");
        }
        assert_eq!(forbidden_kind("151.101.0.223".parse().unwrap()), None);
    }

    #[tokio::test]
    async fn an_admitted_index_is_forwarded_and_counted() {
        let (port, seen) = upstream("index").await;
        let tmp = tempfile::tempdir().unwrap();
        let p = Proxy::start(
            &tmp.path().join("egress"),
            policy(&[&format!("http://127.0.0.1:{port}/simple")]),
            1 << 20,
        )
        .await
        .unwrap();
        let answer = ask(
            &p,
            format!("GET http://127.0.0.1:{port}/simple/x/ HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nProxy-Connection: keep-alive\r\n\r\n"),
        )
        .await;
        assert!(answer.ends_with("\r\n\r\nindex"), "{answer}");
        let head = seen.await.unwrap();
        assert!(head.starts_with("GET /simple/x/ HTTP/1.1\r\n"), "{head}");
        assert!(
            !head.to_ascii_lowercase().contains("proxy-connection"),
            "{head}"
        );
        assert!(p.downloaded() > 5);
        assert!(p.refusals().is_empty());
    }

    #[tokio::test]
    async fn a_tunnel_to_the_index_port_opens() {
        let (port, seen) = upstream("tunnelled").await;
        let tmp = tempfile::tempdir().unwrap();
        let p = Proxy::start(
            &tmp.path().join("egress"),
            policy(&[&format!("https://127.0.0.1:{port}/")]),
            1 << 20,
        )
        .await
        .unwrap();
        let answer = ask(
            &p,
            format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\nGET / HTTP/1.1\r\n\r\n"),
        )
        .await;
        assert!(
            answer.starts_with("HTTP/1.1 200 Connection established"),
            "{answer}"
        );
        assert!(answer.ends_with("tunnelled"), "{answer}");
        assert!(seen.await.unwrap().starts_with("GET / "));
    }

    #[tokio::test]
    async fn everything_else_is_refused_with_a_reason() {
        let (port, _seen) = upstream("never").await;
        let tmp = tempfile::tempdir().unwrap();
        let p = Proxy::start(
            &tmp.path().join("egress"),
            policy(&[
                &format!("http://127.0.0.1:{port}/simple"),
                "https://pypi.example/simple",
            ]),
            1 << 20,
        )
        .await
        .unwrap();
        let cases = [
            (
                "CONNECT other.example:443 HTTP/1.1\r\n\r\n".to_string(),
                "not one of the hosts",
            ),
            (
                format!("CONNECT 127.0.0.1:{} HTTP/1.1\r\n\r\n", port + 1),
                "on port",
            ),
            (
                "CONNECT pypi.example:22 HTTP/1.1\r\n\r\n".into(),
                "on port 443 only, not 22",
            ),
            (
                "CONNECT 10.0.0.1:443 HTTP/1.1\r\n\r\n".into(),
                "is an IP address",
            ),
            (
                "CONNECT 169.254.169.254:80 HTTP/1.1\r\n\r\n".into(),
                "is an IP address",
            ),
            (
                "CONNECT [::1]:443 HTTP/1.1\r\n\r\n".into(),
                "is an IP address",
            ),
            (
                "CONNECT localhost:443 HTTP/1.1\r\n\r\n".into(),
                "not one of the hosts",
            ),
            (
                "GET http://metadata.google.internal/ HTTP/1.1\r\n\r\n".into(),
                "not one of the hosts",
            ),
            (
                "GET /simple/ HTTP/1.1\r\n\r\n".into(),
                "only CONNECT and absolute",
            ),
            (
                "GET http://u:p@127.0.0.1/ HTTP/1.1\r\n\r\n".into(),
                "credentials",
            ),
        ];
        for (request, reason) in &cases {
            let answer = ask(&p, request.clone()).await;
            assert!(answer.starts_with("HTTP/1.1 403"), "{request:?}: {answer}");
            assert!(answer.contains(reason), "{request:?}: {answer}");
        }
        assert_eq!(p.refusals().len(), cases.len());
        assert_eq!(p.downloaded(), 0);
    }

    #[tokio::test]
    async fn a_name_that_resolves_to_a_local_address_is_refused_unless_the_operator_wrote_one() {
        // A public name that resolves to a private, loopback or metadata address (what DNS
        // rebinding would give) is refused; the operator's own `localhost` or `127.0.0.1` is not.
        let public = Allowed::from_url("https://pypi.example/").unwrap();
        for (ip, kind) in [
            ("10.0.0.5", "private"),
            ("127.0.0.1", "loopback"),
            ("169.254.169.254", "metadata"),
            ("fe80::1", "link-local"),
        ] {
            let addrs = vec![
                SocketAddr::new("151.101.0.223".parse().unwrap(), 443),
                SocketAddr::new(ip.parse().unwrap(), 443),
            ];
            let err = checked(&public, addrs).unwrap_err();
            assert!(
                matches!(err, Refusal::Address { kind: k, .. } if k == kind),
                "{ip}: {err:?}"
            );
        }
        let p = policy(&["https://localhost/", "http://127.0.0.1:3141/"]);
        assert!(p.resolve(&p.allowed[0]).await.is_ok());
        assert!(p.resolve(&p.allowed[1]).await.is_ok());
    }

    #[tokio::test]
    async fn its_socket_directory_is_private_to_it_and_goes_with_it() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("egress").join("run-1-install");
        let p = Proxy::start(&dir, policy(&["http://127.0.0.1:1/"]), 1)
            .await
            .unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode(&tmp.path().join("egress")), 0o700);
        assert_eq!(mode(&dir), 0o711);
        assert_eq!(mode(&dir.join(SOCKET)), 0o666);
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(names, [SOCKET]);
        drop(p);
        assert!(!dir.exists(), "the directory outlived its proxy");
        let long = tmp.path().join("x".repeat(120));
        let e = Proxy::start(&long, policy(&[]), 1)
            .await
            .err()
            .expect("too long");
        assert!(e.to_string().contains("set a shorter data_dir"), "{e}");
    }

    #[tokio::test]
    async fn hostile_requests_leave_a_bounded_record_of_refusals() {
        // Untrusted code may ask for thousands of long hosts: what the proxy keeps of them
        // stays small however many it refuses.
        let tmp = tempfile::tempdir().unwrap();
        let p = Proxy::start(
            &tmp.path().join("egress"),
            policy(&["https://pypi.example/"]),
            1,
        )
        .await
        .unwrap();
        let host = "h".repeat(16_000);
        for _ in 0..2000 {
            let answer = ask(&p, format!("CONNECT {host}:443 HTTP/1.1\r\n\r\n")).await;
            assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
        }
        let kept = p.refusals();
        let bytes: usize = kept.iter().map(|r| r.len()).sum();
        assert!(kept.len() <= 64, "{} refusals kept", kept.len());
        assert!(bytes <= 16 * 1024, "{bytes} bytes of refusals kept");
        assert!(kept[0].contains("not one of the hosts"), "{}", kept[0]);
        assert!(
            kept.last().unwrap().contains("more"),
            "{}",
            kept.last().unwrap()
        );
    }

    #[tokio::test]
    async fn the_download_cap_cuts_the_answer() {
        let (port, _seen) = upstream("0123456789012345678901234567890123456789").await;
        let tmp = tempfile::tempdir().unwrap();
        let p = Proxy::start(
            &tmp.path().join("egress"),
            policy(&[&format!("http://127.0.0.1:{port}/")]),
            20,
        )
        .await
        .unwrap();
        let answer = ask(&p, format!("GET http://127.0.0.1:{port}/ HTTP/1.1\r\n\r\n")).await;
        assert!(
            !answer.contains("0123456789012345678901234567890123456789"),
            "{answer}"
        );
        assert!(p.over_cap());
    }
}
