//! candle code as a graph (feature `candle`).
//!
//! A function written with candle ops becomes a graph with the same attribute: its context is
//! candle's `&Device`, its inputs are `&Tensor`s, its state a model of candle-nn layers, and
//! it returns a `Tensor`.
//!
//! ```no_run
//! use graph_runtime::candle::candle_core::{DType, Device, Module, Result, Tensor};
//! use graph_runtime::candle::candle_nn;
//! use graph_runtime::{cuda_graph, DeviceState, Runtime};
//!
//! #[derive(DeviceState)]
//! struct Mlp { layers: Vec<candle_nn::Linear> }
//!
//! #[cuda_graph(warmup = 2)]
//! fn mlp(dev: &Device, x: &Tensor, #[state] m: &Mlp) -> Result<Tensor> {
//!     let mut h = x.clone();
//!     for l in &m.layers { h = l.forward(&h)?.gelu()?; }
//!     Ok(h)
//! }
//!
//! # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
//! let device = Device::new_cuda(0)?;
//! # let linear = |_| -> Result<candle_nn::Linear> {
//! #     Ok(candle_nn::Linear::new(Tensor::ones((512, 512), DType::F32, &device)?, None))
//! # };
//! # let model = Mlp { layers: (0..4).map(linear).collect::<Result<Vec<_>>>()? };
//! # let x = Tensor::ones((1, 512), DType::F32, &device)?;
//! # let x2 = x.clone();
//! let rt = Runtime::from_candle(&device)?;            // captures on candle's own stream
//! let mut graph = MlpGraph::capture(&rt, &x, &model)?;
//! let y: &Tensor = graph.replay(&x2)?.result;         // a static tensor the graph owns
//! # let _ = y;
//! # Ok(()) }
//! ```
//!
//! | candle | in the graph |
//! | --- | --- |
//! | `dev: &Device` (or `&CudaDevice`) first | the runtime's candle device: [`Runtime::from_candle`] |
//! | `x: &Tensor` | a static tensor shaped like the example given to `capture`; `replay` checks dtype and dims and copies the new tensor in (a contiguous tensor on the same stream through the graph's own first node) |
//! | `-> Result<Tensor>` | the returned tensor is copied into a static tensor inside the graph, then dropped; `replay(..)?.result` lends it out |
//! | `#[state] m: &Model` | read in place; `#[derive(DeviceState)]` on your model works for fields that are tensors, `Linear`, `Embedding`, `LayerNorm`, `RmsNorm`, and `Vec`s or `Option`s of them |
//! | `#[state] m: &ModelState<M>` | a model of another crate (candle-transformers') with the tensors it reads, from its `VarMap`: checked by address before every replay, lent back only as `&M` (see [`ModelState`] for the contract) |
//! | every op's output | a stream-ordered allocation, recorded as a graph allocation node: a temporary at a fixed address, freed inside the graph |
//! | candle's cuBLAS calls | recorded like any other kernel (the warmup runs make cuBLAS pick its algorithms) |
//! | `comm.all_reduce_tensor(&t, op)`, `comm.all_gather_tensor(&t)` (feature `nccl`, `#[state] comm: &Communicator`) | NCCL collectives (or the one-shot all-reduce) on the rank's tensors, recorded on every rank like `Communicator::all_reduce`; capture with `comm.capture(\|\| FooGraph::capture(…))` |
//!
//! # What is arranged for you
//! * **Small uploads inside ops.** Some candle ops (`index_select`, strided copies behind
//!   `contiguous()` and `Tensor::cat`) upload a few bytes of shape data from a `Vec` on every
//!   call; recorded in a graph, such a copy would read freed host memory on replay. During the
//!   warmup runs and the capture the runtime holds candle's
//!   `CudaDevice::enable_cuda_graph_htod_cache` guard: the warmup uploads each of them once
//!   into a cache, and the capture reuses the cached device copy. candle keeps that cache per
//!   thread: capture on a thread that lives as long as the graph (the main thread).
//! * **Event tracking.** [`Runtime::from_candle`] uses candle's stream itself, so no second
//!   stream is created. `Device::new_cuda` works as it is. `Device::new_cuda_with_stream`
//!   gives the context a stream of its own with event tracking on, which a capture cannot
//!   live with (CUDA error 905): the capture is refused with [`GraphError::EventTracking`],
//!   saying to call `unsafe { cuda_device.disable_event_tracking() }` before creating tensors.
//! * **Errors.** A candle error that carries a CUDA error (a capture invalidated by a host
//!   read, say) becomes the same typed [`GraphError`] a cudarc body gets. Any other candle
//!   error keeps its text without the backtrace candle puts into it under
//!   `RUST_BACKTRACE=1` (the backtrace is logged through `tracing` at debug level).
//!
//! # What cannot work, and what you get instead
//! * **A host read in the body** (`to_scalar`, `to_vec1`, `to_device(&Device::Cpu)`, …) is a
//!   compile error at the call (see [`coverage`](crate::coverage)).
//! * **A tensor made before the capture and freed inside it** (a model that replaces its KV
//!   cache with `Tensor::cat` on every call): CUDA cannot record the free of memory the graph
//!   did not allocate. The capture fails with [`GraphError::FreedInCapture`]; keep such tensors
//!   at fixed addresses and write into them in place (`slice_set`, `scatter_set`,
//!   [`StaticKvCache`]). A cache cleared or replaced at the start of the body
//!   (`clear_kv_cache()` before the forward) fails the same way, since it drops what the
//!   previous call left: clear it after the forward instead.
//! * **A tensor kept past the capture** (stored into `&mut` state): its memory is a graph
//!   temporary, freed by the next replay. When the state is a `DeviceState`, the replaced
//!   tensor is found after the capture and refused as [`GraphError::StateMoved`].
//! * **Threads capturing at once on one device.** Seen on the H100 before the runtime
//!   serialised captures: two threads, each capturing on its own `Device::new_cuda(0)`,
//!   invalidated each other's capture (CUDA error 901, [`GraphError::CaptureInvalidated`]):
//!   one thread's warmup synchronises or allocates while the other records. The runtime now
//!   holds one capture lock per device for every runtime of the process (see
//!   [`Runtime`], "Threads"), so such threads simply take turns. Eager work
//!   that synchronises the whole device from a thread that is not capturing (a
//!   `CudaContext::synchronize`, a new stream on a context with event tracking on, which
//!   synchronises the context) can still invalidate a capture: make devices and streams
//!   before the threads start capturing.
//! * **Uploads above candle's cap.** candle caches only uploads of at most 4096 bytes
//!   (`CUDA_GRAPH_HTOD_CACHE_MAX_BYTES`, candle-core 0.11), so a body that builds a larger
//!   host tensor on the device in every call (T5's relative-position buckets, Qwen2's and
//!   Phi's causal masks above 32 to 64 tokens) cannot be captured: candle refuses the upload
//!   and the capture fails with [`GraphError::HostUploadInCapture`], which names the limit and,
//!   with `RUST_BACKTRACE=1`, the call (`Tensor::from_slice` called from the model's
//!   function). Ways out: in code of your own, make such a tensor once before the capture and
//!   hold it as `#[state]` (it depends on shapes only), or keep each upload at most 4096
//!   bytes. For a model you cannot change, build candle-core with a larger cache:
//!   `bash scripts/candle-upload-cap.sh vendor/candle-core` copies candle-core from cargo's
//!   registry with the limit raised (16 MiB by default) and prints the `[patch.crates-io]`
//!   lines. The cache is consulted only while a warmup or a capture runs, so eager candle work
//!   and replays are unchanged; each distinct upload of a warmup stays cached on the device for
//!   the thread's life. `20-candle-upload-cap` runs a T5 encoder, a Qwen2 and a Phi window of
//!   candle-transformers at 64, 128 and 512 tokens both ways (`scripts/candle-upload-cap-bundle.sh`
//!   builds it against the raised limit without changing your checkout).
//! * **Shapes and positions are frozen** at capture: one graph serves one set of shapes. Keep
//!   positions in device tensors (select rows with `index_select(pos)`, write with
//!   `scatter_set`) so that one graph serves every position (`13-candle-decoder`).
//!   [`StaticKvCache`] and [`RotaryTables`] do that for a Llama-style decoder
//!   (`16-candle-llama-decode`).

