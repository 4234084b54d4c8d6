//! State: device data a graph reads or writes in place, by address.
//!
//! A captured graph has the device addresses of its `#[state]` buffers baked into its
//! kernels. Three things keep those addresses valid for as long as the graph lives:
//!
//! * **The graph holds the state.** A `#[state]` parameter is given to `capture` as a borrow
//!   (`&w`, `&mut kv`: the graph type then borrows it for its lifetime `'s`), as an `Arc`, or
//!   by value (the graph owns it: a `FooGraph<'static>` can live in a struct of yours). See
//!   [`Held`], [`HeldMut`], [`StateArg`] and [`StateArgMut`].
//! * **What is lent back cannot be replaced where the type allows it.** `state_mut()` lends
//!   each `&mut` state as its [`DeviceState::Lent`] form: a `CudaSlice<T>` is lent as a
//!   `CudaViewMut<T>`, which can be written into but not replaced or freed. Replacing one
//!   (`*graph.state_mut().w = other`) does not compile, and rustc says so in its own words
//!   (E0614, "type `CudaViewMut<'_, f32>` cannot be dereferenced": a view is a value, not a
//!   place, and no stable hook lets a library word that error): to give the graph new
//!   values, copy them into the view (`stream.memcpy_dtod(&other, &mut view)`,
//!   `stream.memcpy_htod(&host, &mut view)`), which keeps the address the graph reads.
//! * **What the type cannot protect is checked.** For state the macro cannot see into (a
//!   struct of yours holding buffers), the graph records every device address at capture
//!   ([`AddressBook`]) and compares them before every replay: one pointer comparison per
//!   buffer, no allocation. A buffer that was replaced, freed or reallocated is a typed
//!   error ([`GraphError::StateMoved`]) naming the parameter, and nothing is launched. The
//!   same check runs after every warmup run and after the capture, so a body that replaces
//!   its own `&mut` parameters is refused too.
//!
//! [`DeviceState`] is what tells the runtime where a value's device memory is. It is
//! implemented for cudarc's buffers, the runtime's generators, common containers and host
//! scalars; `#[derive(DeviceState)]` implements it for a struct of yours, field by field
//! (`#[device_state(skip)]` leaves a field out).
//!
//! Warmup runs the body eagerly before the capture, which would leave `&mut` state (a KV
//! cache, optimizer moments, a step counter) advanced by the warmup. By default the graph
//! snapshots every `&mut` state on the device before the warmup and restores it afterwards
//! (the size is [`GraphInfo::state_snapshot_bytes`](crate::GraphInfo::state_snapshot_bytes)),
//! so the first replay sees what the first eager call would have seen; `#[state(no_restore)]`
//! opts a parameter out when it is too large to copy or the warmup's updates are wanted.
//!
//! This file holds the trait, the held forms and the address book; `state/impls.rs` holds
//! [`DeviceState`] for cudarc's types, host scalars and containers.

use std::sync::Arc;

use crate::error::GraphError;
use crate::error::When;
pub use crate::region::{DeviceRegion, Elem};

mod impls;
#[cfg(test)]
mod tests;

pub(crate) use impls::lent_shared;
#[doc(hidden)]
pub use impls::HostData;
pub use impls::PinnedLend;

/// Where a value keeps its device memory, and how it is lent back from a graph.
///
/// The runtime uses it to check that a graph's state still has the addresses it was
/// captured with, to snapshot `&mut` state around the warmup, and to lend `&mut` state back
/// between replays in a form that cannot replace the buffers where the type allows it.
///
/// Implement it with `#[derive(DeviceState)]` on a struct whose fields implement it;
/// `#[device_state(skip)]` leaves out a field that holds no device memory the graph uses.
/// Skipping gives up every guarantee for that field: its addresses are neither recorded nor
/// checked, it is not snapshotted around the warmup nor compared by `verify`, and
/// `state_mut()` lends it like the rest of the struct, so it can be replaced and the graph
/// then replays with the old addresses. A model of another crate that holds device memory
/// belongs in `graph_runtime::candle::ModelState` (feature `candle`), not in a skipped field.
///
/// # Safety
/// The runtime writes to the regions an implementation reports (it restores them after the
/// warmup) and launches graphs on the strength of their addresses being unchanged, so an
/// implementation must report, always in the same order, every device buffer reachable from
/// the value that a graph may read or write, and only buffers the value keeps allocated for
/// as long as it lives. Replacing or freeing one of them must change what it reports. Regions
/// can only be made by the runtime's own implementations (for `CudaSlice`, generators, …), so
/// a composite implementation reports them by forwarding to its fields, as the derive does.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be held by a CUDA graph: the runtime cannot see its device buffers",
    label = "a graph's `#[state]`, inputs and outputs must implement `DeviceState`",
    note = "add `#[derive(graph_runtime::DeviceState)]` to a struct of yours (fields that hold no device memory can be marked `#[device_state(skip)]`)"
)]
pub unsafe trait DeviceState {
    /// What `state_mut()` lends for a `&mut` state of this type.
    type Lent<'a>
    where
        Self: 'a;

