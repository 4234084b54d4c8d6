//! A linear layer with bias and GELU on cuBLASLt: `y = gelu(x · Wᵀ + b)`, FP32 throughout
//! (compute type `CUBLAS_COMPUTE_32F`, no TF32): the GEMM with cuBLASLt's `BIAS` epilogue,
//! then a GELU kernel in place ([`LtEpilogue::BiasThenGelu`], what PyTorch's `Linear` +
//! `GELU` run), or the GEMM with the `GELU_BIAS` epilogue ([`LtEpilogue::GeluBias`]).
//!
//! Which is faster depends on cuBLASLt: on an H200 (FP32, 512 features) it runs `GELU_BIAS`
//! as a second, generic epilogue kernel after the GEMM, while `BIAS` is folded into the GEMM
//! kernel itself; so both take two kernels a layer, and the plain GELU kernel is the faster
//! second one (16-layer MLP, batch 1024: see `04-mlp-inference`). PyTorch shows the same:
//! its `_addmm_activation(use_gelu=True)`, the `GELU_BIAS` path, ran 342.5 µs against 332.6 µs
//! for its `addmm` + GELU in the same run.
//!
//! cudarc's safe cuBLASLt wrapper computes f32 products in TF32, which is not what PyTorch
//! does by default (`allow_tf32 = False`) and would not match the host reference, so this
//! goes through cudarc's `result` layer. A [`LtLinear`] is a plan for one shape: its
//! descriptors and its algorithm are chosen once, before any capture. The algorithm is the
//! first pick of cuBLASLt's heuristic, untimed, as PyTorch's cuBLASLt path takes it. Timing
//! the heuristic's candidates one layer at a time chose worse for the model than the first
//! pick (H200, 16-layer MLP, GPU µs per replay): at batch 1024 the second candidate (365 µs
//! against 337 µs; one layer alone timed it faster), at batch 1 the fifth (77.7 against
//! 72.7 µs); the first pick was never slower in the model.
//! Eager calls and the captured graph then use the same algorithm, so they agree bit for
//! bit. Its workspace is its own device buffer, fixed for the plan's life, so a
//! call never allocates (a capture could not).
//!
//! cuBLASLt's GELU epilogue is the tanh approximation, the formula of every GELU in
//! [`crate::kernels`] (`gelu_inplace4` is the kernel of `BiasThenGelu`).

use std::ffi::c_void;

use graph_runtime::cudarc::cublas::sys::cublasOperation_t as CublasOp;
use graph_runtime::cudarc::cublaslt::result as lt;
use graph_runtime::cudarc::cublaslt::sys;
use graph_runtime::cudarc::driver::{CudaFunction, CudaSlice, DevicePtr, DevicePtrMut};
use graph_runtime::{DeviceState, GraphError, Runtime};

use crate::kernels::ELEMENTWISE;
use crate::ops::linear::check_lens;
use crate::ops::{elems, Launch};

/// Workspace of each plan; what cuBLASLt may use for split-K reductions. With 32 MiB (and the
/// GELU_BIAS epilogue) the heuristic's first pick at batch 1024 is a split-K algorithm (three
/// kernels a layer) that runs the 16-layer MLP in 357–360 µs on an H200, against 336–338 µs
/// for the single-pass pick it makes with 0, 1 or 4 MiB; 4 MiB keeps the choice among the
/// single-pass ones.
pub const LT_WORKSPACE_BYTES: usize = 4 << 20;
/// Algorithms asked of the heuristic: [`LtLinear::with_candidate`] picks among them.
pub const LT_CANDIDATES: usize = 8;

fn lt_err(what: &'static str) -> impl Fn(lt::CublasError) -> GraphError {
    move |e| GraphError::User(format!("cuBLASLt {what}: {e:?}").into())
}

