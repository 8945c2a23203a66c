//! `skiff push`, `skiff pop`: the datagram queue from the shell.

use std::io::{BufRead, Write};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use skiff::{locator, Dest, Message, Queue, Value};

/// Arguments of `skiff push`.
#[derive(Debug, clap::Args)]
pub(crate) struct PushArgs {
    /// Where to send: host:port (the port is required), optionally
    /// #endpoint (e.g. 127.0.0.1:4711#0).
    dest: String,
    /// Messages to send; with none, each line of standard input is one.
    messages: Vec<String>,
    /// The local queue's locator (options such as qthresh ride here).
    #[arg(long, default_value = "udp://0.0.0.0:0")]
    from: String,
    /// Subject of every message.
    #[arg(long, default_value = "")]
    subject: String,
    /// Type of every message.
    #[arg(long = "type")]
    kind: Option<String>,
    /// A string field, key=value (repeatable).
    #[arg(long = "field")]
    fields: Vec<String>,
    /// Send each message this many times; `{i}` in the text becomes 0, 1, …
    #[arg(long, default_value_t = 1)]
    count: u64,
    /// Pause between messages, e.g. 1ms or 0.5 (seconds; default: none).
    /// Each message then leaves in its own datagram at once: the batching
    /// options of --from (qthresh, timeout) no longer apply.
    #[arg(long, value_parser = crate::bench::parse_duration)]
    interval: Option<Duration>,
    /// Send at most this many messages per second (default: as fast as
    /// pushes go). Pacing keeps a slow receiver from overflowing, so that
    /// what is lost is what the network lost.
    #[arg(long)]
    rate: Option<u64>,
    /// After the messages, send this many `fin` messages, one datagram each
    /// 20 ms apart: a receiver learns of a loss only from a later sequence
    /// number, so these reveal losses at the very end (spaced so that a
    /// receiver still draining a backlog gets some of them).
    #[arg(long, default_value_t = 0)]
    fin: u32,
}

/// Arguments of `skiff pop`.
#[derive(Debug, clap::Args)]
pub(crate) struct PopArgs {
    /// The queue's locator, e.g. udp://0.0.0.0:4711.
    locator: String,
    /// Stop after this many messages.
    #[arg(long)]
    count: Option<u64>,
    /// Stop when nothing arrived for this long, e.g. 2s or 0.5 (seconds;
    /// default: never).
    #[arg(long, value_parser = crate::bench::parse_duration)]
    idle: Option<Duration>,
    /// Print each message as one JSON object per line.
    #[arg(long)]
    json: bool,
    /// Print no messages, only the final stats.
    #[arg(long)]
    quiet: bool,
    /// Print the queue's stats as JSON to standard error at the end.
    #[arg(long)]
    stats: bool,
}

pub(crate) fn parse_dest(s: &str) -> Result<Dest, Box<dyn std::error::Error>> {
    let (addr, endpoint) = match s.rsplit_once('#') {
        Some((a, e)) => (
            a,
            e.parse::<u32>()
                .map_err(|_| format!("endpoint {e:?} is not a number from 0 to 4294967295"))?,
        ),
        None => (s, Dest::ANY),
    };
    if !has_port(addr) {
        return Err(format!(
            "destination {addr:?} has no port: write host:port, e.g. {addr}:4711 (a queue has no default port)"
        )
        .into());
    }
    let addr: SocketAddr = locator::resolve(addr)?;
    Ok(Dest { addr, endpoint })
}

/// Whether `addr` ends in a port: `host:port` or `[v6]:port` (a bare IPv6
/// address has colons but no port).
fn has_port(addr: &str) -> bool {
    let port_ok = |p: &str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit());
    match addr.strip_prefix('[') {
        Some(rest) => rest.split_once("]:").is_some_and(|(_, p)| port_ok(p)),
        None => {
            addr.matches(':').count() == 1 && addr.rsplit_once(':').is_some_and(|(_, p)| port_ok(p))
        }
    }
}

