//! `skiff.Client`, `Subscription`, `Member` and `Tunnel`: the Rust
//! client's handles with blocking methods and `*_async` twins (which
//! return awaitables; `skiff.aio` wraps them in coroutines and async
//! iterators).
//!
//! Blocking waits on handles that the node feeds (a subscription, a
//! membership, a tunnel) poll the handle with a [`Parker`] waker and park
//! the calling thread with the GIL released: no runtime thread takes part,
//! and a subscription hands over every message already here per wake-up
//! (up to [`BATCH`]). Everything else is driven on the runtime with
//! [`block_on`].

use std::collections::VecDeque;
use std::future::{poll_fn, Future};
use std::pin::{pin, Pin};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use parking_lot::Mutex;
use pyo3::exceptions::{PyStopIteration, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};
use skiff::client::{Delivery, Incoming, Policy, SubOptions, Target};

use crate::errors::{raise, IntoPy};
use crate::message::{build, str_arg, Message};
use crate::wait::{
    block_on, deadline, poll_once, poll_until, seconds_arg, timeout_arg, Fan, Parker,
};

/// Most messages one wake-up moves from a subscription to Python.
const BATCH: usize = 1024;

/// A boxed future of a client call.
type CallFuture<T> = Pin<Box<dyn Future<Output = Result<T, skiff::Error>> + Send>>;

/// Clients alive in this process, closed at interpreter exit.
static LIVE: Mutex<Vec<Weak<Core>>> = Mutex::new(Vec::new());

#[derive(Debug)]
struct Core {
    c: skiff::Client,
}

/// Runs a client call to its end with the GIL released (Ctrl-C
/// interrupts the wait; the call then goes on in the background).
fn run<T: Send + 'static>(py: Python<'_>, fut: CallFuture<T>) -> PyResult<T> {
    let mut fut = fut;
    if let Poll::Ready(r) = poll_once(fut.as_mut()) {
        return r.py();
    }
    match block_on(py, fut.as_mut(), None)? {
        Some(r) => r.py(),
        None => unreachable!("no deadline"),
    }
}

/// Hands a client call to the running asyncio loop.
fn run_async<'py, T>(py: Python<'py>, fut: CallFuture<T>) -> PyResult<Bound<'py, PyAny>>
where
    T: for<'a> IntoPyObject<'a> + Send + 'static,
{
    pyo3_async_runtimes::tokio::future_into_py(py, async move { fut.await.py() })
}

/// A locator with `options` appended as query parameters.
fn locator_with(locator: &str, options: Option<&Bound<'_, PyDict>>) -> PyResult<String> {
    let mut loc = locator.to_owned();
    let Some(opts) = options else {
        return Ok(loc);
    };
    for (k, v) in opts.iter() {
        let k: String = k.extract()?;
        let v = if let Ok(b) = v.extract::<bool>() {
            b.to_string()
        } else if let Ok(s) = v.cast::<PyString>() {
            crate::view::str_ref(s)?.to_owned()
        } else if v.is_instance_of::<pyo3::types::PyInt>()
            || v.is_instance_of::<pyo3::types::PyFloat>()
        {
            v.str()?.to_string()
        } else {
            return Err(PyTypeError::new_err(format!(
                "option {k} must be str, int, float or bool, not {}",
                crate::wait::type_name(&v)
            )));
        };
        if v.contains(['&', '?', '#']) || k.contains(['&', '?', '#', '=']) {
            return Err(PyValueError::new_err(format!(
                "option {k}={v:?} may not contain '&', '?', '#' (or '=' in the name)"
            )));
        }
        loc.push(if loc.contains('?') { '&' } else { '?' });
        loc.push_str(&k);
        loc.push('=');
        loc.push_str(&v);
    }
    Ok(loc)
}

