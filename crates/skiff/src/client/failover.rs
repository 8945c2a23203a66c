//! Client failover (cMsg): what a `skiff://a:4747,b:4747` client does when
//! its node dies, and how it tells the application.
//!
//! The link is declared lost on end of stream, a read or write error, a
//! `shutdown` error frame from the node, or silence: when nothing arrives
//! for `ping` the client sends a `Ping`, and when still nothing arrives
//! within `ping_timeout` of the last byte heard the node counts as dead.
//! The client then moves round robin through the list (the next address
//! first), retrying with a short bounded backoff until it gets a node or
//! is closed, and re-registers there every subscription and cluster
//! membership it holds (same ids, same options, full credit window).
//!
//! What the application sees:
//! - [`ClientEvent::Disconnected`] then [`ClientEvent::Reconnected`] on
//!   [`super::Client::events`]; the second carries the [`Gap`] (from, to,
//!   when the link went down and came back). `Reconnected` is sent once the
//!   new node holds every restored interest.
//! - On each live subscription the first delivery after a failover carries
//!   the gap ([`super::Delivery::gap`]) and [`super::Subscription::gaps`]
//!   counts failovers; [`super::Member::gaps`] does the same for members.
//! - Calls waiting on the lost node (requests, subscribe, join, stats,
//!   flush, tunnel open) fail at once with [`crate::Error::NodeLost`]; tunnels end.
//!   Replies to requests that came from the lost node fail the same way
//!   (their tokens mean nothing to the new node).
//! - Publishes and broadcasts made while no node is reachable are held in a
//!   bounded buffer (`reconnect_buffer`, default 1 MiB; 0 refuses at once)
//!   and sent after the restore; once it is full a publish fails with
//!   [`crate::Error::NodeLost`]. Both are counted ([`LinkStats`]). Frames queued
//!   to the lost node but not yet written are lost (at most once).
//!
//! Nothing is delivered twice by the client: it never replays messages.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant, SystemTime};

use skiff_proto::client_frame::{ClientFrame, Code};
use tokio::sync::oneshot;

use super::events::Events;
use super::link::Link;
use super::status::{ClientEvent, Gap, LinkStats};
use super::stream::{open, read_session, write_loop, End, Reading, Session, StreamTx};
use super::target::NodeTarget;
use super::{Client, Inner, ReqEvent, NODES_KEPT};
use crate::spin::Spin;

/// Longest wait between two rounds through the address list.
pub(crate) const BACKOFF_MAX: Duration = Duration::from_millis(500);

/// First wait after a round in which no address answered.
pub(crate) const BACKOFF_MIN: Duration = Duration::from_millis(10);

/// Starts the task that drives a stream link from its first session on.
pub(crate) fn spawn_stream(
    inner: &Arc<Inner>,
    tx: Arc<StreamTx>,
    target: NodeTarget,
    first: Session,
) {
    tokio::spawn(drive(Arc::downgrade(inner), tx, target, first));
}

/// Ends a link's spinner with the link.
struct SpinGuard(Option<Arc<Spin>>);

impl Drop for SpinGuard {
    fn drop(&mut self) {
        if let Some(s) = &self.0 {
            s.close();
        }
    }
}

