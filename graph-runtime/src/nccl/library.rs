//! Finding libnccl, and its version.
//!
//! cudarc loads NCCL at run time, like its other libraries: the first NCCL call `dlopen`s the
//! first of the names cudarc tries for NCCL that the dynamic loader finds (`libnccl.so`, then
//! `libnccl.so.13`, `.12`, … for a CUDA 13 build; see [`loader_names`]) and **panics** when none
//! is found. The loader searches `LD_LIBRARY_PATH` as it was when the process started, the
//! `ldconfig` cache and the system directories. NCCL's runtime package (`libnccl2`) and
//! PyTorch's wheel (`site-packages/nvidia/nccl/lib/`) install only `libnccl.so.2`, which is
//! not among those names; only the development package adds the `libnccl.so` link.
//!
//! So the runtime asks [`nccl_available`] (a `dlopen` probe that cannot panic) before any
//! NCCL call, and when it fails returns [`CollectiveError::LibraryMissing`] with the names
//! tried, the copies of `libnccl.so.2` it can see on this machine ([`find_nccl_copies`]) and
//! the fix: a directory with a `libnccl.so` link to one of them, put on `LD_LIBRARY_PATH`
//! before the program starts (`scripts/with-nccl.sh` does it).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::error::CollectiveError;
use crate::error::GraphError;

/// The oldest NCCL the runtime supports: 2.14 has everything it calls
/// (`ncclCommFinalize`, `ncclGetLastError`) and captures collectives into graphs.
pub const MIN_NCCL: NcclVersion = NcclVersion {
    major: 2,
    minor: 14,
    patch: 0,
};

/// An NCCL version, as `ncclGetVersion` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NcclVersion {
    /// Major version (2).
    pub major: u32,
    /// Minor version (28 for 2.28.3).
    pub minor: u32,
    /// Patch level.
    pub patch: u32,
}

impl NcclVersion {
    /// Decodes `NCCL_VERSION_CODE`: `major·10000 + minor·100 + patch` since 2.9, and
    /// `major·1000 + minor·100 + patch` before.
    pub fn from_code(code: i32) -> Self {
        let code = code.max(0) as u32;
        if code >= 10_000 {
            NcclVersion {
                major: code / 10_000,
                minor: code % 10_000 / 100,
                patch: code % 100,
            }
        } else {
            NcclVersion {
                major: code / 1_000,
                minor: code % 1_000 / 100,
                patch: code % 100,
            }
        }
    }
}

impl std::fmt::Display for NcclVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// Whether cudarc can load libnccl on this machine (see the module docs). Probes once per
/// process.
pub fn nccl_available() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    *PRESENT.get_or_init(|| crate::runtime::library_available("nccl"))
}

/// The name cudarc's loader tries first for NCCL, the one a directory on `LD_LIBRARY_PATH`
/// must provide: `libnccl.so` (cudarc then tries names with its CUDA version, never
/// `libnccl.so.2`). Written here rather than asked of cudarc, whose list exists only with its
/// `dynamic-loading` feature, which candle-core's `cuda` turns off (NCCL is then linked at
/// build time, and this name is what the linker looks for).
pub(crate) fn loader_names() -> Vec<String> {
    vec!["libnccl.so".to_owned()]
}

/// The library's version, or the typed error that says how to make it loadable.
pub(crate) fn load() -> Result<NcclVersion, GraphError> {
    if !crate::runtime::driver_available() {
        return Err(GraphError::NoDriver);
    }
    if !nccl_available() {
        return Err(CollectiveError::LibraryMissing {
            searched: loader_names(),
            found: find_nccl_copies(&search_dirs()),
        }
        .into());
    }
    let code =
        super::raw::version().map_err(|e| super::raw::error("ncclGetVersion", 0, e, None))?;
    let version = NcclVersion::from_code(code);
    if version < MIN_NCCL {
        return Err(CollectiveError::LibraryTooOld {
            found: version.to_string(),
            required: "2.14.0",
        }
        .into());
    }
    Ok(version)
}

/// Where NCCL usually is: `LD_LIBRARY_PATH`, the system library directories, CUDA's, and
/// `nvidia/nccl/lib` of the Python installations' package directories (PyTorch's wheel).
pub(crate) fn search_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("LD_LIBRARY_PATH")
        .map(|v| std::env::split_paths(&v).collect())
        .unwrap_or_default();
    for d in [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/lib64",
        "/usr/lib",
        "/usr/local/lib",
        "/usr/local/cuda/lib64",
        "/usr/local/nccl/lib",
    ] {
        dirs.push(PathBuf::from(d));
    }
    let mut prefixes: Vec<PathBuf> = vec!["/usr/lib".into(), "/usr/local/lib".into()];
    for var in ["VIRTUAL_ENV", "CONDA_PREFIX"] {
        if let Some(p) = std::env::var_os(var) {
            prefixes.push(Path::new(&p).join("lib"));
        }
    }
    if let Some(home) = std::env::var_os("HOME") {
        prefixes.push(Path::new(&home).join(".local/lib"));
    }
    for prefix in prefixes {
        let Ok(entries) = std::fs::read_dir(&prefix) else {
            continue;
        };
        for entry in entries.flatten() {
            if entry.file_name().to_string_lossy().starts_with("python3") {
                for packages in ["site-packages", "dist-packages"] {
                    dirs.push(entry.path().join(packages).join("nvidia/nccl/lib"));
                }
            }
        }
    }
    dirs
}

/// Every `libnccl.so.2` in `dirs` (in that order, without repeats).
pub(crate) fn find_nccl_copies(dirs: &[PathBuf]) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = Vec::new();
    for dir in dirs {
        let candidate = dir.join("libnccl.so.2");
        if candidate.exists() && !found.contains(&candidate) {
            found.push(candidate);
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_codes_decode_both_encodings() {
        let v = NcclVersion::from_code(22803);
        assert_eq!((v.major, v.minor, v.patch), (2, 28, 3));
        assert_eq!(v.to_string(), "2.28.3");
        let old = NcclVersion::from_code(2804);
        assert_eq!(old.to_string(), "2.8.4");
        assert!(old < MIN_NCCL && v > MIN_NCCL);
    }

    #[test]
    fn copies_under_the_runtime_name_are_found() {
        let dir = std::env::temp_dir().join(format!("nccl-search-{}", std::process::id()));
        let lib = dir.join("nvidia/nccl/lib");
        std::fs::create_dir_all(&lib).unwrap();
        std::fs::write(lib.join("libnccl.so.2"), b"not really").unwrap();
        let dirs = vec![dir.clone(), lib.clone(), lib.clone()];
        assert_eq!(find_nccl_copies(&dirs), vec![lib.join("libnccl.so.2")]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_missing_library_is_a_typed_error() {
        if nccl_available() || !crate::runtime::driver_available() {
            eprintln!("skipped: NCCL is present (or there is no driver to get that far)");
            return;
        }
        let err = load().unwrap_err();
        assert!(matches!(
            err.collective(),
            Some(CollectiveError::LibraryMissing { .. })
        ));
    }

    #[test]
    fn the_search_covers_the_system_and_python_packages() {
        let dirs = search_dirs();
        assert!(dirs.contains(&PathBuf::from("/usr/lib/x86_64-linux-gnu")));
        let names = loader_names();
        assert!(names.iter().any(|n| n == "libnccl.so"));
        assert!(
            !names.iter().any(|n| n == "libnccl.so.2"),
            "cudarc now tries libnccl.so.2: the LD_LIBRARY_PATH link is no longer needed"
        );
    }
}
