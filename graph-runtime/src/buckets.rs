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
//!   bucket's graph reads and writes a prefix of it (the body is lent [`Rows`] of it);
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
//! A family is the generated function's `GraphBody` run by [`TypedFamily`]: one body with
//! its static buffers (the largest bucket's rows) and one recording per bucket
//! (`crate::typed`'s `Recording`), so each bucket's graph verifies its replays
//! (`verify = …`, `verify_every`, `verify_tolerance`, and debug builds' replays 1, 2, 4, …,
//! each bucket on its own schedule; a mismatch names the bucket), runs the body's eager
//! islands between its segments, and prints, as a single graph does. A bucket's replay is
//! verified against the function run eagerly on that bucket's rows (the batch's rows, then
//! zeros), comparing the rows handed out.

use std::mem::ManuallyDrop;
use std::ops::{Deref, DerefMut, Range};
use std::time::Instant;

use cudarc::driver::{CudaEvent, CudaSlice, CudaView, DevicePtr, DeviceRepr, ValidAsZeroBits};

use crate::buffer::{alloc_static, InputSource, Staging, StaticBuffer};
use crate::error::{GraphError, When};
use crate::graph::Graph;
use crate::inputs::InputNodes;
use crate::region::DeviceRegion;
use crate::runtime::{FromRuntime, Runtime};
use crate::site::GraphSite;
use crate::state::{AddressBook, DeviceState};
use crate::typed::{
    for_each_tuple, refuse_nested, Batch, GraphBody, Instance, Recording, StaticList, Statics,
    StaticsOf,
};
use crate::verify::{Tolerance, Verifier, VerifyReport};

/// The first rows of a bucket family's buffer as a `CudaSlice`, lent to the body while it
/// runs on them (warmup, capture, `verify`'s eager run, a batch above the buckets).
///
/// It borrows the buffer, so it cannot outlive it, and it never frees the buffer's memory.
/// A body may still assign a new buffer through the `&mut CudaSlice` it was given: that
/// drops (frees) the family's buffer. The guard notices when it is dropped: the family's
/// buffer becomes the body's (the family's address check then reports
/// [`GraphError::StateMoved`] before anything touches it again) and the freed one is
/// forgotten, never freed twice.
#[doc(hidden)]
pub struct Rows<'a, T> {
    alias: ManuallyDrop<CudaSlice<T>>,
    ptr: u64,
    owner: &'a mut CudaSlice<T>,
}

impl<T> std::fmt::Debug for Rows<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rows")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("len", &self.alias.len())
            .finish_non_exhaustive()
    }
}

impl<'a, T> Rows<'a, T> {
    /// The first `len` elements of `owner` (all of it when it holds fewer).
    fn new(owner: &'a mut CudaSlice<T>, len: usize) -> Self {
        let len = len.min(owner.len());
        let ptr = address(owner);
        // SAFETY: `ptr .. ptr + len` lies within `owner`, which outlives the guard (it is
        // borrowed for `'a`, so nothing else touches it until the guard drops). The guard
        // never frees the alias: its drop leaks it while it still starts at `ptr`; a body that
        // assigned a buffer of its own through `DerefMut` (which freed the owner's memory) has
        // the owner take that buffer instead; and a body that swapped the alias out with
        // `mem::swap` now owns that alias, whose memory the owner keeps pointing at, which the
        // next address check reports (`StateMoved`).
        let alias = unsafe { owner.stream().upgrade_device_ptr::<T>(ptr, len) };
        Rows {
            alias: ManuallyDrop::new(alias),
            ptr,
            owner,
        }
    }
}

/// Where `slice`'s memory starts.
fn address<T>(slice: &CudaSlice<T>) -> u64 {
    let (ptr, _sync) = slice.device_ptr(slice.stream());
    ptr
}

impl<T> Deref for Rows<'_, T> {
    type Target = CudaSlice<T>;
    fn deref(&self) -> &CudaSlice<T> {
        &self.alias
    }
}

impl<T> DerefMut for Rows<'_, T> {
    fn deref_mut(&mut self) -> &mut CudaSlice<T> {
        &mut self.alias
    }
}

impl<T> Drop for Rows<'_, T> {
    fn drop(&mut self) {
        // SAFETY: taken exactly once, here.
        let alias = unsafe { ManuallyDrop::take(&mut self.alias) };
        if address(&alias) == self.ptr {
            // Still the alias: give the pointer up without freeing; the owner keeps it.
            let _ = alias.leak();
        } else {
            // The body assigned a buffer of its own, and the assignment freed the owner's
            // memory (the alias starts where the owner does). The owner takes the body's
            // buffer, which the address check reports as moved, and forgets the freed one.
            let freed = std::mem::replace(self.owner, alias);
            let _ = freed.leak();
        }
    }
}

