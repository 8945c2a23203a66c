//! Batches for a tokio task: [`SendBatch`] collects datagrams for any
//! destinations, [`UdpSocket::try_send_batch`] hands them to the kernel in
//! as few system calls as it can, and [`AsyncUdpSocket`] does that, and
//! receives into a [`RecvBatch`], waiting for the socket's readiness in
//! between.

use std::io::{self, IoSlice};
use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::{AsFd, OwnedFd};

use bytes::Bytes;

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use super::send::MAX_UDP_PAYLOAD;
use super::{Outgoing, RecvBatch, UdpConfig, UdpSocket};
use crate::sys;

/// Datagrams to send, each to its own destination, back to back in one
/// buffer that is reused from batch to batch.
///
/// [`UdpSocket::try_send_batch`] (or [`AsyncUdpSocket::send_batch`]) sends
/// up to 64 entries per `sendmmsg(2)` (a lone datagram by plain
/// `sendto(2)`), where an entry is a datagram or, where the socket has GSO
/// ([`UdpSocket::max_segments`]), a run of consecutive datagrams to the
/// same address, all of one size but the last, which may be shorter (at
/// most 64 of them and 65,507 bytes in all): the kernel cuts the run into
/// datagrams (`UDP_SEGMENT`) after one trip through the stack. So a batch
/// of equal datagrams to a few peers costs one system call, and the
/// receiver sees each datagram on its own (or, with GRO, as a coalesced
/// run that [`Received::datagrams`](super::Received::datagrams) splits).
///
/// Keep each datagram within the path's MTU: the kernel refuses a GSO run
/// whose segments the path would fragment, and the socket then sends the
/// run's datagrams one by one and stops using GSO. A datagram pushed with
/// [`SendBatch::push_alone`] never joins a run (a run is one packet on its
/// way to the device, lost or delayed as one).
///
/// A datagram pushed with [`SendBatch::push_with_tail`] may end in bytes
/// held elsewhere (a [`Bytes`] the batch keeps until it is sent): they go
/// to the kernel from where they lie (scatter-gather), not copied here.
#[derive(Debug, Default)]
pub struct SendBatch {
    buf: Vec<u8>,
    entries: Vec<Entry>,
    /// The tails of the entries that have one, in order.
    tails: Vec<Bytes>,
    /// The first entry not yet sent.
    next: usize,
}

/// One datagram of a [`SendBatch`]: `buf[start..end]`, then
/// `tails[tail]` if it has one, for `dest`.
#[derive(Debug, Clone, Copy)]
struct Entry {
    dest: SocketAddr,
    start: usize,
    end: usize,
    alone: bool,
    /// The index of its tail in `tails`, if it has one.
    tail: Option<u32>,
    /// Its length, tail included.
    len: usize,
}

/// One send of a scatter-gather plan ([`SendBatch::plan_iov`]): a
/// datagram or a GSO run, as slices `iov[first..last]`.
#[derive(Debug, Clone, Copy)]
struct IovRun {
    dest: SocketAddr,
    first: usize,
    last: usize,
    segment_size: Option<usize>,
}

/// Slices at most in one scatter-gather `sendmmsg` (two per datagram).
const MAX_IOV: usize = 2 * sys::MAX_BATCH * super::send::GSO_MAX_SEGMENTS;

impl SendBatch {
    /// An empty batch.
    pub fn new() -> SendBatch {
        SendBatch::default()
    }

    /// An empty batch with room for `datagrams` datagrams of `bytes` bytes
    /// in all before it allocates.
    pub fn with_capacity(datagrams: usize, bytes: usize) -> SendBatch {
        SendBatch {
            buf: Vec::with_capacity(bytes),
            entries: Vec::with_capacity(datagrams),
            tails: Vec::new(),
            next: 0,
        }
    }

    /// Adds a copy of `datagram` for `dest`.
    pub fn push(&mut self, dest: SocketAddr, datagram: &[u8]) {
        self.push_entry(dest, datagram, false);
    }

