//! `file:///path`: cMsg's file domain. Publishing appends each message to
//! a log file (a record each: a mark, the length, checksums, then the
//! message in skiff's wire encoding: `skiff_proto::record`); subscribing
//! reads the log from its start, filters by subject and type pattern, and
//! follows it as it grows.
//!
//! The log survives damage. Opening it to append cuts a torn last record
//! (a writer that died or a disk that filled mid-append), and says so on
//! standard error. A reader skips a damaged record (bad checksum, or torn
//! and appended to since) to the next record's mark, counts it
//! ([`super::Subscription::skipped`]) and goes on.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use skiff_proto::record::{self, Next, Skipped};
use skiff_proto::router::{CmsgPattern, KindPattern, Pattern, Subject, Syntax};
use skiff_proto::{wire, Message};

use super::inbox;
use super::sub::{Delivery, Subscription};
use super::Inner;
use crate::Error;

/// Largest record the reader accepts (a longer one is damage).
const MAX_RECORD: usize = 64 << 20;

/// Bytes at the end of the log that opening it looks at for a torn record
/// first (the whole log when no record starts in them).
const TAIL_WINDOW: u64 = 1 << 20;

/// An append-only log of published messages.
#[derive(Debug)]
pub struct FileLog {
    path: PathBuf,
    file: Mutex<std::fs::File>,
}

