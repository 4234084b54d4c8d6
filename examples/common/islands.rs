//! What `22-islands-sampler` and `23-islands-compaction` measure the same way: the host time of
//! a graph's launches (with the inputs as they are), and the two tables they print.

use std::time::{Duration, Instant};

use bench_report::table::{us, Table};
use graph_runtime::cudarc::driver::CudaStream;
use graph_runtime::GraphError;
use workloads::timing::wall_once;

/// Host µs per call of `calls` calls of `launch` (each returns once its work is queued), one
/// synchronize at the end.
pub fn launch_host_us(
    s: &CudaStream,
    calls: usize,
    mut launch: impl FnMut() -> Result<(), GraphError>,
) -> Result<f64, GraphError> {
    let mut host = Duration::ZERO;
    wall_once(s, || {
        for _ in 0..calls {
            let t = Instant::now();
            launch()?;
            host += t.elapsed();
        }
        Ok(())
    })?;
    Ok(host.as_secs_f64() * 1e6 / calls as f64)
}

/// The µs per `unit` of eager and graph, then where a launch's host time goes: the island's
/// own work (`own_us`, what it measured itself) and the rest, per segment.
pub fn print_tables(
    unit: &str,
    eager_us: f64,
    graph_us: f64,
    host_us: f64,
    own_us: f64,
    segments: usize,
) {
    let mut t = Table::new(&[unit, &format!(">µs per {unit}"), ">speedup"]);
    t.row(vec!["eager".into(), us(eager_us), "1.00×".into()]);
    t.row(vec![
        format!("graph, {segments} segments around the island"),
        us(graph_us),
        format!("{:.2}×", eager_us / graph_us),
    ]);
    print!("{}", t.to_markdown());
    println!(
        "\nhost time of a launch (the inputs as they are), µs per {unit} (the island's own work: \
         its reads, its host code, its writes):\n"
    );
    let mut h = Table::new(&[
        "launch",
        ">host",
        ">island's own work",
        ">the rest",
        ">per segment",
    ]);
    h.row(vec![
        "graph".into(),
        us(host_us),
        us(own_us),
        us(host_us - own_us),
        us((host_us - own_us) / segments as f64),
    ]);
    print!("{}", h.to_markdown());
}
