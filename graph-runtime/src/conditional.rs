//! Loops and branches on the GPU: `graph_while`, `graph_if` and `graph_if_else`, recorded as
//! CUDA conditional graph nodes.
//!
//! A straight-line graph cannot decide anything: work that depends on a device value (stop
//! at the end token, iterate until the residual is small) has to go back to the host between
//! replays, with a synchronize each time. CUDA 12.4 added *conditional nodes*: a node whose
//! body graph runs once (IF) or again and again (WHILE) depending on a value that a kernel
//! sets on the device; CUDA 12.8 added IF/ELSE. Inside a `#[cuda_graph]` body they are
//! written like this:
//!
//! ```no_run
//! # use graph_runtime::cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
//! # use graph_runtime::{cuda_graph, Compare, GraphError, Runtime};
//! # const SRC: &str = "";
//! #[cuda_graph(warmup = 1)]
//! fn halve_until_small(rt: &Runtime, #[state] x: &mut CudaSlice<f32>) -> Result<(), GraphError> {
//!     let halve = rt.function(SRC, "halve")?;
//!     let big = rt.condition(true)?;                       // tested before the first iteration
//!     rt.graph_while(&big, Some(100), |rt| {               // at most 100 iterations
//!         // SAFETY: `halve` halves x[0] (in thread 0 only).
//!         unsafe { rt.stream().launch_builder(&halve).arg(&mut *x).launch(LaunchConfig::for_num_elems(1)) }?;
//!         big.set_from(rt, &*x, Compare::Gt, 1.0)          // on the device: x[0] > 1.0
//!     })
//! }
//! # fn main() {}
//! ```
//!
//! # Eagerly and captured: the same code, two executions
//! | | eagerly (the plain function, the warmup runs, `verify`) | captured |
//! | --- | --- | --- |
//! | [`Runtime::condition`] | a `u32` flag in device memory, set by a kernel | a conditional handle of the graph, and the same kernel setting it |
//! | [`Condition::set`], [`Condition::set_from`], your kernels through [`Condition::kernel_arg`] | write the flag | call `cudaGraphSetConditional` on the handle |
//! | [`Runtime::graph_while`] | a host loop: read the flag (a 4-byte copy and a synchronize), run the body, again | one WHILE node; its body graph runs while the condition is non-zero, with no host involvement |
//! | [`Runtime::graph_if`], [`Runtime::graph_if_else`] | read the flag once and run the closure (one way of it) | one IF node (IF/ELSE: one node with two bodies) |
//!
//! The host read of the eager path is the only synchronize a `#[cuda_graph]` body may
//! contain, and the user never writes it: it lives here. The compile-time checks of the
//! macro see an ordinary method call with a closure, and still check the closure's body like
//! the rest of the function (a sync, a host read or a `println!` inside it is the same
//! compile error as anywhere else).
//!
//! # Semantics
//! * **While**: the condition is tested before every iteration, the first included; the body
//!   sets it for the next test. `max_iterations` bounds the loop on the device: after that
//!   many iterations the condition is cleared and the loop ends, so a condition that never
//!   clears cannot hang the GPU. A bounded loop costs one more one-thread kernel per
//!   iteration (it counts); `None` costs nothing and trusts the body.
//! * **If** runs its closure once when the condition is non-zero; **if/else** runs its closure
//!   with `true` or with `false` (captured, it records it both ways, one body each).
//! * A condition is tested by one construct (one call site): CUDA ties a conditional handle
//!   to one conditional node. A second construct testing it is
//!   [`GraphError::ConditionMisuse`], eagerly too; give it a condition of its own.
//! * A condition starts at the value given to [`Runtime::condition`] (set by a kernel in stream
//!   order, so in a loop of loops `inner.set(rt, true)` re-arms it for the next outer pass).
//! * Random numbers drawn inside a body are fresh in every iteration: the generators keep
//!   their offsets on the device and move them in the drawing kernels ([`crate::rng`]), so an
//!   iteration reads what the one before left, eagerly and captured alike. The warmup's draws
//!   are undone as for any graph; [`GraphInfo::rng`](crate::GraphInfo::rng) reports the
//!   average advance of the warmup runs, which varies with the iteration count.
//! * Conditionals nest: a `graph_while` inside a `graph_if` inside a `graph_while` is a WHILE
//!   node inside the IF node's body inside the outer WHILE node's body.
//!
//! # What a body may record
//! CUDA allows only kernels, memsets, device copies and nested conditional nodes inside a
//! conditional body. So inside the closure:
//! * **no allocations and no frees**: allocate temporaries before the call, where they become
//!   graph allocation nodes of the enclosing graph, and let them drop at the end of the
//!   function (a buffer dropped inside the closure is a free node in the body);
//! * **no new conditions** ([`Runtime::condition`]): create every condition at the top of the
//!   body and re-arm it with [`Condition::set`];
//! * no host callbacks, no events of your own, no fork (the closure cannot be inside
//!   [`Runtime::fork`] either: the side stream would be cut off from the capture);
//! * early launches ([`crate::launch`]) run in order inside a body.
//!
//! A capture records each closure twice: first into a scratch graph that is checked and
//! thrown away, then into the conditional node's body. A mistake is therefore a typed error
//! naming the construct and what it recorded ([`GraphError::ForbiddenInConditional`],
//! [`GraphError::ConditionalBody`]), and the runtime stays usable: a failure never happens
//! inside the node's own body, where the driver (580) frees the body graph of a failed
//! recording and crashes when the enclosing graph is ended later (NVIDIA bug 6805256). The
//! same mistakes fail eagerly only where CUDA would fail them eagerly, so keep the warmup
//! and the capture doing the same work.
//!
//! # Setting a condition from your own kernels
//! Pass [`Condition::kernel_arg`] to a kernel (with cudarc's `launch_builder`: it is 16 bytes,
//! more than [`EarlyLaunch`](crate::EarlyLaunch) takes) and prepend the device API to the
//! kernel's source, at compile time with `concat!(graph_runtime::condition_device_api!(), …)`:
//!
//! ```text
//! extern "C" __global__ void argmax_and_stop(const float *logits, int *token, GraphCondition go,
//!                                            int end_token) {
//!     /* … token = argmax(logits) … */
//!     if (threadIdx.x == 0) graph_condition_set(go, *token != end_token);
//! }
//! ```
//!
//! `graph_condition_set(GraphCondition c, bool value)` writes the flag when the body runs
//! eagerly and calls CUDA's device-side `cudaGraphSetConditional` when it is captured. Call it
//! from one thread (or from every thread with the same value). This costs nothing: the
//! condition is set by a kernel the body launches anyway. [`Condition::set_from`] does the
//! same with a one-thread library kernel that compares one element of a buffer with a value.
//!
//! # Requirements
//! * An NVIDIA driver for CUDA 12.4 or newer (driver 550+) for conditions, `graph_while` and
//!   `graph_if`; CUDA 12.8 (driver 570+) for `graph_if_else`. The version is read once with
//!   `cuDriverGetVersion`; below it, every construct returns
//!   [`GraphError::ConditionalUnsupported`] before touching CUDA (cudarc would panic on the
//!   missing driver symbols), eagerly too, so a program finds out in its first eager call.
//! * The device API compiles with NVRTC 12.4 or newer; `cudaGraphSetConditional` is a
//!   builtin that the driver's PTX JIT resolves, with no `-rdc` and no device runtime library.
//! * Kernels set the condition from the same context that captured the graph.
//!
//! # Costs
//! One WHILE iteration costs the body's own GPU time plus the relaunch of the body graph on
//! the device, with no host involvement: about 4 µs on an H100 with driver 580
//! (`examples/14-decode-loop.rs`: a 13-kernel decode step of 30.1 µs takes 34.2 µs per
//! iteration). A body of several steps pays it once per iteration (8 steps: 31.3 µs per step);
//! a `max_iterations` bound adds a one-thread kernel, about 0.8 µs. One replay per step with a
//! host read of the condition costs about 13 µs more per step on the same machine.

