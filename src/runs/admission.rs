//! Admission as bookkeeping, without tasks or clocks: a bounded FIFO queue, a concurrency cap
//! and a memory budget that the pool's ready containers share with the runs.
//!
//! Only the head of the queue may start, and it starts when both a slot is free
//! (`runs.max_concurrent_runs`) and the memory of the running runs plus its own stays within
//! `runs.memory_budget_mb`. A large request at the head is therefore never starved by small
//! ones behind it. Containers waiting in the pool hold budget too: a head that fits only
//! without them asks for them back (`Next::Shed`), and the pool may grow only while nobody
//! waits and the budget has room. Once closed (shutdown), nothing more starts.
//!
//! Sessions opened ahead of time hold budget too (`Admission::hold_ahead`) and give it
//! back like the pool's containers: `Next::Shed` asks for the pool's and theirs.
//!
//! Open sessions hold their memory for their whole life (`Admission::hold`). Executions of
//! one session run one at a time: a ticket whose session is executing waits without holding
//! up the tickets behind it, and the first ticket of a session in the queue is its earliest.

use std::collections::{HashSet, VecDeque};

/// The limits admission enforces.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Policy {
    pub max_concurrent_runs: usize,
    pub max_queued_runs: usize,
    pub memory_budget_mb: u64,
}

/// A run waiting for admission, or admitted.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Ticket {
    pub run_id: String,
    /// Containers it runs at once (test cases): the concurrency slots it takes.
    pub slots: usize,
    /// Memory it holds while it runs.
    pub charge_mb: u64,
    /// The session it executes in.
    pub session: Option<String>,
}

/// What to do for the head of the queue.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Next {
    /// Start it: its slots and memory are now taken.
    Start(Ticket),
    /// It would fit if the pool gave back this much memory of its ready containers.
    Shed { mb: u64 },
    /// It waits (or nothing is queued).
    Wait,
}

/// Why a ticket was not queued.
#[derive(Debug, Clone, PartialEq)]
pub enum Refusal {
    QueueFull { waiting: usize, max: usize },
    Closed,
}

/// The queue and what admitted runs hold.
#[derive(Debug)]
pub(crate) struct Admission {
    policy: Policy,
    queue: VecDeque<Ticket>,
    active: usize,
    active_memory_mb: u64,
    /// Memory open sessions hold.
    held_mb: u64,
    /// Memory sessions opened ahead of time hold (given back on demand).
    ahead_mb: u64,
    /// Sessions with an execution running.
    executing: HashSet<String>,
    peak_active: usize,
    closed: bool,
    /// Draining: no new tickets; the queued ones still start.
    draining: bool,
}

impl Admission {
    pub fn new(policy: Policy) -> Admission {
        Admission {
            policy,
            queue: VecDeque::new(),
            active: 0,
            active_memory_mb: 0,
            held_mb: 0,
            ahead_mb: 0,
            executing: HashSet::new(),
            peak_active: 0,
            closed: false,
            draining: false,
        }
    }

    /// Queue a ticket. A full queue refuses only a ticket that could not start at once.
    pub(crate) fn enqueue(&mut self, ticket: Ticket) -> Result<(), Refusal> {
        if self.closed || self.draining {
            return Err(Refusal::Closed);
        }
        let starts_now = self.queue.is_empty()
            && self.active + ticket.slots <= self.policy.max_concurrent_runs
            && self.committed_mb() + ticket.charge_mb <= self.policy.memory_budget_mb;
        if !starts_now && self.queue.len() >= self.policy.max_queued_runs {
            return Err(Refusal::QueueFull {
                waiting: self.queue.len(),
                max: self.policy.max_queued_runs,
            });
        }
        self.queue.push_back(ticket);
        Ok(())
    }

