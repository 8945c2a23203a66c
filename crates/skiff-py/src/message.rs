//! `skiff.Message`: a received (or built) message, and the conversions of
//! subjects, types, fields and payloads from Python arguments.

use bytes::Bytes;
use parking_lot::Mutex;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyString, PyTuple};
use skiff::client::{Delivery, Request};
use skiff::{Field, Value};
use skiff_proto::wire::{MAX_FIELDS, MAX_FIELD_KEY};

use crate::errors::IntoPy;
use crate::view::{bytes_view, with_data};
use crate::wait::{block_on, poll_once};

/// A payload argument as `Bytes` (copied once: the caller may change a
/// `bytearray` after the call returns).
pub(crate) fn payload(name: &str, data: &Bound<'_, PyAny>) -> PyResult<Bytes> {
    with_data(name, data, Bytes::copy_from_slice)
}

/// A string argument, with a `TypeError` naming the parameter.
pub(crate) fn str_arg<'a>(name: &str, o: &'a Bound<'_, PyAny>) -> PyResult<&'a str> {
    let s = o.cast::<PyString>().map_err(|_| {
        PyTypeError::new_err(format!(
            "{name} must be str, not {}",
            crate::wait::type_name(o)
        ))
    })?;
    crate::view::str_ref(s)
}

/// `fields` as skiff fields: a dict of str to bool, int (64-bit), float,
/// str or bytes-like.
pub(crate) fn fields_arg(fields: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<Field>> {
    let Some(f) = fields else {
        return Ok(Vec::new());
    };
    if f.is_none() {
        return Ok(Vec::new());
    }
    let d = f.cast::<PyDict>().map_err(|_| {
        PyTypeError::new_err(format!(
            "fields must be a dict of str to bool, int, float, str or bytes, not {}",
            crate::wait::type_name(f)
        ))
    })?;
    if d.len() > MAX_FIELDS {
        return Err(PyValueError::new_err(format!(
            "fields has {} entries; a message carries at most {MAX_FIELDS}",
            d.len()
        )));
    }
    let mut out = Vec::with_capacity(d.len());
    for (k, v) in d.iter() {
        let key = k.cast::<PyString>().map_err(|_| {
            PyTypeError::new_err(format!(
                "fields keys must be str, not {}",
                crate::wait::type_name(&k)
            ))
        })?;
        let key = crate::view::str_ref(key)?;
        if key.len() > MAX_FIELD_KEY {
            return Err(PyValueError::new_err(format!(
                "fields key of {} bytes is longer than {MAX_FIELD_KEY}",
                key.len()
            )));
        }
        let value = if v.is_instance_of::<PyBool>() {
            Value::Bool(v.extract()?)
        } else if v.is_instance_of::<PyInt>() {
            Value::Int(v.extract().map_err(|_| {
                PyValueError::new_err(format!(
                    "fields[{key:?}] does not fit a signed 64-bit integer"
                ))
            })?)
        } else if v.is_instance_of::<PyFloat>() {
            Value::Float(v.extract()?)
        } else if let Ok(s) = v.cast::<PyString>() {
            Value::Str(crate::view::str_ref(s)?.into())
        } else {
            Value::Bytes(payload(&format!("fields[{key:?}]"), &v).map_err(|_| {
                PyTypeError::new_err(format!(
                    "fields[{key:?}] must be bool, int, float, str or bytes, not {}",
                    crate::wait::type_name(&v)
                ))
            })?)
        };
        out.push(Field {
            key: key.into(),
            value,
        });
    }
    Ok(out)
}

/// A message from Python arguments.
pub(crate) fn build(
    subject: impl Into<bytestring::ByteString>,
    data: &Bound<'_, PyAny>,
    kind: Option<&str>,
    fields: Option<&Bound<'_, PyAny>>,
) -> PyResult<skiff::Message> {
    let mut m = skiff::Message::new(subject, payload("data", data)?);
    if let Some(k) = kind {
        m = m.with_kind(k);
    }
    m.fields = fields_arg(fields)?;
    Ok(m)
}

/// A reply on its way.
type ReplyFuture =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), skiff::Error>> + Send>>;

