//! The capture checks: what a `#[cuda_graph]` body must not do, found on its tokens.
//!
//! Imports `args` (the host-effects opt-in), `model`, `ctxt` and `tokens`; never `expand`.
//! This file only declares the files below and runs the walk: none of them imports it.
//!
//! A graph records the GPU work the body queues on the capture stream, once, and replays
//! only that. Anything the body does on the host either cannot happen during the capture
//! (CUDA refuses it with one of its capture errors, 900–908) or happens only while
//! capturing and never again on replay. The macro walks the body and reports each such
//! call where it is written, with the failure it prevents and what to write instead. Every
//! finding is reported, not only the first; the function is still emitted (see `expand.rs`).
//!
//! The checks run on the model (`parse → model → check → expand`): what they know about
//! the parameters (roles, declared types) comes from [`GraphFn`], built once.
//!
//! | file | what |
//! | --- | --- |
//! | `rules.rs` | the rule table ([`RULES`](rules::RULES)), its matchers and messages, and the documentation of every rule with its known false positives and negatives |
//! | `names.rs` | the name lists several rules and the walker share (device reads, candle's host reads, allocations, formatting macros) |
//! | `scope.rs` | what the walker knows about the body's names: kinds of declared types, the user's own values |
//! | `walk.rs` | the [`syn::visit`] walker that applies the table |
//! | `finding.rs` | one finding, and the error spanning the offending tokens |
//! | `syntax.rs` | helpers on tokens and expressions (spans, format strings, macro arguments) |
//! | `tests.rs` | unit tests, end to end through the expansion |

mod finding;
mod names;
mod rules;
mod scope;
mod syntax;
mod walk;

#[cfg(test)]
mod tests;

use syn::visit::Visit;

use crate::args::GraphArgs;
use crate::ctxt::Ctxt;
use crate::model::GraphFn;

use finding::Finding;

/// Checks the body of the model's function, recording one error per offending construct.
pub fn check_body(model: &GraphFn, args: &GraphArgs, cx: &mut Ctxt) {
    for f in findings(model, args) {
        cx.push(f.to_error());
    }
}

/// Every finding in the body of the model's function, in source order (the arguments of a
/// macro before the macro itself).
pub fn findings(model: &GraphFn, args: &GraphArgs) -> Vec<Finding> {
    let mut w = walk::Walker::new(scope::Scope::of(model), args.host_effects);
    w.visit_block(&model.item.block);
    w.findings
}
