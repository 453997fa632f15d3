//! One uid per live container, host-wide, so per-user kernel limits (inotify instances,
//! POSIX message queues, pipe buffer pages) are never shared between runs that execute at the
//! same time, even runs of different codebox processes.
//!
//! Images create the users `sandbox` (uid 10001) to `sandbox64` (10064). A container leases
//! one for as long as it lives: within the process from a free list, and across processes by
//! an exclusive lock on `<data dir>/uids/<uid>.lock`, held while the lease lives (the kernel
//! drops it when a process dies, so a crash leaks nothing). Processes that share a data
//! directory (the default one for a user) never share a uid; only when all 64 are held is one
//! shared, with a warning, rather than a run refused.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::posture::{SANDBOX_UIDS, SANDBOX_UID_FIRST};

/// The uids this process does not hold at the moment.
pub(crate) struct UidPool {
    /// Where the host-wide locks live; `None`: this process only.
    dir: Option<PathBuf>,
    free: Mutex<Vec<u32>>,
}

/// A uid held by one container; it returns to the pool (and its lock is released) when
/// dropped.
pub(crate) struct UidLease {
    pub uid: u32,
    pool: Option<Arc<UidPool>>,
    _lock: Option<File>,
}

fn random_index(len: usize) -> usize {
    (uuid::Uuid::new_v4().as_u128() % len as u128) as usize
}

fn all_uids() -> Vec<u32> {
    (SANDBOX_UID_FIRST..SANDBOX_UID_FIRST + SANDBOX_UIDS).collect()
}

impl UidPool {
    /// A pool that coordinates with other processes through lock files under
    /// `<data_dir>/uids` (when the folder can be made; else within this process only).
    pub fn new(data_dir: &Path) -> Arc<UidPool> {
        let dir = data_dir.join("uids");
        let dir = match std::fs::create_dir_all(&dir) {
            Ok(()) => Some(dir),
            Err(e) => {
                tracing::warn!(path = %dir.display(), error = %e, "cannot make the uid lock folder; uids are leased within this process only");
                None
            }
        };
        Arc::new(UidPool {
            dir,
            free: Mutex::new(all_uids()),
        })
    }

    /// The lock of `uid`, if no other process holds it.
    fn lock(&self, uid: u32) -> Option<Option<File>> {
        let Some(dir) = &self.dir else {
            return Some(None);
        };
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join(format!("{uid}.lock")))
            .ok()?;
        file.try_lock().ok()?;
        Some(Some(file))
    }

    /// Lease a free uid, chosen at random among those no process holds. Candidates come off
    /// the free list under its lock; their lock files are opened and tried outside it.
    pub fn lease(self: &Arc<UidPool>) -> UidLease {
        let mut held_elsewhere = Vec::new();
        let leased = loop {
            let candidate = {
                let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
                if free.is_empty() {
                    break None;
                }
                let i = random_index(free.len());
                free.swap_remove(i)
            };
            match self.lock(candidate) {
                Some(lock) => break Some((candidate, lock)),
                None => held_elsewhere.push(candidate),
            }
        };
        self.free
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(held_elsewhere);
        if let Some((uid, lock)) = leased {
            return UidLease {
                uid,
                pool: Some(self.clone()),
                _lock: lock,
            };
        }
        let uid = SANDBOX_UID_FIRST + random_index(SANDBOX_UIDS as usize) as u32;
        tracing::warn!(
            uid,
            "all 64 sandbox users are in use on this host; sharing a uid"
        );
        UidLease {
            uid,
            pool: None,
            _lock: None,
        }
    }
}

impl Drop for UidLease {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.take() {
            pool.free
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(self.uid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leased_uids_are_distinct_sandbox_users_and_come_back() {
        let dir = tempfile::tempdir().unwrap();
        let pool = UidPool::new(dir.path());
        let leases: Vec<UidLease> = (0..SANDBOX_UIDS).map(|_| pool.lease()).collect();
        let mut uids: Vec<u32> = leases.iter().map(|l| l.uid).collect();
        uids.sort();
        uids.dedup();
        assert_eq!(uids, all_uids());
        let extra = pool.lease();
        assert!(extra.pool.is_none(), "an exhausted pool shares a uid");
        drop(leases);
        assert_eq!(pool.free.lock().unwrap().len(), SANDBOX_UIDS as usize);
    }

    #[test]
    fn two_pools_on_one_data_dir_never_hand_out_the_same_uid() {
        // Two processes are two pools on the same lock folder (flock locks belong to the open
        // file, so two pools conflict even within one process).
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (UidPool::new(dir.path()), UidPool::new(dir.path()));
        let held_by_a: Vec<UidLease> = (0..SANDBOX_UIDS - 1).map(|_| a.lease()).collect();
        let from_b = b.lease();
        assert!(from_b.pool.is_some(), "b got a uid of its own");
        assert!(held_by_a.iter().all(|l| l.uid != from_b.uid));
        let shared = b.lease();
        assert!(
            shared.pool.is_none(),
            "all 64 are held: shared, with a warning"
        );
        drop(held_by_a);
        assert!(b.lease().pool.is_some(), "released locks are free again");
    }
}
