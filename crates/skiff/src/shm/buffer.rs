//! [`Output`] (RocketBufs' rOut) and [`Input`] (rIn): the buffer API, the
//! same over every transport. Both sides always work on rings (see
//! `ring.rs`): over `shm://` the ring file is shared with the peer; over
//! `tcp://` and `udp://…?reliable=true` each side has a local ring and
//! threads move bytes between the ring and the socket or tunnel (`tcp.rs`,
//! `assoc/`).

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::Read;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use skiff_proto::credits::{Delivered, Flow};

use super::layout::{HeaderWords, Layout, CLOSED};
use super::ring::{Ring, RingConsumer, RingProducer, Writable};
use super::{assoc, tcp};
use super::{sys, BufferError, BufferId, BufferOptions, LinkStats, Region};
use crate::error::LocatorError;
use crate::locator::Locator;

const ACCEPTED: &str =
    "dir, spin, records, consumers, wait (udp: also reliable and the endpoint's options)";

/// The transport a locator names.
#[derive(Debug)]
enum Kind {
    /// `shm://name`: ring files under `dir/name/`.
    Shm(PathBuf),
    Tcp(SocketAddr),
    /// `udp://host:port?reliable=true`: associations; the string holds the
    /// endpoint's options (`idle_timeout=1s&…`).
    Udp(SocketAddr, String),
}

fn parse(locator: &str) -> Result<(Kind, BufferOptions), BufferError> {
    let loc: Locator = locator.parse()?;
    loc.expect_scheme("shm, tcp, udp")?;
    let udp = loc.scheme == "udp";
    let mut reliable = false;
    let mut endpoint: Vec<String> = Vec::new();
    let mut o = BufferOptions::default();
    let bad = LocatorError::bad_value;
    loc.options(ACCEPTED, |k, v| {
        match k {
            "dir" => o.dir = PathBuf::from(v),
            "spin" => o.spin = crate::locator::parse_duration(k, v)?,
            "wait" => o.wait = crate::locator::parse_duration(k, v)?,
            "records" => o.records = Some(v.parse().map_err(|_| bad(k, v, "a count"))?),
            "consumers" => o.consumers = v.parse().map_err(|_| bad(k, v, "a count"))?,
            "reliable" if udp => {
                reliable = crate::locator::parse_bool(k, v)?;
                if !reliable {
                    return Err(bad(k, v, "true: buffers need reliable delivery over udp"));
                }
            }
            // The association endpoint's options (idle_timeout, keepalive,
            // mtu, …), checked by the endpoint.
            _ if udp => endpoint.push(format!("{k}={v}")),
            _ => return Ok(false),
        }
        Ok(true)
    })?;
    let kind = if loc.scheme == "shm" {
        let name = &loc.address;
        if name.is_empty() || name.contains('/') || name.starts_with('.') {
            return Err(LocatorError::Address {
                addr: name.clone(),
                why: "a shm name is one path component, e.g. shm://feed".into(),
            }
            .into());
        }
        Kind::Shm(o.dir.join(name))
    } else if udp {
        if !reliable {
            return Err(LocatorError::BadValue {
                name: "reliable".into(),
                value: String::new(),
                expected: "reliable=true: buffers over udp need associations, e.g. udp://host:port?reliable=true",
            }
            .into());
        }
        let endpoint = endpoint.join("&");
        // Checked now, so a bad option fails at open on both sides.
        crate::endpoint::EndpointConfig::from_locator(&format!("udp://0.0.0.0:0?{endpoint}"))?;
        Kind::Udp(loc.socket_addr()?, endpoint)
    } else {
        Kind::Tcp(loc.socket_addr()?)
    };
    Ok((kind, o))
}

fn ring_path(ns: &Path, id: BufferId) -> PathBuf {
    ns.join(format!("{id}.ring"))
}

/// Reads and validates the header of a ring file and maps it.
pub(super) fn open_ring(path: &Path, id: BufferId) -> Result<Arc<Ring>, BufferError> {
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(BufferError::io("open ring file"))?;
    let mut b = [0u8; 64];
    let corrupt = |why: String| BufferError::Corrupt { id, why };
    f.read_exact(&mut b)
        .map_err(|e| corrupt(format!("header unreadable: {e}")))?;
    let h = HeaderWords::decode(&b);
    let len = f
        .metadata()
        .map_err(BufferError::io("stat ring file"))?
        .len();
    let layout = Layout::check(&h, len).map_err(|e| corrupt(e.0))?;
    if h.id != id {
        return Err(corrupt(format!("file holds buffer {}", h.id)));
    }
    let region = Region::map_file(&f, layout.total).map_err(BufferError::io("map ring file"))?;
    Ok(Arc::new(Ring::attached(region, layout, &h)))
}

fn default_records(capacity: u64) -> u64 {
    (capacity / 64).clamp(64, 65536)
}

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

/// Sizes the new (empty) ring file `f` for `layout`, maps it and writes
/// the ring's header: the ring this process produces into.
pub(crate) fn init_file(f: &File, layout: Layout, id: BufferId) -> Result<Arc<Ring>, BufferError> {
    f.set_len(layout.total as u64)
        .map_err(BufferError::io("size ring file"))?;
    let region = Region::map_file(f, layout.total).map_err(BufferError::io("map ring file"))?;
    Ok(Arc::new(Ring::init(region, layout, id)))
}

/// Creates ring file `ns/ID.ring` without ever exposing a half-written
/// header: written under a temporary name, then hard-linked into place
/// (which fails if the name exists). A file left by a dead producer is
/// reclaimed.
fn create_file(
    ns: &Path,
    id: BufferId,
    layout: Layout,
) -> Result<(Arc<Ring>, PathBuf), BufferError> {
    let path = ring_path(ns, id);
    let tmp = ns.join(format!(".{id}.{}.tmp", sys::pid()));
    let f = File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp)
        .map_err(BufferError::io("create ring file"))?;
    let made = (|| {
        let ring = init_file(&f, layout, id)?;
        for attempt in 0..2 {
            match fs::hard_link(&tmp, &path) {
                Ok(()) => return Ok(ring),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && attempt == 0 => {
                    match open_ring(&path, id) {
                        Ok(old) if old.producer_alive() && old.state() != CLOSED => {
                            return Err(BufferError::DuplicateId {
                                id,
                                owner: format!(" (producer pid {})", old.producer.0),
                            })
                        }
                        // Dead, closed or unreadable: reclaim.
                        _ => {
                            let _ = fs::remove_file(&path);
                        }
                    }
                }
                Err(e) => return Err(BufferError::io("link ring file")(e)),
            }
        }
        Err(BufferError::DuplicateId {
            id,
            owner: " (recreated concurrently)".into(),
        })
    })();
    let _ = fs::remove_file(&tmp);
    made.map(|r| (r, path))
}

struct InBuf {
    cons: RingConsumer,
    file: Option<PathBuf>,
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
    subs: BTreeMap<BufferId, InBuf>,
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
    /// Options as for [`Output::open`].
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
