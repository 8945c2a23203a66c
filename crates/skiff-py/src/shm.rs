//! `skiff.shm`: RocketBufs buffers (`skiff::shm::{Output, Input}`) with
//! segments exposed as `memoryview`s of the ring itself, without copies.
//!
//! A view keeps its `Output` or `Input` object alive, so the mapping
//! outlives every view of it. What a view shows follows the ring
//! protocol: an output segment's views are for writing until `deliver`
//! (which refuses while any of them is still exported: release them, or
//! use them in a `with` block); an input segment's views are valid until
//! `consumed` returns that space to the producer.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyTuple};
use skiff::shm::{BufferError, Flow, SegmentMut};

use crate::errors::{raise, IntoPy};
use crate::view::{memoryview, with_data};
use crate::wait::{deadline, timeout_arg};

fn id_arg(id: i64) -> PyResult<u32> {
    u32::try_from(id).map_err(|_| {
        PyValueError::new_err(format!("id must be between 0 and {}, not {id}", u32::MAX))
    })
}

fn size_arg(name: &str, n: i64) -> PyResult<usize> {
    if !(0..=(1i64 << 40)).contains(&n) {
        return Err(PyValueError::new_err(format!(
            "{name} must be between 0 and 2**40, not {n}"
        )));
    }
    Ok(n as usize)
}

/// A RocketBufs output (rOut) on `shm://name`, `tcp://host:port` or
/// `udp://host:port?reliable=true`: creates buffers and delivers segments
/// to every subscriber.
#[pyclass(module = "skiff.shm", frozen)]
#[derive(Debug)]
pub(crate) struct Output {
    out: Mutex<skiff::shm::Output>,
}

/// A segment reserved for writing: fill its `views` (or call `write`),
/// then `Output.deliver(seg, used)`.
#[pyclass(module = "skiff.shm", frozen)]
#[derive(Debug)]
pub(crate) struct OutSegment {
    seg: Mutex<Option<SegmentMut>>,
    /// The segment's one or two slices (it wraps at the ring's end).
    parts: [(usize, usize); 2],
    id: u32,
    len: usize,
    exports: Arc<AtomicUsize>,
    owner: Py<Output>,
}

#[pymethods]
impl Output {
    #[new]
    fn py_new(py: Python<'_>, locator: &Bound<'_, PyAny>) -> PyResult<Output> {
        let loc = crate::message::str_arg("locator", locator)?.to_owned();
        let out = py.detach(|| skiff::shm::Output::open(&loc)).py()?;
        Ok(Output {
            out: Mutex::new(out),
        })
    }

    /// Creates buffer `id` of `size` bytes: credit flow (the producer
    /// waits for its subscribers) or, with `overwrite=True`, the oldest
    /// data is overwritten.
    #[pyo3(signature = (id, size, *, overwrite=false))]
    fn create_buffer(&self, py: Python<'_>, id: i64, size: i64, overwrite: bool) -> PyResult<()> {
        let (id, size) = (id_arg(id)?, size_arg("size", size)?);
        let flow = if overwrite {
            Flow::Overwrite
        } else {
            Flow::Credits
        };
        py.detach(|| self.out.lock().create_buffer(id, size, flow))
            .py()
    }

    /// Reserves a segment of `len` bytes of buffer `id` to write in
    /// place. With `block` (the default) waits, GIL released, until the
    /// subscribers consumed enough; else raises WouldBlock.
    #[pyo3(signature = (id, len, *, block=true))]
    fn segment(slf: &Bound<'_, Self>, id: i64, len: i64, block: bool) -> PyResult<OutSegment> {
        let py = slf.py();
        let (id, len) = (id_arg(id)?, size_arg("len", len)?);
        let mut seg = reserve(py, &slf.get().out, id, len, block)?;
        let (a, b) = seg.slices_mut();
        let parts = [
            (a.as_mut_ptr() as usize, a.len()),
            (b.as_mut_ptr() as usize, b.len()),
        ];
        Ok(OutSegment {
            seg: Mutex::new(Some(seg)),
            parts,
            id,
            len,
            exports: Arc::new(AtomicUsize::new(0)),
            owner: slf.clone().unbind(),
        })
    }

