//! [`Runtime`]: the CUDA context, the capture stream, cuBLAS and the kernel cache.
//!
//! This file holds the runtime, its constructors and methods; `runtime/kernels.rs` holds the
//! kernel cache and NVRTC compilation, `runtime/gate.rs` the gate that keeps replays out of a
//! capturing stream, `runtime/probe.rs` the library probes.

use std::mem::ManuallyDrop;
use std::panic::Location;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

use cudarc::cublas::CudaBlas;
use cudarc::driver::{sys, CudaContext, CudaEvent, CudaFunction, CudaSlice, CudaStream};
use cudarc::nvrtc::Ptx;

use crate::driver;
use crate::error::GraphError;
use crate::framework::Framework;
use crate::generator::{Generator, GeneratorInner, DEFAULT_SEED};
use crate::phase::refuse_while_capturing;

mod context;
mod gate;
mod kernels;
mod probe;
#[cfg(test)]
mod tests;

pub use context::FromRuntime;
use gate::StreamGate;
use kernels::{compile_cached, KernelCache, ModuleSource};
use probe::cublas_available;
pub use probe::{driver_available, library_available};

/// Bytes of cuBLAS workspace the runtime sets up front. cuBLAS otherwise allocates its
/// workspace lazily, which is not allowed while a stream is capturing; NVIDIA recommends
/// 32 MiB on Hopper.
pub const CUBLAS_WORKSPACE_BYTES: usize = 32 << 20;

/// One device, one capture stream, one cuBLAS handle and a kernel cache: what every graph
/// of a program shares.
///
/// Everything a graph does runs on [`Runtime::stream`], a non-blocking stream the runtime
/// owns: warmup runs there and replays launch there; a capture records on the runtime's
/// capture stream, which `stream()` is on the capturing thread while it records (see
/// "Threads"). The legacy default stream is never used, so CUDA error 906 cannot come from
/// the runtime itself.
///
/// # cudarc's event tracking
/// The runtime creates its context with cudarc's per-buffer event tracking **off**. With
/// tracking on and more than one stream, every use of a `CudaSlice` waits on events recorded
/// before capture began, which fails capture with error 905. With tracking off, buffers
/// carry no events, and work is ordered by the stream it is issued on: issue the work that
/// produces a graph's inputs on [`Runtime::stream`] (or make that stream wait for yours,
/// `rt.stream().join(&yours)`), and replays copy inputs in order.
///
/// # A handle
/// `Runtime` is a cheap handle: `clone()` gives another handle to the same device, stream
/// and caches. Every graph keeps one, so a graph never outlives the context, the stream, the
/// kernels and the generators it was captured with: dropping your last handle while a graph
/// lives only drops a reference.
///
/// # Threads
/// `Runtime` is `Send + Sync`, and one runtime can be shared by threads that each capture,
/// replay and read at once. A runtime made by [`Runtime::new`] or [`Runtime::from_context`]
/// records its captures on a capture stream of its own: while a thread records, `stream()`
/// and `blas()` give that thread the capture stream and a cuBLAS handle bound to it, and
/// every other thread the runtime's stream, which never captures. So other threads' replays,
/// copies, reads and buffer drops run as usual while one thread captures, and none of them
/// is recorded into its graph. (PyTorch captures on a side stream for the same reason.) A
/// library handle of your own that was bound to the runtime's stream when you made it (a
/// cuBLAS handle, say) keeps launching there during a capture, so its work would run once
/// instead of being recorded: in a body, use `rt.blas()`, or pass `rt.stream()` to the
/// library at each call (as cuBLASLt's `cublasLtMatmul` takes it). cuBLAS lets one host
/// thread at a time use a handle, so [`Runtime::blas`] gives each thread a handle of its own
/// on the runtime's stream.
///
/// Captures on one device are serialised, across every runtime and thread of the process:
/// each capture procedure (warmup, capture, instantiate, upload) waits for the one before
/// it. Captures on different GPUs run in parallel. A replay inside a body (on the capturing
/// thread) is refused with [`GraphError::StreamCapturing`] instead of running once, eagerly.
///
/// A runtime made by [`Runtime::from_stream`] (or from candle) records its captures on the
/// stream it was given, which other code owns. There, a replay or a `stream()` from another
/// thread waits while a capture records, but a clone of the stream kept by another thread
/// (a buffer's drop, a copy on it) is recorded into the capture: share such a runtime only
/// between threads that do not use it while another one captures.
///
/// What no runtime can cover is eager work of other threads that synchronizes the whole
/// device (`CudaContext::synchronize`, a blocking allocation or free, a copy on the legacy
/// default stream) while a capture records: CUDA fails that capture (error 901,
/// [`GraphError::CaptureInvalidated`]); keep such calls out of threads that run while others
/// capture.
#[derive(Clone)]
pub struct Runtime {
    inner: Arc<Inner>,
}

