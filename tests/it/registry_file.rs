//! The registry we ship: every entry is complete, has an image folder, and smoke samples of
//! each kind.

use codebox::registry::is_safe_file_name;
use codebox::report::Status;

use crate::common::{registry, root};

#[test]
fn shipped_registry_has_the_promised_languages() {
    let r = registry();
    for id in [
        "python",
        "cpp",
        "c",
        "javascript",
        "typescript",
        "go",
        "rust",
        "java",
        "bash",
        "ruby",
        "php",
        "lua",
        "perl",
    ] {
        assert!(r.languages.contains_key(id), "missing language {id}");
    }
    assert!(r.languages.len() >= 14, "{} languages", r.languages.len());
}

#[test]
fn shipped_registry_tables_are_sorted_by_id() {
    let text = std::fs::read_to_string(root().join("languages.toml")).unwrap();
    for prefix in ["[images.", "[languages."] {
        let ids: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix(prefix))
            .map(|l| l.trim_end_matches(']'))
            .collect();
        let mut sorted = ids.clone();
        sorted.sort();
        assert_eq!(ids, sorted, "{prefix}...] tables are not sorted");
    }
}

#[test]
fn every_image_has_a_locked_down_dockerfile() {
    for image in registry().images.values() {
        let dockerfile = root().join(&image.context).join("Dockerfile");
        let text = std::fs::read_to_string(&dockerfile)
            .unwrap_or_else(|e| panic!("{}: {e}", dockerfile.display()));
        let instructions: Vec<&str> = text
            .lines()
            .map(str::trim_start)
            .filter(|l| !l.starts_with('#'))
            .collect();
        let has = |p: &str| instructions.iter().any(|l| l.starts_with(p));
        assert!(
            has("FROM debian:bookworm"),
            "{}: not Debian bookworm based",
            image.name
        );
        assert!(has("USER 10001"), "{}: no non-root USER 10001", image.name);
        assert!(text.contains("/workspace"), "{}: no /workspace", image.name);
        // Runs lease uids 10001..=10064: whichever they get must be able to write the
        // compile-stage workspace, and should have a passwd entry.
        assert!(
            text.contains("-m 1777 /workspace"),
            "{}: /workspace is not 1777",
            image.name
        );
        assert!(
            text.contains("seq 2 64"),
            "{}: no sandbox2..sandbox64 users",
            image.name
        );
        assert!(
            !has("CMD") && !has("ENTRYPOINT"),
            "{}: has CMD or ENTRYPOINT",
            image.name
        );
        assert!(
            text.contains("rm -rf /var/lib/apt/lists"),
            "{}: keeps apt lists",
            image.name
        );
        assert!(image.tag.starts_with("codebox/"), "{}", image.tag);
    }
}

#[test]
fn every_language_entry_is_complete() {
    for lang in registry().languages.values() {
        assert!(
            is_safe_file_name(&lang.source_file),
            "{}: source file",
            lang.id
        );
        assert!(lang.version.is_some(), "{}: no version command", lang.id);
        assert!(
            !lang.extensions.is_empty(),
            "{}: no file extension",
            lang.id
        );
        // Compiled languages run their artifact, not the source; interpreted ones run the source.
        if let Some(compile) = &lang.compile {
            assert!(!compile.is_empty());
        }
        for (k, v) in &lang.env {
            if v.starts_with('/') {
                assert!(
                    v.starts_with("/tmp") || v.starts_with("/workspace") || v.starts_with("/usr"),
                    "{}: env {k}={v} points outside /tmp and /workspace",
                    lang.id
                );
            }
        }
    }
}

#[test]
fn every_language_has_the_four_kinds_of_smoke_sample() {
    for lang in registry().languages.values() {
        let t = &lang.tests;
        let hello = t.iter().any(|s| {
            s.expect.status == Status::Succeeded
                && s.stdin.is_none()
                && s.expect.stdout.as_deref() == Some("hello\n")
        });
        let stdin = t.iter().any(|s| {
            s.expect.status == Status::Succeeded && s.stdin.is_some() && s.expect.stdout.is_some()
        });
        let exit = t.iter().any(|s| {
            s.expect.status == Status::Failed && matches!(s.expect.exit_code, Some(c) if c != 0)
        });
        let error = if lang.is_compiled() {
            t.iter().any(|s| {
                s.expect.status == Status::CompileError && s.expect.stderr_contains.is_some()
            })
        } else {
            t.iter()
                .any(|s| s.expect.status == Status::Failed && s.expect.stderr_contains.is_some())
        };
        assert!(
            hello && stdin && exit && error,
            "{}: hello {hello}, stdin {stdin}, exit {exit}, error {error}",
            lang.id
        );
    }
}

#[test]
fn every_extension_maps_to_one_language() {
    let r = registry();
    let mut seen = std::collections::BTreeMap::new();
    for lang in r.languages.values() {
        for ext in &lang.extensions {
            if let Some(other) = seen.insert(ext.clone(), lang.id.clone()) {
                panic!("extension .{ext} is claimed by {other} and {}", lang.id);
            }
        }
    }
}
