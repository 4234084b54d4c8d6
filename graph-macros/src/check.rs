//! The capture checks: what a `#[cuda_graph]` body must not do, found on its tokens.
//!
//! A graph records the GPU work the body queues on the capture stream, once, and replays
//! only that. Anything the body does on the host either cannot happen during the capture
//! (CUDA refuses it with one of its capture errors, 900–908) or happens only while
//! capturing and never again on replay. The macro walks the body with [`syn::visit`] and
//! reports each such call where it is written, with the failure it prevents and what to
//! write instead. Every finding is reported, not only the first; the function is still
//! emitted (see `expand.rs`).
//!
//! # The rules
//!
//! All of them are in [`RULES`], one row per mistake; the table is the only place that
//! knows a name. The macro sees tokens, not types, so every rule matches **names** (of
//! methods, paths and macros, and of the body's parameters, whose declared types the
//! signature does give):
//!
//! | rule | what it matches | CUDA failure / consequence | known false positives | known false negatives |
//! | --- | --- | --- | --- | --- |
//! | `host-sync` | `.synchronize()` | 900 | a method of your own named `synchronize` | a sync inside a helper fn (the runtime's own `Runtime::synchronize` is refused at run time with `GraphError::SyncInCapture`) |
//! | `device-to-host` | `.clone_dtoh()`, `.memcpy_dtoh()`, `.memcpy_dtov()` and cudarc's older `dtoh_sync_copy*`, `sync_reclaim` | copy recorded into a dead `Vec` (`GraphError::PageableCopyCaptured`) or 900 | methods of your own with these names | reads inside helper fns (caught at run time by the runtime's graph inspection) |
//! | `host-to-device` | `.clone_htod()`, `.memcpy_htod()`, `.memcpy_stod()`, older `htod_*copy*`, unless the source is a parameter declared as `PinnedHostSlice` | host address recorded (`GraphError::PageableCopyCaptured`) | a copy from a pinned buffer reached under another name (legal): move it into a helper fn | copies inside helper fns (caught at run time) |
//! | `device-value-formatted` | a formatting macro (`println!`, `format!`, `dbg!`, `panic!`, `assert!`, the `log`/`tracing` macros, …) given a device buffer of the body: a reference parameter other than the context, or a local bound to `alloc_zeros`/`alloc`/`clone_dtod` | 900 if the values were read | a host value that shadows a buffer's name inside a closure | buffers reached through fields or other names |
//! | `host-branch-on-device-data` | an `if`/`while`/`match`/`for`/`let … else` whose condition calls a device-to-host read or names a local bound to one | the graph replays the path taken at capture | a local re-bound in a nested scope to a host value keeps its mark until re-bound in the body's own order | values read in helper fns |
//! | `stream-or-event-query` | `.query()`, `.is_complete()`, `.try_is_complete()`, `.elapsed_ms()` | 900 / 907 | any `query` method (database clients, URLs) | queries inside helper fns |
//! | `pinned-host-alloc` | `.alloc_pinned()`, `.alloc_pinned_with_flags()`, `malloc_host` | 900 in `global` and `thread_local` modes | methods of your own with these names | cudarc 0.19 has no safe host-register call to match; allocations in helper fns |
//! | `pinned-host-read` | `.as_slice()`, `.as_mut_slice()`, `.as_ptr()`, `.as_mut_ptr()` on a parameter declared as `PinnedHostSlice` | 900 (cudarc waits on the buffer's event) | — | pinned buffers reached through other names |
//! | `legacy-default-stream` | `.default_stream()`, `.per_thread_stream()` | work escapes the graph (`GraphError::EmptyGraph`); 906 with a blocking capture stream | methods of your own with these names | a legacy stream obtained before the body and passed in |
//! | `stream-created-in-body` | `.new_stream()`, `.new_stream_with_priority()`, `.wrap_borrowed_stream()`, cudarc's `.fork()` without arguments | 904, or 900 (seen on an H100); work that never joins the capture is not recorded | methods of your own with these names | streams made before capture and reached through a static or a helper |
//! | `cublas-handle-in-body` | `CudaBlas::new` | 900 (handle destruction synchronizes the device) | a type of your own named `CudaBlas` | handles made in helper fns |
//! | `capture-control` | `.begin_capture()`, `.end_capture()` | 903 / a capture ended early | methods of your own with these names | — |
//! | `nested-graph-capture` | `SomethingGraph::capture(…)` | `GraphError::NestedCapture` | a type of your own whose name ends in `Graph` with a `capture` function | captures inside helper fns (refused at run time) |
//! | `cpu-randomness` | paths through `rand`, `fastrand`, `getrandom`; bare `rng()`, `random()`, `thread_rng()`; `.gen()`, `.gen_range()`, `.gen_bool()`, `.random_range()`, `.random_bool()`, `.random_ratio()`, `.shuffle()`, `from_entropy`, `from_os_rng` | the values drawn at capture are replayed forever | a function of your own named `random` or `rng`, a module named `rand` | a generator passed in and used through other method names (`sample`, `choose`) |
//! | `host-print` | `println!`, `print!`, `eprintln!`, `eprint!`, `dbg!` | runs during warmup and capture, never on replay | a macro of your own with one of these names | `write!`/`writeln!` to a file or stdout handle made outside the body |
//! | `host-log` | `info!`, `debug!`, `warn!`, `error!`, `trace!`, `event!`, `log!` (any path) | the same | macros of your own with these names | logging inside helper fns |
//! | `host-io` | paths through `fs`, `File`, `OpenOptions`, `TcpStream`, `TcpListener`, `UdpSocket`, `stdin`, `stdout`, `stderr`, `Command` | the same: the I/O happens at capture only | modules or types of your own with these names | I/O through handles made outside the body |
//! | `host-sleep` | a path ending in or containing `sleep` | the same: a replay does not wait | a function of your own named `sleep` | — |
//! | `host-bookkeeping` | `push`, `insert`, `extend`, `append`, `remove`, `pop`, `truncate`, `retain`, `drain`, `clear` (and their variants) on a parameter declared as `Vec`, `VecDeque`, `HashMap`, `BTreeMap`, `HashSet`, `BTreeSet` or `String` | the same: the collection is updated at capture only | — | collections reached through statics or fields of other parameters |
//! | `host-clock` | `Instant::now`, `SystemTime::now` | the same: the time read at capture is frozen | types of your own with these names | clocks read in helper fns |
//!
//! The `host-*` rules are lifted by the `host_effects_not_replayed` attribute key, whose
//! name states the consequence; the others cannot be lifted (each is a failed capture or a
//! wrong graph). Functions and items declared *inside* the body are not walked, like any
//! other helper: a helper function is where a deliberate exception goes, and where the
//! runtime's own guards ([`ensure_not_capturing`], the graph inspection) take over.
//!
//! Deliberately *not* rules: `.join()` and `.wait()` (how a side stream rejoins the capture;
//! a wait on an event recorded before capture is CUDA error 905, reported at run time as
//! `GraphError::CaptureIsolation`), `capture_status()` and `graph_runtime::phase()` (both
//! are legal while capturing), device allocations (`alloc_zeros`, which become graph
//! memory nodes) and `Runtime::fork` (the scoped fork/join the runtime provides).
//!
//! [`ensure_not_capturing`]: https://docs.rs/graph-runtime/latest/graph_runtime/fn.ensure_not_capturing.html

use std::collections::{HashMap, HashSet};

use proc_macro2::{Ident, Punct, Spacing, Span, TokenStream, TokenTree};
use quote::ToTokens;
use syn::parse::Parser;
use syn::punctuated::Punctuated;
use syn::visit::{self, Visit};
use syn::{Expr, FnArg, ItemFn, Pat, Token, Type};