use std::cell::RefCell;
use std::marker::PhantomData;
use std::panic::{self, AssertUnwindSafe, Location};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use cudarc::driver::{
    sys, CudaFunction, CudaSlice, DevicePtr, DeviceRepr, DriverError, LaunchConfig, PushKernelArg,
};

use crate::driver;
use crate::error::GraphError;
use crate::phase::{self, DepthScope, Phase};
use crate::runtime::Runtime;

/// The device API for kernels of yours that set a condition: the `GraphCondition` struct that
/// [`Condition::kernel_arg`] fills and `graph_condition_set(GraphCondition, bool)`.
///
/// Expands to a string literal, so it can be prepended at compile time:
/// `concat!(graph_runtime::condition_device_api!(), r#"…your kernels…"#)`. It declares
/// CUDA's `cudaGraphConditionalHandle` and `cudaGraphSetConditional` itself, so the source
/// needs no include files under NVRTC.
#[macro_export]
macro_rules! condition_device_api {
    () => {
        r#"
// ---- graph_runtime::conditional device API: setting a graph_while / graph_if condition ----
typedef __device_builtin__ unsigned long long cudaGraphConditionalHandle;
extern "C" __device__ __cudart_builtin__ void cudaGraphSetConditional(cudaGraphConditionalHandle handle,
                                                                       unsigned int value);
// Condition::kernel_arg: the graph's conditional handle while captured (flag == nullptr), a
// flag in device memory when the body runs eagerly.
struct GraphCondition {
    unsigned long long handle;
    unsigned int *flag;
};
// graph_while runs its body again, graph_if takes its first branch, when `value` is true.
// Call it from one thread, or from every thread with the same value.
__device__ __forceinline__ void graph_condition_set(GraphCondition c, bool value) {
    unsigned int v = value ? 1u : 0u;
    if (c.flag != nullptr) {
        *c.flag = v;
    } else {
        cudaGraphSetConditional((cudaGraphConditionalHandle)c.handle, v);
    }
}
// ---- end of the conditional device API ----
"#
    };
}

/// [`condition_device_api!`] as a constant.
pub const CONDITION_DEVICE_API: &str = crate::condition_device_api!();

/// The library's kernels: the device API, a setter, the comparisons of
/// [`Condition::set_from`] and the iteration bound of [`Runtime::graph_while`]. Each runs on
/// one thread.
pub const CONDITION_KERNELS: &str = concat!(
    crate::condition_device_api!(),
    r#"
template <typename T> __device__ __forceinline__ bool cg_compare(T a, int op, T b) {
    switch (op) {
        case 0: return a < b;
        case 1: return a <= b;
        case 2: return a > b;
        case 3: return a >= b;
        case 4: return a == b;
        default: return a != b;
    }
}

extern "C" __global__ void cg_condition_set(GraphCondition c, unsigned int value) {
    graph_condition_set(c, value != 0u);
}

#define CG_SET_FROM(T, NAME)                                                          \
    extern "C" __global__ void NAME(GraphCondition c, const T *x, int op, T rhs) {    \
        graph_condition_set(c, cg_compare<T>(*x, op, rhs));                          \
    }
CG_SET_FROM(float, cg_condition_set_from_f32)
CG_SET_FROM(int, cg_condition_set_from_i32)
CG_SET_FROM(unsigned int, cg_condition_set_from_u32)

// The last node of a bounded loop's body: counts the iteration and clears the condition once
// `max` iterations have run. `count` is reset by a memset before the loop node.
extern "C" __global__ void cg_loop_bound(GraphCondition c, unsigned int *count, unsigned int max) {
    unsigned int n = *count + 1u;
    *count = n;
    if (n >= max) graph_condition_set(c, false);
}
"#
);

/// How [`Condition::set_from`] compares the device value `x` with the host value `rhs`.
///
/// Comparisons follow IEEE for `f32`: with a NaN, every comparison but `Ne` is false (a loop
/// `while residual > tol` stops on a NaN residual).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compare {
    /// `x < rhs`
    Lt,
    /// `x <= rhs`
    Le,
    /// `x > rhs`
    Gt,
    /// `x >= rhs`
    Ge,
    /// `x == rhs`
    Eq,
    /// `x != rhs`
    Ne,
}

impl Compare {
    fn code(self) -> i32 {
        match self {
            Compare::Lt => 0,
            Compare::Le => 1,
            Compare::Gt => 2,
            Compare::Ge => 3,
            Compare::Eq => 4,
            Compare::Ne => 5,
        }
    }

    /// The comparison on the host, as the device computes it.
    pub fn holds<T: PartialOrd>(self, x: T, rhs: T) -> bool {
        match self {
            Compare::Lt => x < rhs,
            Compare::Le => x <= rhs,
            Compare::Gt => x > rhs,
            Compare::Ge => x >= rhs,
            Compare::Eq => x == rhs,
            Compare::Ne => x != rhs,
        }
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for i32 {}
    impl Sealed for u32 {}
}

/// Element types [`Condition::set_from`] compares: `f32`, `i32`, `u32`.
pub trait ConditionValue: DeviceRepr + Copy + PartialOrd + sealed::Sealed {
    /// The library kernel that compares this type.
    const KERNEL: &'static str;
}

impl ConditionValue for f32 {
    const KERNEL: &'static str = "cg_condition_set_from_f32";
}

impl ConditionValue for i32 {
    const KERNEL: &'static str = "cg_condition_set_from_i32";
}

impl ConditionValue for u32 {
    const KERNEL: &'static str = "cg_condition_set_from_u32";
}

/// The value a [`Runtime::graph_while`] or [`Runtime::graph_if`] tests, set on the device.
///
/// Made by [`Runtime::condition`] inside a `#[cuda_graph]` body (or in any eager code). It
/// owns 8 bytes of device memory (the eager flag and the loop counter; a graph allocation
/// node while captured) and, while captured, the graph's conditional handle. Set it with
/// [`Condition::set`], [`Condition::set_from`], or from a kernel of yours through
/// [`Condition::kernel_arg`]. One construct tests it: CUDA ties a conditional handle to one
/// conditional node, so a second `graph_while` / `graph_if` / `graph_if_else` call site
/// testing the same condition is [`GraphError::ConditionMisuse`].
pub struct Condition {
    /// `[flag, iteration count]`.
    mem: CudaSlice<u32>,
    /// The graph's conditional handle while captured; `None` eagerly.
    handle: Option<u64>,
    /// The capture this condition belongs to (0: eager).
    capture: u64,
    location: &'static Location<'static>,
    /// The construct that tests it: CUDA ties a conditional handle to one node.
    tested_at: OnceLock<&'static Location<'static>>,
}

impl std::fmt::Debug for Condition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Condition")
            .field("captured", &self.handle.is_some())
            .field("created_at", &self.location)
            .finish_non_exhaustive()
    }
}

