//! The one-shot all-reduce: small `f32` and `bf16` sums between the ranks of one process,
//! through peer memory, in one kernel per rank.
//!
//! NCCL's all-reduce of a few KiB costs 9–12 µs on two H200s (in a graph, back to back),
//! where a graph of one empty kernel costs 4.2 µs: most of it is protocol, NCCL's kernels
//! staging data through its own buffers and handing it around a ring. When every rank is
//! a thread of this process and every pair of GPUs can read each other's memory, one kernel
//! does it with a single exchange:
//!
//! 1. each rank writes its input into every other rank's *stage* (its own slot there): a
//!    buffer on each device with one slot per rank, written by the peers through peer access
//!    (remote writes are posted, where remote reads would wait a round trip each);
//! 2. every 4 bytes of data travel with the call's number beside them, in 8-byte halves that
//!    arrive whole (NCCL's "LL" protocol), so a rank knows its peers' data has come by
//!    reading it: no flag, no fence, no second trip across NVLink;
//! 3. each rank sums its own input and the staged slots in rank order, so every rank
//!    computes the same bits, and writes its output.
//!
//! The call counter is kept on the device (an epoch per block), so the kernel is the same on
//! every call and replays in a graph; stages alternate between two halves by the counter's
//! parity, so a rank may start the next call while a slower peer still reads the previous
//! one. A rank whose peers never come gives up after the group's timeout, writes NaN and
//! records the failure, rather than spinning forever.
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

/// Blocks of every launch (each keeps its own call counter, so every launch has all of them
/// whatever its size).
const BLOCKS: u32 = 32;
/// Threads per block.
const THREADS: u32 = 512;
/// The most ranks a group may have for the one-shot kernel.
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
// The LL ("low latency") exchange: every 16-byte line a rank pushes is {word, epoch, word,
// epoch}, two 8-byte halves that each arrive whole, so a reader knows a word has come when
// the epoch beside it is this call's. No flag, no fence, no second round trip.
//
// A word is one f32, or two bf16 side by side; a line is two words.

__device__ __forceinline__ float bf16_load(unsigned int x) { return __uint_as_float(x << 16); }
// Round to nearest even, NaN kept.
__device__ __forceinline__ unsigned int bf16_store(float x) {
    unsigned int u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x40u;
    u += 0x7fffu + ((u >> 16) & 1u);
    return u >> 16;
}

struct F32 {
    struct Acc { float x; };
    static __device__ __forceinline__ unsigned long long words(unsigned long long n) { return n; }
    static __device__ __forceinline__ unsigned int get(const void *p, unsigned long long n,
                                                       unsigned long long w) {
        return w < n ? ((const unsigned int *)p)[w] : 0u;
    }
    static __device__ __forceinline__ void first(Acc &a, unsigned int v) { a.x = __uint_as_float(v); }
    static __device__ __forceinline__ void add(Acc &a, unsigned int v) { a.x += __uint_as_float(v); }
    static __device__ __forceinline__ void put(void *p, unsigned long long n, unsigned long long w,
                                               const Acc &a) {
        if (w < n) ((float *)p)[w] = a.x;
    }
    static __device__ __forceinline__ void nan(void *p, unsigned long long n, unsigned long long w) {
        if (w < n) ((unsigned int *)p)[w] = 0x7fc00000u;
    }
};

// Elements 2w and 2w + 1, read and written one by one (a bf16 tensor may start at any even
// address); the sum is taken in f32 and rounded once.
struct BF16 {
    struct Acc { float lo, hi; };
    static __device__ __forceinline__ unsigned long long words(unsigned long long n) { return (n + 1) / 2; }
    static __device__ __forceinline__ unsigned int get(const void *p, unsigned long long n,
                                                       unsigned long long w) {
        const unsigned short *h = (const unsigned short *)p;
        unsigned int lo = 2 * w < n ? h[2 * w] : 0u, hi = 2 * w + 1 < n ? h[2 * w + 1] : 0u;
        return lo | (hi << 16);
    }
    static __device__ __forceinline__ void first(Acc &a, unsigned int v) {
        a.lo = bf16_load(v & 0xffffu); a.hi = bf16_load(v >> 16);
    }
    static __device__ __forceinline__ void add(Acc &a, unsigned int v) {
        a.lo += bf16_load(v & 0xffffu); a.hi += bf16_load(v >> 16);
    }
    static __device__ __forceinline__ void put(void *p, unsigned long long n, unsigned long long w,
                                               const Acc &a) {
        unsigned short *h = (unsigned short *)p;
        if (2 * w < n) h[2 * w] = (unsigned short)bf16_store(a.lo);
        if (2 * w + 1 < n) h[2 * w + 1] = (unsigned short)bf16_store(a.hi);
    }
    static __device__ __forceinline__ void nan(void *p, unsigned long long n, unsigned long long w) {
        unsigned short *h = (unsigned short *)p;
        if (2 * w < n) h[2 * w] = 0x7fc0u;
        if (2 * w + 1 < n) h[2 * w + 1] = 0x7fc0u;
    }
};

