//! The TCP and Unix-socket front ends: an accept loop per listener, and
//! per connection a reader task and a writer task.
//!
//! The reader reads into one buffer and drives the connection's
//! [`Session`] ([`crate::listen::feed`]): every whole frame read goes to
//! the broker in order, runs of publishes as one batch. The writer takes
//! every ready frame from the client's outbox in one batch and writes them
//! with one system call. A frame that does not decode closes that client
//! with an error frame; the node goes on.
//!
//! A frame begun must be whole within its deadline
//! ([`crate::config::Limits::frame_deadline`]), or the client is closed
//! with an error naming `read_timeout_ms`: a sender that stops mid-frame
//! does not hold its buffer for long. The buffer grows with what was read
//! (the decoder reserves at most as much again), not with the length a
//! frame header claims.
//!
//! Keepalive, as nats-server's: a client the node has read nothing from
//! for `ping_interval_ms` is sent a `Ping`, which any frame answers; after
//! `max_pings_out` unanswered it is closed with an error naming them.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::broker::Broker;
use crate::outbox::ClientOut;
use crate::session::Session;
use skiff::spin::Spin;
use skiff_proto::client_frame::{Code, ServerFrame, LEN_PREFIX};

pub(crate) async fn accept_tcp(
    l: TcpListener,
    broker: Arc<Broker>,
    mut stop: watch::Receiver<bool>,
    spin: Option<Arc<Spin>>,
    tls: Option<tokio_rustls::TlsAcceptor>,
) {
    let mut conns = JoinSet::new();
    let admission = super::admit::Admission::new(&broker.limits());
    loop {
        tokio::select! {
            r = l.accept() => match r {
                Ok((s, peer)) => {
                    let ticket = match admission.admit(peer.ip()) {
                        Ok(t) => t,
                        Err(why) => {
                            broker.limit_hit();
                            if tls.is_none() {
                                let (_, w) = s.into_split();
                                conns.spawn(refuse(w, Code::Limit, why));
                            }
                            continue;
                        }
                    };
                    let _ = s.set_nodelay(true);
                    let (broker, stop, spin) = (broker.clone(), stop.clone(), spin.clone());
                    let serving: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> = match &tls {
                        None => {
                            let (r, w) = s.into_split();
                            Box::pin(serve(broker, r, w, format!("tcp:{peer}"), None, stop, spin))
                        }
                        Some(acceptor) => {
                            Box::pin(serve_tls(acceptor.clone(), s, broker, format!("tls:{peer}"), stop, spin))
                        }
                    };
                    conns.spawn(async move {
                        serving.await;
                        drop(ticket);
                    });
                }
                // Out of descriptors or similar: back off, keep serving.
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            },
            _ = stop.changed() => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    // Closed now: a client connecting during the drain is refused at
    // once rather than left in the backlog.
    drop(l);
    while conns.join_next().await.is_some() {}
}

pub(crate) async fn accept_unix(
    l: UnixListener,
    broker: Arc<Broker>,
    mut stop: watch::Receiver<bool>,
    spin: Option<Arc<Spin>>,
) {
    let mut conns = JoinSet::new();
    let mut n = 0u64;
    loop {
        tokio::select! {
            r = l.accept() => match r {
                Ok((s, _)) => {
                    n += 1;
                    // The kernel's word on who the peer is (SO_PEERCRED).
                    let ids = s.peer_cred().ok().map(|c| (c.uid(), c.gid()));
                    let (r, w) = s.into_split();
                    conns.spawn(serve(broker.clone(), r, w, format!("unix:{n}"), ids, stop.clone(), spin.clone()));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            },
            _ = stop.changed() => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    // Closed now: a client connecting during the drain is refused at
    // once rather than left in the backlog.
    drop(l);
    while conns.join_next().await.is_some() {}
}

/// A receive buffer up to this size is every connection's own (bounded by
/// `max_connections`, like its socket buffers); one grown past it for a
/// large frame is charged to the node's budget (`max_total_pending_bytes`).
const INPUT_FREE: usize = 256 * 1024;

/// Runs the TLS handshake (within the authentication time limit), then
/// serves the connection. A failed or stalled handshake is counted.
async fn serve_tls(
    acceptor: tokio_rustls::TlsAcceptor,
    s: tokio::net::TcpStream,
    broker: Arc<Broker>,
    peer: String,
    stop: watch::Receiver<bool>,
    spin: Option<Arc<Spin>>,
) {
    let limit = broker.auth().timeout();
    match tokio::time::timeout(limit, acceptor.accept(s)).await {
        Ok(Ok(t)) => {
            let (r, w) = tokio::io::split(t);
            serve(broker, r, w, peer, None, stop, spin).await
        }
        // A client without the certificate asked for, one that does not
        // speak TLS 1.3, or one that stalled: rustls has answered with an
        // alert where it could.
        _ => broker.tls_failure(),
    }
}

/// Writes a closing error frame and closes the connection.
async fn refuse<W: AsyncWrite + Unpin>(mut w: W, code: Code, text: String) {
    let mut buf = Vec::new();
    ServerFrame::Error {
        corr: 0,
        code,
        text,
    }
    .encode(&mut buf);
    let _ = w.write_all(&buf).await;
    let _ = w.shutdown().await;
}

/// Serves one connection until either side closes it: the
/// authentication handshake (`handshake`), then the session. `local`: a
/// Unix-socket peer's (uid, gid).
pub(crate) async fn serve<R, W>(
    broker: Arc<Broker>,
    mut r: R,
    mut w: W,
    peer: String,
    local: Option<(u32, u32)>,
    mut stop: watch::Receiver<bool>,
    spin: Option<Arc<Spin>>,
) where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let mut buf = BytesMut::with_capacity(64 * 1024);
    let user = tokio::select! {
        u = super::handshake::authenticate(&broker, &mut r, &mut w, &mut buf, local) => u,
        _ = stop.changed() => return,
    };
    let user = match user {
        Ok(u) => u,
        Err((code, text)) => {
            crate::warn_every!("refused authentication", peer = %peer, reason = %text, "authentication refused");
            return refuse(w, code, text).await;
        }
    };
    let out = match broker.attach_as(peer, user) {
        Ok(out) => out,
        Err(f) => return refuse(w, f.code, f.text).await,
    };
    let writer = tokio::spawn(write_loop(out.clone(), w));
    let mut session = Session::new(&broker.limits(), "connection");
    let mut error = None;
    // The frame left partly read in `buf`, if any: (frames read before it,
    // its length once known, when it began); `timer` fires at its deadline.
    let mut partial: Option<(u64, Option<usize>, Instant)> = None;
    let timer = tokio::time::sleep(Duration::ZERO);
    tokio::pin!(timer);
    // Keepalive: whether anything was read since the last tick, and the
    // pings sent since something was.
    let limits = broker.limits();
    let keepalive = limits.ping_interval_ms > 0;
    let every = Duration::from_millis(limits.ping_interval_ms.max(1));
    let mut ping = tokio::time::interval_at(Instant::now() + every, every);
    ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (mut heard, mut pings_out) = (false, 0u32);
    // Bytes of the receive buffer charged to the node's budget.
    let mut charged = 0;
    let mut closed_by_node = false;
    loop {
        if buf.capacity() - buf.len() < 4096 {
            buf.reserve(64 * 1024);
        }
        tokio::select! {
            n = r.read_buf(&mut buf) => match n {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    out.count_in(n);
                    heard = true;
                    if let Some(s) = &spin {
                        s.touch();
                    }
                }
            },
            _ = out.closed() => {
                closed_by_node = true;
                break;
            }
            // Shutting down: go on reading (the client's credit lets the
            // node drain what it holds for it) until the node closes it.
            r = stop.changed(), if !*stop.borrow() => if r.is_ok() { continue } else { break },
            _ = &mut timer, if partial.is_some() => {
                let (_, len, begun) = partial.expect("armed");
                broker.limit_hit();
                error = Some((Code::Limit, format!(
                    "read timeout, closing this connection: a frame of {} bytes begun {:.1} s ago is not whole (read_timeout_ms)",
                    len.map_or("unknown".into(), |l| l.to_string()),
                    begun.elapsed().as_secs_f64(),
                )));
                break;
            }
            _ = ping.tick(), if keepalive => {
                if std::mem::take(&mut heard) {
                    pings_out = 0;
                } else if pings_out >= limits.max_pings_out {
                    broker.limit_hit();
                    error = Some((Code::Limit, format!(
                        "stale connection, closing it: {pings_out} pings unanswered (ping_interval_ms, max_pings_out)"
                    )));
                    break;
                } else {
                    pings_out += 1;
                    out.control(ServerFrame::Ping);
                }
                continue;
            }
        }
        // Every whole frame read, in order; runs of publishes as one batch.
        if let Err(e) = super::feed(&broker, &out, &mut session, &mut buf).await {
            error = Some(e);
            break;
        }
        // The broker took every publish read so far: say so, once per
        // read, to a client that asked (`Confirm`).
        out.confirm_taken(session.publishes());
        arm_deadline(&mut partial, timer.as_mut(), &buf, &session, &broker);
        // A receive buffer grown for a large frame is charged to the
        // node's budget while it is held, and given back once empty.
        if buf.is_empty() && buf.capacity() > INPUT_FREE {
            buf = BytesMut::new();
        }
        let held = if buf.capacity() > INPUT_FREE {
            buf.capacity()
        } else {
            0
        };
        if held != charged {
            if !out.hold_input(held) {
                broker.limit_hit();
                error = Some((Code::Limit, out.budget_error()));
                break;
            }
            charged = held;
        }
    }
    out.hold_input(0);
    // (Closed by the node, as a shutdown's drain ends: already detached,
    // and detaching again does nothing.)
    broker.detach(out.id, error);
    let _ = writer.await;
    if closed_by_node {
        // Read what the client still sends until it closes too (briefly):
        // closing a socket with unread bytes resets it, and a reset can
        // discard what the client has not read yet (the last messages,
        // the closing error frame).
        let _ = tokio::time::timeout(LINGER, async {
            loop {
                buf.clear();
                match r.read_buf(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
        })
        .await;
    }
}

/// How long a connection the node closed is read after, waiting for the
/// client to close its side.
const LINGER: Duration = Duration::from_secs(1);

/// Keeps `partial` and `timer` up to date with what is left in `buf` once
/// every whole frame was taken: no deadline when it is empty; a new one
/// when a new frame has begun; a later one once that frame's header tells
/// its length. Reads no clock unless a read ends mid-frame.
fn arm_deadline(
    partial: &mut Option<(u64, Option<usize>, Instant)>,
    timer: std::pin::Pin<&mut tokio::time::Sleep>,
    buf: &BytesMut,
    session: &Session,
    broker: &Broker,
) {
    if buf.is_empty() {
        *partial = None;
        return;
    }
    let len = (buf.len() >= LEN_PREFIX).then(|| {
        let mut l = [0; LEN_PREFIX];
        l.copy_from_slice(&buf[..LEN_PREFIX]);
        LEN_PREFIX + u32::from_le_bytes(l) as usize
    });
    let begun = match *partial {
        Some((frames, known, begun)) if frames == session.frames() => {
            if known == len {
                return;
            }
            begun
        }
        _ => Instant::now(),
    };
    *partial = Some((session.frames(), len, begun));
    timer.reset(begun + broker.limits().frame_deadline(len.unwrap_or(0)));
}

async fn write_loop<W: AsyncWrite + Unpin>(out: Arc<ClientOut>, mut w: W) {
    let mut buf = Vec::with_capacity(64 * 1024);
    while out.next_encoded(&mut buf).await {
        if !buf.is_empty() {
            if w.write_all(&buf).await.is_err() {
                return;
            }
            out.count_out(buf.len());
            buf.clear();
        }
        if buf.capacity() > 4 << 20 {
            buf = Vec::with_capacity(64 * 1024);
        }
    }
    let _ = w.shutdown().await;
}