struct Inner {
    // Field order is drop order: the cuBLAS handles go first (in `Drop`, under the device's
    // capture lock), then their workspaces, the streams, the context.
    blas: ManuallyDrop<CudaBlas>,
    /// The thread that made the runtime, which uses `blas` (see `gate::thread_token`).
    blas_owner: u64,
    /// The other threads' handles.
    thread_blas: ThreadBlas,
    _blas_workspace: CudaSlice<u8>,
    /// The runtime's own capture stream and its cuBLAS handle (`None`: captures record on
    /// `stream`, a stream the user or candle owns).
    capture: Option<CaptureStream>,
    kernels: Mutex<KernelCache>,
    /// The capture lock of this runtime's device, shared by every runtime of the process on
    /// that device (see [`device_capture_lock`]).
    capture_lock: Arc<Mutex<()>>,
    gate: StreamGate,
    rng: Generator,
    generators: Mutex<Vec<Weak<GeneratorInner>>>,
    stream: Arc<CudaStream>,
    ctx: Arc<CudaContext>,
    compute_capability: (i32, i32),
    multiprocessors: u32,
    /// Whether captures measure their executable graph's memory (`GraphInfo::exec_bytes`).
    measure_exec: AtomicBool,
    /// The framework whose device's stream this runtime uses (candle's:
    /// `Runtime::from_candle`).
    framework: Option<Arc<dyn Framework>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Destroying a cuBLAS handle frees device memory outside any stream's order, which
        // fails a capture another thread records on this device: under the capture lock.
        let _serial = (!crate::phase::in_procedure())
            .then(|| self.capture_lock.lock().unwrap_or_else(|p| p.into_inner()));
        self.ctx.record_err(self.ctx.bind_to_thread());
        drop(self.capture.take());
        drop(std::mem::take(
            &mut *self
                .thread_blas
                .handles
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
        ));
        // SAFETY: `blas` is dropped exactly once, here, and not used afterwards (`Inner` is
        // being dropped).
        unsafe { ManuallyDrop::drop(&mut self.blas) };
    }
}

/// The stream a runtime's captures record on, with a cuBLAS handle bound to it (see
/// [`Runtime`], "Threads").
struct CaptureStream {
    // Drop order: the handle, its workspace, the stream.
    blas: CudaBlas,
    _blas_workspace: CudaSlice<u8>,
    stream: Arc<CudaStream>,
}

/// A cuBLAS handle bound to `stream`, with a workspace of its own set so that GEMMs can be
/// captured.
fn blas_with_workspace(stream: &Arc<CudaStream>) -> Result<(CudaBlas, CudaSlice<u8>), GraphError> {
    use cudarc::driver::DevicePtr;
    let workspace = stream.alloc_zeros::<u8>(CUBLAS_WORKSPACE_BYTES)?;
    let blas = CudaBlas::new(stream.clone())?;
    {
        let (ptr, _sync) = workspace.device_ptr(stream);
        // SAFETY: `blas.handle()` is a live handle; `ptr` points to CUBLAS_WORKSPACE_BYTES
        // bytes that outlive the handle (`Inner`, `CaptureStream` and `ThreadBlas` drop the
        // handle before its workspace) and that no other handle uses.
        unsafe {
            cudarc::cublas::sys::cublasSetWorkspace_v2(
                *blas.handle(),
                ptr as *mut std::ffi::c_void,
                CUBLAS_WORKSPACE_BYTES,
            )
        }
        .result()?;
    }
    Ok((blas, workspace))
}

/// Drops, when its thread ends, the cuBLAS handles the thread got from runtimes still alive.
struct ThreadExit {
    runtimes: std::cell::RefCell<Vec<Weak<Inner>>>,
}

