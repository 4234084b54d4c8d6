//! Graph-safe random numbers: fresh draws on every replay, the same sequence eagerly and
//! through graphs, sound statistics, independent generators, save/restore inside a graph,
//! and typed errors for the host-side state calls that cannot be captured.

use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::rng::{reference_uniform, DEFAULT_SEED};
use graph_runtime::{cuda_graph, Generator, GraphError, RngState, Runtime};
use rand::Rng;
use workloads::testing::{fresh_rng, gpu_test, random_vec};

/// Uniform, normal and dropout from the runtime's default generator.
#[cuda_graph(warmup = 3)]
fn noisy(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    u: &mut CudaSlice<f32>,
    z: &mut CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    mask: &mut CudaSlice<u8>,
) -> Result<(), GraphError> {
    let g = rt.rng();
    g.uniform(rt, u, 0.0, 1.0)?;
    g.normal(rt, z, 0.0, 1.0)?;
    g.dropout(rt, x, y, mask, 0.25)
}

struct Draw {
    u: Vec<f32>,
    z: Vec<f32>,
    y: Vec<f32>,
    mask: Vec<u8>,
}

fn read(
    rt: &Runtime,
    u: &CudaSlice<f32>,
    z: &CudaSlice<f32>,
    y: &CudaSlice<f32>,
    mask: &CudaSlice<u8>,
) -> Result<Draw, GraphError> {
    let s = rt.stream();
    Ok(Draw {
        u: s.clone_dtoh(u)?,
        z: s.clone_dtoh(z)?,
        y: s.clone_dtoh(y)?,
        mask: s.clone_dtoh(mask)?,
    })
}

#[gpu_test]
fn replays_draw_fresh_numbers_every_time(rt: Runtime) -> Result<(), GraphError> {
    let n = 4096;
    let x = vec![1.0f32; n];
    let mut graph = NoisyGraph::capture(&rt, &x, n, n, n, n)?;
    let mut draws: Vec<Draw> = Vec::new();
    for _ in 0..10 {
        let out = graph.replay(&x)?;
        draws.push(read(&rt, out.u, out.z, out.y, out.mask)?);
    }
    for i in 0..draws.len() {
        for j in 0..i {
            assert_ne!(
                draws[i].u, draws[j].u,
                "replays {j} and {i} drew the same uniforms"
            );
            assert_ne!(
                draws[i].z, draws[j].z,
                "replays {j} and {i} drew the same normals"
            );
            assert_ne!(
                draws[i].mask, draws[j].mask,
                "replays {j} and {i} drew the same dropout mask"
            );
        }
    }
    // The graph moves the generator by what the body draws: three draws of n values.
    let per_replay = graph
        .info()
        .rng
        .iter()
        .find(|a| a.generator == rt.rng().id())
        .expect("the default generator moved");
    assert_eq!(per_replay.counters_per_replay, 3 * (n as u64).div_ceil(4));
    let (_, offset) = rt.rng().seed_and_offset(&rt)?;
    assert_eq!(
        offset,
        10 * per_replay.counters_per_replay,
        "warmup draws were undone; ten replays remain"
    );
    Ok(())
}

#[gpu_test]
fn eager_and_graph_draw_the_same_sequence(rt: Runtime) -> Result<(), GraphError> {
    let test = "eager_and_graph_draw_the_same_sequence";
    let mut rng = fresh_rng(test);
    let n = 10_001; // not a multiple of 4: exercises the tail
    let seed: u64 = rng.random();
    let xs: Vec<Vec<f32>> = (0..5).map(|_| random_vec(&mut rng, n)).collect();
    let s = rt.stream();

    // Eagerly, from `seed`.
    rt.rng().manual_seed(&rt, seed)?;
    let (mut u, mut z) = (s.alloc_zeros::<f32>(n)?, s.alloc_zeros::<f32>(n)?);
    let (mut y, mut mask) = (s.alloc_zeros::<f32>(n)?, s.alloc_zeros::<u8>(n)?);
    let mut eager = Vec::new();
    for x in &xs {
        let x = s.clone_htod(x)?;
        noisy(&rt, &x, &mut u, &mut z, &mut y, &mut mask)?;
        eager.push(read(&rt, &u, &z, &y, &mask)?);
    }
    // The first eager uniforms against the host reference of Philox.
    for i in 0..n {
        assert_eq!(
            eager[0].u[i],
            reference_uniform(seed, 0, i as u64),
            "uniform {i} differs from the host Philox"
        );
    }

    // Through warmup (undone), capture and replays, from the same seed.
    rt.rng().manual_seed(&rt, seed)?;
    let mut graph = NoisyGraph::capture(&rt, &xs[0], n, n, n, n)?;
    for (k, x) in xs.iter().enumerate() {
        let out = graph.replay(x)?;
        let d = read(&rt, out.u, out.z, out.y, out.mask)?;
        assert_eq!(d.u, eager[k].u, "draw {k}: uniform differs from eager");
        assert_eq!(d.z, eager[k].z, "draw {k}: normal differs from eager");
        assert_eq!(
            d.mask, eager[k].mask,
            "draw {k}: dropout mask differs from eager"
        );
        assert_eq!(
            d.y, eager[k].y,
            "draw {k}: dropout output differs from eager"
        );
    }
    Ok(())
}

