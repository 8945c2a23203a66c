//! [`Input`]: the consuming side of a buffer (RocketBufs' rIn).

use std::collections::BTreeMap;
use std::fs;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use skiff_proto::credits::{Delivered, Flow};

use crate::shm::layout::Layout;
use crate::shm::ring::{Ring, RingConsumer, RingProducer};
use crate::shm::{assoc, tcp};
use crate::shm::{BufferError, BufferId, BufferOptions, LinkStats, Region};

use super::{default_records, open_ring, parse, ring_path, Kind};

pub(super) struct InBuf {
    pub(super) cons: RingConsumer,
    pub(super) file: Option<PathBuf>,
    /// `udp://`: consumed position at the last credit nudge, and how much
    /// consumption (besides emptying the ring) earns another.
    nudge: Option<(u64, u64)>,
}

/// What an input knows about one buffer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InStats {
    /// Overwrite flow: reads whose sequence lock broke (data changed
    /// while read).
    pub torn: u64,
    /// Overwrite flow: segments overwritten before they were read.
    pub lost: u64,
    /// Bytes received and not yet consumed.
    pub unconsumed: u64,
}

/// RocketBufs' rIn: subscribes to buffers and reads their segments in
/// place.
pub struct Input {
    kind: Kind,
    opts: BufferOptions,
    pub(super) subs: BTreeMap<BufferId, InBuf>,
    client: Option<tcp::Client>,
    uclient: Option<assoc::Client>,
    rr: usize,
}

impl std::fmt::Debug for Input {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Input")
            .field("kind", &self.kind)
            .field("subs", &self.subs.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// A segment received: `(buffer id, bytes)` readable in place while it is
/// borrowed.
#[derive(Debug)]
pub struct InSegment<'a> {
    id: BufferId,
    seg: Delivered,
    cons: &'a RingConsumer,
}

impl InSegment<'_> {
    /// The buffer.
    pub fn id(&self) -> BufferId {
        self.id
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.seg.len as usize
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.seg.len == 0
    }

    /// Position of the first byte in the buffer's stream.
    pub fn position(&self) -> u64 {
        self.seg.start
    }

    /// The bytes in place (one slice, two when wrapped). Credit flow only:
    /// an overwrite buffer may change under a reader, so it is read with
    /// [`InSegment::copy_to`].
    pub fn slices(&self) -> Result<(&[u8], &[u8]), BufferError> {
        self.cons
            .slices(self.seg.start, self.seg.len)
            .ok_or_else(|| BufferError::Usage {
                id: self.id,
                why: "overwrite buffers are read with copy_to (data may change under a reader)"
                    .into(),
            })
    }

    /// Appends the bytes to `out`. Overwrite flow: `false` (and counted as
    /// torn) if the producer overwrote them meanwhile; `out` then holds
    /// garbage past its old length, which the caller discards.
    pub fn copy_to(&self, out: &mut Vec<u8>) -> bool {
        self.cons
            .copy(self.seg.seg, self.seg.start, self.seg.len, out)
    }

    /// Overwrite flow: whether the segment is still whole (read the data,
    /// then ask). Always true with credits.
    pub fn intact(&self) -> bool {
        self.cons.ring.layout.flow == Flow::Credits || self.cons.intact(self.seg.seg)
    }

    /// The bytes as one vector (copied).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.len());
        self.copy_to(&mut v);
        v
    }
}

impl Input {
    /// An input on `shm://name`, `tcp://host:port` or
    /// `udp://host:port?reliable=true` (connects, waiting up to `wait`).
    /// Options as for [`Output::open`](super::Output::open).
    pub fn open(locator: &str) -> Result<Input, BufferError> {
        let (kind, opts) = parse(locator)?;
        let (mut client, mut uclient) = (None, None);
        match &kind {
            Kind::Shm(_) => {}
            Kind::Tcp(addr) => client = Some(tcp::Client::connect(*addr, opts.wait)?),
            Kind::Udp(addr, ep) => uclient = Some(assoc::Client::connect(*addr, ep, opts.wait)?),
        }
        Ok(Input {
            kind,
            opts,
            subs: BTreeMap::new(),
            client,
            uclient,
            rr: 0,
        })
    }

    /// The network transport's counters (`shm://`: `None`).
    pub fn link_stats(&self) -> Option<LinkStats> {
        match (&self.client, &self.uclient) {
            (Some(c), _) => Some(c.stats()),
            (_, Some(u)) => Some(u.stats()),
            _ => None,
        }
    }

