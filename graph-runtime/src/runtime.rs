//! [`Runtime`]: the CUDA context, the capture stream, cuBLAS and the kernel cache.

use std::collections::HashMap;
use std::panic::Location;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream};
use cudarc::nvrtc::{CompileOptions, Ptx};

use crate::capture;
use crate::error::GraphError;
use crate::rng::{Generator, GeneratorInner, DEFAULT_SEED};

/// Bytes of cuBLAS workspace the runtime sets up front. cuBLAS otherwise allocates its
/// workspace lazily, which is not allowed while a stream is capturing; NVIDIA recommends
/// 32 MiB on Hopper.
pub const CUBLAS_WORKSPACE_BYTES: usize = 32 << 20;

/// One device, one capture stream, one cuBLAS handle and a kernel cache: what every graph
/// of a program shares.
///
/// Everything a graph records runs on [`Runtime::stream`], a non-blocking stream the runtime
/// owns: warmup runs there, capture records there, replays launch there. The legacy default
/// stream is never used, so CUDA error 906 cannot come from the runtime itself.
///
/// # cudarc's event tracking
/// The runtime creates its context with cudarc's per-buffer event tracking **off**. With
/// tracking on and more than one stream, every use of a `CudaSlice` waits on events recorded
/// before capture began, which fails capture with error 905. With tracking off, buffers
/// carry no events, and work is ordered by the stream it is issued on: issue the work that
/// produces a graph's inputs on [`Runtime::stream`] (or make that stream wait for yours,
/// `rt.stream().join(&yours)`), and replays copy inputs in order.
///
/// # Threads
/// `Runtime` is `Send + Sync`. Captures on one runtime are serialised; a replay attempted
/// from another thread while a capture records is refused with
/// [`GraphError::StreamCapturing`] instead of being recorded into the wrong graph.
pub struct Runtime {
    // Field order is drop order: the cuBLAS handle goes before its workspace, both before
    // the stream, the stream before the context.
    blas: CudaBlas,
    _blas_workspace: CudaSlice<u8>,
    kernels: Mutex<HashMap<SourceKey, LoadedModule>>,
    capture_lock: Mutex<()>,
    gate: Arc<StreamGate>,
    rng: Generator,
    generators: Mutex<Vec<Weak<GeneratorInner>>>,
    stream: Arc<CudaStream>,
    ctx: Arc<CudaContext>,
    compute_capability: (i32, i32),
    multiprocessors: u32,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("ordinal", &self.ctx.ordinal())
            .field("compute_capability", &self.compute_capability)
            .finish_non_exhaustive()
    }
}

struct LoadedModule {
    module: Arc<CudaModule>,
    functions: HashMap<String, CudaFunction>,
}

/// Identity of a `&'static str` kernel source: its address and length. Two different
/// static sources never share both, so this is a safe and cheap cache key.
type SourceKey = (usize, usize);

/// Whether a CUDA driver library is on this machine. cudarc panics on first use without
/// one, so the runtime asks this before touching the driver.
pub fn driver_available() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: `is_culib_present` only tries to dlopen the library names and drops the
    // handles; it has no preconditions.
    *PRESENT.get_or_init(|| unsafe { cudarc::driver::sys::is_culib_present() })
}

fn nvrtc_available() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: as in `driver_available`, a dlopen probe without preconditions.
    *PRESENT.get_or_init(|| unsafe { cudarc::nvrtc::sys::is_culib_present() })
}

fn cublas_available() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: as in `driver_available`, a dlopen probe without preconditions.
    *PRESENT.get_or_init(|| unsafe { cudarc::cublas::sys::is_culib_present() })
}

