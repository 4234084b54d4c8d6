//! Collects every error of one expansion so the user sees them all at once.
//!
//! Owns the error collector. Imports nothing of this crate, so every module may use it.

use proc_macro2::TokenStream;
use std::fmt::Display;

/// An error collector. Checks push into it; [`Ctxt::finish`] turns the lot into one
/// `compile_error!` per message, each at its own span.
///
/// A `Ctxt` that still holds errors must be finished: dropping it with unreported errors
/// panics (outside of an unwinding panic), so a code path that forgets them fails every
/// test that reaches it instead of silently accepting a wrong function.
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

    /// Every recorded error as a `compile_error!` invocation (nothing when there is none).
    pub fn finish(mut self) -> TokenStream {
        std::mem::take(&mut self.errors)
            .iter()
            .map(syn::Error::to_compile_error)
            .collect()
    }

    /// The messages, for tests; consumes the collector like [`Ctxt::finish`].
    #[cfg(test)]
    pub fn messages(mut self) -> Vec<String> {
        std::mem::take(&mut self.errors)
            .iter()
            .map(ToString::to_string)
            .collect()
    }
}

impl Drop for Ctxt {
    fn drop(&mut self) {
        if !self.errors.is_empty() && !std::thread::panicking() {
            panic!(
                "graph-macros bug: {} error(s) collected and never reported (call `Ctxt::finish`)",
                self.errors.len()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finish_renders_every_error() {
        let mut cx = Ctxt::default();
        cx.error_at(proc_macro2::Span::call_site(), "first");
        cx.error_at(proc_macro2::Span::call_site(), "second");
        assert_eq!(cx.count(), 2);
        let out = cx.finish().to_string();
        assert_eq!(out.matches("compile_error").count(), 2, "{out}");
    }

    #[test]
    fn an_empty_collector_may_be_dropped() {
        let cx = Ctxt::default();
        assert!(!cx.has_errors());
        assert!(cx.finish().is_empty());
        drop(Ctxt::default());
    }

    #[test]
    #[should_panic(expected = "never reported")]
    fn unreported_errors_panic_on_drop() {
        let mut cx = Ctxt::default();
        cx.error_at(proc_macro2::Span::call_site(), "lost");
        drop(cx);
    }
}
