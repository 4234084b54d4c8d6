//! `Runtime::graph_while_unrolled`: a WHILE node whose body holds `unroll` copies of the
//! loop's step, each after the first guarded by an IF node, so that the relaunch of the body
//! that every WHILE iteration costs on the device is paid once per `unroll` steps.
//!
//! Captured, one iteration of the loop node is
//!
//! ```text
//! step 1; guard 1; IF (h1) { step 2; guard 2; IF (h2) { … step k; guard k } }
//! ```
//!
//! While the steps are recorded the condition is set through its flag in device memory (as
//! eagerly: [`Condition::kernel_arg`] hands out the flag), and the library's one-thread guard
//! after each step reads the flag, counts the step against the bound, clears the loop's
//! handle when the loop is to stop and sets the handle of the IF node around the next step. A
//! step after the one that cleared the condition is therefore never run: the loop runs
//! exactly the steps of the plain `graph_while`, with the same results bit for bit. Eagerly
//! it is the plain host loop.

use super::construct::{Construct, NEEDS_CONDITIONALS};
use super::record::{with_record, HandleRecord};
use super::site::Site;
use super::*;

/// Turns `cond`'s setters to its flag while alive, and back when dropped.
struct ViaFlag<'c>(&'c Condition);

impl<'c> ViaFlag<'c> {
    fn new(cond: &'c Condition) -> Self {
        cond.via_flag.store(true, Ordering::Relaxed);
        ViaFlag(cond)
    }
}

impl Drop for ViaFlag<'_> {
    fn drop(&mut self) {
        self.0.via_flag.store(false, Ordering::Relaxed);
    }
}

/// What the recording of an unrolled loop's steps needs.
struct Steps<'a> {
    rt: &'a Runtime,
    graph: &'static str,
    location: &'static Location<'static>,
    mode: sys::CUstreamCaptureMode,
    stream: sys::CUstream,
    loop_handle: u64,
    /// The handles of the IF nodes around steps 2..=k (one fewer than the steps).
    guards: Vec<u64>,
    flag: u64,
    /// The iteration bound in steps (0: none).
    max: u32,
    guard: CudaFunction,
}

impl Steps<'_> {
    /// Records step `j` (from 0), its guard, and the IF node holding the steps after it.
    fn record(
        &self,
        rt: &Runtime,
        j: usize,
        body: &mut dyn FnMut(&Runtime) -> Result<(), GraphError>,
    ) -> Result<(), GraphError> {
        body(rt)?;
        let next = self.guards.get(j).copied();
        let has_next = u32::from(next.is_some());
        let next_handle = next.unwrap_or(0);
        // SAFETY: `cg_unroll_guard(unsigned long long, unsigned long long, unsigned int,
        // unsigned int *, unsigned int)` reads and writes the condition's two words (alive
        // until the condition drops, after the graph's use of it) and sets the loop's handle
        // and the next IF node's handle, both created for the graph being captured; one thread.
        unsafe {
            rt.stream()
                .launch_builder(&self.guard)
                .arg(&self.loop_handle)
                .arg(&next_handle)
                .arg(&has_next)
                .arg(&self.flag)
                .arg(&self.max)
                .launch(one_thread())
        }?;
        let Some(handle) = next else {
            return Ok(());
        };
        let validating = with_record(|r| r.validating > 0).unwrap_or(false);
        if validating {
            // The scratch recording of an enclosing node: every step inline.
            return self.record(rt, j + 1, body);
        }
        let site = Site {
            rt: self.rt,
            construct: Construct::If,
            graph: self.graph,
            location: self.location,
            mode: self.mode,
            stream: self.stream,
        };
        site.record(handle, true, &mut |rt, _| {
            self.record(rt, j + 1, &mut *body)
        })
    }
}

