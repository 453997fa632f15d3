//! Checking one raw language entry (and the names it uses) into a `Language`, with errors
//! that name the field.

use std::collections::BTreeMap;
use std::path::Path;

use super::*;
use super::{raw, source_name};

pub(super) const IDENT_RULE: &str =
    "must be lowercase letters, digits, `_`, `-` or `+`, starting with a letter";

pub(super) fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "_-+".contains(c))
}

/// A plain file name: letters, digits, `_`, `-`, `.`; not hidden, no directories.
pub fn is_safe_file_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && !s.starts_with('.')
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c))
}

pub(super) fn is_safe_relative(s: &str) -> bool {
    let p = Path::new(s);
    !s.is_empty()
        && p.is_relative()
        && p.components()
            .all(|c| matches!(c, std::path::Component::Normal(_)))
}

/// The field a serde error is about, when it says (e.g. "unknown field `x`" or "missing field `y`").
pub(super) fn serde_field(e: &toml::de::Error) -> String {
    let msg = e.message();
    for marker in ["unknown field `", "missing field `"] {
        if let Some(rest) = msg.split(marker).nth(1) {
            if let Some(name) = rest.split('`').next() {
                return name.to_string();
            }
        }
    }
    "?".to_string()
}

pub(super) fn validate_language(
    id: &str,
    raw: raw::RawLanguage,
    images: &BTreeMap<String, Image>,
) -> Result<Language, (String, String)> {
    let err = |f: &str, m: String| Err((f.to_string(), m));
    if !is_identifier(id) {
        return err("id", IDENT_RULE.into());
    }
    if raw.display_name.trim().is_empty() {
        return err("display_name", "must not be empty".into());
    }
    for a in &raw.aliases {
        if !is_identifier(a) {
            return err("aliases", format!("alias `{a}` {IDENT_RULE}"));
        }
    }
    let Some(image) = images.get(&raw.image) else {
        let known: Vec<&str> = images.keys().map(String::as_str).collect();
        return err(
            "image",
            format!(
                "`{}` is not a key of [images] (known: {})",
                raw.image,
                known.join(", ")
            ),
        );
    };
    if !is_safe_file_name(&raw.source_file) {
        return err(
            "source_file",
            format!(
                "`{}` must be a plain file name (letters, digits, `_`, `-`, `.`; not hidden)",
                raw.source_file
            ),
        );
    }
    if raw.run.is_empty() || raw.run[0].is_empty() {
        return err(
            "run",
            "must be a non-empty command (a list of strings)".into(),
        );
    }
    for (name, cmd) in [
        ("compile", &raw.compile),
        ("check", &raw.check),
        ("checked_run", &raw.checked_run),
    ] {
        if let Some(c) = cmd {
            if c.is_empty() || c[0].is_empty() {
                return err(name, "must be a non-empty command when present".into());
            }
        }
    }
    if raw.compile.is_some() && raw.check.is_some() {
        return err(
            "check",
            "a language has a compile stage or a check, not both (its compiler checks)".into(),
        );
    }
    if raw.checked_run.is_some() {
        if raw.check.is_none() {
            return err(
                "checked_run",
                "needs `check`: it is the same check, done in the program's own process".into(),
            );
        }
        if raw.source_name.is_some() {
            return err(
                "checked_run",
                "does not go with `source_name` (a renamed source would need it rewritten too)"
                    .into(),
            );
        }
    }
    let (stem, _) = source_name::split_name(&raw.source_file);
    let source_name = match &raw.source_name {
        Some(p) => Some(
            SourceName::new(p, raw.compile.clone(), raw.check.clone(), raw.run.clone())
                .map_err(|m| ("source_name".to_string(), m))?,
        ),
        None => None,
    };
    let compile = raw.compile.as_deref().map(|c| source_name::fill(c, stem));
    let check = raw.check.as_deref().map(|c| source_name::fill(c, stem));
    let run = source_name::fill(&raw.run, stem);
    let checked_run = raw
        .checked_run
        .as_deref()
        .map(|c| source_name::fill(c, stem));
    if let Some(v) = &raw.version {
        if v.is_empty() {
            return err("version", "must be a non-empty command when present".into());
        }
    }
    let session_driver = match raw.session {
        Some(s) if s.driver.is_empty() || s.driver[0].is_empty() => {
            return err(
                "session.driver",
                "must be a non-empty command (a list of strings)".into(),
            )
        }
        Some(s) => Some(s.driver),
        None => None,
    };
    let install = match raw.install {
        Some(i) => Some(install(i).map_err(|(f, m)| (format!("install.{f}"), m))?),
        None => None,
    };
    for (k, v) in &raw.env {
        let ok_key = !k.is_empty()
            && !k.starts_with(|c: char| c.is_ascii_digit())
            && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !ok_key || v.contains('\0') {
            return err("env", format!("`{k}` is not a valid environment variable"));
        }
    }
    let mut compile_limits = CompileLimits {
        timeout_seconds: DEFAULT_COMPILE_TIMEOUT_SECONDS,
        memory_mb: DEFAULT_COMPILE_MEMORY_MB,
        cpus: DEFAULT_COMPILE_CPUS,
        workspace_mb: DEFAULT_COMPILE_WORKSPACE_MB,
    };
    if let Some(l) = raw.compile_limits {
        if let Some(t) = l.timeout_seconds {
            if !(t.is_finite() && t > 0.0) {
                return err("compile_limits.timeout_seconds", "must be positive".into());
            }
            compile_limits.timeout_seconds = t;
        }
        if let Some(m) = l.memory_mb {
            if m == 0 {
                return err("compile_limits.memory_mb", "must be positive".into());
            }
            compile_limits.memory_mb = m;
        }
        if let Some(w) = l.workspace_mb {
            compile_limits.workspace_mb = w;
        }
        if let Some(c) = l.cpus {
            if !(c.is_finite() && c > 0.0) {
                return err("compile_limits.cpus", "must be positive".into());
            }
            compile_limits.cpus = c;
        }
    }
    if compile_limits.workspace_mb == 0
        || compile_limits.workspace_mb * 2 > compile_limits.memory_mb
    {
        return err(
            "compile_limits.workspace_mb",
            format!(
                "must be between 1 and half of compile_limits.memory_mb ({} MB): the working directory is memory",
                compile_limits.memory_mb
            ),
        );
    }
    let mut extensions = raw.extensions;
    if extensions.is_empty() {
        if let Some(ext) = Path::new(&raw.source_file)
            .extension()
            .and_then(|e| e.to_str())
        {
            extensions.push(ext.to_ascii_lowercase());
        }
    }
    let mut judge0_ids = Vec::new();
    for n in raw.judge0_ids {
        let ok = (1..=MAX_JUDGE0_ID).contains(&n);
        let Some(n) = u32::try_from(n).ok().filter(|_| ok) else {
            return err(
                "judge0_ids",
                format!("{n} is not an id from 1 to {MAX_JUDGE0_ID}"),
            );
        };
        if judge0_ids.contains(&n) {
            return err("judge0_ids", format!("{n} appears twice"));
        }
        judge0_ids.push(n);
    }
    let raw_piston = raw.piston.unwrap_or(raw::RawPiston {
        language: None,
        aliases: Vec::new(),
    });
    let piston = PistonName {
        language: raw_piston.language.unwrap_or_else(|| id.to_string()),
        aliases: raw_piston.aliases,
    };
    for name in std::iter::once(&piston.language).chain(&piston.aliases) {
        let ok = !name.is_empty()
            && name.len() <= 64
            && name
                .chars()
                .all(|c| c.is_ascii_graphic() && !c.is_ascii_uppercase());
        if !ok {
            return err(
                "piston",
                format!(
                    "`{name}` must be 1 to 64 printable ASCII characters, lowercase, no spaces"
                ),
            );
        }
    }
    let mut tests = Vec::new();
    for t in raw.tests {
        let Some(status) = Status::parse(&t.expect.status).filter(|s| s.is_terminal()) else {
            return err(
                "tests.expect.status",
                format!(
                    "`{}` is not a terminal status (sample `{}`)",
                    t.expect.status, t.name
                ),
            );
        };
        if tests.iter().any(|s: &Sample| s.name == t.name) {
            return err("tests.name", format!("sample `{}` appears twice", t.name));
        }
        tests.push(Sample {
            name: t.name,
            code: t.code,
            stdin: t.stdin,
            args: t.args,
            expect: Expect {
                status,
                stdout: t.expect.stdout,
                stderr_contains: t.expect.stderr_contains,
                exit_code: t.expect.exit_code,
            },
        });
    }
    Ok(Language {
        id: id.to_string(),
        display_name: raw.display_name,
        aliases: raw.aliases,
        extensions,
        image: image.clone(),
        source_file: raw.source_file,
        source_name,
        compile,
        check,
        run,
        version: raw.version,
        env: raw.env,
        packages: raw.packages,
        compile_limits,
        judge0_ids,
        piston,
        session_driver,
        checked_run,
        install,
        tests,
    })
}

