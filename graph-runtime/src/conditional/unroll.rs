//! `Runtime::graph_while_unrolled`: a WHILE node whose body holds `unroll` copies of the
//! loop's step, so that the relaunch of the body that every WHILE iteration costs on the
//! device is paid once per `unroll` steps.
//!
//! Captured, one iteration of the loop node is
//!
//! ```text
//! step 1; step 2; …; step k; cg_unroll_end
//! ```
//!
//! with `cg_unroll_begin` before the node. While the steps are recorded, the condition lives
//! in its flag in device memory (as eagerly), whose first three words are the condition, the steps
//! before this iteration and the bound, and [`Condition::kernel_arg`] hands out the flag
//! marked with the step's index in the iteration: `graph_condition_active` is false in a step
//! after the one that cleared the condition or past the bound, and `graph_condition_set`
//! (the library's setters too) does nothing there. The step's kernels check it and return at
//! once. The last node counts the iteration's steps and clears the loop's handle when the flag
//! is cleared or the bound reached. No library kernel runs per step. (An IF node around each
//! step would need no cooperation from the kernels, but on driver 580 an IF node costs as much
//! as a WHILE iteration: no gain, measured on an H200.)

use super::construct::{Construct, NEEDS_CONDITIONALS};
use super::record::with_record;
use super::site::Site;
use super::*;

/// Puts `cond` into step mode while alive, and back when dropped. While a step is recorded,
/// [`step_condition`] hands the library's own drawing kernels the step's condition, so that a
/// step after the one that cleared the loop's condition draws nothing and leaves the
/// generators where `graph_while` leaves them.
struct Steps<'c> {
    cond: &'c Condition,
    flag: u64,
    outer: Option<(u64, u64)>,
}

thread_local! {
    /// The `(handle, flag)` of the unrolled step this thread records, if any.
    static STEP: std::cell::Cell<Option<(u64, u64)>> = const { std::cell::Cell::new(None) };
}

/// The condition of the unrolled step this thread records ([`Runtime::graph_while_unrolled`]),
/// or [`ConditionArg::always`] outside one: the library's kernels that run in a loop's steps
/// (the random draws) take it and do nothing in a step after the loop stopped.
pub(crate) fn step_condition() -> ConditionArg<'static> {
    match STEP.with(|s| s.get()) {
        Some((handle, flag)) => ConditionArg {
            handle,
            flag,
            _condition: PhantomData,
        },
        None => ConditionArg::always(),
    }
}

impl<'c> Steps<'c> {
    fn new(cond: &'c Condition, rt: &Runtime) -> Self {
        cond.step.index.store(0, Ordering::Relaxed);
        cond.step.on.store(true, Ordering::Relaxed);
        let flag = cond.flag_ptr(rt);
        let outer = STEP.with(|s| s.replace(Some((u64::MAX - 1, flag))));
        Steps { cond, flag, outer }
    }

    /// Step `j` of the iteration is recorded next.
    fn step(&self, j: u32) {
        self.cond.step.index.store(j, Ordering::Relaxed);
        STEP.with(|s| s.set(Some((u64::MAX - 1 - u64::from(j), self.flag))));
    }
}

impl Drop for Steps<'_> {
    fn drop(&mut self) {
        self.cond.step.on.store(false, Ordering::Relaxed);
        STEP.with(|s| s.set(self.outer));
    }
}

/// The most steps per iteration (`GRAPH_CONDITION_MAX_STEPS` of the device API).
const MAX_UNROLL: u32 = 4096;

