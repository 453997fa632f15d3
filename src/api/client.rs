//! Noticing a client that goes away while its request waits for a run's end, so that the run
//! is stopped (docs/http-api.md: an abandoned request stops its run).
//!
//! The transport serves HTTP/1.1 with half-close allowed (a client that only closes its
//! sending side still gets its answer), so hyper reads nothing while a handler waits and
//! notices neither a closed nor a reset connection. [`Peer`] watches the connection instead:
//! - a reset (or any socket error) is a client gone;
//! - a FIN is a client that closed its sending side, or the whole socket: an interim
//!   `100 Continue` (which HTTP/1.1 clients skip) is sent, and a socket that is closed
//!   answers it with a reset; one that is only half-closed reads it and waits on.

use std::convert::Infallible;
use std::sync::{Arc, Weak};
use std::time::Duration;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::Version;
use tokio::net::TcpStream;

/// An interim answer any HTTP/1.1 client skips (RFC 9110, 15.2).
const PROBE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";
/// How often a connection that can no longer signal readiness is checked for an error.
const CHECK_EVERY: Duration = Duration::from_millis(200);

/// The connection a request came on: a second descriptor of its socket, so that hyper's own
/// reading and writing are untouched. The connection's task owns it (the descriptor closes
/// with the connection); each request's extensions get a [`PeerHandle`] to it.
#[derive(Clone)]
pub struct Peer(Arc<TcpStream>);

/// What a request carries of its [`Peer`]: a weak reference, so that whatever keeps a
/// request's parts longer than its connection (rmcp keeps them) does not keep the socket open.
#[derive(Clone)]
pub struct PeerHandle(Weak<TcpStream>);

impl Peer {
    pub fn new(stream: TcpStream) -> Peer {
        Peer(Arc::new(stream))
    }

    pub fn handle(&self) -> PeerHandle {
        PeerHandle(Arc::downgrade(&self.0))
    }

    /// Resolves once the client has gone away; never while it may still read the answer.
    /// Call only while no answer is being written (the probe would land inside it).
    async fn gone(&self, may_probe: bool) {
        let s = &self.0;
        let mut byte = [0u8; 1];
        match s.peek(&mut byte).await {
            Err(_) => return,
            Ok(0) if may_probe => match s.try_write(PROBE) {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => return,
            },
            // A FIN that cannot be told from a close (HTTP/1.0), or bytes hyper has not read
            // yet (a pipelined request): only an error can tell now.
            Ok(_) => {}
        }
        // The socket stays readable from here on (end of file, or bytes nobody reads): check
        // for the reset a closed socket sends back.
        loop {
            tokio::time::sleep(CHECK_EVERY).await;
            match s.take_error() {
                Ok(None) => {}
                Ok(Some(_)) | Err(_) => return,
            }
            if matches!(s.try_write(&[]), Err(e) if e.kind() != std::io::ErrorKind::WouldBlock) {
                return;
            }
        }
    }
}

/// The client of a request, as a handler that waits sees it: [`Client::gone`] resolves when it
/// went away. Without a [`Peer`] (a request that did not come over the transport's
/// connections, or whose connection ended) it never does.
pub struct Client {
    peer: Option<Peer>,
    /// Whether the client speaks HTTP/1.1 (a 1xx answer may be sent to it).
    http11: bool,
}

impl Client {
    /// The client of a request, from its parts (as the extractor reads it).
    pub fn of(parts: &Parts) -> Client {
        Client {
            peer: parts
                .extensions
                .get::<PeerHandle>()
                .and_then(|h| h.0.upgrade())
                .map(Peer),
            http11: parts.version == Version::HTTP_11,
        }
    }

    pub async fn gone(&self) {
        match &self.peer {
            Some(p) => p.gone(self.http11).await,
            None => std::future::pending().await,
        }
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Client {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Client, Infallible> {
        Ok(Client::of(parts))
    }
}
