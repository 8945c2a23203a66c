//! Reading association packets: the general decoder, the fast path for the
//! common data packet ([`Plain`]), and the sections on the codec's cursor.
//! Total and bounded (see the parent module).

use super::*;

impl Packet {
    /// Decodes one packet. Total and bounded: any input gives a packet or an
    /// error, nothing is allocated, data are slices of `buf`.
    pub fn decode(buf: &Bytes) -> Result<Packet, WireError> {
        let mut p = Packet::default();
        p.decode_into(buf.clone())?;
        Ok(p)
    }

    /// Decodes one packet into `self`, as [`Packet::decode`] does, reusing
    /// its status in place (a packet is a few hundred bytes: a driver
    /// decodes every packet into the same one instead of moving a fresh
    /// one around), and keeping `buf` for its data (no slice of it is
    /// made). On an error `self` holds no meaning (and no data).
    #[inline(always)]
    pub fn decode_into(&mut self, buf: Bytes) -> Result<(), WireError> {
        if let Some(p) = Plain::read(&buf) {
            self.set_plain(&p, buf);
            return Ok(());
        }
        self.decode_general(buf)
    }

    /// Fills `self` with the plain data packet `p` read from `buf`: what
    /// [`Packet::decode_general`] would leave.
    #[inline(always)]
    fn set_plain(&mut self, p: &Plain, buf: Bytes) {
        self.key = p.key;
        self.sreq = p.sreq;
        self.close = false;
        self.reset = false;
        self.first = None;
        self.accept = None;
        let st = self.status.get_or_insert_with(Status::default);
        st.rseq = p.rseq;
        st.alloc = p.alloc;
        st.ack_delay_us = p.ack_delay_us;
        st.sack.truncate(0);
        let chunks = Chunks {
            buf,
            start: p.start,
            first: Some(p.chunk),
        };
        self.data = Some(Data { seq: p.seq, chunks });
    }

    /// [`Packet::decode_into`] for any packet: every section, every check.
    #[inline(never)]
    pub(crate) fn decode_general(&mut self, buf: Bytes) -> Result<(), WireError> {
        self.data = None;
        let Some(head) = buf.first_chunk::<HEADER_LEN>() else {
            return Err(header_error(&buf));
        };
        if head[0..4] != [MAGIC[0], MAGIC[1], VERSION, KIND] || buf.len() > MAX_DATAGRAM {
            return Err(header_error(&buf));
        }
        let flags = head[4];
        let key = u64::from_le_bytes(head[5..13].try_into().expect("8 bytes"));
        // Every rule between flags involves one of these (a data packet
        // has none of them).
        if flags & (F_RESERVED | F_FIRST | F_ACCEPT | F_CLOSE) != 0 {
            check_flags(flags, key)?;
        }
        let has = |f: u8| flags & f != 0;
        let mut r = Reader::at(&buf[..], HEADER_LEN);
        self.key = key;
        self.sreq = has(F_SREQ);
        self.close = has(F_CLOSE);
        self.reset = has(F_RESET);
        self.first = None;
        self.accept = None;
        if has(F_FIRST) {
            self.first = Some(First {
                service: r.u32("service")?,
                mtu: r.mtu()?,
                max_message: r.max_message()?,
            });
        }
        if has(F_ACCEPT) {
            let k = r.u64("listener key")?;
            if k & RTN != 0 {
                return Err(WireError::Malformed("listener key with RTN set"));
            }
            self.accept = Some(Accept {
                key: k,
                mtu: r.mtu()?,
                max_message: r.max_message()?,
            });
        }
        if has(F_STATUS) {
            // Decoded in place: a status is a few hundred bytes, and this
            // runs for every packet.
            r.status_into(self.status.get_or_insert_with(Status::default))?;
        } else {
            self.status = None;
        }
        if has(F_DATA) {
            let seq = r.varint("sequence number")?;
            let start = r.pos();
            // Checked here, sliced only where kept (`Chunks::iter`). The
            // offsets noted are relative to the DATA's chunks.
            let mut c = Reader::new(&buf[start..]);
            let first = if c.is_empty() {
                None
            } else {
                Some(c.chunk_head()?)
            };
            while !c.is_empty() {
                c.chunk_head()?;
            }
            if first.is_none() && !self.close {
                return Err(WireError::Malformed("DATA with no chunks and no CLOSE"));
            }
            let chunks = Chunks { buf, start, first };
            self.data = Some(Data { seq, chunks });
        } else if !r.is_empty() {
            return Err(WireError::Malformed(
                "trailing bytes after the last section",
            ));
        }
        Ok(())
    }
}

