//! The checked model of an annotated function: its execution-context parameter and the role
//! of every other parameter.
//!
//! Owns the parameters' roles and the signature's checks. Imports only `ctxt`; never
//! `args`, `check` or `expand` (the batch parameter's name comes in as an `Ident`).
//!
//! | parameter | role | in the graph |
//! | --- | --- | --- |
//! | first, `&Ctx` | execution context | the runtime (or its stream) is passed in |
//! | `x: &T` or `#[input] x: &T` | input | static buffer, refilled by every `replay` |
//! | `y: &mut T` or `#[output] y: &mut T` | output | static buffer owned by the graph, lent out after `replay` |
//! | `#[state] w: &T` | read-only state | borrowed `&'s T` for the graph's life, read in place |
//! | `#[state] kv: &mut T` | mutable state | borrowed `&'s mut T`, updated in place, lent back by `state_mut` |
//! | `#[constant] n: T` | capture-time constant | given to `capture`, frozen into the graph |
//! | `#[island] c: &mut T` (or `&T`) | island state | borrowed for the graph's life like state, used only inside `rt.eager(\|\| …)` islands; any `Clone` type, not read by address |

use proc_macro2::{Ident, Span};
use quote::ToTokens;
use syn::spanned::Spanned;
use syn::visit::Visit;
use syn::{Attribute, FnArg, ItemFn, Pat, Type};

use crate::ctxt::{Ctxt, Message};

/// The role attributes a parameter may carry.
pub const ROLE_ATTRS: [&str; 5] = ["input", "output", "state", "constant", "island"];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Input,
    Output,
    State {
        mutable: bool,
    },
    Constant,
    /// The batch parameter of a bucket family (`buckets(batch = [...])`).
    Bucket,
}

#[derive(Clone)]
pub struct Param {
    pub ident: Ident,
    pub role: Role,
    /// `#[state(no_restore)]`: the warmup's updates of this `&mut` state are kept instead of
    /// being snapshotted and restored.
    pub no_restore: bool,
    /// `#[island]`: state (role `State`) that only the body's eager islands use: held like
    /// state, but neither recorded by address nor lent as a device view.
    pub island: bool,
    /// For inputs, outputs and state, the referenced type (`CudaSlice<f32>` for
    /// `&CudaSlice<f32>`); for constants, the parameter type.
    pub ty: Type,
}

#[derive(Clone)]
pub struct ContextParam {
    /// The referenced type of the first parameter (`Runtime` for `&Runtime`).
    pub ty: Type,
}

#[derive(Clone)]
pub struct GraphFn {
    /// The user's function with the role attributes removed: what gets emitted.
    pub item: ItemFn,
    pub context: Option<ContextParam>,
    pub params: Vec<Param>,
    /// `T` of a function that returns `Result<T, E>` with `T` not `()` (a candle function's
    /// `-> Result<Tensor>`): the graph copies the returned value into a static buffer.
    pub result: Option<Type>,
    /// Whether the signature is usable: building the model recorded no error, so a graph
    /// type can be generated for it (the body's checks come after and do not change this).
    pub usable: bool,
}

impl GraphFn {
    pub fn of(&self, pred: impl Fn(Role) -> bool) -> impl Iterator<Item = &Param> {
        self.params.iter().filter(move |p| pred(p.role))
    }
}

/// Removes `#[input]`, `#[output]`, `#[state]`, `#[constant]` from the parameters of `item`
/// and returns, for each parameter, the role attributes it had.
pub fn strip_role_attrs(item: &mut ItemFn) -> Vec<Vec<Attribute>> {
    item.sig
        .inputs
        .iter_mut()
        .map(|arg| {
            let attrs = match arg {
                FnArg::Receiver(r) => &mut r.attrs,
                FnArg::Typed(t) => &mut t.attrs,
            };
            let (roles, rest): (Vec<_>, Vec<_>) = attrs
                .drain(..)
                .partition(|a| ROLE_ATTRS.iter().any(|r| a.path().is_ident(r)));
            *attrs = rest;
            roles
        })
        .collect()
}

