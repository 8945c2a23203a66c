//! The mesh's datagrams authenticated and encrypted, as a layer between the
//! UDP socket and the sans-I/O mesh: every datagram the mesh sends to a
//! peer is sealed whole, every one that arrives is opened before the mesh
//! sees it. It owns no socket and no clock (time comes in as `now`).
//!
//! Keys come from a Noise handshake, through the `snow` crate, with the
//! pattern `Noise_XXpsk3_25519_ChaChaPoly_BLAKE2s`: each node proves its
//! static X25519 identity key, and the pre-shared key (the SHA-256 of the
//! mesh secret, or 32 zero bytes when only trusted keys are configured)
//! is mixed in, so a node without the secret derives other keys and
//! nothing it sends opens. With `trusted_keys`, a peer whose identity is
//! not listed is refused after the handshake. The prologue binds the
//! handshake to this protocol and the network name.
//!
//! Data then goes with snow's stateless transport: ChaCha20-Poly1305 with
//! an explicit 64-bit nonce in each datagram (the sender's counter), and
//! a sliding anti-replay window of [`WINDOW`] nonces per session on the
//! receiver, so a datagram captured and replayed, too old, or altered in
//! any bit is dropped and counted.
//!
//! ```text
//!  0      2     3      4
//! +------+-----+------+----------------------------------------------+
//! | "SX" | ver | type | ...                                          |
//! +------+-----+------+----------------------------------------------+
//! type 1 hello-1: sender index u32 | Noise message 1 (e)
//! type 2 hello-2: sender index u32 | receiver index u32 | Noise message 2 (e, ee, s, es)
//! type 3 hello-3: receiver index u32 | Noise message 3 (s, se, psk)
//! type 4 data:    receiver index u32 | nonce u64 | ciphertext (+16-byte tag)
//! ```
//! Integers are little-endian. Indices are random per session and name
//! the receiver's session (as WireGuard's), so a peer may hold a new
//! session and the one before it while a handshake crosses another.
//!
//! Bounded: at most [`MAX_PEERS`] peers with state, [`MAX_QUEUE`]
//! datagrams waiting per peer for a handshake, [`RESPONSES_PER_SEC`]
//! handshake answers a second; everything dropped is counted.
//!
//! Scouting hellos to the multicast group stay plain (they carry the
//! node's address and network name, nothing else) and are the only plain
//! datagrams accepted.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use skiff_proto::stats::SealStats;
use snow::{HandshakeState, StatelessTransportState};

/// The Noise protocol name.
pub(crate) const NOISE: &str = "Noise_XXpsk3_25519_ChaChaPoly_BLAKE2s";

/// Bytes a sealed data datagram adds to the mesh's own: header, receiver
/// index, nonce, tag.
pub(crate) const OVERHEAD: usize = 4 + 4 + 8 + 16;

const MAGIC: [u8; 2] = *b"SX";
const VERSION: u8 = 1;
const T_HELLO1: u8 = 1;
const T_HELLO2: u8 = 2;
const T_HELLO3: u8 = 3;
const T_DATA: u8 = 4;

/// Nonces the anti-replay window remembers below the highest seen.
pub(crate) const WINDOW: u64 = 1024;
/// Peers with handshake or session state at most.
pub(crate) const MAX_PEERS: usize = 4096;
/// Datagrams held per peer while its handshake runs.
pub(crate) const MAX_QUEUE: usize = 256;
/// Handshake answers (hello-2) sent per second at most, over all peers.
pub(crate) const RESPONSES_PER_SEC: u32 = 256;
/// A handshake not finished by then is started again (while datagrams
/// wait for it).
const RETRY: Duration = Duration::from_millis(500);
/// Datagrams that waited this long for a handshake are dropped.
const QUEUE_LIMIT: Duration = Duration::from_secs(5);

