//! The collectives of a [`Communicator`]: all-reduce, all-gather, reduce-scatter and
//! broadcast, on the runtime's stream, eagerly or captured (see [`crate::nccl`]).

use std::any::type_name;
use std::panic::Location;
use std::sync::OnceLock;

use cudarc::driver::sys::{CUdeviceptr, CUstreamCaptureStatus};
use cudarc::driver::{DevicePtr, DevicePtrMut, DeviceSlice};
use cudarc::nccl::NcclType;

use super::comm::Communicator;
use super::one_shot::Summed;
use super::raw::{self, Buffers};
use super::sequence::{CollectiveCall, CollectiveOp, ReduceOp};
use super::session;
use crate::error::CollectiveError;
use crate::error::GraphError;
use crate::phase::{phase, Phase};

impl Communicator {
    /// `recv = op(send over every rank)`, element-wise; `send` and `recv` have the same
    /// length (they may not overlap; see [`Communicator::all_reduce_in_place`]).
    ///
    /// [`ncclAllReduce`](https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/usage/collectives.html#allreduce)
    #[track_caller]
    pub fn all_reduce<T: NcclType, S: DevicePtr<T>, R: DevicePtrMut<T>>(
        &self,
        send: &S,
        recv: &mut R,
        op: ReduceOp,
    ) -> Result<(), GraphError> {
        let (op, location) = (CollectiveOp::AllReduce(op), Location::caller());
        self.collective("all_reduce", op, Operands::Apart(send, recv), location)
    }

    /// `buf = op(buf over every rank)`, element-wise, in place.
    ///
    /// [`ncclAllReduce`](https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/usage/collectives.html#allreduce)
    #[track_caller]
    pub fn all_reduce_in_place<T: NcclType, B: DevicePtrMut<T>>(
        &self,
        buf: &mut B,
        op: ReduceOp,
    ) -> Result<(), GraphError> {
        let (op, location) = (CollectiveOp::AllReduce(op), Location::caller());
        self.collective("all_reduce_in_place", op, Operands::InPlace(buf), location)
    }

    /// `recv = [send of rank 0, send of rank 1, …]`: every rank's `send` gathered in rank
    /// order; `recv` holds `send.len() × world_size()` elements.
    ///
    /// [`ncclAllGather`](https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/usage/collectives.html#allgather)
    #[track_caller]
    pub fn all_gather<T: NcclType, S: DevicePtr<T>, R: DevicePtrMut<T>>(
        &self,
        send: &S,
        recv: &mut R,
    ) -> Result<(), GraphError> {
        let (op, location) = (CollectiveOp::AllGather, Location::caller());
        self.collective("all_gather", op, Operands::Apart(send, recv), location)
    }

    /// `recv = block r of op(send over every rank)` on rank `r`: the reduction split into
    /// `world_size()` equal blocks, one per rank; `send` holds `recv.len() × world_size()`
    /// elements.
    ///
    /// [`ncclReduceScatter`](https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/usage/collectives.html#reducescatter)
    #[track_caller]
    pub fn reduce_scatter<T: NcclType, S: DevicePtr<T>, R: DevicePtrMut<T>>(
        &self,
        send: &S,
        recv: &mut R,
        op: ReduceOp,
    ) -> Result<(), GraphError> {
        let (op, location) = (CollectiveOp::ReduceScatter(op), Location::caller());
        self.collective("reduce_scatter", op, Operands::Apart(send, recv), location)
    }

    /// `buf = buf of rank root`, on every rank, in place.
    ///
    /// [`ncclBroadcast`](https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/usage/collectives.html#broadcast)
    #[track_caller]
    pub fn broadcast<T: NcclType, B: DevicePtrMut<T>>(
        &self,
        buf: &mut B,
        root: usize,
    ) -> Result<(), GraphError> {
        if root >= self.world_size() {
            return Err(CollectiveError::RankOutOfRange {
                rank: root,
                world: self.world_size(),
            }
            .into());
        }
        let (op, location) = (CollectiveOp::Broadcast { root }, Location::caller());
        self.collective("broadcast", op, Operands::InPlace(buf), location)
    }

