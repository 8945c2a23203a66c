use super::*;

fn addr(p: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], p))
}

fn node(secret: Option<&str>, trusted: Vec<[u8; 32]>, private: [u8; 32]) -> Seal {
    Seal::new(SealConfig::new(secret, trusted, private, "net"))
}

/// Moves every handshake message between `a` (at port 1) and `b` (port
/// 2) until neither has more; returns the plain datagrams each received.
fn exchange(a: &mut Seal, b: &mut Seal, now: Instant) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let (mut to_a, mut to_b) = (Vec::new(), Vec::new());
    for _ in 0..10 {
        let mut moved = false;
        while let Some((to, d)) = a.poll_transmit() {
            assert_eq!(to, addr(2));
            moved = true;
            to_b.extend(b.open(now, addr(1), &d));
        }
        while let Some((to, d)) = b.poll_transmit() {
            assert_eq!(to, addr(1));
            moved = true;
            to_a.extend(a.open(now, addr(2), &d));
        }
        if !moved {
            break;
        }
    }
    (to_a, to_b)
}

/// `a` seals `plain` for `b`; the datagram as it would go on the wire.
fn wire(a: &mut Seal, now: Instant, plain: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    a.seal(now, addr(2), plain, |_, d| out.push(d.to_vec()));
    out
}

#[test]
fn a_handshake_then_data_both_ways_and_held_datagrams_are_sent() {
    let now = Instant::now();
    let mut a = node(Some("s3cret"), vec![], generate_identity().0);
    let mut b = node(Some("s3cret"), vec![], generate_identity().0);
    // Nothing sealed yet: the first datagram waits for the handshake.
    assert!(wire(&mut a, now, b"first").is_empty());
    assert!(a.waiting());
    let (_, to_b) = exchange(&mut a, &mut b, now);
    assert_eq!(to_b, vec![b"first".to_vec()]);
    assert!(!a.waiting());
    for d in wire(&mut a, now, b"second") {
        assert_eq!(b.open(now, addr(1), &d).unwrap(), b"second");
        assert!(!d.windows(6).any(|w| w == b"second"), "not encrypted");
    }
    let mut back = Vec::new();
    b.seal(now, addr(1), b"back", |_, d| back.push(d.to_vec()));
    assert_eq!(a.open(now, addr(2), &back[0]).unwrap(), b"back");
    assert_eq!(a.counters().stats(&a.identity()).handshakes, 1);
}

#[test]
fn a_replayed_or_altered_datagram_is_dropped_and_counted() {
    let now = Instant::now();
    let mut a = node(Some("s3cret"), vec![], generate_identity().0);
    let mut b = node(Some("s3cret"), vec![], generate_identity().0);
    let _ = wire(&mut a, now, b"x");
    exchange(&mut a, &mut b, now);
    let captured = wire(&mut a, now, b"pay 100").remove(0);
    assert_eq!(b.open(now, addr(1), &captured).unwrap(), b"pay 100");
    // Replayed as captured.
    assert!(b.open(now, addr(1), &captured).is_none());
    // Each bit of the nonce and the ciphertext flipped in turn.
    let fresh = wire(&mut a, now, b"pay 200").remove(0);
    let flips = (fresh.len() - 8) as u64 * 8;
    for bit in (8 * 8)..(fresh.len() * 8) {
        let mut f = fresh.clone();
        f[bit / 8] ^= 1 << (bit % 8);
        assert!(
            b.open(now, addr(1), &f).is_none(),
            "bit {bit} flipped was accepted"
        );
    }
    // The original still opens: the forgeries did not spend its nonce.
    assert_eq!(b.open(now, addr(1), &fresh).unwrap(), b"pay 200");
    // The same datagram from another address is no session's.
    assert!(b.open(now, addr(9), &fresh).is_none());
    let s = b.counters().stats(&b.identity());
    // A flipped nonce bit may name a nonce already seen: then it counts
    // as a replay; every other flip as a forgery.
    assert!(s.replayed >= 1, "{s:?}");
    assert_eq!(s.replayed - 1 + s.forged, flips, "{s:?}");
    assert!(s.unknown_session >= 1, "{s:?}");
}

