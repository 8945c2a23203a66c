//! The node's buffer of a topic for the subscribers of its host (RBMQ's
//! broker of buffers over RocketBufs): the node writes each message of a
//! topic once into one ring, and every local shared-memory subscriber of
//! the topic reads it there, in place, instead of the node copying it into
//! each subscriber's own ring.
//!
//! A topic is a subscription's subject pattern and type pattern, with the
//! ring's flow: credits (the ring waits for its slowest reader, which
//! back-pressures the node's queue for the topic and, with the `block`
//! policy, the publishers) or overwrite (the node never waits; a reader
//! lapped by it loses what was overwritten, counted as dropped).
//!
//! Rendezvous on the node's socket (`dir/name/node.sock`; lines as in
//! `attach.rs`), one connection per subscription:
//!
//! ```text
//! subscriber -> node   SKIFF-TOPIC 1 <credits|overwrite> <pattern> <type>
//! node -> subscriber   TOPIC <ring file> <max frame>     (or ERR <text>)
//! subscriber -> node   OK                                 (attached as a reader)
//! ```
//!
//! Then, while attached, the subscriber reports now and then on the same
//! socket what it has read and lost so far ([`Report`]), which the node
//! shows in its stats:
//!
//! ```text
//! subscriber -> node   READ <messages read> <messages dropped>
//! ```
//!
//! The ring file stays in the attachment directory while the topic has
//! subscribers (later ones map it too); the node removes it with the topic.
//! The socket stays open and carries nothing: its end is the subscriber's
//! end. The subscriber checks that the ring was made by the process at the
//! other end of the socket (`SO_PEERCRED`) before it maps it, and every
//! frame it reads is checked as a client checks what a node sends.

use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use skiff_proto::credits::Flow;
use tokio::io::BufReader;
use tokio::net::UnixStream;

use super::attach::{self, FrameWriter, Place};
use super::host::HostReader;
use super::ring::RingConsumer;
use super::{BufferError, BufferId};

/// Buffer id in the header of a topic's ring.
pub(crate) const TOPIC: BufferId = 3;
/// First word of a topic request.
const TOPIC_HELLO: &str = "SKIFF-TOPIC 1";
/// Least time between two reports of a subscriber to the node.
pub(crate) const REPORT_EVERY: Duration = Duration::from_millis(100);
/// Readers one topic's ring takes (subscriptions of the host to it).
pub const TOPIC_READERS: u32 = 256;

/// What a subscriber asks the node for: a topic and its ring's flow.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TopicAsk {
    /// Credits or overwrite.
    pub flow: Flow,
    /// Subject pattern.
    pub pattern: String,
    /// Type pattern.
    pub kind: String,
}

impl TopicAsk {
    /// Parses the request line (total: anything else is an error that
    /// says what was expected).
    pub fn parse(line: &str) -> Result<TopicAsk, String> {
        let bad = || format!("expected {TOPIC_HELLO:?} <credits|overwrite> <pattern> <type>");
        let rest = line.strip_prefix(TOPIC_HELLO).ok_or_else(bad)?;
        let mut w = rest.split(' ').filter(|w| !w.is_empty());
        let (Some(flow), Some(pattern), Some(kind), None) =
            (w.next(), w.next(), w.next(), w.next())
        else {
            return Err(bad());
        };
        let flow = match flow {
            "credits" => Flow::Credits,
            "overwrite" => Flow::Overwrite,
            _ => return Err(bad()),
        };
        Ok(TopicAsk {
            flow,
            pattern: pattern.into(),
            kind: kind.into(),
        })
    }

    /// The request line.
    pub fn line(&self) -> String {
        let flow = match self.flow {
            Flow::Credits => "credits",
            Flow::Overwrite => "overwrite",
        };
        format!("{TOPIC_HELLO} {flow} {} {}", self.pattern, self.kind)
    }
}

/// A shared-buffer subscriber's counts, as it reports them on its topic
/// socket (`READ <read> <dropped>`): totals since it attached.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Report {
    /// Messages read from the ring.
    pub read: u64,
    /// Messages (overwrite: ring segments) lost.
    pub dropped: u64,
}

impl Report {
    /// Parses a report line (total: anything else is an error that says
    /// what was expected).
    pub fn parse(line: &str) -> Result<Report, String> {
        let bad = || "expected READ <read> <dropped>".to_string();
        let mut w = line.strip_prefix("READ ").ok_or_else(bad)?.split(' ');
        let (Some(read), Some(dropped), None) = (w.next(), w.next(), w.next()) else {
            return Err(bad());
        };
        let n = |s: &str| {
            if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            s.parse::<u64>().map_err(|_| bad())
        };
        Ok(Report {
            read: n(read)?,
            dropped: n(dropped)?,
        })
    }

