//! Ed25519 public keys from the configuration: base64, hex, or a NATS user
//! nkey (base32 with a CRC-16).

use std::fmt;

use serde::{Deserialize, Deserializer};

/// An Ed25519 public key read from the configuration: 32 bytes as base64
/// (standard or URL alphabet, padded or not), as 64 hex digits, or as a
/// NATS user nkey (`U…`, base32 with a CRC-16).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct PublicKey(pub [u8; 32]);

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use base64::Engine;
        write!(
            f,
            "PublicKey({})",
            base64::engine::general_purpose::STANDARD.encode(self.0)
        )
    }
}

impl PublicKey {
    /// Parses one of the forms above.
    pub fn parse(s: &str) -> Option<PublicKey> {
        use base64::Engine;
        let s = s.trim();
        if s.len() > 128 {
            return None;
        }
        if s.len() == 56 && s.starts_with('U') {
            return decode_nkey(s, NKEY_USER).map(PublicKey);
        }
        if s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit()) {
            let mut k = [0u8; 32];
            for (i, k) in k.iter_mut().enumerate() {
                *k = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
            }
            return Some(PublicKey(k));
        }
        let e = &base64::engine::general_purpose::GeneralPurpose::new(
            &base64::alphabet::STANDARD,
            base64::engine::GeneralPurposeConfig::new()
                .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
        );
        let u = &base64::engine::general_purpose::GeneralPurpose::new(
            &base64::alphabet::URL_SAFE,
            base64::engine::GeneralPurposeConfig::new()
                .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
        );
        let v = e.decode(s).or_else(|_| u.decode(s)).ok()?;
        Some(PublicKey(v.try_into().ok()?))
    }
}

impl<'de> Deserialize<'de> for PublicKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        PublicKey::parse(&s).ok_or_else(|| {
            serde::de::Error::custom(
                "an Ed25519 public key: 32 bytes as base64 or hex, or a NATS user nkey (U…)",
            )
        })
    }
}

/// The first byte of a NATS user nkey's payload (`'U'` in base32).
const NKEY_USER: u8 = 20 << 3;

/// Decodes a NATS nkey (RFC 4648 base32 without padding of one prefix
/// byte, the 32-byte key and a little-endian CRC-16/XMODEM) with prefix
/// byte `prefix`.
pub fn decode_nkey(s: &str, prefix: u8) -> Option<[u8; 32]> {
    let raw = base32_decode(s)?;
    if raw.len() != 35 || raw[0] != prefix {
        return None;
    }
    let crc = u16::from_le_bytes([raw[33], raw[34]]);
    if crc16(&raw[..33]) != crc {
        return None;
    }
    raw[1..33].try_into().ok()
}

/// RFC 4648 base32 (upper case, no padding) to bytes; `None` for a
/// character outside the alphabet. Bounded by the caller's length check.
pub(super) fn base32_decode(s: &str) -> Option<Vec<u8>> {
    let mut raw = Vec::with_capacity(s.len() * 5 / 8);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in s.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'2'..=b'7' => c - b'2' + 26,
            _ => return None,
        };
        acc = (acc << 5) | v as u32;
        bits += 5;
        if bits >= 8 {
            bits -= 8;
            raw.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(raw)
}

/// CRC-16/XMODEM, as nkeys use.
pub(super) fn crc16(data: &[u8]) -> u16 {
    let mut crc = 0u16;
    for &b in data {
        crc ^= (b as u16) << 8;
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
