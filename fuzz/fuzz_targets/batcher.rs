//! Arbitrary operations on a `Batcher`: pushes of arbitrary messages to a
//! few destinations at arbitrary times, flushes, timeouts and
//! `poll_transmit` with any segment count. Every transmit must split into
//! datagrams within `max_datagram` that decode to exactly the messages
//! pushed to that destination, in order, numbered from zero; refused pushes
//! must be refused for a reason that holds, and `wire::run_stride` must
//! find each multi-segment transmit's segment size from its bytes.
#![no_main]

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use arbitrary::Arbitrary;
use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use skiff_proto::wire::{self, HEADER_LEN};
use skiff_proto::{Batcher, BatcherConfig, Dest, Error, Field, Message, UsageError, Value};

#[derive(Arbitrary, Debug)]
struct Input {
    qthresh: u16,
    timeout_us: u16,
    max_datagram: u16,
    max_destinations: u8,
    source: u64,
    ops: Vec<Op>,
}

#[derive(Arbitrary, Debug)]
enum Op {
    Push { dest: u8, after_us: u16, msg: Msg },
    Flush,
    Timeout { after_us: u32 },
    Poll { max_segments: u8 },
}

#[derive(Arbitrary, Debug)]
enum Subject {
    /// The subject of the previous push (to whatever destination).
    Previous,
    Empty,
    Pool(u8),
    Long(u16),
    Any(String),
}

#[derive(Arbitrary, Debug)]
enum Val {
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Bytes(Vec<u8>),
}

#[derive(Arbitrary, Debug)]
struct Msg {
    subject: Subject,
    kind: Option<String>,
    fields: Vec<(String, Val)>,
    payload: Payload,
    payload_byte: u8,
}

/// A payload length, or one just under what fits in a datagram (where the
/// size rules have their edges).
#[derive(Arbitrary, Debug)]
enum Payload {
    Len(u16),
    NearMax(u8),
}

const POOL: [&str; 3] = ["daq.hallb.rate", "a", "x.y"];

impl Msg {
    fn build(self, max_datagram: usize, previous: &str) -> Message {
        let subject = match self.subject {
            Subject::Previous => previous.to_owned(),
            Subject::Empty => String::new(),
            Subject::Pool(i) => POOL[usize::from(i) % POOL.len()].to_owned(),
            Subject::Long(n) => "l".repeat(usize::from(n) % 1100),
            Subject::Any(s) => s,
        };
        let payload_len = match self.payload {
            Payload::Len(n) => usize::from(n) % 4000,
            Payload::NearMax(d) => max_datagram.saturating_sub(HEADER_LEN + usize::from(d)),
        };
        let fields = self
            .fields
            .into_iter()
            .map(|(k, v)| Field {
                key: k.into(),
                value: match v {
                    Val::Bool(b) => Value::Bool(b),
                    Val::Int(i) => Value::Int(i),
                    Val::Float(x) => Value::Float(x),
                    Val::Str(s) => Value::Str(s.into()),
                    Val::Bytes(b) => Value::Bytes(b.into()),
                },
            })
            .collect();
        Message {
            subject: subject.into(),
            kind: self.kind.map(Into::into),
            fields,
            payload: Bytes::from(vec![self.payload_byte; payload_len]),
            ..Default::default()
        }
    }
}

fn dest(i: u8) -> Dest {
    let addr = SocketAddr::from(([10, 0, 0, i % 2], 4747));
    match i % 4 {
        3 => Dest::any(addr),
        e => Dest {
            addr,
            endpoint: u32::from(e),
        },
    }
}

fn same(a: &Message, b: &Message) -> bool {
    a.subject == b.subject
        && a.kind == b.kind
        && a.payload == b.payload
        && a.fields.len() == b.fields.len()
        && a.fields.iter().zip(&b.fields).all(|(x, y)| {
            x.key == y.key
                && match (&x.value, &y.value) {
                    (Value::Float(p), Value::Float(q)) => p.to_bits() == q.to_bits(),
                    (p, q) => p == q,
                }
        })
}

struct Model {
    /// Pushed and not yet received, per destination.
    pending: BTreeMap<Dest, VecDeque<Message>>,
    /// The next sequence number expected per destination.
    next_seq: BTreeMap<Dest, u64>,
    buf: Vec<u8>,
}

