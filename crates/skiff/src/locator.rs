//! Locator strings: `scheme://address?option=value&…` (cMsg's UDL). The
//! locator picks the transport at run time, so code does not change when the
//! transport does.
//!
//! This module only parses; each object ([`crate::Queue`], …) checks the
//! scheme and options it accepts with [`Locator::options`] so that an error
//! names the bad part and the accepted values.

use std::net::{SocketAddr, ToSocketAddrs};
use std::str::FromStr;
use std::time::Duration;

use crate::error::LocatorError;

/// The default port of a skiff node (TCP and UDP).
pub const DEFAULT_PORT: u16 = 4747;

/// A parsed locator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Locator {
    /// The scheme, lowercase: `udp`, `tcp`, `mem`, `shm`, `skiff`, `file`.
    pub scheme: String,
    /// Everything between `://` and `?`.
    pub address: String,
    /// Options in the order given.
    pub options: Vec<(String, String)>,
}

impl FromStr for Locator {
    type Err = LocatorError;

    fn from_str(s: &str) -> Result<Locator, LocatorError> {
        let (scheme, rest) = s
            .split_once("://")
            .ok_or_else(|| LocatorError::NoScheme(s.to_string()))?;
        if scheme.is_empty()
            || !scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '+' || c == '-')
        {
            return Err(LocatorError::NoScheme(s.to_string()));
        }
        let (address, query) = match rest.split_once('?') {
            Some((a, q)) => (a, Some(q)),
            None => (rest, None),
        };
        let mut options = Vec::new();
        for pair in query
            .into_iter()
            .flat_map(|q| q.split('&'))
            .filter(|p| !p.is_empty())
        {
            let (k, v) = pair.split_once('=').unwrap_or((pair, "true"));
            options.push((k.to_string(), v.to_string()));
        }
        Ok(Locator {
            scheme: scheme.to_ascii_lowercase(),
            address: address.to_string(),
            options,
        })
    }
}

impl Locator {
    /// Fails unless the scheme is one of `accepted` (a comma-separated list
    /// used verbatim in the error).
    pub fn expect_scheme(&self, accepted: &'static str) -> Result<(), LocatorError> {
        if accepted.split(", ").any(|a| a == self.scheme) {
            Ok(())
        } else {
            Err(LocatorError::Scheme {
                scheme: self.scheme.clone(),
                accepted,
            })
        }
    }

    /// The address as one socket address, resolving host names; a missing
    /// port means [`DEFAULT_PORT`].
    pub fn socket_addr(&self) -> Result<SocketAddr, LocatorError> {
        resolve(&self.address)
    }

    /// Walks the options, handing each to `f`; fails on the first one `f`
    /// does not know (it returns `Ok(false)`), naming `accepted`.
    pub fn options(
        &self,
        accepted: &'static str,
        mut f: impl FnMut(&str, &str) -> Result<bool, LocatorError>,
    ) -> Result<(), LocatorError> {
        for (k, v) in &self.options {
            if !f(k, v)? {
                return Err(LocatorError::UnknownOption {
                    name: k.clone(),
                    accepted,
                });
            }
        }
        Ok(())
    }
}

/// Resolves `host:port` (or `host`, meaning [`DEFAULT_PORT`]) to one address.
pub fn resolve(addr: &str) -> Result<SocketAddr, LocatorError> {
    let bad = |why: &str| LocatorError::Address {
        addr: addr.to_string(),
        why: why.to_string(),
    };
    if addr.is_empty() {
        return Err(bad("empty address"));
    }
    if let Ok(a) = addr.parse::<SocketAddr>() {
        return Ok(a);
    }
    // Add the default port where none is given: a bare IPv6 address, a
    // bracketed one, or a name or IPv4 address without a colon.
    let with_port = if addr.parse::<std::net::Ipv6Addr>().is_ok() {
        format!("[{addr}]:{DEFAULT_PORT}")
    } else if (addr.starts_with('[') && addr.ends_with(']')) || !addr.contains(':') {
        format!("{addr}:{DEFAULT_PORT}")
    } else {
        addr.to_string()
    };
    if let Some((_, port)) = with_port.rsplit_once(':') {
        port.parse::<u16>()
            .map_err(|_| bad("the port is not a number from 0 to 65535"))?;
    }
    with_port
        .to_socket_addrs()
        .map_err(|e| bad(&e.to_string()))?
        .next()
        .ok_or_else(|| bad("the name resolved to no address"))
}

/// Parses a byte count: `512`, `64k`/`64KiB`, `4m`/`4MiB`, `1g`/`1GiB`.
pub fn parse_bytes(name: &str, value: &str) -> Result<usize, LocatorError> {
    let bad = || LocatorError::BadValue {
        name: name.to_string(),
        value: value.to_string(),
        expected: "a byte count such as 512, 64k, 4m or 1g",
    };
    let v = value.trim().to_ascii_lowercase();
    let (num, mult) = if let Some(n) = v.strip_suffix("kib").or_else(|| v.strip_suffix('k')) {
        (n, 1 << 10)
    } else if let Some(n) = v.strip_suffix("mib").or_else(|| v.strip_suffix('m')) {
        (n, 1 << 20)
    } else if let Some(n) = v.strip_suffix("gib").or_else(|| v.strip_suffix('g')) {
        (n, 1 << 30)
    } else {
        (v.strip_suffix('b').unwrap_or(&v), 1)
    };
    num.parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(bad)
}