/// A language's `install`: a command, a prefix outside the image's own folders, and
/// variables that only point into the prefix.
fn install(raw: raw::RawInstall) -> Result<super::Install, (String, String)> {
    if raw.command.is_empty() || raw.command[0].is_empty() {
        return Err(("command".into(), "must be a non-empty command".into()));
    }
    if !raw.command.iter().any(|a| a.contains("{prefix}")) {
        return Err((
            "command".into(),
            "must say where to install with `{prefix}`".into(),
        ));
    }
    let p = &raw.prefix;
    let ok = p.starts_with("/opt/")
        && p.len() > 5
        && p.split('/').skip(1).all(|c| {
            !c.is_empty() && c != "." && c != ".." && c.chars().all(|ch| ch.is_ascii_graphic())
        });
    if !ok {
        return Err((
            "prefix".into(),
            format!("`{p}` must be an absolute path under /opt/ (it is mounted there, read-only)"),
        ));
    }
    for (k, v) in &raw.env {
        let ok_key = !k.is_empty()
            && !k.starts_with(|c: char| c.is_ascii_digit())
            && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !ok_key || v.contains('\0') {
            return Err((
                "env".into(),
                format!("`{k}` is not a valid environment variable"),
            ));
        }
    }
    Ok(super::Install {
        command: raw.command,
        env: raw.env,
        prefix: raw.prefix,
    })
}
