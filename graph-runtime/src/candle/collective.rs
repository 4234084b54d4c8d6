//! Collectives on candle tensors (features `candle` and `nccl`): a tensor-parallel candle
//! model sums its partial results and gathers its shards with the rank's [`Communicator`],
//! eagerly or inside a graph, like any other op.

use std::panic::Location;

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::{CudaDType, CudaStorage};
use candle_core::{CpuStorage, CustomOp1, DType, Layout, Shape, Tensor};
use cudarc::driver::CudaSlice;
use half::{bf16, f16};

use crate::nccl::collective::Operands;
use crate::nccl::sequence::CollectiveOp;
use crate::nccl::{Communicator, ReduceOp};

impl Communicator {
    /// `op` of `t` over every rank, element-wise: a new tensor of `t`'s shape and dtype
    /// (`f32`, `f64`, `bf16`, `f16`, `u8`, `u32` or `i64`; `t` contiguous, on this rank's
    /// device). A `bf16` or `f32` sum small enough for the one-shot kernel takes it (see
    /// [`crate::nccl`]). Every rank makes the same call; inside a graph it is captured like
    /// [`Communicator::all_reduce`].
    #[track_caller]
    pub fn all_reduce_tensor(&self, t: &Tensor, op: ReduceOp) -> candle_core::Result<Tensor> {
        let kind = Kind::Reduce(op);
        t.apply_op1_no_bwd(&TensorCollective::new(self, kind, Location::caller()))
    }

    /// Every rank's `t` stacked along the first dimension in rank order: shape
    /// `(world · d0, d1, …)` (a scalar becomes `(world,)`). Same types and rules as
    /// [`Communicator::all_reduce_tensor`].
    #[track_caller]
    pub fn all_gather_tensor(&self, t: &Tensor) -> candle_core::Result<Tensor> {
        t.apply_op1_no_bwd(&TensorCollective::new(
            self,
            Kind::Gather,
            Location::caller(),
        ))
    }
}

#[derive(Clone, Copy)]
enum Kind {
    Reduce(ReduceOp),
    Gather,
}

/// The collective as a candle op: candle hands it the input's storage and takes the output's.
struct TensorCollective<'c> {
    comm: &'c Communicator,
    kind: Kind,
    location: &'static Location<'static>,
}

impl<'c> TensorCollective<'c> {
    fn new(comm: &'c Communicator, kind: Kind, location: &'static Location<'static>) -> Self {
        TensorCollective {
            comm,
            kind,
            location,
        }
    }

    fn run<T>(&self, s: &CudaStorage, layout: &Layout) -> candle_core::Result<CudaStorage>
    where
        T: CudaDType + cudarc::nccl::NcclType + cudarc::driver::DeviceRepr,
    {
        let Some((start, end)) = layout.contiguous_offsets() else {
            candle_core::bail!(
                "{}: the tensor is not contiguous ({:?}); call `.contiguous()` first",
                self.name(),
                layout.stride()
            )
        };
        let dev = s.device().clone();
        let input = s.as_cuda_slice::<T>()?.slice(start..end);
        let len = match self.kind {
            Kind::Reduce(_) => end - start,
            Kind::Gather => (end - start) * self.comm.world_size(),
        };
        // SAFETY: the collective writes every element of `out` before anything reads it.
        let mut out: CudaSlice<T> = unsafe { dev.alloc::<T>(len) }?;
        let op = match self.kind {
            Kind::Reduce(op) => CollectiveOp::AllReduce(op),
            Kind::Gather => CollectiveOp::AllGather,
        };
        let operands = Operands::Apart(&input, &mut out);
        self.comm
            .collective(self.name(), op, operands, self.location)?;
        Ok(CudaStorage::wrap_cuda_slice(out, dev))
    }
}

impl CustomOp1 for TensorCollective<'_> {
    fn name(&self) -> &'static str {
        match self.kind {
            Kind::Reduce(_) => "all_reduce_tensor",
            Kind::Gather => "all_gather_tensor",
        }
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        candle_core::bail!(
            "{}: the tensor is on the CPU; NCCL collectives take tensors on the rank's GPU",
            self.name()
        )
    }

    fn cuda_fwd(&self, s: &CudaStorage, l: &Layout) -> candle_core::Result<(CudaStorage, Shape)> {
        let storage = match s.dtype() {
            DType::F32 => self.run::<f32>(s, l),
            DType::F64 => self.run::<f64>(s, l),
            DType::BF16 => self.run::<bf16>(s, l),
            DType::F16 => self.run::<f16>(s, l),
            DType::U8 => self.run::<u8>(s, l),
            DType::U32 => self.run::<u32>(s, l),
            DType::I64 => self.run::<i64>(s, l),
            other => candle_core::bail!("{}: NCCL has no {other:?} type", self.name()),
        }?;
        let shape = match self.kind {
            Kind::Reduce(_) => l.shape().clone(),
            Kind::Gather => {
                let mut dims = l.shape().dims().to_vec();
                match dims.first_mut() {
                    Some(d0) => *d0 *= self.comm.world_size(),
                    None => dims.push(self.comm.world_size()),
                }
                Shape::from(dims)
            }
        };
        Ok((storage, shape))
    }
}