/// Parses a duration, the one syntax of every skiff flag and locator
/// option: a number with a unit (`50us`, `200ms`, `1.5s`, `2m`) or a bare
/// number of seconds (`0`, `0.5`, `3`).
pub fn parse_duration(name: &str, value: &str) -> Result<Duration, LocatorError> {
    let bad = || LocatorError::BadValue {
        name: name.to_string(),
        value: value.to_string(),
        expected: "a duration such as 0.5 (seconds), 50us, 200ms or 1s",
    };
    let v = value.trim();
    let (num, unit) = match v.find(|c: char| !c.is_ascii_digit() && c != '.') {
        Some(split) => v.split_at(split),
        None => (v, "s"),
    };
    // Digits and dots only: `f64::from_str` alone would take `inf` or `1e9`.
    if num.is_empty() || !num.bytes().any(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let n: f64 = num.parse().map_err(|_| bad())?;
    let secs = match unit {
        "ns" => n / 1e9,
        "us" | "µs" => n / 1e6,
        "ms" => n / 1e3,
        "s" => n,
        "m" | "min" => n * 60.0,
        _ => return Err(bad()),
    };
    if !secs.is_finite() || !(0.0..=86_400.0 * 365.0).contains(&secs) {
        return Err(bad());
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Parses a boolean: `true`/`false`/`1`/`0`/`yes`/`no`/`on`/`off`.
pub fn parse_bool(name: &str, value: &str) -> Result<bool, LocatorError> {
    match value.to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        _ => Err(LocatorError::BadValue {
            name: name.to_string(),
            value: value.to_string(),
            expected: "true or false",
        }),
    }
}

/// Parses an unsigned integer that fits `T`.
pub fn parse_uint<T: FromStr>(
    name: &str,
    value: &str,
    expected: &'static str,
) -> Result<T, LocatorError> {
    value
        .trim()
        .parse::<T>()
        .map_err(|_| LocatorError::BadValue {
            name: name.to_string(),
            value: value.to_string(),
            expected,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_scheme_address_and_options() {
        let l: Locator = "udp://0.0.0.0:4711?qthresh=512&timeout=200ms&reliable"
            .parse()
            .unwrap();
        assert_eq!(l.scheme, "udp");
        assert_eq!(l.address, "0.0.0.0:4711");
        assert_eq!(
            l.options,
            vec![
                ("qthresh".into(), "512".into()),
                ("timeout".into(), "200ms".into()),
                ("reliable".into(), "true".into())
            ]
        );
        assert_eq!(l.socket_addr().unwrap(), "0.0.0.0:4711".parse().unwrap());
    }

    #[test]
    fn resolves_addresses() {
        assert_eq!(resolve("[::1]:9").unwrap(), "[::1]:9".parse().unwrap());
        assert_eq!(resolve("::1").unwrap(), "[::1]:4747".parse().unwrap());
        assert_eq!(
            resolve("127.0.0.1").unwrap(),
            "127.0.0.1:4747".parse().unwrap()
        );
        assert_eq!(resolve("localhost:80").unwrap().port(), 80);
        for bad in [
            "",
            "127.0.0.1:99999",
            "127.0.0.1:x",
            "no such host.invalid:1",
        ] {
            let e = resolve(bad).unwrap_err();
            assert!(matches!(e, LocatorError::Address { .. }), "{bad}: {e}");
        }
    }

    #[test]
    fn errors_name_the_bad_part() {
        let e = "0.0.0.0:1".parse::<Locator>().unwrap_err();
        assert!(e.to_string().contains("no scheme"), "{e}");
        let l: Locator = "ftp://x".parse().unwrap();
        let e = l.expect_scheme("udp").unwrap_err().to_string();
        assert!(e.contains("ftp") && e.contains("accepted: udp"), "{e}");
        let l: Locator = "udp://x?color=red".parse().unwrap();
        let e = l
            .options("qthresh, timeout", |_, _| Ok(false))
            .unwrap_err()
            .to_string();
        assert!(e.contains("color") && e.contains("qthresh, timeout"), "{e}");
        let e = parse_bytes("qthresh", "lots").unwrap_err().to_string();
        assert!(
            e.contains("qthresh") && e.contains("lots") && e.contains("byte count"),
            "{e}"
        );
    }

    #[test]
    fn parses_values() {
        assert_eq!(parse_bytes("x", "512").unwrap(), 512);
        assert_eq!(parse_bytes("x", "64k").unwrap(), 65536);
        assert_eq!(parse_bytes("x", "4MiB").unwrap(), 4 << 20);
        assert!(parse_bytes("x", "-1").is_err());
        assert!(parse_bytes("x", "99999999999999999999k").is_err());
        assert_eq!(parse_duration("t", "0").unwrap(), Duration::ZERO);
        assert_eq!(
            parse_duration("t", "200ms").unwrap(),
            Duration::from_millis(200)
        );
        assert_eq!(
            parse_duration("t", "50us").unwrap(),
            Duration::from_micros(50)
        );
        assert_eq!(
            parse_duration("t", "1.5s").unwrap(),
            Duration::from_millis(1500)
        );
        assert_eq!(
            parse_duration("t", "0.5").unwrap(),
            Duration::from_millis(500)
        );
        assert_eq!(parse_duration("t", "3").unwrap(), Duration::from_secs(3));
        for bad in [
            "", "ms", ".", "5h", "-3ms", "1e400s", "NaNs", "inf", "1e3", "1.2.3s",
        ] {
            assert!(parse_duration("t", bad).is_err(), "{bad}");
        }
        assert!(parse_bool("b", "yes").unwrap());
        assert!(parse_bool("b", "maybe").is_err());
    }
}
