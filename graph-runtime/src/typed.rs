//! [`TypedGraph`]: what every generated graph type is, written once.
//!
//! `#[cuda_graph]` fills in [`GraphBody`] for the function (how to run the body on its
//! static buffers, record and check its state's addresses, lend the views) and names the
//! types of its static inputs and outputs as tuples; the runtime does the rest for any
//! such tuple, here: [`StaticList`] (bytes, input nodes, the outputs' addresses, shadows
//! for `verify`, the outputs given to the verifier) and [`Sources`] for the tuple of a
//! replay's inputs (check their shapes, stage them, copy them for `verify`'s eager run).
//! Warmup and capture around the body, the self-verifying replay, `verify`, `launch`, the
//! views, `info`, `Debug` and `Display` live here, once. The generated `FooGraph<'s>` wraps
//! a `TypedGraph<FooBody<'s>>` and keeps only its typed `capture`, `replay` and `verify`,
//! `replay` and `verify` forwarding here in a line.
//!
//! A [`Recording`] is one capture of a body with its islands and its verification schedule:
//! its replay, islands and `verify` run on an [`Instance`] (the body, its static buffers and
//! their address book). `TypedGraph` is one of each; a bucket family (`crate::buckets`) is
//! one instance and a recording per bucket, so that families verify, run islands and print
//! through this same code.

use std::any::Any;

use crate::buffer::{
    alloc_static, check_shape, feed_input, stage_input, static_bytes, InputSource, Staging,
    StaticBuffer,
};
use crate::capture::CapturedIsland;
use crate::error::{GraphError, When};
use crate::graph::{launch_as_is, replay, Graph, GraphInfo};
use crate::inputs::InputNodes;
use crate::runtime::FromRuntime;
use crate::runtime::Runtime;
use crate::site::{GraphSite, Step};
use crate::state::{AddressBook, DeviceState, Recorded, StateVisitor};
use crate::verify::{Tolerance, Verifier, VerifyReport, VerifySchedule};

/// A graph's static buffers: its inputs and its outputs (tuples, in the function's order)
/// and the buffer of its returned value ([`NoResult`] or `Option<B>`).
#[doc(hidden)]
#[derive(Debug)]
pub struct Statics<I, O, V> {
    /// The static inputs.
    pub inputs: I,
    /// The outputs.
    pub outputs: O,
    /// The returned value, once the first run stored it.
    pub result: V,
    /// Of a bucket family's buffers, the rows the body runs on (see [`Batch`]); a single
    /// graph's body never reads it.
    pub batch: Batch,
}

impl<I, O, V: ResultSlot> Statics<I, O, V> {
    /// Static inputs and outputs, and no returned value yet.
    pub fn new(inputs: I, outputs: O) -> Self {
        Statics {
            inputs,
            outputs,
            result: V::empty(),
            batch: Batch::default(),
        }
    }
}

/// The rows of a bucket family's buffers (`crate::buckets`): each buffer holds `of` rows;
/// the body runs on the first `bucket` of them (the graph's bucket, or the batch itself when
/// it runs eagerly), of which the first `rows` are the caller's and the rest zero padding.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Batch {
    /// The caller's rows: what a replay hands out.
    pub rows: usize,
    /// The rows the body runs on.
    pub bucket: usize,
    /// The rows the buffers hold.
    pub of: usize,
}

/// The static buffers of the graph of body `B`.
#[doc(hidden)]
pub type StaticsOf<B> =
    Statics<<B as GraphBody>::Ins, <B as GraphBody>::Outs, <B as GraphBody>::Value>;

/// The returned value's slot of a function that returns `Result<(), E>` (or nothing).
#[doc(hidden)]
#[derive(Debug, Clone, Copy)]
pub struct NoResult;

/// The returned value's slot of a function that returns device data (`Result<B, E>`): a
/// static buffer allocated by the first run, shaped like that run's value.
#[doc(hidden)]
#[derive(Debug)]
pub struct ResultOf<B>(pub Option<B>);

impl<B> ResultOf<B> {
    /// The stored value (a captured graph holds one: see [`ResultSlot::captured`]).
    pub fn get(&self) -> &B {
        self.0.as_ref().expect("a captured graph holds its result")
    }
}