/// `name=` taken out of `options` (so it is not a locator option): the
/// name the node shows for the client (`/connz`, `skiff stats`).
fn client_options(options: Option<&Bound<'_, PyDict>>) -> PyResult<skiff::ClientOptions> {
    let mut o = skiff::ClientOptions::new();
    if let Some(d) = options {
        if let Some(v) = d.get_item("name")? {
            d.del_item("name")?;
            if !v.is_none() {
                o = o.name(str_arg("name", &v)?);
            }
        }
    }
    Ok(o)
}

/// The default node: $SKIFF_NODE, else skiff://127.0.0.1:4747.
fn locator_arg<'a>(locator: Option<&'a Bound<'_, PyAny>>) -> PyResult<&'a str> {
    match locator.filter(|l| !l.is_none()) {
        Some(l) => str_arg("locator", l),
        None => Ok(default_locator()),
    }
}

fn default_locator() -> &'static str {
    static DEFAULT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    DEFAULT.get_or_init(|| {
        std::env::var("SKIFF_NODE").unwrap_or_else(|_| "skiff://127.0.0.1:4747".into())
    })
}

fn register(c: skiff::Client) -> Client {
    let core = Arc::new(Core { c });
    let mut live = LIVE.lock();
    live.retain(|w| w.strong_count() > 0);
    live.push(Arc::downgrade(&core));
    Client {
        core,
        last_subject: Mutex::new(bytestring::ByteString::new()),
    }
}

/// Connects to a node (see `skiff.connect`).
#[pyfunction]
#[pyo3(signature = (locator=None, **options))]
pub(crate) fn connect(
    py: Python<'_>,
    locator: Option<&Bound<'_, PyAny>>,
    options: Option<&Bound<'_, PyDict>>,
) -> PyResult<Client> {
    let opts = client_options(options)?;
    let loc = locator_with(locator_arg(locator)?, options)?;
    let c = run(
        py,
        Box::pin(async move { skiff::Client::connect_with(&loc, opts).await }),
    )?;
    Ok(register(c))
}

/// `connect` for asyncio.
#[pyfunction]
#[pyo3(signature = (locator=None, **options))]
pub(crate) fn connect_async<'py>(
    py: Python<'py>,
    locator: Option<&Bound<'py, PyAny>>,
    options: Option<&Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, PyAny>> {
    let opts = client_options(options)?;
    let loc = locator_with(locator_arg(locator)?, options)?;
    pyo3_async_runtimes::tokio::future_into_py(py, async move {
        let c = skiff::Client::connect_with(&loc, opts).await.py()?;
        Ok(register(c))
    })
}

/// Closes every client of the process, after a bounded flush (registered
/// with `atexit`, so publishes made just before exit are not lost).
#[pyfunction]
pub(crate) fn shutdown(py: Python<'_>) {
    let live: Vec<Arc<Core>> = LIVE.lock().drain(..).filter_map(|w| w.upgrade()).collect();
    if live.is_empty() {
        return;
    }
    py.detach(|| {
        crate::rt().block_on(async {
            for core in &live {
                let _ = tokio::time::timeout(Duration::from_millis(500), core.c.flush()).await;
                core.c.close();
            }
        })
    });
}

/// A policy name: drop-oldest, drop-newest, block, disconnect.
fn policy_arg(p: &str) -> PyResult<Policy> {
    Policy::parse(p).ok_or_else(|| {
        PyValueError::new_err(format!(
            "policy {p:?} is not one of 'drop-oldest', 'drop-newest', 'block', 'disconnect'"
        ))
    })
}

/// A u32 count argument, > 0.
fn count_arg(name: &str, n: i64) -> PyResult<u32> {
    if n < 1 || n > u32::MAX as i64 {
        return Err(PyValueError::new_err(format!(
            "{name} must be between 1 and {}, not {n}",
            u32::MAX
        )));
    }
    Ok(n as u32)
}

/// A request's target: a subject, or one member of a cluster.
fn target(name: &str, cluster: bool, key: Option<&Bound<'_, PyAny>>) -> PyResult<Target> {
    if !cluster {
        if key.is_some_and(|k| !k.is_none()) {
            return Err(PyValueError::new_err(
                "key applies to cluster requests only (cluster=True)",
            ));
        }
        return Ok(Target::Subject(name.into()));
    }
    let t = Target::cluster(name);
    Ok(match key {
        Some(k) if !k.is_none() => t.with_key(crate::message::payload("key", k)?),
        _ => t,
    })
}

