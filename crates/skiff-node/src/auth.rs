//! Who a client is and what it may do: the node's users, checked the same
//! way for every front end (the skiff client protocol over TCP, TLS, Unix
//! sockets and shared memory, and protocol listeners such as NATS).
//!
//! It owns no socket and no clock. A front end collects a client's
//! [`Credentials`] in its own protocol, calls [`Auth::verify`] with the
//! nonce it sent that client, and from then on asks the [`User`]'s
//! [`Permissions`] before each publish, subscription, reply and join.
//!
//! Configured in the node's TOML (`[auth]`, see [`AuthConfig`]):
//! ```toml
//! [auth]
//! token = "s3cret"                 # anyone with it is user "token", with every permission
//! timeout_ms = 2000                # a client must have authenticated by then
//! [[auth.users]]
//! name = "alice"
//! password_hash = "$argon2id$v=19$m=19456,t=2,p=1$…"   # `skiff passwd` prints one
//! [auth.users.permissions]
//! publish = { allow = ["orders.>"] }
//! subscribe = { allow = ["orders.>", "status.*"], deny = ["orders.secret.>"] }
//! allow_responses = false
//! join = { allow = [] }
//! [[auth.users]]
//! name = "svc"
//! public_key = "Ed25519 public key: 32 bytes as base64, hex, or a NATS user nkey (U…)"
//! [[auth.users]]
//! name = "local-apps"
//! uid = 1000                       # Unix socket / shm peers running as uid 1000 (SO_PEERCRED)
//! ```
//!
//! Promises:
//! - **Secrets compared in constant time**: a token through SHA-256 digests
//!   compared with `subtle`; a password by argon2's verification; a key by
//!   an Ed25519 signature over the node's nonce (`verify_strict`), so no
//!   secret crosses the wire. An unknown user name costs the same argon2
//!   work as a known one.
//! - **One answer for every failure** ([`AuthError`]): it does not say
//!   whether the user, the password, the token or the key was wrong.
//!   Failures are counted ([`Auth::failures`]).
//! - **Secrets never printed**: [`Secret`] and the configuration's `Debug`
//!   hide them.
//! - **Hostile input is bounded**: credentials longer than
//!   [`MAX_CREDENTIAL`] are refused before any hashing; permission lists
//!   are checked when the configuration is read (a bad pattern stops the
//!   node with the file and line).
//!
//! With no `[auth]` (no token, no users) every client is [`User::anonymous`]
//! with every permission, as before authentication existed.
//!
//! A reload builds the users again ([`Auth::rebuild`]) and the broker puts
//! them in force whole; [`Auth::fate`] says what becomes of each client
//! connected under the old ones (kept, given new permissions, or cut).

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use serde::{Deserialize, Deserializer};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

mod keys;
mod permissions;
pub use keys::{decode_nkey, PublicKey};
pub use permissions::{covers, overlaps, PatternText, Permissions, Rule};

/// Longest token, user name, password or key accepted from a client, in
/// bytes: longer input is refused before any work is done on it.
pub const MAX_CREDENTIAL: usize = 1024;

/// Bytes of the nonce a node sends each client to sign.
pub const NONCE_LEN: usize = 32;

/// Default time a client has to authenticate, in ms.
pub const DEFAULT_TIMEOUT_MS: u64 = 5_000;

/// A secret (token, password): kept as given, never shown by `Debug`.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps `s`.
    pub fn new(s: impl Into<String>) -> Secret {
        Secret(s.into())
    }

    /// The secret itself: for comparing and hashing only, never for printing.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        if s.is_empty() || s.len() > MAX_CREDENTIAL {
            return Err(serde::de::Error::custom(format!(
                "a secret of 1 to {MAX_CREDENTIAL} bytes"
            )));
        }
        Ok(Secret(s))
    }
}

/// What a client presents to prove who it is, decoded by its front end.
#[derive(Clone, PartialEq, Eq)]
pub enum Credentials {
    /// Nothing: allowed only when the node has no authentication.
    None,
    /// The node's shared token (`?token=`).
    Token(Secret),
    /// A user name and password (`?user=&password=`).
    Password {
        /// The user's name.
        user: String,
        /// The password, checked against the configured argon2 hash.
        password: Secret,
    },
    /// An Ed25519 public key and its signature over the nonce the node
    /// sent (`?key=FILE`, NATS nkeys): no secret crosses the wire.
    Signature {
        /// The key, 32 bytes.
        public_key: [u8; 32],
        /// The signature over the nonce, 64 bytes.
        signature: [u8; 64],
    },
    /// What the kernel says about a local peer (`SO_PEERCRED` on a Unix
    /// socket, or the owner of a shared-memory attachment): never taken
    /// from the client's own words.
    Local {
        /// The peer's user id.
        uid: u32,
        /// The peer's group id.
        gid: u32,
    },
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Credentials::None => f.write_str("None"),
            Credentials::Token(_) => f.write_str("Token(***)"),
            Credentials::Password { user, .. } => write!(f, "Password {{ user: {user:?}, .. }}"),
            Credentials::Signature { .. } => f.write_str("Signature { .. }"),
            Credentials::Local { uid, gid } => write!(f, "Local {{ uid: {uid}, gid: {gid} }}"),
        }
    }
}

