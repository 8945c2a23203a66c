//! `skiff._skiff`: the Python extension behind `import skiff` and
//! `skiff.aio`, a thin layer of pyo3 over the Rust client (`skiff`) and
//! the embedded node (`skiff-node`, for `mem://`).
//!
//! What it adds to the Rust API is only what Python needs: the GIL is
//! released around every wait (and every send that has to wait), waits
//! wake every [`SIGNAL_SLICE`] to let Ctrl-C through, errors become
//! exception classes by cause (`skiff._errors`), and payloads cross as
//! `bytes`/`bytearray`/`memoryview` in and as `bytes` or zero-copy
//! `memoryview`s out (`view`). The asyncio side hands Rust futures to the
//! event loop through `pyo3-async-runtimes`, which resolves each Python
//! future from the runtime's thread with `call_soon_threadsafe`: no thread
//! per call. The Python layer (`python/skiff/`) adds the async iterators,
//! the callback form and the file-like tunnel.
//!
//! I/O: a tokio runtime with two worker threads, made on first use.

mod client;
mod errors;
mod message;
mod queue;
mod shm;
mod view;
mod wait;

use std::sync::OnceLock;

use pyo3::prelude::*;

/// How often a blocking wait wakes to run Python's signal handlers (so
/// Ctrl-C interrupts it).
pub(crate) const SIGNAL_SLICE: std::time::Duration = std::time::Duration::from_millis(50);

static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();

/// The runtime every client of this process runs on.
pub(crate) fn rt() -> &'static tokio::runtime::Runtime {
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("skiff-rt")
            .enable_all()
            .build()
            .expect("skiff: cannot start the tokio runtime")
    })
}

/// The module: classes, functions and the runtime for asyncio.
#[pymodule]
fn _skiff(m: &Bound<'_, PyModule>) -> PyResult<()> {
    skiff_node::embed::install();
    let _ = pyo3_async_runtimes::tokio::init_with_runtime(rt());
    m.add_class::<message::Message>()?;
    m.add_class::<client::Client>()?;
    m.add_class::<client::Subscription>()?;
    m.add_class::<client::Member>()?;
    m.add_class::<client::Tunnel>()?;
    m.add_class::<queue::Queue>()?;
    m.add_class::<shm::Output>()?;
    m.add_class::<shm::Input>()?;
    m.add_class::<shm::OutSegment>()?;
    m.add_class::<shm::InSegment>()?;
    m.add_function(wrap_pyfunction!(client::connect, m)?)?;
    m.add_function(wrap_pyfunction!(client::connect_async, m)?)?;
    m.add_function(wrap_pyfunction!(client::shutdown, m)?)?;
    Ok(())
}
