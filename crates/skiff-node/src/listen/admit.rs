//! Admission of TCP connections before any handshake: at most
//! `max_connection_rate` new connections per second (a token bucket of
//! one second's worth) and at most `max_connections_per_ip` open at once
//! from one source address. A refused connection is closed at once, with
//! an error frame when the listener is plaintext, and counted as a limit
//! reached (`limit_hits`); it costs the node no TLS or argon2 work.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;

use crate::config::Limits;

/// The admission state of one listener.
#[derive(Debug)]
pub(crate) struct Admission {
    per_ip: usize,
    rate: u32,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    open: HashMap<IpAddr, usize>,
    tokens: f64,
    last: Instant,
}

/// An admitted connection's place in the per-address count, given back
/// when it is dropped.
#[derive(Debug)]
pub(crate) struct Ticket {
    admission: Arc<Admission>,
    ip: IpAddr,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut st = self.admission.state.lock();
        if let Some(n) = st.open.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                st.open.remove(&self.ip);
            }
        }
    }
}

impl Admission {
    pub(crate) fn new(limits: &Limits) -> Arc<Admission> {
        Arc::new(Admission {
            per_ip: limits.max_connections_per_ip,
            rate: limits.max_connection_rate,
            state: Mutex::new(State {
                open: HashMap::new(),
                tokens: f64::from(limits.max_connection_rate),
                last: Instant::now(),
            }),
        })
    }

    /// Admits a connection from `ip` now, or says which limit refuses it.
    pub(crate) fn admit(self: &Arc<Self>, ip: IpAddr) -> Result<Ticket, String> {
        let mut st = self.state.lock();
        if self.rate > 0 {
            let now = Instant::now();
            let rate = f64::from(self.rate);
            st.tokens = (st.tokens + now.duration_since(st.last).as_secs_f64() * rate).min(rate);
            st.last = now;
            if st.tokens < 1.0 {
                return Err(format!(
                    "the node accepts at most {} connections per second (max_connection_rate); try again",
                    self.rate
                ));
            }
            st.tokens -= 1.0;
        }
        let n = st.open.entry(ip).or_insert(0);
        if self.per_ip > 0 && *n >= self.per_ip {
            return Err(format!(
                "{ip} already has {} connections to this node (max_connections_per_ip)",
                self.per_ip
            ));
        }
        *n += 1;
        drop(st);
        Ok(Ticket {
            admission: self.clone(),
            ip,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_address_counts_come_back_and_the_rate_is_a_bucket() {
        let l = Limits {
            max_connections_per_ip: 2,
            max_connection_rate: 3,
            ..Limits::default()
        };
        let a = Admission::new(&l);
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let other: IpAddr = "10.0.0.2".parse().unwrap();
        let t1 = a.admit(ip).unwrap();
        let _t2 = a.admit(ip).unwrap();
        let e = a.admit(ip).unwrap_err();
        assert!(e.contains("max_connections_per_ip"), "{e}");
        drop(t1);
        // The refused attempt spent the last token of this second.
        let e = a.admit(other).unwrap_err();
        assert!(e.contains("max_connection_rate"), "{e}");
        std::thread::sleep(std::time::Duration::from_millis(400));
        let _t3 = a.admit(ip).unwrap();
    }
}
