//! The language registry, loaded from `languages.toml` in two steps: raw serde types that
//! reject unknown fields, then validated types whose errors name the file, the language and
//! the field.

mod locate;
mod raw;
mod source_name;
mod validate;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::report::Status;

pub use locate::{locate, Located, NotFound, DEFAULT_REGISTRY_FILE};
pub(crate) use source_name::SourceName;
pub use validate::is_safe_file_name;
use validate::{is_identifier, is_safe_relative, serde_field, validate_language, IDENT_RULE};

/// Compile-stage limits of a language whose entry sets no `compile_limits`.
pub(crate) const DEFAULT_COMPILE_TIMEOUT_SECONDS: f64 = 60.0;
pub(crate) const DEFAULT_COMPILE_MEMORY_MB: u64 = 1024;
pub(crate) const DEFAULT_COMPILE_CPUS: f64 = 1.0;
pub(crate) const DEFAULT_COMPILE_WORKSPACE_MB: u64 = 256;

/// An image languages run in.
#[derive(Debug, Clone, PartialEq)]
pub struct Image {
    pub name: String,
    /// Docker tag containers are created from.
    pub tag: String,
    /// Dockerfile folder, relative to the registry file's folder.
    pub context: PathBuf,
}

/// Limits of a compile stage, set by the operator.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CompileLimits {
    pub timeout_seconds: f64,
    pub memory_mb: u64,
    pub cpus: f64,
    /// Size of the compile stage's working directory (a tmpfs, counted against `memory_mb`),
    /// which bounds what a compiler, and any user code it runs at compile time (Template
    /// Haskell, macros), can write. At most half of `memory_mb`.
    pub workspace_mb: u64,
}

/// What a smoke sample expects.
#[derive(Debug, Clone, PartialEq)]
pub struct Expect {
    pub status: Status,
    pub stdout: Option<String>,
    pub stderr_contains: Option<String>,
    pub exit_code: Option<i64>,
}

/// A smoke sample run by `codebox smoke` and CI.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub code: String,
    pub stdin: Option<String>,
    pub args: Vec<String>,
    pub expect: Expect,
}

/// How the Piston-compatible API (`/api/v2`) names a language.
#[derive(Debug, Clone, PartialEq)]
pub struct PistonName {
    /// Its `language` in `/api/v2/runtimes` (default: the language's id), e.g. `c++`.
    pub language: String,
    /// Names accepted besides it, the language's id and its aliases (e.g. `c#`).
    pub aliases: Vec<String>,
}

/// Highest Judge0 language id a registry may use.
pub(crate) const MAX_JUDGE0_ID: i64 = 999_999;

/// One language, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct Language {
    pub id: String,
    pub display_name: String,
    pub aliases: Vec<String>,
    pub extensions: Vec<String>,
    pub image: Image,
    pub source_file: String,
    /// How a program renames its source file (and `{name}` in the commands), if it can.
    pub source_name: Option<SourceName>,
    pub compile: Option<Vec<String>>,
    /// A syntax check run in the run stage's container right before the program (no extra
    /// container); a non-zero exit is `compile_error`. For interpreters whose checker finds
    /// syntax errors without running anything (Python compiles the source).
    pub check: Option<Vec<String>>,
    pub run: Vec<String>,
    /// The check and the program in one process, so that a run starts the interpreter once:
    /// the command checks the source as `check` does (same verdict, same message), says
    /// `compiled` on fd 3, and runs the program once `codebox-init` answers on fd 4
    /// (`docs/sandbox-init.md`, "One interpreter start"). Runs use it instead of `check` then
    /// `run`; sessions' files-only executions keep those two.
    pub checked_run: Option<Vec<String>>,
    pub version: Option<Vec<String>>,
    pub env: BTreeMap<String, String>,
    /// Libraries beyond the standard library the image offers, by the name a program uses
    /// (for Python, the module to import).
    pub packages: Vec<String>,
    pub compile_limits: CompileLimits,
    /// Judge0 CE language ids served by this language; the first is the one reported for a
    /// run whose id is not known. Unique across the registry.
    pub judge0_ids: Vec<u32>,
    pub piston: PistonName,
    /// The session driver (a program in the image that keeps an interpreter's state between
    /// the executions of a session); `None`: sessions keep files only.
    pub session_driver: Option<Vec<String>>,
    /// How requested packages are installed (SPEC 13); `None`: this language takes none.
    pub install: Option<Install>,
    pub tests: Vec<Sample>,
}

