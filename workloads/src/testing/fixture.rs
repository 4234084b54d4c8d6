//! What a `#[gpu_test]` is given: its parameter's type implements [`GpuFixture`].

use graph_runtime::{GraphError, Runtime};

use super::means_no_gpu;

/// What a [`gpu_test`](super::gpu_test) function takes as its one parameter, set up by the
/// harness before the test runs: a [`Runtime`] on device 0, or (feature `nccl`) a
/// `graph_runtime::nccl::CommGroup` of as many ranks as the test asks GPUs.
///
/// The harness calls [`GpuFixture::set_up`] only on a machine with at least the GPUs the
/// test asks for. When it fails, [`GpuFixture::lacking`] tells a machine that lacks
/// something the test needs (a library, a driver) from a set-up that failed: the first
/// counts as *ignored* with that reason (a failure with `CUDA_GRAPH_REQUIRE_GPU=1`), the
/// second as *failed*.
#[diagnostic::on_unimplemented(
    message = "a `#[gpu_test]` cannot be given a `{Self}`",
    label = "the test's parameter",
    note = "a `#[gpu_test]` takes `rt: Runtime`, or `group: CommGroup` with `workloads`' feature `nccl` (`#[gpu_test(gpus = 2)]`)"
)]
pub trait GpuFixture: Sized {
    /// What it is, in the message of a failed set-up (`the runtime`).
    const WHAT: &'static str;

    /// Sets it up for a test that asks for `gpus` GPUs.
    fn set_up(gpus: usize) -> Result<Self, GraphError>;

    /// When `e`, returned by [`GpuFixture::set_up`], means that this machine lacks something
    /// the test needs rather than that the set-up failed: that thing, in a few words
    /// (`no CUDA driver`).
    fn lacking(e: &GraphError) -> Option<String>;
}

impl GpuFixture for Runtime {
    const WHAT: &'static str = "the runtime";

    /// A fresh runtime on device 0 (the test opens any other device itself).
    fn set_up(_gpus: usize) -> Result<Self, GraphError> {
        Runtime::new(0)
    }

    fn lacking(e: &GraphError) -> Option<String> {
        means_no_gpu(e).then(|| short_reason(e))
    }
}

#[cfg(feature = "nccl")]
impl GpuFixture for graph_runtime::nccl::CommGroup {
    const WHAT: &'static str = "the communicator group";

    /// A group of one rank per GPU the test asks for (`group.run(&[0, 1], …)` starts them).
    fn set_up(gpus: usize) -> Result<Self, GraphError> {
        graph_runtime::nccl::CommGroup::new(gpus)
    }

    /// No usable GPU, or no loadable libnccl. (An NCCL that loads but is too old is a
    /// failure: it is there, and must be replaced.)
    fn lacking(e: &GraphError) -> Option<String> {
        use graph_runtime::nccl::CollectiveError;
        match e.collective() {
            Some(CollectiveError::LibraryMissing { .. }) => Some("no loadable libnccl".into()),
            _ => means_no_gpu(e).then(|| short_reason(e)),
        }
    }
}

/// A missing GPU in a few words, for the line of each ignored test.
pub(crate) fn short_reason(e: &GraphError) -> String {
    match e {
        GraphError::NoDriver => "no CUDA driver".into(),
        GraphError::NoDevice { ordinal, .. } => format!("no CUDA device {ordinal}"),
        GraphError::MissingLibrary { library } => format!("no {library} library"),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn a_runtime_lacks_only_what_means_no_gpu() {
        assert_eq!(
            Runtime::lacking(&GraphError::NoDriver).as_deref(),
            Some("no CUDA driver")
        );
        assert_eq!(Runtime::lacking(&GraphError::User("boom".into())), None);
    }

    #[cfg(feature = "nccl")]
    #[test]
    fn a_group_lacks_a_missing_libnccl_but_not_an_old_one() {
        use graph_runtime::nccl::{CollectiveError, CommGroup};
        let missing: GraphError = CollectiveError::LibraryMissing {
            searched: vec!["libnccl.so".into()],
            found: vec![],
        }
        .into();
        assert_eq!(
            CommGroup::lacking(&missing).as_deref(),
            Some("no loadable libnccl")
        );
        let old: GraphError = CollectiveError::LibraryTooOld {
            found: "2.12.12".into(),
            required: "2.19",
        }
        .into();
        assert_eq!(CommGroup::lacking(&old), None);
        assert_eq!(
            CommGroup::lacking(&GraphError::NoDriver).as_deref(),
            Some("no CUDA driver")
        );
    }
}
