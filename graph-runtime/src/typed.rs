//! [`TypedGraph`]: what every generated graph type is, written once.
//!
//! `#[cuda_graph]` fills in [`GraphBody`] for the function's static buffers (how to run the
//! body on them, record and check their addresses, lend them as views) and
//! [`ReplayInputs`] for the tuple of a replay's inputs (check their shapes, stage them, copy
//! them for `verify`'s eager run, which runs the body on the copies swapped in for the
//! graph's own buffers). Everything else lives here, once:
//! warmup and capture around the body, the self-verifying replay, `verify`, `launch`, the
//! views, `info`, `Debug` and `Display`. The generated `FooGraph<'s>` wraps a
//! `TypedGraph<FooBody<'s>>` and keeps only its typed `capture`, `replay` and `verify`,
//! each forwarding here in a line.

use std::panic::{self, AssertUnwindSafe};

use crate::buffer::Staging;
use crate::error::{GraphError, When};
use crate::graph::{launch_as_is, replay, Graph, GraphInfo};
use crate::inputs::InputNodes;
use crate::runtime::FromRuntime;
use crate::runtime::Runtime;
use crate::site::{GraphSite, Step};
use crate::state::AddressBook;
use crate::verify::{Tolerance, Verifier, VerifyReport, VerifySchedule};

/// What `#[cuda_graph]` generates for one function: its static buffers, held state and
/// constants, and how to run the body on them.
#[doc(hidden)]
pub trait GraphBody: Sized {
    /// The body's execution context (`Runtime`, a stream, candle's `Device`).
    type Ctx: ?Sized + FromRuntime;
    /// The static input buffers, lent to be filled in place.
    type Inputs<'g>
    where
        Self: 'g;
    /// The outputs, borrowed until the next replay.
    type Outputs<'g>
    where
        Self: 'g;
    /// The state, lent back between replays.
    type State<'g>
    where
        Self: 'g;

    /// The generated graph type's name (`FooGraph`), for `Debug`.
    const GRAPH_TYPE: &'static str;

    /// The static inputs and outputs (and the returned value's buffer), which `verify`'s
    /// eager run swaps for copies and shadows of its own.
    type Statics;

    /// The function's name, warmup and capture mode.
    fn site() -> &'static GraphSite;

    /// The static inputs and outputs.
    fn statics(&mut self) -> &mut Self::Statics;

    /// Runs the user's function once on the static buffers (a warmup run, the capture, or
    /// `verify`'s eager run on swapped-in copies).
    fn run(&mut self, ctx: &Self::Ctx, rt: &Runtime) -> Result<(), GraphError>;

    /// Records the addresses of the state, then of the outputs (indices from 0, in order).
    fn record(&self, book: &mut AddressBook);

    /// Checks the addresses recorded by [`GraphBody::record`]: the state's, and the outputs'
    /// too when `outputs` (after warmup runs and the capture).
    fn check(&self, book: &AddressBook, when: When, outputs: bool) -> Result<(), GraphError>;

    /// Registers the static input buffers, in order, for the graph's input copy nodes.
    fn register_inputs(&self, inputs: &mut InputNodes);

    /// Bytes of the static buffers.
    fn static_bytes(&self) -> usize;

    /// After the capture: a returned value must have been stored.
    fn captured(&self) -> Result<(), GraphError> {
        Ok(())
    }

    /// Lends the static input buffers.
    fn inputs_mut(&mut self) -> Self::Inputs<'_>;

    /// Borrows the outputs.
    fn outputs(&self) -> Self::Outputs<'_>;

    /// Lends the state.
    fn state_mut(&mut self) -> Self::State<'_>;

    /// Gives `verify` each output of `statics`: the eager run's (`eager`) or the replay's.
    fn outputs_to(
        statics: &Self::Statics,
        verifier: &mut Verifier<'_>,
        eager: bool,
    ) -> Result<(), GraphError>;
}