#[test]
fn out_of_order_within_the_window_is_taken_once_and_older_is_refused() {
    let now = Instant::now();
    let mut a = node(Some("k"), vec![], generate_identity().0);
    let mut b = node(Some("k"), vec![], generate_identity().0);
    let _ = wire(&mut a, now, b"x");
    exchange(&mut a, &mut b, now);
    let ds: Vec<Vec<u8>> = (0..WINDOW as usize + 10)
        .map(|i| wire(&mut a, now, format!("{i}").as_bytes()).remove(0))
        .collect();
    let last = ds.len() - 1;
    assert!(b.open(now, addr(1), &ds[last]).is_some());
    // Within the window, out of order: taken, once.
    assert!(b.open(now, addr(1), &ds[last - 5]).is_some());
    assert!(b.open(now, addr(1), &ds[last - 5]).is_none());
    // Older than the window: refused as a replay.
    assert!(b.open(now, addr(1), &ds[2]).is_none());
    assert_eq!(b.counters().stats(&b.identity()).replayed, 2);
}

#[test]
fn a_node_without_the_secret_or_trust_gets_no_session() {
    let now = Instant::now();
    let mut a = node(Some("right"), vec![], generate_identity().0);
    let mut m = node(Some("wrong"), vec![], generate_identity().0);
    let _ = wire(&mut m, now, b"inject");
    let (to_m, to_a) = exchange(&mut m, &mut a, now);
    assert!(to_m.is_empty() && to_a.is_empty());
    // The initiator cannot tell (the pre-shared key is proven in its last
    // message), but nothing it seals opens at `a`.
    for d in wire(&mut m, now, b"again") {
        assert!(a.open(now, addr(1), &d).is_none());
    }
    assert!(a.counters().stats(&a.identity()).bad_handshakes >= 1);

    // Trusted keys: a peer not listed is refused after the handshake.
    let (pa, pb, pm) = (
        generate_identity().0,
        generate_identity().0,
        generate_identity().0,
    );
    let trust = vec![public_of(&pa), public_of(&pb)];
    let mut a = node(None, trust.clone(), pa);
    let mut b = node(None, trust.clone(), pb);
    let mut m = node(None, trust, pm);
    let _ = wire(&mut a, now, b"hi");
    let (_, to_b) = exchange(&mut a, &mut b, now);
    assert_eq!(to_b, vec![b"hi".to_vec()]);
    let _ = wire(&mut m, now, b"inject");
    let (_, to_a) = exchange(&mut m, &mut a, now);
    assert!(to_a.is_empty());
    for d in wire(&mut m, now, b"again") {
        assert!(a.open(now, addr(1), &d).is_none());
    }
    assert!(a.counters().stats(&a.identity()).untrusted >= 1);
}

#[test]
fn plain_datagrams_and_garbage_are_dropped_without_panic() {
    let now = Instant::now();
    let mut a = node(Some("k"), vec![], generate_identity().0);
    let mut plain = b"SM\x01\x06\0\0\0\0".to_vec();
    plain.extend_from_slice(&[0; 20]);
    assert!(a.open(now, addr(1), &plain).is_none());
    assert!(is_plain_hello(b"SM\x01\x07\0\0\0\0"));
    assert!(!is_plain_hello(&plain));
    for len in 0..80 {
        for t in 0..6u8 {
            let mut d = b"SX\x01".to_vec();
            d.push(t);
            d.extend((0..len).map(|i| i as u8));
            let _ = a.open(now, addr(3), &d);
        }
    }
    assert!(a.counters().stats(&a.identity()).plain >= 1);
}

#[test]
fn the_identity_file_is_made_once_and_kept() {
    let dir = std::env::temp_dir().join(format!("skiff-seal-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("mesh.key");
    let _ = std::fs::remove_file(&p);
    let k1 = load_identity(&p).unwrap();
    let k2 = load_identity(&p).unwrap();
    assert_eq!(k1, k2);
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
        0o600
    );
    std::fs::write(&p, "not a key").unwrap();
    let e = load_identity(&p).unwrap_err().to_string();
    assert!(e.contains("mesh.key"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}
