//! The graph type of a function: `FooGraph`, a wrapper around the runtime's
//! `TypedGraph<__FooBody>`, and the `FooInputs` / `FooOutputs` / `FooState` views; or, with
//! `buckets(…)`, its family `FooBuckets`, a wrapper around the runtime's
//! `TypedFamily<__FooBody>`, and the `FooBucketOutputs` / `FooBucketState` views.
//!
//! The expansion is thin: the macro fills in the runtime's `GraphBody` trait (`__FooBody`
//! holds the state and constants; the static inputs and outputs are named as tuple types,
//! which the runtime checks, stages, shadows and verifies generically), and `TypedGraph` or
//! `TypedFamily` supplies everything else once. A family's body differs from a single
//! graph's only in how it runs: on the bucket's rows of its buffers (`__cg::rows`). Only the
//! typed `capture`, `replay` and `verify` stay generated, `replay` and `verify` forwarding in
//! a line. One function per generated item, as serde_derive's `ser.rs` does; the generated
//! locals are named after the user's parameters.
//!
//! Imports `parts.rs`, `buckets.rs` (a family's own pieces), `args`, `model` and `tokens`;
//! never its parent (`expand.rs`) or `check`.

use proc_macro2::{Ident, Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;

use super::buckets;
use super::parts::{CaptureParam, Parts};
use crate::args::buckets::BucketArgs;
use crate::args::{GraphArgs, VerifyEvery};
use crate::model::{Param, Role};
use crate::tokens::relocated;

/// The graph type (or bucket family) of the function and its views, as the items of the
/// generated module, and the names to re-export from it.
pub(super) fn expand_graph(parts: &Parts, args: &GraphArgs) -> (TokenStream, Vec<Ident>) {
    let g = Gen::new(parts, args);
    let (pr, graph_ty, body_ty) = (g.pr, &g.graph_ty, &g.body_ty);
    let types = g.types();
    let views = g.views();
    let graph_body = g.graph_body();
    let methods = g.methods();
    let names: Vec<Ident> = std::iter::once(graph_ty)
        .chain(g.family.is_none().then_some(&g.inputs_ty))
        .chain([&g.outputs_ty, &g.state_ty])
        .cloned()
        .collect();
    let family = g.family.map(|_| quote!(family));
    let views_ty = &names[1..];
    let body = quote! {
        #types
        #views
        #pr::graph_type_impls!(#family #graph_ty, #body_ty, #(#views_ty),*);
        #graph_body
        #methods
    };
    (body, names)
}

/// `FooBody` → `__FooBody`, for the generated types users never name.
trait Hidden {
    fn hidden(self) -> Ident;
}

impl Hidden for Ident {
    fn hidden(self) -> Ident {
        format_ident!("__{}", self, span = self.span())
    }
}

/// What every generated item of a single graph needs: the function's parts, the graph's
/// arguments and the generated types' names.
struct Gen<'p, 'm> {
    parts: &'p Parts<'m>,
    args: &'p GraphArgs,
    /// `buckets(…)`: the family's sizes, fallback and captures.
    family: Option<&'p BucketArgs>,
    pr: &'p TokenStream,
    vis: &'p TokenStream,
    graph_ty: Ident,
    body_ty: Ident,
    inputs_ty: Ident,
    outputs_ty: Ident,
    state_ty: Ident,
    /// A returned value (`-> Result<Tensor>`): a static buffer filled inside the graph.
    result_ty: Option<TokenStream>,
}

impl<'p, 'm> Gen<'p, 'm> {
    fn new(parts: &'p Parts<'m>, args: &'p GraphArgs) -> Self {
        let family = args.buckets.as_ref();
        let (graph, outputs, state) = match family {
            None => ("Graph", "Outputs", "State"),
            Some(_) => ("Buckets", "BucketOutputs", "BucketState"),
        };
        Gen {
            parts,
            args,
            family,
            pr: &parts.pr,
            vis: &parts.vis,
            graph_ty: parts.type_name(graph),
            // Hidden: named so that a type of the user's module is not shadowed by them.
            body_ty: parts.type_name("Body").hidden(),
            inputs_ty: parts.type_name("Inputs"),
            outputs_ty: parts.type_name(outputs),
            state_ty: parts.type_name(state),
            result_ty: parts.model.result.as_ref().map(relocated),
        }
    }

    fn ty(&self, p: &Param) -> TokenStream {
        self.parts.ty(p)
    }

    /// `FooGraph<'s>`, the user's type, and `__FooBody<'s>`, the held state and the
    /// constants (the static buffers are the runtime's `Statics` of tuples).
    fn types(&self) -> TokenStream {
        let (pr, vis, graph_ty, body_ty) = (self.pr, self.vis, &self.graph_ty, &self.body_ty);
        let state_fields = self.parts.state_fields();
        let const_fields = self.parts.const_fields();
        // Held state borrows for `'s`; without any, a marker does.
        let marker = state_fields
            .is_empty()
            .then(|| quote!(__state: ::core::marker::PhantomData<&'s ()>,));
        let (doc, must_use, typed) = match self.family {
            None => (
                self.struct_doc(),
                "a captured graph does nothing until it is replayed",
                quote!(TypedGraph),
            ),
            Some(b) => (
                buckets::family_doc(self.parts, b),
                "a captured bucket family does nothing until it is replayed",
                quote!(TypedFamily),
            ),
        };
        quote! {
            #[doc = #doc]
            #[must_use = #must_use]
            #vis struct #graph_ty<'s>(#pr::#typed<#body_ty<'s>>);

            #[doc(hidden)]
            #vis struct #body_ty<'s> {
                #(#state_fields,)*
                #(#const_fields,)*
                #marker
            }
        }
    }

    fn struct_doc(&self) -> String {
        let (fn_name, graph_ty, warmup) = (&self.parts.fn_name, &self.graph_ty, self.args.warmup());
        format!(
            "The CUDA graph of [`{fn_name}`], generated by `#[cuda_graph(warmup = {warmup})]`: \
             [`{graph_ty}::capture`] warms it up, records it and instantiates the graph; \
             [`{graph_ty}::replay`] copies new inputs in and launches it. `launch`, `inputs_mut`, \
             `outputs`, `state_mut`, `info` and `graph` come from the runtime's `TypedGraph` \
             (see \"What the macro generates\" in the `graph_runtime` docs)."
        )
    }

    /// The three views: `FooInputs` (static inputs lent to fill in place), `FooOutputs`
    /// (outputs borrowed until the next replay) and `FooState` (state lent between replays);
    /// a family has no inputs view, and its outputs view holds the valid rows.
    fn views(&self) -> TokenStream {
        let (inputs_ty, outputs_ty, state_ty) = (&self.inputs_ty, &self.outputs_ty, &self.state_ty);
        let inputs = self.family.is_none().then(|| {
            self.view(
                inputs_ty,
                "The graph's static input buffers, one field per input, lent as views to fill in place before a `launch`: written into, never replaced.",
                self.input_view_fields(),
                quote!(&'g mut ()),
            )
        });
        let outputs = match self.family {
            None => self.view(
                outputs_ty,
                "The graph's outputs, one field per output (and `result`, what the function returned), borrowed until the next replay.",
                self.output_view_fields(),
                quote!(&'g ()),
            ),
            Some(_) => self.view(
                outputs_ty,
                "The valid rows of the outputs of the last replay (each a `CudaView` of the output's first rows), borrowed from the family until the next replay.",
                buckets::output_view_fields(self.parts),
                quote!(&'g ()),
            ),
        };
        let state = self.view(
            state_ty,
            "The state, one field per state parameter, lent back between replays.",
            self.state_view_fields(),
            quote!(&'g mut ()),
        );
        quote!(#inputs #outputs #state)
    }

    /// One view: its fields, or a marker of its lifetime when it has none.
    fn view(
        &self,
        ty: &Ident,
        doc: &str,
        fields: Vec<TokenStream>,
        marker: TokenStream,
    ) -> TokenStream {
        let vis = self.vis;
        let marker = fields
            .is_empty()
            .then(|| quote!(#[doc(hidden)] pub __marker: ::core::marker::PhantomData<#marker>,));
        quote! {
            #[doc = #doc]
            #vis struct #ty<'g> {
                #(#fields,)*
                #marker
            }
        }
    }

    /// A view's initializer: its fields, or its marker when it has none.
    fn view_init(ty: &Ident, fields: Vec<TokenStream>) -> TokenStream {
        if fields.is_empty() {
            quote!(#ty { __marker: ::core::marker::PhantomData })
        } else {
            quote!(#ty { #(#fields,)* })
        }
    }

    fn input_view_fields(&self) -> Vec<TokenStream> {
        let pr = self.pr;
        self.parts
            .inputs
            .iter()
            .map(|p| {
                let (i, t) = (&p.ident, self.ty(p));
                quote!(pub #i: <#t as #pr::DeviceState>::Lent<'g>)
            })
            .collect()
    }

    fn output_view_fields(&self) -> Vec<TokenStream> {
        self.parts
            .outputs
            .iter()
            .map(|p| {
                let (i, t) = (&p.ident, self.ty(p));
                quote!(pub #i: &'g #t)
            })
            .chain(self.result_ty.iter().map(|t| quote!(pub result: &'g #t)))
            .collect()
    }

    fn state_view_fields(&self) -> Vec<TokenStream> {
        let pr = self.pr;
        self.parts
            .states
            .iter()
            .map(|p| {
                let (i, t) = (&p.ident, self.ty(p));
                match p.role {
                    Role::State { mutable: true } if p.island => {
                        quote!(pub #i: &'g mut #t)
                    }
                    Role::State { mutable: true } => {
                        quote!(pub #i: <#t as #pr::DeviceState>::Lent<'g>)
                    }
                    _ => quote!(pub #i: &'g #t),
                }
            })
            .collect()
    }

    /// The names of a list of parameters, as a `&[&str]` constant's value.
    fn names(params: &[&Param]) -> TokenStream {
        let names = params.iter().map(|p| p.ident.to_string());
        quote!(&[#(#names),*])
    }

    /// `impl GraphBody for __FooBody`: what the runtime's `TypedGraph` needs of the function.
    fn graph_body(&self) -> TokenStream {
        let (pr, body_ty) = (self.pr, &self.body_ty);
        let (inputs_ty, outputs_ty, state_ty) = (&self.inputs_ty, &self.outputs_ty, &self.state_ty);
        let site = &self.parts.site;
        let ctx_ty = self.parts.ctx_ty();
        let ctx_assoc = quote_spanned!(ctx_ty.span()=> type Ctx = #ctx_ty;);
        let inputs_view = match self.family {
            None => quote!(#inputs_ty<'g>),
            Some(_) => quote!(()),
        };
        let ins = self.parts.inputs.iter().map(|p| self.ty(p));
        let outs = self.parts.outputs.iter().map(|p| self.ty(p));
        let value = match &self.result_ty {
            None => quote!(#pr::NoResult),
            Some(t) => quote!(#pr::ResultOf<#t>),
        };
        let (input_names, output_names) = (
            Self::names(&self.parts.inputs),
            Self::names(&self.parts.outputs),
        );
        let (every, tolerance) = verify_schedule_tokens(self.args, pr);
        let run = self.run_body();
        let state_book = self.state_book();
        let accessors = self.view_accessors();
        let islands = &self.parts.island_items;
        quote! {
            impl<'s> #pr::GraphBody for #body_ty<'s> {
                #ctx_assoc
                type Ins = (#(#ins,)*);
                type Outs = (#(#outs,)*);
                type Value = #value;
                type Inputs<'g> = #inputs_view where Self: 'g;
                type Outputs<'g> = #outputs_ty<'g> where Self: 'g;
                type State<'g> = #state_ty<'g> where Self: 'g;
                const INPUTS: &'static [&'static str] = #input_names;
                const OUTPUTS: &'static [&'static str] = #output_names;
                const DEBUG: bool = ::core::cfg!(debug_assertions);
                #every
                #tolerance
                const SITE: #pr::GraphSite = #site;
                fn run(&mut self, s: &mut #pr::StaticsOf<Self>, __ctx: &Self::Ctx, __rt: &#pr::Runtime) -> #pr::Result<()> {
                    #run
                }
                #state_book
                #accessors
                #islands
            }
        }
    }

    /// The body's run during warmup, capture and `verify`'s eager run: the user's function
    /// on the static buffers, its returned value stored in the result buffer if it has one.
    fn run_body(&self) -> TokenStream {
        let pr = self.pr;
        let call_args: Vec<TokenStream> = self
            .parts
            .model
            .params
            .iter()
            .map(|p| {
                let i = &p.ident;
                match p.role {
                    // `&mut` locals of the destructured statics (a family's: of its `Rows`),
                    // coerced to the parameters.
                    Role::Input | Role::Output => quote!(#i),
                    Role::State { .. } => self.parts.held_arg(p, quote!(self.#i)),
                    // The bucket's rows, at the batch parameter's type.
                    Role::Bucket => {
                        let t = self.ty(p);
                        quote!(*__b as #t)
                    }
                    // The whole argument at the constant's type, `self.` included.
                    Role::Constant => {
                        quote_spanned!(p.ty.span()=> #pr::constant(&self.#i))
                    }
                }
            })
            .collect();
        let call = self.parts.call(&call_args);
        // The static buffers (a family's bucket rows of them) as locals named after the
        // parameters.
        let statics = self.statics_locals();
        match &self.result_ty {
            None => {
                let body_result = self.parts.body_result();
                quote!(#statics #body_result(#call))
            }
            Some(t) => {
                let body_value = self.body_value();
                quote! {
                    #statics
                    let __value = #body_value(#call)?;
                    #pr::store_result::<#t>(__rt, Self::site(), &mut __result.0, &__value)
                }
            }
        }
    }

    /// The statement that binds the static buffers of `s` to locals named after the
    /// parameters (`&mut` borrows; a family's are of the bucket's `Rows` of them, after its
    /// rows `__b`): what `run` and `island` start with.
    fn statics_locals(&self) -> TokenStream {
        let pr = self.pr;
        let ins = self.parts.inputs.iter().map(|p| &p.ident);
        let outs = self.parts.outputs.iter().map(|p| &p.ident);
        if self.family.is_some() {
            return quote!(let (__b, (#(#ins,)*), (#(#outs,)*)) = &mut #pr::rows(s););
        }
        let result = self.result_ty.as_ref().map(|_| quote!(result: __result,));
        quote!(let #pr::Statics { inputs: (#(#ins,)*), outputs: (#(#outs,)*), #result .. } = s;)
    }

    fn body_value(&self) -> TokenStream {
        let pr = self.pr;
        quote_spanned!(self.parts.model.item.sig.output.span()=> #pr::BodyValue::into_graph_value)
    }

    /// `states`: each state handed to the runtime's visitor with its name and how it is
    /// recorded, which serves both recording and checking its addresses (the outputs' are
    /// the runtime's). Nothing without state (the trait's default).
    fn state_book(&self) -> TokenStream {
        let pr = self.pr;
        let Some((last, rest)) = self.parts.book_states.split_last() else {
            return TokenStream::new();
        };
        let visit = |p: &Param| {
            let (i, kind) = (&p.ident, self.parts.recorded_kind(p));
            let name = i.to_string();
            quote!(v.state(#name, &*self.#i, #kind))
        };
        let rest = rest.iter().map(|p| visit(p));
        let last = visit(last);
        quote! {
            fn states<V: #pr::StateVisitor>(&self, v: &mut V) -> #pr::Result<()> {
                #(#rest?;)*
                #last
            }
        }
    }

    /// `inputs_mut`, `outputs` and `state_mut` of `GraphBody`: the static buffers as locals
    /// named after the parameters, and the state, in their views.
    fn view_accessors(&self) -> TokenStream {
        let pr = self.pr;
        let (inputs_ty, outputs_ty, state_ty) = (&self.inputs_ty, &self.outputs_ty, &self.state_ty);
        let ins: Vec<&Ident> = self.parts.inputs.iter().map(|p| &p.ident).collect();
        let outs: Vec<&Ident> = self.parts.outputs.iter().map(|p| &p.ident).collect();
        let input_init = ins.iter().map(|i| quote!(#i)).collect();
        let result = self.result_ty.as_ref().map(|_| quote!(result: __result,));
        let output_init = outs
            .iter()
            .map(|i| quote!(#i))
            .chain(result.iter().map(|_| quote!(result: __result.get())))
            .collect();
        let state_init = self
            .parts
            .states
            .iter()
            .map(|p| {
                let i = &p.ident;
                match p.role {
                    Role::State { mutable: true } if p.island => quote!(#i: &mut *self.#i),
                    Role::State { mutable: true } => {
                        quote!(#i: #pr::DeviceState::lend(&mut *self.#i))
                    }
                    _ => quote!(#i: &*self.#i),
                }
            })
            .collect();
        let (inputs, outputs, state) = (
            Self::view_init(inputs_ty, input_init),
            Self::view_init(outputs_ty, output_init),
            Self::view_init(state_ty, state_init),
        );
        let (inputs_mut, outputs_of) = match self.family {
            None => (
                quote! {
                    fn inputs_mut(s: &mut #pr::StaticsOf<Self>) -> #inputs_ty<'_> {
                        let (#(#ins,)*) = #pr::StaticList::lend(&mut s.inputs);
                        #inputs
                    }
                },
                quote!(let #pr::Statics { outputs: (#(#outs,)*), #result .. } = s;),
            ),
            // A family's inputs are staged by rows, never lent; its outputs are the rows.
            Some(_) => (
                quote!(fn inputs_mut(s: &mut #pr::StaticsOf<Self>) {}),
                quote!(let (#(#outs,)*) = #pr::BatchList::valid(&s.outputs, s.batch);),
            ),
        };
        quote! {
            #inputs_mut
            fn outputs(s: &#pr::StaticsOf<Self>) -> #outputs_ty<'_> {
                #outputs_of
                #outputs
            }
            fn state_mut(&mut self) -> #state_ty<'_> {
                #state
            }
        }
    }

    /// `WARMUP` and the typed methods: `capture`, and `replay` and `verify` forwarding to the
    /// runtime's `TypedGraph` in a line (a family's: `BUCKETS` and its own, see
    /// `buckets.rs`).
    fn methods(&self) -> TokenStream {
        let (pr, vis, graph_ty, outputs_ty) = (self.pr, self.vis, &self.graph_ty, &self.outputs_ty);
        if let Some(b) = self.family {
            let methods = buckets::family_methods(self.parts, b, &self.body_ty, outputs_ty);
            return quote!(impl<'s> #graph_ty<'s> { #methods });
        }
        let warmup = proc_macro2::Literal::u32_unsuffixed(self.args.warmup());
        let capture = self.capture();
        let (generics, params) = self.parts.replay_inputs();
        let names: Vec<&Ident> = self.parts.inputs.iter().map(|p| &p.ident).collect();
        let replay_doc = "Copies the inputs into the graph's static buffers and launches the graph, all on the \
                          runtime's stream; returns as soon as the work is queued. Every input's shape and \
                          every state's addresses are checked first: a mismatch is `GraphError::InputShape` \
                          or `GraphError::StateMoved` and launches nothing.";
        let verify_doc = "Checks one replay against the eager function on the same inputs: runs the \
                          function eagerly on copies of the inputs into shadow outputs, undoes what that \
                          run did to the `&mut` state and the random generators, replays the graph, and \
                          compares every output and every `&mut` state (`Tolerance::BITWISE`, or within a \
                          tolerance).";
        quote! {
            impl<'s> #graph_ty<'s> {
                /// Eager runs before the capture.
                pub const WARMUP: u32 = #warmup;

                #capture

                #[doc = #replay_doc]
                #vis fn replay<#(#generics),*>(&mut self, #(#params),*) -> ::core::result::Result<#outputs_ty<'_>, #pr::GraphError> {
                    self.0.replay_inputs((#(#names,)*))
                }

                #[doc = #verify_doc]
                #vis fn verify<#(#generics),*>(&mut self, #(#params,)* tolerance: #pr::Tolerance) -> ::core::result::Result<#pr::VerifyReport, #pr::GraphError> {
                    self.0.verify_inputs((#(#names,)*), tolerance)
                }
            }
        }
    }

    /// `capture`'s parameters after the runtime, with their generics, in the function's
    /// order.
    fn capture_params(&self) -> Vec<CaptureParam> {
        let pr = self.pr;
        self.parts
            .model
            .params
            .iter()
            .enumerate()
            .map(|(n, p)| {
                let (i, t) = (&p.ident, self.ty(p));
                match p.role {
                    Role::Input => (None, quote!(#i: &(impl ?Sized + #pr::InputSource<#t>))),
                    Role::State { mutable: true } => {
                        (None, quote!(#i: impl #pr::StateArgMut<'s, #t>))
                    }
                    Role::State { mutable: false } => {
                        (None, quote!(#i: impl #pr::StateArg<'s, #t>))
                    }
                    // A `CudaSlice` output is given by its length: the docs then read `y: usize`.
                    Role::Output if is_cuda_slice(&p.ty) => (None, quote!(#i: usize)),
                    Role::Output => (None, quote!(#i: <#t as #pr::StaticBuffer>::Shape)),
                    _ => self.parts.held_capture_param(n, p),
                }
            })
            .collect()
    }

    /// `capture`: the state held, each input and output turned into its static buffer (a
    /// local of the parameter's own name, in the function's order), then the runtime's
    /// warmup and capture.
    fn capture(&self) -> TokenStream {
        let (pr, body_ty) = (self.pr, &self.body_ty);
        let hold_states = self.parts.hold_states();
        let ins = self.parts.inputs.iter().map(|p| &p.ident);
        // The tuple of input sources, spanned at the first input's type: an input type that is
        // no static buffer is reported among the parameters (at the first input's type, the
        // tuple being one expression) rather than at the attribute.
        let span = self
            .parts
            .inputs
            .first()
            .map_or_else(Span::call_site, |p| p.ty.span());
        let inputs = quote_spanned!(span=> (#(#ins,)*));
        let outs = self.parts.outputs.iter().map(|p| &p.ident);
        let held = self
            .parts
            .model
            .of(|r| matches!(r, Role::State { .. } | Role::Constant))
            .map(|p| &p.ident);
        let (generics, params): (Vec<_>, Vec<_>) = self.capture_params().into_iter().unzip();
        let generics = generics.into_iter().flatten();
        let vis = self.vis;
        let doc = self.capture_doc();
        let marker = self
            .parts
            .states
            .is_empty()
            .then(|| quote!(__state: ::core::marker::PhantomData));
        quote! {
            #[doc = #doc]
            #vis fn capture<#(#generics),*>(rt: &#pr::Runtime, #(#params),*) -> ::core::result::Result<Self, #pr::GraphError> {
                #(#hold_states)*
                let __body = #body_ty { #(#held,)* #marker };
                #pr::TypedGraph::capture_from(rt, __body, #inputs, (#(#outs,)*)).map(Self)
            }
        }
    }

    fn capture_doc(&self) -> String {
        let fn_name = &self.parts.fn_name;
        let warmup = self.args.warmup();
        format!(
            "Warms up `{fn_name}` ({warmup} eager run(s) on the runtime's stream), captures it and \
             instantiates the graph. Inputs are copied into static buffers; outputs are given by \
             shape (a length for a `CudaSlice`); state as `&T` / `&mut T` (borrowed for the graph's \
             life), `Arc<T>` or by value; constants are frozen."
        )
    }
}
/// When the graph's replays verify themselves (`verify = "never" | "first" | "doubling" |
/// "every"` with `verify_every = N`; by default replays 1, 2, 4, … in debug builds, the
/// trait's default):
/// `VERIFY_EVERY` when `verify` is given, and `tolerance` when `verify_tolerance` is.
fn verify_schedule_tokens(args: &GraphArgs, pr: &TokenStream) -> (TokenStream, TokenStream) {
    let every = match args.verify {
        None => None,
        Some(VerifyEvery::Never) => Some(quote!(#pr::VerifySchedule::NEVER)),
        Some(VerifyEvery::First) => Some(quote!(#pr::VerifySchedule::FIRST)),
        Some(VerifyEvery::Doubling) => Some(quote!(#pr::VerifySchedule::DOUBLING)),
        Some(VerifyEvery::Every(n)) => Some(quote!(#n)),
    };
    let every = every.map(|e| quote!(const VERIFY_EVERY: u64 = #e;));
    let tolerance = args.verify_tolerance.map(|t| {
        quote! {
            fn tolerance() -> #pr::Tolerance {
                #pr::Tolerance::new(#t, #t)
            }
        }
    });
    (quote!(#every), quote!(#tolerance))
}

/// Whether `t` is written as a `CudaSlice<…>` (any path ending in it), whose shape is a length.
fn is_cuda_slice(t: &syn::Type) -> bool {
    match t {
        syn::Type::Path(p) if p.qself.is_none() => p
            .path
            .segments
            .last()
            .is_some_and(|s| s.ident == "CudaSlice"),
        _ => false,
    }
}
