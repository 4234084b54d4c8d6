//! What the walker knows about the names of a body: the parameters, from the model (their
//! role and declared type), and the locals, from their `let`s; block-scoped, so a shadowing
//! binding hides what an outer one knew.
//!
//! Imports `model`, `tokens` and the name tables (`names.rs`, candle's among them) only;
//! never the rules, the walker or this folder's `mod.rs`.
//!
//! The one question that lets a rule stand down is whether a method's receiver is provably
//! a value of the user's own type ([`Kind::Users`]). Everything else (a CUDA object, a value
//! of unknown type) is treated alike: a method named like a CUDA operation on it is reported.

use std::collections::HashMap;

use proc_macro2::Ident;
use syn::visit::{self, Visit};
use syn::{Expr, Pat, Type};

use super::names::any_framework;
use crate::model::{GraphFn, Role};
use crate::tokens::{segment_names, unraw};

/// Types of cudarc and of the runtime (by their last path segment) whose methods are CUDA
/// operations. A type naming one anywhere (`Arc<CudaStream>`) is a CUDA type.
const CUDA_TYPES: &[&str] = &[
    "CudaContext",
    "CudaStream",
    "CudaEvent",
    "CudaSlice",
    "CudaView",
    "CudaViewMut",
    "CudaFunction",
    "CudaModule",
    "CudaGraph",
    "PinnedHostSlice",
    "CudaBlas",
    "CudaBlasLT",
    "Ptx",
    "Runtime",
    "Generator",
    "Graph",
    "EarlyLaunch",
    "LaunchArgs",
    // The runtime's NCCL types (feature `nccl`).
    "Communicator",
    "CommGroup",
    "SymmetricBuffer",
];

/// Crates whose paths make a type CUDA's (`cudarc::driver::CudaStream`, `graph_runtime::X`).
const CUDA_CRATES: &[&str] = &[
    "cudarc",
    "graph_runtime",
    "driver",
    "nvrtc",
    "cublas",
    "cublaslt",
];

/// Random generators and their traits: not the user's own types, their methods draw numbers.
const RNG_TYPES: &[&str] = &[
    "Rng",
    "RngCore",
    "TryRngCore",
    "SeedableRng",
    "SliceRandom",
    "IndexedRandom",
    "IndexedMutRandom",
    "IteratorRandom",
    "SmallRng",
    "StdRng",
    "ThreadRng",
    "OsRng",
    "ChaCha8Rng",
    "ChaCha12Rng",
    "ChaCha20Rng",
    "Xoshiro128PlusPlus",
    "Xoshiro256PlusPlus",
    "Pcg32",
    "Pcg64",
    "Distribution",
];

/// Crates of random generators.
const RNG_CRATES: &[&str] = &[
    "rand",
    "rand_core",
    "rand_chacha",
    "rand_pcg",
    "rand_xoshiro",
    "rand_distr",
    "fastrand",
];

/// Host collections: methods that change them are bookkeeping.
const COLLECTIONS: &[&str] = &[
    "Vec", "VecDeque", "HashMap", "BTreeMap", "HashSet", "BTreeSet", "String",
];

/// Wrappers of the standard library looked through to the type they hold.
const WRAPPERS: &[&str] = &[
    "Arc", "Rc", "Box", "RefCell", "Cell", "Mutex", "RwLock", "Option",
];

/// Other types of the standard library and primitives: not the user's, not CUDA's.
const STD_TYPES: &[&str] = &[
    "f32",
    "f64",
    "i8",
    "i16",
    "i32",
    "i64",
    "i128",
    "isize",
    "u8",
    "u16",
    "u32",
    "u64",
    "u128",
    "usize",
    "bool",
    "char",
    "str",
    "Duration",
    "Instant",
    "SystemTime",
    "Path",
    "PathBuf",
];

/// What a name is known to be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Nothing is known: a method named like a CUDA operation on it is reported.
    Unknown,
    /// A cudarc, runtime or candle object (a stream, a context, a buffer, the runtime, a
    /// tensor, a candle device).
    Cuda,
    /// cudarc's `PinnedHostSlice`.
    PinnedHost,
    /// A host collection of the standard library.
    HostCollection,
    /// A random generator.
    Rng,
    /// A primitive or another type of the standard library.
    Std,
    /// A type of the user's own: its methods are the user's.
    Users,
    /// A type of the user's own built from a CUDA value (`Fence::from(event)`,
    /// `Sampler::new(rt, 0.8)`): its methods are the user's, except the names a type commonly
    /// forwards to the CUDA object it holds (`synchronize`, `query`, `is_complete`: the rules'
    /// loose methods).
    Wraps,
}