/// Where a graph keeps its function's returned value: nowhere ([`NoResult`]) or in a static
/// buffer ([`ResultOf`]).
#[doc(hidden)]
pub trait ResultSlot {
    /// No value yet.
    fn empty() -> Self;
    /// After the capture: a returned value must have been stored.
    fn captured(&self, site: &'static GraphSite) -> Result<(), GraphError>;
    /// Gives `verify` the returned value (the eager run's when `eager`, else the replay's).
    fn output_to(&self, verifier: &mut Verifier<'_>, eager: bool) -> Result<(), GraphError>;
}

impl ResultSlot for NoResult {
    fn empty() -> Self {
        NoResult
    }
    fn captured(&self, _: &'static GraphSite) -> Result<(), GraphError> {
        Ok(())
    }
    fn output_to(&self, _: &mut Verifier<'_>, _: bool) -> Result<(), GraphError> {
        Ok(())
    }
}

/// The body stores its value with `store_result` (which asks for a `ResultBuffer`, and says
/// so at the function's return type).
impl<B: DeviceState> ResultSlot for ResultOf<B> {
    fn empty() -> Self {
        ResultOf(None)
    }
    fn captured(&self, site: &'static GraphSite) -> Result<(), GraphError> {
        match self.0 {
            Some(_) => Ok(()),
            None => Err(GraphError::EmptyGraph { graph: site.name }),
        }
    }
    fn output_to(&self, verifier: &mut Verifier<'_>, eager: bool) -> Result<(), GraphError> {
        verifier.output(eager, "result", self.get())
    }
}

/// Refuses a capture whose graphs keep memory they allocated (see [`Graph::memory_nodes`]):
/// state replaced inside the body (a foreign model's own state or cache held as
/// `ModelState`, say), a static, a leak. Each relaunch frees that memory, so whatever holds it
/// would read freed memory. (A returned value is copied into a static buffer the warmup
/// allocated, never kept in a temporary.) Counted over every segment of the capture (a
/// temporary may be freed by the segment after an island) and per address (CUDA may give one
/// address to two allocations of a graph whose lives do not overlap).
fn refuse_kept_temporaries(
    site: &'static GraphSite,
    captured: &crate::capture::Captured,
) -> Result<(), GraphError> {
    let graphs =
        std::iter::once(&captured.graph).chain(captured.islands.iter().flat_map(|i| &i.after));
    let bytes = crate::graph::kept_bytes(graphs.map(|g| g.memory_nodes()));
    match bytes {
        0 => Ok(()),
        bytes => Err(GraphError::KeptTemporary {
            graph: site.name,
            bytes: bytes as usize,
        }),
    }
}

/// Drops what owns a body's state after its capture was refused with
/// [`GraphError::KeptTemporary`]: the state may hold memory of the refused graph, which is
/// gone, and cudarc records the failure of freeing it, a consequence of that error that must
/// not fail an unrelated later call.
pub(crate) fn drop_after_kept<T>(rt: &Runtime, owner: T) {
    drop(owner);
    if let Some(e) = rt.take_recorded_error() {
        tracing::debug!(error = ?e, "cleared the failed free of a refused graph's memory");
    }
}

/// A tuple of static buffers (a graph's inputs, or its outputs), `()` to 16 of them.
#[doc(hidden)]
pub trait StaticList: Sized {
    /// The buffers' `DeviceState::Lent` views, a tuple.
    type Lent<'a>
    where
        Self: 'a;
    /// Lends every buffer as its view (to be written into, never replaced).
    fn lend(&mut self) -> Self::Lent<'_>;
    /// Bytes of the buffers.
    fn bytes(&self) -> usize;
    /// Registers the buffers, in order, as the graph's input copy nodes' destinations.
    fn register(&self, nodes: &mut InputNodes);
    /// Records the buffers' addresses as outputs named `names`.
    fn record(&self, names: &'static [&'static str], book: &mut AddressBook);
    /// Checks the addresses recorded by [`StaticList::record`] from entry `first` on.
    fn check(&self, first: usize, book: &AddressBook, when: When) -> Result<(), GraphError>;
    /// Gives `verify` each buffer as output `names[k]` (the eager run's when `eager`).
    fn outputs_to(
        &self,
        names: &'static [&'static str],
        verifier: &mut Verifier<'_>,
        eager: bool,
    ) -> Result<(), GraphError>;
    /// The buffers' shapes, a tuple (how the generated `capture` is given the outputs).
    type Shapes;
    /// Zeroed buffers of `shapes`, named `names` (in out-of-memory errors).
    fn alloc(
        rt: &Runtime,
        site: &'static GraphSite,
        names: &'static [&'static str],
        shapes: Self::Shapes,
    ) -> Result<Self, GraphError>;
    /// Zeroed buffers shaped like these, for `verify`'s eager run.
    fn shadows(
        &self,
        rt: &Runtime,
        site: &'static GraphSite,
        names: &'static [&'static str],
    ) -> Result<Self, GraphError>;
}

