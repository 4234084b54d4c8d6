//! The name lists that several rules and the walker share: device-to-host reads, formatting
//! macros, and everything the checker knows of candle, in one table ([`CANDLE`]: a second
//! framework would be a second [`Framework`] in [`FRAMEWORKS`], which the walker reads; only
//! candle's own rules name [`CANDLE`]). The rule table (`rules.rs`) re-exports them.
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

/// What the checker knows of a foreign framework whose types reach the device: its names,
/// in one place.
pub struct Framework {
    /// Its crates, under their names and the usual aliases.
    pub crates: &'static [&'static str],
    /// Its types whose methods reach the device. Treated like cudarc's, so that a parameter
    /// or local of one is not taken for a type of the user's own.
    pub types: &'static [&'static str],
    /// Its tensor types, whose `Debug` and `Display` copy the values to the host.
    pub tensor_types: &'static [&'static str],
    /// Tensor methods that copy a tensor's values to the host and return them.
    pub host_reads: &'static [&'static str],
    /// Methods that copy to the host when given the CPU device
    /// ([`Matcher::ToCpu`](super::rules::Matcher::ToCpu)).
    pub to_cpu: &'static [&'static str],
    /// Tensor methods whose result is host data (shapes, types, ids), not a tensor:
    /// formatting it reads nothing from the device.
    pub host_methods: &'static [&'static str],
    /// The CPU device, as the last two segments of its path (`Device::Cpu`).
    pub cpu_device: [&'static str; 2],
}

/// candle (candle-core 0.11).
pub const CANDLE: Framework = Framework {
    crates: &["candle_core", "candle", "candle_nn", "candle_transformers"],
    // A tensor's host reads (`to_vec1`, `to_device(&Device::Cpu)`), a device's `synchronize`.
    types: &[
        "Tensor",
        "Var",
        "QTensor",
        "Device",
        "CudaDevice",
        "CudaStorage",
    ],
    tensor_types: &["Tensor", "Var", "QTensor"],
    // Each goes through the storage's `to_cpu_storage`, a `clone_dtoh` on candle's stream:
    // the `candle-host-read` rule, the marks of `let` bindings and the
    // `candle-branch-on-device-data` rule all use this list. `to_vec0` is an alias of
    // `to_scalar`.
    host_reads: &[
        "to_scalar",
        "to_vec0",
        "to_vec1",
        "to_vec2",
        "to_vec3",
        "to_cpu_storage",
    ],
    // `Tensor::to_device`, and `QTensor::dequantize` / `dequantize_f16`, which end in
    // `to_device`.
    to_cpu: &["to_device", "dequantize", "dequantize_f16"],
    host_methods: &[
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
    ],
    cpu_device: ["Device", "Cpu"],
};

/// Every framework the checker knows: what the walker asks of "a framework's" types, tensors
/// and methods.
pub const FRAMEWORKS: &[Framework] = &[CANDLE];

/// Whether any framework says yes.
pub fn any_framework(says: impl Fn(&Framework) -> bool) -> bool {
    FRAMEWORKS.iter().any(says)
}

/// candle's host reads ([`Framework::host_reads`]), by the name the rule table uses.
pub const CANDLE_READS: &[&str] = CANDLE.host_reads;

/// candle's copies to the CPU device ([`Framework::to_cpu`]), by the name the rule table uses.
pub const CANDLE_TO_CPU: &[&str] = CANDLE.to_cpu;

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