/// What the walker knows about one name.
#[derive(Clone, Debug)]
pub struct Binding {
    pub kind: Kind,
    /// A parameter of the function (not a local).
    pub param: bool,
    /// A device buffer of the body, which formatting macros must not be given.
    pub device_buffer: bool,
    /// Set when the value was read back from the device: how, for the message.
    pub device_data: Option<DeviceData>,
    /// Bound to candle's CPU device (`let cpu = Device::Cpu;`).
    pub cpu_device: bool,
    /// Bound to a null pointer (`let null = ptr::null_mut();`), a legacy stream when a raw
    /// call takes it as its stream.
    pub null_pointer: bool,
    /// Bound to a call chain rooted in a CUDA value (`let ev = rt.stream().record_event(None)?;`):
    /// a CUDA value when it is given to a constructor of the user's ([`Scope::wraps_cuda`]).
    pub cuda_rooted: bool,
    /// Bound to a reference, a clone or a guard of a `static` (`let step = &STEP;`,
    /// `let s = Arc::clone(&STATE);`): the static's name. Its uses are judged like the
    /// static's ([`Scope::static_root`]).
    pub static_ref: Option<String>,
    /// `static_ref` is held as a copy (see [`StaticRoot::by_copy`]).
    pub static_copy: bool,
}

/// The `static` a place or receiver reaches ([`Scope::static_root`]): its name, and the local
/// it is reached through, when it is.
pub struct StaticRoot {
    pub name: String,
    pub through: Option<String>,
    /// Reached through a local that holds a copy of the static's value (`DEFAULTS.clone()`,
    /// `Arc::clone(&CONFIG)`), not a reference or a guard: an assignment to it changes the
    /// copy, and only a lock or a cell reached through it can touch the static.
    pub by_copy: bool,
}

impl StaticRoot {
    /// The place in a message: `` `STEP.fetch_add()` ``, or `` `STEP.fetch_add()` through
    /// `step` `` for `step.fetch_add()`, `tail` written after the static's name.
    pub fn describe(&self, tail: &str) -> String {
        match &self.through {
            None => format!("`{}{tail}`", self.name),
            Some(local) => format!("`{}{tail}` through `{local}`", self.name),
        }
    }
}

/// Device data on the host: a value read back from the device, or computed from one.
#[derive(Clone, Debug)]
pub struct DeviceData {
    /// How it was read, for the message: `` the result of `.clone_dtoh()` ``, or
    /// `` `v` (read back from the GPU by `.to_vec1()`) ``.
    pub how: String,
    /// Read from a candle tensor (by one of `CANDLE_READS`), not by a cudarc copy.
    pub tensor: bool,
}

impl Binding {
    /// A local nothing is known about (a pattern binding, a closure parameter).
    pub fn unknown() -> Self {
        Binding {
            kind: Kind::Unknown,
            param: false,
            device_buffer: false,
            device_data: None,
            cpu_device: false,
            null_pointer: false,
            cuda_rooted: false,
            static_ref: None,
            static_copy: false,
        }
    }
}

/// The names in scope, innermost block last.
pub struct Scope {
    frames: Vec<HashMap<String, Binding>>,
}

impl Scope {
    /// The parameters of the model: their kinds from the declared types, device buffers from
    /// the roles.
    pub fn of(model: &GraphFn) -> Self {
        let mut params = HashMap::new();
        for p in &model.params {
            let kind = kind_of_type(&p.ty);
            // Inputs and outputs are device buffers by their role; state is one unless its
            // declared type says it is host data (a collection, a scalar, a generator, a
            // type of the user's own).
            // A device buffer that formatting reads is a candle tensor (cudarc's buffers
            // format their address, length and stream, and read nothing).
            let device_buffer = match p.role {
                Role::Input | Role::Output | Role::State { .. } => is_tensor_type(&p.ty),
                Role::Constant | Role::Bucket => false,
            };
            params.insert(
                unraw(&p.ident),
                Binding {
                    kind,
                    param: true,
                    device_buffer,
                    ..Binding::unknown()
                },
            );
        }
        // The context parameter (`rt: &Runtime`, a stream, candle's device) is CUDA's.
        let ctx = model.context.as_ref().and(model.item.sig.inputs.first());
        if let Some(syn::FnArg::Typed(syn::PatType { pat, .. })) = ctx {
            let syn::Pat::Ident(p) = &**pat else {
                return Scope {
                    frames: vec![params],
                };
            };
            params.insert(
                unraw(&p.ident),
                Binding {
                    kind: Kind::Cuda,
                    param: true,
                    ..Binding::unknown()
                },
            );
        }
        Scope {
            frames: vec![params],
        }
    }

