//! The one-shot all-reduce: small `f32` and `bf16` sums between the ranks of one process,
//! through peer memory, in one kernel per rank.
//!
//! NCCL's all-reduce of a few KiB costs 9–12 µs on two H200s (in a graph, back to back),
//! where a graph of one empty kernel costs 4.2 µs: most of it is protocol, NCCL's kernels
//! staging data through its own buffers and handing it around a ring. When every rank is
//! a thread of this process and every pair of GPUs can read each other's memory, one kernel
//! does it with a single exchange:
//!
//! 1. each rank writes its input into every rank's *stage* (its own slot there): a buffer on
//!    each device with one slot per rank, written by the peers through peer access (remote
//!    writes are posted, where remote reads would wait a round trip each);
//! 2. each block signals every rank ("my part is staged", a flag in the peer's memory written
//!    with release semantics at system scope) and waits for every rank's signal;
//! 3. each rank reads its own stage's slots and sums them in rank order, so every rank
//!    computes the same bits, and writes its output.
//!
//! The flags hold a call counter kept on the device (an epoch per block), so the kernel is
//! the same on every call and replays in a graph; stages alternate between two halves by
//! the counter's parity, so a rank may start the next call while a slower peer still reads
//! the previous one. A rank whose peers never come gives up after the group's timeout,
//! writes NaN and records the failure, rather than spinning forever.
//!
//! Used by [`Communicator::all_reduce`](super::Communicator::all_reduce) and
//! [`all_reduce_in_place`](super::Communicator::all_reduce_in_place) for `f32` and `bf16`
//! sums of at most [`CommGroup::one_shot_limit`](super::CommGroup::one_shot_limit) bytes;
//! everything else goes to NCCL. A `bf16` sum is computed in `f32` in rank order and rounded
//! once (NCCL rounds after each step of its ring): on two ranks the same bits as NCCL's, on
//! more the same bits on every rank.

use std::sync::Arc;

use cudarc::driver::sys::{self as cu, CUdeviceptr};
use cudarc::driver::{CudaContext, CudaFunction, LaunchConfig, PushKernelArg};

use super::comm::Communicator;
use super::sequence::Checkpoint;
use crate::error::GraphError;

/// Blocks of every launch (each signals and waits on its own flags, so every launch has all
/// of them whatever its size).
const BLOCKS: u32 = 32;
/// Threads per block.
const THREADS: u32 = 512;
/// The most ranks the kernel's flags have room for.
pub(crate) const MAX_WORLD: usize = 8;

/// The element types the one-shot kernel sums: `f32`, and `bf16` (summed in `f32` in rank
/// order, rounded once).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Summed {
    F32,
    Bf16,
}

impl Summed {
    /// The one-shot type of NCCL's `dtype`, if it has one.
    pub(crate) fn of(dtype: cudarc::nccl::sys::ncclDataType_t) -> Option<Summed> {
        use cudarc::nccl::sys::ncclDataType_t as D;
        match dtype {
            D::ncclFloat32 => Some(Summed::F32),
            D::ncclBfloat16 => Some(Summed::Bf16),
            _ => None,
        }
    }

    fn bytes(self) -> usize {
        match self {
            Summed::F32 => 4,
            Summed::Bf16 => 2,
        }
    }
}

