//! The node's I/O: TCP and Unix-socket listeners, one reader and one
//! writer task per connection, in-process attachment ([`MemLink`]), and
//! graceful shutdown.
//!
//! A connection's reader decodes frames ([`skiff_proto::client_frame::Decoder`], bounded
//! by the payload limit) and hands them to the [`Broker`] in order; its
//! writer takes every ready frame from the client's outbox in one batch and
//! writes them with one system call. A frame that does not decode closes
//! that client with an error frame; the node goes on.

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::broker::{Broker, Fatal, Published};
use crate::config::Config;
use crate::outbox::ClientOut;
use crate::shm_listener::ShmListener;
use skiff::client::embed::{LocalFuture, LocalLink, LocalNode, LocalOutbox, Refusal};
use skiff::spin::Spin;
use skiff_proto::client_frame::{is_pub, ClientFrame, Code, Decoder, ServerFrame, FRAME_OVERHEAD};

/// A running node: its listeners and connections run as tokio tasks on the
/// runtime that started it.
#[derive(Debug)]
pub struct Node {
    broker: Arc<Broker>,
    tcp: Option<SocketAddr>,
    unix: Option<PathBuf>,
    shm: Option<ShmListener>,
    stop: watch::Sender<bool>,
    tasks: Option<tokio::task::JoinHandle<()>>,
    /// The wake-up latency request held while the node lives.
    wake: Option<crate::wake::WakeLatency>,
    /// Polls after traffic (setting `spin_us`).
    spin: Option<Arc<Spin>>,
}

impl Node {
    /// A node with no listeners, for in-process clients only (`mem://`).
    /// Needs no runtime until a client uses it.
    pub fn embedded(config: &Config) -> Node {
        let (stop, _) = watch::channel(false);
        Node {
            broker: Arc::new(Broker::new(config.limits.clone())),
            tcp: None,
            unix: None,
            shm: None,
            stop,
            tasks: None,
            wake: None,
            spin: None,
        }
    }

    /// Binds the listeners named in `config` and starts serving on the
    /// current tokio runtime. A TCP port of 0 picks a free port (see
    /// [`Node::tcp_addr`]). With `wake_latency_us` set, fails if the
    /// request cannot be held (it needs root): a setting asked for is not
    /// silently dropped.
    pub async fn start(config: &Config) -> io::Result<Node> {
        let mut node = Node::embedded(config);
        if let Some(us) = config.wake_latency_us {
            node.wake = Some(crate::wake::WakeLatency::request(us).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("wake_latency_us={us}: {e} (needs root; unset the setting to run without it)"),
                )
            })?);
        }
        let mut set = JoinSet::new();
        let spin = Spin::start(Duration::from_micros(config.spin_us));
        node.spin = spin.clone();
        if let Some(addr) = config.tcp {
            let l = TcpListener::bind(addr).await?;
            node.tcp = Some(l.local_addr()?);
            set.spawn(accept_tcp(
                l,
                node.broker.clone(),
                node.stop.subscribe(),
                spin.clone(),
            ));
        }
        if let Some(path) = &config.unix {
            // A stale socket file from a previous run would make bind fail.
            if std::fs::symlink_metadata(path).is_ok_and(|m| {
                use std::os::unix::fs::FileTypeExt;
                m.file_type().is_socket()
            }) {
                let _ = std::fs::remove_file(path);
            }
            let l = UnixListener::bind(path)?;
            node.unix = Some(path.clone());
            set.spawn(accept_unix(
                l,
                node.broker.clone(),
                node.stop.subscribe(),
                spin.clone(),
            ));
        }
        if let Some(loc) = &config.shm {
            let l = ShmListener::start(node.broker.clone(), loc)
                .map_err(|e| io::Error::other(format!("shm {loc}: {e}")))?;
            node.shm = Some(l);
        }
        if let Some(m) = &config.mesh {
            let (_, task) = crate::mesh::start(m, &node.broker, node.stop.subscribe()).await?;
            set.spawn(async move {
                let _ = task.await;
            });
        }
        node.tasks = Some(tokio::spawn(async move {
            while set.join_next().await.is_some() {}
        }));
        Ok(node)
    }

    /// The wake-up latency the node holds (see [`crate::wake`]), in µs.
    pub fn wake_latency_us(&self) -> Option<u32> {
        self.wake.as_ref().map(crate::wake::WakeLatency::micros)
    }

    /// The TCP address the node listens on.
    pub fn tcp_addr(&self) -> Option<SocketAddr> {
        self.tcp
    }

    /// The node's mesh address, when it is part of a mesh.
    pub fn mesh_addr(&self) -> Option<SocketAddr> {
        self.broker.mesh().map(|m| m.id().addr)
    }

    /// The Unix socket path the node listens on.
    pub fn unix_path(&self) -> Option<&std::path::Path> {
        self.unix.as_deref()
    }

    /// The node's shared-memory listener, when it has one.
    pub fn shm(&self) -> Option<&ShmListener> {
        self.shm.as_ref()
    }

    /// The node's state (for stats and tests).
    pub fn broker(&self) -> &Arc<Broker> {
        &self.broker
    }

    /// Attaches an in-process client.
    pub fn attach_mem(&self) -> Result<MemLink, Fatal> {
        MemLink::attach(self.broker.clone())
    }

    /// Graceful shutdown: stops accepting clients and reading from them,
    /// waits (up to the configured drain timeout) until everything queued
    /// for them has been handed to their connections, then closes every
    /// client with a `shutdown` error frame.
    pub async fn shutdown(mut self) {
        self.broker.begin_shutdown();
        let _ = self.stop.send(true);
        let deadline = tokio::time::Instant::now() + self.broker.limits().drain_timeout();
        while !self.broker.drained() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        self.broker
            .close_all(Code::Shutdown, "the node is shutting down");
        if let Some(t) = self.tasks.take() {
            let _ = tokio::time::timeout(Duration::from_secs(2), t).await;
        }
        if let Some(p) = &self.unix {
            let _ = std::fs::remove_file(p);
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(s) = &self.spin {
            s.close();
        }
        let _ = self.stop.send(true);
        self.broker
            .close_all(Code::Shutdown, "the node was dropped");
    }
}

