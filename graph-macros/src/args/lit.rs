//! Literal values of the attribute's keys: an expression read as the one kind of literal a
//! key takes, or an error spanning it.
//!
//! Imports only `ctxt`; never its parent (`args.rs`) nor its sibling (`args/buckets.rs`),
//! which both use it.

use syn::{Expr, ExprLit, Lit, LitBool, LitInt, LitStr};

use crate::ctxt::{Ctxt, Message};

/// `value` as the kind of literal `pick` accepts; anything else is an error spanning it that
/// says what was `expected`.
pub fn literal<'v, L>(
    value: &'v Expr,
    cx: &mut Ctxt,
    expected: &Message,
    pick: fn(&'v Lit) -> Option<&'v L>,
) -> Option<&'v L> {
    let found = match value {
        Expr::Lit(ExprLit { lit, .. }) => pick(lit),
        _ => None,
    };
    if found.is_none() {
        cx.error_spanned_by(value, expected.clone());
    }
    found
}

/// A `bool` literal, for [`literal`].
pub fn boolean(lit: &Lit) -> Option<&LitBool> {
    match lit {
        Lit::Bool(b) => Some(b),
        _ => None,
    }
}

/// An integer literal, for [`literal`].
pub fn integer(lit: &Lit) -> Option<&LitInt> {
    match lit {
        Lit::Int(n) => Some(n),
        _ => None,
    }
}

/// A string literal, for [`literal`].
pub fn string(lit: &Lit) -> Option<&LitStr> {
    match lit {
        Lit::Str(s) => Some(s),
        _ => None,
    }
}
