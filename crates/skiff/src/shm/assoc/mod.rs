//! The `udp://host:port?reliable=true` transport of the buffer API: the
//! tcp transport's framing (RocketBufs' 32-bit buffer id + 32-bit size,
//! see `frame.rs`) carried over skiff associations, one frame per
//! [`Tunnel`] message, with end-to-end credits.
//!
//! Only the public API of [`Endpoint`] and [`Tunnel`] is used: an output
//! binds an endpoint and listens; every input binds its own endpoint and
//! connects one tunnel to it. Both sides keep rings exactly as over tcp:
//!
//! - **Output**: one sender thread and one reader thread per tunnel. The
//!   sender is a consumer of each ring the subscriber asked for; it copies
//!   a segment out of the ring into one tunnel message (the public
//!   `Tunnel::send` takes owned bytes: one user-space copy) and waits in
//!   `send` while the tunnel's send buffer is full. The reader takes
//!   subscribe and credit frames.
//! - **Input**: one I/O thread per input. It is the producer of the
//!   input's local rings (one per subscribed buffer): a segment frame is
//!   copied from the tunnel message straight into the ring, readable in
//!   place by the application.
//!
//! **Credits** (credit flow): the sender sends a segment only while the
//! subscriber's ring has room for it (bytes and segment records), and it
//! consumes the segment from the output's ring only when the subscriber's
//! credit frame says the application consumed it ([`Input::consumed`]
//! nudges the I/O thread, which reports the ring's consumer positions).
//! So the output's ring is full exactly when a subscriber's is: the
//! producer gets `WouldBlock` or waits, memory is bounded on both sides,
//! the tunnel is never stalled by a slow application (dead-peer detection
//! keeps working), and a delivery notification means every subscriber
//! consumed the segment. Overwrite flow sends every segment at once, never
//! waits for credits, and the subscriber's ring is an overwrite ring too
//! (sequence locks, torn and lost reads counted).
//!
//! **Failure**: a tunnel that closes gracefully ends the subscriber's
//! buffers with `Closed` (after the data); one that fails (the peer's
//! process died, the path broke: no answer for the association's
//! `idle_timeout`) ends them with [`BufferError::PeerLost`], and the output
//! detaches that subscriber (counted in `subscribers_lost`), which
//! unblocks its producer.
//!
//! **Hostile input**: every frame is decoded with explicit length checks;
//! a malformed frame is dropped and counted, a frame for an unknown buffer
//! is dropped and counted, a segment that overruns the credits or the
//! subscribed size closes that buffer as corrupt (counted), and a credit
//! beyond what was sent detaches the subscriber (counted). Allocation per
//! frame is bounded by the association's `max_message`; pending
//! subscriptions per tunnel by [`MAX_PENDING`].
//!
//! [`Input::consumed`]: crate::shm::Input::consumed

mod client;
mod frame;
mod server;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::Thread;
use std::time::{Duration, Instant};

use super::{BufferError, Counters};
use crate::endpoint::{DriverMode, Endpoint, EndpointConfig};
use crate::tunnel::Tunnel;

pub(crate) use self::client::Client;
pub(crate) use self::frame::MAX_LEN;
pub(crate) use self::server::Server;

/// Subscriptions one tunnel may have waiting for their buffer to appear;
/// further requests are dropped and counted.
pub(crate) const MAX_PENDING: usize = 1024;

/// How long a waiting thread sleeps before it re-checks its stop flags.
const TICK: Duration = Duration::from_millis(50);

/// How often changed credits are reported without a nudge.
const CREDIT_EVERY: Duration = Duration::from_millis(5);

/// How long a closing side waits for its last frames and the tunnel's
/// graceful close.
const LINGER: Duration = Duration::from_secs(2);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

struct Unpark(Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// A waker that unparks the calling thread.
fn thread_waker() -> Waker {
    Waker::from(Arc::new(Unpark(std::thread::current())))
}

/// Polls `f` on this thread (parked between polls; `waker` must be this
/// thread's) until it is ready or `deadline` passes (`None`).
fn block_on<T>(
    waker: &Waker,
    deadline: Option<Instant>,
    mut f: impl FnMut(&mut Context<'_>) -> Poll<T>,
) -> Option<T> {
    let mut cx = Context::from_waker(waker);
    loop {
        if let Poll::Ready(v) = f(&mut cx) {
            return Some(v);
        }
        match deadline {
            None => std::thread::park(),
            Some(d) => {
                let now = Instant::now();
                if now >= d {
                    return None;
                }
                std::thread::park_timeout(d - now);
            }
        }
    }
}

/// Closes `t` gracefully, waiting at most [`LINGER`].
fn close_tunnel(t: &Tunnel, waker: &Waker) {
    let mut f = std::pin::pin!(t.close());
    let _ = block_on(waker, Some(Instant::now() + LINGER), |cx| {
        f.as_mut().poll(cx)
    });
}

/// The endpoint for `addr` with the endpoint options of the locator.
fn endpoint(bind: SocketAddr, options: &str) -> Result<Endpoint, BufferError> {
    let loc = if options.is_empty() {
        format!("udp://{bind}")
    } else {
        format!("udp://{bind}?{options}")
    };
    let mut config = EndpointConfig::from_locator(&loc)?;
    // Its calls block their thread until the driver has moved the data:
    // the driver keeps a thread of its own unless asked otherwise.
    if config.driver == DriverMode::Auto {
        config.driver = DriverMode::Thread;
    }
    Endpoint::with_config(config)
        .map_err(|e| BufferError::io("udp endpoint")(std::io::Error::other(e.to_string())))
}
