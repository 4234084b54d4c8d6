//! Token helpers for generated code: a path or type of the user's signature rewritten for
//! the generated module one level down, and the visibility its items need; and the names
//! of identifiers and paths as written, without a raw-identifier prefix (`r#type` → `type`),
//! for the checks and the generated names.
//!
//! Owns only token rewriting and naming; imports nothing of this crate (it sits at the
//! bottom, beside `ctxt`), so any module may use it.

use proc_macro2::{Group, Ident, Punct, Spacing, TokenStream, TokenTree};
use quote::{quote, ToTokens};

/// The identifier's name without its raw-identifier prefix: `r#type` → `type`.
pub fn unraw(ident: &Ident) -> String {
    let s = ident.to_string();
    s.strip_prefix("r#").map(str::to_owned).unwrap_or(s)
}

/// The names of the path's segments, [`unraw`]n: `std::r#fs::read` → `["std", "fs", "read"]`.
pub fn segment_names(path: &syn::Path) -> Vec<String> {
    path.segments.iter().map(|s| unraw(&s.ident)).collect()
}

/// The visibility an item of the generated module needs so that the re-export next to the
/// user's function can name it with the function's own visibility.
pub fn inner_vis(vis: &syn::Visibility) -> TokenStream {
    match vis {
        syn::Visibility::Public(_) => quote!(pub),
        syn::Visibility::Inherited => quote!(pub(super)),
        syn::Visibility::Restricted(r) => {
            let path = &r.path;
            if path.is_ident("crate") {
                quote!(pub(crate))
            } else if path.is_ident("self") {
                quote!(pub(super))
            } else if path.is_ident("super") {
                quote!(pub(in super::super))
            } else {
                let p = relocated_path(path);
                quote!(pub(in #p))
            }
        }
    }
}

/// A type of the user's signature as written one module deeper (inside the generated
/// module): a path that starts at `self` starts at `super` instead, and one that starts at
/// `super` gets one more `super`.
pub fn relocated<T: ToTokens>(t: &T) -> TokenStream {
    relocate(t.to_token_stream())
}

/// [`relocated`] for a path that must stay a `syn::Path`.
pub fn relocated_path(p: &syn::Path) -> syn::Path {
    syn::parse2(relocated(p)).unwrap_or_else(|_| p.clone())
}

fn relocate(tokens: TokenStream) -> TokenStream {
    let mut out: Vec<TokenTree> = Vec::new();
    let trees: Vec<TokenTree> = tokens.into_iter().collect();
    for (k, tree) in trees.iter().enumerate() {
        let after_colons = k >= 2
            && matches!(&trees[k - 1], TokenTree::Punct(p) if p.as_char() == ':')
            && matches!(&trees[k - 2], TokenTree::Punct(p) if p.as_char() == ':');
        let before_colons =
            matches!(trees.get(k + 1), Some(TokenTree::Punct(p)) if p.as_char() == ':');
        match tree {
            TokenTree::Ident(i) if !after_colons && before_colons && i == "self" => {
                out.push(TokenTree::Ident(Ident::new("super", i.span())));
            }
            TokenTree::Ident(i) if !after_colons && before_colons && i == "super" => {
                out.push(TokenTree::Ident(Ident::new("super", i.span())));
                out.push(TokenTree::Punct(Punct::new(':', Spacing::Joint)));
                out.push(TokenTree::Punct(Punct::new(':', Spacing::Alone)));
                out.push(tree.clone());
            }
            TokenTree::Group(g) => {
                let mut inner = Group::new(g.delimiter(), relocate(g.stream()));
                inner.set_span(g.span());
                out.push(TokenTree::Group(inner));
            }
            other => out.push(other.clone()),
        }
    }
    out.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_lose_their_raw_prefix() {
        let path: syn::Path = syn::parse2(quote!(::std::r#fs::read)).unwrap();
        assert_eq!(segment_names(&path), ["std", "fs", "read"]);
        assert_eq!(
            unraw(&Ident::new_raw("type", proc_macro2::Span::call_site())),
            "type"
        );
        assert_eq!(
            unraw(&Ident::new("r_x", proc_macro2::Span::call_site())),
            "r_x"
        );
    }

    #[test]
    fn visibility_is_mapped_one_module_deeper() {
        let vis = |v: TokenStream| inner_vis(&syn::parse2(v).unwrap()).to_string();
        assert_eq!(vis(quote!(pub)), "pub");
        assert_eq!(vis(quote!()), "pub (super)");
        assert_eq!(vis(quote!(pub(crate))), "pub (crate)");
        assert_eq!(vis(quote!(pub(self))), "pub (super)");
        assert_eq!(vis(quote!(pub(super))), "pub (in super :: super)");
        assert_eq!(vis(quote!(pub(in crate::a))), "pub (in crate :: a)");
        assert_eq!(
            vis(quote!(pub(in super::a))),
            "pub (in super :: super :: a)"
        );
        assert_eq!(
            relocated(&quote!(Vec<self::A, ::x::self_::B, super::super::C>)).to_string(),
            "Vec < super :: A , :: x :: self_ :: B , super :: super :: super :: C >"
        );
    }
}