/// The inputs of one replay, as the generated `replay` passes them: a tuple with one source
/// per static input of `L`, in order.
#[doc(hidden)]
pub trait Sources<L> {
    /// Checks every source's shape against its static buffer.
    fn check_shapes(
        &self,
        dst: &L,
        site: &'static GraphSite,
        names: &'static [&'static str],
    ) -> Result<(), GraphError>;
    /// Feeds every source into its static buffer (queued on the graph's stream).
    fn stage(&self, dst: &mut L, staging: &Staging<'_>) -> Result<(), GraphError>;
    /// Copies of the sources in buffers of their own: the static inputs of the generated
    /// `capture`, and the inputs of `verify`'s eager run.
    fn copies(
        &self,
        rt: &Runtime,
        site: &'static GraphSite,
        names: &'static [&'static str],
    ) -> Result<L, GraphError>;
}

macro_rules! static_tuples {
    ($(($($n:tt $b:ident $r:ident),*))*) => {$(
        #[allow(unused_variables, clippy::unused_unit)]
        impl<$($b: StaticBuffer),*> StaticList for ($($b,)*) {
            type Lent<'a> = ($($b::Lent<'a>,)*) where Self: 'a;
            fn lend(&mut self) -> Self::Lent<'_> {
                ($(DeviceState::lend(&mut self.$n),)*)
            }
            fn bytes(&self) -> usize {
                0 $(+ static_bytes(&self.$n))*
            }
            fn register(&self, nodes: &mut InputNodes) {
                $(nodes.add(&self.$n);)*
            }
            fn record(&self, names: &'static [&'static str], book: &mut AddressBook) {
                $(book.record(names[$n], &self.$n, Recorded::Output);)*
            }
            fn check(&self, first: usize, book: &AddressBook, when: When) -> Result<(), GraphError> {
                $(book.check(first + $n, &self.$n, when)?;)*
                Ok(())
            }
            fn outputs_to(
                &self,
                names: &'static [&'static str],
                verifier: &mut Verifier<'_>,
                eager: bool,
            ) -> Result<(), GraphError> {
                $(verifier.output(eager, names[$n], &self.$n)?;)*
                Ok(())
            }
            type Shapes = ($($b::Shape,)*);
            fn alloc(
                rt: &Runtime,
                site: &'static GraphSite,
                names: &'static [&'static str],
                shapes: Self::Shapes,
            ) -> Result<Self, GraphError> {
                Ok(($(alloc_static::<$b>(rt, site, names[$n], shapes.$n)?,)*))
            }
            fn shadows(
                &self,
                rt: &Runtime,
                site: &'static GraphSite,
                names: &'static [&'static str],
            ) -> Result<Self, GraphError> {
                Self::alloc(rt, site, names, ($(self.$n.shape(),)*))
            }
        }

        #[allow(unused_variables)]
        impl<'a, $($b: StaticBuffer, $r: ?Sized + InputSource<$b>),*> Sources<($($b,)*)>
            for ($(&'a $r,)*)
        {
            #[inline]
            fn check_shapes(
                &self,
                dst: &($($b,)*),
                site: &'static GraphSite,
                names: &'static [&'static str],
            ) -> Result<(), GraphError> {
                $(check_shape(site, names[$n], &dst.$n, self.$n)?;)*
                Ok(())
            }
            #[inline]
            fn stage(&self, dst: &mut ($($b,)*), staging: &Staging<'_>) -> Result<(), GraphError> {
                $(feed_input(staging, $n, self.$n, DeviceState::lend(&mut dst.$n))?;)*
                Ok(())
            }
            fn copies(
                &self,
                rt: &Runtime,
                site: &'static GraphSite,
                names: &'static [&'static str],
            ) -> Result<($($b,)*), GraphError> {
                Ok(($(stage_input::<$b, $r>(rt, site, names[$n], self.$n)?,)*))
            }
        }
    )*};
}

