//! Small helpers on syntax and tokens for the walker.
//!
//! Imports `tokens` (`unraw`, `segment_names`) only; never the rules, the walker or this folder's
//! `mod.rs`.

use proc_macro2::{Spacing, Span, TokenStream, TokenTree};
use quote::ToTokens;
use syn::visit::{self, Visit};
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

/// Whether `e` calls one of `methods` (as a method), outside closures (a closure's result
/// is what it returns, not what it allocates).
pub fn calls_any(e: &Expr, methods: &[&str]) -> bool {
    struct Finder<'m>(&'m [&'m str], bool);
    impl<'ast> Visit<'ast> for Finder<'_> {
        fn visit_expr_method_call(&mut self, m: &'ast syn::ExprMethodCall) {
            if self.0.contains(&unraw(&m.method).as_str()) {
                self.1 = true;
            }
            visit::visit_expr_method_call(self, m);
        }
        fn visit_expr_closure(&mut self, _: &'ast syn::ExprClosure) {}
        fn visit_item(&mut self, _: &'ast syn::Item) {}
    }
    let mut f = Finder(methods, false);
    f.visit_expr(e);
    f.1
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
