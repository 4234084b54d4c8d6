//! graph-runtime beside cudarc with cubecl-cuda's features: both name the same cudarc, so a
//! stream of one is a stream of the other. Without a GPU it says so and exits 0.

fn main() {
    if !graph_runtime::driver_available() {
        println!("beside-cubecl: built; no CUDA driver here, nothing to run");
        return;
    }
    let ctx = cudarc::driver::CudaContext::new(0).expect("device 0");
    // SAFETY: nothing has been allocated on this context yet, and all work below runs on
    // the one stream the runtime creates.
    unsafe { ctx.disable_event_tracking() };
    let rt = graph_runtime::Runtime::from_context(ctx).expect("runtime on the context");
    println!("beside-cubecl: runtime on {:?}", rt.compute_capability());
}