/// Calls macro `$m` with the tuples of up to 16 buffers, each element as its index, the
/// name of its buffer's type parameter and that of its source's: what the tuple impls here
/// and in `crate::buckets` are written over.
macro_rules! for_each_tuple {
    ($m:ident) => {
        $m! {
            ()
            (0 B0 R0)
            (0 B0 R0, 1 B1 R1)
            (0 B0 R0, 1 B1 R1, 2 B2 R2)
            (0 B0 R0, 1 B1 R1, 2 B2 R2, 3 B3 R3)
            (0 B0 R0, 1 B1 R1, 2 B2 R2, 3 B3 R3, 4 B4 R4)
            (0 B0 R0, 1 B1 R1, 2 B2 R2, 3 B3 R3, 4 B4 R4, 5 B5 R5)
            (0 B0 R0, 1 B1 R1, 2 B2 R2, 3 B3 R3, 4 B4 R4, 5 B5 R5, 6 B6 R6)
            (0 B0 R0, 1 B1 R1, 2 B2 R2, 3 B3 R3, 4 B4 R4, 5 B5 R5, 6 B6 R6, 7 B7 R7)
            (0 B0 R0, 1 B1 R1, 2 B2 R2, 3 B3 R3, 4 B4 R4, 5 B5 R5, 6 B6 R6, 7 B7 R7, 8 B8 R8)
            (0 B0 R0, 1 B1 R1, 2 B2 R2, 3 B3 R3, 4 B4 R4, 5 B5 R5, 6 B6 R6, 7 B7 R7, 8 B8 R8, 9 B9 R9)
            (0 B0 R0, 1 B1 R1, 2 B2 R2, 3 B3 R3, 4 B4 R4, 5 B5 R5, 6 B6 R6, 7 B7 R7, 8 B8 R8, 9 B9 R9,
             10 B10 R10)
            (0 B0 R0, 1 B1 R1, 2 B2 R2, 3 B3 R3, 4 B4 R4, 5 B5 R5, 6 B6 R6, 7 B7 R7, 8 B8 R8, 9 B9 R9,
             10 B10 R10, 11 B11 R11)
            (0 B0 R0, 1 B1 R1, 2 B2 R2, 3 B3 R3, 4 B4 R4, 5 B5 R5, 6 B6 R6, 7 B7 R7, 8 B8 R8, 9 B9 R9,
             10 B10 R10, 11 B11 R11, 12 B12 R12)
            (0 B0 R0, 1 B1 R1, 2 B2 R2, 3 B3 R3, 4 B4 R4, 5 B5 R5, 6 B6 R6, 7 B7 R7, 8 B8 R8, 9 B9 R9,
             10 B10 R10, 11 B11 R11, 12 B12 R12, 13 B13 R13)
            (0 B0 R0, 1 B1 R1, 2 B2 R2, 3 B3 R3, 4 B4 R4, 5 B5 R5, 6 B6 R6, 7 B7 R7, 8 B8 R8, 9 B9 R9,
             10 B10 R10, 11 B11 R11, 12 B12 R12, 13 B13 R13, 14 B14 R14)
            (0 B0 R0, 1 B1 R1, 2 B2 R2, 3 B3 R3, 4 B4 R4, 5 B5 R5, 6 B6 R6, 7 B7 R7, 8 B8 R8, 9 B9 R9,
             10 B10 R10, 11 B11 R11, 12 B12 R12, 13 B13 R13, 14 B14 R14, 15 B15 R15)
        }
    };
}
pub(crate) use for_each_tuple;

for_each_tuple!(static_tuples);

/// What `#[cuda_graph]` generates for one function: its held state and constants, the types
/// of its static buffers, and how to run the body on them.
#[doc(hidden)]
pub trait GraphBody: Sized {
    /// The body's execution context (`Runtime`, a stream, candle's `Device`).
    type Ctx: ?Sized + FromRuntime;
    /// The static inputs, a tuple of buffers in the function's order.
    type Ins: StaticList;
    /// The outputs, a tuple of buffers in the function's order.
    type Outs: StaticList;
    /// The returned value's slot.
    type Value: ResultSlot;
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