pub(crate) fn push(a: PushArgs) -> Result<(), Box<dyn std::error::Error>> {
    let dest = parse_dest(&a.dest)?;
    let q = Queue::bind(&a.from)?;
    let interval = a.interval;
    if interval.is_some() {
        let batching = a
            .from
            .split_once('?')
            .map(|(_, q)| {
                q.split('&')
                    .filter_map(|kv| kv.split('=').next())
                    .filter(|k| matches!(*k, "qthresh" | "timeout"))
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default();
        if !batching.is_empty() {
            eprintln!(
                "skiff push: --interval sends each message at once in its own datagram, so {} of --from do(es) not apply",
                batching.join(" and ")
            );
        }
    }
    let mut base = Message::new(a.subject.as_str(), Bytes::new());
    if let Some(k) = &a.kind {
        base = base.with_kind(k.as_str());
    }
    for f in &a.fields {
        let (k, v) = f
            .split_once('=')
            .ok_or_else(|| format!("field {f:?} is not key=value"))?;
        base = base.with_field(k, Value::from(v));
    }
    let started = Instant::now();
    let mut sent = 0u64;
    let mut send = |text: &str| -> Result<(), Box<dyn std::error::Error>> {
        for i in 0..a.count {
            let body = if text.contains("{i}") {
                text.replace("{i}", &i.to_string())
            } else {
                text.to_string()
            };
            let mut m = base.clone();
            m.payload = Bytes::from(body);
            q.push(dest, &m)?;
            sent += 1;
            if let Some(d) = interval {
                q.flush()?;
                std::thread::sleep(d);
            }
            if let Some(r) = a.rate.filter(|r| *r > 0) {
                let due = started + Duration::from_secs_f64(sent as f64 / r as f64);
                let now = Instant::now();
                if due > now + Duration::from_micros(500) {
                    std::thread::sleep(due - now);
                }
            }
        }
        Ok(())
    };
    if a.messages.is_empty() {
        for line in std::io::stdin().lock().lines() {
            send(&line?)?;
        }
    } else {
        for m in &a.messages {
            send(m)?;
        }
    }
    q.flush()?;
    for _ in 0..a.fin {
        std::thread::sleep(Duration::from_millis(20));
        let mut m = base.clone();
        m.payload = Bytes::from_static(b"fin");
        q.push(dest, &m)?;
        q.flush()?;
    }
    let s = q.stats();
    eprintln!(
        "sent {} messages in {} datagrams ({} bytes) to {dest}",
        s.sent_messages, s.sent_batches, s.sent_bytes
    );
    Ok(())
}

pub(crate) fn message_json(m: &Message) -> serde_json::Value {
    let fields: serde_json::Map<String, serde_json::Value> = m
        .fields
        .iter()
        .map(|f| {
            let v = match &f.value {
                Value::Bool(b) => serde_json::json!(b),
                Value::Int(i) => serde_json::json!(i),
                Value::Float(x) => serde_json::json!(x),
                Value::Str(s) => serde_json::json!(&**s),
                Value::Bytes(b) => serde_json::json!(b.to_vec()),
            };
            (f.key.to_string(), v)
        })
        .collect();
    serde_json::json!({
        "subject": &*m.subject,
        "type": m.kind.as_deref(),
        "fields": fields,
        "seq": m.meta.seq,
        "source": format!("{:016x}", m.meta.source),
        "from": m.meta.from.map(|a| a.to_string()),
        "payload": String::from_utf8_lossy(&m.payload),
    })
}

pub(crate) fn pop(a: PopArgs) -> Result<(), Box<dyn std::error::Error>> {
    let q = Queue::bind(&a.locator)?;
    eprintln!("popping on {}", q.local_addr());
    let idle = a.idle;
    let out = std::io::stdout();
    let mut out = out.lock();
    let mut n = 0u64;
    let mut last = Instant::now();
    while a.count.is_none_or(|c| n < c) {
        let wait = idle
            .map(|d| d.saturating_sub(last.elapsed()))
            .unwrap_or(Duration::from_secs(3600));
        let Some(m) = q.pop_blocking(Some(wait)) else {
            if idle.is_some_and(|d| last.elapsed() >= d) {
                break;
            }
            continue;
        };
        last = Instant::now();
        n += 1;
        if a.quiet {
            continue;
        }
        if a.json {
            writeln!(out, "{}", message_json(&m))?;
        } else {
            writeln!(out, "{}", String::from_utf8_lossy(&m.payload))?;
        }
    }
    out.flush()?;
    let s = q.stats();
    if a.stats {
        eprintln!("{}", serde_json::to_string(&s)?);
    } else {
        eprintln!(
            "received {} messages, lost {}, dropped {}",
            s.recv_messages,
            s.lost,
            s.dropped.total()
        );
    }
    Ok(())
}