__device__ __forceinline__ void push(char *dst, unsigned int a, unsigned int b, unsigned int e) {
    asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};"
                 :: "l"(dst), "r"(a), "r"(e), "r"(b), "r"(e) : "memory");
}

// Waits for a line of this call (both halves carry epoch e); false once `late`.
__device__ __forceinline__ bool pull(const char *src, unsigned int e, unsigned int &a,
                                     unsigned int &b, unsigned long long start,
                                     unsigned long long timeout_ns, bool &late) {
    while (!late) {
        unsigned int x, ex, y, ey;
        asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(x), "=r"(ex), "=r"(y), "=r"(ey) : "l"(src) : "memory");
        if (ex == e && ey == e) { a = x; b = y; return true; }
        unsigned long long now;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
        if (now - start > timeout_ns) late = true;
    }
    return false;
}

// `table[p]`: rank p's stage, two halves (by the epoch's parity) of `world` slots of
// `slot_bytes`; rank r's line l of a call sits in slot r of every other rank's stage.
template <class K>
__device__ __forceinline__ void one_shot(
    const void *in, void *out, unsigned long long n, const unsigned long long *table,
    unsigned int *epochs, unsigned int *status, int rank, int world,
    unsigned long long slot_bytes, unsigned long long timeout_ns)
{
    __shared__ unsigned int epoch;
    if (threadIdx.x == 0) epoch = epochs[blockIdx.x] + 1u;
    __syncthreads();
    const unsigned int e = epoch;
    // At least one line even for n = 0: every call must wait for every peer, or a rank could
    // run two calls ahead of a slower one and write into the half it still reads.
    const unsigned long long words = K::words(n), lines = words == 0 ? 1 : (words + 1) / 2;
    const unsigned long long half = (unsigned long long)(e & 1u) * world * slot_bytes;
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    const unsigned long long first = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    const unsigned long long mine = half + (unsigned long long)rank * slot_bytes;
    for (unsigned long long l = first; l < lines; l += stride) {
        const unsigned int a = K::get(in, n, 2 * l), b = K::get(in, n, 2 * l + 1);
        for (int p = 0; p < world; ++p)
            if (p != rank) push((char *)table[p] + mine + 16 * l, a, b, e);
    }
    // Every line of a half is written at least once every `slot_bytes / 16` calls of that
    // half, so an epoch left in a line no call reaches any more cannot come round again (it
    // would take 2^31 calls of the half).
    const unsigned long long refresh = (unsigned long long)(e >> 1) % (slot_bytes / 16);
    if (first == 0 && refresh >= lines)
        for (int p = 0; p < world; ++p)
            if (p != rank) push((char *)table[p] + mine + 16 * refresh, 0u, 0u, e);
    unsigned long long start;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    bool late = false;
    const char *stage = (const char *)table[rank] + half;
    for (unsigned long long l = first; l < lines; l += stride) {
        typename K::Acc lo, hi;
        bool ok = true;
        for (int r = 0; r < world && ok; ++r) {
            unsigned int a, b;
            if (r == rank) {
                a = K::get(in, n, 2 * l);
                b = K::get(in, n, 2 * l + 1);
            } else {
                ok = pull(stage + r * slot_bytes + 16 * l, e, a, b, start, timeout_ns, late);
            }
            if (r == 0) { K::first(lo, a); K::first(hi, b); }
            else { K::add(lo, a); K::add(hi, b); }
        }
        if (ok) {
            K::put(out, n, 2 * l, lo);
            K::put(out, n, 2 * l + 1, hi);
        } else {
            K::nan(out, n, 2 * l);
            K::nan(out, n, 2 * l + 1);
        }
    }
    if (late) atomicExch(status, 1u);
    if (threadIdx.x == 0) epochs[blockIdx.x] = e;
}