/// Device buffers that can be batched along their leading dimension in a bucket family:
/// `CudaSlice<T>` holding rows of `T`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be an input or output of a bucketed `#[cuda_graph]`",
    label = "inputs and outputs of a bucket family must be `CudaSlice<T>`, batched along their first dimension"
)]
#[doc(hidden)]
pub trait BatchBuffer: StaticBuffer<Shape = usize> {
    /// The element type.
    type Elem: DeviceRepr + ValidAsZeroBits + 'static;
    /// The buffer as the `CudaSlice` it is.
    fn slice(&self) -> &CudaSlice<Self::Elem>;
    /// The buffer as the `CudaSlice` it is, mutably.
    fn slice_mut(&mut self) -> &mut CudaSlice<Self::Elem>;
    /// Elements `range`, lent to be written into (by an input's copy).
    fn lend_range(&mut self, range: Range<usize>) -> Self::Lent<'_>;
}

impl<T: DeviceRepr + ValidAsZeroBits + 'static> BatchBuffer for CudaSlice<T> {
    type Elem = T;
    fn slice(&self) -> &CudaSlice<T> {
        self
    }
    fn slice_mut(&mut self) -> &mut CudaSlice<T> {
        self
    }
    fn lend_range(&mut self, range: Range<usize>) -> Self::Lent<'_> {
        self.slice_mut(range)
    }
}

/// The valid rows of an output of a bucket family, as its outputs view holds them.
#[doc(hidden)]
pub type ValidRows<'g, B> = CudaView<'g, <B as BatchBuffer>::Elem>;

/// Elements per row of `buf`, a buffer of `of` rows.
fn row<B: BatchBuffer>(buf: &B, of: usize) -> usize {
    buf.slice().len().checked_div(of).unwrap_or(0)
}

/// The first `rows` rows of `buf` (a buffer of `of` rows), no more than it holds.
fn prefix<B: BatchBuffer>(buf: &B, rows: usize, of: usize) -> usize {
    rows.saturating_mul(row(buf, of)).min(buf.slice().len())
}

/// The region of the caller's rows of `buf`, for `verify`.
fn valid_region<B: BatchBuffer>(buf: &B, batch: Batch) -> Vec<DeviceRegion> {
    let bytes = prefix(buf, batch.rows, batch.of) * std::mem::size_of::<B::Elem>();
    let mut regions = Vec::with_capacity(1);
    buf.slice()
        .regions(&mut |r| regions.push(DeviceRegion { bytes, ..r }));
    regions
}

/// Zeroed buffers of `rows` rows, each row as wide as `like`'s (a buffer of `of` rows).
fn alloc_rows<B: BatchBuffer>(
    like: &B,
    rt: &Runtime,
    site: &'static GraphSite,
    name: &'static str,
    of: usize,
    rows: usize,
) -> Result<B, GraphError> {
    alloc_static::<B>(rt, site, name, row(like, of).saturating_mul(rows))
}

/// How many rows `src` holds for `dst` (a buffer of `of` rows); its length must be a whole
/// number of rows.
fn rows_in<B: BatchBuffer, S: InputSource<B> + ?Sized>(
    dst: &B,
    of: usize,
    site: &'static GraphSite,
    name: &'static str,
    src: &S,
) -> Result<usize, GraphError> {
    let (len, row) = (src.shape(), row(dst, of));
    if row == 0 || len % row != 0 {
        return Err(GraphError::InputShape {
            graph: site.name,
            input: name,
            expected: format!("a multiple of {row} (rows of {row} elements)"),
            got: len.to_string(),
        });
    }
    Ok(len / row)
}

/// Copies the batch's rows from `src` into `dst` and zero-fills the padding rows up to the
/// bucket, on the staging stream.
fn stage_rows<B: BatchBuffer, S: InputSource<B> + ?Sized>(
    dst: &mut B,
    src: &S,
    batch: Batch,
    staging: &Staging<'_>,
) -> Result<(), GraphError> {
    let (valid, padded) = (
        prefix(dst, batch.rows, batch.of),
        prefix(dst, batch.bucket, batch.of),
    );
    src.copy_into(dst.lend_range(0..valid), staging)?;
    if padded > valid {
        let padding = &mut dst.slice_mut().slice_mut(valid..padded);
        staging.stream().memset_zeros(padding)?;
    }
    Ok(())
}