    /// Publishes the first `used` bytes (default: all) of `seg` to every
    /// subscriber. Refused while a view of the segment is still exported.
    #[pyo3(signature = (seg, used=None))]
    fn deliver(&self, seg: &OutSegment, used: Option<i64>) -> PyResult<()> {
        if seg.exports.load(Ordering::Acquire) != 0 {
            return Err(raise(
                "UsageError",
                "a memoryview of this segment is still exported: release it (view.release(), or use it in a with block) before deliver",
            ));
        }
        let used = match used {
            None => seg.len,
            Some(u) => {
                let u = size_arg("used", u)?;
                if u > seg.len {
                    return Err(PyValueError::new_err(format!(
                        "used must be at most the segment's {} bytes, not {u}",
                        seg.len
                    )));
                }
                u
            }
        };
        let s = seg
            .seg
            .lock()
            .take()
            .ok_or_else(|| raise("UsageError", "this segment was already delivered"))?;
        self.out.lock().deliver(s, used).py()
    }

    /// Copies `data` into a new segment of buffer `id` and delivers it.
    #[pyo3(signature = (id, data, *, block=true))]
    fn send(&self, py: Python<'_>, id: i64, data: &Bound<'_, PyAny>, block: bool) -> PyResult<()> {
        let id = id_arg(id)?;
        let len = with_data("data", data, |b| b.len())?;
        let mut seg = reserve(py, &self.out, id, len, block)?;
        with_data("data", data, |b| {
            let n = b.len().min(seg.len());
            seg.write(0, &b[..n]);
        })?;
        self.out.lock().deliver(seg, len).py()
    }

    /// The capacity of buffer `id`, in bytes (the largest segment).
    fn capacity(&self, id: i64) -> PyResult<usize> {
        self.out.lock().capacity(id_arg(id)?).py()
    }

    /// Counters of buffer `id` (segments, bytes, subscribers_lost).
    fn stats<'py>(&self, py: Python<'py>, id: i64) -> PyResult<Bound<'py, PyDict>> {
        let s = self
            .out
            .lock()
            .stats(id_arg(id)?)
            .ok_or_else(|| raise("UsageError", "no such buffer here"))?;
        let d = PyDict::new(py);
        d.set_item("segments", s.segments)?;
        d.set_item("bytes", s.bytes)?;
        d.set_item("subscribers_lost", s.subscribers_lost)?;
        Ok(d)
    }

    /// The address subscribers connect to (tcp:// and udp://), else None.
    #[getter]
    fn local_addr(&self) -> Option<(String, u16)> {
        self.out
            .lock()
            .local_addr()
            .map(|a| (a.ip().to_string(), a.port()))
    }
}

/// Reserves a segment, waiting in slices so that Ctrl-C interrupts.
fn reserve(
    py: Python<'_>,
    out: &Mutex<skiff::shm::Output>,
    id: u32,
    len: usize,
    block: bool,
) -> PyResult<SegmentMut> {
    let mut pause = Duration::from_micros(20);
    loop {
        match out.lock().segment(id, len, false) {
            Err(BufferError::WouldBlock { .. }) if block => {}
            r => return r.py(),
        }
        py.detach(|| std::thread::sleep(pause));
        pause = (pause * 2).min(Duration::from_millis(2));
        py.check_signals()?;
    }
}