async fn accept_tcp(
    l: TcpListener,
    broker: Arc<Broker>,
    mut stop: watch::Receiver<bool>,
    spin: Option<Arc<Spin>>,
) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            r = l.accept() => match r {
                Ok((s, peer)) => {
                    let _ = s.set_nodelay(true);
                    let (r, w) = s.into_split();
                    conns.spawn(serve(broker.clone(), r, w, format!("tcp:{peer}"), stop.clone(), spin.clone()));
                }
                // Out of descriptors or similar: back off, keep serving.
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            },
            _ = stop.changed() => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    while conns.join_next().await.is_some() {}
}

async fn accept_unix(
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
                    let (r, w) = s.into_split();
                    conns.spawn(serve(broker.clone(), r, w, format!("unix:{n}"), stop.clone(), spin.clone()));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            },
            _ = stop.changed() => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    while conns.join_next().await.is_some() {}
}

/// Serves one connection until either side closes it.
async fn serve<R, W>(
    broker: Arc<Broker>,
    mut r: R,
    mut w: W,
    peer: String,
    mut stop: watch::Receiver<bool>,
    spin: Option<Arc<Spin>>,
) where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let out = match broker.attach(peer) {
        Ok(out) => out,
        Err(f) => {
            let mut buf = Vec::new();
            ServerFrame::Error {
                corr: 0,
                code: f.code,
                text: f.text,
            }
            .encode(&mut buf);
            let _ = w.write_all(&buf).await;
            let _ = w.shutdown().await;
            return;
        }
    };
    let writer = tokio::spawn(write_loop(out.clone(), w));
    let max_payload = broker.limits().max_payload;
    let dec = Decoder::new(max_payload + FRAME_OVERHEAD);
    let mut buf = BytesMut::with_capacity(64 * 1024);
    let mut error = None;
    let mut pubs = Vec::new();
    'read: loop {
        if buf.capacity() - buf.len() < 4096 {
            buf.reserve(64 * 1024);
        }
        tokio::select! {
            n = r.read_buf(&mut buf) => match n {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    if let Some(s) = &spin {
                        s.touch();
                    }
                }
            },
            _ = out.closed() => break,
            _ = stop.changed() => break,
        }
        // Every whole frame read: runs of publishes go to the broker as
        // one batch, other frames one by one, in order.
        loop {
            let body = match dec.next(&mut buf) {
                Ok(Some(b)) => b,
                Ok(None) => break,
                Err(e) => {
                    error = Some(protocol(&broker, e));
                    break 'read;
                }
            };
            if is_pub(&body) {
                match Published::from_frame(body, max_payload) {
                    Ok(p) => pubs.push(p),
                    Err(e) => {
                        broker.publish_batch(&out, &mut pubs).await;
                        error = Some(protocol(&broker, e));
                        break 'read;
                    }
                }
                if pubs.len() >= 1024 {
                    broker.publish_batch(&out, &mut pubs).await;
                }
                continue;
            }
            let frame = match ClientFrame::decode(body, max_payload) {
                Ok(f) => f,
                Err(e) => {
                    broker.publish_batch(&out, &mut pubs).await;
                    error = Some(protocol(&broker, e));
                    break 'read;
                }
            };
            broker.publish_batch(&out, &mut pubs).await;
            if let Err(f) = broker.handle(&out, frame).await {
                broker.protocol_error();
                error = Some((f.code, f.text));
                break 'read;
            }
        }
        broker.publish_batch(&out, &mut pubs).await;
    }
    if *stop.borrow() && error.is_none() {
        // Shutting down: the node drains, then closes every client.
        let _ = writer.await;
        return;
    }
    broker.detach(out.id, error);
    let _ = writer.await;
}