    /// Subscribes to buffer `id`. Over `shm` the producer's ring is shared
    /// (waits up to `wait` for it to appear; `size` must be non-zero); over
    /// `tcp` and `udp` a local ring of `size` bytes receives the data (over
    /// `udp` the producer sends only what fits in it: credits).
    pub fn subscribe(&mut self, id: BufferId, size: usize) -> Result<(), BufferError> {
        if self.subs.contains_key(&id) {
            return Err(BufferError::DuplicateId {
                id,
                owner: String::new(),
            });
        }
        if size == 0 {
            return Err(BufferError::Usage {
                id,
                why: "subscribe with a size of at least 1 byte".into(),
            });
        }
        let (ring, file) = match (&self.kind, &self.client) {
            (Kind::Shm(ns), _) => {
                let path = ring_path(ns, id);
                let until = Instant::now() + self.opts.wait;
                while !path.exists() {
                    if Instant::now() >= until {
                        return Err(BufferError::UnknownBuffer { id });
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
                let ring = open_ring(&path, id)?;
                if !ring.producer_alive() {
                    let _ = fs::remove_file(&path);
                    return Err(BufferError::PeerDead {
                        id,
                        pid: ring.producer.0,
                    });
                }
                (ring, Some(path))
            }
            (Kind::Tcp(_), Some(c)) => {
                if size > tcp::MAX_LEN as usize {
                    return Err(BufferError::TooLarge {
                        id,
                        len: size as u64,
                        limit: u64::from(tcp::MAX_LEN),
                    });
                }
                let cap = size as u64;
                let layout = Layout::new(cap, default_records(cap), 1, Flow::Credits)
                    .map_err(|e| BufferError::Usage { id, why: e.0 })?;
                let region =
                    Region::anonymous(layout.total).map_err(BufferError::io("map ring"))?;
                let ring = Arc::new(Ring::init(region, layout, id));
                let cons = RingConsumer::attach(Arc::clone(&ring))?;
                c.subscribe(id, size as u32, RingProducer::new(ring))?;
                self.subs.insert(
                    id,
                    InBuf {
                        cons,
                        file: None,
                        nudge: None,
                    },
                );
                return Ok(());
            }
            (Kind::Tcp(_), None) => unreachable!("a tcp input has a client"),
            (Kind::Udp(..), _) => {
                let Some(c) = &self.uclient else {
                    unreachable!("a udp input has a client")
                };
                if size > assoc::MAX_LEN as usize {
                    return Err(BufferError::TooLarge {
                        id,
                        len: size as u64,
                        limit: u64::from(assoc::MAX_LEN),
                    });
                }
                let cap = size as u64;
                let records = self.opts.records.unwrap_or_else(|| default_records(cap));
                let layout = Layout::new(cap, records, self.opts.consumers, Flow::Credits)
                    .map_err(|e| BufferError::Usage { id, why: e.0 })?;
                let cons = c.subscribe(id, &layout)?;
                let quarter = (cap / 4).max(1);
                self.subs.insert(
                    id,
                    InBuf {
                        cons,
                        file: None,
                        nudge: Some((0, quarter)),
                    },
                );
                return Ok(());
            }
        };
        let cons = RingConsumer::attach(ring)?;
        self.subs.insert(
            id,
            InBuf {
                cons,
                file,
                nudge: None,
            },
        );
        Ok(())
    }

    /// The next segment of any subscribed buffer, waiting up to `timeout`
    /// (`None`: forever); `Ok(None)` on timeout. Errors: the buffer was
    /// closed ([`BufferError::Closed`]), its producer died
    /// ([`BufferError::PeerDead`], the file is reclaimed), the network peer
    /// went away without closing it ([`BufferError::PeerLost`], `tcp` and
    /// `udp`), or it is corrupt.
    pub fn recv(
        &mut self,
        timeout: Option<Duration>,
    ) -> Result<Option<InSegment<'_>>, BufferError> {
        // One buffer: straight to its ring (no allocation, one clock read
        // only if it must wait).
        if self.subs.len() == 1 {
            let (&id, sub) = self
                .subs
                .iter_mut()
                .next()
                .ok_or(BufferError::UnknownBuffer { id: 0 })?;
            let got = match sub.cons.try_next() {
                Ok(None) => {
                    let deadline = timeout.map(|t| Instant::now() + t);
                    sub.cons.next(deadline, self.opts.spin)
                }
                other => other,
            };
            let found = Self::reclaim(sub, got)?;
            return Ok(found.map(|seg| InSegment {
                id,
                seg,
                cons: &self.subs[&id].cons,
            }));
        }
        let deadline = timeout.map(|t| Instant::now() + t);
        let ids: Vec<BufferId> = self.subs.keys().copied().collect();
        if ids.is_empty() {
            return Err(BufferError::UnknownBuffer { id: 0 });
        }
        let found = loop {
            if let Some(f) = self.poll_once(&ids)? {
                break Some(f);
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                break None;
            }
            // Sleep on the first buffer's futex (all of them if only one).
            let slice = if ids.len() == 1 {
                deadline
            } else {
                Some(deadline.map_or(now + Duration::from_millis(1), |d| {
                    d.min(now + Duration::from_millis(1))
                }))
            };
            let id = ids[0];
            let sub = self
                .subs
                .get_mut(&id)
                .ok_or(BufferError::UnknownBuffer { id })?;
            let got = sub.cons.next(slice, self.opts.spin);
            match Self::reclaim(sub, got)? {
                Some(d) => break Some((id, d)),
                None if ids.len() == 1 => break None,
                None => {}
            }
        };
        Ok(found.map(|(id, seg)| InSegment {
            id,
            seg,
            cons: &self.subs[&id].cons,
        }))
    }

    /// The next segment if one is there now.
    pub fn try_recv(&mut self) -> Result<Option<InSegment<'_>>, BufferError> {
        // One buffer: straight to its ring (no allocation).
        if self.subs.len() == 1 {
            let Some((&id, sub)) = self.subs.iter_mut().next() else {
                return Err(BufferError::UnknownBuffer { id: 0 });
            };
            let got = sub.cons.try_next();
            let found = Self::reclaim(sub, got)?;
            return Ok(found.map(|seg| InSegment {
                id,
                seg,
                cons: &sub.cons,
            }));
        }
        let ids: Vec<BufferId> = self.subs.keys().copied().collect();
        Ok(self.poll_once(&ids)?.map(|(id, seg)| InSegment {
            id,
            seg,
            cons: &self.subs[&id].cons,
        }))
    }