/// A condition as a kernel argument: the `GraphCondition` struct of
/// [`CONDITION_DEVICE_API`] (16 bytes: the conditional handle and the flag pointer).
///
/// Get it from [`Condition::kernel_arg`] and pass it by reference to cudarc's launch builder
/// (`launch.arg(&arg)`). It borrows the condition, so the condition outlives the launch being
/// built.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ConditionArg<'c> {
    handle: u64,
    flag: u64,
    _condition: PhantomData<&'c Condition>,
}

// SAFETY: `ConditionArg` is `#[repr(C)]` with two `u64` fields (the marker has no size), the
// layout of the device API's `struct GraphCondition { unsigned long long; unsigned int *; }`.
unsafe impl DeviceRepr for ConditionArg<'_> {}

impl ConditionArg<'_> {
    /// The conditional handle (0 eagerly).
    pub fn handle(&self) -> u64 {
        self.handle
    }

    /// The device address of the eager flag (0 while captured).
    pub fn flag(&self) -> u64 {
        self.flag
    }
}

fn one_thread() -> LaunchConfig {
    LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (1, 1, 1),
        shared_mem_bytes: 0,
    }
}

impl Condition {
    /// The condition as an argument of a kernel of yours that sets it with
    /// `graph_condition_set` (see the [module docs](self#setting-a-condition-from-your-own-kernels)).
    /// Launch that kernel on `rt`'s stream.
    pub fn kernel_arg(&self, rt: &Runtime) -> ConditionArg<'_> {
        match self.handle {
            Some(handle) => ConditionArg {
                handle,
                flag: 0,
                _condition: PhantomData,
            },
            None => ConditionArg {
                handle: 0,
                flag: self.flag_ptr(rt),
                _condition: PhantomData,
            },
        }
    }

    fn flag_ptr(&self, rt: &Runtime) -> u64 {
        let (ptr, _sync) = self.mem.device_ptr(rt.stream());
        ptr
    }

    fn count_ptr(&self, rt: &Runtime) -> u64 {
        self.flag_ptr(rt) + std::mem::size_of::<u32>() as u64
    }

    /// Sets the condition to `value` on the device, in stream order (a one-thread kernel).
    pub fn set(&self, rt: &Runtime, value: bool) -> Result<(), GraphError> {
        let f = rt.library_function(CONDITION_KERNELS, "cg_condition_set")?;
        let arg = self.kernel_arg(rt);
        let v = u32::from(value);
        // SAFETY: `cg_condition_set(GraphCondition, unsigned int)` writes the 4-byte flag this
        // condition owns (eagerly) or sets its graph's handle (captured); one thread.
        unsafe {
            rt.stream()
                .launch_builder(&f)
                .arg(&arg)
                .arg(&v)
                .launch(one_thread())
        }?;
        Ok(())
    }

    /// Sets the condition to `x[0] <cmp> rhs` on the device, in stream order (a one-thread
    /// kernel reading the first element of `x`): `cond.set_from(rt, &residual, Compare::Gt,
    /// 1e-6)` keeps a loop going while the residual is above the tolerance.
    #[track_caller]
    pub fn set_from<T: ConditionValue, S: DevicePtr<T>>(
        &self,
        rt: &Runtime,
        x: &S,
        cmp: Compare,
        rhs: T,
    ) -> Result<(), GraphError> {
        if x.len() == 0 {
            return Err(GraphError::ConditionMisuse {
                construct: "Condition::set_from",
                location: Location::caller(),
                problem: "the buffer to compare is empty; it compares its first element".into(),
            });
        }
        let f = rt.library_function(CONDITION_KERNELS, T::KERNEL)?;
        let arg = self.kernel_arg(rt);
        let (src, _sync) = x.device_ptr(rt.stream());
        let op = cmp.code();
        // SAFETY: `cg_condition_set_from_<T>(GraphCondition, const T *, int, T)` reads the
        // first element of `x` (non-empty, checked above; borrowed for the call, and freed in
        // stream order after it) and sets this condition; one thread.
        unsafe {
            rt.stream()
                .launch_builder(&f)
                .arg(&arg)
                .arg(&src)
                .arg(&op)
                .arg(&rhs)
                .launch(one_thread())
        }?;
        Ok(())
    }

    /// Reads the condition on the host (waits for the runtime's stream). Eagerly only: inside
    /// a captured body this is [`GraphError::SyncInCapture`], and a condition made while
    /// capturing has no flag to read ([`GraphError::ConditionMisuse`]).
    #[track_caller]
    pub fn read(&self, rt: &Runtime) -> Result<bool, GraphError> {
        let location = Location::caller();
        phase::refuse_while_capturing(|graph| GraphError::SyncInCapture {
            op: "Condition::read",
            graph,
            location,
        })?;
        if self.handle.is_some() {
            return Err(GraphError::ConditionMisuse {
                construct: "Condition::read",
                location,
                problem: format!(
                    "the condition created at {} belongs to a captured graph and lives in its conditional \
                     handle; only a condition created eagerly has a flag to read",
                    self.location
                ),
            });
        }
        let flag = rt.stream().clone_dtoh(&self.mem.slice(0..1))?;
        Ok(flag[0] != 0)
    }
}

// ---------------------------------------------------------------------------------------
// What one capture records about its conditionals.

static NEXT_CAPTURE: AtomicU64 = AtomicU64::new(1);

/// The conditionals of one capture: the handles it created, the nodes it added with their
/// bodies, and where the capture of the stream stands.
pub(crate) struct CaptureRecord {
    id: u64,
    root: sys::CUgraph,
    mode: sys::CUstreamCaptureMode,
    /// Above 0 while a closure is recorded into a scratch graph to be checked: conditionals
    /// met meanwhile record their bodies inline.
    validating: u32,
    /// A body's recording failed inside a conditional node's own body graph: the driver has
    /// freed that body, so no graph of this capture may be ended, destroyed or used.
    pub(crate) poisoned: bool,
    handles: Vec<HandleRecord>,
    nodes: Vec<NodeRecord>,
}

struct HandleRecord {
    handle: u64,
    location: &'static Location<'static>,
    used: bool,
}

/// One conditional node and its body graphs (owned by the node).
pub(crate) struct NodeRecord {
    pub(crate) node: sys::CUgraphNode,
    /// `CU_GRAPH_COND_TYPE_IF` or `_WHILE`, as a number.
    pub(crate) kind: u32,
    pub(crate) bodies: Vec<sys::CUgraph>,
}