    /// Queue a ticket whatever the queue holds, while draining too: a run accepted before
    /// it came here ([`super::RunManager::take`]). Refused only once closed.
    pub(super) fn enqueue_taken(&mut self, ticket: Ticket) -> Result<(), Refusal> {
        if self.closed {
            return Err(Refusal::Closed);
        }
        self.queue.push_back(ticket);
        Ok(())
    }

    /// What this server could start now beyond what it runs and queues: free slots and
    /// memory (what the pool's ready containers and sessions opened ahead of time hold counts as
    /// free: they give it back).
    /// Nothing while draining or closed.
    pub fn room(&self) -> (usize, u64) {
        if self.closed || self.draining {
            return (0, 0);
        }
        let slots: usize = self.queue.iter().map(|t| t.slots).sum();
        let mb: u64 = self.queue.iter().map(|t| t.charge_mb).sum();
        (
            self.policy
                .max_concurrent_runs
                .saturating_sub(self.active + slots),
            self.policy
                .memory_budget_mb
                .saturating_sub(self.committed_mb() + mb),
        )
    }

    /// Memory admitted runs and open sessions hold.
    fn committed_mb(&self) -> u64 {
        self.active_memory_mb + self.held_mb
    }

    /// What to do for the head of the queue (its first ticket whose session is not
    /// executing) while the pool holds `pooled_mb` of the budget. [`Next::Shed`] asks for
    /// memory of the pool's containers and of sessions opened ahead of time.
    pub fn next(&mut self, pooled_mb: u64) -> Next {
        if self.closed {
            return Next::Wait;
        }
        let Some(at) = self.queue.iter().position(|t| {
            t.session
                .as_ref()
                .is_none_or(|s| !self.executing.contains(s))
        }) else {
            return Next::Wait;
        };
        let head = &self.queue[at];
        let budget = self.policy.memory_budget_mb;
        let need = self.committed_mb() + head.charge_mb;
        if self.active + head.slots > self.policy.max_concurrent_runs || need > budget {
            return Next::Wait;
        }
        let sheddable = pooled_mb + self.ahead_mb;
        if need + sheddable > budget {
            return Next::Shed {
                mb: need + sheddable - budget,
            };
        }
        let ticket = self.queue.remove(at).expect("the head exists");
        if let Some(s) = &ticket.session {
            self.executing.insert(s.clone());
        }
        self.active += ticket.slots;
        self.active_memory_mb += ticket.charge_mb;
        self.peak_active = self.peak_active.max(self.active);
        Next::Start(ticket)
    }

    /// An admitted run ended: its slots and memory are free, and its session may execute
    /// again.
    pub fn release(&mut self, ticket: &Ticket) {
        self.active = self.active.saturating_sub(ticket.slots);
        self.active_memory_mb = self.active_memory_mb.saturating_sub(ticket.charge_mb);
        if let Some(s) = &ticket.session {
            self.executing.remove(s);
        }
    }

    /// Whether a session of `mb` may be held now: the runs, the pool (`pooled_mb`) and the
    /// open sessions leave room in the budget. `false` does not wait: the caller refuses.
    pub(super) fn may_hold(&self, mb: u64, pooled_mb: u64) -> bool {
        !self.closed && self.shortfall(mb, pooled_mb) == 0
    }

    /// How much the pool (`pooled_mb`) and sessions opened ahead of time would have to give
    /// back for `mb` more to be held.
    pub(super) fn shortfall(&self, mb: u64, pooled_mb: u64) -> u64 {
        (self.committed_mb() + pooled_mb + self.ahead_mb + mb)
            .saturating_sub(self.policy.memory_budget_mb)
    }

    /// A session opened ahead of time (or being opened) holds `mb` from now on, until it is
    /// claimed ([`Admission::claim`]) or given back.
    pub(super) fn hold_ahead(&mut self, mb: u64) {
        self.ahead_mb += mb;
    }

    pub(super) fn unhold_ahead(&mut self, mb: u64) {
        self.ahead_mb = self.ahead_mb.saturating_sub(mb);
    }