    /// What a helper function's signature says (`#[graph_helper]`): each parameter by its
    /// declared type.
    pub fn of_signature(sig: &syn::Signature) -> Self {
        let mut params = HashMap::new();
        for input in &sig.inputs {
            let syn::FnArg::Typed(t) = input else {
                continue;
            };
            let Pat::Ident(p) = &*t.pat else { continue };
            let mut ty: &Type = &t.ty;
            while let Type::Reference(r) = ty {
                ty = &r.elem;
            }
            params.insert(
                unraw(&p.ident),
                Binding {
                    kind: kind_of_type(ty),
                    param: true,
                    device_buffer: is_tensor_type(ty),
                    ..Binding::unknown()
                },
            );
        }
        Scope {
            frames: vec![params],
        }
    }

    pub fn push(&mut self) {
        self.frames.push(HashMap::new());
    }

    pub fn pop(&mut self) {
        if self.frames.len() > 1 {
            self.frames.pop();
        }
    }

    /// The `static` at the root of a place or receiver (`COUNT` in `COUNT.fetch_add(…)`,
    /// `*STATE.lock().unwrap() += 1`, `crate::STEP += 1`, `TABLE[i] = x`): a path whose last segment is in
    /// `SCREAMING_CASE` and, when it is one segment, is not a local, or a local bound to a
    /// reference, clone or guard of one (`let step = &STEP; step.fetch_add(…)`). A `const` has
    /// the same spelling, but nothing can be written into one, and the methods that the caller
    /// asks about (atomics, locks, cells) are not called on constants.
    pub fn static_root(&self, e: &Expr) -> Option<StaticRoot> {
        match e {
            Expr::Path(p) if p.qself.is_none() => {
                let last = unraw(&p.path.segments.last()?.ident);
                if p.path.segments.len() == 1 {
                    if let Some(b) = self.get(&last) {
                        return b.static_ref.clone().map(|name| StaticRoot {
                            name,
                            through: Some(last),
                            by_copy: b.static_copy,
                        });
                    }
                }
                super::syntax::is_screaming(&last).then_some(StaticRoot {
                    name: last,
                    through: None,
                    by_copy: false,
                })
            }
            Expr::Reference(r) => self.static_root(&r.expr),
            Expr::Paren(p) => self.static_root(&p.expr),
            Expr::Unary(u) => self.static_root(&u.expr),
            Expr::Index(i) => self.static_root(&i.expr),
            Expr::Field(f) => self.static_root(&f.base),
            Expr::Group(g) => self.static_root(&g.expr),
            // Through a lock or a cell: `*STATE.lock().unwrap() += 1`; not through a method
            // that makes a new value (`TABLE.iter().take(2)` takes from an iterator).
            Expr::MethodCall(m) if is_guard_method(m) && m.method != "clone" => {
                self.static_root(&m.receiver)
            }
            _ => None,
        }
    }

    /// The `static` a `let` makes its name refer to, and whether the name holds a copy of its
    /// value: a reference to it or to a part of it (`&STEP`, `&STATE.inner`, `&*LAZY`) or a
    /// guard of it (`STATE.lock().unwrap()`, `CELL.borrow_mut()`) refer to the static; its
    /// `.clone()`, `Arc::clone(&STATE)` or an `unwrap` of it are copies (which still share a
    /// lock, a cell or an atomic behind an `Arc`); another local that refers to one inherits
    /// it. A value read from it (`STEP.load(…)`, `TABLE[0]`) is neither.
    pub fn static_alias(&self, e: &Expr) -> Option<(String, bool)> {
        match e {
            Expr::Paren(p) => self.static_alias(&p.expr),
            Expr::Group(g) => self.static_alias(&g.expr),
            Expr::Reference(r) => self.static_place(&r.expr).map(|n| (n, false)),
            Expr::MethodCall(m) if is_guard_method(m) => {
                let method = unraw(&m.method);
                let of_guard = matches!(&*m.receiver, Expr::MethodCall(r) if is_lock(r));
                let copy = method == "clone"
                    || (matches!(method.as_str(), "unwrap" | "expect") && !of_guard);
                self.static_place(&m.receiver).map(|n| (n, copy))
            }
            // `Arc::clone(&STATE)`, `Rc::clone(&s)`.
            Expr::Call(c) if c.args.len() == 1 => match &*c.func {
                Expr::Path(p) if p.path.segments.last().is_some_and(|s| s.ident == "clone") => self
                    .static_alias(&c.args[0])
                    .or_else(|| self.static_place(&c.args[0]).map(|n| (n, false)))
                    .map(|(n, _)| (n, true)),
                _ => None,
            },
            Expr::Path(p) if p.qself.is_none() && p.path.segments.len() == 1 => {
                let b = self.get(&unraw(&p.path.segments[0].ident))?;
                b.static_ref.clone().map(|n| (n, b.static_copy))
            }
            _ => None,
        }
    }