/// A buffer of the batch's bucket rows for `verify`'s eager run: `src`'s rows, then zeros.
fn copy_rows<B: BatchBuffer, S: InputSource<B> + ?Sized>(
    like: &B,
    src: &S,
    rt: &Runtime,
    site: &'static GraphSite,
    name: &'static str,
    batch: Batch,
) -> Result<B, GraphError> {
    let mut dst = alloc_rows(like, rt, site, name, batch.of, batch.bucket)?;
    let valid = prefix(like, batch.rows, batch.of);
    let (before, after) = (rt.untimed_event()?, rt.untimed_event()?);
    src.copy_into(
        dst.lend_range(0..valid),
        &Staging::new(rt.stream(), &before, &after),
    )?;
    Ok(dst)
}

/// A tuple of a bucket family's batched buffers (its inputs, or its outputs), every buffer
/// holding the same number of rows.
#[doc(hidden)]
pub trait BatchList: StaticList {
    /// The bucket's rows of every buffer, lent to the body ([`Rows`]).
    type Rows<'a>
    where
        Self: 'a;
    /// The caller's rows of every buffer.
    type Valid<'a>
    where
        Self: 'a;
    /// Lends the first `batch.bucket` rows of every buffer.
    fn rows(&mut self, batch: Batch) -> Self::Rows<'_>;
    /// The first `batch.rows` rows of every buffer.
    fn valid(&self, batch: Batch) -> Self::Valid<'_>;
    /// Gives `verify` the first `batch.rows` rows of each buffer as output `names[k]` (the
    /// eager run's when `eager`).
    fn valid_to(
        &self,
        names: &'static [&'static str],
        verifier: &mut Verifier<'_>,
        eager: bool,
        batch: Batch,
    ) -> Result<(), GraphError>;
    /// Zeroed buffers of `rows` rows of the widths `widths` (elements per row).
    fn alloc_widths(
        rt: &Runtime,
        site: &'static GraphSite,
        names: &'static [&'static str],
        widths: Self::Shapes,
        rows: usize,
    ) -> Result<Self, GraphError>;
    /// Zeroed buffers of `rows` rows shaped like these rows (which are `of` rows each).
    fn alloc_rows(
        &self,
        rt: &Runtime,
        site: &'static GraphSite,
        names: &'static [&'static str],
        of: usize,
        rows: usize,
    ) -> Result<Self, GraphError>;
}

/// The inputs of one replay of a bucket family: a tuple with one source per batched input
/// of `L`, in order.
#[doc(hidden)]
pub trait BatchSources<L> {
    /// The rows the sources hold (`None` without inputs): every source a whole number of
    /// its buffer's rows (of `of` rows each), all of them the same number.
    fn rows(
        &self,
        dst: &L,
        of: usize,
        site: &'static GraphSite,
        names: &'static [&'static str],
    ) -> Result<Option<usize>, GraphError>;
    /// Copies the sources' rows into `dst` and zero-fills the rows after them up to the
    /// bucket (see [`Batch`]).
    fn stage_rows(
        &self,
        dst: &mut L,
        batch: Batch,
        staging: &Staging<'_>,
    ) -> Result<(), GraphError>;
    /// Buffers of `batch.bucket` rows holding the sources' rows, then zeros, for `verify`'s
    /// eager run.
    fn copies_rows(
        &self,
        like: &L,
        rt: &Runtime,
        site: &'static GraphSite,
        names: &'static [&'static str],
        batch: Batch,
    ) -> Result<L, GraphError>;
}

/// The rows input `name` holds, checked against the first input's.
fn same_rows(
    seen: &mut Option<usize>,
    rows: usize,
    site: &'static GraphSite,
    name: &'static str,
) -> Result<(), GraphError> {
    match *seen {
        None => *seen = Some(rows),
        Some(first) if first != rows => {
            return Err(GraphError::InputShape {
                graph: site.name,
                input: name,
                expected: format!("{first} rows, like the first input"),
                got: format!("{rows} rows"),
            })
        }
        Some(_) => {}
    }
    Ok(())
}

