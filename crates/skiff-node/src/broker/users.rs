//! Who the clients are while the node runs: the users swapped by a reload
//! ([`Broker::set_auth`]), a client's user set after it attached
//! ([`Broker::set_user`], the NATS listener's `CONNECT`), and the name a
//! client gives itself ([`Broker::set_name`]).
//!
//! Locks: the routing lock alone, then (released) each client's outbox
//! through [`Broker::detach`] and [`Broker::unsubscribe`], as everywhere
//! in the broker; never a mesh lock.

use std::sync::Arc;

use skiff_proto::client_frame::{Code, ServerFrame};

use super::Broker;
use crate::auth::{Auth, Fate, User};
use crate::outbox::ClientOut;

/// Longest client name kept, in bytes (longer ones are cut at a
/// character boundary).
pub const MAX_CLIENT_NAME: usize = skiff_proto::client_frame::MAX_CLIENT_NAME;

/// What [`Broker::set_auth`] did to the clients.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct AuthSwap {
    /// Clients disconnected (their user was removed or its credentials
    /// changed, or the node now requires authentication).
    pub cut: usize,
    /// Clients whose permissions changed.
    pub updated: usize,
    /// Subscriptions ended because the new permissions refuse them.
    pub revoked: usize,
}

impl Broker {
    /// Puts `auth` in force (a reload): new connections authenticate
    /// against it; each connected client (but the node's own) is kept,
    /// given its user's new permissions, or cut with an error naming why
    /// (see [`Auth::fate`]); a subscription the new permissions refuse is
    /// ended and its client told with a [`Code::Denied`] error carrying
    /// the subscription's id.
    pub fn set_auth(&self, auth: Arc<Auth>) -> AuthSwap {
        self.auth.store(auth.clone());
        let mut cut = Vec::new();
        let mut revoke: Vec<(Arc<ClientOut>, u64, String)> = Vec::new();
        let mut done = AuthSwap::default();
        {
            let mut st = self.state.lock();
            for (&id, c) in st.clients.iter_mut() {
                if c.trusted {
                    continue;
                }
                match auth.fate(&c.user) {
                    Fate::Keep => {}
                    Fate::Cut(why) => cut.push((id, c.peer.clone(), c.user.name.clone(), why)),
                    Fate::Update(u) => {
                        done.updated += 1;
                        c.user = u.clone();
                        c.out.set_user(&u);
                        for (&sid, (_, _, pattern, _, (syntax, _))) in &c.sids {
                            if !u.permissions.may_subscribe_as(*syntax, pattern) {
                                revoke.push((c.out.clone(), sid, pattern.clone()));
                            }
                        }
                    }
                }
            }
        }
        for (out, sid, pattern) in revoke {
            self.unsubscribe(&out, sid);
            let user = out.user().name.clone();
            tracing::info!(client = out.id, sid, pattern = %pattern, user = %user, "subscription ended: the reloaded permissions refuse it");
            out.control(ServerFrame::Error {
                corr: sid,
                code: Code::Denied,
                text: format!(
                    "permission denied: user `{user}` may no longer subscribe to `{pattern}` (the node's configuration was reloaded); the subscription ended"
                ),
            });
            done.revoked += 1;
        }
        done.cut = cut.len();
        for (id, peer, user, why) in cut {
            tracing::warn!(client = id, peer = %peer, user = %user, reason = %why, "client disconnected by a reload of the users");
            self.detach(id, Some((Code::Auth, why)));
        }
        done
    }

    /// Sets the user of client `out`, authenticated after it attached (a
    /// NATS client's `CONNECT`). `Err` with the reason when the users
    /// in force no longer know it (a reload came between): the caller
    /// closes the client.
    pub fn set_user(&self, out: &Arc<ClientOut>, user: Arc<User>) -> Result<(), String> {
        let mut st = self.state.lock();
        let user = match self.auth.load().fate(&user) {
            Fate::Keep => user,
            Fate::Update(u) => u,
            Fate::Cut(why) => return Err(why),
        };
        if let Some(c) = st.clients.get_mut(&out.id) {
            c.user = user.clone();
        }
        out.set_user(&user);
        Ok(())
    }

    /// Sets the name client `id` gave itself, for `/connz` and stats:
    /// control characters are replaced and it is cut to
    /// [`MAX_CLIENT_NAME`] bytes; an empty name clears it.
    pub fn set_name(&self, id: u64, name: &str) {
        let name = clean_name(name);
        if let Some(c) = self.state.lock().clients.get_mut(&id) {
            c.name = (!name.is_empty()).then_some(name);
        }
    }
}

/// `name` with control characters replaced by `?`, cut to
/// [`MAX_CLIENT_NAME`] bytes at a character boundary.
pub(crate) fn clean_name(name: &str) -> String {
    let mut s = String::new();
    for ch in name.chars() {
        let ch = if ch.is_control() { '?' } else { ch };
        if s.len() + ch.len_utf8() > MAX_CLIENT_NAME {
            break;
        }
        s.push(ch);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_cleaned_and_bounded() {
        assert_eq!(clean_name("a\nb"), "a?b");
        let long = "é".repeat(MAX_CLIENT_NAME);
        let c = clean_name(&long);
        assert!(c.len() <= MAX_CLIENT_NAME && c.len() >= MAX_CLIENT_NAME - 1);
    }
}