    /// The `static` a place is part of (the operand of `&`, the receiver of a guard).
    fn static_place(&self, e: &Expr) -> Option<String> {
        match e {
            Expr::Path(_) => self.static_root(e).map(|r| r.name),
            Expr::Paren(p) => self.static_place(&p.expr),
            Expr::Group(g) => self.static_place(&g.expr),
            Expr::Unary(u) if matches!(u.op, syn::UnOp::Deref(_)) => self.static_place(&u.expr),
            Expr::Field(f) => self.static_place(&f.base),
            Expr::Index(i) => self.static_place(&i.expr),
            Expr::MethodCall(m) if is_guard_method(m) => self.static_place(&m.receiver),
            _ => None,
        }
    }

    pub fn get(&self, name: &str) -> Option<&Binding> {
        self.frames.iter().rev().find_map(|f| f.get(name))
    }

    /// A new binding in the innermost block (`let`, a pattern, a closure parameter).
    pub fn declare(&mut self, name: String, binding: Binding) {
        self.frames
            .last_mut()
            .expect("the parameters' frame is never popped")
            .insert(name, binding);
    }

    /// An assignment to an existing name: the binding where it was declared.
    pub fn assign(&mut self, name: &str) -> Option<&mut Binding> {
        self.frames.iter_mut().rev().find_map(|f| f.get_mut(name))
    }

    pub fn is_device_buffer(&self, name: &str) -> bool {
        self.get(name).is_some_and(|b| b.device_buffer)
    }

    pub fn device_data(&self, name: &str) -> Option<&DeviceData> {
        self.get(name).and_then(|b| b.device_data.as_ref())
    }

    /// Whether the value of `e` is a candle tensor of the body, whose formatting reads the
    /// device: a tensor (or a reference to one), a `.clone()` of one, or a tensor op on one
    /// (`x.matmul(&w)?`), but not a host value read off one (`x.dims()`, `x.len()`).
    pub fn is_tensor_value(&self, e: &Expr) -> bool {
        match e {
            Expr::Paren(p) => self.is_tensor_value(&p.expr),
            Expr::Reference(r) => self.is_tensor_value(&r.expr),
            Expr::Try(t) => self.is_tensor_value(&t.expr),
            Expr::Path(p) if p.qself.is_none() => p
                .path
                .get_ident()
                .is_some_and(|i| self.is_device_buffer(&unraw(i))),
            // `Tensor::zeros(…)`, `Tensor::new(&data, &dev)`, unless made on the CPU.
            Expr::Call(c) => match &*c.func {
                Expr::Path(p) if p.qself.is_none() => {
                    let segs = segment_names(&p.path);
                    segs.len() >= 2
                        && any_framework(|f| {
                            f.tensor_types.contains(&segs[segs.len() - 2].as_str())
                        })
                        && !c.args.iter().any(|a| self.is_cpu_device(a))
                }
                _ => false,
            },
            Expr::MethodCall(m) => {
                let name = unraw(&m.method);
                let name = name.as_str();
                !any_framework(|f| {
                    f.host_methods.contains(&name)
                        || f.host_reads.contains(&name)
                        || f.to_cpu.contains(&name)
                }) && self.is_tensor_value(&m.receiver)
            }
            _ => false,
        }
    }

