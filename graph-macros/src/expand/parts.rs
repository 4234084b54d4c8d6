//! The pieces of generated code that the single graph (`graph.rs`) and the bucket family
//! (`buckets.rs`) both contain, written once: the held state and constants, the parameters
//! of `capture` and `replay`, and the call of the user's function.
//!
//! Imports the model and the token helpers only; never its parent (`expand.rs`), its
//! siblings, `args` or `check`.

use proc_macro2::{Ident, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;

use crate::model::{GraphFn, Param, Role};
use crate::tokens::{inner_vis, relocated, unraw};

/// A parameter of the generated `capture`, and the generic parameter it is given through,
/// if any.
pub(super) type CaptureParam = (Option<TokenStream>, TokenStream);

/// The name of the generic parameter of `capture` through which the function's `n`th
/// parameter is given.
pub(super) fn capture_generic(n: usize) -> Ident {
    format_ident!("__S{}", n)
}

/// The function a graph type is generated for, with the names and paths every piece of the
/// generated code uses.
pub(super) struct Parts<'m> {
    pub model: &'m GraphFn,
    /// The `GraphSite` literal of the function (name, warmup, capture mode).
    pub site: TokenStream,
    /// What the generated types' names start with: the function's name in camel case, or
    /// the attribute's `name = …`.
    pub base: String,
    /// Where the generated types' names are spanned: the `name = …` value, or the
    /// function's name.
    base_span: proc_macro2::Span,
    /// `__cg`, the generated module's name for `#krate::__private` (the runtime's items for
    /// generated code), which keeps the expansion short.
    pub pr: TokenStream,
    /// The visibility of the generated items (see [`inner_vis`]).
    pub vis: TokenStream,
    pub fn_ident: &'m Ident,
    pub fn_name: String,
    /// The execution context's type, as seen from the generated module.
    ctx_ty: TokenStream,
    pub inputs: Vec<&'m Param>,
    pub outputs: Vec<&'m Param>,
    pub states: Vec<&'m Param>,
    /// The state the graph reads by address: `states` without the `#[island]` state.
    pub book_states: Vec<&'m Param>,
    /// `GraphBody::island` and its companions, for a body with eager islands (see
    /// `islands.rs`); empty without.
    pub island_items: TokenStream,
}

impl<'m> Parts<'m> {
    pub fn new(model: &'m GraphFn, site: TokenStream, name: Option<&Ident>) -> Self {
        let item = &model.item;
        let fn_ident = &item.sig.ident;
        Parts {
            model,
            site,
            base: name.map_or_else(|| camel(fn_ident), unraw),
            base_span: name.map_or(fn_ident.span(), Ident::span),
            pr: quote!(__cg),
            vis: inner_vis(&item.vis),
            fn_ident,
            fn_name: fn_ident.to_string(),
            ctx_ty: relocated(&model.context.as_ref().expect("checked by analyze").ty),
            inputs: model.of(|r| r == Role::Input).collect(),
            outputs: model.of(|r| r == Role::Output).collect(),
            states: model.of(|r| matches!(r, Role::State { .. })).collect(),
            book_states: model
                .of(|r| matches!(r, Role::State { .. }))
                .filter(|p| !p.island)
                .collect(),
            island_items: TokenStream::new(),
        }
    }

    /// A generated type's name: `ScaleAddGraph` for `scale_add` and `"Graph"`, spanned at
    /// the function's name.
    pub fn type_name(&self, suffix: &str) -> Ident {
        format_ident!("{}{}", self.base, suffix, span = self.base_span)
    }

    /// The execution context's type, as seen from the generated module.
    pub fn ctx_ty(&self) -> &TokenStream {
        &self.ctx_ty
    }

    /// Parameter `p`'s type as seen from the generated module.
    pub fn ty(&self, p: &Param) -> TokenStream {
        relocated(&p.ty)
    }

