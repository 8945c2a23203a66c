//! Requests from this client: to every subscription matching a subject
//! or to a cluster member, with the first reply, scatter-gather, "no
//! responders" and timeouts; and replies to requests received on a
//! subscription.

use std::time::Duration;

use bytes::Bytes;
use skiff_proto::client_frame::{req_flags, ClientFrame, Code};
use skiff_proto::router::Subject;
use skiff_proto::Message;
use tokio::sync::mpsc;

use super::cluster::Target;
use super::sub::Delivery;
use super::Client;
use crate::Error;

/// What a request hears.
#[derive(Debug)]
pub(crate) enum ReqEvent {
    Reply(Message),
    Done(Code),
    /// The node it was sent to was lost.
    Lost(String),
}

/// Requests and replies.
impl Client {
    /// Answers a request received on a subscription (a [`Delivery`] with
    /// [`Delivery::is_request`]). A reply to a request that is no longer
    /// waited for is dropped by the node.
    pub async fn reply(&self, to: &Delivery, msg: Message) -> Result<(), Error> {
        let token = to.token.ok_or(Error::Refused {
            code: Code::Invalid,
            reason: "this message is not a request; there is nobody to reply to".into(),
        })?;
        self.inner.reply(token, to.epoch, msg).await
    }

    /// Sends a request and waits for the first reply: to every subscription
    /// matching a subject (`"svc.echo"`), or to one member of a cluster
    /// ([`Target::cluster`]). [`Error::NoResponders`] comes at once when
    /// nobody could answer; [`Error::Timeout`] after `timeout`;
    /// [`Error::NodeLost`] at once if the node is lost meanwhile (the
    /// request may or may not have been handled).
    pub async fn request(
        &self,
        target: impl Into<Target>,
        msg: Message,
        timeout: Duration,
    ) -> Result<Message, Error> {
        let mut v = self.request_inner(target.into(), msg, timeout, 1).await?;
        v.pop().ok_or(Error::Timeout)
    }

    /// Scatter-gather: sends to every matching subscription (or every
    /// member of a cluster) and collects replies until `max` arrived, every
    /// responder answered, or `timeout` passed. An empty result means
    /// nobody answered in time; [`Error::NoResponders`] means nobody could.
    pub async fn request_many(
        &self,
        target: impl Into<Target>,
        msg: Message,
        timeout: Duration,
        max: usize,
    ) -> Result<Vec<Message>, Error> {
        let max = max.clamp(1, u32::MAX as usize) as u32;
        self.request_inner(target.into(), msg, timeout, max).await
    }

    async fn request_inner(
        &self,
        target: Target,
        msg: Message,
        timeout: Duration,
        max: u32,
    ) -> Result<Vec<Message>, Error> {
        self.check(&msg)?;
        let (name, key, mut flags) = match &target {
            Target::Subject(s) => {
                Subject::new(s)?;
                (s.clone(), Bytes::new(), 0)
            }
            Target::Cluster { name, key } => (
                name.clone(),
                key.clone().unwrap_or_default(),
                req_flags::CLUSTER,
            ),
        };
        if max > 1 {
            flags |= req_flags::MANY;
        }
        let rid = self.inner.next_id();
        let (tx, mut rx) = mpsc::unbounded_channel();
        self.inner.state.lock().requests.insert(rid, tx);
        let sent = self
            .inner
            .send(ClientFrame::Req {
                rid,
                flags,
                max,
                target: name.clone(),
                key,
                msg,
            })
            .await;
        if let Err(e) = sent {
            self.inner.state.lock().requests.remove(&rid);
            return Err(e);
        }
        let deadline = tokio::time::Instant::now() + timeout;
        let mut replies = Vec::new();
        let mut finished = false;
        let outcome = loop {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(ReqEvent::Reply(m))) => {
                    replies.push(m);
                    if replies.len() >= max as usize {
                        finished = true;
                        break Ok(());
                    }
                }
                Ok(Some(ReqEvent::Done(Code::NoResponders))) if replies.is_empty() => {
                    finished = true;
                    break Err(Error::NoResponders { target: name });
                }
                Ok(Some(ReqEvent::Done(Code::Denied))) => {
                    finished = true;
                    break Err(Error::Refused {
                        code: Code::Denied,
                        reason: format!(
                            "permission denied: this client's user may not send requests to {name}"
                        ),
                    });
                }
                Ok(Some(ReqEvent::Done(_))) => {
                    finished = true;
                    break Ok(());
                }
                Ok(Some(ReqEvent::Lost(node))) => {
                    finished = true;
                    break Err(Error::NodeLost { node });
                }
                Ok(None) => {
                    finished = true;
                    break Err(self.inner.closed_error());
                }
                Err(_) => break Ok(()),
            }
        };
        self.inner.state.lock().requests.remove(&rid);
        if !finished {
            let _ = self.inner.send_now(ClientFrame::Cancel { rid });
        }
        outcome?;
        if replies.is_empty() && max == 1 {
            return Err(Error::Timeout);
        }
        Ok(replies)
    }
}
