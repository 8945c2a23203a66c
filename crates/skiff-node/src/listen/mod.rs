//! The node's front ends: each turns what its clients send into the one
//! client [`Session`] and hands what the session yields to the broker by
//! `feed`, the one processing path (nats-server's habit: a new protocol
//! adds a parser, not a broker path).
//!
//! - `stream`: TCP and Unix sockets (a read buffer per connection);
//! - [`shm`]: shared-memory rings (segments read in place, no copy);
//! - `nats`: the NATS client protocol (a parser of its own, into the same
//!   session and broker path);
//! - [`mem`]: in-process clients (`mem://`), whose frames are already
//!   values: they skip the decoding and go straight to `handle`.
//!
//! The mesh ([`crate::mesh`]) is not a client front end: other nodes'
//! publishes reach the broker through `Broker::publish_remote`.

pub(crate) mod admit;
pub(crate) mod handshake;
pub mod mem;
pub mod nats;
pub mod shm;
pub mod shm_topic;
pub(crate) mod stream;

use std::sync::Arc;

use skiff_proto::client_frame::{ClientFrame, Code};

use crate::broker::Broker;
use crate::outbox::ClientOut;
use crate::session::{Event, Input, Session};

/// Hands everything whole in `input` to the broker through `session`, in
/// order, waiting before each frame other than a publish while the client
/// is over its pending-bytes limit. `Err`: close the client with this error (counted as a protocol
/// error); nothing more is read.
pub(crate) async fn feed<I: Input + ?Sized>(
    broker: &Broker,
    out: &Arc<ClientOut>,
    session: &mut Session,
    input: &mut I,
) -> Result<(), (Code, String)> {
    while let Some(e) = session.poll_event(input) {
        act(broker, out, session, e).await?;
    }
    Ok(())
}

/// Does what one session event asks of the broker, as [`feed`] does for
/// each: a run of publishes, a frame (after waiting while the client is
/// over its pending-bytes limit, for frames that may queue it a reply),
/// or the close of a client that broke its protocol.
pub(crate) async fn act(
    broker: &Broker,
    out: &Arc<ClientOut>,
    session: &mut Session,
    e: Event,
) -> Result<(), (Code, String)> {
    match e {
        Event::Publish => broker.publish_batch(out, session.run()).await,
        Event::Frame(f) => {
            // A client over its pending-bytes limit is not read until
            // it drains. Frames that queue nothing for their sender
            // (publishes, replies, credit, tunnel data) skip the check:
            // no lock on those hot paths.
            if !matches!(
                f,
                ClientFrame::Reply { .. }
                    | ClientFrame::Credit { .. }
                    | ClientFrame::TunData { .. }
                    | ClientFrame::TunCredit { .. }
            ) {
                out.wait_room().await;
            }
            handle(broker, out, f).await?
        }
        Event::Close(code, text) => {
            broker.protocol_error();
            return Err((code, text));
        }
    }
    Ok(())
}

/// One decoded frame from client `out`, from any front end, to the broker.
/// `Err`: close the client with this error (counted as a protocol error).
pub(crate) async fn handle(
    broker: &Broker,
    out: &Arc<ClientOut>,
    f: ClientFrame,
) -> Result<(), (Code, String)> {
    broker.handle(out, f).await.map_err(|f| {
        broker.protocol_error();
        (f.code, f.text)
    })
}
