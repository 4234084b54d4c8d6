// Correct code that reads like a capture mistake: methods of your own reached through a
// field or a builder chain, a comparison with your own enum's variant, your own functions
// whose calls do not have the shape of the imported ones, constants, and a function
// declared in the body that only queues GPU work.
// Look-alikes of: thread-spawned-in-body
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};

struct Queue(usize);

impl Queue {
    fn synchronize(&self) -> usize {
        self.0
    }
    fn query(&self, key: usize) -> usize {
        self.0 + key
    }
    fn is_complete(&self) -> bool {
        self.0 > 0
    }
}

struct App {
    jobs: Queue,
}

fn make_app(n: usize) -> App {
    App { jobs: Queue(n) }
}

struct Client;

impl Client {
    fn builder() -> ClientBuilder {
        ClientBuilder(1)
    }
}

struct ClientBuilder(usize);

impl ClientBuilder {
    fn timeout(self, t: usize) -> Self {
        ClientBuilder(self.0 + t)
    }
    fn build(self) -> Queue {
        Queue(self.0)
    }
}

#[derive(PartialEq, Clone, Copy)]
enum Command {
    Reset,
    Run,
}

fn pick(n: usize) -> Command {
    if n == 0 {
        Command::Reset
    } else {
        Command::Run
    }
}

fn join(parts: &[&str], sep: &str) -> String {
    parts.join(sep)
}

fn scope(rt: &Runtime, n: usize) -> usize {
    rt.stream().context().ordinal() + n
}

const REPEATS: usize = 2;
static WEIGHTS: [f32; 2] = [0.5, 0.5];

#[cuda_graph(warmup = 2)]
fn step(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    fn copy(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
        rt.stream().memcpy_dtod(x, y)?;
        Ok(())
    }
    let app = make_app(x.len());
    let pending = app.jobs.synchronize() + app.jobs.query(1);
    let ready = Client::builder().timeout(5).build().is_complete();
    let cmd = pick(pending);
    if cmd == Command::Reset || !ready || WEIGHTS[0] > 1.0 {
        rt.stream().memset_zeros(y)?;
    }
    let _label = join(&["a", "b"], ",");
    for _ in 0..scope(rt, REPEATS).min(REPEATS) {
        copy(rt, x, y)?;
    }
    Ok(())
}

#[allow(dead_code)]
fn use_it(rt: &Runtime, x: &CudaSlice<f32>) -> Result<(), GraphError> {
    let _ = StepGraph::capture(rt, x, x.len())?;
    Ok(())
}

fn main() {}