impl CaptureRecord {
    /// The first condition created but never tested by a conditional node.
    pub(crate) fn unused_condition(&self) -> Option<&'static Location<'static>> {
        self.handles.iter().find(|h| !h.used).map(|h| h.location)
    }

    /// The conditional handles the capture created, in order.
    pub(crate) fn handles(&self) -> Vec<u64> {
        self.handles.iter().map(|h| h.handle).collect()
    }

    /// The body graphs of conditional node `node`, if it is one of this capture's.
    pub(crate) fn bodies_of(&self, node: sys::CUgraphNode) -> Option<&[sys::CUgraph]> {
        self.node(node).map(|n| n.bodies.as_slice())
    }

    /// Conditional node `node`, if it is one of this capture's.
    pub(crate) fn node(&self, node: sys::CUgraphNode) -> Option<&NodeRecord> {
        self.nodes.iter().find(|n| n.node == node)
    }
}

thread_local! {
    static FRAME: RefCell<Option<CaptureRecord>> = const { RefCell::new(None) };
}

/// Starts the record of a capture that began recording into `root` in `mode`.
pub(crate) fn open_record(root: sys::CUgraph, mode: sys::CUstreamCaptureMode) {
    let record = CaptureRecord {
        id: NEXT_CAPTURE.fetch_add(1, Ordering::Relaxed),
        root,
        mode,
        validating: 0,
        poisoned: false,
        handles: Vec::new(),
        nodes: Vec::new(),
    };
    FRAME.with(|f| *f.borrow_mut() = Some(record));
}

/// Ends the record of the current capture and hands it back.
pub(crate) fn close_record() -> Option<CaptureRecord> {
    FRAME.with(|f| f.borrow_mut().take())
}

fn with_record<R>(f: impl FnOnce(&mut CaptureRecord) -> R) -> Option<R> {
    FRAME.with(|fr| fr.borrow_mut().as_mut().map(f))
}

// ---------------------------------------------------------------------------------------
// Driver support.

/// CUDA 12.4: conditional IF and WHILE nodes, `cudaGraphSetConditional`.
const NEEDS_CONDITIONALS: i32 = 12040;
/// CUDA 12.8: IF nodes with an ELSE body.
const NEEDS_IF_ELSE: i32 = 12080;

fn version_text(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

fn installed_driver() -> Result<i32, DriverError> {
    static VERSION: OnceLock<i32> = OnceLock::new();
    if let Some(v) = VERSION.get() {
        return Ok(*v);
    }
    let v = driver::driver_version()?;
    Ok(*VERSION.get_or_init(|| v))
}

/// Refuses `construct` on a driver older than `needs`.
fn require_driver(
    construct: &'static str,
    needs: i32,
    location: &'static Location<'static>,
) -> Result<(), GraphError> {
    let have = installed_driver()?;
    check_version(construct, have, needs, location)
}

fn check_version(
    construct: &'static str,
    have: i32,
    needs: i32,
    location: &'static Location<'static>,
) -> Result<(), GraphError> {
    if have >= needs {
        return Ok(());
    }
    Err(GraphError::ConditionalUnsupported {
        construct,
        driver: version_text(have),
        needs: if needs >= NEEDS_IF_ELSE {
            "12.8"
        } else {
            "12.4"
        },
        location,
    })
}

// ---------------------------------------------------------------------------------------
// The constructs.

/// Which conditional node a construct records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Construct {
    While,
    If,
    IfElse,
}

impl Construct {
    fn name(self) -> &'static str {
        match self {
            Construct::While => "graph_while",
            Construct::If => "graph_if",
            Construct::IfElse => "graph_if_else",
        }
    }

    fn needs(self) -> i32 {
        match self {
            Construct::IfElse => NEEDS_IF_ELSE,
            _ => NEEDS_CONDITIONALS,
        }
    }

    fn bodies(self) -> u32 {
        match self {
            Construct::IfElse => 2,
            _ => 1,
        }
    }

    fn node_type(self) -> sys::CUgraphConditionalNodeType {
        match self {
            Construct::While => sys::CUgraphConditionalNodeType::CU_GRAPH_COND_TYPE_WHILE,
            _ => sys::CUgraphConditionalNodeType::CU_GRAPH_COND_TYPE_IF,
        }
    }
}

/// One body of a construct: records (or runs) branch `i`.
type Branches<'a> = dyn FnMut(&Runtime, usize) -> Result<(), GraphError> + 'a;

impl Runtime {
    /// A new [`Condition`] holding `initial`, for [`Runtime::graph_while`],
    /// [`Runtime::graph_if`] and [`Runtime::graph_if_else`].
    ///
    /// Eagerly it is a flag in device memory; inside a captured body it is a conditional
    /// handle of the graph being captured (and its 8 bytes are a graph allocation). Either
    /// way a kernel sets it to `initial` in stream order.
    ///
    /// # Errors
    /// [`GraphError::ConditionalUnsupported`] on a driver older than CUDA 12.4;
    /// [`GraphError::ConditionMisuse`] inside the closure of a `graph_while`/`graph_if`
    /// (CUDA allows no allocation there: create conditions at the top of the body).
    #[track_caller]
    pub fn condition(&self, initial: bool) -> Result<Condition, GraphError> {
        let location = Location::caller();
        require_driver("Runtime::condition", NEEDS_CONDITIONALS, location)?;
        if phase::in_conditional_body() {
            return Err(GraphError::ConditionMisuse {
                construct: "Runtime::condition",
                location,
                problem: "a condition cannot be created inside the closure of a `graph_while`, `graph_if` or \
                          `graph_if_else`: it allocates, and CUDA allows no allocation in a conditional body. \
                          Fix: create it at the top of the function and re-arm it inside with \
                          `cond.set(rt, true)`"
                    .into(),
            });
        }
        let mem = self.stream().alloc_zeros::<u32>(2)?;
        let condition = match phase::phase() {
            Phase::Capture { graph } => {
                let root = with_record(|r| (r.root, r.id))
                    .ok_or_else(|| foreign_capture("Runtime::condition", location, graph))?;
                self.context().bind_to_thread()?;
                // SAFETY: `root` is the graph the runtime's stream is capturing into, on this
                // runtime's context (bound above); the driver supports CUDA 12.4 (checked).
                let handle = unsafe {
                    driver::conditional_handle_create(
                        root.0,
                        self.context().cu_ctx(),
                        u32::from(initial),
                    )
                }
                .map_err(|e| GraphError::from_driver(graph, e))?;
                with_record(|r| {
                    r.handles.push(HandleRecord {
                        handle,
                        location,
                        used: false,
                    })
                });
                Condition {
                    mem,
                    handle: Some(handle),
                    capture: root.1,
                    location,
                    tested_at: OnceLock::new(),
                }
            }
            _ => Condition {
                mem,
                handle: None,
                capture: 0,
                location,
                tested_at: OnceLock::new(),
            },
        };
        condition.set(self, initial)?;
        Ok(condition)
    }