/// What the layer needs to know: its identity, the secret, whom to trust.
#[derive(Clone)]
pub(crate) struct SealConfig {
    /// This node's X25519 private key.
    pub(crate) private: [u8; 32],
    /// The pre-shared key (SHA-256 of the mesh secret, or zeros).
    pub(crate) psk: [u8; 32],
    /// Peers' identity keys accepted; empty: any peer that knows the secret.
    pub(crate) trusted: Vec<[u8; 32]>,
    /// Bound into every handshake: protocol and network name.
    pub(crate) prologue: Vec<u8>,
}

impl std::fmt::Debug for SealConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "SealConfig {{ trusted: {} key(s), .. }}",
            self.trusted.len()
        )
    }
}

impl SealConfig {
    /// A configuration from the mesh secret (if any), trusted keys and the
    /// identity key.
    pub(crate) fn new(
        secret: Option<&str>,
        trusted: Vec<[u8; 32]>,
        private: [u8; 32],
        net: &str,
    ) -> SealConfig {
        let psk = secret.map_or([0; 32], |s| Sha256::digest(s.as_bytes()).into());
        let mut prologue = b"skiff mesh seal v1\0".to_vec();
        prologue.extend_from_slice(net.as_bytes());
        SealConfig {
            private,
            psk,
            trusted,
            prologue,
        }
    }
}

/// A new X25519 key pair (private, public) from snow's generator.
pub(crate) fn generate_identity() -> ([u8; 32], [u8; 32]) {
    let k = snow::Builder::new(NOISE.parse().expect("a valid Noise name"))
        .generate_keypair()
        .expect("the OS's random number generator");
    let mut private = [0u8; 32];
    let mut public = [0u8; 32];
    private.copy_from_slice(&k.private);
    public.copy_from_slice(&k.public);
    (private, public)
}

/// The public key of an X25519 private key, computed by the same
/// curve25519 implementation snow uses.
pub(crate) fn public_of(private: &[u8; 32]) -> [u8; 32] {
    use snow::resolvers::{CryptoResolver, DefaultResolver};
    let mut dh = DefaultResolver
        .resolve_dh(&snow::params::DHChoice::Curve25519)
        .expect("curve25519 in snow's default resolver");
    dh.set(private);
    let mut out = [0u8; 32];
    out.copy_from_slice(dh.pubkey());
    out
}

/// Reads this node's identity (an X25519 private key, base64) from
/// `path`, or makes one and writes it there (mode 0600) if there is no
/// such file. Errors name the file.
pub(crate) fn load_identity(path: &std::path::Path) -> std::io::Result<[u8; 32]> {
    use base64::Engine;
    use std::io::Write;
    let bad = |why: String| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("mesh identity {}: {why}", path.display()),
        )
    };
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let v = base64::engine::general_purpose::STANDARD
                .decode(text.trim())
                .map_err(|_| bad("not a base64 X25519 private key".into()))?;
            v.try_into()
                .map_err(|_| bad("not 32 bytes (an X25519 private key)".into()))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            use std::os::unix::fs::OpenOptionsExt;
            let (private, _) = generate_identity();
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)
                .map_err(|e| bad(format!("cannot create it ({e})")))?;
            writeln!(
                f,
                "{}",
                base64::engine::general_purpose::STANDARD.encode(private)
            )
            .map_err(|e| bad(e.to_string()))?;
            Ok(private)
        }
        Err(e) => Err(bad(format!("cannot read it ({e})"))),
    }
}

/// Parses a trusted identity key (X25519 public key, base64).
pub(crate) fn parse_public(s: &str) -> Option<[u8; 32]> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD
        .decode(s.trim())
        .ok()?
        .try_into()
        .ok()
}

/// Counters, shared with the stats.
#[derive(Debug, Default)]
pub(crate) struct SealCounters {
    handshakes: AtomicU64,
    replayed: AtomicU64,
    forged: AtomicU64,
    plain: AtomicU64,
    untrusted: AtomicU64,
    bad_handshakes: AtomicU64,
    unknown_session: AtomicU64,
    queue_drops: AtomicU64,
    refused_busy: AtomicU64,
}

