//! [`CollectiveError`]: what can go wrong with collectives, in the user's terms.

use std::panic::Location;
use std::path::PathBuf;
use std::time::Duration;

/// Everything that can go wrong with NCCL collectives: setting up a group, issuing a
/// collective, and capturing collectives on every rank. Reached as
/// [`GraphError::Collective`](crate::GraphError::Collective);
/// [`GraphError::collective`](crate::GraphError::collective) finds one inside a warmup or
/// body error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CollectiveError {
    /// libnccl could not be loaded.
    #[error(
        "NCCL could not be loaded:\ncudarc looks for {} on the loader's search path and found \
         none of them{}. Fix: {}",
        .searched.join(", "),
        found_text(.found),
        missing_fix(.found)
    )]
    LibraryMissing {
        /// The file names cudarc tried, in order.
        searched: Vec<String>,
        /// Copies of `libnccl.so.2` found on this machine under a name cudarc does not try.
        found: Vec<PathBuf>,
    },

    /// The NCCL library is older than the runtime supports.
    #[error(
        "the NCCL library loaded is {found}, older than {required},\nthe first with what the \
         runtime calls (ncclCommFinalize, ncclGetLastError, graph capture of collectives). \
         Fix: put a newer libnccl.so.2 first on LD_LIBRARY_PATH (PyTorch's wheel ships one)"
    )]
    LibraryTooOld {
        /// The version found (`2.12.12`).
        found: String,
        /// The oldest version supported.
        required: &'static str,
    },

    /// A group of no ranks was asked for, or a rank (to join, or a broadcast's root) is out
    /// of range.
    #[error(
        "rank {rank} is out of range for a group of {world} rank(s):\nranks are numbered from 0 \
         to the group's size - 1, and a group has at least one"
    )]
    RankOutOfRange {
        /// The rank that was asked for.
        rank: usize,
        /// The group's size.
        world: usize,
    },

    /// [`CommGroup::run`](crate::nccl::CommGroup::run) was given another number of devices
    /// than the group has ranks.
    #[error(
        "`CommGroup::run` got {given} device(s) for a group of {world} rank(s);\nit runs one \
         rank per device. Fix: pass one device ordinal per rank"
    )]
    DeviceCount {
        /// Devices given.
        given: usize,
        /// Ranks in the group.
        world: usize,
    },

    /// A rank joined its group twice.
    #[error(
        "rank {rank} already joined this group;\neach rank joins once and keeps its \
         `Communicator`. Fix: join once per rank (one thread per GPU), or make a new \
         `CommGroup` for a second communicator"
    )]
    AlreadyJoined {
        /// The rank.
        rank: usize,
    },

    /// Two ranks of one group are on the same device.
    #[error(
        "ranks {first} and {second} of the group are both on device {ordinal};\nNCCL needs one \
         rank per GPU in a communicator. Fix: give each rank its own device \
         (`Runtime::new(rank)`)"
    )]
    DuplicateDevice {
        /// The device.
        ordinal: usize,
        /// The lower rank.
        first: usize,
        /// The other rank.
        second: usize,
    },

    /// A buffer given to a collective has the wrong number of elements.
    #[error(
        "`{op}` at {location} on rank {rank}: {detail};\nnothing was issued. Fix: size the \
         buffers as NCCL expects (all_gather: receive = send × ranks; reduce_scatter: send = \
         receive × ranks; all_reduce and broadcast: the same length)"
    )]
    Shape {
        /// The collective.
        op: &'static str,
        /// This rank.
        rank: usize,
        /// Which buffer, how long it is and how long it must be.
        detail: String,
        /// Where it was called.
        location: &'static Location<'static>,
    },

    /// A buffer given to a collective lives on another device than the rank's.
    #[error(
        "`{op}` at {location}: rank {rank} runs on device {ordinal},\nbut a buffer it was \
         given is on device {buffer_ordinal}; nothing was issued. Fix: allocate each rank's \
         buffers from its own runtime (`comm.runtime().stream()`)"
    )]
    WrongDevice {
        /// The collective.
        op: &'static str,
        /// This rank.
        rank: usize,
        /// The rank's device.
        ordinal: usize,
        /// The buffer's device.
        buffer_ordinal: usize,
        /// Where it was called.
        location: &'static Location<'static>,
    },

    /// A graph with collectives was captured outside [`Communicator::capture`](crate::nccl::Communicator::capture).
    #[error(
        "`{op}` at {location} was called while {phase} `{graph}`,\noutside `comm.capture(…)`: \
         every rank must capture a graph with collectives together, so that the runtime can \
         check that they record the same collectives before any rank keeps its graph. \
         Fix: capture as `comm.capture(|| {0}Graph::capture(…))` on every rank; a bucket family as \
         `comm.capture(|| {0}Buckets::capture(…))`, and each replay of a lazy one that may capture a \
         bucket as `comm.capture(|| family.replay(…))`",
        .graph_type
    )]
    OutsideCapture {
        /// The collective.
        op: &'static str,
        /// `warming up` or `capturing`.
        phase: &'static str,
        /// The graph.
        graph: &'static str,
        /// The graph's type name, for the fix (`TpMlp`).
        graph_type: String,
        /// Where it was called.
        location: &'static Location<'static>,
    },

    /// A collective inside a captured body was issued on a communicator whose stream is not
    /// the one being captured: it would run once, now, and never on replay.
    #[error(
        "`{op}` at {location} was called while capturing `{graph}`,\nbut the communicator's \
         stream (device {ordinal}) is not the one being captured: the collective would run \
         once, now, and never on replay, while the other ranks' graphs wait for it. Fix: \
         capture on the runtime the communicator was joined with (`comm.runtime()`)"
    )]
    NotOnCaptureStream {
        /// The collective.
        op: &'static str,
        /// The graph.
        graph: &'static str,
        /// The communicator's device.
        ordinal: usize,
        /// Where it was called.
        location: &'static Location<'static>,
    },

    /// An eager collective was issued while the communicator's stream is capturing.
    #[error(
        "eager `{op}` at {location} on rank {rank}:\nthe runtime's stream is being captured \
         (by another thread), so the collective would be recorded into that graph instead \
         of running now. Fix: issue eager collectives between captures, from the rank's own \
         thread"
    )]
    EagerDuringCapture {
        /// The collective.
        op: &'static str,
        /// This rank.
        rank: usize,
        /// Where it was called.
        location: &'static Location<'static>,
    },

    /// An eager collective after graph captures while NCCL's graph-mixing support is off.
    #[error(
        "eager `{op}` at {location} on rank {rank}\nafter this communicator's collectives were \
         captured into a graph, with NCCL_GRAPH_MIXING_SUPPORT=0: NCCL then only guarantees \
         correctness when no graph launch is outstanding before a non-captured collective. \
         Fix: unset NCCL_GRAPH_MIXING_SUPPORT (its default, 1, supports the mix), or use a \
         second `CommGroup` for eager collectives"
    )]
    GraphMixingDisabled {
        /// The collective.
        op: &'static str,
        /// This rank.
        rank: usize,
        /// Where it was called.
        location: &'static Location<'static>,
    },

    /// The ranks issued or recorded different collectives at the same point.
    #[error(
        "the ranks disagree {at}: rank {} {},\nbut rank {} {}. NCCL matches collectives by their \
         order alone, so these ranks would wait for each other forever{}. Fix: issue the \
         same collectives in the same order, with the same counts, types and roots, on every \
         rank (decide rank-dependent branches around collectives from values all ranks share)",
        .first.0, .first.1, .second.0, .second.1,
        if *.in_capture { "; nothing was instantiated on any rank" } else { "; nothing was issued" }
    )]
    Mismatch {
        /// Where the ranks were.
        at: String,
        /// The lower rank and what it did.
        first: (usize, String),
        /// The other rank and what it did.
        second: (usize, String),
        /// Found when comparing captures (else during a warmup run).
        in_capture: bool,
    },

    /// Another rank failed while this one waited for it.
    #[error(
        "rank {rank} stopped {at} because rank {peer} failed:\n{reason}. The ranks of a group \
         capture together, so no rank keeps a graph the others do not have. Fix: the error of \
         rank {peer}"
    )]
    PeerFailed {
        /// This rank.
        rank: usize,
        /// Where this rank was.
        at: String,
        /// The rank that failed.
        peer: usize,
        /// Its error, in words.
        reason: String,
    },

    /// Some ranks never arrived.
    #[error(
        "rank {rank} waited {:.1} s {at} for rank(s) {missing:?},\nwhich never arrived: each is \
         stuck or never made the same call (every rank must join the group, and call \
         `comm.capture` for the same graphs in the same order). Nothing was left waiting on \
         the GPU. Fix: make every rank take the same path; if a rank is only slow (a first \
         NVRTC compile, NCCL's connection set-up), raise the limit with `CommGroup::set_timeout`",
        .waited.as_secs_f64()
    )]
    Timeout {
        /// This rank.
        rank: usize,
        /// Where this rank was.
        at: String,
        /// The ranks that did not arrive.
        missing: Vec<usize>,
        /// How long this rank waited.
        waited: Duration,
    },

    /// `comm.capture` was called inside another `comm.capture` of the same group, or inside
    /// a captured body.
    #[error(
        "`Communicator::capture` for rank {rank} was called {context}.\nFix: call it once around \
         each graph's `capture`, outside any captured body"
    )]
    NestedCapture {
        /// This rank.
        rank: usize,
        /// `inside another comm.capture of the same group` or `while capturing `f``.
        context: String,
    },

    /// Setting up a communicator was attempted inside a captured body.
    #[error(
        "`{op}` was called while capturing `{graph}`;\ncommunicator set-up talks to the other \
         ranks and cannot be recorded into a graph. Fix: set up the group before capturing"
    )]
    SetupInCapture {
        /// `CommGroup::join`, `Communicator::barrier`, …
        op: &'static str,
        /// The graph being captured.
        graph: &'static str,
    },

    /// A graph with collectives was captured in CUDA's global capture mode.
    #[error(
        "`{graph}` was captured with `mode = \"global\"` on rank {rank};\nwith one thread per \
         GPU, a global capture makes the other ranks' CUDA calls fail while it records (NCCL \
         documents that multi-threaded use needs thread-local capture). Fix: keep the default \
         `mode = \"thread_local\"` for graphs captured with `comm.capture`"
    )]
    GlobalCaptureMode {
        /// The graph.
        graph: &'static str,
        /// This rank.
        rank: usize,
    },

    /// A symmetric buffer was asked of an NCCL library without symmetric windows.
    #[error(
        "symmetric buffers need NCCL {required} or newer, and the library loaded is {found}.\n\
         Fix: put a newer libnccl.so.2 first on LD_LIBRARY_PATH, or pass ordinary buffers \
         (`CudaSlice`): every collective takes both"
    )]
    SymmetricUnsupported {
        /// The version found.
        found: String,
        /// The oldest version with symmetric windows.
        required: String,
    },

    /// A rank could not allocate its memory of a symmetric buffer, so no rank registered it.
    #[error(
        "rank {rank} could not allocate {bytes} bytes for a symmetric buffer\n({reason}), so \
         no rank made it. Fix: free memory on rank {rank}'s device or ask for less"
    )]
    SymmetricAlloc {
        /// The rank that could not allocate.
        rank: usize,
        /// The size asked for.
        bytes: usize,
        /// Why, in NCCL's words.
        reason: String,
    },

    /// A group of processes could not be set up: the launcher's environment is missing or
    /// wrong, the store cannot be reached, or a process asked for a rank it does not hold.
    #[error(
        "the ranks' processes could not meet: {detail}.\nFix: start every rank with RANK, \
         WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT set (torchrun does; with mpirun \
         or srun export MASTER_ADDR and MASTER_PORT), rank 0's host reachable on that port"
    )]
    Launch {
        /// What went wrong.
        detail: String,
    },

    /// A rank's thread panicked.
    #[error("rank {rank} panicked: {message}")]
    RankPanicked {
        /// The rank.
        rank: usize,
        /// The panic's message.
        message: String,
    },

    /// An NCCL call failed.
    #[error(
        "`{call}` failed on rank {rank} with {code}{}:\n{fix}",
        if .detail.is_empty() { String::new() } else { format!(" ({})", .detail) }
    )]
    Nccl {
        /// The NCCL function.
        call: &'static str,
        /// The rank (or the rank joining).
        rank: usize,
        /// NCCL's result code (`ncclInvalidUsage`).
        code: String,
        /// NCCL's own last message, when it has one.
        detail: String,
        /// What to do about it.
        fix: &'static str,
    },
}