    /// Adds a copy of `datagram` for `dest` that travels in a packet of its
    /// own, never in a GSO run with its neighbours.
    pub fn push_alone(&mut self, dest: SocketAddr, datagram: &[u8]) {
        self.push_entry(dest, datagram, true);
    }

    fn push_entry(&mut self, dest: SocketAddr, datagram: &[u8], alone: bool) {
        let start = self.buf.len();
        self.buf.extend_from_slice(datagram);
        self.entries.push(Entry {
            dest,
            start,
            end: self.buf.len(),
            alone,
            tail: None,
            len: datagram.len(),
        });
    }

    /// Adds a datagram written in place, without a copy: `write` appends
    /// its bytes to the vector it is given (which holds the datagrams
    /// before it: append only) and returns the destination, or `None` to
    /// add nothing (what it appended is then removed). Fits a sans-I/O
    /// `poll_transmit(now, buf)`. Returns whether a datagram was added.
    #[inline]
    pub fn push_with(&mut self, write: impl FnOnce(&mut Vec<u8>) -> Option<SocketAddr>) -> bool {
        self.push_with_alone(|buf| write(buf).map(|dest| (dest, false)))
    }

    /// Adds a datagram written in place, as [`SendBatch::push_with`] does,
    /// where `write` also says whether it travels alone (`true`: never in
    /// a GSO run, as with [`SendBatch::push_alone`]). Fits a sans-I/O
    /// transmit that carries such a mark.
    #[inline]
    pub fn push_with_alone(
        &mut self,
        write: impl FnOnce(&mut Vec<u8>) -> Option<(SocketAddr, bool)>,
    ) -> bool {
        let start = self.buf.len();
        match write(&mut self.buf) {
            Some((dest, alone)) if self.buf.len() >= start => {
                self.entries.push(Entry {
                    dest,
                    start,
                    end: self.buf.len(),
                    alone,
                    tail: None,
                    len: self.buf.len() - start,
                });
                true
            }
            _ => {
                self.buf.truncate(start);
                false
            }
        }
    }

    /// Adds a datagram written in place, as [`SendBatch::push_with_alone`]
    /// does, whose last bytes `write` may instead set in the [`Bytes`] it
    /// is given (a reference to where they lie: the batch keeps it until
    /// the datagram is sent, and the kernel copies them from there). Fits
    /// a sans-I/O `poll_transmit_split(now, buf, tail)`.
    #[inline]
    pub fn push_with_tail(
        &mut self,
        write: impl FnOnce(&mut Vec<u8>, &mut Option<Bytes>) -> Option<(SocketAddr, bool)>,
    ) -> bool {
        let start = self.buf.len();
        let mut tail = None;
        match write(&mut self.buf, &mut tail) {
            Some((dest, alone)) if self.buf.len() >= start => {
                let mut len = self.buf.len() - start;
                let tail = tail.filter(|t| !t.is_empty()).map(|t| {
                    len += t.len();
                    self.tails.push(t);
                    (self.tails.len() - 1) as u32
                });
                self.entries.push(Entry {
                    dest,
                    start,
                    end: self.buf.len(),
                    alone,
                    tail,
                    len,
                });
                true
            }
            _ => {
                self.buf.truncate(start);
                false
            }
        }
    }

    /// Datagrams not yet sent.
    pub fn len(&self) -> usize {
        self.entries.len() - self.next
    }

    /// Whether every datagram was sent (or none was added).
    pub fn is_empty(&self) -> bool {
        self.next >= self.entries.len()
    }

    /// Removes every datagram, keeping the allocations.
    pub fn clear(&mut self) {
        self.buf.clear();
        self.entries.clear();
        self.tails.clear();
        self.next = 0;
    }