    /// A session opened ahead of time became a session: its memory is held as such.
    pub fn claim(&mut self, mb: u64) {
        self.unhold_ahead(mb);
        self.hold(mb);
    }

    /// A session opens (or is being opened): its memory is held from now on.
    pub fn hold(&mut self, mb: u64) {
        self.held_mb += mb;
    }

    /// A session ended: its memory is free.
    pub(crate) fn unhold(&mut self, mb: u64) {
        self.held_mb = self.held_mb.saturating_sub(mb);
    }

    /// Take a queued run out of the queue (it was stopped); `false` if it was not queued.
    pub fn withdraw(&mut self, run_id: &str) -> bool {
        let before = self.queue.len();
        self.queue.retain(|t| t.run_id != run_id);
        self.queue.len() != before
    }

    /// 1-based place in the queue.
    pub fn position(&self, run_id: &str) -> Option<usize> {
        self.queue
            .iter()
            .position(|t| t.run_id == run_id)
            .map(|p| p + 1)
    }

    /// Whether the pool may start one more container of `shape_mb` while holding
    /// `pooled_mb`: nobody waits, admission is open and the budget has room.
    pub(super) fn pool_may_grow(&self, pooled_mb: u64, shape_mb: u64) -> bool {
        !self.closed && self.queue.is_empty() && self.shortfall(shape_mb, pooled_mb) == 0
    }

    /// Start nothing more (shutdown).
    pub fn close(&mut self) {
        self.closed = true;
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed
    }

    /// Take no new tickets, and keep starting the queued ones (a drain).
    pub fn drain(&mut self) {
        self.draining = true;
    }

    /// Whether new tickets are refused (closed or draining).
    pub(super) fn refuses_new(&self) -> bool {
        self.closed || self.draining
    }

    pub(crate) fn is_draining(&self) -> bool {
        self.draining
    }

    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    pub fn active(&self) -> usize {
        self.active
    }

    pub fn active_memory_mb(&self) -> u64 {
        self.active_memory_mb
    }