#define ONE_SHOT_KERNEL(NAME, K)                                                                 \
extern "C" __global__ void __launch_bounds__(512) NAME(                                         \
    const void *in, void *out, unsigned long long n, const unsigned long long *table,           \
    unsigned int *epochs, unsigned int *status, int rank, int world,                            \
    unsigned long long slot_bytes, unsigned long long timeout_ns)                               \
{ one_shot<K>(in, out, n, table, epochs, status, rank, world, slot_bytes, timeout_ns); }

ONE_SHOT_KERNEL(one_shot_sum_f32, F32)
ONE_SHOT_KERNEL(one_shot_sum_bf16, BF16)
"#;

/// One rank's part of the one-shot all-reduce: its stage and counters, and the table of every
/// rank's stage that its kernel reads.
pub(crate) struct OneShot {
    ctx: Arc<CudaContext>,
    sum_f32: CudaFunction,
    sum_bf16: CudaFunction,
    /// `[stage | epochs | status | table]`, one allocation of this device.
    base: CUdeviceptr,
    table: CUdeviceptr,
    epochs: CUdeviceptr,
    status: CUdeviceptr,
    /// The most bytes one call reduces (a multiple of 8).
    half_bytes: usize,
    rank: usize,
    world: usize,
    timeout_ns: u64,
    /// Whether a kernel ran or was recorded (then its status may say that it gave up).
    used: std::cell::Cell<bool>,
}

/// Byte offsets of the parts of one rank's allocation.
struct Layout {
    /// Bytes of one rank's slot in one half of a stage: `half_bytes` of data, each 4 bytes
    /// with a 4-byte epoch beside them.
    slot: usize,
    epochs: usize,
    status: usize,
    table: usize,
    total: usize,
}

impl Layout {
    /// `half_bytes`: the most bytes one call reduces (a multiple of 8: whole 16-byte lines).
    fn new(half_bytes: usize, world: usize) -> Layout {
        let slot = 2 * half_bytes;
        // Two halves (by the call counter's parity) of one slot per rank.
        let epochs = 2 * world * slot;
        let status = epochs + BLOCKS as usize * 4;
        let table = (status + 4).next_multiple_of(8);
        Layout {
            slot,
            epochs,
            status,
            table,
            total: table + world * 8,
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
        // Whole 16-byte lines of two 4-byte words, so that every part stays aligned.
        let half_bytes = limit / 8 * 8;
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
        let table: Vec<u64> = peers.iter().map(|&(_, b, _)| b).collect();
        let table_ptr = base + layout.table as u64;
        ctx.bind_to_thread()?;
        // SAFETY: `table_ptr` holds `world` u64 in this rank's allocation (the layout).
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

    /// This rank's memory, zeroed (epochs in the stage and counters start at 0 on every rank).
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
        let (n, slot) = (
            count as u64,
            Layout::new(self.half_bytes, self.world).slot as u64,
        );
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
            .arg(&slot)
            .arg(&self.timeout_ns);
        let cfg = LaunchConfig {
            grid_dim: (BLOCKS, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the kernel's parameters in order, by value; it reads `count` of `send`
        // and writes `count` of `recv` (caller), and touches the rank's allocation and the
        // peers' stages, which the table points to and which live until every rank
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
    /// into this rank's stage (at its start, whether or not this rank ever made the call).
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
    fn the_parts_of_a_ranks_memory_do_not_overlap_and_stay_aligned() {
        for (half_bytes, world) in [(8, 2), (262_144, 2), (262_144, 8), (16, 5)] {
            let l = Layout::new(half_bytes, world);
            // [stage: two halves × world slots of 16-byte lines | epochs | status | table]
            assert_eq!(l.slot % 16, 0, "a slot holds whole lines");
            assert_eq!(
                l.slot / 16,
                half_bytes / 8,
                "a line carries 8 bytes of data"
            );
            assert_eq!(l.epochs, 2 * world * l.slot);
            assert_eq!(l.status, l.epochs + BLOCKS as usize * 4);
            assert!(l.table >= l.status + 4);
            assert_eq!(l.table % 8, 0, "the table holds u64 addresses");
            assert_eq!(l.total, l.table + world * 8);
        }
    }

    #[test]
    fn the_kernel_pushes_whole_lines_with_their_epoch() {
        // Each 8-byte half of a line is a word and the epoch, the unit that arrives whole.
        assert!(
            SOURCE.contains("{%1, %2, %3, %4}")
                && SOURCE.contains(r#""r"(a), "r"(e), "r"(b), "r"(e)"#)
        );
        assert!(SOURCE.contains("ex == e && ey == e"));
        assert!(SOURCE.contains("__launch_bounds__(512)") && THREADS == 512);
    }
}
