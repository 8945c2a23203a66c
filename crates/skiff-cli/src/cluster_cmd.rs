//! `skiff broadcast`, `tunnel` and `join`: Iris's cluster patterns from
//! the shell. `join` makes this process a member that prints what reaches
//! it and can answer; `broadcast` reaches every member; `tunnel` pipes
//! standard input to one member and what it sends back to standard output.

use std::io::{Read, Write};
use std::time::Duration;

use bytes::Bytes;
use skiff::client::{Incoming, Target, Tunnel};
use skiff::Message;

use crate::node_cmd::{runtime, NodeLoc, Result};
use crate::out::outln;

/// `skiff broadcast`
#[derive(clap::Args, Debug)]
pub(crate) struct BroadcastArgs {
    #[command(flatten)]
    loc: NodeLoc,
    /// The cluster: every member gets each message, at most once.
    cluster: String,
    /// Payload; without it, each line of standard input is one message.
    payload: Option<String>,
    /// Message type.
    #[arg(long = "type")]
    kind: Option<String>,
    /// Send the payload this many times.
    #[arg(long, default_value_t = 1)]
    count: u64,
}

pub(crate) fn broadcast(a: BroadcastArgs) -> Result<()> {
    runtime()?.block_on(async move {
        let c = a.loc.connect_for("broadcast", false).await?;
        let make = |p: Bytes| {
            let m = Message::new("", p);
            match &a.kind {
                Some(k) => m.with_kind(k.as_str()),
                None => m,
            }
        };
        let mut sent = 0u64;
        match &a.payload {
            Some(p) => {
                for _ in 0..a.count {
                    c.broadcast(&a.cluster, make(Bytes::from(p.clone())))
                        .await?;
                    sent += 1;
                }
            }
            None => {
                use std::io::BufRead;
                for line in std::io::stdin().lock().lines() {
                    c.broadcast(&a.cluster, make(Bytes::from(line?))).await?;
                    sent += 1;
                }
            }
        }
        c.flush().await?;
        if let (n @ 1.., Some(e)) = c.async_errors() {
            return Err(format!("the node refused {n} broadcast(s): {e}").into());
        }
        eprintln!(
            "skiff broadcast: {sent} message(s) to cluster {}",
            a.cluster
        );
        Ok(())
    })
}

/// `skiff tunnel`
#[derive(clap::Args, Debug)]
pub(crate) struct TunnelArgs {
    #[command(flatten)]
    loc: NodeLoc,
    /// The cluster: the tunnel goes to one member, chosen as a request's.
    cluster: String,
    /// Affinity key: the same key reaches the same member while it lives.
    #[arg(long)]
    key: Option<String>,
    /// How long to wait for the tunnel to open: seconds (`0.5`) or with a
    /// unit (`200ms`, `1s`).
    #[arg(long, default_value = "5", value_parser = crate::bench::parse_secs)]
    timeout: Duration,
    /// Send each line of standard input (newline included) as its own
    /// message, instead of whatever each read returns.
    #[arg(long)]
    lines: bool,
    /// After the end of input, how long to go on printing what the member
    /// sends once it falls silent, before closing (at once if the member
    /// closes first).
    #[arg(long, default_value = "1", value_parser = crate::bench::parse_duration)]
    linger: Duration,
}

pub(crate) fn tunnel(a: TunnelArgs) -> Result<()> {
    runtime()?.block_on(async move {
        let c = a.loc.connect_for("tunnel", false).await?;
        let target = match &a.key {
            Some(k) => Target::cluster(a.cluster.clone()).with_key(Bytes::from(k.clone())),
            None => Target::cluster(a.cluster.clone()),
        };
        let t = c.tunnel(target, a.timeout).await?;
        eprintln!(
            "skiff tunnel: open to a member of {} (tunnel {})",
            a.cluster,
            t.id()
        );
        // Standard input is read on its own thread; a task sends what it
        // reads, so that this one keeps receiving (and granting window)
        // while the member's window is full.
        let (tx, mut rx) = tokio::sync::mpsc::channel::<std::io::Result<Bytes>>(64);
        let lines = a.lines;
        std::thread::spawn(move || read_input(lines, &tx));
        let sender = t.sender();
        let mut sending = tokio::spawn(async move {
            while let Some(b) = rx.recv().await {
                let b = b.map_err(|e| format!("reading standard input: {e}"))?;
                sender.send(Message::new("", b)).await?;
            }
            Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
        });
        let mut input_done = false;
        let mut out = std::io::stdout();
        loop {
            let m = tokio::select! {
                m = t.recv() => m,
                r = &mut sending, if !input_done => {
                    input_done = true;
                    r.map_err(|e| format!("sending: {e}"))?.map_err(|e| e.to_string())?;
                    continue;
                }
                () = tokio::time::sleep(a.linger), if input_done => break,
            };
            match m {
                Some(m) => {
                    out.write_all(&m.payload)?;
                    if lines && !m.payload.ends_with(b"\n") {
                        out.write_all(b"\n")?;
                    }
                    out.flush()?;
                }
                None => {
                    if let Some(e) = t.error() {
                        return Err(format!("the tunnel ended: {e}").into());
                    }
                    if !input_done {
                        sending.abort();
                        eprintln!("skiff tunnel: the member closed the tunnel");
                    }
                    break;
                }
            }
        }
        drop(t); // closes the tunnel
        c.flush().await?;
        Ok(())
    })
}

