//! A small single-consumer queue with a waker, shared by the connection's
//! dispatcher (which pushes) and one subscription, member or tunnel
//! (which pops): poll-based, so [`futures_core::Stream`] is a thin wrapper.

use std::collections::VecDeque;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use parking_lot::Mutex;

use super::status::Gap;

#[derive(Debug)]
pub(crate) struct Inbox<T> {
    pub(crate) q: VecDeque<T>,
    waker: Option<Waker>,
    pub(crate) closed: bool,
    /// Held by the consumer's own pause.
    pub(crate) paused: bool,
    /// Held by the client-wide stop ([`super::Client::stop`]).
    pub(crate) stopped: bool,
    /// Messages the node dropped for this subscription, as it last said.
    pub(crate) dropped: u64,
    /// Why it closed, if not by the user.
    pub(crate) error: Option<String>,
    /// Failovers this consumer lived through.
    pub(crate) gaps: u64,
    /// Damaged records a `file://` log reader skipped, and the last one.
    pub(crate) skipped: u64,
    pub(crate) last_skip: Option<String>,
    /// Set by a failover: the next item pushed carries it.
    pub(crate) pending_gap: Option<Arc<Gap>>,
    /// Bumped by a failover: credit counted for the lost node is void.
    pub(crate) epoch: u32,
    /// Items at the front of the queue that came from a lost node (taking
    /// them earns the new node no credit).
    pub(crate) uncredited: usize,
    /// `dropped` as it stood when the node that reports it was lost.
    pub(crate) dropped_base: u64,
}

pub(crate) type Shared<T> = Arc<Mutex<Inbox<T>>>;

pub(crate) fn shared<T>() -> Shared<T> {
    Arc::new(Mutex::new(Inbox {
        q: VecDeque::new(),
        waker: None,
        closed: false,
        paused: false,
        stopped: false,
        dropped: 0,
        error: None,
        gaps: 0,
        skipped: 0,
        last_skip: None,
        pending_gap: None,
        epoch: 0,
        uncredited: 0,
        dropped_base: 0,
    }))
}

impl<T> Inbox<T> {
    /// Appends and wakes the consumer.
    pub(crate) fn push(&mut self, t: T) {
        self.q.push_back(t);
        self.wake();
    }

    pub(crate) fn wake(&mut self) {
        if let Some(w) = self.waker.take() {
            w.wake();
        }
    }

    /// The node was lost: what is queued came from it, and its counts
    /// start again on the next node.
    pub(crate) fn lost(&mut self) {
        self.epoch = self.epoch.wrapping_add(1);
        self.uncredited = self.q.len();
        self.dropped_base = self.dropped;
    }

    /// For an item just taken by a consumer that counts `taken` since it
    /// last granted credit (as of `epoch`): whether the item earns the
    /// current node credit. Forgets counts made for a lost node.
    pub(crate) fn earns_credit(&mut self, epoch: &mut u32, taken: &mut u32) -> bool {
        if *epoch != self.epoch {
            *epoch = self.epoch;
            *taken = 0;
        }
        if self.uncredited > 0 {
            self.uncredited -= 1;
            return false;
        }
        true
    }

    /// Ends the queue: the consumer gets what is queued, then `None`.
    pub(crate) fn close(&mut self, error: Option<String>) {
        self.closed = true;
        if self.error.is_none() {
            self.error = error;
        }
        self.wake();
    }

    /// Whether items are held back (paused, or the client stopped).
    pub(crate) fn held(&self) -> bool {
        self.paused || self.stopped
    }

    /// The next item, or `Ready(None)` once closed and empty; `Pending`
    /// while held.
    pub(crate) fn poll_pop(&mut self, cx: &mut Context<'_>) -> Poll<Option<T>> {
        if !self.held() {
            if let Some(t) = self.q.pop_front() {
                return Poll::Ready(Some(t));
            }
            if self.closed {
                return Poll::Ready(None);
            }
        } else if self.closed && self.q.is_empty() {
            return Poll::Ready(None);
        }
        match &self.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            _ => self.waker = Some(cx.waker().clone()),
        }
        Poll::Pending
    }
}
