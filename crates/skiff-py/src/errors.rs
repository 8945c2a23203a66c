//! Rust errors as Python exceptions, by cause. The classes live in
//! `skiff/_errors.py` (so they can also derive from Python's built-in
//! exceptions); this maps each error to its class, keeping the Rust
//! error's message.

use pyo3::prelude::*;
use pyo3::types::PyString;
use skiff::client::Code;
use skiff::shm::BufferError;
use skiff::Error;

/// An exception of class `name` of `skiff._errors` with `msg`.
pub(crate) fn raise(name: &str, msg: impl Into<String>) -> PyErr {
    let msg = msg.into();
    Python::attach(|py| {
        let cls = py.import("skiff._errors").and_then(|m| m.getattr(name));
        match cls {
            Ok(cls) => match cls.call1((PyString::new(py, &msg),)) {
                Ok(e) => PyErr::from_value(e),
                Err(e) => e,
            },
            // The package is broken; still say what happened.
            Err(_) => pyo3::exceptions::PyRuntimeError::new_err(msg),
        }
    })
}

/// The class of a node's refusal code.
fn refused_class(code: Code) -> &'static str {
    match code {
        Code::Limit => "LimitExceeded",
        Code::Invalid => "InvalidName",
        Code::NoResponders => "NoResponders",
        Code::SlowConsumer => "SlowConsumer",
        Code::Shutdown => "ConnectionClosed",
        Code::NotFound => "NotFound",
        Code::Protocol => "ProtocolError",
        Code::Auth => "AuthenticationFailed",
        Code::Denied => "PermissionDenied",
        _ => "Refused",
    }
}

/// The exception for a client or queue error.
pub(crate) fn to_py(e: Error) -> PyErr {
    let class = match &e {
        Error::Locator(_) => "LocatorError",
        Error::Usage(_) => "UsageError",
        Error::Limit(_) => "LimitExceeded",
        Error::Codec(_) | Error::TypeMismatch { .. } => "ProtocolError",
        Error::Io { .. } => "IoError",
        Error::Closed => "ConnectionClosed",
        Error::Timeout => "TimeoutError",
        Error::NoResponders { .. } => "NoResponders",
        Error::Refused { code, .. } => refused_class(*code),
        Error::Subject(_) => "InvalidName",
        Error::NodeLost { .. } => "NodeLost",
        _ => "SkiffError",
    };
    raise(class, e.to_string())
}

/// The exception for a buffer error.
pub(crate) fn buf_to_py(e: BufferError) -> PyErr {
    let class = match &e {
        BufferError::Locator(_) => "LocatorError",
        BufferError::WouldBlock { .. } => "WouldBlock",
        BufferError::Timeout => "TimeoutError",
        BufferError::Closed { .. } => "ConnectionClosed",
        BufferError::PeerDead { .. } | BufferError::PeerLost { .. } => "PeerLost",
        BufferError::Io { .. } => "IoError",
        BufferError::Corrupt { .. } => "ProtocolError",
        BufferError::TooLarge { .. }
        | BufferError::Usage { .. }
        | BufferError::UnknownBuffer { .. }
        | BufferError::DuplicateId { .. } => "UsageError",
        _ => "SkiffError",
    };
    raise(class, e.to_string())
}

/// `Result<T, Error>` to `PyResult<T>`.
pub(crate) trait IntoPy<T> {
    /// Maps the error to its exception.
    fn py(self) -> PyResult<T>;
}

impl<T> IntoPy<T> for Result<T, Error> {
    fn py(self) -> PyResult<T> {
        self.map_err(to_py)
    }
}

impl<T> IntoPy<T> for Result<T, BufferError> {
    fn py(self) -> PyResult<T> {
        self.map_err(buf_to_py)
    }
}
