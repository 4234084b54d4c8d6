//! [`DeviceState`] for the types the runtime knows: cudarc's buffers, pinned host memory,
//! handles (streams, events, functions, modules), host scalars, and the common containers
//! (`Box`, `Arc`, `Vec`, arrays, `Option`, tuples), which forward to their contents.

use std::sync::Arc;

use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaModule, CudaSlice, CudaStream, CudaViewMut,
    DevicePtr, PinnedHostSlice,
};

use super::{DeviceRegion, DeviceState, Elem};
use crate::error::GraphError;

/// Implements [`DeviceState`] for a type a graph lends back as a shared borrow (`&T`): a body
/// uses it through `&self` methods and cannot replace it. `|this, visit| regions` is the body
/// of [`DeviceState::regions`] (`this` is `&T`); doc comments before the type go on the impl.
///
/// Put the `// SAFETY:` comment on the invocation: why the regions it reports are all the
/// device memory (and handles) of the value that a graph reads by address.
macro_rules! lent_shared {
    ($(#[$attr:meta])* $t:ty, |$this:pat_param, $visit:pat_param| $regions:expr $(,)?) => {
        $(#[$attr])*
        // SAFETY: stated where the macro is invoked.
        unsafe impl $crate::state::DeviceState for $t {
            type Lent<'a> = &'a $t where Self: 'a;

            fn regions(&self, $visit: &mut dyn FnMut($crate::state::DeviceRegion)) {
                let $this = self;
                $regions
            }

            fn lend(&mut self) -> &$t {
                self
            }
        }
    };
}
pub(crate) use lent_shared;

// SAFETY: one region, the slice's own allocation, which it keeps until dropped; replacing
// the slice changes its address.
unsafe impl<T: 'static> DeviceState for CudaSlice<T> {
    type Lent<'a>
        = CudaViewMut<'a, T>
    where
        Self: 'a;

    fn regions(&self, visit: &mut dyn FnMut(DeviceRegion)) {
        let (ptr, _sync) = self.device_ptr(self.stream());
        visit(DeviceRegion {
            elem: Elem::of::<T>(),
            stream: self.stream().cu_stream() as usize as u64,
            ..DeviceRegion::device(ptr, self.num_bytes())
        });
    }

    fn lend(&mut self) -> CudaViewMut<'_, T> {
        self.as_view_mut()
    }
}

// SAFETY: one (host) region, the buffer's own page-locked allocation.
unsafe impl<T: cudarc::driver::ValidAsZeroBits> DeviceState for PinnedHostSlice<T> {
    type Lent<'a>
        = PinnedLend<'a, T>
    where
        Self: 'a;

    // Reading a pinned buffer's address waits for its last copy; it cannot be replaced
    // through `PinnedLend`, so replays skip the check.
    const REPLAY_CHECK: bool = false;

    fn regions(&self, visit: &mut dyn FnMut(DeviceRegion)) {
        let ptr = self.as_ptr().map_or(0, |p| p as u64);
        visit(DeviceRegion {
            ptr,
            bytes: self.num_bytes(),
            host: true,
            elem: Elem::Bytes,
            stream: 0,
        });
    }

    fn lend(&mut self) -> PinnedLend<'_, T> {
        PinnedLend(self)
    }
}

/// A pinned host buffer lent back by a graph: its contents can be read and written, the
/// buffer itself cannot be replaced.
#[derive(Debug)]
pub struct PinnedLend<'a, T>(&'a mut PinnedHostSlice<T>);

impl<T: cudarc::driver::ValidAsZeroBits> PinnedLend<'_, T> {
    /// The contents, after waiting for the copies that use the buffer.
    pub fn as_slice(&self) -> Result<&[T], GraphError> {
        Ok(self.0.as_slice()?)
    }

    /// The contents, writable, after waiting for the copies that use the buffer.
    pub fn as_mut_slice(&mut self) -> Result<&mut [T], GraphError> {
        Ok(self.0.as_mut_slice()?)
    }
}

impl<T> PinnedLend<'_, T> {
    /// Elements in the buffer.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Implements [`DeviceState`] for host values: they hold no device memory and a graph
/// records nothing of them by address.
macro_rules! host_values {
    ($($t:ty),* $(,)?) => {$(
        impl HostData for $t {}
        // SAFETY: no regions: these types hold no device memory.
        unsafe impl DeviceState for $t {
            type Lent<'a> = &'a mut $t where Self: 'a;
            const HOST_ONLY: bool = true;
            fn regions(&self, _visit: &mut dyn FnMut(DeviceRegion)) {}
            fn lend(&mut self) -> &mut $t {
                self
            }
        }
    )*};
}

host_values!(
    (),
    bool,
    char,
    u8,
    u16,
    u32,
    u64,
    u128,
    usize,
    i8,
    i16,
    i32,
    i64,
    i128,
    isize,
    f32,
    f64,
    String,
);

