//! graph-runtime's `nccl` beside cudarc's own `nccl`: one set of cudarc NCCL bindings, used
//! by both. Without a GPU it says so and exits 0.

fn main() {
    // Both crates name the same cudarc NCCL types: the library's minimum version and
    // cudarc's result type come from one build of cudarc.
    let min = graph_runtime::nccl::MIN_NCCL;
    let ok: cudarc::nccl::sys::ncclResult_t = cudarc::nccl::sys::ncclResult_t::ncclSuccess;
    println!("beside-nccl: built; graph-runtime needs NCCL {min} or newer ({ok:?})");
    if !graph_runtime::driver_available() {
        println!("beside-nccl: no CUDA driver here, nothing to run");
    }
}