    /// The inputs' names, in order.
    const INPUTS: &'static [&'static str];
    /// The outputs' names, in order.
    const OUTPUTS: &'static [&'static str];
    /// `cfg!(debug_assertions)` in the user's crate.
    const DEBUG: bool;
    /// Which replays verify themselves (see [`VerifySchedule`]): by default replays 1, 2, 4,
    /// 8, … in debug builds.
    const VERIFY_EVERY: u64 = VerifySchedule::default_for(Self::DEBUG);

    /// The tolerance of the self-verifying replays.
    fn tolerance() -> Tolerance {
        Tolerance::BITWISE
    }

    /// The function's name, warmup and capture mode.
    const SITE: GraphSite;

    /// [`GraphBody::SITE`], for the errors and logs that name the graph (a constant's
    /// reference, promoted to a static).
    fn site() -> &'static GraphSite {
        &Self::SITE
    }

    /// Runs the user's function once on `statics` (the graph's static buffers in a warmup
    /// run or the capture, copies and shadows in `verify`'s eager run), its returned value
    /// stored in the result's slot.
    fn run(
        &mut self,
        statics: &mut StaticsOf<Self>,
        ctx: &Self::Ctx,
        rt: &Runtime,
    ) -> Result<(), GraphError>;

    /// Hands each state to `v` in the function's order, with its name and how it is
    /// recorded: the one generated item behind [`GraphBody::record`] and
    /// [`GraphBody::check`]. Nothing without state.
    fn states<V: StateVisitor>(&self, v: &mut V) -> Result<(), GraphError> {
        let _ = v;
        Ok(())
    }

    /// Records the addresses of the state (indices from 0, in order).
    fn record(&self, book: &mut AddressBook) {
        // Recording cannot fail.
        let _ = self.states(&mut book.recorder());
    }

    /// Checks the addresses recorded by [`GraphBody::record`].
    #[inline]
    fn check(&self, book: &AddressBook, when: When) -> Result<(), GraphError> {
        self.states(&mut book.checker(when))
    }

    /// Lends the static input buffers.
    fn inputs_mut(statics: &mut StaticsOf<Self>) -> Self::Inputs<'_>;

    /// Borrows the outputs.
    fn outputs(statics: &StaticsOf<Self>) -> Self::Outputs<'_>;

    /// Lends the state.
    fn state_mut(&mut self) -> Self::State<'_>;

    /// Runs eager island `island` (its code as the capture boxed it) on the graph's static
    /// buffers and state, between two segments of a replay. Generated for a body with islands
    /// (`rt.eager(|| …)`); never called for one without.
    fn island(
        &mut self,
        island: &dyn Any,
        statics: &mut StaticsOf<Self>,
        ctx: &Self::Ctx,
    ) -> Result<(), GraphError> {
        let _ = (island, statics, ctx);
        unreachable!("a body without islands has no island to run")
    }

    /// Whether `island` is one of this body's own island functions (as the capture boxed
    /// it), and not one of another `#[cuda_graph]` function the body calls. Generated for a
    /// body with islands.
    fn owns_island(island: &(dyn Any + Send + Sync)) -> bool {
        let _ = island;
        false
    }

    /// A copy of the state only islands use (`#[island]` parameters, cloned), to put back
    /// with [`GraphBody::restore_islands`] after the warmup and after `verify`'s eager run.
    fn save_islands(&self) -> Option<Box<dyn Any>> {
        None
    }

    /// Puts back what [`GraphBody::save_islands`] copied.
    fn restore_islands(&mut self, saved: Option<Box<dyn Any>>) {
        let _ = saved;
    }
}

/// A body with its static buffers and the address book of its state (indices from 0) and its
/// outputs (from `first_output`): what a [`Recording`] runs on. A single graph holds one per
/// graph; a bucket family one for all its buckets' graphs.
pub(crate) struct Instance<B: GraphBody> {
    pub(crate) book: AddressBook,
    pub(crate) first_output: usize,
    pub(crate) body: B,
    pub(crate) statics: StaticsOf<B>,
}

impl<B: GraphBody> Instance<B> {
    /// `body` on `statics`, the addresses of its state and outputs recorded.
    pub(crate) fn new(body: B, statics: StaticsOf<B>) -> Self {
        let mut book = AddressBook::new(B::site().name);
        body.record(&mut book);
        let first_output = book.len();
        statics.outputs.record(B::OUTPUTS, &mut book);
        Instance {
            book,
            first_output,
            body,
            statics,
        }
    }

    /// Checks that the state and the outputs hold the buffers recorded by
    /// [`Instance::new`].
    pub(crate) fn check(&self, when: When) -> Result<(), GraphError> {
        self.body.check(&self.book, when)?;
        self.statics
            .outputs
            .check(self.first_output, &self.book, when)
    }
}

/// One capture of a body: the graph of its first segment, its eager islands each with the
/// graph of the segment after it, and which of its replays verify themselves. The replay,
/// the islands and `verify` of every generated type, single graph or bucket, are these.
pub(crate) struct Recording {
    graph: Graph,
    /// The body's eager islands, each with the segment after it (none without islands).
    islands: Vec<CapturedIsland>,
    pub(crate) verify: VerifySchedule,
}

impl Recording {
    /// Warms up, captures and instantiates the body of `inst` on its static buffers as they
    /// are (see `crate::capture`); `inputs` are the graph's input copy nodes, `static_bytes`
    /// what its static buffers take.
    pub(crate) fn capture<B: GraphBody>(
        rt: &Runtime,
        inst: &mut Instance<B>,
        inputs: &InputNodes,
        static_bytes: usize,
    ) -> Result<Self, GraphError> {
        let site = B::site();
        // The warmup runs the islands too; what they did to the island state is undone, as
        // the warmup's work on `&mut` state is.
        let island_state = inst.body.save_islands();
        let captured = {
            let Instance {
                book,
                first_output,
                body,
                statics,
            } = &mut *inst;
            let (book, first_output) = (&*book, *first_output);
            let mut run = |step: Step| -> Result<(), GraphError> {
                match step {
                    // The context is taken for each run: a stream context is the capture
                    // stream while the capture records, the runtime's stream otherwise.
                    Step::Run(_) => body.run(statics, B::Ctx::try_from_runtime(rt)?, rt),
                    Step::Check(when) => {
                        body.check(book, when)?;
                        statics.outputs.check(first_output, book, when)
                    }
                }
            };
            crate::capture::capture(
                rt,
                site,
                book,
                inputs,
                static_bytes,
                B::owns_island,
                &mut run,
            )
        };
        inst.body.restore_islands(island_state);
        let captured = captured?;
        inst.statics.result.captured(site)?;
        refuse_kept_temporaries(site, &captured)?;
        Ok(Recording {
            graph: captured.graph,
            islands: captured.islands,
            verify: VerifySchedule::new(B::VERIFY_EVERY, B::tolerance()),
        })
    }