/// Where a message came from, which decides how it is answered.
#[derive(Debug)]
enum Origin {
    /// Built here, or from a queue: nobody to answer.
    Plain(skiff::Message),
    /// From a subscription; the client answers it if it is a request.
    Delivery(Delivery, Option<skiff::Client>),
    /// A request to a cluster member (answered once).
    Request(skiff::Message, Mutex<Option<Request>>),
}

/// A message: `subject`, `type`, `data`, `fields`, and `reply` (whether
/// the sender waits for an answer, given with `respond`).
#[pyclass(module = "skiff", frozen)]
#[derive(Debug)]
pub(crate) struct Message {
    origin: Origin,
}

impl Message {
    pub(crate) fn plain(m: skiff::Message) -> Message {
        Message {
            origin: Origin::Plain(m),
        }
    }

    pub(crate) fn delivery(d: Delivery, client: &skiff::Client) -> Message {
        let c = d.is_request().then(|| client.clone());
        Message {
            origin: Origin::Delivery(d, c),
        }
    }

    pub(crate) fn request(mut r: Request) -> Message {
        let m = std::mem::replace(&mut r.msg, skiff::Message::new("", Bytes::new()));
        Message {
            origin: Origin::Request(m, Mutex::new(Some(r))),
        }
    }

    pub(crate) fn msg(&self) -> &skiff::Message {
        match &self.origin {
            Origin::Plain(m) | Origin::Request(m, _) => m,
            Origin::Delivery(d, _) => d,
        }
    }

    /// Sends `reply` to this request: blocking, or started for asyncio
    /// (`Err(fut)` to await).
    fn answer(&self, reply: skiff::Message) -> PyResult<ReplyFuture> {
        match &self.origin {
            Origin::Delivery(d, Some(c)) => {
                let (d, c) = (d.clone(), c.clone());
                Ok(Box::pin(async move { c.reply(&d, reply).await }))
            }
            Origin::Request(_, r) => {
                let r = r.lock().take().ok_or_else(|| {
                    crate::errors::raise("UsageError", "this request was already answered")
                })?;
                Ok(Box::pin(async move { r.reply(reply).await }))
            }
            _ => Err(crate::errors::raise(
                "UsageError",
                "this message is not a request; there is nobody to respond to",
            )),
        }
    }
}

#[pymethods]
impl Message {
    /// A message to publish or push: `Message(subject, data=b"", *,
    /// type=None, fields=None)`.
    #[new]
    #[pyo3(signature = (subject, data=None, *, r#type=None, fields=None))]
    fn py_new(
        subject: &Bound<'_, PyAny>,
        data: Option<&Bound<'_, PyAny>>,
        r#type: Option<&Bound<'_, PyAny>>,
        fields: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Message> {
        let subject = str_arg("subject", subject)?;
        let kind = r#type.map(|t| str_arg("type", t)).transpose()?;
        let payload = match data {
            Some(d) => payload("data", d)?,
            None => Bytes::new(),
        };
        let mut m = skiff::Message::new(subject, payload);
        if let Some(k) = kind {
            m = m.with_kind(k);
        }
        m.fields = fields_arg(fields)?;
        Ok(Message::plain(m))
    }

    /// The subject (dot-separated tokens).
    #[getter]
    fn subject(&self) -> &str {
        &self.msg().subject
    }

    /// The message's type tag, or None.
    #[getter]
    fn r#type(&self) -> Option<&str> {
        self.msg().kind.as_deref()
    }

