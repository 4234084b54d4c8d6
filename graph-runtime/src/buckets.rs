//! Shape buckets: one graph per batch size, captured largest first, sharing their buffers.
//!
//! A graph has fixed shapes. `#[cuda_graph(buckets(batch = [1, 2, 4, 8]))]` captures one
//! graph per bucket; a replay with batch `b` runs the graph of the smallest bucket `>= b`:
//! its `b` rows of input are copied in, the rows up to the bucket are zero-filled (so the
//! padded rows compute the same thing every time), and only the first `b` rows of each
//! output are handed out.
//!
//! Memory is that of the largest bucket, not the sum:
//! * the static inputs and outputs are one buffer each, sized for the largest bucket; every
//!   bucket's graph reads and writes a prefix of it ([`BatchedSlot`]);
//! * the temporaries of all buckets live in the runtime's graph memory pool, and because all
//!   graphs of a runtime launch on one stream, one after another, CUDA backs them with the
//!   same physical memory. Capturing the largest bucket first sizes the pool once.
//!
//! Replaying two buckets at the same time on different streams, which would corrupt the
//! shared buffers, cannot be written: a family replays through `&mut self` on its runtime's
//! single stream.

use std::cell::Cell;
use std::mem::ManuallyDrop;
use std::ops::{Deref, DerefMut};
use std::time::Instant;

use cudarc::driver::{CudaSlice, CudaView, DevicePtr, DeviceRepr, ValidAsZeroBits};

use crate::buffer::{InputSource, Staging};
use crate::error::GraphError;
use crate::graph::Graph;
use crate::runtime::Runtime;
use crate::site::{GraphSite, Step};
use crate::state::AddressBook;

/// A `CudaSlice` over rows of a [`BatchedSlot`]'s buffer, lent to the body of a bucket
/// family during warmup and capture (and to an eager call above the buckets).
///
/// It borrows the slot, so it cannot outlive it, and it never frees the slot's memory. A
/// body may still assign a new buffer through the `&mut CudaSlice` it was given: that drops
/// (frees) the slot's memory. The alias notices: [`Alias::finish`] reports it as
/// [`GraphError::StateMoved`], the slot stops owning the freed memory (no double free), and
/// the body's own buffer is freed normally.
#[doc(hidden)]
pub struct Alias<'a, T> {
    slice: ManuallyDrop<CudaSlice<T>>,
    ptr: u64,
    owner_freed: &'a Cell<bool>,
}

impl<T> std::fmt::Debug for Alias<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Alias")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("len", &self.slice.len())
            .finish_non_exhaustive()
    }
}

impl<T> Deref for Alias<'_, T> {
    type Target = CudaSlice<T>;
    fn deref(&self) -> &CudaSlice<T> {
        &self.slice
    }
}

impl<T> DerefMut for Alias<'_, T> {
    fn deref_mut(&mut self) -> &mut CudaSlice<T> {
        &mut self.slice
    }
}

impl<T> Alias<'_, T> {
    fn replaced(&self) -> bool {
        let (ptr, _sync) = self.slice.device_ptr(self.slice.stream());
        ptr != self.ptr
    }

    /// Checks that the body left the alias in place; see the type's docs.
    pub fn finish(
        &self,
        graph: &'static str,
        param: &'static str,
        when: crate::error::When,
    ) -> Result<(), GraphError> {
        if self.replaced() {
            return Err(GraphError::StateMoved {
                graph,
                param,
                when,
                detail: "the body assigned a new buffer to its `&mut` parameter, which freed the \
                         family's buffer"
                    .to_owned(),
            });
        }
        Ok(())
    }
}

impl<T> Drop for Alias<'_, T> {
    fn drop(&mut self) {
        // SAFETY: taken exactly once, here.
        let slice = unsafe { ManuallyDrop::take(&mut self.slice) };
        if self.replaced_by(&slice) {
            // The body replaced the alias: the slot's memory was freed by that assignment,
            // and `slice` is the body's own buffer, freed normally.
            self.owner_freed.set(true);
            drop(slice);
        } else {
            // Still the alias: give the pointer up without freeing; the slot owns it.
            let _ = slice.leak();
        }
    }
}

impl<T> Alias<'_, T> {
    fn replaced_by(&self, slice: &CudaSlice<T>) -> bool {
        let (ptr, _sync) = slice.device_ptr(slice.stream());
        ptr != self.ptr
    }
}

