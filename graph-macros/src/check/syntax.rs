//! Small helpers on syntax and tokens for the walker.
//!
//! Imports `tokens` (`unraw`, `segment_names`) only; never the rules, the walker or this folder's
//! `mod.rs`.

use std::collections::HashMap;

use proc_macro2::{Spacing, Span, TokenStream, TokenTree};
use quote::ToTokens;
use syn::visit::Visit;
use syn::Expr;

use crate::tokens::{segment_names, unraw};

/// Names used inline in a format string: `{y}`, `{y:?}`, `{y:#?}`.
pub fn inline_args(fmt: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = fmt;
    while let Some(open) = rest.find('{') {
        rest = &rest[open + 1..];
        if rest.starts_with('{') {
            rest = &rest[1..]; // `{{` is a literal brace
            continue;
        }
        let end = rest.find(['}', ':']).unwrap_or(rest.len());
        let name = rest[..end].trim();
        if !name.is_empty() && name.chars().all(|c| c.is_alphanumeric() || c == '_') {
            out.push(name.to_owned());
        }
    }
    out
}

/// The token trees of `tokens` between top-level separators.
pub fn split_top_level(tokens: &TokenStream, separators: &[char]) -> Vec<Vec<TokenTree>> {
    let mut pieces: Vec<Vec<TokenTree>> = vec![Vec::new()];
    for tt in tokens.clone() {
        match &tt {
            TokenTree::Punct(p) if separators.contains(&p.as_char()) => pieces.push(Vec::new()),
            _ => pieces.last_mut().expect("never empty").push(tt),
        }
    }
    pieces
}

/// A piece of tokens split at top-level `=>`.
pub fn split_arrows(piece: Vec<TokenTree>) -> Vec<Vec<TokenTree>> {
    let mut parts: Vec<Vec<TokenTree>> = vec![Vec::new()];
    let mut iter = piece.into_iter().peekable();
    while let Some(tt) = iter.next() {
        if let TokenTree::Punct(p) = &tt {
            let arrow = p.as_char() == '='
                && p.spacing() == Spacing::Joint
                && matches!(iter.peek(), Some(TokenTree::Punct(q)) if q.as_char() == '>');
            if arrow {
                iter.next();
                parts.push(Vec::new());
                continue;
            }
        }
        parts.last_mut().expect("never empty").push(tt);
    }
    parts
}

pub fn spans_of<T: ToTokens>(node: &T) -> (Span, Span) {
    let mut tokens = node.to_token_stream().into_iter();
    let first = tokens
        .next()
        .map(|t| t.span())
        .unwrap_or_else(Span::call_site);
    let last = tokens.last().map(|t| t.span()).unwrap_or(first);
    (first, last)
}

/// `x`, `&x`, `&mut x`, `(x)`: the one name an expression is.
pub fn plain_name(e: &Expr) -> Option<String> {
    match e {
        Expr::Path(p) if p.qself.is_none() => p.path.get_ident().map(unraw),
        Expr::Reference(r) => plain_name(&r.expr),
        Expr::Paren(p) => plain_name(&p.expr),
        _ => None,
    }
}

/// The variable at the root of a place expression: `host` in `&mut host[..]`.
pub fn root_name(e: &Expr) -> Option<String> {
    match e {
        Expr::Path(p) if p.qself.is_none() && p.path.segments.len() == 1 => {
            Some(unraw(&p.path.segments[0].ident))
        }
        Expr::Reference(r) => root_name(&r.expr),
        Expr::Unary(u) => root_name(&u.expr),
        Expr::Paren(p) => root_name(&p.expr),
        Expr::Index(i) => root_name(&i.expr),
        Expr::Field(f) => root_name(&f.base),
        Expr::MethodCall(m) => root_name(&m.receiver),
        _ => None,
    }
}

/// A short text for an argument that is a path, or a reference to one: `&Device::Cpu`,
/// `&cpu`; `…` for anything else.
pub fn compact(e: &Expr) -> String {
    match e {
        Expr::Reference(r) => {
            let m = if r.mutability.is_some() { "mut " } else { "" };
            format!("&{m}{}", compact(&r.expr))
        }
        Expr::Paren(p) => format!("({})", compact(&p.expr)),
        Expr::Path(p) if p.qself.is_none() => {
            let segs = segment_names(&p.path);
            let lead = if p.path.leading_colon.is_some() {
                "::"
            } else {
                ""
            };
            format!("{lead}{}", segs.join("::"))
        }
        _ => "…".to_owned(),
    }
}

/// Whether `e` is a closure (`|| …`, `move |s| …`).
pub fn is_closure(e: &Expr) -> bool {
    match e {
        Expr::Closure(_) => true,
        Expr::Paren(p) => is_closure(&p.expr),
        _ => false,
    }
}

/// A name in `SCREAMING_CASE` with at least one letter: by convention a `static` or a
/// `const`.
pub fn is_screaming(name: &str) -> bool {
    name.chars().any(|c| c.is_ascii_uppercase())
        && name
            .chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
}