use std::any::Any;
use std::sync::Arc;

use candle_core::cuda_backend::CudaStorageSlice;
use candle_core::{CudaDevice, DType, Device, Storage, Tensor};
use cudarc::driver::CudaStream;

/// The candle crates this module was built with.
pub use candle_core;
/// The candle-nn crate this module was built with.
pub use candle_nn;

// The tensor collectives are methods of `crate::nccl::Communicator`.
#[cfg(feature = "nccl")]
mod collective;
mod error;
mod kv_cache;
mod model_state;
pub use kv_cache::{greedy_next, CachePosition, RotaryTables, StaticKvCache};
pub use model_state::ModelState;

use crate::buffer::{same_stream, InputSource, Staging, StaticBuffer};
use crate::error::{FrameworkErrors, GraphError};
use crate::framework::Framework;
use crate::region::{DeviceRegion, Elem};
use crate::runtime::{FromRuntime, Runtime};
use crate::state::DeviceState;

/// The most dimensions a static tensor may have.
pub const MAX_RANK: usize = 8;

/// The shape of a static tensor: its dtype and dims. What a `&mut Tensor` output is given to
/// `capture` as, and what a replay compares before copying an input.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TensorShape {
    dtype: DType,
    rank: u8,
    dims: [usize; MAX_RANK],
}

