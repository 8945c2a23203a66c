//! Tests of the association: a two-endpoint harness with a simulated clock
//! and network ([`harness`]), script-like scenarios ([`scripts`]), property
//! tests over random operations and faults ([`props`]), malformed input
//! for the codec ([`malformed`]), stream writes ([`stream`]), and the association endpoint between two
//! hosts that both initiate and accept ([`endpoint`]), bundles of small
//! messages ([`bundles`]), the status every packet carries ([`status`]).

mod bundles;
mod closes;
mod endpoint;
mod harness;
mod malformed;
mod props;
mod scripts;
mod status;
mod stream;
