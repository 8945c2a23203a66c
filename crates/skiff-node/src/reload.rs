//! Reloading the configuration while the node runs (SIGHUP, `skiff
//! reload`): the file is read again (with the environment and flags over
//! it, as at start), and what can change live is applied whole or not at
//! all; clients stay connected.
//!
//! Applied at once: the limits ([`crate::Limits`]; a client's
//! pending-bytes bound, frame size bound and keepalive are set when it
//! attaches, so changes to `max_pending_bytes`, `max_payload`'s frame
//! bound and `ping_interval_ms` / `max_pings_out` reach clients attaching
//! after; `max_payload` is checked on every publish at once), the log
//! filter, and the users and permissions of `[auth]`
//! ([`Broker::set_auth`]): new connections authenticate against the new
//! users; a connected client whose user was removed (or whose password,
//! key, uid or gid changed, or whose token changed) is disconnected with
//! an error saying so; one whose permissions changed has them for its
//! next operation, and its subscriptions they refuse are ended, the
//! client told. Everything else (listeners, the mesh, threads, the
//! monitor, the log format, `max_total_pending_bytes`) needs a restart: a
//! reload that changes it keeps the running value and names it in the
//! log. A file that cannot be read, or whose `[auth]` is bad, is refused
//! whole: nothing changes.

use std::sync::Arc;

use parking_lot::Mutex;

use crate::auth::Auth;
use crate::broker::Broker;
use crate::config::{Config, Limits};
use crate::node::ConfigSource;

/// Rebuilds and applies the configuration (see the module documentation).
pub struct Reloader {
    source: ConfigSource,
    running: Mutex<Config>,
    broker: Arc<Broker>,
}

impl std::fmt::Debug for Reloader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reloader")
            .field("running", &*self.running.lock())
            .finish_non_exhaustive()
    }
}

impl Reloader {
    /// A reloader for a node started from `running`.
    pub fn new(source: ConfigSource, running: Config, broker: Arc<Broker>) -> Reloader {
        Reloader {
            source,
            running: Mutex::new(running),
            broker,
        }
    }

    /// Rereads the configuration and applies what can change; `Ok` with
    /// a summary of what changed, or the reason the new configuration was
    /// refused (the running one stays). Both are logged.
    pub fn reload(&self) -> Result<String, String> {
        let mut new = match (self.source)() {
            Ok(c) => c,
            Err(e) => {
                crate::logging::counted();
                tracing::warn!(reason = %e, "reload refused: the configuration stays as it was");
                return Err(format!("reload refused: {e}"));
            }
        };
        // As at start: the connection limit stays below what the
        // descriptors allow.
        if let Some(room) = crate::node::connection_room() {
            new.limits.max_connections = new.limits.max_connections.min(room);
        }
        let mut running = self.running.lock();
        let mut plan = plan(&running, &new);
        // The users first: a bad `[auth]` refuses the whole reload.
        let auth = if running.auth != new.auth {
            match Auth::rebuild(&new.auth, &self.broker.auth()) {
                Ok(a) => Some(Arc::new(a)),
                Err(e) => {
                    crate::logging::counted();
                    tracing::warn!(reason = %e, "reload refused: the configuration stays as it was");
                    return Err(format!("reload refused: {e}"));
                }
            }
        } else {
            None
        };
        if let Some(filter) = &plan.log {
            let f = filter.as_deref().unwrap_or(crate::logging::DEFAULT_FILTER);
            if let Err(e) = crate::logging::set_filter(f) {
                // Checked when the configuration was read: only a node with
                // no log writer gets here, and that is not a reason to
                // refuse the limits.
                tracing::debug!(reason = %e, "log filter not changed");
            }
        }
        let mut limits = new.limits.clone();
        limits.max_total_pending_bytes = running.limits.max_total_pending_bytes;
        self.broker.set_limits(limits.clone());
        running.limits = limits;
        running.log_level = new.log_level.clone();
        if let Some(auth) = auth {
            let users = auth.users().count();
            let done = self.broker.set_auth(auth);
            plan.changed.push(format!(
                "auth: {} ({users} users; {} clients disconnected, {} given new permissions, {} subscriptions ended)",
                if new.auth.enabled() { "required" } else { "off" },
                done.cut,
                done.updated,
                done.revoked
            ));
            running.auth = new.auth.clone();
        }
        for name in &plan.restart {
            crate::logging::counted();
            tracing::warn!(setting = %name, "reload: this setting changed but needs a restart; the running value stays");
        }
        let summary = if plan.changed.is_empty() {
            "nothing changed".to_owned()
        } else {
            plan.changed.join(", ")
        };
        tracing::info!(
            changed = %summary,
            needs_restart = %plan.restart.join(", "),
            "configuration reloaded"
        );
        Ok(summary)
    }
}

