// Variants of your own enum named like standard I/O types (`File`, `Stdout`, `Command`):
// a pattern or a variant is not a call, so none of this is host I/O.
// Look-alikes of: host-io
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};

#[derive(Clone, Copy, PartialEq)]
enum Sink {
    File,
    Stdout,
    Command(u8),
}

#[cuda_graph(warmup = 2)]
fn route(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    #[constant] sink: Sink,
) -> Result<(), GraphError> {
    let copies = match sink {
        Sink::File => 1,
        Sink::Stdout => 2,
        Sink::Command(n) => n as usize,
    };
    if let Sink::Command(_) = sink {
        debug_assert!(copies > 0);
    }
    let fallback = if matches!(sink, Sink::File) { Sink::Stdout } else { Sink::Command(1) };
    let _ = fallback == Sink::File;
    for _ in 0..copies {
        rt.stream().memcpy_dtod(x, y)?;
    }
    Ok(())
}

#[allow(dead_code)]
fn use_it(rt: &Runtime, x: &CudaSlice<f32>) -> Result<(), GraphError> {
    let _ = RouteGraph::capture(rt, x, x.len(), Sink::File)?;
    Ok(())
}

fn main() {}