/// Builds the model, recording every signature problem in `cx`; the model says whether the
/// signature is usable ([`GraphFn::usable`]).
/// The most inputs, and the most outputs, of a graph: the runtime handles its static buffers
/// as tuples of up to this many (`graph_runtime`'s `StaticList`).
pub const MAX_STATICS: usize = 16;

/// An input or output past [`MAX_STATICS`] of its kind is refused where it is declared.
fn too_many_statics(params: &[Param], cx: &mut Ctxt) {
    for (role, kind) in [
        (Role::Input, "inputs (`&T`)"),
        (Role::Output, "outputs (`&mut T`)"),
    ] {
        if let Some(p) = params.iter().filter(|p| p.role == role).nth(MAX_STATICS) {
            cx.error_spanned_by(
                &p.ident,
                Message::new(format!(
                    "a graph holds at most {MAX_STATICS} {kind}, and `{}` is one more",
                    p.ident
                ))
                .fix(
                    "group buffers into a `#[derive(DeviceState)]` struct passed as `#[state]`, or \
                     split the function into two graphs",
                ),
            );
        }
    }
}

pub fn analyze(item: ItemFn, bucket: Option<&Ident>, cx: &mut Ctxt) -> GraphFn {
    let before = cx.count();
    let mut model = build(item, bucket, cx);
    model.usable = cx.count() == before;
    model
}

fn build(mut item: ItemFn, bucket: Option<&Ident>, cx: &mut Ctxt) -> GraphFn {
    let role_attrs = strip_role_attrs(&mut item);
    check_signature(&item, cx);
    let mut inputs = item.sig.inputs.iter().zip(role_attrs);
    let Some(context) = context_param(&item.sig, inputs.next(), cx) else {
        // A method: reported by check_signature; the other parameters are not classified,
        // their roles would only add noise to that one error.
        return GraphFn {
            usable: false,
            item,
            context: None,
            params: Vec::new(),
            result: None,
        };
    };
    let params = classify_params(inputs, bucket, cx);
    if let Some(b) = bucket {
        check_bucket_family(b, &params, context.is_some(), cx);
    } else {
        too_many_statics(&params, cx);
    }
    let result = returned_value(&item.sig.output);
    if let Some(ty) = &result {
        check_returned(ty, bucket, &params, cx);
    }
    GraphFn {
        item,
        context,
        params,
        result,
        usable: false,
    }
}

/// The execution context from the first parameter: `Some(None)` when it is missing or
/// malformed (reported), `None` for a method's receiver (reported by `check_signature`).
fn context_param(
    sig: &syn::Signature,
    first: Option<(&FnArg, Vec<syn::Attribute>)>,
    cx: &mut Ctxt,
) -> Option<Option<ContextParam>> {
    match first {
        None => {
            cx.error_spanned_by(
                sig,
                Message::new(
                    "a `#[cuda_graph]` function needs an execution context as its first parameter",
                )
                .why(
                    "the graph passes its own runtime there so that the body's GPU work lands on the \
                     capture stream",
                )
                .fix("add one, e.g. `rt: &Runtime` or `stream: &Arc<CudaStream>`"),
            );
            Some(None)
        }
        Some((FnArg::Receiver(_), _)) => None,
        Some((FnArg::Typed(first), roles)) => {
            for a in &roles {
                cx.error_spanned_by(
                    a,
                    Message::new(
                        "the first parameter is the execution context and takes no role attribute",
                    )
                    .fix("add the context (`rt: &Runtime`) before the graph's inputs"),
                );
            }
            match &*first.ty {
                Type::Reference(r) if r.mutability.is_none() => Some(Some(ContextParam {
                    ty: (*r.elem).clone(),
                })),
                other => {
                    cx.error_spanned_by(
                        other,
                        Message::new(
                            "the execution context (the first parameter) must be a shared reference",
                        )
                        .fix("write `&Runtime`, `&Arc<CudaStream>` or `&CudaStream`"),
                    );
                    Some(None)
                }
            }
        }
    }
}

