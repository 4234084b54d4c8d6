//! The rule table: every mistake `#[cuda_graph]` rejects in a body, one row each, with its
//! message split into what happened (its first line), why, and what to write instead
//! (`ctxt::Message`). This is the only place that knows a name (with `names.rs`, the name
//! lists it shares with the walker, re-exported here); the walker (`walk.rs`) only asks the
//! table whether a construct matches.
//!
//! Imports `names.rs` (re-exported), the opt-in's name from `args` and `ctxt`'s message
//! type; never the walker, `scope.rs`, `syntax.rs` or this folder's `mod.rs`.
//!
//! The macro sees tokens, not types, so every rule matches **names** (of methods, paths and
//! macros), helped by what the signature says about the parameters (their roles and declared
//! types, from the model) and by what the body's own `let`s show (`scope.rs`):
//!
//! * **a pattern is not a call**: paths inside patterns (`match` arms, `if let`, closure
//!   parameters) are never matched, and a rule about a module or a type of the standard
//!   library or of a crate (`fs`, `File`, `rand`) needs a path *through* it (`File::create`,
//!   `fs::write`): a path that ends at the name (`Sink::File`, `Sink::File(path)`) is an enum
//!   variant or a type of the user's;
//! * **a method of the user's own type is the user's**: a method rule is not applied when the
//!   receiver is provably a value of a type the user declared (a parameter or a local whose
//!   declared type is neither cudarc's, nor the runtime's, nor candle's, nor a random
//!   generator's, nor the standard library's; a local bound to `Type { … }`, `Type::new(…)`, `Type::default()`,
//!   `Type::with_…(…)`, `Type::from…(…)`, or to a reference or `.clone()` of such a value,
//!   unless the constructor is given a CUDA value: `Fence::from(event)`,
//!   `Gpu::new(rt.stream().clone())`, `Gpu { stream: s }` may hold it, and are not provably
//!   the user's, annotated or not). In a function or an `impl` declared in the body, a
//!   parameter whose type names a generic parameter is CUDA's when a bound names a CUDA type
//!   (`S: Deref<Target = CudaStream>`); one typed by a generic parameter bounded otherwise
//!   (`s: S`, `s: &S`) is of unknown type.
//!   A receiver the macro cannot classify (a field, a method chain, a closure parameter, a
//!   local bound to a call of a function) is judged by the name alone, so a real CUDA call is
//!   never let through because of what a helper might return. A call written as a path on a
//!   cudarc, runtime or candle type (`CudaStream::synchronize(s)`, `Tensor::to_scalar(&t)`) is
//!   judged like the method call, and so is such a path passed as a value
//!   (`.for_each(CudaStream::synchronize)`, `let wait = Runtime::synchronize;`).
//!
//! | rule | what it matches | CUDA failure / consequence | known false positives | known false negatives |
//! | --- | --- | --- | --- | --- |
//! | `host-sync` | `.synchronize()` (candle's `Device::synchronize` too) on a receiver that may be CUDA's (a name not provably the user's, a field named like a CUDA object, a chain rooted in one), a bare `synchronize(…)` (imported by `use`), `CudaStream::synchronize(s)` (any cudarc, runtime or candle type), `result::{ctx,stream,event}::synchronize`, `sys::cu{Ctx,Stream,Event}Synchronize` | 900 | a function of your own named `synchronize`; a `synchronize` method on a local of unknown type or a field named like a stream | a sync inside a helper fn; a user type that derefs to a stream passed in as a parameter of the user's type (built in the body from a CUDA value it is caught), a type alias of one, a stream in a field under the user's name (all typed at capture: 900) |
//! | `device-to-host` | `.clone_dtoh()`, `.memcpy_dtoh()`, `.memcpy_dtov()`, cudarc's older `dtoh_sync_copy*`, `sync_reclaim`; `result::memcpy_dtoh_async`, `sys::cuMemcpyDtoHAsync` | copy recorded into a dead `Vec` (`GraphError::PageableCopyCaptured`) or 900 | methods of your own with these names on a receiver the macro cannot classify | reads inside helper fns (caught at run time by the runtime's graph inspection) |
//! | `candle-host-read` | candle's host reads (candle-core 0.11): `.to_scalar()`, `.to_vec0()`, `.to_vec1()`, `.to_vec2()`, `.to_vec3()`, `.to_cpu_storage()`; `.to_device(cpu)`, `.dequantize(cpu)`, `.dequantize_f16(cpu)` where `cpu` is `&Device::Cpu` (any path ending so) or a local bound to it; `.write_npy()`, `.save_safetensors()`, `Tensor::write_npz`, `safetensors::save` | candle refuses the copy while capturing; without its capture guard, copy recorded into a dead `Vec` (`GraphError::PageableCopyCaptured`); warmup values frozen | methods of your own with these names on a receiver the macro cannot classify; a tensor made on the CPU in the body and read (the tokens do not say where a tensor lives); a type of your own named like candle's (`Tensor`, `Device`, …) | reads through generic names (`f32::try_from(&t)`, `t.try_into()`, `t.to_string()`, `t.write_bytes(w)`, `QTensor::data()`), `to_device` given a CPU device under another name (`Device::cuda_if_available`, a field), reads inside candle ops (`QTensor::quantize`, `dequantize` of types without a GPU kernel), reads in helper fns |
//! | `host-to-device` | `.clone_htod()`, `.memcpy_htod()`, `.memcpy_stod()`, older `htod_*copy*`, unless the source is a pinned buffer (a parameter declared as `PinnedHostSlice`); `result::memcpy_htod_async`, `sys::cuMemcpyHtoDAsync` | host address recorded (`GraphError::PageableCopyCaptured`) | a copy from a pinned buffer reached under another name (legal): move it into a helper fn | copies inside helper fns (caught at run time) |
//! | `raw-sync-memory-op` | the synchronous memory calls of cudarc's raw layers: `result::memcpy_{htod,dtoh,dtod}_sync`, `memset_d8_sync`, `malloc_sync`, `free_sync`, `memory_free`; `sys::cuMemcpy{HtoD,DtoH,DtoD,,Peer,2D,3D}`, `cuMemsetD{8,16,32}`, `cuMemAlloc`, `cuMemFree` | nothing recorded, no replay repeats it: runs in the warmup runs, and while capturing is refused (900) or runs once outside the graph | functions of your own with these names | raw calls reached through other names |
//! | `device-value-formatted` | a formatting macro (`println!`, `format!`, `dbg!`, `panic!`, `assert!`, the `log`/`tracing` macros, …) given a candle tensor of the body as a whole: an input, output or state declared as `Tensor`, `Var`, `QTensor`, a local bound to `Tensor::…(…)` (not on the CPU device) or to a tensor op on one (not a host value such as `.dims()`). cudarc's buffers are not: their `Debug` reads nothing | candle refuses the read while capturing, or 900 | — | tensors returned by functions of the user's; a state of your own type whose `Debug` reads the device |
//! | `host-branch-on-device-data` | an `if`/`while`/`match`/`for`/`let … else` whose condition calls a device-to-host read or names a local bound to one (block-scoped: a shadowing `let`, closure parameter or pattern clears the mark) | the graph replays the path taken at capture | — | values read in helper fns, or through raw copies |
//! | `candle-branch-on-device-data` | the same, where the data is a candle tensor's values (a `candle-host-read` value read, or a local bound to one) | the graph replays the path taken at capture | as `candle-host-read` | as `candle-host-read` |
//! | `stream-or-event-query` | `.query()`, `.is_complete()` on a receiver that may be CUDA's (as `host-sync`), `.try_is_complete()`, `.elapsed_ms()`; `result::event::{query,elapsed}`, `sys::cuEventQuery`, `cuStreamQuery`, `cuEventElapsedTime` | 900 / 907 | a `query` method on a local of unknown type or a field named like an event | queries inside helper fns, or through fields under the user's names (typed at capture) |
//! | `pinned-host-alloc` | `.alloc_pinned()`, `.alloc_pinned_with_flags()`, `result::malloc_host`, `sys::cuMemAllocHost`, `cuMemHostAlloc`, `cuMemHostRegister` (freeing is reported at the allocation) | 900 in `global` and `thread_local` modes | methods of your own with these names on a receiver the macro cannot classify | allocations in helper fns |
//! | `pinned-host-read` | `.as_slice()`, `.as_mut_slice()`, `.as_ptr()`, `.as_mut_ptr()` on a parameter (or annotated local) declared as `PinnedHostSlice`; `.as_slice()`, `.as_mut_slice()` on a field of a `#[state]` struct of the user's (`stage.host.as_slice()`) | 900 (cudarc waits on the buffer's event) | a host `Vec` field of a state struct read with `as_slice` | pinned buffers reached through other names |
//! | `legacy-default-stream` | `.default_stream()`, `.per_thread_stream()`, `result::stream::null()`; a null stream (`ptr::null_mut()`, `0 as _`, `Default::default()`, a local bound to one) where a raw call takes its stream (`cuLaunchKernel`, `cu…Async`, `cuEventRecord`, `result::…_async`, `launch_kernel`) | work escapes the graph (`GraphError::EmptyGraph`); 906 with a blocking capture stream | methods of your own with these names on a receiver the macro cannot classify | a legacy stream obtained before the body and passed in |
//! | `stream-created-in-body` | `.new_stream()`, `.new_stream_with_priority()`, `.wrap_borrowed_stream()`, cudarc's `.fork()` without arguments, `result::stream::create*`, `sys::cuStreamCreate*` | 904, or 900 (seen on an H100); work that never joins the capture is not recorded | methods of your own with these names on a receiver the macro cannot classify | streams made before capture and reached through a static or a helper |
//! | `cublas-handle-in-body` | `CudaBlas::new`, `CudaBlasLT::new` | 900 (handle destruction synchronizes the device) | a type of your own named `CudaBlas` | handles made in helper fns |
//! | `capture-control` | `.begin_capture()`, `.end_capture()`, `result::stream::{begin,end}_capture`, `sys::cuStream{Begin,End}Capture` | 903 / a capture ended early | methods of your own with these names on a receiver the macro cannot classify | — |
//! | `nested-graph-capture` | `SomethingGraph::capture(…)` | `GraphError::NestedCapture` | a type of your own whose name ends in `Graph` with a `capture` function | captures inside helper fns (refused at run time) |
//! | `collective-setup-in-body` | `CommGroup::new`, `CommGroup::connect`, `Communicator::from_env`, `.symmetric_buffer()`, `.barrier()` | `CollectiveError::SetupInCapture` at run time | methods of your own named `barrier` or `symmetric_buffer` on a receiver the macro cannot classify | `CommGroup::join` (a `join` is also how a side stream rejoins: refused at run time), set-up in helper fns |
//! | `module-load-in-body` | `.load_module()`, `.load_ptx()`, `compile_ptx`, `compile_ptx_with_opts`, `Ptx::from_file`, `result::module::{load,load_data}`, `sys::cuModuleLoad*`, `cuLibraryLoad*` | compiled and loaded again on every warmup run and at capture; a module dropped after capture leaves the graph launching unloaded code | methods or functions of your own with these names (methods only on a receiver the macro cannot classify) | modules loaded in helper fns |
//! | `thread-spawned-in-body` | `thread::spawn`, `thread::scope`, `thread::Builder::…`, paths through `rayon`, `tokio::spawn`, `spawn_blocking`, a bare `spawn(…)`; imported bare: `join(|| …, || …)`, `scope(|s| …)`; `.spawn(|| …)`/`.spawn_scoped`/`.install(|| …)` at the end of a call chain; rayon's `par_iter`, `par_iter_mut`, `into_par_iter`, `par_chunks*`, `par_bridge` | host work at warmup and capture only; GPU work recorded in an order between threads nothing fixes, or not at all (detached) | functions of your own named `spawn`, or `join`/`scope` taking closures | thread pools reached through methods without a closure literal (`pool.execute(job)`) |
//! | `cpu-randomness` | paths through `rand`, `fastrand`, `getrandom`, `RandomState`; `from_entropy`, `from_os_rng`; bare `rng()`, `random()`, `thread_rng()`, `random_range()`, `random_bool()`, `random_ratio()`, `random_iter()`, `getrandom(…)`, `fill(&mut buf)`; the methods of rand 0.8 and 0.9 (`.gen*()`, `.random*()`, `.sample()`, `.sample_iter()`, `.shuffle()`, `.partial_shuffle()`, `.choose*()`, `.next_u32()`, `.next_u64()`, `.fill_bytes()`); any method of a value of a generator type (`Rng::new()`, a local declared `SmallRng`) | the values drawn at capture are replayed forever | a function of your own named `random`, `rng` or `fill` (one `&mut` argument); methods of your own with these names on a receiver the macro cannot classify | a generator used through other method names, or through a module-level alias of a function (`use rand::random as r; r()`) |
//! | `host-print` | `println!`, `print!`, `eprintln!`, `eprint!`, `dbg!`; the same bare names reached through a macro of the user's declared outside the body (the body's shadows, `check::shadow_host_macros`, fail to compile where reached) | runs during warmup and capture, never on replay | a macro of your own with one of these names | `write!`/`writeln!` to a file or stdout handle made outside the body; `std::eprintln!` by path in a macro of the user's |
//! | `host-log` | `info!`, `debug!`, `warn!`, `error!`, `trace!`, `event!`, `log!` (any path); a macro of the user's whose name has the word `log`, `print`, `println`, `eprintln`, `trace`, `debug`, `info` or `warn` (`log_step!`), not `debug_assert*!` nor a span (`trace_span!`: a word `span` in the name) | the same | macros of your own with these names or words | logging inside helper fns, or through a path (`tracing::info!`) in a module-level macro (a bare `info!` there meets the body's shadow, `check::shadow_host_macros`) |
//! | `host-io` | paths through `fs`, `File`, `OpenOptions`, `TcpStream`, `TcpListener`, `UdpSocket`, `Command`; `stdin`, `stdout`, `stderr` | the same: the I/O happens at capture only | modules or types of your own with these names, used through a path (`File::create`) | I/O through handles made outside the body |
//! | `host-sleep` | a path ending in or containing `sleep` | the same: a replay does not wait | a function of your own named `sleep` | — |
//! | `host-bookkeeping` | `push`, `insert`, `extend`, `append`, `remove`, `pop`, `truncate`, `retain`, `drain`, `clear` (and their variants) on a parameter declared as `Vec`, `VecDeque`, `HashMap`, `BTreeMap`, `HashSet`, `BTreeSet` or `String` | the same: the collection is updated at capture only | — | collections reached through statics or fields of other parameters |
//! | `host-clock` | `Instant::now`, `SystemTime::now`, `Utc::now`, `Local::now`, `.elapsed()` without arguments (`UNIX_EPOCH.elapsed()`, `t0.elapsed()` of a constant `Instant`) | the same: the time read at capture is frozen | types of your own with these names; an `elapsed()` method of your own without arguments on a receiver the macro cannot classify | clocks read in helper fns |
//! | `host-input` | paths through `env` (`env::var`, `std::env::args`), bare `var("…")`/`var_os("…")`; `.exists()`, `.try_exists()`, `.is_file()`, `.is_dir()` without arguments; `.recv()`, `.try_recv()`, `.recv_timeout()`, `.recv_deadline()`, `.try_iter()` | the value read at capture is frozen; a message is taken once | modules or methods of your own with these names | host values read in helper fns |
//! | `host-static-state` | a `static` (a `SCREAMING_CASE` path that is not a local, or a local bound to a reference, clone or guard of one: `let step = &STEP;`, `Arc::clone(&STATE)`, `STATE.lock().unwrap()`) written (`STEP += 1`, `CALLS = 0`, `*STATE.lock().unwrap() += 1`) or used through an atomic or cell method (`load`, `store`, `fetch_*`, `swap`, `compare_exchange*`, `set`, `take`, `with_borrow_mut`) | updated or read at warmup and capture only; what it held at capture is frozen | a constant of your own with such a method | a `static mut` read by value; a static read through a lock (`CACHE.lock()…get(…)`, a lookup, not refused); updates inside a closure (`COUNTER.with(\|c\| …)`); statics reached through helper fns |
//! | `host-state-mut` | a `&mut` `#[state]` whose declared type is host data only: a scalar, `String`, `Duration`, an atomic, arrays, tuples, slices and `Option`/`Box`/… of them (not collections: their updates are `host-bookkeeping`'s); under an alias or a name of the user's, the generated constant fails when `DeviceState::HOST_ONLY` says so | the body's updates happen at warmup and capture only | — | host fields of a derived struct that also holds device memory (a derived struct of host fields only is refused by its `HOST_ONLY`) |
//!
//! The `host-*` rules are lifted by the `host_effects_not_replayed` attribute key, whose
//! name states the consequence; the others cannot be lifted (each is a failed capture or a
//! wrong graph). Every rule whose names the user's code can share (`misfires`) ends its
//! message with a last fix, the per-statement opt-out, `graph_runtime::replays_as_captured!`, inside
//! which the walker reports only what no statement can make replay as captured: a
//! synchronize, a device-to-host read or a query whose receiver is provably a CUDA object
//! (the context parameter, a stream bound from it, a call chain on one; `OPT_OUT_KEEPS`). Functions (generic ones too), `impl` methods and provided `trait` methods declared *inside* the
//! body are walked like the body (only the body can call them); a `macro_rules!` declared
//! there is scanned for the macros, methods and paths its rules write. A helper function
//! declared outside the body is not in the tokens: that is where the runtime's own guards
//! ([`ensure_not_capturing`], the graph inspection) take over. `use` items anywhere in the
//! body (and inside macro invocations) are read, and a name they import is judged by the
//! path it stands for. The arguments of a macro invocation are walked when they parse as
//! comma-separated
//! expressions, statements, or expressions between `;`, `,` and `=>`; otherwise nothing in
//! them is reported.
//!
//! Deliberately *not* rules: `rt.graph_while(…)`, `rt.graph_if(…)` and `rt.graph_if_else(…)`
//! (loops and branches on device data, recorded as conditional nodes; their eager form reads
//! the condition inside the runtime, the one host read a body may contain, and their closures
//! are walked like the rest of the body, so a sync written inside one is still reported),
//! `.join()` and `.wait()` (how a side stream rejoins the capture;
//! a wait on an event recorded before capture is CUDA error 905, reported at run time as
//! `GraphError::CaptureIsolation`), `capture_status()` and `graph_runtime::phase()` (both
//! are legal while capturing), device allocations (`alloc_zeros`, which become graph
//! memory nodes), `Runtime::fork` (the scoped fork/join the runtime provides) and
//! `rt.function(…)` (compiled once per process, loaded once per runtime).
//!
//! [`ensure_not_capturing`]: https://docs.rs/graph-runtime/latest/graph_runtime/fn.ensure_not_capturing.html

