//! A static KV cache for candle decoders, and the rotary tables read by the same position:
//! see [`StaticKvCache`].

use candle_core::{DType, Device, Result, Tensor, D};

use crate::region::DeviceRegion;
use crate::state::DeviceState;

/// Per-layer key and value tensors of fixed shape `(batch, kv_heads, max_len, head_dim)`,
/// written in place at a position held in a device tensor: one graph for every position.
///
/// candle-transformers' decoders grow their caches with `Tensor::cat`, so every step has new
/// shapes and frees tensors made before it: a capture of such a step is refused
/// ([`GraphError::FreedInCapture`](crate::GraphError::FreedInCapture)), and a graph of one
/// step could serve only one position anyway. This cache keeps, per layer, a key and a
/// value tensor of fixed shape `(batch, kv_heads, max_len, head_dim)` and writes each step's
/// keys and values into them in place (`scatter_set`) at a position held in a device tensor.
/// Attention then always spans the whole cache; the causal-mask row of the position hides
/// what is not written yet. The rotary rows come from [`RotaryTables`] by the same position.
/// Nothing a step does depends on a host value, so one captured step serves every position.
///
/// A candle-transformers-style Llama attention becomes graph-friendly by changing these lines:
///
/// ```ignore
/// // once per step, before the layers: the position `pos` is a `(1,)` u32 tensor on the device
/// let at = cache.at(&pos, seq_len)?;
/// let (cos, sin) = rotary.at(&at)?;                  // was: cache.cos.narrow(0, index_pos, seq_len)
/// // in layer `i`'s attention, after the projections:
/// let q = candle_nn::rotary_emb::rope(&q, &cos, &sin)?;
/// let k = candle_nn::rotary_emb::rope(&k, &cos, &sin)?;
/// let (k, v) = cache.write(i, &at, &k, &v)?;         // was: Tensor::cat(&[cache_k, &k], 2)
/// let att = (q.matmul(&repeat_kv(k)?.t()?)? / (head_dim as f64).sqrt())?;
/// let att = att.broadcast_add(at.mask())?;            // was: masked_fill(.., cache.mask(..))
/// ```
///
/// The position is the caller's to keep below `max_len`: a step's positions must satisfy
/// `pos + seq_len <= max_len`. The cache cannot check a position held on the device without a
/// host synchronisation, and candle's scatter kernel traps (a device assertion, which ends the
/// CUDA context) on an index past the end.
///
/// As a graph's `#[state]` (`&mut StaticKvCache`), `state_mut()` lends it back as
/// `&StaticKvCache`: its contents can be read, written in place and [reset](Self::reset), its
/// tensors cannot be replaced.
#[derive(Debug)]
pub struct StaticKvCache {
    k: Vec<Tensor>,
    v: Vec<Tensor>,
    batch: usize,
    kv_heads: usize,
    max_len: usize,
    head_dim: usize,
    /// `(1, max_len)` u32: 0, 1, …, max_len - 1, what a position is compared with for the mask.
    cols: Tensor,
    /// `(1, 1)` f32 zero and minus infinity: the mask's two values.
    zero: Tensor,
    neg_inf: Tensor,
}

/// The positions one step writes and reads, made by [`StaticKvCache::at`] once per step and
/// used by every layer: the scatter index for the writes and the causal-mask rows.
#[derive(Debug, Clone)]
pub struct CachePosition {
    positions: Tensor,
    index: Tensor,
    mask: Tensor,
}

impl CachePosition {
    /// The step's positions, `(seq_len,)` u32: `pos`, `pos + 1`, ….
    pub fn positions(&self) -> &Tensor {
        &self.positions
    }

    /// The causal-mask rows of the step's positions, `(1, 1, seq_len, max_len)` f32: 0 where
    /// a token may attend (a column at or before its position), minus infinity after it. Add
    /// it to the attention scores (`broadcast_add`) before the softmax; `to_dtype` it for
    /// scores in another dtype.
    pub fn mask(&self) -> &Tensor {
        &self.mask
    }