use crate::args::{GraphArgs, HOST_EFFECTS_KEY};
use crate::ctxt::Ctxt;

/// How a rule recognises a construct in the body's tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Matcher {
    /// `receiver.name(…)`, any receiver, any arguments.
    Method(&'static str),
    /// `receiver.name()` with no arguments (cudarc's `CudaStream::fork`, not `Runtime::fork`).
    MethodNoArgs(&'static str),
    /// A path expression (a value or a called function) whose segments contain these,
    /// next to each other: `["Instant", "now"]` matches `std::time::Instant::now`.
    Path(&'static [&'static str]),
    /// A call of a bare function, written without a path: `rng()`.
    BareCall(&'static str),
    /// A macro invocation `name!(…)`, by the last segment of its path.
    Macro(&'static str),
    /// A formatting macro given one of the body's device buffers.
    FormatsDeviceBuffer,
    /// A condition (`if`, `while`, `match`, `for`, `let … else`) that reads device data.
    BranchesOnDeviceData,
    /// `FooGraph::capture(…)` inside the body.
    NestedGraphCapture,
    /// `p.name(…)` where `p` is a parameter whose declared type is cudarc's
    /// `PinnedHostSlice` (the signature says so).
    PinnedParamMethod(&'static str),
    /// `p.name(…)` where `p` is a parameter whose declared type is a host collection
    /// (`Vec`, `VecDeque`, `HashMap`, `BTreeMap`, `HashSet`, `BTreeSet`, `String`).
    CollectionParamMethod(&'static str),
}

/// One mistake the macro rejects.
#[derive(Debug)]
pub struct Rule {
    /// A stable short name, used by the tests and the coverage table.
    pub id: &'static str,
    /// What the rule matches.
    pub matchers: &'static [Matcher],
    /// Whether `host_effects_not_replayed` lifts it.
    pub host_effect: bool,
    /// The error message. `{what}` becomes the construct found (`` `.clone_dtoh()` ``,
    /// `` `println!` ``), `{data}` the device data involved, where the rule has one, and
    /// `{opt_in}` the way to lift a `host-*` rule.
    pub message: &'static str,
}

/// The end of every `host-*` message: how to opt in.
fn opt_in() -> String {
    format!(
        "if running it only then is what you want, add `{HOST_EFFECTS_KEY}` to the `#[cuda_graph(…)]` \
         arguments"
    )
}

/// The device-to-host reads: the `device-to-host` rule, the taint of `let` bindings and the
/// `host-branch-on-device-data` rule all use this list.
const DEVICE_READS: &[Matcher] = &[
    Matcher::Method("clone_dtoh"),
    Matcher::Method("memcpy_dtoh"),
    Matcher::Method("memcpy_dtov"),
    Matcher::Method("dtoh_sync_copy"),
    Matcher::Method("dtoh_sync_copy_into"),
    Matcher::Method("sync_reclaim"),
];

/// Calls whose result is a device buffer of the body (for `device-value-formatted`).
const DEVICE_ALLOCS: &[&str] = &["alloc_zeros", "alloc", "clone_dtod", "try_clone"];

/// Macros whose arguments are formatted.
const FORMATTING_MACROS: &[&str] = &[
    "println",
    "print",
    "eprintln",
    "eprint",
    "format",
    "format_args",
    "write",
    "writeln",
    "panic",
    "dbg",
    "assert",
    "assert_eq",
    "assert_ne",
    "debug_assert",
    "debug_assert_eq",
    "debug_assert_ne",
    "unreachable",
    "todo",
    "unimplemented",
    "info",
    "debug",
    "warn",
    "error",
    "trace",
    "event",
    "log",
];

/// Every rule, in the order of the module documentation's table.
pub const RULES: &[Rule] = &[
    Rule {
        id: "host-sync",
        matchers: &[Matcher::Method("synchronize")],
        host_effect: false,
        message: "{what} makes the CPU wait for the GPU, which a capture cannot record: it fails with CUDA \
                  error 900 (operation not permitted when stream is capturing); the graph's kernels already \
                  run in stream order, so delete it, and wait for results after `replay()` returns",
    },
    Rule {
        id: "device-to-host",
        matchers: DEVICE_READS,
        host_effect: false,
        message: "{what} reads device memory on the host, but while the body is captured the GPU has not run \
                  yet: the copy is recorded into the graph instead of done, the host buffer holds garbage, and \
                  every replay would write into a host buffer that is long gone (the runtime refuses such a \
                  graph with `GraphError::PageableCopyCaptured`; a read that waits fails with CUDA error 900, \
                  operation not permitted when stream is capturing); make the value an output parameter \
                  (`out: &mut CudaSlice<T>`) and read it after the replay: \
                  `stream.clone_dtoh(graph.replay(…)?.out)`",
    },
    Rule {
        id: "host-to-device",
        matchers: &[
            Matcher::Method("clone_htod"),
            Matcher::Method("memcpy_htod"),
            Matcher::Method("memcpy_stod"),
            Matcher::Method("htod_copy"),
            Matcher::Method("htod_copy_into"),
            Matcher::Method("htod_sync_copy"),
            Matcher::Method("htod_sync_copy_into"),
        ],
        host_effect: false,
        message: "{what} copies host memory to the device: a capture records the host address, not the values, \
                  so every replay would copy from that address again after the `Vec` or slice is gone (the \
                  runtime refuses such a graph with `GraphError::PageableCopyCaptured`); take the data as an \
                  input parameter (`x: &CudaSlice<T>`, refilled by every `replay`), as `#[state]` if it rarely \
                  changes, or upload it once before `capture` (a copy from a pinned buffer that outlives the \
                  graph is legal, but its tokens look the same: make it in a helper function)",
    },
    Rule {
        id: "device-value-formatted",
        matchers: &[Matcher::FormatsDeviceBuffer],
        host_effect: false,
        message: "{what} formats the device buffer {data}: its values live on the GPU and, while the body is \
                  captured, have not been computed yet; showing them needs a device-to-host copy and a wait, \
                  which a capture cannot do (CUDA error 900, operation not permitted when stream is capturing); \
                  print it after `replay()` returns, from the graph's outputs",
    },
    Rule {
        id: "host-branch-on-device-data",
        matchers: &[Matcher::BranchesOnDeviceData],
        host_effect: false,
        message: "this condition decides on the host from {data}: while the body is captured that value does \
                  not exist yet (reading it fails with CUDA error 900, operation not permitted when stream is \
                  capturing, or yields garbage), and a graph records only the path taken at capture and replays \
                  it whatever the data says; keep the decision on the GPU (a kernel that reads the flag from \
                  device memory and skips its work), or decide after `replay()` returns and capture one graph \
                  per path",
    },
    Rule {
        id: "stream-or-event-query",
        matchers: &[
            Matcher::Method("query"),
            Matcher::Method("is_complete"),
            Matcher::Method("try_is_complete"),
            Matcher::Method("elapsed_ms"),
        ],
        host_effect: false,
        message: "{what} asks whether GPU work has finished, which has no answer while the work is only being \
                  recorded: it fails with CUDA error 900 (operation not permitted when stream is capturing), or \
                  CUDA error 907 (operation not permitted on an event last recorded in a capturing stream) for an event \
                  recorded in the body; query streams and time events outside the body, around \
                  `graph.replay(…)`",
    },
    Rule {
        id: "pinned-host-alloc",
        matchers: &[
            Matcher::Method("alloc_pinned"),
            Matcher::Method("alloc_pinned_with_flags"),
            Matcher::Path(&["malloc_host"]),
        ],
        host_effect: false,
        message: "{what} allocates page-locked host memory, a blocking driver call that a capture refuses with CUDA \
                  error 900 (operation not permitted when stream is capturing) in the `thread_local` and \
                  `global` capture modes, and freeing it at the end of the body waits for the GPU as well; \
                  allocate pinned buffers once, before `capture`, and keep them as long as the graph, or use \
                  device memory (`rt.stream().alloc_zeros`), which becomes part of the graph",
    },
    Rule {
        id: "pinned-host-read",
        matchers: &[
            Matcher::PinnedParamMethod("as_slice"),
            Matcher::PinnedParamMethod("as_mut_slice"),
            Matcher::PinnedParamMethod("as_ptr"),
            Matcher::PinnedParamMethod("as_mut_ptr"),
        ],
        host_effect: false,
        message: "{what} on the pinned buffer {data} first waits for the GPU work that uses it (cudarc \
                  synchronizes the buffer's event), which a capture refuses with CUDA error 900 (operation not \
                  permitted when stream is capturing), and the host values it would show are not computed yet; \
                  copy to or from the pinned buffer with the stream's copy calls inside the body, and touch its \
                  host side only before `capture` or after `replay()` returns",
    },
    Rule {
        id: "legacy-default-stream",
        matchers: &[
            Matcher::Method("default_stream"),
            Matcher::Method("per_thread_stream"),
        ],
        host_effect: false,
        message: "{what} is not the capture stream: the runtime captures on its own non-blocking stream, so work \
                  queued on a default stream does not wait for the capture, runs once, right away, and is not \
                  in the graph (a body with nothing else fails with `GraphError::EmptyGraph`); with a blocking \
                  capture stream it would fail with CUDA error 906 (operation would make the legacy stream \
                  depend on a capturing blocking stream); queue the work on `rt.stream()` (or the context \
                  parameter)",
    },
    Rule {
        id: "stream-created-in-body",
        matchers: &[
            Matcher::Method("new_stream"),
            Matcher::Method("new_stream_with_priority"),
            Matcher::Method("wrap_borrowed_stream"),
            Matcher::MethodNoArgs("fork"),
        ],
        host_effect: false,
        message: "{what} creates a stream inside the captured body: work on it is not recorded unless the \
                  stream first waits on the capture, and then it must rejoin the capture stream before the \
                  body returns or the capture fails with CUDA error 904 (capturing stream has unjoined work); \
                  creating and using a stream during a capture also failed with CUDA error 900 on an H100; run side \
                  work with `rt.fork(|side| { … })`, which uses a stream made before the capture and always \
                  rejoins the runtime's stream",
    },
    Rule {
        id: "cublas-handle-in-body",
        matchers: &[Matcher::Path(&["CudaBlas", "new"])],
        host_effect: false,
        message: "{what} creates a cuBLAS handle inside the captured body: it is created again on every warmup \
                  run and at capture, and destroying it at the end of the body synchronizes the device, which a \
                  capture refuses (CUDA error 900, operation not permitted when stream is capturing); use \
                  `rt.blas()`, the runtime's handle, bound to the capture stream with its workspace set up \
                  before any capture",
    },
    Rule {
        id: "capture-control",
        matchers: &[
            Matcher::Method("begin_capture"),
            Matcher::Method("end_capture"),
        ],
        host_effect: false,
        message: "{what} controls a stream capture by hand, but the runtime already captures this body on \
                  its stream: a second capture cannot begin there, ending it early leaves the rest of the body \
                  unrecorded, and ending it on another stream is CUDA error 903 (capture was not ended in the \
                  same stream as it began); delete it, the generated `capture` begins and ends the capture \
                  around the body",
    },
    Rule {
        id: "nested-graph-capture",
        matchers: &[Matcher::NestedGraphCapture],
        host_effect: false,
        message: "{what} captures a graph inside the body of another: captures do not nest, and the runtime \
                  refuses it with `GraphError::NestedCapture`; call the inner `#[cuda_graph]` function \
                  directly (its work becomes part of this graph), or capture the inner graph before this one",
    },
    Rule {
        id: "cpu-randomness",
        matchers: &[
            Matcher::Path(&["rand"]),
            Matcher::Path(&["fastrand"]),
            Matcher::Path(&["getrandom"]),
            Matcher::Path(&["from_entropy"]),
            Matcher::Path(&["from_os_rng"]),
            Matcher::BareCall("rng"),
            Matcher::BareCall("random"),
            Matcher::BareCall("thread_rng"),
            Matcher::Method("gen"),
            Matcher::Method("gen_range"),
            Matcher::Method("gen_bool"),
            Matcher::Method("random_range"),
            Matcher::Method("random_bool"),
            Matcher::Method("random_ratio"),
            Matcher::Method("shuffle"),
        ],
        host_effect: false,
        message: "{what} draws random numbers on the CPU, but the body runs only during warmup and capture: the \
                  values drawn at capture are frozen into the graph (as kernel arguments or copied data) and \
                  every replay repeats them; draw on the GPU instead, with the runtime's graph-safe generator \
                  (`rt.rng().uniform(rt, &mut noise, lo, hi)?`), whose seed and offset live in device memory \
                  and advance on every replay",
    },
    Rule {
        id: "host-print",
        matchers: &[
            Matcher::Macro("println"),
            Matcher::Macro("print"),
            Matcher::Macro("eprintln"),
            Matcher::Macro("eprint"),
            Matcher::Macro("dbg"),
        ],
        host_effect: true,
        message: "{what} prints on the host: it runs during the warmup runs and the capture, and never when the \
                  graph replays, because a graph holds only GPU work; print after `replay()` returns, or, {opt_in}",
    },
    Rule {
        id: "host-log",
        matchers: &[
            Matcher::Macro("info"),
            Matcher::Macro("debug"),
            Matcher::Macro("warn"),
            Matcher::Macro("error"),
            Matcher::Macro("trace"),
            Matcher::Macro("event"),
            Matcher::Macro("log"),
        ],
        host_effect: true,
        message: "{what} logs on the host: it runs during the warmup runs and the capture, and never when the \
                  graph replays, because a graph holds only GPU work; log around `replay()`, or, {opt_in}",
    },
    Rule {
        id: "host-io",
        matchers: &[
            Matcher::Path(&["fs"]),
            Matcher::Path(&["File"]),
            Matcher::Path(&["OpenOptions"]),
            Matcher::Path(&["TcpStream"]),
            Matcher::Path(&["TcpListener"]),
            Matcher::Path(&["UdpSocket"]),
            Matcher::Path(&["stdin"]),
            Matcher::Path(&["stdout"]),
            Matcher::Path(&["stderr"]),
            Matcher::Path(&["Command"]),
        ],
        host_effect: true,
        message: "{what} does file, network or process I/O on the host: it happens during the warmup runs and \
                  the capture only, so a replay neither reads fresh data nor writes anything; do the I/O outside \
                  the body and pass data in through an input parameter, or, {opt_in}",
    },
    Rule {
        id: "host-sleep",
        matchers: &[Matcher::Path(&["sleep"])],
        host_effect: true,
        message: "{what} sleeps on the host during the warmup runs and the capture only: a replay does not wait \
                  (the GPU runs the graph without the CPU); sleep between `replay()` calls to pace them, or, \
                  {opt_in}",
    },
    Rule {
        id: "host-bookkeeping",
        matchers: &[
            Matcher::CollectionParamMethod("push"),
            Matcher::CollectionParamMethod("push_back"),
            Matcher::CollectionParamMethod("push_front"),
            Matcher::CollectionParamMethod("push_str"),
            Matcher::CollectionParamMethod("insert"),
            Matcher::CollectionParamMethod("extend"),
            Matcher::CollectionParamMethod("extend_from_slice"),
            Matcher::CollectionParamMethod("append"),
            Matcher::CollectionParamMethod("remove"),
            Matcher::CollectionParamMethod("swap_remove"),
            Matcher::CollectionParamMethod("pop"),
            Matcher::CollectionParamMethod("pop_back"),
            Matcher::CollectionParamMethod("pop_front"),
            Matcher::CollectionParamMethod("truncate"),
            Matcher::CollectionParamMethod("retain"),
            Matcher::CollectionParamMethod("drain"),
            Matcher::CollectionParamMethod("clear"),
        ],
        host_effect: true,
        message: "{what} changes the host collection {data} during the warmup runs and the capture only: \
                  replays do not run it, so the collection stops following the graph after capture; keep \
                  per-replay records outside the body (after each `replay()`), or, {opt_in}",
    },
    Rule {
        id: "host-clock",
        matchers: &[
            Matcher::Path(&["Instant", "now"]),
            Matcher::Path(&["SystemTime", "now"]),
        ],
        host_effect: true,
        message: "{what} reads the host clock during the warmup runs and the capture only: a replay does not \
                  read it again, and anything computed from it (a timestamp, a seed, a timeout) is frozen into \
                  the graph; time replays from outside the body (CUDA events around `replay()`), or, {opt_in}",
    },
];

/// Looks a rule up by id.
pub fn rule(id: &str) -> &'static Rule {
    RULES
        .iter()
        .find(|r| r.id == id)
        .unwrap_or_else(|| panic!("no capture rule `{id}`"))
}

/// One mistake found in a body.
pub struct Finding {
    /// The rule that matched.
    #[cfg_attr(not(test), allow(dead_code))]
    pub rule: &'static Rule,
    /// First and last span of the offending construct.
    pub span: (Span, Span),
    /// The message, with its placeholders filled in.
    pub message: String,
}

impl Finding {
    fn to_error(&self) -> syn::Error {
        // Two tokens carrying the first and last span: `new_spanned` makes the error cover
        // the range between them.
        let (start, end) = self.span;
        let mut range = TokenStream::new();
        range.extend([
            TokenTree::Punct(with_span(Punct::new('<', Spacing::Alone), start)),
            TokenTree::Punct(with_span(Punct::new('>', Spacing::Alone), end)),
        ]);
        syn::Error::new_spanned(range, &self.message)
    }
}

fn with_span(mut p: Punct, span: Span) -> Punct {
    p.set_span(span);
    p
}

/// Checks the body of `item`, recording one error per offending construct.
pub fn check_body(item: &ItemFn, args: &GraphArgs, cx: &mut Ctxt) {
    for f in findings(item, args) {
        cx.push(f.to_error());
    }
}

/// Every finding in the body of `item`, in source order.
pub fn findings(item: &ItemFn, args: &GraphArgs) -> Vec<Finding> {
    let mut w = Walker {
        host_effects: args.host_effects,
        device_bufs: device_params(item),
        pinned: params_of_type(item, &["PinnedHostSlice"]),
        collections: collection_params(item),
        tainted: HashMap::new(),
        quiet_reads: 0,
        findings: Vec::new(),
    };
    w.visit_block(&item.block);
    w.findings
}

/// The parameters after the first whose declared type names one of `types` (as the last
/// segment of a path anywhere in the type).
fn params_of_type(item: &ItemFn, types: &[&str]) -> HashSet<String> {
    struct Finder<'t>(&'t [&'t str], bool);
    impl<'ast> Visit<'ast> for Finder<'_> {
        fn visit_path(&mut self, p: &'ast syn::Path) {
            if p.segments
                .last()
                .is_some_and(|s| self.0.contains(&unraw(&s.ident).as_str()))
            {
                self.1 = true;
            }
            visit::visit_path(self, p);
        }
    }
    item.sig
        .inputs
        .iter()
        .skip(1)
        .filter_map(|arg| match arg {
            FnArg::Typed(pt) => {
                let mut f = Finder(types, false);
                f.visit_type(&pt.ty);
                match &*pt.pat {
                    Pat::Ident(p) if f.1 => Some(unraw(&p.ident)),
                    _ => None,
                }
            }
            FnArg::Receiver(_) => None,
        })
        .collect()
}

/// The outermost type a parameter's reference points to, by its last path segment.
fn referenced_type_name(ty: &Type) -> Option<String> {
    match ty {
        Type::Reference(r) => referenced_type_name(&r.elem),
        Type::Paren(p) => referenced_type_name(&p.elem),
        Type::Path(p) => p.path.segments.last().map(|s| unraw(&s.ident)),
        _ => None,
    }
}

/// Parameters that are host collections (`&mut Vec<…>`, …), by their declared type.
fn collection_params(item: &ItemFn) -> HashSet<String> {
    const COLLECTIONS: [&str; 7] = [
        "Vec", "VecDeque", "HashMap", "BTreeMap", "HashSet", "BTreeSet", "String",
    ];
    item.sig
        .inputs
        .iter()
        .skip(1)
        .filter_map(|arg| match arg {
            FnArg::Typed(pt) => match (&*pt.pat, referenced_type_name(&pt.ty)) {
                (Pat::Ident(p), Some(t)) if COLLECTIONS.contains(&t.as_str()) => {
                    Some(unraw(&p.ident))
                }
                _ => None,
            },
            FnArg::Receiver(_) => None,
        })
        .collect()
}

/// The names of the reference parameters after the first (inputs, outputs, state): the
/// device buffers a body might try to print.
fn device_params(item: &ItemFn) -> HashSet<String> {
    item.sig
        .inputs
        .iter()
        .skip(1)
        .filter_map(|arg| match arg {
            FnArg::Typed(pt) if matches!(*pt.ty, Type::Reference(_)) => match &*pt.pat {
                Pat::Ident(p) => Some(unraw(&p.ident)),
                _ => None,
            },
            _ => None,
        })
        .collect()
}

fn unraw(ident: &Ident) -> String {
    let s = ident.to_string();
    s.strip_prefix("r#").map(str::to_owned).unwrap_or(s)
}

fn is_device_read(method: &str) -> bool {
    DEVICE_READS
        .iter()
        .any(|m| matches!(m, Matcher::Method(n) if *n == method))
}

struct Walker {
    host_effects: bool,
    /// Names bound to device buffers: reference parameters and locals bound to allocations.
    device_bufs: HashSet<String>,
    /// Parameters declared as cudarc pinned host buffers.
    pinned: HashSet<String>,
    /// Parameters declared as host collections.
    collections: HashSet<String>,
    /// Locals bound to data read back from the device, with how it was read.
    tainted: HashMap<String, String>,
    /// Above zero while walking a condition already reported as a whole: its reads are
    /// part of that error.
    quiet_reads: usize,
    findings: Vec<Finding>,
}

impl Walker {
    fn report(&mut self, rule: &'static Rule, span: (Span, Span), what: &str, data: &str) {
        if rule.host_effect && self.host_effects {
            return;
        }
        if rule.id == "device-to-host" && self.quiet_reads > 0 {
            return;
        }
        let message = rule
            .message
            .replace("{opt_in}", &opt_in())
            .replace("{what}", what)
            .replace("{data}", data);
        self.findings.push(Finding {
            rule,
            span,
            message,
        });
    }

    /// Reports each rule at most once for this node.
    fn match_rules(&mut self, span: (Span, Span), what: &str, hit: impl Fn(&Matcher) -> bool) {
        for rule in RULES {
            if rule.matchers.iter().any(&hit) {
                self.report(rule, span, what, "");
            }
        }
    }

    /// Reports the `Path` rules a path expression matches.
    fn match_path(&mut self, p: &syn::ExprPath) {
        let segs: Vec<String> = p.path.segments.iter().map(|s| unraw(&s.ident)).collect();
        let what = format!("`{}`", segs.join("::"));
        self.match_rules(spans_of(p), &what, |matcher| match matcher {
            Matcher::Path(pattern) => segs
                .windows(pattern.len())
                .any(|w| w.iter().zip(pattern.iter()).all(|(a, b)| a == b)),
            _ => false,
        });
    }

    /// Reports a condition that reads device data, and walks it.
    fn condition(&mut self, cond: &Expr) {
        let mut reads = Reads {
            tainted: &self.tainted,
            found: Vec::new(),
            direct: false,
        };
        reads.visit_expr(cond);
        let direct = reads.direct;
        if let Some(data) = reads.found.into_iter().next() {
            self.report(
                rule("host-branch-on-device-data"),
                spans_of(cond),
                "",
                &data,
            );
        }
        if direct {
            self.quiet_reads += 1;
        }
        self.visit_expr(cond);
        if direct {
            self.quiet_reads -= 1;
        }
    }

    /// What a `let` or an assignment binds: marks or clears its names as device data and as
    /// device buffers.
    fn bind(&mut self, names: Vec<String>, init: Option<&Expr>) {
        let (read, alloc) = match init {
            Some(e) => {
                let mut reads = Reads {
                    tainted: &self.tainted,
                    found: Vec::new(),
                    direct: false,
                };
                reads.visit_expr(e);
                let read = reads.found.into_iter().next();
                (read, calls_any(e, DEVICE_ALLOCS))
            }
            None => (None, false),
        };
        for n in names {
            match &read {
                Some(how) => {
                    let desc = match how.strip_prefix("the result of ") {
                        Some(call) => format!("`{n}` (read back from the GPU by {call})"),
                        None => format!("`{n}`, computed from {how}"),
                    };
                    self.tainted.insert(n.clone(), desc);
                }
                None => {
                    self.tainted.remove(&n);
                }
            }
            if alloc {
                self.device_bufs.insert(n);
            } else {
                self.device_bufs.remove(&n);
            }
        }
    }

    /// The first of the body's device buffers that a formatting macro's arguments pass as a
    /// whole (`y`, `&y`, `?y`, `name = %y`) or name inline in a literal (`"{y:?}"`).
    /// Uses of a buffer in a larger expression (`y.len()`) are host values and pass.
    fn formatted_buffer(&self, tokens: &TokenStream) -> Option<String> {
        let mut args: Vec<Vec<TokenTree>> = vec![Vec::new()];
        for tt in tokens.clone() {
            match &tt {
                TokenTree::Punct(p) if p.as_char() == ',' => args.push(Vec::new()),
                _ => args.last_mut().expect("never empty").push(tt),
            }
        }
        for arg in &args {
            if let Some(name) = self.whole_buffer(arg) {
                return Some(name);
            }
            for tt in arg {
                if let TokenTree::Literal(lit) = tt {
                    if let Ok(s) = syn::parse2::<syn::LitStr>(lit.to_token_stream()) {
                        if let Some(n) = inline_args(&s.value())
                            .into_iter()
                            .find(|n| self.device_bufs.contains(n))
                        {
                            return Some(n);
                        }
                    }
                }
            }
        }
        None
    }

    /// Whether one macro argument is a device buffer of the body, as a whole.
    fn whole_buffer(&self, arg: &[TokenTree]) -> Option<String> {
        let mut rest = arg;
        // `name = value` (format and tracing named arguments).
        if let [TokenTree::Ident(_), TokenTree::Punct(eq), tail @ ..] = rest {
            if eq.as_char() == '=' && eq.spacing() == Spacing::Alone {
                rest = tail;
            }
        }
        loop {
            match rest {
                [TokenTree::Punct(p), tail @ ..]
                    if matches!(p.as_char(), '&' | '*' | '?' | '%') =>
                {
                    rest = tail
                }
                [TokenTree::Ident(m), tail @ ..] if m == "mut" => rest = tail,
                _ => break,
            }
        }
        match rest {
            [TokenTree::Ident(id)] => {
                let name = unraw(id);
                self.device_bufs.contains(&name).then_some(name)
            }
            [TokenTree::Group(g)] => {
                let inner: Vec<TokenTree> = g.stream().into_iter().collect();
                self.whole_buffer(&inner)
            }
            _ => None,
        }
    }
}

/// Names used inline in a format string: `{y}`, `{y:?}`, `{y:#?}`.
fn inline_args(fmt: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = fmt;
    while let Some(open) = rest.find('{') {
        rest = &rest[open + 1..];
        if rest.starts_with('{') {
            rest = &rest[1..]; // `{{` is a literal brace
            continue;
        }
        let end = rest.find(['}', ':']).unwrap_or(rest.len());
        let name = rest[..end].trim();
        if !name.is_empty() && name.chars().all(|c| c.is_alphanumeric() || c == '_') {
            out.push(name.to_owned());
        }
    }
    out
}

fn spans_of<T: ToTokens>(node: &T) -> (Span, Span) {
    let mut tokens = node.to_token_stream().into_iter();
    let first = tokens
        .next()
        .map(|t| t.span())
        .unwrap_or_else(Span::call_site);
    let last = tokens.last().map(|t| t.span()).unwrap_or(first);
    (first, last)
}

/// Whether `e` calls one of `methods` (as a method), outside closures (a closure's result
/// is what it returns, not what it allocates).
fn calls_any(e: &Expr, methods: &[&str]) -> bool {
    struct Finder<'m>(&'m [&'m str], bool);
    impl<'ast> Visit<'ast> for Finder<'_> {
        fn visit_expr_method_call(&mut self, m: &'ast syn::ExprMethodCall) {
            if self.0.contains(&unraw(&m.method).as_str()) {
                self.1 = true;
            }
            visit::visit_expr_method_call(self, m);
        }
        fn visit_expr_closure(&mut self, _: &'ast syn::ExprClosure) {}
        fn visit_item(&mut self, _: &'ast syn::Item) {}
    }
    let mut f = Finder(methods, false);
    f.visit_expr(e);
    f.1
}

/// The names a pattern binds.
fn bound_names(pat: &Pat) -> Vec<String> {
    struct Names(Vec<String>);
    impl<'ast> Visit<'ast> for Names {
        fn visit_pat_ident(&mut self, p: &'ast syn::PatIdent) {
            self.0.push(unraw(&p.ident));
            visit::visit_pat_ident(self, p);
        }
    }
    let mut n = Names(Vec::new());
    n.visit_pat(pat);
    n.0
}

/// The variable at the root of a place expression: `host` in `&mut host[..]`.
fn root_name(e: &Expr) -> Option<String> {
    match e {
        Expr::Path(p) if p.qself.is_none() && p.path.segments.len() == 1 => {
            Some(unraw(&p.path.segments[0].ident))
        }
        Expr::Reference(r) => root_name(&r.expr),
        Expr::Unary(u) => root_name(&u.expr),
        Expr::Paren(p) => root_name(&p.expr),
        Expr::Index(i) => root_name(&i.expr),
        Expr::Field(f) => root_name(&f.base),
        Expr::MethodCall(m) => root_name(&m.receiver),
        _ => None,
    }
}

/// Finds device data in an expression: reads from the device, and locals bound to them.
struct Reads<'t> {
    tainted: &'t HashMap<String, String>,
    /// A description of each, in order.
    found: Vec<String>,
    /// Whether one of them is a read written right there.
    direct: bool,
}

impl<'ast> Visit<'ast> for Reads<'_> {
    fn visit_expr_method_call(&mut self, m: &'ast syn::ExprMethodCall) {
        let name = unraw(&m.method);
        if is_device_read(&name) {
            self.found.push(format!("the result of `.{name}()`"));
            self.direct = true;
        }
        visit::visit_expr_method_call(self, m);
    }

    fn visit_expr_path(&mut self, p: &'ast syn::ExprPath) {
        if p.qself.is_none() && p.path.segments.len() == 1 {
            if let Some(how) = self.tainted.get(&unraw(&p.path.segments[0].ident)) {
                self.found.push(how.clone());
            }
        }
    }

    fn visit_expr_closure(&mut self, _: &'ast syn::ExprClosure) {}

    fn visit_item(&mut self, _: &'ast syn::Item) {}
}

impl<'ast> Visit<'ast> for Walker {
    /// Items declared inside the body are helpers: not walked.
    fn visit_item(&mut self, _: &'ast syn::Item) {}

    fn visit_expr_method_call(&mut self, m: &'ast syn::ExprMethodCall) {
        let name = unraw(&m.method);
        let span = (m.method.span(), m.paren_token.span.close());
        let what = format!("`.{name}()`");
        let no_args = m.args.is_empty();
        // A copy from a parameter declared as a pinned buffer is the legal host-to-device
        // copy: the signature says what the tokens of the call cannot.
        let pinned_source = m
            .args
            .first()
            .and_then(root_name)
            .is_some_and(|n| self.pinned.contains(&n));
        let host_to_device = rule("host-to-device");
        for r in RULES {
            let hit = r.matchers.iter().any(|matcher| match matcher {
                Matcher::Method(n) => *n == name,
                Matcher::MethodNoArgs(n) => *n == name && no_args,
                _ => false,
            });
            if hit && !(pinned_source && std::ptr::eq(r, host_to_device)) {
                self.report(r, span, &what, "");
            }
        }
        if let Some(recv) = root_name(&m.receiver) {
            let pinned = self.pinned.contains(&recv);
            let collection = self.collections.contains(&recv);
            let data = format!("`{recv}`");
            for r in RULES {
                let hit = r.matchers.iter().any(|matcher| match matcher {
                    Matcher::PinnedParamMethod(n) => pinned && *n == name,
                    Matcher::CollectionParamMethod(n) => collection && *n == name,
                    _ => false,
                });
                if hit {
                    self.report(r, span, &what, &data);
                }
            }
        }
        if name == "memcpy_dtoh" {
            if let Some(dst) = m.args.iter().nth(1).and_then(root_name) {
                self.tainted.insert(
                    dst.clone(),
                    format!("`{dst}` (filled from the GPU by `.memcpy_dtoh()`)"),
                );
            }
        }
        visit::visit_expr_method_call(self, m);
    }

    fn visit_expr_call(&mut self, c: &'ast syn::ExprCall) {
        if let Expr::Path(p) = &*c.func {
            if p.qself.is_none() && p.path.leading_colon.is_none() && p.path.segments.len() == 1 {
                let name = unraw(&p.path.segments[0].ident);
                let what = format!("`{name}()`");
                self.match_rules(
                    spans_of(c),
                    &what,
                    |matcher| matches!(matcher, Matcher::BareCall(n) if *n == name),
                );
                self.match_path(p);
            }
            let segs: Vec<String> = p.path.segments.iter().map(|s| unraw(&s.ident)).collect();
            if let [.., ty, f] = segs.as_slice() {
                if f == "capture" && ty.ends_with("Graph") && ty.len() > "Graph".len() {
                    let what = format!("`{ty}::capture`");
                    self.match_rules(spans_of(c), &what, |matcher| {
                        *matcher == Matcher::NestedGraphCapture
                    });
                }
            }
        }
        visit::visit_expr_call(self, c);
    }

    fn visit_expr_path(&mut self, p: &'ast syn::ExprPath) {
        // A one-segment path is a local variable unless it is called (see `visit_expr_call`).
        if p.path.segments.len() > 1 {
            self.match_path(p);
        }
        visit::visit_expr_path(self, p);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        let Some(last) = mac.path.segments.last() else {
            return;
        };
        let name = unraw(&last.ident);
        let what = format!("`{name}!`");
        let span = (
            mac.path
                .segments
                .first()
                .map_or_else(|| last.ident.span(), |s| s.ident.span()),
            mac.delimiter.span().close(),
        );
        let mut formats_buffer = false;
        if FORMATTING_MACROS.contains(&name.as_str()) {
            if let Some(buf) = self.formatted_buffer(&mac.tokens) {
                formats_buffer = true;
                self.report(
                    rule("device-value-formatted"),
                    span,
                    &what,
                    &format!("`{buf}`"),
                );
            }
        }
        if !formats_buffer {
            self.match_rules(
                span,
                &what,
                |matcher| matches!(matcher, Matcher::Macro(n) if *n == name),
            );
        }
        // Macro arguments are tokens to syn; walk them when they parse as expressions.
        let parsed = Punctuated::<Expr, Token![,]>::parse_terminated.parse2(mac.tokens.clone());
        match parsed {
            Ok(exprs) => {
                for e in &exprs {
                    self.visit_expr(e);
                }
            }
            Err(_) => {
                // `vec![x; n]` and friends.
                let semi = |input: syn::parse::ParseStream| {
                    let a: Expr = input.parse()?;
                    let _: Token![;] = input.parse()?;
                    let b: Expr = input.parse()?;
                    Ok((a, b))
                };
                if let Ok((a, b)) = semi.parse2(mac.tokens.clone()) {
                    self.visit_expr(&a);
                    self.visit_expr(&b);
                }
            }
        }
    }

    fn visit_local(&mut self, l: &'ast syn::Local) {
        for a in &l.attrs {
            self.visit_attribute(a);
        }
        if let Some(init) = &l.init {
            if init.diverge.is_some() {
                self.condition(&init.expr);
            } else {
                self.visit_expr(&init.expr);
            }
            if let Some((_, diverge)) = &init.diverge {
                self.visit_expr(diverge);
            }
        }
        self.bind(bound_names(&l.pat), l.init.as_ref().map(|i| &*i.expr));
    }

    fn visit_expr_assign(&mut self, a: &'ast syn::ExprAssign) {
        self.visit_expr(&a.right);
        self.visit_expr(&a.left);
        if let Some(name) = root_name(&a.left) {
            if matches!(&*a.left, Expr::Path(_)) {
                self.bind(vec![name], Some(&a.right));
            }
        }
    }

    fn visit_expr_if(&mut self, i: &'ast syn::ExprIf) {
        self.condition(&i.cond);
        self.visit_block(&i.then_branch);
        if let Some((_, e)) = &i.else_branch {
            self.visit_expr(e);
        }
    }

    fn visit_expr_while(&mut self, w: &'ast syn::ExprWhile) {
        self.condition(&w.cond);
        self.visit_block(&w.body);
    }

    fn visit_expr_match(&mut self, m: &'ast syn::ExprMatch) {
        self.condition(&m.expr);
        for arm in &m.arms {
            self.visit_arm(arm);
        }
    }

    fn visit_expr_for_loop(&mut self, f: &'ast syn::ExprForLoop) {
        self.condition(&f.expr);
        self.visit_pat(&f.pat);
        self.visit_block(&f.body);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::expand;
    use quote::quote;

    /// The rule ids a body triggers, in order, through the same entry point the compiler
    /// uses (`expand::cuda_graph`), matched back to the table by message.
    fn ids(args: TokenStream, body: TokenStream) -> Vec<&'static str> {
        let item = quote! {
            fn f(
                rt: &Runtime,
                x: &CudaSlice<f32>,
                y: &mut CudaSlice<f32>,
                #[state] staging: &PinnedHostSlice<f32>,
                #[state] history: &mut Vec<usize>,
            ) -> Result<(), GraphError> {
                #body
                Ok(())
            }
        };
        let item: ItemFn = syn::parse2(item).expect("test body parses");
        let mut cx = Ctxt::default();
        let parsed = crate::args::parse(args.clone(), &mut cx);
        let direct: Vec<&'static str> =
            findings(&item, &parsed).iter().map(|f| f.rule.id).collect();
        // End to end: the expansion carries one `compile_error!` per finding, with its text.
        let out = expand::cuda_graph(args, item.to_token_stream());
        let messages = compile_errors(out);
        assert_eq!(messages.len(), direct.len(), "{messages:#?}");
        for (id, msg) in direct.iter().zip(&messages) {
            let head: String = rule(id).message.split('{').next().unwrap_or("").to_owned();
            let marker = rule(id)
                .message
                .split(['{', '}'])
                .filter(|part| !part.is_empty() && !["what", "data", "opt_in"].contains(part))
                .max_by_key(|part| part.len())
                .unwrap_or(&head);
            assert!(msg.contains(marker.trim()), "rule {id}: {msg}");
        }
        direct
    }

    fn compile_errors(out: TokenStream) -> Vec<String> {
        let file: syn::File = syn::parse2(out).expect("the expansion parses");
        file.items
            .iter()
            .filter_map(|item| match item {
                syn::Item::Macro(m) if m.mac.path.segments.last()?.ident == "compile_error" => {
                    Some(
                        syn::parse2::<syn::LitStr>(m.mac.tokens.clone())
                            .ok()?
                            .value(),
                    )
                }
                _ => None,
            })
            .collect()
    }

    fn one(body: TokenStream) -> Vec<&'static str> {
        ids(quote!(warmup = 2), body)
    }

    /// A minimal snippet for each matcher, generated from the table.
    fn snippet(m: &Matcher) -> TokenStream {
        let ident = |s: &str| Ident::new(s, Span::call_site());
        match m {
            Matcher::Method(n) => {
                let n = ident(n);
                quote!(let _ = thing.#n(arg);)
            }
            Matcher::MethodNoArgs(n) => {
                let n = ident(n);
                quote!(let _ = thing.#n();)
            }
            Matcher::Path(p) => {
                let segs: Vec<Ident> = p.iter().map(|s| ident(s)).collect();
                if segs.len() == 1 {
                    quote!(let _ = #(#segs)::*::function();)
                } else {
                    quote!(let _ = #(#segs)::*();)
                }
            }
            Matcher::BareCall(n) => {
                let n = ident(n);
                quote!(let _ = #n();)
            }
            Matcher::Macro(n) => {
                let n = ident(n);
                quote!(#n!("step");)
            }
            Matcher::FormatsDeviceBuffer => quote!(let _ = format!("{:?}", y);),
            Matcher::BranchesOnDeviceData => {
                quote!(if rt.stream().clone_dtoh(y)?[0] > 0.0 {
                    launch(rt)?;
                })
            }
            Matcher::NestedGraphCapture => quote!(let _inner = InnerGraph::capture(rt, x, 16)?;),
            Matcher::PinnedParamMethod(n) => {
                let n = ident(n);
                quote!(let _ = staging.#n();)
            }
            Matcher::CollectionParamMethod(n) => {
                let n = ident(n);
                quote!(history.#n(arg);)
            }
        }
    }

    #[test]
    fn every_matcher_of_every_rule_fires_alone() {
        for rule in RULES {
            for m in rule.matchers {
                let got = one(snippet(m));
                assert_eq!(got, vec![rule.id], "{m:?} of rule `{}`", rule.id);
            }
        }
    }

    /// Every rule has a compile-fail case in `ui-tests/tests/fail/` whose snapshot shows its
    /// message.
    #[test]
    fn every_rule_has_a_ui_case() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../ui-tests/tests/fail");
        let snapshots: Vec<String> = std::fs::read_dir(&dir)
            .expect("ui-tests/tests/fail exists")
            .filter_map(|e| e.ok())
            .filter(|e| e.path().extension().is_some_and(|x| x == "stderr"))
            .map(|e| std::fs::read_to_string(e.path()).expect("readable snapshot"))
            .collect();
        for rule in RULES {
            // The longest fixed part of the message identifies it.
            let marker = rule
                .message
                .split(['{', '}'])
                .filter(|part| !["what", "data", "opt_in"].contains(part))
                .max_by_key(|part| part.len())
                .expect("a message has text");
            assert!(
                snapshots.iter().any(|s| s.contains(marker.trim())),
                "rule `{}` has no ui case in {}",
                rule.id,
                dir.display()
            );
        }
    }

    #[test]
    fn rule_ids_are_unique_and_messages_follow_the_style() {
        let mut seen = HashSet::new();
        for rule in RULES {
            assert!(seen.insert(rule.id), "duplicate id {}", rule.id);
            let m = rule.message;
            assert!(!m.ends_with('.'), "{}: trailing period", rule.id);
            let first = m.chars().next().unwrap();
            assert!(
                first == '{' || first.is_lowercase(),
                "{}: starts upper-case",
                rule.id
            );
            assert!(
                m.contains("CUDA error") || m.contains("GraphError") || m.contains("replay"),
                "{}: must say what goes wrong",
                rule.id
            );
            assert!(
                m.contains(';'),
                "{}: must say what to write instead",
                rule.id
            );
            assert_eq!(rule.host_effect, m.contains("{opt_in}"), "{}", rule.id);
        }
    }

    #[test]
    fn realistic_mistakes() {
        let cases: Vec<(&str, TokenStream)> = vec![
            ("host-sync", quote!(rt.stream().synchronize()?;)),
            ("host-sync", quote!(rt.context().synchronize()?;)),
            ("host-sync", quote!(rt.synchronize()?;)),
            (
                "device-to-host",
                quote!(let host = rt.stream().clone_dtoh(y)?;),
            ),
            (
                "host-to-device",
                quote!(let bias = rt.stream().clone_htod(&vec![0.5f32; 8])?;),
            ),
            (
                "host-to-device",
                quote!(rt.stream().memcpy_htod(&[1.0f32; 4], y)?;),
            ),
            ("device-value-formatted", quote!(let s = format!("{y:?}");)),
            ("device-value-formatted", quote!(let _ = dbg!(&x);)),
            (
                "stream-or-event-query",
                quote!(let done = ev.is_complete();),
            ),
            (
                "stream-or-event-query",
                quote!(let ms = start.elapsed_ms(&end)?;),
            ),
            (
                "pinned-host-alloc",
                quote!(let h = unsafe { rt.context().alloc_pinned::<f32>(8) }?;),
            ),
            (
                "legacy-default-stream",
                quote!(rt.context().default_stream().memcpy_dtod(x, y)?;),
            ),
            (
                "stream-created-in-body",
                quote!(let side = rt.context().new_stream()?;),
            ),
            (
                "stream-created-in-body",
                quote!(let side = rt.stream().fork()?;),
            ),
            (
                "cublas-handle-in-body",
                quote!(let blas = CudaBlas::new(rt.stream().clone())?;),
            ),
            ("capture-control", quote!(rt.stream().begin_capture(mode)?;)),
            (
                "nested-graph-capture",
                quote!(let g = PlusTwoGraph::capture(rt, x, 8)?;),
            ),
            ("cpu-randomness", quote!(let noise: f32 = rand::random();)),
            (
                "cpu-randomness",
                quote!(let scale = rng().random_range(0.5..1.5);),
            ),
            ("host-print", quote!(println!("step done");)),
            ("host-print", quote!(eprint!(".");)),
            (
                "host-log",
                quote!(tracing::info!(n = x.len(), "launching");),
            ),
            ("host-log", quote!(log::warn!("slow");)),
            (
                "host-io",
                quote!(let cfg = std::fs::read_to_string("cfg.toml")?;),
            ),
            ("host-io", quote!(let mut f = File::create("trace.bin")?;)),
            (
                "host-sleep",
                quote!(std::thread::sleep(Duration::from_millis(1));),
            ),
            ("host-clock", quote!(let t0 = Instant::now();)),
            (
                "pinned-host-read",
                quote!(let first = staging.as_slice()?[0];),
            ),
            ("host-bookkeeping", quote!(history.push(x.len());)),
            (
                "host-clock",
                quote!(let seed = SystemTime::now().duration_since(UNIX_EPOCH)?;),
            ),
        ];
        for (id, body) in cases {
            let got = one(body.clone());
            assert!(
                got.contains(&id),
                "expected `{id}` for `{body}`, got {got:?}"
            );
        }
    }

    #[test]
    fn a_condition_reading_the_device_is_one_error_on_the_condition() {
        assert_eq!(
            one(quote! {
                if rt.stream().clone_dtoh(y)?[0].is_nan() {
                    return Err(GraphError::User("NaN".into()));
                }
            }),
            ["host-branch-on-device-data"]
        );
        assert_eq!(
            one(quote!(while rt.stream().clone_dtoh(y)?[0] > 1.0 {
                halve(rt, y)?;
            })),
            ["host-branch-on-device-data"]
        );
    }

    #[test]
    fn locals_read_from_the_device_taint_later_conditions() {
        assert_eq!(
            one(quote! {
                let host = rt.stream().clone_dtoh(y)?;
                let worst = host.iter().fold(0.0f32, |a, b| a.max(*b));
                if worst > 1.0 { rescale(rt, y)?; }
                match host.len() { 0 => {}, _ => {} }
                for _ in 0..host.len() {}
            }),
            [
                "device-to-host",
                "host-branch-on-device-data",
                "host-branch-on-device-data",
                "host-branch-on-device-data"
            ]
        );
        assert_eq!(
            one(quote! {
                let mut host = vec![0.0f32; 4];
                rt.stream().memcpy_dtoh(y, &mut host)?;
                let Some(first) = host.first() else { return Ok(()) };
            }),
            ["device-to-host", "host-branch-on-device-data"]
        );
        // Re-binding the name to a host value clears the mark.
        assert_eq!(
            one(quote! {
                let v = rt.stream().clone_dtoh(y)?;
                let v = 1.0f32;
                if v > 0.0 {}
            }),
            ["device-to-host"]
        );
    }

    #[test]
    fn formatting_host_values_of_buffers_is_fine() {
        let opt_in = quote!(warmup = 2, host_effects_not_replayed);
        for body in [
            quote!(println!("{} elements", x.len());),
            quote!(tracing::debug!(n = y.len(), "step");),
            quote!(assert_eq!(x.len(), y.len(), "shapes differ");),
            quote!(let s = format!("{}", x.len());),
        ] {
            assert_eq!(
                ids(opt_in.clone(), body.clone()),
                Vec::<&str>::new(),
                "{body}"
            );
        }
        // Formatting a buffer is refused even with the opt-in, and reported once.
        assert_eq!(
            ids(opt_in, quote!(println!("{:?}", y);)),
            ["device-value-formatted"]
        );
        assert_eq!(
            one(quote!(println!("{:?}", y);)),
            ["device-value-formatted"]
        );
        // Locals bound to device allocations count as buffers.
        assert_eq!(
            one(quote! {
                let tmp = rt.stream().alloc_zeros::<f32>(x.len())?;
                let s = format!("{tmp:?}");
            }),
            ["device-value-formatted"]
        );
    }

    #[test]
    fn the_opt_in_lifts_host_effects_only() {
        let body = quote! {
            let t0 = Instant::now();
            println!("capturing");
            tracing::info!("capturing");
            std::thread::sleep(Duration::from_millis(1));
            let _ = std::fs::write("capture.log", "x");
            rt.stream().synchronize()?;
            let r: f32 = rand::random();
        };
        assert_eq!(
            one(body.clone()),
            [
                "host-clock",
                "host-print",
                "host-log",
                "host-sleep",
                "host-io",
                "host-sync",
                "cpu-randomness"
            ]
        );
        assert_eq!(
            ids(quote!(warmup = 2, host_effects_not_replayed), body.clone()),
            ["host-sync", "cpu-randomness"]
        );
        assert_eq!(
            ids(quote!(host_effects_not_replayed = false), body).len(),
            7
        );
    }

    #[test]
    fn correct_bodies_pass() {
        for body in [
            // Kernels through the runtime's cache, on the runtime's stream.
            quote! {
                let n = x.len() as i32;
                let f = rt.function(SRC, "scale")?;
                let mut tmp = rt.stream().alloc_zeros::<f32>(x.len())?;
                // SAFETY: test
                unsafe { rt.stream().launch_builder(&f).arg(x).arg(&mut tmp).arg(&n).launch(cfg)?; }
                rt.stream().memcpy_dtod(&tmp, y)?;
            },
            // cuBLAS through the runtime's handle.
            quote!(unsafe { rt.blas().gemm(cfg, x, x, y) }?;),
            // The scoped fork/join, and cudarc's join/wait.
            quote! {
                rt.fork(|side| { side.memcpy_dtod(x, y)?; Ok(()) })?;
                rt.stream().join(&other)?;
                rt.stream().wait(&event)?;
            },
            // The phase and the capture status are legal while capturing.
            quote! {
                if is_capturing() { panic!("found during capture"); }
                match phase() { Phase::Warmup { run, .. } => { let _ = run; } _ => {} }
                let status = rt.stream().capture_status()?;
            },
            // Names that only look like rules.
            quote! {
                let rng = 3;
                let random = rng + 1;
                let stdout = random;
                let sleep = stdout;
                let query = sleep;
                let s = format!("{query} {}", x.len());
                let _ = my_rng.next_index(rng);
            },
            // Copies from a parameter declared as a pinned buffer are the legal host copies.
            quote! {
                rt.stream().memcpy_htod(staging, y)?;
                let up = rt.stream().clone_htod(&staging)?;
                let n = history.len();
            },
            // A closure that allocates does not make its result a device buffer.
            quote! {
                let n = rt.fork(|side| { let t = side.alloc_zeros::<f32>(4)?; drop(t); Ok(4) })?;
                assert_eq!(n, x.len(), "{n}");
            },
            // Helpers declared inside the body are not walked.
            quote! {
                fn helper(rt: &Runtime) -> Result<(), GraphError> { rt.synchronize() }
                const DEBUG: bool = false;
            },
        ] {
            assert_eq!(one(body.clone()), Vec::<&str>::new(), "{body}");
        }
    }

    #[test]
    fn macro_arguments_are_walked() {
        assert_eq!(
            one(quote!(assert!(rt.stream().clone_dtoh(y)?.len() > 0);)),
            ["device-to-host"]
        );
        assert_eq!(
            one(quote!(let v = vec![rand::random::<f32>(); 4];)),
            ["cpu-randomness"]
        );
    }

    #[test]
    fn every_error_is_reported_and_the_graph_type_is_still_emitted() {
        let out = expand::cuda_graph(
            quote!(warmup = 2),
            quote! {
                fn f(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
                    rt.stream().synchronize()?;
                    println!("hi");
                    let v = rt.stream().clone_dtoh(y)?;
                    Ok(())
                }
            },
        );
        let text = out.to_string();
        assert_eq!(compile_errors(out).len(), 3);
        assert!(text.contains("fn f"), "{text}");
        assert!(text.contains("struct FGraph"), "{text}");
    }
}
