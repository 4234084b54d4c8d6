//! Collects every error of one expansion so the user sees them all at once, and lays out
//! every message the same way ([`Message`]).
//!
//! Owns the error collector and the message type. Imports nothing of this crate, so every
//! module may use it.

use proc_macro2::TokenStream;
use std::fmt::{self, Display};

/// The longest first line a [`Message`] may have (issue 33); `style_tests` holds the rule
/// table to it, and `ui-tests/tests/source_style.rs` every `Message::new` and snapshot.
#[cfg_attr(not(test), allow(dead_code))]
pub const MAX_FIRST_LINE: usize = 119;

/// One error message, laid out like rustc's own: a first line that says what happened, then
/// the reason (`= note: …`, what CUDA or the graph would do) and the fix (`= help: …`, what to
/// write instead), each on a line of its own. rustc indents the lines after the first under
/// it, so the error reads
///
/// ```text
/// error: `.synchronize()` makes the CPU wait for the GPU inside a captured body
///        = note: a capture cannot record a wait: it fails with CUDA error 900 (…)
///        = help: delete it: the graph's kernels already run in stream order; …
/// ```
///
/// Every error the macros emit is one: [`Ctxt`] takes nothing else. The first line stays
/// short (at most [`MAX_FIRST_LINE`] characters with typical names in it); the others may be
/// as long as they need.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    what: String,
    why: Vec<String>,
    fix: Vec<String>,
}

impl Message {
    /// A message whose first line is `what`: what happened, in one short line.
    pub fn new(what: impl Into<String>) -> Self {
        Message {
            what: what.into(),
            why: Vec::new(),
            fix: Vec::new(),
        }
    }

    /// Adds a reason, rendered as `= note: …` after the first line (and any reason before it).
    #[must_use]
    pub fn why(mut self, why: impl Into<String>) -> Self {
        self.why.push(why.into());
        self
    }

    /// Adds a fix, rendered as `= help: …` after the reasons (and any fix before it).
    #[must_use]
    pub fn fix(mut self, fix: impl Into<String>) -> Self {
        self.fix.push(fix.into());
        self
    }

    /// The first line.
    #[cfg(test)]
    pub fn what(&self) -> &str {
        &self.what
    }

    /// The message with `from` replaced by `to` in every line.
    #[must_use]
    pub fn replace(&self, from: &str, to: &str) -> Self {
        let all = |lines: &[String]| lines.iter().map(|l| l.replace(from, to)).collect();
        Message {
            what: self.what.replace(from, to),
            why: all(&self.why),
            fix: all(&self.fix),
        }
    }
}

impl Display for Message {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.what)?;
        for why in &self.why {
            write!(f, "\n= note: {why}")?;
        }
        for fix in &self.fix {
            write!(f, "\n= help: {fix}")?;
        }
        Ok(())
    }
}

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
    pub fn error_spanned_by<T: quote::ToTokens>(&mut self, tokens: T, message: Message) {
        self.errors.push(syn::Error::new_spanned(tokens, message));
    }

    /// Records an error at `span`.
    pub fn error_at(&mut self, span: proc_macro2::Span, message: Message) {
        self.errors.push(syn::Error::new(span, message));
    }

    /// Records a ready-made error (one made from a [`Message`], or one of `syn`'s own
    /// parse errors).
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
        cx.error_at(proc_macro2::Span::call_site(), Message::new("first"));
        cx.error_at(proc_macro2::Span::call_site(), Message::new("second"));
        assert_eq!(cx.count(), 2);
        let out = cx.finish().to_string();
        assert_eq!(out.matches("compile_error").count(), 2, "{out}");
    }

    #[test]
    fn a_message_leads_with_its_first_line() {
        let m = Message::new("`x` waits for the GPU")
            .why("a capture only records work")
            .fix("move it after `replay()`")
            .fix("or mark the helper");
        assert_eq!(
            m.to_string(),
            "`x` waits for the GPU\n= note: a capture only records work\n\
             = help: move it after `replay()`\n= help: or mark the helper"
        );
        assert_eq!(Message::new("alone").to_string(), "alone");
        assert_eq!(m.replace("`x`", "`y`").what(), "`y` waits for the GPU");
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
        cx.error_at(proc_macro2::Span::call_site(), Message::new("lost"));
        drop(cx);
    }
}
