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
        "csharp",
        "kotlin",
        "scala",
        "clojure",
        "d",
        "fortran",
        "pascal",
        "cobol",
        "erlang",
        "elixir",
        "ocaml",
        "nim",
        "crystal",
        "prolog",
        "racket",
        "scheme",
        "commonlisp",
        "tcl",
        "awk",
        "octave",
        "verilog",
        // Issue 17.
        "ada",
        "algol68",
        "basic",
        "coffeescript",
        "emacslisp",
        "fish",
        "forth",
        "groovy",
        "haxe",
        "icon",
        "jq",
        "llvmir",
        "modula2",
        "nasm",
        "objectivec",
        "pike",
        "raku",
        "rexx",
        "sml",
        "sql",
        "vala",
        "vhdl",
        "wat",
        "zig",
        "zsh",
    ] {
        assert!(r.languages.contains_key(id), "missing language {id}");
    }
    assert!(r.languages.len() >= 60, "{} languages", r.languages.len());
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

fn instructions(text: &str) -> Vec<&str> {
    text.lines()
        .map(str::trim_start)
        .filter(|l| !l.starts_with('#'))
        .collect()
}

#[test]
fn the_base_image_holds_what_every_image_shares() {
    let base = &registry().images["base"];
    let dir = root().join(&base.context);
    let text = std::fs::read_to_string(dir.join("Dockerfile")).unwrap();
    let lines = instructions(&text);
    assert!(lines.iter().any(|l| l.starts_with("FROM debian:bookworm")));
    // Each run's containers lease a uid of 10001..=10064: each needs a passwd entry.
    assert!(text.contains("seq 2 64"), "no sandbox2..sandbox64 users");
    assert!(
        text.contains("-m 1777 /workspace"),
        "/workspace is not 1777"
    );
    assert!(
        text.contains("/usr/local/bin/codebox-init"),
        "no codebox-init"
    );
    assert!(
        text.contains("gcc -std=c11 -static"),
        "codebox-init is not static"
    );
    let install = std::fs::read_to_string(dir.join("codebox-install")).unwrap();
    assert!(install.contains("--no-install-recommends"));
    assert!(
        install.contains("rm -rf /var/lib/apt/lists/*"),
        "keeps apt lists"
    );
    assert!(!lines
        .iter()
        .any(|l| l.starts_with("CMD") || l.starts_with("ENTRYPOINT")));
}

#[test]
fn every_language_image_builds_on_the_base_as_a_sandbox_user() {
    let r = registry();
    let base = &r.images["base"];
    for image in r.images.values().filter(|i| i.name != "base") {
        let dockerfile = root().join(&image.context).join("Dockerfile");
        let text = std::fs::read_to_string(&dockerfile)
            .unwrap_or_else(|e| panic!("{}: {e}", dockerfile.display()));
        let lines = instructions(&text);
        let has = |p: &str| lines.iter().any(|l| l.starts_with(p));
        // The final stage is the image; an earlier stage (unpacking a downloaded wheel) is
        // built on the base too.
        assert_eq!(
            lines.iter().rfind(|l| l.starts_with("FROM")).copied(),
            Some(format!("FROM {}", base.tag).as_str()),
            "{}: not built on the base image",
            image.name
        );
        for from in lines.iter().filter(|l| l.starts_with("FROM")) {
            assert!(
                from.starts_with(&format!("FROM {} AS ", base.tag))
                    || *from == format!("FROM {}", base.tag),
                "{}: a stage not built on the base image: {from}",
                image.name
            );
        }
        assert_eq!(
            lines.iter().rfind(|l| l.starts_with("USER")).copied(),
            Some("USER 10001:10001"),
            "{}: does not end as the sandbox user",
            image.name
        );
        assert!(
            !has("CMD") && !has("ENTRYPOINT"),
            "{}: has CMD or ENTRYPOINT",
            image.name
        );
        assert!(
            !text.contains("apt-get install"),
            "{}: installs without codebox-install (which drops apt's caches)",
            image.name
        );
        assert!(image.tag.starts_with("codebox/"), "{}", image.tag);
        assert!(
            r.languages_of_image(&image.name).next().is_some(),
            "{}: no language uses it",
            image.name
        );
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
        let error = if lang.can_fail_to_compile() {
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

/// The README's language table, as the registry has it.
fn readme_language_table() -> String {
    let r = registry();
    let mut out = format!(
        "{} languages ship (`codebox languages` adds the toolchain versions):\n\n",
        r.languages.len()
    );
    out.push_str("| id | language | image | syntax errors found |\n|---|---|---|---|\n");
    for lang in r.languages.values() {
        let stage = if lang.is_compiled() {
            "by the compile stage"
        } else if lang.check.is_some() {
            "by a check before the run"
        } else {
            "while running"
        };
        out.push_str(&format!(
            "| `{}` | {} | `{}` | {stage} |\n",
            lang.id, lang.display_name, lang.image.tag
        ));
    }
    // A blank line ends the table before the end marker.
    out.push('\n');
    out
}

#[test]
fn the_readme_lists_the_registry_languages() {
    const BEGIN: &str =
        "<!-- languages: kept in step with languages.toml by tests/it/registry_file.rs -->\n";
    const END: &str = "<!-- /languages -->";
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let start = readme
        .find(BEGIN)
        .expect("README.md has no languages marker")
        + BEGIN.len();
    let end = start
        + readme[start..]
            .find(END)
            .expect("README.md has no end marker");
    let expected = readme_language_table();
    assert!(
        readme[start..end] == expected,
        "README.md's language table is out of step with languages.toml; between the markers it should read:\n{expected}"
    );
}