/// How a plan adds the bias and applies the GELU (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LtEpilogue {
    /// cuBLASLt's `BIAS` epilogue, then the `gelu_inplace4` kernel on the output: what
    /// PyTorch's `Linear` + `GELU` run, and the faster on an H200. [`LtLinear::new`]'s.
    BiasThenGelu,
    /// cuBLASLt's `GELU_BIAS` epilogue: one cuBLASLt call.
    GeluBias,
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
    /// Which of the heuristic's candidates `algo` is (0: its first pick).
    #[device_state(skip)]
    pick: usize,
    /// The GELU kernel of [`LtEpilogue::BiasThenGelu`], looked up once (`None`: the plan
    /// is [`LtEpilogue::GeluBias`]).
    #[device_state(skip)]
    gelu: Option<CudaFunction>,
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
    /// Makes the descriptors and takes cuBLASLt heuristic's first pick for this shape and a
    /// workspace of [`LT_WORKSPACE_BYTES`] (see the module docs). Allocates the workspace:
    /// call it before capturing.
    pub fn new(rt: &Runtime, rows: usize, n_out: usize, k: usize) -> Result<Self, GraphError> {
        let mut plan = Self::describe(
            rt,
            (rows, n_out, k),
            LT_WORKSPACE_BYTES,
            LtEpilogue::BiasThenGelu,
        )?;
        plan.algo = plan.candidates()?[0];
        plan.pick = 0;
        Ok(plan)
    }

    /// The plan with `epilogue` and the `index`-th algorithm of cuBLASLt's heuristic (0: its
    /// first pick) for a workspace of `workspace_bytes`, untimed; `None` when the heuristic
    /// proposes fewer. For probes that compare algorithms.
    #[doc(hidden)]
    pub fn with_candidate(
        rt: &Runtime,
        (rows, n_out, k): (usize, usize, usize),
        workspace_bytes: usize,
        epilogue: LtEpilogue,
        index: usize,
    ) -> Result<Option<Self>, GraphError> {
        let mut plan = Self::describe(rt, (rows, n_out, k), workspace_bytes, epilogue)?;
        let candidates = plan.candidates()?;
        let Some(&algo) = candidates.get(index) else {
            return Ok(None);
        };
        plan.algo = algo;
        plan.pick = index;
        Ok(Some(plan))
    }

    /// A second plan of the same shape with the same algorithm (its own descriptors and
    /// workspace): what an eager caller needs to match a graph captured with `self` bit for
    /// bit (a plan of [`LtLinear::with_candidate`] may run another algorithm than `new`'s).
    pub fn duplicate(&self, rt: &Runtime) -> Result<Self, GraphError> {
        let shape = (self.rows, self.n_out, self.k);
        let mut plan = Self::describe(rt, shape, self.workspace_bytes, self.epilogue())?;
        plan.algo = self.algo;
        plan.pick = self.pick;
        Ok(plan)
    }

    /// The handle, workspace and descriptors, with no algorithm chosen yet.
    fn describe(
        rt: &Runtime,
        (rows, n_out, k): (usize, usize, usize),
        workspace_bytes: usize,
        epilogue: LtEpilogue,
    ) -> Result<Self, GraphError> {
        let f32_ = sys::cudaDataType_t::CUDA_R_32F;
        let u = |v: usize| v as u64;
        let i = |v: usize| v as i64;
        let workspace = rt.stream().alloc_zeros::<u8>(workspace_bytes.max(256))?;
        let gelu = match epilogue {
            LtEpilogue::BiasThenGelu => Some(rt.function(ELEMENTWISE, "gelu_inplace4")?),
            LtEpilogue::GeluBias => None,
        };
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
            pick: 0,
            gelu,
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
        let epilogue = match epilogue {
            LtEpilogue::BiasThenGelu => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS,
            LtEpilogue::GeluBias => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_GELU_BIAS,
        };
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
                format!(
                    "cuBLASLt has no FP32 {:?} algorithm for [{rows}, {k}] → [{rows}, {n_out}]",
                    self.epilogue()
                )
                .into(),
            ));
        }
        Ok(usable)
    }

    /// How the plan adds the bias and applies the GELU.
    pub fn epilogue(&self) -> LtEpilogue {
        match self.gelu {
            Some(_) => LtEpilogue::BiasThenGelu,
            None => LtEpilogue::GeluBias,
        }
    }

    /// Which of cuBLASLt's heuristic candidates the plan runs (0: the heuristic's first pick).
    pub fn candidate(&self) -> usize {
        self.pick
    }

    /// The algorithm the plan runs, as cuBLASLt configures it: its id, tile, stages, split-K
    /// count (1: one pass), reduction scheme and CTA swizzling. For reports that say why two
    /// runs or two libraries differ.
    pub fn algorithm(&self) -> String {
        use sys::cublasLtMatmulAlgoConfigAttributes_t as A;
        let read = |attr: A| {
            let mut value = 0u32;
            let mut written = 0usize;
            // SAFETY: `self.algo` is a live algorithm value; each of these attributes is a
            // 32-bit integer, written into `value` (4 bytes), its size into `written`.
            let status = unsafe {
                sys::cublasLtMatmulAlgoConfigGetAttribute(
                    &self.algo,
                    attr,
                    (&mut value as *mut u32).cast(),
                    std::mem::size_of::<u32>(),
                    &mut written,
                )
            };
            match status {
                sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS => value.to_string(),
                _ => "?".to_owned(),
            }
        };
        format!(
            "algo {} tile {} stages {} split-K {} reduction {} swizzle {}",
            read(A::CUBLASLT_ALGO_CONFIG_ID),
            read(A::CUBLASLT_ALGO_CONFIG_TILE_ID),
            read(A::CUBLASLT_ALGO_CONFIG_STAGES_ID),
            read(A::CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
            read(A::CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME),
            read(A::CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING),
        )
    }

    /// The workspace cuBLASLt may use, in bytes.
    pub fn workspace_bytes(&self) -> usize {
        self.workspace_bytes
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
        {
            // The buffers' event guards live until the matmul is queued.
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
                .map_err(lt_err("matmul"))?;
            }
        }
        let Some(gelu) = &self.gelu else {
            return Ok(());
        };
        let n = self.rows * self.n_out;
        let launch = Launch::of(rt, gelu, "gelu_inplace4")
            .write("y", y, n)
            .int(n);
        // SAFETY: thread t of the kernel reads and writes y[4t .. min(4t + 4, n)), and the
        // grid covers n / 4 threads rounded up: n floats of `y`, which holds them (checked
        // above).
        unsafe { launch.launch(elems(n.div_ceil(4))) }
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