/// A connection to a skiff node. Use it as a context manager (`with
/// skiff.connect() as c:`) or call `close()`; clients still open at
/// interpreter exit are flushed and closed then.
#[pyclass(module = "skiff", frozen, weakref)]
#[derive(Debug)]
pub(crate) struct Client {
    core: Arc<Core>,
    /// The last subject published: a publisher that repeats its subject
    /// shares one copy of it instead of allocating one per message.
    last_subject: Mutex<bytestring::ByteString>,
}

impl Client {
    /// `s` as a subject, shared with the previous publish when equal.
    fn subject(&self, s: &str) -> bytestring::ByteString {
        let mut last = self.last_subject.lock();
        if &**last != s {
            *last = s.into();
        }
        last.clone()
    }

    fn publish_fut(
        &self,
        subject: &Bound<'_, PyAny>,
        data: &Bound<'_, PyAny>,
        kind: Option<&Bound<'_, PyAny>>,
        fields: Option<&Bound<'_, PyAny>>,
        reliable: bool,
    ) -> PyResult<CallFuture<()>> {
        let subject = str_arg("subject", subject)?;
        let kind = kind
            .filter(|k| !k.is_none())
            .map(|t| str_arg("type", t))
            .transpose()?;
        let m = build(subject, data, kind, fields)?.with_best_effort(!reliable);
        let c = self.core.c.clone();
        Ok(Box::pin(async move { c.publish(m).await }))
    }

