//! [`Output`] (RocketBufs' rOut) and [`Input`] (rIn): the buffer API, the
//! same over every transport. Both sides always work on rings (see
//! `ring.rs`): over `shm://` the ring file is shared with the peer; over
//! `tcp://` and `udp://…?reliable=true` each side has a local ring and
//! threads move bytes between the ring and the socket or tunnel (`tcp.rs`,
//! `assoc/`).

use std::fs::{self, File, OpenOptions};
use std::io::Read;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::layout::{HeaderWords, Layout, CLOSED};
use super::ring::Ring;
use super::{sys, BufferError, BufferId, BufferOptions, Region};
use crate::error::LocatorError;
use crate::locator::Locator;

mod input;
mod output;

pub use input::{InSegment, InStats, Input};
pub use output::{OutStats, Output, SegmentMut};

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