    /// Fills `out` with the next sends as [`SendBatch::plan`] does, each
    /// as slices appended to `iov` (a datagram's bytes here, then its
    /// tail), and `counts` with the datagrams each holds; returns how many
    /// sends it filled.
    fn plan_iov<'a>(
        &'a self,
        segments: usize,
        out: &mut [IovRun],
        counts: &mut [usize],
        iov: &mut Vec<IoSlice<'a>>,
    ) -> usize {
        let e = &self.entries;
        let (mut n, mut i) = (0, self.next);
        while n < out.len() && i < e.len() && iov.len() + 2 <= MAX_IOV {
            let first = e[i];
            let len = first.len;
            let (mut j, mut total) = (i + 1, len);
            if segments > 1 && len > 0 && !first.alone {
                while j < e.len() && j - i < segments && iov.len() + 2 * (j - i + 1) <= MAX_IOV {
                    let d = &e[j];
                    let dlen = d.len;
                    if d.dest != first.dest
                        || d.alone
                        || dlen > len
                        || total + dlen > MAX_UDP_PAYLOAD
                    {
                        break;
                    }
                    total += dlen;
                    j += 1;
                    if dlen < len {
                        break;
                    }
                }
            }
            let at = iov.len();
            for d in &e[i..j] {
                iov.push(IoSlice::new(&self.buf[d.start..d.end]));
                if let Some(t) = d.tail {
                    iov.push(IoSlice::new(&self.tails[t as usize]));
                }
            }
            out[n] = IovRun {
                dest: first.dest,
                first: at,
                last: iov.len(),
                segment_size: (j - i > 1).then_some(len),
            };
            counts[n] = j - i;
            n += 1;
            i = j;
        }
        n
    }

    /// Fills `out` with the next entries to send (up to `out.len()`),
    /// grouping runs for GSO when `segments > 1`, and `counts` with the
    /// datagrams each holds; returns how many entries it filled.
    fn plan<'a>(
        &'a self,
        segments: usize,
        out: &mut [Outgoing<'a>],
        counts: &mut [usize],
    ) -> usize {
        let e = &self.entries;
        let (mut n, mut i) = (0, self.next);
        while n < out.len() && i < e.len() {
            let first = e[i];
            let len = first.end - first.start;
            let (mut j, mut end) = (i + 1, first.end);
            if segments > 1 && len > 0 && !first.alone {
                while j < e.len() && j - i < segments {
                    let d = e[j];
                    let dlen = d.end - d.start;
                    if d.dest != first.dest
                        || d.alone
                        || d.start != end
                        || dlen > len
                        || d.end - first.start > MAX_UDP_PAYLOAD
                    {
                        break;
                    }
                    end = d.end;
                    j += 1;
                    if dlen < len {
                        break;
                    }
                }
            }
            out[n] = Outgoing {
                dest: first.dest,
                data: &self.buf[first.start..end],
                segment_size: (j - i > 1).then_some(len),
            };
            counts[n] = j - i;
            n += 1;
            i = j;
        }
        n
    }
}

/// What one [`UdpSocket::try_send_batch`] or [`AsyncUdpSocket::send_batch`]
/// did.
#[derive(Debug, Default)]
pub struct Sent {
    /// Datagrams the kernel took.
    pub datagrams: usize,
    /// System calls made (the last may have sent nothing: the socket's
    /// buffer was full).
    pub calls: usize,
    /// Datagrams the kernel refused (an unreachable or invalid address, a
    /// datagram too large): removed from the batch, not sent.
    pub refused: usize,
    /// The error of the last refusal.
    pub error: Option<io::Error>,
}