/// Why a client was not let in. `Display` is the one sentence a client is
/// told: it never says which part of its credentials was wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AuthError {
    /// The credentials (or their absence) are not accepted.
    #[error("authentication failed: the node did not accept these credentials")]
    Refused,
}

/// Counts of operations refused to one user, per kind of operation (in
/// `skiff stats`).
#[derive(Debug, Default)]
pub struct Denials {
    /// Publishes refused.
    pub publish: AtomicU64,
    /// Subscriptions refused.
    pub subscribe: AtomicU64,
    /// Replies refused (`allow_responses = false`).
    pub reply: AtomicU64,
    /// Cluster joins refused.
    pub join: AtomicU64,
}

impl Denials {
    /// (publish, subscribe, reply, join) as read now.
    pub fn snapshot(&self) -> [u64; 4] {
        [
            self.publish.load(Relaxed),
            self.subscribe.load(Relaxed),
            self.reply.load(Relaxed),
            self.join.load(Relaxed),
        ]
    }
}

/// An authenticated user: a name, what it may do, and what it was refused.
/// Shared (`Arc`) by every connection of that user, so the counts are per
/// user.
#[derive(Debug)]
pub struct User {
    /// The configured name (`token` for the shared token, `anonymous` when
    /// the node has no authentication).
    pub name: String,
    /// What the user may do.
    pub permissions: Permissions,
    /// Operations refused to it.
    pub denied: Denials,
    /// Which of the node's identities it is, and a digest of how it is
    /// recognised: a reload compares these to tell a user whose
    /// credentials changed from one whose permissions did.
    ident: Ident,
}

/// Who a [`User`] is to a reload ([`Auth::fate`]).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Ident {
    /// No authentication: every client.
    Anonymous,
    /// The holder of the shared token (the digest is the token's SHA-256).
    Token([u8; 32]),
    /// A configured user: SHA-256 over its password hash, key, uid and gid.
    Configured([u8; 32]),
}

impl User {
    /// A user with every permission, for a node without authentication.
    pub fn anonymous() -> Arc<User> {
        Arc::new(User {
            name: "anonymous".into(),
            permissions: Permissions::default(),
            denied: Denials::default(),
            ident: Ident::Anonymous,
        })
    }
}

/// What a reload of `[auth]` does to a connected client
/// ([`Auth::fate`]).
#[derive(Debug, Clone)]
pub enum Fate {
    /// Nothing changes for it.
    Keep,
    /// Its user's permissions changed: it holds this user from now on.
    Update(Arc<User>),
    /// Its user is gone or is recognised differently now: it is
    /// disconnected, told this.
    Cut(String),
}

/// An argon2 password hash in PHC form (`$argon2id$v=19$…`), checked when
/// read.
#[derive(Clone, PartialEq, Eq)]
pub struct PasswordHashText(String);

impl fmt::Debug for PasswordHashText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PasswordHash(***)")
    }
}

impl PasswordHashText {
    /// Checks `s` is an argon2 PHC string.
    pub fn new(s: &str) -> Option<PasswordHashText> {
        let h = argon2::PasswordHash::new(s).ok()?;
        if !h.algorithm.as_str().starts_with("argon2") || h.hash.is_none() {
            return None;
        }
        Some(PasswordHashText(s.to_owned()))
    }
}

impl<'de> Deserialize<'de> for PasswordHashText {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        PasswordHashText::new(&s).ok_or_else(|| {
            serde::de::Error::custom(
                "an argon2 hash in PHC form ($argon2id$v=19$…; `skiff passwd` prints one)",
            )
        })
    }
}

/// Hashes `password` with argon2id and a fresh salt, in PHC form, for
/// `password_hash` in the configuration.
pub fn hash_password(password: &str) -> String {
    use argon2::PasswordHasher;
    argon2::Argon2::default()
        .hash_password(password.as_bytes())
        .expect("argon2 with default parameters and a fresh salt")
        .to_string()
}

