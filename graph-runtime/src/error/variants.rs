//! The error types themselves: [`GraphError`] with one variant per way things fail, [`When`]
//! an address check ran, [`BoxError`]. Imports nothing of the crate but the payloads some
//! variants carry (the verification report, NCCL's collective error), which import nothing.

use std::panic::Location;

use cudarc::cublas::result::CublasError;
use cudarc::driver::DriverError;

#[cfg(feature = "nccl")]
use super::collective::CollectiveError;
use crate::report::VerifyReport;

/// Boxed error returned by a captured body whose error type is not one of ours.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Everything that can go wrong in the runtime, the capture or a replay.
///
/// Capture failures that only the GPU can detect come back as one variant per CUDA code
/// (`CaptureUnsupported` is 900, `CaptureInvalidated` 901, …); each message names the graph,
/// says what CUDA saw and how to fix the body. After any of them the capture has been ended
/// and the [`Runtime`](crate::Runtime) is usable again.
///
/// Its `Debug` form is its message followed by the variant's name, so that
/// `fn main() -> Result<(), GraphError>` (which prints the error with `Debug`) shows the
/// message: `Error: no CUDA driver: … (GraphError::NoDriver)`. Match on the variants for
/// their fields.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum GraphError {
    /// The CUDA driver library (`libcuda.so`) is not installed on this machine.
    #[error(
        "no CUDA driver: libcuda could not be loaded, so there is no GPU to run on;\n\
         install the NVIDIA driver, or run the program on a machine with an NVIDIA GPU"
    )]
    NoDriver,

    /// A CUDA library the runtime needs (NVRTC or cuBLAS) could not be loaded.
    #[error(
        "the CUDA library `{library}` could not be loaded;\ninstall the CUDA toolkit's \
         runtime libraries (or put them on LD_LIBRARY_PATH)"
    )]
    MissingLibrary {
        /// `nvrtc` or `cublas`.
        library: &'static str,
    },

    /// The driver is there but the requested device is not.
    #[error("no CUDA device with ordinal {ordinal}: this machine has {count}")]
    NoDevice {
        /// The ordinal that was asked for.
        ordinal: usize,
        /// How many devices the driver reports.
        count: usize,
    },

    /// cudarc's per-buffer event tracking is active on the runtime's context: every use of a
    /// buffer would wait on events recorded outside the capture (CUDA error 905).
    #[error(
        "{during}: cudarc's event tracking is on for this context,\nand with more than one stream it makes \
         every buffer wait on events recorded before the capture, which a capture refuses (CUDA error 905). \
         Fix: turn it off before allocating (`unsafe {{ ctx.disable_event_tracking() }}`, after which you \
         order your own streams with `stream.join(&other)`). Capturing on the stream you already use does not \
         avoid it when that stream was made with `ctx.new_stream()`: cudarc counts such a stream beside the \
         context's default stream as several streams and tracks events on every buffer"
    )]
    EventTracking {
        /// What was about to happen.
        during: &'static str,
    },

    /// A runtime was asked to capture on a default stream.
    #[error(
        "a runtime cannot capture on the legacy default stream or the per-thread default stream:\nCUDA \
         refuses to capture them. Fix: pass a stream made with `ctx.new_stream()` to \
         `Runtime::from_stream`, or let the runtime make its own (`Runtime::from_context`)"
    )]
    DefaultStream,

    /// A body whose context is a stream asked for the runtime of that stream, and none exists.
    #[error(
        "no runtime was made for this stream:\n`graph_runtime::function_for_stream(stream, …)` reaches the kernel cache \
         of the runtime that owns the stream. Fix: make the runtime first (`Runtime::new`, \
         `Runtime::from_stream(stream)`), and keep it alive while the body runs"
    )]
    NoRuntimeForStream,

    /// CUDA error 900 during capture.
    #[error(
        "capturing `{graph}` failed with CUDA error 900 (operation not permitted when stream is capturing):\n\
         the body called something a graph cannot record. Fix: read results on the host after `replay()` \
         returns, keep values that steer the computation on the device, and allocate host or device memory \
         before capture. Such calls make the CPU wait for the GPU or are not GPU work (a stream or context \
         synchronize, a device-to-host copy such as `clone_dtoh`, an event or stream query, a pinned host \
         allocation); a graph only records GPU work, and there is no GPU result yet to wait for"
    )]
    CaptureUnsupported {
        /// The graph (the annotated function) being captured.
        graph: &'static str,
    },

    /// CUDA error 901 during capture.
    #[error(
        "capturing `{graph}` failed with CUDA error 901 (capture invalidated):\nan earlier operation inside the \
         capture failed, often a forbidden call (error 900) whose error a helper ignored, or another thread \
         touched the capturing stream. Fix: look for the first failing call in the body (run it eagerly with \
         the same inputs); in `mode = \"global\"`, keep other threads away from CUDA during capture or use the \
         default `thread_local` mode"
    )]
    CaptureInvalidated {
        /// The graph (the annotated function) being captured.
        graph: &'static str,
    },

    /// CUDA error 902 during capture.
    #[error(
        "capturing `{graph}` failed with CUDA error 902 (capture merge):\na stream in this capture waited on an \
         event recorded in a different, independent capture. Fix: do not share events between graphs that are \
         captured at the same time"
    )]
    CaptureMerge {
        /// The graph (the annotated function) being captured.
        graph: &'static str,
    },

    /// CUDA error 903 during capture.
    #[error(
        "capturing `{graph}` failed with CUDA error 903 (capture unmatched):\nthe capture was ended on a stream \
         that did not begin it. Fix: let the runtime begin and end captures; do not call `begin_capture` or \
         `end_capture` yourself inside the body"
    )]
    CaptureUnmatched {
        /// The graph (the annotated function) being captured.
        graph: &'static str,
    },

    /// CUDA error 904 during capture.
    #[error(
        "capturing `{graph}` failed with CUDA error 904 (capture unjoined):\nwork was forked onto another stream \
         during capture and that stream never rejoined the capture stream before the body returned. Fix: make the \
         runtime's stream wait for the side stream at the end of the forked work (`rt.stream().join(&side)`)"
    )]
    CaptureUnjoined {
        /// The graph (the annotated function) being captured.
        graph: &'static str,
    },

    /// CUDA error 905 during capture.
    #[error(
        "capturing `{graph}` failed with CUDA error 905 (capture isolation):\na captured operation waited on work \
         that is not part of the capture, such as an event recorded before capture began. cudarc does this by \
         itself for buffers with event tracking when the context has several streams. Fix: allocate the buffers \
         the graph touches from the runtime's stream (the runtime turns event tracking off), and order other \
         streams before calling `capture` (`rt.stream().join(&other)`), not inside the body"
    )]
    CaptureIsolation {
        /// The graph (the annotated function) being captured.
        graph: &'static str,
    },

    /// CUDA error 906 during capture.
    #[error(
        "capturing `{graph}` failed with CUDA error 906 (implicit dependency on the legacy stream):\nan operation \
         was issued on the legacy default stream (`ctx.default_stream()`, stream 0) while the capture stream was \
         recording; the legacy stream would have to wait for the capture, which CUDA forbids. Fix: issue every \
         operation of the body on the runtime's stream (`rt.stream()`), never on the default stream"
    )]
    CaptureImplicit {
        /// The graph (the annotated function) being captured.
        graph: &'static str,
    },

    /// CUDA error 907 during capture.
    #[error(
        "capturing `{graph}` failed with CUDA error 907 (captured event):\nan event recorded inside the capture was \
         queried, synchronized or timed. Fix: record and read timing events outside the captured body"
    )]
    CapturedEvent {
        /// The graph (the annotated function) being captured.
        graph: &'static str,
    },

    /// CUDA error 908 during capture.
    #[error(
        "capturing `{graph}` failed with CUDA error 908 (capture on the wrong thread):\nthe capture was ended from \
         a thread other than the one that began it. Fix: keep the whole body on the calling thread"
    )]
    CaptureWrongThread {
        /// The graph (the annotated function) being captured.
        graph: &'static str,
    },

    /// A runtime operation that waits for the GPU was called while the runtime's stream was
    /// capturing. The runtime refused it before reaching CUDA, so the capture was not
    /// invalidated and the message can point at the caller.
    #[error(
        "`{op}` at {location} waits for the GPU,\nbut it was called while capturing `{graph}`; a graph only \
         records GPU work, so CUDA would fail the capture with error 900. Fix: move it out of the captured body \
         and call it after `replay()` returns"
    )]
    SyncInCapture {
        /// The operation that was refused (`Runtime::synchronize`, …).
        op: &'static str,
        /// The graph being captured.
        graph: &'static str,
        /// Where the operation was called from.
        location: &'static Location<'static>,
    },

    /// The body copied between the device and pageable host memory while capturing.
    #[error(
        "capturing `{graph}` recorded a {direction} copy of pageable host memory\n(a `Vec` or slice, as \
         `clone_dtoh`, `memcpy_dtoh`, `clone_htod` or `memcpy_htod` make): the body saw data copied before the \
         GPU had run, and every replay would copy to or from that host address again, after the `Vec` was \
         freed. The graph was not kept. Fix: take host data in through an input parameter and read results \
         from the graph's outputs after `replay()`; copy through a pinned buffer only if it lives as long \
         as the graph"
    )]
    PageableCopyCaptured {
        /// The graph being captured.
        graph: &'static str,
        /// `device-to-host` or `host-to-device`.
        direction: &'static str,
    },

    /// A generator's host-side state accessor was called inside a captured body.
    #[error(
        "`{op}` at {location} reads or writes the generator's seed and offset on the host,\nbut it was called \
         while capturing `{graph}`: it would run once, at capture, and every replay would reuse (or rewind to) \
         that value. Fix: inside a graph use `{instead}`, which copies the state on the device each replay"
    )]
    RngHostStateInCapture {
        /// The refused operation.
        op: &'static str,
        /// The graph-safe operation to use instead.
        instead: &'static str,
        /// The graph being captured.
        graph: &'static str,
        /// Where the operation was called from.
        location: &'static Location<'static>,
    },

    /// A fork inside a captured body needed a side stream that no earlier (eager) run made.
    #[error(
        "the fork at {location} needs a side stream,\nand none was made before `{graph}` began capturing; a \
         stream cannot be created inside a capture (CUDA error 900, operation not permitted when stream is \
         capturing). Fix: fork the same way in the warmup runs as in the capture (a fork outside a capture \
         creates the side stream and the capture reuses it): do not put `fork` behind `is_capturing()`, and \
         nest forks as deeply in every run"
    )]
    SideStreamInCapture {
        /// The graph being captured.
        graph: &'static str,
        /// Where the fork was called.
        location: &'static Location<'static>,
    },

    /// A generator was created inside a captured body.
    #[error(
        "a random generator was created at {location} while capturing `{graph}`:\nits seed would be written \
         once, at capture, and every replay would start it from that seed again, drawing the same numbers. \
         Fix: create generators before capture (`rt.generator(seed)`, or use `rt.rng()`) and pass them in as \
         `#[state]` or reach them through the runtime"
    )]
    GeneratorInCapture {
        /// The graph being captured.
        graph: &'static str,
        /// Where the generator was created.
        location: &'static Location<'static>,
    },

    /// The body returned without putting any GPU work on the runtime's stream.
    #[error(
        "capturing `{graph}` recorded no GPU work: the body did not launch anything on the runtime's stream.\n\
         If it launched on another stream or another cuBLAS handle, that work ran once, eagerly, and would \
         never run on replay. Fix: launch on `rt.stream()` and use `rt.blas()` inside the body"
    )]
    EmptyGraph {
        /// The graph being captured.
        graph: &'static str,
    },

    /// One of the warmup runs failed (they run eagerly, before capture).
    #[error("warmup run {iteration} of {warmup} of `{graph}` failed\n(it runs eagerly, before capture): {source}")]
    Warmup {
        /// The graph being warmed up.
        graph: &'static str,
        /// Which run failed, from 1.
        iteration: u32,
        /// How many warmup runs were asked for.
        warmup: u32,
        /// What the body returned.
        #[source]
        source: Box<GraphError>,
    },

    /// The captured body returned an error that is not a capture failure.
    #[error("capturing `{graph}` failed inside the body: {source}")]
    Body {
        /// The graph being captured.
        graph: &'static str,
        /// What the body returned.
        #[source]
        source: Box<GraphError>,
    },

    /// A `#[state]` parameter (or an output the body was given) no longer holds the device
    /// buffers the graph was captured with: one was replaced, freed or reallocated.
    #[error(
        "`{param}` of `{graph}` no longer holds the device buffers the graph was captured with,\nso {}. Fix: write into state in place (`state_mut()` lends `CudaSlice` state as a \
         `CudaViewMut`, which cannot be replaced), never assign a new buffer to a field of a struct the graph \
         holds, and capture a new graph when the buffers must change. What moved: {detail}; it was replaced, \
         freed or reallocated {when}, and the graph, which reads and writes its state by address, would have \
         touched freed memory",
        not_launched(when)
    )]
    StateMoved {
        /// The graph.
        graph: &'static str,
        /// The parameter whose buffers moved.
        param: &'static str,
        /// When the check found it.
        when: When,
        /// Which buffer, and its addresses before and now.
        detail: String,
    },

    /// A verification found the replay's outputs or state different from the eager run's.
    #[error("{report}")]
    VerifyMismatch {
        /// The graph.
        graph: &'static str,
        /// What differed, item by item.
        report: Box<VerifyReport>,
    },

    /// The last warmup run and the capture looked up different kernels.
    #[error(
        "the last warmup run of `{graph}` and its capture took different paths:\nthe warmup looked up the \
         kernels [{warmup}] and the capture [{capture}]. The warmup runs exist to do once what a capture \
         must not (compile, load, allocate) on the path the capture takes; a body that branches on \
         `is_capturing()` or on a host counter captures work its warmup never ran. Fix: run the same code \
         in the warmup and the capture"
    )]
    WarmupDiverged {
        /// The graph.
        graph: &'static str,
        /// The kernels the last warmup run looked up, in order.
        warmup: String,
        /// The kernels the capture looked up, in order.
        capture: String,
    },

    /// Two captures of the same body recorded different work.
    #[error(
        "capturing `{graph}` twice recorded different work: {difference}.\nThe graph would replay whatever \
         one capture happened to record. Fix: make the body record the same kernels with the same \
         arguments every time it runs: no host counters, caches or clocks that change what it launches \
         (keep such values on the device, or pass them as `#[constant]`), and no state the body replaces \
         with new tensors (a model that replaces its own state or cache: write it in place, or keep it \
         outside the graph)"
    )]
    NondeterministicCapture {
        /// The graph.
        graph: &'static str,
        /// The first difference: node index, kernel name, what differed.
        difference: String,
    },

    /// A replay input does not have the shape the graph was captured with.
    #[error(
        "replay of `{graph}`: input `{input}` has shape {got},\nbut the graph was captured with {expected}; \
         a graph's static buffers have fixed sizes, so nothing was launched. Fix: pass an input of the captured \
         shape, or capture one graph per shape"
    )]
    InputShape {
        /// The graph being replayed.
        graph: &'static str,
        /// The parameter name of the input.
        input: &'static str,
        /// The captured shape.
        expected: String,
        /// The shape that was passed.
        got: String,
    },

    /// The body returned a value of another shape than in its first warmup run: the graph's
    /// static result has a fixed shape.
    #[error(
        "`{graph}` returned a result of shape {got} after returning {expected}\nin its first warmup run; \
         a graph copies its result into a static buffer of fixed shape. Fix: return the same shape on \
         every call (shapes must not depend on values read at run time)"
    )]
    ResultShape {
        /// The annotated function.
        graph: &'static str,
        /// The shape of the first run's result.
        expected: String,
        /// The shape returned now.
        got: String,
    },

    /// A candle tensor or device was needed and the runtime has no candle device.
    #[error(
        "this graph uses candle tensors or candle's `Device`, and the runtime was not made from a candle \
         device.\nFix: make the runtime with `Runtime::from_candle(&device)` (feature `candle`)"
    )]
    NoCandleDevice,

    /// Capturing a candle body failed with CUDA's invalid-value error, which is what a free of
    /// memory allocated before the capture gives inside it.
    #[error(
        "capturing `{graph}` failed with CUDA_ERROR_INVALID_VALUE,\nwhich is what freeing memory inside a \
         capture gives when the memory was allocated before it: a tensor made before `capture` was dropped or \
         replaced in the body. CUDA can only record frees of memory the graph itself allocated. Two causes are \
         common. (1) A KV cache grown with `Tensor::cat` and stored back: keep such tensors at fixed addresses \
         for the graph's life and write into them in place (`slice_set`, `scatter_set`), with positions held \
         in a device tensor (`graph_runtime::candle::StaticKvCache` does this for decoders). (2) A cache cleared \
         or replaced at the start of the body (`model.clear_kv_cache()`, a fresh cache assigned before the \
         forward): that drops tensors the previous call left. Fix: clear it after the forward instead, so \
         the tensors the body drops are the ones it made itself, or zero a static cache in place \
         (`StaticKvCache::reset`)"
    )]
    FreedInCapture {
        /// The annotated function.
        graph: &'static str,
    },

    /// A candle body uploads host data inside the capture that candle cannot serve from the
    /// uploads of the warmup runs: more than candle's cache holds (4096 bytes per upload in
    /// candle-core 0.11), or other bytes than the warmup uploaded.
    #[error("{}", host_upload_text(*above_cap, op))]
    HostUploadInCapture {
        /// The call that uploaded, as far as it is known (named from candle's backtrace when
        /// `RUST_BACKTRACE=1`).
        op: String,
        /// Whether the upload was larger than candle's cache takes (otherwise its bytes
        /// differed from every upload of the warmup runs).
        above_cap: bool,
    },

    /// Capturing one bucket of a bucket family failed.
    #[error("capturing bucket {bucket} of `{graph}` failed: {source}")]
    Bucket {
        /// The annotated function.
        graph: &'static str,
        /// The bucket (batch size) whose capture failed.
        bucket: usize,
        /// Why.
        #[source]
        source: Box<GraphError>,
    },

    /// A replay asked for a batch larger than the largest bucket.
    #[error(
        "replay of `{graph}` with batch {batch}, but the largest bucket is {largest};\nnothing was launched. Fix: \
         add a bucket of at least {batch} to `buckets(…)`, split the batch, or allow eager execution above the \
         buckets with `buckets(…, fallback = \"eager\")`"
    )]
    BatchAboveBuckets {
        /// The annotated function.
        graph: &'static str,
        /// The batch that was asked for.
        batch: usize,
        /// The largest bucket.
        largest: usize,
    },

    /// `capture` was called from inside another graph's captured body.
    #[error(
        "cannot capture `{graph}` while `{outer}` is being captured on this thread;\ncaptures do not nest. \
         Fix: call the inner function directly inside the outer body (it becomes part of the outer graph)"
    )]
    NestedCapture {
        /// The graph whose capture was refused.
        graph: &'static str,
        /// The graph already being captured.
        outer: &'static str,
    },

    /// A replay was attempted while the same stream is capturing in another thread.
    #[error(
        "cannot launch `{graph}`: the runtime's stream is capturing another graph in another thread,\nand the \
         launch would be recorded into that graph. Fix: replay after that capture finishes, or give each \
         thread its own `Runtime`"
    )]
    StreamCapturing {
        /// The graph whose launch was refused.
        graph: &'static str,
    },

    /// The device ran out of memory.
    #[error(
        "out of device memory while {during}{}{}.\nFix: free buffers you no longer need; capture graphs that \
         replay one after another on the same `Runtime`, so that they share one graph memory pool; use fewer \
         or smaller shape buckets",
        .requested_bytes.map(|b| format!(", asking for {}", crate::error::bytes(b))).unwrap_or_default(),
        .free_bytes.map(|b| format!(" with {} free on the device", crate::error::bytes(b))).unwrap_or_default()
    )]
    OutOfMemory {
        /// What the runtime was doing, naming the graph where there is one.
        during: String,
        /// How much was asked for, where the runtime knows.
        requested_bytes: Option<usize>,
        /// Free device memory right after the failure, where it could be read.
        free_bytes: Option<usize>,
    },

    /// NVRTC could not compile a kernel source.
    #[error("NVRTC could not compile kernel source `{name}`:\n{log}")]
    Compile {
        /// A short name for the source (its first kernel, or a hash).
        name: String,
        /// The compiler's log.
        log: String,
    },

    /// A kernel with this name is not in the compiled module.
    #[error("kernel `{name}` is not in the compiled source; check the `extern \"C\"` name")]
    MissingKernel {
        /// The kernel name that was asked for.
        name: String,
    },

    /// The driver is too old for conditional graph nodes (`graph_while`, `graph_if`,
    /// `graph_if_else`, and the conditions they test).
    #[error(
        "`{construct}` at {location} needs CUDA graph conditional nodes,\nwhich need a driver for CUDA {needs} \
         or newer; this driver supports CUDA {driver}. Nothing was recorded or launched. Fix: update the NVIDIA \
         driver (CUDA 12.4 came with driver 550, CUDA 12.8 with driver 570), or keep the loop on the host: \
         replay a graph of one iteration and read the condition after each replay"
    )]
    ConditionalUnsupported {
        /// `graph_while`, `graph_if`, `graph_if_else` or `Runtime::condition`.
        construct: &'static str,
        /// The CUDA version the driver supports (`12.2`).
        driver: String,
        /// The CUDA version the construct needs (`12.4`; `12.8` for `graph_if_else`).
        needs: &'static str,
        /// Where the construct was called.
        location: &'static Location<'static>,
    },

    /// The body of a `graph_while` / `graph_if` recorded something CUDA does not allow inside
    /// a conditional node's body.
    #[error(
        "the body of `{construct}` at {location} in `{graph}` recorded {what};\nCUDA allows only kernels, \
         memsets, device copies and nested `graph_while`/`graph_if` inside a conditional body, so the graph was \
         not made. Nothing ran: the body was recorded into a scratch graph first and checked there. Fix: allocate \
         temporaries and create conditions and generators before the `{construct}` call (they live until the end \
         of the function), and drop no buffer inside the closure"
    )]
    ForbiddenInConditional {
        /// `graph_while`, `graph_if` or `graph_if_else`.
        construct: &'static str,
        /// The graph being captured.
        graph: &'static str,
        /// Where the construct was called.
        location: &'static Location<'static>,
        /// What the body recorded, in words (`a memory allocation (…)`).
        what: String,
    },

    /// The host code of an eager island (`rt.eager(|| …)` in a `#[cuda_graph]` body) failed
    /// during a replay: the segments before it ran, the ones after it were not launched.
    #[error(
        "island {island} of `{graph}` (at {location}) failed during a replay:\n{source}; the segments \
         before it ran and the ones after it were not launched"
    )]
    Island {
        /// The graph replayed.
        graph: &'static str,
        /// Which island, from 1, in the order the body meets them.
        island: usize,
        /// Where the island is in the body.
        location: &'static Location<'static>,
        /// What the island's code returned.
        #[source]
        source: Box<GraphError>,
    },

    /// An eager island was met where the graph cannot stop for host code.
    #[error("the island at {location} in `{graph}` cannot be used here: {reason}")]
    IslandMisuse {
        /// The graph being captured.
        graph: &'static str,
        /// Where the island is in the body.
        location: &'static Location<'static>,
        /// Why, and what to write instead.
        reason: &'static str,
    },

    /// The body of a `graph_while` / `graph_if` failed while it was recorded.
    #[error("recording the body of `{construct}` at {location} in `{graph}` failed:\n{source}")]
    ConditionalBody {
        /// `graph_while`, `graph_if` or `graph_if_else`.
        construct: &'static str,
        /// The graph being captured.
        graph: &'static str,
        /// Where the construct was called.
        location: &'static Location<'static>,
        /// What went wrong: what the body returned, or the CUDA error of its recording.
        #[source]
        source: Box<GraphError>,
    },

    /// A condition, `graph_while` or `graph_if` was used where it cannot work.
    #[error("`{construct}` at {location}: {problem}")]
    ConditionMisuse {
        /// The construct (`graph_while`, `Runtime::condition`, …).
        construct: &'static str,
        /// Where it was called.
        location: &'static Location<'static>,
        /// What is wrong and what to write instead.
        problem: String,
    },

    /// A condition was created in a captured body but no `graph_while` / `graph_if` tested it.
    #[error(
        "the condition created at {location} in `{graph}` was never tested\nby a `graph_while`, `graph_if` or \
         `graph_if_else`, and CUDA refuses to instantiate a graph with an unused conditional handle. Fix: \
         remove it, or create it only where it is used"
    )]
    UnusedCondition {
        /// The graph being captured.
        graph: &'static str,
        /// Where the condition was created.
        location: &'static Location<'static>,
    },

    /// The body kept memory it allocated during the capture past its end.
    #[error(
        "`{graph}` keeps {} it allocated during the capture past the body's end\nEvery \
         replay frees and reallocates the graph's temporaries, so whatever holds that memory (state \
         replaced inside the body, a model's own state or cache object, a static) would read freed \
         memory after the first replay. Fix: write state in place (`slice_set`, `copy_`, a kernel) \
         instead of replacing it; for a model that replaces its own state, keep that state outside \
         the graph or list its tensors in `ModelState`; return a value as the function's result. \
         State you lent the capture now holds the refused graph's memory: build it again",
        crate::error::bytes(*.bytes)
    )]
    KeptTemporary {
        /// The graph being captured.
        graph: &'static str,
        /// Bytes kept.
        bytes: usize,
    },

    /// Memory the graph addresses but does not hold (a framework's own buffer) was freed or
    /// allocated again since the capture: replaying would write into whatever lives there now.
    #[error(
        "`{graph}` addresses memory it does not hold, and that memory was freed or reallocated since the capture:\n\
         nothing was launched, and every later replay of this graph is refused the same way. The graph's {node} \
         was captured with the address {address:#x}, in a buffer of {} that something other than the graph \
         owned, such as a framework's own workspace: candle keeps one grow-only workspace per device for its \
         quantized matmuls, and an eager quantized call larger than any before it frees the old workspace for \
         a bigger one. Fix: capture the graph again after such a call, or make the largest quantized call once \
         before capturing so that the workspace does not grow afterwards; device memory of yours that a body \
         reads must be one of its inputs or `#[state]`, which the graph holds",
        crate::error::bytes(*.bytes)
    )]
    ForeignMemoryMoved {
        /// The graph.
        graph: &'static str,
        /// The node that carries the address (a kernel by name, a copy or a memset).
        node: String,
        /// The address the node carries.
        address: u64,
        /// The size of the allocation at capture.
        bytes: usize,
    },

    /// A kernel faulted (an illegal or misaligned address, an illegal instruction, a device-side
    /// assert, …): CUDA stops the whole context, and every later CUDA call of the process
    /// returns the same error. Nothing recovers it but a new process.
    #[error(
        "the GPU context is lost: {} ({})\nA kernel faulted, and CUDA keeps this error for the rest of \
         the process: every later call fails with it. Restart the process. In a graph body, a common \
         cause is work queued on a stream of your own (not `rt.stream()` or a branch of `rt.fork`): it \
         runs at once instead of being recorded, and reads memory the capture allocated but has not \
         mapped yet. Fix: queue all of a body's work on the capture stream; run the program under \
         compute-sanitizer to find the kernel",
        code_name(.0),
        code_text(.0)
    )]
    ContextLost(DriverError),

    /// Any other CUDA driver error.
    #[error("CUDA driver error {}: {}", code_name(.0), code_text(.0))]
    Driver(DriverError),

    /// A cuBLAS call failed.
    #[error("cuBLAS error {0:?}")]
    Cublas(CublasError),

    /// An error of the user's own type, returned by a captured body.
    #[error(transparent)]
    User(BoxError),

    /// A collective failed or was refused: NCCL set-up, a collective's arguments, or ranks
    /// that did not capture the same collectives (see [`crate::nccl::CollectiveError`]).
    #[cfg(feature = "nccl")]
    #[cfg_attr(docsrs, doc(cfg(feature = "nccl")))]
    #[error(transparent)]
    Collective(Box<CollectiveError>),
}

