//! [`Output`]: the producing side of a buffer (RocketBufs' rOut).

use std::collections::BTreeMap;
use std::fs;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use skiff_proto::credits::{Delivered, Flow};

use crate::shm::layout::{Layout, CLOSED};
use crate::shm::ring::{Ring, RingProducer, Writable};
use crate::shm::{assoc, tcp};
use crate::shm::{BufferError, BufferId, BufferOptions, LinkStats, Region};

use super::{create_file, default_records, parse, ring_path, Input, Kind};

/// A segment reserved for writing; deliver it with [`Output::deliver`].
/// Dropping it undelivered gives the space back.
#[derive(Debug)]
pub struct SegmentMut {
    id: BufferId,
    w: Writable,
}

impl SegmentMut {
    /// The buffer.
    pub fn id(&self) -> BufferId {
        self.id
    }

    /// Bytes reserved.
    pub fn len(&self) -> usize {
        self.w.res.len as usize
    }

    /// Whether zero bytes were reserved.
    pub fn is_empty(&self) -> bool {
        self.w.res.len == 0
    }

    /// The segment in place: one slice, or two when it wraps around the
    /// ring (the second is then non-empty).
    pub fn slices_mut(&mut self) -> (&mut [u8], &mut [u8]) {
        self.w.slices_mut()
    }

    /// Copies `data` to offset `at` of the segment across the wrap.
    /// Panics if it does not fit (a caller bug).
    pub fn write(&mut self, at: usize, data: &[u8]) {
        let (a, b) = self.w.slices_mut();
        assert!(
            at + data.len() <= a.len() + b.len(),
            "write past the segment"
        );
        let mut at = at;
        let mut data = data;
        if at < a.len() {
            let n = (a.len() - at).min(data.len());
            a[at..at + n].copy_from_slice(&data[..n]);
            data = &data[n..];
            at += n;
        }
        if data.is_empty() {
            return;
        }
        let off = at - a.len();
        b[off..off + data.len()].copy_from_slice(data);
    }
}

enum OutBuf {
    Own {
        prod: RingProducer,
        file: Option<PathBuf>,
    },
    /// Fed by an input (splice): the ring of that input, shared onward.
    Spliced {
        /// Keeps the input's ring mapped while subscribers use it.
        _ring: Arc<Ring>,
        link: Option<PathBuf>,
    },
}

/// What an output knows about one buffer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OutStats {
    /// Segments published.
    pub segments: u64,
    /// Bytes published.
    pub bytes: u64,
    /// Subscribers detached because their process died or they wrote
    /// impossible positions (`shm`), or because their connection ended
    /// without unsubscribing (`tcp`: no close frame; `udp`: the tunnel
    /// failed).
    pub subscribers_lost: u64,
}

/// RocketBufs' rOut: creates buffers and delivers segments to every
/// subscriber of each.
pub struct Output {
    kind: Kind,
    opts: BufferOptions,
    buffers: BTreeMap<BufferId, OutBuf>,
    server: Option<tcp::Server>,
    userver: Option<assoc::Server>,
    on_delivered: Option<Box<dyn FnMut(BufferId, Delivered) + Send>>,
}

impl std::fmt::Debug for Output {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Output")
            .field("kind", &self.kind)
            .field("buffers", &self.buffers.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Output {
    /// An output on `shm://name` (ring files under `dir/name/`),
    /// `tcp://host:port` or `udp://host:port?reliable=true` (listens there;
    /// port 0 picks one, see [`Output::local_addr`]). Options: `dir`,
    /// `spin`, `records`, `consumers`, `wait`; over `udp://` also the
    /// association endpoint's (`idle_timeout`, `keepalive`, `mtu`, …, see
    /// [`crate::EndpointConfig`]), which both sides should share.
    pub fn open(locator: &str) -> Result<Output, BufferError> {
        let (kind, opts) = parse(locator)?;
        let (mut server, mut userver) = (None, None);
        match &kind {
            Kind::Shm(ns) => {
                fs::create_dir_all(ns).map_err(BufferError::io("create ring directory"))?
            }
            Kind::Tcp(addr) => server = Some(tcp::Server::bind(*addr, opts.spin)?),
            Kind::Udp(addr, ep) => userver = Some(assoc::Server::bind(*addr, ep, opts.spin)?),
        }
        Ok(Output {
            kind,
            opts,
            buffers: BTreeMap::new(),
            server,
            userver,
            on_delivered: None,
        })
    }

    /// The address subscribers connect to (`tcp://` and `udp://` only).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        match (&self.server, &self.userver) {
            (Some(s), _) => Some(s.addr),
            (_, Some(u)) => Some(u.addr),
            _ => None,
        }
    }

