//! A linear layer with bias and GELU in one cuBLASLt call: `y = gelu(x · Wᵀ + b)`, FP32
//! throughout (compute type `CUBLAS_COMPUTE_32F`, no TF32), with the `GELU_BIAS` epilogue.
//!
//! cudarc's safe cuBLASLt wrapper computes f32 products in TF32, which is not what PyTorch
//! does by default (`allow_tf32 = False`) and would not match the host reference, so this
//! goes through cudarc's `result` layer. A [`LtLinear`] is a plan for one shape: its
//! descriptors and its algorithm are chosen once, before any capture. cuBLASLt's heuristic
//! proposes up to [`LT_CANDIDATES`] algorithms; the plan times each on the GPU and keeps the
//! heuristic's first pick unless another is faster by more than [`LT_MARGIN`] (the first pick
//! is not always the fastest for these skinny FP32 shapes, and a plain "fastest" flipped
//! between two picks from run to run: on an H200 at batch 1024, the first pick ran the
//! 16-layer MLP in 337 µs and the second in 364 µs, and timing chose either).
//! Eager calls and the captured graph then use the same algorithm, so they agree bit for
//! bit. Its workspace is its own device buffer, fixed for the plan's life, so a
//! call never allocates (a capture could not).
//!
//! cuBLASLt's GELU epilogue is the tanh approximation, the formula of every GELU in
//! [`crate::kernels`].

use std::ffi::c_void;

use graph_runtime::cudarc::cublas::sys::cublasOperation_t as CublasOp;
use graph_runtime::cudarc::cublaslt::result as lt;
use graph_runtime::cudarc::cublaslt::sys;
use graph_runtime::cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};
use graph_runtime::{DeviceState, GraphError, Runtime};

use crate::ops::linear::check_lens;
use crate::testing::{random_vec, seeded_rng};
use crate::timing::gpu_us;

/// Workspace of each plan; what cuBLASLt may use for split-K reductions. Measured on an
/// H100 with 32 MiB and 16 candidates, the timing picked a three-kernel split-K algorithm at
/// batch 4096 that times faster alone and runs 12% slower inside the 16-layer model; 4 MiB
/// keeps the choice among the single-pass ones. On an H200 at batch 1024 the heuristic's
/// first pick takes 336–337 µs for the 16 layers with 0, 1 or 4 MiB, and with 32 MiB it is a
/// three-kernel algorithm that takes 357 µs.
pub const LT_WORKSPACE_BYTES: usize = 4 << 20;
/// Algorithms asked of the heuristic and timed by [`LtLinear::new`].
pub const LT_CANDIDATES: usize = 8;
/// Calls per timing of a candidate (after one untimed call); the median of
/// [`crate::timing::REPEATS`] timings counts.
const TIMED_CALLS: usize = 10;
/// Rounds of timing over all candidates, interleaved so that a GPU still raising its clock
/// does not favour the candidates timed last; each candidate's fastest round counts.
const ROUNDS: usize = 3;
/// How much faster (fraction of its time) another candidate must be than the heuristic's first
/// pick to replace it: below that, timing noise would decide, and the choice would differ
/// from run to run.
pub const LT_MARGIN: f64 = 0.03;

fn lt_err(what: &'static str) -> impl Fn(lt::CublasError) -> GraphError {
    move |e| GraphError::User(format!("cuBLASLt {what}: {e:?}").into())
}

/// The plan of `y[rows, n_out] = gelu(x[rows, k] · W[n_out, k]ᵀ + b[n_out])`, row-major, W
/// stored like PyTorch's `Linear.weight`.
#[derive(DeviceState)]
pub struct LtLinear {
    #[device_state(skip)]
    handle: sys::cublasLtHandle_t,
    #[device_state(skip)]
    desc: sys::cublasLtMatmulDesc_t,
    #[device_state(skip)]
    w_layout: sys::cublasLtMatrixLayout_t,
    #[device_state(skip)]
    x_layout: sys::cublasLtMatrixLayout_t,
    #[device_state(skip)]
    y_layout: sys::cublasLtMatrixLayout_t,
    #[device_state(skip)]
    algo: sys::cublasLtMatmulAlgo_t,
    workspace: CudaSlice<u8>,
    #[device_state(skip)]
    workspace_bytes: usize,
    rows: usize,
    n_out: usize,
    k: usize,
}

// SAFETY: the handle and descriptors are plain host objects with no thread affinity;
// cuBLASLt allows a handle to be used from any thread, and `LtLinear` touches them only
// through `&mut self` or in `Drop`. (Not `Sync`: nothing needs to share one plan.)
unsafe impl Send for LtLinear {}