impl Drop for ThreadExit {
    fn drop(&mut self) {
        let me = gate::thread_token();
        for inner in self.runtimes.borrow().iter().filter_map(Weak::upgrade) {
            // Destroying a handle frees device memory: not while another thread captures.
            let _serial = inner.capture_lock.lock().unwrap_or_else(|p| p.into_inner());
            let mut handles = inner
                .thread_blas
                .handles
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            handles.retain(|(t, _, _)| *t != me);
        }
    }
}

thread_local! {
    static EXIT: ThreadExit = const {
        ThreadExit {
            runtimes: std::cell::RefCell::new(Vec::new()),
        }
    };
}

/// The cuBLAS handles of the threads other than the runtime's creator, each bound to the
/// runtime's stream with a workspace of its own: cuBLAS allows a handle to be used by one
/// host thread at a time, so threads sharing a runtime each get their own. A handle stays
/// until the runtime drops (boxed, so that the references `Runtime::blas` hands out stay
/// valid while the list changes); a thread's handle goes when the thread ends.
#[derive(Default)]
struct ThreadBlas {
    /// Each thread's handle and the workspace it alone uses (a handle's creation and
    /// `cublasSetWorkspace` touch the workspace outside the stream's order, so handles never
    /// share one: measured on the H200, a second handle made on the runtime's workspace
    /// corrupted the first GEMM of a thread running at the same time).
    handles: Mutex<Vec<ThreadHandle>>,
}

/// A thread's token, its cuBLAS handle (boxed: it does not move) and the handle's workspace.
type ThreadHandle = (u64, Box<CudaBlas>, CudaSlice<u8>);

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("ordinal", &self.inner.ctx.ordinal())
            .field("compute_capability", &self.inner.compute_capability)
            .finish_non_exhaustive()
    }
}

/// Every live runtime by its stream, so that a body whose context is the stream can reach
/// the runtime's kernel cache ([`Runtime::find_by_stream`]).
type Registry = Vec<(Weak<CudaStream>, Weak<Inner>)>;
static REGISTRY: Mutex<Registry> = Mutex::new(Vec::new());

/// One capture lock per device, shared by every runtime of the process on that device.
///
/// A capture procedure (warmup, capture, instantiate, upload) holds it, so captures on one
/// device run one after another whatever thread and runtime they come from. Two captures at
/// once on one device fail each other: in `Global` mode every call CUDA deems unsafe (a
/// blocking allocation, a context synchronize, a query) that another thread makes while a
/// capture records fails and invalidates that capture (CUDA error 901), and in every mode a
/// warmup's synchronizing work, or a legacy-stream call, on one thread creates a dependency
/// into another thread's capturing stream (cudarc's `new_stream` on a context with event
/// tracking synchronizes the whole context; candle's `Device::new_cuda` stream is the
/// per-thread default stream, which synchronizes with the legacy stream). Devices are
/// independent: ranks capturing collectives on their own GPUs are not serialized.
fn device_capture_lock(ordinal: usize) -> Arc<Mutex<()>> {
    static LOCKS: Mutex<Vec<(usize, Arc<Mutex<()>>)>> = Mutex::new(Vec::new());
    let mut locks = LOCKS.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, lock)) = locks.iter().find(|(o, _)| *o == ordinal) {
        return lock.clone();
    }
    let lock = Arc::new(Mutex::new(()));
    locks.push((ordinal, lock.clone()));
    lock
}

/// How many live graphs with temporaries device `ordinal` has, across every runtime of the
/// process: the device's graph memory pool is trimmed only when none is left (see
/// [`Runtime::trim_graph_memory`]). Devices past the 64th share the last counter.
pub(crate) fn graphs_with_temporaries(ordinal: usize) -> &'static std::sync::atomic::AtomicUsize {
    use std::sync::atomic::AtomicUsize;
    static COUNTS: [AtomicUsize; 64] = [const { AtomicUsize::new(0) }; 64];
    &COUNTS[ordinal.min(COUNTS.len() - 1)]
}

