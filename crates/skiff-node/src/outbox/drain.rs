//! The writer's side of a client's outbox: taking what is ready (frames,
//! encoded bytes, or into a [`Sink`]), waiting for it, and whether all of
//! it went. The broker's side (control frames, subscription queues, the
//! byte bounds) is in `outbox.rs`.

use super::*;

/// Where a client's writer puts the frames it takes
/// ([`ClientOut::take_into`]): a front end with an encoding of its own
/// (the NATS listener) writes each as it comes, with no frame built for a
/// message.
pub trait Sink {
    /// A control frame.
    fn frame(&mut self, f: ServerFrame);
    /// A message for subscription `sid` (`token`: a request to answer, or
    /// 0), as it was queued.
    fn msg(&mut self, sid: u64, token: u64, body: Body);
    /// Whether the batch is large enough to write now.
    fn full(&self) -> bool;
}

impl ClientOut {
    /// Moves every ready frame into `out`, waiting until there is one.
    /// Returns `false` once the client is closed (after the final frame,
    /// if any, has been handed out).
    pub async fn next_batch(&self, out: &mut Vec<ServerFrame>) -> bool {
        loop {
            let n = self.ready.notified();
            if self.take(out) {
                return true;
            }
            if self.is_closed() {
                if let Some(f) = self.inner.lock().closing.take() {
                    out.push(f);
                    return true;
                }
                return false;
            }
            n.await;
        }
    }

    /// Moves every ready frame into `out` without waiting; returns whether
    /// it moved any.
    pub fn take(&self, out: &mut Vec<ServerFrame>) -> bool {
        struct Frames<'a>(&'a mut Vec<ServerFrame>, usize);
        impl Sink for Frames<'_> {
            fn frame(&mut self, f: ServerFrame) {
                self.0.push(f);
                self.1 += 1;
            }
            fn msg(&mut self, sid: u64, token: u64, body: Body) {
                if let Some(msg) = body.into_message() {
                    self.0.push(ServerFrame::Msg { sid, token, msg });
                }
                self.1 += 1;
            }
            fn full(&self) -> bool {
                self.1 >= MAX_BATCH
            }
        }
        let mut sink = Frames(out, 0);
        self.drain(&mut sink);
        sink.1 > 0
    }

    /// Encodes every ready frame (up to a batch of about 256 KiB) onto
    /// `out`, waiting until there is one: what a socket writer sends with
    /// one system call. Returns `false` once the client is closed (after
    /// the final frame, if any, has been encoded).
    pub async fn next_encoded(&self, out: &mut Vec<u8>) -> bool {
        loop {
            let n = self.ready.notified();
            if self.take_encoded(out) {
                return true;
            }
            if self.is_closed() {
                if let Some(f) = self.inner.lock().closing.take() {
                    f.encode(out);
                    return true;
                }
                return false;
            }
            n.await;
        }
    }

    /// Encodes ready frames onto `out` without waiting; returns whether it
    /// encoded any.
    pub fn take_encoded(&self, out: &mut Vec<u8>) -> bool {
        struct Enc<'a>(&'a mut Vec<u8>, usize);
        impl Sink for Enc<'_> {
            fn frame(&mut self, f: ServerFrame) {
                f.encode(self.0);
            }
            fn msg(&mut self, sid: u64, token: u64, body: Body) {
                body.encode(self.0, sid, token);
            }
            fn full(&self) -> bool {
                self.0.len() - self.1 >= MAX_BATCH_BYTES
            }
        }
        let start = out.len();
        self.drain(&mut Enc(out, start));
        out.len() > start
    }

    /// Waits until there is a frame to take, or the client is closed.
    pub async fn ready(&self) {
        loop {
            let n = self.ready.notified();
            {
                let o = self.inner.lock();
                if !o.control.is_empty()
                    || !o.ready.is_empty()
                    || !o.drop_reports.is_empty()
                    || self.is_closed()
                {
                    return;
                }
            }
            n.await;
        }
    }

    /// Moves ready frames (up to what `sink` calls a batch) into `sink`
    /// without waiting.
    pub fn take_into<S: Sink>(&self, sink: &mut S) {
        self.drain(sink);
    }

    /// The frame to send last once the client is closed, if any (handed
    /// out once).
    pub fn take_closing(&self) -> Option<ServerFrame> {
        if !self.is_closed() {
            return None;
        }
        self.inner.lock().closing.take()
    }

    fn drain<S: Sink>(&self, out: &mut S) {
        let mut freed = false;
        {
            let mut o = self.inner.lock();
            let o = &mut *o;
            // Control frames first, up to a batch, so the writer holds
            // no more than a batch of what it cannot send yet.
            while !out.full() {
                let Some((mut f, bytes)) = o.control.pop_front() else {
                    break;
                };
                o.pending_bytes -= bytes;
                freed = true;
                if let ServerFrame::TunCredit { tunnel, n } = &mut f {
                    *n = o.tun_credit.remove(tunnel).unwrap_or(*n);
                }
                out.frame(f);
            }
            for sid in o.drop_reports.drain(..) {
                if let Some(s) = o.subs.get_mut(&sid) {
                    s.drop_reported = true;
                    out.frame(ServerFrame::Dropped {
                        sid,
                        total: s.dropped,
                    });
                }
            }
            // Round robin over ready subscriptions, up to BURST each per
            // visit, until nothing is ready or the batch is large.
            while !out.full() {
                let Some(sid) = o.ready.pop_front() else {
                    break;
                };
                let Some(s) = o.subs.get_mut(&sid) else {
                    continue;
                };
                let take = s.credit.min(BURST).min(s.q.len() as u32);
                let mut bytes = 0;
                for (token, body) in s.q.drain(..take as usize) {
                    bytes += body.cost();
                    out.msg(sid, token, body);
                }
                o.pending_bytes -= bytes;
                freed |= take > 0;
                s.credit -= take;
                s.delivered += u64::from(take);
                o.delivered += u64::from(take);
                if s.credit > 0 && !s.q.is_empty() {
                    o.ready.push_back(sid);
                } else {
                    s.in_ready = false;
                }
            }
            if freed {
                self.settle(o);
            }
        }
        if freed {
            self.space.notify_waiters();
        }
    }

    /// Whether nothing is queued (a draining shutdown waits for this):
    /// no control frame, and no message in any subscription, including
    /// those waiting for the client's credit (not in `ready`).
    pub fn is_drained(&self) -> bool {
        let o = self.inner.lock();
        o.control.is_empty() && o.ready.is_empty() && o.subs.values().all(|s| s.q.is_empty())
    }
}
