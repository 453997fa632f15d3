//! Where settings come from: the file's TOML table, `CODEBOX_*` variables and `--set` items,
//! each placed by its path in the structs' schema.

use super::validate::validate;
use super::*;

/// Resolve the configuration of this process: `file` (if any), then the variables `env`
/// returns (injected so tests need no real environment), then `--set` items; validate.
pub fn resolve(
    file: Option<&Path>,
    env: impl Fn(&str) -> Option<String>,
    sets: &[String],
) -> Result<Config, ConfigError> {
    let mut table = match file {
        None => toml::Table::new(),
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                path: path.to_path_buf(),
                source,
            })?;
            parse_table(&text).map_err(|message| ConfigError::Parse {
                path: path.to_path_buf(),
                message,
            })?
        }
    };
    let settings = Config::settings();
    for s in &settings {
        // The section-qualified name wins over the short one.
        let found = std::iter::once(&s.env)
            .chain(&s.env_short)
            .find_map(|var| env(var).filter(|v| !v.is_empty()).map(|v| (var, v)));
        if let Some((var, value)) = found {
            set_in(&mut table, s, &value, Source::Env(var.clone()))?;
        }
    }
    for item in sets {
        let Some((path, value)) = item.split_once('=') else {
            return Err(ConfigError::SetSyntax { item: item.clone() });
        };
        let path = path.trim();
        let Some(s) = settings.iter().find(|s| s.path == path) else {
            return Err(ConfigError::Unknown {
                setting: path.to_string(),
                origin: Source::Flag,
                nearest: nearest(path, settings.iter().map(|s| s.path.as_str())),
            });
        };
        set_in(&mut table, s, value, Source::Flag)?;
    }
    let mut config = from_table(table, file)?;
    config.docker = config.docker.or_docker_env(env);
    validate(&config)?;
    Ok(config)
}

/// Parse and validate config-file text on its own (no variables, no flags).
pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
    let table = parse_table(text).map_err(|message| ConfigError::Parse {
        path: PathBuf::new(),
        message,
    })?;
    let config = from_table(table, None)?;
    validate(&config)?;
    Ok(config)
}

/// The typed configuration of a table; an error names the setting it is about.
pub(super) fn from_table(table: toml::Table, file: Option<&Path>) -> Result<Config, ConfigError> {
    serde_path_to_error::deserialize(toml::Value::Table(table)).map_err(|e| {
        let setting = e.path().to_string();
        let message = e.into_inner().message().to_string();
        ConfigError::Parse {
            path: file.map(Path::to_path_buf).unwrap_or_default(),
            message: if setting.is_empty() || setting == "." {
                message
            } else {
                format!("setting `{setting}`: {message}")
            },
        }
    })
}

pub(super) fn parse_table(text: &str) -> Result<toml::Table, String> {
    toml::from_str(text).map_err(|e: toml::de::Error| e.message().to_string())
}

pub(super) fn last_key(path: &str) -> &str {
    path.rsplit('.').next().unwrap_or(path)
}

pub(super) fn env_name(path: &str) -> String {
    format!(
        "{ENV_PREFIX}{}",
        path.replace('.', "_").to_ascii_uppercase()
    )
}