fn protocol(broker: &Broker, e: skiff_proto::WireError) -> (Code, String) {
    broker.protocol_error();
    (
        Code::Protocol,
        format!("protocol error, closing this connection: {e}"),
    )
}

async fn write_loop<W: AsyncWrite + Unpin>(out: Arc<ClientOut>, mut w: W) {
    let mut buf = Vec::with_capacity(64 * 1024);
    while out.next_encoded(&mut buf).await {
        if !buf.is_empty() {
            if w.write_all(&buf).await.is_err() {
                return;
            }
            buf.clear();
        }
        if buf.capacity() > 4 << 20 {
            buf = Vec::with_capacity(64 * 1024);
        }
    }
    let _ = w.shutdown().await;
}

/// An in-process client's attachment to a node (`mem://`): frames go in
/// and come out as values, with no encoding and no copy.
#[derive(Debug)]
pub struct MemLink {
    broker: Arc<Broker>,
    out: Arc<ClientOut>,
}

impl MemLink {
    /// Attaches a new client to `broker`.
    pub fn attach(broker: Arc<Broker>) -> Result<MemLink, Fatal> {
        let out = broker.attach("mem".into())?;
        Ok(MemLink { broker, out })
    }

    /// Hands one frame to the node. An error means the node closed this
    /// client.
    pub async fn send(&self, frame: ClientFrame) -> Result<(), Fatal> {
        if self.out.is_closed() {
            return Err(Fatal {
                code: Code::Shutdown,
                text: "closed".into(),
            });
        }
        match self.broker.handle(&self.out, frame).await {
            Ok(()) => Ok(()),
            Err(f) => {
                self.broker
                    .detach(self.out.id, Some((f.code, f.text.clone())));
                Err(f)
            }
        }
    }

    /// Hands a frame that never waits (anything but publish and request)
    /// to the node at once.
    pub fn send_control(&self, frame: ClientFrame) -> Result<(), Fatal> {
        match self.broker.handle_control(&self.out, frame) {
            Ok(()) => Ok(()),
            Err(f) => {
                self.broker
                    .detach(self.out.id, Some((f.code, f.text.clone())));
                Err(f)
            }
        }
    }

    /// Moves every frame the node has for this client into `out`, waiting
    /// until there is one; `false` once the client is closed.
    pub async fn recv(&self, out: &mut Vec<ServerFrame>) -> bool {
        self.out.next_batch(out).await
    }

    /// The client's outbox in the node, from which [`MemLink::recv`] takes
    /// frames (for a task that must not keep the link alive).
    pub fn outbox(&self) -> Arc<ClientOut> {
        self.out.clone()
    }

    /// The node's id for this client.
    pub fn id(&self) -> u64 {
        self.out.id
    }

    /// Detaches the client (also done on drop).
    pub fn close(&self) {
        self.broker.detach(self.out.id, None);
    }
}

impl Drop for MemLink {
    fn drop(&mut self) {
        self.close();
    }
}

fn refusal(f: Fatal) -> Refusal {
    Refusal {
        code: f.code,
        text: f.text,
    }
}

impl LocalNode for Node {
    fn attach(&self) -> Result<Box<dyn LocalLink>, Refusal> {
        Ok(Box::new(self.attach_mem().map_err(refusal)?))
    }
}

impl LocalLink for MemLink {
    fn send(&self, frame: ClientFrame) -> LocalFuture<'_, Result<(), Refusal>> {
        Box::pin(async move { MemLink::send(self, frame).await.map_err(refusal) })
    }

    fn send_control(&self, frame: ClientFrame) -> Result<(), Refusal> {
        MemLink::send_control(self, frame).map_err(refusal)
    }

    fn outbox(&self) -> Arc<dyn LocalOutbox> {
        self.out.clone()
    }

    fn id(&self) -> u64 {
        self.out.id
    }

    fn max_payload(&self) -> usize {
        self.broker.limits().max_payload
    }

    fn close(&self) {
        MemLink::close(self)
    }
}

impl LocalOutbox for ClientOut {
    fn take(&self, out: &mut Vec<ServerFrame>) {
        ClientOut::take(self, out);
    }

    fn next_batch<'a>(&'a self, out: &'a mut Vec<ServerFrame>) -> LocalFuture<'a, bool> {
        Box::pin(ClientOut::next_batch(self, out))
    }
}
