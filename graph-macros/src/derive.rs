//! `#[derive(DeviceState)]`: where a struct or enum of the user's keeps its device buffers,
//! so that a graph can hold it as `#[state]`.
//!
//! Stands apart from the `#[cuda_graph]` pipeline: imports only `ctxt`.
//!
//! Every field must implement `DeviceState` (buffers, generators, containers of them, host
//! scalars), or be marked `#[device_state(skip)]` when it holds no device memory a graph
//! uses. The value is lent back from a graph as `&mut Self`; the graph compares the
//! buffers' addresses before every replay. `#[device_state(crate = "path")]` on the type
//! names the runtime crate when it is renamed.

use proc_macro2::TokenStream;
use quote::{format_ident, quote};
use syn::spanned::Spanned;
use syn::{Data, DeriveInput, Fields, LitStr};

use crate::ctxt::{Ctxt, Message};

/// Entry point: `#[derive(DeviceState)] item`.
pub fn derive(input: TokenStream) -> TokenStream {
    let input: DeriveInput = match syn::parse2(input) {
        Ok(i) => i,
        Err(e) => return e.to_compile_error(),
    };
    let mut cx = Ctxt::default();
    let krate = crate_path(&input.attrs, &mut cx);
    let body = match &input.data {
        Data::Struct(s) => {
            let visits = field_visits(&s.fields, |member| quote!(&self.#member), &krate, &mut cx);
            quote!(#(#visits)*)
        }
        Data::Enum(e) => {
            let arms: Vec<TokenStream> = e
                .variants
                .iter()
                .map(|v| {
                    let name = &v.ident;
                    let mut pattern = Vec::new();
                    let mut visits = Vec::new();
                    for (i, f) in v.fields.iter().enumerate() {
                        let binding = f.ident.clone().unwrap_or_else(|| format_ident!("__f{}", i));
                        if skip_field(f, &mut cx) {
                            if f.ident.is_none() {
                                pattern.push(quote!(_));
                            }
                            continue;
                        }
                        pattern.push(quote!(#binding));
                        visits.push(quote_spanned_visit(&f.ty, quote!(#binding), &krate));
                    }
                    let pattern = match &v.fields {
                        Fields::Named(_) => quote!(Self::#name { #(#pattern,)* .. }),
                        Fields::Unnamed(_) => quote!(Self::#name ( #(#pattern),* )),
                        Fields::Unit => quote!(Self::#name),
                    };
                    quote!(#pattern => { #(#visits)* })
                })
                .collect();
            quote! {
                match self { #(#arms)* }
            }
        }
        Data::Union(u) => {
            cx.error_spanned_by(
                u.union_token,
                Message::new("`DeviceState` cannot be derived for a union")
                    .why("the runtime could not tell which field holds the device buffers")
                    .fix("implement the trait by hand"),
            );
            quote!()
        }
    };
    if cx.has_errors() {
        return cx.finish();
    }
    let name = &input.ident;
    let mut generics = input.generics.clone();
    if generics.type_params().next().is_some() {
        // Bound what is visited, not the parameters: `Layer<T>` holding `CudaSlice<T>` needs
        // `CudaSlice<T>: DeviceState`, which holds for every `T`.
        let where_clause = generics.make_where_clause();
        for ty in visited_types(&input.data) {
            where_clause
                .predicates
                .push(syn::parse_quote!(#ty: #krate::DeviceState));
        }
    }
    let (impl_generics, ty_generics, where_clause) = generics.split_for_impl();
    // Host data only when every visited field is (a struct of counters and names held as
    // `&mut` state is refused like a `&mut u64`); a type with a device buffer anywhere is not.
    let host_only = visited_types(&input.data)
        .into_iter()
        .map(|ty| quote!(<#ty as #krate::DeviceState>::HOST_ONLY));
    quote! {
        // SAFETY: every field that is not skipped forwards its own regions, in declaration
        // order; skipped fields are the user's statement that they hold no device memory.
        unsafe impl #impl_generics #krate::DeviceState for #name #ty_generics #where_clause {
            type Lent<'__lent> = &'__lent mut Self where Self: '__lent;

            const HOST_ONLY: bool = true #(&& #host_only)*;

            fn regions(&self, __visit: &mut dyn FnMut(#krate::DeviceRegion)) {
                #body
            }

            fn lend(&mut self) -> &mut Self {
                self
            }
        }
    }
}

/// The types of every field that is not skipped, in every variant.
fn visited_types(data: &Data) -> Vec<syn::Type> {
    let fields: Vec<&syn::Field> = match data {
        Data::Struct(s) => s.fields.iter().collect(),
        Data::Enum(e) => e.variants.iter().flat_map(|v| v.fields.iter()).collect(),
        Data::Union(_) => Vec::new(),
    };
    fields
        .into_iter()
        .filter(|f| !marked_skip(&f.attrs))
        .map(|f| f.ty.clone())
        .collect()
}

/// One `regions` call per field that is not skipped.
fn field_visits(
    fields: &Fields,
    access: impl Fn(&syn::Member) -> TokenStream,
    krate: &syn::Path,
    cx: &mut Ctxt,
) -> Vec<TokenStream> {
    fields
        .iter()
        .enumerate()
        .filter_map(|(i, f)| {
            if skip_field(f, cx) {
                return None;
            }
            let member = match &f.ident {
                Some(n) => syn::Member::Named(n.clone()),
                None => syn::Member::Unnamed(syn::Index {
                    index: i as u32,
                    span: f.span(),
                }),
            };
            let value = access(&member);
            let ty = &f.ty;
            Some(quote_spanned_visit(ty, value, krate))
        })
        .collect()
}

fn quote_spanned_visit(ty: &syn::Type, value: TokenStream, krate: &syn::Path) -> TokenStream {
    let span = ty.span();
    quote::quote_spanned!(span=> <#ty as #krate::DeviceState>::regions(#value, __visit);)
}

/// Whether a field carries `#[device_state(skip)]`, without reporting malformed attributes
/// (`skipped` reports them, once).
fn marked_skip(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("device_state")
            && a.parse_nested_meta(|meta| {
                if meta.path.is_ident("skip") {
                    Ok(())
                } else {
                    Err(meta.error(""))
                }
            })
            .is_ok()
    })
}

/// Device buffer types that `skip` must not hide from the graph's checks.
const DEVICE_TYPES: [&str; 6] = [
    "CudaSlice",
    "CudaView",
    "CudaViewMut",
    "PinnedHostSlice",
    "Generator",
    "RngState",
];

/// A `skip` on a field whose type names a device buffer type.
fn skips_device_memory(ty: &syn::Type) -> Option<String> {
    let text = quote!(#ty).to_string();
    DEVICE_TYPES
        .iter()
        .find(|t| {
            text.split(|c: char| !c.is_alphanumeric() && c != '_')
                .any(|w| w == **t)
        })
        .map(|t| (*t).to_owned())
}

/// Whether a field is skipped; a skip of a device buffer type is an error.
fn skip_field(f: &syn::Field, cx: &mut Ctxt) -> bool {
    if !skipped(&f.attrs, cx) {
        return false;
    }
    if let Some(t) = skips_device_memory(&f.ty) {
        cx.error_spanned_by(
            &f.ty,
            Message::new(format!(
                "`#[device_state(skip)]` on a field that holds a `{t}`"
            ))
            .why(
                "the graph reads such buffers by address, and a skipped one could be replaced under \
                 it unnoticed",
            )
            .fix("remove `skip` (the field's buffers are then checked before every replay)"),
        );
    }
    true
}

/// Whether a field carries `#[device_state(skip)]` (other keys are errors).
fn skipped(attrs: &[syn::Attribute], cx: &mut Ctxt) -> bool {
    let mut skip = false;
    for attr in attrs.iter().filter(|a| a.path().is_ident("device_state")) {
        let parsed = attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("skip") {
                skip = true;
                Ok(())
            } else {
                Err(meta.error(
                    Message::new("unknown `device_state` field option; the only one is `skip`")
                        .fix(
                        "write `#[device_state(skip)]` on a field that holds no device memory the \
                         graph uses",
                    ),
                ))
            }
        });
        if let Err(e) = parsed {
            cx.push(e);
        }
    }
    skip
}

/// `#[device_state(crate = "path")]` on the type, or `::graph_runtime`.
fn crate_path(attrs: &[syn::Attribute], cx: &mut Ctxt) -> syn::Path {
    let mut path: syn::Path = syn::parse_quote!(::graph_runtime);
    for attr in attrs.iter().filter(|a| a.path().is_ident("device_state")) {
        let parsed = attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("crate") {
                let s: LitStr = meta.value()?.parse()?;
                path = s.parse()?;
                Ok(())
            } else {
                Err(meta.error(Message::new(
                    "unknown `device_state` option on the type; the only one is `crate = \"path\"`",
                )))
            }
        });
        if let Err(e) = parsed {
            cx.push(e);
        }
    }
    path
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn struct_fields_are_visited_in_order_and_skipped_fields_left_out() {
        let out = derive(quote! {
            struct Model<T> {
                w: CudaSlice<T>,
                #[device_state(skip)]
                name: Handle,
                layers: Vec<Layer>,
            }
        })
        .to_string();
        assert!(
            out.contains("where CudaSlice < T > : :: graph_runtime :: DeviceState , Vec < Layer > : :: graph_runtime :: DeviceState"),
            "{out}"
        );
        let w = out.find("& self . w").expect("w visited");
        let layers = out.find("& self . layers").expect("layers visited");
        assert!(w < layers, "{out}");
        assert!(!out.contains("self . name"), "skipped: {out}");
    }

    #[test]
    fn enums_and_tuple_structs() {
        let out = derive(quote! {
            enum Cache { Empty, Full { k: CudaSlice<f32>, v: CudaSlice<f32> }, One(CudaSlice<u8>) }
        })
        .to_string();
        assert!(out.contains("Self :: Full { k , v , .. }"), "{out}");
        assert!(out.contains("Self :: One (__f0)"), "{out}");
        let out = derive(quote!(
            struct Pair(CudaSlice<f32>, #[device_state(skip)] u32);
        ))
        .to_string();
        assert!(out.contains("& self . 0"), "{out}");
        assert!(!out.contains("& self . 1"), "{out}");
    }

    #[test]
    fn unknown_options_and_unions_are_errors() {
        let out = derive(quote!(
            struct S {
                #[device_state(ignore)]
                a: u32,
            }
        ))
        .to_string();
        assert!(
            out.contains("compile_error") && out.contains("only one is `skip`"),
            "{out}"
        );
        let out = derive(quote!(
            struct S {
                #[device_state(skip)]
                w: Vec<CudaSlice<f32>>,
            }
        ))
        .to_string();
        assert!(out.contains("holds a `CudaSlice`"), "{out}");
        let out = derive(quote!(union U { a: u32 })).to_string();
        assert!(out.contains("cannot be derived for a union"), "{out}");
        let out = derive(quote!(
            #[device_state(crate = "rt")]
            struct S {
                a: u32,
            }
        ))
        .to_string();
        assert!(out.contains("rt :: DeviceState"), "{out}");
    }
}
