//! The list of supported languages with their images, versions and the limits in force: the
//! object `list_supported_languages` returns and `codebox languages --json` prints.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::config::Config;
use crate::contract::session_ceilings;
use crate::engine::{ContainerEngine, EngineError};
use crate::images::VERSION_LABEL_PREFIX;
use crate::registry::Registry;
use crate::report::RunLimits;

/// One supported language.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct LanguageInfo {
    /// Id to pass as `language`.
    pub language: String,
    pub display_name: String,
    /// Other names accepted as `language`.
    pub aliases: Vec<String>,
    /// Docker tag runs are created from (e.g. `codebox/python:3.11`).
    pub image: String,
    /// Whether that image is present on the Docker host.
    pub image_present: bool,
    /// Name the code is saved under in the workspace.
    pub source_file: String,
    /// Where the code itself names the file: a regular expression whose first group, when it
    /// matches the code, replaces the stem of `source_file` (Java: `public class Hello` is
    /// saved as `Hello.java`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_name: Option<String>,
    /// File extensions `codebox run` takes as this language (without the dot).
    pub extensions: Vec<String>,
    /// Whether a compile step or syntax check runs first (its failures are `compile_error`).
    pub compiled: bool,
    /// Toolchain version, recorded when the image was built; null if unknown.
    pub version: Option<String>,
    /// Libraries beyond the standard library that programs can use (for Python, the modules
    /// to import), shipped in the image. Programs have no network.
    pub packages: Vec<String>,
    /// The host (and port) of the index `packages` of a request install from, when this
    /// server installs packages for this language; null: a request with `packages` is refused.
    pub package_index: Option<String>,
    /// What a session of this language keeps between executions: `stateful` (the
    /// interpreter's variables, imports and definitions, and the files) or `files`.
    pub session: SessionKind,
}

/// What a language's sessions keep.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SessionKind {
    Stateful,
    Files,
}

/// Default and maximum limits a request may set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct LimitsInfo {
    pub defaults: RunLimits,
    pub ceilings: RunLimits,
    /// The most a session may ask for (`create_session`): a session holds its memory for its
    /// whole life, so its memory is also at most what sessions may hold in all
    /// (`sessions.memory_budget_mb`).
    pub session_ceilings: RunLimits,
}

/// Supported languages and limits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Catalog {
    pub languages: Vec<LanguageInfo>,
    pub limits: LimitsInfo,
}

/// Build the catalog. When the engine cannot be reached, images are reported absent.
pub async fn catalog(
    engine: &dyn ContainerEngine,
    registry: &Registry,
    config: &Config,
) -> Result<Catalog, EngineError> {
    let mut languages = Vec::new();
    let mut images = std::collections::BTreeMap::new();
    for image in registry.images.values() {
        let info = match engine.inspect_image(&image.tag).await {
            Ok(info) => info,
            Err(EngineError::Unreachable { .. }) => None,
            Err(e) => return Err(e),
        };
        images.insert(image.name.clone(), info);
    }
    for lang in registry.languages.values() {
        let info = images.get(&lang.image.name).cloned().flatten();
        languages.push(LanguageInfo {
            language: lang.id.clone(),
            display_name: lang.display_name.clone(),
            aliases: lang.aliases.clone(),
            image: lang.image.tag.clone(),
            image_present: info.is_some(),
            source_file: lang.source_file.clone(),
            source_name: lang.source_name.as_ref().map(|s| s.pattern().to_string()),
            extensions: lang.extensions.clone(),
            compiled: lang.can_fail_to_compile(),
            version: info.and_then(|i| {
                i.labels
                    .get(&format!("{VERSION_LABEL_PREFIX}{}", lang.id))
                    .cloned()
            }),
            packages: lang.packages.clone(),
            package_index: lang
                .install
                .as_ref()
                .and(config.packages.index_for(&lang.id))
                .and_then(|(url, _)| crate::config::Allowed::from_url(url))
                .map(|a| format!("{}:{}", a.host, a.port)),
            session: if lang.is_stateful() {
                SessionKind::Stateful
            } else {
                SessionKind::Files
            },
        });
    }
    Ok(Catalog {
        languages,
        limits: LimitsInfo {
            defaults: config.limits.defaults(),
            ceilings: config.ceilings(),
            session_ceilings: session_ceilings(config),
        },
    })
}