impl std::fmt::Debug for LtLinear {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LtLinear")
            .field("rows", &self.rows)
            .field("n_out", &self.n_out)
            .field("k", &self.k)
            .finish_non_exhaustive()
    }
}

impl LtLinear {
    /// Makes the descriptors, asks cuBLASLt's heuristic for up to [`LT_CANDIDATES`]
    /// algorithms for this shape and keeps the fastest on this GPU. Allocates a workspace and
    /// waits for the timing runs: call it before capturing.
    pub fn new(rt: &Runtime, rows: usize, n_out: usize, k: usize) -> Result<Self, GraphError> {
        let mut plan = Self::describe(rt, rows, n_out, k, LT_WORKSPACE_BYTES)?;
        let candidates = plan.candidates()?;
        plan.algo = candidates[0];
        if candidates.len() > 1 {
            plan.algo = plan.fastest(rt, &candidates)?;
        }
        Ok(plan)
    }

    /// The plan with the `index`-th algorithm of cuBLASLt's heuristic (0: its first pick) for
    /// a workspace of `workspace_bytes`, untimed; `None` when the heuristic proposes fewer.
    /// For probes that compare algorithms.
    #[doc(hidden)]
    pub fn with_candidate(
        rt: &Runtime,
        rows: usize,
        n_out: usize,
        k: usize,
        workspace_bytes: usize,
        index: usize,
    ) -> Result<Option<Self>, GraphError> {
        let mut plan = Self::describe(rt, rows, n_out, k, workspace_bytes)?;
        let candidates = plan.candidates()?;
        let Some(&algo) = candidates.get(index) else {
            return Ok(None);
        };
        plan.algo = algo;
        Ok(Some(plan))
    }

    /// A second plan of the same shape with the same algorithm (its own descriptors and
    /// workspace): what an eager caller needs to match a graph captured with `self` bit for
    /// bit, since two timing runs may pick different algorithms.
    pub fn duplicate(&self, rt: &Runtime) -> Result<Self, GraphError> {
        let mut plan = Self::describe(rt, self.rows, self.n_out, self.k, self.workspace_bytes)?;
        plan.algo = self.algo;
        Ok(plan)
    }

    /// The handle, workspace and descriptors, with no algorithm chosen yet.
    fn describe(
        rt: &Runtime,
        rows: usize,
        n_out: usize,
        k: usize,
        workspace_bytes: usize,
    ) -> Result<Self, GraphError> {
        let f32_ = sys::cudaDataType_t::CUDA_R_32F;
        let u = |v: usize| v as u64;
        let i = |v: usize| v as i64;
        let workspace = rt.stream().alloc_zeros::<u8>(workspace_bytes.max(256))?;
        let handle = lt::create_handle().map_err(lt_err("create handle"))?;
        let mut plan = LtLinear {
            handle,
            desc: std::ptr::null_mut(),
            w_layout: std::ptr::null_mut(),
            x_layout: std::ptr::null_mut(),
            y_layout: std::ptr::null_mut(),
            // SAFETY: the algorithm is plain data (an opaque array of integers); all zeros is
            // a valid value, replaced by the caller's choice before any matmul.
            algo: unsafe { std::mem::zeroed() },
            workspace,
            workspace_bytes,
            rows,
            n_out,
            k,
        };
        // Column-major view: Yᶜ[n_out, rows] = (Wᶜ[k, n_out])ᵀ · Xᶜ[k, rows], bias per row
        // of Yᶜ, i.e. per output feature.
        plan.desc = lt::create_matmul_desc(sys::cublasComputeType_t::CUBLAS_COMPUTE_32F, f32_)
            .map_err(lt_err("create matmul descriptor"))?;
        plan.w_layout =
            lt::create_matrix_layout(f32_, u(k), u(n_out), i(k)).map_err(lt_err("W layout"))?;
        plan.x_layout =
            lt::create_matrix_layout(f32_, u(k), u(rows), i(k)).map_err(lt_err("x layout"))?;
        plan.y_layout = lt::create_matrix_layout(f32_, u(n_out), u(rows), i(n_out))
            .map_err(lt_err("y layout"))?;
        let trans_a = CublasOp::CUBLAS_OP_T;
        let epilogue = sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_GELU_BIAS;
        // SAFETY: each attribute buffer is a live value of the type and size cuBLASLt
        // documents for that attribute (an operation enum, an epilogue enum); the descriptor
        // was created above and is destroyed only in `Drop`.
        unsafe {
            lt::set_matmul_desc_attribute(
                plan.desc,
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
                (&trans_a as *const CublasOp).cast(),
                std::mem::size_of_val(&trans_a),
            )
            .map_err(lt_err("set transa"))?;
            lt::set_matmul_desc_attribute(
                plan.desc,
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_EPILOGUE,
                (&epilogue as *const sys::cublasLtEpilogue_t).cast(),
                std::mem::size_of_val(&epilogue),
            )
            .map_err(lt_err("set epilogue"))?;
        }
        Ok(plan)
    }

