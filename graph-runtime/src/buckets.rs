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
//!
//! Shapes that arrive over time: with `lazy = N` a family captures nothing up front; a
//! bucket is captured the first time a replay needs it, and at most `N` graphs stay live.
//! When a replay needs a bucket that is not live while `N` are, the least recently
//! replayed one is dropped first (LRU): dropping a graph destroys it and releases its
//! temporaries (the drop trims the device's graph memory, so what no live graph uses goes
//! back to the device; the static buffers stay, sized for the largest bucket). Each
//! capture on a replay pays the warmup runs and the capture on that call (`GraphInfo`'s
//! timings say how long); the `&mut` state and the generators are restored after the
//! warmup as at construction, so results do not depend on when a bucket was captured
//! (unless the state is `#[state(no_restore)]`). A batch above the largest bucket is never
//! captured: it is an error, or runs eagerly with `fallback = "eager"`, as in an eager
//! family. [`Buckets::stats`] counts, per bucket, the replays, the captures, the evictions
//! and the padded rows, and the batches that ran eagerly.
//!
//! A family does not verify its replays yet: `verify`, `verify_every` and
//! `verify_tolerance` beside `buckets(…)` are compile errors (not accepted and ignored), and
//! debug builds' first-replay check does not run for families. Compare a bucket with the
//! function called eagerly in your tests.

use std::cell::Cell;
use std::mem::ManuallyDrop;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{
    CudaEvent, CudaSlice, CudaStream, CudaView, DevicePtr, DeviceRepr, ValidAsZeroBits,
};

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

/// When a bucket family captures its graphs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[doc(hidden)]
pub enum Capture {
    /// Every bucket at construction, largest first (the default).
    All,
    /// Each bucket on the first replay that needs it, keeping at most this many graphs
    /// (`lazy = N`); the least recently replayed is dropped to make room.
    Lazy(usize),
}

/// What one bucket of a family did since the family was captured (see [`BucketStats`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketCounts {
    /// The bucket's batch size.
    pub bucket: usize,
    /// Replays that ran this bucket's graph.
    pub replays: u64,
    /// Times the bucket was captured (at construction, or on a replay that found it not
    /// live in a `lazy` family).
    pub captures: u64,
    /// Times its graph was dropped to make room for another (`lazy` families only).
    pub evictions: u64,
    /// Rows the replays padded: the bucket's size minus the batch, summed over its replays.
    pub rows_padded: u64,
    /// Whether the bucket's graph is live now.
    pub live: bool,
}

/// Per-bucket counts of a bucket family, like the per-shape statistics serving engines
/// print: [`Buckets::stats`]. `Display` writes them as a table, one row per bucket and a
/// last row for the batches above the largest bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketStats {
    /// The function's name.
    pub graph: &'static str,
    /// The most graphs kept live (`lazy = N`), or `None` when every bucket is captured up
    /// front.
    pub max_live: Option<usize>,
    /// One entry per bucket, ascending.
    pub buckets: Vec<BucketCounts>,
    /// Misses above the largest bucket that ran eagerly (`fallback = "eager"`).
    pub eager_runs: u64,
    /// Rows of those eager runs, summed.
    pub eager_rows: u64,
}

impl BucketStats {
    /// Replays of every bucket's graph.
    pub fn replays(&self) -> u64 {
        self.buckets.iter().map(|b| b.replays).sum()
    }

    /// Captures of every bucket.
    pub fn captures(&self) -> u64 {
        self.buckets.iter().map(|b| b.captures).sum()
    }
}