    /// Whether `e` is candle's CPU device: a path ending in `Device::Cpu` (`Device::Cpu`,
    /// `candle_core::Device::Cpu`), a local bound to one, or a reference to either.
    pub fn is_cpu_device(&self, e: &Expr) -> bool {
        match e {
            Expr::Paren(p) => self.is_cpu_device(&p.expr),
            Expr::Reference(r) => self.is_cpu_device(&r.expr),
            Expr::Path(p) if p.qself.is_none() => {
                let segs = segment_names(&p.path);
                match segs.as_slice() {
                    [name] => self.get(name).is_some_and(|b| b.cpu_device),
                    [.., ty, variant] => {
                        any_framework(|f| [ty.as_str(), variant.as_str()] == f.cpu_device)
                    }
                    [] => false,
                }
            }
            _ => false,
        }
    }

    /// Whether the value of `e` is provably of the user's own type, so that its methods are
    /// the user's: a name bound to one, a struct literal or constructor call of a type that
    /// is not cudarc's, the runtime's, a generator's or the standard library's, or a
    /// reference, dereference or `.clone()` of one of those.
    pub fn is_users_own(&self, e: &Expr) -> bool {
        self.kind_of_expr(e) == Kind::Users
    }

    /// Whether `e` is a constructor call or a struct literal (`Fence::from(event)`,
    /// `Gpu::new(rt.stream().clone())`, `Gpu { stream: s }`) given a CUDA value
    /// ([`Scope::is_cuda_value`]): the value built may hold a stream or an event, so its
    /// `synchronize` or `query` may be CUDA's ([`Kind::Wraps`]).
    pub fn wraps_cuda(&self, e: &Expr) -> bool {
        match e {
            Expr::Paren(p) => self.wraps_cuda(&p.expr),
            Expr::Reference(r) => self.wraps_cuda(&r.expr),
            Expr::Try(t) => self.wraps_cuda(&t.expr),
            Expr::Call(c) => c.args.iter().any(|a| self.is_cuda_value(a)),
            // A CUDA value given, or a field named like a CUDA object given a value the tokens
            // cannot classify (`Gpu { stream: s }`); not one given a host value
            // (`Job { id, device }` with `device` a number).
            Expr::Struct(s) => s.fields.iter().any(|f| {
                let named = match &f.member {
                    syn::Member::Named(i) => field_named_like_cuda(&unraw(i)),
                    syn::Member::Unnamed(_) => false,
                };
                self.is_cuda_value(&f.expr)
                    || (named && self.kind_of_expr(&f.expr) == Kind::Unknown)
            }),
            _ => false,
        }
    }

    /// Whether `e` is a CUDA value as far as the tokens tell: a name of a cudarc, runtime or
    /// candle type (a parameter, a local declared or built so, a local bound to a chain rooted
    /// in one), a field named like a CUDA object (`cfg.stream`), or a chain rooted in one of
    /// those (`rt.stream().clone()`, `rt.context().new_event(None)?`) that does not end in a
    /// host value (`x.len()`); also such a value wrapped (`Arc::new(s)`).
    pub fn is_cuda_value(&self, e: &Expr) -> bool {
        match e {
            Expr::Paren(p) => self.is_cuda_value(&p.expr),
            Expr::Group(g) => self.is_cuda_value(&g.expr),
            Expr::Reference(r) => self.is_cuda_value(&r.expr),
            Expr::Try(t) => self.is_cuda_value(&t.expr),
            Expr::Unary(u) if matches!(u.op, syn::UnOp::Deref(_)) => self.is_cuda_value(&u.expr),
            Expr::Path(p) if p.qself.is_none() && p.path.segments.len() == 1 => self
                .get(&unraw(&p.path.segments[0].ident))
                .is_some_and(|b| b.kind == Kind::Cuda || b.cuda_rooted),
            Expr::Field(f) => {
                let named = match &f.member {
                    syn::Member::Named(i) => field_named_like_cuda(&unraw(i)),
                    syn::Member::Unnamed(_) => false,
                };
                named || self.is_cuda_value(&f.base)
            }
            Expr::MethodCall(m) => {
                !host_result(&unraw(&m.method)) && self.is_cuda_value(&m.receiver)
            }
            Expr::Call(c) => {
                let wrapper = match &*c.func {
                    Expr::Path(p) => {
                        let segs = segment_names(&p.path);
                        segs.len() >= 2 && WRAPPERS.contains(&segs[segs.len() - 2].as_str())
                    }
                    _ => false,
                };
                self.kind_of_expr(e) == Kind::Cuda
                    || (wrapper && c.args.iter().any(|a| self.is_cuda_value(a)))
            }
            Expr::Struct(_) => self.kind_of_expr(e) == Kind::Cuda,
            _ => false,
        }
    }