impl Runtime {
    /// Opens device `ordinal`: retains its primary context (event tracking off), creates the
    /// capture stream, a cuBLAS handle bound to it with its workspace set, and an empty
    /// kernel cache.
    ///
    /// Without a CUDA driver this returns [`GraphError::NoDriver`] instead of panicking.
    pub fn new(ordinal: usize) -> Result<Self, GraphError> {
        if !driver_available() {
            return Err(GraphError::NoDriver);
        }
        let count = match CudaContext::device_count() {
            Ok(n) => n.max(0) as usize,
            Err(e) if e.0 == cudarc::driver::sys::CUresult::CUDA_ERROR_NO_DEVICE => 0,
            Err(e) => return Err(e.into()),
        };
        if ordinal >= count {
            return Err(GraphError::NoDevice { ordinal, count });
        }
        if !cublas_available() {
            return Err(GraphError::MissingLibrary { library: "cublas" });
        }
        let ctx = CudaContext::new(ordinal)?;
        // SAFETY: the context was created just now and nothing has been allocated from it
        // through this handle; the runtime issues all of its own work on one stream, and the
        // type's docs tell users to order any other stream themselves, which is the
        // condition `disable_event_tracking` places on its caller.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream()?;
        let blas = CudaBlas::new(stream.clone())?;
        let workspace = stream.alloc_zeros::<u8>(CUBLAS_WORKSPACE_BYTES)?;
        {
            use cudarc::driver::DevicePtr;
            let (ptr, _sync) = workspace.device_ptr(&stream);
            // SAFETY: `blas.handle()` is a live handle; `ptr` points to CUBLAS_WORKSPACE_BYTES
            // bytes that outlive the handle (the field order of `Runtime` drops the handle
            // first) and are only used by this handle's stream.
            unsafe {
                cudarc::cublas::sys::cublasSetWorkspace_v2(
                    *blas.handle(),
                    ptr as *mut std::ffi::c_void,
                    CUBLAS_WORKSPACE_BYTES,
                )
            }
            .result()?;
        }
        let compute_capability = ctx.compute_capability()?;
        let multiprocessors = ctx.attribute(
            cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
        )? as u32;
        stream.synchronize()?;
        tracing::debug!(
            ordinal,
            device = %ctx.name().unwrap_or_default(),
            ?compute_capability,
            "cuda-graph runtime ready"
        );
        let rng = Generator::create(&stream, DEFAULT_SEED)?;
        Ok(Runtime {
            blas,
            _blas_workspace: workspace,
            kernels: Mutex::new(HashMap::new()),
            capture_lock: Mutex::new(()),
            gate: Arc::new(StreamGate::default()),
            generators: Mutex::new(vec![rng.downgrade()]),
            rng,
            stream,
            ctx,
            compute_capability,
            multiprocessors,
        })
    }

    /// The CUDA context (device) of this runtime.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The stream every warmup, capture and replay runs on. Launch the body's kernels here.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The cuBLAS handle, bound to [`Runtime::stream`], with its workspace set so that GEMMs
    /// can be captured.
    pub fn blas(&self) -> &CudaBlas {
        &self.blas
    }

    /// An [early launch](crate::launch) of `func` on [`Runtime::stream`]: the kernel may start
    /// while the kernel before it finishes, and a capture records that as a programmatic
    /// graph edge. The kernel must wait with `griddepcontrol.wait` before reading what
    /// earlier kernels wrote; see [`crate::launch`].
    pub fn launch_early<'a>(&'a self, func: &'a CudaFunction) -> crate::EarlyLaunch<'a> {
        crate::EarlyLaunch::new(&self.stream, func)
    }

    /// The device's compute capability, e.g. `(9, 0)` on an H100.
    pub fn compute_capability(&self) -> (i32, i32) {
        self.compute_capability
    }