impl std::fmt::Display for BucketStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let live = match self.max_live {
            Some(n) => format!("lazy, at most {n} live"),
            None => "all captured up front".to_owned(),
        };
        writeln!(f, "bucket family `{}` ({live})", self.graph)?;
        writeln!(
            f,
            "| {:>8} | {:>8} | {:>8} | {:>9} | {:>11} | {:>4} |",
            "bucket", "replays", "captures", "evictions", "rows padded", "live"
        )?;
        writeln!(
            f,
            "|---------:|---------:|---------:|----------:|------------:|-----:|"
        )?;
        for b in &self.buckets {
            writeln!(
                f,
                "| {:>8} | {:>8} | {:>8} | {:>9} | {:>11} | {:>4} |",
                b.bucket,
                b.replays,
                b.captures,
                b.evictions,
                b.rows_padded,
                if b.live { "yes" } else { "no" }
            )?;
        }
        let largest = self.buckets.last().map_or(0, |b| b.bucket);
        write!(
            f,
            "| {:>8} | {:>8} | {:>8} | {:>9} | {:>11} | {:>4} |",
            format!(">{largest}"),
            format!("{} eager", self.eager_runs),
            "-",
            "-",
            format!("{} rows", self.eager_rows),
            "-"
        )
    }
}

/// Shape buckets: one graph per batch size, sharing their buffers.
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
///   same physical memory. Capturing the largest bucket first sizes the pool once (a `lazy`
///   family grows the pool as larger buckets arrive).
///
/// With `buckets(…, lazy = N)` the family captures a bucket on the first replay that needs
/// it and keeps at most `N` graphs live, dropping the least recently replayed one to make
/// room (its temporaries are released); see the module docs.
///
/// Replaying two buckets at the same time on different streams, which would corrupt the
/// shared buffers, cannot be written: a family replays through `&mut self` on its runtime's
/// single stream.
///
/// This type holds the graphs of one family, in ascending bucket order, and their counts
/// ([`Buckets::stats`]); the generated family type lends it through `buckets()`.
pub struct Buckets {
    site: &'static GraphSite,
    sizes: &'static [usize],
    /// One slot per bucket, ascending: `None` until captured (and again once evicted).
    graphs: Vec<Option<Graph>>,
    eager_fallback: bool,
    capture: Capture,
    static_bytes: usize,
    /// Per bucket: the replay count when it was last replayed or captured (LRU order).
    last_used: Vec<u64>,
    clock: u64,
    counts: Vec<BucketCounts>,
    eager_runs: u64,
    eager_rows: u64,
    /// The runtime's stream and the events of the eager fallback's staging (no graph needs
    /// to be live for it).
    stream: Arc<CudaStream>,
    before: CudaEvent,
    after: CudaEvent,
}

impl std::fmt::Debug for Buckets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Buckets")
            .field("graph", &self.site.name)
            .field("sizes", &self.sizes)
            .field("eager_fallback", &self.eager_fallback)
            .field("capture", &self.capture)
            .finish_non_exhaustive()
    }
}

impl Buckets {
    /// A family of `sizes` (ascending, as the attribute lists them) with no graph yet;
    /// [`Buckets::capture_missing`] captures them.
    #[doc(hidden)]
    pub fn new(
        rt: &Runtime,
        site: &'static GraphSite,
        sizes: &'static [usize],
        eager_fallback: bool,
        capture: Capture,
        static_bytes: usize,
    ) -> Result<Self, GraphError> {
        Ok(Buckets {
            site,
            sizes,
            graphs: sizes.iter().map(|_| None).collect(),
            eager_fallback,
            capture,
            static_bytes,
            last_used: vec![0; sizes.len()],
            clock: 0,
            counts: sizes
                .iter()
                .map(|&bucket| BucketCounts {
                    bucket,
                    replays: 0,
                    captures: 0,
                    evictions: 0,
                    rows_padded: 0,
                    // Read from `graphs` by `stats`.
                    live: false,
                })
                .collect(),
            eager_runs: 0,
            eager_rows: 0,
            stream: rt.stream().clone(),
            before: rt.untimed_event()?,
            after: rt.untimed_event()?,
        })
    }

