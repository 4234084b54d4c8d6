//! graph-runtime beside cudarc as candle-core's `cuda` feature builds it: cudarc links the CUDA
//! libraries dynamically (candle's choice) and graph-runtime does not object. Without a GPU it
//! says so and exits 0.

fn main() {
    match cudarc::driver::CudaContext::new(0) {
        Err(e) => {
            let why = format!("{e:?}");
            println!("beside-candle: built; no usable GPU here ({why})");
        }
        Ok(ctx) => {
            let rt = graph_runtime::Runtime::from_stream(ctx.default_stream());
            println!(
                "beside-candle: runtime on the context's stream: {}",
                rt.is_ok()
            );
        }
    }
}