macro_rules! batch_tuples {
    ($(($($n:tt $b:ident $r:ident),*))*) => {$(
        #[allow(unused_variables, clippy::unused_unit)]
        impl<$($b: BatchBuffer),*> BatchList for ($($b,)*) {
            type Rows<'a> = ($(Rows<'a, $b::Elem>,)*) where Self: 'a;
            type Valid<'a> = ($(ValidRows<'a, $b>,)*) where Self: 'a;
            fn rows(&mut self, batch: Batch) -> Self::Rows<'_> {
                ($({
                    let len = prefix(&self.$n, batch.bucket, batch.of);
                    Rows::new(self.$n.slice_mut(), len)
                },)*)
            }
            fn valid(&self, batch: Batch) -> Self::Valid<'_> {
                ($(self.$n.slice().slice(0..prefix(&self.$n, batch.rows, batch.of)),)*)
            }
            fn valid_to(
                &self,
                names: &'static [&'static str],
                verifier: &mut Verifier<'_>,
                eager: bool,
                batch: Batch,
            ) -> Result<(), GraphError> {
                $(verifier.output_regions(eager, names[$n], valid_region(&self.$n, batch))?;)*
                Ok(())
            }
            fn alloc_widths(
                rt: &Runtime,
                site: &'static GraphSite,
                names: &'static [&'static str],
                widths: Self::Shapes,
                rows: usize,
            ) -> Result<Self, GraphError> {
                Ok(($(alloc_static::<$b>(rt, site, names[$n], widths.$n.saturating_mul(rows))?,)*))
            }
            fn alloc_rows(
                &self,
                rt: &Runtime,
                site: &'static GraphSite,
                names: &'static [&'static str],
                of: usize,
                rows: usize,
            ) -> Result<Self, GraphError> {
                Ok(($(alloc_rows(&self.$n, rt, site, names[$n], of, rows)?,)*))
            }
        }

        #[allow(unused_variables, unused_mut)]
        impl<'a, $($b: BatchBuffer, $r: ?Sized + InputSource<$b>),*> BatchSources<($($b,)*)>
            for ($(&'a $r,)*)
        {
            fn rows(
                &self,
                dst: &($($b,)*),
                of: usize,
                site: &'static GraphSite,
                names: &'static [&'static str],
            ) -> Result<Option<usize>, GraphError> {
                let mut rows = None;
                $(same_rows(&mut rows, rows_in(&dst.$n, of, site, names[$n], self.$n)?, site, names[$n])?;)*
                Ok(rows)
            }
            #[inline]
            fn stage_rows(
                &self,
                dst: &mut ($($b,)*),
                batch: Batch,
                staging: &Staging<'_>,
            ) -> Result<(), GraphError> {
                $(stage_rows(&mut dst.$n, self.$n, batch, staging)?;)*
                Ok(())
            }
            fn copies_rows(
                &self,
                like: &($($b,)*),
                rt: &Runtime,
                site: &'static GraphSite,
                names: &'static [&'static str],
                batch: Batch,
            ) -> Result<($($b,)*), GraphError> {
                Ok(($(copy_rows(&like.$n, self.$n, rt, site, names[$n], batch)?,)*))
            }
        }
    )*};
}

for_each_tuple!(batch_tuples);

/// The generated `run` of a bucket family's body: the bucket's rows (the body's batch
/// parameter), and its rows of every input and output, lent as `CudaSlice`s.
#[doc(hidden)]
#[inline]
pub fn rows<I: BatchList, O: BatchList, V>(
    statics: &mut Statics<I, O, V>,
) -> (usize, I::Rows<'_>, O::Rows<'_>) {
    let batch = statics.batch;
    (
        batch.bucket,
        statics.inputs.rows(batch),
        statics.outputs.rows(batch),
    )
}

/// What a batch maps to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pick {
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

/// What `buckets(…)` says: the bucket sizes (ascending, as the attribute lists them),
/// whether a batch above them runs eagerly, and when the buckets are captured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[doc(hidden)]
pub struct Family {
    /// The bucket sizes, ascending.
    pub sizes: &'static [usize],
    /// `fallback = "eager"`.
    pub eager_fallback: bool,
    /// `lazy = N`, or every bucket up front.
    pub capture: Capture,
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
///   bucket's graph reads and writes a prefix of it;
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
    /// Kept alive with the family: its lazy captures and eager runs use it.
    rt: Runtime,
    site: &'static GraphSite,
    family: Family,
    /// One slot per bucket, ascending: `None` until captured (and again once evicted).
    recordings: Vec<Option<Recording>>,
    static_bytes: usize,
    /// Per bucket: the replay count when it was last replayed or captured (LRU order).
    last_used: Vec<u64>,
    clock: u64,
    counts: Vec<BucketCounts>,
    eager_runs: u64,
    eager_rows: u64,
    /// The events of the eager fallback's staging (no graph needs to be live for it).
    before: CudaEvent,
    after: CudaEvent,
}

impl std::fmt::Debug for Buckets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Buckets")
            .field("graph", &self.site.name)
            .field("sizes", &self.family.sizes)
            .field("eager_fallback", &self.family.eager_fallback)
            .field("capture", &self.family.capture)
            .finish_non_exhaustive()
    }
}