/// The parameters after the context, each with its role (the bucket parameter of a family
/// as such); a parameter that cannot be classified is reported and left out.
fn classify_params<'a>(
    inputs: impl Iterator<Item = (&'a FnArg, Vec<syn::Attribute>)>,
    bucket: Option<&Ident>,
    cx: &mut Ctxt,
) -> Vec<Param> {
    let mut params = Vec::new();
    for (arg, roles) in inputs {
        let FnArg::Typed(pt) = arg else { continue };
        let Some(ident) = binding_ident(&pt.pat, cx) else {
            continue;
        };
        if ident == "rt" {
            cx.error_spanned_by(
                &ident,
                Message::new(
                    "parameter `rt` clashes with the first parameter of the generated `capture`",
                )
                .why("`capture(rt: &Runtime, …)` passes the runtime as `rt`")
                .fix("rename this parameter"),
            );
            continue;
        }
        let param = if bucket == Some(&ident) {
            classify_bucket(ident, &pt.ty, &roles, cx)
        } else {
            classify(ident, &pt.ty, &roles, cx)
        };
        params.extend(param);
    }
    params
}

/// What a bucket family (`buckets(b = …)`) requires of its parameters.
fn check_bucket_family(b: &Ident, params: &[Param], has_context: bool, cx: &mut Ctxt) {
    let has_bucket = params.iter().any(|p| p.role == Role::Bucket);
    if !has_bucket && has_context {
        cx.error_spanned_by(
            b,
            Message::new(format!(
                "`buckets({b} = …)` names a parameter `{b}` that the function does not have"
            ))
            .fix(format!(
                "add `{b}: usize`, which receives each bucket's batch size"
            )),
        );
    }
    if has_bucket
        && !params
            .iter()
            .any(|p| matches!(p.role, Role::Input | Role::Output))
    {
        cx.error_spanned_by(
            b,
            Message::new(
                "a bucket family needs at least one input or output batched along `batch` rows",
            ),
        );
    }
}

/// What a returned value (`-> Result<T, E>`) requires: not in a family, and no parameter
/// named like the output that holds it.
fn check_returned(ty: &Type, bucket: Option<&Ident>, params: &[Param], cx: &mut Ctxt) {
    if let Some(b) = bucket {
        cx.error_spanned_by(
            ty,
            Message::new(format!(
                "a bucket family (`buckets({b} = …)`) cannot return a value"
            ))
            .why("each bucket's graph writes its own rows")
            .fix(
                "return `Result<(), E>` and write the result into an output parameter \
                 (`y: &mut CudaSlice<f32>`)",
            ),
        );
    }
    if let Some(p) = params.iter().find(|p| p.ident == "result") {
        cx.error_spanned_by(
            &p.ident,
            Message::new("a parameter named `result` clashes with the graph's output `result`")
                .why("the output `result` holds the function's returned value")
                .fix("rename the parameter"),
        );
    }
}

/// `T` of a return type written `…Result<T>` or `…Result<T, E>` with `T` not `()`.
fn returned_value(output: &syn::ReturnType) -> Option<Type> {
    let syn::ReturnType::Type(_, ty) = output else {
        return None;
    };
    let Type::Path(p) = &**ty else { return None };
    let last = p.path.segments.last()?;
    if !last.ident.to_string().ends_with("Result") {
        return None;
    }
    let syn::PathArguments::AngleBracketed(args) = &last.arguments else {
        return None;
    };
    match args.args.first()? {
        syn::GenericArgument::Type(Type::Tuple(t)) if t.elems.is_empty() => None,
        syn::GenericArgument::Type(t) => Some(t.clone()),
        _ => None,
    }
}