impl Sent {
    /// Counts what one send of `counts.len()` messages (`counts`: the
    /// datagrams in each) did, and moves `batch` past what went or was
    /// refused: whether to go on (`false`: the socket's buffer is full).
    fn note(&mut self, batch: &mut SendBatch, counts: &[usize], r: io::Result<usize>) -> bool {
        match r {
            Ok(0) => false,
            Ok(k) => {
                let d: usize = counts[..k.min(counts.len())].iter().sum();
                batch.next += d;
                self.datagrams += d;
                true
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => false,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => true,
            Err(e) => {
                batch.next += counts[0];
                self.refused += counts[0];
                self.error = Some(e);
                true
            }
        }
    }

    fn add(&mut self, other: Sent) {
        self.datagrams += other.datagrams;
        self.calls += other.calls;
        self.refused += other.refused;
        if other.error.is_some() {
            self.error = other.error;
        }
    }
}

impl UdpSocket {
    /// Sends what `batch` holds, in order, without blocking, in as few
    /// system calls as it can (see [`SendBatch`]), until it is empty or the
    /// socket's send buffer is full; what went leaves the batch, so calling
    /// again (once the socket is writable) sends the rest. A datagram the
    /// kernel refuses is dropped and counted in [`Sent::refused`]; the
    /// others still go.
    #[must_use = "datagrams the kernel refused are reported only here"]
    pub fn try_send_batch(&self, batch: &mut SendBatch) -> Sent {
        if !batch.tails.is_empty() {
            return self.try_send_iov(batch);
        }
        let mut sent = Sent::default();
        let segments = self.max_segments();
        let empty = Outgoing {
            dest: SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)),
            data: &[],
            segment_size: None,
        };
        while !batch.is_empty() {
            let mut out = [empty; sys::MAX_BATCH];
            let mut counts = [0usize; sys::MAX_BATCH];
            let n = batch.plan(segments, &mut out, &mut counts);
            sent.calls += 1;
            if !sent.note(batch, &counts[..n], self.send(&out[..n])) {
                break;
            }
        }
        if batch.is_empty() {
            batch.clear();
        }
        sent
    }
}

impl UdpSocket {
    /// [`UdpSocket::try_send_batch`] of a batch whose datagrams may have
    /// tails: each send is a list of slices (scatter-gather), so a tail
    /// is copied once, by the kernel. A GSO run the kernel refuses is
    /// joined into one buffer and sent by [`UdpSocket::send`], which cuts
    /// it (and stops using GSO if it must).
    fn try_send_iov(&self, batch: &mut SendBatch) -> Sent {
        let mut sent = Sent::default();
        let segments = self.max_segments();
        let fd = self.socket.as_fd();
        let none = IovRun {
            dest: SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)),
            first: 0,
            last: 0,
            segment_size: None,
        };
        while !batch.is_empty() {
            let mut runs = [none; sys::MAX_BATCH];
            let mut counts = [0usize; sys::MAX_BATCH];
            let mut iov = Vec::with_capacity(2 * batch.len().min(MAX_IOV / 2));
            let n = batch.plan_iov(segments, &mut runs, &mut counts, &mut iov);
            let empty = sys::Transmit {
                dest: runs[0].dest,
                data: &[],
                iov: &[],
                segment_size: None,
            };
            let mut tx = [empty; sys::MAX_BATCH];
            for (t, r) in tx.iter_mut().zip(&runs[..n]) {
                *t = sys::Transmit {
                    dest: self.adapt(r.dest),
                    data: &[],
                    iov: &iov[r.first..r.last],
                    // At most 64 segments within 65,507 bytes: fits u16.
                    segment_size: r.segment_size.map(|s| s as u16),
                };
            }
            sent.calls += 1;
            let r = match sys::sendmmsg(fd, &tx[..n]) {
                Err(e) if runs[0].segment_size.is_some() && sys::is_gso_error(&e) => {
                    let r = runs[0];
                    let joined: Vec<u8> = iov[r.first..r.last]
                        .iter()
                        .flat_map(|s| s.iter())
                        .copied()
                        .collect();
                    let out = super::Outgoing {
                        dest: r.dest,
                        data: &joined,
                        segment_size: r.segment_size,
                    };
                    // The run's datagrams, one message: its count is the
                    // first's.
                    self.send(&[out]).map(|k| k.min(1))
                }
                r => r,
            };
            if !sent.note(batch, &counts[..n], r) {
                break;
            }
        }
        if batch.is_empty() {
            batch.clear();
        }
        sent
    }
}

