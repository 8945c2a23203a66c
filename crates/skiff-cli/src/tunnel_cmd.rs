//! `skiff cat`: a pipe over a tunnel. On one side
//! `skiff cat --listen udp://0.0.0.0:4711 > out` accepts one tunnel and
//! writes what arrives to stdout; on the other `skiff cat udp://host:4711 <
//! in` sends stdin over a tunnel to it. Bytes arrive exactly, in order; the
//! sender exits once the listener has them all (a graceful close in both
//! directions).

use std::error::Error;
use std::io::{Read, Write};
use std::time::{Duration, Instant};

use bytes::Bytes;
use skiff::{Endpoint, EndpointConfig};

/// `skiff cat`
#[derive(clap::Args, Debug)]
pub(crate) struct CatArgs {
    /// With --listen, the locator to listen on (`udp://0.0.0.0:4711?…`);
    /// otherwise the listener to send stdin to (`udp://host:4711?…`; its
    /// options set up this side's endpoint).
    locator: String,
    /// Accept one tunnel on LOCATOR and write what arrives to stdout.
    #[arg(long)]
    listen: bool,
    /// Sending side: the local locator to bind (default: any port; the
    /// options of LOCATOR apply when this has none).
    #[arg(long, value_name = "LOCATOR")]
    from: Option<String>,
    /// How long to wait for the listener to answer: seconds (`0.5`) or
    /// with a unit (`200ms`, `10s`).
    #[arg(long, default_value = "10", value_parser = crate::bench::parse_secs)]
    connect_timeout: Duration,
    /// Bytes read from stdin per message.
    #[arg(long, default_value_t = 256 << 10)]
    chunk: usize,
    /// Sending side: send each line of stdin (newline included) as its own
    /// message instead of filling chunks.
    #[arg(long)]
    lines: bool,
    /// Print the tunnel's and endpoint's counters to stderr at the end, as
    /// JSON-ish debug text.
    #[arg(long)]
    stats: bool,
}

/// Runs `skiff cat`.
pub(crate) fn run(a: CatArgs) -> Result<(), Box<dyn Error>> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        if a.listen {
            listen(a).await
        } else {
            send(a).await
        }
    })
}

async fn listen(a: CatArgs) -> Result<(), Box<dyn Error>> {
    let ep = Endpoint::bind(&a.locator)?;
    ep.listen();
    let t = ep.accept().await?;
    let started = Instant::now();
    let mut out = std::io::stdout().lock();
    let mut total = 0u64;
    while let Some(m) = t.recv().await? {
        total += m.len() as u64;
        out.write_all(&m)?;
    }
    out.flush()?;
    // The peer closed; finish our side of the close.
    t.close().await?;
    if a.stats {
        report(&ep, total, started);
        eprintln!("tunnel: {:?}", t.stats());
    }
    Ok(())
}

async fn send(a: CatArgs) -> Result<(), Box<dyn Error>> {
    let target = EndpointConfig::from_locator(&a.locator)?;
    let from = match &a.from {
        Some(f) => f.clone(),
        None => {
            let unspecified = if target.bind.is_ipv4() {
                "0.0.0.0:0"
            } else {
                "[::]:0"
            };
            match a.locator.split_once('?') {
                Some((_, q)) => format!("udp://{unspecified}?{q}"),
                None => format!("udp://{unspecified}"),
            }
        }
    };
    let ep = Endpoint::bind(&from)?;
    let t = ep.connect(target.bind, a.connect_timeout).await?;
    let started = Instant::now();
    // stdin is read on its own thread; a small channel bounds what waits.
    let depth = if a.lines { 1024 } else { 4 };
    let (tx, mut rx) = tokio::sync::mpsc::channel::<std::io::Result<Bytes>>(depth);
    let chunk = a.chunk.max(1);
    let lines = a.lines;
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin().lock();
        if lines {
            return send_lines(&mut stdin, &tx);
        }
        loop {
            let mut buf = vec![0u8; chunk];
            let mut n = 0;
            // Fill the chunk (pipes deliver 64 KiB at a time).
            let r = loop {
                match stdin.read(&mut buf[n..]) {
                    Ok(0) => break Ok(()),
                    Ok(k) => {
                        n += k;
                        if n == buf.len() {
                            break Ok(());
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => break Err(e),
                }
            };
            if let Err(e) = r {
                let _ = tx.blocking_send(Err(e));
                return;
            }
            if n == 0 {
                return;
            }
            buf.truncate(n);
            if tx.blocking_send(Ok(Bytes::from(buf))).is_err() {
                return;
            }
        }
    });
    let mut total = 0u64;
    while let Some(b) = rx.recv().await {
        let b = b.map_err(|e| format!("reading stdin: {e}"))?;
        total += b.len() as u64;
        t.send(b).await?;
    }
    t.close().await?;
    if a.stats {
        report(&ep, total, started);
        eprintln!("tunnel: {:?}", t.stats());
    }
    Ok(())
}

/// Sends each line of `input` as one message.
fn send_lines(
    input: &mut impl std::io::BufRead,
    tx: &tokio::sync::mpsc::Sender<std::io::Result<Bytes>>,
) {
    loop {
        let mut line = Vec::new();
        match input.read_until(b'\n', &mut line) {
            Ok(0) => return,
            Ok(_) => {
                if tx.blocking_send(Ok(Bytes::from(line))).is_err() {
                    return;
                }
            }
            Err(e) => {
                let _ = tx.blocking_send(Err(e));
                return;
            }
        }
    }
}

fn report(ep: &Endpoint, bytes: u64, started: Instant) {
    let secs = started.elapsed().as_secs_f64();
    eprintln!(
        "{bytes} bytes in {secs:.3} s ({:.1} MB/s)",
        bytes as f64 / secs.max(1e-9) / 1e6
    );
    eprintln!("endpoint: {:?}", ep.stats());
}