    /// How many positions the step writes.
    pub fn seq_len(&self) -> usize {
        self.positions.dims1().unwrap_or(0)
    }
}

impl StaticKvCache {
    /// Zeros: `layers` key and value tensors of shape `(batch, kv_heads, max_len, head_dim)`
    /// and dtype `dtype` on `device`.
    pub fn new(
        layers: usize,
        (batch, kv_heads, max_len, head_dim): (usize, usize, usize, usize),
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        if max_len == 0 || max_len > u32::MAX as usize {
            candle_core::bail!(
                "a static KV cache holds 1 to {} positions, not {max_len}",
                u32::MAX
            );
        }
        let shape = (batch, kv_heads, max_len, head_dim);
        let zeros = || Tensor::zeros(shape, dtype, device);
        Ok(StaticKvCache {
            k: (0..layers).map(|_| zeros()).collect::<Result<_>>()?,
            v: (0..layers).map(|_| zeros()).collect::<Result<_>>()?,
            batch,
            kv_heads,
            max_len,
            head_dim,
            cols: Tensor::arange(0u32, max_len as u32, device)?.reshape((1, max_len))?,
            zero: Tensor::zeros((1, 1), DType::F32, device)?,
            neg_inf: Tensor::full(f32::NEG_INFINITY, (1, 1), device)?,
        })
    }

    /// The number of layers.
    pub fn layers(&self) -> usize {
        self.k.len()
    }

    /// The most positions a sequence can have.
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// The shape of every key and value tensor: `(batch, kv_heads, max_len, head_dim)`.
    pub fn dims(&self) -> (usize, usize, usize, usize) {
        (self.batch, self.kv_heads, self.max_len, self.head_dim)
    }

    /// Layer `layer`'s keys, `(batch, kv_heads, max_len, head_dim)`: the tensor itself (a
    /// cheap handle on the same storage), positions not written yet hold zeros or an earlier
    /// sequence's keys.
    pub fn keys(&self, layer: usize) -> Result<&Tensor> {
        self.k.get(layer).ok_or_else(|| self.no_layer(layer))
    }

    /// Layer `layer`'s values, like [`keys`](Self::keys).
    pub fn values(&self, layer: usize) -> Result<&Tensor> {
        self.v.get(layer).ok_or_else(|| self.no_layer(layer))
    }

    fn no_layer(&self, layer: usize) -> candle_core::Error {
        candle_core::Error::Msg(format!(
            "the static KV cache has {} layers, there is no layer {layer}",
            self.k.len()
        ))
    }

    /// The positions of one step of `seq_len` tokens starting at `pos`, a `(1,)` tensor on
    /// the device (u32 or i64; `(1, 1)` and scalars are accepted too): the scatter index for
    /// [`write`](Self::write) and the step's causal-mask rows. Call it once per step, before
    /// the layers; nothing in it reads `pos` on the host, so a graph of the step serves
    /// every position. The caller keeps `pos + seq_len <= max_len` (see [`StaticKvCache`]).
    pub fn at(&self, pos: &Tensor, seq_len: usize) -> Result<CachePosition> {
        if pos.elem_count() != 1 {
            candle_core::bail!(
                "a cache position is one number on the device, got a tensor of shape {:?}",
                pos.dims()
            );
        }
        if seq_len == 0 || seq_len > self.max_len {
            candle_core::bail!(
                "a step writes 1 to {} positions (the cache's length), not {seq_len}",
                self.max_len
            );
        }
        let first = pos.flatten_all()?.to_dtype(DType::U32)?;
        let positions = if seq_len == 1 {
            first
        } else {
            let offsets = Tensor::arange(0u32, seq_len as u32, pos.device())?;
            offsets.broadcast_add(&first)?
        };
        let index = positions
            .reshape((1, 1, seq_len, 1))?
            .broadcast_as((self.batch, self.kv_heads, seq_len, self.head_dim))?
            .contiguous()?;
        // Column j is visible from position p when j <= p.
        let visible = self.cols.broadcast_le(&positions.reshape((seq_len, 1))?)?;
        let shape = (seq_len, self.max_len);
        let mask = visible
            .where_cond(
                &self.zero.broadcast_as(shape)?,
                &self.neg_inf.broadcast_as(shape)?,
            )?
            .reshape((1, 1, seq_len, self.max_len))?;
        Ok(CachePosition {
            positions,
            index,
            mask,
        })
    }

