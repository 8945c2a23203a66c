//! `Tunnel`: a tunnel to a cluster member (or from one), blocking and
//! asyncio, and its file-like wrapper.

use super::*;

/// A tunnel as the file-like `skiff.TunnelFile`.
pub(super) fn wrap_tunnel(py: Python<'_>, t: Tunnel) -> PyResult<Py<PyAny>> {
    let t = Py::new(py, t)?;
    Ok(py
        .import("skiff._io")?
        .getattr("TunnelFile")?
        .call1((t,))?
        .unbind())
}

#[derive(Debug)]
struct TunCore {
    t: Mutex<Option<Arc<skiff::client::Tunnel>>>,
    /// Taken by an asyncio wait, not yet handed out.
    stash: Mutex<VecDeque<skiff::Message>>,
    fan: Arc<Fan>,
    fan_waker: Waker,
    parker: Arc<Parker>,
    id: u64,
}

/// A tunnel: an ordered, flow-controlled stream of messages with one
/// member of a cluster, exactly once while both ends live. `send` waits
/// while the peer's window is full; `recv` returns None once it closed.
/// `skiff.Client.tunnel` wraps it as a file-like object.
#[pyclass(module = "skiff", frozen)]
#[derive(Debug)]
pub(crate) struct Tunnel {
    core: Arc<TunCore>,
}

impl Tunnel {
    pub(super) fn new(t: skiff::client::Tunnel) -> Tunnel {
        let id = t.id();
        let (fan, fan_waker) = Fan::new();
        Tunnel {
            core: Arc::new(TunCore {
                t: Mutex::new(Some(Arc::new(t))),
                stash: Mutex::new(VecDeque::new()),
                fan,
                fan_waker,
                parker: Parker::new(),
                id,
            }),
        }
    }

    fn get(&self) -> PyResult<Arc<skiff::client::Tunnel>> {
        self.core
            .t
            .lock()
            .clone()
            .ok_or_else(|| raise("ConnectionClosed", "the tunnel is closed"))
    }

    fn poll(core: &TunCore, cx: &mut Context<'_>) -> Poll<Option<skiff::Message>> {
        if let Some(m) = core.stash.lock().pop_front() {
            return Poll::Ready(Some(m));
        }
        let Some(t) = core.t.lock().clone() else {
            return Poll::Ready(None);
        };
        // `recv` takes a message only when ready: a fresh future per poll
        // loses nothing.
        core.fan.register(cx.waker());
        let fut = pin!(t.recv());
        fut.poll(&mut Context::from_waker(&core.fan_waker))
    }

    fn send_fut(&self, data: &Bound<'_, PyAny>) -> PyResult<CallFuture<()>> {
        let t = self.get()?;
        let m = skiff::Message::new("", crate::message::payload("data", data)?);
        Ok(Box::pin(async move { t.send(m).await }))
    }
}

#[pymethods]
impl Tunnel {
    /// Sends `data` as one message, waiting (GIL released) for window.
    fn send(&self, py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<()> {
        let fut = self.send_fut(data)?;
        run(py, fut)
    }

    /// `send` for asyncio.
    fn send_async<'py>(
        &self,
        py: Python<'py>,
        data: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let fut = self.send_fut(data)?;
        run_async(py, fut)
    }

    /// The next message's bytes, waiting up to `timeout` seconds; None
    /// once the tunnel closed. Raises TimeoutError.
    #[pyo3(signature = (timeout=None))]
    fn recv<'py>(
        &self,
        py: Python<'py>,
        timeout: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Option<Bound<'py, pyo3::types::PyBytes>>> {
        let t = timeout_arg("timeout", timeout)?;
        match poll_until(py, &self.core.parker, deadline(t), |cx| {
            Tunnel::poll(&self.core, cx)
        })? {
            Some(Some(m)) => Ok(Some(pyo3::types::PyBytes::new(py, &m.payload))),
            Some(None) => Ok(None),
            None => Err(raise("TimeoutError", "nothing within the timeout")),
        }
    }

    /// The next message's bytes if one is here now; None if not; False
    /// once the tunnel closed.
    fn try_recv<'py>(&self, py: Python<'py>) -> Py<PyAny> {
        match Tunnel::poll(&self.core, &mut Context::from_waker(Waker::noop())) {
            Poll::Ready(Some(m)) => pyo3::types::PyBytes::new(py, &m.payload)
                .into_any()
                .unbind(),
            Poll::Ready(None) => false
                .into_pyobject(py)
                .map(|b| b.to_owned().into_any().unbind())
                .unwrap_or_else(|_| py.None()),
            Poll::Pending => py.None(),
        }
    }

    /// For asyncio: an awaitable that finishes once a message is here (or
    /// the tunnel closed); take it with `try_recv`. Cancelling it loses
    /// nothing.
    fn wait_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let core = self.core.clone();
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            if let Some(m) = poll_fn(|cx| Tunnel::poll(&core, cx)).await {
                core.stash.lock().push_front(m);
            }
            Ok(())
        })
    }

    /// Closes the tunnel (idempotent); the peer's recv returns None.
    fn close(&self) {
        let t = self.core.t.lock().take();
        self.core.fan_waker.wake_by_ref();
        self.core.parker.unpark();
        drop(t);
    }

    /// Why the tunnel ended, if the client lost its node.
    #[getter]
    fn error(&self) -> Option<String> {
        self.core.t.lock().as_ref().and_then(|t| t.error())
    }

    /// Whether the tunnel is closed here.
    #[getter]
    fn closed(&self) -> bool {
        self.core.t.lock().is_none()
    }

    /// The node's id for the tunnel.
    #[getter]
    fn id(&self) -> u64 {
        self.core.id
    }

    fn __repr__(&self) -> String {
        format!("<skiff.Tunnel id={}>", self.core.id)
    }
}
