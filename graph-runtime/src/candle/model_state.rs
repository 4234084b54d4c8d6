//! [`ModelState`]: a model the runtime cannot see into (one from another crate, such as
//! candle-transformers' `BertModel` or `llama::Llama`), held as a graph's state under a contract
//! that holds.

use candle_core::Tensor;
use candle_nn::VarMap;

use crate::region::DeviceRegion;
use crate::state::DeviceState;

/// A model of another crate as a graph's `#[state]`, with the tensors it reads.
///
/// The orphan rule keeps you from implementing [`DeviceState`] for a type of another crate,
/// and `#[device_state(skip)]` on a field holding such a model tells the runtime that the
/// field holds no device memory: the runtime then checks and protects nothing of it, and a
/// model or a cache replaced through `state_mut()` is replayed with the addresses of the old
/// one. A `ModelState` is the sanctioned way instead. **The contract:** the wrapper owns the
/// model and a handle on every tensor you list as what it reads (its weights: every variable
/// of its `VarMap` with [`from_varmap`](Self::from_varmap), or a list with [`new`](Self::new))
/// or writes in place ([`writing`](Self::writing)), so their storage lives as long as the
/// graph, whatever happens to the model; and it lends the model back between replays only as
/// `&M` (`state_mut()` gives `&M` also for `&mut ModelState<M>` state), so safe code cannot
/// replace the model or, through it, what it reads: a replacement is a compile error. The
/// graph records the listed tensors' addresses and checks them after every warmup run and
/// after the capture, like any state's ([`GraphError::StateMoved`] on a mismatch); candle
/// never moves a tensor's storage (in-place writes and `Var::set` keep it), so no per-replay
/// check is needed. Read tensors are recorded by address only: nothing of them is snapshotted
/// around the warmup and `verify` does not compare them, which is what a model whose
/// `forward` takes `&mut self` but writes no weights needs; written tensors are snapshotted
/// and compared like any `&mut` state. What the contract cannot cover: a model that hands out
/// interior mutability (a `Mutex` or `RefCell` of tensors) can have them replaced through
/// `&M`, and the graph keeps reading the listed old storage; keep such parts out of the
/// model (use a [`StaticKvCache`](super::StaticKvCache)). Inside the body the model is yours
/// as `&mut M` ([`model_mut`](Self::model_mut), for a `forward(&mut self)`).
///
/// [`GraphError::StateMoved`]: crate::GraphError::StateMoved
///
/// ```no_run
/// use graph_runtime::candle::candle_core::{DType, Device, Module, Result, Tensor};
/// use graph_runtime::candle::candle_nn::{linear, Linear, VarBuilder, VarMap};
/// use graph_runtime::candle::ModelState;
/// use graph_runtime::{cuda_graph, Runtime};
///
/// // `Linear` stands for any model of another crate (candle-transformers' `BertModel`, ...).
/// #[cuda_graph(warmup = 2)]
/// fn layer(dev: &Device, x: &Tensor, #[state] m: &mut ModelState<Linear>) -> Result<Tensor> {
///     let _ = dev;
///     m.model().forward(x)
/// }
///
/// fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
///     let dev = Device::new_cuda(0)?;
///     let rt = Runtime::from_candle(&dev)?;
///     let varmap = VarMap::new();
///     let model = linear(64, 64, VarBuilder::from_varmap(&varmap, DType::F32, &dev))?;
///     let x = Tensor::zeros((1, 64), DType::F32, &dev)?;
///     let mut graph = LayerGraph::capture(&rt, &x, ModelState::from_varmap(model, &varmap))?;
///     let y = graph.replay(&x)?;
///     let _ = y;
///     let lent: &Linear = graph.state_mut().m; // the model, lent back as a shared borrow
///     let _ = lent;
///     Ok(())
/// }
/// ```
///
/// Replacing the model between replays does not compile (the compile-time half of the
/// contract):
///
/// ```compile_fail,E0594
/// use graph_runtime::candle::candle_core::{DType, Device, Module, Result, Tensor};
/// use graph_runtime::candle::candle_nn::{linear, Linear, VarBuilder, VarMap};
/// use graph_runtime::candle::ModelState;
/// use graph_runtime::{cuda_graph, Runtime};
///
/// // `Linear` stands for any model of another crate (candle-transformers' `BertModel`, ...).
/// #[cuda_graph(warmup = 2)]
/// fn layer(dev: &Device, x: &Tensor, #[state] m: &mut ModelState<Linear>) -> Result<Tensor> {
///     let _ = dev;
///     m.model().forward(x)
/// }
///
/// fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
///     let dev = Device::new_cuda(0)?;
///     let rt = Runtime::from_candle(&dev)?;
///     let varmap = VarMap::new();
///     let model = linear(64, 64, VarBuilder::from_varmap(&varmap, DType::F32, &dev))?;
///     let x = Tensor::zeros((1, 64), DType::F32, &dev)?;
///     let mut graph = LayerGraph::capture(&rt, &x, ModelState::from_varmap(model, &varmap))?;
///     let y = graph.replay(&x)?;
///     let _ = y;
///     let other = linear(64, 64, VarBuilder::from_varmap(&varmap, DType::F32, &dev))?;
///     *graph.state_mut().m = other;
///     Ok(())
/// }
/// ```
#[derive(Debug)]
pub struct ModelState<M> {
    model: M,
    reads: Vec<Tensor>,
    writes: Vec<Tensor>,
}

