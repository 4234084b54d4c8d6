// candle code that only looks like a host read: a copy to the tensor's own (CUDA) device,
// tensor ops in place of a host branch, and methods of your own types named like candle's
// reads (`to_vec1`, `to_scalar`, `to_device(&Device::Cpu)`). `ui_tests::candle` stands in
// for candle_core: the checks see names, not types.
// Look-alikes of: candle-host-read, candle-branch-on-device-data
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, DeviceState, GraphError, Runtime};
use ui_tests::candle::{Device, Tensor};

/// Host-side counts of your own.
struct Histogram {
    bins: Vec<usize>,
}

impl Histogram {
    fn new(bins: usize) -> Self {
        Histogram {
            bins: vec![1; bins],
        }
    }

    fn to_vec1(&self) -> Vec<usize> {
        self.bins.clone()
    }
}

/// A launch plan of your own, with a `to_device` that takes candle's device.
#[derive(Default)]
struct Plan {
    copies: usize,
}

impl Plan {
    fn to_device(&self, device: &Device) -> Plan {
        let copies = match device {
            Device::Cpu => self.copies,
            Device::Cuda(_) => self.copies + 1,
        };
        Plan { copies }
    }
}

/// Step statistics of your own, given as state.
#[derive(DeviceState)]
struct Stats {
    steps: usize,
}

impl Stats {
    fn to_scalar(&self) -> usize {
        self.steps
    }
}

#[cuda_graph(warmup = 2)]
fn step(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    #[state] w: &Tensor,
    #[state] stats: &Stats,
) -> Result<(), GraphError> {
    // To the tensor's own device: device memory to device memory.
    let _same = w.to_device(w.device())?;
    // A decision kept on the GPU: tensor ops, no host branch.
    let _clipped = w.ge(1.0)?.where_cond(w, &w.zeros_like()?)?;
    // Your own types' methods with candle's names.
    let bins = Histogram::new(2).to_vec1();
    let plan = Plan::default().to_device(&Device::Cpu);
    for _ in 0..bins.len() + plan.copies + stats.to_scalar() {
        rt.stream().memcpy_dtod(x, y)?;
    }
    Ok(())
}

#[allow(dead_code)]
fn use_it(rt: &Runtime, x: &CudaSlice<f32>, w: &Tensor) -> Result<(), GraphError> {
    let stats = Stats { steps: 1 };
    let _ = StepGraph::capture(rt, x, x.len(), w, &stats)?;
    Ok(())
}

fn main() {}