/// Reads standard input into `tx`: lines, or whatever each read returns.
fn read_input(lines: bool, tx: &tokio::sync::mpsc::Sender<std::io::Result<Bytes>>) {
    let mut stdin = std::io::stdin().lock();
    loop {
        let r = if lines {
            let mut line = Vec::new();
            std::io::BufRead::read_until(&mut stdin, b'\n', &mut line).map(|n| (n, line))
        } else {
            let mut buf = vec![0u8; 64 << 10];
            stdin.read(&mut buf).map(|n| {
                buf.truncate(n);
                (n, buf)
            })
        };
        match r {
            Ok((0, _)) => return,
            Ok((_, b)) => {
                if tx.blocking_send(Ok(Bytes::from(b))).is_err() {
                    return;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                let _ = tx.blocking_send(Err(e));
                return;
            }
        }
    }
}

/// `skiff join`
#[derive(clap::Args, Debug)]
pub(crate) struct JoinArgs {
    #[command(flatten)]
    loc: NodeLoc,
    /// The cluster to join.
    cluster: String,
    /// This member's share of requests and tunnels (0: broadcasts only).
    #[arg(long, default_value_t = 1)]
    capacity: u32,
    /// Answer each request with this payload.
    #[arg(long, value_name = "TEXT", conflicts_with = "echo")]
    reply: Option<String>,
    /// Answer each request with its own payload, and send every tunnel
    /// message back on its tunnel.
    #[arg(long)]
    echo: bool,
    /// Stop after this many requests, broadcasts and tunnels in all.
    #[arg(long)]
    count: Option<u64>,
}

pub(crate) fn join(a: JoinArgs) -> Result<()> {
    runtime()?.block_on(async move {
        let c = a.loc.connect_for("join", false).await?;
        let m = c.join(&a.cluster, a.capacity).await?;
        eprintln!(
            "skiff join: member of cluster {} (capacity {})",
            a.cluster, a.capacity
        );
        let mut n = 0u64;
        let mut tunnels = tokio::task::JoinSet::new();
        while let Some(i) = m.recv().await {
            match i {
                Incoming::Request(r) => {
                    outln!("request: {}", body(&r.msg));
                    let answer = match (&a.reply, a.echo) {
                        (Some(p), _) => Some(Message::new("", p.clone())),
                        (None, true) => Some(Message::new("", r.msg.payload.clone())),
                        (None, false) => None,
                    };
                    match answer {
                        Some(out) => r.reply(out).await?,
                        None => eprintln!(
                            "skiff join: request not answered (answer with --reply TEXT or --echo)"
                        ),
                    }
                }
                Incoming::Broadcast(b) => outln!("broadcast: {}", body(&b)),
                Incoming::Tunnel(t) => {
                    outln!("tunnel {}: open", t.id());
                    tunnels.spawn(serve_tunnel(t, a.echo));
                }
                _ => continue,
            }
            n += 1;
            if a.count.is_some_and(|c| n >= c) {
                break;
            }
        }
        // Tunnels opened so far run until their peers close them.
        while let Some(r) = tunnels.join_next().await {
            r.map_err(|e| format!("tunnel task: {e}"))?;
        }
        c.flush().await?;
        Ok(())
    })
}

/// Prints what arrives on a member's tunnel, one line per message, and
/// with `echo` sends each back.
async fn serve_tunnel(t: Tunnel, echo: bool) {
    let id = t.id();
    let back = t.sender();
    while let Some(m) = t.recv().await {
        match std::str::from_utf8(&m.payload) {
            Ok(text) => outln!("tunnel {id}: {}", text.strip_suffix('\n').unwrap_or(text)),
            Err(_) => outln!("tunnel {id}: ({} bytes, not text)", m.payload.len()),
        }
        if echo && back.send(Message::new("", m.payload)).await.is_err() {
            break;
        }
    }
    match t.error() {
        Some(e) => eprintln!("skiff join: tunnel {id} ended: {e}"),
        None => outln!("tunnel {id}: closed"),
    }
}

/// A cluster message as one line: `[type] payload`.
fn body(m: &Message) -> String {
    let text = String::from_utf8_lossy(&m.payload);
    match m.kind.as_deref() {
        Some(k) => format!("[{k}] {text}"),
        None => text.into_owned(),
    }
}