/// The inputs of one replay of `B`, as the generated `replay` passes them: a tuple with one
/// source per input, in order.
#[doc(hidden)]
pub trait ReplayInputs<B: GraphBody> {
    /// Checks every input's shape against its static buffer (`site`: `B::site()`).
    fn check_shapes(&self, body: &B, site: &'static GraphSite) -> Result<(), GraphError>;

    /// Feeds every input into its static buffer (queued on the graph's stream).
    fn stage(&self, body: &mut B, staging: &Staging<'_>) -> Result<(), GraphError>;

    /// What `verify`'s eager run works on: copies of the inputs, shadow outputs shaped like
    /// the graph's, an empty result buffer.
    fn eager_statics(
        &self,
        body: &B,
        rt: &Runtime,
        site: &'static GraphSite,
    ) -> Result<B::Statics, GraphError>;
}

/// A captured graph of a `#[cuda_graph]` function: the instantiated graph, its address book,
/// its verification schedule and the function's static buffers.
#[doc(hidden)]
pub struct TypedGraph<B> {
    graph: Graph,
    book: AddressBook,
    verify: VerifySchedule,
    body: B,
}

impl<B: GraphBody> TypedGraph<B> {
    /// Warms up, captures and instantiates `body`'s function on its static buffers (see
    /// `crate::capture`).
    pub fn capture(rt: &Runtime, mut body: B, verify: VerifySchedule) -> Result<Self, GraphError> {
        let site = B::site();
        let static_bytes = body.static_bytes();
        let mut book = AddressBook::new(site.name);
        body.record(&mut book);
        let mut inputs = InputNodes::new();
        body.register_inputs(&mut inputs);
        let graph = {
            let ctx = B::Ctx::try_from_runtime(rt)?;
            let book = &book;
            let body = &mut body;
            let mut run = |step: Step| -> Result<(), GraphError> {
                match step {
                    Step::Run(_) => body.run(ctx, rt),
                    Step::Check(when) => body.check(book, when, true),
                }
            };
            crate::capture::capture(rt, site, book, &inputs, static_bytes, &mut run)?
        };
        body.captured()?;
        Ok(TypedGraph {
            graph,
            book,
            verify,
            body,
        })
    }

    /// The generated `replay`: verifies the replay when the schedule says so, otherwise
    /// checks the inputs' shapes and the state's addresses, feeds the inputs and launches.
    #[inline]
    pub fn replay_inputs<I: ReplayInputs<B>>(
        &mut self,
        inputs: I,
    ) -> Result<B::Outputs<'_>, GraphError> {
        if let Some(tolerance) = self.verify.due() {
            self.verify_inputs(inputs, tolerance)?.into_result()?;
            return Ok(self.body.outputs());
        }
        inputs.check_shapes(&self.body, B::site())?;
        self.body.check(&self.book, When::Replay, false)?;
        let body = &mut self.body;
        replay(&self.graph, |staging| inputs.stage(body, staging))?;
        Ok(self.body.outputs())
    }

    /// The generated `verify`: one replay checked against the eager function on the same
    /// inputs (see the generated method's documentation).
    pub fn verify_inputs<I: ReplayInputs<B>>(
        &mut self,
        inputs: I,
        tolerance: Tolerance,
    ) -> Result<VerifyReport, GraphError> {
        inputs.check_shapes(&self.body, B::site())?;
        self.body.check(&self.book, When::Replay, false)?;
        let rt = self.graph.runtime().clone();
        let mut verifier = Verifier::begin(&rt, &self.book, tolerance)?;
        // Dropped at the end, after the comparison.
        let mut eager = inputs.eager_statics(&self.body, &rt, B::site())?;
        let ctx = B::Ctx::try_from_runtime(&rt)?;
        run_on(&mut self.body, &mut eager, ctx, &rt)?;
        B::outputs_to(&eager, &mut verifier, true)?;
        verifier.rewind()?;
        let body = &mut self.body;
        replay(&self.graph, |staging| inputs.stage(body, staging))?;
        B::outputs_to(self.body.statics(), &mut verifier, false)?;
        verifier.finish()
    }

    /// Launches the graph with the inputs as they are in its static buffers (see
    /// `inputs_mut`): a replay without copies. The state's addresses are checked first, as
    /// in `replay`.
    #[inline]
    pub fn launch(&mut self) -> Result<B::Outputs<'_>, GraphError> {
        self.body.check(&self.book, When::Replay, false)?;
        launch_as_is(&self.graph)?;
        Ok(self.body.outputs())
    }

