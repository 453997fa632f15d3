//! Installed prefixes kept for reuse: one volume per key, least recently used first out,
//! never one a run still holds.

use std::collections::HashMap;
use std::sync::Arc;

use crate::report::InstalledPackage;

/// A cached prefix. Runs hold an `Arc` of it while their container may mount it.
#[derive(Debug)]
pub struct Entry {
    pub volume: String,
    pub bytes: u64,
    pub installed: Vec<InstalledPackage>,
}

/// The cache's index (the volumes are the content).
#[derive(Default)]
pub(super) struct Lru {
    entries: HashMap<String, (Arc<Entry>, u64)>,
    tick: u64,
}

impl Lru {
    pub fn get(&mut self, key: &str) -> Option<Arc<Entry>> {
        self.tick += 1;
        let tick = self.tick;
        self.entries.get_mut(key).map(|(e, used)| {
            *used = tick;
            e.clone()
        })
    }

    pub fn insert(&mut self, key: String, entry: Arc<Entry>) {
        self.tick += 1;
        self.entries.insert(key, (entry, self.tick));
    }

    pub fn bytes(&self) -> u64 {
        self.entries.values().map(|(e, _)| e.bytes).sum()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Take out least recently used entries no run holds until the rest fit `max_bytes`;
    /// their volumes are the caller's to remove.
    pub(super) fn evict(&mut self, max_bytes: u64) -> Vec<Arc<Entry>> {
        let mut out = Vec::new();
        while self.bytes() > max_bytes {
            let victim = self
                .entries
                .iter()
                .filter(|(_, (e, _))| Arc::strong_count(e) == 1)
                .min_by_key(|(_, (_, used))| *used)
                .map(|(k, _)| k.clone());
            let Some(k) = victim else { break };
            if let Some((e, _)) = self.entries.remove(&k) {
                out.push(e);
            }
        }
        out
    }

    /// The volumes of every entry.
    pub fn volumes(&self) -> Vec<String> {
        self.entries
            .values()
            .map(|(e, _)| e.volume.clone())
            .collect()
    }

    /// Everything, for removal at shutdown.
    pub fn drain(&mut self) -> Vec<Arc<Entry>> {
        self.entries.drain().map(|(_, (e, _))| e).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, bytes: u64) -> Arc<Entry> {
        Arc::new(Entry {
            volume: name.into(),
            bytes,
            installed: Vec::new(),
        })
    }

    #[test]
    fn the_least_recently_used_unheld_entry_goes_first() {
        let mut c = Lru::default();
        c.insert("a".into(), entry("va", 10));
        c.insert("b".into(), entry("vb", 10));
        c.insert("c".into(), entry("vc", 10));
        c.get("a");
        let held = c.get("b").unwrap();
        let out = c.evict(15);
        let names: Vec<&str> = out.iter().map(|e| e.volume.as_str()).collect();
        // c is the oldest unheld after a was used; b is held; then a.
        assert_eq!(names, ["vc", "va"]);
        assert_eq!(c.len(), 1);
        drop(held);
        assert_eq!(c.evict(0).len(), 1);
        assert!(c.is_empty());
    }
}
