//! The runner of test binaries built with `harness = false`: the tests that `#[gpu_test]` and
//! `#[cpu_test]` registered, run by libtest-mimic, so that the output and the command line are
//! libtest's (`--test-threads`, filters, `--exact`, `--list`, `--ignored`, `--nocapture`, the
//! `test result: … N passed; N failed; N ignored …` summary).
//!
//! A GPU test on a machine without a usable GPU is *ignored*, each with a short reason on its
//! own line, and one line before the run says why in full. With `CUDA_GRAPH_REQUIRE_GPU=1` it
//! runs instead, and fails because there is no runtime to give it.

use std::fmt::Display;
use std::process::ExitCode;

use graph_runtime::{GraphError, Runtime};
use libtest_mimic::{Arguments, Completion, Failed, Trial};

use super::{gpu_required, init_tracing, means_no_gpu, REQUIRE_GPU};

/// One registered test: its path (`crate::module::name`) and its body.
#[doc(hidden)]
pub struct Test {
    path: &'static str,
    body: Body,
}

enum Body {
    Gpu(fn(Runtime) -> Result<(), String>),
    Cpu(fn() -> Result<(), String>),
}

impl Test {
    /// A test that needs a GPU.
    pub const fn gpu(path: &'static str, body: fn(Runtime) -> Result<(), String>) -> Self {
        Test {
            path,
            body: Body::Gpu(body),
        }
    }

    /// A test that runs on the CPU.
    pub const fn cpu(path: &'static str, body: fn() -> Result<(), String>) -> Self {
        Test {
            path,
            body: Body::Cpu(body),
        }
    }

    /// The name libtest would give it: the path without the crate's name.
    fn name(&self) -> &'static str {
        self.path
            .split_once("::")
            .map_or(self.path, |(_, rest)| rest)
    }
}

inventory::collect!(Test);

/// What a test function returned, as the runner takes it: `()` and `Ok(())` pass, an `Err`
/// fails with its message (as libtest's `Termination` does for `#[test]` functions).
#[doc(hidden)]
pub fn outcome<T: TestResult>(result: T) -> Result<(), String> {
    result.into_result()
}

/// What a test function may return.
#[doc(hidden)]
pub trait TestResult {
    /// `Ok(())` for a pass, the message of a failure.
    fn into_result(self) -> Result<(), String>;
}

impl TestResult for () {
    fn into_result(self) -> Result<(), String> {
        Ok(())
    }
}

impl<E: Display + std::fmt::Debug> TestResult for Result<(), E> {
    fn into_result(self) -> Result<(), String> {
        self.map_err(|e| format!("Error: {e}\n({e:?})"))
    }
}

/// Why GPU tests cannot run here, in full and in a few words; `None` when there is a usable
/// GPU (or `CUDA_GRAPH_REQUIRE_GPU=1`, when there must be one and nothing is ignored).
fn no_gpu_here() -> Option<(String, String)> {
    if gpu_required() {
        return None;
    }
    match Runtime::new(0) {
        Ok(_) => None,
        Err(e) if means_no_gpu(&e) => Some((e.to_string(), short_reason(&e))),
        // A GPU that is there but fails: every GPU test runs and reports it.
        Err(_) => None,
    }
}

/// A missing GPU in a few words, for the line of each ignored test.
fn short_reason(e: &GraphError) -> String {
    match e {
        GraphError::NoDriver => "no CUDA driver".into(),
        GraphError::NoDevice { ordinal, .. } => format!("no CUDA device {ordinal}"),
        GraphError::MissingLibrary { library } => format!("no {library} library"),
        other => other.to_string(),
    }
}

/// The runtime a GPU test gets: a fresh one on device 0.
fn runtime_for(name: &str) -> Result<Runtime, Failed> {
    Runtime::new(0).map_err(|e| {
        if means_no_gpu(&e) && gpu_required() {
            format!("{name}: {REQUIRE_GPU}=1 but there is no usable GPU: {e}").into()
        } else {
            format!("{name}: the runtime failed to start: {e}").into()
        }
    })
}

fn trial(test: &'static Test, no_gpu: Option<&str>) -> Trial {
    let name = test.name();
    match test.body {
        Body::Cpu(body) => Trial::test(name, move || body().map_err(Failed::from)),
        Body::Gpu(body) => {
            let no_gpu = no_gpu.map(str::to_owned);
            Trial::ignorable_test(name, move || {
                if let Some(reason) = no_gpu {
                    return Ok(Completion::ignored_with(reason));
                }
                body(runtime_for(name)?).map_err(Failed::from)?;
                Ok(Completion::Completed)
            })
        }
    }
}

/// Runs the tests registered in this binary with libtest's command line and output, and
/// returns the exit code for `main`.
pub fn run_tests() -> ExitCode {
    init_tracing();
    let args = Arguments::from_args();
    let mut tests: Vec<&'static Test> = inventory::iter::<Test>.into_iter().collect();
    tests.sort_by_key(|t| t.name());
    let gpu_tests = tests
        .iter()
        .filter(|t| matches!(t.body, Body::Gpu(_)))
        .count();
    let no_gpu = if gpu_tests > 0 { no_gpu_here() } else { None };
    if let (Some((why, _)), false) = (&no_gpu, args.list) {
        println!("{gpu_tests} GPU tests are ignored on this machine: {why}");
    }
    let trials = tests
        .into_iter()
        .map(|t| trial(t, no_gpu.as_ref().map(|(_, short)| short.as_str())))
        .collect();
    libtest_mimic::run(&args, trials).exit_code()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_drop_the_crate() {
        fn pass() -> Result<(), String> {
            Ok(())
        }
        assert_eq!(
            Test::cpu("rng::two_generators", pass).name(),
            "two_generators"
        );
        assert_eq!(Test::cpu("rng::inner::case", pass).name(), "inner::case");
        assert_eq!(Test::cpu("alone", pass).name(), "alone");
    }

    #[test]
    fn results_become_outcomes() {
        assert_eq!(outcome(()), Ok(()));
        assert_eq!(outcome(Ok::<(), String>(())), Ok(()));
        let err = outcome(Err::<(), _>(GraphError::NoDriver)).unwrap_err();
        assert!(err.starts_with("Error: no CUDA driver"), "{err}");
        assert!(err.contains("NoDriver"), "{err}");
    }

    #[test]
    fn missing_gpus_in_a_few_words() {
        assert_eq!(short_reason(&GraphError::NoDriver), "no CUDA driver");
        assert_eq!(
            short_reason(&GraphError::NoDevice {
                ordinal: 0,
                count: 0
            }),
            "no CUDA device 0"
        );
        assert_eq!(
            short_reason(&GraphError::MissingLibrary { library: "nvrtc" }),
            "no nvrtc library"
        );
    }
}
