//! The LogFile subdomain (cMsg): many clients write, through the node, to
//! one log file.
//!
//! A sink (`[[log]]` in the configuration, `skiff node --log
//! PATTERN=PATH`) is the node's own subscription to a pattern, with policy
//! `block`. Every message published on a matching subject, by any client
//! of the node (or, in a mesh, of any node: the sink's interest travels
//! like any other), is appended to the file as one record of the
//! `file://` log format ([`skiff_proto::record`]), so `skiff sub -n
//! file://PATH` and every `file://` reader read it, following it as it
//! grows.
//!
//! Only the node writes the file, a batch of whole records per `write`, in
//! the order the sink receives them (each publisher's order is kept). A
//! client killed in the middle of a publish leaves at most a frame the node
//! never read whole, which is never written; no two clients' records
//! interleave. A node killed in the middle of a write leaves a torn last
//! record: readers skip it and the next opening of the log cuts it off.
//!
//! Nothing is dropped: a sink slower than its publishers holds them back
//! (policy `block`). A failed write stops the sink, which says so on
//! standard error; its subscription then ends.

use std::path::PathBuf;
use std::sync::Arc;

use serde::Deserialize;
use skiff::client::{Client, FileLog, Policy, SubOptions, Subscription, Syntax};
use skiff::Message;

/// Records a sink writes with one `write`, at most.
const BATCH: usize = 1024;

/// One log sink: messages matching `pattern` go to the file at `path`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogSink {
    /// Subject pattern (tokens; a cMsg pattern with `cmsg = true`).
    pub pattern: String,
    /// The log file (created if missing, appended to).
    pub path: PathBuf,
    /// `pattern` is a cMsg pattern.
    #[serde(default)]
    pub cmsg: bool,
}

impl LogSink {
    /// Parses `PATTERN=PATH` (a token pattern; split at the last `=`, so
    /// the path may not hold one).
    pub fn parse(s: &str) -> Option<LogSink> {
        let (pattern, path) = s.rsplit_once('=')?;
        if pattern.is_empty() || path.is_empty() {
            return None;
        }
        Some(LogSink {
            pattern: pattern.into(),
            path: path.into(),
            cmsg: false,
        })
    }
}

/// A sink ready to run: its file open, its subscription held by the node.
#[derive(Debug)]
pub(crate) struct Running {
    _client: Client,
    sub: Subscription,
    log: Arc<FileLog>,
}

/// Opens the sink's file and subscribes through `client` (a client of the
/// node itself); the node holds the interest when this returns.
pub(crate) async fn open(client: Client, sink: &LogSink) -> std::io::Result<Running> {
    let bad = |what: &str, e: skiff::Error| {
        std::io::Error::other(format!(
            "log sink {} ({}): {what}: {e}",
            sink.path.display(),
            sink.pattern
        ))
    };
    let log = FileLog::open(&sink.path.to_string_lossy()).map_err(|e| bad("open", e))?;
    let syntax = if sink.cmsg {
        Syntax::Cmsg
    } else {
        Syntax::Tokens
    };
    let opts = SubOptions::default()
        .policy(Policy::Block)
        .syntax(syntax)
        .window(BATCH as u32 * 4);
    let sub = client
        .subscribe_with(&sink.pattern, "*", opts)
        .await
        .map_err(|e| bad("subscribe", e))?;
    Ok(Running {
        _client: client,
        sub,
        log: Arc::new(log),
    })
}

/// Writes what the sink receives until its subscription ends (the node
/// shuts down) or a write fails.
pub(crate) async fn run(mut r: Running) {
    let mut batch: Vec<Message> = Vec::with_capacity(BATCH);
    while let Some(d) = r.sub.recv().await {
        batch.push(d.into_message());
        while batch.len() < BATCH {
            match r.sub.try_recv() {
                Some(d) => batch.push(d.into_message()),
                None => break,
            }
        }
        let log = r.log.clone();
        let msgs = std::mem::take(&mut batch);
        let done = tokio::task::spawn_blocking(move || log.append_batch(&msgs).map(|_| msgs)).await;
        match done {
            Ok(Ok(mut msgs)) => {
                msgs.clear();
                batch = msgs;
            }
            Ok(Err(e)) => {
                eprintln!(
                    "skiff node: log sink {}: {e}; the sink stopped",
                    r.log.path().display()
                );
                return;
            }
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sinks_from_flags_and_toml() {
        let s = LogSink::parse("logs.>=/tmp/a.log").unwrap();
        assert_eq!(
            (s.pattern.as_str(), s.path.to_str().unwrap()),
            ("logs.>", "/tmp/a.log")
        );
        // The last `=` splits: a cMsg range may hold one.
        let s = LogSink::parse("x{i=5}=/tmp/b.log").unwrap();
        assert_eq!(s.pattern, "x{i=5}");
        assert!(LogSink::parse("nopath").is_none());
        assert!(LogSink::parse("=/tmp/x").is_none());
        assert!(LogSink::parse("p=").is_none());
        let c = crate::Config::from_toml(
            "[[log]]\npattern = \"daq.h*b\"\npath = \"/tmp/c.log\"\ncmsg = true\n",
            std::path::Path::new("t.toml"),
        )
        .unwrap();
        assert_eq!(
            c.log,
            vec![LogSink {
                pattern: "daq.h*b".into(),
                path: "/tmp/c.log".into(),
                cmsg: true
            }]
        );
        let mut c = crate::Config::default();
        c.set("log", "a.>=/tmp/d.log").unwrap();
        assert!(c.set("log", "bad").is_err());
        assert_eq!(c.log.len(), 1);
    }
}