    /// The kind of the value of `e`, as far as the tokens tell.
    pub fn kind_of_expr(&self, e: &Expr) -> Kind {
        match e {
            Expr::Paren(p) => self.kind_of_expr(&p.expr),
            Expr::Reference(r) => self.kind_of_expr(&r.expr),
            Expr::Unary(u) if matches!(u.op, syn::UnOp::Deref(_)) => self.kind_of_expr(&u.expr),
            // `Type::new(…)?`: the value of a fallible constructor.
            Expr::Try(t) => self.kind_of_expr(&t.expr),
            Expr::Path(p) if p.qself.is_none() && p.path.segments.len() == 1 => {
                let name = unraw(&p.path.segments[0].ident);
                match self.get(&name) {
                    Some(b) => b.kind,
                    // A unit struct (`Cache.exists()`): a capitalised name that is not a
                    // local, nor a `SCREAMING_CASE` static or constant.
                    None if name.starts_with(char::is_uppercase)
                        && !super::syntax::is_screaming(&name) =>
                    {
                        kind_of_path(&p.path).unwrap_or(Kind::Users)
                    }
                    None => Kind::Unknown,
                }
            }
            // Built from a CUDA value, a value of the user's type may hold it (`Fence::from(event)`,
            // `Gpu { stream }`): not provably the user's own.
            Expr::Struct(s) if s.qself.is_none() => match kind_of_path(&s.path) {
                Some(kind) => kind,
                None if self.wraps_cuda(e) => Kind::Wraps,
                None => Kind::Users,
            },
            Expr::Call(c) => match &*c.func {
                Expr::Path(p) if p.qself.is_none() => match constructor_kind(&p.path) {
                    Kind::Users if self.wraps_cuda(e) => Kind::Wraps,
                    kind => kind,
                },
                _ => Kind::Unknown,
            },
            Expr::MethodCall(m) if m.method == "clone" && m.args.is_empty() => {
                self.kind_of_expr(&m.receiver)
            }
            // A stream, a context or a cuBLAS handle of a CUDA value (`rt.stream()`).
            Expr::MethodCall(m)
                if ["stream", "context", "blas"].contains(&unraw(&m.method).as_str())
                    && self.kind_of_expr(&m.receiver) == Kind::Cuda =>
            {
                Kind::Cuda
            }
            // A builder of the user's: `Client::builder().timeout(5).build()`, a chain that
            // starts at a function of a type of the user's and ends in `build`/`finish`/
            // `connect` (`?` allowed between).
            Expr::MethodCall(m)
                if ["build", "finish", "connect"].contains(&unraw(&m.method).as_str()) =>
            {
                let mut root: &Expr = &m.receiver;
                loop {
                    match root {
                        Expr::MethodCall(inner) => root = &inner.receiver,
                        Expr::Try(t) => root = &t.expr,
                        _ => break,
                    }
                }
                match root {
                    Expr::Call(c) => match &*c.func {
                        Expr::Path(p) if p.qself.is_none() && p.path.segments.len() >= 2 => {
                            let mut ty = p.path.clone();
                            ty.segments.pop();
                            ty.segments.pop_punct();
                            let users =
                                ty.segments.last().is_some_and(|s| {
                                    unraw(&s.ident).starts_with(char::is_uppercase)
                                }) && kind_of_path(&ty.clone()).is_none();
                            if users {
                                Kind::Users
                            } else {
                                Kind::Unknown
                            }
                        }
                        _ => Kind::Unknown,
                    },
                    _ => Kind::Unknown,
                }
            }
            Expr::Lit(_) => Kind::Std,
            _ => Kind::Unknown,
        }
    }
}

/// A lock or a cell's borrow: through it a copy of a static still reaches the static's value.
pub fn is_lock(m: &syn::ExprMethodCall) -> bool {
    const LOCKS: &[&str] = &[
        "lock",
        "read",
        "write",
        "try_lock",
        "borrow",
        "borrow_mut",
        "get_mut",
    ];
    LOCKS.contains(&unraw(&m.method).as_str())
}

/// A method that hands out the value it is called on, or a guard of it: `.clone()`,
/// `.lock()`, `.borrow_mut()`, `.unwrap()`, …
fn is_guard_method(m: &syn::ExprMethodCall) -> bool {
    const THROUGH: &[&str] = &[
        "clone",
        "lock",
        "read",
        "write",
        "borrow",
        "borrow_mut",
        "unwrap",
        "expect",
        "as_ref",
        "deref",
    ];
    THROUGH.contains(&unraw(&m.method).as_str())
}

