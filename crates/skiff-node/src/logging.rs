//! The node's log: `tracing` events written by `tracing-subscriber`, as
//! text (the default) or one JSON object a line (`log_format = "json"`),
//! filtered by a level or `RUST_LOG`-style directives (`log = "info"`,
//! `log = "skiff_node=debug,info"`) that a reload can change while the node
//! runs ([`set_filter`]).
//!
//! Libraries (`skiff`, `skiff-proto`, this crate) only emit events; the
//! binary that runs a node calls [`init`] once. Events that could repeat
//! without bound (limits hit, drops, refusals) go through [`Every`], which
//! lets one through per second per cause and counts the rest.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::OnceLock;
use std::time::Instant;

use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{reload, EnvFilter, Registry};

/// The level used when neither the configuration nor `RUST_LOG` names one.
pub const DEFAULT_FILTER: &str = "info";

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// Human-readable lines (the default).
    #[default]
    Text,
    /// One JSON object per line (`timestamp`, `level`, `target`,
    /// `fields`).
    Json,
}

impl Format {
    /// Parses `text` or `json`.
    pub fn parse(s: &str) -> Option<Format> {
        match s.trim() {
            "text" | "" => Some(Format::Text),
            "json" => Some(Format::Json),
            _ => None,
        }
    }

    /// The name `parse` accepts.
    pub fn name(self) -> &'static str {
        match self {
            Format::Text => "text",
            Format::Json => "json",
        }
    }
}

/// Checks a filter (a level such as `info`, or directives such as
/// `skiff_node=debug,warn`); the parser's message when it is not valid.
pub fn check_filter(filter: &str) -> Result<(), String> {
    EnvFilter::builder()
        .parse(filter)
        .map(drop)
        .map_err(|e| e.to_string())
}

static HANDLE: OnceLock<reload::Handle<EnvFilter, Registry>> = OnceLock::new();

/// Installs the process's log writer on standard error: `filter` (see
/// [`check_filter`]) and `format`. Only the first call in a process
/// installs anything (later ones change the filter only).
pub fn init(filter: &str, format: Format) -> Result<(), String> {
    let f = EnvFilter::builder()
        .parse(filter)
        .map_err(|e| e.to_string())?;
    if HANDLE.get().is_some() {
        return set_filter(filter);
    }
    let (layer, handle) = reload::Layer::new(f);
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_target(true);
    let r = match format {
        Format::Text => Registry::default()
            .with(layer)
            .with(fmt.with_ansi(false))
            .try_init(),
        Format::Json => Registry::default()
            .with(layer)
            .with(fmt.json().flatten_event(false).with_current_span(false))
            .try_init(),
    };
    r.map_err(|e| e.to_string())?;
    let _ = HANDLE.set(handle);
    Ok(())
}

/// Changes the filter of the writer [`init`] installed (a reload); an
/// error if the filter is not valid or nothing was installed.
pub fn set_filter(filter: &str) -> Result<(), String> {
    let f = EnvFilter::builder()
        .parse(filter)
        .map_err(|e| e.to_string())?;
    match HANDLE.get() {
        Some(h) => h.reload(f).map_err(|e| e.to_string()),
        None => Err("no log writer installed".into()),
    }
}

/// At most one event per second per cause: [`Every::check`] says whether
/// to log now and how many were held back since the last one.
#[derive(Debug, Default)]
pub struct Every {
    causes: Mutex<FxHashMap<String, (Instant, u64)>>,
}

/// Causes tracked at most (a flood of distinct causes is logged as one).
const MAX_CAUSES: usize = 4096;

impl Every {
    /// `Some(suppressed)` when an event for `cause` may be logged now
    /// (`suppressed` events of this cause were held back since the last),
    /// `None` when one was logged less than a second ago.
    pub fn check(&self, cause: &str) -> Option<u64> {
        let now = Instant::now();
        let mut c = self.causes.lock();
        if c.len() >= MAX_CAUSES && !c.contains_key(cause) {
            c.retain(|_, (at, _)| now.duration_since(*at).as_secs() < 1);
            if c.len() >= MAX_CAUSES {
                return None;
            }
        }
        match c.get_mut(cause) {
            Some((at, held)) if now.duration_since(*at).as_millis() < 1000 => {
                *held += 1;
                None
            }
            Some((at, held)) => {
                *at = now;
                Some(std::mem::take(held))
            }
            None => {
                c.insert(cause.to_owned(), (now, 0));
                Some(0)
            }
        }
    }
}

/// The node-wide [`Every`] for warnings.
pub fn every() -> &'static Every {
    static E: OnceLock<Every> = OnceLock::new();
    E.get_or_init(Every::default)
}

/// Warnings logged since the start (for tests and `/varz`).
pub static WARNINGS: AtomicU64 = AtomicU64::new(0);

/// Logs a warning for `cause` at most once a second (see [`Every`]),
/// saying how many like it were held back.
#[macro_export]
macro_rules! warn_every {
    ($cause:expr, $($arg:tt)+) => {{
        if let Some(held) = $crate::logging::every().check($cause) {
            $crate::logging::WARNINGS.fetch_add(1, ::std::sync::atomic::Ordering::Relaxed);
            ::tracing::warn!(cause = $cause, held_back = held, $($arg)+);
        }
    }};
}

/// Counts a warning that was logged directly.
pub fn counted() {
    WARNINGS.fetch_add(1, Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn once_a_second_per_cause() {
        let e = Every::default();
        assert_eq!(e.check("a"), Some(0));
        assert_eq!(e.check("a"), None);
        assert_eq!(e.check("a"), None);
        assert_eq!(e.check("b"), Some(0));
        {
            let mut c = e.causes.lock();
            c.get_mut("a").unwrap().0 -= std::time::Duration::from_secs(2);
        }
        assert_eq!(e.check("a"), Some(2), "two held back");
    }

    #[test]
    fn filters_and_formats() {
        assert!(check_filter("info").is_ok());
        assert!(check_filter("skiff_node=debug,warn").is_ok());
        assert!(check_filter("loud=[").is_err());
        assert_eq!(Format::parse("json"), Some(Format::Json));
        assert_eq!(Format::parse("xml"), None);
    }
}
