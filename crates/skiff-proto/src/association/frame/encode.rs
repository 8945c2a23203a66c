//! Writing association packets: [`Encoder`], section by section, straight
//! into the output buffer.

use super::*;

impl Packet {
    /// Appends the encoded packet to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut e = Encoder::new(out, self.key);
        if let Some(f) = &self.first {
            e.first(f);
        }
        if let Some(a) = &self.accept {
            e.accept(a);
        }
        if let Some(s) = &self.status {
            e.status(s, usize::MAX);
        }
        if let Some(d) = &self.data {
            e.data(d.seq);
            e.out.extend_from_slice(d.chunks.raw());
        }
        e.sreq(self.sreq);
        e.close(self.close);
        e.reset(self.reset);
    }
}

/// Writes a packet section by section, in the fixed order, straight into the
/// output buffer. Flags are patched into the header as sections are added.
#[derive(Debug)]
pub struct Encoder<'a> {
    out: &'a mut Vec<u8>,
    at: usize,
}

impl<'a> Encoder<'a> {
    /// Starts a packet with `key` at the end of `out`.
    pub fn new(out: &'a mut Vec<u8>, key: u64) -> Encoder<'a> {
        let at = out.len();
        // One copy of the whole header (and one capacity check).
        let mut h = [0u8; HEADER_LEN];
        h[0..2].copy_from_slice(&MAGIC);
        h[2] = VERSION;
        h[3] = KIND;
        h[5..13].copy_from_slice(&key.to_le_bytes());
        out.extend_from_slice(&h);
        Encoder { out, at }
    }

    fn flag(&mut self, f: u8, on: bool) {
        if on {
            self.out[self.at + 4] |= f;
        }
    }

    fn flags(&self) -> u8 {
        self.out[self.at + 4]
    }

    /// Bytes written so far for this packet, header included.
    pub fn written(&self) -> usize {
        self.out.len() - self.at
    }

    /// Adds the FIRST section.
    pub fn first(&mut self, f: &First) {
        debug_assert!(self.flags() & !F_FIRST & 0x0f == 0, "section order");
        self.flag(F_FIRST, true);
        self.out.extend_from_slice(&f.service.to_le_bytes());
        varint::put(self.out, u64::from(f.mtu));
        varint::put(self.out, f.max_message);
    }

    /// Adds the ACCEPT section.
    pub fn accept(&mut self, a: &Accept) {
        debug_assert!(self.flags() & 0x0c == 0, "section order");
        self.flag(F_ACCEPT, true);
        self.out.extend_from_slice(&a.key.to_le_bytes());
        varint::put(self.out, u64::from(a.mtu));
        varint::put(self.out, a.max_message);
    }

    /// Adds a STATUS section of at most `room` bytes (at least
    /// [`STATUS_MIN_LEN`]), dropping the highest ranges that do not fit.
    /// Returns whether every range fit.
    pub fn status(&mut self, s: &Status, room: usize) -> bool {
        debug_assert!(self.flags() & 0x08 == 0, "section order");
        debug_assert!(s.alloc >= s.rseq);
        self.flag(F_STATUS, true);
        let start = self.out.len();
        varint::put(self.out, s.rseq);
        varint::put(self.out, s.alloc - s.rseq);
        varint::put(self.out, s.ack_delay_us);
        let count_at = self.out.len();
        self.out.push(0);
        let mut prev = s.rseq;
        let mut n = 0u8;
        for &(a, b) in s.sack.ranges() {
            let gap = a - prev - 1;
            let len = b - a - 1;
            if self.out.len() - start + varint::len(gap) + varint::len(len) > room {
                break;
            }
            varint::put(self.out, gap);
            varint::put(self.out, len);
            prev = b;
            n += 1;
        }
        self.out[count_at] = n;
        usize::from(n) == s.sack.ranges().len()
    }

    /// Adds a STATUS section encoded before by [`Encoder::status`] (its
    /// bytes as [`Encoder::since`] gave them): the same status again
    /// without encoding it again.
    pub fn status_encoded(&mut self, section: &[u8]) {
        debug_assert!(self.flags() & 0x08 == 0, "section order");
        self.flag(F_STATUS, true);
        self.out.extend_from_slice(section);
    }

    /// The bytes written for this packet from `at` (a [`written`](Self::written)
    /// count) on.
    pub fn since(&self, at: usize) -> &[u8] {
        &self.out[self.at + at..]
    }

    /// Starts the DATA section with sequence number `seq`; add chunks next.
    pub fn data(&mut self, seq: u64) {
        self.flag(F_DATA, true);
        varint::put(self.out, seq);
    }

    /// Adds a chunk to the DATA section.
    pub fn chunk(&mut self, c: &Chunk) {
        debug_assert!(self.flags() & F_DATA != 0, "chunk outside DATA");
        put_chunk(self.out, c);
    }

    /// Adds the header of a chunk to the DATA section, not its bytes: the
    /// caller sends them right after what was written, as the packet's
    /// last bytes (so only the packet's last chunk may be added this way).
    pub fn chunk_head(&mut self, c: &Chunk) {
        debug_assert!(self.flags() & F_DATA != 0, "chunk outside DATA");
        put_chunk_head(self.out, c);
    }

    /// Sets SREQ.
    pub fn sreq(&mut self, on: bool) {
        self.flag(F_SREQ, on);
    }

    /// Sets CLOSE (with a DATA section).
    pub fn close(&mut self, on: bool) {
        self.flag(F_CLOSE, on);
    }

    /// Sets RESET.
    pub fn reset(&mut self, on: bool) {
        self.flag(F_RESET, on);
    }
}

pub(super) fn put_chunk(out: &mut Vec<u8>, c: &Chunk) {
    put_chunk_head(out, c);
    out.extend_from_slice(&c.bytes);
}

/// A chunk's flags and lengths: its encoding without its bytes.
fn put_chunk_head(out: &mut Vec<u8>, c: &Chunk) {
    let mut f = 0;
    if c.begin {
        f |= C_BEGIN;
    }
    if c.end {
        f |= C_END;
    }
    if c.bundle {
        f |= C_BUNDLE;
    }
    out.push(f);
    if c.begin && !c.end {
        varint::put(out, c.total);
    }
    varint::put(out, c.bytes.len() as u64);
}