    /// Whether the graph compares this value's addresses before every replay. Types whose
    /// [`Lent`](DeviceState::Lent) form cannot replace their buffers, and whose address can
    /// only be read with a host synchronisation, set it to `false`; the check after every
    /// warmup run and after the capture still happens.
    const REPLAY_CHECK: bool = true;

    /// Whether the value lives on the host only (a scalar, a `String`, and containers of
    /// them): a graph holds only GPU work, so updates a body makes to such a value as `&mut`
    /// `#[state]` happen in the warmup runs and at capture, never on replay. `#[cuda_graph]`
    /// refuses `&mut` state of such a type at compile time (unless the function opts into
    /// `host_effects_not_replayed`), also when the type is named through an alias the macro
    /// cannot see through. `#[derive(DeviceState)]` sets it when every field it visits is
    /// host-only (a struct of counters and names); `false` for every type that may hold device
    /// memory, and the default for implementations by hand.
    const HOST_ONLY: bool = false;

    /// Calls `visit` with every buffer this value holds, always in the same order.
    fn regions(&self, visit: &mut dyn FnMut(DeviceRegion));

    /// Lends the value back between replays.
    fn lend(&mut self) -> Self::Lent<'_>;
}

/// A read-only `#[state]` as a graph holds it: borrowed for the graph's lifetime, shared
/// through an `Arc`, or owned.
#[derive(Debug)]
pub enum Held<'s, T: ?Sized> {
    /// Borrowed: the graph type is `FooGraph<'s>`.
    Borrowed(&'s T),
    /// Shared with the rest of the program.
    Shared(Arc<T>),
    /// Owned by the graph.
    Owned(Box<T>),
}

impl<T: ?Sized> std::ops::Deref for Held<'_, T> {
    type Target = T;

    #[inline]
    fn deref(&self) -> &T {
        match self {
            Held::Borrowed(t) => t,
            Held::Shared(t) => t,
            Held::Owned(t) => t,
        }
    }
}

/// A `&mut` `#[state]` as a graph holds it: borrowed exclusively for the graph's lifetime,
/// or owned.
#[derive(Debug)]
pub enum HeldMut<'s, T: ?Sized> {
    /// Borrowed: the graph type is `FooGraph<'s>`.
    Borrowed(&'s mut T),
    /// Owned by the graph.
    Owned(Box<T>),
}

impl<T: ?Sized> std::ops::Deref for HeldMut<'_, T> {
    type Target = T;

    #[inline]
    fn deref(&self) -> &T {
        match self {
            HeldMut::Borrowed(t) => t,
            HeldMut::Owned(t) => t,
        }
    }
}

impl<T: ?Sized> std::ops::DerefMut for HeldMut<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        match self {
            HeldMut::Borrowed(t) => t,
            HeldMut::Owned(t) => t,
        }
    }
}

/// What `capture` accepts for a read-only `#[state] w: &T`: `&T` (the graph borrows it),
/// `Arc<T>` (shared) or `T` (the graph owns it).
#[diagnostic::on_unimplemented(
    message = "a read-only `#[state]` of type `{T}` is given to `capture` as `&{T}`, `Arc<{T}>` or `{T}`, not `{Self}`",
    label = "pass `&value` to borrow it for the graph's lifetime, an `Arc` to share it, or the value to move it into the graph"
)]
pub trait StateArg<'s, T: ?Sized> {
    /// The state as the graph holds it.
    fn into_held(self) -> Held<'s, T>;
}

impl<'s, T: ?Sized> StateArg<'s, T> for &'s T {
    fn into_held(self) -> Held<'s, T> {
        Held::Borrowed(self)
    }
}

impl<'s, T: ?Sized + 's> StateArg<'s, T> for Arc<T> {
    fn into_held(self) -> Held<'s, T> {
        Held::Shared(self)
    }
}

impl<'s, T: 's> StateArg<'s, T> for T {
    fn into_held(self) -> Held<'s, T> {
        Held::Owned(Box::new(self))
    }
}

/// What `capture` accepts for a `#[state] kv: &mut T`: `&mut T` (the graph borrows it
/// exclusively) or `T` (the graph owns it).
#[diagnostic::on_unimplemented(
    message = "a `&mut` `#[state]` of type `{T}` is given to `capture` as `&mut {T}` or `{T}`, not `{Self}`",
    label = "pass `&mut value` to lend it to the graph for its lifetime, or the value to move it into the graph"
)]
pub trait StateArgMut<'s, T: ?Sized> {
    /// The state as the graph holds it.
    fn into_held_mut(self) -> HeldMut<'s, T>;
}

