//! `Member`: a cluster membership's requests, broadcasts and tunnels, blocking and asyncio.

use super::*;

#[derive(Debug)]
struct MemberCore {
    m: Mutex<Option<Arc<skiff::client::Member>>>,
    /// Taken by an asyncio wait, not yet handed out.
    stash: Mutex<VecDeque<Incoming>>,
    fan: Arc<Fan>,
    fan_waker: Waker,
    parker: Arc<Parker>,
    client: skiff::Client,
    cluster: String,
}

/// What a member receives, as Python objects.
fn incoming(py: Python<'_>, i: Incoming, file: bool) -> PyResult<Py<PyAny>> {
    Ok(match i {
        Incoming::Request(r) => Py::new(py, Message::request(r))?.into_any(),
        Incoming::Broadcast(m) => Py::new(py, Message::plain(m))?.into_any(),
        Incoming::Tunnel(t) if file => wrap_tunnel(py, Tunnel::new(t))?,
        Incoming::Tunnel(t) => Py::new(py, Tunnel::new(t))?.into_any(),
        _ => py.None(),
    })
}

/// Membership in a cluster: iterate it or call `next(timeout)` for the
/// requests (Messages with `reply` set: answer with `respond`),
/// broadcasts (Messages) and tunnels (Tunnel) sent to this member.
/// `leave()` (or a `with` block) leaves the cluster.
#[pyclass(module = "skiff", frozen)]
#[derive(Debug)]
pub(crate) struct Member {
    core: Arc<MemberCore>,
}

impl Member {
    pub(super) fn new(m: skiff::client::Member, client: skiff::Client) -> Member {
        let cluster = m.cluster().to_owned();
        let (fan, fan_waker) = Fan::new();
        Member {
            core: Arc::new(MemberCore {
                m: Mutex::new(Some(Arc::new(m))),
                stash: Mutex::new(VecDeque::new()),
                fan,
                fan_waker,
                parker: Parker::new(),
                client,
                cluster,
            }),
        }
    }

    fn poll(core: &MemberCore, cx: &mut Context<'_>) -> Poll<Option<Incoming>> {
        if let Some(i) = core.stash.lock().pop_front() {
            return Poll::Ready(Some(i));
        }
        let Some(m) = core.m.lock().clone() else {
            return Poll::Ready(None);
        };
        // `recv` only takes an item when it is ready: a fresh future per
        // poll loses nothing.
        core.fan.register(cx.waker());
        let fut = pin!(m.recv());
        fut.poll(&mut Context::from_waker(&core.fan_waker))
    }

    fn next_inner(
        &self,
        py: Python<'_>,
        t: Option<Duration>,
    ) -> PyResult<Option<Option<Incoming>>> {
        poll_until(py, &self.core.parker, deadline(t), |cx| {
            Member::poll(&self.core, cx)
        })
    }
}

#[pymethods]
impl Member {
    /// The next request, broadcast or tunnel, waiting up to `timeout`
    /// seconds. Raises TimeoutError, or ConnectionClosed once the
    /// membership ended.
    #[pyo3(signature = (timeout=None))]
    fn next(&self, py: Python<'_>, timeout: Option<&Bound<'_, PyAny>>) -> PyResult<Py<PyAny>> {
        let t = timeout_arg("timeout", timeout)?;
        match self.next_inner(py, t)? {
            Some(Some(i)) => incoming(py, i, true),
            Some(None) => Err(raise("ConnectionClosed", "the membership ended")),
            None => Err(raise("TimeoutError", "nothing within the timeout")),
        }
    }

    fn __iter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        match self.next_inner(py, None)? {
            Some(Some(i)) => incoming(py, i, true),
            _ => Err(PyStopIteration::new_err(())),
        }
    }

    /// The next request, broadcast or tunnel (a raw Tunnel) if one is
    /// here now, else None.
    fn try_next(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        match Member::poll(&self.core, &mut Context::from_waker(Waker::noop())) {
            Poll::Ready(Some(i)) => incoming(py, i, false).map(Some),
            _ => Ok(None),
        }
    }

    /// For asyncio: an awaitable that finishes with True once something
    /// is here (take it with `try_next`), None once the membership ended.
    /// Cancelling it loses nothing.
    fn wait_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let core = self.core.clone();
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            let i = poll_fn(|cx| Member::poll(&core, cx)).await;
            Ok(i.map(|i| {
                core.stash.lock().push_front(i);
                true
            }))
        })
    }

    /// Leaves the cluster (idempotent).
    fn leave(&self) {
        let m = self.core.m.lock().take();
        self.core.fan_waker.wake_by_ref();
        self.core.parker.unpark();
        drop(m);
    }

    /// The cluster.
    #[getter]
    fn cluster(&self) -> &str {
        &self.core.cluster
    }

    /// Failovers this membership lived through.
    #[getter]
    fn gaps(&self) -> u64 {
        self.core.m.lock().as_ref().map_or(0, |m| m.gaps())
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, _exc: &Bound<'_, pyo3::types::PyTuple>) {
        self.leave();
    }

    fn __repr__(&self) -> String {
        let _ = &self.core.client;
        format!("<skiff.Member of {:?}>", self.core.cluster)
    }
}
