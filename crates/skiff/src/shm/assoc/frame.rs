//! The frames of the `udp://…?reliable=true` buffer transport. Their codec
//! (layouts, [`decode_up`], [`decode_down`], [`encode`]) is
//! `skiff_proto::buffer::assoc`; this module adds what ties them to this
//! crate's rings.

pub(crate) use skiff_proto::buffer::assoc::{
    decode_down, decode_up, encode, segment_header, Frame,
};
pub(crate) use skiff_proto::buffer::{CloseReason, MAX_LEN};

/// The reason a ring consumer's error ends a buffer with.
pub(crate) fn close_reason(e: &crate::shm::BufferError) -> CloseReason {
    match e {
        crate::shm::BufferError::Closed { .. } => CloseReason::Producer,
        e if e.is_peer_gone() => CloseReason::Lost,
        _ => CloseReason::Corrupt,
    }
}