/// The batch parameter of a bucket family: a by-value integer without a role attribute.
fn classify_bucket(ident: Ident, ty: &Type, roles: &[Attribute], cx: &mut Ctxt) -> Option<Param> {
    if let Some(a) = roles.first() {
        cx.error_spanned_by(
            a,
            Message::new(format!(
                "`{ident}` is the batch parameter named in `buckets(…)`; it takes no role attribute"
            )),
        );
        return None;
    }
    let is_integer = matches!(ty, Type::Path(p) if p.qself.is_none() && p.path.get_ident().is_some_and(|i| {
        ["usize", "u32", "u64", "i32", "i64", "isize", "u16", "i16"].contains(&i.to_string().as_str())
    }));
    if !is_integer {
        cx.error_spanned_by(
            ty,
            Message::new(format!(
                "the batch parameter `{ident}` must be an integer passed by value"
            ))
            .fix(format!("e.g. `{ident}: usize`")),
        );
        return None;
    }
    Some(Param {
        ident,
        role: Role::Bucket,
        no_restore: false,
        island: false,
        ty: ty.clone(),
    })
}

fn check_signature(item: &ItemFn, cx: &mut Ctxt) {
    let sig = &item.sig;
    if let Some(t) = &sig.asyncness {
        cx.error_spanned_by(
            t,
            Message::new("`#[cuda_graph]` requires a non-async fn")
                .why(
                    "a graph is recorded by running the body once on the calling thread, and an \
                     `async fn` body only runs when polled",
                )
                .fix("make the function synchronous"),
        );
    }
    if let Some(t) = &sig.constness {
        cx.error_spanned_by(
            t,
            Message::new("`#[cuda_graph]` cannot be put on a `const fn`")
                .why("a graph records GPU work, which only exists at run time")
                .fix("remove `const`"),
        );
    }
    if let syn::Safety::Unsafe(t) = &sig.safety {
        cx.error_spanned_by(
            t,
            Message::new("`#[cuda_graph]` requires a safe fn")
                .why("the generated `capture` calls it without `unsafe`")
                .fix(
                    "keep the function safe and put `unsafe { … }` around the launches inside it, \
                     with a SAFETY comment",
                ),
        );
    }
    if let Some(abi) = &sig.abi {
        cx.error_spanned_by(
            abi,
            Message::new("`#[cuda_graph]` requires a Rust fn, without an `extern` ABI")
                .why("the generated graph type calls it as one")
                .fix(
                    "remove the ABI, and call the graph's `replay` from an `extern` function of your \
                     own if C must reach it",
                ),
        );
    }
    if let Some(v) = &sig.variadic {
        cx.error_spanned_by(
            v,
            Message::new("`#[cuda_graph]` cannot capture a variadic fn"),
        );
    }
    if !sig.generics.params.is_empty() || sig.generics.where_clause.is_some() {
        cx.error_spanned_by(
            &sig.generics,
            Message::new(
                "`#[cuda_graph]` requires a function without generic or lifetime parameters",
            )
            .why("a graph is captured for one set of concrete types and owns its buffers")
            .fix(
                "write a non-generic function for each element type you capture (a generic \
                     helper can do the work)",
            ),
        );
    }
    for arg in &sig.inputs {
        if let FnArg::Receiver(r) = arg {
            cx.error_spanned_by(
                r,
                Message::new("`#[cuda_graph]` cannot be put on a method")
                    .why(
                        "the generated graph type must own its static buffers and borrow its state \
                         separately",
                    )
                    .fix(
                        "make it a free function and pass the fields it reads as `#[state]` \
                         parameters",
                    ),
            );
        }
    }
}

fn binding_ident(pat: &Pat, cx: &mut Ctxt) -> Option<Ident> {
    match pat {
        Pat::Ident(p) if p.subpat.is_none() && p.by_ref.is_none() => Some(p.ident.clone()),
        other => {
            cx.error_spanned_by(
                other,
                Message::new(
                    "`#[cuda_graph]` parameters must be plain names (`x: &CudaSlice<f32>`)",
                )
                .why("the name becomes the static buffer's field and the replay argument"),
            );
            None
        }
    }
}

