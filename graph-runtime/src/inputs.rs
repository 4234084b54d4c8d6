//! New inputs without a copy launch: each static input is filled by a copy kernel that is
//! the graph's own first node, and a replay only points that node at the new data.
//!
//! Giving a graph new input data used to cost a `cuMemcpyDtoDAsync` per input before the
//! launch: about 5.5 µs of host time on an H100, where the launch itself costs 2.2 µs. Measured
//! alternatives, host µs per replay of a 10-node graph with one 1 KiB input (H100, driver 580):
//!
//! | how the input gets in | host µs |
//! | --- | ---: |
//! | launch only (input written beforehand) | 2.19 |
//! | `cuMemcpyDtoDAsync`, then launch | 7.70 |
//! | a memcpy node in the graph, its source updated (`cuGraphExecMemcpyNodeSetParams`), launch | 3.48 |
//! | a copy kernel node in the graph, its source argument updated (`cuGraphExecKernelNodeSetParams`), launch | **2.54** |
//! | a pinned host buffer written by the CPU, copied by a node in the graph | 4.02 |
//! | pageable host data, `cuMemcpyHtoDAsync`, then launch | 5.34 |
//!
//! So every input gets a copy kernel node, recorded at the start of the capture. A replay
//! whose input is a device buffer on the runtime's stream sets the node's source argument to
//! that buffer (one driver call, no copy launch); the graph copies it into the static buffer
//! as its first step, in stream order. Any other source (host data, a buffer of another
//! stream) is copied into the static buffer before the launch as before, and the node is set
//! to copy nothing. Updating a node affects only later launches, so a replay still queued
//! keeps reading the buffer it was given; that buffer is freed, if at all, on the same stream
//! after the graph has read it.

use std::cell::Cell;

use cudarc::driver::{sys, CudaFunction, LaunchConfig, PushKernelArg};

use crate::error::GraphError;
use crate::runtime::Runtime;

/// The copy kernel: `bytes` bytes from `src` to `dst`, 16 at a time where both are aligned;
/// `bytes == 0` copies nothing.
pub(crate) const INPUT_COPY: &str = r#"
extern "C" __global__ void graph_input_copy(const unsigned char *src, unsigned char *dst,
                                            unsigned long long bytes) {
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    unsigned long long t = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if ((((unsigned long long)src | (unsigned long long)dst) & 15ull) == 0ull) {
        unsigned long long words = bytes / 16ull;
        for (unsigned long long i = t; i < words; i += stride)
            ((uint4 *)dst)[i] = ((const uint4 *)src)[i];
        for (unsigned long long i = words * 16ull + t; i < bytes; i += stride) dst[i] = src[i];
    } else {
        for (unsigned long long i = t; i < bytes; i += stride) dst[i] = src[i];
    }
}
"#;

const THREADS: u32 = 256;

/// The static inputs of a graph about to be captured: where each lives and how big it is.
#[doc(hidden)]
#[derive(Debug, Default)]
pub struct InputNodes {
    inputs: Vec<(u64, usize)>,
}

impl InputNodes {
    /// No inputs yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers the device range (address, bytes) of the next input, in parameter order
    /// (`InputNodes::add` in `buffer.rs` takes the static buffer itself).
    pub(crate) fn push_range(&mut self, range: (u64, usize)) {
        self.inputs.push(range);
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.inputs.is_empty()
    }

    /// How many inputs (and so copy nodes ahead of the body) there are.
    pub(crate) fn len(&self) -> usize {
        self.inputs.len()
    }

    /// Compiles and loads the copy kernel (before the capture: a capture only looks it up).
    pub(crate) fn prepare(&self, rt: &Runtime) -> Result<Option<CudaFunction>, GraphError> {
        if self.is_empty() {
            return Ok(None);
        }
        Ok(Some(rt.library_function(INPUT_COPY, "graph_input_copy")?))
    }