const SOURCE: &str = r#"
// One kernel body for every element type: T is what the buffers hold, ACC what the sum is
// computed in, LOAD/STORE convert between them (bf16 travels as its 16 bits).
#define ONE_SHOT_SUM(NAME, T, ACC, LOAD, STORE, NAN_BITS)                                      \
extern "C" __global__ void __launch_bounds__(512) NAME(                                         \
    const T *in, T *out, unsigned long long n,                                                  \
    const unsigned long long *table, unsigned int *epochs, unsigned int *status,                \
    int rank, int world, unsigned long long half_bytes, unsigned long long timeout_ns)          \
{                                                                                               \
    __shared__ unsigned int epoch;                                                              \
    __shared__ int timed_out;                                                                   \
    const unsigned int b = blockIdx.x;                                                          \
    if (threadIdx.x == 0) { epoch = epochs[b] + 1u; timed_out = 0; }                            \
    __syncthreads();                                                                            \
    const unsigned int e = epoch;                                                               \
    const unsigned long long parity = (unsigned long long)(e & 1u) * world * half_bytes;        \
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;               \
    const unsigned long long first = (unsigned long long)b * blockDim.x + threadIdx.x;          \
    const unsigned long long slot = parity + (unsigned long long)rank * half_bytes;             \
    for (unsigned long long i = first; i < n; i += stride) {                                    \
        const T v = in[i];                                                                      \
        for (int p = 0; p < world; ++p) ((T *)((char *)table[p] + slot))[i] = v;                \
    }                                                                                           \
    __syncthreads();                                                                            \
    if (threadIdx.x < world) {                                                                  \
        const int peer = threadIdx.x;                                                           \
        unsigned int *theirs = (unsigned int *)table[world + peer] + b * world + rank;          \
        asm volatile("st.release.sys.global.u32 [%0], %1;" :: "l"(theirs), "r"(e) : "memory");  \
        const unsigned int *slot = (const unsigned int *)table[world + rank] + b * world + peer; \
        unsigned long long start, now;                                                          \
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));                               \
        for (;;) {                                                                              \
            unsigned int v;                                                                     \
            asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(slot) : "memory"); \
            if ((int)(v - e) >= 0) break;                                                       \
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));                             \
            if (now - start > timeout_ns) { timed_out = 1; atomicExch(status, 1u); break; }     \
        }                                                                                       \
    }                                                                                           \
    __syncthreads();                                                                            \
    if (timed_out) {                                                                            \
        for (unsigned long long i = first; i < n; i += stride) out[i] = (T)(NAN_BITS);          \
    } else {                                                                                    \
        for (unsigned long long i = first; i < n; i += stride) {                                \
            const char *stage = (const char *)table[rank] + parity;                             \
            ACC acc = LOAD(__ldcg((const T *)stage + i));                                       \
            for (int r = 1; r < world; ++r)                                                     \
                acc += LOAD(__ldcg((const T *)(stage + r * half_bytes) + i));                   \
            out[i] = STORE(acc);                                                                \
        }                                                                                       \
    }                                                                                           \
    if (threadIdx.x == 0) epochs[b] = e;                                                        \
}

__device__ __forceinline__ float f32_load(float x) { return x; }
__device__ __forceinline__ float f32_store(float x) { return x; }
// bf16 is the high half of an f32: widen exactly, narrow with round-to-nearest-even (NaN kept).
__device__ __forceinline__ float bf16_load(unsigned short x) {
    return __uint_as_float(((unsigned int)x) << 16);
}
__device__ __forceinline__ unsigned short bf16_store(float x) {
    unsigned int u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}

ONE_SHOT_SUM(one_shot_sum_f32, float, float, f32_load, f32_store, __int_as_float(0x7fc00000))
ONE_SHOT_SUM(one_shot_sum_bf16, unsigned short, float, bf16_load, bf16_store, 0x7fc0u)
"#;

/// One rank's part of the one-shot all-reduce: its stage, flags and counters, and the table
/// of every rank's stage and flags that its kernel reads.
pub(crate) struct OneShot {
    ctx: Arc<CudaContext>,
    sum_f32: CudaFunction,
    sum_bf16: CudaFunction,
    /// `[stage | flags | epochs | status | table]`, one allocation of this device.
    base: CUdeviceptr,
    table: CUdeviceptr,
    epochs: CUdeviceptr,
    status: CUdeviceptr,
    /// Bytes of one rank's slot in each half of a stage: the most one call reduces.
    half_bytes: usize,
    rank: usize,
    world: usize,
    timeout_ns: u64,
    /// Whether a kernel ran or was recorded (then its status may say that it gave up).
    used: std::cell::Cell<bool>,
}

/// Byte offsets of the parts of one rank's allocation.
struct Layout {
    flags: usize,
    epochs: usize,
    status: usize,
    table: usize,
    total: usize,
}

impl Layout {
    /// `half_bytes`: one slot of one half (a multiple of 4, so every part stays aligned).
    fn new(half_bytes: usize, world: usize) -> Layout {
        // Two halves (by the call counter's parity) of one slot per rank.
        let stage = 2 * world * half_bytes;
        let flags = stage;
        let epochs = flags + BLOCKS as usize * MAX_WORLD * 4;
        let status = epochs + BLOCKS as usize * 4;
        let table = (status + 4).next_multiple_of(8);
        Layout {
            flags,
            epochs,
            status,
            table,
            total: table + 2 * world * 8,
        }
    }
}