    /// The algorithms cuBLASLt's heuristic proposes for this plan, best guess first.
    fn candidates(&self) -> Result<Vec<sys::cublasLtMatmulAlgo_t>, GraphError> {
        let pref = lt::create_matmul_pref().map_err(lt_err("create preference"))?;
        let ws_bytes = self.workspace_bytes as u64;
        let ws = bytemuck::bytes_of(&ws_bytes);
        // SAFETY: the workspace attribute is a live u64 byte count, its documented type; the
        // heuristic writes at most `LT_CANDIDATES` results into `found`, which holds that
        // many (all-zero is a valid value of the plain C struct), and reports how many in
        // `count`. `pref` is destroyed once, right after use.
        let (status, found, count) = unsafe {
            let set_ws = lt::set_matmul_pref_attribute(
                pref,
                sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                ws.as_ptr().cast(),
                ws.len(),
            );
            let mut found: [sys::cublasLtMatmulHeuristicResult_t; LT_CANDIDATES] =
                std::mem::zeroed();
            let mut count = 0i32;
            let status = set_ws.and_then(|()| {
                sys::cublasLtMatmulAlgoGetHeuristic(
                    self.handle,
                    self.desc,
                    self.w_layout,
                    self.x_layout,
                    self.y_layout,
                    self.y_layout,
                    pref,
                    LT_CANDIDATES as i32,
                    found.as_mut_ptr(),
                    &mut count,
                )
                .result()
            });
            let _ = lt::destroy_matmul_pref(pref);
            (status, found, count)
        };
        status.map_err(lt_err("algorithm heuristic"))?;
        let count = (count.max(0) as usize).min(LT_CANDIDATES);
        let usable: Vec<_> = found[..count]
            .iter()
            .filter(|h| h.state == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS)
            .map(|h| h.algo)
            .collect();
        if usable.is_empty() {
            let (rows, n_out, k) = (self.rows, self.n_out, self.k);
            return Err(GraphError::User(
                format!("cuBLASLt has no FP32 GELU_BIAS algorithm for [{rows}, {k}] → [{rows}, {n_out}]").into(),
            ));
        }
        Ok(usable)
    }

    /// Times each candidate on buffers of the plan's shape holding values in the range of
    /// real activations (zeros would let the GPU clock higher than real data does), in
    /// [`ROUNDS`] interleaved rounds of [`crate::timing::gpu_us`], and returns the heuristic's
    /// first pick (`candidates[0]`) unless the fastest is faster than it by more than
    /// [`LT_MARGIN`]. Queues work on the runtime's stream and waits for it: not inside a
    /// capture.
    fn fastest(
        &mut self,
        rt: &Runtime,
        candidates: &[sys::cublasLtMatmulAlgo_t],
    ) -> Result<sys::cublasLtMatmulAlgo_t, GraphError> {
        graph_runtime::ensure_not_capturing("LtLinear::new (times cuBLASLt algorithms)")?;
        let s = rt.stream();
        let mut rng = seeded_rng(0x17);
        let (rows, n_out, k) = (self.rows, self.n_out, self.k);
        let x = s.clone_htod(&random_vec(&mut rng, rows * k))?;
        let w = s.clone_htod(&random_vec(&mut rng, n_out * k))?;
        let b = s.clone_htod(&random_vec(&mut rng, n_out))?;
        let mut y = s.alloc_zeros::<f32>(rows * n_out)?;
        // An algorithm the heuristic proposed may still refuse this problem: drop it.
        // (µs, index in `candidates`)
        let mut usable = Vec::with_capacity(candidates.len());
        for (i, &algo) in candidates.iter().enumerate() {
            self.algo = algo;
            if self.forward(rt, &x, &w, &b, &mut y).is_ok() {
                usable.push((f64::INFINITY, i));
            }
        }
        for _ in 0..ROUNDS {
            for (us, i) in usable.iter_mut() {
                self.algo = candidates[*i];
                let t = gpu_us(s, TIMED_CALLS, || self.forward(rt, &x, &w, &b, &mut y))?;
                *us = us.min(t);
            }
        }
        Ok(candidates[pick(0, &usable)])
    }