    /// The network transport's counters (`shm://`: `None`).
    pub fn link_stats(&self) -> Option<LinkStats> {
        match (&self.server, &self.userver) {
            (Some(s), _) => Some(s.stats()),
            (_, Some(u)) => Some(u.stats()),
            _ => None,
        }
    }

    /// Creates buffer `id` of `size` bytes. Errors: the id exists here or
    /// (shm) is held by another live process.
    pub fn create_buffer(
        &mut self,
        id: BufferId,
        size: usize,
        flow: Flow,
    ) -> Result<(), BufferError> {
        if self.buffers.contains_key(&id) {
            return Err(BufferError::DuplicateId {
                id,
                owner: String::new(),
            });
        }
        let cap = size as u64;
        let records = self.opts.records.unwrap_or_else(|| default_records(cap));
        let layout = Layout::new(cap, records, self.opts.consumers, flow)
            .map_err(|e| BufferError::Usage { id, why: e.0 })?;
        let (ring, file) = match &self.kind {
            Kind::Shm(ns) => {
                let (ring, path) = create_file(ns, id, layout)?;
                (ring, Some(path))
            }
            Kind::Tcp(_) | Kind::Udp(..) => {
                let region =
                    Region::anonymous(layout.total).map_err(BufferError::io("map ring"))?;
                (Arc::new(Ring::init(region, layout, id)), None)
            }
        };
        self.publish(id, &ring);
        let prod = RingProducer::new(ring);
        self.buffers.insert(id, OutBuf::Own { prod, file });
        Ok(())
    }

    /// Hands ring `id` to the network server, if any.
    fn publish(&self, id: BufferId, ring: &Arc<Ring>) {
        if let Some(s) = &self.server {
            s.publish(id, Arc::clone(ring));
        }
        if let Some(u) = &self.userver {
            u.publish(id, Arc::clone(ring));
        }
    }

    fn producer(&mut self, id: BufferId) -> Result<&mut RingProducer, BufferError> {
        match self.buffers.get_mut(&id) {
            Some(OutBuf::Own { prod, .. }) => Ok(prod),
            Some(OutBuf::Spliced { .. }) => Err(BufferError::Usage {
                id,
                why: "the buffer is spliced from an input; its input feeds it".into(),
            }),
            None => Err(BufferError::UnknownBuffer { id }),
        }
    }

    /// A writable segment of `len` bytes of buffer `id`. Without
    /// `blocking`, [`BufferError::WouldBlock`] when the subscribers have not
    /// consumed enough; with it, waits (reaping dead subscribers). One
    /// segment per buffer may be outstanding.
    pub fn segment(
        &mut self,
        id: BufferId,
        len: usize,
        blocking: bool,
    ) -> Result<SegmentMut, BufferError> {
        let spin = self.opts.spin;
        let prod = self.producer(id)?;
        if prod.outstanding() {
            return Err(BufferError::Usage {
                id,
                why: "a segment of this buffer is outstanding; deliver or drop it first".into(),
            });
        }
        prod.abandon();
        let res = if blocking {
            prod.reserve(len as u64, None, spin)?
        } else {
            prod.try_reserve(len as u64)
                .map_err(|e| BufferError::credit(id, e))?
        };
        Ok(SegmentMut {
            id,
            w: prod.writable(res),
        })
    }

    /// Publishes the first `used` bytes of `seg` to every subscriber.
    pub fn deliver(&mut self, seg: SegmentMut, used: usize) -> Result<(), BufferError> {
        let id = seg.id;
        let prod = self.producer(id)?;
        if !seg.w.is_of(&prod.ring) {
            return Err(BufferError::Usage {
                id,
                why: "the segment belongs to another buffer object".into(),
            });
        }
        prod.finish(seg.w);
        prod.commit(used as u64)
            .map_err(|e| BufferError::credit(id, e))?;
        Ok(())
    }

    /// Copies `data` into a new segment of buffer `id` and delivers it.
    pub fn send(&mut self, id: BufferId, data: &[u8], blocking: bool) -> Result<(), BufferError> {
        let mut seg = self.segment(id, data.len(), blocking)?;
        seg.write(0, data);
        self.deliver(seg, data.len())
    }

