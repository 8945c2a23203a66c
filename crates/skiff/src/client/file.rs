//! `file:///path`: cMsg's file domain. Publishing appends each message to
//! a log file (a 4-byte little-endian length, then the message in skiff's
//! wire encoding: `skiff_proto::record`); subscribing reads the log from its start, filters by
//! subject and type pattern, and follows it as it grows.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use skiff_proto::router::{KindPattern, Pattern, Subject};
use skiff_proto::{record, wire, Message, WireError};

use super::inbox;
use super::sub::{Delivery, Subscription};
use super::Inner;
use crate::Error;

/// Largest record the reader accepts (a corrupt length ends the read).
const MAX_RECORD: usize = 64 << 20;

/// An append-only log of published messages.
#[derive(Debug)]
pub struct FileLog {
    path: PathBuf,
    file: Mutex<std::fs::File>,
}

impl FileLog {
    /// Opens (creating) the log at `path`.
    pub fn open(path: &str) -> Result<FileLog, Error> {
        let path = PathBuf::from(if path.is_empty() { "/" } else { path });
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(Error::io("open the log file"))?;
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

    /// Reads every record from `offset`; returns the messages and the
    /// offset after the last whole record.
    pub fn read_from(&self, offset: u64) -> Result<(Vec<Message>, u64), Error> {
        let mut f = std::fs::File::open(&self.path).map_err(Error::io("open the log file"))?;
        f.seek(SeekFrom::Start(offset))
            .map_err(Error::io("seek in the log file"))?;
        let mut data = Vec::new();
        f.read_to_end(&mut data)
            .map_err(Error::io("read the log file"))?;
        let data = Bytes::from(data);
        let mut pos = 0usize;
        let mut out = Vec::new();
        // `None`: the end, or a record still being written.
        while let Some((m, next)) = record::next(&data, pos, MAX_RECORD).map_err(|e| match e {
            WireError::TooLong {
                what: "log record",
                len,
                ..
            } => Error::Codec(format!(
                "log record at offset {} claims {len} bytes: the log is corrupt",
                offset + pos as u64
            )),
            e => Error::Codec(format!("log record: {e}")),
        })? {
            out.push(m);
            pos = next;
        }
        Ok((out, offset + pos as u64))
    }

    pub(crate) fn subscribe(
        &self,
        inner: Arc<Inner>,
        pattern: &str,
        kind: &str,
    ) -> Result<Subscription, Error> {
        let log = FileLog {
            path: self.path.clone(),
            file: Mutex::new(
                std::fs::OpenOptions::new()
                    .append(true)
                    .open(&self.path)
                    .map_err(Error::io("open the log file"))?,
            ),
        };
        let pattern = pattern.to_owned();
        let kind = kind.to_owned();
        let sub_inbox = inbox::shared();
        let weak = Arc::downgrade(&sub_inbox);
        tokio::spawn(async move {
            let mut offset = 0;
            loop {
                let Some(ib) = weak.upgrade() else { return };
                match log.read_from(offset) {
                    Ok((msgs, next)) => {
                        offset = next;
                        let p = Pattern::new(&pattern).expect("checked");
                        let k = KindPattern::new(&kind).expect("checked");
                        let mut i = ib.lock();
                        for m in msgs {
                            let ok = Subject::new(&m.subject).is_ok_and(|s| p.matches(&s))
                                && k.matches(m.kind.as_deref());
                            if ok {
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