    /// Writes a step's keys and values, each `(batch, kv_heads, seq_len, head_dim)`, into
    /// layer `layer` at the step's positions, in place, and returns the layer's whole key and
    /// value tensors `(batch, kv_heads, max_len, head_dim)` to attend over (with
    /// [`CachePosition::mask`]).
    pub fn write(
        &self,
        layer: usize,
        at: &CachePosition,
        k: &Tensor,
        v: &Tensor,
    ) -> Result<(Tensor, Tensor)> {
        let (ck, cv) = (self.keys(layer)?, self.values(layer)?);
        let want = (self.batch, self.kv_heads, at.seq_len(), self.head_dim);
        for (what, t) in [("keys", k), ("values", v)] {
            if t.dims4().ok() != Some(want) {
                candle_core::bail!(
                    "layer {layer}'s {what} to cache have shape {:?}, the cache takes {:?} \
                     (batch, kv_heads, tokens of the step, head_dim)",
                    t.dims(),
                    [want.0, want.1, want.2, want.3]
                );
            }
            if t.dtype() != ck.dtype() {
                candle_core::bail!(
                    "layer {layer}'s {what} to cache are {:?}, the cache holds {:?}",
                    t.dtype(),
                    ck.dtype()
                );
            }
        }
        ck.scatter_set(&at.index, &k.contiguous()?, 2)?;
        cv.scatter_set(&at.index, &v.contiguous()?, 2)?;
        Ok((ck.clone(), cv.clone()))
    }

    /// Zeros every key and value, in place (for a new sequence; also inside a graph). Not
    /// needed for correctness: a step attends only to positions at or before its own, and
    /// those it or an earlier step of the same sequence wrote.
    pub fn reset(&self) -> Result<()> {
        for t in self.k.iter().chain(&self.v) {
            t.zero_set()?;
        }
        Ok(())
    }
}

/// Rotary tables, `cos` and `sin` of shape `(max_len, head_dim / 2)`, whose rows a step
/// picks by the position held on the device ([`at`](Self::at)).
#[derive(Debug, Clone)]
pub struct RotaryTables {
    cos: Tensor,
    sin: Tensor,
}

impl RotaryTables {
    /// Tables of your own, `(max_len, head_dim / 2)` each, row `p` for position `p`.
    pub fn new(cos: Tensor, sin: Tensor) -> Result<Self> {
        if cos.dims2()? != sin.dims2()? {
            candle_core::bail!(
                "rotary tables of different shapes: cos {:?}, sin {:?}",
                cos.dims(),
                sin.dims()
            );
        }
        Ok(RotaryTables { cos, sin })
    }

    /// Llama's tables (no rope scaling), computed as candle-transformers' `llama::Cache`
    /// computes them, so rows picked here are bitwise its rows: frequencies
    /// `1 / theta^(i / head_dim)` for even `i`, angles `position × frequency` by a device
    /// matmul, then `cos` and `sin` in `dtype`.
    pub fn llama(
        head_dim: usize,
        theta: f32,
        max_len: usize,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let inv_freq: Vec<f32> = (0..head_dim)
            .step_by(2)
            .map(|i| 1f32 / theta.powf(i as f32 / head_dim as f32))
            .collect();
        let n = inv_freq.len();
        let inv_freq = Tensor::new(inv_freq, device)?;
        let angles = Tensor::arange(0, max_len as u32, device)?
            .to_dtype(DType::F32)?
            .reshape((max_len, 1))?
            .matmul(&inv_freq.reshape((1, n))?)?;
        Ok(RotaryTables {
            cos: angles.cos()?.to_dtype(dtype)?,
            sin: angles.sin()?.to_dtype(dtype)?,
        })
    }