/// How a language's package manager installs requested packages into a prefix.
#[derive(Debug, Clone, PartialEq)]
pub struct Install {
    /// The command; `{prefix}` is where it installs, `{index}` the operator's index URL;
    /// the requirements are appended.
    pub command: Vec<String>,
    /// The program's extra environment, pointing into `prefix`.
    pub env: BTreeMap<String, String>,
    /// Where the program's container mounts the installed prefix, read-only.
    pub prefix: String,
}

impl Language {
    /// Name the source file after `code` where the language says how (the first group of
    /// its `source_name` pattern, when it matches and makes a plain file name); otherwise
    /// the language stays as it is.
    pub(crate) fn name_after(&mut self, code: &str) {
        let named = self
            .source_name
            .as_ref()
            .and_then(|rule| rule.named_after(&self.source_file, code));
        if let Some(n) = named {
            (self.source_file, self.compile, self.check, self.run) =
                (n.source_file, n.compile, n.check, n.run);
        }
    }

    /// Sessions of this language keep the interpreter's state, not only files.
    pub fn is_stateful(&self) -> bool {
        self.session_driver.is_some()
    }

    /// A compile stage runs in a container of its own.
    pub fn is_compiled(&self) -> bool {
        self.compile.is_some()
    }

    /// A compile step or a syntax check can end a run as `compile_error`.
    pub fn can_fail_to_compile(&self) -> bool {
        self.compile.is_some() || self.check.is_some()
    }
}

/// All languages and images of one registry file.
#[derive(Debug, Clone)]
pub struct Registry {
    pub path: PathBuf,
    pub images: BTreeMap<String, Image>,
    pub languages: BTreeMap<String, Language>,
}

/// A problem in the registry file, naming the file, the language (or image) and the field.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Syntax { path: PathBuf, message: String },
    #[error("{path}: {section} `{name}`: field `{field}`: {message}")]
    Field {
        path: PathBuf,
        section: &'static str,
        name: String,
        field: String,
        message: String,
    },
}

impl Registry {
    /// Read and validate a registry file.
    pub fn load(path: &Path) -> Result<Registry, RegistryError> {
        let text = std::fs::read_to_string(path).map_err(|source| RegistryError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Registry::parse(path, &text)
    }

    /// Validate registry text; `path` is used in messages only.
    pub fn parse(path: &Path, text: &str) -> Result<Registry, RegistryError> {
        let syntax = |message: String| RegistryError::Syntax {
            path: path.to_path_buf(),
            message,
        };
        let table: toml::Table = toml::from_str(text).map_err(|e| syntax(e.to_string()))?;
        let mut images_raw = toml::Table::new();
        let mut languages_raw = toml::Table::new();
        for (key, value) in table {
            let target = match key.as_str() {
                "images" => &mut images_raw,
                "languages" => &mut languages_raw,
                _ => {
                    return Err(syntax(format!(
                        "unknown top-level table `{key}`; expected `images` or `languages`"
                    )))
                }
            };
            match value {
                toml::Value::Table(t) => *target = t,
                _ => return Err(syntax(format!("`{key}` must be a table"))),
            }
        }
        let field = |section: &'static str, name: &str, field: &str, message: String| {
            RegistryError::Field {
                path: path.to_path_buf(),
                section,
                name: name.to_string(),
                field: field.to_string(),
                message,
            }
        };

        let mut images = BTreeMap::new();
        for (name, value) in images_raw {
            let raw = raw::RawImage::deserialize(value)
                .map_err(|e| field("image", &name, &serde_field(&e), e.message().to_string()))?;
            if !is_identifier(&name) {
                return Err(field("image", &name, "name", IDENT_RULE.to_string()));
            }
            if raw.tag.trim().is_empty() || raw.tag.contains(char::is_whitespace) {
                return Err(field("image", &name, "tag", "must be a Docker tag".into()));
            }
            let context = PathBuf::from(&raw.context);
            if !is_safe_relative(&raw.context) {
                return Err(field(
                    "image",
                    &name,
                    "context",
                    "must be a relative path inside the project, without `..`".into(),
                ));
            }
            images.insert(
                name.clone(),
                Image {
                    name,
                    tag: raw.tag,
                    context,
                },
            );
        }

        let mut languages = BTreeMap::new();
        let mut names: BTreeMap<String, String> = BTreeMap::new();
        let mut judge0: BTreeMap<u32, String> = BTreeMap::new();
        for (id, value) in languages_raw {
            let raw = raw::RawLanguage::deserialize(value)
                .map_err(|e| field("language", &id, &serde_field(&e), e.message().to_string()))?;
            let lang = validate_language(&id, raw, &images)
                .map_err(|(f, m)| field("language", &id, &f, m))?;
            // Every name a client may use, in any API, means one language.
            let own: std::collections::BTreeSet<&String> = std::iter::once(&lang.id)
                .chain(&lang.aliases)
                .chain(std::iter::once(&lang.piston.language))
                .chain(&lang.piston.aliases)
                .collect();
            for name in own {
                if let Some(other) = names.insert(name.clone(), lang.id.clone()) {
                    let which = if name == &lang.id || lang.aliases.contains(name) {
                        "aliases"
                    } else {
                        "piston"
                    };
                    return Err(field(
                        "language",
                        &id,
                        which,
                        format!("`{name}` is already used by language `{other}`"),
                    ));
                }
            }
            for n in &lang.judge0_ids {
                if let Some(other) = judge0.insert(*n, lang.id.clone()) {
                    return Err(field(
                        "language",
                        &id,
                        "judge0_ids",
                        format!("id {n} is already used by language `{other}`"),
                    ));
                }
            }
            languages.insert(id, lang);
        }
        Ok(Registry {
            path: path.to_path_buf(),
            images,
            languages,
        })
    }

