//! Static buffers: the device memory a graph owns for its inputs and outputs, the sources a
//! replay can copy inputs from, and the stream and events those copies are queued with.
//!
//! A captured graph has device addresses baked into its kernels. Its inputs therefore live
//! in buffers the graph owns, allocated once at capture, and each replay copies new values
//! into them (PyTorch's `static_input.copy_(x)`); its outputs live in buffers the graph owns
//! and hands out as borrows. Nothing outside the graph type ever holds a static buffer
//! itself: inputs are lent as views that can be written into but not replaced
//! ([`DeviceState::Lent`]), outputs as shared borrows.

use std::sync::Arc;

use cudarc::driver::{
    sys, CudaEvent, CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DeviceRepr,
    DeviceSlice, ValidAsZeroBits,
};

use crate::error::GraphError;
use crate::inputs::{InputNode, InputNodes};
use crate::runtime::Runtime;
use crate::site::GraphSite;
use crate::state::DeviceState;

/// A device buffer type a graph can own as a static input or output.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a static input or output of a CUDA graph",
    label = "a `#[cuda_graph]` input (`&T`) or output (`&mut T`) must be a device buffer such as `CudaSlice<f32>`",
    note = "mark read-only device data the graph reads in place with `#[state]`, and host values fixed at capture with `#[constant]`"
)]
pub trait StaticBuffer: DeviceState + Sized + sealed::Sealed {
    /// What fixes the buffer's size (`usize` elements for a `CudaSlice`).
    type Shape: Copy + PartialEq + std::fmt::Debug;

    /// This buffer's shape.
    fn shape(&self) -> Self::Shape;

    /// Allocates a zero-filled buffer of `shape` on the runtime's stream.
    fn alloc_static(rt: &Runtime, shape: Self::Shape) -> Result<Self, GraphError>;

    /// Bytes of device memory a buffer of `shape` takes.
    fn bytes_for(shape: Self::Shape) -> usize;

    /// Where the buffer's device memory starts and how many bytes it spans.
    #[doc(hidden)]
    fn device_range(&self) -> (sys::CUdeviceptr, usize);
}

impl<T: DeviceRepr + ValidAsZeroBits + 'static> StaticBuffer for CudaSlice<T> {
    type Shape = usize;

    fn shape(&self) -> usize {
        self.len()
    }

    fn alloc_static(rt: &Runtime, len: usize) -> Result<Self, GraphError> {
        Ok(rt.stream().alloc_zeros::<T>(len)?)
    }

    fn bytes_for(len: usize) -> usize {
        len.saturating_mul(std::mem::size_of::<T>())
    }

    fn device_range(&self) -> (sys::CUdeviceptr, usize) {
        let (ptr, _sync) = self.device_ptr(self.stream());
        (ptr, self.num_bytes())
    }
}

impl InputNodes {
    /// Registers the static buffer of the next input, in parameter order. (It lives here,
    /// with the buffers, so that the input nodes need not know the buffer types.)
    pub fn add<B: StaticBuffer>(&mut self, buffer: &B) {
        self.push_range(buffer.device_range());
    }
}

/// Only the runtime's own buffer types are static buffers: a graph lends its inputs as their
/// `DeviceState::Lent` views and never checks their addresses again, which is sound only
/// for types whose views cannot replace them. A framework's module adds its own (candle's
/// `Tensor`).
pub(crate) mod sealed {
    pub trait Sealed {}
    impl<T> Sealed for cudarc::driver::CudaSlice<T> {}

    /// Only the runtime's own input sources: a replay may point a graph's copy node at a
    /// source's device memory, which is sound only for types that report it truthfully.
    pub trait SealedSource {}
    impl<T> SealedSource for cudarc::driver::CudaSlice<T> {}
    impl<T> SealedSource for cudarc::driver::CudaView<'_, T> {}
    impl<T> SealedSource for [T] {}
    impl<T> SealedSource for Vec<T> {}
    impl<T, const N: usize> SealedSource for [T; N] {}
}

