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
//!   [`GraphError::ConditionMisuse`], eagerly too; give it a condition of its own. Inside the
//!   step of [`Runtime::graph_while_unrolled`], which is recorded once per unrolled copy, a
//!   construct that tests one condition in every copy is refused at capture (in the check of
//!   the loop's body, the runtime usable after): make one condition per copy before the loop
//!   and pick it with a counter in the step's closure.
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
//! # Unrolled loops
//! [`Runtime::graph_while_unrolled`] records `k` copies of the step in one iteration of the
//! WHILE node, so that the node's per-iteration toll is paid once per `k` steps. Steps after
//! the one that cleared the condition still run, and change nothing: inside them the
//! condition lives in its flag in device memory, the library's setters skip once it is
//! cleared, and kernels of yours that take [`Condition::kernel_arg`] start with
//! `if (!graph_condition_active(go)) return;` (device API above; outside a step it is always
//! true, and [`ConditionArg::always`] gives a kernel shared with straight-line code an
//! argument for which it is). The loop then runs exactly the steps of `graph_while`, with the
//! same results bit for bit; a kernel that cannot check (a cuBLAS call) may run again only
//! where that changes nothing the loop reads. Set the condition last in a step. A bounded
//! loop counts a step in its `set` / `set_from` call, or with a one-thread kernel after a
//! step whose condition a kernel of yours sets.
//!
//! Inside a step, `graph_condition_active` reads the flag from memory (one 16-byte load, a
//! round trip to L2). For kernels of a few µs, read it first and test it just before the
//! kernel's first store, so that the read overlaps the kernel's own loads, read it only in
//! the threads that store when few do, and set the condition with
//! `graph_condition_set_active`, which does not read it again:
//!
//! ```text
//! bool active = graph_condition_active(go);    // first
//! float v = …loads and arithmetic…;
//! if (!active) return;                         // before the first store
//! y[k] = v;
//! if (k == 0) graph_condition_set_active(go, v > tol);
//! ```
//!
//! **Kernels with no guard: a ring of buffers.** A kernel whose only effect is a buffer that
//! the next step reads needs no guard at all when the steps move that buffer around a ring
//! of `k` positions (`k` the unroll factor): step `c` reads position `c % k` and writes
//! position `(c + 1) % k`. The steps after the last one then write scratch and the positions
//! after the result's, never the result's own (at most `k − 1` of them run). Only the kernels
//! with other effects read the condition (a counter of steps, the condition's setter), and
//! after the loop one kernel copies position `steps % k` to where the result belongs. The
//! closure is called once per step and in order (eagerly once per iteration of the host
//! loop, captured `k` times per recording of the body, from step 0), so a counter in the
//! closure gives `c`. The results are bitwise those of `graph_while`; the cost is `k − 1`
//! more buffers. `examples/15-jacobi-solve.rs` (`--form ring`) and `tests/conditional.rs`
//! (`halve_ring`) do this.
//!
//! # Costs
//! One WHILE iteration costs the body's own GPU time plus the relaunch of the body graph on
//! the device, with no host involvement. On an H200 with driver 580
//! (`examples/14-decode-loop.rs`): a 13-kernel decode step of 29.4 µs takes 33.6 µs per
//! iteration (+14.3%), and 30.7 µs (+4.6%) with [`Runtime::graph_while_unrolled`] at 8 steps
//! per iteration; `examples/15-jacobi-solve.rs`'s iteration of 3 small kernels (6.09 µs in the
//! same process) takes 10.3 µs with `graph_while` (+70%); unrolled by 16 with every kernel
//! reading the condition first and testing it before its first store, 6.45 µs (+6.0%; by
//! 32: +3.1%); in the ring form, where only the residual kernel reads it (in one thread),
//! 6.30 µs (+3.5%; by 32: 6.17 µs, +0.9%). Kernels that did not test it at all (wrong past
//! the last step: a floor) take 6.28 µs by 16 (+3.0%). (Before, with the flag read as three
//! 4-byte loads and by every thread of the residual kernel, the read-first form cost +15% by
//! 16.) A `max_iterations` bound adds a one-thread
//! kernel per iteration to `graph_while` (about 0.6 µs) and nothing to
//! `graph_while_unrolled`; so does [`Condition::set_from`], where setting the condition from
//! a kernel of yours costs nothing. An IF node costs about as much as a WHILE iteration. One
//! replay per step with a host read of the condition costs 8–12 µs more per step.
//!
//! # Files
//! This file holds the public types ([`Condition`], [`ConditionArg`], [`Compare`],
//! [`ConditionValue`]) and the device API; `conditional/record.rs` what one capture records
//! about its conditionals, `conditional/construct.rs` the driver checks and what each
//! construct records, `conditional/api.rs` the `Runtime` constructs (eager and captured),
//! `conditional/site.rs` how a captured construct becomes a conditional node.

