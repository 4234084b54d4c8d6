//! graph-runtime beside candle-core's `cuda` feature in one binary: cudarc links the CUDA
//! libraries dynamically (candle's choice) and graph-runtime does not object. Without a GPU it
//! says so and exits 0.

fn main() {
    match candle_core::Device::new_cuda(0) {
        Err(e) => {
            let why = e.to_string();
            let why = why.lines().next().unwrap_or_default();
            println!("beside-candle: built; no usable GPU here ({why})");
        }
        Ok(device) => {
            let cuda = device.as_cuda_device().expect("a CUDA device");
            let rt = graph_runtime::Runtime::from_stream(cuda.cuda_stream());
            println!("beside-candle: runtime on candle's stream: {}", rt.is_ok());
        }
    }
}
