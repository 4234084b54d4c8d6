//! Random numbers in user kernels, and the distributions beyond uniform and normal.
//!
//! User kernels draw through `graph_runtime::rng::PHILOX_DEVICE_API` and
//! `Generator::kernel_arg`: they must draw bit for bit what the library draws for the same
//! seed and offset, move the offset as much, stay fresh on every replay and draw the same
//! sequence eagerly and through a graph. Every distribution is compared with its host
//! reference (bit for bit, or within the documented tolerance) on fresh random seeds and
//! offsets, and its statistics are checked on 10^6–10^7 samples against bounds of six
//! standard errors.

use std::sync::Arc;

use graph_runtime::cudarc::driver::{CudaSlice, CudaStream, LaunchConfig, PushKernelArg};
use graph_runtime::half::{bf16, f16};
use graph_runtime::rng::{
    reference_bernoulli, reference_exponential, reference_integer, reference_normal,
    reference_uniform, reference_uniform_in, RandomInt, EXPONENTIAL_MAX_ULPS, NORMAL_TOLERANCE,
};
use graph_runtime::{cuda_graph, Generator, GraphError, Runtime};
use rand::rngs::SmallRng;
use rand::Rng;
use workloads::testing::{fresh_rng, gpu_test};

/// Kernels of "a user": each draws through the device API.
const USER_KERNELS: &str = concat!(
    graph_runtime::philox_device_api!(),
    r#"
// Generator::normal's values: one group of four per thread, grid-stride.
extern "C" __global__ void user_normal(unsigned long long *rng, float *out, unsigned long long n,
                                       float mean, float std) {
    PhiloxDraw d = philox_begin(rng);
    unsigned long long groups = (n + 3) / 4;
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long g = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; g < groups; g += stride) {
        float4 v = philox_normal4(philox_group(d, g), mean, std);
        float t[4] = {v.x, v.y, v.z, v.w};
        for (unsigned long long j = 0; j < 4 && 4 * g + j < n; ++j) out[4 * g + j] = t[j];
    }
    philox_end(rng, d, groups);
}

// Generator::uniform's values, one thread per value (many blocks: most are not resident at once).
extern "C" __global__ void user_uniform_per_thread(unsigned long long *rng, float *out, unsigned long long n,
                                                   float lo, float hi) {
    PhiloxDraw d = philox_begin(rng);
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = philox_uniform(philox_bits(d, i), lo, hi);
    philox_end(rng, d, (n + 3) / 4);
}

// The same on a 2-D grid of 2-D blocks: value i = row * cols + col.
extern "C" __global__ void user_uniform_2d(unsigned long long *rng, float *out, unsigned int rows,
                                           unsigned int cols) {
    PhiloxDraw d = philox_begin(rng);
    unsigned int col = blockIdx.x * blockDim.x + threadIdx.x;
    unsigned int row = blockIdx.y * blockDim.y + threadIdx.y;
    unsigned long long n = (unsigned long long)rows * cols;
    if (row < rows && col < cols) {
        unsigned long long i = (unsigned long long)row * cols + col;
        out[i] = philox_uniform(philox_bits(d, i), 0.0f, 1.0f);
    }
    philox_end(rng, d, (n + 3) / 4);
}

// Two generators in one kernel.
extern "C" __global__ void user_two_generators(unsigned long long *a, unsigned long long *b, float *out_a,
                                               float *out_b, unsigned long long n) {
    PhiloxDraw da = philox_begin(a);
    PhiloxDraw db = philox_begin(b);
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        out_a[i] = philox_uniform(philox_bits(da, i), 0.0f, 1.0f);
        out_b[i] = philox_uniform(philox_bits(db, i), 0.0f, 1.0f);
    }
    philox_end(a, da, (n + 3) / 4);
    philox_end(b, db, (n + 3) / 4);
}

// Breaks the contract on purpose: draws but never calls philox_end.
extern "C" __global__ void user_forgets_end(unsigned long long *rng, float *out, unsigned long long n) {
    PhiloxDraw d = philox_begin(rng);
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = philox_uniform(philox_bits(d, i), 0.0f, 1.0f);
}
"#
);

const THREADS: u32 = 256;

/// How many values of a large draw are compared with the host reference one by one.
const PREFIX: usize = 1 << 18;

fn blocks_for(threads: u64) -> u32 {
    threads.div_ceil(u64::from(THREADS)).max(1) as u32
}

