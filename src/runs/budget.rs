//! What a run holds of the memory budget, and the start-up check that every language can
//! ever be admitted.

use crate::config::Config;
use crate::contract::{RequestError, ValidRequest};
use crate::registry::{Language, Registry};
use crate::report::RunLimits;

/// Memory held by what was opened ahead of time beside the pool (sessions' containers
/// opened ahead): given back when a queued run needs it.
pub trait Ahead: Send + Sync {
    /// Give back at least `mb` if it is held; returns what was freed at once. Called with
    /// the run manager locked: it must not call the run manager.
    fn shed(&self, mb: u64) -> u64;
}

/// A language whose compile stage alone needs more memory than the whole budget.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("setting `runs.memory_budget_mb` = {budget_mb} is invalid: language `{language}` compiles with {compile_mb} MB, which would never fit")]
pub struct BudgetError {
    pub language: String,
    pub compile_mb: u64,
    pub budget_mb: u64,
}

/// Memory a run holds while admitted: its own limit (times the test cases it runs at once),
/// or its compile stage's if larger (the stages' working directories are tmpfs within those
/// limits).
pub fn memory_charge(language: &Language, limits: &RunLimits, parallel: usize) -> u64 {
    let run = limits.memory_mb * parallel as u64;
    if language.is_compiled() {
        run.max(language.compile_limits.memory_mb)
    } else {
        run
    }
}

/// Memory a run holds while admitted: [`memory_charge`], or its install step's container
/// (`packages.install_memory_mb`) if larger when it asks for packages: the install runs
/// inside the run's admission, before its other stages.
pub fn run_charge(valid: &ValidRequest, config: &Config, parallel: usize) -> u64 {
    let charge = memory_charge(&valid.language, &valid.limits, parallel);
    with_install(charge, valid, config)
}

/// Memory a session's execution holds while admitted (the session holds its own): its
/// compile stage's for a compiled language, and its install step's when it asks for packages.
pub fn execution_charge(valid: &ValidRequest, config: &Config) -> u64 {
    let compile = if valid.language.is_compiled() {
        valid.language.compile_limits.memory_mb
    } else {
        0
    };
    with_install(compile, valid, config)
}

/// Whether a run charged `charge_mb` (and its install step) can ever be admitted here.
pub(super) fn fits(
    valid: &ValidRequest,
    config: &Config,
    charge_mb: u64,
) -> Result<(), RequestError> {
    let budget_mb = config.runs.memory_budget_mb;
    let install_mb = config.packages.install_memory_mb;
    if !valid.packages.is_empty() && install_mb > budget_mb {
        return Err(RequestError {
            field: "packages".into(),
            message: format!(
                "installing packages takes {install_mb} MB (packages.install_memory_mb), more than the {budget_mb} MB this server runs at once (runs.memory_budget_mb)"
            ),
        });
    }
    if charge_mb > budget_mb {
        return Err(RequestError {
            field: "limits.memory_mb".into(),
            message: format!(
                "requested {} MB of memory; this server runs at most {budget_mb} MB of runs at once, so the maximum here is {budget_mb} MB",
                valid.limits.memory_mb
            ),
        });
    }
    Ok(())
}

fn with_install(charge: u64, valid: &ValidRequest, config: &Config) -> u64 {
    if valid.packages.is_empty() {
        charge
    } else {
        charge.max(config.packages.install_memory_mb)
    }
}

/// Check that every language's compile stage fits the memory budget (at start).
pub fn check_budget(registry: &Registry, config: &Config) -> Result<(), BudgetError> {
    let budget_mb = config.runs.memory_budget_mb;
    for lang in registry.languages.values() {
        let compile_mb = lang.compile_limits.memory_mb;
        if lang.is_compiled() && compile_mb > budget_mb {
            return Err(BudgetError {
                language: lang.id.clone(),
                compile_mb,
                budget_mb,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn a_compiled_run_is_charged_its_larger_stage() {
        let registry = Registry::parse(
            Path::new("t.toml"),
            r#"
[images.i]
tag = "t"
context = "images/i"

[languages.plain]
display_name = "P"
image = "i"
source_file = "main.p"
run = ["p", "main.p"]

[languages.heavy]
display_name = "H"
image = "i"
source_file = "main.h"
compile = ["cc"]
run = ["./main"]
compile_limits = { memory_mb = 1024, workspace_mb = 256 }
"#,
        )
        .unwrap();
        let limits = RunLimits {
            memory_mb: 512,
            timeout_seconds: 1.0,
            cpus: 1.0,
        };
        assert_eq!(memory_charge(&registry.languages["plain"], &limits, 1), 512);
        assert_eq!(
            memory_charge(&registry.languages["heavy"], &limits, 1),
            1024
        );
        assert_eq!(
            memory_charge(&registry.languages["heavy"], &limits, 3),
            1536,
            "three test cases at once"
        );
    }
}