    /// The path of every collective: checks the buffers' lengths for `op` and their device,
    /// admits the call ([`Communicator::admit`]), then issues it with the buffers borrowed
    /// on the runtime's stream.
    pub(crate) fn collective<T: NcclType>(
        &self,
        name: &'static str,
        op: CollectiveOp,
        operands: Operands<'_, T>,
        location: &'static Location<'static>,
    ) -> Result<(), GraphError> {
        let count = match &operands {
            Operands::Apart(send, recv) => {
                let (world, sent, received) = (self.world_size(), send.len(), recv.len());
                // (which buffer, its length, the length `op` needs, the element count)
                let (which, got, want, count) = match op {
                    CollectiveOp::AllGather => ("the receive buffer", received, sent * world, sent),
                    CollectiveOp::ReduceScatter(_) => {
                        ("the send buffer", sent, received * world, received)
                    }
                    CollectiveOp::AllReduce(_) | CollectiveOp::Broadcast { .. } => {
                        ("the receive buffer", received, sent, sent)
                    }
                };
                self.expect_len(name, location, which, got, want)?;
                self.expect_device(name, location, *send)?;
                self.expect_device(name, location, *recv)?;
                count
            }
            Operands::InPlace(buf) => {
                self.expect_device(name, location, *buf)?;
                buf.len()
            }
        };
        let call = self.admit::<T>(name, op, count, location)?;
        let stream = self.runtime().stream();
        match operands {
            Operands::Apart(send, recv) => {
                let (src, _read) = send.device_ptr(stream);
                let (dst, _write) = recv.device_ptr_mut(stream);
                self.issue::<T>(&call, src, dst)
            }
            Operands::InPlace(buf) => {
                let (ptr, _write) = buf.device_ptr_mut(stream);
                self.issue::<T>(&call, ptr, ptr)
            }
        }
    }

    fn expect_len(
        &self,
        op: &'static str,
        location: &'static Location<'static>,
        which: &str,
        got: usize,
        want: usize,
    ) -> Result<(), GraphError> {
        if got == want {
            return Ok(());
        }
        Err(CollectiveError::Shape {
            op,
            rank: self.rank(),
            detail: format!("{which} holds {got} elements where {want} are needed"),
            location,
        }
        .into())
    }

    fn expect_device<T>(
        &self,
        op: &'static str,
        location: &'static Location<'static>,
        buf: &(impl DeviceSlice<T> + ?Sized),
    ) -> Result<(), GraphError> {
        let ordinal = self.runtime().context().ordinal();
        let buffer_ordinal = buf.stream().context().ordinal();
        if buffer_ordinal == ordinal {
            return Ok(());
        }
        Err(CollectiveError::WrongDevice {
            op,
            rank: self.rank(),
            ordinal,
            buffer_ordinal,
            location,
        }
        .into())
    }

