//! `Runtime::condition`, `graph_while`, `graph_if` and `graph_if_else`, eager and captured,
//! with the errors they share. Built on [`Construct`] (`conditional/construct.rs`), the
//! recording (`conditional/site.rs`) and the handle records (`conditional/record.rs`).

use super::construct::{require_driver, Branches, Construct, NEEDS_CONDITIONALS};
use super::record::{with_record, HandleRecord};
use super::site::Site;
use super::*;

impl Runtime {
    /// A new [`Condition`] holding `initial`, for [`Runtime::graph_while`],
    /// [`Runtime::graph_if`] and [`Runtime::graph_if_else`].
    ///
    /// Eagerly it is a flag in device memory; inside a captured body it is a conditional
    /// handle of the graph being captured (and its 16 bytes are a graph allocation). Either
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
            return Err(misuse(
                "Runtime::condition",
                location,
                "a condition cannot be created inside the closure of a `graph_while`, `graph_if` or \
                 `graph_if_else`: it allocates, and CUDA allows no allocation in a conditional body. \
                 Fix: create it at the top of the function and re-arm it inside with `cond.set(rt, true)`",
            ));
        }
        let mem = self.stream().alloc_zeros::<u32>(4)?;
        let condition = match phase::phase() {
            Phase::Capture { graph } => {
                let root = with_record(|r| (r.root, r.id)).ok_or_else(|| {
                    misuse("Runtime::condition", location, foreign_capture(graph))
                })?;
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
                    step: StepMode::default(),
                }
            }
            _ => Condition {
                mem,
                handle: None,
                capture: 0,
                location,
                tested_at: OnceLock::new(),
                step: StepMode::default(),
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
        if max_iterations == Some(0) {
            // Not one iteration: the body is neither run nor recorded.
            let location = Location::caller();
            return require_driver(Construct::While.name(), NEEDS_CONDITIONALS, location);
        }
        self.conditional(Construct::While, cond, max_iterations, &mut |rt, _| {
            body(rt)
        })
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
        self.conditional(Construct::If, cond, None, &mut |rt, _| then(rt))
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
        self.conditional(Construct::IfElse, cond, None, &mut |rt, i| {
            branch(rt, i == 0)
        })
    }

    /// What the three constructs share: the checks, then the host loop or branch (`eager`)
    /// or the recording (`captured`). `Location::caller()` is the user's call: every step
    /// to here is `#[track_caller]`.
    #[track_caller]
    pub(super) fn conditional(
        &self,
        construct: Construct,
        cond: &Condition,
        bound: Option<u32>,
        branches: &mut Branches<'_>,
    ) -> Result<(), GraphError> {
        let location = Location::caller();
        require_driver(construct.name(), construct.needs(), location)?;
        if phase::in_fork() {
            return Err(misuse(
                construct.name(),
                location,
                "it cannot run inside the closure of `fork`: a captured conditional pauses the capture of \
                 the runtime's stream, which would cut the side stream off. Fix: call it before or after \
                 the fork",
            ));
        }
        let first = *cond.tested_at.get_or_init(|| location);
        if first != location {
            return Err(misuse(
                construct.name(),
                location,
                tested_twice(cond, first),
            ));
        }
        match phase::phase() {
            Phase::Capture { graph } => {
                self.captured(construct, graph, cond, bound, location, branches)
            }
            _ => self.eager(construct, cond, bound, location, branches),
        }
    }

    /// The host loop or branch: reads the flag (a copy and a synchronize) and runs closures.
    pub(super) fn eager(
        &self,
        construct: Construct,
        cond: &Condition,
        bound: Option<u32>,
        location: &'static Location<'static>,
        branches: &mut Branches<'_>,
    ) -> Result<(), GraphError> {
        if cond.handle.is_some() {
            return Err(misuse(construct.name(), location, from_elsewhere(cond)));
        }
        // A capture this runtime did not begin (a raw cudarc capture around the call) would
        // be invalidated by the synchronize.
        let status = self.stream().capture_status()?;
        if status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
            return Err(misuse(
                construct.name(),
                location,
                foreign_capture("a graph"),
            ));
        }
        if bound.is_some() {
            // Loaded now, so that the capture only looks it up.
            self.library_function(CONDITION_KERNELS, "cg_loop_bound")?;
        }
        let _inside = FrameScope::conditional();
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
    pub(super) fn captured(
        &self,
        construct: Construct,
        graph: &'static str,
        cond: &Condition,
        bound: Option<u32>,
        location: &'static Location<'static>,
        branches: &mut Branches<'_>,
    ) -> Result<(), GraphError> {
        let state = with_record(|r| (r.id, r.validating > 0, r.mode))
            .ok_or_else(|| misuse(construct.name(), location, foreign_capture(graph)))?;
        let (capture, validating, mode) = state;
        let handle = match cond.handle {
            Some(h) if cond.capture == capture => h,
            _ => return Err(misuse(construct.name(), location, from_elsewhere(cond))),
        };
        let stream = self.stream().cu_stream();
        if bound.is_some() {
            // The iteration count starts at 0 each time the loop node is reached (a memset
            // node, allowed inside a body as well).
            // SAFETY: the count is the second word of the condition's 16 bytes, alive until
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
            // where the enclosing check sees what they record, and refuse a second test of the
            // condition there (a construct in every copy of an unrolled step), before any
            // node's own body records it.
            if !first_inline_test(handle) {
                return Err(misuse(
                    construct.name(),
                    location,
                    tested_in_every_copy(cond),
                ));
            }
            let _inside = FrameScope::conditional();
            for i in 0..construct.bodies() as usize {
                record(self, i)?;
            }
            return Ok(());
        }
        let tested = with_record(|r| r.handles.iter().any(|h| h.handle == handle && h.used));
        if tested == Some(true) {
            // The same call recorded twice (a helper called twice with one condition).
            return Err(misuse(
                construct.name(),
                location,
                tested_twice(cond, location),
            ));
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

pub(super) fn launch_bound(
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

/// A [`GraphError::ConditionMisuse`] of `construct`, called at `location`: `problem` says
/// what is wrong and what to write instead (the functions below write the shared ones).
fn misuse(
    construct: &'static str,
    location: &'static Location<'static>,
    problem: impl Into<String>,
) -> GraphError {
    GraphError::ConditionMisuse {
        construct,
        location,
        problem: problem.into(),
    }
}

/// Why a construct refuses a capture that `#[cuda_graph]` did not begin (into `graph`).
pub(super) fn foreign_capture(graph: &'static str) -> String {
    format!(
        "the runtime's stream is being captured into {graph} by something other than `#[cuda_graph]`'s \
         capture, which is the only one that records conditional nodes (and eagerly, the loop's host \
         read would invalidate that capture). Fix: capture the function with the generated `capture`"
    )
}

/// Why a second construct may not test `cond`, which the construct at `first` tests.
pub(super) fn tested_twice(cond: &Condition, first: &'static Location<'static>) -> String {
    format!(
        "the condition created at {} is already tested by the construct at {first}, and CUDA ties a \
         conditional handle to one conditional node. Fix: give each `graph_while` / `graph_if` / \
         `graph_if_else` its own condition, set from the same value (`let again = rt.condition(false)?; \
         again.set_from(rt, &flag, Compare::Ne, 0)?`, or set both from your kernel)",
        cond.location
    )
}

/// Notes that a construct recorded inline (in a scratch recording) tests `handle`: false when
/// one did already in this scratch recording.
pub(super) fn first_inline_test(handle: u64) -> bool {
    with_record(|r| {
        let first = !r.inline_tested.contains(&handle);
        if first {
            r.inline_tested.push(handle);
        }
        first
    })
    .unwrap_or(true)
}

/// Why a construct inside the step of an unrolled loop may not test `cond` in every copy.
pub(super) fn tested_in_every_copy(cond: &Condition) -> String {
    format!(
        "it tests the condition created at {} in more than one recorded copy: inside the step of a \
         `graph_while_unrolled` the step is recorded once per unrolled copy, and CUDA ties a conditional \
         handle to one conditional node. Fix: create one condition per copy before the loop and pick \
         it with a counter in the step's closure (`let c = &conds[i % unroll]; i += 1;`), or unroll by 1",
        cond.location
    )
}

/// Why a construct may not test `cond`, which another run (eager or a capture) created.
pub(super) fn from_elsewhere(cond: &Condition) -> String {
    format!(
        "the condition it tests was created at {} {}, and a condition belongs to the run (eager, or \
         one capture) that created it. Fix: create the condition in the same body run, before the call",
        cond.location,
        if cond.handle.is_some() {
            "in another capture"
        } else {
            "eagerly, outside this capture"
        }
    )
}