/// What a reload from `old` to `new` does.
#[derive(Debug, Default, PartialEq, Eq)]
struct Plan {
    /// Settings applied, as `name: old -> new`.
    changed: Vec<String>,
    /// Settings that changed but need a restart.
    restart: Vec<&'static str>,
    /// The new log filter, when it changed.
    log: Option<Option<String>>,
}

fn plan(old: &Config, new: &Config) -> Plan {
    let mut p = Plan::default();
    limit_changes(&old.limits, &new.limits, &mut p);
    if old.log_level != new.log_level {
        p.changed.push(format!(
            "log_level: {} -> {}",
            old.log_level.as_deref().unwrap_or("default"),
            new.log_level.as_deref().unwrap_or("default")
        ));
        p.log = Some(new.log_level.clone());
    }
    let mut restart = |differs: bool, name| {
        if differs {
            p.restart.push(name)
        }
    };
    restart(old.tcp != new.tcp, "tcp");
    restart(old.unix != new.unix, "unix");
    restart(old.shm != new.shm, "shm");
    restart(old.mesh != new.mesh, "mesh");
    restart(
        old.wake_latency_us != new.wake_latency_us,
        "wake_latency_us",
    );
    restart(old.workers != new.workers, "workers");
    restart(old.spin_us != new.spin_us, "spin_us");
    restart(old.log_format != new.log_format, "log_format");
    restart(old.monitor != new.monitor, "monitor");
    restart(old.nats != new.nats, "nats");
    restart(old.log != new.log, "log (sinks)");
    restart(
        (&old.tls_cert, &old.tls_key, &old.tls_ca) != (&new.tls_cert, &new.tls_key, &new.tls_ca),
        "tls_cert, tls_key, tls_ca",
    );
    restart(
        old.limits.max_total_pending_bytes != new.limits.max_total_pending_bytes,
        "max_total_pending_bytes",
    );
    p
}

fn limit_changes(old: &Limits, new: &Limits, p: &mut Plan) {
    macro_rules! each {
        ($($f:ident),*) => {$(
            if old.$f != new.$f {
                p.changed.push(format!(concat!(stringify!($f), ": {} -> {}"), old.$f, new.$f));
            }
        )*};
    }
    each!(
        max_subject,
        max_payload,
        max_subscriptions,
        max_pending_bytes,
        max_connections,
        max_requests,
        drain_timeout_ms,
        read_timeout_ms,
        ping_interval_ms,
        max_pings_out
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_names_what_changes_and_what_needs_a_restart() {
        let old = Config::default();
        let mut new = old.clone();
        new.limits.max_subscriptions = 2;
        new.log_level = Some("debug".into());
        new.tcp = None;
        new.limits.max_total_pending_bytes = 1 << 30;
        let p = plan(&old, &new);
        assert_eq!(
            p.changed,
            vec![
                "max_subscriptions: 10000 -> 2",
                "log_level: default -> debug"
            ]
        );
        assert_eq!(p.restart, vec!["tcp", "max_total_pending_bytes"]);
        assert_eq!(p.log, Some(Some("debug".into())));
        assert_eq!(plan(&old, &old), Plan::default());
    }

    #[test]
    fn a_bad_file_changes_nothing() {
        let broker = Arc::new(Broker::new(Limits::default()));
        let r = Reloader::new(
            Box::new(|| {
                Config::from_toml("[limits]\nmax_subscriptions = \"x\"", "bad.toml".as_ref())
            }),
            Config::default(),
            broker.clone(),
        );
        let e = r.reload().unwrap_err();
        assert!(e.contains("bad.toml"), "{e}");
        assert_eq!(broker.limits().max_subscriptions, 10_000);
        // (A connection limit under any descriptor limit: not capped.)
        let mut running = Config::default();
        running.limits.max_connections = 100;
        let r = Reloader::new(
            Box::new(|| {
                Config::from_toml(
                    "[limits]\nmax_subscriptions = 3\nmax_connections = 100",
                    "ok.toml".as_ref(),
                )
            }),
            running,
            broker.clone(),
        );
        assert_eq!(r.reload().unwrap(), "max_subscriptions: 10000 -> 3");
        assert_eq!(broker.limits().max_subscriptions, 3);
    }
}
