//! The compile cache: what a compile stage produced, by everything it depended on.
//!
//! The key is a SHA-256 over the image id (not its tag: a rebuilt image never serves old
//! artifacts), the compile command, the language's environment, its compile limits, the source
//! file's name, the code and every request file. A hit hands back the artifacts (or the
//! `compile_error` verdict with the compiler's output) without a compile container. Only those
//! two verdicts are kept: a timeout, an OOM kill or a sandbox error says nothing certain about
//! the inputs.
//!
//! Entries live in codebox's own memory, where no run can reach them, bounded by
//! `cache.compile_mb` with least-recently-used eviction.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use sha2::{Digest, Sha256};

use crate::engine::protocol::Files;
use crate::registry::Language;
use crate::report::CompileReport;

/// What a compile stage produced.
#[derive(Debug, Clone)]
pub(super) enum Verdict {
    /// The whole working directory, ready for the run stage.
    Compiled {
        report: CompileReport,
        artifacts: Files,
    },
    /// The compiler refused the code.
    Refused { report: CompileReport },
}

impl Verdict {
    fn bytes(&self) -> u64 {
        let (report, files) = match self {
            Verdict::Compiled { report, artifacts } => (report, artifacts.encoded_bytes()),
            Verdict::Refused { report } => (report, 0),
        };
        files + (report.stdout.len() + report.stderr.len() + 256) as u64
    }
}

/// A cache key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Key([u8; 32]);

/// Everything a compile stage's result depends on.
pub(crate) fn key(
    image_id: &str,
    lang: &Language,
    code: &str,
    files: &[(String, bytes::Bytes)],
) -> Key {
    let mut h = Sha256::new();
    let mut field = |bytes: &[u8]| {
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    };
    // Every list is preceded by its length, so no two different inputs hash the same fields.
    field(image_id.as_bytes());
    let compile = lang.compile.as_deref().unwrap_or_default();
    field(&(compile.len() as u64).to_le_bytes());
    for a in compile {
        field(a.as_bytes());
    }
    field(&(lang.env.len() as u64).to_le_bytes());
    for (k, v) in &lang.env {
        field(k.as_bytes());
        field(v.as_bytes());
    }
    let l = lang.compile_limits;
    field(
        format!(
            "{}/{}/{}/{}",
            l.timeout_seconds, l.memory_mb, l.cpus, l.workspace_mb
        )
        .as_bytes(),
    );
    field(lang.source_file.as_bytes());
    field(code.as_bytes());
    field(&(files.len() as u64).to_le_bytes());
    for (path, content) in files {
        field(path.as_bytes());
        field(content);
    }
    Key(h.finalize().into())
}

struct Slot {
    verdict: Verdict,
    bytes: u64,
    /// Larger: used more recently.
    used: u64,
}

#[derive(Default)]
struct State {
    slots: HashMap<Key, Slot>,
    /// The keys by when they were last used, oldest first: eviction takes the first.
    by_use: BTreeMap<u64, Key>,
    bytes: u64,
    clock: u64,
}

impl State {
    /// Mark a slot used now.
    fn touch(&mut self, key: &Key) {
        self.clock += 1;
        let now = self.clock;
        if let Some(slot) = self.slots.get_mut(key) {
            self.by_use.remove(&slot.used);
            slot.used = now;
            self.by_use.insert(now, *key);
        }
    }
}

/// The cache of one process.
pub(super) struct CompileCache {
    max_bytes: u64,
    state: Mutex<State>,
    hits: AtomicU64,
    misses: AtomicU64,
}