impl GraphError {
    /// The variant's name (`"NoDriver"`), as the `Debug` form shows it.
    fn variant_name(&self) -> &'static str {
        match self {
            GraphError::NoDriver => "NoDriver",
            GraphError::MissingLibrary { .. } => "MissingLibrary",
            GraphError::NoDevice { .. } => "NoDevice",
            GraphError::EventTracking { .. } => "EventTracking",
            GraphError::DefaultStream => "DefaultStream",
            GraphError::NoRuntimeForStream => "NoRuntimeForStream",
            GraphError::CaptureUnsupported { .. } => "CaptureUnsupported",
            GraphError::CaptureInvalidated { .. } => "CaptureInvalidated",
            GraphError::CaptureMerge { .. } => "CaptureMerge",
            GraphError::CaptureUnmatched { .. } => "CaptureUnmatched",
            GraphError::CaptureUnjoined { .. } => "CaptureUnjoined",
            GraphError::CaptureIsolation { .. } => "CaptureIsolation",
            GraphError::CaptureImplicit { .. } => "CaptureImplicit",
            GraphError::CapturedEvent { .. } => "CapturedEvent",
            GraphError::CaptureWrongThread { .. } => "CaptureWrongThread",
            GraphError::SyncInCapture { .. } => "SyncInCapture",
            GraphError::PageableCopyCaptured { .. } => "PageableCopyCaptured",
            GraphError::RngHostStateInCapture { .. } => "RngHostStateInCapture",
            GraphError::SideStreamInCapture { .. } => "SideStreamInCapture",
            GraphError::GeneratorInCapture { .. } => "GeneratorInCapture",
            GraphError::EmptyGraph { .. } => "EmptyGraph",
            GraphError::Warmup { .. } => "Warmup",
            GraphError::Body { .. } => "Body",
            GraphError::StateMoved { .. } => "StateMoved",
            GraphError::VerifyMismatch { .. } => "VerifyMismatch",
            GraphError::WarmupDiverged { .. } => "WarmupDiverged",
            GraphError::NondeterministicCapture { .. } => "NondeterministicCapture",
            GraphError::InputShape { .. } => "InputShape",
            GraphError::ResultShape { .. } => "ResultShape",
            GraphError::NoCandleDevice => "NoCandleDevice",
            GraphError::FreedInCapture { .. } => "FreedInCapture",
            GraphError::HostUploadInCapture { .. } => "HostUploadInCapture",
            GraphError::Bucket { .. } => "Bucket",
            GraphError::BatchAboveBuckets { .. } => "BatchAboveBuckets",
            GraphError::NestedCapture { .. } => "NestedCapture",
            GraphError::StreamCapturing { .. } => "StreamCapturing",
            GraphError::OutOfMemory { .. } => "OutOfMemory",
            GraphError::Compile { .. } => "Compile",
            GraphError::MissingKernel { .. } => "MissingKernel",
            GraphError::ConditionalUnsupported { .. } => "ConditionalUnsupported",
            GraphError::ForbiddenInConditional { .. } => "ForbiddenInConditional",
            GraphError::ConditionalBody { .. } => "ConditionalBody",
            GraphError::Island { .. } => "Island",
            GraphError::IslandMisuse { .. } => "IslandMisuse",
            GraphError::ConditionMisuse { .. } => "ConditionMisuse",
            GraphError::UnusedCondition { .. } => "UnusedCondition",
            GraphError::KeptTemporary { .. } => "KeptTemporary",
            GraphError::ForeignMemoryMoved { .. } => "ForeignMemoryMoved",
            GraphError::ContextLost(_) => "ContextLost",
            GraphError::Driver(_) => "Driver",
            GraphError::Cublas(_) => "Cublas",
            GraphError::User(_) => "User",
            #[cfg(feature = "nccl")]
            GraphError::Collective(_) => "Collective",
        }
    }
}

