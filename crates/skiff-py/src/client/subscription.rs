//! `Subscription`: a subscription's messages, pulled many per GIL release, as an iterator, `next(timeout)` and an asyncio wait.

use super::*;

#[derive(Debug)]
struct SubState {
    sub: Option<skiff::client::Subscription>,
    /// Taken from the subscription, not yet handed to Python.
    buf: VecDeque<Delivery>,
    paused: bool,
}

#[derive(Debug)]
struct SubCore {
    st: Mutex<SubState>,
    /// Every waiter (the blocking parker, asyncio tasks).
    fan: Arc<Fan>,
    fan_waker: Waker,
    parker: Arc<Parker>,
    client: skiff::Client,
}

/// What one look at a subscription found.
enum Got {
    One(Delivery),
    /// Ended: by the application (None) or the node (the reason).
    Ended(Option<String>),
}

impl SubCore {
    /// Moves what is here now into the buffer (up to `BATCH`).
    fn fill(st: &mut SubState) {
        if let Some(s) = st.sub.as_mut() {
            while st.buf.len() < BATCH {
                match s.try_recv() {
                    Some(d) => st.buf.push_back(d),
                    None => break,
                }
            }
        }
    }

    /// One message if there is one (waker registered if not).
    fn poll_one(&self, cx: &mut Context<'_>) -> Poll<Got> {
        self.fan.register(cx.waker());
        let mut st = self.st.lock();
        if st.paused {
            return Poll::Pending;
        }
        if let Some(d) = st.buf.pop_front() {
            return Poll::Ready(Got::One(d));
        }
        let st = &mut *st;
        let Some(s) = st.sub.as_mut() else {
            return Poll::Ready(Got::Ended(None));
        };
        match s.poll_recv(&mut Context::from_waker(&self.fan_waker)) {
            Poll::Ready(Some(d)) => {
                Self::fill(st);
                Poll::Ready(Got::One(d))
            }
            Poll::Ready(None) => Poll::Ready(Got::Ended(s.error())),
            Poll::Pending => Poll::Pending,
        }
    }

    fn wake_all(&self) {
        self.fan_waker.wake_by_ref();
        self.parker.unpark();
    }
}

fn ended_error(why: Option<String>) -> PyErr {
    match why {
        Some(w) if w.contains("slow consumer") => raise("SlowConsumer", w),
        Some(w) => raise("ConnectionClosed", w),
        None => raise(
            "ConnectionClosed",
            "the subscription ended (unsubscribed or the client closed)",
        ),
    }
}

/// A subscription: iterate it (`for m in sub`), or call `next(timeout)`.
/// Ending it: `unsubscribe()`, a `with` block, or dropping it.
#[pyclass(module = "skiff", frozen)]
#[derive(Debug)]
pub(crate) struct Subscription {
    core: Arc<SubCore>,
    pattern: String,
    id: u64,
}

impl Subscription {
    pub(super) fn new(
        client: skiff::Client,
        s: skiff::client::Subscription,
        pattern: String,
    ) -> Subscription {
        let id = s.id();
        let (fan, fan_waker) = Fan::new();
        Subscription {
            core: Arc::new(SubCore {
                st: Mutex::new(SubState {
                    sub: Some(s),
                    buf: VecDeque::new(),
                    paused: false,
                }),
                fan,
                fan_waker,
                parker: Parker::new(),
                client,
            }),
            pattern,
            id,
        }
    }

    fn next_inner(&self, py: Python<'_>, timeout: Option<Duration>) -> PyResult<Option<Got>> {
        // The fast path: a message already taken, no wait.
        {
            let mut st = self.core.st.lock();
            if !st.paused {
                if let Some(d) = st.buf.pop_front() {
                    return Ok(Some(Got::One(d)));
                }
            }
        }
        poll_until(py, &self.core.parker, deadline(timeout), |cx| {
            self.core.poll_one(cx)
        })
    }
}

#[pymethods]
impl Subscription {
    /// The next message, waiting up to `timeout` seconds (None: forever)
    /// with the GIL released. Raises TimeoutError when none came, and
    /// ConnectionClosed once the subscription ended.
    #[pyo3(signature = (timeout=None))]
    fn next(&self, py: Python<'_>, timeout: Option<&Bound<'_, PyAny>>) -> PyResult<Message> {
        let t = timeout_arg("timeout", timeout)?;
        match self.next_inner(py, t)? {
            Some(Got::One(d)) => Ok(Message::delivery(d, &self.core.client)),
            Some(Got::Ended(why)) => Err(ended_error(why)),
            None => Err(raise("TimeoutError", "no message within the timeout")),
        }
    }