impl FileLog {
    /// Opens (creating) the log at `path`, cutting a torn last record
    /// when no other process has the log open to append (a record being
    /// written is not torn).
    pub fn open(path: &str) -> Result<FileLog, Error> {
        let path = PathBuf::from(if path.is_empty() { "/" } else { path });
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .open(&path)
            .map_err(Error::io("open the log file"))?;
        if lock::exclusive(&file) {
            let cut = cut_torn_tail(&mut file);
            lock::shared(&file);
            match cut {
                Ok(Some((at, len))) => tracing::warn!(
                    path = %path.display(),
                    offset = at,
                    bytes = len,
                    "cut a torn record off the end of the log"
                ),
                Ok(None) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(FileLog {
            path,
            file: Mutex::new(file),
        })
    }

    /// Appends one message.
    pub fn append(&self, msg: &Message) -> Result<(), Error> {
        wire::check(msg)?;
        let mut rec = Vec::new();
        record::encode(&mut rec, msg);
        self.file
            .lock()
            .write_all(&rec)
            .map_err(Error::io("append to the log file"))
    }

    /// Appends messages as consecutive records with one write (the node's
    /// log sinks: one writer, whole records); returns how many.
    pub fn append_batch<'a>(
        &self,
        msgs: impl IntoIterator<Item = &'a Message>,
    ) -> Result<usize, Error> {
        let mut buf = Vec::new();
        let mut n = 0;
        for m in msgs {
            wire::check(m)?;
            record::encode(&mut buf, m);
            n += 1;
        }
        self.file
            .lock()
            .write_all(&buf)
            .map_err(Error::io("append to the log file"))?;
        Ok(n)
    }

    /// The log's path.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// Reads every record from `offset`, skipping damage (counted in
    /// `skipped`, whose offsets are then the file's); returns the messages
    /// and the offset to go on from.
    pub fn read_from(
        &self,
        offset: u64,
        skipped: &mut Skipped,
    ) -> Result<(Vec<Message>, u64), Error> {
        let mut f = std::fs::File::open(&self.path).map_err(Error::io("open the log file"))?;
        f.seek(SeekFrom::Start(offset))
            .map_err(Error::io("seek in the log file"))?;
        let mut data = Vec::new();
        f.read_to_end(&mut data)
            .map_err(Error::io("read the log file"))?;
        let data = Bytes::from(data);
        let mut pos = 0usize;
        let mut out = Vec::new();
        let before = skipped.records;
        while let Some(m) = record::next_skipping(&data, &mut pos, MAX_RECORD, skipped) {
            out.push(m);
        }
        if skipped.records != before {
            if let Some((at, _, _)) = &mut skipped.last {
                *at += offset as usize;
            }
        }
        Ok((out, offset + pos as u64))
    }

    pub(crate) fn subscribe(
        &self,
        inner: Arc<Inner>,
        syntax: Syntax,
        pattern: &str,
        kind: &str,
    ) -> Result<Subscription, Error> {
        let filter = Filter::new(syntax, pattern, kind)?;
        let log = FileLog {
            path: self.path.clone(),
            file: Mutex::new(
                std::fs::OpenOptions::new()
                    .append(true)
                    .open(&self.path)
                    .map_err(Error::io("open the log file"))?,
            ),
        };
        let sub_inbox = inbox::shared();
        let weak = Arc::downgrade(&sub_inbox);
        tokio::spawn(async move {
            let mut offset = 0;
            let mut skipped = Skipped::default();
            loop {
                let Some(ib) = weak.upgrade() else { return };
                match log.read_from(offset, &mut skipped) {
                    Ok((msgs, next)) => {
                        offset = next;
                        let mut i = ib.lock();
                        if i.skipped != skipped.records {
                            i.skipped = skipped.records;
                            i.last_skip = skipped.last.map(|(at, len, why)| {
                                format!("{len} byte(s) at offset {at}: {why}")
                            });
                        }
                        for m in msgs {
                            if filter.matches(&m) {
                                i.push(Delivery::new(m, None, 0));
                            }
                        }
                    }
                    Err(e) => {
                        ib.lock().close(Some(e.to_string()));
                        return;
                    }
                }
                drop(ib);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
        Ok(Subscription::new(inner, 0, sub_inbox, u32::MAX))
    }
}

/// A subscription's patterns, parsed once.
#[derive(Debug)]
enum Filter {
    Tokens(String, String),
    Cmsg(CmsgPattern, CmsgPattern),
}

impl Filter {
    fn new(syntax: Syntax, pattern: &str, kind: &str) -> Result<Filter, Error> {
        Ok(match syntax {
            Syntax::Tokens => {
                Pattern::new(pattern)?;
                KindPattern::new(kind)?;
                Filter::Tokens(pattern.to_owned(), kind.to_owned())
            }
            Syntax::Cmsg => Filter::Cmsg(CmsgPattern::subject(pattern)?, CmsgPattern::kind(kind)?),
        })
    }

    fn matches(&self, m: &Message) -> bool {
        match self {
            Filter::Tokens(p, k) => {
                let (p, k) = (
                    Pattern::new(p).expect("checked"),
                    KindPattern::new(k).expect("checked"),
                );
                Subject::new(&m.subject).is_ok_and(|s| p.matches(&s))
                    && k.matches(m.kind.as_deref())
            }
            Filter::Cmsg(p, k) => {
                p.matches(&m.subject) && k.matches(m.kind.as_deref().unwrap_or(""))
            }
        }
    }
}

/// Cuts a torn record off the end of `file` (opened to read and append):
/// one the end of the file cuts short, after a valid record or starting
/// with the record mark. Returns where it was cut and how many bytes went.
/// Damage that is not at the end stays (readers skip it), as does a file
/// with no valid record in it (not a log, or not one to touch).
fn cut_torn_tail(file: &mut std::fs::File) -> Result<Option<(u64, u64)>, Error> {
    let len = file
        .metadata()
        .map_err(Error::io("read the log file's size"))?
        .len();
    if len == 0 {
        return Ok(None);
    }
    let mut from = len.saturating_sub(TAIL_WINDOW);
    loop {
        let mut data = Vec::new();
        file.seek(SeekFrom::Start(from))
            .map_err(Error::io("seek in the log file"))?;
        file.read_to_end(&mut data)
            .map_err(Error::io("read the log file"))?;
        let data = Bytes::from(data);
        // In a window, start at the first record mark; at 0, at the start.
        let start = if from == 0 {
            Some(0)
        } else {
            record::resync(&data, 0).ok()
        };
        if let Some(torn) = start.and_then(|s| torn_at(&data, s)) {
            if torn >= data.len() {
                return Ok(None);
            }
            let at = from + torn as u64;
            file.set_len(at)
                .map_err(Error::io("cut a torn record off the log file"))?;
            return Ok(Some((at, len - at)));
        }
        if from == 0 {
            return Ok(None);
        }
        from = 0;
    }
}

/// Walking `data` from `start`: where a torn record at its end starts
/// (`data.len()` when there is none), or `None` if no valid record was seen
/// (nothing is known about the data).
fn torn_at(data: &Bytes, start: usize) -> Option<usize> {
    let mut at = start;
    let mut valid_end = None;
    loop {
        match record::next(data, at, MAX_RECORD) {
            Next::Record(_, end) => {
                valid_end = Some(end);
                at = end;
            }
            Next::Partial if at >= data.len() => return valid_end.map(|_| at),
            Next::Partial => {
                // Torn, but appended to since: damage for readers to skip.
                if let Ok(p) = record::resync(data, at + 1) {
                    if matches!(record::next(data, p, MAX_RECORD), Next::Record(..)) {
                        at = p;
                        continue;
                    }
                }
                let marked = data[at..].iter().zip(record::MAGIC).all(|(a, b)| *a == b);
                return match valid_end {
                    Some(_) => Some(at),
                    None if marked => Some(at),
                    None => None,
                };
            }
            Next::Damaged(_) => match record::resync(data, at + 1) {
                Ok(p) => at = p,
                // Damage at the end but no torn record: leave it.
                Err(_) => return valid_end.map(|_| data.len()),
            },
        }
    }
}

/// Advisory locks on the log: a writer holds a shared one while it has the
/// log open, and cutting a torn tail needs an exclusive one, so a record
/// another process is writing is never taken for a torn one.
mod lock {
    #[cfg(unix)]
    use std::os::fd::AsRawFd;

    /// Takes an exclusive lock if no one else holds one; false if someone
    /// does (or locks are not supported here).
    pub(super) fn exclusive(f: &std::fs::File) -> bool {
        #[cfg(unix)]
        {
            // SAFETY: flock on a file descriptor this File owns.
            unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
        }
        #[cfg(not(unix))]
        {
            let _ = f;
            false
        }
    }

    /// Turns the lock into a shared one, held while the file is open.
    pub(super) fn shared(f: &std::fs::File) {
        #[cfg(unix)]
        // SAFETY: as above.
        unsafe {
            libc::flock(f.as_raw_fd(), libc::LOCK_SH);
        }
        #[cfg(not(unix))]
        let _ = f;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log_of(n: u8) -> (Vec<u8>, Vec<usize>) {
        let (mut out, mut starts) = (Vec::new(), Vec::new());
        for i in 0..n {
            starts.push(out.len());
            record::encode(&mut out, &Message::new("t", vec![b'a' + i; 20]));
        }
        (out, starts)
    }

    fn cut(bytes: &[u8]) -> (Option<(u64, u64)>, Vec<u8>) {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("skiff-cut-{}-{n}.log", std::process::id()));
        std::fs::write(&path, bytes).unwrap();
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .append(true)
            .open(&path)
            .unwrap();
        let r = cut_torn_tail(&mut f).unwrap();
        let after = std::fs::read(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        (r, after)
    }

    #[test]
    fn a_torn_tail_is_cut_and_nothing_else_is() {
        let (log, starts) = log_of(4);
        for at in [starts[3] + 1, starts[3] + 3, starts[3] + 20, log.len() - 1] {
            assert_eq!(
                cut(&log[..at]),
                (
                    Some((starts[3] as u64, (at - starts[3]) as u64)),
                    log[..starts[3]].to_vec()
                ),
                "torn at {at}"
            );
        }
        // A whole log, a damaged (not torn) last record, and a file that is
        // not a log stay as they are.
        assert_eq!(cut(&log), (None, log.clone()));
        let mut bad = log.clone();
        *bad.last_mut().unwrap() ^= 1;
        assert_eq!(cut(&bad), (None, bad.clone()));
        let text = b"not a log at all, just some text\n".repeat(10);
        assert_eq!(cut(&text), (None, text.clone()));
        // A torn record appended to since is left for readers to skip.
        let mut torn = log[..starts[3] + 5].to_vec();
        torn.extend_from_slice(&log[starts[1]..starts[2]]);
        assert_eq!(cut(&torn), (None, torn.clone()));
    }
}