/// Whether a field name says it holds a CUDA object: its last word (between `_`) is one of
/// the names of a stream, a context, an event, a device or the runtime (`.stream`,
/// `.main_stream`, `.ctx`, `.done_event`), not a count or an index of one (`.gpu_count`).
pub fn field_named_like_cuda(name: &str) -> bool {
    const WORDS: &[&str] = &[
        "stream", "streams", "ctx", "context", "event", "events", "cuda", "gpu", "runtime", "rt",
        "ev", "dev", "device",
    ];
    let name = name.to_lowercase();
    name.rsplit('_')
        .next()
        .is_some_and(|last| WORDS.contains(&last))
}

/// Methods of a CUDA value whose result is host data (a length, a shape, an ordinal).
fn host_result(name: &str) -> bool {
    const HOST: &[&str] = &[
        "num_bytes",
        "ordinal",
        "size",
        "capacity",
        "to_string",
        "name",
        "priority",
    ];
    HOST.contains(&name) || any_framework(|f| f.host_methods.contains(&name))
}

/// `Type::new(…)`, `Type::default()`, `Type::with_…(…)`, `Type::from…(…)`: by convention a
/// value of `Type` (whether it holds a CUDA value is [`Scope::wraps_cuda`]'s question).
fn constructor_kind(path: &syn::Path) -> Kind {
    let segs = segment_names(path);
    let [.., ty, f] = segs.as_slice() else {
        return Kind::Unknown;
    };
    let constructor = f == "new"
        || f == "default"
        || f == "from"
        || f.starts_with("new_")
        || f.starts_with("with_")
        || f.starts_with("from_");
    let is_type = ty.chars().next().is_some_and(char::is_uppercase);
    if !(constructor && is_type) {
        return Kind::Unknown;
    }
    let mut type_path = path.clone();
    type_path.segments.pop();
    type_path.segments.pop_punct();
    kind_of_path(&type_path).unwrap_or(Kind::Users)
}

/// The kind of a declared type (a parameter's, with the reference already removed by the
/// model, or a `let`'s annotation).
pub fn kind_of_type(ty: &Type) -> Kind {
    match ty {
        Type::Reference(r) => kind_of_type(&r.elem),
        Type::Paren(p) => kind_of_type(&p.elem),
        Type::Group(g) => kind_of_type(&g.elem),
        Type::Path(p) if p.qself.is_none() => {
            // A wrapper (`Arc<CudaStream>`, `Box<Scheduler>`) is judged by what it holds.
            let last = p.path.segments.last().expect("a path has a segment");
            if WRAPPERS.contains(&unraw(&last.ident).as_str()) {
                if let syn::PathArguments::AngleBracketed(args) = &last.arguments {
                    if let Some(syn::GenericArgument::Type(inner)) = args.args.first() {
                        return kind_of_type(inner);
                    }
                }
            }
            kind_of_path(&p.path).unwrap_or(Kind::Users)
        }
        Type::Array(_) | Type::Slice(_) | Type::Tuple(_) | Type::Ptr(_) | Type::FnPtr(_) => {
            Kind::Std
        }
        _ => Kind::Unknown,
    }
}

/// The kind a type path names when the lists know it: `None` for a type they do not know,
/// which is then the user's own. The outer type decides first (`Vec<CudaSlice<f32>>` is a
/// host collection); a known name anywhere inside then decides (`MyPool<CudaStream>` is not
/// provably the user's own).
fn kind_of_path(path: &syn::Path) -> Option<Kind> {
    let names = idents_in(path);
    let has = |list: &[&str]| names.iter().any(|n| list.contains(&n.as_str()));
    let last = unraw(&path.segments.last()?.ident);
    let first = unraw(&path.segments.first()?.ident);
    if COLLECTIONS.contains(&last.as_str()) {
        Some(Kind::HostCollection)
    } else if WRAPPERS.contains(&last.as_str()) {
        Some(Kind::Unknown)
    } else if last == "PinnedHostSlice" {
        Some(Kind::PinnedHost)
    } else if has(CUDA_TYPES)
        || has(CUDA_CRATES)
        || any_framework(|f| has(f.types) || has(f.crates))
    {
        Some(Kind::Cuda)
    } else if has(RNG_TYPES) || has(RNG_CRATES) {
        Some(Kind::Rng)
    } else if STD_TYPES.contains(&last.as_str())
        || ["std", "core", "alloc"].contains(&first.as_str())
    {
        Some(Kind::Std)
    } else {
        None
    }
}