/// One configured user (`[[auth.users]]`): a name, one or more ways to
/// recognise it, and its permissions.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserConfig {
    /// Its name (what `?user=` gives, and what stats show).
    pub name: String,
    /// Its password's argon2 hash.
    pub password_hash: Option<PasswordHashText>,
    /// Its Ed25519 public key.
    pub public_key: Option<PublicKey>,
    /// Local peers (Unix socket, shm) running as this uid are this user.
    pub uid: Option<u32>,
    /// Local peers whose primary group is this gid are this user (a uid
    /// match wins).
    pub gid: Option<u32>,
    /// What it may do (default: everything).
    #[serde(default)]
    pub permissions: Permissions,
}

impl UserConfig {
    /// A digest of how the user is recognised (never shown; compared
    /// across a reload).
    fn fingerprint(&self) -> [u8; 32] {
        let mut h = Sha256::new();
        h.update(self.name.as_bytes());
        h.update([0]);
        if let Some(p) = &self.password_hash {
            h.update(b"p");
            h.update(p.0.as_bytes());
        }
        h.update([0]);
        if let Some(k) = &self.public_key {
            h.update(b"k");
            h.update(k.0);
        }
        h.update([0]);
        for id in [self.uid, self.gid] {
            match id {
                Some(id) => h.update(id.to_le_bytes()),
                None => h.update(b"-"),
            }
        }
        h.finalize().into()
    }
}

/// The `[auth]` table. No token and no users: no authentication.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    /// A shared token (`--auth-token`, `SKIFF_TOKEN`): whoever gives it is
    /// user `token`, with `token_permissions`.
    pub token: Option<Secret>,
    /// What the token's holder may do (default: everything).
    pub token_permissions: Permissions,
    /// Time a client has to authenticate, in ms.
    pub timeout_ms: u64,
    /// The users.
    pub users: Vec<UserConfig>,
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            token: None,
            token_permissions: Permissions::default(),
            timeout_ms: DEFAULT_TIMEOUT_MS,
            users: Vec::new(),
        }
    }
}

impl AuthConfig {
    /// Whether any authentication is configured.
    pub fn enabled(&self) -> bool {
        self.token.is_some() || !self.users.is_empty()
    }
}

/// A configuration that cannot be used (found when the node starts).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AuthConfigError {
    /// Two users have the same name, or one key, uid or gid names two users.
    #[error("[auth] {what} {value} is given to two users; each must be unique")]
    Duplicate {
        /// `user name`, `public key`, `uid` or `gid`.
        what: &'static str,
        /// Which (never a secret).
        value: String,
    },
    /// A user without any way to be recognised.
    #[error("[auth] user `{0}` has no password_hash, public_key, uid or gid, so no one can be it")]
    Unreachable(String),
}

/// A user name that cannot match (used to spend the same argon2 work on
/// an unknown name as on a known one).
fn decoy_hash() -> &'static str {
    static DECOY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    DECOY.get_or_init(|| hash_password("skiff decoy password"))
}

/// The node's users, ready to check credentials (see the module
/// documentation). Cheap to share (`Arc`).
#[derive(Debug)]
pub struct Auth {
    enabled: bool,
    timeout_ms: u64,
    token: Option<([u8; 32], Arc<User>)>,
    by_name: HashMap<String, (Option<PasswordHashText>, Arc<User>)>,
    by_key: Vec<([u8; 32], Arc<User>)>,
    by_uid: HashMap<u32, Arc<User>>,
    by_gid: HashMap<u32, Arc<User>>,
    anonymous: Arc<User>,
    failures: AtomicU64,
}

impl Default for Auth {
    fn default() -> Self {
        Auth::new(&AuthConfig::default()).expect("no users")
    }
}