    /// Decides whether the collective may be issued now, given what this thread is doing:
    ///
    /// * eagerly: not into another thread's capture of the stream, and not after graphs when
    ///   NCCL's graph-mixing support is off;
    /// * in a warmup run: only inside [`Communicator::capture`], after the other ranks have
    ///   shown the same collective at the same point;
    /// * while capturing: only inside [`Communicator::capture`] and on the stream being
    ///   captured; the call is recorded for the comparison before instantiation.
    fn admit<T>(
        &self,
        name: &'static str,
        op: CollectiveOp,
        count: usize,
        location: &'static Location<'static>,
    ) -> Result<CollectiveCall, GraphError> {
        let call = CollectiveCall {
            op,
            dtype: type_name::<T>(),
            count,
            group: self.group_id(),
            location: location.into(),
        };
        let status = || {
            self.runtime()
                .stream()
                .capture_status()
                .map_err(GraphError::from)
        };
        let active = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE;
        match phase() {
            Phase::Eager => {
                if status()? == active {
                    return Err(CollectiveError::EagerDuringCapture {
                        op: name,
                        rank: self.rank(),
                        location,
                    }
                    .into());
                }
                if graph_mixing_disabled() && self.has_captured() {
                    return Err(CollectiveError::GraphMixingDisabled {
                        op: name,
                        rank: self.rank(),
                        location,
                    }
                    .into());
                }
            }
            Phase::Warmup { graph, run } => {
                self.expect_session(name, "warming up", graph, location)?;
                session::warmup_collective(self.group_id(), graph, run, call)?;
            }
            Phase::Capture { graph } => {
                self.expect_session(name, "capturing", graph, location)?;
                // Not capturing at all (an invalidated capture is reported by CUDA itself).
                if status()? == CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
                    return Err(CollectiveError::NotOnCaptureStream {
                        op: name,
                        graph,
                        ordinal: self.runtime().context().ordinal(),
                        location,
                    }
                    .into());
                }
                session::record_captured(self.group_id(), graph, call);
                self.mark_captured();
            }
        }
        Ok(call)
    }

    fn expect_session(
        &self,
        op: &'static str,
        phase: &'static str,
        graph: &'static str,
        location: &'static Location<'static>,
    ) -> Result<(), GraphError> {
        if session::has(self.group_id()) {
            return Ok(());
        }
        Err(CollectiveError::OutsideCapture {
            op,
            phase,
            graph,
            graph_type: upper_camel(graph),
            location,
        }
        .into())
    }

    /// Enqueues (or records) the admitted collective.
    fn issue<T: NcclType>(
        &self,
        call: &CollectiveCall,
        send: CUdeviceptr,
        recv: CUdeviceptr,
    ) -> Result<(), GraphError> {
        let stream = self.runtime().stream();
        stream.context().bind_to_thread()?;
        if let (CollectiveOp::AllReduce(ReduceOp::Sum), Some(one_shot)) = (call.op, &self.one_shot)
        {
            let summed = Summed::of(T::as_nccl_type()).filter(|&d| one_shot.takes(d, call.count));
            if let Some(dtype) = summed {
                // SAFETY: `dtype` is `T`'s (f32 or bf16); the buffers hold `call.count`
                // elements on this rank's device (checked above), within the kernel's size
                // (`takes`); every rank issues its collectives in the same order (the
                // sessions check captured ones), so the peers make the same call next.
                return unsafe { one_shot.launch(stream, dtype, send, recv, call.count) };
            }
        }
        let buffers = Buffers {
            send,
            recv,
            count: call.count,
            dtype: T::as_nccl_type(),
        };
        // SAFETY: the communicator is alive (owned by `self`) and used from its own thread
        // (`Communicator` is neither `Send` nor `Sync`); it was made on this runtime's device,
        // whose context is bound just above, and `stream` is that runtime's. The pointers come
        // from buffers of that device (`expect_device`) whose lengths were checked against
        // `call.count` for this operation (`expect_len`), borrowed by the caller for the call;
        // a captured call reads them on every replay, and the graph's owner keeps them (its
        // state and static buffers) for the graph's life.
        unsafe { raw::issue(call.op, buffers, self.raw(), stream.cu_stream()) }
            .map_err(|e| raw::error(nccl_name(call.op), self.rank(), e, Some(self.raw())))
    }
}

/// The buffers of one collective: a send and a receive buffer, or one buffer read and written
/// in place.
pub(crate) enum Operands<'b, T> {
    Apart(&'b dyn DevicePtr<T>, &'b mut dyn DevicePtrMut<T>),
    InPlace(&'b mut dyn DevicePtrMut<T>),
}

/// NCCL's name of the function behind `op`.
fn nccl_name(op: CollectiveOp) -> &'static str {
    match op {
        CollectiveOp::AllReduce(_) => "ncclAllReduce",
        CollectiveOp::AllGather => "ncclAllGather",
        CollectiveOp::ReduceScatter(_) => "ncclReduceScatter",
        CollectiveOp::Broadcast { .. } => "ncclBroadcast",
    }
}

/// Whether `NCCL_GRAPH_MIXING_SUPPORT=0` turned off NCCL's support for eager collectives
/// while a graph launch of the same communicator is outstanding (read once per process).
fn graph_mixing_disabled() -> bool {
    static OFF: OnceLock<bool> = OnceLock::new();
    *OFF.get_or_init(|| std::env::var("NCCL_GRAPH_MIXING_SUPPORT").is_ok_and(|v| v.trim() == "0"))
}

/// `tp_mlp` → `TpMlp`: the graph type `#[cuda_graph]` makes from a function name.
fn upper_camel(name: &str) -> String {
    name.split('_')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let mut c = p.chars();
            c.next()
                .map(|f| f.to_uppercase().chain(c).collect::<String>())
                .unwrap_or_default()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn graph_types_are_named_like_the_macro_names_them() {
        assert_eq!(upper_camel("tp_mlp"), "TpMlp");
        assert_eq!(upper_camel("train_step_dp"), "TrainStepDp");
        assert_eq!(upper_camel("step"), "Step");
    }

    #[test]
    fn every_op_has_its_nccl_name() {
        assert_eq!(
            nccl_name(CollectiveOp::AllReduce(ReduceOp::Avg)),
            "ncclAllReduce"
        );
        assert_eq!(
            nccl_name(CollectiveOp::Broadcast { root: 1 }),
            "ncclBroadcast"
        );
    }
}