impl Runtime {
    /// [`Runtime::graph_while`] with `unroll` steps per iteration of the loop node: the same
    /// loop, the same steps and the same results bit for bit, with the loop node's per-iteration
    /// cost on the device (the relaunch of its body, a few µs) paid once per `unroll` steps.
    ///
    /// `body` is one step, as for `graph_while`: it sets `cond` for the next test. Captured,
    /// the loop node's body holds `unroll` copies of the step; after each, a one-thread library
    /// kernel (the guard) hands the condition on, and the copies after the first sit inside IF
    /// nodes that run them only while the condition holds, so no step runs after the one that
    /// cleared it (iteration counts need not be multiples of `unroll`). `max_iterations`
    /// counts steps, as for `graph_while`, in the guard. Eagerly it is `graph_while`'s host
    /// loop.
    ///
    /// ```no_run
    /// # use graph_runtime::cudarc::driver::CudaSlice;
    /// # use graph_runtime::{Compare, GraphError, Runtime};
    /// # fn step(rt: &Runtime, x: &mut CudaSlice<f32>, r: &mut CudaSlice<f32>) -> Result<(), GraphError> { Ok(()) }
    /// # fn solve(rt: &Runtime, x: &mut CudaSlice<f32>, r: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    /// let go = rt.condition(true)?;
    /// rt.graph_while_unrolled(&go, Some(10_000), 8, |rt| {
    ///     step(rt, x, r)?;
    ///     go.set_from(rt, &*r, Compare::Gt, 1e-6)
    /// })
    /// # }
    /// ```
    ///
    /// Whether it pays depends on the driver's cost of an IF node against a WHILE iteration:
    /// `examples/15-jacobi-solve.rs` and `examples/14-decode-loop.rs` measure both.
    ///
    /// What a step may record is what a `graph_while` body may, with two more limits:
    /// * set the condition inside the step (with [`Condition::set`], [`Condition::set_from`], or
    ///   a kernel given [`Condition::kernel_arg`] taken inside the step: an argument taken
    ///   before the call addresses the loop node directly and skips the guard);
    /// * no conditional constructs of its own: each copy would test the same condition, which
    ///   is [`GraphError::ConditionMisuse`] when captured.
    ///
    /// # Errors
    /// Those of [`Runtime::graph_while`]; [`GraphError::ConditionMisuse`] for `unroll == 0`.
    #[track_caller]
    pub fn graph_while_unrolled(
        &self,
        cond: &Condition,
        max_iterations: Option<u32>,
        unroll: u32,
        mut body: impl FnMut(&Runtime) -> Result<(), GraphError>,
    ) -> Result<(), GraphError> {
        let location = Location::caller();
        if unroll == 0 {
            return Err(GraphError::ConditionMisuse {
                construct: "graph_while_unrolled",
                location,
                problem:
                    "`unroll` is 0; it is the number of steps per iteration of the loop node (1: \
                          `graph_while`)"
                        .into(),
            });
        }
        let captured = matches!(phase::phase(), Phase::Capture { .. });
        if unroll == 1 || max_iterations == Some(0) || !captured {
            // Eagerly the unrolled loop is the plain one: a host read before every step.
            return self.graph_while(cond, max_iterations, body);
        }
        self.while_unrolled(cond, max_iterations, unroll, location, &mut body)
    }

    #[allow(clippy::too_many_arguments)]
    fn while_unrolled(
        &self,
        cond: &Condition,
        bound: Option<u32>,
        unroll: u32,
        location: &'static Location<'static>,
        body: &mut dyn FnMut(&Runtime) -> Result<(), GraphError>,
    ) -> Result<(), GraphError> {
        let construct = Construct::While;
        super::construct::require_driver(construct.name(), NEEDS_CONDITIONALS, location)?;
        let Phase::Capture { graph } = phase::phase() else {
            unreachable!("called while capturing")
        };
        let misuse = |problem: String| GraphError::ConditionMisuse {
            construct: "graph_while_unrolled",
            location,
            problem,
        };
        if phase::in_fork() {
            return Err(misuse(
                "it cannot run inside the closure of `fork`: a captured conditional pauses the capture of \
                 the runtime's stream, which would cut the side stream off. Fix: call it before or after \
                 the fork"
                    .into(),
            ));
        }
        let first = *cond.tested_at.get_or_init(|| location);
        if first != location {
            return Err(misuse(super::api::tested_twice(cond, first)));
        }
        let (capture, validating, mode, root) =
            with_record(|r| (r.id, r.validating > 0, r.mode, r.root))
                .ok_or_else(|| misuse(super::api::foreign_capture(graph)))?;
        let loop_handle = match cond.handle {
            Some(h) if cond.capture == capture => h,
            _ => return Err(misuse(super::api::from_elsewhere(cond))),
        };
        let begin = self.library_function(CONDITION_KERNELS, "cg_unroll_begin")?;
        let guard = self.library_function(CONDITION_KERNELS, "cg_unroll_guard")?;
        let flag = cond.flag_ptr(self);
        // SAFETY: `cg_unroll_begin(unsigned int *)` writes the condition's two words (alive
        // until the condition drops, after the graph's use of them); one thread.
        unsafe {
            self.stream()
                .launch_builder(&begin)
                .arg(&flag)
                .launch(one_thread())
        }?;
        let guards = if validating {
            // Inside the scratch recording of an enclosing body: no nodes, no handles.
            vec![0; unroll as usize - 1]
        } else {
            self.context().bind_to_thread()?;
            (1..unroll)
                .map(|_| {
                    // SAFETY: `root` is the graph being captured, on this runtime's context
                    // (bound above); the driver supports CUDA 12.4 (checked).
                    let h = unsafe {
                        driver::conditional_handle_create(root, self.context().cu_ctx(), 0)
                    }
                    .map_err(|e| GraphError::from_driver(graph, e))?;
                    with_record(|r| {
                        r.handles.push(HandleRecord {
                            handle: h,
                            location,
                            used: false,
                        })
                    });
                    Ok(h)
                })
                .collect::<Result<Vec<u64>, GraphError>>()?
        };
        let steps = Steps {
            rt: self,
            graph,
            location,
            mode,
            stream: self.stream().cu_stream(),
            loop_handle,
            guards,
            flag,
            max: bound.unwrap_or(0),
            guard,
        };
        let _via_flag = ViaFlag::new(cond);
        if validating {
            let _inside = DepthScope::conditional();
            return steps.record(self, 0, body);
        }
        let tested = with_record(|r| r.handles.iter().any(|h| h.handle == loop_handle && h.used));
        if tested == Some(true) {
            return Err(misuse(super::api::tested_twice(cond, location)));
        }
        let site = Site {
            rt: self,
            construct,
            graph,
            location,
            mode,
            stream: steps.stream,
        };
        site.record(loop_handle, bound.is_none(), &mut |rt, _| {
            steps.record(rt, 0, &mut *body)
        })
    }
}
