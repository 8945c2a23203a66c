//! `skiff.Queue`: CMQ's batched datagram queue (`skiff::Queue`) from
//! Python: `push` to an address without waiting on the network, `pop`
//! what arrived.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyString, PyTuple};

use crate::errors::IntoPy;
use crate::message::{build, Message};
use crate::wait::{deadline, timeout_arg, type_name};

/// A destination: "host:port" or a (host, port) tuple.
fn dest_arg(py: Python<'_>, dest: &Bound<'_, PyAny>) -> PyResult<SocketAddr> {
    let text = if let Ok(s) = dest.cast::<PyString>() {
        crate::view::str_ref(s)?.to_owned()
    } else if let Ok(t) = dest.cast::<PyTuple>() {
        let (h, p): (String, u16) = t.extract().map_err(|_| {
            PyTypeError::new_err("dest as a tuple must be (host: str, port: int 0..65535)")
        })?;
        if h.contains(':') {
            format!("[{h}]:{p}")
        } else {
            format!("{h}:{p}")
        }
    } else {
        return Err(PyTypeError::new_err(format!(
            "dest must be 'host:port' or (host, port), not {}",
            type_name(dest)
        )));
    };
    py.detach(|| text.to_socket_addrs())
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| PyValueError::new_err(format!("dest {text:?} is not a reachable host:port")))
}

/// A datagram queue bound to `locator` (`udp://0.0.0.0:4711?qthresh=512`,
/// `...?reliable=true`): `push(dest, data)` batches per destination and
/// never waits on the network; `pop`, `try_pop` take what arrived. Loss
/// and every drop are counted in `stats()`.
#[pyclass(module = "skiff", frozen)]
#[derive(Debug)]
pub(crate) struct Queue {
    q: Arc<skiff::Queue>,
}

#[pymethods]
impl Queue {
    #[new]
    fn py_new(py: Python<'_>, locator: &Bound<'_, PyAny>) -> PyResult<Queue> {
        let loc = crate::message::str_arg("locator", locator)?.to_owned();
        let q = py.detach(|| skiff::Queue::bind(&loc)).py()?;
        Ok(Queue { q: Arc::new(q) })
    }

    /// Queues `data` for `dest` ("host:port" or (host, port)); never waits
    /// on the network. Raises UsageError if the message can never be sent
    /// (too large), LimitExceeded at a limit.
    #[pyo3(signature = (dest, data, *, subject="", r#type=None, fields=None))]
    fn push(
        &self,
        py: Python<'_>,
        dest: &Bound<'_, PyAny>,
        data: &Bound<'_, PyAny>,
        subject: &str,
        r#type: Option<&str>,
        fields: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let to = dest_arg(py, dest)?;
        let m = build(subject, data, r#type, fields)?;
        self.q.push(to, &m).py()
    }

    /// Hands everything queued to the kernel now (a reliable queue: waits
    /// until every message is acknowledged), with the GIL released.
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        let q = self.q.clone();
        py.detach(move || q.flush()).py()
    }

    /// The next message, or None at once if there is none.
    fn try_pop(&self) -> Option<Message> {
        self.q.try_pop().map(Message::plain)
    }

    /// Up to `max` messages that are here now (none: []).
    #[pyo3(signature = (max=1024))]
    fn pop_many(&self, max: usize) -> Vec<Message> {
        let mut v = Vec::new();
        self.q.try_pop_many(&mut v, max);
        v.into_iter().map(Message::plain).collect()
    }

    /// The next message, waiting up to `timeout` seconds (None: forever)
    /// with the GIL released; raises TimeoutError.
    #[pyo3(signature = (timeout=None))]
    fn pop(&self, py: Python<'_>, timeout: Option<&Bound<'_, PyAny>>) -> PyResult<Message> {
        let end = deadline(timeout_arg("timeout", timeout)?);
        loop {
            if let Some(m) = self.q.try_pop() {
                return Ok(Message::plain(m));
            }
            let slice = match end {
                None => crate::SIGNAL_SLICE,
                Some(d) => {
                    let left = d.saturating_duration_since(std::time::Instant::now());
                    if left.is_zero() {
                        return Err(crate::errors::raise(
                            "TimeoutError",
                            "no message within the timeout",
                        ));
                    }
                    left.min(crate::SIGNAL_SLICE)
                }
            };
            let q = self.q.clone();
            if let Some(m) = py.detach(move || q.pop_blocking(Some(slice))) {
                return Ok(Message::plain(m));
            }
            py.check_signals()?;
        }
    }

    /// `pop` for asyncio: an awaitable of the next message.
    fn pop_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let q = self.q.clone();
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            let m = q.pop().await.py()?;
            Ok(Message::plain(m))
        })
    }

    /// Counters: sent, received, lost, dropped by reason (a dict).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let s = serde_json::to_string(&self.q.stats())
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        py.import("json")?.call_method1("loads", (s,))
    }

    /// The bound address as (host, port).
    #[getter]
    fn local_addr(&self) -> (String, u16) {
        let a = self.q.local_addr();
        (a.ip().to_string(), a.port())
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, PyTuple>) -> PyResult<()> {
        self.flush(py)
    }

    fn __repr__(&self) -> String {
        format!("<skiff.Queue {}>", self.q.local_addr())
    }
}
