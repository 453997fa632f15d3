//! Which `languages.toml` a process uses when the `languages` setting names none: the current
//! folder's, else the one that belongs to the executable (beside it, in the checkout whose
//! `target/` holds it, or installed under `../share/codebox/`). Never a path fixed when the
//! binary was compiled: a binary copied or run from elsewhere does not read the sources it
//! was built from without saying so.

use std::path::{Path, PathBuf};

/// File name of a registry: the shipped one is at the project root.
pub const DEFAULT_REGISTRY_FILE: &str = "languages.toml";

/// The registry file chosen, and why that one, as a phrase (`in the current folder`) (for `codebox config` and `codebox doctor`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Located {
    pub path: PathBuf,
    pub why: String,
}

/// No registry file was found where one is looked for.
#[derive(Debug, thiserror::Error)]
#[error("no language registry found: looked for {}; set CODEBOX_LANGUAGES (or --languages) to the languages.toml of a codebox checkout", .tried.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", "))]
pub struct NotFound {
    pub tried: Vec<PathBuf>,
}

/// The registry to use: `configured` (the `languages` setting) when set; else
/// `languages.toml` in `cwd`; else the one of the executable `exe`: beside it, in the
/// checkout it was built in (`<checkout>/target/.../codebox`), or under `../share/codebox/`.
pub fn locate(
    configured: Option<&Path>,
    cwd: &Path,
    exe: Option<&Path>,
) -> Result<Located, NotFound> {
    if let Some(p) = configured {
        return Ok(Located {
            path: p.to_path_buf(),
            why: "set by `languages`: --languages, CODEBOX_LANGUAGES or the config file".into(),
        });
    }
    let mut candidates = vec![(
        cwd.join(DEFAULT_REGISTRY_FILE),
        "in the current folder".to_string(),
    )];
    if let Some(dir) = exe.and_then(Path::parent) {
        candidates.push((
            dir.join(DEFAULT_REGISTRY_FILE),
            "beside the executable".into(),
        ));
        // A cargo build: `<checkout>/target/<profile>/codebox` (or `target/<triple>/<profile>`).
        if let Some(checkout) = dir
            .ancestors()
            .take(3)
            .find(|a| a.file_name().is_some_and(|n| n == "target"))
            .and_then(Path::parent)
        {
            candidates.push((
                checkout.join(DEFAULT_REGISTRY_FILE),
                format!(
                    "of the checkout the executable is in ({})",
                    checkout.display()
                ),
            ));
        }
        if let Some(prefix) = dir.parent() {
            candidates.push((
                prefix.join("share/codebox").join(DEFAULT_REGISTRY_FILE),
                "installed with the executable".into(),
            ));
        }
    }
    match candidates.iter().find(|(p, _)| p.is_file()) {
        Some((path, why)) => Ok(Located {
            path: path.clone(),
            why: why.clone(),
        }),
        None => Err(NotFound {
            tried: candidates.into_iter().map(|(p, _)| p).collect(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn touch(p: &Path) {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, "").unwrap();
    }

    #[test]
    fn the_setting_then_the_current_folder_then_the_executables_own_file() {
        let t = tempfile::tempdir().unwrap();
        let (cwd, checkout) = (t.path().join("work"), t.path().join("checkout"));
        let exe = checkout.join("target/release/codebox");
        touch(&exe);
        std::fs::create_dir_all(&cwd).unwrap();
        // Nothing anywhere: the error names every place looked at.
        let err = locate(None, &cwd, Some(&exe)).unwrap_err().to_string();
        assert!(
            err.contains(&cwd.join("languages.toml").display().to_string()),
            "{err}"
        );
        assert!(
            err.contains(&checkout.join("languages.toml").display().to_string()),
            "{err}"
        );
        assert!(err.contains("CODEBOX_LANGUAGES"), "{err}");
        // The checkout whose target/ holds the executable.
        touch(&checkout.join("languages.toml"));
        let l = locate(None, &cwd, Some(&exe)).unwrap();
        assert_eq!(l.path, checkout.join("languages.toml"));
        assert!(l.why.contains("checkout"), "{}", l.why);
        // The current folder's file beats the executable's.
        touch(&cwd.join("languages.toml"));
        let l = locate(None, &cwd, Some(&exe)).unwrap();
        assert_eq!(l.path, cwd.join("languages.toml"));
        assert!(l.why.contains("current folder"), "{}", l.why);
        // The setting beats both, even when its file is missing (loading then says so).
        let set = t.path().join("elsewhere.toml");
        assert_eq!(locate(Some(&set), &cwd, Some(&exe)).unwrap().path, set);
    }

    #[test]
    fn an_installed_executable_finds_the_registry_installed_with_it() {
        let t = tempfile::tempdir().unwrap();
        let exe = t.path().join("usr/local/bin/codebox");
        touch(&exe);
        let cwd = t.path().join("home");
        std::fs::create_dir_all(&cwd).unwrap();
        touch(&t.path().join("usr/local/share/codebox/languages.toml"));
        let l = locate(None, &cwd, Some(&exe)).unwrap();
        assert_eq!(
            l.path,
            t.path().join("usr/local/share/codebox/languages.toml")
        );
        // A file beside the executable comes first.
        touch(&t.path().join("usr/local/bin/languages.toml"));
        let l = locate(None, &cwd, Some(&exe)).unwrap();
        assert_eq!(l.path, t.path().join("usr/local/bin/languages.toml"));
    }
}
