//! The bearer token that protects `/mcp`, `/metrics` and the APIs for programs, and where it
//! comes from. It is kept only as its SHA-256 and compared in constant time (both sides are
//! hashed first, so the comparison does not even leak the length).

use std::net::SocketAddr;
use std::path::Path;

use axum::http::HeaderValue;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::ServeError;
use crate::config::HttpSettings;

/// A bearer token, kept only as its SHA-256.
#[derive(Clone)]
pub struct Token {
    digest: [u8; 32],
}

impl Token {
    pub fn new(secret: &str) -> Token {
        Token {
            digest: Sha256::digest(secret.as_bytes()).into(),
        }
    }

    /// Constant-time check of an `Authorization` header value.
    pub fn accepts(&self, authorization: Option<&HeaderValue>) -> bool {
        let Some(value) = authorization.and_then(|v| v.to_str().ok()) else {
            return false;
        };
        let Some((scheme, presented)) = value.trim().split_once(' ') else {
            return false;
        };
        if !scheme.eq_ignore_ascii_case("bearer") {
            return false;
        }
        self.matches(presented)
    }

    /// Constant-time check of a header carrying the token alone (Judge0's `X-Auth-Token`).
    pub(super) fn accepts_raw(&self, value: Option<&HeaderValue>) -> bool {
        value
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| self.matches(v))
    }

    fn matches(&self, presented: &str) -> bool {
        let presented: [u8; 32] = Sha256::digest(presented.trim().as_bytes()).into();
        self.digest.ct_eq(&presented).into()
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

/// Decide how `/mcp` is protected. The token comes from the first of: the `--token-file`
/// flag (`flag_file`), the `CODEBOX_TOKEN` variable (`env_token`), the `http.token_file`
/// setting; or there is none, which only `--no-auth` on a loopback address allows.
pub fn resolve_auth(
    http: &HttpSettings,
    flag_file: Option<&Path>,
    env_token: Option<String>,
    no_auth: bool,
) -> Result<Option<Token>, ServeError> {
    let addr: SocketAddr = http.listen.parse().map_err(|_| {
        ServeError::Invalid(format!(
            "setting `http.listen` = {:?} is not an address",
            http.listen
        ))
    })?;
    let env_token = env_token.filter(|t| !t.trim().is_empty());
    let file = match (flag_file, &env_token) {
        (Some(f), _) => Some(f.to_path_buf()),
        (None, Some(_)) => None,
        (None, None) => http.token_file.clone(),
    };
    let secret = match (file, env_token) {
        (Some(path), _) => {
            let text = std::fs::read_to_string(&path).map_err(|source| ServeError::TokenFile {
                path: path.clone(),
                source,
            })?;
            let t = text.trim().to_string();
            if t.is_empty() {
                return Err(ServeError::Invalid(format!(
                    "the token file {} is empty",
                    path.display()
                )));
            }
            Some(t)
        }
        (None, Some(t)) => Some(t.trim().to_string()),
        (None, None) => None,
    };
    if no_auth {
        if !addr.ip().is_loopback() {
            return Err(ServeError::NoAuthOnPublicAddress(addr.to_string()));
        }
        if secret.is_some() {
            return Err(ServeError::Invalid(
                "--no-auth was given together with a token (CODEBOX_TOKEN or a token file); choose one".into(),
            ));
        }
        tracing::warn!(%addr, "serving HTTP without authentication (--no-auth): any local process can run code");
        return Ok(None);
    }
    let Some(secret) = secret else {
        return Err(ServeError::NoToken);
    };
    if secret.len() < 16 {
        tracing::warn!("the bearer token is shorter than 16 characters; use a long random one");
    }
    Ok(Some(Token::new(&secret)))
}