    /// Registers a callback for segments that reached every subscriber
    /// (RocketBufs' `set_data_out_cb`); it runs inside
    /// [`Output::poll_delivered`].
    pub fn set_delivered_callback(&mut self, cb: impl FnMut(BufferId, Delivered) + Send + 'static) {
        self.on_delivered = Some(Box::new(cb));
    }

    /// The next segment that reached every subscriber (credit flow: all
    /// consumed it; overwrite flow: published), if any. With a callback
    /// set, runs it for every such segment and returns `None`.
    pub fn poll_delivered(&mut self) -> Option<(BufferId, Delivered)> {
        loop {
            let mut found = None;
            for (id, b) in self.buffers.iter_mut() {
                if let OutBuf::Own { prod, .. } = b {
                    if let Some(d) = prod.poll_delivered() {
                        found = Some((*id, d));
                        break;
                    }
                }
            }
            match (found, self.on_delivered.as_mut()) {
                (Some((id, d)), Some(cb)) => cb(id, d),
                (found, _) => return found,
            }
        }
    }

    /// The capacity of buffer `id` in bytes (the largest segment).
    pub fn capacity(&self, id: BufferId) -> Result<usize, BufferError> {
        match self.buffers.get(&id) {
            Some(OutBuf::Own { prod, .. }) => Ok(prod.ring.layout.geom.capacity() as usize),
            Some(OutBuf::Spliced { .. }) => Err(BufferError::Usage {
                id,
                why: "the buffer is spliced from an input; its input feeds it".into(),
            }),
            None => Err(BufferError::UnknownBuffer { id }),
        }
    }

    /// Statistics of buffer `id`.
    pub fn stats(&self, id: BufferId) -> Option<OutStats> {
        match self.buffers.get(&id)? {
            OutBuf::Own { prod, .. } => Some(OutStats {
                segments: prod.segments(),
                bytes: prod.head(),
                subscribers_lost: prod.consumers_lost
                    + self.server.as_ref().map_or(0, |s| s.lost(id))
                    + self.userver.as_ref().map_or(0, |u| u.lost(id)),
            }),
            OutBuf::Spliced { .. } => Some(OutStats::default()),
        }
    }

    /// Forwards buffer `id` of `input` to this output's subscribers without
    /// copying (RocketBufs' splice). The input stops delivering `id` to its
    /// own application. `shm` into `shm`: the ring file is linked into this
    /// output's namespace (subscribers read the original bytes). Any input
    /// into `tcp` or `udp`: the sender threads send from the input's ring
    /// (over `udp`, credits flow on upstream as downstream subscribers
    /// consume). A `tcp` or `udp` input into an `shm` output is refused
    /// (its ring is process-private; forwarding it would need a copy).
    pub fn splice(&mut self, input: &mut Input, id: BufferId) -> Result<(), BufferError> {
        if self.buffers.contains_key(&id) {
            return Err(BufferError::DuplicateId {
                id,
                owner: String::new(),
            });
        }
        let sub = input
            .subs
            .get(&id)
            .ok_or(BufferError::UnknownBuffer { id })?;
        let ring = Arc::clone(&sub.cons.ring);
        let link = match (&self.kind, &sub.file) {
            (Kind::Shm(ns), Some(src)) => {
                let dst = ring_path(ns, id);
                fs::hard_link(src, &dst).map_err(BufferError::io("link spliced ring"))?;
                Some(dst)
            }
            (Kind::Shm(_), None) => {
                return Err(BufferError::Usage {
                    id,
                    why: "cannot splice a tcp or udp input into an shm output without a copy"
                        .into(),
                })
            }
            (Kind::Tcp(_) | Kind::Udp(..), _) => None,
        };
        self.publish(id, &ring);
        input.subs.remove(&id);
        self.buffers
            .insert(id, OutBuf::Spliced { _ring: ring, link });
        Ok(())
    }
}

impl Drop for Output {
    fn drop(&mut self) {
        for b in self.buffers.values() {
            match b {
                OutBuf::Own { prod, file } => {
                    prod.ring.close(CLOSED);
                    if let Some(f) = file {
                        let _ = fs::remove_file(f);
                    }
                }
                OutBuf::Spliced { link, .. } => {
                    if let Some(l) = link {
                        let _ = fs::remove_file(l);
                    }
                }
            }
        }
        if let Kind::Shm(ns) = &self.kind {
            // Only succeeds once the namespace is empty.
            let _ = fs::remove_dir(ns);
        }
        if let Some(s) = self.server.take() {
            s.shutdown();
        }
        if let Some(u) = self.userver.take() {
            u.shutdown();
        }
    }
}
