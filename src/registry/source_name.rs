//! Source files named after the program (`source_name` in `languages.toml`): javac wants a
//! public class in a file of its name, so a Java program declaring `public class Hello` is
//! saved as `Hello.java` and run as `Hello`. `{name}` in a language's commands stands for the
//! source file's stem: `source_file`'s, or the one the program gives.

use super::validate::is_safe_file_name;

/// The longest compiled pattern accepted (regex's own measure of its program).
const MAX_PATTERN_SIZE: usize = 1 << 20;

/// A language's rule for naming its source file after the program.
#[derive(Debug, Clone)]
pub struct SourceName {
    pattern: regex::Regex,
    /// `compile`, `check` and `run` as written, `{name}` not yet replaced.
    compile: Option<Vec<String>>,
    check: Option<Vec<String>>,
    run: Vec<String>,
}

impl PartialEq for SourceName {
    fn eq(&self, other: &Self) -> bool {
        self.pattern.as_str() == other.pattern.as_str()
            && (&self.compile, &self.check, &self.run) == (&other.compile, &other.check, &other.run)
    }
}

impl SourceName {
    /// Compile `pattern` (it needs a group: the name); the commands are kept as written.
    pub(super) fn new(
        pattern: &str,
        compile: Option<Vec<String>>,
        check: Option<Vec<String>>,
        run: Vec<String>,
    ) -> Result<SourceName, String> {
        let pattern = regex::RegexBuilder::new(pattern)
            .size_limit(MAX_PATTERN_SIZE)
            .build()
            .map_err(|e| format!("is not a regular expression: {e}"))?;
        if pattern.captures_len() < 2 {
            return Err("needs a group, `(...)`, that captures the name".into());
        }
        Ok(SourceName {
            pattern,
            compile,
            check,
            run,
        })
    }

    pub(crate) fn pattern(&self) -> &str {
        self.pattern.as_str()
    }
}

/// `source_file` without its extension, and the extension with its dot (`Main`, `.java`).
pub(super) fn split_name(source_file: &str) -> (&str, &str) {
    match source_file.rfind('.') {
        Some(i) if i > 0 => source_file.split_at(i),
        _ => (source_file, ""),
    }
}

/// A command with `{name}` replaced by `stem`.
pub(super) fn fill(command: &[String], stem: &str) -> Vec<String> {
    command.iter().map(|a| a.replace("{name}", stem)).collect()
}

/// The names a program gives its source file and commands ([`SourceName::named_after`]).
pub(super) struct Named {
    pub source_file: String,
    pub compile: Option<Vec<String>>,
    pub check: Option<Vec<String>>,
    pub run: Vec<String>,
}

impl SourceName {
    /// The source file and commands for `code`, named after the first group of the pattern
    /// when it matches and makes a plain file name with `source_file`'s extension.
    pub(super) fn named_after(&self, source_file: &str, code: &str) -> Option<Named> {
        let (_, ext) = split_name(source_file);
        let stem = self
            .pattern
            .captures(code)
            .and_then(|c| c.get(1))
            .map(|m| m.as_str())
            .filter(|s| is_safe_file_name(&format!("{s}{ext}")))?;
        Some(Named {
            source_file: format!("{stem}{ext}"),
            compile: self.compile.as_deref().map(|c| fill(c, stem)),
            check: self.check.as_deref().map(|c| fill(c, stem)),
            run: fill(&self.run, stem),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::super::Registry;

    const JAVA: &str = r#"
[images.java]
tag = "codebox/java:17"
context = "images/java"

[languages.java]
display_name = "Java"
image = "java"
source_file = "Main.java"
source_name = '(?m)^public\s+(?:final\s+)?class\s+(\w+)[\s{<]'
compile = ["javac", "{name}.java"]
run = ["java", "-cp", ".", "{name}"]
"#;

    fn java() -> crate::registry::Language {
        Registry::parse(Path::new("l.toml"), JAVA)
            .unwrap()
            .languages["java"]
            .clone()
    }

    #[test]
    fn the_commands_name_the_default_stem_until_a_program_names_another() {
        let j = java();
        assert_eq!(j.source_file, "Main.java");
        assert_eq!(j.compile.as_deref().unwrap(), ["javac", "Main.java"]);
        assert_eq!(j.run, ["java", "-cp", ".", "Main"]);

        let mut named = j.clone();
        named.name_after(
            "import x;\n\nclass A {}\npublic final class Hello { }\npublic class B {}\n",
        );
        assert_eq!(named.source_file, "Hello.java");
        assert_eq!(named.compile.as_deref().unwrap(), ["javac", "Hello.java"]);
        assert_eq!(named.run, ["java", "-cp", ".", "Hello"]);
    }

    #[test]
    fn a_program_that_names_nothing_usable_keeps_the_default() {
        for code in [
            "class Hello { }",
            "  // public class Commented {}",
            // Java allows these names; a file name may not have them.
            "public class Caf\u{e9} {}",
            "public class A$B {}",
        ] {
            let mut j = java();
            j.name_after(code);
            assert_eq!(j, java(), "{code}");
        }
    }

    #[test]
    fn a_pattern_must_compile_and_capture() {
        for (bad, wanted) in [
            ("'(unclosed'", "is not a regular expression"),
            ("'public class \\w+'", "needs a group"),
        ] {
            let text = JAVA.replace(r"'(?m)^public\s+(?:final\s+)?class\s+(\w+)[\s{<]'", bad);
            let msg = Registry::parse(Path::new("l.toml"), &text)
                .unwrap_err()
                .to_string();
            assert!(
                msg.contains("source_name") && msg.contains(wanted),
                "{bad}: {msg}"
            );
        }
    }

    #[test]
    fn the_shipped_java_entry_follows_the_public_class() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let r = Registry::load(&root.join("languages.toml")).unwrap();
        let mut j = r.languages["java"].clone();
        j.name_after("import java.util.*;\n\n@SuppressWarnings(\"x\")\npublic final class Solution {\n    public static class Inner {}\n}\n");
        assert_eq!(j.source_file, "Solution.java");
        assert_eq!(j.run.last().unwrap(), "Solution");
        let mut j = r.languages["java"].clone();
        j.name_after("class Main { public static void main(String[] a) {} }");
        assert_eq!(j.source_file, "Main.java");
    }
}