/// The message, then the variant: what `fn main() -> Result<(), GraphError>` prints.
impl std::fmt::Debug for GraphError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self} (GraphError::{})", self.variant_name())
    }
}

/// `1536` → `1.5 KiB`: byte counts as people read them.
pub(crate) fn bytes(n: usize) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

fn code_name(e: &DriverError) -> String {
    e.error_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|_| format!("{:?}", e.0))
}

fn code_text(e: &DriverError) -> String {
    e.error_string()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "unknown error".to_owned())
}

/// When an address check ran (see [`GraphError::StateMoved`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum When {
    /// After warmup run `run` (from 1).
    Warmup {
        /// The run.
        run: u32,
    },
    /// After the body was captured.
    Capture,
    /// Before a replay.
    Replay,
    /// After eager island `island` (from 1) of a replay ran, before the segment after it.
    Island {
        /// The island.
        island: usize,
    },
}

impl std::fmt::Display for When {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            When::Warmup { run } => write!(f, "during warmup run {run}"),
            When::Capture => f.write_str("while the body was captured"),
            When::Replay => f.write_str("between the capture and this replay"),
            When::Island { island } => write!(
                f,
                "by eager island {island} of this replay (the segments before it ran; none after it was launched)"
            ),
        }
    }
}

/// What [`GraphError::StateMoved`] kept from launching.
fn not_launched(when: &When) -> &'static str {
    match when {
        When::Island { .. } => "the segments after the island were not launched",
        _ => "nothing was launched",
    }
}

