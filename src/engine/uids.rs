//! One uid per concurrent run, so per-user kernel limits (inotify instances, POSIX message
//! queues, pipe buffer pages) are never shared between runs that execute at the same time.
//!
//! Images create the users `sandbox` (uid 10001) to `sandbox64` (10064); a run leases one for
//! as long as its containers live.

use std::sync::{Arc, Mutex};

use super::posture::{SANDBOX_UIDS, SANDBOX_UID_FIRST};

/// The uids not leased at the moment.
pub struct UidPool {
    free: Mutex<Vec<u32>>,
}

/// A uid held by one run; it returns to the pool when dropped.
pub struct UidLease {
    pub uid: u32,
    pool: Option<Arc<UidPool>>,
}

fn random_index(len: usize) -> usize {
    (uuid::Uuid::new_v4().as_u128() % len as u128) as usize
}

impl UidPool {
    pub fn new() -> Arc<UidPool> {
        Arc::new(UidPool {
            free: Mutex::new((SANDBOX_UID_FIRST..SANDBOX_UID_FIRST + SANDBOX_UIDS).collect()),
        })
    }

    /// Lease a free uid, chosen at random (so that separate codebox processes on one host
    /// rarely pick the same one). With more concurrent runs than sandbox users, a uid is
    /// shared rather than the run refused.
    pub fn lease(self: &Arc<UidPool>) -> UidLease {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        if free.is_empty() {
            let uid = SANDBOX_UID_FIRST + random_index(SANDBOX_UIDS as usize) as u32;
            tracing::warn!(
                uid,
                "more concurrent runs than sandbox users; sharing a uid"
            );
            return UidLease { uid, pool: None };
        }
        let i = random_index(free.len());
        UidLease {
            uid: free.swap_remove(i),
            pool: Some(self.clone()),
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
        let pool = UidPool::new();
        let leases: Vec<UidLease> = (0..SANDBOX_UIDS).map(|_| pool.lease()).collect();
        let mut uids: Vec<u32> = leases.iter().map(|l| l.uid).collect();
        uids.sort();
        uids.dedup();
        assert_eq!(uids.len(), SANDBOX_UIDS as usize);
        assert!(uids
            .iter()
            .all(|u| (SANDBOX_UID_FIRST..SANDBOX_UID_FIRST + SANDBOX_UIDS).contains(u)));
        let extra = pool.lease();
        assert!(extra.pool.is_none(), "an exhausted pool shares a uid");
        drop(leases);
        assert_eq!(pool.free.lock().unwrap().len(), SANDBOX_UIDS as usize);
    }
}