impl TensorShape {
    /// `dtype` and `dims`; `None` above [`MAX_RANK`] dimensions.
    pub fn new(dtype: DType, dims: &[usize]) -> Option<Self> {
        if dims.len() > MAX_RANK {
            return None;
        }
        let mut d = [0; MAX_RANK];
        d[..dims.len()].copy_from_slice(dims);
        Some(TensorShape {
            dtype,
            rank: dims.len() as u8,
            dims: d,
        })
    }

    /// The shape of `t` (a tensor of more than [`MAX_RANK`] dimensions gets a shape that no
    /// static tensor has, so it is refused as a mismatch).
    pub fn of(t: &Tensor) -> Self {
        TensorShape::new(t.dtype(), t.dims()).unwrap_or(TensorShape {
            dtype: t.dtype(),
            rank: u8::MAX,
            dims: [0; MAX_RANK],
        })
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The dimensions.
    pub fn dims(&self) -> &[usize] {
        &self.dims[..usize::from(self.rank).min(MAX_RANK)]
    }

    fn elem_count(&self) -> usize {
        self.dims().iter().product()
    }
}

impl std::fmt::Debug for TensorShape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if usize::from(self.rank) > MAX_RANK {
            return write!(f, "{:?} with more than {MAX_RANK} dims", self.dtype);
        }
        write!(f, "{:?}{:?}", self.dtype, self.dims())
    }
}

/// The element type of a dtype, as verification reads it.
fn elem_of(dtype: DType) -> Elem {
    match dtype {
        DType::F32 => Elem::F32,
        DType::F64 => Elem::F64,
        DType::U8 => Elem::UInt(1),
        DType::U32 => Elem::UInt(4),
        DType::I16 => Elem::Int(2),
        DType::I32 => Elem::Int(4),
        DType::I64 => Elem::Int(8),
        _ => Elem::Bytes,
    }
}

/// The device address and byte length of a CUDA storage slice.
fn slice_range(slice: &CudaStorageSlice) -> (u64, usize) {
    use cudarc::driver::DevicePtr;
    macro_rules! range {
        ($($v:ident),*) => {
            match slice {
                $(CudaStorageSlice::$v(s) => (s.device_ptr(s.stream()).0, s.num_bytes()),)*
            }
        };
    }
    range!(U8, U32, I16, I32, I64, BF16, F16, F32, F64, F8E4M3, F6E2M3, F6E3M2, F4, F8E8M0)
}

/// Where `t`'s elements start on the device and whether they are one contiguous run of the
/// tensor's own bytes; `None` for a tensor that is not on a CUDA device.
fn cuda_data(t: &Tensor) -> Option<(u64, usize, bool)> {
    let (storage, layout) = t.storage_and_layout();
    let Storage::Cuda(cuda) = &*storage else {
        return None;
    };
    let (base, bytes) = slice_range(&cuda.slice);
    let size = t.dtype().size_in_bytes();
    let start = base + (layout.start_offset() * size) as u64;
    Some((start, bytes, layout.is_contiguous()))
}