use crate::args::HOST_EFFECTS_KEY;
use crate::ctxt::Message;

/// How a rule recognises a construct in the body's tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Matcher {
    /// `receiver.name(…)`, any arguments, unless the receiver is provably a value of the
    /// user's own type; also `Type::name(receiver, …)` on a cudarc, runtime or rand type.
    Method(&'static str),
    /// The same with no arguments (cudarc's `CudaStream::fork`, not `Runtime::fork`).
    MethodNoArgs(&'static str),
    /// A path expression (a value or a called function) whose segments contain these,
    /// next to each other: `["Instant", "now"]` matches `std::time::Instant::now`.
    Path(&'static [&'static str]),
    /// A path through an item of this module or type: the segments, followed by at least
    /// one more (`fs::write`, `File::create`). A path that ends there is not a call into it.
    ItemOf(&'static [&'static str]),
    /// A function of cudarc's raw `sys` layer, by its last segment without the version
    /// suffix (`cuMemcpyDtoH` matches `sys::cuMemcpyDtoH_v2`, not `cuMemcpyDtoHAsync_v2`).
    Driver(&'static str),
    /// A call of a bare function, written without a path: `rng()`.
    BareCall(&'static str),
    /// A macro invocation `name!(…)`, by the last segment of its path.
    Macro(&'static str),
    /// A formatting macro given one of the body's device buffers.
    FormatsDeviceBuffer,
    /// A condition (`if`, `while`, `match`, `for`, `let … else`) that reads device data.
    BranchesOnDeviceData,
    /// The same, where the device data is a candle tensor's values ([`CANDLE_READS`]).
    BranchesOnTensorData,
    /// `receiver.name(cpu, …)` whose first argument is candle's CPU device: a path ending in
    /// `Device::Cpu` (`&Device::Cpu`, `&candle_core::Device::Cpu`) or a local bound to one;
    /// unless the receiver is provably the user's own, as for [`Matcher::Method`]. The same
    /// method with any other device (a CUDA device: a copy between devices) is not matched.
    ToCpu(&'static str),
    /// `FooGraph::capture(…)` inside the body.
    NestedGraphCapture,
    /// `p.name(…)` where `p` is declared as cudarc's `PinnedHostSlice` (the signature or an
    /// annotated `let` says so).
    PinnedMethod(&'static str),
    /// `p.name(…)` where `p` is a parameter whose declared type is a host collection
    /// (`Vec`, `VecDeque`, `HashMap`, `BTreeMap`, `HashSet`, `BTreeSet`, `String`).
    CollectionParamMethod(&'static str),
    /// `receiver.name(…)` where the receiver may be a CUDA object: a name whose type is not
    /// the user's, a field named like one (`.stream`, `.ctx`, `.event`), or a call chain
    /// rooted in a CUDA value or ending in `.stream()`/`.context()`. A field or a chain the
    /// tokens cannot classify is taken for the user's: the names these rules match are
    /// common in user code, and the CUDA calls they stand for fail the capture with a typed
    /// error at run time when the macro lets one through.
    LooseMethod(&'static str),
    /// A bare call `name(…)` with exactly this many arguments, all closures: rayon's
    /// `join(|| a, || b)`, `std::thread::scope(|s| …)` imported by `use`.
    BareClosureCall(&'static str, usize),
    /// A bare call `name(&mut buf)` with one `&mut` argument: `getrandom::fill` imported by `use`.
    BareMutRefCall(&'static str),
    /// A bare call `name("LITERAL", …)` whose first argument is a string literal:
    /// `std::env::var` imported by `use`.
    BareStrCall(&'static str),
    /// `receiver.name(…)` with a closure among the arguments (`Builder::new().spawn(|| …)`),
    /// unless the receiver is provably the user's own.
    MethodWithClosure(&'static str),
    /// Any method of a value whose type is a random generator's (a local bound to
    /// `Rng::new()`, `SmallRng::seed_from_u64(…)`, or declared with such a type).
    RngMethod,
    /// A `static` (a name in `SCREAMING_CASE` that is not a local) written, or read or
    /// updated through an atomic, lock or cell method.
    StaticAccess,
    /// A raw driver call given a null stream (`ptr::null_mut()`, `0 as _`, `Default::default()`)
    /// where it takes its stream: the legacy default stream.
    NullStream,
    /// A macro of the user's whose name has this word (between `_`): `log_step!`,
    /// `debug_print!`. The standard library's `debug_assert*!` are not.
    MacroWord(&'static str),
    /// `s.field.name(…)` where `s` is a `#[state]` parameter of a type of the user's: a
    /// pinned buffer held in a field of a state struct (`stage.host.as_slice()`).
    StateFieldMethod(&'static str),
    /// A `&mut` `#[state]` whose declared type holds only host data (`&mut u64`,
    /// `&mut [f32; 4]`): nothing of it is on the device, so no replay updates it.
    HostStateMut,
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
    /// Whether it can match correct code (its names are also the user's): the message then
    /// ends with the per-statement opt-out, [`OPT_OUT_MACRO`].
    pub misfires: bool,
    /// The message's first line: what happened, in at most 119 characters with the
    /// placeholders filled in. `{what}` becomes the construct found (`` `.clone_dtoh()` ``,
    /// `` `println!` ``), `{data}` the device data involved, where the rule has one.
    pub what: &'static str,
    /// The reason (a `= note:` line): what CUDA, candle or the runtime would do.
    pub why: &'static str,
    /// The fix (a `= help:` line): what to write instead. A `host-*` rule's message adds the
    /// way to lift it ([`opt_in`]) as a second fix.
    pub fix: &'static str,
}

impl Rule {
    /// The message with its placeholders filled in, ending with the per-statement opt-out
    /// when the rule can misfire.
    pub fn render(&self, what: &str, data: &str) -> Message {
        let message = self.render_plain(what, data);
        if self.misfires {
            message.fix(opt_out())
        } else {
            message
        }
    }

    /// The message without the per-statement opt-out (for errors the opt-out cannot lift).
    pub fn render_plain(&self, what: &str, data: &str) -> Message {
        let fill = |text: &str| text.replace("{what}", what).replace("{data}", data);
        let message = Message::new(fill(self.what))
            .why(fill(self.why))
            .fix(fill(self.fix));
        if self.host_effect {
            message.fix(opt_in())
        } else {
            message
        }
    }

    /// Whether `matcher` is one of this rule's.
    pub fn has(&self, hit: impl Fn(&Matcher) -> bool) -> bool {
        self.matchers.iter().any(hit)
    }
}

/// The per-statement opt-out: a macro of `graph_runtime` that expands to its tokens and that
/// the checks do not look into. Its name is what the user asserts by writing it.
pub const OPT_OUT_MACRO: &str = "replays_as_captured";

/// The rules still reported inside [`OPT_OUT_MACRO`] when the receiver is provably a CUDA
/// object: a synchronize, a device-to-host read and a query never do on a replay what they
/// did at capture, whatever the statement claims.
pub const OPT_OUT_KEEPS: &[&str] = &["host-sync", "device-to-host", "stream-or-event-query"];

/// The reason a message reported inside the opt-out adds, in place of the fix [`opt_out`].
pub fn inside_opt_out() -> String {
    format!(
        "`{OPT_OUT_MACRO}!` does not lift this one: its receiver is the runtime's own CUDA \
         object, and no statement of this kind does on a replay what it did at capture"
    )
}

/// The last fix of every message that can misfire: how to say that the code is correct.
pub fn opt_out() -> String {
    format!(
        "if this is code of your own that only shares the name, and it does the same on every \
         replay as at capture, say so for this statement with \
         `graph_runtime::{OPT_OUT_MACRO}!{{ … }}`"
    )
}

/// The fix every `host-*` message adds: how to opt in.
pub fn opt_in() -> String {
    format!(
        "if running it only then is what you want, add `{HOST_EFFECTS_KEY}` to the `#[cuda_graph(…)]` \
         arguments"
    )
}

pub use super::names::{CANDLE_READS, CANDLE_TO_CPU, DEVICE_READS, FORMATTING_MACROS};

use Matcher::{
    BareCall, BareClosureCall, BareMutRefCall, BareStrCall, BranchesOnDeviceData,
    BranchesOnTensorData, CollectionParamMethod, Driver, FormatsDeviceBuffer, HostStateMut, ItemOf,
    LooseMethod, Macro, MacroWord, Method, MethodNoArgs, MethodWithClosure, NestedGraphCapture,
    NullStream, Path, PinnedMethod, RngMethod, StateFieldMethod, StaticAccess, ToCpu,
};

/// Every rule, in the order of the module documentation's table.
pub const RULES: &[Rule] = &[
    Rule {
        id: "host-sync",
        matchers: &[
            LooseMethod("synchronize"),
            BareCall("synchronize"),
            Path(&["ctx", "synchronize"]),
            Path(&["stream", "synchronize"]),
            Path(&["event", "synchronize"]),
            Driver("cuCtxSynchronize"),
            Driver("cuStreamSynchronize"),
            Driver("cuEventSynchronize"),
        ],
        host_effect: false,
        misfires: true,
        what: "{what} makes the CPU wait for the GPU inside a captured body",
        why: "a capture cannot record a wait: it fails with CUDA error 900 (operation not permitted \
             when stream is capturing)",
        fix: "delete it: the graph's kernels already run in stream order; wait for results after \
             `replay()` returns",
    },
    Rule {
        id: "device-to-host",
        matchers: &[
            Method(DEVICE_READS[0]),
            Method(DEVICE_READS[1]),
            Method(DEVICE_READS[2]),
            Method(DEVICE_READS[3]),
            Method(DEVICE_READS[4]),
            Method(DEVICE_READS[5]),
            Path(&["memcpy_dtoh_async"]),
            Driver("cuMemcpyDtoHAsync"),
        ],
        host_effect: false,
        misfires: true,
        what: "{what} reads device memory on the host, which a captured body cannot do",
        why: "while the body is captured the GPU has not run yet: the copy is recorded into the graph \
             instead of done, the host buffer holds garbage, and every replay would write into a \
             host buffer that is long gone (the runtime refuses such a graph with \
             `GraphError::PageableCopyCaptured`; a read that waits fails with CUDA error 900, \
             operation not permitted when stream is capturing)",
        fix: "make the value an output parameter (`out: &mut CudaSlice<T>`) and read it after the \
             replay (`stream.clone_dtoh(graph.replay(…)?.out)`), or copy into a pinned buffer that \
             outlives the graph, which every replay repeats (`#[state] staging: &mut \
             PinnedHostSlice<T>`, copied into as `staging`)",
    },
    Rule {
        id: "candle-host-read",
        matchers: &[
            Method(CANDLE_READS[0]),
            Method(CANDLE_READS[1]),
            Method(CANDLE_READS[2]),
            Method(CANDLE_READS[3]),
            Method(CANDLE_READS[4]),
            Method(CANDLE_READS[5]),
            ToCpu(CANDLE_TO_CPU[0]),
            ToCpu(CANDLE_TO_CPU[1]),
            ToCpu(CANDLE_TO_CPU[2]),
            Method("write_npy"),
            Method("save_safetensors"),
            Path(&["Tensor", "write_npz"]),
            Path(&["safetensors", "save"]),
        ],
        host_effect: false,
        misfires: true,
        what: "{what} copies a candle tensor from the GPU to the host, which a captured body cannot do",
        why: "in the warmup runs it reads values that no replay reads again, and while the body is \
             captured the GPU has not run yet, so candle refuses the copy (`to_cpu_storage during \
             CUDA graph capture`; without candle's capture guard the copy is recorded into the \
             graph, which the runtime refuses with `GraphError::PageableCopyCaptured`)",
        fix: "return the tensor from the body (`-> candle_core::Result<Tensor>`) and read it after \
             the replay (`graph.replay(…)?.result.to_vec1::<f32>()`), or keep it on the device and \
             go on with tensor ops",
    },
    Rule {
        id: "host-to-device",
        matchers: &[
            Method("clone_htod"),
            Method("memcpy_htod"),
            Method("memcpy_stod"),
            Method("htod_copy"),
            Method("htod_copy_into"),
            Method("htod_sync_copy"),
            Method("htod_sync_copy_into"),
            Path(&["memcpy_htod_async"]),
            Driver("cuMemcpyHtoDAsync"),
        ],
        host_effect: false,
        misfires: true,
        what: "{what} copies host memory to the device, which a replay would repeat from a stale address",
        why: "a capture records the host address, not the values, so every replay would copy from \
             that address again after the `Vec` or slice is gone (the runtime refuses such a graph \
             with `GraphError::PageableCopyCaptured`)",
        fix: "take the data as an input parameter (`x: &CudaSlice<T>`, refilled by every `replay`), \
             as `#[state]` if it rarely changes, or upload it once before `capture` (a copy from a \
             pinned buffer that outlives the graph is legal and every replay repeats it: declare it \
             as `#[state] staging: &PinnedHostSlice<T>` and copy from `staging`)",
    },
    Rule {
        id: "raw-sync-memory-op",
        matchers: &[
            Path(&["memcpy_htod_sync"]),
            Path(&["memcpy_dtoh_sync"]),
            Path(&["memcpy_dtod_sync"]),
            Path(&["memset_d8_sync"]),
            Path(&["malloc_sync"]),
            Path(&["free_sync"]),
            Path(&["memory_free"]),
            Driver("cuMemcpyHtoD"),
            Driver("cuMemcpyDtoH"),
            Driver("cuMemcpyDtoD"),
            Driver("cuMemcpy"),
            Driver("cuMemcpyPeer"),
            Driver("cuMemcpy2D"),
            Driver("cuMemcpy3D"),
            Driver("cuMemsetD8"),
            Driver("cuMemsetD16"),
            Driver("cuMemsetD32"),
            Driver("cuMemAlloc"),
            Driver("cuMemFree"),
        ],
        host_effect: false,
        misfires: false,
        what: "{what} is a synchronous memory call of cudarc's raw driver layer, which a graph does not record",
        why: "the call does not go through the capture stream, so no replay repeats it; it runs in \
             the warmup runs, and while capturing CUDA either refuses it (error 900, operation not \
             permitted when stream is capturing, in the `thread_local` and `global` capture modes) \
             or runs it once, outside the graph",
        fix: "use the capture stream's asynchronous calls, which the graph records \
             (`rt.stream().memcpy_dtod(…)`, `memset_zeros(…)`, `alloc_zeros(…)`), and move host \
             transfers before `capture` or after `replay()` returns",
    },
    Rule {
        id: "device-value-formatted",
        matchers: &[FormatsDeviceBuffer],
        host_effect: false,
        misfires: false,
        what: "{what} formats the candle tensor {data}, which reads its values back from the GPU",
        why: "candle's `Debug` and `Display` copy the tensor's values to the host, and while the body \
             is captured they have not been computed yet; candle refuses the copy (`to_cpu_storage \
             during CUDA graph capture`), or it fails with CUDA error 900 (operation not permitted \
             when stream is capturing)",
        fix: "format it after `replay()` returns, from the graph's outputs (cudarc's buffers are \
             different: their `Debug` shows the address, length and stream, reads nothing, and may \
             be formatted in the body)",
    },
    Rule {
        id: "host-branch-on-device-data",
        matchers: &[BranchesOnDeviceData],
        host_effect: false,
        misfires: false,
        what: "this condition decides on the host from data read back from the GPU, which a graph cannot replay",
        why: "it reads {data}; while the body is captured that value does not exist yet (reading it fails with CUDA \
             error 900, operation not permitted when stream is capturing, or yields garbage), and a \
             graph records only the path taken at capture and replays it whatever the data says",
        fix: "keep the decision on the GPU: a loop or a branch whose condition a kernel sets \
             (`rt.graph_while(&cond, max, |rt| …)`, `rt.graph_if(&cond, |rt| …)`: conditional graph \
             nodes), or a kernel that reads the flag from device memory and skips its work; or \
             decide after `replay()` returns and capture one graph per path",
    },
    Rule {
        id: "candle-branch-on-device-data",
        matchers: &[BranchesOnTensorData],
        host_effect: false,
        misfires: false,
        what: "this condition decides on the host from a candle tensor's values",
        why: "it reads {data}; while the body is captured those values do not exist yet (candle refuses the read: \
             `to_cpu_storage during CUDA graph capture`), and a graph records only the path taken at \
             capture and replays it whatever the tensor holds",
        fix: "keep the decision on the GPU with tensor ops (`mask.where_cond(&on_true, &on_false)?`, \
             or multiply by a 0/1 mask), or decide after `replay()` returns and capture one graph \
             per path",
    },
    Rule {
        id: "stream-or-event-query",
        matchers: &[
            LooseMethod("query"),
            LooseMethod("is_complete"),
            Method("try_is_complete"),
            Method("elapsed_ms"),
            Path(&["event", "query"]),
            Path(&["event", "elapsed"]),
            Driver("cuEventQuery"),
            Driver("cuStreamQuery"),
            Driver("cuEventElapsedTime"),
        ],
        host_effect: false,
        misfires: true,
        what: "{what} asks whether GPU work has finished while the work is only being recorded",
        why: "the question has no answer during a capture: it fails with CUDA error 900 (operation \
             not permitted when stream is capturing), or CUDA error 907 (operation not permitted on \
             an event last recorded in a capturing stream) for an event recorded in the body",
        fix: "query streams and time events outside the body, around `graph.replay(…)`",
    },
    Rule {
        id: "pinned-host-alloc",
        matchers: &[
            Method("alloc_pinned"),
            Method("alloc_pinned_with_flags"),
            Path(&["malloc_host"]),
            Driver("cuMemAllocHost"),
            Driver("cuMemHostAlloc"),
            Driver("cuMemHostRegister"),
        ],
        host_effect: false,
        misfires: true,
        what: "{what} allocates page-locked host memory inside the captured body",
        why: "that is a blocking driver call, which a capture refuses with CUDA error 900 (operation \
             not permitted when stream is capturing) in the `thread_local` and `global` capture \
             modes, and freeing it at the end of the body waits for the GPU as well",
        fix: "allocate pinned buffers once, before `capture`, and keep them as long as the graph, or \
             use device memory (`rt.stream().alloc_zeros`), which becomes part of the graph",
    },
    Rule {
        id: "pinned-host-read",
        matchers: &[
            PinnedMethod("as_slice"),
            PinnedMethod("as_mut_slice"),
            PinnedMethod("as_ptr"),
            PinnedMethod("as_mut_ptr"),
            StateFieldMethod("as_slice"),
            StateFieldMethod("as_mut_slice"),
        ],
        host_effect: false,
        misfires: true,
        what: "{what} on the pinned buffer {data} waits for the GPU inside a captured body",
        why: "it first waits for the GPU work that uses the buffer (cudarc synchronizes the buffer's \
             event), which a capture refuses with CUDA error 900 (operation not permitted when \
             stream is capturing), and the host values it would show are not computed yet",
        fix: "inside the body a pinned `#[state]` buffer is only the source or destination of the \
             stream's asynchronous copies (`memcpy_htod(&*staging, …)`, `memcpy_dtoh(&y, &mut \
             *staging)`), which the graph records and every replay repeats; read or fill its host \
             side before `capture` or after `replay()` returns",
    },
    Rule {
        id: "legacy-default-stream",
        matchers: &[
            Method("default_stream"),
            Method("per_thread_stream"),
            Path(&["stream", "null"]),
            NullStream,
        ],
        host_effect: false,
        misfires: true,
        what: "{what} is not the capture stream, so the work queued on it escapes the graph",
        why: "the runtime captures on its own non-blocking stream, so work queued on a default stream \
             (cudarc's, or a null `CUstream` given to a raw driver call) does not wait for the \
             capture, runs once, right away, and is not in the graph (a body with nothing else fails \
             with `GraphError::EmptyGraph`); with a blocking capture stream it would fail with CUDA \
             error 906 (operation would make the legacy stream depend on a capturing blocking \
             stream)",
        fix: "queue the work on `rt.stream()` (or the context parameter)",
    },
    Rule {
        id: "stream-created-in-body",
        matchers: &[
            Method("new_stream"),
            Method("new_stream_with_priority"),
            Method("wrap_borrowed_stream"),
            MethodNoArgs("fork"),
            Path(&["stream", "create"]),
            Path(&["stream", "create_with_priority"]),
            Driver("cuStreamCreate"),
            Driver("cuStreamCreateWithPriority"),
        ],
        host_effect: false,
        misfires: true,
        what: "{what} creates a stream inside the captured body, whose work the graph loses unless it rejoins",
        why: "work on a new stream is not recorded unless the stream first waits on the capture, and \
             then it must rejoin the capture stream before the body returns or the capture fails \
             with CUDA error 904 (capturing stream has unjoined work); creating and using a stream \
             during a capture also failed with CUDA error 900 on an H100",
        fix: "run side work with `rt.fork(|side| { … })`, which uses a stream made before the capture \
             and always rejoins the runtime's stream",
    },
    Rule {
        id: "cublas-handle-in-body",
        matchers: &[Path(&["CudaBlas", "new"]), Path(&["CudaBlasLT", "new"])],
        host_effect: false,
        misfires: true,
        what: "{what} creates a cuBLAS handle inside the captured body",
        why: "it is created again on every warmup run and at capture, and destroying it at the end of \
             the body synchronizes the device, which a capture refuses (CUDA error 900, operation \
             not permitted when stream is capturing)",
        fix: "use `rt.blas()`, the runtime's handle, bound to the capture stream with its workspace \
             set up before any capture",
    },
    Rule {
        id: "capture-control",
        matchers: &[
            Method("begin_capture"),
            Method("end_capture"),
            Path(&["stream", "begin_capture"]),
            Path(&["stream", "end_capture"]),
            Driver("cuStreamBeginCapture"),
            Driver("cuStreamEndCapture"),
        ],
        host_effect: false,
        misfires: false,
        what: "{what} controls a stream capture by hand, but the runtime already captures this body",
        why: "the runtime captures the body on its own stream: a second capture cannot begin there, \
             ending it early leaves the rest of the body unrecorded, and ending it on another stream \
             is CUDA error 903 (capture was not ended in the same stream as it began)",
        fix: "delete it: the generated `capture` begins and ends the capture around the body",
    },
    Rule {
        id: "nested-graph-capture",
        matchers: &[NestedGraphCapture],
        host_effect: false,
        misfires: true,
        what: "{what} captures a graph inside the body of another",
        why: "captures do not nest, and the runtime refuses it with `GraphError::NestedCapture`",
        fix: "call the inner `#[cuda_graph]` function directly (its work becomes part of this graph), \
             or capture the inner graph before this one",
    },
    Rule {
        id: "collective-setup-in-body",
        matchers: &[
            Path(&["CommGroup", "new"]),
            Path(&["CommGroup", "connect"]),
            Path(&["Communicator", "from_env"]),
            Method("symmetric_buffer"),
            Method("barrier"),
        ],
        host_effect: false,
        misfires: true,
        what: "{what} sets up NCCL inside the captured body",
        why: "making a group or a communicator, registering a symmetric buffer and meeting at a host \
             barrier are host work between the ranks that a capture cannot record and a replay \
             would not repeat (NCCL's registration while capturing fails or hangs); the runtime \
             refuses each during a capture with `CollectiveError::SetupInCapture`",
        fix: "make the group, the communicator and its symmetric buffers before the capture and pass \
             them in as `#[state]`; meet the other ranks (`comm.barrier()`) between replays",
    },
    Rule {
        id: "module-load-in-body",
        matchers: &[
            Method("load_module"),
            Method("load_ptx"),
            Path(&["compile_ptx"]),
            Path(&["compile_ptx_with_opts"]),
            Path(&["Ptx", "from_file"]),
            Path(&["module", "load"]),
            Path(&["module", "load_data"]),
            Driver("cuModuleLoad"),
            Driver("cuModuleLoadData"),
            Driver("cuModuleLoadDataEx"),
            Driver("cuModuleLoadFatBinary"),
            Driver("cuLibraryLoadData"),
            Driver("cuLibraryLoadFromFile"),
        ],
        host_effect: false,
        misfires: true,
        what: "{what} compiles or loads a CUDA module inside the captured body",
        why: "that is done again in every warmup run and at capture, and the kernels the graph \
             records point into the module loaded at capture, so once the body drops it every replay \
             launches unloaded code",
        fix: "get kernels with `rt.function(SOURCE, \"name\")`, which compiles once per process and \
             keeps the module loaded as long as the runtime",
    },
    Rule {
        id: "thread-spawned-in-body",
        matchers: &[
            Path(&["thread", "spawn"]),
            Path(&["thread", "scope"]),
            ItemOf(&["thread", "Builder"]),
            ItemOf(&["rayon"]),
            Path(&["tokio", "spawn"]),
            Path(&["spawn_blocking"]),
            BareCall("spawn"),
            BareClosureCall("join", 2),
            BareClosureCall("scope", 1),
            MethodWithClosure("spawn"),
            MethodWithClosure("spawn_scoped"),
            MethodWithClosure("install"),
            Method("par_iter"),
            Method("par_iter_mut"),
            Method("into_par_iter"),
            Method("par_chunks"),
            Method("par_chunks_mut"),
            Method("par_bridge"),
        ],
        host_effect: false,
        misfires: true,
        what: "{what} runs code on other threads inside the captured body",
        why: "their host work runs during the warmup runs and the capture only, never on replay (a \
             graph holds only GPU work); GPU work they queue on the capture stream is recorded in \
             whatever order the threads happen to reach it (a scoped thread, `rayon::join` or a \
             parallel iterator joins before the body goes on, but nothing orders the threads among \
             themselves, so another capture may record another order), a detached thread's work is \
             recorded only if it lands before the capture ends, and work on other streams is not \
             recorded at all",
        fix: "do host work before `capture` or after `replay()` returns, and run parallel GPU work \
             with `rt.fork(|side| { … })`, which records it as a parallel branch of the graph",
    },
    Rule {
        id: "cpu-randomness",
        matchers: &[
            ItemOf(&["rand"]),
            ItemOf(&["fastrand"]),
            ItemOf(&["getrandom"]),
            Path(&["from_entropy"]),
            Path(&["from_os_rng"]),
            BareCall("rng"),
            BareCall("random"),
            BareCall("thread_rng"),
            BareCall("random_range"),
            BareCall("random_bool"),
            BareCall("random_ratio"),
            BareCall("random_iter"),
            Method("gen"),
            Method("gen_range"),
            Method("gen_bool"),
            Method("gen_ratio"),
            Method("random"),
            Method("random_range"),
            Method("random_bool"),
            Method("random_ratio"),
            Method("random_iter"),
            Method("sample"),
            Method("sample_iter"),
            Method("shuffle"),
            Method("partial_shuffle"),
            Method("choose"),
            Method("choose_multiple"),
            Method("choose_weighted"),
            Method("next_u32"),
            Method("next_u64"),
            Method("fill_bytes"),
            RngMethod,
            BareMutRefCall("fill"),
            BareCall("getrandom"),
            ItemOf(&["RandomState"]),
        ],
        host_effect: false,
        misfires: true,
        what: "{what} draws random numbers (or a random hash seed) on the CPU inside the captured body",
        why: "the body runs only during warmup and capture: the values drawn at capture are frozen \
             into the graph (as kernel arguments or copied data) and every replay repeats them",
        fix: "draw on the GPU instead, with the runtime's graph-safe generator (`rt.rng().uniform(rt, \
             &mut noise, lo, hi)?`), whose seed and offset live in device memory and advance on \
             every replay",
    },
    Rule {
        id: "host-print",
        matchers: &[
            Macro("println"),
            Macro("print"),
            Macro("eprintln"),
            Macro("eprint"),
            Macro("dbg"),
        ],
        host_effect: true,
        misfires: true,
        what: "{what} prints on the host during warmup and capture only, never on replay",
        why: "it runs during the warmup runs and the capture, and never when the graph replays, \
             because a graph holds only GPU work",
        fix: "print after `replay()` returns",
    },
    Rule {
        id: "host-log",
        matchers: &[
            Macro("info"),
            Macro("debug"),
            Macro("warn"),
            Macro("error"),
            Macro("trace"),
            Macro("event"),
            Macro("log"),
            MacroWord("log"),
            MacroWord("print"),
            MacroWord("println"),
            MacroWord("eprintln"),
            MacroWord("trace"),
            MacroWord("debug"),
            MacroWord("info"),
            MacroWord("warn"),
        ],
        host_effect: true,
        misfires: true,
        what: "{what} logs on the host during warmup and capture only, never on replay",
        why: "it runs during the warmup runs and the capture, and never when the graph replays, \
             because a graph holds only GPU work",
        fix: "log around `replay()`",
    },
    Rule {
        id: "host-io",
        matchers: &[
            ItemOf(&["fs"]),
            ItemOf(&["File"]),
            ItemOf(&["OpenOptions"]),
            ItemOf(&["TcpStream"]),
            ItemOf(&["TcpListener"]),
            ItemOf(&["UdpSocket"]),
            ItemOf(&["Command"]),
            Path(&["stdin"]),
            Path(&["stdout"]),
            Path(&["stderr"]),
        ],
        host_effect: true,
        misfires: true,
        what: "{what} does file, network or process I/O on the host during warmup and capture only",
        why: "the I/O happens during the warmup runs and the capture only, so a replay neither reads \
             fresh data nor writes anything",
        fix: "do the I/O outside the body and pass data in through an input parameter",
    },
    Rule {
        id: "host-sleep",
        matchers: &[Path(&["sleep"])],
        host_effect: true,
        misfires: true,
        what: "{what} sleeps on the host during warmup and capture only, and a replay does not wait",
        why: "the sleep happens during the warmup runs and the capture only: a replay does not wait \
             (the GPU runs the graph without the CPU)",
        fix: "sleep between `replay()` calls to pace them",
    },
    Rule {
        id: "host-bookkeeping",
        matchers: &[
            CollectionParamMethod("push"),
            CollectionParamMethod("push_back"),
            CollectionParamMethod("push_front"),
            CollectionParamMethod("push_str"),
            CollectionParamMethod("insert"),
            CollectionParamMethod("extend"),
            CollectionParamMethod("extend_from_slice"),
            CollectionParamMethod("append"),
            CollectionParamMethod("remove"),
            CollectionParamMethod("swap_remove"),
            CollectionParamMethod("pop"),
            CollectionParamMethod("pop_back"),
            CollectionParamMethod("pop_front"),
            CollectionParamMethod("truncate"),
            CollectionParamMethod("retain"),
            CollectionParamMethod("drain"),
            CollectionParamMethod("clear"),
        ],
        host_effect: true,
        misfires: true,
        what: "{what} changes the host collection {data} during warmup and capture only",
        why: "it runs during the warmup runs and the capture only: replays do not run it, so the \
             collection stops following the graph after capture",
        fix: "keep per-replay records outside the body (after each `replay()`)",
    },
    Rule {
        id: "host-clock",
        matchers: &[
            Path(&["Instant", "now"]),
            Path(&["SystemTime", "now"]),
            Path(&["Utc", "now"]),
            Path(&["Local", "now"]),
            // `Instant::elapsed` and `SystemTime::elapsed` take no argument: an `elapsed(x)`
            // is the user's.
            MethodNoArgs("elapsed"),
        ],
        host_effect: true,
        misfires: true,
        what: "{what} reads the host clock during warmup and capture only, and a replay does not read it",
        why: "the clock is read during the warmup runs and the capture only: a replay does not read \
             it again, and anything computed from it (a timestamp, a seed, a timeout) is frozen into \
             the graph",
        fix: "time replays from outside the body (CUDA events around `replay()`)",
    },
    Rule {
        id: "host-input",
        matchers: &[
            ItemOf(&["env"]),
            BareStrCall("var"),
            BareStrCall("var_os"),
            MethodNoArgs("exists"),
            MethodNoArgs("try_exists"),
            MethodNoArgs("is_file"),
            MethodNoArgs("is_dir"),
            Method("recv"),
            Method("try_recv"),
            Method("recv_timeout"),
            Method("recv_deadline"),
            Method("try_iter"),
        ],
        host_effect: true,
        misfires: true,
        what: "{what} reads a host value during warmup and capture only, and freezes what it read",
        why: "the value (an environment variable, whether a file exists, a message from a channel) is \
             read during the warmup runs and the capture only: the value read at capture is frozen \
             into the graph, and no replay reads it again (a message is taken from the channel once)",
        fix: "read it outside the body and pass what changes as an input buffer, or capture one graph \
             per value",
    },
    Rule {
        id: "host-static-state",
        matchers: &[StaticAccess],
        host_effect: true,
        misfires: true,
        what: "{what} uses a `static` of the host, which a replay neither advances nor reads",
        why: "the body updates or reads the static (an atomic, a `static mut`, a lock) during the \
             warmup runs and the capture only, so a replay neither advances it nor sees its new \
             value, and a value read from it is frozen into the graph",
        fix: "a counter that must advance on every replay belongs in device memory (a `#[state] step: \
             &mut CudaSlice<u64>` that a kernel increments)",
    },
    Rule {
        id: "host-state-mut",
        matchers: &[HostStateMut],
        host_effect: true,
        misfires: false,
        what: "{what} is `&mut` state that lives on the host, which no replay updates",
        why: "the body's updates to it (`*step += 1`) run in the warmup runs and the capture only, \
             and no replay repeats them, because a graph holds only GPU work",
        fix: "a counter or value that must change on every replay belongs in a device buffer \
             (`#[state] step: &mut CudaSlice<u64>`, advanced by a kernel), and a value fixed at \
             capture is a `#[constant]`",
    },
];

/// Looks a rule up by id.
pub fn rule(id: &str) -> &'static Rule {
    RULES
        .iter()
        .find(|r| r.id == id)
        .unwrap_or_else(|| panic!("no capture rule `{id}`"))
}

/// Whether `segments` (a path's, unraw) match `matcher`, for the path matchers.
pub fn path_matches(matcher: &Matcher, segments: &[String]) -> bool {
    let window = |pattern: &[&str], must_continue: bool| {
        segments.windows(pattern.len()).enumerate().any(|(i, w)| {
            w.iter().zip(pattern).all(|(a, b)| a == b)
                && (!must_continue || i + pattern.len() < segments.len())
        })
    };
    match matcher {
        Matcher::Path(pattern) => window(pattern, false),
        Matcher::ItemOf(pattern) => {
            // Through a type (`File`, `Command`): the next segment is a function
            // (`Command::new`); an uppercase one is a variant or a constant of the user's
            // (`Command::Reset`).
            let is_type = pattern
                .last()
                .is_some_and(|p| p.starts_with(char::is_uppercase));
            segments.windows(pattern.len()).enumerate().any(|(i, w)| {
                w.iter().zip(*pattern).all(|(a, b)| a == b)
                    && segments
                        .get(i + pattern.len())
                        .is_some_and(|next| !is_type || !next.starts_with(char::is_uppercase))
            })
        }
        Matcher::Driver(name) => segments
            .last()
            .is_some_and(|last| without_version_suffix(last) == *name),
        _ => false,
    }
}

/// `cuMemcpyDtoH_v2` → `cuMemcpyDtoH`; also `_v3`, `_ptds`, `_ptsz` and their combinations.
pub fn without_version_suffix(name: &str) -> &str {
    let mut name = name;
    loop {
        let trimmed = ["_ptds", "_ptsz", "_v2", "_v3", "_v4"]
            .iter()
            .find_map(|s| name.strip_suffix(s));
        match trimmed {
            Some(t) => name = t,
            None => return name,
        }
    }
}