impl CompileCache {
    pub fn new(max_mb: u64) -> CompileCache {
        CompileCache {
            max_bytes: max_mb * 1024 * 1024,
            state: Mutex::new(State::default()),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn get(&self, key: &Key) -> Option<Verdict> {
        if self.max_bytes == 0 {
            return None;
        }
        let mut st = self.state();
        st.touch(key);
        match st.slots.get(key) {
            Some(slot) => {
                self.hits.fetch_add(1, Ordering::Relaxed);
                Some(slot.verdict.clone())
            }
            None => {
                self.misses.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// Keep a verdict; the least recently used ones go when the cache is over its size. A
    /// verdict larger than a quarter of the cache is not kept.
    pub(crate) fn put(&self, key: Key, verdict: Verdict) {
        let bytes = verdict.bytes();
        if bytes > self.max_bytes / 4 {
            return;
        }
        let mut st = self.state();
        st.clock += 1;
        let used = st.clock;
        if let Some(old) = st.slots.insert(
            key,
            Slot {
                verdict,
                bytes,
                used,
            },
        ) {
            st.bytes -= old.bytes;
            st.by_use.remove(&old.used);
        }
        st.by_use.insert(used, key);
        st.bytes += bytes;
        while st.bytes > self.max_bytes {
            let Some((_, oldest)) = st.by_use.pop_first() else {
                break;
            };
            if let Some(s) = st.slots.remove(&oldest) {
                st.bytes -= s.bytes;
            }
        }
    }

    /// (hits, misses)
    pub fn counts(&self) -> (u64, u64) {
        (
            self.hits.load(Ordering::Relaxed),
            self.misses.load(Ordering::Relaxed),
        )
    }

    /// (entries, bytes)
    #[cfg(test)]
    pub fn size(&self) -> (usize, u64) {
        let st = self.state();
        (st.slots.len(), st.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{Status, Usage};

    fn report() -> CompileReport {
        CompileReport {
            status: Status::Succeeded,
            exit_code: Some(0),
            stdout: String::new(),
            stderr: String::new(),
            duration_ms: 5,
            usage: Usage::default(),
            cached: false,
        }
    }

    fn compiled(size: usize) -> Verdict {
        Verdict::Compiled {
            report: report(),
            artifacts: Files::new(&[crate::engine::protocol::Entry::file(
                "main",
                0o755,
                vec![0u8; size],
            )]),
        }
    }

    fn language() -> crate::registry::Language {
        let registry = crate::registry::Registry::parse(
            std::path::Path::new("t.toml"),
            r#"
[images.gcc]
tag = "codebox/gcc:12"
context = "images/gcc"

[languages.c]
display_name = "C"
image = "gcc"
source_file = "main.c"
compile = ["gcc", "main.c"]
run = ["./a.out"]
"#,
        )
        .unwrap();
        registry.languages["c"].clone()
    }

    #[test]
    fn every_input_of_a_compile_is_part_of_its_key() {
        let lang = language();
        let file = |p: &str, c: &str| (p.to_string(), bytes::Bytes::from(c.to_string()));
        let base = key("sha256:a", &lang, "int main(){}", &[file("x.h", "1")]);
        assert_eq!(
            base,
            key("sha256:a", &lang, "int main(){}", &[file("x.h", "1")])
        );
        let mut variants = vec![
            key("sha256:b", &lang, "int main(){}", &[file("x.h", "1")]),
            key("sha256:a", &lang, "int main(){ }", &[file("x.h", "1")]),
            key("sha256:a", &lang, "int main(){}", &[file("x.h", "2")]),
            key("sha256:a", &lang, "int main(){}", &[file("y.h", "1")]),
            key("sha256:a", &lang, "int main(){}", &[]),
        ];
        let mut changed = |f: &dyn Fn(&mut crate::registry::Language)| {
            let mut l = lang.clone();
            f(&mut l);
            variants.push(key("sha256:a", &l, "int main(){}", &[file("x.h", "1")]));
        };
        changed(&|l| l.compile = Some(vec!["gcc".into(), "-O2".into(), "main.c".into()]));
        changed(&|l| {
            l.env.insert("CFLAGS".into(), "-O2".into());
        });
        changed(&|l| l.compile_limits.memory_mb += 1);
        changed(&|l| l.compile_limits.timeout_seconds += 1.0);
        changed(&|l| l.source_file = "prog.c".into());
        for (i, v) in variants.iter().enumerate() {
            assert_ne!(*v, base, "variant {i} has the base's key");
        }
        // An argument moved from the command into the environment is a different input.
        let mut a = lang.clone();
        a.compile = Some(vec!["gcc".into(), "main.c".into(), "K".into(), "V".into()]);
        let mut b = lang.clone();
        b.env.insert("K".into(), "V".into());
        assert_ne!(key("i", &a, "", &[]), key("i", &b, "", &[]));
    }

    #[test]
    fn least_recently_used_entries_leave_first() {
        let cache = CompileCache::new(2);
        let k = |n: u8| Key([n; 32]);
        for n in 0..3 {
            cache.put(k(n), compiled(500 * 1024));
        }
        assert!(cache.get(&k(0)).is_some(), "touch 0: 1 is now the oldest");
        for n in 3..5 {
            cache.put(k(n), compiled(500 * 1024));
        }
        assert!(cache.get(&k(0)).is_some());
        assert!(cache.get(&k(1)).is_none() && cache.get(&k(2)).is_some());
        assert!(cache.get(&k(4)).is_some());
        assert!(cache.size().1 <= 2 * 1024 * 1024);
        cache.put(k(9), compiled(600 * 1024));
        assert!(cache.get(&k(9)).is_none(), "over a quarter of the cache");
    }
}
