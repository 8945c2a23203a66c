//! Waiting from Python: with the GIL released, in slices of
//! [`SIGNAL_SLICE`](crate::SIGNAL_SLICE) so that Ctrl-C interrupts, up to
//! an optional deadline. Two ways: [`block_on`] drives a future on the
//! runtime; [`Parker`] is a waker that parks the calling thread, for
//! handles polled by hand (subscriptions, members, tunnels), which need
//! no runtime thread at all.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;

use crate::{rt, SIGNAL_SLICE};

/// A timeout argument: `None` (forever) or seconds as an int or float,
/// finite and not negative; the error names the parameter.
pub(crate) fn timeout_arg(name: &str, t: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Duration>> {
    let Some(t) = t else { return Ok(None) };
    if t.is_none() {
        return Ok(None);
    }
    if t.is_instance_of::<pyo3::types::PyBool>() {
        return Err(PyTypeError::new_err(format!(
            "{name} must be a number of seconds or None, not bool"
        )));
    }
    let s: f64 = t.extract().map_err(|_| {
        PyTypeError::new_err(format!(
            "{name} must be a number of seconds or None, not {}",
            type_name(t)
        ))
    })?;
    if !s.is_finite() || !(0.0..=1e9).contains(&s) {
        return Err(PyValueError::new_err(format!(
            "{name} must be a finite number of seconds >= 0 (and below 1e9), not {s}"
        )));
    }
    Ok(Some(Duration::from_secs_f64(s)))
}

/// A required timeout in seconds (no `None`).
pub(crate) fn seconds_arg(name: &str, t: &Bound<'_, PyAny>) -> PyResult<Duration> {
    timeout_arg(name, Some(t))?.ok_or_else(|| {
        PyTypeError::new_err(format!("{name} must be a number of seconds, not None"))
    })
}

/// The name of `o`'s type, for error messages.
pub(crate) fn type_name(o: &Bound<'_, PyAny>) -> String {
    o.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into())
}

/// The deadline `timeout` from now (`None`: never).
pub(crate) fn deadline(timeout: Option<Duration>) -> Option<Instant> {
    timeout.map(|t| Instant::now() + t)
}

/// The next slice of a wait, or `None` once `deadline` passed.
fn slice(deadline: Option<Instant>) -> Option<Duration> {
    match deadline {
        None => Some(SIGNAL_SLICE),
        Some(d) => {
            let left = d.saturating_duration_since(Instant::now());
            (!left.is_zero()).then(|| left.min(SIGNAL_SLICE))
        }
    }
}

/// Polls `fut` once, on this thread, with a waker that does nothing: the
/// fast path of calls that usually finish at once (a publish into the
/// write buffer). `Pending` means: drive it with [`block_on`] (or hand it
/// to the event loop), never drop it half done.
pub(crate) fn poll_once<F: Future + ?Sized>(fut: Pin<&mut F>) -> Poll<F::Output> {
    let _rt = rt().enter();
    fut.poll(&mut Context::from_waker(Waker::noop()))
}

/// Drives `fut` on the runtime with the GIL released until it finishes
/// (`Some`) or `deadline` passes (`None`); raises `KeyboardInterrupt`
/// (or whatever a signal handler raises) when a signal arrives meanwhile.
/// Callers whose future must not be dropped half done pass no deadline.
pub(crate) fn block_on<F>(
    py: Python<'_>,
    mut fut: Pin<&mut F>,
    deadline: Option<Instant>,
) -> PyResult<Option<F::Output>>
where
    F: Future + Send + ?Sized,
    F::Output: Send,
{
    loop {
        let Some(s) = slice(deadline) else {
            return Ok(None);
        };
        let f = fut.as_mut();
        let r = py.detach(move || rt().block_on(async move { tokio::time::timeout(s, f).await }));
        if let Ok(v) = r {
            return Ok(Some(v));
        }
        py.check_signals()?;
    }
}

/// A waker that unparks the thread waiting on it.
#[derive(Debug, Default)]
pub(crate) struct Parker {
    woken: Mutex<bool>,
    cv: Condvar,
}

impl Wake for Parker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.unpark();
    }
}

impl Parker {
    pub(crate) fn new() -> Arc<Parker> {
        Arc::new(Parker::default())
    }

    /// Wakes the waiting thread (or the next one to wait).
    pub(crate) fn unpark(&self) {
        *self.woken.lock() = true;
        self.cv.notify_all();
    }

    /// Waits with the GIL released until woken or one slice passed;
    /// `Ok(false)` once `deadline` passed. Runs the signal handlers.
    pub(crate) fn park(&self, py: Python<'_>, deadline: Option<Instant>) -> PyResult<bool> {
        let Some(s) = slice(deadline) else {
            return Ok(false);
        };
        py.detach(|| {
            let mut w = self.woken.lock();
            if !*w {
                self.cv.wait_for(&mut w, s);
            }
            *w = false;
        });
        py.check_signals()?;
        Ok(true)
    }
}

/// Polls with `poll` (a `Parker` waker in its context) until it is ready
/// or `deadline` passes (`None`), parking between tries with the GIL
/// released. `poll` must be safe to call again after `Pending` (it holds
/// no half-done work).
pub(crate) fn poll_until<T>(
    py: Python<'_>,
    parker: &Arc<Parker>,
    deadline: Option<Instant>,
    mut poll: impl FnMut(&mut Context<'_>) -> Poll<T>,
) -> PyResult<Option<T>> {
    let waker = Waker::from(parker.clone());
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(v) = poll(&mut cx) {
            return Ok(Some(v));
        }
        if !parker.park(py, deadline)? {
            // One last look: it may have come just now.
            return Ok(match poll(&mut cx) {
                Poll::Ready(v) => Some(v),
                Poll::Pending => None,
            });
        }
    }
}

/// A waker that wakes every waker registered with it: a handle the node
/// feeds remembers one waker, but a blocking thread and asyncio tasks
/// (including ones being cancelled, which poll once more) may wait on it
/// in turn. Each poll of the handle registers the poller here and passes
/// the fan's own waker down, so no waiter is forgotten.
#[derive(Debug, Default)]
pub(crate) struct Fan {
    wakers: Mutex<Vec<Waker>>,
}

/// Registered wakers kept at most; past it all are woken (spuriously;
/// the live ones register again).
const FAN_MAX: usize = 64;

impl Wake for Fan {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        let all = std::mem::take(&mut *self.wakers.lock());
        for w in all {
            w.wake();
        }
    }
}

impl Fan {
    /// A fan and its waker.
    pub(crate) fn new() -> (Arc<Fan>, Waker) {
        let f = Arc::new(Fan::default());
        let w = Waker::from(f.clone());
        (f, w)
    }

    /// Remembers `w` until the next wake.
    pub(crate) fn register(&self, w: &Waker) {
        let mut v = self.wakers.lock();
        if v.iter().any(|x| x.will_wake(w)) {
            return;
        }
        if v.len() >= FAN_MAX {
            for x in v.drain(..) {
                x.wake();
            }
        }
        v.push(w.clone());
    }
}