#[gpu_test]
fn statistics_on_ten_million_samples(rt: Runtime) -> Result<(), GraphError> {
    let test = "statistics_on_ten_million_samples";
    let n = 10_000_000usize;
    let x = vec![2.0f32; n];
    let mut graph = NoisyGraph::capture(&rt, &x, n, n, n, n)?;
    graph.replay(&x)?; // the statistics are of the second replay
    let out = graph.replay(&x)?;
    let d = read(&rt, out.u, out.z, out.y, out.mask)?;
    let nf = n as f64;
    let mean = |v: &[f32]| v.iter().map(|&a| a as f64).sum::<f64>() / nf;
    let var =
        |v: &[f32], m: f64| v.iter().map(|&a| (a as f64 - m).powi(2)).sum::<f64>() / (nf - 1.0);

    // Tolerances: 6 standard errors of each estimator for n samples.
    let (mu, vu) = (mean(&d.u), var(&d.u, mean(&d.u)));
    assert!(
        d.u.iter().all(|v| (0.0..1.0).contains(v)),
        "uniform out of [0, 1)"
    );
    assert!(
        (mu - 0.5).abs() < 6.0 * (1.0 / 12.0 / nf).sqrt(),
        "uniform mean {mu}"
    );
    let se_var_u = ((1.0 / 80.0 - 1.0 / 144.0) / nf).sqrt();
    assert!(
        (vu - 1.0 / 12.0).abs() < 6.0 * se_var_u,
        "uniform variance {vu}"
    );

    let (mz, vz) = (mean(&d.z), var(&d.z, mean(&d.z)));
    assert!(mz.abs() < 6.0 / nf.sqrt(), "normal mean {mz}");
    assert!(
        (vz - 1.0).abs() < 6.0 * (2.0 / nf).sqrt(),
        "normal variance {vz}"
    );
    let beyond3 = d.z.iter().filter(|v| v.abs() > 3.0).count() as f64 / nf;
    assert!(
        (beyond3 - 0.0026998).abs() < 6.0 * (0.0027 / nf).sqrt(),
        "normal tail mass {beyond3}"
    );

    let keep = 0.75;
    let kept = d.mask.iter().filter(|&&m| m == 1).count() as f64 / nf;
    assert!(
        (kept - keep).abs() < 6.0 * (keep * (1.0 - keep) / nf).sqrt(),
        "dropout kept {kept}"
    );
    for (i, (&m, &y)) in d.mask.iter().zip(&d.y).enumerate() {
        let want = if m == 1 { 2.0 / 0.75 } else { 0.0 };
        assert!(
            (y - want).abs() < 1e-6,
            "dropout output {i}: {y} with mask {m}"
        );
    }
    eprintln!(
        "{test}: uniform mean {mu:.6} var {vu:.6}; normal mean {mz:.6} var {vz:.6}; kept {kept:.6}"
    );
    Ok(())
}

/// Draws from two generators given as state.
#[cuda_graph(warmup = 2)]
fn two_streams(
    rt: &Runtime,
    #[state] a: &Generator,
    #[state] b: &Generator,
    ya: &mut CudaSlice<f32>,
    yb: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    a.uniform(rt, ya, -1.0, 1.0)?;
    b.uniform(rt, yb, -1.0, 1.0)
}

#[gpu_test]
fn two_generators_are_independent(rt: Runtime) -> Result<(), GraphError> {
    let n = 1 << 20;
    let (a, b) = (rt.generator(1)?, rt.generator(2)?);
    let mut graph = TwoStreamsGraph::capture(&rt, &a, &b, n, n)?;
    let s = rt.stream();
    let mut from_b_interleaved = Vec::new();
    for _ in 0..3 {
        let out = graph.replay()?;
        let (da, db) = (s.clone_dtoh(out.ya)?, s.clone_dtoh(out.yb)?);
        assert_ne!(da, db);
        let r = correlation(&da, &db);
        assert!(r.abs() < 6.0 / (n as f64).sqrt(), "correlation {r}");
        from_b_interleaved.push(db);
    }
    drop(graph);
    // Generator b alone, from its seed, draws what it drew next to a.
    let b_alone = rt.generator(2)?;
    let mut yb = s.alloc_zeros::<f32>(n)?;
    for (k, want) in from_b_interleaved.iter().enumerate() {
        b_alone.uniform(&rt, &mut yb, -1.0, 1.0)?;
        assert_eq!(&s.clone_dtoh(&yb)?, want, "draw {k} of b depends on a");
    }
    Ok(())
}