impl SealCounters {
    pub(crate) fn stats(&self, identity: &[u8; 32]) -> SealStats {
        use base64::Engine;
        let l = |a: &AtomicU64| a.load(Relaxed);
        SealStats {
            identity: base64::engine::general_purpose::STANDARD.encode(identity),
            handshakes: l(&self.handshakes),
            replayed: l(&self.replayed),
            forged: l(&self.forged),
            plain: l(&self.plain),
            untrusted: l(&self.untrusted),
            bad_handshakes: l(&self.bad_handshakes),
            unknown_session: l(&self.unknown_session),
            queue_drops: l(&self.queue_drops),
            refused_busy: l(&self.refused_busy),
        }
    }
}

/// Nonces seen: the highest, and a bitmap of the [`WINDOW`] below it.
#[derive(Debug, Default)]
struct ReplayWindow {
    /// One more than the highest nonce accepted (0: none yet).
    top: u64,
    bits: [u64; (WINDOW / 64) as usize],
}

impl ReplayWindow {
    /// Whether `n` may be new (not seen, not too old): checked before the
    /// tag, marked only once the tag verified ([`ReplayWindow::mark`]).
    fn fresh(&self, n: u64) -> bool {
        if n >= self.top {
            return true;
        }
        if self.top - n > WINDOW {
            return false;
        }
        let i = (n % WINDOW) as usize;
        self.bits[i / 64] & (1 << (i % 64)) == 0
    }

    fn mark(&mut self, n: u64) {
        if n >= self.top {
            // Clear the slots of the nonces skipped over (now unseen).
            let from = self.top.max(n.saturating_sub(WINDOW - 1));
            for k in from..n {
                let i = (k % WINDOW) as usize;
                self.bits[i / 64] &= !(1 << (i % 64));
            }
            if n - self.top >= WINDOW {
                self.bits = [0; (WINDOW / 64) as usize];
            }
            self.top = n + 1;
        }
        let i = (n % WINDOW) as usize;
        self.bits[i / 64] |= 1 << (i % 64);
    }
}

struct Session {
    /// Our index: data to us carries it.
    local: u32,
    /// The peer's index: data we send carries it.
    remote: u32,
    t: StatelessTransportState,
    next_nonce: u64,
    window: ReplayWindow,
}

#[derive(Default)]
struct Peer {
    /// Established sessions, newest first (at most two).
    sessions: Vec<Session>,
    /// Our handshake to the peer: our index, its state, when sent.
    initiating: Option<(u32, HandshakeState, Instant)>,
    /// The peer's handshake to us: our index, its index, the state.
    responding: Option<(u32, u32, HandshakeState)>,
    /// Datagrams waiting for a session, and since when the oldest waits.
    queue: VecDeque<Vec<u8>>,
    queued_since: Option<Instant>,
}

/// The sealing layer (see the module documentation). Polling: call
/// [`Seal::seal`] for each datagram to send and [`Seal::open`] for each
/// that arrives, then send what [`Seal::poll_transmit`] gives, and call
/// [`Seal::handle_timeout`] at least every [`RETRY`] while
/// [`Seal::waiting`].
pub(crate) struct Seal {
    cfg: SealConfig,
    public: [u8; 32],
    peers: HashMap<SocketAddr, Peer>,
    /// Our session and handshake indices → peer.
    index: HashMap<u32, SocketAddr>,
    out: VecDeque<(SocketAddr, Vec<u8>)>,
    counters: Arc<SealCounters>,
    /// Handshake answers sent in the current second.
    answered: (u64, u32),
    /// A sealed data datagram on its way out.
    scratch: Vec<u8>,
    /// Handshake messages being written.
    hs_buf: Vec<u8>,
}

impl std::fmt::Debug for Seal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Seal {{ peers: {} }}", self.peers.len())
    }
}

