//! Standard output that a closed pipe ends quietly: `skiff stats | head -1`
//! exits the way a C tool killed by `SIGPIPE` does (status 141, nothing on
//! standard error), not with a panic as `println!` would. (The node and
//! the clients need `SIGPIPE` ignored for their sockets, so it stays so.)

use std::error::Error;
use std::fmt;
use std::io::{self, Write};

/// The exit status of a process ended by `SIGPIPE` (128 + 13).
pub(crate) const BROKEN_PIPE_EXIT: i32 = 141;

/// `println!` that exits quietly when standard output is closed.
macro_rules! outln {
    ($($t:tt)*) => {
        $crate::out::line(format_args!($($t)*))
    };
}
pub(crate) use outln;

/// Writes one line to standard output; a closed pipe ends the process
/// quietly, any other error with a message.
pub(crate) fn line(args: fmt::Arguments<'_>) {
    let mut out = io::stdout().lock();
    if let Err(e) = out.write_fmt(args).and_then(|()| out.write_all(b"\n")) {
        exit_on(&e);
    }
}

/// Ends the process for an error writing standard output.
fn exit_on(e: &io::Error) -> ! {
    if e.kind() == io::ErrorKind::BrokenPipe {
        std::process::exit(BROKEN_PIPE_EXIT);
    }
    eprintln!("skiff: writing to standard output: {e}");
    std::process::exit(1);
}

/// Whether a command's error is a closed standard output (a reader such as
/// `head` went away): then the command ends quietly.
pub(crate) fn is_broken_pipe(e: &(dyn Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(e) = cur {
        if e.downcast_ref::<io::Error>()
            .is_some_and(|e| e.kind() == io::ErrorKind::BrokenPipe)
        {
            return true;
        }
        cur = e.source();
    }
    false
}