/// The common data packet, read by [`Plain::read`]: flags STATUS and
/// DATA (and perhaps SREQ), a status without selective ranges, and one
/// chunk to the end of the datagram, every number in at most three bytes.
#[derive(Debug, Clone, Copy)]
struct Plain {
    key: u64,
    sreq: bool,
    rseq: u64,
    alloc: u64,
    ack_delay_us: u64,
    seq: u64,
    /// Offset of the DATA's chunks in the datagram.
    start: usize,
    /// The chunk, its offset relative to `start`.
    chunk: ChunkHead,
}

// `Plain::read` takes a message length of three varint bytes as within
// bounds.
const _: () = assert!(MAX_MESSAGE >= 1 << 21);

/// A varint of one to three bytes at `*pos` of `b` (what
/// [`Reader::varint`] reads inline); `None` for a longer one or the end.
#[inline(always)]
fn short_varint(b: &[u8], pos: &mut usize) -> Option<u64> {
    let x = *b.get(*pos)?;
    if x < 0x80 {
        *pos += 1;
        return Some(u64::from(x));
    }
    let y = *b.get(*pos + 1)?;
    if y < 0x80 {
        *pos += 2;
        return Some(u64::from(x & 0x7f) | u64::from(y) << 7);
    }
    let z = *b.get(*pos + 2)?;
    if z < 0x80 {
        *pos += 3;
        return Some(u64::from(x & 0x7f) | u64::from(y & 0x7f) << 7 | u64::from(z) << 14);
    }
    None
}

impl Plain {
    /// Reads `buf` if it is a plain data packet that
    /// [`Packet::decode_general`] accepts, with every check it makes;
    /// `None` for anything else, valid or not (the general path decides).
    #[inline(always)]
    fn read(buf: &[u8]) -> Option<Plain> {
        let head = buf.first_chunk::<HEADER_LEN>()?;
        if head[0..4] != [MAGIC[0], MAGIC[1], VERSION, KIND] || buf.len() > MAX_DATAGRAM {
            return None;
        }
        let flags = head[4];
        if flags & !F_SREQ != F_STATUS | F_DATA {
            return None;
        }
        let key = u64::from_le_bytes(head[5..13].try_into().ok()?);
        let mut pos = HEADER_LEN;
        let rseq = short_varint(buf, &mut pos)?;
        // Both below 2^21: the sum cannot overflow.
        let alloc = rseq + short_varint(buf, &mut pos)?;
        let ack_delay_us = short_varint(buf, &mut pos)?;
        if *buf.get(pos)? != 0 {
            return None;
        }
        pos += 1;
        let seq = short_varint(buf, &mut pos)?;
        let start = pos;
        let f = *buf.get(pos)?;
        pos += 1;
        let (begin, end, bundle) = (f & C_BEGIN != 0, f & C_END != 0, f & C_BUNDLE != 0);
        if f & C_RESERVED != 0 || (bundle && !begin) {
            return None;
        }
        let total = if begin && !end {
            // Below 2^21, so within MAX_MESSAGE.
            short_varint(buf, &mut pos)?
        } else {
            0
        };
        let len = short_varint(buf, &mut pos)? as usize;
        let whole = begin && end;
        if (!whole && len == 0) || (begin && !end && len as u64 >= total) {
            return None;
        }
        // One chunk, to the end.
        if buf.len() - pos != len {
            return None;
        }
        let chunk = ChunkHead {
            begin,
            end,
            bundle,
            total,
            at: pos - start,
            len,
        };
        Some(Plain {
            key,
            sreq: flags & F_SREQ != 0,
            rseq,
            alloc,
            ack_delay_us,
            seq,
            start,
            chunk,
        })
    }
}

/// Why a datagram's header is not an association packet's (the checks in
/// the order the header is read: the first that fails names the error).
#[cold]
fn header_error(buf: &[u8]) -> WireError {
    if buf.len() < 2 || buf[0..2] != MAGIC {
        return WireError::Foreign;
    }
    if buf.len() < 3 {
        return WireError::Truncated { what: "header" };
    }
    if buf[2] != VERSION {
        return WireError::Version(buf[2]);
    }
    if buf.len() < 4 {
        return WireError::Truncated { what: "header" };
    }
    if buf[3] != KIND {
        return WireError::Kind(buf[3]);
    }
    if buf.len() < HEADER_LEN {
        return WireError::Truncated { what: "header" };
    }
    WireError::TooLong {
        what: "datagram",
        len: buf.len() as u64,
        max: MAX_DATAGRAM,
    }
}