/// The CUDA stream a tensor's storage belongs to.
fn cuda_stream_of(t: &Tensor) -> Option<Arc<CudaStream>> {
    let (storage, _) = t.storage_and_layout();
    match &*storage {
        Storage::Cuda(cuda) => Some(cuda.device.cuda_stream()),
        _ => None,
    }
}

fn candle_err(e: candle_core::Error) -> GraphError {
    error::from_candle(e)
}

/// Copies `src` (any layout, any device) into the static tensor `dst` of the same shape, on
/// `dst`'s device: an in-place copy, `dst` keeps its storage.
fn copy_tensor(dst: &Tensor, src: &Tensor) -> Result<(), GraphError> {
    let src = if src.device().same_device(dst.device()) {
        src.clone()
    } else {
        src.to_device(dst.device()).map_err(candle_err)?
    };
    let src = if src.is_contiguous() {
        src
    } else {
        src.contiguous().map_err(candle_err)?
    };
    let (d, s) = (
        dst.flatten_all().map_err(candle_err)?,
        src.flatten_all().map_err(candle_err)?,
    );
    d.slice_set(&s, 0, 0).map_err(candle_err)
}

// SAFETY: one region, the tensor's CUDA storage (the whole allocation the tensor keeps alive
// through its `Arc`); replacing the tensor changes the storage it reports. A tensor not on a
// CUDA device reports nothing (it holds no device memory).
unsafe impl DeviceState for Tensor {
    /// A static tensor is lent as `&Tensor`: its contents can be written in place
    /// (`slice_set`, `scatter_set`), its storage cannot be replaced.
    type Lent<'a> = &'a Tensor;

    fn regions(&self, visit: &mut dyn FnMut(DeviceRegion)) {
        let (storage, _) = self.storage_and_layout();
        if let Storage::Cuda(cuda) = &*storage {
            let (ptr, bytes) = slice_range(&cuda.slice);
            visit(DeviceRegion {
                elem: elem_of(self.dtype()),
                stream: cuda.device.cuda_stream().cu_stream() as usize as u64,
                ..DeviceRegion::device(ptr, bytes)
            });
        }
    }

    fn lend(&mut self) -> &Tensor {
        self
    }
}

/// candle-nn layers: their weight tensors, in a fixed order.
macro_rules! layers {
    ($($t:ty => |$l:ident| $tensors:expr;)*) => {$(
        // SAFETY: forwards to the layer's tensors, always in the same order; the layer owns them.
        unsafe impl DeviceState for $t {
            type Lent<'a> = &'a mut $t;

            fn regions(&self, visit: &mut dyn FnMut(DeviceRegion)) {
                let $l = self;
                for t in $tensors.into_iter().flatten() {
                    t.regions(visit);
                }
            }

            fn lend(&mut self) -> &mut $t {
                self
            }
        }
    )*};
}

layers! {
    candle_nn::Linear => |l| [Some(l.weight()), l.bias()];
    candle_nn::Embedding => |l| [Some(l.embeddings())];
    candle_nn::LayerNorm => |l| [Some(l.weight()), l.bias()];
    candle_nn::RmsNorm => |l| [Some(l.weight())];
}

impl StaticBuffer for Tensor {
    type Shape = TensorShape;

    fn shape(&self) -> TensorShape {
        TensorShape::of(self)
    }

    fn alloc_static(rt: &Runtime, shape: TensorShape) -> Result<Self, GraphError> {
        let device = rt.candle_device().ok_or(GraphError::NoCandleDevice)?;
        if usize::from(shape.rank) > MAX_RANK {
            return Err(GraphError::User(
                format!("a static tensor has at most {MAX_RANK} dimensions, not {shape:?}").into(),
            ));
        }
        Tensor::zeros(shape.dims(), shape.dtype, device).map_err(candle_err)
    }

    fn bytes_for(shape: TensorShape) -> usize {
        shape
            .elem_count()
            .saturating_mul(shape.dtype.size_in_bytes())
    }

    fn device_range(&self) -> (cudarc::driver::sys::CUdeviceptr, usize) {
        match cuda_data(self) {
            Some((ptr, _, _)) => (ptr, Self::bytes_for(TensorShape::of(self))),
            None => (0, 0),
        }
    }
}

impl crate::buffer::ResultBuffer for Tensor {
    fn store(&mut self, value: &Self) -> Result<(), GraphError> {
        copy_tensor(self, value)
    }
}

