//! # 06 — a whole training step as one graph
//!
//! Borrows from this workspace: `workloads` (the training step's kernels and trainer,
//! comparisons, timing, the runtime or a skip) and `bench-report` (records, tables, loss
//! curves).
//!
//! An MLP 64 → 256 → 256 → 16 (GELU between layers) learns to imitate a random "teacher"
//! MLP of the same shape, batch 32, mean squared error. One training step
//! (`workloads::train::Trainer::step`, shared with `07-dropout-train`) is
//!
//! * pick mini-batch `step % 8` of the data set (on the device, by the step counter);
//! * forward: cuBLAS GEMMs and bias + GELU kernels that keep the pre-activations;
//! * loss: MSE and its gradient, the loss written to `losses[step]` on the device;
//! * backward: GEMMs for weight and input gradients, column sums for bias gradients,
//!   GELU's derivative;
//! * gradient clipping to a global norm of 1 **without a host sync**: partial sums of
//!   squares, then the optimizer kernel sums them and scales the gradient itself;
//! * AdamW, its bias correction from the step counter on the device; then `step += 1`.
//!
//! Nothing in the step is a host value that changes, so one graph replays every step.
//! 200 eager steps and 200 graphed steps from the same initial weights give loss curves
//! that are equal bit for bit (and so are the final weights); the first 10 losses are also
//! checked against the f64 host reference of the same step.
//!
//! Run: `cargo run --release --example 06-train-step` (`-- --json` for machine-readable
//! lines).

use bench_report::record::{Record, Side};
use bench_report::table::{loss_curves, times, us, Table};
use clap::Parser;
use graph_runtime::{cuda_graph, BoxError, GraphError, Runtime, Tolerance};
use workloads::check::{max_rel_err, same_training, verified};
use workloads::testing::{runtime_or_skip, seeded_rng};
use workloads::timing::EagerGraph;
use workloads::train::{Data, Problem, TrainSpec, Trainer};

const SPEC: TrainSpec = TrainSpec {
    dims: &[64, 256, 256, 16],
    batch: 32,
    batches: 8,
    steps: 200,
    dropout: None,
};
const STEPS: usize = SPEC.steps;
/// Losses checked against the host reference, and the tolerance.
const CPU_STEPS: usize = 10;
const CPU_TOLERANCE: f64 = 1e-3;

/// A whole training step (forward, MSE, backward, clipping, AdamW) as one graph: the loss
/// curves of eager and graphed training, and the time per step.
#[derive(Parser)]
struct Args {
    /// Print one JSON line for the report after the tables.
    #[arg(long)]
    json: bool,
}

// 1. The training step. `tr` is mutable state: the graph updates the weights, moments and
//    counter in place, and reads the counter on the device, so each replay is the next step.
#[cuda_graph(warmup = 2)]
fn train_step(
    rt: &Runtime,
    #[state] data: &Data,
    #[state] tr: &mut Trainer,
) -> Result<(), GraphError> {
    tr.step(rt, data)
}

fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    let Some(rt) = runtime_or_skip("06-train-step") else {
        return Ok(());
    };
    let s = rt.stream().clone();

    // 2. Initial weights, a data set and its targets from a teacher network.
    let problem = Problem::new(SPEC, &mut seeded_rng(6));
    let data = problem.upload(&s)?;

    // 3. 200 eager steps: the function called directly, one synchronize at the end.
    let mut eager = problem.trainer(&rt)?;
    for _ in 0..STEPS {
        train_step(&rt, &data, &mut eager)?;
    }
    let eager_losses = s.clone_dtoh(&eager.losses)?;
    let eager_params = s.clone_dtoh(&eager.params)?;

    // 4. 200 graphed steps from the same weights. The warmup's two steps leave the trainer
    //    as it was: the graph snapshots its `&mut` state before them and restores it after.
    //    Then one launch per step.
    let mut graphed = problem.trainer(&rt)?;
    let mut graph = TrainStepGraph::capture(&rt, &data, &mut graphed)?;
    let nodes = graph.info().kinds.kernels;
    for _ in 0..STEPS {
        graph.launch()?;
    }
    let graph_losses = s.clone_dtoh(&graph.state_mut().tr.losses)?;
    let graph_params = s.clone_dtoh(&graph.state_mut().tr.params)?;
    // One more step checked against the eager function (state and generator rewound).
    let verify = verified(graph.verify(Tolerance::BITWISE)?)?;

    // 5. Bit for bit: the loss curves and the final weights.
    let bitwise = same_training(
        (&eager_losses, &graph_losses),
        Some((&eager_params, &graph_params)),
    );

    // 6. The eager curve against the host reference for the first steps.
    let cpu_err = max_rel_err(&eager_losses[..CPU_STEPS], &problem.host_losses(CPU_STEPS));

    // 7. Step time: more steps of both (the curves are already read).
    let iters = 200;
    let EagerGraph {
        eager_us,
        graph_us,
        eager_gpu_us,
        graph_gpu_us,
    } = EagerGraph::measure(
        &s,
        iters,
        || train_step(&rt, &data, &mut eager),
        || graph.launch().map(drop),
    )?;

    let device = rt.context().name().unwrap_or_default();
    println!(
        "training step of an MLP {:?}, batch {}, MSE, clip 1.0, AdamW, on {device}\n",
        SPEC.dims, SPEC.batch
    );
    let curve = loss_curves(
        &eager_losses,
        &graph_losses,
        &[0, 1, 9, 49, 99, 149, STEPS - 1],
    );
    print!("{}", curve.to_markdown());
    println!();
    let mut t = Table::new(&[
        "loop",
        ">kernels in graph",
        ">µs per step",
        ">GPU µs per step",
        ">speedup",
    ]);
    t.row(vec![
        "eager".into(),
        "–".into(),
        us(eager_us),
        us(eager_gpu_us),
        "1.00×".into(),
    ]);
    t.row(vec![
        "graph".into(),
        nodes.to_string(),
        us(graph_us),
        us(graph_gpu_us),
        times(eager_us / graph_us),
    ]);
    print!("{}", t.to_markdown());
    println!("\nfirst {CPU_STEPS} eager losses vs f64 host: max relative error {cpu_err:.1e}");
    println!("{verify}");
    let identical = bitwise.is_ok();
    if args.json {
        let dims = SPEC.dims_text();
        let what = format!("train step MLP {dims}, batch {}", SPEC.batch);
        let rec = Record::new("train", Side::Ours, "train", what, eager_us, graph_us)
            .shape("batch", SPEC.batch)
            .shape("dims", dims.as_str())
            .shape("steps", STEPS)
            .kernels(nodes)
            .check(
                "200-step loss curve and final weights bitwise, eager vs graph; 10 losses vs f64 host",
                identical && cpu_err < CPU_TOLERANCE,
            )
            .with("eager_gpu_us", eager_gpu_us)
            .with("graph_gpu_us", graph_gpu_us)
            .with("loss_first", eager_losses[0] as f64)
            .with("loss_last", eager_losses[STEPS - 1] as f64)
            .with("cpu_max_rel_err", cpu_err);
        println!("{}", rec.line());
    }

    bitwise?;
    if cpu_err >= CPU_TOLERANCE {
        return Err(format!("eager losses are off the host reference by {cpu_err:.1e}").into());
    }
    println!(
        "the {STEPS}-step loss curves and final weights of eager and graph are bitwise identical"
    );
    Ok(())
}