/// A macro argument without tracing's and `format!`'s naming: `name = value`,
/// `a.b = value`, and the `?` / `%` sigils of tracing's fields, so that the value alone can
/// be parsed as an expression.
pub fn strip_named_argument(part: &[TokenTree]) -> &[TokenTree] {
    let mut rest = part;
    // `ident (. ident)* =`, but not `==` or `=>`.
    let mut i = 0;
    while let Some(TokenTree::Ident(_)) = rest.get(i) {
        match rest.get(i + 1) {
            Some(TokenTree::Punct(p)) if p.as_char() == '.' => i += 2,
            Some(TokenTree::Punct(p)) if p.as_char() == '=' && p.spacing() == Spacing::Alone => {
                rest = &rest[i + 2..];
                break;
            }
            _ => break,
        }
    }
    while let [TokenTree::Punct(p), tail @ ..] = rest {
        if matches!(p.as_char(), '?' | '%') {
            rest = tail;
        } else {
            break;
        }
    }
    rest
}

/// Where a raw driver function (its last path segment, version suffix removed) takes its
/// stream: `cuLaunchKernel`'s ninth argument, the first of `cuStream*` and
/// `cuLaunchHostFunc`, the second of `cuEventRecord*` and `cuGraphLaunch`/`cuGraphUpload`,
/// the last of any `cu…Async` and of cudarc's `result::…_async`.
pub fn stream_argument<'e>(name: &str, args: &[&'e Expr]) -> Option<&'e Expr> {
    let at = |i: usize| args.get(i).copied();
    match name {
        "cuLaunchKernel" | "cuLaunchCooperativeKernel" => at(8),
        "cuLaunchHostFunc" | "cuStreamWaitEvent" | "cuStreamAddCallback" => at(0),
        "cuEventRecord" | "cuEventRecordWithFlags" | "cuGraphLaunch" | "cuGraphUpload" => at(1),
        "launch_kernel" => at(4),
        _ if name.starts_with("cu") && name.ends_with("Async") => args.last().copied(),
        _ if name.ends_with("_async") => args.last().copied(),
        _ => None,
    }
}

/// A null pointer written out: `ptr::null_mut()`, `std::ptr::null()`, `null_mut()`,
/// `0 as _`, `0 as CUstream`, `Default::default()`, `CUstream::default()`,
/// `std::mem::zeroed()`.
pub fn is_null_pointer(e: &Expr) -> bool {
    match e {
        Expr::Paren(p) => is_null_pointer(&p.expr),
        Expr::Group(g) => is_null_pointer(&g.expr),
        Expr::Unsafe(u) => match u.block.stmts.as_slice() {
            [syn::Stmt::Expr(e, None)] => is_null_pointer(e),
            _ => false,
        },
        Expr::Cast(c) => {
            matches!(&*c.expr, Expr::Lit(syn::ExprLit { lit: syn::Lit::Int(i), .. }) if i.base10_digits() == "0")
        }
        Expr::Call(c) if c.args.is_empty() => match &*c.func {
            Expr::Path(p) => {
                let segs = segment_names(&p.path);
                matches!(
                    segs.last().map(String::as_str),
                    Some("null_mut" | "null" | "default" | "zeroed")
                )
            }
            _ => false,
        },
        _ => false,
    }
}

/// The names a body brings in with its own `use` items, anywhere in it (nested blocks and
/// functions too), each with the path it stands for. Globs bring no name the tokens show.
pub fn use_aliases(body: &syn::Block) -> HashMap<String, Vec<String>> {
    struct Uses(HashMap<String, Vec<String>>);
    impl<'ast> Visit<'ast> for Uses {
        fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
            aliases_of_use(u, &mut self.0);
        }
    }
    let mut uses = Uses(HashMap::new());
    uses.visit_block(body);
    uses.0
}

/// The names one `use` item brings in, each with the path it stands for.
pub fn aliases_of_use(u: &syn::ItemUse, out: &mut HashMap<String, Vec<String>>) {
    fn tree(t: &syn::UseTree, prefix: &mut Vec<String>, out: &mut HashMap<String, Vec<String>>) {
        match t {
            syn::UseTree::Path(p) => {
                prefix.push(unraw(&p.ident));
                tree(&p.tree, prefix, out);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                let name = unraw(&n.ident);
                let full: Vec<String> = if name == "self" {
                    prefix.clone()
                } else {
                    prefix.iter().cloned().chain([name]).collect()
                };
                if let Some(last) = full.last() {
                    out.insert(last.clone(), full.clone());
                }
            }
            syn::UseTree::Rename(r) => {
                let name = unraw(&r.ident);
                let full: Vec<String> = if name == "self" {
                    prefix.clone()
                } else {
                    prefix.iter().cloned().chain([name]).collect()
                };
                out.insert(unraw(&r.rename), full);
            }
            syn::UseTree::Glob(_) => {}
            syn::UseTree::Group(g) => {
                for t in &g.items {
                    tree(t, prefix, out);
                }
            }
        }
    }
    tree(&u.tree, &mut Vec::new(), out);
}
