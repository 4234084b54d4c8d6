//! Where device memory is and what it holds: the leaf types every check of a graph's
//! buffers is written in (addresses, sizes, element types).

/// One buffer a graph reads or writes by address: its start, its size in bytes and, where
/// known, what its elements are (so a verification can report numeric errors).
///
/// Only the runtime makes regions (from real buffers), so a [`DeviceState`] implementation
/// can report regions only by forwarding its fields' regions.
///
/// [`DeviceState`]: crate::DeviceState
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceRegion {
    pub(crate) ptr: u64,
    pub(crate) bytes: usize,
    pub(crate) host: bool,
    pub(crate) elem: Elem,
    /// The raw stream the buffer is freed on (cudarc frees a `CudaSlice` on its own stream),
    /// or 0 where that does not apply.
    pub(crate) stream: u64,
}

impl DeviceRegion {
    /// The address (a device pointer, or a pinned host pointer).
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// The buffer's size in bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Whether this is pinned host memory rather than device memory.
    pub fn is_host(&self) -> bool {
        self.host
    }

    /// The element type, or [`Elem::Bytes`] when unknown.
    pub fn elem(&self) -> Elem {
        self.elem
    }

    /// A CUDA handle (function, stream, context, event) a graph depends on: no bytes, only
    /// its identity, so that the address check notices when it is replaced.
    pub(crate) fn handle(raw: u64) -> Self {
        DeviceRegion::device(raw, 0)
    }

    /// Whether this stands for a CUDA handle rather than memory.
    pub fn is_handle(&self) -> bool {
        self.bytes == 0 && !self.host
    }

    /// A region of device memory whose elements are not known.
    pub(crate) fn device(ptr: u64, bytes: usize) -> Self {
        DeviceRegion {
            ptr,
            bytes,
            host: false,
            elem: Elem::Bytes,
            stream: 0,
        }
    }
}

/// The element type of a buffer, as far as verification needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Elem {
    /// Unknown: compared bit for bit, byte by byte.
    Bytes,
    /// `f32`.
    F32,
    /// `f64`.
    F64,
    /// A signed integer of this many bytes.
    Int(u8),
    /// An unsigned integer of this many bytes.
    UInt(u8),
}

impl Elem {
    /// The element type of `T`, for the types verification can read as numbers.
    pub fn of<T: 'static>() -> Elem {
        use std::any::TypeId;
        let t = TypeId::of::<T>();
        let table: [(TypeId, Elem); 10] = [
            (TypeId::of::<f32>(), Elem::F32),
            (TypeId::of::<f64>(), Elem::F64),
            (TypeId::of::<i8>(), Elem::Int(1)),
            (TypeId::of::<i16>(), Elem::Int(2)),
            (TypeId::of::<i32>(), Elem::Int(4)),
            (TypeId::of::<i64>(), Elem::Int(8)),
            (TypeId::of::<u8>(), Elem::UInt(1)),
            (TypeId::of::<u16>(), Elem::UInt(2)),
            (TypeId::of::<u32>(), Elem::UInt(4)),
            (TypeId::of::<u64>(), Elem::UInt(8)),
        ];
        table
            .iter()
            .find(|(id, _)| *id == t)
            .map_or(Elem::Bytes, |(_, e)| *e)
    }

    /// Bytes per element (1 for [`Elem::Bytes`]).
    pub fn size(self) -> usize {
        match self {
            Elem::Bytes => 1,
            Elem::F32 => 4,
            Elem::F64 => 8,
            Elem::Int(n) | Elem::UInt(n) => n as usize,
        }
    }
}
