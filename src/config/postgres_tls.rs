//! libpq's TLS parameters in a `history.url`: `sslmode` (`disable`, `prefer`, the default,
//! `require`, `verify-ca`, `verify-full`) and `sslrootcert` (the CA file; libpq's default
//! `~/.postgresql/root.crt`). The PostgreSQL client parses neither `verify-*` nor
//! `sslrootcert`, so they are taken off the URL here and the client gets the rest, with
//! `disable`, `prefer` or `require`; `history/pg_tls.rs` makes the TLS connection.
//!
//! As libpq: `prefer` and `require` encrypt without checking the server's certificate, except
//! that `require` checks it as `verify-ca` does when a root certificate file exists;
//! `verify-ca` checks that the certificate chains to the CA; `verify-full` also that it names
//! the host the URL connects to.

use std::path::{Path, PathBuf};

/// How much the connection checks, libpq's `sslmode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

/// The TLS part of a `history.url`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TlsParams {
    pub mode: SslMode,
    /// `sslrootcert`, when the URL names one.
    pub root_cert: Option<PathBuf>,
}

/// `url` without its `sslmode` and `sslrootcert` parameters, and what they asked for.
pub(crate) fn split_tls(url: &str) -> Result<(String, TlsParams), String> {
    let mut params = TlsParams {
        mode: SslMode::Prefer,
        root_cert: None,
    };
    let Some((base, query)) = url.split_once('?') else {
        return Ok((url.to_string(), params));
    };
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match key {
            "sslmode" => {
                params.mode = match value {
                    "disable" => SslMode::Disable,
                    "prefer" => SslMode::Prefer,
                    "require" => SslMode::Require,
                    "verify-ca" => SslMode::VerifyCa,
                    "verify-full" => SslMode::VerifyFull,
                    other => {
                        return Err(format!(
                            "asks for sslmode={other}; codebox takes disable, prefer, require, verify-ca or verify-full"
                        ))
                    }
                }
            }
            "sslrootcert" => params.root_cert = Some(PathBuf::from(percent_decode(value)?)),
            _ => kept.push(pair),
        }
    }
    let rest = if kept.is_empty() {
        base.to_string()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Ok((rest, params))
}

fn percent_decode(s: &str) -> Result<String, String> {
    let mut out = Vec::with_capacity(s.len());
    let mut bytes = s.bytes();
    while let Some(b) = bytes.next() {
        if b != b'%' {
            out.push(b);
            continue;
        }
        let hex: String = bytes.by_ref().take(2).map(char::from).collect();
        out.push(
            u8::from_str_radix(&hex, 16)
                .map_err(|_| format!("has a bad percent escape in sslrootcert: %{hex}"))?,
        );
    }
    String::from_utf8(out).map_err(|_| "has an sslrootcert that is not UTF-8".to_string())
}

/// libpq's default root certificate file.
fn default_root_cert() -> Option<PathBuf> {
    std::env::var_os("HOME").map(|home| Path::new(&home).join(".postgresql/root.crt"))
}

impl TlsParams {
    /// The CA file to check the server against, if this mode checks: the URL's, else
    /// libpq's default when it exists (for `require`) or must (for `verify-*`).
    pub(crate) fn root_cert(&self) -> Result<Option<PathBuf>, String> {
        let named = self.root_cert.clone();
        match self.mode {
            SslMode::Disable | SslMode::Prefer => Ok(None),
            SslMode::Require => {
                Ok(named.or_else(|| default_root_cert().filter(|p| p.exists())))
            }
            SslMode::VerifyCa | SslMode::VerifyFull => match named.or_else(default_root_cert) {
                Some(p) if p.exists() => Ok(Some(p)),
                Some(p) => Err(format!(
                    "asks for sslmode={}, but the root certificate file {} does not exist (name the CA file with sslrootcert=)",
                    if self.mode == SslMode::VerifyCa { "verify-ca" } else { "verify-full" },
                    p.display()
                )),
                None => Err("asks for a verified connection but names no root certificate (sslrootcert=)".into()),
            },
        }
    }

    /// Check what can be checked before connecting (the CA file is there).
    pub fn check(&self) -> Result<(), String> {
        self.root_cert().map(|_| ())
    }

    /// The mode the PostgreSQL client itself knows.
    pub(crate) fn client_mode(&self) -> postgres::config::SslMode {
        match self.mode {
            SslMode::Disable => postgres::config::SslMode::Disable,
            SslMode::Prefer => postgres::config::SslMode::Prefer,
            _ => postgres::config::SslMode::Require,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libpq_tls_parameters_are_taken_off_the_url() {
        let (rest, p) = split_tls(
            "postgres://codebox@db/h?connect_timeout=3&sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem",
        )
        .unwrap();
        assert_eq!(rest, "postgres://codebox@db/h?connect_timeout=3");
        assert_eq!(p.mode, SslMode::VerifyFull);
        assert_eq!(p.root_cert, Some(PathBuf::from("/etc/ca.pem")));
        let (rest, p) = split_tls("postgres://codebox@db/h").unwrap();
        assert_eq!(
            (rest.as_str(), p.mode),
            ("postgres://codebox@db/h", SslMode::Prefer)
        );
        let (_, p) = split_tls("postgres://codebox@db/h?sslmode=disable").unwrap();
        assert_eq!(p.client_mode(), postgres::config::SslMode::Disable);
        let err = split_tls("postgres://x@db/h?sslmode=allow").unwrap_err();
        assert!(
            err.contains("sslmode=allow") && err.contains("verify-full"),
            "{err}"
        );
        let missing = TlsParams {
            mode: SslMode::VerifyCa,
            root_cert: Some("/nonexistent/ca.pem".into()),
        };
        let err = missing.check().unwrap_err();
        assert!(
            err.contains("/nonexistent/ca.pem") && err.contains("verify-ca"),
            "{err}"
        );
    }
}