    /// Find a language by id or alias (case-insensitive).
    pub fn resolve(&self, name: &str) -> Option<&Language> {
        let name = name.trim().to_ascii_lowercase();
        self.languages
            .get(&name)
            .or_else(|| self.languages.values().find(|l| l.aliases.contains(&name)))
    }

    /// Find a language by its name in the Piston-compatible API: its Piston name or Piston
    /// aliases, else its id or aliases (case-insensitive).
    pub(crate) fn resolve_piston(&self, name: &str) -> Option<&Language> {
        let name = name.trim().to_ascii_lowercase();
        self.languages
            .values()
            .find(|l| l.piston.language == name || l.piston.aliases.contains(&name))
            .or_else(|| self.resolve(&name))
    }

    /// The language serving a Judge0 language id.
    pub fn by_judge0_id(&self, id: i64) -> Option<&Language> {
        let id = u32::try_from(id).ok()?;
        self.languages.values().find(|l| l.judge0_ids.contains(&id))
    }

    /// Guess a language from a file name's extension.
    pub(crate) fn for_file(&self, file: &Path) -> Option<&Language> {
        let ext = file.extension()?.to_str()?.to_ascii_lowercase();
        self.languages
            .values()
            .find(|l| l.extensions.contains(&ext))
    }

    /// The folder image contexts are relative to.
    pub fn root(&self) -> &Path {
        self.path.parent().unwrap_or(Path::new("."))
    }

    /// Languages served by one image.
    pub fn languages_of_image<'a>(&'a self, image: &'a str) -> impl Iterator<Item = &'a Language> {
        self.languages
            .values()
            .filter(move |l| l.image.name == image)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINI: &str = r#"
[images.python]
tag = "codebox/python:3.11"
context = "images/python"

[languages.python]
display_name = "Python 3"
aliases = ["py"]
image = "python"
source_file = "main.py"
run = ["python3", "main.py"]
"#;

    #[test]
    fn minimal_registry_loads_and_resolves_aliases() {
        let r = Registry::parse(Path::new("x.toml"), MINI).unwrap();
        assert_eq!(r.resolve("PY").unwrap().id, "python");
        assert_eq!(r.for_file(Path::new("a/b.py")).unwrap().id, "python");
        assert!(r.resolve("cobol").is_none());
    }

    #[test]
    fn unknown_field_error_names_file_language_and_field() {
        let text = MINI.replace("run = [", "color = \"red\"\nrun = [");
        let msg = Registry::parse(Path::new("langs.toml"), &text)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("langs.toml"), "{msg}");
        assert!(msg.contains("`python`"), "{msg}");
        assert!(msg.contains("color"), "{msg}");
    }

