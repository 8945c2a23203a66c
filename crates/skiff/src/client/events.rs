//! The streams of a client's [`ClientEvent`]s: each listener an inbox of
//! its own, fed by the client's link.

use std::future::poll_fn;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};

use parking_lot::Mutex;

use super::inbox::{self, Inbox, Shared};
use super::status::ClientEvent;

/// Events a listener keeps before it drops the oldest (see
/// [`Events::lagged`]).
const EVENTS_KEPT: usize = 256;

/// The stream of a client's [`ClientEvent`]s from the moment
/// [`super::Client::events`] was called; ends after
/// [`ClientEvent::Closed`]. Keeps the last 256 events if not read.
#[derive(Debug)]
pub struct Events {
    inbox: Shared<ClientEvent>,
}

impl Events {
    /// The next event; `None` once the client is closed and every event
    /// was read.
    pub async fn recv(&mut self) -> Option<ClientEvent> {
        poll_fn(|cx| self.inbox.lock().poll_pop(cx)).await
    }

    /// The next event if one is here now.
    pub fn try_recv(&mut self) -> Option<ClientEvent> {
        self.inbox.lock().q.pop_front()
    }

    /// Events dropped because more than 256 were waiting.
    pub fn lagged(&self) -> u64 {
        self.inbox.lock().dropped
    }
}

impl futures_core::Stream for Events {
    type Item = ClientEvent;
    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<ClientEvent>> {
        self.inbox.lock().poll_pop(cx)
    }
}

/// The listeners of one client.
#[derive(Debug, Default)]
pub(crate) struct Listeners {
    list: Vec<Weak<Mutex<Inbox<ClientEvent>>>>,
    closed: bool,
}

impl Listeners {
    /// A new listener (already ended if the client is closed).
    pub(crate) fn listen(&mut self) -> Events {
        let inbox = inbox::shared();
        if self.closed {
            inbox.lock().close(None);
        } else {
            self.list.push(Arc::downgrade(&inbox));
        }
        Events { inbox }
    }

    /// Hands `ev` to every listener; a [`ClientEvent::Closed`] ends them.
    pub(crate) fn emit(&mut self, ev: ClientEvent) {
        if self.closed {
            return;
        }
        let last = matches!(ev, ClientEvent::Closed { .. });
        self.list.retain(|w| {
            let Some(i) = w.upgrade() else {
                return false;
            };
            let mut i = i.lock();
            if i.q.len() >= EVENTS_KEPT {
                i.q.pop_front();
                i.dropped += 1;
            }
            i.push(ev.clone());
            if last {
                i.close(None);
            }
            true
        });
        if last {
            self.closed = true;
            self.list.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use super::*;

    #[test]
    fn listeners_keep_a_bounded_tail_and_end_on_close() {
        let mut l = Listeners::default();
        let mut ev = l.listen();
        for i in 0..300 {
            l.emit(ClientEvent::Disconnected {
                node: i.to_string(),
                at: SystemTime::UNIX_EPOCH,
                reason: String::new(),
            });
        }
        assert_eq!(ev.lagged(), 44);
        l.emit(ClientEvent::Closed { reason: "x".into() });
        let mut n = 0;
        while let Some(e) = ev.try_recv() {
            n += 1;
            if let ClientEvent::Disconnected { node, .. } = &e {
                assert_eq!(n, 1 + node.parse::<usize>().unwrap() - 45);
            }
        }
        assert_eq!(n, 256);
        assert!(ev.inbox.lock().closed);
        assert!(l.listen().inbox.lock().closed, "late listeners end at once");
    }
}
