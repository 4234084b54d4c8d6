// cuBLAS through the runtime's handle, which is bound to the capture stream.
// Look-alikes of: cublas-handle-in-body
use graph_runtime::cudarc::cublas::{sys::cublasOperation_t, Gemm, GemmConfig};
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};

#[cuda_graph(warmup = 3)]
fn linear(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] w: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    #[constant] dims: (usize, usize, usize),
) -> Result<(), GraphError> {
    let (batch, inp, out) = dims;
    let cfg = GemmConfig {
        transa: cublasOperation_t::CUBLAS_OP_T,
        transb: cublasOperation_t::CUBLAS_OP_N,
        m: out as i32,
        n: batch as i32,
        k: inp as i32,
        alpha: 1.0f32,
        lda: inp as i32,
        ldb: inp as i32,
        beta: 0.0f32,
        ldc: out as i32,
    };
    // SAFETY: the dimensions match the buffers: x is batch·inp, w is out·inp, y is batch·out.
    unsafe { rt.blas().gemm(cfg, w, x, y) }?;
    Ok(())
}

#[allow(dead_code)]
fn use_it(rt: &Runtime, x: &CudaSlice<f32>, w: &CudaSlice<f32>) -> Result<(), GraphError> {
    let mut graph = LinearGraph::capture(rt, x, w, 8 * 128, (8, 256, 128))?;
    let _ = graph.replay(x)?;
    Ok(())
}

fn main() {}