    /// A loop on the GPU: runs `body` while `cond` is non-zero, testing it before every
    /// iteration; at most `max_iterations` times when that is `Some`.
    ///
    /// Captured, this is one CUDA WHILE node whose body graph is what `body` records; the
    /// body sets `cond` on the device for the next test. Eagerly (the plain function, the
    /// warmup runs) it is the same loop on the host, reading `cond` before every iteration (a
    /// 4-byte copy and a synchronize). See the [module docs](crate::conditional) for what a
    /// body may record.
    ///
    /// ```no_run
    /// # use graph_runtime::cudarc::driver::CudaSlice;
    /// # use graph_runtime::{Compare, GraphError, Runtime};
    /// # fn step(rt: &Runtime, x: &mut CudaSlice<f32>, r: &mut CudaSlice<f32>) -> Result<(), GraphError> { Ok(()) }
    /// # fn solve(rt: &Runtime, x: &mut CudaSlice<f32>, r: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    /// let go = rt.condition(true)?;
    /// rt.graph_while(&go, Some(10_000), |rt| {
    ///     step(rt, x, r)?;                              // one iteration, writes the residual r[0]
    ///     go.set_from(rt, &*r, Compare::Gt, 1e-6)       // again while r[0] > 1e-6
    /// })
    /// # }
    /// ```
    ///
    /// # Errors
    /// What `body` returns; [`GraphError::ConditionalUnsupported`] on a driver older than
    /// CUDA 12.4; [`GraphError::ForbiddenInConditional`] when the body records what CUDA does
    /// not allow in a conditional body (an allocation, a free, a host callback);
    /// [`GraphError::ConditionalBody`] when recording it fails; [`GraphError::ConditionMisuse`]
    /// for a condition of another capture, or a call inside a fork's closure.
    #[track_caller]
    pub fn graph_while(
        &self,
        cond: &Condition,
        max_iterations: Option<u32>,
        mut body: impl FnMut(&Runtime) -> Result<(), GraphError>,
    ) -> Result<(), GraphError> {
        let location = Location::caller();
        let bound = match max_iterations {
            Some(0) => {
                // Not one iteration: the body is neither run nor recorded.
                return require_driver(Construct::While.name(), NEEDS_CONDITIONALS, location);
            }
            other => other,
        };
        let mut branches = |rt: &Runtime, _: usize| body(rt);
        self.conditional(Construct::While, cond, bound, location, &mut branches)
    }

    /// A branch on the GPU: runs `then` once when `cond` is non-zero.
    ///
    /// Captured, this is one CUDA IF node whose body graph is what `then` records. Eagerly it
    /// reads `cond` (a 4-byte copy and a synchronize) and runs `then` or not. See
    /// [`Runtime::graph_while`] for the errors.
    #[track_caller]
    pub fn graph_if(
        &self,
        cond: &Condition,
        mut then: impl FnMut(&Runtime) -> Result<(), GraphError>,
    ) -> Result<(), GraphError> {
        let location = Location::caller();
        let mut branches = |rt: &Runtime, _: usize| then(rt);
        self.conditional(Construct::If, cond, None, location, &mut branches)
    }

    /// A two-way branch on the GPU: runs `branch(rt, true)` when `cond` is non-zero and
    /// `branch(rt, false)` when it is zero.
    ///
    /// One closure for both ways, so both can write the same buffers:
    ///
    /// ```no_run
    /// # use graph_runtime::cudarc::driver::CudaSlice;
    /// # use graph_runtime::{GraphError, Runtime};
    /// # fn f(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    /// let positive = rt.condition(false)?;
    /// positive.set_from(rt, x, graph_runtime::Compare::Gt, 0.0)?;
    /// rt.graph_if_else(&positive, |rt, positive| {
    ///     if positive {
    ///         rt.stream().memcpy_dtod(x, &mut *y)?;   // y = x
    ///     } else {
    ///         rt.stream().memset_zeros(&mut *y)?;     // y = 0
    ///     }
    ///     Ok(())
    /// })
    /// # }
    /// ```
    ///
    /// Captured, this is one CUDA IF node with an ELSE body (CUDA 12.8, driver 570 or newer;
    /// older drivers get [`GraphError::ConditionalUnsupported`]), whose two bodies are what
    /// `branch` records for `true` and for `false`. Eagerly it reads `cond` and runs one way.
    /// See [`Runtime::graph_while`] for the other errors.
    #[track_caller]
    pub fn graph_if_else(
        &self,
        cond: &Condition,
        mut branch: impl FnMut(&Runtime, bool) -> Result<(), GraphError>,
    ) -> Result<(), GraphError> {
        let location = Location::caller();
        let mut branches = |rt: &Runtime, i: usize| branch(rt, i == 0);
        self.conditional(Construct::IfElse, cond, None, location, &mut branches)
    }

    fn conditional(
        &self,
        construct: Construct,
        cond: &Condition,
        bound: Option<u32>,
        location: &'static Location<'static>,
        branches: &mut Branches<'_>,
    ) -> Result<(), GraphError> {
        require_driver(construct.name(), construct.needs(), location)?;
        if phase::in_fork() {
            return Err(GraphError::ConditionMisuse {
                construct: construct.name(),
                location,
                problem: "it cannot run inside the closure of `fork`: a captured conditional pauses the \
                          capture of the runtime's stream, which would cut the side stream off. Fix: call it \
                          before or after the fork, or fork inside its closure"
                    .into(),
            });
        }
        let first = *cond.tested_at.get_or_init(|| location);
        if first != location {
            return Err(tested_twice(construct.name(), cond, first, location));
        }
        match phase::phase() {
            Phase::Capture { graph } => {
                self.captured(construct, graph, cond, bound, location, branches)
            }
            _ => self.eager(construct, cond, bound, location, branches),
        }
    }

