//! trybuild cases live in tests/. This crate's only code is [`candle`], the stand-ins that
//! let the candle cases compile without candle.

pub mod candle;