async fn drive(weak: Weak<Inner>, tx: Arc<StreamTx>, target: NodeTarget, first: Session) {
    let opts = &target.opts;
    let mut s = first;
    // The gap being reported: the node first lost and when.
    let mut open_gap: Option<(String, SystemTime, Instant)> = None;
    let spin = SpinGuard(Spin::start(opts.spin));
    loop {
        let (done, mut writer_done) = oneshot::channel();
        let writer = tokio::spawn(write_loop(tx.clone(), s.w, done));
        let (end, last_read) = read_session(
            &weak,
            &tx,
            &mut s.r,
            &mut s.buf,
            Reading {
                max_payload: s.max_payload as usize,
                opts,
                spin: spin.0.as_deref(),
            },
            &mut writer_done,
        )
        .await;
        let why = match end {
            // The writer flushes what is queued, then shuts the socket.
            End::Closed => {
                if let Some(inner) = weak.upgrade() {
                    inner.shut(None);
                }
                return;
            }
            End::Lost(why) | End::BadFrame(why) if opts.reconnect => why,
            End::Fatal(why) | End::Lost(why) => {
                writer.abort();
                if let Some(inner) = weak.upgrade() {
                    inner.fail(why);
                }
                return;
            }
            End::BadFrame(why) => {
                writer.abort();
                if let Some(inner) = weak.upgrade() {
                    inner.fail_with(Code::Protocol, why);
                }
                return;
            }
        };
        // Nothing more goes to the old connection.
        writer.abort();
        let _ = writer.await;
        let lost = target.addrs[s.at].to_string();
        let Some(inner) = weak.upgrade() else {
            return;
        };
        let now = SystemTime::now();
        // A node lost before it confirmed the restore: the gap that began
        // with the previous loss goes on.
        let unconfirmed = inner.lost(&tx, &lost, now, why);
        drop(inner);
        if !unconfirmed || open_gap.is_none() {
            // The gap begins with the last bytes read from the lost node,
            // not when its loss was noticed (a node that went silent was
            // noticed only at the ping timeout).
            let silent = last_read.elapsed();
            let since = Instant::now();
            open_gap = Some((
                lost,
                now.checked_sub(silent).unwrap_or(now),
                since.checked_sub(silent).unwrap_or(since),
            ));
        }
        let (from, down_at, down) = open_gap.clone().expect("set");
        let mut at = s.at;
        let mut attempts = 0u32;
        let mut in_round = 0;
        let mut backoff = BACKOFF_MIN;
        let next = loop {
            at = (at + 1) % target.addrs.len();
            attempts = attempts.saturating_add(1);
            let r = tokio::select! {
                r = open(&target.addrs[at], at, opts) => r,
                _ = tx.closing() => return closed_between_nodes(&weak),
            };
            if tx.is_closed() || weak.strong_count() == 0 {
                return closed_between_nodes(&weak);
            }
            if let Ok(s) = r {
                break s;
            }
            // A round with no node: wait a little (with jitter, so that
            // the clients of a dead node do not come back in step).
            in_round += 1;
            if in_round == target.addrs.len() {
                in_round = 0;
                let wait = backoff.mul_f64(0.75 + rand::random::<f64>() / 2.0);
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = tx.closing() => return closed_between_nodes(&weak),
                }
                backoff = (backoff * 2).min(BACKOFF_MAX);
            }
        };
        let Some(inner) = weak.upgrade() else {
            return;
        };
        let gap = Gap {
            from,
            to: target.addrs[at].to_string(),
            down_at,
            up_at: SystemTime::now(),
            down_for: down.elapsed(),
            attempts,
        };
        inner.restore(&tx, gap, next.client, next.max_payload);
        drop(inner);
        s = next;
    }
}

/// The application closed the client while it had no node: everything
/// waiting ends.
fn closed_between_nodes(weak: &Weak<Inner>) {
    if let Some(inner) = weak.upgrade() {
        inner.shut(None);
    }
}

/// What the application asks about its link.
impl Client {
    /// The client's link events (failovers, closing) from now on: see
    /// [`ClientEvent`]. Each call makes an independent listener.
    pub fn events(&self) -> Events {
        self.inner.state.lock().listeners.listen()
    }

    /// The node this client is connected to now, as in its locator; `None`
    /// while failing over, in process (`mem://`) or once closed.
    pub fn node(&self) -> Option<String> {
        self.inner.state.lock().node.clone()
    }

    /// The link's counters: failovers, and publishes held or refused while
    /// no node was reachable.
    pub fn link_stats(&self) -> LinkStats {
        let (held, refused) = match &self.inner.link {
            Some(Link::Stream(tx)) => tx.held_refused(),
            _ => (0, 0),
        };
        let (unconfirmed, forgotten, maybe_lost) = match &self.inner.link {
            Some(Link::Stream(tx)) => tx.confirm_counts(),
            _ => (0, 0, 0),
        };
        let st = self.inner.state.lock();
        LinkStats {
            node: st.node.clone(),
            failovers: st.failovers,
            held,
            refused,
            unconfirmed,
            forgotten,
            maybe_lost,
        }
    }

    /// Takes back the publishes that lost nodes may not have taken (see
    /// [`ClientEvent::Unconfirmed`]), oldest first, each with its number
    /// (publishes are numbered 1, 2, 3, … over the client's life), so the
    /// application can publish them again. Over a stream link
    /// (`skiff://`, `tcp://`, `unix://`, `tls://`) with
    /// `unconfirmed_buffer` above 0 (by default 1 MiB for a client that
    /// fails over, 0 for a lone one); empty otherwise.
    pub fn unconfirmed(&self) -> Vec<(u64, skiff_proto::Message)> {
        match &self.inner.link {
            Some(Link::Stream(tx)) => tx.take_unconfirmed(),
            _ => Vec::new(),
        }
    }
}