impl Auth {
    /// Builds the users from `config`; refuses duplicates and users no one
    /// can be.
    pub fn new(config: &AuthConfig) -> Result<Auth, AuthConfigError> {
        let mut a = Auth {
            enabled: config.enabled(),
            timeout_ms: config.timeout_ms,
            token: config.token.as_ref().map(|t| {
                let digest: [u8; 32] = Sha256::digest(t.expose().as_bytes()).into();
                (
                    digest,
                    Arc::new(User {
                        name: "token".into(),
                        permissions: config.token_permissions.clone(),
                        denied: Denials::default(),
                        ident: Ident::Token(digest),
                    }),
                )
            }),
            by_name: HashMap::new(),
            by_key: Vec::new(),
            by_uid: HashMap::new(),
            by_gid: HashMap::new(),
            anonymous: User::anonymous(),
            failures: AtomicU64::new(0),
        };
        let dup = |what, value: String| AuthConfigError::Duplicate { what, value };
        for u in &config.users {
            if u.password_hash.is_none()
                && u.public_key.is_none()
                && u.uid.is_none()
                && u.gid.is_none()
            {
                return Err(AuthConfigError::Unreachable(u.name.clone()));
            }
            let user = Arc::new(User {
                name: u.name.clone(),
                permissions: u.permissions.clone(),
                denied: Denials::default(),
                ident: Ident::Configured(u.fingerprint()),
            });
            if a.by_name
                .insert(u.name.clone(), (u.password_hash.clone(), user.clone()))
                .is_some()
            {
                return Err(dup("user name", u.name.clone()));
            }
            if let Some(k) = u.public_key {
                if a.by_key.iter().any(|(x, _)| *x == k.0) {
                    return Err(dup("public key", format!("{k:?}")));
                }
                a.by_key.push((k.0, user.clone()));
            }
            if let Some(uid) = u.uid {
                if a.by_uid.insert(uid, user.clone()).is_some() {
                    return Err(dup("uid", uid.to_string()));
                }
            }
            if let Some(gid) = u.gid {
                if a.by_gid.insert(gid, user.clone()).is_some() {
                    return Err(dup("gid", gid.to_string()));
                }
            }
        }
        Ok(a)
    }

    /// Builds the users from `config` for a reload of a node running
    /// with `old`: the failure count carries over, a user whose
    /// permissions and credentials are unchanged stays the same `User`
    /// (its clients are untouched), and one whose permissions changed
    /// starts with its refusal counts carried over.
    pub fn rebuild(config: &AuthConfig, old: &Auth) -> Result<Auth, AuthConfigError> {
        let mut a = Auth::new(config)?;
        a.failures = AtomicU64::new(old.failures());
        let same = |new: &Arc<User>| {
            let o = match &new.ident {
                Ident::Anonymous => return None,
                Ident::Token(_) => old.token.as_ref().map(|(_, u)| u)?,
                Ident::Configured(_) => &old.by_name.get(&new.name)?.1,
            };
            if o.ident != new.ident {
                return None;
            }
            if o.permissions == new.permissions {
                return Some(o.clone());
            }
            let d = &new.denied;
            let [p, s, r, j] = o.denied.snapshot();
            d.publish.store(p, Relaxed);
            d.subscribe.store(s, Relaxed);
            d.reply.store(r, Relaxed);
            d.join.store(j, Relaxed);
            None
        };
        let mut swap = HashMap::new();
        for u in a.users() {
            if let Some(o) = same(u) {
                swap.insert(Arc::as_ptr(u), o);
            }
        }
        let pick = |u: &mut Arc<User>| {
            if let Some(o) = swap.get(&Arc::as_ptr(u)) {
                *u = o.clone();
            }
        };
        if let Some((_, u)) = &mut a.token {
            pick(u);
        }
        for (_, u) in a.by_name.values_mut() {
            pick(u);
        }
        for (_, u) in &mut a.by_key {
            pick(u);
        }
        a.by_uid.values_mut().for_each(pick);
        a.by_gid.values_mut().for_each(pick);
        Ok(a)
    }

    /// What becomes of a client connected as `user` now that the node's
    /// users are these (see [`Fate`]): a configured user that is gone or
    /// whose password, key, uid or gid changed is cut, as are the token's
    /// holders when the token changed or went, and anonymous clients once
    /// authentication is required.
    pub fn fate(&self, user: &Arc<User>) -> Fate {
        let now = match &user.ident {
            Ident::Anonymous if self.enabled => {
                return Fate::Cut(
                    "the node now requires authentication (its configuration was reloaded)".into(),
                )
            }
            Ident::Anonymous => return Fate::Keep,
            Ident::Token(_) => match &self.token {
                Some((_, u)) if u.ident == user.ident => u,
                _ => {
                    return Fate::Cut(
                        "the node's token changed (its configuration was reloaded)".into(),
                    )
                }
            },
            Ident::Configured(_) => match self.by_name.get(&user.name) {
                None => {
                    return Fate::Cut(format!(
                        "user `{}` was removed from the node's configuration",
                        user.name
                    ))
                }
                Some((_, u)) if u.ident != user.ident => {
                    return Fate::Cut(format!(
                        "the credentials of user `{}` changed in the node's configuration",
                        user.name
                    ))
                }
                Some((_, u)) => u,
            },
        };
        if Arc::ptr_eq(now, user) {
            Fate::Keep
        } else {
            Fate::Update(now.clone())
        }
    }

