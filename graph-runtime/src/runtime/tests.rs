//! Unit tests of the kernel labels, the stream gate and the no-driver path.

use std::sync::atomic::Ordering;

use super::kernels::kernel_label;
use super::*;

#[test]
fn kernel_label_finds_the_first_kernel() {
    let src = r#"extern "C" __global__ void add_one(float *x, int n) { }"#;
    assert_eq!(kernel_label(src), "add_one");
    assert_eq!(kernel_label("int x;"), "<unnamed source>");
}

#[test]
fn gate_refuses_launches_while_capturing() {
    let gate = StreamGate::default();
    assert!(gate.launch("g", || Ok(())).is_ok());
    gate.begin_capture();
    let err = gate.launch("g", || Ok(())).unwrap_err();
    assert!(matches!(err, GraphError::StreamCapturing { graph: "g" }));
    gate.end_capture();
    assert!(gate.launch("g", || Ok(())).is_ok());
    assert_eq!(gate.state.load(Ordering::Relaxed), 0);
}

#[test]
fn other_threads_wait_for_a_capture_instead_of_failing() {
    let gate = std::sync::Arc::new(StreamGate::default());
    gate.begin_capture();
    let waiter = {
        let gate = gate.clone();
        std::thread::spawn(move || gate.launch("g", || Ok(42)))
    };
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert!(
        !waiter.is_finished(),
        "the other thread waits while the capture records"
    );
    gate.end_capture();
    assert_eq!(waiter.join().unwrap().unwrap(), 42);
    assert_eq!(gate.state.load(Ordering::Relaxed), 0);
}

#[test]
fn a_panic_inside_a_launch_leaves_the_gate() {
    let gate = StreamGate::default();
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        gate.launch::<()>("g", || panic!("in the staging closure"))
    }));
    assert!(caught.is_err());
    assert_eq!(gate.state.load(Ordering::Relaxed), 0);
    // A capture can begin (it would spin forever on a leaked launch).
    gate.begin_capture();
    gate.end_capture();
}

#[test]
fn no_driver_is_a_typed_error() {
    if driver_available() {
        eprintln!("skipped: a CUDA driver is present, the no-driver path cannot be seen here");
        return;
    }
    let err = Runtime::new(0).unwrap_err();
    assert!(matches!(err, GraphError::NoDriver));
    assert!(err.to_string().contains("no CUDA driver"));
}