    /// `y = gelu(x · Wᵀ + bias)` on the runtime's stream (capturable: no allocation, no sync).
    ///
    /// # Panics
    /// If a buffer is shorter than the plan's shape needs.
    pub fn forward<X, W, B, Y>(
        &mut self,
        rt: &Runtime,
        x: &X,
        w: &W,
        bias: &B,
        y: &mut Y,
    ) -> Result<(), GraphError>
    where
        X: DevicePtr<f32>,
        W: DevicePtr<f32>,
        B: DevicePtr<f32>,
        Y: DevicePtrMut<f32>,
    {
        let lens = [x.len(), w.len(), bias.len(), y.len()];
        check_lens("LtLinear", self.rows, self.n_out, self.k, lens);
        let s = rt.stream();
        let (xp, _x) = x.device_ptr(s);
        let (wp, _w) = w.device_ptr(s);
        let (bp, _b) = bias.device_ptr(s);
        let (yp, _y) = y.device_ptr_mut(s);
        let (ws, _ws) = self.workspace.device_ptr_mut(s);
        let (alpha, beta) = (1.0f32, 0.0f32);
        let bias_ptr = bytemuck::bytes_of(&bp);
        // SAFETY: the bias attribute is a device pointer (8 bytes) to n_out floats, checked
        // above. The matmul reads n_out·k floats of W, rows·k of x (leading dimension k, as
        // the layouts say) and writes rows·n_out of y; `beta` is 0 so C (= y) is not read.
        // The workspace is this plan's own buffer of the size the heuristic was given, and
        // the stream is the runtime's, in the runtime's context.
        unsafe {
            lt::set_matmul_desc_attribute(
                self.desc,
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                bias_ptr.as_ptr().cast(),
                bias_ptr.len(),
            )
            .map_err(lt_err("set bias"))?;
            lt::matmul(
                self.handle,
                self.desc,
                (&alpha as *const f32).cast(),
                (&beta as *const f32).cast(),
                wp as *const c_void,
                self.w_layout,
                xp as *const c_void,
                self.x_layout,
                yp as *const c_void,
                self.y_layout,
                yp as *mut c_void,
                self.y_layout,
                &self.algo,
                ws as *mut c_void,
                self.workspace_bytes,
                s.cu_stream() as sys::cudaStream_t,
            )
            .map_err(lt_err("matmul"))
        }
    }
}

/// The choice of [`LtLinear::fastest`]: `first` unless the fastest of `timed` (µs, candidate)
/// beats `first`'s time by more than [`LT_MARGIN`]; when `first` was not timed (it refused
/// the problem), the fastest.
fn pick<A: Copy + PartialEq>(first: A, timed: &[(f64, A)]) -> A {
    let Some(&(first_us, _)) = timed.iter().find(|(_, a)| *a == first) else {
        return timed
            .iter()
            .min_by(|a, b| a.0.total_cmp(&b.0))
            .map_or(first, |&(_, a)| a);
    };
    match timed.iter().min_by(|a, b| a.0.total_cmp(&b.0)) {
        Some(&(us, a)) if us < first_us * (1.0 - LT_MARGIN) => a,
        _ => first,
    }
}

impl Drop for LtLinear {
    fn drop(&mut self) {
        // SAFETY: each handle was created by `describe` (the descriptors are null when it
        // failed before making them; those are skipped) and is destroyed once, here. Work queued with them holds no
        // reference to the descriptors after `cublasLtMatmul` returns.
        unsafe {
            for layout in [self.w_layout, self.x_layout, self.y_layout] {
                if !layout.is_null() {
                    let _ = lt::destroy_matrix_layout(layout);
                }
            }
            if !self.desc.is_null() {
                let _ = lt::destroy_matmul_desc(self.desc);
            }
            let _ = lt::destroy_handle(self.handle);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::pick;

    #[test]
    fn the_first_pick_stays_unless_another_is_clearly_faster() {
        // Within the margin: the first pick, whichever timed fastest.
        assert_eq!(pick(0, &[(22.8, 0), (22.5, 1), (30.0, 2)]), 0);
        // Beyond it: the fastest.
        assert_eq!(pick(0, &[(25.0, 0), (22.8, 1), (23.5, 2)]), 1);
        // The first pick timed fastest.
        assert_eq!(pick(0, &[(22.8, 0), (25.1, 1)]), 0);
        // The first pick refused the problem (not timed): the fastest of the rest.
        assert_eq!(pick(0, &[(25.1, 1), (24.0, 2)]), 2);
        assert_eq!(pick(7, &[]), 7);
    }
}