    /// The host loop or branch: reads the flag (a copy and a synchronize) and runs closures.
    fn eager(
        &self,
        construct: Construct,
        cond: &Condition,
        bound: Option<u32>,
        location: &'static Location<'static>,
        branches: &mut Branches<'_>,
    ) -> Result<(), GraphError> {
        if cond.handle.is_some() {
            return Err(from_elsewhere(construct.name(), cond, location));
        }
        // A capture this runtime did not begin (a raw cudarc capture around the call) would
        // be invalidated by the synchronize.
        let status = self.stream().capture_status()?;
        if status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
            return Err(foreign_capture(construct.name(), location, "a graph"));
        }
        if bound.is_some() {
            // Loaded now, so that the capture only looks it up.
            self.library_function(CONDITION_KERNELS, "cg_loop_bound")?;
        }
        let _inside = DepthScope::conditional();
        match construct {
            Construct::While => {
                let mut done = 0u32;
                loop {
                    if bound.is_some_and(|max| done >= max) {
                        tracing::debug!(
                            iterations = done,
                            %location,
                            "graph_while stopped at its iteration bound"
                        );
                        // What the bound kernel does on the device: the condition ends cleared.
                        cond.set(self, false)?;
                        break;
                    }
                    if !cond.read(self)? {
                        break;
                    }
                    branches(self, 0)?;
                    done += 1;
                }
                Ok(())
            }
            Construct::If => {
                if cond.read(self)? {
                    branches(self, 0)?;
                }
                Ok(())
            }
            Construct::IfElse => {
                let i = usize::from(!cond.read(self)?);
                branches(self, i)
            }
        }
    }

    /// Records the construct into the graph being captured.
    fn captured(
        &self,
        construct: Construct,
        graph: &'static str,
        cond: &Condition,
        bound: Option<u32>,
        location: &'static Location<'static>,
        branches: &mut Branches<'_>,
    ) -> Result<(), GraphError> {
        let state = with_record(|r| (r.id, r.validating > 0, r.mode))
            .ok_or_else(|| foreign_capture(construct.name(), location, graph))?;
        let (capture, validating, mode) = state;
        let handle = match cond.handle {
            Some(h) if cond.capture == capture => h,
            _ => return Err(from_elsewhere(construct.name(), cond, location)),
        };
        let stream = self.stream().cu_stream();
        if bound.is_some() {
            // The iteration count starts at 0 each time the loop node is reached (a memset
            // node, allowed inside a body as well).
            // SAFETY: the count is the second word of the condition's 8 bytes, alive until
            // the condition drops, after this in stream order.
            unsafe { driver::fill_bytes(cond.count_ptr(self), 0, 4, stream) }?;
        }
        // The body of one branch, with the loop's bound as its last node.
        let arg = ConditionArg {
            handle,
            flag: 0,
            _condition: PhantomData,
        };
        let count = cond.count_ptr(self);
        let bound_kernel = match bound {
            Some(_) => Some(self.library_function(CONDITION_KERNELS, "cg_loop_bound")?),
            None => None,
        };
        let mut record = |rt: &Runtime, i: usize| -> Result<(), GraphError> {
            branches(rt, i)?;
            if let (Some(f), Some(max)) = (&bound_kernel, bound) {
                launch_bound(rt, f, arg, count, max)?;
            }
            Ok(())
        };
        if validating {
            // Inside the scratch recording of an enclosing body: record every branch inline,
            // where the enclosing check sees what they record.
            let _inside = DepthScope::conditional();
            for i in 0..construct.bodies() as usize {
                record(self, i)?;
            }
            return Ok(());
        }
        let tested = with_record(|r| r.handles.iter().any(|h| h.handle == handle && h.used));
        if tested == Some(true) {
            // The same call recorded twice (a helper called twice with one condition).
            return Err(tested_twice(construct.name(), cond, location, location));
        }
        let site = Site {
            rt: self,
            construct,
            graph,
            location,
            mode,
            stream,
        };
        site.record(handle, bound.is_none(), &mut record)
    }
}

fn launch_bound(
    rt: &Runtime,
    f: &CudaFunction,
    arg: ConditionArg<'_>,
    count: u64,
    max: u32,
) -> Result<(), GraphError> {
    // SAFETY: `cg_loop_bound(GraphCondition, unsigned int *, unsigned int)` reads and writes
    // the condition's count word (alive until the condition drops, after the graph's use of
    // it) and sets the condition's handle; one thread.
    unsafe {
        rt.stream()
            .launch_builder(f)
            .arg(&arg)
            .arg(&count)
            .arg(&max)
            .launch(one_thread())
    }?;
    Ok(())
}

fn foreign_capture(
    construct: &'static str,
    location: &'static Location<'static>,
    graph: &'static str,
) -> GraphError {
    GraphError::ConditionMisuse {
        construct,
        location,
        problem: format!(
            "the runtime's stream is being captured into {graph} by something other than `#[cuda_graph]`'s \
             capture, which is the only one that records conditional nodes (and eagerly, the loop's host \
             read would invalidate that capture). Fix: capture the function with the generated `capture`"
        ),
    }
}

fn tested_twice(
    construct: &'static str,
    cond: &Condition,
    first: &'static Location<'static>,
    location: &'static Location<'static>,
) -> GraphError {
    GraphError::ConditionMisuse {
        construct,
        location,
        problem: format!(
            "the condition created at {} is already tested by the construct at {first}, and CUDA ties a \
             conditional handle to one conditional node. Fix: give each `graph_while` / `graph_if` / \
             `graph_if_else` its own condition, set from the same value (`let again = rt.condition(false)?; \
             again.set_from(rt, &flag, Compare::Ne, 0)?`, or set both from your kernel)",
            cond.location
        ),
    }
}

fn from_elsewhere(
    construct: &'static str,
    cond: &Condition,
    location: &'static Location<'static>,
) -> GraphError {
    GraphError::ConditionMisuse {
        construct,
        location,
        problem: format!(
            "the condition it tests was created at {} {}, and a condition belongs to the run (eager, or \
             one capture) that created it. Fix: create the condition in the same body run, before the call",
            cond.location,
            if cond.handle.is_some() {
                "in another capture"
            } else {
                "eagerly, outside this capture"
            }
        ),
    }
}

/// Where a captured construct is recorded.
struct Site<'a> {
    rt: &'a Runtime,
    construct: Construct,
    graph: &'static str,
    location: &'static Location<'static>,
    mode: sys::CUstreamCaptureMode,
    stream: sys::CUstream,
}

/// How the scratch recording of a construct's branches ended, when it did not pass.
enum Refused {
    Error(GraphError),
    Panic(Box<dyn std::any::Any + Send>),
}

