//! Eager islands: `rt.eager(|| { … })` statements in a body, where `rt` is the function's
//! context parameter.
//!
//! The body is rewritten before it is emitted, so the function called eagerly and the graph
//! run the same code:
//!
//! - each island becomes a call of the runtime's `island` with `__FooIsland`, a struct of
//!   the function's parameters as an island may use them (inputs and read-only state by `&`,
//!   outputs and `&mut` state as their `DeviceState::Lent` views, which can be written into
//!   but not replaced, `#[island]` state by `&mut`, constants by value), and the island's code
//!   as a closure of that struct whose first statement binds the parameters' names to its
//!   fields. Eagerly the closure runs there; in the capture it is boxed and kept, and the graph
//!   calls it on every replay between the segment before the island and the one after it;
//! - locals of the body that the island's code uses are probed before the call
//!   (`(&&Probe(&x)).crosses().taken()`): device data fails to compile there, host values are
//!   copied into the island's code (a `move` closure that must be `'static`: it outlives the
//!   body's run);
//! - locals made before an island and used after it, by a later segment (or by the same code
//!   on the next turn of an enclosing loop), are probed after it (`.across()`): device data
//!   fails to compile, host values (counts, shapes, kernels, streams) pass; device data
//!   crosses in the graph's own buffers.
//!
//! What the tokens can tell is reported here, spanned: an island inside a closure, one that
//! is not a statement of its own, a closure with parameters, an island's use of a local that
//! shadows a parameter, and `#[island]` state used outside islands.
//!
//! Imports the model, `ctxt` and `tokens`; only `expand.rs` and `graph.rs` import it.

use std::collections::{HashMap, HashSet};

use proc_macro2::{Ident, Span, TokenStream, TokenTree};
use quote::{format_ident, quote, quote_spanned, ToTokens};
use syn::spanned::Spanned;
use syn::visit_mut::{self, VisitMut};
use syn::{Block, Expr, ExprClosure, ExprMethodCall, FnArg, Pat, Stmt};

use crate::ctxt::{Ctxt, Message};
use crate::model::{GraphFn, Param, Role};
use crate::tokens::relocated;

/// The method name of an island on the context parameter.
const ISLAND_METHOD: &str = "eager";

/// The name of the function's context parameter, if it is a plain name.
pub(super) fn ctx_ident(model: &GraphFn) -> Option<Ident> {
    match model.item.sig.inputs.first()? {
        FnArg::Typed(t) => match &*t.pat {
            Pat::Ident(p) => Some(p.ident.clone()),
            _ => None,
        },
        FnArg::Receiver(_) => None,
    }
}

/// `ctx.eager(closure)`: the island call, if `e` is one.
fn island_call<'e>(e: &'e Expr, ctx: &Ident) -> Option<&'e ExprMethodCall> {
    let Expr::MethodCall(m) = e else { return None };
    let on_ctx = matches!(&*m.receiver, Expr::Path(p) if p.path.is_ident(ctx));
    (on_ctx && m.method == ISLAND_METHOD).then_some(m)
}

/// The island call of a statement `ctx.eager(…);` or `ctx.eager(…)?;`.
fn island_stmt<'s>(s: &'s Stmt, ctx: &Ident) -> Option<&'s ExprMethodCall> {
    let Stmt::Expr(e, Some(_)) = s else {
        return None;
    };
    match e {
        Expr::Try(t) => island_call(&t.expr, ctx),
        e => island_call(e, ctx),
    }
}

/// Whether the body has an island anywhere (a cheap scan, before the rewrite).
pub(super) fn has_islands(model: &GraphFn) -> bool {
    let Some(ctx) = ctx_ident(model) else {
        return false;
    };
    struct Find<'c>(&'c Ident, bool);
    impl<'ast> syn::visit::Visit<'ast> for Find<'_> {
        fn visit_expr_method_call(&mut self, m: &'ast ExprMethodCall) {
            let on_ctx = matches!(&*m.receiver, Expr::Path(p) if p.path.is_ident(self.0));
            self.1 |= on_ctx && m.method == ISLAND_METHOD;
            syn::visit::visit_expr_method_call(self, m);
        }
    }
    let mut find = Find(&ctx, false);
    syn::visit::Visit::visit_block(&mut find, &model.item.block);
    find.1
}