/// The rules between a packet's flags (and its key's RTN bit).
fn check_flags(flags: u8, key: u64) -> Result<(), WireError> {
    let has = |f: u8| flags & f != 0;
    if has(F_RESERVED) {
        return Err(WireError::Malformed("reserved packet flag set"));
    }
    if has(F_FIRST) && has(F_ACCEPT) {
        return Err(WireError::Malformed("FIRST and ACCEPT together"));
    }
    if has(F_FIRST) && (key & RTN != 0) {
        return Err(WireError::Malformed("FIRST with a return key"));
    }
    if has(F_ACCEPT) && (key & RTN == 0) {
        return Err(WireError::Malformed("ACCEPT without a return key"));
    }
    if has(F_FIRST) && has(F_DATA) {
        return Err(WireError::Malformed("FIRST with DATA"));
    }
    if has(F_CLOSE) && !has(F_DATA) {
        return Err(WireError::Malformed("CLOSE without DATA"));
    }
    Ok(())
}

/// The association sections, on the codec's cursor.
impl<B: AsRef<[u8]> + ?Sized> Reader<'_, B> {
    fn mtu(&mut self) -> Result<u32, WireError> {
        let m = self.varint("mtu")?;
        if m < MIN_MTU as u64 || m > MAX_DATAGRAM as u64 {
            return Err(WireError::Malformed("mtu out of range"));
        }
        Ok(m as u32)
    }

    fn max_message(&mut self) -> Result<u64, WireError> {
        let m = self.varint("max message")?;
        if m > MAX_MESSAGE {
            return Err(WireError::TooLong {
                what: "max message",
                len: m,
                max: MAX_MESSAGE as usize,
            });
        }
        Ok(m)
    }

    #[inline]
    fn status_into(&mut self, st: &mut Status) -> Result<(), WireError> {
        let rseq = self.varint("rseq")?;
        let alloc = rseq
            .checked_add(self.varint("alloc")?)
            .ok_or(WireError::Malformed("alloc overflows"))?;
        let ack_delay_us = self.varint("ack delay")?;
        let n = self.u8("range count")?;
        st.rseq = rseq;
        st.alloc = alloc;
        st.ack_delay_us = ack_delay_us;
        // `st` may be a status decoded before (see `Packet::decode_into`).
        st.sack.truncate(0);
        if usize::from(n) > MAX_SACK {
            return Err(WireError::TooLong {
                what: "sack ranges",
                len: u64::from(n),
                max: MAX_SACK,
            });
        }
        let mut prev = rseq;
        let overflow = WireError::Malformed("sack range overflows");
        for _ in 0..n {
            let gap = self.varint("sack gap")?;
            let len = self.varint("sack length")?;
            let start = prev
                .checked_add(gap)
                .and_then(|v| v.checked_add(1))
                .ok_or(overflow)?;
            let end = start
                .checked_add(len)
                .and_then(|v| v.checked_add(1))
                .ok_or(overflow)?;
            if end > alloc {
                return Err(WireError::Malformed("sack range beyond alloc"));
            }
            st.sack.push(start, end);
            prev = end;
        }
        Ok(())
    }

    /// Reads and checks a chunk, stepping over its bytes.
    #[inline(always)]
    pub(super) fn chunk_head(&mut self) -> Result<ChunkHead, WireError> {
        let f = self.u8("chunk flags")?;
        if f & C_RESERVED != 0 {
            return Err(WireError::Malformed("reserved chunk flag set"));
        }
        let begin = f & C_BEGIN != 0;
        let end = f & C_END != 0;
        let bundle = f & C_BUNDLE != 0;
        if bundle && !begin {
            return Err(WireError::Malformed(
                "BUNDLE on a piece that is not the first",
            ));
        }
        let total = if begin && !end {
            let t = self.varint("message length")?;
            if t > MAX_MESSAGE {
                return Err(WireError::TooLong {
                    what: "message",
                    len: t,
                    max: MAX_MESSAGE as usize,
                });
            }
            t
        } else {
            0
        };
        let wire_len = self.varint("chunk length")?;
        let len = self.check_len(wire_len, usize::MAX, "chunk")?;
        if !(begin && end) && len == 0 {
            return Err(WireError::Malformed("empty fragment"));
        }
        if begin && !end && len as u64 >= total {
            return Err(WireError::Malformed(
                "first fragment not shorter than its message",
            ));
        }
        let at = self.pos();
        self.take_len(wire_len, usize::MAX, "chunk")?;
        Ok(ChunkHead {
            begin,
            end,
            bundle,
            total,
            at,
            len,
        })
    }
}