    /// The `cos` and `sin` rows of the step's positions, `(seq_len, head_dim / 2)` each, for
    /// `candle_nn::rotary_emb::rope`.
    pub fn at(&self, at: &CachePosition) -> Result<(Tensor, Tensor)> {
        Ok((
            self.cos.index_select(at.positions(), 0)?,
            self.sin.index_select(at.positions(), 0)?,
        ))
    }

    /// `x` `(batch, heads, seq_len, head_dim)` rotated by the step's positions
    /// (`candle_nn::rotary_emb::rope` with the rows of [`at`](Self::at)).
    pub fn apply(&self, x: &Tensor, at: &CachePosition) -> Result<Tensor> {
        let (cos, sin) = self.at(at)?;
        candle_nn::rotary_emb::rope(&x.contiguous()?, &cos, &sin)
    }

    /// The whole tables.
    pub fn tables(&self) -> (&Tensor, &Tensor) {
        (&self.cos, &self.sin)
    }
}

/// The last dimension's argmax of `logits` `(.., vocab)`, kept as a `(.., 1)` u32 tensor on
/// the device: greedy decoding's next token, to feed to the next step without a host read.
pub fn greedy_next(logits: &Tensor) -> Result<Tensor> {
    logits.argmax_keepdim(D::Minus1)
}

// SAFETY: reports every tensor the cache holds (keys, values, the mask's constants), always in
// the same order, each through `Tensor`'s own implementation; the cache owns them for its
// life, and its fields are private: nothing outside this module can replace them, and the
// lent form (`&StaticKvCache`) only writes in place.
unsafe impl DeviceState for StaticKvCache {
    type Lent<'a> = &'a StaticKvCache;

    fn regions(&self, visit: &mut dyn FnMut(DeviceRegion)) {
        for t in self.k.iter().chain(&self.v) {
            t.regions(visit);
        }
        for t in [&self.cols, &self.zero, &self.neg_inf] {
            t.regions(visit);
        }
    }

    fn lend(&mut self) -> &StaticKvCache {
        self
    }
}

// SAFETY: reports the two tables, always in the same order, through `Tensor`'s own
// implementation; the fields are private and the lent form is a shared borrow.
unsafe impl DeviceState for RotaryTables {
    type Lent<'a> = &'a RotaryTables;

    fn regions(&self, visit: &mut dyn FnMut(DeviceRegion)) {
        self.cos.regions(visit);
        self.sin.regions(visit);
    }