impl OneShot {
    /// Sets up rank `comm.rank()`'s part (a host step every rank makes at join): allocates
    /// its memory, enables access to every peer's, and exchanges the addresses. `None`
    /// (after saying why at debug level) when the limit is 0, a pair of devices cannot
    /// reach each other, or any rank failed: the group then uses NCCL for everything.
    pub(crate) fn set_up(comm: &Communicator, limit: usize) -> Result<Option<OneShot>, GraphError> {
        let (rank, world) = (comm.rank(), comm.world_size());
        let rt = comm.runtime();
        let ctx = rt.context().clone();
        // Whole f32s, so that the slots (and the flags after them) stay 4-byte aligned.
        let half_bytes = limit / 4 * 4;
        let mine = if half_bytes == 0 || !(2..=MAX_WORLD).contains(&world) {
            Err("off for this group".to_owned())
        } else {
            Self::allocate(rt, half_bytes, world).map_err(|e| e.to_string())
        };
        let posted = comm.meet_on_host(
            Checkpoint::PeerMemory {
                ready: mine.is_ok(),
                ctx: ctx.cu_ctx() as usize as u64,
                base: *mine.as_ref().unwrap_or(&0),
                ordinal: ctx.ordinal(),
            },
            "while setting up the one-shot all-reduce",
        )?;
        let peers: Vec<(u64, u64, usize)> = posted
            .iter()
            .map(|c| match c {
                Checkpoint::PeerMemory {
                    ready: true,
                    ctx,
                    base,
                    ordinal,
                } => Some((*ctx, *base, *ordinal)),
                _ => None,
            })
            .collect::<Option<_>>()
            .unwrap_or_default();
        let base = match mine {
            Ok(base) => base,
            Err(why) => {
                tracing::debug!(rank, why, "one-shot all-reduce not set up");
                return Ok(None);
            }
        };
        let release = |why: String| {
            tracing::debug!(
                rank,
                why,
                "one-shot all-reduce not set up; NCCL does every all-reduce"
            );
            // SAFETY: `base` came from `malloc_sync` on this context, no kernel uses it yet.
            let _ = ctx
                .bind_to_thread()
                .map(|()| unsafe { cudarc::driver::result::free_sync(base) });
            Ok(None)
        };
        if peers.len() != world {
            return release("a rank could not allocate its memory".to_owned());
        }
        // Every rank must reach every other: ask, then enable, for each peer.
        let mut reachable = true;
        for (r, &(peer_ctx, _, ordinal)) in peers.iter().enumerate() {
            if r == rank {
                continue;
            }
            // SAFETY: `peer_ctx` is the live context of rank `r`, whose runtime (and so its
            // context) outlives this set-up: rank `r` is inside the same join.
            let enabled = unsafe {
                super::raw::enable_peer_access(
                    ctx.ordinal(),
                    ordinal,
                    peer_ctx as usize as cu::CUcontext,
                )
            };
            match enabled {
                Ok(true) => {}
                Ok(false) => reachable = false,
                Err(e) => return release(format!("cuCtxEnablePeerAccess failed: {e:?}")),
            }
        }
        // Every rank learns whether every pair is reachable before anyone launches.
        let agreed = comm.meet_on_host(
            Checkpoint::PeerMemory {
                ready: reachable,
                ctx: 0,
                base: 0,
                ordinal: 0,
            },
            "while setting up the one-shot all-reduce",
        )?;
        if agreed
            .iter()
            .any(|c| matches!(c, Checkpoint::PeerMemory { ready: false, .. }))
        {
            return release("a pair of GPUs cannot access each other's memory".to_owned());
        }
        let layout = Layout::new(half_bytes, world);
        let mut table: Vec<u64> = peers.iter().map(|&(_, b, _)| b).collect();
        table.extend(peers.iter().map(|&(_, b, _)| b + layout.flags as u64));
        let table_ptr = base + layout.table as u64;
        ctx.bind_to_thread()?;
        // SAFETY: `table_ptr` holds `2 · world` u64 in this rank's allocation (the layout).
        unsafe { super::raw::copy_htod_sync(table_ptr, &table) }?;
        let sum_f32 = rt.library_function(SOURCE, "one_shot_sum_f32")?;
        let sum_bf16 = rt.library_function(SOURCE, "one_shot_sum_bf16")?;
        Ok(Some(OneShot {
            ctx,
            sum_f32,
            sum_bf16,
            base,
            table: table_ptr,
            epochs: base + layout.epochs as u64,
            status: base + layout.status as u64,
            half_bytes,
            rank,
            world,
            timeout_ns: comm.group().timeout().as_nanos().min(u64::MAX as u128) as u64,
            used: std::cell::Cell::new(false),
        }))
    }

    /// This rank's memory, zeroed (flags and counters start at 0 on every rank).
    fn allocate(
        rt: &crate::Runtime,
        half_bytes: usize,
        world: usize,
    ) -> Result<CUdeviceptr, GraphError> {
        let layout = Layout::new(half_bytes, world);
        rt.context().bind_to_thread()?;
        // SAFETY: the context is current; plain device memory (not a pool's), so that peer
        // access covers it.
        let base = unsafe { cudarc::driver::result::malloc_sync(layout.total) }?;
        // SAFETY: `base` holds `total` bytes just allocated on the current context.
        if let Err(e) = unsafe { cudarc::driver::result::memset_d8_sync(base, 0, layout.total) } {
            // SAFETY: as above, not used by anything yet.
            let _ = unsafe { cudarc::driver::result::free_sync(base) };
            return Err(e.into());
        }
        Ok(base)
    }