/// Device buffers that can be batched along their leading dimension in a bucket family:
/// `CudaSlice<T>` holding rows of `T`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be an input or output of a bucketed `#[cuda_graph]`",
    label = "inputs and outputs of a bucket family must be `CudaSlice<T>`, batched along their first dimension"
)]
#[doc(hidden)]
pub trait BatchBuffer {
    /// The element type.
    type Elem: DeviceRepr + ValidAsZeroBits + 'static;
}

impl<T: DeviceRepr + ValidAsZeroBits + 'static> BatchBuffer for CudaSlice<T> {
    type Elem = T;
}

/// One batched input or output of a bucket family: rows of `row` elements, one buffer sized
/// for the largest bucket whose prefixes serve the smaller ones.
#[doc(hidden)]
pub struct BatchedSlot<T> {
    owner: ManuallyDrop<CudaSlice<T>>,
    /// Set when a body freed the owner's memory by assigning through an alias.
    owner_freed: Cell<bool>,
    row: usize,
    name: &'static str,
    /// Used when a batch larger than every bucket runs eagerly (`fallback = "eager"`); grown
    /// on demand, never touched by a graph.
    overflow: Option<CudaSlice<T>>,
    overflow_freed: Cell<bool>,
}

impl<T> std::fmt::Debug for BatchedSlot<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchedSlot")
            .field("name", &self.name)
            .field("row", &self.row)
            .field("len", &self.owner.len())
            .finish_non_exhaustive()
    }
}

impl<T> Drop for BatchedSlot<T> {
    fn drop(&mut self) {
        // SAFETY: taken exactly once, here.
        let owner = unsafe { ManuallyDrop::take(&mut self.owner) };
        if self.owner_freed.get() {
            let _ = owner.leak();
        }
        if self.overflow_freed.get() {
            if let Some(o) = self.overflow.take() {
                let _ = o.leak();
            }
        }
    }
}