    /// The report line.
    pub fn line(&self) -> String {
        format!("READ {} {}", self.read, self.dropped)
    }
}

/// The node's ring of one topic: it writes whole encoded frames (as for a
/// client's node→client ring), every subscriber of the topic reads them.
#[derive(Debug)]
pub struct TopicRing {
    w: FrameWriter,
    path: PathBuf,
    name: String,
}

impl TopicRing {
    /// Creates ring file `name` in `dir` (the attachment directory) with
    /// room for `capacity` bytes (raised to fit `max_frame` twice), the
    /// flow of `ask` and [`TOPIC_READERS`] readers.
    pub fn create(
        dir: &Path,
        name: &str,
        capacity: u64,
        max_frame: u64,
        flow: Flow,
        spin: Duration,
    ) -> Result<TopicRing, BufferError> {
        if !attach::valid_name(name) {
            return Err(BufferError::Usage {
                id: TOPIC,
                why: format!("topic ring name {name:?} is not one plain path component"),
            });
        }
        let cap = attach::capacity(capacity, max_frame);
        let (ring, path) = attach::create_ring_with(dir, name, cap, TOPIC, TOPIC_READERS, flow)?;
        Ok(TopicRing {
            w: FrameWriter::new(ring, spin),
            path,
            name: name.into(),
        })
    }

    /// The ring file's name, for the `TOPIC` line.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The ring's data area as this process maps it (tests: a payload at
    /// such an address was read in place).
    pub fn data_range(&self) -> std::ops::Range<usize> {
        self.w.data_range()
    }

    /// Copies `buf`, a run of whole encoded frames, into the ring, whole
    /// frames per segment; with credits, waits while the slowest reader is
    /// a ring behind and `go` says to wait.
    pub fn write_frames(
        &mut self,
        buf: &[u8],
        go: &mut dyn FnMut() -> bool,
    ) -> Result<(), BufferError> {
        self.w.write_frames(buf, go)
    }