impl Site<'_> {
    fn body_error(&self, source: GraphError) -> GraphError {
        // A capture code the closure's cudarc call came back with gets its own variant.
        let source = match source {
            GraphError::Driver(d) => GraphError::from_driver(self.graph, d),
            other => other,
        };
        GraphError::ConditionalBody {
            construct: self.construct.name(),
            graph: self.graph,
            location: self.location,
            source: Box::new(source),
        }
    }

    /// A driver error of `step` of the recording.
    fn driver_error(&self, step: &'static str, e: DriverError) -> GraphError {
        tracing::debug!(
            graph = self.graph,
            construct = self.construct.name(),
            step,
            error = ?e,
            "recording a conditional node failed"
        );
        self.body_error(GraphError::from_driver(self.graph, e))
    }

    /// Pauses the capture, checks the branches in a scratch recording, adds the conditional
    /// node, records the branches into its bodies and resumes the capture after the node.
    fn record(
        &self,
        handle: u64,
        unbounded: bool,
        record: &mut Branches<'_>,
    ) -> Result<(), GraphError> {
        self.rt.context().bind_to_thread()?;
        // 1. Where the capture stands: the graph it records into and the nodes the next one
        //    depends on. Then pause it, so the stream can record the branches elsewhere.
        // SAFETY: the stream is the runtime's, capturing on this thread (phase Capture).
        let (parent, deps) = unsafe { driver::capture_point(self.stream) }
            .map_err(|e| self.driver_error("reading the capture point", e))?;
        // SAFETY: as above; the graph it hands back is `parent`, still owned by the capture
        // procedure (or by the node whose body it is), so it is not destroyed here.
        unsafe { driver::end_capture(self.stream) }
            .map_err(|e| self.driver_error("pausing the capture", e))?;

        // 2. The scratch recording: what the branches record must be allowed in a body.
        let checked = self.check(unbounded, record);
        if let Err(refused) = checked {
            self.resume(parent, &deps)?;
            return match refused {
                Refused::Error(e) => Err(e),
                Refused::Panic(payload) => panic::resume_unwind(payload),
            };
        }

        // 3. The node, after what the capture had recorded so far.
        // SAFETY: `parent` is live and `deps` are its nodes (read from the capture just now);
        // the handle was created for the capture's root graph, `parent` or an ancestor of it;
        // the driver version was checked.
        let added = unsafe {
            driver::add_conditional_node(
                parent,
                &deps,
                self.rt.context().cu_ctx(),
                handle,
                self.construct.node_type(),
                self.construct.bodies(),
            )
        };
        let (node, bodies) = match added {
            Ok(added) => added,
            Err(e) => {
                self.resume(parent, &deps)?;
                return Err(self.driver_error("adding the conditional node", e));
            }
        };
        with_record(|r| {
            r.nodes.push(NodeRecord {
                node,
                kind: self.construct.node_type() as u32,
                bodies: bodies.clone(),
            });
            for h in r.handles.iter_mut().filter(|h| h.handle == handle) {
                h.used = true;
            }
        });

        // 4. Each branch into its body graph.
        for (i, &body) in bodies.iter().enumerate() {
            // SAFETY: the stream is not capturing (paused above); `body` is the node's live
            // body graph, on the runtime's context.
            let begun =
                unsafe { driver::begin_capture_to_graph(self.stream, body, &[], self.mode) };
            if let Err(e) = begun {
                self.resume(parent, &[node])?;
                return Err(self.driver_error("beginning a body's recording", e));
            }
            let ran = {
                let _inside = DepthScope::conditional();
                panic::catch_unwind(AssertUnwindSafe(|| record(self.rt, i)))
            };
            // SAFETY: the stream is capturing into `body`, begun above on this thread.
            let ended = unsafe { driver::end_capture(self.stream) };
            match (ran, ended) {
                (Ok(Ok(())), Ok(_)) => {}
                (Ok(Err(e)), Ok(_)) => {
                    // The body is recorded in part; the capture fails as a whole, and the node
                    // (with its body) goes with the parent graph.
                    self.resume(parent, &[node])?;
                    return Err(self.body_error(e));
                }
                (Err(payload), Ok(_)) => {
                    self.resume(parent, &[node])?;
                    panic::resume_unwind(payload);
                }
                (ran, Err(e)) => {
                    // The body's recording was invalidated although its scratch recording
                    // passed (the closure did something else the second time). The driver has
                    // freed the body graph: ending or destroying the parent now would crash
                    // (NVIDIA bug 6805256), so every graph of this capture is left alone.
                    with_record(|r| r.poisoned = true);
                    tracing::error!(
                        graph = self.graph,
                        construct = self.construct.name(),
                        location = %self.location,
                        "the recording of a conditional body was invalidated after its check passed; the \
                         capture's graphs are leaked rather than destroyed"
                    );
                    return match ran {
                        Err(payload) => panic::resume_unwind(payload),
                        Ok(Err(body)) => Err(self.body_error(body)),
                        Ok(Ok(())) => Err(self.driver_error("ending a body's recording", e)),
                    };
                }
            }
        }

        // 5. The capture goes on after the node.
        self.resume(parent, &[node])
    }

    /// Records every branch into a scratch graph and checks what it holds.
    fn check(&self, unbounded: bool, record: &mut Branches<'_>) -> Result<(), Refused> {
        // SAFETY: the stream is the runtime's, not capturing (paused by the caller), on the
        // context bound to this thread.
        unsafe { driver::begin_capture(self.stream, self.mode) }
            .map_err(|e| Refused::Error(self.driver_error("beginning the scratch recording", e)))?;
        with_record(|r| r.validating += 1);
        let ran = {
            let _inside = DepthScope::conditional();
            panic::catch_unwind(AssertUnwindSafe(|| {
                (0..self.construct.bodies() as usize).try_for_each(|i| record(self.rt, i))
            }))
        };
        with_record(|r| r.validating -= 1);
        // SAFETY: the stream is capturing the scratch graph, begun above on this thread.
        let ended = unsafe { driver::end_capture(self.stream) };
        // Errors cudarc recorded meanwhile (a buffer's free that failed) belong to the scratch
        // recording.
        if let Some(e) = self.rt.take_recorded_error() {
            tracing::debug!(error = ?e, "cleared an error recorded while checking a conditional body");
        }
        let scratch = ended.as_ref().ok().copied().filter(|g| !g.is_null());
        let verdict = match scratch {
            Some(g) => forbidden_nodes(g),
            None => Ok((None, 0)),
        };
        if let Some(g) = scratch {
            // SAFETY: the scratch graph was returned by cuStreamEndCapture just now and is
            // owned here; it was never instantiated.
            let _ = unsafe { driver::graph_destroy(g) };
        }
        match ran {
            Err(payload) => return Err(Refused::Panic(payload)),
            Ok(Err(e)) => return Err(Refused::Error(self.body_error(e))),
            Ok(Ok(())) => {}
        }
        if let Err(e) = ended {
            return Err(Refused::Error(
                self.driver_error("ending the scratch recording", e),
            ));
        }
        let what = match verdict {
            Ok((Some(what), _)) => Some(what),
            Ok((None, 0)) if unbounded && self.construct == Construct::While => Some(
                "no GPU work, so nothing in it can clear the condition and an unbounded loop would never end \
                 (give it `max_iterations`, or set the condition in the body)"
                    .to_owned(),
            ),
            Ok((None, _)) => None,
            Err(e) => return Err(Refused::Error(self.driver_error("reading the scratch recording", e))),
        };
        match what {
            Some(what) => Err(Refused::Error(GraphError::ForbiddenInConditional {
                construct: self.construct.name(),
                graph: self.graph,
                location: self.location,
                what,
            })),
            None => Ok(()),
        }
    }

    /// Resumes the capture of `parent` after `deps`.
    fn resume(&self, parent: sys::CUgraph, deps: &[sys::CUgraphNode]) -> Result<(), GraphError> {
        // SAFETY: the stream is not capturing; `parent` is the live graph the capture was
        // recording into and `deps` are nodes of it.
        unsafe { driver::begin_capture_to_graph(self.stream, parent, deps, self.mode) }.map_err(
            |e| {
                // The stream is no longer part of the capture: nothing of it may be ended or
                // destroyed by the capture procedure any more.
                with_record(|r| r.poisoned = true);
                self.driver_error("resuming the capture", e)
            },
        )
    }
}

/// The first node of `graph` (recorded by a scratch recording, so conditionals are inline)
/// that CUDA does not allow in a conditional body, in words, and how many nodes it has.
fn forbidden_nodes(graph: sys::CUgraph) -> Result<(Option<String>, usize), DriverError> {
    // SAFETY: `graph` is the live scratch graph.
    let nodes = unsafe { driver::graph_nodes(graph) }?;
    for &node in &nodes {
        // SAFETY: `node` belongs to the live graph.
        let kind = unsafe { driver::node_type(node) }?;
        if let Some(what) = forbidden_kind(kind) {
            return Ok((Some(what.to_owned()), nodes.len()));
        }
    }
    Ok((None, nodes.len()))
}

