//! CUDA C++ sources of the kernels the tests and examples launch, kept in one place.
//!
//! Each constant is one NVRTC compilation unit; [`graph_runtime::Runtime::function`]
//! compiles it once per process and caches the module.

/// Element-wise float kernels. All take the element count `n` last and use a 1-D grid.
pub const ELEMENTWISE: &str = r#"
extern "C" __global__ void add_scalar(const float *x, float *y, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] + a;
}

extern "C" __global__ void add_one_inplace(float *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = y[i] + 1.0f;
}

extern "C" __global__ void mul(const float *a, const float *b, float *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a[i] * b[i];
}

extern "C" __global__ void add(const float *a, const float *b, float *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a[i] + b[i];
}

extern "C" __global__ void tanh_inplace(float *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = tanhf(y[i]);
}

// y[r, c] = gelu(x[r, c] + b[c]) for a row-major rows x cols matrix (tanh approximation).
extern "C" __global__ void bias_gelu(const float *x, const float *b, float *y, int rows, int cols) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < rows * cols) {
        float v = x[i] + b[i % cols];
        float u = 0.7978845608028654f * (v + 0.044715f * v * v * v);
        y[i] = 0.5f * v * (1.0f + tanhf(u));
    }
}
"#;