    /// Launches one copy kernel per input on the capturing stream, copying nothing, and
    /// returns the node each became.
    pub(crate) fn record(
        &self,
        rt: &Runtime,
        copy: &CudaFunction,
    ) -> Result<Vec<InputNode>, GraphError> {
        let stream = rt.stream();
        let cap = u64::from(rt.multiprocessors().max(1)) * 4;
        self.inputs
            .iter()
            .map(|&(dst, bytes)| {
                let blocks = (bytes as u64)
                    .div_ceil(16 * u64::from(THREADS))
                    .clamp(1, cap) as u32;
                let cfg = LaunchConfig {
                    grid_dim: (blocks, 1, 1),
                    block_dim: (THREADS, 1, 1),
                    shared_mem_bytes: 0,
                };
                let zero = 0u64;
                // SAFETY: the kernel copies `zero` bytes (nothing); its pointers are the static
                // buffer, which the graph owns for as long as it can be launched.
                unsafe {
                    stream
                        .launch_builder(copy)
                        .arg(&dst)
                        .arg(&dst)
                        .arg(&zero)
                        .launch(cfg)
                }?;
                // SAFETY: the stream is capturing on this thread; the node just added is its
                // only dependency.
                let node = unsafe { crate::driver::last_captured_node(stream.cu_stream()) }?;
                Ok(InputNode::new(node, copy, cfg, dst, bytes))
            })
            .collect()
    }
}

/// The kernel argument values of an input's copy node, at a fixed address (the node's
/// parameters point at them while they are updated).
#[derive(Debug)]
struct Args {
    src: Cell<u64>,
    dst: Cell<u64>,
    bytes: Cell<u64>,
}

/// One input's copy node in an instantiated graph, and what it currently copies.
#[derive(Debug)]
pub(crate) struct InputNode {
    node: sys::CUgraphNode,
    func: sys::CUfunction,
    cfg: LaunchConfig,
    args: Box<Args>,
    bytes: usize,
    /// The source the executable graph copies from now; 0 while it copies nothing.
    current: Cell<u64>,
}

impl InputNode {
    fn new(
        node: sys::CUgraphNode,
        copy: &CudaFunction,
        cfg: LaunchConfig,
        dst: u64,
        bytes: usize,
    ) -> Self {
        InputNode {
            node,
            func: copy.cu_function(),
            cfg,
            args: Box::new(Args {
                src: Cell::new(dst),
                dst: Cell::new(dst),
                bytes: Cell::new(0),
            }),
            bytes,
            current: Cell::new(0),
        }
    }

    /// The node in the recorded graph.
    pub(crate) fn node(&self) -> sys::CUgraphNode {
        self.node
    }

    /// The static buffer the node copies into (address, bytes).
    pub(crate) fn destination(&self) -> (u64, u64) {
        (self.args.dst.get(), self.bytes as u64)
    }

    /// Points the node of `exec` at `src` (a device buffer of the input's size), or at
    /// nothing (`None`). A driver call only when it changes; allocates nothing.
    ///
    /// # Safety
    /// `exec` is the live executable graph instantiated from the graph this node belongs to;
    /// `src`, when given, holds the input's bytes and stays allocated until the next launch of
    /// `exec` on the runtime's stream has read it (a buffer of that stream is freed after it).
    pub(crate) unsafe fn point_at(
        &self,
        exec: sys::CUgraphExec,
        src: Option<u64>,
    ) -> Result<(), GraphError> {
        let want = src.unwrap_or(0);
        if self.current.get() == want {
            return Ok(());
        }
        let args = &self.args;
        args.src.set(if want == 0 { args.dst.get() } else { want });
        args.bytes
            .set(if want == 0 { 0 } else { self.bytes as u64 });
        let mut values: [*mut std::ffi::c_void; 3] = [
            args.src.as_ptr().cast(),
            args.dst.as_ptr().cast(),
            args.bytes.as_ptr().cast(),
        ];
        // SAFETY: `exec` and the node are live (caller); the parameters name the node's own
        // function and launch configuration and hold one pointer per kernel argument.
        unsafe {
            crate::driver::set_kernel_node_args(exec, self.node, self.func, self.cfg, &mut values)
        }?;
        self.current.set(want);
        Ok(())
    }
}