    fn __iter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Iteration ends when the subscription ends, for whatever reason
    /// (`next()` raises with the reason instead).
    fn __next__(&self, py: Python<'_>) -> PyResult<Message> {
        match self.next_inner(py, None)? {
            Some(Got::One(d)) => Ok(Message::delivery(d, &self.core.client)),
            _ => Err(PyStopIteration::new_err(())),
        }
    }

    /// Up to `max` messages that are here now, without waiting ([] if
    /// none, or while paused).
    #[pyo3(signature = (max=1024))]
    fn take(&self, max: usize) -> Vec<Message> {
        let mut st = self.core.st.lock();
        if st.paused {
            return Vec::new();
        }
        if st.buf.len() < max {
            SubCore::fill(&mut st);
        }
        let n = st.buf.len().min(max);
        st.buf
            .drain(..n)
            .map(|d| Message::delivery(d, &self.core.client))
            .collect()
    }

    /// For asyncio: an awaitable that finishes with True once messages
    /// are here (take them with `take`) or the subscription resumed from
    /// a pause, or None once it ended (raising if the node ended it). It
    /// takes nothing itself, so cancelling it loses nothing.
    fn wait_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let core = self.core.clone();
        let mut was_paused = None;
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            let r = poll_fn(|cx| {
                let paused = core.st.lock().paused;
                if *was_paused.get_or_insert(paused) && !paused {
                    return Poll::Ready(Ok(()));
                }
                match core.poll_one(cx) {
                    Poll::Pending => Poll::Pending,
                    Poll::Ready(Got::One(d)) => {
                        core.st.lock().buf.push_front(d);
                        Poll::Ready(Ok(()))
                    }
                    Poll::Ready(Got::Ended(why)) => Poll::Ready(Err(why)),
                }
            })
            .await;
            match r {
                Ok(()) => Ok(Some(true)),
                Err(None) => Ok(None),
                Err(why) => Err(ended_error(why)),
            }
        })
    }

    /// Stops handing out messages (cMsg's pause): they wait, and once
    /// this process's window and the node's queue are full the policy
    /// applies.
    fn pause(&self) {
        let mut st = self.core.st.lock();
        st.paused = true;
        if let Some(s) = &st.sub {
            s.pause();
        }
    }

    /// Hands out messages again.
    fn resume(&self) {
        let mut st = self.core.st.lock();
        st.paused = false;
        if let Some(s) = &st.sub {
            s.resume();
        }
        self.core.wake_all();
    }

    /// Whether paused.
    #[getter]
    fn paused(&self) -> bool {
        self.core.st.lock().paused
    }

    /// Ends the subscription (idempotent); waiting calls end too.
    fn unsubscribe(&self) {
        let mut st = self.core.st.lock();
        let s = st.sub.take();
        st.buf.clear();
        self.core.wake_all();
        drop(st);
        drop(s);
    }

    /// Whether the subscription is live (not unsubscribed).
    #[getter]
    fn active(&self) -> bool {
        self.core.st.lock().sub.is_some()
    }

    /// Messages the node dropped for this subscription so far (its
    /// policy), as the node last reported.
    #[getter]
    fn dropped(&self) -> u64 {
        self.core.st.lock().sub.as_ref().map_or(0, |s| s.dropped())
    }

    /// Failovers this subscription lived through (each a window in which
    /// messages may have been missed; see `Message.gap`).
    #[getter]
    fn gaps(&self) -> u64 {
        self.core.st.lock().sub.as_ref().map_or(0, |s| s.gaps())
    }

    /// Messages waiting in this process.
    #[getter]
    fn pending(&self) -> usize {
        let st = self.core.st.lock();
        st.buf.len() + st.sub.as_ref().map_or(0, |s| s.queue_len())
    }

    /// The subject pattern.
    #[getter]
    fn pattern(&self) -> &str {
        &self.pattern
    }

    /// The subscription's id (as in the node's stats).
    #[getter]
    fn id(&self) -> u64 {
        self.id
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, _exc: &Bound<'_, pyo3::types::PyTuple>) {
        self.unsubscribe();
    }

    fn __repr__(&self) -> String {
        format!("<skiff.Subscription {:?} id={}>", self.pattern, self.id)
    }
}