    #[test]
    fn unknown_image_key_is_rejected_with_the_field() {
        let text = MINI.replace("image = \"python\"", "image = \"pyth\"");
        let msg = Registry::parse(Path::new("l.toml"), &text)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("field `image`"), "{msg}");
        assert!(msg.contains("pyth"), "{msg}");
    }

    #[test]
    fn judge0_ids_and_piston_names_are_checked_and_unique() {
        let two = format!(
            "{MINI}\n[languages.ruby]\ndisplay_name = \"Ruby\"\nimage = \"python\"\nsource_file = \"main.rb\"\nrun = [\"ruby\", \"main.rb\"]\n"
        );
        let with = |py: &str, rb: &str| {
            two.replace("aliases = [\"py\"]", &format!("aliases = [\"py\"]\n{py}"))
                .replace(
                    "display_name = \"Ruby\"",
                    &format!("display_name = \"Ruby\"\n{rb}"),
                )
        };
        let r = Registry::parse(
            Path::new("l.toml"),
            &with(
                "judge0_ids = [71, 1001]\npiston = { language = \"python3\", aliases = [\"py3\"] }",
                "judge0_ids = [72]",
            ),
        )
        .unwrap();
        assert_eq!(r.by_judge0_id(1001).unwrap().id, "python");
        assert_eq!(r.by_judge0_id(72).unwrap().id, "ruby");
        assert!(r.by_judge0_id(73).is_none() && r.by_judge0_id(-1).is_none());
        assert_eq!(r.resolve_piston("PY3").unwrap().id, "python");
        assert_eq!(r.resolve_piston("ruby").unwrap().piston.language, "ruby");
        for (py, rb, wanted) in [
            (
                "judge0_ids = [71]",
                "judge0_ids = [71]",
                "judge0_ids`: id 71 is already used by language `python`",
            ),
            ("judge0_ids = [0]", "", "judge0_ids`: 0 is not an id"),
            ("judge0_ids = [5, 5]", "", "5 appears twice"),
            (
                "piston = { aliases = [\"rb\"] }",
                "aliases = [\"rb\"]",
                "`rb` is already used by language `python`",
            ),
            ("piston = { language = \"Py\" }", "", "field `piston`"),
            ("piston = { color = 1 }", "", "color"),
        ] {
            let msg = Registry::parse(Path::new("l.toml"), &with(py, rb))
                .unwrap_err()
                .to_string();
            assert!(msg.contains(wanted), "{py} / {rb}: {msg}");
        }
    }

    #[test]
    fn unsafe_source_file_is_rejected() {
        for bad in ["../x.py", "/etc/x", ".hidden", "a/b.py", ""] {
            let text = MINI.replace("\"main.py\"", &format!("{bad:?}"));
            let msg = Registry::parse(Path::new("l.toml"), &text)
                .unwrap_err()
                .to_string();
            assert!(msg.contains("source_file"), "{bad}: {msg}");
        }
    }

    #[test]
    fn a_session_driver_is_a_command_and_makes_the_language_stateful() {
        let r = Registry::parse(Path::new("l.toml"), MINI).unwrap();
        assert!(!r.languages["python"].is_stateful());
        let text = MINI.replace("run = [", "session = { driver = [\"py-driver\"] }\nrun = [");
        let r = Registry::parse(Path::new("l.toml"), &text).unwrap();
        assert_eq!(
            r.languages["python"].session_driver.as_deref(),
            Some(&["py-driver".to_string()][..])
        );
        for bad in [
            "session = { driver = [] }",
            "session = { driver = [\"\"] }",
            "session = { drive = [\"x\"] }",
        ] {
            let text = MINI.replace("run = [", &format!("{bad}\nrun = ["));
            let msg = Registry::parse(Path::new("l.toml"), &text)
                .unwrap_err()
                .to_string();
            assert!(msg.contains("driver"), "{bad}: {msg}");
        }
    }

    #[test]
    fn a_checked_run_is_a_command_and_comes_with_its_check() {
        let with = |extra: &str| MINI.replace("run = [", &format!("{extra}\nrun = ["));
        let ok = with("check = [\"py-check\"]\nchecked_run = [\"py-both\"]");
        let r = Registry::parse(Path::new("l.toml"), &ok).unwrap();
        assert_eq!(
            r.languages["python"].checked_run.as_deref(),
            Some(&["py-both".to_string()][..])
        );
        for bad in [
            "checked_run = [\"py-both\"]",
            "check = [\"py-check\"]\nchecked_run = []",
        ] {
            let msg = Registry::parse(Path::new("l.toml"), &with(bad))
                .unwrap_err()
                .to_string();
            assert!(msg.contains("field `checked_run`"), "{bad}: {msg}");
        }
    }
}