fn correlation(a: &[f32], b: &[f32]) -> f64 {
    let n = a.len() as f64;
    let (ma, mb) = (
        a.iter().map(|&v| v as f64).sum::<f64>() / n,
        b.iter().map(|&v| v as f64).sum::<f64>() / n,
    );
    let cov: f64 = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| (x as f64 - ma) * (y as f64 - mb))
        .sum();
    let va: f64 = a.iter().map(|&x| (x as f64 - ma).powi(2)).sum();
    let vb: f64 = b.iter().map(|&y| (y as f64 - mb).powi(2)).sum();
    cov / (va * vb).sqrt()
}

/// Saves the generator, draws, restores it and draws again: both draws are equal, inside
/// every replay.
#[cuda_graph(warmup = 2)]
fn draw_twice(
    rt: &Runtime,
    #[state] g: &Generator,
    #[state] saved: &mut RngState,
    first: &mut CudaSlice<f32>,
    second: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    g.save_state(rt, saved)?;
    g.normal(rt, first, 0.0, 1.0)?;
    g.restore_state(rt, saved)?;
    g.normal(rt, second, 0.0, 1.0)
}

#[gpu_test]
fn save_and_restore_inside_a_graph_replay_the_same_draw(rt: Runtime) -> Result<(), GraphError> {
    let g = rt.generator(77)?;
    let mut saved = RngState::new(&rt)?;
    let mut graph = DrawTwiceGraph::capture(&rt, &g, &mut saved, 5000, 5000)?;
    let mut previous: Option<Vec<f32>> = None;
    for k in 0..4 {
        let out = graph.replay()?;
        let (a, b) = (
            rt.stream().clone_dtoh(out.first)?,
            rt.stream().clone_dtoh(out.second)?,
        );
        assert_eq!(
            a, b,
            "replay {k}: the restored generator drew something else"
        );
        if let Some(p) = &previous {
            assert_ne!(p, &a, "replay {k} repeated the previous replay's draw");
        }
        previous = Some(a);
    }
    Ok(())
}

// --- host-side state calls inside a capture ----------------------------------------------

fn peek_offset(rt: &Runtime) -> Result<u64, GraphError> {
    Ok(rt.rng().seed_and_offset(rt)?.1)
}

#[cuda_graph(warmup = 1)]
fn reads_rng_state(rt: &Runtime, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    rt.rng().uniform(rt, y, 0.0, 1.0)?;
    let _offset = peek_offset(rt)?;
    Ok(())
}

fn reseed(rt: &Runtime) -> Result<(), GraphError> {
    rt.rng().manual_seed(rt, 5)
}

#[cuda_graph(warmup = 1)]
fn reseeds(rt: &Runtime, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    reseed(rt)?;
    rt.rng().uniform(rt, y, 0.0, 1.0)
}

fn fresh_generator(rt: &Runtime) -> Result<Generator, GraphError> {
    rt.generator(9)
}

#[cuda_graph(warmup = 1)]
fn makes_generator(rt: &Runtime, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    fresh_generator(rt)?.uniform(rt, y, 0.0, 1.0)
}

#[gpu_test]
fn host_state_calls_in_capture_point_to_the_graph_safe_ones(rt: Runtime) -> Result<(), GraphError> {
    let err = ReadsRngStateGraph::capture(&rt, 64).unwrap_err();
    assert!(
        matches!(
            err,
            GraphError::RngHostStateInCapture {
                op: "Generator::seed_and_offset",
                instead: "Generator::save_state",
                graph: "reads_rng_state",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("tests/rng.rs"), "{err}");
    let err = ReseedsGraph::capture(&rt, 64).unwrap_err();
    assert!(
        matches!(
            err,
            GraphError::RngHostStateInCapture {
                op: "Generator::manual_seed",
                instead: "Generator::restore_state",
                ..
            }
        ),
        "{err:?}"
    );
    let err = MakesGeneratorGraph::capture(&rt, 64).unwrap_err();
    assert!(
        matches!(
            err,
            GraphError::GeneratorInCapture {
                graph: "makes_generator",
                ..
            }
        ),
        "{err:?}"
    );
    // The refused reseed never ran, and the runtime still captures and draws.
    let (seed, _) = rt.rng().seed_and_offset(&rt)?;
    assert_eq!(seed, DEFAULT_SEED);
    let other = rt.generator(3)?;
    let mut graph = TwoStreamsGraph::capture(&rt, rt.rng(), &other, 64, 64)?;
    let out = graph.replay()?;
    assert_ne!(
        rt.stream().clone_dtoh(out.ya)?,
        rt.stream().clone_dtoh(out.yb)?
    );
    Ok(())
}

fn main() -> std::process::ExitCode {
    workloads::testing::run_tests()
}
