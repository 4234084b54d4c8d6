// Look-alikes of the logging and clock rules that are neither: a tracing span (it prints
// nothing by itself) and an `elapsed(layer)` method of the user's, which takes an argument
// (`Instant::elapsed` takes none).
// Look-alikes of: host-log, host-clock
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};

#[derive(Clone, Copy)]
struct LayerPlan {
    widths: [usize; 2],
}

impl LayerPlan {
    fn elapsed(&self, layer: usize) -> usize {
        self.widths[layer % 2]
    }
}

#[derive(Clone, Copy)]
struct Config {
    plan: LayerPlan,
}

#[cuda_graph(warmup = 2)]
fn spans(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    #[constant] cfg: Config,
) -> Result<(), GraphError> {
    let _span = tracing::trace_span!("layer", n = x.len()).entered();
    let _inner = tracing::debug_span!("copy").entered();
    if cfg.plan.elapsed(1) == 0 {
        return Err(GraphError::User("empty plan".into()));
    }
    rt.stream().memcpy_dtod(x, y)?;
    Ok(())
}

#[allow(dead_code)]
fn use_it(rt: &Runtime, x: &CudaSlice<f32>) -> Result<(), GraphError> {
    let cfg = Config {
        plan: LayerPlan { widths: [4, 8] },
    };
    let _ = SpansGraph::capture(rt, x, x.len(), cfg)?;
    Ok(())
}

fn main() {}
