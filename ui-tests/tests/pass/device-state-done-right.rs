// The correct forms of what the host-state rules reject: a counter in device memory that a
// kernel advances, a host value read (not written) as read-only state, a struct of yours
// as `&mut` state, a host value read outside the body and passed as a constant, raw driver
// work on the capture stream, and methods of your own named like host reads.
// Look-alikes of: raw-sync-memory-op, host-state-mut, host-input
use graph_runtime::cudarc::driver::{sys, CudaSlice, DevicePtrMut};
use graph_runtime::{cuda_graph, DeviceState, GraphError, Runtime};

#[derive(DeviceState)]
struct Decoder {
    kv: CudaSlice<f32>,
    layers: usize,
}

struct Cache;

impl Cache {
    fn exists(&self) -> bool {
        true
    }
}

struct Timer(u64);

impl Timer {
    fn new() -> Self {
        Timer(3)
    }
    fn elapsed(&self) -> u64 {
        self.0
    }
}

#[cuda_graph(warmup = 2)]
fn step(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    #[state] steps: &mut CudaSlice<u64>,
    #[state] limit: &u64,
    #[state] dec: &mut Decoder,
    #[constant] scale: f32,
) -> Result<(), GraphError> {
    rt.stream().memcpy_dtod(x, y)?;
    rt.stream().memcpy_dtod(x, &mut dec.kv)?;
    if *limit > 0 && dec.layers > 0 && Cache.exists() && Timer::new().elapsed() > 0 && scale > 0.0 {
        rt.stream().memset_zeros(steps)?;
    }
    let n = y.len();
    let (ptr, _sync) = y.device_ptr_mut(rt.stream());
    // SAFETY: `ptr` is `y`'s live allocation of `n` floats; the stream is the capture stream.
    unsafe { sys::cuMemsetD32Async(ptr, 0, n, rt.stream().cu_stream()) }.result()?;
    Ok(())
}

fn main() {}