fn classify(ident: Ident, ty: &Type, roles: &[Attribute], cx: &mut Ctxt) -> Option<Param> {
    let no_restore = role_attr_options(&ident, ty, roles, cx)?;
    let reference = match ty {
        Type::Reference(r) => Some((r.mutability.is_some(), (*r.elem).clone())),
        _ => None,
    };
    let role = role_of(&ident, ty, roles, reference.as_ref().map(|(m, _)| *m), cx)?;
    let ty = match (role, reference) {
        (Role::Constant, _) | (_, None) => ty.clone(),
        (_, Some((_, elem))) => elem,
    };
    check_param_type(&ident, role, &ty, cx)?;
    let island = roles.iter().any(|a| a.path().is_ident("island"));
    Some(Param {
        ident,
        role,
        no_restore,
        island,
        ty,
    })
}

/// Checks the role attributes' forms (none takes arguments but `#[state(no_restore)]`, at
/// most one role) and says whether the state is `no_restore`; `None` when the parameter has
/// more than one role.
fn role_attr_options(ident: &Ident, ty: &Type, roles: &[Attribute], cx: &mut Ctxt) -> Option<bool> {
    let mut no_restore = false;
    for a in roles {
        if a.path().is_ident("state") && matches!(a.meta, syn::Meta::List(_)) {
            no_restore = state_options(a, ident, ty, cx);
            continue;
        }
        if !matches!(a.meta, syn::Meta::Path(_)) {
            let name = a
                .path()
                .get_ident()
                .map(ToString::to_string)
                .unwrap_or_default();
            cx.error_spanned_by(
                a,
                Message::new(format!("`#[{name}]` takes no arguments"))
                    .fix(format!("write `#[{name}]`")),
            );
        }
    }
    if roles.len() > 1 {
        let names: Vec<String> = roles
            .iter()
            .map(|a| format!("`#[{}]`", a.path().to_token_stream()))
            .collect();
        cx.error_spanned_by(
            &roles[1],
            Message::new(format!("parameter `{ident}` has more than one role"))
                .why(format!("it is marked {}", names.join(", ")))
                .fix("give it exactly one"),
        );
        return None;
    }
    Some(no_restore)
}

/// The role of a parameter of type `ty` (`reference`: whether it is `&mut`, `None` when it
/// is no reference), from its role attribute or its form.
fn role_of(
    ident: &Ident,
    ty: &Type,
    roles: &[Attribute],
    reference: Option<bool>,
    cx: &mut Ctxt,
) -> Option<Role> {
    let explicit = roles
        .first()
        .and_then(|a| a.path().get_ident())
        .map(|i| (i.to_string(), i.span()));
    let role = match (explicit.as_ref().map(|(n, s)| (n.as_str(), *s)), reference) {
        (None | Some(("input", _)), Some(false)) => Role::Input,
        (None | Some(("output", _)), Some(true)) => Role::Output,
        (Some(("state" | "island", _)), Some(mutable)) => Role::State { mutable },
        (Some(("constant", _)), None) => Role::Constant,
        (Some(("input", span)), Some(true)) => {
            cx.error_at(
                span,
                Message::new(format!("input `{ident}` is `&mut`"))
                    .why("a graph input is a read-only static buffer that each replay refills")
                    .fix("take it as `&T`, or mark it `#[state]` if the graph updates it in place"),
            );
            return None;
        }
        (Some(("output", span)), Some(false)) => {
            cx.error_at(
                span,
                Message::new(format!("output `{ident}` must be `&mut`"))
                    .why("the graph writes its outputs")
                    .fix(format!("write `{ident}: &mut T`")),
            );
            return None;
        }
        (Some(("constant", span)), Some(_)) => {
            cx.error_at(
                span,
                Message::new(format!("`#[constant]` parameter `{ident}` is a reference"))
                    .why("a constant is a host value frozen at capture")
                    .fix(format!(
                        "take it by value (`{ident}: u32`), or use `#[state]` for device data read by \
                         address"
                    )),
            );
            return None;
        }
        (Some((role, span)), None) => {
            let ty_text = ty.to_token_stream().to_string().replace(' ', "");
            cx.error_at(
                span,
                Message::new(format!(
                    "parameter `{ident}` is passed by value, so it can only be a `#[constant]`"
                ))
                .why("inputs, outputs and state are device buffers passed by reference")
                .fix(format!(
                    "write `#[{role}] {ident}: &{ty_text}` (or `&mut` for state the graph updates)"
                )),
            );
            return None;
        }
        (None, None) => {
            cx.error_spanned_by(
                ty,
                Message::new(format!(
                    "parameter `{ident}` is passed by value, which a graph freezes at capture"
                ))
                .why("the graph would keep the value it had at capture, and every replay would reuse it")
                .fix(format!(
                    "mark it `#[constant]` if that is what you want, or pass it in a device buffer \
                     (`{ident}: &CudaSlice<_>`) so that replays can change it"
                )),
            );
            return None;
        }
        (Some((other, span)), Some(_)) => {
            cx.error_at(span, Message::new(format!("unknown role `#[{other}]`")));
            return None;
        }
    };
    Some(role)
}

