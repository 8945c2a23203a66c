//! Typed messages (CMQ's polymorphic queue): a value serialized with
//! postcard, its Rust type name as the message type.

use serde::{de::DeserializeOwned, Serialize};
use skiff_proto::{wire, Message};

use crate::error::Error;

/// Builds a message carrying `value` serialized with postcard, typed with
/// its Rust type name.
pub fn typed_message<T: Serialize>(value: &T) -> Result<Message, Error> {
    let payload = postcard::to_allocvec(value).map_err(|e| Error::Codec(e.to_string()))?;
    Ok(Message::from_payload(payload).with_kind(type_tag::<T>()))
}

/// Deserializes a message built by [`typed_message`] as `T`, checking the
/// type first.
pub fn decode_typed<T: DeserializeOwned>(msg: &Message) -> Result<T, Error> {
    let tag = type_tag::<T>();
    if msg.kind.as_deref() != Some(tag) {
        return Err(Error::TypeMismatch {
            expected: tag.to_string(),
            found: msg.kind.as_ref().map(|k| k.to_string()),
        });
    }
    postcard::from_bytes(&msg.payload).map_err(|e| Error::Codec(e.to_string()))
}

fn type_tag<T>() -> &'static str {
    let name = std::any::type_name::<T>();
    if name.len() <= wire::MAX_KIND {
        return name;
    }
    let mut end = wire::MAX_KIND;
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    &name[..end]
}
