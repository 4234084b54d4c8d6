//! GPU operations the tests and examples compose, each a safe function over cudarc buffers
//! that checks what its kernel or library call will address and then issues it on the
//! runtime's stream (so a `#[cuda_graph]` body can call it).
//!
//! * [`blas`]: row-major matrix products on cuBLAS;
//! * [`elementwise`]: bias + GELU, bias + residual, and a fill by position (the MLP and
//!   tensor-parallel examples);
//! * [`linear`]: the fused `linear_bias_gelu` kernel, launched in order or early;
//! * [`lt`]: a linear layer with bias and GELU as one FP32 cuBLASLt call;
//! * [`train`]: the non-GEMM kernels of a training step, one GPU or data-parallel.
//!
//! The launchers of this crate's own kernels (element-wise, training, and the decode step of
//! [`crate::decode`]) build their launches with one crate-private builder, `Launch`: it checks
//! each buffer against what the kernel addresses as the buffer is pushed, so each launcher is
//! its kernel's parameter list and one `SAFETY` comment, its kernel's contract.

use graph_runtime::cudarc::driver::sys::CUdeviceptr;
use graph_runtime::cudarc::driver::{
    CudaFunction, CudaStream, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg, SyncOnDrop,
};
use graph_runtime::{Condition, ConditionArg, GraphError, Runtime};

pub mod blas;
pub mod elementwise;
pub mod linear;
pub mod lt;
pub mod train;

/// One thread per element, blocks of 256 (cudarc's `for_num_elems`).
pub(crate) fn elems(n: usize) -> LaunchConfig {
    LaunchConfig::for_num_elems(u32::try_from(n).expect("more elements than one launch covers"))
}