/// The function as the compile-time checks see it: every island's code left out (inside an
/// island anything goes: syncs, device reads, prints, host randomness), and without its
/// `#[island]` parameters (a use of them in a segment is this file's own error, see
/// [`rewrite`], not a host-collection or host-state finding).
pub(super) fn as_checked(model: &GraphFn) -> GraphFn {
    struct Blank<'c>(&'c Ident);
    impl VisitMut for Blank<'_> {
        fn visit_expr_mut(&mut self, e: &mut Expr) {
            if island_call(e, self.0).is_some() {
                if let Expr::MethodCall(m) = e {
                    m.args = syn::punctuated::Punctuated::new();
                }
                return;
            }
            visit_mut::visit_expr_mut(self, e);
        }
    }
    let mut seen = model.clone();
    seen.params.retain(|p| !p.island);
    if let Some(ctx) = ctx_ident(model) {
        Blank(&ctx).visit_block_mut(&mut seen.item.block);
    }
    seen
}

/// The names the generated island items use.
pub(super) struct IslandNames {
    /// `__FooIsland`: the parameters as an island takes them.
    pub params_ty: Ident,
    /// `__FooIslandFn`: an island's code, boxed.
    pub fn_ty: Ident,
}

impl IslandNames {
    pub(super) fn new(base: &str, span: Span) -> Self {
        IslandNames {
            params_ty: format_ident!("__{}Island", base, span = span),
            fn_ty: format_ident!("__{}IslandFn", base, span = span),
        }
    }
}

