//! `buckets(batch = [1, 2, 4, 8], fallback = "eager", lazy = 2)`: the attribute key that asks
//! for one graph per batch size, parsed into [`BucketArgs`].
//!
//! Imports only `ctxt` and its sibling `args/lit.rs`; never its parent (`args.rs`), nor
//! `model`, `check` or `expand`.
//!
//! The key names the function's batch parameter (a by-value integer); the list gives the
//! bucket sizes. What the family looks like is `expand/buckets.rs`.

use proc_macro2::Ident;
use syn::punctuated::Punctuated;
use syn::{Expr, Meta, Token};

use super::lit::{integer, literal, string};
use crate::ctxt::{Ctxt, Message};

/// The parsed `buckets(…)` argument.
pub struct BucketArgs {
    /// The batch parameter's name.
    pub param: Ident,
    /// Bucket sizes, ascending, without duplicates.
    pub sizes: Vec<usize>,
    /// Whether batches above the largest bucket run eagerly.
    pub eager_fallback: bool,
    /// `lazy = N`: capture each bucket on its first use, keeping at most `N` graphs live.
    pub lazy: Option<usize>,
}

/// Parses the inside of `buckets(…)`, recording every problem in `cx`.
pub fn parse(list: &syn::MetaList, cx: &mut Ctxt) -> Option<BucketArgs> {
    let metas = match list.parse_args_with(Punctuated::<Meta, Token![,]>::parse_terminated) {
        Ok(m) => m,
        Err(e) => {
            cx.error_at(
                e.span(),
                Message::new(format!("malformed `buckets(…)`: {e}")).fix(
                    "write `buckets(batch = [1, 2, 4, 8])`, naming the batch parameter and listing the \
                     batch sizes to capture",
                ),
            );
            return None;
        }
    };
    let mut param: Option<(Ident, Vec<usize>)> = None;
    let mut eager_fallback = false;
    let mut lazy = None;
    for meta in metas {
        let Meta::NameValue(nv) = &meta else {
            cx.error_spanned_by(
                &meta,
                Message::new(
                    "expected `name = [sizes]`, `fallback = \"eager\"` or `lazy = N` inside `buckets(…)`",
                ),
            );
            continue;
        };
        let Some(key) = nv.path.get_ident() else {
            cx.error_spanned_by(
                &nv.path,
                Message::new("expected the batch parameter's name, `fallback` or `lazy`"),
            );
            continue;
        };
        if key == "fallback" {
            let fallback = Message::new("`fallback` is \"error\" or \"eager\"").fix(
                "write \"error\" (the default: a batch above the largest bucket is an error) or \
                 \"eager\" (such a batch runs the function eagerly)",
            );
            match literal(&nv.value, cx, &fallback, string).map(|s| s.value()) {
                Some(v) if v == "eager" => eager_fallback = true,
                Some(v) if v == "error" => eager_fallback = false,
                Some(_) => cx.error_spanned_by(&nv.value, fallback),
                None => {}
            }
            continue;
        }
        if key == "lazy" {
            let lazy_count = Message::new("`lazy` is the most graphs kept live, at least 1").fix(
                "e.g. `lazy = 2`, which captures each bucket on its first use and drops the least \
                 recently replayed one to make room",
            );
            if let Some(n) = literal(&nv.value, cx, &lazy_count, integer) {
                match n.base10_parse::<usize>() {
                    Ok(v) if v >= 1 => lazy = Some(v),
                    _ => cx.error_spanned_by(n, lazy_count),
                }
            }
            continue;
        }
        let Expr::Array(array) = &nv.value else {
            cx.error_spanned_by(
                &nv.value,
                Message::new(format!("`{key}` needs a list of batch sizes"))
                    .fix(format!("e.g. `{key} = [1, 2, 4, 8]`")),
            );
            continue;
        };
        if let Some((first, _)) = &param {
            cx.error_spanned_by(
                key,
                Message::new(format!(
                    "`buckets(…)` takes one batch parameter, and `{first}` is already given"
                )),
            );
            continue;
        }
        let mut sizes = Vec::new();
        for elem in &array.elems {
            let integers = Message::new("bucket sizes must be integer literals");
            let Some(n) = literal(elem, cx, &integers, integer) else {
                continue;
            };
            match n.base10_parse::<usize>() {
                Ok(0) => {
                    cx.error_spanned_by(n, Message::new("a bucket must hold at least one row"));
                }
                Ok(v) if sizes.contains(&v) => {
                    cx.error_spanned_by(n, Message::new(format!("bucket {v} is listed twice")));
                }
                Ok(v) => sizes.push(v),
                Err(_) => {
                    cx.error_spanned_by(n, Message::new("bucket sizes are whole numbers"));
                }
            }
        }
        if array.elems.is_empty() {
            cx.error_spanned_by(array, Message::new("list at least one bucket size"));
        }
        sizes.sort_unstable();
        param = Some((key.clone(), sizes));
    }
    let Some((param, sizes)) = param else {
        cx.error_spanned_by(
            list,
            Message::new("`buckets(…)` must name the batch parameter and list its sizes")
                .fix("e.g. `buckets(batch = [1, 2, 4, 8])`"),
        );
        return None;
    };
    // Returned even when some size was invalid (the errors are in `cx`), so that the batch
    // parameter is still recognised and does not draw an error of its own.
    Some(BucketArgs {
        param,
        sizes,
        eager_fallback,
        lazy,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proc_macro2::TokenStream;
    use quote::quote;

    /// Parses `buckets(…)` as the attribute would hand it over.
    fn parse_str(tokens: TokenStream) -> (Option<BucketArgs>, Vec<String>) {
        let meta: Meta = syn::parse2(quote!(buckets(#tokens))).expect("a meta list");
        let Meta::List(list) = meta else {
            panic!("`buckets(…)` is a list")
        };
        let mut cx = Ctxt::default();
        let args = parse(&list, &mut cx);
        (args, cx.messages())
    }

    fn errors_of(tokens: TokenStream) -> Vec<String> {
        parse_str(tokens).1
    }

    #[test]
    fn sizes_are_sorted_and_the_parameter_named() {
        let (args, errors) = parse_str(quote!(batch = [8, 1, 4, 2]));
        assert!(errors.is_empty(), "{errors:#?}");
        let args = args.expect("valid buckets");
        assert_eq!(args.param, "batch");
        assert_eq!(args.sizes, [1, 2, 4, 8]);
        assert!(!args.eager_fallback);
    }

    #[test]
    fn lazy_takes_the_most_live_graphs() {
        let lazy = |t: TokenStream| parse_str(t).0.expect("valid buckets").lazy;
        assert_eq!(lazy(quote!(batch = [1, 2])), None);
        assert_eq!(lazy(quote!(batch = [1, 2], lazy = 2)), Some(2));
        for bad in [
            quote!(batch = [1], lazy = 0),
            quote!(batch = [1], lazy = "2"),
        ] {
            let errors = errors_of(bad);
            assert_eq!(errors.len(), 1, "{errors:#?}");
            assert!(
                errors[0].contains("`lazy` is the most graphs kept live"),
                "{errors:#?}"
            );
        }
    }

    #[test]
    fn fallback() {
        let eager = |t: TokenStream| parse_str(t).0.expect("valid buckets").eager_fallback;
        assert!(eager(quote!(batch = [1], fallback = "eager")));
        assert!(!eager(quote!(fallback = "error", batch = [1])));
        let errors = errors_of(quote!(batch = [1], fallback = "later"));
        assert!(errors[0].contains("`fallback` is \"error\""), "{errors:#?}");
        let errors = errors_of(quote!(batch = [1], fallback = eager));
        assert_eq!(errors.len(), 1, "{errors:#?}");
        assert!(errors[0].contains("`fallback` is \"error\""), "{errors:#?}");
    }

    #[test]
    fn invalid_sizes_are_all_reported_and_the_parameter_kept() {
        let (args, errors) = parse_str(quote!(batch = [0, 2, 2, x, 99999999999999999999999]));
        assert_eq!(errors.len(), 4, "{errors:#?}");
        assert!(errors[0].contains("at least one row"));
        assert!(errors[1].contains("bucket 2 is listed twice"));
        assert!(errors[2].contains("integer literals"));
        assert!(errors[3].contains("whole numbers"));
        // Still returned, so the batch parameter draws no error of its own.
        let args = args.expect("kept despite the errors");
        assert_eq!(
            (args.param.to_string(), args.sizes),
            ("batch".to_owned(), vec![2])
        );
    }

    #[test]
    fn shape_mistakes() {
        for (tokens, needle) in [
            (quote!(batch = []), "list at least one bucket size"),
            (quote!(fallback = "eager"), "must name the batch parameter"),
            (quote!(batch = [1], rows = [2]), "takes one batch parameter"),
            (quote!(batch = 4), "needs a list of batch sizes"),
            (quote!(batch), "expected `name = [sizes]`"),
            (quote!(a::b = [1]), "expected the batch parameter's name"),
            (quote!(batch = [1],,), "malformed `buckets(…)`"),
        ] {
            let errors = errors_of(tokens.clone());
            assert!(
                errors.iter().any(|e| e.contains(needle)),
                "`{needle}` for `{tokens}`: {errors:#?}"
            );
        }
    }
}
