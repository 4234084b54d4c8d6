//! Static buffers: the device memory a graph owns for its inputs and outputs, and the
//! sources a replay can copy inputs from.
//!
//! A captured graph has device addresses baked into its kernels. Its inputs therefore live
//! in buffers the graph owns, allocated once at capture, and each replay copies new values
//! into them (PyTorch's `static_input.copy_(x)`); its outputs live in buffers the graph owns
//! and hands out as borrows.

use cudarc::driver::{CudaSlice, CudaView, DeviceRepr, DeviceSlice, ValidAsZeroBits};

use crate::error::GraphError;
use crate::graph::Staging;
use crate::runtime::Runtime;

/// A device buffer type a graph can own as a static input or output.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a static input or output of a CUDA graph",
    label = "a `#[cuda_graph]` input (`&T`) or output (`&mut T`) must be a device buffer such as `CudaSlice<f32>`",
    note = "mark read-only device data the graph reads in place with `#[state]`, and host values fixed at capture with `#[constant]`"
)]
pub trait StaticBuffer: Sized {
    /// What fixes the buffer's size (`usize` elements for a `CudaSlice`).
    type Shape: Copy + PartialEq + std::fmt::Debug;

    /// This buffer's shape.
    fn shape(&self) -> Self::Shape;

    /// Allocates a zero-filled buffer of `shape` on the runtime's stream.
    fn alloc_static(rt: &Runtime, shape: Self::Shape) -> Result<Self, GraphError>;

    /// Bytes of device memory a buffer of `shape` takes.
    fn bytes_for(shape: Self::Shape) -> usize;
}

impl<T: DeviceRepr + ValidAsZeroBits> StaticBuffer for CudaSlice<T> {
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
}

/// Something a replay can copy into the static buffer `B`: a device buffer, a view of one,
/// or host memory.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be copied into a graph input of type `{B}`",
    label = "pass a device buffer (`CudaSlice`, `CudaView`) or host data (`[T]`, `Vec<T>`) of the input's element type"
)]
pub trait InputSource<B: StaticBuffer> {
    /// The source's shape, compared with the static buffer's before anything is copied.
    fn shape(&self) -> B::Shape;

    /// Queues the copy of `self` into `dst` on the staging stream.
    fn copy_into(&self, dst: &mut B, staging: &Staging<'_>) -> Result<(), GraphError>;
}

impl<T: DeviceRepr + ValidAsZeroBits> InputSource<CudaSlice<T>> for CudaSlice<T> {
    fn shape(&self) -> usize {
        self.len()
    }

    fn copy_into(&self, dst: &mut CudaSlice<T>, staging: &Staging<'_>) -> Result<(), GraphError> {
        staging.wait_for(self.stream())?;
        staging.stream().memcpy_dtod(self, dst)?;
        staging.release_to(self.stream())
    }
}

impl<T: DeviceRepr + ValidAsZeroBits> InputSource<CudaSlice<T>> for CudaView<'_, T> {
    fn shape(&self) -> usize {
        self.len()
    }

    fn copy_into(&self, dst: &mut CudaSlice<T>, staging: &Staging<'_>) -> Result<(), GraphError> {
        staging.wait_for(self.stream())?;
        staging.stream().memcpy_dtod(self, dst)?;
        staging.release_to(self.stream())
    }
}

impl<T: DeviceRepr + ValidAsZeroBits> InputSource<CudaSlice<T>> for [T] {
    fn shape(&self) -> usize {
        self.len()
    }

    fn copy_into(&self, dst: &mut CudaSlice<T>, staging: &Staging<'_>) -> Result<(), GraphError> {
        // Pageable host memory: the driver stages the bytes before returning, so `self` may
        // be reused as soon as this returns.
        staging.stream().memcpy_htod(self, dst)?;
        Ok(())
    }
}

impl<T: DeviceRepr + ValidAsZeroBits> InputSource<CudaSlice<T>> for Vec<T> {
    fn shape(&self) -> usize {
        self.len()
    }

    fn copy_into(&self, dst: &mut CudaSlice<T>, staging: &Staging<'_>) -> Result<(), GraphError> {
        self.as_slice().copy_into(dst, staging)
    }
}

impl<T: DeviceRepr + ValidAsZeroBits, const N: usize> InputSource<CudaSlice<T>> for [T; N] {
    fn shape(&self) -> usize {
        N
    }

    fn copy_into(&self, dst: &mut CudaSlice<T>, staging: &Staging<'_>) -> Result<(), GraphError> {
        self.as_slice().copy_into(dst, staging)
    }
}

/// Compares an input's shape with its static buffer's, naming the input on mismatch.
#[inline]
pub(crate) fn check_shape<B: StaticBuffer, S: InputSource<B> + ?Sized>(
    graph: &'static str,
    input: &'static str,
    dst: &B,
    src: &S,
) -> Result<(), GraphError> {
    let (expected, got) = (dst.shape(), src.shape());
    if expected == got {
        Ok(())
    } else {
        Err(GraphError::InputShape {
            graph,
            input,
            expected: format!("{expected:?}"),
            got: format!("{got:?}"),
        })
    }
}