fn header(t: u8) -> Vec<u8> {
    let mut v = Vec::with_capacity(128);
    v.extend_from_slice(&MAGIC);
    v.push(VERSION);
    v.push(t);
    v
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

impl Seal {
    pub(crate) fn new(cfg: SealConfig) -> Seal {
        let public = public_of(&cfg.private);
        Seal {
            cfg,
            public,
            peers: HashMap::new(),
            index: HashMap::new(),
            out: VecDeque::new(),
            counters: Arc::default(),
            answered: (0, 0),
            scratch: Vec::with_capacity(65_536),
            hs_buf: vec![0; 1024],
        }
    }

    /// This node's identity (public key).
    pub(crate) fn identity(&self) -> [u8; 32] {
        self.public
    }

    /// The counters, for stats.
    pub(crate) fn counters(&self) -> Arc<SealCounters> {
        self.counters.clone()
    }

    fn builder(&self) -> snow::Builder<'_> {
        snow::Builder::new(NOISE.parse().expect("a valid Noise name"))
    }

    fn new_index(&self) -> u32 {
        loop {
            let mut b = [0u8; 4];
            if getrandom::fill(&mut b).is_err() {
                continue;
            }
            let i = u32::from_le_bytes(b);
            if i != 0 && !self.index.contains_key(&i) {
                return i;
            }
        }
    }

    /// Seals `plain` for `dest`, or holds it while a handshake with `dest`
    /// runs (starting one if none is). `push` takes each sealed datagram.
    pub(crate) fn seal(
        &mut self,
        now: Instant,
        dest: SocketAddr,
        plain: &[u8],
        mut push: impl FnMut(SocketAddr, &[u8]),
    ) {
        if !self.peers.contains_key(&dest) && self.peers.len() >= MAX_PEERS {
            self.counters.queue_drops.fetch_add(1, Relaxed);
            return;
        }
        let peer = self.peers.entry(dest).or_default();
        if let Some(s) = peer.sessions.first_mut() {
            // Into the one scratch buffer: no allocation per datagram.
            let d = &mut self.scratch;
            d.clear();
            d.extend_from_slice(&MAGIC);
            d.extend_from_slice(&[VERSION, T_DATA]);
            d.extend_from_slice(&s.remote.to_le_bytes());
            d.extend_from_slice(&s.next_nonce.to_le_bytes());
            let at = d.len();
            d.resize(at + plain.len() + 16, 0);
            match s.t.write_message(s.next_nonce, plain, &mut d[at..]) {
                Ok(n) => {
                    s.next_nonce += 1;
                    d.truncate(at + n);
                    push(dest, d);
                }
                Err(_) => {
                    self.counters.queue_drops.fetch_add(1, Relaxed);
                }
            }
            return;
        }
        if peer.queue.len() >= MAX_QUEUE {
            self.counters.queue_drops.fetch_add(1, Relaxed);
        } else {
            peer.queue.push_back(plain.to_vec());
            peer.queued_since.get_or_insert(now);
        }
        let stale = peer
            .initiating
            .as_ref()
            .is_none_or(|(_, _, sent)| now.duration_since(*sent) >= RETRY);
        if stale {
            self.initiate(now, dest);
        }
    }

    /// Starts a handshake with `dest` (hello-1).
    fn initiate(&mut self, now: Instant, dest: SocketAddr) {
        let idx = self.new_index();
        let hs = self
            .builder()
            .local_private_key(&self.cfg.private)
            .and_then(|b| b.psk(3, &self.cfg.psk))
            .and_then(|b| b.prologue(&self.cfg.prologue))
            .and_then(|b| b.build_initiator());
        let Ok(mut hs) = hs else {
            return;
        };
        let mut d = header(T_HELLO1);
        d.extend_from_slice(&idx.to_le_bytes());
        let Ok(n) = hs.write_message(&[], &mut self.hs_buf) else {
            return;
        };
        d.extend_from_slice(&self.hs_buf[..n]);
        let peer = self.peers.entry(dest).or_default();
        if let Some((old, _, _)) = peer.initiating.take() {
            self.index.remove(&old);
        }
        peer.initiating = Some((idx, hs, now));
        self.index.insert(idx, dest);
        self.out.push_back((dest, d));
    }

    /// Opens a datagram from `from`: the mesh's plaintext when it is data
    /// of a live session; `None` when it was a handshake message (its
    /// answer, if any, waits in [`Seal::poll_transmit`]) or was dropped
    /// (counted).
    pub(crate) fn open(&mut self, now: Instant, from: SocketAddr, d: &[u8]) -> Option<Vec<u8>> {
        if d.len() < 8 || d[..2] != MAGIC || d[2] != VERSION {
            self.counters.plain.fetch_add(1, Relaxed);
            return None;
        }
        match d[3] {
            T_DATA => self.open_data(now, from, d),
            T_HELLO1 => {
                self.answer(now, from, d);
                None
            }
            T_HELLO2 => {
                self.finish_initiator(now, from, d);
                None
            }
            T_HELLO3 => {
                self.finish_responder(now, from, d);
                None
            }
            _ => {
                self.counters.bad_handshakes.fetch_add(1, Relaxed);
                None
            }
        }
    }

    fn open_data(&mut self, now: Instant, from: SocketAddr, d: &[u8]) -> Option<Vec<u8>> {
        let (Some(idx), Some(nonce)) = (
            u32_at(d, 4),
            d.get(8..16)
                .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes"))),
        ) else {
            self.counters.forged.fetch_add(1, Relaxed);
            return None;
        };
        let session = self
            .index
            .get(&idx)
            .filter(|a| **a == from)
            .and_then(|a| self.peers.get_mut(a))
            .and_then(|p| p.sessions.iter_mut().find(|s| s.local == idx));
        let Some(s) = session else {
            // A peer that restarted, or a datagram from elsewhere: a new
            // handshake, if one is not already running.
            self.counters.unknown_session.fetch_add(1, Relaxed);
            let running = self.peers.get(&from).is_some_and(|p| {
                p.initiating
                    .as_ref()
                    .is_some_and(|i| now.duration_since(i.2) < RETRY)
            });
            if !running && (self.peers.contains_key(&from) || self.peers.len() < MAX_PEERS) {
                self.initiate(now, from);
            }
            return None;
        };
        if !s.window.fresh(nonce) {
            self.counters.replayed.fetch_add(1, Relaxed);
            return None;
        }
        let body = &d[16..];
        let mut out = vec![0u8; body.len()];
        match s.t.read_message(nonce, body, &mut out) {
            Ok(n) => {
                s.window.mark(nonce);
                out.truncate(n);
                Some(out)
            }
            Err(_) => {
                self.counters.forged.fetch_add(1, Relaxed);
                None
            }
        }
    }

    fn trusted(&self, remote: Option<&[u8]>) -> bool {
        self.cfg.trusted.is_empty()
            || remote.is_some_and(|r| self.cfg.trusted.iter().any(|t| t[..] == *r))
    }

    /// hello-1 from `from`: answer with hello-2 (rate limited).
    fn answer(&mut self, now: Instant, from: SocketAddr, d: &[u8]) {
        let _ = now;
        let sec = now_secs();
        if self.answered.0 != sec {
            self.answered = (sec, 0);
        }
        if self.answered.1 >= RESPONSES_PER_SEC
            || (!self.peers.contains_key(&from) && self.peers.len() >= MAX_PEERS)
        {
            self.counters.refused_busy.fetch_add(1, Relaxed);
            return;
        }
        let Some(their) = u32_at(d, 4) else {
            self.counters.bad_handshakes.fetch_add(1, Relaxed);
            return;
        };
        let hs = self
            .builder()
            .local_private_key(&self.cfg.private)
            .and_then(|b| b.psk(3, &self.cfg.psk))
            .and_then(|b| b.prologue(&self.cfg.prologue))
            .and_then(|b| b.build_responder());
        let Ok(mut hs) = hs else {
            return;
        };
        let mut payload = [0u8; 64];
        if hs.read_message(&d[8..], &mut payload).is_err() {
            self.counters.bad_handshakes.fetch_add(1, Relaxed);
            return;
        }
        let Ok(n) = hs.write_message(&[], &mut self.hs_buf) else {
            self.counters.bad_handshakes.fetch_add(1, Relaxed);
            return;
        };
        self.answered.1 += 1;
        let ours = self.new_index();
        let mut reply = header(T_HELLO2);
        reply.extend_from_slice(&ours.to_le_bytes());
        reply.extend_from_slice(&their.to_le_bytes());
        reply.extend_from_slice(&self.hs_buf[..n]);
        let peer = self.peers.entry(from).or_default();
        if let Some((old, _, _)) = peer.responding.take() {
            self.index.remove(&old);
        }
        peer.responding = Some((ours, their, hs));
        self.index.insert(ours, from);
        self.out.push_back((from, reply));
    }

    /// hello-2 from `from` answering our hello-1: send hello-3 and start
    /// the session.
    fn finish_initiator(&mut self, now: Instant, from: SocketAddr, d: &[u8]) {
        let (Some(their), Some(ours)) = (u32_at(d, 4), u32_at(d, 8)) else {
            self.counters.bad_handshakes.fetch_add(1, Relaxed);
            return;
        };
        let Some(peer) = self.peers.get_mut(&from) else {
            self.counters.bad_handshakes.fetch_add(1, Relaxed);
            return;
        };
        match &peer.initiating {
            Some((i, _, _)) if *i == ours => {}
            _ => {
                self.counters.bad_handshakes.fetch_add(1, Relaxed);
                return;
            }
        }
        let (idx, mut hs, _) = peer.initiating.take().expect("checked");
        let mut payload = [0u8; 64];
        if hs.read_message(&d[12..], &mut payload).is_err() {
            self.index.remove(&idx);
            self.counters.bad_handshakes.fetch_add(1, Relaxed);
            return;
        }
        if !self.trusted(hs.get_remote_static()) {
            self.index.remove(&idx);
            self.counters.untrusted.fetch_add(1, Relaxed);
            return;
        }
        let Ok(n) = hs.write_message(&[], &mut self.hs_buf) else {
            self.index.remove(&idx);
            return;
        };
        let mut m3 = header(T_HELLO3);
        m3.extend_from_slice(&their.to_le_bytes());
        m3.extend_from_slice(&self.hs_buf[..n]);
        self.out.push_back((from, m3));
        self.establish(now, from, idx, their, hs);
    }

    /// hello-3 from `from`: the session it asked for starts.
    fn finish_responder(&mut self, now: Instant, from: SocketAddr, d: &[u8]) {
        let Some(ours) = u32_at(d, 4) else {
            self.counters.bad_handshakes.fetch_add(1, Relaxed);
            return;
        };
        let Some(peer) = self.peers.get_mut(&from) else {
            self.counters.bad_handshakes.fetch_add(1, Relaxed);
            return;
        };
        match &peer.responding {
            Some((i, _, _)) if *i == ours => {}
            _ => {
                self.counters.bad_handshakes.fetch_add(1, Relaxed);
                return;
            }
        }
        let (idx, their, mut hs) = peer.responding.take().expect("checked");
        let mut payload = [0u8; 64];
        if hs.read_message(&d[8..], &mut payload).is_err() {
            // Most often: the peer does not know the mesh secret.
            self.index.remove(&idx);
            self.counters.bad_handshakes.fetch_add(1, Relaxed);
            return;
        }
        if !self.trusted(hs.get_remote_static()) {
            self.index.remove(&idx);
            self.counters.untrusted.fetch_add(1, Relaxed);
            return;
        }
        self.establish(now, from, idx, their, hs);
    }

    fn establish(
        &mut self,
        now: Instant,
        peer_addr: SocketAddr,
        local: u32,
        remote: u32,
        hs: HandshakeState,
    ) {
        let Ok(t) = hs.into_stateless_transport_mode() else {
            self.index.remove(&local);
            return;
        };
        self.counters.handshakes.fetch_add(1, Relaxed);
        let peer = self.peers.entry(peer_addr).or_default();
        peer.sessions.insert(
            0,
            Session {
                local,
                remote,
                t,
                next_nonce: 0,
                window: ReplayWindow::default(),
            },
        );
        while peer.sessions.len() > 2 {
            let old = peer.sessions.pop().expect("more than two");
            self.index.remove(&old.local);
        }
        // What waited for the session goes now.
        let queued: Vec<Vec<u8>> = peer.queue.drain(..).collect();
        peer.queued_since = None;
        let mut sealed = Vec::new();
        for q in queued {
            self.seal(now, peer_addr, &q, |a, d| sealed.push((a, d.to_vec())));
        }
        self.out.extend(sealed);
    }

    /// The next handshake message (or flushed datagram) to send.
    #[must_use]
    pub(crate) fn poll_transmit(&mut self) -> Option<(SocketAddr, Vec<u8>)> {
        self.out.pop_front()
    }

    /// Whether datagrams wait for a handshake (then call
    /// [`Seal::handle_timeout`] again within [`RETRY`]).
    pub(crate) fn waiting(&self) -> bool {
        self.peers.values().any(|p| !p.queue.is_empty())
    }

    /// Retries handshakes that datagrams wait for, and drops datagrams
    /// that waited too long (counted).
    pub(crate) fn handle_timeout(&mut self, now: Instant) {
        let mut retry = Vec::new();
        for (a, p) in &mut self.peers {
            if p.queue.is_empty() {
                continue;
            }
            if p.queued_since
                .is_some_and(|t| now.duration_since(t) >= QUEUE_LIMIT)
            {
                self.counters
                    .queue_drops
                    .fetch_add(p.queue.len() as u64, Relaxed);
                p.queue.clear();
                p.queued_since = None;
                continue;
            }
            if p.initiating
                .as_ref()
                .is_none_or(|(_, _, sent)| now.duration_since(*sent) >= RETRY)
            {
                retry.push(*a);
            }
        }
        for a in retry {
            self.initiate(now, a);
        }
        // Peers with nothing left (no session, no handshake, no queue).
        let index = &mut self.index;
        self.peers.retain(|_, p| {
            let keep = !p.sessions.is_empty()
                || p.initiating.is_some()
                || p.responding.is_some()
                || !p.queue.is_empty();
            if !keep {
                for s in &p.sessions {
                    index.remove(&s.local);
                }
            }
            keep
        });
    }

    /// Forgets a peer that left the mesh (its sessions and what waits).
    pub(crate) fn forget(&mut self, peer: SocketAddr) {
        if let Some(p) = self.peers.remove(&peer) {
            for s in &p.sessions {
                self.index.remove(&s.local);
            }
            if let Some((i, _, _)) = p.initiating {
                self.index.remove(&i);
            }
            if let Some((i, _, _)) = p.responding {
                self.index.remove(&i);
            }
        }
    }
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Whether `d` is a plain scouting hello (the only plain datagram a
/// sealed mesh accepts).
pub(crate) fn is_plain_hello(d: &[u8]) -> bool {
    use skiff_proto::mesh::packet::{Kind, MAGIC as PLAIN, VERSION as PLAIN_VERSION};
    d.len() >= 4 && d[..2] == PLAIN && d[2] == PLAIN_VERSION && d[3] == Kind::Hello as u8
}

#[cfg(test)]
mod tests;