impl Buckets {
    /// A family of `family.sizes` with no graph yet.
    fn new(
        rt: &Runtime,
        site: &'static GraphSite,
        family: Family,
        static_bytes: usize,
    ) -> Result<Self, GraphError> {
        let sizes = family.sizes;
        Ok(Buckets {
            rt: rt.clone(),
            site,
            family,
            recordings: sizes.iter().map(|_| None).collect(),
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
                    // Read from `recordings` by `stats`.
                    live: false,
                })
                .collect(),
            eager_runs: 0,
            eager_rows: 0,
            before: rt.untimed_event()?,
            after: rt.untimed_event()?,
        })
    }

    /// The largest bucket: the rows every static buffer holds.
    fn largest(&self) -> usize {
        *self.family.sizes.last().expect("at least one bucket")
    }

    /// Drops least recently replayed graphs until fewer than `max_live` are live.
    fn make_room(&mut self, max_live: usize) {
        while self.recordings.iter().flatten().count() >= max_live.max(1) {
            let Some(lru) = (0..self.recordings.len())
                .filter(|&k| self.recordings[k].is_some())
                .min_by_key(|&k| self.last_used[k])
            else {
                return;
            };
            tracing::debug!(
                graph = self.site.name,
                bucket = self.family.sizes[lru],
                "evicted bucket (least recently replayed)"
            );
            // Dropping the graph destroys it and trims the device's graph memory.
            self.recordings[lru] = None;
            self.counts[lru].evictions += 1;
        }
    }

    /// Keeps bucket `index`'s new recording (captured since `started`), counted.
    fn captured(&mut self, index: usize, recording: Recording, started: Instant) {
        let g = recording.graph();
        tracing::info!(
            graph = self.site.name,
            bucket = self.family.sizes[index],
            nodes = g.info().nodes(),
            temp_bytes = g.info().temp_bytes,
            ms = started.elapsed().as_secs_f64() * 1e3,
            "captured bucket"
        );
        self.recordings[index] = Some(recording);
        self.clock += 1;
        self.last_used[index] = self.clock;
        self.counts[index].captures += 1;
    }

    /// Reports the whole family captured (at construction), since `started`.
    fn log_family(&self, started: Instant) {
        let pool = self.rt.graph_memory().unwrap_or_default();
        let live = self.graphs();
        tracing::info!(
            graph = self.site.name,
            buckets = self.family.sizes.len(),
            static_bytes = self.static_bytes,
            largest_temp_bytes = live.clone().map(|g| g.info().temp_bytes).max().unwrap_or(0),
            sum_temp_bytes = live.map(|g| g.info().temp_bytes).sum::<usize>(),
            pool_reserved_bytes = pool.reserved,
            ms = started.elapsed().as_secs_f64() * 1e3,
            "captured bucket family"
        );
    }

    /// The bucket sizes, ascending.
    pub fn sizes(&self) -> &'static [usize] {
        self.family.sizes
    }

    /// The live graphs, in ascending bucket order: every bucket's once captured, unless
    /// the family is `lazy` (then those captured and not evicted). Of a body with eager
    /// islands, each bucket's first segment (the family's `Display` shows them all).
    pub fn graphs(&self) -> impl Iterator<Item = &Graph> + Clone {
        self.recordings.iter().flatten().map(Recording::graph)
    }

    /// The graph of bucket `bucket` (a batch size of [`Buckets::sizes`]), if it is live.
    pub fn graph_of(&self, bucket: usize) -> Option<&Graph> {
        let index = self.family.sizes.iter().position(|&b| b == bucket)?;
        self.recordings[index].as_ref().map(Recording::graph)
    }

    /// What each bucket did so far: replays, captures, evictions, padded rows, and the
    /// batches above the largest bucket that ran eagerly. `Display` writes a table.
    pub fn stats(&self) -> BucketStats {
        BucketStats {
            graph: self.site.name,
            max_live: match self.family.capture {
                Capture::All => None,
                Capture::Lazy(n) => Some(n),
            },
            // Live is what the family holds now, not a count.
            buckets: self
                .counts
                .iter()
                .zip(&self.recordings)
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
    fn pick(&self, rows: usize) -> Result<Pick, GraphError> {
        match self.family.sizes.iter().position(|&b| b >= rows) {
            Some(index) => Ok(Pick::Graph {
                index,
                bucket: self.family.sizes[index],
            }),
            None if self.family.eager_fallback => Ok(Pick::Eager),
            None => Err(self.above(rows)),
        }
    }

    /// A batch above every bucket, as an error.
    fn above(&self, rows: usize) -> GraphError {
        GraphError::BatchAboveBuckets {
            graph: self.site.name,
            batch: rows,
            largest: self.largest(),
        }
    }

    /// The recording at `index` (from [`Buckets::pick`], captured), counted as replayed
    /// with `rows` rows: the caller replays it.
    #[inline]
    fn replayed(&mut self, index: usize, rows: usize) -> &Recording {
        self.clock += 1;
        self.last_used[index] = self.clock;
        let counts = &mut self.counts[index];
        counts.replays += 1;
        counts.rows_padded += (counts.bucket - rows.min(counts.bucket)) as u64;
        self.recordings[index]
            .as_ref()
            .expect("the bucket was captured before its replay")
    }

    /// Staging for a batch above every bucket, counted as one eager run of `rows` rows.
    fn eager_run(&mut self, rows: usize) -> Staging<'_> {
        self.eager_runs += 1;
        self.eager_rows += rows as u64;
        Staging::new(self.rt.stream(), &self.before, &self.after)
    }
}