impl InputSource<Tensor> for Tensor {
    fn shape(&self) -> TensorShape {
        TensorShape::of(self)
    }

    fn copy_into(&self, dst: &Tensor, staging: &Staging<'_>) -> Result<(), GraphError> {
        let _ = staging;
        copy_tensor(dst, self)
    }

    fn device_source(&self, stream: &CudaStream) -> Option<u64> {
        let (ptr, _, contiguous) = cuda_data(self)?;
        let same = same_stream(cuda_stream_of(self)?.as_ref(), stream);
        (contiguous && same).then_some(ptr)
    }
}

/// Lets a [`Runtime`] made by [`Runtime::from_candle`] pass candle's `Device` to a body.
pub(crate) fn device_of(rt: &Runtime) -> Result<&Device, GraphError> {
    rt.candle_device().ok_or(GraphError::NoCandleDevice)
}

#[cfg_attr(docsrs, doc(cfg(feature = "candle")))]
impl Runtime {
    /// A runtime on a candle device (feature `candle`): it captures and replays on candle's
    /// own stream, so graphs run in order with candle's eager work, and a body whose context
    /// parameter is `&Device` (or `&CudaDevice`) gets this device. See the [module docs](self).
    ///
    /// `Device::new_cuda(ordinal)` uses CUDA's per-thread default stream, which captures
    /// (unlike the legacy default stream): the graphs then launch on the calling thread's
    /// default stream, as candle's own work does. A device made with
    /// `Device::new_cuda_with_stream` has event tracking on; capturing on it is refused with
    /// [`GraphError::EventTracking`] unless it was turned off before any tensor was made.
    pub fn from_candle(device: &candle_core::Device) -> Result<Self, GraphError> {
        let cuda = cuda_device(device)?;
        let stream = cuda.cuda_stream();
        if stream.cu_stream().is_null() {
            return Err(GraphError::DefaultStream);
        }
        let ctx = stream.context().clone();
        let candle = CandleFramework {
            device: device.clone(),
        };
        Self::assemble_with(ctx, stream, None, Some(Arc::new(candle)))
    }

    /// The candle device of a runtime made by [`Runtime::from_candle`].
    pub fn candle_device(&self) -> Option<&Device> {
        let framework: &dyn Any = self.framework()?;
        framework
            .downcast_ref::<CandleFramework>()
            .map(|c| &c.device)
    }
}

// candle's `Tensor` is a static buffer and an input source of the runtime's own (see
// `crate::buffer::sealed`).
impl crate::buffer::sealed::Sealed for Tensor {}
impl crate::buffer::sealed::SealedSource for Tensor {}

/// candle as the framework of the runtimes [`Runtime::from_candle`] makes.
struct CandleFramework {
    device: Device,
}

impl Framework for CandleFramework {
    fn errors(&self) -> (&'static str, FrameworkErrors) {
        ("candle", error::convert)
    }

    /// candle's upload cache (see the module docs), held while the warmup and the capture run.
    fn hold_during_capture(&self) -> Box<dyn Any> {
        match &self.device {
            Device::Cuda(cuda) => Box::new(cuda.enable_cuda_graph_htod_cache()),
            _ => Box::new(()),
        }
    }

    /// In a capture, CUDA's invalid-value error is what freeing a tensor made before the
    /// capture gives (candle frees op outputs as they drop): name that cause.
    fn explain_capture_error(&self, graph: &'static str, e: GraphError) -> GraphError {
        let code = match &e {
            GraphError::Driver(d) => Some(d.0),
            GraphError::Body { source, .. } => match &**source {
                GraphError::Driver(d) => Some(d.0),
                _ => None,
            },
            _ => None,
        };
        match code {
            Some(cudarc::driver::sys::CUresult::CUDA_ERROR_INVALID_VALUE) => {
                GraphError::FreedInCapture { graph }
            }
            _ => e,
        }
    }
}

/// The CUDA device of a candle `Device`, or the error that says it is not one.
pub(crate) fn cuda_device(device: &Device) -> Result<&CudaDevice, GraphError> {
    match device {
        Device::Cuda(d) => Ok(d),
        other => Err(GraphError::User(
            format!(
                "a graph runs on a CUDA device, and this candle device is {:?}: create it with \
                 `Device::new_cuda(ordinal)`",
                other.location()
            )
            .into(),
        )),
    }
}

