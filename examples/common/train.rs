//! The data-parallel example's host side (`11-data-parallel-train`): the model's shape and
//! parameter layout, the data set, the launchers of its small kernels, and the PyTorch
//! reference run.

use std::ops::Range;

use graph_runtime::cudarc::driver::{
    CudaFunction, CudaSlice, CudaView, CudaViewMut, PushKernelArg,
};
use graph_runtime::{GraphError, Runtime};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::{elems, int};

/// The MLP: 64 → 256 → 256 → 16.
pub const DIMS: [usize; 4] = [64, 256, 256, 16];
/// Mini-batches in the data set; step `s` trains on mini-batch `s % BATCHES`.
pub const BATCHES: usize = 8;

/// Where each layer's weight `[out, in]` and bias live in the flat parameter buffer.
#[derive(Debug, Clone)]
pub struct Layout {
    /// Each layer's weight.
    pub w: Vec<Range<usize>>,
    /// Each layer's bias.
    pub b: Vec<Range<usize>>,
    /// Parameters in all.
    pub len: usize,
}

impl Layout {
    /// The layout of [`DIMS`].
    pub fn new() -> Self {
        let (mut w, mut b, mut at) = (Vec::new(), Vec::new(), 0);
        for pair in DIMS.windows(2) {
            let (inp, out) = (pair[0], pair[1]);
            w.push(at..at + out * inp);
            at += out * inp;
            b.push(at..at + out);
            at += out;
        }
        Layout { w, b, len: at }
    }
}

/// `z = h + bias`, `a = gelu(z)` for `rows × width` values.
#[allow(clippy::too_many_arguments)]
pub fn hidden_fwd(
    rt: &Runtime,
    f: &CudaFunction,
    h: &CudaSlice<f32>,
    bias: &CudaView<f32>,
    z: &mut CudaSlice<f32>,
    a: &mut CudaSlice<f32>,
    rows: usize,
    width: usize,
) -> Result<(), GraphError> {
    // SAFETY: reads rows·width of `h` (it holds batch·wide ≥ that) and width of the bias;
    // writes rows·width of `z` and `a`, which hold exactly that.
    unsafe {
        rt.stream()
            .launch_builder(f)
            .arg(h)
            .arg(bias)
            .arg(z)
            .arg(a)
            .arg(&int(rows))
            .arg(&int(width))
            .launch(elems(rows * width))?;
    }
    Ok(())
}

pub fn col_sums(
    rt: &Runtime,
    f: &CudaFunction,
    dz: &CudaSlice<f32>,
    db: &mut CudaViewMut<f32>,
    rows: usize,
    cols: usize,
) -> Result<(), GraphError> {
    // SAFETY: reads rows·cols of `dz` (it holds batch·wide ≥ that), writes cols of `db`,
    // a view of exactly cols elements.
    unsafe {
        rt.stream()
            .launch_builder(f)
            .arg(dz)
            .arg(db)
            .arg(&int(rows))
            .arg(&int(cols))
            .launch(elems(cols))?;
    }
    Ok(())
}

pub fn gelu_grad(
    rt: &Runtime,
    f: &CudaFunction,
    da: &CudaSlice<f32>,
    z: &CudaSlice<f32>,
    dz: &mut CudaSlice<f32>,
    n: usize,
) -> Result<(), GraphError> {
    // SAFETY: n elements of `da`, `z` and `dz`, which hold at least n each.
    unsafe {
        rt.stream()
            .launch_builder(f)
            .arg(da)
            .arg(z)
            .arg(dz)
            .arg(&int(n))
            .launch(elems(n))?;
    }
    Ok(())
}

/// The data set and initial weights (the same seed on every rank): inputs uniform in
/// [-1, 1), targets from a teacher MLP of the same shape (f32, on the host).
pub fn data_set(world: usize, batch: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let mut rng = SmallRng::seed_from_u64(11);
    let l = Layout::new();
    let mut init = |scale: f32| -> Vec<f32> {
        let mut p = vec![0.0f32; l.len];
        for (i, pair) in DIMS.windows(2).enumerate() {
            let bound = scale / (pair[0] as f32).sqrt();
            for r in [l.w[i].clone(), l.b[i].clone()] {
                p[r].iter_mut()
                    .for_each(|v| *v = rng.random_range(-bound..bound));
            }
        }
        p
    };
    let student = init(1.0);
    let teacher = init(4.0);
    let rows = BATCHES * world * batch;
    let xs: Vec<f32> = (0..rows * DIMS[0])
        .map(|_| rng.random_range(-1.0f32..1.0))
        .collect();
    let gelu = |v: f32| 0.5 * v * (1.0 + (0.797_884_6 * (v + 0.044715 * v * v * v)).tanh());
    let mut ts = Vec::with_capacity(rows * DIMS[3]);
    for row in xs.chunks(DIMS[0]) {
        let mut a = row.to_vec();
        for (i, pair) in DIMS.windows(2).enumerate() {
            let (inp, out) = (pair[0], pair[1]);
            let w = &teacher[l.w[i].clone()];
            let b = &teacher[l.b[i].clone()];
            a = (0..out)
                .map(|o| {
                    let z = b[o] + (0..inp).map(|k| w[o * inp + k] * a[k]).sum::<f32>();
                    if i + 1 < DIMS.len() - 1 {
                        gelu(z)
                    } else {
                        z
                    }
                })
                .collect();
        }
        ts.extend(a);
    }
    (xs, ts, student)
}

/// PyTorch DDP's eager and graphed step times per batch, from `scripts/torch_ddp.py`.
pub struct Torch {
    /// Batch per rank.
    pub batch: usize,
    /// Eager DDP step, µs.
    pub eager_us: f64,
    /// Graphed DDP step, µs.
    pub graph_us: f64,
    /// Graphed DDP step, GPU µs.
    pub graph_gpu_us: f64,
}

/// Runs `scripts/torch_ddp.py` with these batch sizes and reads its JSON lines.
pub fn run_torch(batches: &[usize], iters: usize) -> Result<Vec<Torch>, String> {
    let script = [
        "scripts/torch_ddp.py",
        concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/torch_ddp.py"),
    ]
    .into_iter()
    .find(|p| std::path::Path::new(p).exists())
    .ok_or("scripts/torch_ddp.py not found (run from the repository root)")?;
    let list: Vec<String> = batches.iter().map(usize::to_string).collect();
    let out = std::process::Command::new("python3")
        .args([
            script,
            "--batches",
            &list.join(","),
            "--iters",
            &iters.to_string(),
        ])
        .output()
        .map_err(|e| format!("python3 {script}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "python3 {script} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let num = |line: &str, key: &str| -> Option<f64> {
        let rest = &line[line.find(&format!("\"{key}\":"))? + key.len() + 3..];
        let end = rest.find([',', '}']).unwrap_or(rest.len());
        rest[..end].trim().parse().ok()
    };
    Ok(text
        .lines()
        .filter(|l| l.starts_with('{'))
        .filter_map(|l| {
            Some(Torch {
                batch: num(l, "batch")? as usize,
                eager_us: num(l, "eager_us")?,
                graph_us: num(l, "graph_us")?,
                graph_gpu_us: num(l, "graph_gpu_us")?,
            })
        })
        .collect())
}