/// Checks the type of a parameter with `role` (`ty` without its reference): device buffers
/// for inputs and outputs, no borrowed types, no `impl Trait`. `None` after an error.
fn check_param_type(ident: &Ident, role: Role, ty: &Type, cx: &mut Ctxt) -> Option<()> {
    if matches!(role, Role::Input | Role::Output) {
        if let Some(elem) = host_element(ty) {
            let (what, fix) = if role == Role::Input {
                (
                    "input",
                    format!(
                        "declare it as a device buffer, `{ident}: &CudaSlice<{elem}>`: `replay` still accepts host data \
                         (`graph.replay(&host_vec)`) and copies it in"
                    ),
                )
            } else {
                (
                    "output",
                    format!(
                        "declare it as a device buffer, `{ident}: &mut CudaSlice<{elem}>`, and copy it to the host \
                         after `replay()` returns (`stream.clone_dtoh(out.{ident})`)"
                    ),
                )
            };
            cx.error_spanned_by(
                ty,
                Message::new(format!(
                    "{what} `{ident}` is host memory (`{}`)",
                    ty.to_token_stream().to_string().replace(' ', "")
                ))
                .why("a graph's inputs and outputs are device buffers the graph owns at fixed addresses")
                .fix(fix),
            );
            return None;
        }
    }
    if role != Role::Constant {
        if let Some(span) = first_lifetime(ty).or_else(|| view_type(ty)) {
            cx.error_at(
                span,
                Message::new(format!("the type of `{ident}` borrows (it has a lifetime)"))
                    .why(
                        "a graph keeps its buffers for as long as it lives, so inputs, outputs and state \
                         must be owned buffer types such as `CudaSlice<f32>`, not views",
                    )
                    .fix(format!(
                        "a `&CudaSlice<T>` input already accepts a `CudaView<T>` (or host data) in \
                         `capture` and `replay`, copying it into the graph's buffer: declare \
                         `{ident}: &CudaSlice<T>`"
                    ))
                    .fix(
                        "for a model, hold a type that owns what it uses, whose lifetimes are all \
                         `'static` (`Func<'static>`, `Box<dyn Module>`; a model of another crate in \
                         `graph_runtime::candle::ModelState<M>`), and give the graph the model itself \
                         (owned, borrowed for the graph's life, or in an `Arc`)",
                    ),
            );
            return None;
        }
    }
    if let Some(span) = first_impl_trait(ty) {
        cx.error_at(
            span,
            Message::new(format!(
                "`impl Trait` in the type of `{ident}` makes the function generic"
            ))
            .fix("name a concrete type"),
        );
        return None;
    }
    Some(())
}

