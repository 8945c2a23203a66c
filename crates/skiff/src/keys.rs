//! Ed25519 keys as text, for authenticating to a node without sending a
//! secret (`?key=FILE`): the client signs the node's nonce with its
//! private key, the node checks the signature with the public key in its
//! configuration.
//!
//! Accepted forms (surrounding whitespace ignored):
//! - a private key (seed, 32 bytes): base64 (standard or URL alphabet), 64
//!   hex digits, or a NATS user seed (`SU…`);
//! - a public key (32 bytes): base64, 64 hex digits, or a NATS user nkey
//!   (`U…`).
//!
//! NATS keys are base32 (RFC 4648, no padding) of a prefix, the key and a
//! CRC-16/XMODEM (checked). No cryptography is done here beyond calling
//! `ed25519-dalek`.

use base64::Engine;

/// A NATS user nkey's prefix byte (`U`).
const NKEY_USER: u8 = 20 << 3;
/// A NATS seed's prefix byte (`S`).
const NKEY_SEED: u8 = 18 << 3;

/// RFC 4648 base32 (upper case, no padding) to bytes; `None` for a
/// character outside the alphabet.
fn base32_decode(s: &str) -> Option<Vec<u8>> {
    let mut raw = Vec::with_capacity(s.len() * 5 / 8);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in s.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'2'..=b'7' => c - b'2' + 26,
            _ => return None,
        };
        acc = (acc << 5) | u32::from(v);
        bits += 5;
        if bits >= 8 {
            bits -= 8;
            raw.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(raw)
}

fn base32_encode(data: &[u8]) -> String {
    const A: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let mut out = String::with_capacity(data.len().div_ceil(5) * 8);
    let (mut acc, mut bits) = (0u32, 0u32);
    for &b in data {
        acc = (acc << 8) | u32::from(b);
        bits += 8;
        while bits >= 5 {
            bits -= 5;
            out.push(A[((acc >> bits) & 31) as usize] as char);
        }
        acc &= (1 << bits) - 1;
    }
    if bits > 0 {
        out.push(A[((acc << (5 - bits)) & 31) as usize] as char);
    }
    out
}