    /// The payload as `bytes` (a copy; `view` gives it without one).
    #[getter]
    fn data<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.msg().payload)
    }

    /// The payload as a read-only `memoryview`, without copying (it keeps
    /// the received buffer alive while it lives).
    #[getter]
    fn view<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        bytes_view(py, &self.msg().payload)
    }

    /// The fields as a dict (str to bool, int, float, str or bytes).
    #[getter]
    fn fields<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for f in &self.msg().fields {
            let k: &str = &f.key;
            match &f.value {
                Value::Bool(b) => d.set_item(k, *b)?,
                Value::Int(i) => d.set_item(k, *i)?,
                Value::Float(x) => d.set_item(k, *x)?,
                Value::Str(s) => d.set_item(k, &**s)?,
                Value::Bytes(b) => d.set_item(k, PyBytes::new(py, b))?,
            }
        }
        Ok(d)
    }

    /// Whether the sender waits for a reply (answer it with `respond`).
    #[getter]
    fn reply(&self) -> bool {
        match &self.origin {
            Origin::Delivery(d, _) => d.is_request(),
            Origin::Request(_, r) => r.lock().is_some(),
            Origin::Plain(_) => false,
        }
    }

    /// After a failover, on the first message: a dict (`from`, `to`,
    /// `down_for` seconds, `attempts`) saying messages published while
    /// the client had no node may be missing before this one; else None.
    #[getter]
    fn gap<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let Origin::Delivery(d, _) = &self.origin else {
            return Ok(None);
        };
        let Some(g) = d.gap() else { return Ok(None) };
        let out = PyDict::new(py);
        out.set_item("from", &g.from)?;
        out.set_item("to", &g.to)?;
        out.set_item("down_for", g.down_for.as_secs_f64())?;
        out.set_item("attempts", g.attempts)?;
        Ok(Some(out))
    }

    /// The sender's address `(host, port)` for a queue message, else None.
    #[getter]
    fn sender<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyTuple>>> {
        self.msg()
            .meta
            .from
            .map(|a| {
                PyTuple::new(
                    py,
                    [
                        a.ip().to_string().into_pyobject(py)?.into_any(),
                        a.port().into_pyobject(py)?.into_any(),
                    ],
                )
            })
            .transpose()
    }

    /// Answers this request (blocking; the GIL is released while it
    /// waits). Raises UsageError if it is not a request or was answered.
    #[pyo3(signature = (data, *, r#type=None, fields=None))]
    fn respond(
        &self,
        py: Python<'_>,
        data: &Bound<'_, PyAny>,
        r#type: Option<&Bound<'_, PyAny>>,
        fields: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let kind = r#type.map(|t| str_arg("type", t)).transpose()?;
        let m = build(self.msg().subject.clone(), data, kind, fields)?;
        let mut fut = self.answer(m)?;
        if let std::task::Poll::Ready(r) = poll_once(fut.as_mut()) {
            return r.py();
        }
        match block_on(py, fut.as_mut(), None)? {
            Some(r) => r.py(),
            None => Ok(()),
        }
    }

    /// `respond` for asyncio: returns an awaitable.
    #[pyo3(signature = (data, *, r#type=None, fields=None))]
    fn respond_async<'py>(
        &self,
        py: Python<'py>,
        data: &Bound<'py, PyAny>,
        r#type: Option<&Bound<'py, PyAny>>,
        fields: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let kind = r#type.map(|t| str_arg("type", t)).transpose()?;
        let m = build(self.msg().subject.clone(), data, kind, fields)?;
        let fut = self.answer(m)?;
        pyo3_async_runtimes::tokio::future_into_py(py, async move { fut.await.py() })
    }

    fn __len__(&self) -> usize {
        self.msg().payload.len()
    }

    fn __bytes__<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.msg().payload)
    }

    fn __repr__(&self) -> String {
        let m = self.msg();
        let shown = &m.payload[..m.payload.len().min(32)];
        let more = if m.payload.len() > 32 { "..." } else { "" };
        format!(
            "Message(subject={:?}, type={:?}, data={}{more}, fields={}, reply={})",
            &*m.subject,
            m.kind.as_deref(),
            bytes_repr(shown),
            m.fields.len(),
            if self.reply() { "True" } else { "False" },
        )
    }
}

/// Python's `repr` of a bytes literal, near enough.
fn bytes_repr(b: &[u8]) -> String {
    let mut s = String::from("b'");
    for &c in b {
        match c {
            b'\\' => s.push_str("\\\\"),
            b'\'' => s.push_str("\\'"),
            0x20..=0x7e => s.push(c as char),
            _ => s.push_str(&format!("\\x{c:02x}")),
        }
    }
    s.push('\'');
    s
}