impl<M> ModelState<M> {
    /// `model` and the tensors it reads (its weights), compared by address before every
    /// replay, never snapshotted or verified.
    pub fn new(model: M, reads: impl IntoIterator<Item = Tensor>) -> Self {
        ModelState {
            model,
            reads: reads.into_iter().collect(),
            writes: Vec::new(),
        }
    }

    /// `model` and every variable of the `VarMap` it was loaded from as what it reads, in
    /// the order of their names (the order must not change between captures and replays).
    pub fn from_varmap(model: M, varmap: &VarMap) -> Self {
        let data = varmap.data().lock().unwrap_or_else(|p| p.into_inner());
        let mut vars: Vec<(&String, &candle_core::Var)> = data.iter().collect();
        vars.sort_by(|a, b| a.0.cmp(b.0));
        let reads = vars.into_iter().map(|(_, v)| v.as_tensor().clone());
        let reads: Vec<Tensor> = reads.collect();
        drop(data);
        ModelState::new(model, reads)
    }

    /// Adds tensors the model writes in place (a static cache of its own): snapshotted around
    /// the warmup when the state is `&mut`, and compared by `verify`.
    pub fn writing(mut self, writes: impl IntoIterator<Item = Tensor>) -> Self {
        self.writes.extend(writes);
        self
    }

    /// The model.
    pub fn model(&self) -> &M {
        &self.model
    }

    /// The model for a `forward(&mut self)`, in the body (between replays `state_mut()` lends
    /// only [`model`](Self::model)'s `&M`).
    pub fn model_mut(&mut self) -> &mut M {
        &mut self.model
    }

    /// The tensors listed as read.
    pub fn reads(&self) -> &[Tensor] {
        &self.reads
    }

    /// The tensors listed as written.
    pub fn writes(&self) -> &[Tensor] {
        &self.writes
    }

    /// The model, given back.
    pub fn into_inner(self) -> M {
        self.model
    }
}

// SAFETY: reports every tensor the wrapper holds, always in the same order (read tensors in
// the order listed, then written ones): written tensors with their whole storage through
// `Tensor`'s own implementation, read tensors by their storage's address alone (a region of
// no bytes, which the address check compares and snapshots and verification skip: the graph
// does not write them). The wrapper keeps every listed tensor's storage alive for its life,
// its fields are private, and it lends the model only as `&M`, so safe code cannot replace a
// listed tensor between replays (hence no replay check).
unsafe impl<M> DeviceState for ModelState<M> {
    type Lent<'a>
        = &'a M
    where
        M: 'a;

    /// The lent `&M` cannot replace a listed tensor and the wrapper keeps each one's storage
    /// alive, so replays skip the comparison (the checks after the warmup and the capture
    /// stay).
    const REPLAY_CHECK: bool = false;

    fn regions(&self, visit: &mut dyn FnMut(DeviceRegion)) {
        for t in &self.reads {
            t.regions(&mut |r| visit(DeviceRegion::handle(r.ptr)));
        }
        for t in &self.writes {
            t.regions(visit);
        }
    }

    fn lend(&mut self) -> &M {
        &self.model
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};
    use candle_nn::VarBuilder;

    #[test]
    fn a_varmap_gives_every_variable_in_name_order() -> candle_core::Result<()> {
        let varmap = VarMap::new();
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
        let b = candle_nn::linear(4, 3, vb.pp("b"))?;
        let a = candle_nn::linear_no_bias(3, 2, vb.pp("a"))?;
        let mut held = ModelState::from_varmap((a, b), &varmap);
        let dims: Vec<Vec<usize>> = held.reads().iter().map(|t| t.dims().to_vec()).collect();
        // a.weight, b.bias, b.weight
        assert_eq!(dims, [vec![2, 3], vec![3], vec![3, 4]]);
        assert_eq!(held.reads()[0].id(), held.model().0.weight().id());
        // Lent as `&M`: what `state_mut()` gives cannot replace the model.
        let lent: &(candle_nn::Linear, candle_nn::Linear) = held.lend();
        assert_eq!(lent.1.weight().dims(), &[3, 4]);
        // Host tensors hold no device memory: nothing to report.
        let mut n = 0;
        held.regions(&mut |_| n += 1);
        assert_eq!(n, 0);
        let cache = Tensor::zeros(4, DType::F32, &Device::Cpu)?;
        let held = held.writing([cache]);
        assert_eq!(held.writes().len(), 1);
        Ok(())
    }
}