/// A [`UdpSocket`] registered with tokio's reactor: send a [`SendBatch`]
/// and receive into a [`RecvBatch`] from a task, each in as few system
/// calls as the kernel allows, waiting for readiness when the socket's
/// buffer is full or empty.
///
/// ```no_run
/// # async fn demo(peers: &[std::net::SocketAddr]) -> std::io::Result<()> {
/// use skiff::udp::{AsyncUdpSocket, RecvBatch, SendBatch, UdpConfig};
///
/// let addr = "0.0.0.0:4747".parse().unwrap();
/// let socket = AsyncUdpSocket::bind(addr, &UdpConfig::default())?;
/// let mut out = SendBatch::new();
/// for p in peers {
///     out.push(*p, b"hello");
/// }
/// let sent = socket.send_batch(&mut out).await?; // one sendmmsg
/// let mut batch = RecvBatch::new(32, 65_536);
/// socket.recv(&mut batch).await?;
/// for r in batch.drain() {
///     for datagram in r.datagrams() {
///         // `r.from` sent `datagram`
///     }
/// }
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct AsyncUdpSocket {
    socket: UdpSocket,
    /// The reactor's registration (of a duplicate of the socket's
    /// descriptor).
    io: AsyncFd<OwnedFd>,
}

impl AsyncUdpSocket {
    /// Binds a socket as [`UdpSocket::bind`] does and registers it with
    /// the current tokio runtime, which must have I/O enabled.
    pub fn bind(addr: SocketAddr, cfg: &UdpConfig) -> io::Result<AsyncUdpSocket> {
        AsyncUdpSocket::new(UdpSocket::bind(addr, cfg)?)
    }

    /// Registers `socket` with the current tokio runtime, which must have
    /// I/O enabled.
    pub fn new(socket: UdpSocket) -> io::Result<AsyncUdpSocket> {
        let io = socket.register_async(Interest::READABLE | Interest::WRITABLE)?;
        Ok(AsyncUdpSocket { socket, io })
    }

    /// The socket, for its address, options and non-blocking calls (not
    /// [`UdpSocket::recv_wait`], which blocks the thread).
    pub fn socket(&self) -> &UdpSocket {
        &self.socket
    }

    /// Sends everything `batch` holds (see [`UdpSocket::try_send_batch`]),
    /// waiting for room in the socket's send buffer when it is full;
    /// returns the sum of what the sends did. The batch is then empty.
    /// Errors only if the reactor fails; datagrams the kernel refuses are
    /// counted in [`Sent::refused`]. Cancel safe: what was sent has left
    /// the batch, the rest is still in it.
    ///
    /// One wait happens on the thread rather than the reactor: if the
    /// device refuses a GSO run, [`UdpSocket::send`] sends it segment by
    /// segment and, once it has begun, waits (about a second at most) for
    /// room to finish it. The socket then stops using GSO (see
    /// [`UdpSocket::send`]), so this is rare.
    pub async fn send_batch(&self, batch: &mut SendBatch) -> io::Result<Sent> {
        let mut sent = Sent::default();
        if batch.is_empty() {
            return Ok(sent);
        }
        self.io
            .async_io(Interest::WRITABLE, |_| {
                sent.add(self.socket.try_send_batch(batch));
                if batch.is_empty() {
                    Ok(())
                } else {
                    // Stopped by a full send buffer: wait for room.
                    Err(io::ErrorKind::WouldBlock.into())
                }
            })
            .await?;
        Ok(sent)
    }