impl Model {
    fn drain(&mut self, b: &mut Batcher, max_segments: usize) {
        let max = b.config().max_datagram;
        while let Some(t) = b.poll_transmit(&mut self.buf, max_segments) {
            assert_eq!(t.size, self.buf.len());
            assert!(t.segments >= 1 && t.segments <= max_segments.max(1));
            let segs: Vec<&[u8]> = match t.segment_size {
                None => {
                    assert_eq!(t.segments, 1);
                    vec![&self.buf[..]]
                }
                Some(seg) => self.buf.chunks(seg).collect(),
            };
            assert_eq!(segs.len(), t.segments);
            // A receiver told nothing of the run (a waiting receive under
            // GRO) finds the same segment size from the bytes.
            assert_eq!(
                wire::run_stride(&Bytes::copy_from_slice(&self.buf)),
                t.segment_size
            );
            let mut n = 0;
            for (i, seg) in segs.iter().enumerate() {
                assert!(
                    seg.len() <= max,
                    "{}-byte datagram, max_datagram {max}",
                    seg.len()
                );
                if let Some(s) = t.segment_size {
                    assert!(i + 1 == segs.len() || seg.len() == s);
                }
                let (h, msgs) = wire::decode(&Bytes::copy_from_slice(seg))
                    .unwrap_or_else(|e| panic!("{e} in {t:?}"));
                assert_eq!(h.endpoint, t.dest.endpoint);
                let next = self.next_seq.entry(t.dest).or_insert(0);
                assert_eq!(h.base_seq, *next);
                *next += msgs.len() as u64;
                let pending = self.pending.get_mut(&t.dest).expect("pushed to this dest");
                for m in &msgs {
                    let want = pending.pop_front().expect("no more messages than pushed");
                    assert!(same(m, &want), "{m:?} != {want:?}");
                }
                n += msgs.len();
            }
            assert_eq!(n, t.messages);
        }
    }
}

fuzz_target!(|input: Input| {
    let mut b = Batcher::new(BatcherConfig {
        qthresh: usize::from(input.qthresh),
        timeout: Duration::from_micros(u64::from(input.timeout_us)),
        max_datagram: usize::from(input.max_datagram),
        max_destinations: usize::from(input.max_destinations % 6),
        source: input.source,
    });
    let max = b.config().max_datagram;
    let max_dest = b.config().max_destinations;
    let mut now = Instant::now();
    let mut previous = String::new();
    let mut model = Model {
        pending: BTreeMap::new(),
        next_seq: BTreeMap::new(),
        buf: Vec::new(),
    };
    for op in input.ops.into_iter().take(256) {
        match op {
            Op::Push {
                dest: d,
                after_us,
                msg,
            } => {
                now += Duration::from_micros(u64::from(after_us));
                let d = dest(d);
                let msg = msg.build(max, &previous);
                previous = msg.subject.to_string();
                let known = model.pending.contains_key(&d);
                let destinations = b.destinations();
                match b.push(now, d, &msg) {
                    Ok(()) => model.pending.entry(d).or_default().push_back(msg),
                    Err(Error::Usage(UsageError::TooLarge { needed, limit, .. })) => {
                        assert_eq!(limit, max - HEADER_LEN);
                        assert!(needed > limit);
                        assert!(HEADER_LEN + wire::encoded_len(&msg, false) > max);
                    }
                    Err(Error::Usage(e)) => assert_eq!(wire::check(&msg), Err(e)),
                    Err(Error::Limit(_)) => assert!(!known && destinations >= max_dest),
                    Err(e) => panic!("unexpected {e}"),
                }
            }
            Op::Flush => b.flush(),
            Op::Timeout { after_us } => {
                now += Duration::from_micros(u64::from(after_us));
                b.handle_timeout(now);
                if let Some(at) = b.poll_timeout() {
                    assert!(at > now, "a due batch was left open");
                }
            }
            Op::Poll { max_segments } => model.drain(&mut b, usize::from(max_segments % 10)),
        }
    }
    b.flush();
    assert_eq!(b.poll_timeout(), None);
    model.drain(&mut b, 4);
    assert_eq!(b.queued(), 0);
    assert!(
        model.pending.values().all(VecDeque::is_empty),
        "pushed messages never sent"
    );
});