fn found_text(found: &[PathBuf]) -> String {
    match found {
        [] => String::new(),
        [one, rest @ ..] => format!(
            ", while {}{} exists: NCCL's runtime package and PyTorch's wheel install only \
             `libnccl.so.2`, a name cudarc does not try",
            one.display(),
            if rest.is_empty() {
                String::new()
            } else {
                format!(" (and {} more)", rest.len())
            }
        ),
    }
}

fn missing_fix(found: &[PathBuf]) -> String {
    let lib = found
        .first()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "/path/to/libnccl.so.2".to_owned());
    let install = if found.is_empty() {
        "install NCCL (the `libnccl2` package) or PyTorch (its wheel ships \
         site-packages/nvidia/nccl/lib/libnccl.so.2), then "
    } else {
        ""
    };
    format!(
        "{install}give cudarc a `libnccl.so` on the loader path before the program starts: \
         `mkdir -p ~/.cache/nccl-lib && ln -sf {lib} ~/.cache/nccl-lib/libnccl.so` and run \
         with `LD_LIBRARY_PATH=$HOME/.cache/nccl-lib:$LD_LIBRARY_PATH` (scripts/with-nccl.sh \
         in this repository does both)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::GraphError;

    #[test]
    fn a_missing_library_names_the_search_the_copy_found_and_the_fix() {
        let e = CollectiveError::LibraryMissing {
            searched: vec!["libnccl.so".into(), "libnccl.so.13".into()],
            found: vec![PathBuf::from("/usr/lib/x86_64-linux-gnu/libnccl.so.2")],
        };
        let text = GraphError::from(e).to_string();
        assert!(
            text.contains("looks for libnccl.so, libnccl.so.13"),
            "{text}"
        );
        assert!(text.contains("while /usr/lib/x86_64-linux-gnu/libnccl.so.2 exists"));
        assert!(text.contains("ln -sf /usr/lib/x86_64-linux-gnu/libnccl.so.2"));
        assert!(text.contains("LD_LIBRARY_PATH"));

        let none = CollectiveError::LibraryMissing {
            searched: vec!["libnccl.so".into()],
            found: vec![],
        };
        assert!(none.to_string().contains("install NCCL"));
    }

    #[test]
    fn collective_errors_are_found_inside_warmup_errors() {
        let inner: GraphError = CollectiveError::AlreadyJoined { rank: 1 }.into();
        let wrapped = GraphError::Warmup {
            graph: "g",
            iteration: 1,
            warmup: 2,
            source: Box::new(inner),
        };
        assert!(matches!(
            wrapped.collective(),
            Some(CollectiveError::AlreadyJoined { rank: 1 })
        ));
        assert!(GraphError::NoDriver.collective().is_none());
    }

    #[test]
    fn a_mismatch_says_what_each_rank_did() {
        let e = CollectiveError::Mismatch {
            at: "in the capture of `f`, collective #2".into(),
            first: (0, "recorded all_reduce(sum) of 8 × f32".into()),
            second: (1, "recorded nothing more".into()),
            in_capture: true,
        };
        let text = e.to_string();
        assert!(text.starts_with(
            "the ranks disagree in the capture of `f`, collective #2: rank 0 recorded all_reduce"
        ));
        assert!(text.contains("rank 1 recorded nothing more"));
        assert!(text.contains("nothing was instantiated on any rank"));
    }
}