/// CRC-16/XMODEM, as NATS keys carry.
fn crc16(data: &[u8]) -> u16 {
    let mut crc = 0u16;
    for &b in data {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// Bytes from `raw` with its trailing CRC checked and removed.
fn checked(raw: Vec<u8>) -> Option<Vec<u8>> {
    let n = raw.len().checked_sub(2)?;
    let crc = u16::from_le_bytes([raw[n], raw[n + 1]]);
    (crc16(&raw[..n]) == crc).then(|| raw[..n].to_vec())
}

fn hex32(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 || !s.is_ascii() {
        return None;
    }
    let mut k = [0u8; 32];
    for (i, k) in k.iter_mut().enumerate() {
        *k = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(k)
}

fn base64_32(s: &str) -> Option<[u8; 32]> {
    use base64::engine::{general_purpose::GeneralPurpose, DecodePaddingMode};
    let cfg = base64::engine::GeneralPurposeConfig::new()
        .with_decode_padding_mode(DecodePaddingMode::Indifferent);
    let std = GeneralPurpose::new(&base64::alphabet::STANDARD, cfg);
    let url = GeneralPurpose::new(&base64::alphabet::URL_SAFE, cfg);
    let v = std.decode(s).or_else(|_| url.decode(s)).ok()?;
    v.try_into().ok()
}

/// Parses a public key (see the module documentation).
pub fn parse_public(s: &str) -> Option<[u8; 32]> {
    let s = s.trim();
    if s.len() > 128 {
        return None;
    }
    if s.len() == 56 && s.starts_with('U') {
        let raw = checked(base32_decode(s)?)?;
        return (raw.len() == 33 && raw[0] == NKEY_USER)
            .then(|| raw[1..].try_into().ok())
            .flatten();
    }
    hex32(s).or_else(|| base64_32(s))
}

/// Parses a private key's seed (see the module documentation).
pub fn parse_seed(s: &str) -> Option<[u8; 32]> {
    let s = s.trim();
    if s.len() > 128 {
        return None;
    }
    if s.len() == 58 && s.starts_with('S') {
        let raw = checked(base32_decode(s)?)?;
        let ok = raw.len() == 34
            && raw[0] & 0xf8 == NKEY_SEED
            && ((raw[0] & 7) << 5 | (raw[1] >> 3)) == NKEY_USER;
        return ok.then(|| raw[2..].try_into().ok()).flatten();
    }
    hex32(s).or_else(|| base64_32(s))
}

/// A NATS user nkey (`U…`) for a public key.
pub fn nkey_public(key: &[u8; 32]) -> String {
    let mut raw = vec![NKEY_USER];
    raw.extend_from_slice(key);
    let crc = crc16(&raw);
    raw.extend_from_slice(&crc.to_le_bytes());
    base32_encode(&raw)
}

/// The public key of a seed.
pub fn public_of(seed: &[u8; 32]) -> [u8; 32] {
    ed25519_dalek::SigningKey::from_bytes(seed)
        .verifying_key()
        .to_bytes()
}

/// Signs `msg` with the key of `seed`.
pub fn sign(seed: &[u8; 32], msg: &[u8]) -> [u8; 64] {
    use ed25519_dalek::Signer;
    ed25519_dalek::SigningKey::from_bytes(seed)
        .sign(msg)
        .to_bytes()
}

/// A fresh private key's seed, from the OS's generator.
pub fn generate_seed() -> std::io::Result<[u8; 32]> {
    let mut s = [0u8; 32];
    getrandom::fill(&mut s).map_err(|e| std::io::Error::other(e.to_string()))?;
    Ok(s)
}

/// A seed as text (base64), for a key file.
pub fn seed_text(seed: &[u8; 32]) -> String {
    base64::engine::general_purpose::STANDARD.encode(seed)
}

/// A public key as text (base64), for the node's configuration.
pub fn public_text(key: &[u8; 32]) -> String {
    base64::engine::general_purpose::STANDARD.encode(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nats_seed_gives_its_nkey() {
        // The user from nats-server's documentation example.
        let seed =
            parse_seed("SUACSSL3UAHUDXKFSNVUZRF5UHPMWZ6BFDTJ7M6USDXIEDNPPQYYYCU3VY").unwrap();
        let public = "UDXU4RCSJNZOIQHZNWXHXORDPRTGNJAHAHFRGZNEEJCPQTT2M7NLCNF4";
        assert_eq!(nkey_public(&public_of(&seed)), public);
        assert_eq!(parse_public(public), Some(public_of(&seed)));
        assert!(parse_seed("SUACSSL3UAHUDXKFSNVUZRF5UHPMWZ6BFDTJ7M6USDXIEDNPPQYYZCU3VY").is_none());
    }

    #[test]
    fn text_forms_round_trip_and_bad_input_is_none() {
        let seed = [3u8; 32];
        assert_eq!(parse_seed(&seed_text(&seed)), Some(seed));
        let pk = public_of(&seed);
        assert_eq!(parse_public(&public_text(&pk)), Some(pk));
        let hex: String = pk.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(parse_public(&hex), Some(pk));
        for bad in ["", "x", "U", &"A".repeat(500), "ééé", &"é".repeat(32)] {
            assert!(
                parse_public(bad).is_none() && parse_seed(bad).is_none(),
                "{bad}"
            );
        }
        let sig = sign(&seed, b"nonce");
        use ed25519_dalek::Verifier;
        let vk = ed25519_dalek::VerifyingKey::from_bytes(&pk).unwrap();
        assert!(vk
            .verify(b"nonce", &ed25519_dalek::Signature::from_bytes(&sig))
            .is_ok());
    }
}
