//! Where a captured construct is recorded ([`Site`]): the scratch recording that checks a
//! construct's branches, the conditional node and its bodies, and the node kinds CUDA
//! forbids in a conditional body.

use super::construct::{Branches, Construct};
use super::record::{with_record, NodeRecord};
use super::*;
use crate::recorded::RecordedGraph;

/// Where a captured construct is recorded.
pub(super) struct Site<'a> {
    pub(super) rt: &'a Runtime,
    pub(super) construct: Construct,
    pub(super) graph: &'static str,
    pub(super) location: &'static Location<'static>,
    pub(super) mode: sys::CUstreamCaptureMode,
    pub(super) stream: sys::CUstream,
}

/// How the scratch recording of a construct's branches ended, when it did not pass.
pub(super) enum Refused {
    Error(GraphError),
    Panic(Box<dyn std::any::Any + Send>),
}

impl Site<'_> {
    pub(super) fn body_error(&self, source: GraphError) -> GraphError {
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
    pub(super) fn driver_error(&self, step: &'static str, e: DriverError) -> GraphError {
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
    pub(super) fn record(
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
                let _inside = FrameScope::conditional();
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
    pub(super) fn check(&self, unbounded: bool, record: &mut Branches<'_>) -> Result<(), Refused> {
        // An error cudarc recorded before this check belongs to the enclosing capture: kept
        // aside while the scratch recording runs and put back after it.
        let earlier = self.rt.take_recorded_error();
        let result = self.check_scratch(unbounded, record);
        if let Some(e) = earlier {
            self.rt.context().record_err(Err::<(), _>(e));
        }
        result
    }

    fn check_scratch(&self, unbounded: bool, record: &mut Branches<'_>) -> Result<(), Refused> {
        // SAFETY: the stream is the runtime's, not capturing (paused by the caller), on the
        // context bound to this thread.
        unsafe { driver::begin_capture(self.stream, self.mode) }
            .map_err(|e| Refused::Error(self.driver_error("beginning the scratch recording", e)))?;
        with_record(|r| {
            if r.validating == 0 {
                r.inline_tested.clear();
            }
            r.validating += 1;
        });
        let ran = {
            let _inside = FrameScope::conditional();
            panic::catch_unwind(AssertUnwindSafe(|| {
                (0..self.construct.bodies() as usize).try_for_each(|i| record(self.rt, i))
            }))
        };
        with_record(|r| r.validating -= 1);
        // SAFETY: the stream is capturing the scratch graph, begun above on this thread.
        let ended = unsafe { RecordedGraph::end_capture(self.stream) };
        // Errors cudarc recorded meanwhile (a buffer's free that failed) belong to the scratch
        // recording.
        if let Some(e) = self.rt.take_recorded_error() {
            tracing::debug!(error = ?e, "cleared an error recorded while checking a conditional body");
        }
        let (ended, verdict) = match ended {
            // The scratch graph is read, then destroyed as it drops.
            Ok(Some(scratch)) => (Ok(()), forbidden_nodes(scratch.raw())),
            Ok(None) => (Ok(()), Ok((None, 0))),
            Err(e) => (Err(e), Ok((None, 0))),
        };
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
    pub(super) fn resume(
        &self,
        parent: sys::CUgraph,
        deps: &[sys::CUgraphNode],
    ) -> Result<(), GraphError> {
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
pub(super) fn forbidden_nodes(graph: sys::CUgraph) -> Result<(Option<String>, usize), DriverError> {
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
pub(super) fn forbidden_kind(kind: sys::CUgraphNodeType) -> Option<&'static str> {
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
