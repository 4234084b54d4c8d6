//! # 09 — random numbers in your own kernel
//!
//! Borrows from this workspace: `workloads` (a seeded host generator, the runtime or a skip);
//! the kernel and the checks are in this file.
//!
//! `03-rng-fill` draws with the library's kernels. Here the kernels are the user's own: they
//! draw from a `graph_runtime::Generator` through the CUDA device API of
//! `graph_runtime::rng::PHILOX_DEVICE_API` and the generator's state pointer
//! (`Generator::kernel_arg`). Each kernel reads the generator's seed and offset on the device
//! (`philox_begin`) and the last of its blocks moves the offset past what it drew
//! (`philox_end`), so a captured graph draws fresh numbers on every replay with no
//! registration, exactly like the library's own draws.
//!
//! Two kernels, one `#[cuda_graph]` step:
//! * `add_scaled_noise`: `noise ~ N(MEAN, STD)`, `y = x + scale ⊙ noise`, one group of four
//!   values per thread (grid-stride), converted with `philox_normal4`, the library's normal;
//! * `random_mask`: `keep[i] = 1` with probability `p[i]`, one thread per element, from
//!   `philox_uniform(philox_bits(d, i), 0, 1)`, the library's uniform.
//!
//! The example checks, and prints as a table:
//! 1. for the same seed and offset, the noise is bit for bit `Generator::normal` and the mask
//!    is bit for bit `Generator::bernoulli_per_element`, and the offset moves as much;
//! 2. `y` is `fma(scale, noise, x)` bit for bit, and the noise and the mask match the host
//!    references (`reference_normal` within its tolerance, `reference_bernoulli` exactly);
//! 3. five eager calls and five replays of the captured step, from the same seed, draw the
//!    same sequence; every replay draws fresh numbers; `GraphInfo::rng` reports the counters
//!    per replay.
//!
//! It exits with an error if any check fails.
//!
//! Run: `cargo run --release --example 09-user-rng-kernel`

use std::sync::Arc;

use graph_runtime::cudarc::driver::{CudaSlice, CudaStream, LaunchConfig, PushKernelArg};
use graph_runtime::rng::{reference_bernoulli, reference_normal, NORMAL_TOLERANCE};
use graph_runtime::{cuda_graph, Generator, GraphError, Runtime};
use rand::Rng;
use workloads::testing::{fresh_rng, runtime_or_skip};

const N: usize = 1_000_003; // not a multiple of 4: the kernels handle the tail
const MEAN: f32 = 0.0;
const STD: f32 = 0.5;
const CALLS: usize = 5;
const THREADS: u32 = 256;

/// The user's kernels, built on the device API (prepended at compile time).
const KERNELS: &str = concat!(
    graph_runtime::philox_device_api!(),
    r#"
// noise ~ N(mean, std), y = x + scale * noise. Group g of the draw gives values 4g .. 4g + 3,
// as Generator::normal does; one group per thread, grid-stride.
extern "C" __global__ void add_scaled_noise(unsigned long long *rng, const float *x, const float *scale,
                                            float *noise, float *y, unsigned long long n,
                                            float mean, float std) {
    PhiloxDraw d = philox_begin(rng);
    unsigned long long groups = (n + 3) / 4;
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long g = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; g < groups;
         g += stride) {
        float4 z4 = philox_normal4(philox_group(d, g), mean, std);
        float z[4] = {z4.x, z4.y, z4.z, z4.w};
        for (unsigned long long j = 0; j < 4 && 4 * g + j < n; ++j) {
            unsigned long long i = 4 * g + j;
            noise[i] = z[j];
            y[i] = fmaf(scale[i], z[j], x[i]);
        }
    }
    philox_end(rng, d, groups);
}

// keep[i] = 1 with probability p[i]: one thread per element, value i of a uniform draw.
extern "C" __global__ void random_mask(unsigned long long *rng, const float *p, unsigned char *keep,
                                       unsigned long long n) {
    PhiloxDraw d = philox_begin(rng);
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {   // no early return: every thread reaches philox_end
        keep[i] = philox_uniform(philox_bits(d, i), 0.0f, 1.0f) < p[i] ? 1 : 0;
    }
    philox_end(rng, d, (n + 3) / 4);
}
"#
);

fn add_scaled_noise(
    rt: &Runtime,
    g: &Generator,
    x: &CudaSlice<f32>,
    scale: &CudaSlice<f32>,
    noise: &mut CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    let f = rt.function(KERNELS, "add_scaled_noise")?;
    let n = x.len() as u64;
    let rng = g.kernel_arg(rt);
    let blocks = n
        .div_ceil(4)
        .div_ceil(u64::from(THREADS))
        .clamp(1, u64::from(rt.multiprocessors()) * 8) as u32;
    let cfg = LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut launch = rt.stream().launch_builder(&f);
    launch
        .arg(&rng)
        .arg(x)
        .arg(scale)
        .arg(noise)
        .arg(y)
        .arg(&n)
        .arg(&MEAN)
        .arg(&STD);
    // SAFETY: the kernel reads `n` floats of `x` and `scale`, writes `n` of `noise` and `y`
    // (all hold `n`: the graph's buffers are made with these lengths), and draws from `g` by
    // the contract of `graph_runtime::rng`.
    unsafe { launch.launch(cfg) }?;
    Ok(())
}