#[pymethods]
impl OutSegment {
    /// The segment as one or two writable memoryviews (two when it wraps
    /// around the ring's end), without copies.
    #[getter]
    fn views<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        if self.seg.lock().is_none() {
            return Err(raise("UsageError", "this segment was already delivered"));
        }
        let mut out = Vec::new();
        for &(p, n) in &self.parts {
            if n == 0 && !out.is_empty() {
                continue;
            }
            // SAFETY: the slice is part of the ring's mapping, which the
            // Output (kept alive by the view) holds until it is dropped;
            // deliver refuses while the view is exported.
            let v = unsafe {
                memoryview(
                    py,
                    p as *mut u8,
                    n,
                    false,
                    Box::new(self.owner.clone_ref(py)),
                    Some(self.exports.clone()),
                )?
            };
            out.push(v);
        }
        PyTuple::new(py, out)
    }

    /// Copies `data` into the segment at offset `at`.
    #[pyo3(signature = (data, at=0))]
    fn write(&self, data: &Bound<'_, PyAny>, at: i64) -> PyResult<()> {
        let at = size_arg("at", at)?;
        let mut g = self.seg.lock();
        let seg = g
            .as_mut()
            .ok_or_else(|| raise("UsageError", "this segment was already delivered"))?;
        with_data("data", data, |b| {
            if at.checked_add(b.len()).is_none_or(|end| end > seg.len()) {
                return Err(PyValueError::new_err(format!(
                    "data of {} bytes at {at} does not fit the segment's {} bytes",
                    b.len(),
                    seg.len()
                )));
            }
            seg.write(at, b);
            Ok(())
        })?
    }

    /// The buffer's id.
    #[getter]
    fn id(&self) -> u32 {
        self.id
    }

    fn __len__(&self) -> usize {
        self.len
    }
}

/// A RocketBufs input (rIn) on the same locators: subscribes to buffers
/// and reads their segments in place.
#[pyclass(module = "skiff.shm", frozen)]
#[derive(Debug)]
pub(crate) struct Input {
    inp: Mutex<skiff::shm::Input>,
}

/// A received segment: `views` reads it in place (credit flow), `data`
/// copies it (either flow; checks it was not overwritten meanwhile).
#[pyclass(module = "skiff.shm", frozen)]
#[derive(Debug)]
pub(crate) struct InSegment {
    id: u32,
    position: u64,
    len: usize,
    parts: Option<[(usize, usize); 2]>,
    /// Overwrite flow: the bytes, copied when received.
    data: Option<Py<PyBytes>>,
    intact: bool,
    owner: Py<Input>,
}

#[pymethods]
impl Input {
    #[new]
    fn py_new(py: Python<'_>, locator: &Bound<'_, PyAny>) -> PyResult<Input> {
        let loc = crate::message::str_arg("locator", locator)?.to_owned();
        let inp = py.detach(|| skiff::shm::Input::open(&loc)).py()?;
        Ok(Input {
            inp: Mutex::new(inp),
        })
    }

    /// Subscribes to buffer `id` of `size` bytes.
    fn subscribe(&self, py: Python<'_>, id: i64, size: i64) -> PyResult<()> {
        let (id, size) = (id_arg(id)?, size_arg("size", size)?);
        py.detach(|| self.inp.lock().subscribe(id, size)).py()
    }