impl<T: DeviceRepr + ValidAsZeroBits + 'static> BatchedSlot<T> {
    /// Allocates the zeroed buffer for `rows` rows of `row` elements (the largest bucket).
    pub fn new(
        rt: &Runtime,
        site: &'static GraphSite,
        name: &'static str,
        row: usize,
        rows: usize,
    ) -> Result<Self, GraphError> {
        let owner = crate::buffer::alloc_static::<CudaSlice<T>>(rt, site, name, row * rows)?;
        Ok(BatchedSlot {
            owner: ManuallyDrop::new(owner),
            owner_freed: Cell::new(false),
            row,
            name,
            overflow: None,
            overflow_freed: Cell::new(false),
        })
    }

    /// Elements per row.
    pub fn row(&self) -> usize {
        self.row
    }

    /// Bytes of device memory the slot holds for its graphs.
    pub fn bytes(&self) -> usize {
        self.owner.len() * std::mem::size_of::<T>()
    }

    /// The buffer of the graphs, unless a body freed it (then the family was refused and
    /// nothing may touch the memory again).
    fn owner(&self) -> &CudaSlice<T> {
        assert!(
            !self.owner_freed.get(),
            "the buffer of `{}` was freed by a body that replaced its parameter; the bucket family \
             that owned it was refused and cannot be used",
            self.name
        );
        &self.owner
    }

    fn alias_of<'a>(buf: &'a CudaSlice<T>, len: usize, freed: &'a Cell<bool>) -> Alias<'a, T> {
        assert!(len <= buf.len(), "an alias lies within its buffer");
        let (ptr, _sync) = buf.device_ptr(buf.stream());
        Alias {
            // SAFETY: `ptr .. ptr + len` lies within `buf`, which outlives the alias (it is
            // borrowed for `'a`); the alias never frees it (see `Alias`'s drop).
            slice: ManuallyDrop::new(unsafe { buf.stream().upgrade_device_ptr::<T>(ptr, len) }),
            ptr,
            owner_freed: freed,
        }
    }

    /// A `CudaSlice` over the first `rows` rows, for the body during warmup and capture.
    pub fn alias(&self, rows: usize) -> Alias<'_, T> {
        Self::alias_of(self.owner(), rows * self.row, &self.owner_freed)
    }

    /// How many rows `src` holds; its length must be a whole number of rows.
    pub fn rows_of<S: InputSource<CudaSlice<T>> + ?Sized>(
        &self,
        graph: &'static str,
        src: &S,
    ) -> Result<usize, GraphError> {
        let len = src.shape();
        if self.row == 0 || len % self.row != 0 {
            return Err(GraphError::InputShape {
                graph,
                input: self.name,
                expected: format!("a multiple of {} (rows of {} elements)", self.row, self.row),
                got: len.to_string(),
            });
        }
        Ok(len / self.row)
    }

    /// Copies `rows` rows from `src` into the bucket of `bucket` rows and zero-fills the
    /// padding rows, on the staging stream.
    pub fn stage<S: InputSource<CudaSlice<T>> + ?Sized>(
        &mut self,
        src: &S,
        rows: usize,
        bucket: usize,
        staging: &Staging<'_>,
    ) -> Result<(), GraphError> {
        let (valid, padded) = (rows * self.row, bucket * self.row);
        self.owner();
        src.copy_into(self.owner.slice_mut(0..valid), staging)?;
        if padded > valid {
            staging
                .stream()
                .memset_zeros(&mut self.owner.slice_mut(valid..padded))?;
        }
        Ok(())
    }

    /// For a batch above every bucket: makes room for `rows` rows outside the graphs'
    /// memory and returns a `CudaSlice` over them, with `src` copied in (on `staging`'s
    /// stream) when it is an input.
    pub fn eager_alias<S: InputSource<CudaSlice<T>> + ?Sized>(
        &mut self,
        rt: &Runtime,
        rows: usize,
        src: Option<(&S, &Staging<'_>)>,
    ) -> Result<Alias<'_, T>, GraphError> {
        let len = rows * self.row;
        if self.overflow_freed.get() || self.overflow.as_ref().is_none_or(|o| o.len() < len) {
            if self.overflow_freed.replace(false) {
                if let Some(o) = self.overflow.take() {
                    let _ = o.leak();
                }
            }
            self.overflow = Some(rt.stream().alloc_zeros::<T>(len)?);
        }
        let buf = self.overflow.as_mut().expect("allocated above");
        if let Some((src, staging)) = src {
            src.copy_into(buf.slice_mut(0..len), staging)?;
        }
        Ok(Self::alias_of(
            self.overflow.as_ref().expect("allocated above"),
            len,
            &self.overflow_freed,
        ))
    }

    /// For a batch above every bucket: room for `rows` rows of output outside the graphs'
    /// memory, as a `CudaSlice` for the eager call.
    pub fn eager_output(&mut self, rt: &Runtime, rows: usize) -> Result<Alias<'_, T>, GraphError> {
        self.eager_alias::<CudaSlice<T>>(rt, rows, None)
    }

    /// The first `rows` rows as the last replay left them: in the graphs' buffer, or in the
    /// overflow buffer when that replay ran `eager`.
    pub fn valid(&self, rows: usize, eager: bool) -> CudaView<'_, T> {
        let buf = match (&self.overflow, eager) {
            (Some(o), true) if !self.overflow_freed.get() => o,
            _ => self.owner(),
        };
        buf.slice(0..rows * self.row)
    }
}

/// What a batch maps to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[doc(hidden)]
pub enum Pick {
    /// Replay the graph at this index (the bucket of `rows` rows).
    Graph {
        /// Index into the family's graphs (ascending bucket order).
        index: usize,
        /// The bucket size.
        bucket: usize,
    },
    /// Run the function eagerly (batch above every bucket, `fallback = "eager"`).
    Eager,
}

/// Shape buckets: one graph per batch size, captured largest first, sharing their buffers.
///
/// A graph has fixed shapes. `#[cuda_graph(buckets(batch = [1, 2, 4, 8]))]` captures one
/// graph per bucket; a replay with batch `b` runs the graph of the smallest bucket `>= b`:
/// its `b` rows of input are copied in, the rows up to the bucket are zero-filled (so the
/// padded rows compute the same thing every time), and only the first `b` rows of each
/// output are handed out.
///
/// Memory is that of the largest bucket, not the sum:
/// * the static inputs and outputs are one buffer each, sized for the largest bucket; every
///   bucket's graph reads and writes a prefix of it ([`BatchedSlot`]);
/// * the temporaries of all buckets live in the runtime's graph memory pool, and because all
///   graphs of a runtime launch on one stream, one after another, CUDA backs them with the
///   same physical memory. Capturing the largest bucket first sizes the pool once.
///
/// Replaying two buckets at the same time on different streams, which would corrupt the
/// shared buffers, cannot be written: a family replays through `&mut self` on its runtime's
/// single stream.
///
/// This type holds the graphs of one family, in ascending bucket order; the generated
/// family type lends it through `buckets()`.
pub struct Buckets {
    site: &'static GraphSite,
    sizes: &'static [usize],
    graphs: Vec<Graph>,
    eager_fallback: bool,
}

