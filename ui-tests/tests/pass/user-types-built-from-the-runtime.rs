// A type of your own built from the runtime or a device value keeps every method that is not
// named like something it could forward to a stream or an event: a sampler's `sample` and
// `shuffle` are not host randomness, a job's `query` is not CUDA's when its `device` field is
// an ordinal given as a constant.
// Look-alikes of: cpu-randomness, stream-or-event-query
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};

/// A sampler of your own that keeps device buffers.
struct Sampler {
    temperature: f32,
    calls: u32,
}

impl Sampler {
    fn new(rt: &Runtime, temperature: f32) -> Self {
        let _ = rt;
        Sampler {
            temperature,
            calls: 0,
        }
    }

    fn sample(&mut self, x: &CudaSlice<f32>) -> usize {
        self.calls += 1;
        x.len() / 2 + (self.temperature as usize)
    }

    fn shuffle(&mut self) -> u32 {
        self.calls
    }
}

/// A job of your own, with the ordinal of the GPU it runs on.
struct Job {
    id: u32,
    device: u32,
}

impl Job {
    fn query(&self) -> u32 {
        self.id + self.device
    }
}

#[cuda_graph(warmup = 2)]
fn step(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    #[constant] device: u32,
) -> Result<(), GraphError> {
    let mut sampler = Sampler::new(rt, 0.8);
    let picked = sampler.sample(x) + sampler.shuffle() as usize;
    let job = Job { id: 1, device };
    for _ in 0..(picked + job.query() as usize) % 3 {
        rt.stream().memcpy_dtod(x, y)?;
    }
    Ok(())
}

fn main() {}
