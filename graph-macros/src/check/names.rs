//! The name lists that several rules and the walker share: device-to-host reads, candle's
//! host reads, allocations, formatting macros. The rule table (`rules.rs`) re-exports them.
//!
//! Data only: imports nothing.

/// The device-to-host reads: the `device-to-host` rule, the marks of `let` bindings and the
/// `host-branch-on-device-data` rule all use this list.
pub const DEVICE_READS: &[&str] = &[
    "clone_dtoh",
    "memcpy_dtoh",
    "memcpy_dtov",
    "dtoh_sync_copy",
    "dtoh_sync_copy_into",
    "sync_reclaim",
];

/// candle's `Tensor` methods that copy a tensor's values to the host and return them (candle-core
/// 0.11: each goes through the storage's `to_cpu_storage`, a `clone_dtoh` on candle's stream):
/// the `candle-host-read` rule, the marks of `let` bindings and the
/// `candle-branch-on-device-data` rule all use this list. `to_vec0` is an alias of `to_scalar`.
pub const CANDLE_READS: &[&str] = &[
    "to_scalar",
    "to_vec0",
    "to_vec1",
    "to_vec2",
    "to_vec3",
    "to_cpu_storage",
];

/// candle methods that copy to the host when given the CPU device
/// ([`Matcher::ToCpu`](super::rules::Matcher::ToCpu)): `Tensor::to_device`, and
/// `QTensor::dequantize` / `dequantize_f16`, which end in `to_device`.
pub const CANDLE_TO_CPU: &[&str] = &["to_device", "dequantize", "dequantize_f16"];

/// candle `Tensor` methods whose result is host data (shapes, types, ids), not a tensor:
/// formatting it reads nothing from the device.
pub const TENSOR_HOST_METHODS: &[&str] = &[
    "dims",
    "dims0",
    "dims1",
    "dims2",
    "dims3",
    "dims4",
    "dims5",
    "shape",
    "dim",
    "rank",
    "elem_count",
    "dtype",
    "device",
    "layout",
    "stride",
    "id",
    "is_contiguous",
    "is_variable",
    "len",
    "is_empty",
];

/// Macros whose arguments are formatted.
pub const FORMATTING_MACROS: &[&str] = &[
    "println",
    "print",
    "eprintln",
    "eprint",
    "format",
    "format_args",
    "write",
    "writeln",
    "panic",
    "dbg",
    "assert",
    "assert_eq",
    "assert_ne",
    "debug_assert",
    "debug_assert_eq",
    "debug_assert_ne",
    "unreachable",
    "todo",
    "unimplemented",
    "info",
    "debug",
    "warn",
    "error",
    "trace",
    "event",
    "log",
];