/// A static buffer that can hold what a body returns (`-> Result<Tensor>`): the returned value
/// is copied into the graph's own buffer inside the graph, then dropped.
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "a `#[cuda_graph]` function cannot return the host value `{Self}`: a replay would not compute it again",
    label = "the body's result must be device data the graph copies into its own buffer",
    note = "return a device buffer (`Result<CudaSlice<T>, E>`, or a candle `Tensor` with feature `candle`), or write the value into a `&mut CudaSlice<T>` output parameter and return `Result<(), E>`",
    note = "read the value on the host after `replay`, from the graph's output"
)]
pub trait ResultBuffer: StaticBuffer {
    /// Copies `value` (same shape) into `self`, on the runtime's stream.
    fn store(&mut self, value: &Self) -> Result<(), GraphError>;
}

impl<T: DeviceRepr + ValidAsZeroBits + 'static> ResultBuffer for CudaSlice<T> {
    fn store(&mut self, value: &Self) -> Result<(), GraphError> {
        let stream = self.stream().clone();
        stream.memcpy_dtod(value, self)?;
        Ok(())
    }
}

/// Copies a body's returned value into the graph's static result: allocated on the first
/// (warmup) run, shaped like that run's value; every later run must return that shape.
#[doc(hidden)]
pub fn store_result<B: ResultBuffer>(
    rt: &Runtime,
    site: &'static GraphSite,
    slot: &mut Option<B>,
    value: &B,
) -> Result<(), GraphError> {
    let shape = value.shape();
    let dst = match slot {
        Some(dst) => {
            let expected = dst.shape();
            if expected != shape {
                return Err(GraphError::ResultShape {
                    graph: site.name,
                    expected: format!("{expected:?}"),
                    got: format!("{shape:?}"),
                });
            }
            dst
        }
        None => slot.insert(alloc_static::<B>(rt, site, "result", shape)?),
    };
    dst.store(value)
}

/// A copy of a body's returned value in a buffer of its own (for `verify`'s eager run).
#[doc(hidden)]
pub fn copy_result<B: ResultBuffer>(
    rt: &Runtime,
    site: &'static GraphSite,
    value: &B,
) -> Result<B, GraphError> {
    let mut slot = None;
    store_result(rt, site, &mut slot, value)?;
    Ok(slot.expect("store_result fills an empty slot"))
}

/// What an input copy needs during a replay: the graph's stream, two events to order a
/// source that lives on another stream, and the graph's input copy nodes.
pub struct Staging<'g> {
    stream: &'g Arc<CudaStream>,
    before: &'g CudaEvent,
    after: &'g CudaEvent,
    exec: sys::CUgraphExec,
    inputs: &'g [InputNode],
}

impl std::fmt::Debug for Staging<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Staging")
            .field("input_nodes", &self.inputs.len())
            .finish_non_exhaustive()
    }
}

impl<'g> Staging<'g> {
    pub(crate) fn new(
        stream: &'g Arc<CudaStream>,
        before: &'g CudaEvent,
        after: &'g CudaEvent,
    ) -> Self {
        Staging {
            stream,
            before,
            after,
            exec: std::ptr::null_mut(),
            inputs: &[],
        }
    }

    /// Staging for a replay of `exec`, whose inputs are copied by `inputs`.
    pub(crate) fn with_inputs(mut self, exec: sys::CUgraphExec, inputs: &'g [InputNode]) -> Self {
        self.exec = exec;
        self.inputs = inputs;
        self
    }

    /// Sets every input copy node to copy nothing: the static buffers already hold the
    /// inputs (a `launch` after writing them in place).
    pub(crate) fn keep_inputs(&self) -> Result<(), GraphError> {
        for node in self.inputs {
            // SAFETY: `exec` is the live executable graph the nodes belong to (`with_inputs`).
            unsafe { node.point_at(self.exec, None) }?;
        }
        Ok(())
    }