impl Runtime {
    /// [`Runtime::graph_while`] with `unroll` steps per iteration of the loop node: the same
    /// loop and the same results bit for bit, with the loop node's per-iteration cost on the
    /// device (the relaunch of its body, a few µs) paid once per `unroll` steps.
    ///
    /// `body` is one step, as for `graph_while`: it sets `cond` for the next test. Captured,
    /// the loop node's body holds `unroll` copies of the step. A step after the one that
    /// cleared the condition still runs, and must change nothing; the library makes its own
    /// kernels so, and yours cooperate through the device API (see the
    /// [module docs](crate::conditional#unrolled-loops)):
    ///
    /// ```text
    /// extern "C" __global__ void sweep(const float *x, float *y, int n, GraphCondition go) {
    ///     if (!graph_condition_active(go)) return;   // an earlier step stopped the loop
    ///     …
    /// }
    /// ```
    ///
    /// so each step's kernels take `cond.kernel_arg(rt)` (taken inside the step) and change
    /// nothing when `graph_condition_active` is false. For kernels of a few µs, read it first
    /// and test it just before the first store (its read then overlaps the kernel's loads;
    /// see the module docs). Kernels that cannot check it (a cuBLAS
    /// call) are fine when running them again changes nothing the loop reads; kernels whose
    /// only effect is a buffer the next step reads need no check when the steps move that
    /// buffer around a ring of `unroll` positions (the module docs' ring form: `body` is
    /// called once per step, in order, eagerly once per host-loop iteration and captured
    /// `unroll` times per recording from step 0, so a counter in it names the position). Set the
    /// condition last in the step (a kernel after the setter sees the new value). Iteration
    /// counts need not be multiples of `unroll`; `max_iterations` counts steps, as for
    /// `graph_while`, and no library kernel runs per step: setting the condition from a
    /// kernel of yours (`graph_condition_set`) makes the toll of a step nothing at all.
    /// Eagerly it is `graph_while`'s host loop, where `graph_condition_active` is always
    /// true.
    ///
    /// ```no_run
    /// # use graph_runtime::cudarc::driver::CudaSlice;
    /// # use graph_runtime::{Compare, Condition, GraphError, Runtime};
    /// # fn step(rt: &Runtime, go: &Condition, x: &mut CudaSlice<f32>, r: &mut CudaSlice<f32>) -> Result<(), GraphError> { Ok(()) }
    /// # fn solve(rt: &Runtime, x: &mut CudaSlice<f32>, r: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    /// let go = rt.condition(true)?;
    /// rt.graph_while_unrolled(&go, Some(10_000), 8, |rt| {
    ///     step(rt, &go, x, r)?;                         // kernels given go.kernel_arg(rt)
    ///     go.set_from(rt, &*r, Compare::Gt, 1e-6)
    /// })
    /// # }
    /// ```
    ///
    /// # Errors
    /// Those of [`Runtime::graph_while`]; [`GraphError::ConditionMisuse`] for `unroll == 0`
    /// or above 4096.
    #[track_caller]
    pub fn graph_while_unrolled(
        &self,
        cond: &Condition,
        max_iterations: Option<u32>,
        unroll: u32,
        mut body: impl FnMut(&Runtime) -> Result<(), GraphError>,
    ) -> Result<(), GraphError> {
        let location = Location::caller();
        if unroll == 0 || unroll > MAX_UNROLL {
            return Err(GraphError::ConditionMisuse {
                construct: "graph_while_unrolled",
                location,
                problem: format!(
                    "`unroll` is {unroll}; it is the number of steps per iteration of the loop node, \
                     1 (`graph_while`) to {MAX_UNROLL}"
                ),
            });
        }
        let captured = matches!(phase::phase(), Phase::Capture { .. });
        if unroll == 1 || max_iterations == Some(0) || !captured {
            // Eagerly the unrolled loop is the plain one: a host read before every step.
            return self.graph_while(cond, max_iterations, body);
        }
        self.while_unrolled(cond, max_iterations, unroll, location, &mut body)
    }

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
        let (capture, validating, mode) = with_record(|r| (r.id, r.validating > 0, r.mode))
            .ok_or_else(|| misuse(super::api::foreign_capture(graph)))?;
        let loop_handle = match cond.handle {
            Some(h) if cond.capture == capture => h,
            _ => return Err(misuse(super::api::from_elsewhere(cond))),
        };
        let begin = self.library_function(CONDITION_KERNELS, "cg_unroll_begin")?;
        let end = self.library_function(CONDITION_KERNELS, "cg_unroll_end")?;
        let flag = cond.flag_ptr(self);
        let max = bound.unwrap_or(0);
        // SAFETY: `cg_unroll_begin(unsigned int *, unsigned int)` writes the condition's three
        // words (alive until the condition drops, after the graph's use of them); one thread.
        unsafe {
            self.stream()
                .launch_builder(&begin)
                .arg(&flag)
                .arg(&max)
                .launch(one_thread())
        }?;
        let mut record = |rt: &Runtime, _: usize| -> Result<(), GraphError> {
            let steps = Steps::new(cond, rt);
            for j in 0..unroll {
                steps.step(j);
                body(rt)?;
            }
            drop(steps);
            // SAFETY: `cg_unroll_end(unsigned long long, unsigned int *, unsigned int)` reads
            // and writes the condition's words (alive as above) and clears the loop's handle,
            // created for the graph being captured; one thread.
            unsafe {
                rt.stream()
                    .launch_builder(&end)
                    .arg(&loop_handle)
                    .arg(&flag)
                    .arg(&unroll)
                    .launch(one_thread())
            }?;
            Ok(())
        };
        if validating {
            // Inside the scratch recording of an enclosing body: the steps inline (a second
            // test of the loop's condition refused there, as for the other constructs).
            if !super::api::first_inline_test(loop_handle) {
                return Err(misuse(super::api::tested_in_every_copy(cond)));
            }
            let _inside = FrameScope::conditional();
            return record(self, 0);
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
            stream: self.stream().cu_stream(),
        };
        site.record(loop_handle, bound.is_none(), &mut record)
    }
}
