//! Collects every error of one expansion so the user sees them all at once.

use proc_macro2::TokenStream;
use std::fmt::Display;

/// An error collector. Checks push into it; [`Ctxt::finish`] turns the lot into one
/// `syn::Error` (rendered as one `compile_error!` per message, each at its own span).
#[derive(Default)]
pub struct Ctxt {
    errors: Vec<syn::Error>,
}

impl Ctxt {
    /// Records an error spanning `tokens`.
    pub fn error_spanned_by<T: quote::ToTokens, M: Display>(&mut self, tokens: T, message: M) {
        self.errors.push(syn::Error::new_spanned(tokens, message));
    }

    /// Records an error at `span`.
    pub fn error_at<M: Display>(&mut self, span: proc_macro2::Span, message: M) {
        self.errors.push(syn::Error::new(span, message));
    }

    /// Records a ready-made error.
    pub fn push(&mut self, error: syn::Error) {
        self.errors.push(error);
    }

    /// How many errors were recorded so far.
    pub fn count(&self) -> usize {
        self.errors.len()
    }

    /// Whether any error was recorded.
    pub fn has_errors(&self) -> bool {
        !self.errors.is_empty()
    }

    /// All recorded errors as `compile_error!` invocations.
    pub fn to_compile_errors(&self) -> TokenStream {
        self.errors
            .iter()
            .map(syn::Error::to_compile_error)
            .collect()
    }

    /// The messages, for tests.
    #[cfg(test)]
    pub fn messages(&self) -> Vec<String> {
        self.errors.iter().map(ToString::to_string).collect()
    }
}
