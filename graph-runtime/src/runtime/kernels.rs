//! A runtime's kernel cache: the modules it has loaded (CUDA C++ through NVRTC, or PTX) with
//! the functions looked up so far, and the process-wide cache of NVRTC output.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaFunction, CudaModule};
use cudarc::nvrtc::{CompileOptions, Ptx};

use super::probe::nvrtc_available;
use crate::error::GraphError;

/// Where a module comes from: CUDA C++ for NVRTC, or PTX text.
#[derive(Clone, Copy)]
pub(super) enum ModuleSource<'a> {
    Cuda(&'a str),
    Ptx(&'a str),
}

impl ModuleSource<'_> {
    pub(super) fn text(&self) -> &str {
        match self {
            ModuleSource::Cuda(t) | ModuleSource::Ptx(t) => t,
        }
    }

    pub(super) fn is_ptx(&self) -> bool {
        matches!(self, ModuleSource::Ptx(_))
    }
}

/// The modules one runtime has loaded, each with the functions looked up so far.
#[derive(Default)]
pub(super) struct KernelCache {
    /// The address and length of a source text last seen for a module: the fast path for
    /// sources passed again from the same place (a `const`); confirmed by comparing text.
    pub(super) by_address: HashMap<(usize, usize), usize>,
    pub(super) modules: Vec<CachedModule>,
}

pub(super) struct CachedModule {
    pub(super) source: String,
    pub(super) ptx: bool,
    pub(super) options: Vec<String>,
    pub(super) module: Arc<CudaModule>,
    pub(super) functions: HashMap<String, CudaFunction>,
}

impl CachedModule {
    pub(super) fn matches(&self, source: ModuleSource<'_>, options: &[&str]) -> bool {
        self.ptx == source.is_ptx()
            && self.source == source.text()
            && self
                .options
                .iter()
                .map(String::as_str)
                .eq(options.iter().copied())
    }
}

impl KernelCache {
    pub(super) fn find(&mut self, source: ModuleSource<'_>, options: &[&str]) -> Option<usize> {
        let text = source.text();
        let key = (text.as_ptr() as usize, text.len());
        if let Some(&i) = self.by_address.get(&key) {
            if self.modules[i].matches(source, options) {
                return Some(i);
            }
        }
        let i = self
            .modules
            .iter()
            .position(|m| m.matches(source, options))?;
        self.by_address.insert(key, i);
        Some(i)
    }

    pub(super) fn insert(
        &mut self,
        source: ModuleSource<'_>,
        options: &[&str],
        module: Arc<CudaModule>,
    ) -> usize {
        let text = source.text();
        self.modules.push(CachedModule {
            source: text.to_owned(),
            ptx: source.is_ptx(),
            options: options.iter().map(|o| (*o).to_owned()).collect(),
            module,
            functions: HashMap::new(),
        });
        let i = self.modules.len() - 1;
        self.by_address
            .insert((text.as_ptr() as usize, text.len()), i);
        i
    }
}

/// NVRTC output shared by every runtime of the process, keyed by source text and target.
pub(super) fn compile_cached(
    source: &str,
    options: &[&str],
    cc: (i32, i32),
) -> Result<Ptx, GraphError> {
    type PtxCache = Mutex<HashMap<(String, Vec<String>, (i32, i32)), Ptx>>;
    static CACHE: OnceLock<PtxCache> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let options: Vec<String> = options.iter().map(|o| (*o).to_owned()).collect();
    let key = (source.to_owned(), options.clone(), cc);
    if let Some(ptx) = cache.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
        return Ok(ptx.clone());
    }
    if !nvrtc_available() {
        return Err(GraphError::MissingLibrary { library: "nvrtc" });
    }
    let name = kernel_label(source);
    let started = std::time::Instant::now();
    let mut flags = vec![format!("--gpu-architecture=sm_{}{}", cc.0, cc.1)];
    flags.extend(options);
    let opts = CompileOptions {
        options: flags,
        ..Default::default()
    };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(source, opts).map_err(|e| match e {
        cudarc::nvrtc::CompileError::CompileError { log, .. } => GraphError::Compile {
            name: name.clone(),
            log: log.to_string_lossy().into_owned(),
        },
        other => GraphError::Compile {
            name: name.clone(),
            log: format!("{other:?}"),
        },
    })?;
    tracing::debug!(kernel = %name, ms = started.elapsed().as_secs_f64() * 1e3, "compiled with NVRTC");
    cache
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(key, ptx.clone());
    Ok(ptx)
}

/// A readable name for a kernel source: its first `__global__` function.
pub(super) fn kernel_label(source: &str) -> String {
    source
        .split("__global__")
        .nth(1)
        .and_then(|rest| rest.split('(').next())
        .and_then(|decl| decl.split_whitespace().last())
        .map(str::to_owned)
        .unwrap_or_else(|| "<unnamed source>".to_owned())
}