/// Rewrites the islands of the body (see the module docs), reporting what cannot work.
/// Returns how many there are.
pub(super) fn rewrite(
    model: &mut GraphFn,
    krate: &syn::Path,
    names: &IslandNames,
    cx: &mut Ctxt,
) -> usize {
    let Some(ctx) = ctx_ident(model) else {
        return 0;
    };
    let params: Vec<&Param> = model.params.iter().collect();
    let ret = island_return_type(&model.item.sig.output);
    let (inits, binds): (Vec<TokenStream>, Vec<TokenStream>) = params
        .iter()
        .map(|p| {
            let i = &p.ident;
            let init = match p.role {
                Role::Input | Role::State { mutable: false } => quote!(#i: &*#i),
                Role::State { mutable: true } if p.island => quote!(#i: &mut *#i),
                Role::Output | Role::State { mutable: true } => {
                    quote!(#i: #krate::DeviceState::lend(&mut *#i))
                }
                Role::Constant | Role::Bucket => quote!(#i),
            };
            // Views and `&mut` state are written through: bound `mut`.
            let bind = match p.role {
                Role::Output | Role::State { mutable: true } => quote!(mut #i),
                _ => quote!(#i),
            };
            (init, bind)
        })
        .unzip();
    let mut rewriter = Rewriter {
        ctx: ctx.clone(),
        krate: krate.clone(),
        params_ty: names.params_ty.clone(),
        fn_ty: names.fn_ty.clone(),
        ret,
        inits,
        binds,
        param_names: params.iter().map(|p| p.ident.to_string()).collect(),
        island_state: params
            .iter()
            .filter(|p| p.island)
            .map(|p| p.ident.to_string())
            .collect(),
        scopes: Vec::new(),
        after: Vec::new(),
        closure_depth: 0,
        count: 0,
        cx,
    };
    rewriter.visit_block_mut(&mut model.item.block);
    let count = rewriter.count;
    if count > 0 && rewriter.ret.is_none() {
        rewriter.cx.error_spanned_by(
            &model.item.sig,
            Message::new(
                "a body with eager islands must return `Result<(), E>` (or `Result<T, E>`)",
            )
            .why(
                "an island's code returns `Result<(), E>` with the same `E`, and its failure on a \
                 replay comes back as `GraphError::Island`",
            ),
        );
    }
    count
}

/// `Result<(), E>` for a function returning `Result<T, E>` (`candle_core::Result<()>` for one
/// returning `candle_core::Result<Tensor>`): the type an island's code returns.
fn island_return_type(output: &syn::ReturnType) -> Option<syn::Type> {
    let syn::ReturnType::Type(_, ty) = output else {
        return None;
    };
    let mut ty = (**ty).clone();
    let syn::Type::Path(p) = &mut ty else {
        return None;
    };
    let last = p.path.segments.last_mut()?;
    if !last.ident.to_string().ends_with("Result") {
        return None;
    }
    let syn::PathArguments::AngleBracketed(args) = &mut last.arguments else {
        return None;
    };
    let first = args.args.first_mut()?;
    *first = syn::parse_quote!(());
    Some(ty)
}

struct Rewriter<'c> {
    ctx: Ident,
    krate: syn::Path,
    params_ty: Ident,
    fn_ty: Ident,
    ret: Option<syn::Type>,
    /// The island struct's fields as the body fills them from its parameters.
    inits: Vec<TokenStream>,
    /// The parameters' names, bound from the struct in the island's code.
    binds: Vec<TokenStream>,
    param_names: HashSet<String>,
    /// The `#[island]` parameters: only islands may use them.
    island_state: HashSet<String>,
    /// The locals in scope (`let` and `for` bindings), innermost block last.
    scopes: Vec<Vec<Ident>>,
    /// The names used by what runs after the current statement, per enclosing block (with
    /// its depth in `scopes`): the rest of the block, or a whole loop body.
    after: Vec<(usize, HashMap<String, Ident>)>,
    closure_depth: usize,
    count: usize,
    cx: &'c mut Ctxt,
}

/// Every identifier in `tokens` (macro arguments included), with its first occurrence.
fn idents_in(tokens: TokenStream, out: &mut HashMap<String, Ident>) {
    for t in tokens {
        match t {
            TokenTree::Ident(i) => {
                out.entry(i.to_string()).or_insert(i);
            }
            TokenTree::Group(g) => idents_in(g.stream(), out),
            _ => {}
        }
    }
}

/// The identifiers `stmts` use, leaving out those that a `let` among them binds again before
/// the use (the use then reads the new binding, not the one the caller asks about).
fn used_before_rebound(stmts: &[Stmt]) -> HashMap<String, Ident> {
    let mut used = HashMap::new();
    let mut rebound: HashSet<String> = HashSet::new();
    let add =
        |tokens: TokenStream, rebound: &HashSet<String>, used: &mut HashMap<String, Ident>| {
            let mut names = HashMap::new();
            idents_in(tokens, &mut names);
            for (n, i) in names {
                if !rebound.contains(&n) {
                    used.entry(n).or_insert(i);
                }
            }
        };
    for s in stmts {
        match s {
            Stmt::Local(l) => {
                if let Some(init) = &l.init {
                    add(init.expr.to_token_stream(), &rebound, &mut used);
                    if let Some((_, diverge)) = &init.diverge {
                        add(diverge.to_token_stream(), &rebound, &mut used);
                    }
                }
                let mut names = Vec::new();
                pat_idents(&l.pat, &mut names);
                rebound.extend(names.iter().map(ToString::to_string));
            }
            other => add(other.to_token_stream(), &rebound, &mut used),
        }
    }
    used
}

/// Every identifier in `tokens` that can name a variable, with the span of its first
/// occurrence: not a field or method after `.` (`sampled.scores` uses `sampled`, not a local
/// `scores`), not a path segment after `::`, not a field name before a lone `:` (`Sampled {
/// scores: v }`).
fn ident_uses(tokens: TokenStream, out: &mut Vec<Ident>) {
    use proc_macro2::Spacing;
    let tokens: Vec<TokenTree> = tokens.into_iter().collect();
    fn punct(t: Option<&TokenTree>, c: char, spacing: Spacing) -> bool {
        matches!(t, Some(TokenTree::Punct(p)) if p.as_char() == c && p.spacing() == spacing)
    }
    let lone = |t, c| punct(t, c, Spacing::Alone);
    let joint = |t, c| punct(t, c, Spacing::Joint);
    for (k, t) in tokens.iter().enumerate() {
        match t {
            TokenTree::Ident(i) => {
                let before = |back: usize| k.checked_sub(back).and_then(|j| tokens.get(j));
                // `a.b`, not the end of `..` (`0..n` uses `n`).
                let member = lone(before(1), '.') && !joint(before(2), '.');
                let path = lone(before(1), ':') && joint(before(2), ':');
                let field = lone(tokens.get(k + 1), ':');
                if !(member || path || field || out.contains(i)) {
                    out.push(i.clone());
                }
            }
            TokenTree::Group(g) => ident_uses(g.stream(), out),
            _ => {}
        }
    }
}

/// The names bound anywhere inside `e` (`let`, `for`, closure and match patterns).
fn bound_inside(e: &Expr) -> HashSet<String> {
    struct Names(HashSet<String>);
    impl<'ast> syn::visit::Visit<'ast> for Names {
        fn visit_pat_ident(&mut self, p: &'ast syn::PatIdent) {
            self.0.insert(p.ident.to_string());
            syn::visit::visit_pat_ident(self, p);
        }
    }
    let mut names = Names(HashSet::new());
    syn::visit::Visit::visit_expr(&mut names, e);
    names.0
}

/// The names a pattern binds.
fn pat_idents(pat: &Pat, out: &mut Vec<Ident>) {
    struct Names<'o>(&'o mut Vec<Ident>);
    impl<'ast> syn::visit::Visit<'ast> for Names<'_> {
        fn visit_pat_ident(&mut self, p: &'ast syn::PatIdent) {
            self.0.push(p.ident.clone());
            syn::visit::visit_pat_ident(self, p);
        }
    }
    syn::visit::Visit::visit_pat(&mut Names(out), pat);
}

impl Rewriter<'_> {
    /// The locals visible here that something after this point uses: they cross the island
    /// at this point. Each is given by its first use after it (the span of the check).
    fn crossing(&self) -> Vec<Ident> {
        let mut out: Vec<Ident> = Vec::new();
        for (depth, scope) in self.scopes.iter().enumerate() {
            let depth = depth + 1;
            for b in scope {
                let name = b.to_string();
                let used = self
                    .after
                    .iter()
                    .filter(|(d, _)| *d >= depth)
                    .find_map(|(_, names)| names.get(&name));
                // One check per name: it reaches the latest binding, the one in scope here.
                if let Some(used) = used {
                    if !out.contains(b) {
                        out.push(used.clone());
                    }
                }
            }
        }
        out
    }

    /// Whether `name` is a local of the body in scope here.
    fn local(&self, name: &Ident) -> Option<&Ident> {
        self.scopes
            .iter()
            .rev()
            .flat_map(|s| s.iter().rev())
            .find(|b| *b == name)
    }

    /// The island call `m`, rewritten (see the module docs).
    fn island(&mut self, m: &ExprMethodCall) -> Expr {
        self.count += 1;
        let closure = match m.args.iter().collect::<Vec<_>>().as_slice() {
            [Expr::Closure(c)] => Some(c.clone()),
            _ => None,
        };
        let Some(closure) = closure else {
            self.cx.error_spanned_by(
                &m.args,
                Message::new(format!(
                    "`{}.eager` takes the island's code as a closure without parameters",
                    self.ctx
                ))
                .fix(format!("write `{}.eager(|| {{ … }})?;`", self.ctx)),
            );
            return Expr::MethodCall(m.clone());
        };
        let mut closure = closure;
        self.check_closure(&mut closure);
        let krate = self.krate.clone();
        // The locals of the body the island's code uses: checked to be `Copy` host values.
        let mut used = Vec::new();
        ident_uses(closure.body.to_token_stream(), &mut used);
        // Names the island binds itself are its own (a use before its own binding would still
        // be refused, by the closure's `'static` bound).
        let own = bound_inside(&closure.body);
        used.retain(|u| !own.contains(&u.to_string()));
        let mut captured = Vec::new();
        for u in &used {
            let Some(local) = self.local(u) else { continue };
            let name = u.to_string();
            if self.param_names.contains(&name) || *u == self.ctx {
                self.cx.error_spanned_by(
                    u,
                    Message::new(format!(
                        "inside an island, `{name}` is the function's parameter, not the body's local `{name}`"
                    ))
                    .why(format!(
                        "the body defines a local `{name}` before the island, and an island sees the \
                         function's parameters by name"
                    ))
                    .fix("rename the local"),
                );
                continue;
            }
            let local = local.clone();
            captured.push(
                quote_spanned!(u.span()=> (&&#krate::__private::Probe(&#local)).crosses().taken();),
            );
        }
        let ret = self
            .ret
            .as_ref()
            .map(|r| quote!(#r))
            .unwrap_or_else(|| quote!(::core::result::Result<(), #krate::GraphError>));
        let ret = match &closure.output {
            syn::ReturnType::Type(_, t) => quote!(#t),
            syn::ReturnType::Default => ret,
        };
        let body = &closure.body;
        let (params_ty, fn_ty) = (&self.params_ty, &self.fn_ty);
        let (ctx, inits, binds) = (&self.ctx, &self.inits, &self.binds);
        let call_span = m.span();
        let _ = fn_ty;
        let probes = (!captured.is_empty()).then(
            || quote!(use #krate::__private::{ProbeDevice as _, ProbeHost as _, ProbeOther as _};),
        );
        syn::parse_quote_spanned! {call_span=>
            {
                #probes
                #(#captured)*
                #params_ty { #ctx, #(#inits,)* }.__run(move |__island| -> #ret {
                    #[allow(unused_variables, unused_mut)]
                    let #params_ty { #ctx, #(#binds,)* } = __island;
                    #body
                })
            }
        }
    }

    fn check_closure(&mut self, c: &mut ExprClosure) {
        if !c.inputs.is_empty() {
            self.cx.error_spanned_by(
                &c.inputs,
                Message::new("an island's closure takes no parameters")
                    .why(format!(
                        "inside it, the function's parameters are in scope by name (`{}`, the inputs, \
                         outputs and state)",
                        self.ctx
                    ))
                    .fix(format!("write `{}.eager(|| {{ … }})`", self.ctx)),
            );
        }
        if let Some(a) = &c.asyncness {
            self.cx.error_spanned_by(
                a,
                Message::new("an island's code runs on the calling thread; remove `async`"),
            );
        }
        // `y = …` / `*y = …` on a parameter the segments read by address: reported, and left
        // out of the emitted code, so that the error is the only one about it.
        struct Replaced<'n> {
            params: HashSet<&'n String>,
            found: Vec<(Ident, String)>,
        }
        impl VisitMut for Replaced<'_> {
            fn visit_expr_mut(&mut self, e: &mut Expr) {
                if let Expr::Assign(a) = e {
                    let mut target = &*a.left;
                    while let Expr::Unary(syn::ExprUnary {
                        op: syn::UnOp::Deref(_),
                        expr,
                        ..
                    }) = target
                    {
                        target = expr;
                    }
                    let param = match target {
                        Expr::Path(p) => p
                            .path
                            .get_ident()
                            .filter(|i| self.params.contains(&i.to_string())),
                        _ => None,
                    };
                    if let Some(i) = param {
                        self.found
                            .push((i.clone(), a.left.to_token_stream().to_string()));
                        *e = syn::parse_quote!(());
                        return;
                    }
                }
                visit_mut::visit_expr_mut(self, e);
            }
        }
        let mut replaced = Replaced {
            params: self.param_names.difference(&self.island_state).collect(),
            found: Vec::new(),
        };
        replaced.visit_expr_mut(&mut c.body);
        for (i, lhs) in replaced.found {
            self.cx.error_spanned_by(
                &i,
                Message::new(format!(
                    "an island cannot replace `{i}` (`{} = …`)",
                    lhs.replace(' ', "")
                ))
                .why(format!(
                    "the segments after it read `{i}` by the address they were captured with, so they \
                     would read the old buffer"
                ))
                .fix(format!(
                    "write into it instead (`stream.memcpy_htod(&host, &mut {i})`, a kernel, \
                     `copy_from`), or keep what the island replaces in `#[island]` state"
                )),
            );
        }
    }

    /// Reports a use of `#[island]` state outside islands.
    fn outside_island(&mut self, tokens: TokenStream) {
        if self.island_state.is_empty() {
            return;
        }
        let mut uses = Vec::new();
        ident_uses(tokens, &mut uses);
        for u in uses {
            let name = u.to_string();
            if self.island_state.contains(&name) && self.local(&u).is_none() {
                self.cx.error_spanned_by(
                    &u,
                    Message::new(format!(
                        "`{name}` is `#[island]` state, used outside an island"
                    ))
                    .why(format!(
                        "only the code of an island (`{}.eager(|| {{ … }})`) may use it, because a \
                         replay runs the islands' code and not the rest of the body",
                        self.ctx
                    ))
                    .fix(format!(
                        "move this use into an island, or make `{name}` `#[state]` if the graph reads \
                         it on the device"
                    )),
                );
            }
        }
    }
}

impl VisitMut for Rewriter<'_> {
    fn visit_block_mut(&mut self, b: &mut Block) {
        self.scopes.push(Vec::new());
        let stmts = std::mem::take(&mut b.stmts);
        let mut out = Vec::with_capacity(stmts.len());
        for (k, mut stmt) in stmts.iter().cloned().enumerate() {
            let rest = used_before_rebound(&stmts[k + 1..]);
            self.after.push((self.scopes.len(), rest));
            let island = island_stmt(&stmt, &self.ctx).cloned();
            match island {
                Some(m) if self.closure_depth == 0 => {
                    let rewritten = self.island(&m);
                    match &mut stmt {
                        Stmt::Expr(Expr::Try(t), _) => *t.expr = rewritten,
                        Stmt::Expr(e, _) => *e = rewritten,
                        _ => unreachable!("island_stmt matched an expression statement"),
                    }
                    out.push(stmt);
                    let krate = &self.krate;
                    let crossing = self.crossing();
                    if !crossing.is_empty() {
                        let checks = crossing.iter().map(|c| {
                            quote_spanned!(c.span()=> (&&#krate::__private::Probe(&#c)).crosses().across();)
                        });
                        out.push(syn::parse_quote! {
                            {
                                use #krate::__private::{ProbeDevice as _, ProbeHost as _, ProbeOther as _};
                                #(#checks)*
                            }
                        });
                    }
                }
                _ => {
                    self.visit_stmt_mut(&mut stmt);
                    if let Stmt::Local(l) = &stmt {
                        let mut names = Vec::new();
                        pat_idents(&l.pat, &mut names);
                        self.scopes.last_mut().expect("in a block").extend(names);
                    }
                    out.push(stmt);
                }
            }
            self.after.pop();
        }
        b.stmts = out;
        self.scopes.pop();
    }

    fn visit_expr_mut(&mut self, e: &mut Expr) {
        if let Some(m) = island_call(e, &self.ctx) {
            let message = if self.closure_depth > 0 {
                Message::new(
                    "an island cannot be inside a closure (a `graph_while` / `graph_if` body, a fork, an \
                     iterator adapter)",
                )
                .why("a replay runs islands between whole segments of the body")
                .fix("move it to the body's own statements (loops and `if` are fine)")
            } else {
                Message::new("an island is a statement of its own, `rt.eager(|| { … })?;`")
                    .why(
                        "its code runs between two segments of the graph, so it cannot be part of an \
                         expression",
                    )
                    .fix("write it as a statement")
            };
            let span = m.method.span();
            self.cx.error_at(span, message);
            // Refused: an inert stand-in, so that the error is the only one.
            let krate = &self.krate;
            *e = syn::parse_quote_spanned!(span=> #krate::__private::misplaced_island());
            return;
        }
        if let Expr::Path(p) = e {
            self.outside_island(p.to_token_stream());
        }
        visit_mut::visit_expr_mut(self, e);
    }

    fn visit_macro_mut(&mut self, m: &mut syn::Macro) {
        self.outside_island(m.tokens.clone());
    }

    fn visit_expr_closure_mut(&mut self, c: &mut ExprClosure) {
        self.closure_depth += 1;
        visit_mut::visit_expr_closure_mut(self, c);
        self.closure_depth -= 1;
    }

    fn visit_expr_for_loop_mut(&mut self, f: &mut syn::ExprForLoop) {
        self.visit_expr_mut(&mut f.expr);
        // The next turn runs the whole body again: what it uses crosses every island in it.
        let again = used_before_rebound(&f.body.stmts);
        self.after.push((self.scopes.len(), again));
        let mut names = Vec::new();
        pat_idents(&f.pat, &mut names);
        self.scopes.push(names);
        self.visit_block_mut(&mut f.body);
        self.scopes.pop();
        self.after.pop();
    }

    fn visit_expr_while_mut(&mut self, w: &mut syn::ExprWhile) {
        let mut again = HashMap::new();
        idents_in(w.cond.to_token_stream(), &mut again);
        idents_in(w.body.to_token_stream(), &mut again);
        self.after.push((self.scopes.len(), again));
        visit_mut::visit_expr_while_mut(self, w);
        self.after.pop();
    }

    fn visit_expr_loop_mut(&mut self, l: &mut syn::ExprLoop) {
        let mut again = HashMap::new();
        idents_in(l.body.to_token_stream(), &mut again);
        self.after.push((self.scopes.len(), again));
        visit_mut::visit_expr_loop_mut(self, l);
        self.after.pop();
    }

    // Items declared in the body are their own functions: no islands, no locals of the body.
    fn visit_item_mut(&mut self, _: &mut syn::Item) {}
}

/// The island items next to the user's function: `__FooIsland<'__i>`, the parameters as an
/// island takes them, and `__FooIslandFn`, an island's code boxed.
pub(super) fn items(
    model: &GraphFn,
    krate: &syn::Path,
    names: &IslandNames,
    vis: &syn::Visibility,
) -> TokenStream {
    let (params_ty, fn_ty) = (&names.params_ty, &names.fn_ty);
    let Some(ctx) = ctx_ident(model) else {
        return TokenStream::new();
    };
    let ctx_ty = &model.context.as_ref().expect("checked by analyze").ty;
    let fields = model.params.iter().map(|p| {
        let (i, t) = (&p.ident, &p.ty);
        match p.role {
            Role::Input | Role::State { mutable: false } => quote!(pub #i: &'__i #t),
            Role::State { mutable: true } if p.island => quote!(pub #i: &'__i mut #t),
            Role::Output | Role::State { mutable: true } => {
                quote!(pub #i: <#t as #krate::DeviceState>::Lent<'__i>)
            }
            Role::Constant | Role::Bucket => quote!(pub #i: #t),
        }
    });
    quote! {
        #[doc(hidden)]
        #[allow(non_camel_case_types, dead_code)]
        #vis struct #params_ty<'__i> {
            pub #ctx: &'__i #ctx_ty,
            #(#fields,)*
        }
        #[doc(hidden)]
        #[allow(non_camel_case_types)]
        #vis type #fn_ty = ::std::boxed::Box<
            dyn for<'__i> ::core::ops::Fn(#params_ty<'__i>) -> ::core::result::Result<(), #krate::GraphError>
                + ::core::marker::Send
                + ::core::marker::Sync,
        >;
        impl<'__i> #params_ty<'__i> {
            /// Runs the island's code now, or, in the capture, ends the segment there and
            /// keeps the code for the replays (see `graph_runtime::__private::island`).
            #[doc(hidden)]
            #[track_caller]
            #vis fn __run<__E, __F>(self, code: __F) -> ::core::result::Result<(), __E>
            where
                __F: for<'__j> ::core::ops::Fn(#params_ty<'__j>) -> ::core::result::Result<(), __E>
                    + ::core::marker::Send
                    + ::core::marker::Sync
                    + 'static,
                __E: ::core::convert::From<#krate::GraphError>,
                ::core::result::Result<(), __E>: #krate::__private::BodyResult,
            {
                #krate::__private::island(self, code, |code| -> #fn_ty {
                    ::std::boxed::Box::new(move |p: #params_ty<'_>| {
                        #krate::__private::BodyResult::into_graph_result(code(p))
                    })
                })
            }
        }
    }
}

/// `GraphBody::island` (the island's code on the graph's static buffers and held state) and,
/// with `#[island]` state, `save_islands` / `restore_islands` (its clones around the warmup
/// and `verify`'s eager run).
pub(super) fn graph_body_items(
    model: &GraphFn,
    names: &IslandNames,
    pr: &TokenStream,
    family: bool,
) -> TokenStream {
    let (params_ty, fn_ty) = (&names.params_ty, &names.fn_ty);
    let Some(ctx) = ctx_ident(model) else {
        return TokenStream::new();
    };
    let ins = model.of(|r| r == Role::Input).map(|p| &p.ident);
    let outs = model.of(|r| r == Role::Output).map(|p| &p.ident);
    // The static buffers as locals named after the parameters (a family's: the bucket's
    // rows of them, after the rows `__b`), as `run` binds them.
    let statics = if family {
        quote!(let (__b, (#(#ins,)*), (#(#outs,)*)) = &mut #pr::rows(s);)
    } else {
        quote!(let #pr::Statics { inputs: (#(#ins,)*), outputs: (#(#outs,)*), .. } = s;)
    };
    let fields = model.params.iter().map(|p| {
        let i = &p.ident;
        match p.role {
            // A family's locals are `&mut` its `Rows`, coerced (`&**`) to the buffers.
            Role::Input => quote!(#i: &*#i),
            Role::Output if family => quote!(#i: #pr::DeviceState::lend(&mut **#i)),
            Role::Output => quote!(#i: #pr::DeviceState::lend(#i)),
            Role::State { mutable: false } => quote!(#i: &*self.#i),
            Role::State { mutable: true } if p.island => quote!(#i: &mut *self.#i),
            Role::State { mutable: true } => quote!(#i: #pr::DeviceState::lend(&mut *self.#i)),
            Role::Bucket => {
                let t = relocated(&p.ty);
                quote!(#i: *__b as #t)
            }
            Role::Constant => quote!(#i: self.#i),
        }
    });
    let saved: Vec<&Param> = model
        .params
        .iter()
        .filter(|p| p.island && p.role == Role::State { mutable: true })
        .collect();
    let save = (!saved.is_empty()).then(|| {
        let names: Vec<&Ident> = saved.iter().map(|p| &p.ident).collect();
        let tys: Vec<TokenStream> = saved.iter().map(|p| relocated(&p.ty)).collect();
        quote! {
            fn save_islands(&self) -> ::core::option::Option<::std::boxed::Box<dyn ::core::any::Any>> {
                ::core::option::Option::Some(::std::boxed::Box::new((
                    #(::core::clone::Clone::clone(&*self.#names),)*
                )))
            }
            fn restore_islands(&mut self, __saved: ::core::option::Option<::std::boxed::Box<dyn ::core::any::Any>>) {
                if let ::core::option::Option::Some(__saved) = __saved.and_then(|s| s.downcast::<(#(#tys,)*)>().ok()) {
                    let (#(#names,)*) = *__saved;
                    #(*self.#names = #names;)*
                }
            }
        }
    });
    quote! {
        fn island(
            &mut self,
            __island: &dyn ::core::any::Any,
            s: &mut #pr::StaticsOf<Self>,
            __ctx: &Self::Ctx,
        ) -> #pr::Result<()> {
            let __run = __island
                .downcast_ref::<super::#fn_ty>()
                .expect("an island of this graph holds this graph's island function");
            #statics
            __run(super::#params_ty { #ctx: __ctx, #(#fields,)* })
        }
        fn owns_island(__island: &(dyn ::core::any::Any + ::core::marker::Send + ::core::marker::Sync)) -> bool {
            __island.is::<super::#fn_ty>()
        }
        #save
    }
}