    /// The stream the copies and the launch are queued on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        self.stream
    }

    /// Makes the graph's stream wait for the work queued so far on `other`.
    pub fn wait_for(&self, other: &CudaStream) -> Result<(), GraphError> {
        if !same_stream(other, self.stream) {
            self.before.record(other)?;
            self.stream.wait(self.before)?;
        }
        Ok(())
    }

    /// Makes `other` wait for the work queued so far on the graph's stream, so that a source
    /// freed on `other` is not freed before the copy has read it.
    pub fn release_to(&self, other: &CudaStream) -> Result<(), GraphError> {
        if !same_stream(other, self.stream) {
            self.after.record(self.stream)?;
            other.wait(self.after)?;
        }
        Ok(())
    }
}

/// Whether `a` and `b` are one stream. The handle alone does not say so: CUDA's per-thread
/// default stream (what candle's `Device::new_cuda` uses) has the same handle in every
/// context, so a buffer of another GPU would pass for one of the graph's stream.
pub(crate) fn same_stream(a: &CudaStream, b: &CudaStream) -> bool {
    a.cu_stream() == b.cu_stream() && a.context().cu_ctx() == b.context().cu_ctx()
}

/// Something a replay can copy into the static buffer `B`: a device buffer, a view of one,
/// or host memory. The copy writes into a view of the static buffer (`CudaViewMut` for a
/// `CudaSlice`), which it cannot replace.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be copied into a graph input of type `{B}`",
    label = "pass a device buffer (`CudaSlice`, `CudaView`) or host data (`[T]`, `Vec<T>`) of the input's element type"
)]
pub trait InputSource<B: StaticBuffer>: sealed::SealedSource {
    /// The source's shape, compared with the static buffer's before anything is copied.
    fn shape(&self) -> B::Shape;

    /// Queues the copy of `self` into `dst` on the staging stream.
    fn copy_into(&self, dst: B::Lent<'_>, staging: &Staging<'_>) -> Result<(), GraphError>;

    /// The device address of the source's bytes when the graph can copy them itself: a
    /// device buffer of `stream` (its frees are ordered after the graph on that stream).
    fn device_source(&self, stream: &CudaStream) -> Option<u64> {
        let _ = stream;
        None
    }
}

/// A whole buffer is copied as its view (the same address, length, stream and events).
impl<T: DeviceRepr + ValidAsZeroBits + 'static> InputSource<CudaSlice<T>> for CudaSlice<T> {
    fn shape(&self) -> usize {
        self.len()
    }

    fn device_source(&self, stream: &CudaStream) -> Option<u64> {
        self.as_view().device_source(stream)
    }

    fn copy_into(&self, dst: CudaViewMut<'_, T>, staging: &Staging<'_>) -> Result<(), GraphError> {
        self.as_view().copy_into(dst, staging)
    }
}

impl<T: DeviceRepr + ValidAsZeroBits + 'static> InputSource<CudaSlice<T>> for CudaView<'_, T> {
    fn shape(&self) -> usize {
        self.len()
    }

    fn device_source(&self, stream: &CudaStream) -> Option<u64> {
        same_stream(self.stream(), stream).then(|| self.device_ptr(stream).0)
    }

    fn copy_into(
        &self,
        mut dst: CudaViewMut<'_, T>,
        staging: &Staging<'_>,
    ) -> Result<(), GraphError> {
        staging.wait_for(self.stream())?;
        staging.stream().memcpy_dtod(self, &mut dst)?;
        staging.release_to(self.stream())
    }
}

impl<T: DeviceRepr + ValidAsZeroBits + 'static> InputSource<CudaSlice<T>> for [T] {
    fn shape(&self) -> usize {
        self.len()
    }

    fn copy_into(
        &self,
        mut dst: CudaViewMut<'_, T>,
        staging: &Staging<'_>,
    ) -> Result<(), GraphError> {
        // Pageable host memory: the driver stages the bytes before returning, so `self` may
        // be reused as soon as this returns.
        staging.stream().memcpy_htod(self, &mut dst)?;
        Ok(())
    }
}