    /// Captures what the family needs now: at construction (`bucket` is `None`) every
    /// bucket, largest first, unless the family is `lazy`; on a replay, bucket index
    /// `bucket` if it is not live, after dropping the least recently replayed graph when
    /// the family holds its most. `body(b, step)` runs the function with batch `b` on the
    /// bucket's buffers, or checks the state's addresses (`book`, see [`Step`]). Reports
    /// each capture and, at construction, a summary through `tracing`.
    #[doc(hidden)]
    pub fn capture_missing(
        &mut self,
        rt: &Runtime,
        book: &AddressBook,
        bucket: Option<usize>,
        body: &mut dyn FnMut(usize, Step) -> Result<(), GraphError>,
    ) -> Result<(), GraphError> {
        let started = Instant::now();
        match (bucket, self.capture) {
            (None, Capture::All) => {
                for index in (0..self.sizes.len()).rev() {
                    self.capture_one(rt, book, index, body)?;
                }
            }
            (None, Capture::Lazy(_)) => return Ok(()),
            (Some(index), _) if self.graphs[index].is_some() => return Ok(()),
            (Some(index), capture) => {
                if let Capture::Lazy(max_live) = capture {
                    self.make_room(max_live);
                }
                return self.capture_one(rt, book, index, body);
            }
        }
        let pool = rt.graph_memory().unwrap_or_default();
        let live = self.graphs.iter().flatten();
        tracing::info!(
            graph = self.site.name,
            buckets = self.sizes.len(),
            static_bytes = self.static_bytes,
            largest_temp_bytes = live.clone().map(|g| g.info().temp_bytes).max().unwrap_or(0),
            sum_temp_bytes = live.map(|g| g.info().temp_bytes).sum::<usize>(),
            pool_reserved_bytes = pool.reserved,
            ms = started.elapsed().as_secs_f64() * 1e3,
            "captured bucket family"
        );
        Ok(())
    }

    /// Drops least recently replayed graphs until fewer than `max_live` are live.
    fn make_room(&mut self, max_live: usize) {
        while self.graphs.iter().flatten().count() >= max_live.max(1) {
            let Some(lru) = (0..self.graphs.len())
                .filter(|&k| self.graphs[k].is_some())
                .min_by_key(|&k| self.last_used[k])
            else {
                return;
            };
            tracing::debug!(
                graph = self.site.name,
                bucket = self.sizes[lru],
                "evicted bucket (least recently replayed)"
            );
            // Dropping the graph destroys it and trims the device's graph memory.
            self.graphs[lru] = None;
            self.counts[lru].evictions += 1;
        }
    }

    fn capture_one(
        &mut self,
        rt: &Runtime,
        book: &AddressBook,
        index: usize,
        body: &mut dyn FnMut(usize, Step) -> Result<(), GraphError>,
    ) -> Result<(), GraphError> {
        let (site, bucket) = (self.site, self.sizes[index]);
        let t = Instant::now();
        // The family stages its rows itself (copies and padding), outside the graphs.
        let no_inputs = crate::inputs::InputNodes::new();
        let mut run = |step: Step| body(bucket, step);
        // Families have no islands (the macro refuses them).
        let no_islands: crate::capture::OwnsIsland = |_| false;
        let g = crate::capture::capture(
            rt,
            site,
            book,
            &no_inputs,
            self.static_bytes,
            no_islands,
            &mut run,
        )
        .and_then(crate::capture::Captured::single)
        .map_err(|e| GraphError::Bucket {
            graph: site.name,
            bucket,
            source: Box::new(e),
        })?;
        tracing::info!(
            graph = site.name,
            bucket,
            nodes = g.info().nodes(),
            temp_bytes = g.info().temp_bytes,
            ms = t.elapsed().as_secs_f64() * 1e3,
            "captured bucket"
        );
        self.graphs[index] = Some(g);
        self.clock += 1;
        self.last_used[index] = self.clock;
        self.counts[index].captures += 1;
        Ok(())
    }