fn random_mask(
    rt: &Runtime,
    g: &Generator,
    p: &CudaSlice<f32>,
    keep: &mut CudaSlice<u8>,
) -> Result<(), GraphError> {
    let f = rt.function(KERNELS, "random_mask")?;
    let n = p.len() as u64;
    let rng = g.kernel_arg(rt);
    let mut launch = rt.stream().launch_builder(&f);
    launch.arg(&rng).arg(p).arg(keep).arg(&n);
    // SAFETY: the kernel reads `n` floats of `p` and writes `n` bytes of `keep`; it draws from
    // `g` by the contract of `graph_runtime::rng`.
    unsafe { launch.launch(LaunchConfig::for_num_elems(n as u32)) }?;
    Ok(())
}

/// One step: scaled noise, then a random mask, both from `g`.
#[allow(clippy::too_many_arguments)] // the step's buffers, one per role
#[cuda_graph(warmup = 2)]
fn noisy_step(
    rt: &Runtime,
    #[state] g: &Generator,
    x: &CudaSlice<f32>,
    #[state] scale: &CudaSlice<f32>,
    #[state] p: &CudaSlice<f32>,
    noise: &mut CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    keep: &mut CudaSlice<u8>,
) -> Result<(), GraphError> {
    add_scaled_noise(rt, g, x, scale, noise, y)?;
    random_mask(rt, g, p, keep)
}

/// What one step drew.
#[derive(PartialEq)]
struct Step {
    noise: Vec<u32>,
    y: Vec<u32>,
    keep: Vec<u8>,
}

fn read(
    s: &Arc<CudaStream>,
    noise: &CudaSlice<f32>,
    y: &CudaSlice<f32>,
    keep: &CudaSlice<u8>,
) -> Result<Step, GraphError> {
    let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect();
    Ok(Step {
        noise: bits(s.clone_dtoh(noise)?),
        y: bits(s.clone_dtoh(y)?),
        keep: s.clone_dtoh(keep)?,
    })
}

/// The first index where two slices differ, if any.
fn first_difference<T: PartialEq>(a: &[T], b: &[T]) -> Option<usize> {
    (0..a.len().min(b.len()))
        .find(|&i| a[i] != b[i])
        .or((a.len() != b.len()).then_some(a.len().min(b.len())))
}

struct Report {
    rows: Vec<(String, bool, String)>,
}

impl Report {
    fn check(&mut self, what: &str, ok: bool, detail: String) {
        self.rows.push((what.to_owned(), ok, detail));
    }

    fn print(&self) {
        println!("| check | result | detail |");
        println!("|---|---|---|");
        for (what, ok, detail) in &self.rows {
            let result = if *ok { "ok" } else { "FAILED" };
            println!("| {what} | {result} | {detail} |");
        }
    }

    fn failures(&self) -> usize {
        self.rows.iter().filter(|r| !r.1).count()
    }
}

fn same(what: &str, d: Option<usize>) -> String {
    match d {
        None => format!("{N} values, bit for bit"),
        Some(i) => format!("{what} first differs at index {i}"),
    }
}

/// Random numbers drawn by kernels of your own, graph-safe: checked bit for bit against the
/// library's generator, fresh on every replay.
#[derive(clap::Parser)]
struct Args {}

