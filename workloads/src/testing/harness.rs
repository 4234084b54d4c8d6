//! The runner of test binaries built with `harness = false`: the tests that `#[gpu_test]` and
//! `#[cpu_test]` registered, run by libtest-mimic, so that the output and the command line are
//! libtest's (`--test-threads`, filters, `--exact`, `--list`, `--ignored`, `--nocapture`, the
//! `test result: … N passed; N failed; N ignored …` summary).
//!
//! Before the run the harness looks at the machine once ([`usable_gpus`]). A GPU test then
//! * on a machine without a usable GPU is *ignored*, each with a short reason on its own line
//!   and one line before the run saying why in full; with `CUDA_GRAPH_REQUIRE_GPU=1` it
//!   *fails* instead, with the reason;
//! * asking for more GPUs than the machine has (`#[gpu_test(gpus = 2)]` on one GPU) is
//!   *ignored*, saying how many it needs, also with `CUDA_GRAPH_REQUIRE_GPU=1`;
//! * otherwise gets its parameter set up ([`GpuFixture::set_up`]): a machine that lacks
//!   something it needs ([`GpuFixture::lacking`], a libnccl that does not load) makes it
//!   *ignored* (failed with `CUDA_GRAPH_REQUIRE_GPU=1`, with the typed error), any other
//!   set-up error *fails* it, and then it runs. Tests of more than one GPU run one at a time.

use std::collections::BTreeSet;
use std::fmt::Display;
use std::process::ExitCode;
use std::sync::{Mutex, MutexGuard};

use libtest_mimic::{Arguments, Completion, Failed, Trial};

use super::fixture::short_reason;
use super::{gpu_required, init_tracing, usable_gpus, GpuFixture, REQUIRE_GPU};

/// One registered test: its path (`crate::module::name`) and its body.
#[doc(hidden)]
pub struct Test {
    path: &'static str,
    body: Body,
}

enum Body {
    /// A test of `gpus` GPUs: `run` sets up its parameter and calls it.
    Gpu {
        gpus: usize,
        run: fn(usize) -> Attempt,
    },
    Cpu(fn() -> Result<(), String>),
}