    /// Returns kernel `name` from the CUDA C++ `source`, compiling it with NVRTC for this
    /// device the first time the process sees that source and loading it into this context
    /// the first time this runtime asks. Later calls are a hash-map lookup.
    ///
    /// Call it freely inside a `#[cuda_graph]` body: the warmup runs compile and load the
    /// module, so the capture only looks it up.
    pub fn function(&self, source: &'static str, name: &str) -> Result<CudaFunction, GraphError> {
        let key = (source.as_ptr() as usize, source.len());
        let mut kernels = self.kernels.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(f) = kernels.get(&key).and_then(|m| m.functions.get(name)) {
            return Ok(f.clone());
        }
        let entry = match kernels.entry(key) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => {
                let ptx = compile_cached(source, self.compute_capability)?;
                v.insert(LoadedModule {
                    module: self.ctx.load_module(ptx)?,
                    functions: HashMap::new(),
                })
            }
        };
        let f = entry
            .module
            .load_function(name)
            .map_err(|_| GraphError::MissingKernel {
                name: name.to_owned(),
            })?;
        entry.functions.insert(name.to_owned(), f.clone());
        Ok(f)
    }

    /// Streaming multiprocessors on the device.
    pub fn multiprocessors(&self) -> u32 {
        self.multiprocessors
    }

    /// The runtime's default random generator (seed [`DEFAULT_SEED`](crate::rng::DEFAULT_SEED)).
    /// Every graph may draw from it with no registration; see [`crate::rng`].
    pub fn rng(&self) -> &Generator {
        &self.rng
    }

    /// A new random generator starting at `seed`, offset 0. The runtime remembers it so that
    /// warmup runs before a capture can be undone for it too (see [`crate::rng`]).
    ///
    /// Inside a captured body this is refused with [`GraphError::GeneratorInCapture`].
    #[track_caller]
    pub fn generator(&self, seed: u64) -> Result<Generator, GraphError> {
        if let crate::capture::Phase::Capture { graph } = crate::capture::phase() {
            return Err(GraphError::GeneratorInCapture {
                graph,
                location: Location::caller(),
            });
        }
        let g = Generator::create(&self.stream, seed)?;
        let mut all = self.generators.lock().unwrap_or_else(|p| p.into_inner());
        all.retain(|w| w.strong_count() > 0);
        all.push(g.downgrade());
        Ok(g)
    }

    /// Every generator created from this runtime that is still alive.
    pub(crate) fn live_generators(&self) -> Vec<Generator> {
        let all = self.generators.lock().unwrap_or_else(|p| p.into_inner());
        all.iter()
            .filter_map(Weak::upgrade)
            .map(Generator::from_inner)
            .collect()
    }

    /// Waits until all work queued on [`Runtime::stream`] has finished.
    ///
    /// Inside a captured body this is refused with [`GraphError::SyncInCapture`], naming the
    /// caller's line, before CUDA sees it, so the capture is not invalidated.
    #[track_caller]
    pub fn synchronize(&self) -> Result<(), GraphError> {
        capture::refuse_in_capture("Runtime::synchronize", Location::caller())?;
        self.stream.synchronize()?;
        Ok(())
    }

    /// The runtime's graph memory pool: where the temporaries of every graph live. All graphs
    /// of a runtime launch on its one stream, one after another, so CUDA can back their
    /// temporaries with the same physical memory: the pool holds what the largest graph
    /// needs, not the sum. The figures are the device's, across runtimes.
    pub fn graph_memory(&self) -> Result<GraphMemory, GraphError> {
        use cudarc::driver::sys::CUgraphMem_attribute as A;
        let read = |attr: A| -> Result<usize, GraphError> {
            let mut v: u64 = 0;
            self.ctx.bind_to_thread()?;
            // SAFETY: the device is valid for this context and `v` is the 64-bit value the
            // attribute query writes.
            unsafe {
                cudarc::driver::sys::cuDeviceGetGraphMemAttribute(
                    self.ctx.cu_device(),
                    attr,
                    (&mut v as *mut u64).cast(),
                )
            }
            .result()?;
            Ok(v as usize)
        };
        Ok(GraphMemory {
            used: read(A::CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT)?,
            used_high: read(A::CU_GRAPH_MEM_ATTR_USED_MEM_HIGH)?,
            reserved: read(A::CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT)?,
            reserved_high: read(A::CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH)?,
        })
    }

    /// Resets the high-water marks of [`Runtime::graph_memory`] to the current values.
    pub fn reset_graph_memory_high(&self) -> Result<(), GraphError> {
        use cudarc::driver::sys::CUgraphMem_attribute as A;
        self.ctx.bind_to_thread()?;
        for attr in [
            A::CU_GRAPH_MEM_ATTR_USED_MEM_HIGH,
            A::CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH,
        ] {
            let mut zero: u64 = 0;
            // SAFETY: resetting a high-water mark takes a pointer to a 64-bit zero.
            unsafe {
                cudarc::driver::sys::cuDeviceSetGraphMemAttribute(
                    self.ctx.cu_device(),
                    attr,
                    (&mut zero as *mut u64).cast(),
                )
            }
            .result()?;
        }
        Ok(())
    }

    /// Gives physical graph memory that no live graph uses back to the device. Dropping a
    /// graph with temporaries does this already.
    pub fn trim_graph_memory(&self) -> Result<(), GraphError> {
        self.ctx.bind_to_thread()?;
        // SAFETY: trims the pool of this context's device; no other precondition.
        unsafe { cudarc::driver::sys::cuDeviceGraphMemTrim(self.ctx.cu_device()) }.result()?;
        Ok(())
    }

    /// Free and total device memory in bytes, as the driver reports them.
    pub fn mem_info(&self) -> Result<(usize, usize), GraphError> {
        Ok(self.ctx.mem_get_info()?)
    }

    pub(crate) fn gate(&self) -> &Arc<StreamGate> {
        &self.gate
    }

    pub(crate) fn capture_lock(&self) -> std::sync::MutexGuard<'_, ()> {
        self.capture_lock.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// NVRTC output shared by every runtime of the process, keyed by source text and target.