    /// The graph of the body (of its first segment, with eager islands).
    pub(crate) fn graph(&self) -> &Graph {
        &self.graph
    }

    /// Queues `stage` (the input copies into `inst`'s static inputs) and a launch of the
    /// graph, then runs the islands, each followed by its segment.
    #[inline]
    pub(crate) fn replay<B: GraphBody>(
        &self,
        inst: &mut Instance<B>,
        stage: impl FnOnce(&mut B::Ins, &Staging<'_>) -> Result<(), GraphError>,
    ) -> Result<(), GraphError> {
        let dst = &mut inst.statics.inputs;
        replay(&self.graph, |staging| stage(dst, staging))?;
        self.islands_of(&inst.book, &mut inst.body, &mut inst.statics)
    }

    /// A replay with the static inputs as they are.
    #[inline]
    pub(crate) fn launch<B: GraphBody>(&self, inst: &mut Instance<B>) -> Result<(), GraphError> {
        launch_as_is(&self.graph)?;
        self.islands_of(&inst.book, &mut inst.body, &mut inst.statics)
    }

    /// After the first segment's launch: each island's code, then the segment after it.
    fn islands_of<B: GraphBody>(
        &self,
        book: &AddressBook,
        body: &mut B,
        statics: &mut StaticsOf<B>,
    ) -> Result<(), GraphError> {
        if self.islands.is_empty() {
            return Ok(());
        }
        let ctx = B::Ctx::try_from_runtime(self.graph.runtime())?;
        let graph = B::site().name;
        for (k, island) in self.islands.iter().enumerate() {
            let ran = {
                let _span =
                    tracing::trace_span!("cuda_graph_island", graph, island = k + 1).entered();
                body.island(&*island.run, statics, ctx)
                    .map_err(|e| GraphError::Island {
                        graph,
                        island: k + 1,
                        location: island.location,
                        source: Box::new(e),
                    })
            };
            ran?;
            // An island may not replace state that the segments after it read by address
            // (`#[derive(DeviceState)]` state is lent as `&mut`): checked before they launch.
            body.check(book, When::Island { island: k + 1 })?;
            if let Some(after) = &island.after {
                launch_as_is(after)?;
            }
        }
        Ok(())
    }

    /// One replay checked against the eager function: the body runs eagerly on `eager`
    /// (copies of the inputs, shadows of the outputs), what that did to the `&mut` state and
    /// the generators is undone, then the graph replays with `stage` as its input copies;
    /// `outputs_to` gives the verifier what each side wrote (`true`: the eager side).
    pub(crate) fn verify<B: GraphBody>(
        &self,
        inst: &mut Instance<B>,
        mut eager: StaticsOf<B>,
        tolerance: Tolerance,
        stage: impl FnOnce(&mut B::Ins, &Staging<'_>) -> Result<(), GraphError>,
        outputs_to: impl Fn(&StaticsOf<B>, &mut Verifier<'_>, bool) -> Result<(), GraphError>,
    ) -> Result<VerifyReport, GraphError> {
        let site = B::site();
        let rt = self.graph.runtime();
        let Instance {
            book,
            body,
            statics,
            ..
        } = inst;
        let book = &*book;
        let mut verifier = Verifier::begin(rt, book, tolerance)?;
        let ctx = B::Ctx::try_from_runtime(rt)?;
        let island_state = body.save_islands();
        crate::capture::take_failed_island();
        let ran = body.run(&mut eager, ctx, rt);
        body.restore_islands(island_state);
        // An island that fails in the eager run is named as a replay names it.
        let failed = crate::capture::take_failed_island()
            .and_then(|at| Some((self.islands.iter().position(|i| i.location == at)?, at)));
        ran.map_err(|e| match failed {
            Some((k, location)) => GraphError::Island {
                graph: site.name,
                island: k + 1,
                location,
                source: Box::new(e),
            },
            None => e,
        })?;
        outputs_to(&eager, &mut verifier, true)?;
        verifier.rewind()?;
        let dst = &mut statics.inputs;
        replay(&self.graph, |staging| stage(dst, staging))?;
        self.islands_of(book, body, statics)?;
        outputs_to(statics, &mut verifier, false)?;
        // The eager run's copies and shadows are dropped after the comparison.
        drop(eager);
        verifier.finish()
    }

    /// The graphs of the body's segments, in replay order (see [`TypedGraph::segments`]).
    pub(crate) fn segments(&self) -> impl Iterator<Item = &Graph> {
        std::iter::once(&self.graph).chain(self.islands.iter().filter_map(|i| i.after.as_ref()))
    }

    /// Where the body's eager islands are, in replay order.
    pub(crate) fn islands(&self) -> Vec<&'static std::panic::Location<'static>> {
        self.islands.iter().map(|i| i.location).collect()
    }
}

/// The graph's summary: nodes by kind, kernels by name, edges, memory, timings; with
/// islands, segment by segment.
impl std::fmt::Display for Recording {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.islands.is_empty() {
            return std::fmt::Display::fmt(&self.graph, f);
        }
        let segments = self.islands.len() + 1;
        writeln!(f, "segment 1 of {segments}: ")?;
        std::fmt::Display::fmt(&self.graph, f)?;
        for (k, island) in self.islands.iter().enumerate() {
            writeln!(f)?;
            writeln!(f, "island {} at {}: runs eagerly", k + 1, island.location)?;
            match &island.after {
                Some(after) => {
                    writeln!(f, "segment {} of {segments}: ", k + 2)?;
                    std::fmt::Display::fmt(after, f)?;
                }
                None => write!(f, "segment {} of {segments}: empty", k + 2)?,
            }
        }
        Ok(())
    }
}

/// A captured graph of a `#[cuda_graph]` function: its recording, and the function's held
/// state and static buffers with their address book.
#[doc(hidden)]
pub struct TypedGraph<B: GraphBody> {
    recording: Recording,
    inst: Instance<B>,
}

impl<B: GraphBody> TypedGraph<B> {
    /// Warms up, captures and instantiates `body`'s function on `statics` (see
    /// `crate::capture`).
    pub fn capture(rt: &Runtime, body: B, statics: StaticsOf<B>) -> Result<Self, GraphError> {
        let static_bytes = statics.inputs.bytes() + statics.outputs.bytes();
        let mut inst = Instance::new(body, statics);
        let mut inputs = InputNodes::new();
        inst.statics.inputs.register(&mut inputs);
        let recording = match Recording::capture(rt, &mut inst, &inputs, static_bytes) {
            Ok(recording) => recording,
            Err(e @ GraphError::KeptTemporary { .. }) => {
                drop_after_kept(rt, inst);
                return Err(e);
            }
            Err(e) => return Err(e),
        };
        Ok(TypedGraph { recording, inst })
    }

    /// The generated `capture`: each input staged into a static buffer of its own (in the
    /// function's order), each output allocated zeroed at its shape, then
    /// [`TypedGraph::capture`].
    pub fn capture_from<I: Sources<B::Ins>>(
        rt: &Runtime,
        body: B,
        inputs: I,
        outputs: <B::Outs as StaticList>::Shapes,
    ) -> Result<Self, GraphError> {
        let site = B::site();
        refuse_nested(site)?;
        let inputs = inputs.copies(rt, site, B::INPUTS)?;
        let outputs = B::Outs::alloc(rt, site, B::OUTPUTS, outputs)?;
        Self::capture(rt, body, Statics::new(inputs, outputs))
    }

    /// The generated `replay`: verifies the replay when the schedule says so, otherwise
    /// checks the inputs' shapes and the state's addresses, feeds the inputs and launches.
    #[inline]
    pub fn replay_inputs<I: Sources<B::Ins>>(
        &mut self,
        inputs: I,
    ) -> Result<B::Outputs<'_>, GraphError> {
        if let Some((replay, tolerance)) = self.recording.verify.due() {
            let mut report = self.verify_inputs(inputs, tolerance)?;
            report.replay = Some(replay);
            report.into_result()?;
            return Ok(B::outputs(&self.inst.statics));
        }
        inputs.check_shapes(&self.inst.statics.inputs, B::site(), B::INPUTS)?;
        self.inst.body.check(&self.inst.book, When::Replay)?;
        self.recording
            .replay(&mut self.inst, |dst, staging| inputs.stage(dst, staging))?;
        Ok(B::outputs(&self.inst.statics))
    }

    /// The generated `verify`: one replay checked against the eager function on the same
    /// inputs (see the generated method's documentation).
    pub fn verify_inputs<I: Sources<B::Ins>>(
        &mut self,
        inputs: I,
        tolerance: Tolerance,
    ) -> Result<VerifyReport, GraphError> {
        let site = B::site();
        let inst = &mut self.inst;
        inputs.check_shapes(&inst.statics.inputs, site, B::INPUTS)?;
        inst.body.check(&inst.book, When::Replay)?;
        let rt = self.recording.graph.runtime();
        let copies = inputs.copies(rt, site, B::INPUTS)?;
        let shadows = inst.statics.outputs.shadows(rt, site, B::OUTPUTS)?;
        self.recording.verify(
            inst,
            Statics::new(copies, shadows),
            tolerance,
            |dst, staging| inputs.stage(dst, staging),
            |statics, verifier, eager| {
                statics.outputs.outputs_to(B::OUTPUTS, verifier, eager)?;
                statics.result.output_to(verifier, eager)
            },
        )
    }

    /// Launches the graph with the inputs as they are in its static buffers (see
    /// `inputs_mut`): a replay without copies. The state's addresses are checked first, as
    /// in `replay`.
    #[inline]
    pub fn launch(&mut self) -> Result<B::Outputs<'_>, GraphError> {
        self.inst.body.check(&self.inst.book, When::Replay)?;
        self.recording.launch(&mut self.inst)?;
        Ok(B::outputs(&self.inst.statics))
    }