#[cfg(test)]
mod plain_tests {
    use proptest::prelude::*;

    use super::*;

    fn general(buf: &Bytes) -> Result<Packet, WireError> {
        let mut p = Packet::default();
        p.decode_general(buf.clone()).map(|()| p)
    }

    /// The fast path takes only what the general path accepts, and leaves
    /// the same packet (the noted first chunk included), in a packet that
    /// held another before; `decode_into` answers as the general path does
    /// on every input. Returns whether the fast path took it.
    fn agree(buf: &Bytes) -> bool {
        let slow = general(buf);
        let mut p = Packet::default();
        // A packet with every section and ranges, decoded into first.
        let mut other = Vec::new();
        let mut sack = Sack::default();
        sack.push(5, 7);
        Packet {
            key: RTN | 9,
            sreq: true,
            status: Some(Status {
                rseq: 1,
                alloc: 90,
                ack_delay_us: 3,
                sack,
            }),
            accept: Some(Accept {
                key: 4,
                mtu: 1400,
                max_message: 77,
            }),
            ..Packet::default()
        }
        .encode(&mut other);
        p.decode_into(other.into()).unwrap();
        let fast = Plain::read(buf).is_some();
        let got = p.decode_into(buf.clone());
        match (&slow, got) {
            (Ok(want), Ok(())) => {
                assert_eq!(&p, want);
                let firsts = |q: &Packet| q.data.as_ref().map(|d| d.chunks.first);
                assert_eq!(firsts(&p), firsts(want));
            }
            (Err(want), Err(e)) => assert_eq!(&e, want),
            (want, got) => panic!("general {want:?}, decode_into {got:?}"),
        }
        assert!(
            !fast || slow.is_ok(),
            "fast path took a packet the general one refuses"
        );
        fast
    }

    /// A plain data packet, encoded.
    fn plain(
        key: u64,
        sreq: bool,
        rseq: u64,
        window: u64,
        delay: u64,
        seq: u64,
        c: Chunk,
    ) -> Vec<u8> {
        let mut out = Vec::new();
        let mut e = Encoder::new(&mut out, key);
        e.status(
            &Status {
                rseq,
                alloc: rseq + window,
                ack_delay_us: delay,
                sack: Sack::default(),
            },
            usize::MAX,
        );
        e.data(seq);
        e.chunk(&c);
        e.sreq(sreq);
        out
    }

    #[test]
    fn a_bulk_packet_takes_the_fast_path() {
        let c = Chunk {
            begin: false,
            end: false,
            bundle: false,
            total: 0,
            bytes: Bytes::from(vec![7u8; 1400]),
        };
        let buf = Bytes::from(plain(RTN | 77, false, 0, 1024, 0, 12_345, c));
        assert!(agree(&buf));
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 4096, ..ProptestConfig::default() })]

        /// Plain data packets of every shape (numbers of one to four varint
        /// bytes), then changed in up to three bytes, cut or extended.
        #[test]
        fn fast_and_general_decoders_agree(
            key in any::<u64>(),
            sreq in any::<bool>(),
            nums in proptest::collection::vec(0u64..(1 << 23), 4),
            cflags in 0u8..8,
            total in 0u64..(1 << 22),
            len in 0usize..300,
            edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..4),
            cut in 0usize..4,
            grow in 0usize..3,
        ) {
            let c = Chunk {
                begin: cflags & 1 != 0,
                end: cflags & 2 != 0,
                bundle: cflags & 4 != 0,
                total,
                bytes: Bytes::from(vec![1u8; len]),
            };
            let mut buf = plain(key, sreq, nums[0], nums[1], nums[2], nums[3], c);
            agree(&Bytes::from(buf.clone()));
            for (at, x) in edits {
                let at = at % buf.len();
                buf[at] ^= x;
            }
            buf.truncate(buf.len().saturating_sub(cut));
            buf.extend(std::iter::repeat_n(0x42, grow));
            agree(&Bytes::from(buf));
        }

        /// Any bytes at all behind a valid header.
        #[test]
        fn fast_and_general_decoders_agree_on_any_bytes(
            flags in any::<u8>(),
            key in any::<u64>(),
            rest in proptest::collection::vec(any::<u8>(), 0..64),
        ) {
            let mut buf = vec![MAGIC[0], MAGIC[1], VERSION, KIND, flags];
            buf.extend_from_slice(&key.to_le_bytes());
            buf.extend_from_slice(&rest);
            agree(&Bytes::from(buf));
        }
    }
}