/// A bucket family of a `#[cuda_graph]` function: its body held once with static buffers
/// of the largest bucket's rows, and a recording per bucket ([`Buckets`]). The generated
/// `FooBuckets<'s>` wraps a `TypedFamily<FooBody<'s>>` and keeps only its typed
/// `capture`, `replay` and `verify`; `outputs`, `state_mut`, `buckets` and `Display`
/// come from here.
#[doc(hidden)]
pub struct TypedFamily<B: GraphBody> {
    buckets: Buckets,
    inst: Instance<B>,
    /// The buffers of the last batch above every bucket (`fallback = "eager"`): kept for its
    /// outputs, reused by the next such batch that fits.
    overflow: Option<StaticsOf<B>>,
    /// Whether the last replay ran eagerly (its outputs are in `overflow`).
    eager: bool,
    /// Bytes a capture of this family kept past the body (`GraphError::KeptTemporary`): its
    /// state now holds memory of a graph that is gone, so the family refuses every later call.
    kept: Option<(usize, usize)>,
}

impl<B: GraphBody> TypedFamily<B>
where
    B::Ins: BatchList,
    B::Outs: BatchList,
{
    /// The generated `capture`: every input and output allocated zeroed for the largest
    /// bucket's rows (`inputs` and `outputs` give the elements in one row of each), then
    /// every bucket captured, largest first, unless the family is `lazy`.
    pub fn capture_rows(
        rt: &Runtime,
        body: B,
        family: Family,
        inputs: <B::Ins as StaticList>::Shapes,
        outputs: <B::Outs as StaticList>::Shapes,
    ) -> Result<Self, GraphError> {
        let site = B::site();
        refuse_nested(site)?;
        let largest = *family.sizes.last().expect("at least one bucket");
        let ins = B::Ins::alloc_widths(rt, site, B::INPUTS, inputs, largest)?;
        let outs = B::Outs::alloc_widths(rt, site, B::OUTPUTS, outputs, largest)?;
        let static_bytes = ins.bytes() + outs.bytes();
        let mut statics = Statics::new(ins, outs);
        statics.batch = Batch {
            rows: 0,
            bucket: largest,
            of: largest,
        };
        let mut this = TypedFamily {
            buckets: Buckets::new(rt, site, family, static_bytes)?,
            inst: Instance::new(body, statics),
            overflow: None,
            eager: false,
            kept: None,
        };
        if family.capture == Capture::All {
            let started = Instant::now();
            for index in (0..family.sizes.len()).rev() {
                if let Err(e) = this.capture_bucket(index) {
                    if this.kept.is_some() {
                        crate::typed::drop_after_kept(rt, this);
                    }
                    return Err(e);
                }
            }
            this.buckets.log_family(started);
        }
        Ok(this)
    }

    /// Captures bucket `index` on the family's buffers, after dropping the least recently
    /// replayed graph when a `lazy` family holds its most.
    fn capture_bucket(&mut self, index: usize) -> Result<(), GraphError> {
        let buckets = &mut self.buckets;
        if let Capture::Lazy(max_live) = buckets.family.capture {
            buckets.make_room(max_live);
        }
        let bucket = buckets.family.sizes[index];
        let last = self.inst.statics.batch;
        self.inst.statics.batch = Batch {
            rows: bucket,
            bucket,
            of: last.of,
        };
        let started = Instant::now();
        // The family stages its rows itself (copies and padding), outside the graphs.
        let captured = Recording::capture(
            &buckets.rt,
            &mut self.inst,
            &InputNodes::new(),
            buckets.static_bytes,
        );
        self.inst.statics.batch = last;
        if let Err(GraphError::KeptTemporary { bytes, .. }) = &captured {
            self.kept = Some((bucket, *bytes));
        }
        let recording = captured.map_err(|e| GraphError::Bucket {
            graph: B::site().name,
            bucket,
            source: Box::new(e),
        })?;
        buckets.captured(index, recording, started);
        Ok(())
    }

    /// The rows of a replay: those of its inputs, or `batch` for a family without inputs.
    fn rows_of<I: BatchSources<B::Ins>>(
        &self,
        inputs: &I,
        batch: Option<usize>,
    ) -> Result<usize, GraphError> {
        let of = self.buckets.largest();
        let rows = inputs.rows(&self.inst.statics.inputs, of, B::site(), B::INPUTS)?;
        Ok(rows.or(batch).unwrap_or(0))
    }

    /// The generated `replay`: the rows of the inputs (or `batch`), the state's and the
    /// outputs' addresses checked, then the bucket that holds them replayed (captured first
    /// in a `lazy` family where it is not live; verified when its schedule says so) with
    /// the rows copied in and the rest of the bucket zero-filled, or, above every bucket,
    /// the function run eagerly (`fallback = "eager"`) or an error.
    #[inline]
    pub fn replay_rows<I: BatchSources<B::Ins>>(
        &mut self,
        inputs: I,
        batch: Option<usize>,
    ) -> Result<B::Outputs<'_>, GraphError> {
        if let Some((bucket, bytes)) = self.kept {
            let graph = B::site().name;
            let source = Box::new(GraphError::KeptTemporary { graph, bytes });
            return Err(GraphError::Bucket {
                graph,
                bucket,
                source,
            });
        }
        let rows = self.rows_of(&inputs, batch)?;
        // A body that replaced an output during a lazy capture freed the family's buffer.
        self.inst.check(When::Replay)?;
        match self.buckets.pick(rows)? {
            Pick::Graph { index, bucket } => self.replay_bucket(&inputs, rows, index, bucket)?,
            Pick::Eager => self.run_eagerly(&inputs, rows)?,
        }
        Ok(self.outputs())
    }

    fn replay_bucket<I: BatchSources<B::Ins>>(
        &mut self,
        inputs: &I,
        rows: usize,
        index: usize,
        bucket: usize,
    ) -> Result<(), GraphError> {
        if self.buckets.recordings[index].is_none() {
            self.capture_bucket(index)?;
        }
        let of = self.buckets.largest();
        let batch = Batch { rows, bucket, of };
        self.inst.statics.batch = batch;
        self.eager = false;
        let recording = self.buckets.replayed(index, rows);
        match recording.verify.due() {
            Some((replay, tolerance)) => {
                let mut report = Self::verify_on(recording, &mut self.inst, inputs, tolerance)?;
                report.replay = Some(replay);
                report.into_result()?;
            }
            None => recording.replay(&mut self.inst, |dst, staging| {
                inputs.stage_rows(dst, batch, staging)
            })?,
        }
        Ok(())
    }

    /// One replay of `recording` on `inst` (its batch set) checked against the function run
    /// eagerly on the bucket's rows: copies of the inputs' rows padded with zeros, zeroed
    /// outputs; the caller's rows of each output are compared.
    fn verify_on<I: BatchSources<B::Ins>>(
        recording: &Recording,
        inst: &mut Instance<B>,
        inputs: &I,
        tolerance: Tolerance,
    ) -> Result<VerifyReport, GraphError> {
        let (site, rt) = (B::site(), recording.graph().runtime());
        let batch = inst.statics.batch;
        let statics = &inst.statics;
        let copies = inputs.copies_rows(&statics.inputs, rt, site, B::INPUTS, batch)?;
        let shadows = (statics.outputs).alloc_rows(rt, site, B::OUTPUTS, batch.of, batch.bucket)?;
        let mut eager = Statics::new(copies, shadows);
        eager.batch = Batch {
            of: batch.bucket,
            ..batch
        };
        let mut report = recording.verify(
            inst,
            eager,
            tolerance,
            |dst, staging| inputs.stage_rows(dst, batch, staging),
            |statics, verifier, eager| {
                (statics.outputs).valid_to(B::OUTPUTS, verifier, eager, statics.batch)
            },
        )?;
        report.bucket = Some(batch.bucket);
        Ok(report)
    }

    /// The generated `verify`: one replay of the bucket that holds the inputs' rows checked
    /// against the function run eagerly on that bucket's rows (see the generated method's
    /// documentation). A batch above every bucket has no graph to verify: an error.
    pub fn verify_rows<I: BatchSources<B::Ins>>(
        &mut self,
        inputs: I,
        batch: Option<usize>,
        tolerance: Tolerance,
    ) -> Result<VerifyReport, GraphError> {
        let rows = self.rows_of(&inputs, batch)?;
        self.inst.check(When::Replay)?;
        let Pick::Graph { index, bucket } = self.buckets.pick(rows)? else {
            return Err(self.buckets.above(rows));
        };
        self.eager = false;
        if self.buckets.recordings[index].is_none() {
            self.capture_bucket(index)?;
        }
        let of = self.buckets.largest();
        self.inst.statics.batch = Batch { rows, bucket, of };
        let recording = self.buckets.replayed(index, rows);
        Self::verify_on(recording, &mut self.inst, &inputs, tolerance)
    }

    /// A batch above every bucket: the function run eagerly on buffers of its own (kept
    /// for its outputs, reused while they are large enough).
    fn run_eagerly<I: BatchSources<B::Ins>>(
        &mut self,
        inputs: &I,
        rows: usize,
    ) -> Result<(), GraphError> {
        let (site, rt) = (B::site(), self.buckets.rt.clone());
        if self.overflow.as_ref().is_none_or(|o| o.batch.of < rows) {
            // The old buffers are freed before the new ones are made.
            self.overflow = None;
            let (statics, of) = (&self.inst.statics, self.buckets.largest());
            let ins = (statics.inputs).alloc_rows(&rt, site, B::INPUTS, of, rows)?;
            let outs = (statics.outputs).alloc_rows(&rt, site, B::OUTPUTS, of, rows)?;
            let mut overflow = Statics::new(ins, outs);
            overflow.batch.of = rows;
            self.overflow = Some(overflow);
        }
        let overflow = self.overflow.as_mut().expect("made above");
        overflow.batch = Batch {
            rows,
            bucket: rows,
            of: overflow.batch.of,
        };
        let staging = self.buckets.eager_run(rows);
        inputs.stage_rows(&mut overflow.inputs, overflow.batch, &staging)?;
        let mut book = AddressBook::new(site.name);
        overflow.outputs.record(B::OUTPUTS, &mut book);
        let ran = (self.inst.body).run(overflow, B::Ctx::try_from_runtime(&rt)?, &rt);
        // The body may have replaced an output (see `Rows`): reported, and the buffers made
        // anew next time.
        let moved = overflow.outputs.check(0, &book, When::Replay);
        if moved.is_err() {
            self.overflow = None;
        }
        moved?;
        ran?;
        self.eager = true;
        Ok(())
    }

    /// The caller's rows of the outputs as the last replay left them.
    pub fn outputs(&self) -> B::Outputs<'_> {
        match (&self.overflow, self.eager) {
            (Some(overflow), true) => B::outputs(overflow),
            _ => B::outputs(&self.inst.statics),
        }
    }

    /// The state, lent back between replays (see `TypedGraph::state_mut`): when some state
    /// lives on a stream other than the runtime's, this first waits for the replays in
    /// flight.
    pub fn state_mut(&mut self) -> B::State<'_> {
        for graph in self.buckets.graphs() {
            graph.settle();
        }
        self.inst.body.state_mut()
    }

    /// The graphs, one per bucket (ascending), with their capture facts, and what each
    /// bucket did so far (`buckets().stats()`).
    pub fn buckets(&self) -> &Buckets {
        &self.buckets
    }

    /// `Debug` of the generated type `name` that wraps this family.
    #[doc(hidden)]
    pub fn fmt_as(&self, name: &str, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct(name)
            .field("buckets", &self.buckets)
            .finish_non_exhaustive()
    }
}

impl<B: GraphBody> std::fmt::Debug for TypedFamily<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TypedFamily")
            .field("buckets", &self.buckets)
            .finish_non_exhaustive()
    }
}

/// Each live bucket's graph summary (nodes by kind, kernels by name, edges, memory,
/// timings; with islands, segment by segment), in ascending bucket order.
impl<B: GraphBody> std::fmt::Display for TypedFamily<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let buckets = &self.buckets;
        let live = buckets.recordings.iter().flatten().count();
        let sizes = buckets.family.sizes;
        write!(
            f,
            "bucket family `{}`: {live} of {} buckets live",
            buckets.site.name,
            sizes.len()
        )?;
        for (bucket, recording) in sizes.iter().zip(&buckets.recordings) {
            if let Some(recording) = recording {
                write!(f, "\n\nbucket {bucket}: ")?;
                std::fmt::Display::fmt(recording, f)?;
            }
        }
        Ok(())
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