impl<'s, T: ?Sized> StateArgMut<'s, T> for &'s mut T {
    fn into_held_mut(self) -> HeldMut<'s, T> {
        HeldMut::Borrowed(self)
    }
}

impl<'s, T: 's> StateArgMut<'s, T> for T {
    fn into_held_mut(self) -> HeldMut<'s, T> {
        HeldMut::Owned(Box::new(self))
    }
}

/// What a parameter recorded in an [`AddressBook`] is to the graph (for generated code).
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded {
    /// An output buffer the graph owns (the body gets it as `&mut`).
    Output,
    /// Read-only state.
    State,
    /// `&mut` state; `restore` unless `#[state(no_restore)]`: snapshotted before the warmup
    /// and restored after it.
    StateMut {
        /// Whether the warmup's updates are undone.
        restore: bool,
    },
}

impl Recorded {
    /// `&mut` state, its warmup's updates undone when `restore` (see
    /// [`Recorded::StateMut`]).
    pub const fn mutable(restore: bool) -> Self {
        Recorded::StateMut { restore }
    }
}

/// What a graph does with each of its state parameters in turn: record its addresses
/// ([`AddressBook::recorder`]) or check them ([`AddressBook::checker`]). The generated
/// `GraphBody::states` hands every state to one, so that recording and checking are one
/// generated item.
#[doc(hidden)]
pub trait StateVisitor {
    /// Visits state `name` (the function's parameter), recorded as `kind`.
    fn state<T: DeviceState + ?Sized>(
        &mut self,
        name: &'static str,
        value: &T,
        kind: Recorded,
    ) -> Result<(), GraphError>;
}

/// Records each visited state in the book (see [`AddressBook::recorder`]).
#[doc(hidden)]
#[derive(Debug)]
pub struct Recorder<'b>(&'b mut AddressBook);

impl StateVisitor for Recorder<'_> {
    fn state<T: DeviceState + ?Sized>(
        &mut self,
        name: &'static str,
        value: &T,
        kind: Recorded,
    ) -> Result<(), GraphError> {
        self.0.record(name, value, kind);
        Ok(())
    }
}

/// Checks each visited state against its entry, from index 0 on (see
/// [`AddressBook::checker`]).
#[doc(hidden)]
#[derive(Debug)]
pub struct Checker<'b> {
    book: &'b AddressBook,
    next: usize,
    when: When,
}

impl StateVisitor for Checker<'_> {
    #[inline]
    fn state<T: DeviceState + ?Sized>(
        &mut self,
        _: &'static str,
        value: &T,
        _: Recorded,
    ) -> Result<(), GraphError> {
        let index = self.next;
        self.next += 1;
        self.book.check(index, value, self.when)
    }
}

/// One parameter's entry in an [`AddressBook`].
#[derive(Debug, Clone)]
struct Entry {
    name: &'static str,
    start: usize,
    end: usize,
    kind: Recorded,
}

/// The device addresses a graph was captured with, per parameter, so that they can be
/// compared later without allocating.
///
/// Machinery of the code `#[cuda_graph]` generates, like `__private`: a book keeps no borrow
/// of what it recorded, so only the generated graph types, which hold that state for their
/// whole life, may use one.
#[doc(hidden)]
#[derive(Debug, Clone)]
pub struct AddressBook {
    graph: &'static str,
    entries: Vec<Entry>,
    regions: Vec<DeviceRegion>,
}

impl AddressBook {
    /// Whether some buffer of the state is freed on a stream other than `stream` (the
    /// runtime's): such a buffer, freed or replaced while a replay runs, would not wait for
    /// it, so the graph waits for its replays before it lends that state or is dropped.
    pub(crate) fn frees_on_other_streams(&self, stream: &cudarc::driver::CudaStream) -> bool {
        let ours = stream.cu_stream() as usize as u64;
        self.regions
            .iter()
            .any(|r| r.stream != 0 && r.stream != ours)
    }

    /// An empty book for graph `graph`.
    pub fn new(graph: &'static str) -> Self {
        AddressBook {
            graph,
            entries: Vec::new(),
            regions: Vec::new(),
        }
    }