    /// The static input buffers, lent as views to write the next inputs in place.
    pub fn inputs_mut(&mut self) -> B::Inputs<'_> {
        B::inputs_mut(&mut self.inst.statics)
    }

    /// The outputs as the last replay left them.
    pub fn outputs(&self) -> B::Outputs<'_> {
        B::outputs(&self.inst.statics)
    }

    /// The state, lent back between replays: `&mut` state in its `DeviceState::Lent` form (a
    /// `CudaSlice` as a `CudaViewMut`), read-only state as `&T`. When some state lives on a
    /// stream other than the runtime's, this first waits for the replays in flight
    /// ([`Graph::settle`]).
    pub fn state_mut(&mut self) -> B::State<'_> {
        self.recording.graph.settle();
        self.inst.body.state_mut()
    }

    /// Node count, memory and timings of the capture.
    pub fn info(&self) -> &GraphInfo {
        self.recording.graph.info()
    }

    /// The instantiated graph (its facts and raw handles); of a body with eager islands, the
    /// first segment's (see [`TypedGraph::segments`]).
    pub fn graph(&self) -> &Graph {
        &self.recording.graph
    }

    /// The graphs of the body's segments, in replay order: one without islands, one more
    /// than islands with them (`rt.eager(|| …)` in the body), less the segments that
    /// recorded nothing (between two islands in a row, or after an island at the end).
    pub fn segments(&self) -> impl Iterator<Item = &Graph> {
        self.recording.segments()
    }

    /// Where the body's eager islands are, in replay order (empty without islands).
    pub fn islands(&self) -> Vec<&'static std::panic::Location<'static>> {
        self.recording.islands()
    }

    /// `Debug` of the generated type `name` that wraps this graph.
    #[doc(hidden)]
    pub fn fmt_as(&self, name: &str, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct(name)
            .field("info", self.info())
            .finish_non_exhaustive()
    }
}

