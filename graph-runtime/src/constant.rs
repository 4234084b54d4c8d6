//! `#[constant]` parameters: host values fixed at capture.

/// A value a graph can take as a `#[constant]`: plain host data, copied into the graph type
/// at capture and handed to every eager call (`verify`, the warmup) by copy.
///
/// Only `Copy` types qualify. A constant that owned device memory (a `CudaSlice<T>`, an
/// `Arc<Mutex<CudaSlice<T>>>`) would let code outside the graph replace a buffer whose
/// address the graph recorded, with no borrow to stop it and no check before the next
/// replay; such data is `#[state]`, whose addresses are checked. `Copy` does not rule out a
/// `'static` reference to device memory (`&'static Mutex<CudaSlice<T>>`): nothing checks
/// what such a reference points to, so do not pass device memory that way.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a `#[constant]` of a CUDA graph: a constant must be plain host data (`Copy`)",
    label = "not `Copy`",
    note = "a constant is frozen into the graph at capture; device memory, or anything that holds it, goes in `#[state]`, which the graph borrows or owns and checks before every replay"
)]
pub trait GraphConstant: Copy {}

impl<T: Copy> GraphConstant for T {}

/// The copy of a constant that an eager call of the body receives.
#[doc(hidden)]
pub fn constant<T: GraphConstant>(value: &T) -> T {
    *value
}