fn main() -> Result<(), GraphError> {
    let _ = <Args as clap::Parser>::parse();
    let name = "09-user-rng-kernel";
    let Some(rt) = runtime_or_skip(name) else {
        return Ok(());
    };
    let s = rt.stream().clone();
    let mut rng = fresh_rng(name);
    let seed: u64 = rng.random();
    let offset: u64 = rng.random_range(0..1u64 << 40);
    let xs: Vec<Vec<f32>> = (0..CALLS)
        .map(|_| (0..N).map(|_| rng.random_range(-1.0..1.0)).collect())
        .collect();
    let scale_h: Vec<f32> = (0..N).map(|_| rng.random_range(0.5..2.0)).collect();
    let p_h: Vec<f32> = (0..N).map(|_| rng.random_range(0.0..1.0)).collect();
    let (scale, p) = (s.clone_htod(&scale_h)?, s.clone_htod(&p_h)?);
    let groups = (N as u64).div_ceil(4);
    let mut report = Report { rows: Vec::new() };

    // 1. The user's kernels against the library's draws, same seed and offset.
    let user = rt.generator(seed)?;
    let lib = rt.generator(seed)?;
    user.set_seed_and_offset(&rt, seed, offset)?;
    lib.set_seed_and_offset(&rt, seed, offset)?;
    let x0 = s.clone_htod(&xs[0])?;
    let mut noise = s.alloc_zeros::<f32>(N)?;
    let mut y = s.alloc_zeros::<f32>(N)?;
    let mut keep = s.alloc_zeros::<u8>(N)?;
    noisy_step(&rt, &user, &x0, &scale, &p, &mut noise, &mut y, &mut keep)?;
    let mine = read(&s, &noise, &y, &keep)?;
    let user_offset = user.seed_and_offset(&rt)?.1;

    let mut z = s.alloc_zeros::<f32>(N)?;
    let mut k = s.alloc_zeros::<u8>(N)?;
    lib.normal(&rt, &mut z, MEAN, STD)?;
    lib.bernoulli_per_element(&rt, &p, &mut k)?;
    let z_lib: Vec<u32> = s.clone_dtoh(&z)?.into_iter().map(f32::to_bits).collect();
    let k_lib = s.clone_dtoh(&k)?;
    let lib_offset = lib.seed_and_offset(&rt)?.1;
    let d = first_difference(&mine.noise, &z_lib);
    report.check(
        "noise = Generator::normal (same seed, offset)",
        d.is_none(),
        same("noise", d),
    );
    let d = first_difference(&mine.keep, &k_lib);
    report.check(
        "mask = Generator::bernoulli_per_element",
        d.is_none(),
        same("mask", d),
    );
    report.check(
        "offset moved as the library's draws move it",
        user_offset == lib_offset && user_offset == offset + 2 * groups,
        format!(
            "user {}, library {}, expected {} (2 × ceil(n / 4))",
            user_offset - offset,
            lib_offset - offset,
            2 * groups
        ),
    );

    // 2. Host checks: y = fma(scale, noise, x), the noise and the mask against the host.
    let y_bad = (0..N).find(|&i| {
        let want = scale_h[i].mul_add(f32::from_bits(mine.noise[i]), xs[0][i]);
        mine.y[i] != want.to_bits()
    });
    report.check(
        "y = fma(scale, noise, x)",
        y_bad.is_none(),
        same("y", y_bad),
    );
    let mut worst = 0f32;
    for i in 0..N {
        let r = reference_normal(seed, offset, i as u64, MEAN, STD);
        worst = worst.max((f32::from_bits(mine.noise[i]) - r).abs());
    }
    report.check(
        "noise vs reference_normal (host, f64)",
        worst <= NORMAL_TOLERANCE * STD,
        format!(
            "largest difference {worst:.2e} (tolerance {:.1e})",
            NORMAL_TOLERANCE * STD
        ),
    );
    let mask_bad = (0..N).find(|&i| {
        (mine.keep[i] == 1) != reference_bernoulli(seed, offset + groups, i as u64, p_h[i])
    });
    report.check(
        "mask vs reference_bernoulli (host)",
        mask_bad.is_none(),
        same("mask", mask_bad),
    );

    // 3. Eager calls and graph replays from the same seed.
    user.manual_seed(&rt, seed)?;
    let mut eager = Vec::new();
    for x in &xs {
        let xd = s.clone_htod(x)?;
        noisy_step(&rt, &user, &xd, &scale, &p, &mut noise, &mut y, &mut keep)?;
        eager.push(read(&s, &noise, &y, &keep)?);
    }
    user.manual_seed(&rt, seed)?;
    let mut graph = NoisyStepGraph::capture(&rt, &user, &xs[0], &scale, &p, N, N, N)?;
    let after_capture = user.seed_and_offset(&rt)?.1;
    let per_replay = graph
        .info()
        .rng
        .iter()
        .find(|a| a.generator == user.id())
        .map_or(0, |a| a.counters_per_replay);
    let mut replays = Vec::new();
    for x in &xs {
        let out = graph.replay(x)?;
        replays.push(read(&s, out.noise, out.y, out.keep)?);
    }
    let same_sequence = (0..CALLS).filter(|&c| replays[c] == eager[c]).count();
    report.check(
        "eager calls = graph replays",
        same_sequence == CALLS,
        format!("{same_sequence} of {CALLS} steps identical (noise, y, mask)"),
    );
    let fresh = (0..CALLS).all(|a| {
        (0..a).all(|b| replays[a].noise != replays[b].noise && replays[a].keep != replays[b].keep)
    });
    report.check(
        "fresh numbers on every replay",
        fresh,
        format!("{CALLS} replays, every pair differs in noise and mask"),
    );
    report.check(
        "warmup undone, GraphInfo::rng",
        after_capture == 0 && per_replay == 2 * groups,
        format!("offset {after_capture} after capture; {per_replay} counters per replay"),
    );
    report.check(
        "offset after the replays",
        user.seed_and_offset(&rt)?.1 == CALLS as u64 * 2 * groups,
        format!(
            "{} = {CALLS} × {}",
            user.seed_and_offset(&rt)?.1,
            2 * groups
        ),
    );

    let device = rt.context().name().unwrap_or_default();
    println!("user kernels drawing from a Generator on {device}: n = {N}, seed {seed}, offset {offset}\n");
    report.print();
    match report.failures() {
        0 => Ok(()),
        k => Err(GraphError::User(format!("{k} checks failed").into())),
    }
}