    /// The static input buffers, lent as views to write the next inputs in place.
    pub fn inputs_mut(&mut self) -> B::Inputs<'_> {
        self.body.inputs_mut()
    }

    /// The outputs as the last replay left them.
    pub fn outputs(&self) -> B::Outputs<'_> {
        self.body.outputs()
    }

    /// The state, lent back between replays: `&mut` state in its `DeviceState::Lent` form (a
    /// `CudaSlice` as a `CudaViewMut`), read-only state as `&T`. When some state lives on a
    /// stream other than the runtime's, this first waits for the replays in flight
    /// ([`Graph::settle`]).
    pub fn state_mut(&mut self) -> B::State<'_> {
        self.graph.settle();
        self.body.state_mut()
    }

    /// Node count, memory and timings of the capture.
    pub fn info(&self) -> &GraphInfo {
        self.graph.info()
    }

    /// The instantiated graph (its facts and raw handles).
    pub fn graph(&self) -> &Graph {
        &self.graph
    }
}

/// Runs the user's function on `statics` instead of the graph's own static buffers: swaps
/// them in, runs, and swaps them back, also when the function panics (the graph's buffers
/// are never left outside it).
fn run_on<B: GraphBody>(
    body: &mut B,
    statics: &mut B::Statics,
    ctx: &B::Ctx,
    rt: &Runtime,
) -> Result<(), GraphError> {
    std::mem::swap(body.statics(), statics);
    let ran = panic::catch_unwind(AssertUnwindSafe(|| body.run(ctx, rt)));
    std::mem::swap(body.statics(), statics);
    match ran {
        Ok(result) => result,
        Err(payload) => panic::resume_unwind(payload),
    }
}

impl<B: GraphBody> std::fmt::Debug for TypedGraph<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct(B::GRAPH_TYPE)
            .field("info", self.graph.info())
            .finish_non_exhaustive()
    }
}

/// The graph's summary: nodes by kind, kernels by name, edges, memory, timings.
impl<B> std::fmt::Display for TypedGraph<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.graph, f)
    }
}

/// `Deref`, `DerefMut`, `Debug` and `Display` of a generated graph type `$graph<'s>`, a
/// wrapper around `TypedGraph<$body<'s>>`, and `Debug` of its views (which show their
/// names only): the impls Rust cannot write generically for a type of the user's crate.
#[doc(hidden)]
#[macro_export]
macro_rules! __graph_type_impls {
    ($graph:ident, $body:ident, $($view:ident),*) => {
        impl<'s> ::core::ops::Deref for $graph<'s> {
            type Target = $crate::__private::TypedGraph<$body<'s>>;
            fn deref(&self) -> &Self::Target {
                &self.0
            }
        }
        impl<'s> ::core::ops::DerefMut for $graph<'s> {
            fn deref_mut(&mut self) -> &mut Self::Target {
                &mut self.0
            }
        }
        impl ::core::fmt::Debug for $graph<'_> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                ::core::fmt::Debug::fmt(&self.0, f)
            }
        }
        /// The graph's summary: nodes by kind, kernels by name, edges, memory, timings.
        impl ::core::fmt::Display for $graph<'_> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                ::core::fmt::Display::fmt(&self.0, f)
            }
        }
        $(
            impl ::core::fmt::Debug for $view<'_> {
                fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                    f.debug_struct(::core::stringify!($view)).finish_non_exhaustive()
                }
            }
        )*
    };
}
