//! The shape of `src/`: modules only import modules below them in the documented order (so
//! there is no import cycle), and the crates that belong to one place stay there.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::common::root;

/// Top to bottom: a module may use only modules listed after it. The same order as the
/// `# Layout` section of `src/lib.rs`.
const LAYERS: &[&str] = &[
    "cli",
    "transport",
    "api",
    "app",
    "mcp",
    "cluster",
    "sessions",
    "runs",
    "history",
    "catalog",
    "images",
    "reaper",
    "executor",
    "live",
    "engine",
    "instance",
    "contract",
    "registry",
    "config",
    "report",
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Top-level module of a file under `src/` (`None` for lib.rs and main.rs).
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).unwrap();
    let first = rel.components().next()?.as_os_str().to_str()?;
    let name = first.trim_end_matches(".rs");
    (name != "lib" && name != "main").then(|| name.to_string())
}

/// The top-level modules a file names as `crate::x`.
fn crate_references(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (i, _) in text.match_indices("crate::") {
        if text[..i].ends_with("$") || text[..i].ends_with("_") {
            continue;
        }
        let rest = &text[i + "crate::".len()..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if !name.is_empty() {
            found.push(name);
        }
    }
    found
}

fn sources() -> Vec<(String, PathBuf, String)> {
    let src = root().join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files
        .into_iter()
        .filter_map(|f| {
            let m = module_of(&src, &f)?;
            let text = std::fs::read_to_string(&f).unwrap();
            Some((m, f, text))
        })
        .collect()
}

#[test]
fn modules_only_import_modules_below_them() {
    let rank: BTreeMap<&str, usize> = LAYERS.iter().enumerate().map(|(i, m)| (*m, i)).collect();
    let mut wrong = Vec::new();
    for (module, file, text) in sources() {
        let Some(&mine) = rank.get(module.as_str()) else {
            wrong.push(format!(
                "{}: module `{module}` is not in LAYERS",
                file.display()
            ));
            continue;
        };
        for dep in crate_references(&text) {
            match rank.get(dep.as_str()) {
                Some(&theirs) if theirs > mine || dep == module => {}
                Some(_) => wrong.push(format!(
                    "{}: `{module}` uses `crate::{dep}`, which is above it",
                    file.display()
                )),
                None => wrong.push(format!(
                    "{}: `crate::{dep}` is not a known module",
                    file.display()
                )),
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn the_layout_docs_list_every_module_in_order() {
    let lib = std::fs::read_to_string(root().join("src/lib.rs")).unwrap();
    let mut at = 0;
    for m in LAYERS {
        let needle = format!("[`{m}`]");
        let Some(i) = lib[at..].find(&needle) else {
            panic!("src/lib.rs `# Layout` lacks {needle} (or lists it out of order)");
        };
        at += i;
    }
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let layout = readme
        .split("## Layout")
        .nth(1)
        .expect("README has a Layout section");
    for m in LAYERS {
        assert!(
            layout.contains(&format!("{m}/")) || layout.contains(&format!("{m}.rs")),
            "README's Layout section does not mention `{m}`"
        );
    }
}

#[test]
fn bollard_clap_and_anyhow_stay_in_their_places() {
    for (module, file, text) in sources() {
        let rel = file.strip_prefix(root()).unwrap().display().to_string();
        if text.contains("bollard::") {
            assert!(rel.starts_with("src/engine/docker/"), "{rel} uses bollard");
        }
        if text.contains("clap::") {
            assert_eq!(module, "cli", "{rel} uses clap");
        }
        if text.contains("anyhow::") {
            assert_eq!(module, "cli", "{rel} uses anyhow");
        }
    }
}