/// [`GraphError::HostUploadInCapture`]'s text.
fn host_upload_text(above_cap: bool, op: &str) -> String {
    if above_cap {
        format!(
            "the body uploads more than 4096 bytes of host data to the device inside the capture ({op}).\ncandle \
             serves an upload inside a capture from a per-thread cache of what the warmup runs uploaded, and it \
             caches only uploads of at most 4096 bytes (`CUDA_GRAPH_HTOD_CACHE_MAX_BYTES`, candle-core 0.11); a \
             larger one would be recorded as a copy from host memory that is freed before any replay, so candle \
             refuses it. Models that build a mask or position buckets on the host in every forward meet this above \
             32 to 64 tokens. Fix: make such a tensor once before the capture and hold it as `#[state]` (it \
             depends on shapes only), or keep each upload at most 4096 bytes (a 32×32 f32 mask is 4096 bytes); \
             for a model you cannot change, see \"Uploads above candle's cap\" in the `graph_runtime::candle` docs"
        )
    } else {
        format!(
            "the body uploads host data inside the capture whose bytes differ from every upload of the warmup \
             runs\n({op}): candle can only serve an upload inside a capture from the warmup's uploads of the same \
             bytes, and a recorded copy would replay the capture's values forever. Fix: keep what changes between \
             calls (positions, lengths, token ids) in device tensors given to the graph as inputs, not in host \
             data made in the body"
        )
    }
}
