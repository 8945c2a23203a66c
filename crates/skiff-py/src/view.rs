//! Bytes across the boundary without copies where Python allows it.
//!
//! In: [`with_data`] reads `bytes` in place and any other object with the
//! buffer protocol (`bytearray`, `memoryview`, numpy arrays, ...) through
//! `PyObject_GetBuffer`, refusing `str` and the rest with a `TypeError`
//! that names the parameter.
//!
//! Out: [`memoryview`] exposes memory that Rust owns (a message's `Bytes`,
//! a shared-memory segment) as a `memoryview` whose exporter, a small
//! object of the private type `skiff._View`, keeps the owner alive. pyo3
//! offers the buffer protocol to abi3 modules only from Python 3.11 (when
//! `Py_buffer` joined the stable ABI); the struct and the three buffer
//! functions have had the same layout and symbols since 3.3, so this
//! module declares them itself and builds the type with
//! `PyType_FromSpec`. All of this crate's `unsafe` code is here.

use std::any::Any;
use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use pyo3::exceptions::PyTypeError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// CPython's `Py_buffer` (unchanged since 3.3; stable ABI from 3.11).
#[repr(C)]
struct RawBuffer {
    buf: *mut c_void,
    obj: *mut ffi::PyObject,
    len: ffi::Py_ssize_t,
    itemsize: ffi::Py_ssize_t,
    readonly: c_int,
    ndim: c_int,
    format: *mut c_char,
    shape: *mut ffi::Py_ssize_t,
    strides: *mut ffi::Py_ssize_t,
    suboffsets: *mut ffi::Py_ssize_t,
    internal: *mut c_void,
}

extern "C" {
    fn PyObject_GetBuffer(obj: *mut ffi::PyObject, view: *mut RawBuffer, flags: c_int) -> c_int;
    fn PyBuffer_Release(view: *mut RawBuffer);
    fn PyUnicode_AsUTF8AndSize(
        obj: *mut ffi::PyObject,
        size: *mut ffi::Py_ssize_t,
    ) -> *const c_char;
    fn PyBuffer_FillInfo(
        view: *mut RawBuffer,
        obj: *mut ffi::PyObject,
        buf: *mut c_void,
        len: ffi::Py_ssize_t,
        readonly: c_int,
        flags: c_int,
    ) -> c_int;
}

/// The UTF-8 text of a `str`, in place (CPython caches it in the object;
/// in the limited API only from 3.10, in every CPython 3 ABI).
pub(crate) fn str_ref<'a>(s: &'a Bound<'_, pyo3::types::PyString>) -> PyResult<&'a str> {
    let mut n: ffi::Py_ssize_t = 0;
    // SAFETY: `s` is a live str; the returned buffer is owned by it and
    // lives as long as it does (the borrow of `s`), NUL-terminated UTF-8,
    // or null with an exception set (lone surrogates).
    unsafe {
        let p = PyUnicode_AsUTF8AndSize(s.as_ptr(), &mut n);
        if p.is_null() {
            return Err(PyErr::fetch(s.py()));
        }
        let b = std::slice::from_raw_parts(p as *const u8, n as usize);
        Ok(std::str::from_utf8_unchecked(b))
    }
}

/// `PyBUF_SIMPLE`: contiguous bytes, no format.
const PYBUF_SIMPLE: c_int = 0;
/// Slot numbers of `bf_getbuffer` and `bf_releasebuffer` (typeslots.h).
const PY_BF_GETBUFFER: c_int = 1;
const PY_BF_RELEASEBUFFER: c_int = 2;