/// What a node of `kind` is, in words, when CUDA forbids it in a conditional body.
fn forbidden_kind(kind: sys::CUgraphNodeType) -> Option<&'static str> {
    use sys::CUgraphNodeType as T;
    Some(match kind {
        T::CU_GRAPH_NODE_TYPE_KERNEL
        | T::CU_GRAPH_NODE_TYPE_MEMCPY
        | T::CU_GRAPH_NODE_TYPE_MEMSET
        | T::CU_GRAPH_NODE_TYPE_EMPTY
        | T::CU_GRAPH_NODE_TYPE_GRAPH
        | T::CU_GRAPH_NODE_TYPE_CONDITIONAL => return None,
        T::CU_GRAPH_NODE_TYPE_MEM_ALLOC => {
            "a memory allocation (`alloc`, `alloc_zeros`, `clone_htod`, a new condition or generator inside \
             the closure)"
        }
        T::CU_GRAPH_NODE_TYPE_MEM_FREE => {
            "a memory free (a device buffer dropped inside the closure, or one allocated there)"
        }
        T::CU_GRAPH_NODE_TYPE_HOST => "a host callback (`cuLaunchHostFunc`)",
        T::CU_GRAPH_NODE_TYPE_EVENT_RECORD | T::CU_GRAPH_NODE_TYPE_WAIT_EVENT => {
            "an event record or wait node"
        }
        _ => "a node of a kind CUDA does not allow there (an external semaphore, a batch memory operation)",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernels_are_built_on_the_device_api() {
        assert!(CONDITION_KERNELS.starts_with(CONDITION_DEVICE_API));
        assert_eq!(CONDITION_DEVICE_API, crate::condition_device_api!());
        assert!(!CONDITION_DEVICE_API.contains("__global__"));
        for name in [
            "cg_condition_set",
            f32::KERNEL,
            i32::KERNEL,
            u32::KERNEL,
            "cg_loop_bound",
        ] {
            let decl = format!("void {name}(");
            let defined = CONDITION_KERNELS.contains(&format!("extern \"C\" __global__ {decl}"))
                || CONDITION_KERNELS.contains(&format!(
                    "CG_SET_FROM({}, {name})",
                    match name {
                        "cg_condition_set_from_f32" => "float",
                        "cg_condition_set_from_i32" => "int",
                        _ => "unsigned int",
                    }
                ));
            assert!(defined, "kernel {name} is defined");
        }
    }

    #[test]
    fn a_kernel_arg_is_the_device_struct() {
        assert_eq!(std::mem::size_of::<ConditionArg<'_>>(), 16);
        assert_eq!(std::mem::align_of::<ConditionArg<'_>>(), 8);
    }

    #[test]
    fn comparisons_match_their_codes() {
        let all = [
            Compare::Lt,
            Compare::Le,
            Compare::Gt,
            Compare::Ge,
            Compare::Eq,
            Compare::Ne,
        ];
        let codes: Vec<i32> = all.iter().map(|c| c.code()).collect();
        assert_eq!(
            codes,
            [0, 1, 2, 3, 4, 5],
            "the order of `cg_compare`'s cases"
        );
        assert!(Compare::Gt.holds(2.0, 1.0) && !Compare::Gt.holds(1.0, 1.0));
        assert!(Compare::Ge.holds(1, 1) && Compare::Le.holds(1u32, 1));
        assert!(!Compare::Gt.holds(f32::NAN, 0.0) && Compare::Ne.holds(f32::NAN, 0.0));
    }

    #[test]
    fn old_drivers_get_a_typed_error() {
        let here = Location::caller();
        let e = check_version("graph_while", 12020, NEEDS_CONDITIONALS, here).unwrap_err();
        let text = e.to_string();
        assert!(
            matches!(
                e,
                GraphError::ConditionalUnsupported {
                    construct: "graph_while",
                    needs: "12.4",
                    ..
                }
            ),
            "{e:?}"
        );
        assert!(
            text.contains("CUDA 12.2") && text.contains("driver 550"),
            "{text}"
        );
        let e = check_version("graph_if_else", 12060, NEEDS_IF_ELSE, here).unwrap_err();
        assert!(e.to_string().contains("CUDA 12.8"), "{e}");
        assert!(check_version("graph_if_else", 12080, NEEDS_IF_ELSE, here).is_ok());
        assert!(check_version("graph_while", 13000, NEEDS_CONDITIONALS, here).is_ok());
        assert_eq!(version_text(12040), "12.4");
        assert_eq!(version_text(13000), "13.0");
    }

    #[test]
    fn forbidden_kinds_are_named() {
        use sys::CUgraphNodeType as T;
        for ok in [
            T::CU_GRAPH_NODE_TYPE_KERNEL,
            T::CU_GRAPH_NODE_TYPE_MEMCPY,
            T::CU_GRAPH_NODE_TYPE_MEMSET,
            T::CU_GRAPH_NODE_TYPE_EMPTY,
            T::CU_GRAPH_NODE_TYPE_CONDITIONAL,
        ] {
            assert_eq!(forbidden_kind(ok), None, "{ok:?}");
        }
        assert!(forbidden_kind(T::CU_GRAPH_NODE_TYPE_MEM_ALLOC)
            .unwrap()
            .contains("allocation"));
        assert!(forbidden_kind(T::CU_GRAPH_NODE_TYPE_MEM_FREE)
            .unwrap()
            .contains("free"));
        assert!(forbidden_kind(T::CU_GRAPH_NODE_TYPE_HOST)
            .unwrap()
            .contains("host"));
    }

    #[test]
    fn constructs_map_to_nodes() {
        assert_eq!(Construct::While.bodies(), 1);
        assert_eq!(Construct::IfElse.bodies(), 2);
        assert_eq!(Construct::IfElse.needs(), NEEDS_IF_ELSE);
        assert_eq!(Construct::If.needs(), NEEDS_CONDITIONALS);
        assert_eq!(
            Construct::IfElse.node_type(),
            sys::CUgraphConditionalNodeType::CU_GRAPH_COND_TYPE_IF
        );
        assert_eq!(
            Construct::While.node_type(),
            sys::CUgraphConditionalNodeType::CU_GRAPH_COND_TYPE_WHILE
        );
    }

    #[test]
    fn records_track_their_handles() {
        open_record(
            std::ptr::null_mut(),
            sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
        );
        with_record(|r| {
            r.handles.push(HandleRecord {
                handle: 7,
                location: Location::caller(),
                used: false,
            })
        });
        let r = close_record().expect("a record");
        assert!(!r.poisoned);
        assert_eq!(r.handles(), vec![7]);
        assert!(r.unused_condition().is_some());
        assert!(r.bodies_of(std::ptr::null_mut()).is_none());
        assert!(close_record().is_none(), "closed once");
    }
}
