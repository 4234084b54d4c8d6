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

use std::mem::ManuallyDrop;
use std::ops::{Deref, DerefMut};
use std::time::Instant;

use cudarc::driver::{result, CudaSlice, CudaView, DevicePtr, DeviceRepr, ValidAsZeroBits};

use crate::buffer::InputSource;
use crate::capture::GraphSite;
use crate::error::GraphError;
use crate::graph::{Graph, Staging};
use crate::runtime::Runtime;

/// A `CudaSlice` that borrows memory owned elsewhere and never frees it.
pub struct Alias<T>(ManuallyDrop<CudaSlice<T>>);

impl<T> Deref for Alias<T> {
    type Target = CudaSlice<T>;
    fn deref(&self) -> &CudaSlice<T> {
        &self.0
    }
}

impl<T> DerefMut for Alias<T> {
    fn deref_mut(&mut self) -> &mut CudaSlice<T> {
        &mut self.0
    }
}

impl<T> Drop for Alias<T> {
    fn drop(&mut self) {
        // SAFETY: taken exactly once, here; `leak` gives the pointer up without freeing it,
        // so the owner keeps the memory.
        let slice = unsafe { ManuallyDrop::take(&mut self.0) };
        let _ = slice.leak();
    }
}

/// Device buffers that can be batched along their leading dimension in a bucket family:
/// `CudaSlice<T>` holding rows of `T`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be an input or output of a bucketed `#[cuda_graph]`",
    label = "inputs and outputs of a bucket family must be `CudaSlice<T>`, batched along their first dimension"
)]
pub trait BatchBuffer {
    /// The element type.
    type Elem: DeviceRepr + ValidAsZeroBits;
}

impl<T: DeviceRepr + ValidAsZeroBits> BatchBuffer for CudaSlice<T> {
    type Elem = T;
}

/// One batched input or output of a bucket family: rows of `row` elements, one buffer sized
/// for the largest bucket whose prefixes serve the smaller ones.
pub struct BatchedSlot<T> {
    owner: CudaSlice<T>,
    row: usize,
    name: &'static str,
    /// Used when a batch larger than every bucket runs eagerly (`fallback = "eager"`); grown
    /// on demand, never touched by a graph.
    overflow: Option<CudaSlice<T>>,
}

impl<T: DeviceRepr + ValidAsZeroBits> BatchedSlot<T> {
    /// Allocates the zeroed buffer for `rows` rows of `row` elements (the largest bucket).
    pub fn new(
        rt: &Runtime,
        site: &'static GraphSite,
        name: &'static str,
        row: usize,
        rows: usize,
    ) -> Result<Self, GraphError> {
        let owner = crate::__private::alloc_static::<CudaSlice<T>>(rt, site, name, row * rows)?;
        Ok(BatchedSlot {
            owner,
            row,
            name,
            overflow: None,
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

    fn alias_of(buf: &CudaSlice<T>, len: usize) -> Alias<T> {
        debug_assert!(len <= buf.len());
        let (ptr, _sync) = buf.device_ptr(buf.stream());
        // SAFETY: `ptr` and `len` lie within `buf`, which outlives every alias (aliases are
        // temporaries of the slot's methods or of the capture, and `Alias` never frees).
        Alias(ManuallyDrop::new(unsafe {
            buf.stream().upgrade_device_ptr::<T>(ptr, len)
        }))
    }

    /// A `CudaSlice` over the first `rows` rows, for the body during warmup and capture.
    pub fn alias(&self, rows: usize) -> Alias<T> {
        Self::alias_of(&self.owner, rows * self.row)
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
        let mut dst = Self::alias_of(&self.owner, rows * self.row);
        src.copy_into(&mut dst, staging)?;
        let pad = (bucket - rows) * self.row * std::mem::size_of::<T>();
        if pad > 0 {
            let (base, _sync) = self.owner.device_ptr(staging.stream());
            let start = base + (rows * self.row * std::mem::size_of::<T>()) as u64;
            // SAFETY: `start .. start + pad` lies within the owner buffer (bucket rows at
            // most the largest bucket); the memset is ordered on the staging stream before
            // the graph launch.
            unsafe { result::memset_d8_async(start, 0, pad, staging.stream().cu_stream()) }?;
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
    ) -> Result<Alias<T>, GraphError> {
        let len = rows * self.row;
        if self.overflow.as_ref().is_none_or(|o| o.len() < len) {
            self.overflow = Some(rt.stream().alloc_zeros::<T>(len)?);
        }
        let buf = self.overflow.as_ref().expect("allocated above");
        let mut alias = Self::alias_of(buf, len);
        if let Some((src, staging)) = src {
            src.copy_into(&mut alias, staging)?;
        }
        Ok(alias)
    }

    /// For a batch above every bucket: room for `rows` rows of output outside the graphs'
    /// memory, as a `CudaSlice` for the eager call.
    pub fn eager_output(&mut self, rt: &Runtime, rows: usize) -> Result<Alias<T>, GraphError> {
        self.eager_alias::<CudaSlice<T>>(rt, rows, None)
    }

    /// The first `rows` rows as the last replay left them: in the graphs' buffer, or in the
    /// overflow buffer when that replay ran `eager`.
    pub fn valid(&self, rows: usize, eager: bool) -> CudaView<'_, T> {
        let buf = match (&self.overflow, eager) {
            (Some(o), true) => o,
            _ => &self.owner,
        };
        buf.slice(0..rows * self.row)
    }
}

/// What a batch maps to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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

/// The graphs of a bucket family, in ascending bucket order.
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
    /// largest first. `body(b)` runs the function with batch `b` on the bucket's buffers.
    /// Reports each bucket and a summary through `tracing`.
    pub fn capture(
        rt: &Runtime,
        site: &'static GraphSite,
        sizes: &'static [usize],
        eager_fallback: bool,
        static_bytes: usize,
        body: &mut dyn FnMut(usize) -> Result<(), GraphError>,
    ) -> Result<Self, GraphError> {
        let started = Instant::now();
        let mut graphs = Vec::with_capacity(sizes.len());
        for (k, &bucket) in sizes.iter().enumerate().rev() {
            let t = Instant::now();
            let mut run = || body(bucket);
            let g =
                crate::capture::capture_graph(rt, site, static_bytes, &mut run).map_err(|e| {
                    GraphError::Bucket {
                        graph: site.name,
                        bucket,
                        source: Box::new(e),
                    }
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