/// Kernel `name` of `source` through the runtime of `stream` (see [`Runtime::find_by_stream`]):
/// for a `#[cuda_graph]` body whose context parameter is the stream.
///
/// Fails with [`GraphError::NoRuntimeForStream`] when no runtime was made for `stream`.
pub fn function_for_stream(
    stream: &Arc<CudaStream>,
    source: &str,
    name: &str,
) -> Result<CudaFunction, GraphError> {
    Runtime::find_by_stream(stream)
        .ok_or(GraphError::NoRuntimeForStream)?
        .function(source, name)
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
        let ctx = CudaContext::new(ordinal)?;
        // SAFETY: the context was created just now and nothing has been allocated from it
        // through this handle; the runtime issues all of its own work on one stream, and the
        // type's docs tell users to order any other stream themselves, which is the
        // condition `disable_event_tracking` places on its caller.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream()?;
        let capture = ctx.new_stream()?;
        Self::assemble(ctx, stream, Some(capture))
    }

    /// A runtime on a context you created (candle's `CudaDevice`, a context of your own):
    /// it creates its own capture stream on that context.
    ///
    /// A second stream makes cudarc synchronise every buffer of the context through events
    /// when event tracking is on, and a capture cannot wait on events recorded before it
    /// (CUDA error 905). So the context must have event tracking off; if it is on, this is
    /// [`GraphError::EventTracking`], which says how to turn it off, or to use
    /// [`Runtime::from_stream`] with the one stream you already use.
    pub fn from_context(ctx: Arc<CudaContext>) -> Result<Self, GraphError> {
        if ctx.is_event_tracking() {
            return Err(GraphError::EventTracking {
                during: "creating a runtime with its own stream on your context",
            });
        }
        let stream = ctx.new_stream()?;
        let capture = ctx.new_stream()?;
        Self::assemble(ctx, stream, Some(capture))
    }

    /// A runtime that captures and replays on `stream`, a stream you created (for candle,
    /// `CudaDevice::cuda_stream()`): graphs then run in order with the rest of your work on
    /// that stream, and buffers made before the runtime existed are used as they are.
    ///
    /// The stream must not be the legacy default stream or the per-thread default stream:
    /// CUDA cannot capture them ([`GraphError::DefaultStream`]). cudarc's event tracking
    /// must be off on the context whenever it has a stream made with `ctx.new_stream()`,
    /// this one included: cudarc counts any such stream beside the context's default stream
    /// as several streams and then records and waits on events for every buffer, which a
    /// capture refuses. So a capture on such a stream with tracking on is refused with
    /// [`GraphError::EventTracking`] (instead of failing with CUDA error 905), and so is a
    /// [`Runtime::fork`] that would create a side stream; turn tracking off
    /// (`unsafe { ctx.disable_event_tracking() }`) before allocating.
    pub fn from_stream(stream: Arc<CudaStream>) -> Result<Self, GraphError> {
        let raw = stream.cu_stream() as usize;
        if raw == 0 || raw == 0x2 {
            return Err(GraphError::DefaultStream);
        }
        let ctx = stream.context().clone();
        Self::assemble(ctx, stream, None)
    }

    /// The framework this runtime was made from, if any (see `crate::framework`).
    pub(crate) fn framework(&self) -> Option<&dyn Framework> {
        self.inner.framework.as_deref()
    }

    /// The runtime of `stream`, if one was made for it (by [`Runtime::new`],
    /// [`Runtime::from_context`] or [`Runtime::from_stream`]) and is still alive: how a body
    /// whose context parameter is the stream reaches the kernel cache (see [`function_for_stream`]).
    pub fn find_by_stream(stream: &Arc<CudaStream>) -> Option<Runtime> {
        let registry = REGISTRY.lock().unwrap_or_else(|p| p.into_inner());
        registry
            .iter()
            .filter(|(s, _)| std::ptr::eq(s.as_ptr(), Arc::as_ptr(stream)))
            .find_map(|(_, inner)| inner.upgrade())
            .map(|inner| Runtime { inner })
    }

    fn assemble(
        ctx: Arc<CudaContext>,
        stream: Arc<CudaStream>,
        capture: Option<Arc<CudaStream>>,
    ) -> Result<Self, GraphError> {
        Self::assemble_with(ctx, stream, capture, None)
    }

    /// `capture`: the runtime's own capture stream (see [`Runtime`], "Threads"), or `None`
    /// to capture on `stream` itself (a stream the user or a framework owns); `framework`:
    /// the framework whose device's stream `stream` is.
    pub(crate) fn assemble_with(
        ctx: Arc<CudaContext>,
        stream: Arc<CudaStream>,
        capture: Option<Arc<CudaStream>>,
        framework: Option<Arc<dyn Framework>>,
    ) -> Result<Self, GraphError> {
        if !cublas_available() {
            return Err(GraphError::MissingLibrary { library: "cublas" });
        }
        if let Some(f) = &framework {
            let (name, convert) = f.errors();
            crate::error::register_framework_errors(name, convert);
        }
        ctx.bind_to_thread()?;
        // Creating cuBLAS handles allocates and frees device memory outside any stream's
        // order, which fails a capture that another thread records on this device: the
        // device's capture lock keeps them apart (see `device_capture_lock`).
        let lock = device_capture_lock(ctx.ordinal());
        let serial =
            (!crate::phase::in_procedure()).then(|| lock.lock().unwrap_or_else(|p| p.into_inner()));
        let (blas, workspace) = blas_with_workspace(&stream)?;
        let capture = match capture {
            Some(s) => {
                let (blas, workspace) = blas_with_workspace(&s)?;
                Some(CaptureStream {
                    blas,
                    _blas_workspace: workspace,
                    stream: s,
                })
            }
            None => None,
        };
        let compute_capability = ctx.compute_capability()?;
        let multiprocessors = ctx.attribute(
            cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
        )? as u32;
        stream.synchronize()?;
        tracing::debug!(
            ordinal = ctx.ordinal(),
            device = %ctx.name().unwrap_or_default(),
            ?compute_capability,
            event_tracking = ctx.is_event_tracking(),
            "cuda-graph runtime ready"
        );
        let rng = Generator::create(&stream, DEFAULT_SEED)?;
        drop(serial);
        let inner = Arc::new(Inner {
            blas: ManuallyDrop::new(blas),
            blas_owner: gate::thread_token(),
            thread_blas: ThreadBlas::default(),
            _blas_workspace: workspace,
            gate: StreamGate::new(capture.is_some()),
            capture,
            kernels: Mutex::new(KernelCache::default()),
            capture_lock: lock,
            generators: Mutex::new(vec![rng.downgrade()]),
            rng,
            stream,
            ctx,
            compute_capability,
            multiprocessors,
            measure_exec: AtomicBool::new(false),
            framework,
        });
        let mut registry = REGISTRY.lock().unwrap_or_else(|p| p.into_inner());
        registry.retain(|(s, i)| s.strong_count() > 0 && i.strong_count() > 0);
        registry.push((Arc::downgrade(&inner.stream), Arc::downgrade(&inner)));
        if let Some(c) = &inner.capture {
            registry.push((Arc::downgrade(&c.stream), Arc::downgrade(&inner)));
        }
        Ok(Runtime { inner })
    }

    /// Refuses a capture (or a new side stream) on a context whose cudarc event tracking is
    /// active, naming what was about to happen.
    pub(crate) fn refuse_event_tracking(&self, during: &'static str) -> Result<(), GraphError> {
        if self.inner.ctx.is_managing_stream_synchronization() {
            return Err(GraphError::EventTracking { during });
        }
        Ok(())
    }

    /// The CUDA context (device) of this runtime.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.inner.ctx
    }

    /// The stream the runtime's work runs on: warmups, replays, and what you queue between
    /// them. Launch the body's kernels here.
    ///
    /// While a thread records a capture of this runtime, `stream()` gives that thread the
    /// runtime's capture stream, on which the capture records, and every other thread this
    /// stream, which no capture touches (see [`Runtime`], "Threads"). A runtime made with
    /// [`Runtime::from_stream`] (or from candle) captures on the stream it was given: a thread
    /// that asks for it while another thread's capture records waits until that capture has
    /// ended.
    #[inline]
    pub fn stream(&self) -> &Arc<CudaStream> {
        if let Some(c) = &self.inner.capture {
            if self.inner.gate.captured_by_this_thread() {
                return &c.stream;
            }
            return &self.inner.stream;
        }
        self.inner.gate.wait_for_other_capture();
        &self.inner.stream
    }

    /// The stream whose side streams [`Runtime::fork`] lends, on every thread: the runtime's
    /// stream (the capture stream forks from the same pool, so a capture reuses the side
    /// streams its warmup created).
    pub(crate) fn fork_key(&self) -> &Arc<CudaStream> {
        &self.inner.stream
    }

    /// The cuBLAS handle, bound to [`Runtime::stream`], with its workspace set so that GEMMs
    /// can be captured.
    ///
    /// cuBLAS lets one host thread at a time use a handle, so each thread gets a handle of
    /// its own (the runtime's creator the first; the others made at their first call, on the
    /// same stream, each with a workspace of [`CUBLAS_WORKSPACE_BYTES`] of its own, given
    /// back when the thread ends), and the thread recording a capture gets the capture
    /// stream's.
    ///
    /// # Panics
    /// When cuBLAS cannot create a handle for a new thread (out of memory).
    #[inline]
    pub fn blas(&self) -> &CudaBlas {
        if let Some(c) = &self.inner.capture {
            if self.inner.gate.captured_by_this_thread() {
                return &c.blas;
            }
        }
        let me = gate::thread_token();
        if me == self.inner.blas_owner {
            return &self.inner.blas;
        }
        self.thread_blas(me)
    }

    /// The cuBLAS handle of thread `me` (not the runtime's creator), made at its first call.
    fn thread_blas(&self, me: u64) -> &CudaBlas {
        let lock_handles = || {
            self.inner
                .thread_blas
                .handles
                .lock()
                .unwrap_or_else(|p| p.into_inner())
        };
        let find = |handles: &[ThreadHandle]| {
            handles
                .iter()
                .find(|(t, _, _)| *t == me)
                .map(|(_, b, _)| &**b as *const CudaBlas)
        };
        let found = find(&lock_handles());
        // Making a handle is device-wide work: under the capture lock, taken before the
        // list's (a capturing thread holds it and asks for its handle).
        let _serial =
            (found.is_none() && !crate::phase::in_procedure()).then(|| self.capture_lock());
        let mut handles = lock_handles();
        let ptr = match found {
            Some(ptr) => ptr,
            None => {
                let (blas, workspace) = blas_with_workspace(&self.inner.stream)
                    .expect("cuBLAS could not create a handle for this thread");
                handles.push((me, Box::new(blas), workspace));
                // The handle goes when the thread ends (threads of a pool come and go).
                EXIT.with(|e| e.runtimes.borrow_mut().push(Arc::downgrade(&self.inner)));
                &*handles.last().expect("just pushed").1 as *const CudaBlas
            }
        };
        drop(handles);
        // SAFETY: the handle is boxed in `thread_blas`; its entry is removed only by this
        // thread's exit (`ThreadExit`), after any borrow of the runtime on this thread has
        // ended, and other entries moving does not move the box's contents. So the handle
        // stays at this address for as long as `&self` borrows the runtime on this thread,
        // the only thread that uses it.
        unsafe { &*ptr }
    }

    /// An [early launch](crate::launch) of `func` on [`Runtime::stream`]: the kernel may start
    /// while the kernel before it finishes, and a capture records that as a programmatic
    /// graph edge. The kernel must wait with `griddepcontrol.wait` before reading what
    /// earlier kernels wrote; see [`crate::launch`].
    pub fn launch_early<'a>(&'a self, func: &'a CudaFunction) -> crate::launch::EarlyLaunch<'a> {
        crate::launch::EarlyLaunch::new(self.stream(), func)
    }

    /// The device's compute capability, e.g. `(9, 0)` on an H100.
    pub fn compute_capability(&self) -> (i32, i32) {
        self.inner.compute_capability
    }

    /// Returns kernel `name` from the CUDA C++ `source`, compiling it with NVRTC for this
    /// device the first time the process sees that source and loading it into this context
    /// the first time this runtime asks. Later calls are a hash-map lookup (and a comparison
    /// of the source text, so a source built at run time is safe to pass too).
    ///
    /// Call it freely inside a `#[cuda_graph]` body: the warmup runs compile and load the
    /// module, so the capture only looks it up. The module stays loaded as long as the
    /// runtime (and every graph, which keeps the runtime alive).
    pub fn function(&self, source: &str, name: &str) -> Result<CudaFunction, GraphError> {
        self.function_with(source, name, &[])
    }

    /// [`Runtime::function`] with extra NVRTC options (for example `"--use_fast_math"`);
    /// the target architecture is always this device's.
    pub fn function_with(
        &self,
        source: &str,
        name: &str,
        options: &[&str],
    ) -> Result<CudaFunction, GraphError> {
        self.cached_function(ModuleSource::Cuda(source), name, options, true)
    }

    /// A kernel of the library's own sources, looked up without noting it for the
    /// determinism check (the library decides when its kernels run, not the body).
    pub(crate) fn library_function(
        &self,
        source: &str,
        name: &str,
    ) -> Result<CudaFunction, GraphError> {
        self.cached_function(ModuleSource::Cuda(source), name, &[], false)
    }

    /// Kernel `name` from PTX text you compiled yourself (with `nvcc -ptx`, or NVRTC with
    /// options of your own), loaded into this context once.
    pub fn function_from_ptx(&self, ptx: &str, name: &str) -> Result<CudaFunction, GraphError> {
        self.cached_function(ModuleSource::Ptx(ptx), name, &[], true)
    }

    fn cached_function(
        &self,
        source: ModuleSource<'_>,
        name: &str,
        options: &[&str],
        note: bool,
    ) -> Result<CudaFunction, GraphError> {
        if note {
            crate::phase::note_kernel_lookup(name);
        }
        let lock_kernels = || self.inner.kernels.lock().unwrap_or_else(|p| p.into_inner());
        let mut cache = lock_kernels();
        let index = match cache.find(source, options) {
            Some(i) => i,
            None => {
                drop(cache);
                let ptx = match source {
                    ModuleSource::Cuda(text) => {
                        compile_cached(text, options, self.inner.compute_capability)?
                    }
                    ModuleSource::Ptx(text) => Ptx::from_src(text),
                };
                // Loading a module is device-wide work: not while another thread captures.
                // The capture lock is taken before the cache's (a capturing thread holds it
                // and looks kernels up).
                let _serial = (!crate::phase::in_procedure()).then(|| self.capture_lock());
                cache = lock_kernels();
                match cache.find(source, options) {
                    Some(i) => i,
                    None => {
                        let module = self.inner.ctx.load_module(ptx)?;
                        cache.insert(source, options, module)
                    }
                }
            }
        };
        let entry = &mut cache.modules[index];
        if let Some(f) = entry.functions.get(name) {
            return Ok(f.clone());
        }
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
        self.inner.multiprocessors
    }

    /// A new event without timing (the cheap kind), for ordering work across streams.
    pub(crate) fn untimed_event(&self) -> Result<CudaEvent, GraphError> {
        Ok(self
            .inner
            .ctx
            .new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))?)
    }

    /// The runtime's default random generator (seed [`DEFAULT_SEED`](crate::rng::DEFAULT_SEED)).
    /// Every graph may draw from it with no registration; see [`crate::rng`].
    pub fn rng(&self) -> &Generator {
        &self.inner.rng
    }

    /// A new random generator starting at `seed`, offset 0. The runtime remembers it so that
    /// warmup runs before a capture can be undone for it too (see [`crate::rng`]).
    ///
    /// Inside a captured body this is refused with [`GraphError::GeneratorInCapture`].
    #[track_caller]
    pub fn generator(&self, seed: u64) -> Result<Generator, GraphError> {
        let location = Location::caller();
        refuse_while_capturing(|graph| GraphError::GeneratorInCapture { graph, location })?;
        let g = Generator::create(&self.inner.stream, seed)?;
        let mut all = self
            .inner
            .generators
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        all.retain(|w| w.strong_count() > 0);
        all.push(g.downgrade());
        Ok(g)
    }

    /// Every generator created from this runtime that is still alive.
    pub(crate) fn live_generators(&self) -> Vec<Generator> {
        let all = self
            .inner
            .generators
            .lock()
            .unwrap_or_else(|p| p.into_inner());
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
        let location = Location::caller();
        refuse_while_capturing(|graph| GraphError::SyncInCapture {
            op: "Runtime::synchronize",
            graph,
            location,
        })?;
        self.inner.stream.synchronize()?;
        Ok(())
    }

    /// The runtime's graph memory pool: where the temporaries of every graph live. All graphs
    /// of a runtime launch on its one stream, one after another, so CUDA can back their
    /// temporaries with the same physical memory: the pool holds what the largest graph
    /// needs, not the sum. The figures are the device's, across runtimes.
    pub fn graph_memory(&self) -> Result<GraphMemory, GraphError> {
        use cudarc::driver::sys::CUgraphMem_attribute as A;
        self.inner.ctx.bind_to_thread()?;
        let device = self.inner.ctx.cu_device();
        let read = |attr: A| -> Result<usize, GraphError> {
            Ok(driver::graph_mem_attribute(device, attr)? as usize)
        };
        Ok(GraphMemory {
            used: read(A::CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT)?,
            used_high: read(A::CU_GRAPH_MEM_ATTR_USED_MEM_HIGH)?,
            reserved: read(A::CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT)?,
            reserved_high: read(A::CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH)?,
        })
    }

    /// Whether the graphs captured from now on measure their executable graph's own device
    /// memory ([`GraphInfo::exec_bytes`](crate::GraphInfo::exec_bytes)), for every handle of
    /// this runtime. Off by default: the driver has no figure for it, so each capture reads
    /// the device's free memory before and after instantiating (`cuMemGetInfo`, 8 to 60 µs
    /// each on an H200, as much as instantiating a small graph). Turn it on for probes that size memory (see "Sizing memory" in the
    /// crate docs).
    pub fn set_measure_executable_memory(&self, on: bool) {
        self.inner.measure_exec.store(on, Ordering::Relaxed);
    }

    pub(crate) fn measures_executable_memory(&self) -> bool {
        self.inner.measure_exec.load(Ordering::Relaxed)
    }

    /// What the device's graph memory pool holds now (`reserved` of [`Runtime::graph_memory`],
    /// one driver call).
    pub(crate) fn graph_pool_reserved(&self) -> Result<usize, GraphError> {
        use cudarc::driver::sys::CUgraphMem_attribute as A;
        let device = self.inner.ctx.cu_device();
        Ok(
            driver::graph_mem_attribute(device, A::CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT)?
                as usize,
        )
    }

    /// Resets the high-water marks of [`Runtime::graph_memory`] to the current values.
    pub fn reset_graph_memory_high(&self) -> Result<(), GraphError> {
        use cudarc::driver::sys::CUgraphMem_attribute as A;
        self.inner.ctx.bind_to_thread()?;
        for attr in [
            A::CU_GRAPH_MEM_ATTR_USED_MEM_HIGH,
            A::CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH,
        ] {
            driver::reset_graph_mem_high(self.inner.ctx.cu_device(), attr)?;
        }
        Ok(())
    }

    /// Gives the device's graph memory back to the device when no live graph on it has
    /// temporaries, and returns whether it did. Dropping the last graph with temporaries
    /// does this already.
    ///
    /// While a graph with temporaries lives, the pool is kept: between two replays CUDA counts
    /// a graph's temporaries as unused, so a trim would unmap them and the graph's next replay
    /// would map them again (an allocation on the replay path, which can fail once another
    /// allocation took the memory).
    pub fn trim_graph_memory(&self) -> Result<bool, GraphError> {
        self.inner.ctx.bind_to_thread()?;
        // Device-wide: not while another thread captures on this device (see `capture_lock`).
        let _serial = (!crate::phase::in_procedure()).then(|| self.capture_lock());
        if graphs_with_temporaries(self.inner.ctx.ordinal()).load(Ordering::Acquire) > 0 {
            return Ok(false);
        }
        driver::graph_mem_trim(self.inner.ctx.cu_device())?;
        Ok(true)
    }

    /// Free and total device memory in bytes, as the driver reports them.
    pub fn mem_info(&self) -> Result<(usize, usize), GraphError> {
        Ok(self.inner.ctx.mem_get_info()?)
    }

    /// Adds what the runtime knows to an out-of-memory error: what it was doing, the size
    /// asked for, and the device's free memory now. Other errors pass through.
    pub(crate) fn oom_context(
        &self,
        e: GraphError,
        during: impl FnOnce() -> String,
        requested: Option<usize>,
    ) -> GraphError {
        if !e.is_out_of_memory() {
            return e;
        }
        let requested = requested.or_else(|| e.requested_bytes());
        GraphError::OutOfMemory {
            during: during(),
            requested_bytes: requested,
            free_bytes: self.mem_info().ok().map(|(free, _)| free),
        }
    }

    /// Clears an error cudarc recorded on the context (from a call that cannot return one,
    /// such as a buffer's drop) and returns it.
    pub(crate) fn take_recorded_error(&self) -> Option<cudarc::driver::DriverError> {
        self.inner.ctx.check_err().err()
    }

    pub(crate) fn gate(&self) -> &StreamGate {
        &self.inner.gate
    }

    /// The device's capture lock (see [`device_capture_lock`]): held for a whole capture
    /// procedure, and by a settle that synchronizes the stream.
    pub(crate) fn capture_lock(&self) -> std::sync::MutexGuard<'_, ()> {
        self.inner
            .capture_lock
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Whether two handles are the same runtime (as [`Arc::ptr_eq`] says of two `Arc`s).
    pub fn ptr_eq(&self, other: &Runtime) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

/// The device's graph memory pool, in bytes (see [`Runtime::graph_memory`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
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
