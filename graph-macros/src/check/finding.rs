//! One mistake found in a body, and the error that reports it over the offending tokens.
//!
//! Imports the rule table's `Rule` and `ctxt`'s message type only; never its parent
//! (`check/mod.rs`) or the walker.

use proc_macro2::{Punct, Spacing, Span, TokenStream, TokenTree};

use super::rules::Rule;
use crate::ctxt::Message;

/// One mistake found in a body.
pub struct Finding {
    /// The rule that matched.
    #[cfg_attr(not(test), allow(dead_code))]
    pub rule: &'static Rule,
    /// First and last span of the offending construct.
    pub span: (Span, Span),
    /// The message, with its placeholders filled in.
    pub message: Message,
}

impl Finding {
    pub fn to_error(&self) -> syn::Error {
        // Two tokens carrying the first and last span: `new_spanned` makes the error cover
        // the range between them.
        let (start, end) = self.span;
        let mut range = TokenStream::new();
        range.extend([
            TokenTree::Punct(with_span(Punct::new('<', Spacing::Alone), start)),
            TokenTree::Punct(with_span(Punct::new('>', Spacing::Alone), end)),
        ]);
        syn::Error::new_spanned(range, &self.message)
    }
}

fn with_span(mut p: Punct, span: Span) -> Punct {
    p.set_span(span);
    p
}
