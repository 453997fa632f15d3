//! [`defaults_toml`]: every setting at its shipped default, as a config file with each
//! setting's documentation (`codebox config --defaults`; docs/mcp.md shows the same text, and
//! a test keeps the two equal).

use super::*;

/// Example values of the settings that are unset by default (written commented out), and of
/// `data_dir`, whose default depends on the user.
const EXAMPLES: [(&str, &str); 16] = [
    ("cluster.advertise_url", "\"http://10.0.0.2:8765\""),
    ("cluster.secret_file", "\"/etc/codebox/cluster-secret\""),
    ("data_dir", "\"/var/lib/codebox\""),
    ("languages", "\"/etc/codebox/languages.toml\""),
    ("docker.build_network", "\"host\""),
    ("docker.cert_path", "\"/etc/codebox/docker\""),
    ("docker.host", "\"tcp://docker.example:2376\""),
    ("docker.tls_verify", "true"),
    ("history.password_file", "\"/etc/codebox/pg-password\""),
    ("history.path", "\"/var/lib/codebox/history.sqlite3\""),
    (
        "history.url",
        "\"postgres://codebox@db.internal/codebox?sslmode=verify-full&sslrootcert=/etc/codebox/pg-ca.pem\"",
    ),
    ("http.token_file", "\"/etc/codebox/token\""),
    ("packages.install_runtime", "\"runc\""),
    ("packages.javascript.registry_url", "\"https://registry.npmjs.org\""),
    ("packages.python.index_url", "\"https://pypi.org/simple\""),
    ("sessions.memory_budget_mb", "4096"),
];

/// Longest comment line written, `# ` included.
const WIDTH: usize = 96;

/// Every setting at its shipped default, grouped by section, each under the first
/// paragraph of its documentation. A setting unset by default is written commented out
/// with an example value, and so is `data_dir` (its default is the user's data folder).
/// Uncommented as it is, the text reads back as [`Config::default`].
pub fn defaults_toml() -> String {
    let root = serde_json::to_value(schemars::schema_for!(Config)).unwrap_or_default();
    let defs = root.get("$defs").cloned().unwrap_or_default();
    let values: toml::Table = toml::from_str(&Config::default().to_toml()).unwrap_or_default();
    let settings = Config::settings();
    let mut out = String::new();
    let mut section = String::new();
    // Top-level settings first: TOML puts every key after a header into that section.
    let mut ordered: Vec<&Setting> = settings.iter().filter(|s| !s.path.contains('.')).collect();
    let mut nested: Vec<&Setting> = settings.iter().filter(|s| s.path.contains('.')).collect();
    // A section's own keys, then its subsections' (`[packages]`, `[packages.python]`).
    nested.sort_by_key(|s| s.path.rsplit_once('.').map_or("", |(h, _)| h));
    ordered.extend(nested);
    for s in ordered {
        let (head, key) = s.path.rsplit_once('.').unwrap_or(("", &s.path));
        if head != section {
            section = head.to_string();
            let doc = head
                .split('.')
                .try_fold(root.clone(), |node, h| {
                    node.get("properties")
                        .and_then(|p| p.get(h))
                        .map(|p| sources::resolve_ref(p, &defs).clone())
                })
                .as_ref()
                .and_then(|p| {
                    p.get("description")
                        .and_then(|d| d.as_str())
                        .map(str::to_string)
                })
                .unwrap_or_default();
            out.push_str(&format!("\n[{head}]\n"));
            comment(&mut out, &doc);
            out.push('\n');
        }
        comment(&mut out, &s.doc);
        let value = head
            .split('.')
            .filter(|h| !h.is_empty())
            .try_fold(&values, |t, h| t.get(h).and_then(|v| v.as_table()))
            .and_then(|t| t.get(key));
        let example = EXAMPLES.iter().find(|(p, _)| *p == s.path).map(|(_, e)| *e);
        match (value, example) {
            (Some(v), None) => out.push_str(&format!("{key} = {v}\n")),
            (_, Some(e)) => out.push_str(&format!("# {key} = {e}\n")),
            (None, None) => out.push_str(&format!("# {key} = (unset)\n")),
        }
    }
    out.trim_start().to_string()
}

/// The first paragraph of `doc` as `# ` lines of at most [`WIDTH`] characters.
fn comment(out: &mut String, doc: &str) {
    let first = doc.split("\n\n").next().unwrap_or("");
    let mut line = String::from("#");
    for word in first.split_whitespace() {
        if line.len() + 1 + word.len() > WIDTH && line.len() > 1 {
            out.push_str(&line);
            out.push('\n');
            line = String::from("#");
        }
        line.push(' ');
        line.push_str(word);
    }
    if line.len() > 1 {
        out.push_str(&line);
        out.push('\n');
    }
}