    fn lend(&mut self) -> &RotaryTables {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The cache on the CPU: the same ops as on a GPU, so shapes, masks and writes are checked
    // here; tests/candle.rs runs them on a GPU, eager and as a graph.
    #[test]
    fn writes_land_at_the_position_and_the_mask_hides_the_rest() -> Result<()> {
        let dev = Device::Cpu;
        let cache = StaticKvCache::new(2, (1, 2, 6, 4), DType::F32, &dev)?;
        let mut grown_k: Option<Tensor> = None;
        for p in 0..6u32 {
            let at = cache.at(&Tensor::new(&[p], &dev)?, 1)?;
            let k = Tensor::randn(0f32, 1.0, (1, 2, 1, 4), &dev)?;
            let v = Tensor::randn(0f32, 1.0, (1, 2, 1, 4), &dev)?;
            let (ck, _) = cache.write(1, &at, &k, &v)?;
            let grown = match grown_k.take() {
                None => k.clone(),
                Some(g) => Tensor::cat(&[&g, &k], 2)?,
            };
            let written = ck.narrow(2, 0, p as usize + 1)?;
            assert_eq!(
                written.flatten_all()?.to_vec1::<f32>()?,
                grown.flatten_all()?.to_vec1::<f32>()?
            );
            grown_k = Some(grown);
            let mask = at.mask().flatten_all()?.to_vec1::<f32>()?;
            let want: Vec<f32> = (0..6)
                .map(|j| if j <= p { 0.0 } else { f32::NEG_INFINITY })
                .collect();
            assert_eq!(mask, want);
        }
        // Layer 0 was never written.
        assert_eq!(cache.keys(0)?.abs()?.sum_all()?.to_scalar::<f32>()?, 0.0);
        cache.reset()?;
        assert_eq!(cache.keys(1)?.abs()?.sum_all()?.to_scalar::<f32>()?, 0.0);
        Ok(())
    }

    #[test]
    fn a_prefill_writes_consecutive_positions() -> Result<()> {
        let dev = Device::Cpu;
        let cache = StaticKvCache::new(1, (1, 1, 8, 2), DType::F32, &dev)?;
        let at = cache.at(&Tensor::new(&[3u32], &dev)?, 3)?;
        assert_eq!(at.positions().to_vec1::<u32>()?, [3, 4, 5]);
        let k = Tensor::arange(1f32, 7., &dev)?.reshape((1, 1, 3, 2))?;
        cache.write(0, &at, &k, &k)?;
        let row = |p| -> Result<Vec<f32>> {
            cache
                .keys(0)?
                .narrow(2, p, 1)?
                .flatten_all()?
                .to_vec1::<f32>()
        };
        assert_eq!(row(2)?, [0., 0.]);
        assert_eq!(row(3)?, [1., 2.]);
        assert_eq!(row(5)?, [5., 6.]);
        assert_eq!(at.mask().dims(), &[1, 1, 3, 8]);
        let mask = at.mask().squeeze(0)?.squeeze(0)?.to_vec2::<f32>()?;
        assert_eq!(mask[0][3], 0.0);
        assert_eq!(mask[0][4], f32::NEG_INFINITY);
        assert_eq!(mask[2][5], 0.0);
        assert_eq!(mask[2][6], f32::NEG_INFINITY);
        // i64 positions work too; wrong shapes are refused with the shape the cache takes.
        assert!(cache.at(&Tensor::new(&[0i64], &dev)?, 1).is_ok());
        let err = cache.write(0, &at, &k.narrow(2, 0, 2)?, &k).unwrap_err();
        assert!(
            err.to_string().contains("the cache takes [1, 1, 3, 2]"),
            "{err}"
        );
        assert!(cache.at(&Tensor::new(&[0u32, 1], &dev)?, 1).is_err());
        assert!(cache.keys(1).is_err());
        Ok(())
    }

    #[test]
    fn llama_rotary_rows_are_picked_by_position() -> Result<()> {
        let dev = Device::Cpu;
        let rot = RotaryTables::llama(8, 10_000.0, 16, DType::F32, &dev)?;
        let cache = StaticKvCache::new(1, (1, 1, 16, 8), DType::F32, &dev)?;
        let at = cache.at(&Tensor::new(&[5u32], &dev)?, 1)?;
        let (cos, sin) = rot.at(&at)?;
        assert_eq!(cos.dims(), &[1, 4]);
        let (c, s) = (cos.to_vec2::<f32>()?, sin.to_vec2::<f32>()?);
        for i in 0..4 {
            let angle = 5.0 * (1.0 / 10_000f32.powf((2 * i) as f32 / 8.0));
            assert!((c[0][i] - angle.cos()).abs() < 1e-5);
            assert!((s[0][i] - angle.sin()).abs() < 1e-5);
        }
        Ok(())
    }
}