/// `grid` blocks of `threads`.
pub(crate) fn blocks(grid: usize, threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (
            u32::try_from(grid).expect("more blocks than one launch covers"),
            1,
            1,
        ),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// A size as the kernels' `int`.
///
/// # Panics
/// Beyond `i32::MAX`.
pub(crate) fn int(v: usize) -> i32 {
    i32::try_from(v).expect("size exceeds the kernels' i32")
}

/// Asserts that a buffer holds what a kernel addresses.
///
/// # Panics
/// When `have < need`, naming `what`.
pub(crate) fn need(what: &str, have: usize, need: usize) {
    assert!(
        have >= need,
        "{what}: a buffer of {have} elements, need {need}"
    );
}

/// Most arguments of one [`Launch`] (the optimizer kernel has 14).
const MAX_ARGS: usize = 16;

/// Most buffers of one [`Launch`].
const MAX_BUFS: usize = 8;

/// A kernel argument, kept until the launch takes its address.
#[derive(Clone, Copy)]
enum Arg<'a> {
    Ptr(CUdeviceptr),
    Int(i32),
    Float(f32),
    Uint(u32),
    Condition(ConditionArg<'a>),
}

/// One launch of a kernel of this crate's sources on the runtime's stream, its arguments
/// pushed in the kernel's parameter order. Each buffer is pushed with the number of elements
/// the kernel addresses in it and checked against that number on the spot, so a launcher's
/// `SAFETY` comment states its kernel's contract in terms of those numbers.
///
/// Capturable: nothing is allocated, on the device or the host (the arguments are kept
/// inline, at most [`MAX_ARGS`] of them and [`MAX_BUFS`] buffers).
pub(crate) struct Launch<'a> {
    kernel: &'a str,
    stream: &'a CudaStream,
    func: CudaFunction,
    args: [Arg<'a>; MAX_ARGS],
    nargs: usize,
    /// The buffers' event bookkeeping (cudarc's multi-stream tracking): dropped only after
    /// the launch is queued, as [`DevicePtr::device_ptr`] asks.
    syncs: [Option<SyncOnDrop<'a>>; MAX_BUFS],
    nbufs: usize,
}

impl<'a> Launch<'a> {
    /// A launch of `kernel` of `source` (compiled once per process by the runtime).
    pub(crate) fn new(rt: &'a Runtime, source: &str, kernel: &'a str) -> Result<Self, GraphError> {
        Ok(Self::of(rt, &rt.function(source, kernel)?, kernel))
    }

    /// A launch of `func`, a kernel already looked up (named `kernel` in messages).
    pub(crate) fn of(rt: &'a Runtime, func: &CudaFunction, kernel: &'a str) -> Self {
        Launch {
            kernel,
            stream: rt.stream(),
            func: func.clone(),
            args: [Arg::Int(0); MAX_ARGS],
            nargs: 0,
            syncs: [const { None }; MAX_BUFS],
            nbufs: 0,
        }
    }

    fn push(&mut self, arg: Arg<'a>) {
        assert!(
            self.nargs < MAX_ARGS,
            "{}: a launch takes at most {MAX_ARGS} arguments",
            self.kernel
        );
        self.args[self.nargs] = arg;
        self.nargs += 1;
    }

    fn push_buf(&mut self, ptr: CUdeviceptr, sync: SyncOnDrop<'a>) {
        assert!(
            self.nbufs < MAX_BUFS,
            "{}: a launch takes at most {MAX_BUFS} buffers",
            self.kernel
        );
        self.syncs[self.nbufs] = Some(sync);
        self.nbufs += 1;
        self.push(Arg::Ptr(ptr));
    }

    /// A buffer the kernel reads (`const T *`), of which it addresses `len` elements.
    ///
    /// # Panics
    /// When the buffer holds fewer, naming the kernel and `what`.
    pub(crate) fn read<T>(mut self, what: &str, buf: &'a impl DevicePtr<T>, len: usize) -> Self {
        self.check(what, buf.len(), len);
        let (ptr, sync) = buf.device_ptr(self.stream);
        self.push_buf(ptr, sync);
        self
    }

    /// A buffer the kernel writes (`T *`), of which it addresses `len` elements.
    ///
    /// # Panics
    /// When the buffer holds fewer, naming the kernel and `what`.
    pub(crate) fn write<T>(
        mut self,
        what: &str,
        buf: &'a mut impl DevicePtrMut<T>,
        len: usize,
    ) -> Self {
        self.check(what, buf.len(), len);
        let (ptr, sync) = buf.device_ptr_mut(self.stream);
        self.push_buf(ptr, sync);
        self
    }

    /// A size, as the kernel's `int`.
    ///
    /// # Panics
    /// Beyond `i32::MAX`.
    pub(crate) fn int(mut self, v: usize) -> Self {
        self.push(Arg::Int(int(v)));
        self
    }

    /// An `int` value.
    pub(crate) fn i32(mut self, v: i32) -> Self {
        self.push(Arg::Int(v));
        self
    }

    /// A `float`.
    pub(crate) fn float(mut self, v: f32) -> Self {
        self.push(Arg::Float(v));
        self
    }

    /// An `unsigned int`.
    pub(crate) fn uint(mut self, v: u32) -> Self {
        self.push(Arg::Uint(v));
        self
    }

    /// A `graph_while` / `graph_if` condition the kernel sets (`GraphCondition`).
    pub(crate) fn condition(mut self, rt: &Runtime, go: &'a Condition) -> Self {
        self.push(Arg::Condition(go.kernel_arg(rt)));
        self
    }

    fn check(&self, what: &str, have: usize, len: usize) {
        if have < len {
            need(&format!("{} {what}", self.kernel), have, len);
        }
    }

    /// Queues the kernel with `cfg`.
    ///
    /// # Safety
    /// The pushed arguments are the kernel's parameters in number, order and type, and for
    /// `cfg` the kernel addresses no more of each buffer than the length it was pushed with.
    pub(crate) unsafe fn launch(self, cfg: LaunchConfig) -> Result<(), GraphError> {
        let mut builder = self.stream.launch_builder(&self.func);
        for arg in &self.args[..self.nargs] {
            match arg {
                Arg::Ptr(p) => builder.arg(p),
                Arg::Int(v) => builder.arg(v),
                Arg::Float(v) => builder.arg(v),
                Arg::Uint(v) => builder.arg(v),
                Arg::Condition(v) => builder.arg(v),
            };
        }
        // SAFETY: the caller's contract above; every argument lives in `self.args` until the
        // call returns.
        unsafe { builder.launch(cfg) }?;
        // `self.syncs` drops here, after the launch is queued.
        Ok(())
    }
}

/// `kernel` of `source`, a kernel `(x, bias, y, rows, cols)` with one thread per element of
/// `[rows, cols]` matrices that reads `x[r, c]` and `bias[c]` and writes `y[r, c]`
/// (`bias_add`, `bias_gelu`).
pub(crate) fn row_bias_kernel(
    rt: &Runtime,
    (source, kernel): (&str, &str),
    x: &impl DevicePtr<f32>,
    bias: &impl DevicePtr<f32>,
    y: &mut impl DevicePtrMut<f32>,
    rows: usize,
    cols: usize,
) -> Result<(), GraphError> {
    let n = rows * cols;
    let launch = Launch::new(rt, source, kernel)?
        .read("x", x, n)
        .read("bias", bias, cols)
        .write("y", y, n)
        .int(rows)
        .int(cols);
    // SAFETY: the kernel's contract (above): one thread per element reads rows · cols of `x`
    // and cols of `bias` and writes rows · cols of `y`.
    unsafe { launch.launch(elems(n)) }
}