impl std::fmt::Debug for Buckets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Buckets")
            .field("graph", &self.site.name)
            .field("sizes", &self.sizes)
            .field("eager_fallback", &self.eager_fallback)
            .finish_non_exhaustive()
    }
}

impl Buckets {
    /// Captures one graph per bucket of `sizes` (ascending, as the attribute lists them),
    /// largest first. `body(b, step)` runs the function with batch `b` on the bucket's
    /// buffers, or checks the state's addresses (`book`, see [`Step`]).
    /// Reports each bucket and a summary through `tracing`.
    #[doc(hidden)]
    pub fn capture(
        rt: &Runtime,
        site: &'static GraphSite,
        sizes: &'static [usize],
        eager_fallback: bool,
        book: &AddressBook,
        static_bytes: usize,
        body: &mut dyn FnMut(usize, Step) -> Result<(), GraphError>,
    ) -> Result<Self, GraphError> {
        let started = Instant::now();
        // The family stages its rows itself (copies and padding), outside the graphs.
        let no_inputs = crate::inputs::InputNodes::new();
        let mut graphs = Vec::with_capacity(sizes.len());
        for (k, &bucket) in sizes.iter().enumerate().rev() {
            let t = Instant::now();
            let mut run = |step: Step| body(bucket, step);
            let g = crate::capture::capture(rt, site, book, &no_inputs, static_bytes, &mut run)
                .and_then(crate::capture::Captured::single)
                .map_err(|e| GraphError::Bucket {
                    graph: site.name,
                    bucket,
                    source: Box::new(e),
                })?;
            tracing::info!(
                graph = site.name,
                bucket,
                done = sizes.len() - k,
                of = sizes.len(),
                nodes = g.info().nodes(),
                temp_bytes = g.info().temp_bytes,
                ms = t.elapsed().as_secs_f64() * 1e3,
                "captured bucket"
            );
            graphs.push(g);
        }
        graphs.reverse();
        let pool = rt.graph_memory().unwrap_or_default();
        tracing::info!(
            graph = site.name,
            buckets = sizes.len(),
            static_bytes,
            largest_temp_bytes = graphs
                .iter()
                .map(|g| g.info().temp_bytes)
                .max()
                .unwrap_or(0),
            sum_temp_bytes = graphs.iter().map(|g| g.info().temp_bytes).sum::<usize>(),
            pool_reserved_bytes = pool.reserved,
            ms = started.elapsed().as_secs_f64() * 1e3,
            "captured bucket family"
        );
        Ok(Buckets {
            site,
            sizes,
            graphs,
            eager_fallback,
        })
    }

    /// The bucket sizes, ascending.
    pub fn sizes(&self) -> &'static [usize] {
        self.sizes
    }

    /// The graph of each bucket, in ascending bucket order.
    pub fn graphs(&self) -> &[Graph] {
        &self.graphs
    }

    /// The smallest bucket that holds `rows`, or eager execution when none does and the
    /// family allows it.
    #[doc(hidden)]
    pub fn pick(&self, rows: usize) -> Result<Pick, GraphError> {
        match self.sizes.iter().position(|&b| b >= rows) {
            Some(index) => Ok(Pick::Graph {
                index,
                bucket: self.sizes[index],
            }),
            None if self.eager_fallback => Ok(Pick::Eager),
            None => Err(GraphError::BatchAboveBuckets {
                graph: self.site.name,
                batch: rows,
                largest: *self.sizes.last().expect("at least one bucket"),
            }),
        }
    }

    /// The graph at `index` (from [`Buckets::pick`]).
    pub fn graph(&self, index: usize) -> &Graph {
        &self.graphs[index]
    }

    /// Checks that every batched input holds the same number of rows.
    #[doc(hidden)]
    pub fn same_rows(
        &self,
        input: &'static str,
        rows: usize,
        first: usize,
    ) -> Result<(), GraphError> {
        if rows == first {
            Ok(())
        } else {
            Err(GraphError::InputShape {
                graph: self.site.name,
                input,
                expected: format!("{first} rows, like the first input"),
                got: format!("{rows} rows"),
            })
        }
    }
}