    /// Whether the one-shot kernel takes a sum of `count` elements of `dtype`.
    pub(crate) fn takes(&self, dtype: Summed, count: usize) -> bool {
        count.saturating_mul(dtype.bytes()) <= self.half_bytes
    }

    /// Launches (or records) `recv = Σ send` over the ranks on `stream`.
    ///
    /// # Safety
    /// `send` and `recv` hold `count` elements of `dtype` on this rank's device (they may be
    /// the same), `count` fits ([`OneShot::takes`]), and every other rank makes the same call
    /// next.
    pub(crate) unsafe fn launch(
        &self,
        stream: &cudarc::driver::CudaStream,
        dtype: Summed,
        send: CUdeviceptr,
        recv: CUdeviceptr,
        count: usize,
    ) -> Result<(), GraphError> {
        self.used.set(true);
        let (n, half) = (count as u64, self.half_bytes as u64);
        let (rank, world) = (self.rank as i32, self.world as i32);
        let func = match dtype {
            Summed::F32 => &self.sum_f32,
            Summed::Bf16 => &self.sum_bf16,
        };
        let mut b = stream.launch_builder(func);
        b.arg(&send)
            .arg(&recv)
            .arg(&n)
            .arg(&self.table)
            .arg(&self.epochs)
            .arg(&self.status)
            .arg(&rank)
            .arg(&world)
            .arg(&half)
            .arg(&self.timeout_ns);
        let cfg = LaunchConfig {
            grid_dim: (BLOCKS, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the kernel's parameters in order, by value; it reads `count` of `send`
        // and writes `count` of `recv` (caller), and touches the rank's allocation and the
        // peers' stages and flags, which the table points to and which live until every rank
        // has dropped its part (`OneShot::release`).
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// Whether a kernel of this rank gave up waiting for its peers.
    fn timed_out(&self) -> bool {
        let mut flag = [0u32];
        // SAFETY: `status` is one u32 of this rank's allocation; the stream is drained.
        unsafe { super::raw::copy_dtoh_sync(&mut flag, self.status) }.is_ok() && flag[0] != 0
    }

    /// Frees this rank's memory once no peer can write or read it. Every rank meets the
    /// others here (their streams drained) before freeing; when a rank does not come, the
    /// memory stays allocated (a warning): that rank's last kernel may still write its input
    /// into this rank's stage (at its start, whether or not this rank ever made the call) or
    /// read this rank's flags.
    pub(crate) fn release(self, comm_drained: bool, meet: impl FnOnce() -> bool) {
        let _ = self.ctx.bind_to_thread();
        if self.used.get() && comm_drained && self.timed_out() {
            tracing::error!(
                rank = self.rank,
                "a one-shot all-reduce gave up waiting for the other ranks (they issued \
                 different collectives, or stopped); its output was NaN"
            );
        }
        let met = comm_drained && meet();
        if !met {
            tracing::warn!(
                rank = self.rank,
                "kept the one-shot all-reduce's memory: another rank may still write into it"
            );
            return;
        }
        // SAFETY: `base` came from `malloc_sync` on this context; no kernel of this rank is
        // queued (drained) and every peer has drained too (the meeting).
        if let Err(e) = unsafe { cudarc::driver::result::free_sync(self.base) } {
            tracing::warn!(rank = self.rank, error = ?e, "the one-shot all-reduce's memory could not be freed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parts_of_a_ranks_memory_do_not_overlap_and_the_table_is_aligned() {
        for (half_bytes, world) in [(4, 2), (262_144, 2), (262_144, 8), (12, 5)] {
            let l = Layout::new(half_bytes, world);
            // [stage: two halves × world slots of f32 | flags: blocks × MAX_WORLD u32 | epochs
            //  | status | table]
            assert_eq!(l.flags, 2 * world * half_bytes);
            assert_eq!(l.epochs, l.flags + BLOCKS as usize * MAX_WORLD * 4);
            assert_eq!(l.status, l.epochs + BLOCKS as usize * 4);
            assert!(l.table >= l.status + 4);
            assert_eq!(l.table % 8, 0, "the table holds u64 addresses");
            assert_eq!(l.total, l.table + 2 * world * 8);
        }
    }

    #[test]
    fn the_kernel_indexes_flags_by_block_and_world() {
        // The kernel's flag of block b from rank r sits at b · world + r, which must stay
        // inside the flags' room for every block and the largest world.
        let last = (BLOCKS as usize - 1) * MAX_WORLD + (MAX_WORLD - 1);
        assert!(last < BLOCKS as usize * MAX_WORLD);
        assert!(SOURCE.contains("b * world + rank") && SOURCE.contains("b * world + peer"));
        assert!(SOURCE.contains("__launch_bounds__(512)") && THREADS == 512);
    }
}