    #[allow(clippy::too_many_arguments)]
    fn subscribe_fut(
        &self,
        pattern: &Bound<'_, PyAny>,
        kind: &Bound<'_, PyAny>,
        policy: &Bound<'_, PyAny>,
        queue: i64,
        window: i64,
        cmsg: bool,
        reliable: bool,
        queue_group: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<CallFuture<Subscription>> {
        let pattern = str_arg("pattern", pattern)?.to_owned();
        let kind = str_arg("type", kind)?.to_owned();
        let mut opts = SubOptions::default()
            .policy(policy_arg(str_arg("policy", policy)?)?)
            .queue(count_arg("queue", queue)?)
            .window(count_arg("window", window)?)
            .best_effort(!reliable);
        if cmsg {
            opts = opts.cmsg();
        }
        if let Some(g) = queue_group.filter(|g| !g.is_none()) {
            opts = opts.queue_group(str_arg("queue_group", g)?);
        }
        let c = self.core.c.clone();
        Ok(Box::pin(async move {
            let s = c.subscribe_with(&pattern, &kind, opts).await?;
            Ok(Subscription::new(c, s, pattern))
        }))
    }

    #[allow(clippy::too_many_arguments)]
    fn request_fut(
        &self,
        subject: &Bound<'_, PyAny>,
        data: &Bound<'_, PyAny>,
        timeout: &Bound<'_, PyAny>,
        max: Option<i64>,
        kind: Option<&Bound<'_, PyAny>>,
        fields: Option<&Bound<'_, PyAny>>,
        cluster: bool,
        key: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<CallFuture<Vec<Message>>> {
        let name = str_arg("subject", subject)?;
        let t = target(name, cluster, key)?;
        let timeout = seconds_arg("timeout", timeout)?;
        let kind = kind
            .filter(|k| !k.is_none())
            .map(|t| str_arg("type", t))
            .transpose()?;
        let m = build(name, data, kind, fields)?;
        let max = max.map(|n| count_arg("max", n)).transpose()?;
        let c = self.core.c.clone();
        Ok(Box::pin(async move {
            let v = match max {
                None => vec![c.request(t, m, timeout).await?],
                Some(n) => c.request_many(t, m, timeout, n as usize).await?,
            };
            Ok(v.into_iter().map(Message::plain).collect())
        }))
    }

    fn stats_fut(&self) -> CallFuture<String> {
        let c = self.core.c.clone();
        Box::pin(async move { c.stats_json().await })
    }

    fn tunnel_fut(
        &self,
        cluster: &Bound<'_, PyAny>,
        timeout: &Bound<'_, PyAny>,
        key: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<CallFuture<Tunnel>> {
        let t = target(str_arg("cluster", cluster)?, true, key)?;
        let timeout = seconds_arg("timeout", timeout)?;
        let c = self.core.c.clone();
        Ok(Box::pin(async move {
            let t = c.tunnel(t, timeout).await?;
            Ok(Tunnel::new(t))
        }))
    }

    fn join_fut(&self, cluster: &Bound<'_, PyAny>, capacity: i64) -> PyResult<CallFuture<Member>> {
        let cluster = str_arg("cluster", cluster)?.to_owned();
        if !(0..=u32::MAX as i64).contains(&capacity) {
            return Err(PyValueError::new_err(format!(
                "capacity must be between 0 and {}, not {capacity}",
                u32::MAX
            )));
        }
        let c = self.core.c.clone();
        Ok(Box::pin(async move {
            let m = c.join(&cluster, capacity as u32).await?;
            Ok(Member::new(m, c))
        }))
    }

    fn broadcast_fut(
        &self,
        cluster: &Bound<'_, PyAny>,
        data: &Bound<'_, PyAny>,
        kind: Option<&Bound<'_, PyAny>>,
        fields: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<CallFuture<()>> {
        let cluster = str_arg("cluster", cluster)?.to_owned();
        let kind = kind
            .filter(|k| !k.is_none())
            .map(|t| str_arg("type", t))
            .transpose()?;
        let m = build(cluster.as_str(), data, kind, fields)?;
        let c = self.core.c.clone();
        Ok(Box::pin(async move { c.broadcast(&cluster, m).await }))
    }
}

/// The stats JSON as Python objects.
fn json_loads<'py>(py: Python<'py>, s: &str) -> PyResult<Bound<'py, PyAny>> {
    py.import("json")?.call_method1("loads", (s,))
}

#[pymethods]
impl Client {
    /// Publishes `data` on `subject`. Returns once the message is handed
    /// to the connection (see `flush`); waits, with the GIL released,
    /// while a `block` subscriber or the connection pushes back. With
    /// `reliable=False` the message may cross to other nodes as a datagram
    /// (best effort: its loss counted, never repaired).
    #[pyo3(signature = (subject, data, *, r#type=None, fields=None, reliable=true))]
    fn publish(
        &self,
        py: Python<'_>,
        subject: &Bound<'_, PyAny>,
        data: &Bound<'_, PyAny>,
        r#type: Option<&Bound<'_, PyAny>>,
        fields: Option<&Bound<'_, PyAny>>,
        reliable: bool,
    ) -> PyResult<()> {
        let subject = self.subject(str_arg("subject", subject)?);
        let kind = r#type
            .filter(|k| !k.is_none())
            .map(|t| str_arg("type", t))
            .transpose()?;
        let m = build(subject, data, kind, fields)?.with_best_effort(!reliable);
        let mut fut = pin!(self.core.c.publish(m));
        // Most publishes only copy into the write buffer: done here, no
        // wait and no thread hand-off.
        if let Poll::Ready(r) = poll_once(fut.as_mut()) {
            return r.py();
        }
        match block_on(py, fut, None)? {
            Some(r) => r.py(),
            None => Ok(()),
        }
    }

    /// `publish` for asyncio: None when the message is already handed
    /// over, else an awaitable that finishes the publish.
    #[pyo3(signature = (subject, data, *, r#type=None, fields=None, reliable=true))]
    fn publish_async<'py>(
        &self,
        py: Python<'py>,
        subject: &Bound<'py, PyAny>,
        data: &Bound<'py, PyAny>,
        r#type: Option<&Bound<'py, PyAny>>,
        fields: Option<&Bound<'py, PyAny>>,
        reliable: bool,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let mut fut = self.publish_fut(subject, data, r#type, fields, reliable)?;
        if let Poll::Ready(r) = poll_once(fut.as_mut()) {
            return r.py().map(|_| None);
        }
        run_async(py, fut).map(Some)
    }

    /// Waits (up to `timeout` seconds) until the node has handled
    /// everything this client sent before.
    #[pyo3(signature = (timeout=None))]
    fn flush(&self, py: Python<'_>, timeout: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let t = timeout_arg("timeout", timeout)?;
        let c = self.core.c.clone();
        let mut fut = pin!(async move { c.flush().await });
        match block_on(py, fut.as_mut(), deadline(t))? {
            Some(r) => r.py(),
            None => Err(raise("TimeoutError", "flush timed out")),
        }
    }

    /// `flush` for asyncio.
    fn flush_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let c = self.core.c.clone();
        run_async(py, Box::pin(async move { c.flush().await }))
    }

    /// Subscribes to subjects matching `pattern` (`*` one token, `>` the
    /// rest) with types matching `type`. Returns once the node holds the
    /// interest. `policy` says what the node does when `queue` messages
    /// wait for this subscriber: 'drop-oldest' (default), 'drop-newest',
    /// 'block' (the publishers wait) or 'disconnect'; `window` messages
    /// at most wait in this process.
    ///
    /// With `callback`, a thread of its own calls `callback(message)` for
    /// each message (the callback form); the Subscription still pauses,
    /// resumes and ends it. With `cmsg=True`, `pattern` and `type` are cMsg
    /// patterns over whole strings (`*` any characters, `?` one, `#` an
    /// integer, `{i>5 & i<10}` an integer in a range). With
    /// `reliable=False`, what reaches this subscription from other nodes
    /// may travel as datagrams (best effort: loss counted, never repaired).
    /// With `queue_group='G'` (NATS `queue=`; `queue` here is the bound),
    /// the subscription is a member of queue group G: of the group's
    /// subscriptions that match a message, skiff's and NATS clients'
    /// alike, one in the whole mesh gets each message and request.
    #[pyo3(signature = (pattern, *, r#type=None, policy=None, queue=65536, window=4096, callback=None, cmsg=false, reliable=true, queue_group=None))]
    #[allow(clippy::too_many_arguments)]
    fn subscribe(
        &self,
        py: Python<'_>,
        pattern: &Bound<'_, PyAny>,
        r#type: Option<&Bound<'_, PyAny>>,
        policy: Option<&Bound<'_, PyAny>>,
        queue: i64,
        window: i64,
        callback: Option<&Bound<'_, PyAny>>,
        cmsg: bool,
        reliable: bool,
        queue_group: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<Subscription>> {
        let callback = callback.filter(|c| !c.is_none());
        if let Some(cb) = callback {
            if !cb.is_callable() {
                return Err(PyTypeError::new_err(format!(
                    "callback must be callable, not {}",
                    crate::wait::type_name(cb)
                )));
            }
        }
        let star = PyString::new(py, "*").into_any();
        let dflt = PyString::new(py, "drop-oldest").into_any();
        let fut = self.subscribe_fut(
            pattern,
            r#type.filter(|t| !t.is_none()).unwrap_or(&star),
            policy.filter(|t| !t.is_none()).unwrap_or(&dflt),
            queue,
            window,
            cmsg,
            reliable,
            queue_group,
        )?;
        let sub = Py::new(py, run(py, fut)?)?;
        if let Some(cb) = callback {
            py.import("skiff._io")?
                .call_method1("start_callback", (sub.clone_ref(py), cb))?;
        }
        Ok(sub)
    }

    /// `subscribe` for asyncio.
    #[pyo3(signature = (pattern, *, r#type=None, policy=None, queue=65536, window=4096, cmsg=false, reliable=true, queue_group=None))]
    #[allow(clippy::too_many_arguments)]
    fn subscribe_async<'py>(
        &self,
        py: Python<'py>,
        pattern: &Bound<'py, PyAny>,
        r#type: Option<&Bound<'py, PyAny>>,
        policy: Option<&Bound<'py, PyAny>>,
        queue: i64,
        window: i64,
        cmsg: bool,
        reliable: bool,
        queue_group: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let star = PyString::new(py, "*").into_any();
        let dflt = PyString::new(py, "drop-oldest").into_any();
        let fut = self.subscribe_fut(
            pattern,
            r#type.filter(|t| !t.is_none()).unwrap_or(&star),
            policy.filter(|t| !t.is_none()).unwrap_or(&dflt),
            queue,
            window,
            cmsg,
            reliable,
            queue_group,
        )?;
        run_async(py, fut)
    }

    /// Sends a request and waits for the first reply: to every
    /// subscription matching `subject`, or with `cluster=True` to one
    /// member of the cluster `subject` (`key` for affinity). Raises
    /// NoResponders at once when nobody could answer, TimeoutError after
    /// `timeout` seconds.
    #[pyo3(signature = (subject, data=None, *, timeout=None, r#type=None, fields=None, cluster=false, key=None))]
    #[allow(clippy::too_many_arguments)]
    fn request(
        &self,
        py: Python<'_>,
        subject: &Bound<'_, PyAny>,
        data: Option<&Bound<'_, PyAny>>,
        timeout: Option<&Bound<'_, PyAny>>,
        r#type: Option<&Bound<'_, PyAny>>,
        fields: Option<&Bound<'_, PyAny>>,
        cluster: bool,
        key: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Message> {
        let empty = pyo3::types::PyBytes::new(py, b"").into_any();
        let five = 5.0f64.into_pyobject(py)?.into_any();
        let fut = self.request_fut(
            subject,
            data.unwrap_or(&empty),
            timeout.filter(|t| !t.is_none()).unwrap_or(&five),
            None,
            r#type,
            fields,
            cluster,
            key,
        )?;
        let mut v = run(py, fut)?;
        v.pop().ok_or_else(|| raise("TimeoutError", "timed out"))
    }

    /// `request` for asyncio.
    #[pyo3(signature = (subject, data=None, *, timeout=None, r#type=None, fields=None, cluster=false, key=None))]
    #[allow(clippy::too_many_arguments)]
    fn request_async<'py>(
        &self,
        py: Python<'py>,
        subject: &Bound<'py, PyAny>,
        data: Option<&Bound<'py, PyAny>>,
        timeout: Option<&Bound<'py, PyAny>>,
        r#type: Option<&Bound<'py, PyAny>>,
        fields: Option<&Bound<'py, PyAny>>,
        cluster: bool,
        key: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let empty = pyo3::types::PyBytes::new(py, b"").into_any();
        let five = 5.0f64.into_pyobject(py)?.into_any();
        let fut = self.request_fut(
            subject,
            data.unwrap_or(&empty),
            timeout.filter(|t| !t.is_none()).unwrap_or(&five),
            None,
            r#type,
            fields,
            cluster,
            key,
        )?;
        run_async(
            py,
            Box::pin(async move {
                let mut v = fut.await?;
                v.pop().ok_or(skiff::Error::Timeout)
            }),
        )
    }

    /// Scatter-gather: sends to every matching subscription (or, with
    /// `cluster=True`, every member) and collects replies until `max`
    /// arrived, every responder answered, or `timeout` passed. An empty
    /// list means nobody answered in time; NoResponders, nobody could.
    #[pyo3(signature = (subject, data=None, *, timeout=None, max=65535, r#type=None, fields=None, cluster=false))]
    #[allow(clippy::too_many_arguments)]
    fn request_many(
        &self,
        py: Python<'_>,
        subject: &Bound<'_, PyAny>,
        data: Option<&Bound<'_, PyAny>>,
        timeout: Option<&Bound<'_, PyAny>>,
        max: i64,
        r#type: Option<&Bound<'_, PyAny>>,
        fields: Option<&Bound<'_, PyAny>>,
        cluster: bool,
    ) -> PyResult<Vec<Message>> {
        let empty = pyo3::types::PyBytes::new(py, b"").into_any();
        let one = 1.0f64.into_pyobject(py)?.into_any();
        let fut = self.request_fut(
            subject,
            data.unwrap_or(&empty),
            timeout.filter(|t| !t.is_none()).unwrap_or(&one),
            Some(max),
            r#type,
            fields,
            cluster,
            None,
        )?;
        run(py, fut)
    }

    /// `request_many` for asyncio.
    #[pyo3(signature = (subject, data=None, *, timeout=None, max=65535, r#type=None, fields=None, cluster=false))]
    #[allow(clippy::too_many_arguments)]
    fn request_many_async<'py>(
        &self,
        py: Python<'py>,
        subject: &Bound<'py, PyAny>,
        data: Option<&Bound<'py, PyAny>>,
        timeout: Option<&Bound<'py, PyAny>>,
        max: i64,
        r#type: Option<&Bound<'py, PyAny>>,
        fields: Option<&Bound<'py, PyAny>>,
        cluster: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let empty = pyo3::types::PyBytes::new(py, b"").into_any();
        let one = 1.0f64.into_pyobject(py)?.into_any();
        let fut = self.request_fut(
            subject,
            data.unwrap_or(&empty),
            timeout.filter(|t| !t.is_none()).unwrap_or(&one),
            Some(max),
            r#type,
            fields,
            cluster,
            None,
        )?;
        run_async(py, fut)
    }

