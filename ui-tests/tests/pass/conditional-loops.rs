// Loops and branches on device data: `graph_while`, `graph_if` and `graph_if_else` with a
// condition a kernel sets. Eagerly they read the condition inside the runtime (the one host
// read a body may contain); captured they are conditional nodes. The checker accepts them and
// walks their closures like the rest of the body.
use graph_runtime::cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use graph_runtime::{cuda_graph, Compare, GraphError, Runtime};

const SRC: &str = concat!(
    graph_runtime::condition_device_api!(),
    r#"
extern "C" __global__ void halve(float *x, GraphCondition go) {
    if (threadIdx.x == 0) {
        x[0] *= 0.5f;
        graph_condition_set(go, x[0] > 1.0f);
    }
}
"#
);

#[cuda_graph(warmup = 1)]
fn halve_until_small(
    rt: &Runtime,
    #[state] x: &mut CudaSlice<f32>,
    #[state] steps: &mut CudaSlice<u32>,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    let halve = rt.function(SRC, "halve")?;
    let go = rt.condition(true)?;
    let big = rt.condition(false)?;
    let big_too = rt.condition(false)?; // one condition per construct
    rt.graph_while(&go, Some(64), |rt| {
        let arg = go.kernel_arg(rt);
        // SAFETY: `halve` reads and writes x[0] and sets the condition; one thread.
        unsafe {
            rt.stream()
                .launch_builder(&halve)
                .arg(&mut *x)
                .arg(&arg)
                .launch(LaunchConfig::for_num_elems(1))
        }?;
        rt.stream().memset_zeros(&mut *steps)?;
        Ok(())
    })?;
    big.set_from(rt, &*x, Compare::Gt, 0.75)?;
    big_too.set_from(rt, &*x, Compare::Gt, 0.75)?;
    rt.graph_if(&big, |rt| {
        rt.stream().memcpy_dtod(&*x, &mut *y)?;
        Ok(())
    })?;
    rt.graph_if_else(&big_too, |rt, big| {
        if big {
            rt.stream().memset_zeros(&mut *steps)?;
        } else {
            rt.stream().memset_zeros(&mut *y)?;
        }
        Ok(())
    })
}

fn main() {}
