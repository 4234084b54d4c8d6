//! # 27 — host code between two graphed segments: an eager island
//!
//! A generation step often ends on the host: a sampler reads the scores, draws a token with a
//! host random generator, and the next model step starts from that token. `rt.eager(|| …)` in
//! the body is an *island*: the work before and after it is captured (two graphs), and every
//! replay runs the island's host code between them, where the body has it.
//!
//! ```text
//! segment 1: scores = tanh(a · logits + b), 4 kernels ─┤ island: draw a token ├─ segment 2: row = table[token], transformed
//! ```
//!
//! The sampler is `#[island]` state: only the island touches it, it can be any `Clone` type,
//! and the graph undoes what its warmup runs drew, so the replays draw what the eager
//! function draws. Checked: over 32 steps with new logits each, the graph's tokens and rows
//! equal the eager function's from the same seed.
//!
//! Run: `cargo run --release --example 27-island-sampler`
//!
//! It uses `graph-runtime` alone (and cudarc through it): copy it into a crate of yours that
//! depends on `graph-runtime`, and it builds as it is.

use graph_runtime::cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use graph_runtime::{cuda_graph, GraphError, Runtime};

const KERNELS: &str = r#"
extern "C" __global__ void affine_tanh(float *y, float a, float b, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = tanhf(a * y[i] + b);
}
extern "C" __global__ void gather(const float *table, const int *idx, float *y, int dim) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < dim) y[i] = table[idx[0] * dim + i];
}
"#;

const VOCAB: usize = 4096;
const DIM: usize = 512;
const STEPS: usize = 32;

/// A host random generator (xorshift) and a temperature sampler.
#[derive(Clone, Debug)]
struct Sampler {
    state: u64,
}

impl Sampler {
    fn next_f32(&mut self) -> f32 {
        self.state ^= self.state << 13;
        self.state ^= self.state >> 7;
        self.state ^= self.state << 17;
        (self.state >> 40) as f32 / (1u64 << 24) as f32
    }

    /// A token drawn from `softmax(scores / temperature)`.
    fn draw(&mut self, scores: &[f32], temperature: f32) -> i32 {
        let max = scores.iter().cloned().fold(f32::MIN, f32::max);
        let weights: Vec<f32> = scores
            .iter()
            .map(|s| ((s - max) / temperature).exp())
            .collect();
        let mut u = self.next_f32() * weights.iter().sum::<f32>();
        for (i, w) in weights.iter().enumerate() {
            if u < *w {
                return i as i32;
            }
            u -= w;
        }
        (weights.len() - 1) as i32
    }
}

/// `y = tanh(a·y + b)` in place on the runtime's stream.
fn affine_tanh(rt: &Runtime, y: &mut CudaSlice<f32>, a: f32, b: f32) -> Result<(), GraphError> {
    let f = rt.function(KERNELS, "affine_tanh")?;
    let n = y.len() as i32;
    // SAFETY: `affine_tanh` updates `n` floats of `y` in place, which holds them.
    unsafe {
        rt.stream()
            .launch_builder(&f)
            .arg(&mut *y)
            .arg(&a)
            .arg(&b)
            .arg(&n)
            .launch(LaunchConfig::for_num_elems(n as u32))?;
    }
    Ok(())
}

// 1. The step: segment 1, the island, segment 2. In the island the body's rules are lifted
//    (a device-to-host read, host randomness); `scores` and `token` are outputs, seen there
//    as views to read and write, never to replace.
#[allow(clippy::too_many_arguments)] // the step's inputs, state and outputs
#[cuda_graph(warmup = 2)]
fn sample_step(
    rt: &Runtime,
    logits: &CudaSlice<f32>,
    #[state] table: &CudaSlice<f32>,
    #[island] sampler: &mut Sampler,
    #[constant] temperature: f32,
    scores: &mut CudaSlice<f32>,
    token: &mut CudaSlice<i32>,
    row: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    rt.stream().memcpy_dtod(logits, &mut *scores)?;
    for k in 0..4 {
        affine_tanh(rt, scores, 1.0 + k as f32 * 0.1, 0.0)?;
    }
    rt.eager(|| {
        let host = rt.stream().clone_dtoh(&scores)?;
        let t = sampler.draw(&host, temperature);
        rt.stream().memcpy_htod(&[t], &mut token)?;
        Ok(())
    })?;
    let gather = rt.function(KERNELS, "gather")?;
    let dim = DIM as i32;
    // SAFETY: `gather` reads row `token[0]` (< VOCAB, drawn by the island) of the table and
    // writes `dim` floats of `row`, which holds them.
    unsafe {
        rt.stream()
            .launch_builder(&gather)
            .arg(table)
            .arg(&*token)
            .arg(&mut *row)
            .arg(&dim)
            .launch(LaunchConfig::for_num_elems(DIM as u32))?;
    }
    for k in 0..4 {
        affine_tanh(rt, row, 1.0 - k as f32 * 0.1, 0.1)?;
    }
    Ok(())
}

/// Numbers in [-1, 1) from a seed.
fn numbers(seed: u64, n: usize) -> Vec<f32> {
    let mut g = Sampler { state: seed | 1 };
    (0..n).map(|_| 2.0 * g.next_f32() - 1.0).collect()
}

fn main() -> Result<(), GraphError> {
    let rt = match Runtime::new(0) {
        Ok(rt) => rt,
        Err(
            e @ (GraphError::NoDriver
            | GraphError::NoDevice { .. }
            | GraphError::MissingLibrary { .. }),
        ) => {
            eprintln!("skipped 27-island-sampler: {e}");
            return Ok(());
        }
        Err(e) => return Err(e),
    };
    let s = rt.stream();
    let table = s.clone_htod(&numbers(7, VOCAB * DIM))?;
    let logits: Vec<CudaSlice<f32>> = (0..STEPS)
        .map(|k| s.clone_htod(&numbers(100 + k as u64, VOCAB)))
        .collect::<Result<_, _>>()?;
    let seed = Sampler {
        state: 0x2545_f491_4f6c_dd1d,
    };

    // 2. Capture: two segments and the island between them. The graph keeps its own sampler
    //    (a clone of the seed), put back after the warmup runs drew from it.
    let mut graph_sampler = seed.clone();
    let mut graph = SampleStepGraph::capture(
        &rt,
        &logits[0],
        &table,
        &mut graph_sampler,
        0.7,
        VOCAB,
        1,
        DIM,
    )?;
    println!("captured:\n{graph}");

    // 3. The eager function and the replays, step by step from the same seed.
    let mut eager_sampler = seed.clone();
    let (mut scores, mut token, mut row) = (
        s.alloc_zeros::<f32>(VOCAB)?,
        s.alloc_zeros::<i32>(1)?,
        s.alloc_zeros::<f32>(DIM)?,
    );
    let mut tokens = Vec::new();
    for (k, x) in logits.iter().enumerate() {
        let (t, r) = {
            let out = graph.replay(x)?;
            (s.clone_dtoh(out.token)?, s.clone_dtoh(out.row)?)
        };
        sample_step(
            &rt,
            x,
            &table,
            &mut eager_sampler,
            0.7,
            &mut scores,
            &mut token,
            &mut row,
        )?;
        if t != s.clone_dtoh(&token)? || r != s.clone_dtoh(&row)? {
            return Err(GraphError::User(
                format!("step {k}: the replay's token or row differs from eager").into(),
            ));
        }
        tokens.push(t[0]);
    }
    println!("{STEPS} steps, replay = eager bit for bit; tokens {tokens:?}");
    Ok(())
}
