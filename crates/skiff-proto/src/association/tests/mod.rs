//! Tests of the association: a two-endpoint harness with a simulated clock
//! and network ([`harness`]), script-like scenarios ([`scripts`]), property
//! tests over random operations and faults ([`props`]) and malformed input
//! for the codec ([`malformed`]).

mod harness;
mod malformed;
mod props;
mod scripts;