use std::marker::PhantomData;
use std::panic::{self, AssertUnwindSafe, Location};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::OnceLock;

use cudarc::driver::{
    sys, CudaFunction, CudaSlice, DevicePtr, DeviceRepr, DriverError, LaunchConfig, PushKernelArg,
};

use crate::driver;
use crate::error::GraphError;
use crate::phase::{self, FrameScope, Phase};
use crate::runtime::Runtime;

mod api;
mod construct;
pub(crate) mod record;
mod site;
#[cfg(test)]
mod tests;
mod unroll;
pub(crate) use unroll::step_condition;

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
// flag in device memory when the body runs eagerly (handle == 0), and inside step j of a
// graph_while_unrolled iteration the flag with handle == GRAPH_CONDITION_NONE - 1 - j; the
// flag's words (16 bytes, 16-byte aligned) are then [condition, steps before this iteration,
// bound, unused]. ConditionArg::always:
// handle == GRAPH_CONDITION_NONE, no flag.
struct GraphCondition {
    unsigned long long handle;
    unsigned int *flag;
};
#define GRAPH_CONDITION_NONE 0xffffffffffffffffull
#define GRAPH_CONDITION_MAX_STEPS 4096ull
// Whether the loop is still going: false only inside a step of graph_while_unrolled that comes
// after the step that cleared the condition (or past the loop's bound); a kernel of such a
// step returns at once. True everywhere else. In a step it reads the flag's words with one
// 16-byte load from L2 (written by earlier kernels; one request per warp): call it first in the
// kernel and test the result before the kernel's first store, so that the read overlaps the
// kernel's own loads. A kernel whose result only one thread writes reads it in that thread.
__device__ __forceinline__ bool graph_condition_active(GraphCondition c) {
    if (c.flag == nullptr || c.handle < GRAPH_CONDITION_NONE - GRAPH_CONDITION_MAX_STEPS) return true;
    unsigned int on, before, bound, spare;
    asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(on), "=r"(before), "=r"(bound), "=r"(spare) : "l"(c.flag));
    unsigned int j = (unsigned int)(GRAPH_CONDITION_NONE - 1ull - c.handle);
    return (on != 0u) & (before + j < bound);
}
// graph_condition_set for a thread that found graph_condition_active(c) true earlier in this
// kernel: the same without reading the flag again.
__device__ __forceinline__ void graph_condition_set_active(GraphCondition c, bool value) {
    unsigned int v = value ? 1u : 0u;
    if (c.flag != nullptr) {
        *c.flag = v;
    } else if (c.handle != GRAPH_CONDITION_NONE) {
        cudaGraphSetConditional((cudaGraphConditionalHandle)c.handle, v);
    }
}
// graph_while runs its body again, graph_if takes its first branch, when `value` is true.
// Call it from one thread, or from every thread with the same value.
__device__ __forceinline__ void graph_condition_set(GraphCondition c, bool value) {
    if (graph_condition_active(c)) graph_condition_set_active(c, value);
}
// ---- end of the conditional device API ----
"#
    };
}

/// [`condition_device_api!`] as a constant.
pub const CONDITION_DEVICE_API: &str = condition_device_api!();

