//! # 01 — your first graph
//!
//! A function written against plain cudarc (a stream, `CudaSlice` buffers, a kernel from
//! NVRTC) becomes a CUDA graph by adding one attribute and marking which buffer is state.
//!
//! Run: `cargo run --release --example 01-first-graph`
//!
//! It uses `graph-runtime` alone (and cudarc through it): copy it into a crate of yours that
//! depends on `graph-runtime`, and it builds as it is.

use graph_runtime::cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use graph_runtime::{cuda_graph, GraphError, Runtime, Tolerance, VerifyReport};

/// The two kernels, CUDA C compiled by NVRTC the first time a runtime asks for them.
const ELEMENTWISE: &str = r#"
extern "C" __global__ void mul(const float *a, const float *b, float *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a[i] * b[i];
}

extern "C" __global__ void tanh_inplace(float *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = tanhf(y[i]);
}
"#;

// 1. The function. `rt` is the execution context (always the first parameter); `x` is an
//    input (`&`), `w` is state the graph reads in place (`#[state]`), `y` is an output
//    (`&mut`). The body is ordinary cudarc code.
#[cuda_graph(warmup = 3)]
fn scale_then_tanh(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] w: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    let n = x.len() as i32;
    let cfg = LaunchConfig::for_num_elems(n as u32);
    let mul = rt.function(ELEMENTWISE, "mul")?; // compiled once, cached
    let tanh = rt.function(ELEMENTWISE, "tanh_inplace")?;
    // SAFETY: both kernels touch exactly `n` floats of buffers holding `n`.
    unsafe {
        rt.stream()
            .launch_builder(&mul)
            .arg(x)
            .arg(w)
            .arg(&mut *y)
            .arg(&n)
            .launch(cfg)?;
        rt.stream()
            .launch_builder(&tanh)
            .arg(&mut *y)
            .arg(&n)
            .launch(cfg)?;
    }
    Ok(())
}

/// The first line of a verification report, or the mismatch as an error.
fn verified(report: VerifyReport) -> Result<String, GraphError> {
    let report = report.into_result()?;
    Ok(report
        .to_string()
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned())
}

fn main() -> Result<(), GraphError> {
    // 2. The runtime: device 0, its capture stream, cuBLAS, the kernel cache. Without a
    //    usable GPU the example says why and stops.
    let rt = match Runtime::new(0) {
        Ok(rt) => rt,
        Err(
            e @ (GraphError::NoDriver
            | GraphError::NoDevice { .. }
            | GraphError::MissingLibrary { .. }),
        ) => {
            eprintln!("skipped 01-first-graph: {e}");
            return Ok(());
        }
        Err(e) => return Err(e),
    };
    let n = 1 << 16;
    let s = rt.stream();
    let w = s.clone_htod(&vec![0.5f32; n])?;
    let x = s.clone_htod(&vec![1.0f32; n])?;

    // 3. The function is still callable eagerly.
    let mut y = s.alloc_zeros::<f32>(n)?;
    scale_then_tanh(&rt, &x, &w, &mut y)?;
    let eager = s.clone_dtoh(&y)?;

    // 4. Capture: 3 warmup runs on the runtime's stream, one recorded run, instantiate.
    //    Inputs are given as example values, outputs by size, state by reference.
    let mut graph = ScaleThenTanhGraph::capture(&rt, &x, &w, n)?;
    println!("captured:\n{graph}");

    // 4b. The library checks the graph against the function for you: the eager run on copies
    //     of the inputs, then a replay, every output compared bit for bit.
    println!("{}", verified(graph.verify(&x, Tolerance::BITWISE)?)?);

    // 5. Replay with new inputs: one copy into the graph's static input, one launch.
    //    The output is borrowed from the graph until the next replay.
    for step in 0..3 {
        let input = vec![step as f32; n];
        let out = graph.replay(&input)?;
        let y = s.clone_dtoh(out.y)?;
        println!(
            "replay {step}: y[0] = {:.6} (tanh(0.5 * {step}) = {:.6})",
            y[0],
            (0.5 * step as f32).tanh()
        );
    }

    // 6. Same inputs, same kernels: the replay equals the eager run bit for bit.
    let replayed = s.clone_dtoh(graph.replay(&x)?.y)?;
    assert_eq!(replayed, eager);
    println!("replay equals eager on {n} elements");
    Ok(())
}