/// Every identifier in a path, generic arguments included.
fn idents_in(path: &syn::Path) -> Vec<String> {
    struct Idents(Vec<String>);
    impl<'ast> Visit<'ast> for Idents {
        fn visit_ident(&mut self, i: &'ast Ident) {
            self.0.push(unraw(i));
        }
        fn visit_lifetime(&mut self, _: &'ast syn::Lifetime) {}
    }
    let mut v = Idents(Vec::new());
    v.visit_path(path);
    v.0
}

/// The names a pattern binds.
pub fn bound_names(pat: &Pat) -> Vec<String> {
    struct Names(Vec<String>);
    impl<'ast> Visit<'ast> for Names {
        fn visit_pat_ident(&mut self, p: &'ast syn::PatIdent) {
            self.0.push(unraw(&p.ident));
            visit::visit_pat_ident(self, p);
        }
    }
    let mut n = Names(Vec::new());
    n.visit_pat(pat);
    n.0
}

/// The declared type of a `let` pattern (`let s: Scheduler = …`).
pub fn annotated_type(pat: &Pat) -> Option<&Type> {
    match pat {
        Pat::Type(t) => Some(&t.ty),
        _ => None,
    }
}

/// Whether a declared type is a candle tensor (or a reference, `Arc` or `Box` of one).
pub fn is_tensor_type(ty: &Type) -> bool {
    match ty {
        Type::Reference(r) => is_tensor_type(&r.elem),
        Type::Paren(p) => is_tensor_type(&p.elem),
        Type::Group(g) => is_tensor_type(&g.elem),
        Type::Path(p) if p.qself.is_none() => {
            let Some(last) = p.path.segments.last() else {
                return false;
            };
            let name = unraw(&last.ident);
            if WRAPPERS.contains(&name.as_str()) {
                if let syn::PathArguments::AngleBracketed(args) = &last.arguments {
                    if let Some(syn::GenericArgument::Type(inner)) = args.args.first() {
                        return is_tensor_type(inner);
                    }
                }
            }
            any_framework(|f| f.tensor_types.contains(&name.as_str()))
        }
        _ => false,
    }
}

/// Whether a declared type holds host data only, and is not a collection (whose updates the
/// `host-bookkeeping` rule reports where they are written): primitives, `String`,
/// `Duration`, `Instant`, arrays, tuples and slices of them, the standard wrappers around
/// them, atomics. A type of the user's own may hold device memory and is not.
pub fn is_host_only_type(ty: &Type) -> bool {
    !matches!(kind_of_type(ty), Kind::HostCollection) && host_only(ty)
}

fn host_only(ty: &Type) -> bool {
    const HOST: &[&str] = &[
        "AtomicBool",
        "AtomicU8",
        "AtomicU16",
        "AtomicU32",
        "AtomicU64",
        "AtomicUsize",
        "AtomicI8",
        "AtomicI16",
        "AtomicI32",
        "AtomicI64",
        "AtomicIsize",
        "String",
        "Wrapping",
    ];
    match ty {
        Type::Reference(r) => host_only(&r.elem),
        Type::Paren(p) => host_only(&p.elem),
        Type::Group(g) => host_only(&g.elem),
        Type::Array(a) => host_only(&a.elem),
        Type::Slice(s) => host_only(&s.elem),
        Type::Tuple(t) => !t.elems.is_empty() && t.elems.iter().all(host_only),
        Type::Path(p) if p.qself.is_none() => {
            let Some(last) = p.path.segments.last() else {
                return false;
            };
            let name = unraw(&last.ident);
            let inner_all_host = match &last.arguments {
                syn::PathArguments::None => true,
                syn::PathArguments::AngleBracketed(args) => args.args.iter().all(|a| match a {
                    syn::GenericArgument::Type(t) => host_only(t),
                    _ => true,
                }),
                syn::PathArguments::Parenthesized(_) => false,
            };
            let generic = !matches!(last.arguments, syn::PathArguments::None);
            let known = (STD_TYPES.contains(&name.as_str()) && name != "Path" && name != "PathBuf")
                || HOST.contains(&name.as_str())
                || (WRAPPERS.contains(&name.as_str()) && generic);
            known && inner_all_host
        }
        _ => false,
    }
}