    /// Writes one segment of `len` bytes, which `fill` writes in place
    /// (whole encoded frames), only if the ring has room now: never waits.
    /// `Ok(false)`: no room (nothing written); the caller queues instead.
    /// For the node's direct path, which writes a topic's messages from
    /// the publisher's thread while nothing is queued for the topic.
    pub fn try_write(
        &mut self,
        len: usize,
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<bool, BufferError> {
        self.w.try_write(len, fill)
    }

    /// Closes the ring (readers read what was written, then learn the
    /// topic ended) and removes its file.
    pub fn close(mut self) {
        self.w.close();
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A subscriber's reader of a topic's ring.
#[derive(Debug)]
pub(crate) struct TopicReader {
    /// The socket: its end tells the node this subscriber left.
    _socket: std::os::unix::net::UnixStream,
    /// Credits: read in place.
    in_place: Option<HostReader>,
    /// Overwrite: segments copied out under the sequence lock.
    copied: Option<RingConsumer>,
    spin: Duration,
    /// The node's frame bound.
    pub(crate) max_frame: u64,
    /// What was last reported to the node, and when.
    reported: Report,
    reported_at: std::time::Instant,
}

/// What [`TopicReader::next`] found.
#[derive(Debug)]
pub(crate) enum TopicSeg {
    /// A segment of whole frames.
    Frames(Bytes),
    /// Segments overwritten before they were read (overwrite flow).
    Lost(u64),
    /// Nothing within the wait, or `stop` held.
    Idle,
}

impl TopicReader {
    /// Asks the node at `place` for the topic `ask` and maps its ring.
    pub(crate) async fn open(place: &Place, ask: &TopicAsk) -> Result<TopicReader, String> {
        let sock = place.dir.join(attach::SOCKET);
        let s = UnixStream::connect(&sock)
            .await
            .map_err(|e| format!("no node serves shared memory at {} ({e})", sock.display()))?;
        let node_pid = s.peer_cred().ok().and_then(|c| c.pid()).map(|p| p as u32);
        let mut s = BufReader::new(s);
        let r = tokio::time::timeout(attach::HANDSHAKE, async {
            let e = |e: std::io::Error| format!("topic rendezvous: {e}");
            attach::write_line(s.get_mut(), &ask.line())
                .await
                .map_err(e)?;
            let line = attach::read_line(&mut s).await.map_err(e)?;
            let refused = || match line.strip_prefix("ERR ") {
                Some(why) => format!("the node refused the topic: {why}"),
                None => format!("unexpected rendezvous line {line:?}"),
            };
            let mut w = line.strip_prefix("TOPIC ").ok_or_else(refused)?.split(' ');
            let (Some(name), Some(max_frame), None) = (w.next(), w.next(), w.next()) else {
                return Err(refused());
            };
            let max_frame: u64 = max_frame.parse().map_err(|_| refused())?;
            let ring =
                attach::open_peer_ring(&place.dir, name, TOPIC).map_err(|e| e.to_string())?;
            if node_pid.is_some_and(|p| p != ring.producer.0) {
                return Err(format!(
                    "the topic's ring was made by process {}, not by the node",
                    ring.producer.0
                ));
            }
            if ring.layout.flow != ask.flow {
                return Err("the topic's ring has another flow than asked".into());
            }
            let cons = RingConsumer::attach(ring.clone()).map_err(|e| e.to_string())?;
            attach::write_line(s.get_mut(), "OK").await.map_err(e)?;
            Ok((ring, cons, max_frame))
        })
        .await
        .unwrap_or_else(|_| Err("the node did not answer the topic rendezvous in time".into()));
        let (_ring, cons, max_frame) = r?;
        let (in_place, copied) = match ask.flow {
            Flow::Credits => (Some(HostReader::over(cons)), None),
            Flow::Overwrite => (None, Some(cons)),
        };
        // `into_std` leaves the socket non-blocking, as `report` wants.
        let socket = s
            .into_inner()
            .into_std()
            .map_err(|e| format!("topic rendezvous: {e}"))?;
        Ok(TopicReader {
            _socket: socket,
            in_place,
            copied,
            spin: place.spin,
            max_frame,
            reported: Report::default(),
            reported_at: std::time::Instant::now(),
        })
    }

    /// Tells the node what this subscriber has read and lost, when that
    /// changed and at most every [`REPORT_EVERY`] (or at once with
    /// `now`). Never blocks: a report the socket cannot take now is left
    /// for the next one (reports are totals). Returns whether the node is
    /// up to date.
    pub(crate) fn report(&mut self, r: Report, now: bool) -> bool {
        use std::io::Write;
        if r == self.reported {
            return true;
        }
        if !now && self.reported_at.elapsed() < REPORT_EVERY {
            return false;
        }
        let mut line = r.line();
        line.push('\n');
        // The socket is non-blocking: all of a short line, or nothing.
        if let Ok(n) = (&self._socket).write(line.as_bytes()) {
            if n == line.len() {
                self.reported = r;
                self.reported_at = std::time::Instant::now();
                return true;
            }
        }
        false
    }

    /// The next segment of frames (in place with credits; copied in
    /// overwrite mode). Blocks the thread; returns `Idle` at least every
    /// second and whenever `stop` holds, so the caller can look around.
    /// `Closed` once the node ended the topic; `PeerDead` if it died.
    pub(crate) fn next(&mut self, stop: &dyn Fn() -> bool) -> Result<TopicSeg, BufferError> {
        if let Some(r) = &mut self.in_place {
            return Ok(match r.next_once(self.spin, stop)? {
                Some(seg) => TopicSeg::Frames(seg.bytes),
                None => TopicSeg::Idle,
            });
        }
        let cons = self.copied.as_mut().expect("one reader");
        let lost = cons.lost;
        let Some(d) = cons.next_or(None, self.spin, attach::IDLE_CHECK, stop)? else {
            return Ok(TopicSeg::Idle);
        };
        let mut v = Vec::new();
        let intact = cons.copy(d.seg, d.start, d.len, &mut v);
        cons.consume(d.len)?;
        if cons.lost > lost || !intact {
            return Ok(TopicSeg::Lost(cons.lost - lost + u64::from(!intact)));
        }
        if attach::is_pad(&v) {
            return Ok(TopicSeg::Idle);
        }
        Ok(TopicSeg::Frames(Bytes::from(v)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_lines_parse_totally() {
        let a = TopicAsk {
            flow: Flow::Overwrite,
            pattern: "daq.>".into(),
            kind: "*".into(),
        };
        assert_eq!(TopicAsk::parse(&a.line()), Ok(a));
        let r = Report {
            read: 7,
            dropped: u64::MAX,
        };
        assert_eq!(Report::parse(&r.line()), Ok(r));
        for bad in [
            "",
            "READ",
            "READ 1",
            "READ 1 2 3",
            "READ -1 2",
            "READ +1 2",
            "READ 1  2",
            "READ 18446744073709551616 0",
            "read 1 2",
        ] {
            assert!(Report::parse(bad).is_err(), "{bad:?}");
        }
        for bad in [
            "",
            "SKIFF-TOPIC 1",
            "SKIFF-TOPIC 1 credits a",
            "SKIFF-TOPIC 1 credits a b c",
            "SKIFF-TOPIC 1 sometimes a b",
            "SKIFF-TOPIC 2 credits a b",
            "SKIFF-SHM 1",
        ] {
            assert!(TopicAsk::parse(bad).is_err(), "{bad:?}");
        }
    }
}