    /// Whether clients must authenticate.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Time a client has to authenticate.
    pub fn timeout(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.timeout_ms)
    }

    /// Failed authentications so far (every front end together).
    pub fn failures(&self) -> u64 {
        self.failures.load(Relaxed)
    }

    /// Counts a failure found by a front end itself (a client that gave up
    /// or ran out of time in the handshake).
    pub fn count_failure(&self) {
        self.failures.fetch_add(1, Relaxed);
    }

    /// Every configured user (the token's holder first, if any), for stats.
    pub fn users(&self) -> impl Iterator<Item = &Arc<User>> + '_ {
        self.token
            .iter()
            .map(|(_, u)| u)
            .chain(self.by_name.values().map(|(_, u)| u))
    }

    /// Whether local peers with these ids are some user (no failure is
    /// counted: a front end then asks for credentials).
    pub fn local_user(&self, uid: u32, gid: u32) -> Option<Arc<User>> {
        if !self.enabled {
            return Some(self.anonymous.clone());
        }
        self.by_uid
            .get(&uid)
            .or_else(|| self.by_gid.get(&gid))
            .cloned()
    }

    /// Checks `creds`, presented by a client that was sent `nonce`; the
    /// user it proves to be. With no authentication configured, every
    /// client is [`User::anonymous`]. A password costs an argon2
    /// verification (tens of ms): call it off the runtime's worker threads
    /// (`spawn_blocking`) when that matters.
    pub fn verify(&self, creds: &Credentials, nonce: &[u8]) -> Result<Arc<User>, AuthError> {
        if !self.enabled {
            return Ok(self.anonymous.clone());
        }
        let r = self.check(creds, nonce);
        if r.is_err() {
            self.failures.fetch_add(1, Relaxed);
        }
        r
    }

    fn check(&self, creds: &Credentials, nonce: &[u8]) -> Result<Arc<User>, AuthError> {
        match creds {
            Credentials::None => Err(AuthError::Refused),
            Credentials::Token(t) => {
                let (want, user) = self.token.as_ref().ok_or(AuthError::Refused)?;
                if t.expose().len() > MAX_CREDENTIAL {
                    return Err(AuthError::Refused);
                }
                let got: [u8; 32] = Sha256::digest(t.expose().as_bytes()).into();
                if bool::from(got.ct_eq(want)) {
                    Ok(user.clone())
                } else {
                    Err(AuthError::Refused)
                }
            }
            Credentials::Password { user, password } => {
                use argon2::PasswordVerifier;
                if user.len() > MAX_CREDENTIAL || password.expose().len() > MAX_CREDENTIAL {
                    return Err(AuthError::Refused);
                }
                let found = self.by_name.get(user.as_str());
                let hash = match found {
                    Some((Some(h), _)) => h.0.as_str(),
                    // Same work for a name that has no password as for one
                    // that has: the time does not tell names apart.
                    _ => decoy_hash(),
                };
                let ok = argon2::PasswordHash::new(hash).is_ok_and(|h| {
                    argon2::Argon2::default()
                        .verify_password(password.expose().as_bytes(), &h)
                        .is_ok()
                });
                match (ok, found) {
                    (true, Some((Some(_), u))) => Ok(u.clone()),
                    _ => Err(AuthError::Refused),
                }
            }
            Credentials::Signature {
                public_key,
                signature,
            } => {
                let (_, user) = self
                    .by_key
                    .iter()
                    .find(|(k, _)| bool::from(k.ct_eq(public_key)))
                    .ok_or(AuthError::Refused)?;
                let key = ed25519_dalek::VerifyingKey::from_bytes(public_key)
                    .map_err(|_| AuthError::Refused)?;
                let sig = ed25519_dalek::Signature::from_bytes(signature);
                key.verify_strict(nonce, &sig)
                    .map_err(|_| AuthError::Refused)?;
                Ok(user.clone())
            }
            Credentials::Local { uid, gid } => {
                self.local_user(*uid, *gid).ok_or(AuthError::Refused)
            }
        }
    }
}

/// A fresh random nonce for one client to sign (from the OS's generator).
pub fn new_nonce() -> [u8; NONCE_LEN] {
    let mut n = [0u8; NONCE_LEN];
    getrandom::fill(&mut n).expect("the OS's random number generator");
    n
}

#[cfg(test)]
mod tests;