    /// The struct fields holding the state parameters for the graph's life.
    pub fn state_fields(&self) -> Vec<TokenStream> {
        let pr = &self.pr;
        self.states
            .iter()
            .map(|p| {
                let (i, t) = (&p.ident, self.ty(p));
                match p.role {
                    Role::State { mutable: true } => quote!(#i: #pr::HeldMut<'s, #t>),
                    _ => quote!(#i: #pr::Held<'s, #t>),
                }
            })
            .collect()
    }

    /// The struct fields holding the constants frozen at capture.
    pub fn const_fields(&self) -> Vec<TokenStream> {
        self.model
            .of(|r| r == Role::Constant)
            .map(|p| {
                let (i, t) = (&p.ident, self.ty(p));
                quote!(#i: #t)
            })
            .collect()
    }

    /// `capture`'s parameter for state or constant `p` (the function's `n`th parameter),
    /// with the generic parameter it is given through: a state as `s: __S3` with
    /// `__S3: StateArg<'s, T>` (`StateArgMut` for `&mut` state), a constant by value.
    pub fn held_capture_param(&self, n: usize, p: &Param) -> CaptureParam {
        let (pr, i, t) = (&self.pr, &p.ident, self.ty(p));
        let g = capture_generic(n);
        match p.role {
            Role::State { mutable: true } => {
                (Some(quote!(#g: #pr::StateArgMut<'s, #t>)), quote!(#i: #g))
            }
            Role::State { mutable: false } => {
                (Some(quote!(#g: #pr::StateArg<'s, #t>)), quote!(#i: #g))
            }
            _ => (None, quote!(#i: #t)),
        }
    }

    /// `capture`'s first statements: each state argument turned into what the graph holds.
    pub fn hold_states(&self) -> Vec<TokenStream> {
        let pr = &self.pr;
        self.states
            .iter()
            .map(|p| {
                let i = &p.ident;
                match p.role {
                    Role::State { mutable: true } => {
                        quote!(let mut #i = #pr::StateArgMut::into_held_mut(#i);)
                    }
                    _ => quote!(let #i = #pr::StateArg::into_held(#i);),
                }
            })
            .collect()
    }

    /// How the address book records state parameter `p`.
    pub fn recorded_kind(&self, p: &Param) -> TokenStream {
        let pr = &self.pr;
        match p.role {
            Role::State { mutable: true } => {
                let restore = !p.no_restore;
                quote!(#pr::Recorded::mutable(#restore))
            }
            _ => quote!(#pr::Recorded::State),
        }
    }

    /// A state, constant or batch parameter `p` as the user's function receives it from
    /// `owner` (the held value, `x` or `self.x`).
    pub fn held_arg(&self, p: &Param, owner: TokenStream) -> TokenStream {
        let pr = &self.pr;
        match p.role {
            Role::State { mutable: true } => quote!(&mut *#owner),
            Role::State { mutable: false } => quote!(&*#owner),
            _ => quote_spanned!(p.ty.span()=> #pr::constant(&#owner)),
        }
    }

    /// The call of the user's function with `args` after the context `__ctx`.
    pub fn call(&self, args: &[TokenStream]) -> TokenStream {
        let fn_ident = self.fn_ident;
        quote!(super::#fn_ident(__ctx, #(#args),*))
    }

    /// The conversion of the function's return value into the graph's result, spanned at
    /// the return type (so that a return type that is not a result is reported there).
    pub fn body_result(&self) -> TokenStream {
        let pr = &self.pr;
        quote_spanned!(self.model.item.sig.output.span()=> #pr::body_result)
    }

    /// The generic parameters and the parameters of `replay`, one of each per input:
    /// `__R0: ?Sized + InputSource<T>` and `x: &__R0`.
    pub fn replay_inputs(&self) -> (Vec<TokenStream>, Vec<TokenStream>) {
        let pr = &self.pr;
        self.inputs
            .iter()
            .enumerate()
            .map(|(n, p)| {
                let (i, t) = (&p.ident, self.ty(p));
                let g = format_ident!("__R{}", n);
                (quote!(#g: ?Sized + #pr::InputSource<#t>), quote!(#i: &#g))
            })
            .unzip()
    }
}

/// `scale_add` → `ScaleAdd`.
pub(super) fn camel(ident: &Ident) -> String {
    unraw(ident)
        .split('_')
        .filter(|s| !s.is_empty())
        .map(|s| {
            let mut c = s.chars();
            c.next()
                .map(|f| f.to_uppercase().chain(c).collect::<String>())
                .unwrap_or_default()
        })
        .collect()
}