/// Refuses a capture from inside another capture before anything is staged or allocated
/// (inside a capture that work would be recorded into it).
pub(crate) fn refuse_nested(site: &'static GraphSite) -> Result<(), GraphError> {
    match crate::phase::procedure_of_thread() {
        Some(outer) => Err(GraphError::NestedCapture {
            graph: site.name,
            outer,
        }),
        None => Ok(()),
    }
}

impl<B: GraphBody> std::fmt::Debug for TypedGraph<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.fmt_as("TypedGraph", f)
    }
}

/// The graph's summary: nodes by kind, kernels by name, edges, memory, timings.
impl<B: GraphBody> std::fmt::Display for TypedGraph<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.recording, f)
    }
}

/// `Deref`, `DerefMut`, `Debug` and `Display` of a generated graph type `$graph<'s>`, a
/// wrapper around `TypedGraph<$body<'s>>` (`TypedFamily<$body<'s>>` after `family`), and
/// `Debug` of its views (which show their names only): the impls Rust cannot write
/// generically for a type of the user's crate.
#[doc(hidden)]
#[macro_export]
macro_rules! __graph_type_impls {
    (family $($rest:tt)*) => {
        $crate::__graph_type_impls!(@ TypedFamily $($rest)*);
    };
    (@ $typed:ident $graph:ident, $body:ident, $($view:ident),*) => {
        impl<'s> ::core::ops::Deref for $graph<'s> {
            type Target = $crate::__private::$typed<$body<'s>>;
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
                self.0.fmt_as(::core::stringify!($graph), f)
            }
        }
        /// The summary of the graph (of each graph of a family): nodes by kind, kernels by
        /// name, edges, memory, timings.
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
    ($($rest:tt)*) => {
        $crate::__graph_type_impls!(@ TypedGraph $($rest)*);
    };
}
