//! This process's identity on the Docker daemon, and whether another instance is still alive.
//!
//! Each codebox process holds an exclusive lock on `<data dir>/instances/<id>.lock` while it
//! lives. The reaper removes containers of an instance whose lock is free (it died), or whose
//! containers are past their expiry label (another machine, or no lock file). Lock files only
//! tell about processes sharing this data directory on this host; for the others the history
//! keeps a heartbeat per instance (see `history`).

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

/// This process's instance id and the lock that proves it is alive.
pub struct Instance {
    pub id: String,
    lock: Option<(File, PathBuf)>,
    /// Leave the lock file behind at exit (objects of this instance remain on the daemon).
    keep: std::sync::atomic::AtomicBool,
}

/// What is known of another instance.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Liveness {
    Alive,
    Dead,
    Unknown,
}

fn lock_path(data_dir: &Path, id: &str) -> PathBuf {
    data_dir.join("instances").join(format!("{id}.lock"))
}

impl Instance {
    /// A new instance id, registered under `data_dir` when it is writable.
    pub fn register(data_dir: &Path) -> Instance {
        let id = uuid::Uuid::new_v4().simple().to_string();
        let path = lock_path(data_dir, &id);
        let lock = std::fs::create_dir_all(path.parent().unwrap_or(data_dir))
            .and_then(|_| {
                OpenOptions::new()
                    .create(true)
                    .write(true)
                    .truncate(true)
                    .open(&path)
            })
            .and_then(|f| f.try_lock().map_err(std::io::Error::other).map(|_| f));
        match lock {
            Ok(f) => Instance {
                id,
                lock: Some((f, path)),
                keep: Default::default(),
            },
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "cannot register this instance; other instances will only reap its containers after they expire");
                Instance {
                    id,
                    lock: None,
                    keep: Default::default(),
                }
            }
        }
    }

    /// Whether the instance `id` still runs, judged by its lock file.
    pub(super) fn liveness(data_dir: &Path, id: &str) -> Liveness {
        if id.is_empty() || !id.chars().all(|c| c.is_ascii_alphanumeric()) {
            return Liveness::Unknown;
        }
        let path = lock_path(data_dir, id);
        let Ok(f) = OpenOptions::new().write(true).open(&path) else {
            return Liveness::Unknown;
        };
        match f.try_lock() {
            Ok(()) => Liveness::Dead,
            Err(_) => Liveness::Alive,
        }
    }

    /// Keep the lock file when this process ends: something it created is still on the
    /// daemon, and the next start must see a dead instance (not an unknown one) to reap it
    /// at once.
    pub(super) fn keep_lock_file(&self) {
        self.keep.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Forget a dead instance once everything it left has been removed.
    pub(super) fn forget(data_dir: &Path, id: &str) {
        if Instance::liveness(data_dir, id) == Liveness::Dead {
            let _ = std::fs::remove_file(lock_path(data_dir, id));
        }
    }
}

/// This host's name (for the history's record of instances), or `unknown`.
pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most `buf.len()` bytes into our own buffer.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    match std::str::from_utf8(&buf[..end]) {
        Ok(name) if rc == 0 && !name.is_empty() => name.to_string(),
        _ => "unknown".to_string(),
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        if let Some((_, path)) = self.lock.take() {
            if !self.keep.load(std::sync::atomic::Ordering::Relaxed) {
                let _ = std::fs::remove_file(path);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_registered_instance_is_alive_until_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let me = Instance::register(dir.path());
        assert_eq!(Instance::liveness(dir.path(), &me.id), Liveness::Alive);
        let id = me.id.clone();
        drop(me);
        assert_eq!(Instance::liveness(dir.path(), &id), Liveness::Unknown);
        assert_eq!(Instance::liveness(dir.path(), "../etc"), Liveness::Unknown);
    }

    #[test]
    fn an_instance_that_left_objects_behind_stays_known_as_dead() {
        let dir = tempfile::tempdir().unwrap();
        let me = Instance::register(dir.path());
        let id = me.id.clone();
        me.keep_lock_file();
        drop(me);
        assert_eq!(Instance::liveness(dir.path(), &id), Liveness::Dead);
    }
}