/// Walk a JSON schema object's properties, recursing into nested sections.
pub(super) fn collect_settings(
    schema: &serde_json::Value,
    defs: &serde_json::Value,
    prefix: &str,
    out: &mut Vec<Setting>,
) {
    let Some(props) = schema.get("properties").and_then(|p| p.as_object()) else {
        return;
    };
    for (key, prop) in props {
        let path = if prefix.is_empty() {
            key.clone()
        } else {
            format!("{prefix}.{key}")
        };
        let resolved = resolve_ref(prop, defs);
        if resolved.get("properties").is_some() {
            collect_settings(&resolved, defs, &path, out);
            continue;
        }
        let doc = prop
            .get("description")
            .or_else(|| resolved.get("description"))
            .and_then(|d| d.as_str())
            .unwrap_or("")
            .to_string();
        let choices = resolved
            .get("enum")
            .and_then(|e| e.as_array())
            .map(|vs| {
                vs.iter()
                    .filter_map(|v| v.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        out.push(Setting {
            env: env_name(&path),
            env_short: None,
            env_fallback: None,
            choices,
            kind: kind_of(&resolved),
            path,
            doc,
        });
    }
}

pub(super) fn resolve_ref(prop: &serde_json::Value, defs: &serde_json::Value) -> serde_json::Value {
    match prop.get("$ref").and_then(|r| r.as_str()) {
        Some(r) => defs
            .get(r.trim_start_matches("#/$defs/"))
            .cloned()
            .unwrap_or_default(),
        None => prop.clone(),
    }
}

pub(super) fn kind_of(schema: &serde_json::Value) -> Kind {
    let types: Vec<&str> = match schema.get("type") {
        Some(serde_json::Value::String(t)) => vec![t.as_str()],
        Some(serde_json::Value::Array(ts)) => ts.iter().filter_map(|t| t.as_str()).collect(),
        _ => Vec::new(),
    };
    let has = |t: &str| types.contains(&t);
    if has("integer") {
        Kind::Integer
    } else if has("number") {
        Kind::Number
    } else if has("boolean") {
        Kind::Boolean
    } else if has("array") {
        Kind::List
    } else if has("object") {
        Kind::Table
    } else {
        // Strings, paths and the enums (`one of`).
        Kind::Text
    }
}

/// Put one textual value into the config table at the setting's path, converted to its kind.
pub(super) fn set_in(
    table: &mut toml::Table,
    setting: &Setting,
    text: &str,
    source: Source,
) -> Result<(), ConfigError> {
    let type_error = || ConfigError::Type {
        setting: setting.path.clone(),
        value: format!("{text:?}"),
        expected: setting.kind.name(),
        origin: source.clone(),
    };
    let t = text.trim();
    let value = match setting.kind {
        Kind::Integer => toml::Value::Integer(t.parse().map_err(|_| type_error())?),
        Kind::Number => {
            let v: f64 = t.parse().map_err(|_| type_error())?;
            toml::Value::Float(v)
        }
        Kind::Boolean => toml::Value::Boolean(t.parse().map_err(|_| type_error())?),
        Kind::Text if !setting.choices.is_empty() && !setting.choices.iter().any(|c| c == t) => {
            return Err(ConfigError::Invalid {
                setting: setting.path.clone(),
                value: format!("{text:?} ({source})"),
                reason: format!("must be one of {}", setting.choices.join(", ")),
            });
        }
        Kind::Text => toml::Value::String(t.to_string()),
        Kind::List if t.starts_with('[') => inline_value(t).ok_or_else(type_error)?,
        Kind::List => toml::Value::Array(
            t.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|s| toml::Value::String(s.to_string()))
                .collect(),
        ),
        Kind::Table => inline_value(t)
            .filter(|v| v.is_table())
            .ok_or_else(type_error)?,
    };
    let mut node = table;
    let parts: Vec<&str> = setting.path.split('.').collect();
    for part in &parts[..parts.len() - 1] {
        let entry = node
            .entry(part.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        let Some(inner) = entry.as_table_mut() else {
            return Err(ConfigError::Unknown {
                setting: setting.path.clone(),
                origin: source,
                nearest: None,
            });
        };
        node = inner;
    }
    node.insert(parts[parts.len() - 1].to_string(), value);
    Ok(())
}

/// A TOML value written inline (`[1, 2]`, `{ a = 1 }`).
pub(super) fn inline_value(text: &str) -> Option<toml::Value> {
    let table: toml::Table = toml::from_str(&format!("v = {text}")).ok()?;
    table.get("v").cloned()
}

/// The candidate nearest to `typo` by edit distance, if it is near enough to be what was
/// meant (at most a quarter of its length, and at least 2, edits away).
pub(super) fn nearest<'a>(typo: &str, candidates: impl Iterator<Item = &'a str>) -> Option<String> {
    let distance = |a: &str, b: &str| -> usize {
        let b: Vec<char> = b.chars().collect();
        let mut row: Vec<usize> = (0..=b.len()).collect();
        for (i, ca) in a.chars().enumerate() {
            let mut prev = row[0];
            row[0] = i + 1;
            for (j, cb) in b.iter().enumerate() {
                let next = (row[j + 1] + 1)
                    .min(row[j] + 1)
                    .min(prev + usize::from(ca != *cb));
                prev = row[j + 1];
                row[j + 1] = next;
            }
        }
        row[b.len()]
    };
    let budget = (typo.chars().count() / 4).max(2);
    candidates
        .map(|c| (distance(typo, c), c))
        .filter(|(d, _)| *d <= budget)
        .min()
        .map(|(_, c)| c.to_string())
}

/// The `CODEBOX_*` variables among `names` that are neither a setting's nor one of
/// `RESERVED_ENV`, each with the known variable nearest to it: typos that would
/// otherwise be ignored without a word.
pub fn unknown_env(names: impl Iterator<Item = String>) -> Vec<(String, Option<String>)> {
    let settings = Config::settings();
    let known: Vec<String> = settings
        .iter()
        .flat_map(|s| {
            std::iter::once(s.env.clone())
                .chain(s.env_short.clone())
                .chain(s.env_fallback.clone())
        })
        .chain(RESERVED_ENV.iter().map(|v| v.to_string()))
        .collect();
    names
        .filter(|n| n.starts_with(ENV_PREFIX) && !known.contains(n))
        .map(|n| {
            let near = nearest(&n, known.iter().map(String::as_str));
            (n, near)
        })
        .collect()
}
