//! # 07 — dropout in a captured training step
//!
//! Borrows from this workspace: `workloads` (the training step with dropout, the host Philox
//! counters, comparisons, timing, the runtime or a skip) and `bench-report` (records, tables,
//! loss curves).
//!
//! The model: 64 → 256 (GELU, then dropout p = 0.2) → 16, MSE, clipping and AdamW as in
//! `06-train-step`, with the same training step (`workloads::train::Trainer::step`). Dropout draws its mask from a `graph_runtime::Generator`: its seed and
//! offset live on the device and the dropout kernel moves the offset on by itself, so every
//! replay of the graph draws a fresh mask with no registration step (see
//! `graph_runtime::rng`).
//!
//! Eager and graphed training each get their own generator made from the same seed. The
//! capture's warmup draws from the graph's generator, and the runtime puts every generator
//! back afterwards (the rng module's warmup policy): the example checks that the graph's
//! generator is back at offset 0 after the capture, then trains 50 steps each way and checks
//!
//! * the loss curves and the last dropout masks are equal bit for bit;
//! * every eager loss matches the f64 host reference fed with the masks the host computes
//!   from the same seed (`graph_runtime::rng::reference_uniform`), and the last eager mask
//!   is that host mask exactly.
//!
//! Run: `cargo run --release --example 07-dropout-train` (`-- --json` for machine-readable
//! lines).

use bench_report::record::{Record, Side};
use bench_report::table::{loss_curves, times, us, Table};
use clap::Parser;
use graph_runtime::{cuda_graph, BoxError, GraphError, Runtime, Tolerance};
use workloads::check::{max_rel_err, same_training, verified};
use workloads::reference::counters_for;
use workloads::testing::{runtime_or_skip, seeded_rng};
use workloads::timing::wall_us;
use workloads::train::{Data, DropoutSpec, Problem, TrainSpec, Trainer};

const P: f32 = 0.2;
const SEED: u64 = 2026;
const SPEC: TrainSpec = TrainSpec {
    dims: &[64, 256, 16],
    batch: 32,
    batches: 8,
    steps: 50,
    dropout: Some(DropoutSpec { p: P, seed: SEED }),
};
const STEPS: usize = SPEC.steps;
const CPU_TOLERANCE: f64 = 1e-3;

/// Dropout drawn from a graph-safe generator inside a captured training step: losses and
/// masks of eager and graphed training, against the host.
#[derive(Parser)]
struct Args {
    /// Print one JSON line for the report after the tables.
    #[arg(long)]
    json: bool,
}

// 1. The step, as in 06; the trainer holds its own generator (both made from SEED), and the
//    step draws the dropout mask from it after the hidden layer's GELU.
#[cuda_graph(warmup = 2)]
fn dropout_step(
    rt: &Runtime,
    #[state] data: &Data,
    #[state] tr: &mut Trainer,
) -> Result<(), GraphError> {
    tr.step(rt, data)
}

fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    let Some(rt) = runtime_or_skip("07-dropout-train") else {
        return Ok(());
    };
    let s = rt.stream().clone();
    let problem = Problem::new(SPEC, &mut seeded_rng(7));
    let data = problem.upload(&s)?;

    // 2. Eager: 50 steps.
    let mut eager = problem.trainer(&rt)?;
    for _ in 0..STEPS {
        dropout_step(&rt, &data, &mut eager)?;
    }
    let eager_losses = s.clone_dtoh(&eager.losses)?;
    let eager_mask = s.clone_dtoh(&dropout_of(&eager).mask)?;

    // 3. Graph: capture (two warmup steps train and draw from the graph's generator; the
    //    runtime restores the trainer and the generator), check the generator is back at the
    //    seed's start, then 50 launches.
    let mut graphed = problem.trainer(&rt)?;
    let mut graph = DropoutStepGraph::capture(&rt, &data, &mut graphed)?;
    let nodes = graph.info().kinds.kernels;
    let after_capture = dropout_of(graph.state_mut().tr).rng.seed_and_offset(&rt)?;
    for _ in 0..STEPS {
        graph.launch()?;
    }
    let graph_losses = s.clone_dtoh(&graph.state_mut().tr.losses)?;
    let graph_mask = s.clone_dtoh(&dropout_of(graph.state_mut().tr).mask)?;
    let graph_rng = dropout_of(graph.state_mut().tr).rng.seed_and_offset(&rt)?;
    let eager_rng = dropout_of(&eager).rng.seed_and_offset(&rt)?;
    // One more step checked against the eager function (state and generator rewound).
    let verify = verified(graph.verify(Tolerance::BITWISE)?)?;

    // 4. The host reference with the masks computed on the host from the same seed.
    let per_step = counters_for(SPEC.mask_len());
    let cpu_err = max_rel_err(&eager_losses, &problem.host_losses(STEPS));
    let host_mask = problem.mask(STEPS - 1).expect("the spec has dropout");
    let kept = eager_mask.iter().filter(|&&m| m == 1).count() as f64 / eager_mask.len() as f64;

    // 5. Step times.
    let eager_us = wall_us(&s, 200, || dropout_step(&rt, &data, &mut eager))?;
    let graph_us = wall_us(&s, 200, || graph.launch().map(|_| ()))?;

    let device = rt.context().name().unwrap_or_default();
    println!(
        "training with dropout p = {P}, MLP {:?}, batch {}, seed {SEED}, on {device}\n",
        SPEC.dims, SPEC.batch
    );
    let curve = loss_curves(&eager_losses, &graph_losses, &[0, 1, 2, 9, 24, STEPS - 1]);
    print!("{}", curve.to_markdown());
    println!();
    let mut t = Table::new(&["loop", ">kernels in graph", ">µs per step", ">speedup"]);
    t.row(vec![
        "eager".into(),
        "–".into(),
        us(eager_us),
        "1.00×".into(),
    ]);
    t.row(vec![
        "graph".into(),
        nodes.to_string(),
        us(graph_us),
        times(eager_us / graph_us),
    ]);
    print!("{}", t.to_markdown());
    println!("\ngraph generator after capture (seed, offset): {after_capture:?}; after {STEPS} steps: eager {eager_rng:?}, graph {graph_rng:?}");
    println!("{verify}");
    println!("last mask keeps {:.1}% (expected {:.0}%); eager losses vs f64 host with host-drawn masks: max relative error {cpu_err:.1e}", 100.0 * kept, 100.0 * (1.0 - P));

    let losses_equal = same_training((&eager_losses, &graph_losses), None);
    let masks_equal = eager_mask == graph_mask;
    let host_mask_equal = eager_mask == host_mask;
    let restored = after_capture == (SEED, 0);
    // Each step draws one mask: both generators moved on by STEPS draws, on the device.
    let moved = eager_rng == (SEED, STEPS as u64 * per_step) && graph_rng == eager_rng;
    let agree = losses_equal.is_ok()
        && masks_equal
        && host_mask_equal
        && restored
        && moved
        && cpu_err < CPU_TOLERANCE;
    if args.json {
        let dims = SPEC.dims_text();
        let what = format!(
            "train step + dropout p={P} MLP {dims}, batch {}",
            SPEC.batch
        );
        let rec = Record::new(
            "dropout_train",
            Side::Ours,
            "dropout_train",
            what,
            eager_us,
            graph_us,
        )
        .shape("batch", SPEC.batch)
        .shape("dims", dims.as_str())
        .shape("p", P as f64)
        .shape("steps", STEPS)
        .kernels(nodes)
        .check("50-step loss curve and last mask bitwise, eager vs graph; losses and mask vs host with host-drawn masks", agree)
        .with("cpu_max_rel_err", cpu_err);
        println!("{}", rec.line());
    }

    if !restored {
        return Err(format!(
            "the graph's generator is at {after_capture:?} after the capture, not at (seed {SEED}, offset 0): the warmup's draws were not undone"
        )
        .into());
    }
    if !moved {
        return Err(format!(
            "after {STEPS} steps the generators are at eager {eager_rng:?}, graph {graph_rng:?}; expected offset {}",
            STEPS as u64 * per_step
        )
        .into());
    }
    losses_equal?;
    if !masks_equal {
        return Err("the last dropout masks of eager and graph differ".into());
    }
    if !host_mask_equal {
        return Err("the last eager dropout mask differs from the one computed on the host".into());
    }
    if cpu_err >= CPU_TOLERANCE {
        return Err(format!("eager losses are off the host reference by {cpu_err:.1e}").into());
    }
    println!("eager and graph drew the same masks and produced bitwise identical losses");
    Ok(())
}

/// The dropout layer of a trainer made from [`SPEC`], which has one.
fn dropout_of(tr: &Trainer) -> &workloads::train::Dropout {
    tr.dropout.as_ref().expect("SPEC has dropout")
}
