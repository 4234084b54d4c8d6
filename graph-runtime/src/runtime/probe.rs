//! Library probes: whether the CUDA driver, NVRTC, cuBLAS or NCCL can be loaded here, asked
//! before cudarc touches them (cudarc panics on first use of a missing library). Imports
//! nothing of the crate.

use std::sync::OnceLock;

/// Whether a CUDA driver library is on this machine. cudarc panics on first use without
/// one, so the runtime asks this before touching the driver.
pub fn driver_available() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    *PRESENT.get_or_init(|| library_available("cuda"))
}

pub(crate) fn nvrtc_available() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    *PRESENT.get_or_init(|| library_available("nvrtc"))
}

pub(crate) fn cublas_available() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    *PRESENT.get_or_init(|| library_available("cublas"))
}

/// Whether the CUDA library `name` (`"cuda"`, `"nvrtc"`, `"cublas"`, `"nccl"`) can be
/// loaded on this machine: a `dlopen` probe of its usual file names, without touching CUDA.
///
/// It answers the same whichever way cudarc was built to reach the libraries: loaded at run
/// time (`dynamic-loading`, this crate's default), or linked (`dynamic-linking`, what
/// candle-core's `cuda` feature picks; the probe then finds the library already loaded).
pub fn library_available(name: &str) -> bool {
    let names: &[&str] = match name {
        "cuda" => &["libcuda.so.1", "libcuda.so", "nvcuda.dll"],
        "nvrtc" => &[
            "libnvrtc.so.13",
            "libnvrtc.so.12",
            "libnvrtc.so",
            "nvrtc64_130_0.dll",
            "nvrtc64_120_0.dll",
        ],
        "cublas" => &[
            "libcublas.so.13",
            "libcublas.so.12",
            "libcublas.so",
            "cublas64_13.dll",
            "cublas64_12.dll",
        ],
        "nccl" => &["libnccl.so.2", "libnccl.so"],
        _ => &[],
    };
    names.iter().any(|n| {
        // SAFETY: loading a CUDA library runs its initialisers, which have no preconditions;
        // the handle is dropped (the library stays loaded if something else holds it).
        unsafe { libloading::Library::new(*n) }.is_ok()
    })
}