impl Test {
    /// A test that needs `gpus` GPUs; `run(gpus)` is [`attempt`] on the test function.
    pub const fn gpu(path: &'static str, gpus: usize, run: fn(usize) -> Attempt) -> Self {
        Test {
            path,
            body: Body::Gpu { gpus, run },
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

    /// GPUs it needs (0 for a CPU test).
    fn gpus(&self) -> usize {
        match self.body {
            Body::Gpu { gpus, .. } => gpus,
            Body::Cpu(_) => 0,
        }
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

/// How far a GPU test got once the machine had its GPUs.
#[doc(hidden)]
#[derive(Debug, Clone, PartialEq)]
pub enum Attempt {
    /// The machine lacks something the test needs: in a few words, and in full.
    Lacking {
        /// For the test's line (`no loadable libnccl`).
        short: String,
        /// The typed error, with its fix.
        full: String,
    },
    /// Setting up the test's parameter failed: the message.
    SetUpFailed(String),
    /// The test ran: its outcome.
    Ran(Result<(), String>),
}

/// Sets up the parameter of `test` for `gpus` GPUs and runs it.
#[doc(hidden)]
pub fn attempt<F, T>(gpus: usize, test: impl FnOnce(F) -> T) -> Attempt
where
    F: GpuFixture,
    T: TestResult,
{
    match F::set_up(gpus) {
        Ok(fixture) => Attempt::Ran(outcome(test(fixture))),
        Err(e) => match F::lacking(&e) {
            Some(short) => Attempt::Lacking {
                short,
                full: e.to_string(),
            },
            None => Attempt::SetUpFailed(format!("{} could not be set up: {e}", F::WHAT)),
        },
    }
}

/// The machine as the harness saw it before the run: its GPUs, or why it has none (in full
/// and in a few words).
type Machine = Result<usize, (String, String)>;

/// What becomes of a GPU test before its parameter is set up.
#[derive(Debug, PartialEq)]
enum Plan {
    Run,
    Ignore(String),
    Fail(String),
}

/// The plan for a test of `gpus` GPUs on `machine`.
fn plan(machine: &Machine, gpus: usize, required: bool) -> Plan {
    match machine {
        Err((why, _)) if required => {
            Plan::Fail(format!("{REQUIRE_GPU}=1 but there is no usable GPU: {why}"))
        }
        Err((_, short)) => Plan::Ignore(short.clone()),
        Ok(have) if *have < gpus => {
            Plan::Ignore(format!("needs {gpus} GPUs, this machine has {have}"))
        }
        Ok(_) => Plan::Run,
    }
}

/// What a GPU test came to.
#[derive(Debug, PartialEq)]
enum Verdict {
    Passed,
    Ignored(String),
    Failed(String),
}

impl Verdict {
    fn completion(self) -> Result<Completion, Failed> {
        match self {
            Verdict::Passed => Ok(Completion::Completed),
            Verdict::Ignored(reason) => Ok(Completion::ignored_with(reason)),
            Verdict::Failed(message) => Err(message.into()),
        }
    }
}

/// What test `name` of `gpus` GPUs came to, from how far it got. Failures to set up are
/// prefixed with the test's name; the test's own failure is its message.
fn judge(attempt: Attempt, name: &str, gpus: usize, required: bool) -> Verdict {
    match attempt {
        Attempt::Ran(Ok(())) => Verdict::Passed,
        Attempt::Ran(Err(message)) => Verdict::Failed(message),
        Attempt::Lacking { full, .. } if required => Verdict::Failed(format!(
            "{name}: {REQUIRE_GPU}=1 and this machine has the {gpus} GPU(s) the test needs, but {full}"
        )),
        Attempt::Lacking { short, full } => {
            say_once(&full);
            Verdict::Ignored(short)
        }
        Attempt::SetUpFailed(message) => Verdict::Failed(format!("{name}: {message}")),
    }
}

/// Prints a full reason for ignored tests once per test binary (each test's line has the
/// short one).
fn say_once(full: &str) {
    static SAID: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());
    let mut said = SAID.lock().unwrap_or_else(|p| p.into_inner());
    if said.insert(full.to_owned()) {
        eprintln!("GPU tests ignored because {full}");
    }
}

/// Held while a test of more than one GPU runs: one at a time (each may start a thread and a
/// communicator per GPU).
fn multi_gpu_lock() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

fn trial(test: &'static Test, machine: &Machine) -> Trial {
    let name = test.name();
    match test.body {
        Body::Cpu(body) => Trial::test(name, move || body().map_err(Failed::from)),
        Body::Gpu { gpus, run } => {
            let required = gpu_required();
            let plan = plan(machine, gpus, required);
            Trial::ignorable_test(name, move || match plan {
                Plan::Ignore(reason) => Ok(Completion::ignored_with(reason)),
                Plan::Fail(message) => Err(format!("{name}: {message}").into()),
                Plan::Run => {
                    let _one_at_a_time = (gpus > 1).then(multi_gpu_lock);
                    judge(run(gpus), name, gpus, required).completion()
                }
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
    let gpu_tests: Vec<usize> = tests.iter().map(|t| t.gpus()).filter(|&g| g > 0).collect();
    let machine: Machine = if gpu_tests.is_empty() {
        Ok(0)
    } else {
        usable_gpus().map_err(|e| (e.to_string(), short_reason(&e)))
    };
    if !args.list {
        match &machine {
            Err((why, _)) if !gpu_required() => println!(
                "{} GPU tests are ignored on this machine (CUDA_GRAPH_REQUIRE_GPU=1 makes them fail): {why}",
                gpu_tests.len()
            ),
            Ok(have) => {
                let more = gpu_tests.iter().filter(|&&g| g > *have).count();
                if more > 0 {
                    println!("{more} GPU tests need more GPUs than this machine's {have}: they are ignored");
                }
            }
            Err(_) => {}
        }
    }
    let trials = tests.into_iter().map(|t| trial(t, &machine)).collect();
    libtest_mimic::run(&args, trials).exit_code()
}

#[cfg(test)]
mod tests {
    use super::*;
    use graph_runtime::GraphError;

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

    fn no_driver() -> Machine {
        Err((
            "no CUDA driver: libcuda could not be loaded".into(),
            "no CUDA driver".into(),
        ))
    }

    #[test]
    fn without_a_gpu_tests_are_ignored_or_fail_when_required() {
        for gpus in [1, 2] {
            assert_eq!(
                plan(&no_driver(), gpus, false),
                Plan::Ignore("no CUDA driver".into())
            );
            let Plan::Fail(message) = plan(&no_driver(), gpus, true) else {
                panic!("a required GPU that is missing must fail");
            };
            assert!(
                message.starts_with(
                    "CUDA_GRAPH_REQUIRE_GPU=1 but there is no usable GPU: no CUDA driver"
                ),
                "{message}"
            );
        }
    }

    #[test]
    fn too_few_gpus_are_ignored_even_when_required() {
        for required in [false, true] {
            assert_eq!(
                plan(&Ok(1), 2, required),
                Plan::Ignore("needs 2 GPUs, this machine has 1".into())
            );
            assert_eq!(plan(&Ok(1), 1, required), Plan::Run);
            assert_eq!(plan(&Ok(2), 2, required), Plan::Run);
            assert_eq!(plan(&Ok(8), 2, required), Plan::Run);
        }
    }

    #[test]
    fn a_missing_library_is_ignored_unless_required() {
        let lacking = || Attempt::Lacking {
            short: "no loadable libnccl".into(),
            full: "NCCL could not be loaded: … Fix: …".into(),
        };
        assert_eq!(
            judge(lacking(), "t", 2, false),
            Verdict::Ignored("no loadable libnccl".into())
        );
        let Verdict::Failed(message) = judge(lacking(), "t", 2, true) else {
            panic!("a missing library must fail when the GPU is required");
        };
        assert!(
            message.starts_with("t: CUDA_GRAPH_REQUIRE_GPU=1 and this machine has the 2 GPU(s)"),
            "{message}"
        );
        assert!(
            message.ends_with("but NCCL could not be loaded: … Fix: …"),
            "{message}"
        );
    }

    #[test]
    fn set_up_failures_and_test_results_pass_through() {
        for required in [false, true] {
            let failed = Attempt::SetUpFailed("the runtime could not be set up: x".into());
            assert_eq!(
                judge(failed, "t", 1, required),
                Verdict::Failed("t: the runtime could not be set up: x".into())
            );
            assert_eq!(
                judge(Attempt::Ran(Ok(())), "t", 1, required),
                Verdict::Passed
            );
            assert_eq!(
                judge(Attempt::Ran(Err("Error: boom".into())), "t", 1, required),
                Verdict::Failed("Error: boom".into())
            );
        }
    }

    /// A stand-in parameter whose set-up fails as asked.
    struct Fake(usize);

    impl GpuFixture for Fake {
        const WHAT: &'static str = "the fake";
        fn set_up(gpus: usize) -> Result<Self, GraphError> {
            match gpus {
                7 => Err(GraphError::NoDriver),
                8 => Err(GraphError::User("broken".into())),
                n => Ok(Fake(n)),
            }
        }
        fn lacking(e: &GraphError) -> Option<String> {
            matches!(e, GraphError::NoDriver).then(|| "nothing here".into())
        }
    }

    #[test]
    fn attempts_set_up_then_run() {
        let seen = |f: Fake| -> Result<(), String> {
            match f.0 {
                2 => Ok(()),
                n => Err(format!("got {n}")),
            }
        };
        assert_eq!(attempt(2, seen), Attempt::Ran(Ok(())));
        assert_eq!(
            attempt(3, seen),
            Attempt::Ran(Err("Error: got 3\n(\"got 3\")".into()))
        );
        assert!(matches!(
            attempt(7, seen),
            Attempt::Lacking { short, full } if short == "nothing here" && full.starts_with("no CUDA driver")
        ));
        assert_eq!(
            attempt(8, seen),
            Attempt::SetUpFailed("the fake could not be set up: broken".into())
        );
    }
}