/// Calls `f` with the bytes of `data` (`bytes` in place; anything with the
/// buffer protocol through a buffer view held for the call). `name` is
/// the parameter's name for the `TypeError`.
pub(crate) fn with_data<R>(
    name: &str,
    data: &Bound<'_, PyAny>,
    f: impl FnOnce(&[u8]) -> R,
) -> PyResult<R> {
    if let Ok(b) = data.cast::<PyBytes>() {
        return Ok(f(b.as_bytes()));
    }
    if data.is_instance_of::<pyo3::types::PyString>() {
        return Err(PyTypeError::new_err(format!(
            "{name} must be bytes, bytearray or memoryview, not str (encode it first, e.g. {name}.encode())"
        )));
    }
    let mut view = std::mem::MaybeUninit::<RawBuffer>::uninit();
    // SAFETY: `data` is a live object (we hold a reference and the GIL);
    // PyObject_GetBuffer fills `view` on success and returns -1 with an
    // exception set on failure, leaving it unused.
    let rc = unsafe { PyObject_GetBuffer(data.as_ptr(), view.as_mut_ptr(), PYBUF_SIMPLE) };
    if rc != 0 {
        // Drop the BufferError/TypeError CPython set; say which parameter.
        let _ = PyErr::take(data.py());
        return Err(PyTypeError::new_err(format!(
            "{name} must be bytes, bytearray or memoryview (contiguous), not {}",
            crate::wait::type_name(data)
        )));
    }
    // SAFETY: filled by the successful call above.
    let mut view = unsafe { view.assume_init() };
    let bytes: &[u8] = if view.len <= 0 || view.buf.is_null() {
        &[]
    } else {
        // SAFETY: a PyBUF_SIMPLE view is `len` contiguous bytes at `buf`,
        // valid until PyBuffer_Release; we hold the GIL throughout, so no
        // Python code can resize the exporter meanwhile.
        unsafe { std::slice::from_raw_parts(view.buf as *const u8, view.len as usize) }
    };
    let r = f(bytes);
    // SAFETY: releases the view obtained above, once.
    unsafe { PyBuffer_Release(&mut view) };
    Ok(r)
}

/// The exporter object behind each `memoryview` this crate hands out.
#[repr(C)]
struct ViewObj {
    ob_base: ffi::PyObject,
    ptr: *mut u8,
    len: ffi::Py_ssize_t,
    readonly: c_int,
    keep: *mut Keep,
}

/// What a view keeps alive, and the count of live buffer exports the
/// owner may check (a segment must not be delivered while Python can
/// still write to it).
struct Keep {
    _owner: Box<dyn Any + Send>,
    exports: Option<Arc<AtomicUsize>>,
}

unsafe extern "C" fn view_getbuffer(
    exporter: *mut ffi::PyObject,
    view: *mut RawBuffer,
    flags: c_int,
) -> c_int {
    let o = exporter as *mut ViewObj;
    // SAFETY: CPython calls this slot with an object of our type and a
    // `Py_buffer` to fill; FillInfo takes a reference to the exporter and
    // refuses a writable request on a read-only view.
    unsafe {
        if PyBuffer_FillInfo(
            view,
            exporter,
            (*o).ptr as *mut c_void,
            (*o).len,
            (*o).readonly,
            flags,
        ) < 0
        {
            return -1;
        }
        if let Some(c) = &(*(*o).keep).exports {
            c.fetch_add(1, Ordering::AcqRel);
        }
    }
    0
}