/// What the link driver does to the client's state on a failover.
impl Inner {
    /// The link to `node` was lost at `at` (failover follows): calls in
    /// flight fail with [`crate::Error::NodeLost`], tunnels end, and what is
    /// registered stays to be restored on the next node. True if `node`
    /// had not yet confirmed a restore (the previous gap is not over).
    pub(crate) fn lost(&self, tx: &StreamTx, node: &str, at: SystemTime, why: String) -> bool {
        let mut st = self.state.lock();
        let st = &mut *st;
        self.epoch.fetch_add(1, Ordering::AcqRel);
        let unconfirmed = tx.go_down(node);
        st.node = None;
        let restoring = st.restoring.take().is_some();
        for (_, w) in st.waiters.drain() {
            let _ = w.send(Err(crate::Error::NodeLost { node: node.into() }));
        }
        for (_, r) in st.requests.drain() {
            let _ = r.send(ReqEvent::Lost(node.into()));
        }
        for (_, t) in st.tunnels.drain() {
            t.lose(node);
        }
        st.joins.clear();
        st.subs.retain(|_, s| s.live);
        for s in st.subs.values() {
            s.inbox.lock().lost();
            // The reader of the lost node's topic buffer stops.
            if let Some(g) = &s.topic {
                g.fetch_add(1, Ordering::AcqRel);
            }
        }
        st.members.retain(|_, m| m.capacity.is_some());
        st.listeners.emit(ClientEvent::Disconnected {
            node: node.into(),
            at,
            reason: why,
        });
        if let Some(u) = unconfirmed {
            st.listeners.emit(ClientEvent::Unconfirmed(u));
        }
        restoring
    }

    /// A new node welcomed the client (id `client`): re-register every
    /// subscription (same id and options, a full credit window) and
    /// membership there, then a ping whose answer reports the gap; the
    /// publishes held meanwhile follow.
    pub(crate) fn restore(&self, tx: &StreamTx, gap: Gap, client: u64, max_payload: u64) {
        self.id.store(client, Ordering::Relaxed);
        self.max_payload
            .store(max_payload as usize, Ordering::Relaxed);
        let mut out = Vec::new();
        if tx.confirms() {
            // First: the new node confirms what it takes from now on.
            ClientFrame::Confirm.encode(&mut out);
        }
        let mut st = self.state.lock();
        let st = &mut *st;
        let shared = Arc::new(gap.clone());
        for (&sid, s) in &st.subs {
            let mut i = s.inbox.lock();
            i.gaps += 1;
            i.pending_gap = Some(shared.clone());
            drop(i);
            // A shared-buffer subscription reads the new node's buffer of
            // its topic when the new node is on shm (else it is a plain
            // subscription there).
            #[cfg(not(skiff_loom))]
            if let (Some(g), true) = (&s.topic, gap.to.starts_with("shm://")) {
                g.fetch_add(1, Ordering::AcqRel);
                super::shm_topic::restore_kept(self, gap.to.clone(), s, g.clone());
                continue;
            }
            if let Some(g) = &s.topic {
                g.fetch_add(1, Ordering::AcqRel);
            }
            ClientFrame::Sub {
                sid,
                pattern: s.pattern.clone(),
                kind: s.kind.clone(),
                policy: s.opts.policy,
                queue: s.opts.queue.max(1),
                credit: s.opts.window.max(1),
                syntax: s.opts.syntax,
                best_effort: s.opts.best_effort,
                group: s
                    .opts
                    .queue_group
                    .and_then(|g| g.name().ok().map(str::to_owned)),
            }
            .encode(&mut out);
        }
        for (name, m) in &st.members {
            if let Some(capacity) = m.capacity {
                let corr = self.next_id();
                st.joins.insert(corr, (name.clone(), capacity));
                ClientFrame::Join {
                    corr,
                    cluster: name.clone(),
                    capacity,
                }
                .encode(&mut out);
                m.inbox.lock().gaps += 1;
            }
        }
        let corr = self.next_id();
        ClientFrame::Ping { corr }.encode(&mut out);
        let epoch = self.epoch();
        if st.nodes.len() >= NODES_KEPT {
            st.nodes.remove(0);
        }
        st.nodes.push((epoch, gap.to.clone()));
        st.node = Some(gap.to.clone());
        st.restoring = Some((corr, gap));
        tx.go_up(out);
    }
}
