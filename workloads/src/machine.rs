//! Facts about the machine a benchmark ran on: the GPU, the NVIDIA driver, the CUDA
//! libraries, the host. The report prints them above its tables.

use std::process::Command;

use graph_runtime::cudarc;
use graph_runtime::Runtime;

/// A CUDA version number as the driver reports it (`13000`) in the usual form (`13.0`).
pub fn cuda_version_text(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

/// The NCCL settings a multi-GPU run sees (`NCCL_NVLS_ENABLE`, `NCCL_GRAPH_MIXING_SUPPORT`:
/// `unset` when not set), for the header of its tables.
pub fn nccl_env() -> String {
    let var = |k: &str| std::env::var(k).unwrap_or_else(|_| "unset".to_owned());
    format!(
        "NCCL_NVLS_ENABLE={}, NCCL_GRAPH_MIXING_SUPPORT={}",
        var("NCCL_NVLS_ENABLE"),
        var("NCCL_GRAPH_MIXING_SUPPORT")
    )
}

/// `(what, value)` pairs, in order: the GPU of `rt` and its memory, the driver, the CUDA
/// driver API, cuBLAS and NVRTC versions. A fact that cannot be read is left out.
pub fn gpu_facts(rt: &Runtime) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = Vec::new();
    let mut put = |k: &str, v: String| env.push((k.to_owned(), v));
    put(
        "GPU",
        rt.context()
            .name()
            .unwrap_or_else(|e| format!("unknown ({e})")),
    );
    let (major, minor) = rt.compute_capability();
    put("compute capability", format!("{major}.{minor}"));
    put(
        "streaming multiprocessors",
        rt.multiprocessors().to_string(),
    );
    if let Ok((_, total)) = rt.mem_info() {
        put(
            "GPU memory",
            format!("{:.1} GiB", total as f64 / (1u64 << 30) as f64),
        );
    }
    if let Some(v) = command_line(
        "nvidia-smi",
        &["--query-gpu=driver_version", "--format=csv,noheader"],
    ) {
        put("NVIDIA driver", v);
    }
    let mut driver = 0i32;
    // SAFETY: the runtime exists, so the driver library is loaded; the call writes one int.
    let r = unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut driver) };
    if r == cudarc::driver::sys::CUresult::CUDA_SUCCESS {
        put("CUDA driver API", cuda_version_text(driver));
    }
    let mut parts = [0i32; 3];
    let props = [
        cudarc::cublas::sys::libraryPropertyType_t::MAJOR_VERSION,
        cudarc::cublas::sys::libraryPropertyType_t::MINOR_VERSION,
        cudarc::cublas::sys::libraryPropertyType_t::PATCH_LEVEL,
    ];
    let mut cublas_ok = true;
    for (slot, prop) in parts.iter_mut().zip(props) {
        // SAFETY: the runtime created a cuBLAS handle, so the library is loaded; the call
        // writes one int.
        let status = unsafe { cudarc::cublas::sys::cublasGetProperty(prop, slot) };
        cublas_ok &= status == cudarc::cublas::sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS;
    }
    if cublas_ok {
        put("cuBLAS", format!("{}.{}.{}", parts[0], parts[1], parts[2]));
    }
    if graph_runtime::library_available("nvrtc") {
        let (mut major, mut minor) = (0i32, 0i32);
        // SAFETY: NVRTC is present (checked just above); the call writes two ints.
        let r = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
        if r == cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
            put("NVRTC", format!("{major}.{minor}"));
        }
    }
    env
}

/// `(what, value)` pairs of the host: its CPU model and operating system, where Linux tells.
pub fn host_facts() -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = Vec::new();
    let mut put = |k: &str, v: String| env.push((k.to_owned(), v));
    if let Ok(cpu) = std::fs::read_to_string("/proc/cpuinfo") {
        if let Some(model) = cpu
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split(':').nth(1))
        {
            put("host CPU", model.trim().to_owned());
        }
    }
    if let Ok(os) = std::fs::read_to_string("/etc/os-release") {
        if let Some(name) = os.lines().find_map(|l| l.strip_prefix("PRETTY_NAME=")) {
            put("host OS", name.trim_matches('"').to_owned());
        }
    }
    env
}

/// The first line a command prints, if it runs and succeeds.
fn command_line(program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program).args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .map(|l| l.trim().to_owned())
        .filter(|l| !l.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_versions() {
        assert_eq!(cuda_version_text(13000), "13.0");
        assert_eq!(cuda_version_text(12080), "12.8");
    }
}