    /// Joins `cluster` with `capacity` (its share of requests; 0: only
    /// broadcasts). Requests, broadcasts and tunnels for this member
    /// arrive on the returned Member.
    #[pyo3(signature = (cluster, *, capacity=1))]
    fn join(&self, py: Python<'_>, cluster: &Bound<'_, PyAny>, capacity: i64) -> PyResult<Member> {
        let fut = self.join_fut(cluster, capacity)?;
        run(py, fut)
    }

    /// `join` for asyncio.
    #[pyo3(signature = (cluster, *, capacity=1))]
    fn join_async<'py>(
        &self,
        py: Python<'py>,
        cluster: &Bound<'py, PyAny>,
        capacity: i64,
    ) -> PyResult<Bound<'py, PyAny>> {
        let fut = self.join_fut(cluster, capacity)?;
        run_async(py, fut)
    }

    /// Sends `data` to every member of `cluster`, at most once each.
    #[pyo3(signature = (cluster, data, *, r#type=None, fields=None))]
    fn broadcast(
        &self,
        py: Python<'_>,
        cluster: &Bound<'_, PyAny>,
        data: &Bound<'_, PyAny>,
        r#type: Option<&Bound<'_, PyAny>>,
        fields: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let fut = self.broadcast_fut(cluster, data, r#type, fields)?;
        run(py, fut)
    }

    /// `broadcast` for asyncio.
    #[pyo3(signature = (cluster, data, *, r#type=None, fields=None))]
    fn broadcast_async<'py>(
        &self,
        py: Python<'py>,
        cluster: &Bound<'py, PyAny>,
        data: &Bound<'py, PyAny>,
        r#type: Option<&Bound<'py, PyAny>>,
        fields: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let fut = self.broadcast_fut(cluster, data, r#type, fields)?;
        run_async(py, fut)
    }

    /// Opens a tunnel to one member of `cluster` (`key` for affinity),
    /// waiting at most `timeout` seconds: the raw tunnel (`skiff.tunnel`
    /// wraps it as a file-like object).
    #[pyo3(signature = (cluster, *, timeout=None, key=None))]
    fn tunnel_raw(
        &self,
        py: Python<'_>,
        cluster: &Bound<'_, PyAny>,
        timeout: Option<&Bound<'_, PyAny>>,
        key: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Tunnel> {
        let five = 5.0f64.into_pyobject(py)?.into_any();
        let fut = self.tunnel_fut(
            cluster,
            timeout.filter(|t| !t.is_none()).unwrap_or(&five),
            key,
        )?;
        run(py, fut)
    }

    /// Opens a tunnel to one member of `cluster` (`key` for affinity),
    /// waiting at most `timeout` seconds, as a file-like object
    /// (`skiff.TunnelFile`: read/write bytes, or send/recv messages).
    #[pyo3(signature = (cluster, *, timeout=None, key=None))]
    fn tunnel(
        &self,
        py: Python<'_>,
        cluster: &Bound<'_, PyAny>,
        timeout: Option<&Bound<'_, PyAny>>,
        key: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let t = self.tunnel_raw(py, cluster, timeout, key)?;
        wrap_tunnel(py, t)
    }

    /// `tunnel_raw` for asyncio.
    #[pyo3(signature = (cluster, *, timeout=None, key=None))]
    fn tunnel_raw_async<'py>(
        &self,
        py: Python<'py>,
        cluster: &Bound<'py, PyAny>,
        timeout: Option<&Bound<'py, PyAny>>,
        key: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let five = 5.0f64.into_pyobject(py)?.into_any();
        let fut = self.tunnel_fut(
            cluster,
            timeout.filter(|t| !t.is_none()).unwrap_or(&five),
            key,
        )?;
        run_async(py, fut)
    }

    /// The node's counters (per node, client and subscription) as a dict.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let s = run(py, self.stats_fut())?;
        json_loads(py, &s)
    }

    /// The node's counters as JSON text, for asyncio (`skiff.aio` parses it).
    fn stats_json_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        run_async(py, self.stats_fut())
    }

    /// This client's own counters: failovers, publishes held or refused
    /// while it had no node, the node it is connected to, and errors the
    /// node reported about publishes.
    fn link_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.core.c.link_stats();
        let (n, last) = self.core.c.async_errors();
        let d = PyDict::new(py);
        d.set_item("node", s.node)?;
        d.set_item("failovers", s.failovers)?;
        d.set_item("held", s.held)?;
        d.set_item("refused", s.refused)?;
        d.set_item("unconfirmed", s.unconfirmed)?;
        d.set_item("forgotten", s.forgotten)?;
        d.set_item("maybe_lost", s.maybe_lost)?;
        d.set_item("async_errors", n)?;
        d.set_item("last_async_error", last)?;
        Ok(d)
    }

    /// Takes back the publishes that a lost node may not have taken (the
    /// client failed over before the node confirmed them): a list of
    /// `(number, Message)`, oldest first, publishes being numbered 1, 2, 3,
    /// … in the order this client made them. Publish them again if they
    /// must arrive. Empty when no node was lost with publishes unconfirmed.
    fn unconfirmed(&self, py: Python<'_>) -> PyResult<Vec<(u64, Py<Message>)>> {
        self.core
            .c
            .unconfirmed()
            .into_iter()
            .map(|(n, m)| Ok((n, Py::new(py, Message::plain(m))?)))
            .collect()
    }

    /// The node's id for this client (a new one after each failover).
    #[getter]
    fn id(&self) -> u64 {
        self.core.c.id()
    }

    /// The largest payload the node accepts, in bytes.
    #[getter]
    fn max_payload(&self) -> usize {
        self.core.c.max_payload()
    }

    /// Closes the connection (after a flush of at most `timeout` seconds,
    /// so what was published reaches the node). Idempotent.
    #[pyo3(signature = (timeout=None))]
    fn close(&self, py: Python<'_>, timeout: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let t = timeout_arg("timeout", timeout)?.unwrap_or(Duration::from_secs(1));
        let c = self.core.c.clone();
        let mut fut = pin!(async move { c.flush().await });
        // A closed client fails the flush at once: nothing to report.
        let _ = block_on(py, fut.as_mut(), deadline(Some(t)))?;
        self.core.c.close();
        Ok(())
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<()> {
        self.close(py, None)
    }

    fn __repr__(&self) -> String {
        format!("<skiff.Client id={}>", self.core.c.id())
    }
}

mod member;
mod subscription;
mod tunnel;
pub(crate) use member::Member;
pub(crate) use subscription::Subscription;
use tunnel::wrap_tunnel;
pub(crate) use tunnel::Tunnel;