    /// A visitor that records each state it is given, in order (indices from 0 when the
    /// book is new).
    pub fn recorder(&mut self) -> Recorder<'_> {
        Recorder(self)
    }

    /// A visitor that checks each state it is given against the entries from index 0 on,
    /// in the order they were recorded.
    #[inline]
    pub fn checker(&self, when: When) -> Checker<'_> {
        Checker {
            book: self,
            next: 0,
            when,
        }
    }

    /// How many parameters were recorded: the index the next one gets.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no parameter was recorded.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Records the addresses of parameter `name`. Returns the parameter's index for
    /// [`AddressBook::check`].
    pub fn record<T: DeviceState + ?Sized>(
        &mut self,
        name: &'static str,
        value: &T,
        kind: Recorded,
    ) -> usize {
        let start = self.regions.len();
        value.regions(&mut |r| self.regions.push(r));
        self.entries.push(Entry {
            name,
            start,
            end: self.regions.len(),
            kind,
        });
        self.entries.len() - 1
    }

    /// Checks that parameter `index` still holds the buffers it was recorded with. Allocates
    /// nothing unless it fails.
    #[inline]
    pub fn check<T: DeviceState + ?Sized>(
        &self,
        index: usize,
        value: &T,
        when: When,
    ) -> Result<(), GraphError> {
        if when == When::Replay && !T::REPLAY_CHECK {
            return Ok(());
        }
        let entry = &self.entries[index];
        let expected = &self.regions[entry.start..entry.end];
        let mut seen = 0usize;
        let mut first_difference: Option<(usize, DeviceRegion)> = None;
        value.regions(&mut |r| {
            if first_difference.is_none() && expected.get(seen) != Some(&r) {
                first_difference = Some((seen, r));
            }
            seen += 1;
        });
        if first_difference.is_none() && seen == expected.len() {
            return Ok(());
        }
        Err(self.moved(entry, when, seen, first_difference))
    }

    #[cold]
    fn moved(
        &self,
        entry: &Entry,
        when: When,
        seen: usize,
        first_difference: Option<(usize, DeviceRegion)>,
    ) -> GraphError {
        let expected = &self.regions[entry.start..entry.end];
        let detail = match first_difference {
            Some((i, now)) => match expected.get(i) {
                Some(was) if was.is_handle() || now.is_handle() => format!(
                    "entry {} of {} is a CUDA handle (function, stream, context, event or \
                     communicator) or a tensor a `ModelState` reads, that was {:#x} and is now \
                     {:#x}: the graph still uses the old one",
                    i + 1,
                    expected.len(),
                    was.ptr,
                    now.ptr
                ),
                Some(was) => format!(
                    "buffer {} of {} was {} at {:#x} and is now {} at {:#x}",
                    i + 1,
                    expected.len(),
                    crate::error::bytes(was.bytes),
                    was.ptr,
                    crate::error::bytes(now.bytes),
                    now.ptr
                ),
                None => format!(
                    "it held {} buffer(s) at capture and now holds {seen}",
                    expected.len()
                ),
            },
            None => format!(
                "it held {} buffer(s) at capture and now holds {seen}",
                expected.len()
            ),
        };
        GraphError::StateMoved {
            graph: self.graph,
            param: entry.name,
            when,
            detail,
        }
    }

    /// Every region of every parameter.
    pub(crate) fn regions(&self) -> impl Iterator<Item = DeviceRegion> + '_ {
        self.regions.iter().copied()
    }

    /// The device regions of every `&mut` state recorded to be restored after the warmup.
    pub(crate) fn restorable(&self) -> impl Iterator<Item = DeviceRegion> + '_ {
        self.regions_where(|k| k == Recorded::StateMut { restore: true })
    }

    /// The device regions of every `&mut` state.
    pub(crate) fn mutable(&self) -> impl Iterator<Item = DeviceRegion> + '_ {
        self.regions_where(|k| matches!(k, Recorded::StateMut { .. }))
    }

    /// Every `&mut` state parameter with its device regions.
    pub(crate) fn mutable_entries(&self) -> Vec<(&'static str, Vec<DeviceRegion>)> {
        self.entries
            .iter()
            .filter(|e| matches!(e.kind, Recorded::StateMut { .. }))
            .map(|e| (e.name, self.device_regions(e).collect()))
            .collect()
    }

    fn device_regions<'b>(&'b self, e: &Entry) -> impl Iterator<Item = DeviceRegion> + 'b {
        self.regions[e.start..e.end]
            .iter()
            .copied()
            .filter(|r| !r.host && r.bytes > 0)
    }

    fn regions_where<'b>(
        &'b self,
        keep: impl Fn(Recorded) -> bool + 'b,
    ) -> impl Iterator<Item = DeviceRegion> + 'b {
        self.entries
            .iter()
            .filter(move |e| keep(e.kind))
            .flat_map(|e| self.device_regions(e))
    }

    /// The graph this book belongs to.
    pub fn graph(&self) -> &'static str {
        self.graph
    }
}