/// The library's kernels: the device API, a setter, the comparisons of
/// [`Condition::set_from`] and the iteration bound of [`Runtime::graph_while`]. Each runs on
/// one thread.
pub const CONDITION_KERNELS: &str = concat!(
    condition_device_api!(),
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
        if (graph_condition_active(c)) graph_condition_set(c, cg_compare<T>(*x, op, rhs)); \
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

// graph_while_unrolled: before the loop node, the condition's flag is 1, no step has run, and
// the bound is `max` (0: none).
extern "C" __global__ void cg_unroll_begin(unsigned int *flag, unsigned int max) {
    flag[0] = 1u;
    flag[1] = 0u;
    flag[2] = max != 0u ? max : 0xffffffffu;
}

// graph_while_unrolled, the last node of the loop's body: `steps` more steps are behind; the
// loop stops when one cleared the flag or the bound is reached.
extern "C" __global__ void cg_unroll_end(unsigned long long loop_handle, unsigned int *flag,
                                         unsigned int steps) {
    unsigned int done = flag[1] + steps;
    flag[1] = done;
    if (flag[0] == 0u || done >= flag[2]) cudaGraphSetConditional((cudaGraphConditionalHandle)loop_handle, 0u);
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
/// owns 16 bytes of device memory (the eager flag, the loop counter and bound, one spare word; a graph allocation
/// node while captured) and, while captured, the graph's conditional handle. Set it with
/// [`Condition::set`], [`Condition::set_from`], or from a kernel of yours through
/// [`Condition::kernel_arg`]. One construct tests it: CUDA ties a conditional handle to one
/// conditional node, so a second `graph_while` / `graph_if` / `graph_if_else` call site
/// testing the same condition is [`GraphError::ConditionMisuse`].
pub struct Condition {
    /// `[flag, iteration count, bound, spare]` (the bound for `graph_while_unrolled`; four
    /// words so that the device API reads them with one 16-byte load).
    mem: CudaSlice<u32>,
    /// The graph's conditional handle while captured; `None` eagerly.
    handle: Option<u64>,
    /// The capture this condition belongs to (0: eager).
    capture: u64,
    location: &'static Location<'static>,
    /// The construct that tests it: CUDA ties a conditional handle to one node.
    tested_at: OnceLock<&'static Location<'static>>,
    /// While the steps of an unrolled loop are recorded: the condition is its flag (see
    /// `conditional/unroll.rs`).
    pub(super) step: StepMode,
}

/// How a condition is handed out while the steps of `graph_while_unrolled` are recorded.
#[derive(Default)]
pub(super) struct StepMode {
    /// Recording a step: `kernel_arg` hands out the flag, marked with the step's index.
    pub(super) on: AtomicBool,
    /// The index of the step being recorded in its iteration.
    pub(super) index: AtomicU32,
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

impl ConditionArg<'static> {
    /// No condition: for a kernel that takes a `GraphCondition` (to check
    /// `graph_condition_active`, see [`Runtime::graph_while_unrolled`], or to set it) when it
    /// runs outside any loop: `graph_condition_active` is true for it, and
    /// `graph_condition_set` does nothing.
    pub fn always() -> Self {
        ConditionArg {
            handle: u64::MAX,
            flag: 0,
            _condition: PhantomData,
        }
    }
}

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
        if self.step.on.load(Ordering::Relaxed) {
            let j = u64::from(self.step.index.load(Ordering::Relaxed));
            return ConditionArg {
                handle: u64::MAX - 1 - j,
                flag: self.flag_ptr(rt),
                _condition: PhantomData,
            };
        }
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
        // SAFETY: `cg_condition_set(GraphCondition, unsigned int)` reads and writes the words
        // this condition owns (eagerly, or in a step of an unrolled loop) or sets its graph's
        // handle (captured); one thread.
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
        // first element of `x` (non-empty, checked above; borrowed for the call, and
        // freed in stream order after it) and sets this condition; one thread.
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