    /// The next segment of any subscribed buffer, waiting up to `timeout`
    /// seconds (None: forever) with the GIL released; raises TimeoutError.
    #[pyo3(signature = (timeout=None))]
    fn recv(slf: &Bound<'_, Self>, timeout: Option<&Bound<'_, PyAny>>) -> PyResult<InSegment> {
        let py = slf.py();
        let end = deadline(timeout_arg("timeout", timeout)?);
        loop {
            let slice = match end {
                None => crate::SIGNAL_SLICE,
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    left.min(crate::SIGNAL_SLICE)
                }
            };
            let me = slf.get();
            let got = py.detach(|| {
                let mut inp = me.inp.lock();
                match inp.recv(Some(slice)) {
                    Ok(Some(seg)) => {
                        let parts = seg.slices().ok().map(|(a, b)| {
                            [
                                (a.as_ptr() as usize, a.len()),
                                (b.as_ptr() as usize, b.len()),
                            ]
                        });
                        // Overwrite flow: copy now, checked; credits: read in place.
                        let data = parts.is_none().then(|| seg.to_vec());
                        Ok(Some((
                            seg.id(),
                            seg.position(),
                            seg.len(),
                            parts,
                            data,
                            seg.intact(),
                        )))
                    }
                    Ok(None) => Ok(None),
                    Err(e) => Err(e),
                }
            });
            if let Some((id, position, len, parts, data, intact)) = got.py()? {
                return Ok(InSegment {
                    id,
                    position,
                    len,
                    parts,
                    data: data.map(|d| PyBytes::new(py, &d).unbind()),
                    intact,
                    owner: slf.clone().unbind(),
                });
            }
            if end.is_some_and(|d| Instant::now() >= d) {
                return Err(raise("TimeoutError", "no segment within the timeout"));
            }
            py.check_signals()?;
        }
    }

    /// Returns `len` bytes of buffer `id` to its producer, oldest first
    /// (views of them may then change).
    fn consumed(&self, id: i64, len: i64) -> PyResult<()> {
        let (id, len) = (id_arg(id)?, size_arg("len", len)?);
        self.inp.lock().consumed(id, len).py()
    }

    /// Counters of buffer `id` (torn, lost, unconsumed).
    fn stats<'py>(&self, py: Python<'py>, id: i64) -> PyResult<Bound<'py, PyDict>> {
        let s = self
            .inp
            .lock()
            .stats(id_arg(id)?)
            .ok_or_else(|| raise("UsageError", "not subscribed to that buffer"))?;
        let d = PyDict::new(py);
        d.set_item("torn", s.torn)?;
        d.set_item("lost", s.lost)?;
        d.set_item("unconsumed", s.unconsumed)?;
        Ok(d)
    }
}

#[pymethods]
impl InSegment {
    /// The segment in place as one or two read-only memoryviews, without
    /// copies (credit flow; an overwrite buffer raises UsageError: read
    /// `data`). Valid until `consumed` returns the space.
    #[getter]
    fn views<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let parts = self.parts.ok_or_else(|| {
            raise(
                "UsageError",
                "overwrite buffers are read with data (they may change under a reader)",
            )
        })?;
        let mut out = Vec::new();
        for (p, n) in parts {
            if n == 0 && !out.is_empty() {
                continue;
            }
            // SAFETY: the slice is in the input's mapping, which the Input
            // (kept alive by the view) holds while it lives; read-only.
            let v = unsafe {
                memoryview(
                    py,
                    p as *mut u8,
                    n,
                    true,
                    Box::new(self.owner.clone_ref(py)),
                    None,
                )?
            };
            out.push(v);
        }
        PyTuple::new(py, out)
    }

    /// The segment's bytes as `bytes` (a copy; credit flow: made now, so
    /// before `consumed`; overwrite flow: made when received).
    #[getter]
    fn data(&self, py: Python<'_>) -> Py<PyBytes> {
        if let Some(d) = &self.data {
            return d.clone_ref(py);
        }
        let mut v = Vec::with_capacity(self.len);
        for (p, n) in self.parts.into_iter().flatten() {
            if n > 0 {
                // SAFETY: as for `views`: in the mapping the Input holds.
                v.extend_from_slice(unsafe { std::slice::from_raw_parts(p as *const u8, n) });
            }
        }
        PyBytes::new(py, &v).unbind()
    }

    /// False if an overwrite buffer's producer overwrote it while read.
    #[getter]
    fn intact(&self) -> bool {
        self.intact
    }

    /// The buffer's id.
    #[getter]
    fn id(&self) -> u32 {
        self.id
    }

    /// The position of the first byte in the buffer's stream.
    #[getter]
    fn position(&self) -> u64 {
        self.position
    }

    fn __len__(&self) -> usize {
        self.len
    }
}