    /// The bucket sizes, ascending.
    pub fn sizes(&self) -> &'static [usize] {
        self.sizes
    }

    /// The live graphs, in ascending bucket order: every bucket's once captured, unless
    /// the family is `lazy` (then those captured and not evicted).
    pub fn graphs(&self) -> impl Iterator<Item = &Graph> {
        self.graphs.iter().flatten()
    }

    /// The graph of bucket `bucket` (a batch size of [`Buckets::sizes`]), if it is live.
    pub fn graph_of(&self, bucket: usize) -> Option<&Graph> {
        let index = self.sizes.iter().position(|&b| b == bucket)?;
        self.graphs[index].as_ref()
    }

    /// What each bucket did so far: replays, captures, evictions, padded rows, and the
    /// batches above the largest bucket that ran eagerly. `Display` writes a table.
    pub fn stats(&self) -> BucketStats {
        BucketStats {
            graph: self.site.name,
            max_live: match self.capture {
                Capture::All => None,
                Capture::Lazy(n) => Some(n),
            },
            // Live is what the family holds now, not a count.
            buckets: self
                .counts
                .iter()
                .zip(&self.graphs)
                .map(|(c, g)| BucketCounts {
                    live: g.is_some(),
                    ..*c
                })
                .collect(),
            eager_runs: self.eager_runs,
            eager_rows: self.eager_rows,
        }
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

    /// Whether the graph at `index` (from [`Buckets::pick`]) is live.
    #[doc(hidden)]
    #[inline]
    pub fn is_live(&self, index: usize) -> bool {
        self.graphs[index].is_some()
    }

    /// The graph at `index` (from [`Buckets::pick`]), counted as replayed with `rows` rows:
    /// the caller replays it. Captured first by [`Buckets::capture_missing`].
    #[doc(hidden)]
    #[inline]
    pub fn replayed(&mut self, index: usize, rows: usize) -> &Graph {
        self.clock += 1;
        self.last_used[index] = self.clock;
        let counts = &mut self.counts[index];
        counts.replays += 1;
        counts.rows_padded += (counts.bucket - rows.min(counts.bucket)) as u64;
        self.graphs[index]
            .as_ref()
            .expect("the bucket was captured before its replay")
    }

    /// Staging for a batch above every bucket, counted as one eager run of `rows` rows.
    #[doc(hidden)]
    pub fn eager_run(&mut self, rows: usize) -> Staging<'_> {
        self.eager_runs += 1;
        self.eager_rows += rows as u64;
        Staging::new(&self.stream, &self.before, &self.after)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(bucket: usize, replays: u64, captures: u64, padded: u64, live: bool) -> BucketCounts {
        BucketCounts {
            bucket,
            replays,
            captures,
            evictions: captures.saturating_sub(u64::from(live)),
            rows_padded: padded,
            live,
        }
    }

    #[test]
    fn stats_print_as_a_table_with_a_row_per_bucket_and_one_above() {
        let stats = BucketStats {
            graph: "mlp",
            max_live: Some(2),
            buckets: vec![
                counts(1, 2, 2, 0, false),
                counts(2, 2, 2, 0, true),
                counts(4, 3, 2, 1, true),
            ],
            eager_runs: 1,
            eager_rows: 12,
        };
        assert_eq!((stats.replays(), stats.captures()), (7, 6));
        let table = stats.to_string();
        let want = "\
bucket family `mlp` (lazy, at most 2 live)
|   bucket |  replays | captures | evictions | rows padded | live |
|---------:|---------:|---------:|----------:|------------:|-----:|
|        1 |        2 |        2 |         2 |           0 |   no |
|        2 |        2 |        2 |         1 |           0 |  yes |
|        4 |        3 |        2 |         1 |           1 |  yes |
|       >4 |  1 eager |        - |         - |     12 rows |    - |";
        assert_eq!(table, want, "\n{table}");
        let all = BucketStats {
            max_live: None,
            ..stats
        };
        assert!(all
            .to_string()
            .starts_with("bucket family `mlp` (all captured up front)\n"));
    }
}