fn compile_cached(source: &str, cc: (i32, i32)) -> Result<Ptx, GraphError> {
    type PtxCache = Mutex<HashMap<(String, (i32, i32)), Ptx>>;
    static CACHE: OnceLock<PtxCache> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let key = (source.to_owned(), cc);
    if let Some(ptx) = cache.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
        return Ok(ptx.clone());
    }
    if !nvrtc_available() {
        return Err(GraphError::MissingLibrary { library: "nvrtc" });
    }
    let name = kernel_label(source);
    let started = std::time::Instant::now();
    let opts = CompileOptions {
        options: vec![format!("--gpu-architecture=sm_{}{}", cc.0, cc.1)],
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
fn kernel_label(source: &str) -> String {
    source
        .split("__global__")
        .nth(1)
        .and_then(|rest| rest.split('(').next())
        .and_then(|decl| decl.split_whitespace().last())
        .map(str::to_owned)
        .unwrap_or_else(|| "<unnamed source>".to_owned())
}

/// The device's graph memory pool, in bytes (see [`Runtime::graph_memory`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GraphMemory {
    /// Memory currently mapped for live graphs' temporaries.
    pub used: usize,
    /// The most `used` has been since the last reset.
    pub used_high: usize,
    /// Memory the pool holds, in use or cached for the next graph.
    pub reserved: usize,
    /// The most `reserved` has been.
    pub reserved_high: usize,
}

/// Keeps replays out of a stream while it is capturing.
///
/// Bit 63 is set while a capture records; the low bits count launches in flight. A replay
/// adds one, checks the bit, launches, and subtracts one: two uncontended atomic operations.
/// A capture sets the bit only when no launch is in flight.
#[derive(Default)]
pub(crate) struct StreamGate {
    state: AtomicU64,
}

const CAPTURING: u64 = 1 << 63;

impl StreamGate {
    /// Runs `launch` unless the stream is capturing.
    #[inline]
    pub(crate) fn launch<R>(
        &self,
        graph: &'static str,
        launch: impl FnOnce() -> Result<R, GraphError>,
    ) -> Result<R, GraphError> {
        let prev = self.state.fetch_add(1, Ordering::Acquire);
        let result = if prev & CAPTURING != 0 {
            Err(GraphError::StreamCapturing { graph })
        } else {
            launch()
        };
        self.state.fetch_sub(1, Ordering::Release);
        result
    }

    /// Marks the stream as capturing once no launch is in flight.
    pub(crate) fn begin_capture(&self) {
        while self
            .state
            .compare_exchange_weak(0, CAPTURING, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            std::hint::spin_loop();
        }
    }

    pub(crate) fn end_capture(&self) {
        self.state.fetch_and(!CAPTURING, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_label_finds_the_first_kernel() {
        let src = r#"extern "C" __global__ void add_one(float *x, int n) { }"#;
        assert_eq!(kernel_label(src), "add_one");
        assert_eq!(kernel_label("int x;"), "<unnamed source>");
    }

    #[test]
    fn gate_refuses_launches_while_capturing() {
        let gate = StreamGate::default();
        assert!(gate.launch("g", || Ok(())).is_ok());
        gate.begin_capture();
        let err = gate.launch("g", || Ok(())).unwrap_err();
        assert!(matches!(err, GraphError::StreamCapturing { graph: "g" }));
        gate.end_capture();
        assert!(gate.launch("g", || Ok(())).is_ok());
        assert_eq!(gate.state.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn no_driver_is_a_typed_error() {
        if driver_available() {
            eprintln!("skipped: a CUDA driver is present, the no-driver path cannot be seen here");
            return;
        }
        let err = Runtime::new(0).unwrap_err();
        assert!(matches!(err, GraphError::NoDriver));
        assert!(err.to_string().contains("no CUDA driver"));
    }
}
