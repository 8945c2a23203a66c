//! The other systems skiff is compared with, run as child processes: the
//! ZeroMQ peer (`bench/zmq/zmq_bench.c`, built by `bench/zmq/build.sh`)
//! and nats-server (Debian's package) driven by `bench/nats/natsbench`
//! (nats.go, built by `bench/nats/build.sh`). Both print their figures as
//! rows in skiff's JSON schema ([`Row`]).

use std::error::Error;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use skiff_cli::bench::pubsub::Places;
use skiff_cli::bench::report::Row;
use skiff_cli::bench::server::{free_port, Server};
use skiff_cli::bench::Limits;

/// The ZeroMQ peer to run: `explicit` if given (it must exist), else the
/// first `zmq_bench` found in `$CARGO_TARGET_DIR`, beside this binary's
/// target directory or under ./target, else `None` with a note on stderr
/// (the zmq rows are then skipped).
pub(crate) fn zmq_path(explicit: Option<&Path>) -> Result<Option<PathBuf>, String> {
    if let Some(p) = explicit {
        return if p.is_file() {
            Ok(Some(p.to_path_buf()))
        } else {
            Err(format!(
                "--zmq {}: no such file (bench/zmq/build.sh builds it)",
                p.display()
            ))
        };
    }
    let mut candidates = Vec::new();
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR") {
        candidates.push(PathBuf::from(dir).join("zmq_bench"));
    }
    // target/release/skiff-bench → target/zmq_bench
    if let Some(target) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent()?.parent().map(Path::to_path_buf))
    {
        candidates.push(target.join("zmq_bench"));
    }
    candidates.push(PathBuf::from("target/zmq_bench"));
    match candidates.into_iter().find(|p| p.is_file()) {
        Some(p) => Ok(Some(p)),
        None => {
            eprintln!("note: zmq rows skipped: target/zmq_bench not found (run bench/zmq/build.sh or pass --zmq PATH)");
            Ok(None)
        }
    }
}

/// Runs the ZeroMQ peer with `args` and reads its rows (one JSON line
/// each).
fn zmq_rows(path: &Path, args: &[String]) -> Result<Vec<Row>, Box<dyn Error>> {
    let output = Command::new(path)
        .args(args)
        .output()
        .map_err(|e| format!("cannot run {}: {e}", path.display()))?;
    if !output.status.success() {
        return Err(format!(
            "{} failed ({}): {}",
            path.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )
        .into());
    }
    let rows = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            serde_json::from_str::<Row>(l)
                .map_err(|e| format!("bad row from {}: {e}: {l}", path.display()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(rows)
}

/// ZeroMQ PUSH/PULL over TCP at `size` bytes (rows `zmq`).
pub(crate) fn zmq_tcp(
    path: &Path,
    size: usize,
    limits: Limits,
) -> Result<Vec<Row>, Box<dyn Error>> {
    // Two contexts, one I/O thread each: the layout of a sender and a
    // receiver in two processes, and the faster of the two on two cores.
    let rows = zmq_rows(
        path,
        &[
            size.to_string(),
            limits.messages.to_string(),
            format!("{}", limits.duration.as_secs_f64()),
            "1".into(),
            "2".into(),
        ],
    )?;
    if rows.is_empty() {
        return Err(format!("{} printed no row", path.display()).into());
    }
    Ok(rows)
}

/// ZeroMQ over `ipc://` at `size` bytes, `transport` `ipc` (PUSH/PULL
/// rate) or `ipc-pingpong` (PAIR round trips): rows `zmq-ipc…`.
pub(crate) fn zmq_ipc(
    path: &Path,
    size: usize,
    limits: Limits,
    transport: &str,
) -> Result<Vec<Row>, Box<dyn Error>> {
    zmq_rows(
        path,
        &[
            size.to_string(),
            limits.messages.to_string(),
            format!("{}", limits.duration.as_secs_f64()),
            "1".into(),
            // One context: with two, libzmq 4.3.4's ipc PUSH/PULL in this
            // harness stalled before the end marker (not investigated).
            "1".into(),
            transport.into(),
        ],
    )
}

fn wait_port(port: u16) -> Result<(), Box<dyn Error>> {
    let t = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if t.elapsed() > Duration::from_secs(10) {
            return Err(format!("nothing listens on port {port} after 10 s").into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// `nats-server` (`$NATS_SERVER`, else the one on the `PATH`; the bench
/// scripts set it to the newest release) on a free port, once it listens.
pub(crate) fn nats_server() -> Result<Server, Box<dyn Error>> {
    let port = free_port()?;
    let bin = std::env::var_os("NATS_SERVER").unwrap_or_else(|| "nats-server".into());
    let child = Command::new(bin)
        .args(["-a", "127.0.0.1", "-p", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| {
            format!("cannot start nats-server ({e}); set NATS_SERVER, or run bench/nats/server.sh to install the newest")
        })?;
    let server = Server::new(child, format!("nats://127.0.0.1:{port}"));
    wait_port(port)?;
    Ok(server)
}

/// The natsbench binary: `$SKIFF_NATSBENCH`, else `bench/nats/natsbench`.
fn natsbench() -> Result<PathBuf, Box<dyn Error>> {
    let p = std::env::var_os("SKIFF_NATSBENCH")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("bench/nats/natsbench"));
    if p.exists() {
        Ok(p)
    } else {
        Err(format!("{} not found: run bench/nats/build.sh first", p.display()).into())
    }
}

/// natsbench's flags for `places` (nats URLs).
pub(crate) fn natsbench_places(places: &Places) -> Vec<String> {
    let mut v = vec!["-pub-url".to_owned(), places.publisher.clone()];
    for s in &places.subscribers {
        v.push("-sub-url".into());
        v.push(s.clone());
    }
    v
}

/// Runs natsbench with `args` and parses its row.
pub(crate) fn run_natsbench(args: &[String]) -> Result<Row, Box<dyn Error>> {
    let out = Command::new(natsbench()?).args(args).output()?;
    if !out.status.success() {
        return Err(format!("natsbench failed: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
    Ok(serde_json::from_slice(&out.stdout)?)
}
