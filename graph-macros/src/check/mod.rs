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
//! | `generated.rs` | the robustness test: bodies generated from a grammar of the mistakes, nested in closures, blocks and macros between valid code; every mistake reported once at its line, no panic, no error without a mistake |

mod finding;
mod names;
mod rules;
mod scope;
mod syntax;
mod walk;

#[cfg(test)]
mod generated;
#[cfg(test)]
mod tests;

use syn::visit::Visit;

use crate::args::GraphArgs;
use crate::ctxt::Ctxt;
use crate::model::{GraphFn, Role};

use finding::Finding;

/// Every rule, for the message style test (`style_tests.rs`).
#[cfg(test)]
pub fn rule_table() -> &'static [rules::Rule] {
    rules::RULES
}

/// Checks the body of the model's function, recording one error per offending construct.
pub fn check_body(model: &GraphFn, args: &GraphArgs, cx: &mut Ctxt) {
    for f in findings(model, args) {
        cx.push(f.to_error());
    }
}

/// The type-level half of the `host-state-mut` rule, for `&mut` state whose declared type
/// the tokens cannot judge (a type alias, `type Step = u64;`, or a type of the user's): one
/// constant per such parameter, next to the user's function, that fails to compile when
/// the type's `DeviceState::HOST_ONLY` says it lives on the host. Spanned at the type, so
/// the error points at the parameter. Nothing when the body opts into host effects; nothing
/// for the types the tokens already judged (their error comes from [`check_body`]) or for
/// host collections (whose updates the `host-bookkeeping` rule reports where written).
pub fn state_guards(model: &GraphFn, args: &GraphArgs) -> proc_macro2::TokenStream {
    if args.host_effects {
        return proc_macro2::TokenStream::new();
    }
    let krate = args.krate();
    let host_state = rules::rule("host-state-mut");
    let mut out = proc_macro2::TokenStream::new();
    for p in model
        .of(|r| matches!(r, Role::State { mutable: true }))
        .filter(|p| !p.island)
    {
        let kind = scope::kind_of_type(&p.ty);
        if kind != scope::Kind::Users || scope::is_host_only_type(&p.ty) {
            continue;
        }
        let ty = &p.ty;
        let what = format!("`{}: &mut {}`", p.ident, quote::quote!(#ty));
        let message = host_state.render(&what, "").to_string();
        let span = syn::spanned::Spanned::span(ty);
        out.extend(quote::quote_spanned! {span=>
            const _: () = {
                if <#ty as #krate::DeviceState>::HOST_ONLY {
                    ::core::panic!(#message);
                }
            };
        });
    }
    out
}

/// The host macros a body may reach through a macro of the user's declared outside it
/// (`macro_rules! note { ($($t:tt)*) => { eprintln!($($t)*) } }` at module level): the
/// tokens show only `note!(…)`. A `macro_rules!` resolves the macros its expansion names
/// where it is invoked, so the body is given local macros of these names, first in its
/// block, that fail to compile wherever they are reached; the error comes with the user's
/// invocation (`in this macro invocation`). Written only into a body without findings and
/// without `host_effects_not_replayed` (the body's own prints are the `host-print` and
/// `host-log` rules' findings); path-qualified calls (`std::eprintln!`, `tracing::info!`)
/// and the standard library's own macros (`dbg!`, `assert!`, which name theirs through
/// `$crate`) are not affected.
///
/// A body that invokes no macro and carries no attribute (which could name an attribute
/// macro) cannot reach them, and is given none.
pub fn shadow_host_macros(model: &mut GraphFn, args: &GraphArgs) {
    if args.host_effects || !reaches_macros(&model.item.block) {
        return;
    }
    const SHADOWED: &[(&str, &str)] = &[
        ("println", "host-print"),
        ("print", "host-print"),
        ("eprintln", "host-print"),
        ("eprint", "host-print"),
        ("info", "host-log"),
        ("debug", "host-log"),
        ("warn", "host-log"),
        ("error", "host-log"),
        ("trace", "host-log"),
    ];
    let krate = args.krate();
    let mut shadows: Vec<syn::Stmt> = Vec::new();
    for (name, rule_id) in SHADOWED {
        let ident = proc_macro2::Ident::new(name, proc_macro2::Span::call_site());
        let message = rules::rule(rule_id)
            .render_plain(&format!("`{name}!`"), "")
            .why(format!(
                "`{name}!` is reached through a macro of yours (the invocation below)"
            ))
            .to_string();
        shadows.push(syn::parse_quote! {
            #[allow(unused_macros)]
            macro_rules! #ident {
                ($($tokens:tt)*) => {
                    #krate::__refuse_host_macro!(#message)
                };
            }
        });
    }
    let block = &mut model.item.block;
    shadows.append(&mut block.stmts);
    block.stmts = shadows;
}

/// Every finding in the body of the model's function, in source order (the arguments of a
/// macro before the macro itself).
/// The findings of a helper function marked `#[graph_helper]`: its body checked as a graph
/// body is (host effects not allowed), its parameters known by their declared types.
pub fn helper_findings(item: &syn::ItemFn) -> Vec<Finding> {
    use syn::visit::Visit;
    let mut w = walk::Walker::new(scope::Scope::of_signature(&item.sig), false, &item.block);
    w.visit_block(&item.block);
    // A helper has no attribute of its own to opt into host effects.
    let helper_opt_in = "if running it only then is what you want, keep it in the body of a \
                         `#[cuda_graph(host_effects_not_replayed)]` function, or in a helper that is not \
                         marked";
    for f in &mut w.findings {
        f.message = f.message.replace(&rules::opt_in(), helper_opt_in);
    }
    w.findings
}

pub fn findings(model: &GraphFn, args: &GraphArgs) -> Vec<Finding> {
    let mut w = walk::Walker::new(
        scope::Scope::of(model),
        args.host_effects,
        &model.item.block,
    );
    // `&mut` state that lives on the host: the signature is the mistake.
    if !args.host_effects {
        let host_state = rules::rule("host-state-mut");
        for p in model
            .of(|r| matches!(r, Role::State { mutable: true }))
            .filter(|p| !p.island)
        {
            if scope::is_host_only_type(&p.ty) {
                let ty = &p.ty;
                let what = format!("`{}: &mut {}`", p.ident, quote::quote!(#ty));
                w.findings.push(Finding {
                    rule: host_state,
                    span: syntax::spans_of(&p.ty),
                    message: host_state.render(&what, ""),
                });
            }
        }
    }
    w.visit_block(&model.item.block);
    w.findings
}

/// Whether `block` invokes a macro or carries an attribute anywhere inside it.
fn reaches_macros(block: &syn::Block) -> bool {
    struct Reach(bool);
    impl<'ast> syn::visit::Visit<'ast> for Reach {
        fn visit_macro(&mut self, _: &'ast syn::Macro) {
            self.0 = true;
        }
        fn visit_attribute(&mut self, _: &'ast syn::Attribute) {
            self.0 = true;
        }
    }
    let mut reach = Reach(false);
    syn::visit::Visit::visit_block(&mut reach, block);
    reach.0
}