/// The options of `#[state(…)]`: `no_restore` (only for `&mut` state).
fn state_options(attr: &Attribute, ident: &Ident, ty: &Type, cx: &mut Ctxt) -> bool {
    let mutable = matches!(ty, Type::Reference(r) if r.mutability.is_some());
    let mut no_restore = false;
    let parsed = attr.parse_nested_meta(|meta| {
        if meta.path.is_ident("no_restore") {
            if !mutable {
                return Err(meta.error(
                    Message::new("`no_restore` applies to `&mut` state only")
                        .why(format!(
                            "`{ident}` is read-only, so the warmup cannot change it and there is nothing \
                             to restore"
                        ))
                        .fix("write `#[state]`"),
                ));
            }
            no_restore = true;
            Ok(())
        } else {
            Err(meta.error(
                Message::new("unknown `#[state]` option; the only one is `no_restore`").fix(
                    "write `#[state(no_restore)]` to keep what the warmup runs wrote to this `&mut` \
                     state instead of restoring the value it had before them",
                ),
            ))
        }
    });
    if let Err(e) = parsed {
        cx.push(e);
    }
    no_restore
}

/// The element type of a host buffer type (`Vec<T>`, `[T]`, `[T; N]`, `Box<[T]>`) or of a
/// scalar (`f32`): types a user may write for an input or output that can only be host
/// memory.
fn host_element(ty: &Type) -> Option<String> {
    const SCALARS: [&str; 14] = [
        "f32", "f64", "i8", "i16", "i32", "i64", "isize", "u8", "u16", "u32", "u64", "usize",
        "bool", "char",
    ];
    let text = |t: &Type| t.to_token_stream().to_string().replace(' ', "");
    match ty {
        Type::Slice(s) => Some(text(&s.elem)),
        Type::Array(a) => Some(text(&a.elem)),
        Type::Paren(p) => host_element(&p.elem),
        Type::Path(p) if p.qself.is_none() => {
            let last = p.path.segments.last()?;
            let name = last.ident.to_string();
            if SCALARS.contains(&name.as_str()) && p.path.segments.len() == 1 {
                return Some(name);
            }
            let syn::PathArguments::AngleBracketed(args) = &last.arguments else {
                return None;
            };
            let Some(syn::GenericArgument::Type(inner)) = args.args.first() else {
                return None;
            };
            match name.as_str() {
                "Vec" | "VecDeque" => Some(text(inner)),
                "Box" => host_element(inner),
                _ => None,
            }
        }
        _ => None,
    }
}

fn first_lifetime(ty: &Type) -> Option<Span> {
    struct Finder(Option<Span>);
    impl<'ast> Visit<'ast> for Finder {
        // `'static` borrows nothing a graph could outlive: `Func<'static>`, `Box<dyn Module +
        // 'static>` and `&'static T` are owned for the graph's purposes.
        fn visit_lifetime(&mut self, l: &'ast syn::Lifetime) {
            if l.ident != "static" {
                self.0.get_or_insert(l.span());
            }
        }
        fn visit_type_reference(&mut self, r: &'ast syn::TypeReference) {
            if r.lifetime.as_ref().is_none_or(|l| l.ident != "static") {
                self.0.get_or_insert(r.and_token.span());
            }
            syn::visit::visit_type_reference(self, r);
        }
    }
    let mut f = Finder(None);
    f.visit_type(ty);
    f.0
}

/// cudarc's view types, which borrow even when their lifetime is elided (`CudaView<f32>`).
fn view_type(ty: &Type) -> Option<Span> {
    struct Finder(Option<Span>);
    impl<'ast> Visit<'ast> for Finder {
        fn visit_path_segment(&mut self, s: &'ast syn::PathSegment) {
            if ["CudaView", "CudaViewMut"].iter().any(|v| s.ident == v) {
                self.0.get_or_insert(s.ident.span());
            }
            syn::visit::visit_path_segment(self, s);
        }
    }
    let mut f = Finder(None);
    f.visit_type(ty);
    f.0
}

fn first_impl_trait(ty: &Type) -> Option<Span> {
    struct Finder(Option<Span>);
    impl<'ast> Visit<'ast> for Finder {
        fn visit_type_impl_trait(&mut self, t: &'ast syn::TypeImplTrait) {
            self.0.get_or_insert(t.span());
        }
    }
    let mut f = Finder(None);
    f.visit_type(ty);
    f.0
}

#[cfg(test)]
mod tests;