/// candle's device as a body's context: the device of a runtime made by
/// [`Runtime::from_candle`].
/// A [`GraphError`] as candle's error, so that a candle body can use `?` on the library's
/// calls (an eager island's among them); `graph_runtime` unwraps it again, typed, when the
/// body returns it (under any context or backtrace candle adds). It travels in candle's
/// `Error::Cuda`, the variant that keeps an error's type; its text is the `GraphError`'s.
impl From<GraphError> for candle_core::Error {
    fn from(e: GraphError) -> Self {
        candle_core::Error::Cuda(Box::new(e))
    }
}

impl FromRuntime for Device {
    /// # Panics
    /// On a runtime not made by [`Runtime::from_candle`]; the generated code calls
    /// [`FromRuntime::try_from_runtime`], which returns [`GraphError::NoCandleDevice`] instead.
    fn from_runtime(rt: &Runtime) -> &Self {
        Self::try_from_runtime(rt).expect("the runtime was not made by Runtime::from_candle")
    }

    fn try_from_runtime(rt: &Runtime) -> Result<&Self, GraphError> {
        device_of(rt)
    }
}

/// candle's CUDA device as a body's context (see the `Device` implementation).
impl FromRuntime for CudaDevice {
    /// # Panics
    /// As for candle's `Device`.
    fn from_runtime(rt: &Runtime) -> &Self {
        Self::try_from_runtime(rt).expect("the runtime was not made by Runtime::from_candle")
    }

    fn try_from_runtime(rt: &Runtime) -> Result<&Self, GraphError> {
        cuda_device(device_of(rt)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cudarc::driver::sys::CUresult;
    use cudarc::driver::DriverError;

    #[test]
    fn shapes_compare_dtype_and_dims() {
        let a = TensorShape::new(DType::F32, &[1, 512]).unwrap();
        assert_eq!(a.dims(), &[1, 512]);
        assert_eq!(format!("{a:?}"), "F32[1, 512]");
        assert_ne!(a, TensorShape::new(DType::F16, &[1, 512]).unwrap());
        assert_ne!(a, TensorShape::new(DType::F32, &[512]).unwrap());
        assert!(TensorShape::new(DType::F32, &[1; MAX_RANK + 1]).is_none());
        assert_eq!(Tensor::bytes_for(a), 2048);
    }

    #[test]
    fn host_tensors_hold_no_device_memory() {
        let t = Tensor::zeros((2, 3), DType::F32, &Device::Cpu).unwrap();
        assert_eq!(
            TensorShape::of(&t),
            TensorShape::new(DType::F32, &[2, 3]).unwrap()
        );
        let mut n = 0;
        t.regions(&mut |_| n += 1);
        assert_eq!(n, 0);
        assert!(cuda_data(&t).is_none());
        assert!(cuda_device(&Device::Cpu).is_err());
    }

    #[test]
    fn candles_registered_conversion_takes_candle_errors_and_passes_others_on() {
        let (name, convert) = CandleFramework {
            device: Device::Cpu,
        }
        .errors();
        assert_eq!(name, "candle");
        let msg: crate::error::BoxError = Box::new(candle_core::Error::Msg("bad shape".into()));
        let typed = convert(msg).expect("a candle error is candle's");
        assert!(matches!(typed, GraphError::User(_)) && typed.to_string().contains("bad shape"));
        let other: crate::error::BoxError = Box::new(std::fmt::Error);
        assert!(convert(other).is_err(), "not candle's: handed back");
    }

    #[test]
    fn candle_errors_carrying_cuda_errors_are_typed() {
        let capture = DriverError(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        let e = candle_core::Error::Cuda(Box::new(candle_core::cuda_backend::CudaError::Cuda(
            capture,
        )))
        .bt();
        let typed = error::from_candle(e);
        assert!(matches!(typed, GraphError::Driver(_)), "{typed:?}");
        assert!(matches!(
            GraphError::in_capture("f", typed),
            GraphError::CaptureUnsupported { graph: "f" }
        ));
        let plain = error::from_candle(candle_core::Error::Msg("shape mismatch".into()));
        assert!(matches!(plain, GraphError::User(_)));
        assert!(plain.to_string().contains("shape mismatch"));
    }
}