/// Implements [`DeviceState`] for cudarc handles a captured graph depends on (the function
/// its kernel nodes launch, a stream, a context, an event): lent read-only, so they cannot
/// be replaced through the graph, and reported as a handle region, so that replacing one
/// inside a struct of yours is [`GraphError::StateMoved`](crate::GraphError::StateMoved)
/// before the next replay instead of a launch of unloaded code.
macro_rules! handles {
    ($($t:ty => $raw:ident),* $(,)?) => {$(
        // SAFETY: one handle region, the handle's own identity, which changes when the
        // handle is replaced; no memory is reported.
        lent_shared!($t, |h, visit| visit(DeviceRegion::handle(h.$raw() as usize as u64)));
    )*};
}

handles!(
    CudaFunction => cu_function,
    CudaStream => cu_stream,
    CudaContext => cu_ctx,
    CudaEvent => cu_event,
);

impl HostData for CudaFunction {}
impl HostData for CudaStream {}
impl HostData for CudaContext {}
impl HostData for CudaEvent {}

// SAFETY: no regions: cudarc does not expose a module's handle. A module is lent read-only;
// the functions a graph launches keep their module loaded themselves (`CudaFunction` holds
// it), and a `CudaFunction` in state is checked by identity.
lent_shared!(CudaModule, |_, _| {});

// SAFETY: forwards to the boxed value, which the box owns.
unsafe impl<T: DeviceState + ?Sized> DeviceState for Box<T> {
    type Lent<'a>
        = T::Lent<'a>
    where
        Self: 'a;
    const REPLAY_CHECK: bool = T::REPLAY_CHECK;
    const HOST_ONLY: bool = T::HOST_ONLY;

    fn regions(&self, visit: &mut dyn FnMut(DeviceRegion)) {
        (**self).regions(visit);
    }

    fn lend(&mut self) -> T::Lent<'_> {
        (**self).lend()
    }
}

// SAFETY: forwards to the shared value, alive while any `Arc` is.
unsafe impl<T: DeviceState + ?Sized> DeviceState for Arc<T> {
    type Lent<'a>
        = &'a T
    where
        Self: 'a;
    const REPLAY_CHECK: bool = T::REPLAY_CHECK;

    fn regions(&self, visit: &mut dyn FnMut(DeviceRegion)) {
        (**self).regions(visit);
    }

    fn lend(&mut self) -> &T {
        self
    }
}

/// Implements [`DeviceState`] for containers that forward to every element they hold, in
/// order (an `Option` holds none or one), lent back as `&mut` the container.
macro_rules! containers {
    ($([$($generics:tt)*] $t:ty),* $(,)?) => {$(
        // SAFETY: forwards to every element, in order; the container owns them.
        unsafe impl<$($generics)*> DeviceState for $t {
            type Lent<'a> = &'a mut $t where Self: 'a;
            const HOST_ONLY: bool = T::HOST_ONLY;

            fn regions(&self, visit: &mut dyn FnMut(DeviceRegion)) {
                for item in self.iter() {
                    item.regions(visit);
                }
            }

            fn lend(&mut self) -> &mut $t {
                self
            }
        }
    )*};
}

containers!(
    [T: DeviceState] Vec<T>,
    [T: DeviceState, const N: usize] [T; N],
    [T: DeviceState] Option<T>,
);

/// The [`DeviceState`] types that hold no device memory at all, whatever their values (the
/// ones whose `HOST_ONLY` is always true), as a trait: how the checks around eager islands
/// tell a host value from device data at compile time (see `crate::capture::Probe`).
#[doc(hidden)]
pub trait HostData {}

impl<T: HostData + ?Sized> HostData for Arc<T> {}
impl<T: HostData + ?Sized> HostData for Box<T> {}
impl<T: HostData> HostData for Vec<T> {}
impl<T: HostData, const N: usize> HostData for [T; N] {}
impl<T: HostData> HostData for Option<T> {}
impl<A: HostData> HostData for (A,) {}
impl<A: HostData, B: HostData> HostData for (A, B) {}
impl<A: HostData, B: HostData, C: HostData> HostData for (A, B, C) {}
impl<A: HostData, B: HostData, C: HostData, D: HostData> HostData for (A, B, C, D) {}

macro_rules! tuples {
    ($(($($n:tt $t:ident),+)),* $(,)?) => {$(
        // SAFETY: forwards to every element, in order.
        unsafe impl<$($t: DeviceState),+> DeviceState for ($($t,)+) {
            type Lent<'a> = &'a mut ($($t,)+) where Self: 'a;
            const HOST_ONLY: bool = true $(&& $t::HOST_ONLY)+;

            fn regions(&self, visit: &mut dyn FnMut(DeviceRegion)) {
                $(self.$n.regions(visit);)+
            }

            fn lend(&mut self) -> &mut ($($t,)+) {
                self
            }
        }
    )*};
}

tuples!((0 A), (0 A, 1 B), (0 A, 1 B, 2 C), (0 A, 1 B, 2 C, 3 D));