    /// Waits until datagrams arrive and receives them, as many as `batch`
    /// has slots, in one system call ([`UdpSocket::recv`]); returns how
    /// many buffers arrived (a GRO run counts once). Cancel safe.
    pub async fn recv(&self, batch: &mut RecvBatch) -> io::Result<usize> {
        self.io
            .async_io(Interest::READABLE, |_| self.socket.recv(batch))
            .await
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::udp::tests::{bind, no_gro, pattern, recv_n, v4};

    /// Receives `want` datagrams on `s` and checks they are `expect`, in
    /// order, from `from`.
    fn expect(s: &UdpSocket, from: SocketAddr, expect: &[Vec<u8>]) {
        let got = recv_n(s, &mut RecvBatch::new(32, 65_536), expect.len());
        let got: Vec<&[u8]> = got
            .iter()
            .map(|(f, d)| {
                assert_eq!(*f, from);
                &d[..]
            })
            .collect();
        let want: Vec<&[u8]> = expect.iter().map(|d| &d[..]).collect();
        assert_eq!(got, want);
    }

    fn gso(on: bool) -> UdpConfig {
        UdpConfig {
            gso: on,
            ..UdpConfig::default()
        }
    }

    #[test]
    fn one_call_reaches_several_destinations() {
        for gso_on in [true, false] {
            let tx = bind(v4(), &gso(gso_on));
            let rx: Vec<UdpSocket> = (0..3).map(|_| bind(v4(), &no_gro())).collect();
            let dests: Vec<SocketAddr> = rx.iter().map(|s| s.local_addr().unwrap()).collect();
            // Runs and singles interleaved: 5 to 0, 1 to 1, 3 to 2, 2 to 0,
            // 1 to 1.
            let plan = [
                (0, 5, 200),
                (1, 1, 300),
                (2, 3, 100),
                (0, 2, 200),
                (1, 1, 50),
            ];
            let mut batch = SendBatch::new();
            let mut want: Vec<Vec<Vec<u8>>> = vec![Vec::new(); 3];
            for (k, &(to, n, len)) in plan.iter().enumerate() {
                for i in 0..n {
                    let d = pattern((k * 16 + i) as u8, len);
                    batch.push(dests[to], &d);
                    want[to].push(d);
                }
            }
            assert_eq!(batch.len(), 12);
            let sent = tx.try_send_batch(&mut batch);
            assert_eq!((sent.datagrams, sent.calls, sent.refused), (12, 1, 0));
            assert!(batch.is_empty() && sent.error.is_none());
            let from = tx.local_addr().unwrap();
            for (s, w) in rx.iter().zip(&want) {
                expect(s, from, w);
            }
        }
    }

    #[test]
    fn equal_datagrams_to_one_address_go_as_gso_runs() {
        for (gso_on, gro_on) in [(true, true), (true, false), (false, true), (false, false)] {
            let tx = bind(v4(), &gso(gso_on));
            let rx = bind(
                v4(),
                &UdpConfig {
                    gro: gro_on,
                    ..UdpConfig::default()
                },
            );
            let dest = rx.local_addr().unwrap();
            let want: Vec<Vec<u8>> = (0..130).map(|i| pattern(i as u8, 100)).collect();
            let mut batch = SendBatch::with_capacity(130, 13_000);
            for d in &want {
                batch.push(dest, d);
            }
            let sent = tx.try_send_batch(&mut batch);
            assert_eq!(sent.datagrams, 130);
            // GSO: runs of 64, 64 and 2 in one sendmmsg; without: 64
            // datagrams per sendmmsg.
            let calls = if tx.max_segments() > 1 { 1 } else { 3 };
            assert_eq!(sent.calls, calls, "gso {gso_on}");
            expect(&rx, tx.local_addr().unwrap(), &want);
        }
    }

    #[test]
    fn a_longer_datagram_starts_a_new_run_and_a_shorter_ends_one() {
        let dest = v4();
        let lens = [100, 100, 100, 150, 100, 50, 100];
        let mut batch = SendBatch::new();
        for (i, &len) in lens.iter().enumerate() {
            batch.push(dest, &pattern(i as u8, len));
        }
        batch.push_alone(dest, &pattern(7, 100));
        batch.push(dest, &pattern(8, 100));
        let empty = Outgoing {
            dest,
            data: &[],
            segment_size: None,
        };
        let (mut out, mut counts) = ([empty; 8], [0; 8]);
        let n = batch.plan(64, &mut out, &mut counts);
        let shape: Vec<(usize, Option<usize>, usize)> = out[..n]
            .iter()
            .zip(counts)
            .map(|(o, c)| (o.data.len(), o.segment_size, c))
            .collect();
        let want = [
            (300, Some(100), 3),
            (250, Some(150), 2),
            (50, None, 1),
            (100, None, 1),
            (100, None, 1), // alone
            (100, None, 1),
        ];
        assert_eq!(shape, want);
        // Without GSO, one entry per datagram.
        assert_eq!(batch.plan(1, &mut out, &mut counts), 8);

        // And over loopback, GSO on and off, GRO on and off.
        for (gso_on, gro_on) in [(true, true), (true, false), (false, true), (false, false)] {
            let tx = bind(v4(), &gso(gso_on));
            let rx = bind(
                v4(),
                &UdpConfig {
                    gro: gro_on,
                    ..UdpConfig::default()
                },
            );
            let dest = rx.local_addr().unwrap();
            let mut want = Vec::new();
            let mut batch = SendBatch::new();
            for (i, &len) in lens.iter().chain(&[100, 100]).enumerate() {
                let d = pattern(i as u8, len);
                if i == 7 {
                    batch.push_alone(dest, &d);
                } else {
                    batch.push(dest, &d);
                }
                want.push(d);
            }
            let sent = tx.try_send_batch(&mut batch);
            assert_eq!((sent.datagrams, sent.calls), (9, 1));
            expect(&rx, tx.local_addr().unwrap(), &want);
        }
    }

    #[test]
    fn a_refused_datagram_is_counted_and_the_others_go() {
        let tx = bind(v4(), &UdpConfig::default());
        let rx = bind(v4(), &no_gro());
        let dest = rx.local_addr().unwrap();
        // Port 0 is not a destination: EINVAL.
        let bad = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
        let mut batch = SendBatch::new();
        batch.push(dest, b"one");
        batch.push(bad, b"refused");
        batch.push(dest, b"two");
        batch.push(dest, b"six");
        let sent = tx.try_send_batch(&mut batch);
        assert_eq!((sent.datagrams, sent.refused), (3, 1));
        assert!(sent.error.is_some());
        assert!(batch.is_empty());
        expect(
            &rx,
            tx.local_addr().unwrap(),
            &[b"one".to_vec(), b"two".to_vec(), b"six".to_vec()],
        );
    }

    #[test]
    fn push_with_writes_in_place() {
        let mut batch = SendBatch::new();
        let dest = v4();
        assert!(batch.push_with(|buf| {
            buf.extend_from_slice(b"in place");
            Some(dest)
        }));
        assert!(!batch.push_with(|buf| {
            buf.extend_from_slice(b"nothing to send after all");
            None
        }));
        assert_eq!(batch.len(), 1);
        assert_eq!(batch.buf, b"in place");
        batch.clear();
        assert!(batch.is_empty());

        // With the alone mark: a marked datagram never joins a run.
        for alone in [false, true, false] {
            assert!(batch.push_with_alone(|buf| {
                buf.extend_from_slice(&[7; 100]);
                Some((dest, alone))
            }));
        }
        assert!(!batch.push_with_alone(|buf| {
            buf.extend_from_slice(b"taken back");
            None
        }));
        let empty = Outgoing {
            dest,
            data: &[],
            segment_size: None,
        };
        let (mut out, mut counts) = ([empty; 4], [0; 4]);
        assert_eq!(batch.plan(64, &mut out, &mut counts), 3);
        assert_eq!(&counts[..3], &[1, 1, 1]);
        assert_eq!(batch.buf.len(), 300);
    }

    #[test]
    fn tails_are_sent_after_their_heads_in_runs_and_alone() {
        // Datagrams of a head in the batch and a tail held elsewhere, some
        // without a tail, a shorter one ending a run, one alone, and one to
        // another address: each arrives as head then tail, GSO on and off.
        for (gso_on, gro_on) in [(true, true), (true, false), (false, false)] {
            let tx = bind(v4(), &gso(gso_on));
            let rx = [true, false].map(|_| {
                bind(
                    v4(),
                    &UdpConfig {
                        gro: gro_on,
                        ..UdpConfig::default()
                    },
                )
            });
            let dests = rx.each_ref().map(|s| s.local_addr().unwrap());
            // (receiver, head length, tail length, alone)
            let plan = [
                (0, 20, 600, false),
                (0, 20, 600, false),
                (0, 620, 0, false),
                (0, 20, 600, false),
                (0, 10, 300, false),
                (0, 20, 600, false),
                (0, 20, 600, true),
                (1, 20, 600, false),
                (0, 20, 600, false),
            ];
            let mut batch = SendBatch::new();
            let mut want: [Vec<Vec<u8>>; 2] = Default::default();
            for (i, &(to, head, tail, alone)) in plan.iter().enumerate() {
                let d = pattern(i as u8, head + tail);
                let t = Bytes::copy_from_slice(&d[head..]);
                assert!(batch.push_with_tail(|buf, tail_out| {
                    buf.extend_from_slice(&d[..head]);
                    *tail_out = Some(t);
                    Some((dests[to], alone))
                }));
                want[to].push(d);
            }
            assert!(!batch.push_with_tail(|buf, tail_out| {
                buf.extend_from_slice(b"taken back");
                *tail_out = Some(Bytes::from_static(b"and this"));
                None
            }));
            assert_eq!(batch.len(), plan.len());
            let sent = tx.try_send_batch(&mut batch);
            assert_eq!((sent.datagrams, sent.refused), (plan.len(), 0));
            assert!(batch.is_empty() && batch.tails.is_empty());
            let from = tx.local_addr().unwrap();
            for (s, w) in rx.iter().zip(&want) {
                expect(s, from, w);
            }
        }
    }

    #[test]
    fn tokio_task_sends_and_receives_batches() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let bind = |cfg: &UdpConfig| AsyncUdpSocket::bind(v4(), cfg).unwrap();
            let a = bind(&UdpConfig::default());
            let peers = [bind(&no_gro()), bind(&UdpConfig::default())];
            let to: Vec<SocketAddr> = peers
                .iter()
                .map(|p| p.socket().local_addr().unwrap())
                .collect();
            let mut batch = SendBatch::new();
            for round in 0..3u8 {
                for i in 0..20u8 {
                    batch.push(to[usize::from(i % 2)], &pattern(round * 32 + i, 500));
                }
                let sent = a.send_batch(&mut batch).await.unwrap();
                assert_eq!((sent.datagrams, sent.refused), (20, 0));
                assert!(batch.is_empty());
                for (k, p) in peers.iter().enumerate() {
                    let mut rb = RecvBatch::new(32, 65_536);
                    let mut got = Vec::new();
                    while got.len() < 10 {
                        tokio::time::timeout(Duration::from_secs(2), p.recv(&mut rb))
                            .await
                            .expect("datagrams arrive")
                            .unwrap();
                        got.extend(rb.drain().flat_map(|r| r.into_datagrams()));
                    }
                    let want: Vec<Vec<u8>> = (0..10u8)
                        .map(|i| pattern(round * 32 + 2 * i + k as u8, 500))
                        .collect();
                    assert_eq!(got, want);
                }
            }
            // Nothing more waits: a receive now waits.
            let mut rb = RecvBatch::new(4, 2048);
            let idle =
                tokio::time::timeout(Duration::from_millis(50), peers[0].recv(&mut rb)).await;
            assert!(idle.is_err());
        });
    }
}