    /// The most runs that were ever executing at once.
    pub fn peak_active(&self) -> usize {
        self.peak_active
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> Policy {
        Policy {
            max_concurrent_runs: 2,
            max_queued_runs: 2,
            memory_budget_mb: 1024,
        }
    }

    fn ticket(id: &str, slots: usize, charge_mb: u64) -> Ticket {
        Ticket {
            run_id: id.into(),
            slots,
            charge_mb,
            session: None,
        }
    }

    fn in_session(id: &str, session: &str) -> Ticket {
        Ticket {
            session: Some(session.into()),
            ..ticket(id, 1, 0)
        }
    }

    fn started(next: Next) -> String {
        match next {
            Next::Start(t) => t.run_id,
            other => panic!("expected a start, got {other:?}"),
        }
    }

    #[test]
    fn the_head_starts_first_and_a_big_head_is_not_overtaken() {
        let mut a = Admission::new(policy());
        a.enqueue(ticket("a", 1, 512)).unwrap();
        assert_eq!(started(a.next(0)), "a");
        a.enqueue(ticket("b", 1, 1024)).unwrap();
        a.enqueue(ticket("c", 1, 256)).unwrap();
        assert_eq!(
            a.next(0),
            Next::Wait,
            "b waits; c, which fits, stays behind it"
        );
        assert_eq!(a.position("c"), Some(2));
        a.release(&ticket("a", 1, 512));
        assert_eq!(started(a.next(0)), "b");
        assert_eq!((a.active(), a.active_memory_mb()), (1, 1024));
    }

    #[test]
    fn slots_are_capped_and_the_peak_remembered() {
        let mut a = Admission::new(Policy {
            memory_budget_mb: 100_000,
            max_queued_runs: 10,
            ..policy()
        });
        for id in ["a", "b", "c"] {
            a.enqueue(ticket(id, 1, 10)).unwrap();
        }
        assert_eq!(started(a.next(0)), "a");
        assert_eq!(started(a.next(0)), "b");
        assert_eq!(a.next(0), Next::Wait);
        a.release(&ticket("a", 1, 10));
        assert_eq!(started(a.next(0)), "c");
        assert_eq!(a.peak_active(), 2);
    }

    #[test]
    fn a_full_queue_refuses_only_what_cannot_start_at_once() {
        let mut a = Admission::new(Policy {
            max_queued_runs: 1,
            ..policy()
        });
        a.enqueue(ticket("a", 2, 10)).unwrap();
        assert_eq!(started(a.next(0)), "a");
        a.enqueue(ticket("b", 1, 10)).unwrap();
        assert_eq!(
            a.enqueue(ticket("c", 1, 10)),
            Err(Refusal::QueueFull { waiting: 1, max: 1 })
        );
        assert!(a.withdraw("b"));
        assert!(!a.withdraw("b"));
        a.enqueue(ticket("c", 1, 10)).unwrap();
    }

    #[test]
    fn a_head_that_fits_only_without_the_pool_asks_for_its_memory() {
        let mut a = Admission::new(policy());
        a.enqueue(ticket("big", 1, 1024)).unwrap();
        assert_eq!(a.next(512), Next::Shed { mb: 512 });
        assert_eq!(a.queued(), 1, "still queued until the memory is back");
        assert_eq!(started(a.next(0)), "big");
    }

    #[test]
    fn the_pool_grows_only_when_nobody_waits_and_the_budget_has_room() {
        let mut a = Admission::new(policy());
        assert!(a.pool_may_grow(0, 512));
        assert!(!a.pool_may_grow(768, 512));
        a.enqueue(ticket("a", 1, 1024)).unwrap();
        assert!(!a.pool_may_grow(0, 1), "a run waits");
        a.close();
        assert!(!a.pool_may_grow(0, 1));
    }

    #[test]
    fn nothing_starts_once_admission_is_closed() {
        let mut a = Admission::new(policy());
        a.enqueue(ticket("a", 2, 10)).unwrap();
        a.enqueue(ticket("b", 1, 10)).unwrap();
        assert_eq!(started(a.next(0)), "a");
        a.close();
        // The run that was running ends during shutdown: the queued one must not start.
        a.release(&ticket("a", 2, 10));
        assert_eq!(a.next(0), Next::Wait);
        assert_eq!(a.enqueue(ticket("c", 1, 10)), Err(Refusal::Closed));
    }

    #[test]
    fn a_sessions_executions_run_one_at_a_time_without_holding_up_others() {
        let mut a = Admission::new(Policy {
            max_concurrent_runs: 4,
            max_queued_runs: 10,
            memory_budget_mb: 1024,
        });
        for t in [
            in_session("s1", "A"),
            in_session("s2", "A"),
            ticket("r", 1, 10),
            in_session("s3", "A"),
        ] {
            a.enqueue(t).unwrap();
        }
        assert_eq!(started(a.next(0)), "s1");
        assert_eq!(
            started(a.next(0)),
            "r",
            "s2 waits for s1; the run behind it does not"
        );
        assert_eq!(a.next(0), Next::Wait);
        a.release(&in_session("s1", "A"));
        assert_eq!(
            started(a.next(0)),
            "s2",
            "the session's next in arrival order"
        );
        assert_eq!(a.next(0), Next::Wait);
    }

    #[test]
    fn sessions_hold_memory_that_runs_cannot_use() {
        let mut a = Admission::new(policy());
        assert!(a.may_hold(512, 0));
        a.hold(512);
        assert!(!a.may_hold(512, 256), "the pool's share counts too");
        a.enqueue(ticket("big", 1, 1024)).unwrap();
        assert_eq!(a.next(0), Next::Wait, "the held memory is not the runs'");
        a.unhold(512);
        assert_eq!(started(a.next(0)), "big");
    }
}