unsafe extern "C" fn view_releasebuffer(exporter: *mut ffi::PyObject, _view: *mut RawBuffer) {
    let o = exporter as *mut ViewObj;
    // SAFETY: called once per successful getbuffer on our object.
    unsafe {
        if let Some(c) = &(*(*o).keep).exports {
            c.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

unsafe extern "C" fn view_dealloc(obj: *mut ffi::PyObject) {
    // SAFETY: the object is ours and no longer referenced; its `keep` was
    // boxed at creation and is freed exactly here. Instances of a heap
    // type hold a reference to their type, released after freeing.
    unsafe {
        let o = obj as *mut ViewObj;
        if !(*o).keep.is_null() {
            drop(Box::from_raw((*o).keep));
            (*o).keep = std::ptr::null_mut();
        }
        let tp = ffi::Py_TYPE(obj);
        let free = ffi::PyType_GetSlot(tp, ffi::Py_tp_free);
        if !free.is_null() {
            let free: ffi::freefunc = std::mem::transmute(free);
            free(obj as *mut c_void);
        }
        ffi::Py_DECREF(tp as *mut ffi::PyObject);
    }
}

/// The `skiff._View` type (made once, never freed).
fn view_type(py: Python<'_>) -> PyResult<*mut ffi::PyTypeObject> {
    static TYPE: OnceLock<usize> = OnceLock::new();
    if let Some(t) = TYPE.get() {
        return Ok(*t as *mut ffi::PyTypeObject);
    }
    let mut slots = [
        ffi::PyType_Slot {
            slot: PY_BF_GETBUFFER,
            pfunc: view_getbuffer as *mut c_void,
        },
        ffi::PyType_Slot {
            slot: PY_BF_RELEASEBUFFER,
            pfunc: view_releasebuffer as *mut c_void,
        },
        ffi::PyType_Slot {
            slot: ffi::Py_tp_dealloc,
            pfunc: view_dealloc as *mut c_void,
        },
        ffi::PyType_Slot {
            slot: 0,
            pfunc: std::ptr::null_mut(),
        },
    ];
    // PyType_FromSpec copies what it needs from the spec except the name,
    // which must live as long as the type: a static string.
    let mut spec = ffi::PyType_Spec {
        name: c"skiff._View".as_ptr(),
        basicsize: std::mem::size_of::<ViewObj>() as c_int,
        itemsize: 0,
        flags: ffi::Py_TPFLAGS_DEFAULT as _,
        slots: slots.as_mut_ptr(),
    };
    // SAFETY: a valid spec with a static name and slots of the right
    // signatures; we hold the GIL.
    let t = unsafe { ffi::PyType_FromSpec(&mut spec) };
    if t.is_null() {
        return Err(PyErr::fetch(py));
    }
    // Another thread may have won the race (under the GIL only between
    // calls): keep the first type, the other stays alive and unused.
    Ok(*TYPE.get_or_init(|| t as usize) as *mut ffi::PyTypeObject)
}

/// A `memoryview` of `len` bytes at `ptr` that keeps `owner` alive (and
/// so the memory valid) while any view of it lives; writable unless
/// `readonly`. `exports` counts the buffer exports alive.
///
/// # Safety
/// `ptr..ptr+len` must stay valid for reading (and writing, unless
/// `readonly`) as long as `owner` lives.
pub(crate) unsafe fn memoryview<'py>(
    py: Python<'py>,
    ptr: *mut u8,
    len: usize,
    readonly: bool,
    owner: Box<dyn Any + Send>,
    exports: Option<Arc<AtomicUsize>>,
) -> PyResult<Bound<'py, PyAny>> {
    let tp = view_type(py)?;
    // SAFETY: allocating an instance of our heap type with its tp_alloc;
    // every field is set before anything can see the object.
    unsafe {
        let alloc = ffi::PyType_GetSlot(tp, ffi::Py_tp_alloc);
        let alloc: ffi::allocfunc = std::mem::transmute(alloc);
        let obj = alloc(tp, 0);
        if obj.is_null() {
            return Err(PyErr::fetch(py));
        }
        let o = obj as *mut ViewObj;
        (*o).ptr = ptr;
        (*o).len = len as ffi::Py_ssize_t;
        (*o).readonly = c_int::from(readonly);
        (*o).keep = Box::into_raw(Box::new(Keep {
            _owner: owner,
            exports,
        }));
        let obj = Bound::from_owned_ptr(py, obj);
        let mv = ffi::PyMemoryView_FromObject(obj.as_ptr());
        if mv.is_null() {
            return Err(PyErr::fetch(py));
        }
        Ok(Bound::from_owned_ptr(py, mv))
    }
}

/// A read-only, zero-copy `memoryview` of `b` (which it keeps alive).
pub(crate) fn bytes_view<'py>(py: Python<'py>, b: &bytes::Bytes) -> PyResult<Bound<'py, PyAny>> {
    let b = b.clone();
    let (ptr, len) = (b.as_ptr() as *mut u8, b.len());
    // SAFETY: `Bytes` never moves or frees its memory while a clone lives,
    // and the view is read-only.
    unsafe { memoryview(py, ptr, len, true, Box::new(b), None) }
}