    fn poll_once(
        &mut self,
        ids: &[BufferId],
    ) -> Result<Option<(BufferId, Delivered)>, BufferError> {
        for k in 0..ids.len() {
            let id = ids[(self.rr + k) % ids.len()];
            let sub = self
                .subs
                .get_mut(&id)
                .ok_or(BufferError::UnknownBuffer { id })?;
            // A segment or an error: the next call starts after this
            // buffer, so a closed or corrupt buffer, which reports its
            // error on every call, does not starve the others.
            let got = sub.cons.try_next();
            match Self::reclaim(sub, got) {
                Ok(None) => {}
                got => {
                    self.rr = (self.rr + k + 1) % ids.len();
                    return got.map(|d| d.map(|d| (id, d)));
                }
            }
        }
        Ok(None)
    }

    /// Passes `got` through; a dead producer's file is removed on the way.
    fn reclaim(
        sub: &mut InBuf,
        got: Result<Option<Delivered>, BufferError>,
    ) -> Result<Option<Delivered>, BufferError> {
        if let Err(BufferError::PeerDead { .. }) = &got {
            sub.cons.detach();
            if let Some(f) = &sub.file {
                let _ = fs::remove_file(f);
            }
        }
        got
    }

    /// Returns `len` bytes of buffer `id` to its producer (RocketBufs'
    /// `data_consumed`), oldest first.
    pub fn consumed(&mut self, id: BufferId, len: usize) -> Result<(), BufferError> {
        let sub = self
            .subs
            .get_mut(&id)
            .ok_or(BufferError::UnknownBuffer { id })?;
        sub.cons.consume(len as u64)?;
        // `udp`: the producer waits for this credit; report it when a
        // quarter of the ring came free or the ring is empty (and in any
        // case within a few milliseconds).
        if let (Some((last, quarter)), Some(c)) = (&mut sub.nudge, &self.uclient) {
            let (consumed, received) = sub.cons.positions();
            if consumed == received || consumed - *last >= *quarter {
                *last = consumed;
                c.nudge();
            }
        }
        Ok(())
    }

    /// Everything received and not yet consumed of buffer `id`, in place
    /// (RocketBufs' `get_buf_ref`; credit flow).
    pub fn unconsumed(&self, id: BufferId) -> Result<InSegment<'_>, BufferError> {
        let sub = self
            .subs
            .get(&id)
            .ok_or(BufferError::UnknownBuffer { id })?;
        let (consumed, received) = sub.cons.positions();
        Ok(InSegment {
            id,
            seg: Delivered {
                seg: u64::MAX,
                start: consumed,
                len: received - consumed,
            },
            cons: &sub.cons,
        })
    }

    /// Statistics of buffer `id`.
    pub fn stats(&self, id: BufferId) -> Option<InStats> {
        let sub = self.subs.get(&id)?;
        let (consumed, received) = sub.cons.positions();
        Some(InStats {
            torn: sub.cons.torn.get(),
            lost: sub.cons.lost,
            unconsumed: received - consumed,
        })
    }
}

impl Drop for Input {
    fn drop(&mut self) {
        self.subs.clear();
        if let Some(c) = self.client.take() {
            c.shutdown();
        }
        if let Some(c) = self.uclient.take() {
            c.shutdown();
        }
    }
}
