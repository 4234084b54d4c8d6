// Generic functions declared inside the body (bounds in the parameter list or in a where
// clause), and the methods of a generic `impl` there, are walked like the body: a parameter
// of a generic type may be a stream.
use graph_runtime::cudarc::driver::{CudaSlice, CudaStream, DriverError};
use graph_runtime::{cuda_graph, GraphError, Runtime};
use std::ops::Deref;

#[cuda_graph(warmup = 2)]
fn step(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    rt.stream().memcpy_dtod(x, y)?;
    fn wait<S: std::ops::Deref<Target = CudaStream>>(s: S) -> Result<(), DriverError> {
        s.synchronize()
    }
    fn settle<S>(s: &S) -> Result<(), DriverError>
    where
        S: Deref<Target = CudaStream>,
    {
        s.synchronize()
    }
    struct Lane<S>(S);
    impl<S: Deref<Target = CudaStream>> Lane<S> {
        fn wait(&self) -> Result<(), DriverError> {
            self.0.synchronize()
        }
    }
    wait(rt.stream().clone())?;
    settle(rt.stream())?;
    Lane(rt.stream().clone()).wait()?;
    Ok(())
}

fn main() {}