impl<T: DeviceRepr + ValidAsZeroBits + 'static> InputSource<CudaSlice<T>> for Vec<T> {
    fn shape(&self) -> usize {
        self.len()
    }

    fn copy_into(&self, dst: CudaViewMut<'_, T>, staging: &Staging<'_>) -> Result<(), GraphError> {
        self.as_slice().copy_into(dst, staging)
    }
}

impl<T: DeviceRepr + ValidAsZeroBits + 'static, const N: usize> InputSource<CudaSlice<T>>
    for [T; N]
{
    fn shape(&self) -> usize {
        N
    }

    fn copy_into(&self, dst: CudaViewMut<'_, T>, staging: &Staging<'_>) -> Result<(), GraphError> {
        self.as_slice().copy_into(dst, staging)
    }
}

/// Gives input `index` of a replay its new value: the graph's copy node is pointed at a
/// device source of the graph's stream (no copy launch); any other source is copied into the
/// static buffer now and the node copies nothing.
#[doc(hidden)]
#[inline]
pub fn feed_input<B: StaticBuffer, S: InputSource<B> + ?Sized>(
    staging: &Staging<'_>,
    index: usize,
    src: &S,
    dst: B::Lent<'_>,
) -> Result<(), GraphError> {
    let node = staging.inputs.get(index);
    if let (Some(node), Some(ptr)) = (node, src.device_source(staging.stream)) {
        // SAFETY: `exec` is the live executable graph of the node; `ptr` holds the input's
        // bytes (the shapes were compared) and is a buffer of the graph's stream, so it is
        // freed, if at all, after the launch that follows has read it.
        return unsafe { node.point_at(staging.exec, Some(ptr)) };
    }
    src.copy_into(dst, staging)?;
    match node {
        // SAFETY: as above; the node now copies nothing.
        Some(node) => unsafe { node.point_at(staging.exec, None) },
        None => Ok(()),
    }
}

/// Compares a replay input's shape with its static buffer's before anything is queued,
/// naming the input on mismatch.
#[doc(hidden)]
#[inline]
pub fn check_shape<B: StaticBuffer, S: InputSource<B> + ?Sized>(
    site: &'static GraphSite,
    input: &'static str,
    dst: &B,
    src: &S,
) -> Result<(), GraphError> {
    let (expected, got) = (dst.shape(), src.shape());
    if expected == got {
        Ok(())
    } else {
        Err(GraphError::InputShape {
            graph: site.name,
            input,
            expected: format!("{expected:?}"),
            got: format!("{got:?}"),
        })
    }
}

/// Allocates a zeroed static buffer of `shape` for graph `site` (capture only); out of
/// memory names the graph, the buffer and its size.
#[doc(hidden)]
pub fn alloc_static<B: StaticBuffer>(
    rt: &Runtime,
    site: &'static GraphSite,
    name: &'static str,
    shape: B::Shape,
) -> Result<B, GraphError> {
    B::alloc_static(rt, shape).map_err(|e| {
        rt.oom_context(
            e,
            || format!("allocating the static buffer `{name}` of `{}`", site.name),
            Some(B::bytes_for(shape)),
        )
    })
}

/// Bytes a static buffer takes, for the graph's memory report.
#[doc(hidden)]
pub fn static_bytes<B: StaticBuffer>(b: &B) -> usize {
    B::bytes_for(b.shape())
}

/// Allocates a static buffer shaped like `src` and copies `src` into it (capture only).
#[doc(hidden)]
pub fn stage_input<B: StaticBuffer, S: InputSource<B> + ?Sized>(
    rt: &Runtime,
    site: &'static GraphSite,
    name: &'static str,
    src: &S,
) -> Result<B, GraphError> {
    let mut dst = alloc_static::<B>(rt, site, name, src.shape())?;
    let (before, after) = (rt.untimed_event()?, rt.untimed_event()?);
    src.copy_into(dst.lend(), &Staging::new(rt.stream(), &before, &after))?;
    Ok(dst)
}