fn cfg(blocks: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// `user_normal` on a capped grid (grid-stride).
fn user_normal(
    rt: &Runtime,
    g: &Generator,
    out: &mut CudaSlice<f32>,
    mean: f32,
    std: f32,
) -> Result<(), GraphError> {
    let f = rt.function(USER_KERNELS, "user_normal")?;
    let n = out.len() as u64;
    let rng = g.kernel_arg(rt);
    let blocks = blocks_for(n.div_ceil(4)).min(rt.multiprocessors() * 4);
    let mut launch = rt.stream().launch_builder(&f);
    launch.arg(&rng).arg(out).arg(&n).arg(&mean).arg(&std);
    // SAFETY: the kernel writes `n` floats of `out`, which holds `n`, and draws from `g` by
    // the device API's contract.
    unsafe { launch.launch(cfg(blocks)) }?;
    Ok(())
}

/// `user_uniform_per_thread`, one thread per value.
fn user_uniform(
    rt: &Runtime,
    g: &Generator,
    out: &mut CudaSlice<f32>,
    lo: f32,
    hi: f32,
) -> Result<(), GraphError> {
    let f = rt.function(USER_KERNELS, "user_uniform_per_thread")?;
    let n = out.len() as u64;
    let rng = g.kernel_arg(rt);
    let mut launch = rt.stream().launch_builder(&f);
    launch.arg(&rng).arg(out).arg(&n).arg(&lo).arg(&hi);
    // SAFETY: the kernel writes the `n` floats of `out` and draws from `g` by the contract.
    unsafe { launch.launch(cfg(blocks_for(n))) }?;
    Ok(())
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Panics with the first differing index when two f32 slices differ in any bit.
fn assert_same_bits(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    if let Some(i) = (0..got.len()).find(|&i| got[i].to_bits() != want[i].to_bits()) {
        panic!(
            "{what}: first difference at index {i} of {}: {} ({:#010x}) vs {} ({:#010x})",
            got.len(),
            got[i],
            got[i].to_bits(),
            want[i],
            want[i].to_bits()
        );
    }
}

fn random_offset(rng: &mut SmallRng) -> u64 {
    // Half the time just below a 2^32 boundary, so that counters carry into the high word.
    if rng.random_bool(0.5) {
        (rng.random_range(1..1u64 << 20) << 32) - rng.random_range(1..64)
    } else {
        rng.random_range(0..1u64 << 40)
    }
}

// --- user kernels against the library ----------------------------------------------------

#[gpu_test]
fn user_kernels_draw_what_the_generator_draws(rt: Runtime) -> Result<(), GraphError> {
    let test = "user_kernels_draw_what_the_generator_draws";
    let mut rng = fresh_rng(test);
    let s = rt.stream().clone();
    let (user, lib) = (rt.generator(0)?, rt.generator(0)?);
    for &n in &[1usize, 7, 4096, 1_000_003] {
        let (seed, offset) = (rng.random::<u64>(), random_offset(&mut rng));
        let groups = (n as u64).div_ceil(4);
        let (mut a, mut b) = (s.alloc_zeros::<f32>(n)?, s.alloc_zeros::<f32>(n)?);

        // Normal (grid-stride, group per thread).
        user.set_seed_and_offset(&rt, seed, offset)?;
        lib.set_seed_and_offset(&rt, seed, offset)?;
        user_normal(&rt, &user, &mut a, 0.25, 1.5)?;
        lib.normal(&rt, &mut b, 0.25, 1.5)?;
        let (za, zb) = (s.clone_dtoh(&a)?, s.clone_dtoh(&b)?);
        assert_same_bits(
            &format!("n {n}, seed {seed}, offset {offset}: user normal vs Generator::normal"),
            &za,
            &zb,
        );
        assert_eq!(
            user.seed_and_offset(&rt)?,
            (seed, offset + groups),
            "user normal moved the offset"
        );
        assert_eq!(
            lib.seed_and_offset(&rt)?,
            (seed, offset + groups),
            "Generator::normal moved the offset"
        );
        for i in (0..n).step_by(n.div_ceil(4096)) {
            let r = reference_normal(seed, offset, i as u64, 0.25, 1.5);
            assert!(
                (za[i] - r).abs() <= NORMAL_TOLERANCE * 1.5,
                "n {n}: normal {i} is {} on the device, {r} on the host",
                za[i]
            );
        }

        // Uniform (one thread per value), continuing from where the normals left off.
        user_uniform(&rt, &user, &mut a, -1.0, 3.0)?;
        lib.uniform(&rt, &mut b, -1.0, 3.0)?;
        let (ua, ub) = (s.clone_dtoh(&a)?, s.clone_dtoh(&b)?);
        assert_same_bits(
            &format!("n {n}: user uniform vs Generator::uniform"),
            &ua,
            &ub,
        );
        for (i, &u) in ua.iter().enumerate().step_by(n.div_ceil(65_536)) {
            let want = reference_uniform_in::<f32>(seed, offset + groups, i as u64, -1.0, 3.0);
            assert_eq!(
                u.to_bits(),
                want.to_bits(),
                "n {n}: uniform {i} vs the host"
            );
        }
        assert_eq!(user.seed_and_offset(&rt)?.1, offset + 2 * groups);
        assert_eq!(lib.seed_and_offset(&rt)?.1, offset + 2 * groups);
    }
    Ok(())
}

#[gpu_test]
fn a_2d_grid_and_two_generators_in_one_kernel_keep_the_contract(
    rt: Runtime,
) -> Result<(), GraphError> {
    let test = "a_2d_grid_and_two_generators_in_one_kernel_keep_the_contract";
    let mut rng = fresh_rng(test);
    let s = rt.stream().clone();

    // 2-D grid of 16 × 16 blocks over a 1000 × 777 matrix.
    let (rows, cols) = (1000u32, 777u32);
    let n = (rows * cols) as usize;
    let (seed, offset) = (rng.random::<u64>(), random_offset(&mut rng));
    let g = rt.generator(seed)?;
    let f = rt.function(USER_KERNELS, "user_uniform_2d")?;
    let mut out = s.alloc_zeros::<f32>(n)?;
    for call in 0..3u64 {
        let at = offset + call * (n as u64).div_ceil(4);
        if call == 0 {
            g.set_seed_and_offset(&rt, seed, offset)?;
        }
        let rng_arg = g.kernel_arg(&rt);
        let mut launch = s.launch_builder(&f);
        launch.arg(&rng_arg).arg(&mut out).arg(&rows).arg(&cols);
        let grid = LaunchConfig {
            grid_dim: (cols.div_ceil(16), rows.div_ceil(16), 1),
            block_dim: (16, 16, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the kernel writes the `rows × cols` floats of `out` and draws from `g` by
        // the contract.
        unsafe { launch.launch(grid) }?;
        let got = s.clone_dtoh(&out)?;
        for (i, &u) in got.iter().enumerate().step_by(97) {
            assert_eq!(
                u,
                reference_uniform(seed, at, i as u64),
                "2-D call {call}: value {i} vs the host"
            );
        }
        assert_eq!(
            g.seed_and_offset(&rt)?.1,
            at + (n as u64).div_ceil(4),
            "2-D call {call}: the offset moved by ceil(n / 4) after all blocks arrived"
        );
    }

    // Two generators drawn in one kernel: each draws what it draws alone.
    let n = 300_001usize;
    let (sa, sb) = (rng.random::<u64>(), rng.random::<u64>());
    let (a, b) = (rt.generator(sa)?, rt.generator(sb)?);
    let f = rt.function(USER_KERNELS, "user_two_generators")?;
    let (mut ya, mut yb) = (s.alloc_zeros::<f32>(n)?, s.alloc_zeros::<f32>(n)?);
    for call in 0..2 {
        let (ka, kb, nn) = (a.kernel_arg(&rt), b.kernel_arg(&rt), n as u64);
        let mut launch = s.launch_builder(&f);
        launch.arg(&ka).arg(&kb).arg(&mut ya).arg(&mut yb).arg(&nn);
        // SAFETY: the kernel writes `n` floats of `ya` and `yb` and draws from both
        // generators by the contract.
        unsafe { launch.launch(cfg(blocks_for(nn))) }?;
        let (ga, gb) = (s.clone_dtoh(&ya)?, s.clone_dtoh(&yb)?);
        let at = call * nn.div_ceil(4);
        for i in (0..n).step_by(101) {
            assert_eq!(
                ga[i],
                reference_uniform(sa, at, i as u64),
                "a, call {call}, {i}"
            );
            assert_eq!(
                gb[i],
                reference_uniform(sb, at, i as u64),
                "b, call {call}, {i}"
            );
        }
    }
    assert_eq!(a.seed_and_offset(&rt)?.1, 2 * (n as u64).div_ceil(4));
    assert_eq!(b.seed_and_offset(&rt)?.1, 2 * (n as u64).div_ceil(4));
    Ok(())
}

/// The documented failure: a kernel that never calls `philox_end` repeats its numbers.
#[gpu_test]
fn a_kernel_without_philox_end_repeats_its_numbers(rt: Runtime) -> Result<(), GraphError> {
    let test = "a_kernel_without_philox_end_repeats_its_numbers";
    let s = rt.stream().clone();
    let g = rt.generator(fresh_rng(test).random())?;
    let f = rt.function(USER_KERNELS, "user_forgets_end")?;
    let n = 10_000u64;
    let mut out = s.alloc_zeros::<f32>(n as usize)?;
    let mut draws = Vec::new();
    for _ in 0..2 {
        let k = g.kernel_arg(&rt);
        let mut launch = s.launch_builder(&f);
        launch.arg(&k).arg(&mut out).arg(&n);
        // SAFETY: the kernel writes `n` floats of `out`; it reads the generator's state only.
        unsafe { launch.launch(cfg(blocks_for(n))) }?;
        draws.push(s.clone_dtoh(&out)?);
    }
    assert_eq!(draws[0], draws[1], "without philox_end the offset stays");
    assert_eq!(g.seed_and_offset(&rt)?.1, 0);
    // The same kernel with philox_end (the contract kept) draws fresh numbers.
    user_uniform(&rt, &g, &mut out, 0.0, 1.0)?;
    let first = s.clone_dtoh(&out)?;
    user_uniform(&rt, &g, &mut out, 0.0, 1.0)?;
    assert_ne!(
        first,
        s.clone_dtoh(&out)?,
        "with philox_end the offset moves"
    );
    Ok(())
}

// --- user kernels in graphs ---------------------------------------------------------------

/// A user kernel and library draws interleaved in one body.
#[cuda_graph(warmup = 2)]
fn user_and_library(
    rt: &Runtime,
    #[state] g: &Generator,
    z: &mut CudaSlice<f32>,
    u: &mut CudaSlice<f32>,
    k: &mut CudaSlice<i32>,
) -> Result<(), GraphError> {
    user_normal(rt, g, z, 0.0, 1.0)?;
    g.uniform(rt, u, 0.0, 1.0)?;
    g.integers(rt, k, -50, 50)?;
    user_uniform(rt, g, u, 0.0, 1.0)
}

#[gpu_test]
fn user_kernels_in_a_graph_are_fresh_every_replay_and_match_eager(
    rt: Runtime,
) -> Result<(), GraphError> {
    let test = "user_kernels_in_a_graph_are_fresh_every_replay_and_match_eager";
    let mut rng = fresh_rng(test);
    let s = rt.stream().clone();
    let n = 100_003usize;
    let groups = (n as u64).div_ceil(4);
    let per_call = 3 * groups + (n as u64).div_ceil(2);
    let seed: u64 = rng.random();
    let g = rt.generator(seed)?;
    let replays = 5;

    // Eagerly.
    let (mut z, mut u) = (s.alloc_zeros::<f32>(n)?, s.alloc_zeros::<f32>(n)?);
    let mut k = s.alloc_zeros::<i32>(n)?;
    let mut eager = Vec::new();
    for call in 0..replays {
        user_and_library(&rt, &g, &mut z, &mut u, &mut k)?;
        let (zz, uu, kk) = (s.clone_dtoh(&z)?, s.clone_dtoh(&u)?, s.clone_dtoh(&k)?);
        // The last draw of the call is the user's uniform at offset call × per_call + 2g + n/2.
        let at = call as u64 * per_call + 2 * groups + (n as u64).div_ceil(2);
        for i in (0..n).step_by(53) {
            assert_eq!(
                uu[i],
                reference_uniform(seed, at, i as u64),
                "eager call {call}: u[{i}]"
            );
            let want_k =
                reference_integer::<i32>(seed, at - (n as u64).div_ceil(2), i as u64, -50, 50);
            assert_eq!(kk[i], want_k, "eager call {call}: k[{i}]");
        }
        eager.push((bits(&zz), bits(&uu), kk));
    }
    assert_eq!(g.seed_and_offset(&rt)?.1, replays as u64 * per_call);

    // Through warmup (undone), capture and replays, from the same seed.
    g.manual_seed(&rt, seed)?;
    let mut graph = UserAndLibraryGraph::capture(&rt, &g, n, n, n)?;
    assert_eq!(
        g.seed_and_offset(&rt)?,
        (seed, 0),
        "the warmup's draws were undone"
    );
    let advance = graph
        .info()
        .rng
        .iter()
        .find(|a| a.generator == g.id())
        .expect("the graph moves the generator");
    assert_eq!(advance.counters_per_replay, per_call);
    let mut replayed: Vec<(Vec<u32>, Vec<u32>, Vec<i32>)> = Vec::new();
    for (r, want) in eager.iter().enumerate() {
        let out = graph.replay()?;
        let d = (
            bits(&s.clone_dtoh(out.z)?),
            bits(&s.clone_dtoh(out.u)?),
            s.clone_dtoh(out.k)?,
        );
        assert!(
            d.0 == want.0,
            "replay {r}: user normals differ from the eager call"
        );
        assert!(
            d.1 == want.1,
            "replay {r}: user uniforms differ from the eager call"
        );
        assert!(
            d.2 == want.2,
            "replay {r}: integers differ from the eager call"
        );
        for (q, p) in replayed.iter().enumerate() {
            assert!(p.0 != d.0, "replays {q} and {r} drew the same user normals");
            assert!(
                p.1 != d.1,
                "replays {q} and {r} drew the same user uniforms"
            );
        }
        replayed.push(d);
    }
    assert_eq!(g.seed_and_offset(&rt)?.1, replays as u64 * per_call);
    Ok(())
}

// --- distributions ------------------------------------------------------------------------

/// Every new draw in one body, so that replays can be compared with eager calls.
#[allow(clippy::too_many_arguments)] // one output per distribution
#[cuda_graph(warmup = 2)]
fn every_distribution(
    rt: &Runtime,
    #[state] g: &Generator,
    #[state] probs: &CudaSlice<f32>,
    uh: &mut CudaSlice<f16>,
    nb: &mut CudaSlice<bf16>,
    bern: &mut CudaSlice<u8>,
    bern_each: &mut CudaSlice<f32>,
    expo: &mut CudaSlice<f32>,
    ints: &mut CudaSlice<i64>,
) -> Result<(), GraphError> {
    g.uniform(rt, uh, -1.0, 1.0)?;
    g.normal(rt, nb, 2.0, 0.5)?;
    g.bernoulli(rt, bern, 0.3)?;
    g.bernoulli_per_element(rt, probs, bern_each)?;
    g.exponential(rt, expo, 4.0)?;
    g.integers(rt, ints, -7, 1 << 40)
}

#[gpu_test]
fn every_distribution_is_fresh_in_a_graph_and_matches_eager(rt: Runtime) -> Result<(), GraphError> {
    let test = "every_distribution_is_fresh_in_a_graph_and_matches_eager";
    let mut rng = fresh_rng(test);
    let s = rt.stream().clone();
    let n = 65_537usize;
    let seed: u64 = rng.random();
    let g = rt.generator(seed)?;
    let p_host: Vec<f32> = (0..n).map(|_| rng.random_range(0.0..1.0)).collect();
    let probs = s.clone_htod(&p_host)?;
    let names = [
        "uniform f16",
        "normal bf16",
        "bernoulli",
        "bernoulli per element",
        "exponential",
        "integers i64",
    ];

    let mut graph = EveryDistributionGraph::capture(&rt, &g, &probs, n, n, n, n, n, n)?;
    let groups = (n as u64).div_ceil(4);
    let per_replay = 5 * groups + n as u64;
    assert_eq!(
        graph
            .info()
            .rng
            .iter()
            .find(|a| a.generator == g.id())
            .map(|a| a.counters_per_replay),
        Some(per_replay),
        "counters per replay: five one-word draws and one i64 draw"
    );
    let mut replays = Vec::new();
    for _ in 0..3 {
        let o = graph.replay()?;
        replays.push(read_all(
            &s,
            o.uh,
            o.nb,
            o.bern,
            o.bern_each,
            o.expo,
            o.ints,
        )?);
    }
    drop(graph);
    for (r, d) in replays.iter().enumerate() {
        for (q, p) in replays[..r].iter().enumerate() {
            for (k, name) in names.iter().enumerate() {
                assert!(p[k] != d[k], "replays {q} and {r} drew the same {name}");
            }
        }
    }

    // The same draws eagerly, from the same seed, into buffers of the same types.
    g.manual_seed(&rt, seed)?;
    let mut uh = s.alloc_zeros::<f16>(n)?;
    let mut nb = s.alloc_zeros::<bf16>(n)?;
    let mut bern = s.alloc_zeros::<u8>(n)?;
    let mut bern_each = s.alloc_zeros::<f32>(n)?;
    let mut expo = s.alloc_zeros::<f32>(n)?;
    let mut ints = s.alloc_zeros::<i64>(n)?;
    for (r, want) in replays.iter().enumerate() {
        every_distribution(
            &rt,
            &g,
            &probs,
            &mut uh,
            &mut nb,
            &mut bern,
            &mut bern_each,
            &mut expo,
            &mut ints,
        )?;
        let got = read_all(&s, &uh, &nb, &bern, &bern_each, &expo, &ints)?;
        for (k, name) in names.iter().enumerate() {
            assert!(
                got[k] == want[k],
                "eager call {r}: {name} differs from replay {r}"
            );
        }
        // And the host references, on the whole draw.
        let at = r as u64 * per_replay;
        for i in 0..n {
            let iu = i as u64;
            assert_eq!(
                got[0][i] as u16,
                reference_uniform_in::<f16>(seed, at, iu, -1.0, 1.0).to_bits(),
                "call {r}: uniform f16 {i}"
            );
            assert_eq!(
                got[2][i] == 1,
                reference_bernoulli(seed, at + 2 * groups, iu, 0.3),
                "call {r}: bernoulli {i}"
            );
            assert_eq!(
                f32::from_bits(got[3][i] as u32) == 1.0,
                reference_bernoulli(seed, at + 3 * groups, iu, p_host[i]),
                "call {r}: bernoulli per element {i}"
            );
            let e = f32::from_bits(got[4][i] as u32);
            let want_e = reference_exponential(seed, at + 4 * groups, iu, 4.0);
            assert!(
                ulps(e, want_e) <= EXPONENTIAL_MAX_ULPS,
                "call {r}: exponential {i}: {e} vs {want_e}"
            );
            assert_eq!(
                got[5][i] as i64,
                reference_integer::<i64>(seed, at + 5 * groups, iu, -7, 1 << 40),
                "call {r}: i64 {i}"
            );
        }
    }
    Ok(())
}

/// The six outputs of `every_distribution` as bit patterns.
fn read_all(
    s: &Arc<CudaStream>,
    uh: &CudaSlice<f16>,
    nb: &CudaSlice<bf16>,
    bern: &CudaSlice<u8>,
    bern_each: &CudaSlice<f32>,
    expo: &CudaSlice<f32>,
    ints: &CudaSlice<i64>,
) -> Result<Vec<Vec<u64>>, GraphError> {
    Ok(vec![
        s.clone_dtoh(uh)?
            .iter()
            .map(|v| u64::from(v.to_bits()))
            .collect(),
        s.clone_dtoh(nb)?
            .iter()
            .map(|v| u64::from(v.to_bits()))
            .collect(),
        s.clone_dtoh(bern)?.iter().map(|&v| u64::from(v)).collect(),
        s.clone_dtoh(bern_each)?
            .iter()
            .map(|v| u64::from(v.to_bits()))
            .collect(),
        s.clone_dtoh(expo)?
            .iter()
            .map(|v| u64::from(v.to_bits()))
            .collect(),
        s.clone_dtoh(ints)?.iter().map(|&v| v as u64).collect(),
    ])
}

/// Distance in units in the last place between two floats of the same sign.
fn ulps(a: f32, b: f32) -> u32 {
    (i64::from(a.to_bits() as i32) - i64::from(b.to_bits() as i32)).unsigned_abs() as u32
}

fn mean_var(v: impl Iterator<Item = f64> + Clone) -> (f64, f64, f64) {
    let (n, sum) = v.clone().fold((0.0, 0.0), |(n, s), x| (n + 1.0, s + x));
    let mean = sum / n;
    let var = v.map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
    (n, mean, var)
}

#[gpu_test]
fn half_precision_uniform_and_normal(rt: Runtime) -> Result<(), GraphError> {
    let test = "half_precision_uniform_and_normal";
    let mut rng = fresh_rng(test);
    let s = rt.stream().clone();
    let n = 10_000_000usize;
    let (seed, offset) = (rng.random::<u64>(), random_offset(&mut rng));
    let g = rt.generator(seed)?;
    let mut f = s.alloc_zeros::<f32>(n)?;
    let mut h = s.alloc_zeros::<f16>(n)?;
    let mut b = s.alloc_zeros::<bf16>(n)?;

    // Uniform: bit for bit against the host on a 10^6 prefix, in range everywhere.
    g.set_seed_and_offset(&rt, seed, offset)?;
    g.uniform(&rt, &mut h, 0.0, 1.0)?;
    g.set_seed_and_offset(&rt, seed, offset)?;
    g.uniform(&rt, &mut b, -3.0, 5.0)?;
    let (hh, bb) = (s.clone_dtoh(&h)?, s.clone_dtoh(&b)?);
    for i in 0..PREFIX {
        let iu = i as u64;
        assert_eq!(
            hh[i].to_bits(),
            reference_uniform_in::<f16>(seed, offset, iu, 0.0, 1.0).to_bits(),
            "uniform f16 {i}"
        );
        assert_eq!(
            bb[i].to_bits(),
            reference_uniform_in::<bf16>(seed, offset, iu, -3.0, 5.0).to_bits(),
            "uniform bf16 {i}"
        );
    }
    assert!(
        hh.iter().all(|v| (0.0..1.0).contains(&v.to_f32())),
        "uniform f16 out of [0, 1)"
    );
    assert!(
        bb.iter().all(|v| (-3.0..5.0).contains(&v.to_f32())),
        "uniform bf16 out of [-3, 5)"
    );
    // Mean and variance of [0, 1) in f16: rounding to the f16 grid (spacing ≤ 2^-11) moves
    // the mean by at most 2^-12 (the top values that become 0 weigh 2^-12 × 1 at most), well
    // inside 6 standard errors plus that bias.
    let (nf, m, v) = mean_var(hh.iter().map(|x| f64::from(x.to_f32())));
    let se_mean = (1.0 / 12.0 / nf).sqrt();
    assert!(
        (m - 0.5).abs() < 6.0 * se_mean + 2f64.powi(-11),
        "uniform f16 mean {m}"
    );
    let se_var = ((1.0 / 80.0 - 1.0 / 144.0) / nf).sqrt();
    assert!(
        (v - 1.0 / 12.0).abs() < 6.0 * se_var + 2f64.powi(-11),
        "uniform f16 variance {v}"
    );

    // Normal: the 16-bit draws are the roundings of the f32 draw from the same seed and offset.
    g.set_seed_and_offset(&rt, seed, offset)?;
    g.normal(&rt, &mut f, 1.0, 3.0)?;
    g.set_seed_and_offset(&rt, seed, offset)?;
    g.normal(&rt, &mut h, 1.0, 3.0)?;
    g.set_seed_and_offset(&rt, seed, offset)?;
    g.normal(&rt, &mut b, 1.0, 3.0)?;
    let (ff, hh, bb) = (s.clone_dtoh(&f)?, s.clone_dtoh(&h)?, s.clone_dtoh(&b)?);
    for i in 0..n {
        assert_eq!(
            hh[i].to_bits(),
            f16::from_f32(ff[i]).to_bits(),
            "normal f16 {i} is not the rounding of {}",
            ff[i]
        );
        assert_eq!(
            bb[i].to_bits(),
            bf16::from_f32(ff[i]).to_bits(),
            "normal bf16 {i} is not the rounding of {}",
            ff[i]
        );
    }
    // The f32 draw against the host: within NORMAL_TOLERANCE × std, and almost always much closer.
    let (mut worst, mut loose) = (0f32, 0usize);
    let prefix = PREFIX;
    for (i, &z) in ff.iter().take(prefix).enumerate() {
        let d = (z - reference_normal(seed, offset, i as u64, 1.0, 3.0)).abs();
        worst = worst.max(d);
        loose += usize::from(d > 1e-4 * 3.0);
    }
    assert!(
        worst <= NORMAL_TOLERANCE * 3.0,
        "normal: worst host difference {worst}"
    );
    assert!(
        loose <= prefix / 1000,
        "normal: {loose} of {prefix} values further than 3e-4 from the host"
    );
    let (nf, m, v) = mean_var(hh.iter().map(|x| f64::from(x.to_f32())));
    assert!(
        (m - 1.0).abs() < 6.0 * 3.0 / nf.sqrt() + 1e-3,
        "normal f16 mean {m}"
    );
    assert!(
        (v - 9.0).abs() < 6.0 * 9.0 * (2.0 / nf).sqrt() + 1e-2,
        "normal f16 variance {v}"
    );
    eprintln!("{test}: normal worst host difference {worst:e}, {loose} beyond 3e-4; f16 mean {m:.5} var {v:.5}");
    Ok(())
}

#[gpu_test]
fn bernoulli_matches_the_host_and_its_probabilities(rt: Runtime) -> Result<(), GraphError> {
    let test = "bernoulli_matches_the_host_and_its_probabilities";
    let mut rng = fresh_rng(test);
    let s = rt.stream().clone();
    let n = 10_000_000usize;
    let (seed, offset) = (rng.random::<u64>(), random_offset(&mut rng));
    let g = rt.generator(seed)?;
    let nf = n as f64;

    // Scalar p, u8 and f32 outputs from the same seed and offset: the same draws.
    for &p in &[0.0f32, 0.013, 0.5, 0.9, 1.0] {
        let (mut b8, mut bf) = (s.alloc_zeros::<u8>(n)?, s.alloc_zeros::<f32>(n)?);
        g.set_seed_and_offset(&rt, seed, offset)?;
        g.bernoulli(&rt, &mut b8, p)?;
        g.set_seed_and_offset(&rt, seed, offset)?;
        g.bernoulli(&rt, &mut bf, p)?;
        let (h8, hf) = (s.clone_dtoh(&b8)?, s.clone_dtoh(&bf)?);
        for i in 0..n {
            assert_eq!(
                f32::from(h8[i]),
                hf[i],
                "p {p}: u8 and f32 outputs differ at {i}"
            );
        }
        for (i, &v) in h8.iter().enumerate().take(PREFIX) {
            assert_eq!(
                v == 1,
                reference_bernoulli(seed, offset, i as u64, p),
                "p {p}: value {i} vs the host"
            );
        }
        let ones = h8.iter().filter(|&&v| v == 1).count() as f64;
        assert!(
            h8.iter().all(|&v| v <= 1),
            "p {p}: values other than 0 and 1"
        );
        let pp = f64::from(p);
        assert!(
            (ones / nf - pp).abs() <= 6.0 * (pp * (1.0 - pp) / nf).sqrt() + 1e-7,
            "p {p}: success rate {}",
            ones / nf
        );
        assert_eq!(g.seed_and_offset(&rt)?.1, offset + (n as u64).div_ceil(4));
    }

    // Per element: probabilities from the host (some outside [0, 1]), on the device.
    let probs: Vec<f32> = (0..n)
        .map(|i| match i % 10 {
            0 => -0.5,
            1 => 1.5,
            _ => rng.random_range(0.0..1.0),
        })
        .collect();
    let probs_d = s.clone_htod(&probs)?;
    let mut out = s.alloc_zeros::<u8>(n)?;
    g.set_seed_and_offset(&rt, seed, offset)?;
    g.bernoulli_per_element(&rt, &probs_d, &mut out)?;
    let got = s.clone_dtoh(&out)?;
    for i in 0..PREFIX {
        assert_eq!(
            got[i] == 1,
            reference_bernoulli(seed, offset, i as u64, probs[i]),
            "per element {i} (p {})",
            probs[i]
        );
    }
    let (mut excess, mut var) = (0.0f64, 0.0f64);
    for (i, (&b, &p)) in got.iter().zip(&probs).enumerate() {
        match i % 10 {
            0 => assert_eq!(b, 0, "p < 0 succeeded at {i}"),
            1 => assert_eq!(b, 1, "p > 1 failed at {i}"),
            _ => {
                let p = f64::from(p);
                excess += f64::from(b) - p;
                var += p * (1.0 - p);
            }
        }
    }
    assert!(
        excess.abs() <= 6.0 * var.sqrt(),
        "per element: {excess} more successes than expected (sd {})",
        var.sqrt()
    );
    eprintln!(
        "{test}: per-element excess {excess:.1} (sd {:.1})",
        var.sqrt()
    );
    Ok(())
}

#[gpu_test]
fn exponential_matches_the_host_and_its_moments(rt: Runtime) -> Result<(), GraphError> {
    let test = "exponential_matches_the_host_and_its_moments";
    let mut rng = fresh_rng(test);
    let s = rt.stream().clone();
    let n = 10_000_000usize;
    let (seed, offset) = (rng.random::<u64>(), random_offset(&mut rng));
    let lambda = rng.random_range(0.1f32..10.0);
    let g = rt.generator(seed)?;
    let mut out = s.alloc_zeros::<f32>(n)?;
    g.set_seed_and_offset(&rt, seed, offset)?;
    g.exponential(&rt, &mut out, lambda)?;
    let e = s.clone_dtoh(&out)?;
    let mut worst = 0;
    for (i, &v) in e.iter().enumerate().take(PREFIX) {
        let want = reference_exponential(seed, offset, i as u64, lambda);
        let d = ulps(v, want);
        worst = worst.max(d);
        assert!(
            d <= EXPONENTIAL_MAX_ULPS,
            "lambda {lambda}: value {i} is {v}, the host says {want} ({d} ulp)"
        );
    }
    let max = 16.64 / lambda + 1e-3;
    assert!(
        e.iter().all(|&v| v > 0.0 && v <= max),
        "lambda {lambda}: a value is 0, negative or above {max}"
    );
    let mu = 1.0 / f64::from(lambda);
    let (nf, m, v) = mean_var(e.iter().map(|&x| f64::from(x)));
    assert!(
        (m - mu).abs() < 6.0 * mu / nf.sqrt(),
        "lambda {lambda}: mean {m}, want {mu}"
    );
    // Var[(X − μ)²] = 8 μ⁴ for an exponential.
    assert!(
        (v - mu * mu).abs() < 6.0 * mu * mu * (8.0 / nf).sqrt(),
        "lambda {lambda}: variance {v}, want {}",
        mu * mu
    );
    let tail = e.iter().filter(|&&x| f64::from(x) > 2.0 * mu).count() as f64 / nf;
    let pt = (-2.0f64).exp();
    assert!(
        (tail - pt).abs() < 6.0 * (pt * (1.0 - pt) / nf).sqrt(),
        "lambda {lambda}: P(X > 2/λ) = {tail}, want {pt}"
    );
    eprintln!("{test}: lambda {lambda}: worst {worst} ulp, mean {m:.6} (want {mu:.6})");
    Ok(())
}

/// Chi-square of counts over `k` equally likely values: below its mean `k − 1` plus six
/// standard deviations `sqrt(2(k − 1))`.
fn assert_uniform_counts(what: &str, counts: &[u64]) {
    let k = counts.len() as f64;
    let total: u64 = counts.iter().sum();
    let expected = total as f64 / k;
    let chi2: f64 = counts
        .iter()
        .map(|&c| (c as f64 - expected).powi(2) / expected)
        .sum();
    let bound = (k - 1.0) + 6.0 * (2.0 * (k - 1.0)).sqrt();
    assert!(
        chi2 < bound,
        "{what}: chi-square {chi2:.1} over {k} values (bound {bound:.1})"
    );
}

fn integers_case<T: RandomInt>(
    rt: &Runtime,
    g: &Generator,
    seed: u64,
    offset: u64,
    n: usize,
    lo: T,
    hi: T,
) -> Result<Vec<T>, GraphError> {
    let s = rt.stream();
    let mut out = s.alloc_zeros::<T>(n)?;
    g.set_seed_and_offset(rt, seed, offset)?;
    g.integers(rt, &mut out, lo, hi)?;
    let v = s.clone_dtoh(&out)?;
    for (i, &x) in v.iter().enumerate().take(PREFIX) {
        assert_eq!(
            x,
            reference_integer(seed, offset, i as u64, lo, hi),
            "[{lo:?}, {hi:?}): value {i} vs the host"
        );
    }
    assert!(
        v.iter().all(|&x| lo <= x && x < hi),
        "[{lo:?}, {hi:?}): a value out of range"
    );
    let counters = (n as u64).div_ceil(T::PER_COUNTER);
    assert_eq!(
        g.seed_and_offset(rt)?.1,
        offset + counters,
        "[{lo:?}, {hi:?}): counters used"
    );
    Ok(v)
}

#[gpu_test]
fn integers_match_the_host_and_are_uniform(rt: Runtime) -> Result<(), GraphError> {
    let test = "integers_match_the_host_and_are_uniform";
    let mut rng = fresh_rng(test);
    let n = 10_000_000usize;
    let (seed, offset) = (rng.random::<u64>(), random_offset(&mut rng));
    let g = rt.generator(seed)?;

    let v = integers_case::<u32>(&rt, &g, seed, offset, n, 5, 1005)?;
    let mut counts = vec![0u64; 1000];
    v.iter().for_each(|&x| counts[(x - 5) as usize] += 1);
    assert_uniform_counts("u32 in [5, 1005)", &counts);

    let v = integers_case::<i32>(&rt, &g, seed, offset, n, -3, 4)?;
    let mut counts = vec![0u64; 7];
    v.iter().for_each(|&x| counts[(x + 3) as usize] += 1);
    assert_uniform_counts("i32 in [-3, 4)", &counts);

    // The whole i32 range: the top 4 bits are uniform over 16 values.
    let v = integers_case::<i32>(&rt, &g, seed, offset, n, i32::MIN, i32::MAX)?;
    let mut counts = vec![0u64; 16];
    v.iter()
        .for_each(|&x| counts[((x as u32) >> 28) as usize] += 1);
    assert_uniform_counts("i32 over its range, top 4 bits", &counts);

    let v = integers_case::<i64>(&rt, &g, seed, offset, n, -10, 10)?;
    let mut counts = vec![0u64; 20];
    v.iter().for_each(|&x| counts[(x + 10) as usize] += 1);
    assert_uniform_counts("i64 in [-10, 10)", &counts);

    // A range of 3 × 2^61 (not a power of two): thirds of it are equally likely, and the mean
    // is the middle within six standard errors.
    let hi = 3i64 << 61;
    let v = integers_case::<i64>(&rt, &g, seed, offset, n, 0, hi)?;
    let mut counts = vec![0u64; 3];
    v.iter().for_each(|&x| counts[(x >> 61) as usize] += 1);
    assert_uniform_counts("i64 in [0, 3 × 2^61), thirds", &counts);
    let mean = v.iter().map(|&x| x as f64).sum::<f64>() / n as f64;
    let (mid, se) = (hi as f64 / 2.0, hi as f64 / (12.0 * n as f64).sqrt());
    assert!(
        (mean - mid).abs() < 6.0 * se,
        "i64 in [0, 3 × 2^61): mean {mean:e}, want {mid:e}"
    );
    Ok(())
}

/// The message of the panic `f` raises, or a failure when it returns.
fn panic_message(what: &str, f: impl FnOnce()) -> String {
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    let payload = caught
        .err()
        .unwrap_or_else(|| panic!("{what} did not panic"));
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

#[gpu_test]
fn invalid_parameters_are_refused_before_launching(rt: Runtime) -> Result<(), GraphError> {
    let g = rt.generator(1)?;
    let s = rt.stream().clone();
    let (mut u, mut f) = (s.alloc_zeros::<u32>(4)?, s.alloc_zeros::<f32>(4)?);
    let probs = s.alloc_zeros::<f32>(3)?;
    let msg = panic_message("integers on [3, 3)", || {
        let _ = g.integers(&rt, &mut u, 3u32, 3);
    });
    assert!(msg.contains("[3, 3) is empty"), "{msg}");
    let msg = panic_message("exponential with rate 0", || {
        let _ = g.exponential(&rt, &mut f, 0.0);
    });
    assert!(msg.contains("not a positive finite number"), "{msg}");
    let msg = panic_message("bernoulli with p = 1.5", || {
        let _ = g.bernoulli(&rt, &mut f, 1.5);
    });
    assert!(msg.contains("not in [0, 1]"), "{msg}");
    let msg = panic_message(
        "bernoulli_per_element with 3 probabilities for 4 outputs",
        || {
            let _ = g.bernoulli_per_element(&rt, &probs, &mut f);
        },
    );
    assert!(msg.contains("3 probabilities for 4 outputs"), "{msg}");
    assert_eq!(g.seed_and_offset(&rt)?, (1, 0), "nothing was drawn");
    Ok(())
}

fn main() -> std::process::ExitCode {
    workloads::testing::run_tests()
}
