//! The walker: visits a body with [`syn::visit`] and asks the rule table about every method
//! call, path, macro and condition, keeping the names it passes in a block-scoped
//! [`Scope`].
//!
//! Imports the rules, `scope.rs`, `syntax.rs`, `finding.rs` and `tokens` (names); never
//! this folder's `mod.rs`, which drives it.

use std::collections::HashMap;

use proc_macro2::{Spacing, Span, TokenStream, TokenTree};
use quote::ToTokens;
use syn::parse::{ParseStream, Parser};
use syn::punctuated::Punctuated;
use syn::visit::{self, Visit};
use syn::{Expr, Token};

use super::finding::Finding;
use super::rules::{
    inside_opt_out, path_matches, rule, without_version_suffix, Matcher, Rule, CANDLE_READS,
    CANDLE_TO_CPU, DEVICE_READS, FORMATTING_MACROS, OPT_OUT_KEEPS, OPT_OUT_MACRO, RULES,
};
use super::scope::{annotated_type, bound_names, kind_of_type, Binding, DeviceData, Kind, Scope};
use super::syntax::{
    aliases_of_use, compact, inline_args, is_closure, is_null_pointer, plain_name, root_name,
    spans_of, split_arrows, split_top_level, stream_argument, strip_named_argument, use_aliases,
};
use crate::tokens::{segment_names, unraw};

pub struct Walker {
    host_effects: bool,
    scope: Scope,
    /// Names the body brings in with `use` items of its own (anywhere in it), with the path
    /// each stands for: `trng` → `rand::thread_rng`. The enclosing module's `use` items are
    /// not in the tokens.
    imports: HashMap<String, Vec<String>>,
    /// Above zero while walking a condition already reported as a whole: its reads are
    /// part of that error.
    quiet_reads: usize,
    /// Above zero inside `replays_as_captured!`: only what can never replay as captured (a
    /// synchronize, a device-to-host read or a query of a receiver that is provably CUDA's)
    /// is still reported there, and `provable` is set for that match.
    opt_out: usize,
    /// Whether the receiver of the method being matched is provably a CUDA object.
    provable: bool,
    pub findings: Vec<Finding>,
}

/// A method call, or a call written as a path on a known type (`CudaStream::synchronize(s)`).
struct MethodLike<'e> {
    name: String,
    receiver: Option<&'e Expr>,
    /// The arguments after the receiver.
    args: Vec<&'e Expr>,
    /// Written on a type of cudarc, the runtime, rand or std: the receiver's kind does not
    /// matter, the type says whose method it is.
    on_known_type: bool,
    span: (Span, Span),
    what: String,
    /// Rules the same call already matched by its path: not reported twice.
    already: Vec<&'static str>,
}

impl Walker {
    pub fn new(scope: Scope, host_effects: bool, body: &syn::Block) -> Self {
        Walker {
            host_effects,
            scope,
            imports: use_aliases(body),
            quiet_reads: 0,
            opt_out: 0,
            provable: false,
            findings: Vec::new(),
        }
    }

    fn report(&mut self, rule: &'static Rule, span: (Span, Span), what: &str, data: &str) {
        if rule.host_effect && self.host_effects {
            return;
        }
        if self.opt_out > 0 {
            if !(self.provable && OPT_OUT_KEEPS.contains(&rule.id)) {
                return;
            }
            let message = rule.render_plain(what, data).why(inside_opt_out());
            self.findings.push(Finding {
                rule,
                span,
                message,
            });
            return;
        }
        if (rule.id == "device-to-host" || rule.id == "candle-host-read") && self.quiet_reads > 0 {
            return;
        }
        self.findings.push(Finding {
            rule,
            span,
            message: rule.render(what, data),
        });
    }

    /// Reports each rule at most once for this node; returns the ids of the rules that
    /// matched.
    fn match_rules(
        &mut self,
        span: (Span, Span),
        what: &str,
        hit: impl Fn(&Matcher) -> bool,
    ) -> Vec<&'static str> {
        let mut ids = Vec::new();
        for rule in RULES {
            if rule.has(&hit) {
                self.report(rule, span, what, "");
                ids.push(rule.id);
            }
        }
        ids
    }

    /// The path's segments with a first segment that the body imported by `use` replaced by
    /// the path it stands for (`thread::scope` after `use std::thread;` is unchanged,
    /// `trng` after `use rand::thread_rng as trng;` is `rand::thread_rng`).
    fn resolved(&self, path: &syn::Path) -> Vec<String> {
        let segs = segment_names(path);
        if path.leading_colon.is_some() {
            return segs;
        }
        match segs.split_first() {
            Some((first, rest)) => match self.imports.get(first) {
                Some(full) => full.iter().chain(rest).cloned().collect(),
                None => segs,
            },
            None => segs,
        }
    }

    /// Reports the path rules a path matches.
    fn match_path(&mut self, path: &syn::Path) -> Vec<&'static str> {
        let written = segment_names(path);
        let segs = self.resolved(path);
        let what = if segs == written {
            format!("`{}`", segs.join("::"))
        } else {
            format!("`{}` (`{}`)", written.join("::"), segs.join("::"))
        };
        self.match_rules(spans_of(path), &what, |m| path_matches(m, &segs))
    }

    /// Whether a receiver may be a CUDA object, for [`Matcher::LooseMethod`]: a name whose
    /// type is not provably the user's, a field named like a CUDA object, a call chain rooted
    /// in a CUDA value or ending in a method that returns one. Fields and chains the tokens
    /// cannot classify are taken for the user's.
    fn may_be_cuda(&self, e: &Expr) -> bool {
        const CUDA_WORDS: &[&str] = &[
            "stream", "ctx", "context", "event", "cuda", "gpu", "runtime",
        ];
        const CUDA_FIELDS: &[&str] = &["rt", "ev", "dev", "device", "start", "stop", "end", "done"];
        const CUDA_GETTERS: &[&str] = &[
            "stream",
            "context",
            "ctx",
            "default_stream",
            "per_thread_stream",
            "new_stream",
            "fork",
            "cu_stream",
            "device",
            "event",
            "new_event",
            "record_event",
        ];
        const LOOK_THROUGH: &[&str] = &[
            "clone", "unwrap", "expect", "as_ref", "as_mut", "borrow", "lock", "read", "write",
        ];
        match e {
            Expr::Paren(p) => self.may_be_cuda(&p.expr),
            Expr::Reference(r) => self.may_be_cuda(&r.expr),
            Expr::Unary(u) => self.may_be_cuda(&u.expr),
            Expr::Try(t) => self.may_be_cuda(&t.expr),
            Expr::Index(i) => self.may_be_cuda(&i.expr),
            Expr::Path(p) if p.qself.is_none() && p.path.segments.len() == 1 => {
                matches!(self.scope.kind_of_expr(e), Kind::Unknown | Kind::Cuda)
            }
            Expr::Field(f) => {
                let name = match &f.member {
                    syn::Member::Named(i) => unraw(i).to_lowercase(),
                    syn::Member::Unnamed(_) => {
                        return self.scope.kind_of_expr(&f.base) == Kind::Cuda
                    }
                };
                CUDA_WORDS.iter().any(|w| name.contains(w)) || CUDA_FIELDS.contains(&name.as_str())
            }
            Expr::MethodCall(m) => {
                let name = unraw(&m.method);
                if CUDA_GETTERS.contains(&name.as_str()) {
                    return true;
                }
                if LOOK_THROUGH.contains(&name.as_str()) {
                    return self.may_be_cuda(&m.receiver);
                }
                let mut root: &Expr = &m.receiver;
                while let Expr::MethodCall(inner) = root {
                    root = &inner.receiver;
                }
                self.scope.kind_of_expr(root) == Kind::Cuda
            }
            Expr::Call(_) => self.scope.kind_of_expr(e) == Kind::Cuda,
            _ => true,
        }
    }

    /// Whether a receiver is provably a CUDA object: a name bound to one (the context
    /// parameter, a `CudaStream` parameter, `let s = rt.stream();`), or a call chain on such a
    /// name (`rt.stream()`, `rt.stream().clone()`). What [`Walker::may_be_cuda`] guesses
    /// from field names does not count.
    fn provably_cuda(&self, e: &Expr) -> bool {
        match e {
            Expr::Paren(p) => self.provably_cuda(&p.expr),
            Expr::Reference(r) => self.provably_cuda(&r.expr),
            Expr::Unary(u) => self.provably_cuda(&u.expr),
            Expr::Try(t) => self.provably_cuda(&t.expr),
            Expr::MethodCall(m) => {
                let mut root: &Expr = &m.receiver;
                while let Expr::MethodCall(inner) = root {
                    root = &inner.receiver;
                }
                self.scope.kind_of_expr(root) == Kind::Cuda
            }
            Expr::Path(p) if p.qself.is_none() && p.path.segments.len() == 1 => {
                self.scope.kind_of_expr(e) == Kind::Cuda
            }
            _ => false,
        }
    }

    fn method_like(&mut self, call: MethodLike<'_>) {
        let MethodLike {
            name,
            receiver,
            args,
            on_known_type,
            span,
            what,
            already,
        } = call;
        // A method of a value of the user's own type is the user's: no name rule applies.
        let users_own = !on_known_type && receiver.is_some_and(|r| self.scope.is_users_own(r));
        // A copy from a buffer declared as pinned is the legal host-to-device copy: the
        // declaration says what the tokens of the call cannot.
        let pinned_source = args.first().and_then(|a| root_name(a)).is_some_and(|n| {
            self.scope
                .get(&n)
                .is_some_and(|b| b.kind == Kind::PinnedHost)
        });
        // candle's CPU device as the first argument: the same call with a CUDA device is a
        // copy between devices.
        let to_cpu = args.first().filter(|a| self.scope.is_cpu_device(a));
        // A device-to-host copy into a buffer declared as pinned is recorded into the graph
        // and repeated by every replay: legal, like the copy from one.
        // A field of a `#[state]` struct of the user's as the host end: pinned or not, the
        // graph records the copy, and the runtime refuses a pageable end at capture
        // (`GraphError::PageableCopyCaptured`), so only the type can tell, and it is checked.
        let state_field = |a: &Expr| {
            field_of(a).and_then(root_name).is_some_and(|n| {
                self.scope
                    .get(&n)
                    .is_some_and(|b| b.param && b.kind == Kind::Users)
            })
        };
        let pinned_destination = name == "memcpy_dtoh"
            && args.get(1).is_some_and(|a| {
                state_field(a)
                    || root_name(a).is_some_and(|n| {
                        self.scope
                            .get(&n)
                            .is_some_and(|b| b.kind == Kind::PinnedHost)
                    })
            });
        let pinned_source = pinned_source
            || (matches!(name.as_str(), "memcpy_htod" | "clone_htod")
                && args.first().is_some_and(|a| state_field(a)));
        let loose_ok = receiver.is_some_and(|r| self.may_be_cuda(r)) || on_known_type;
        // Inside the opt-out only a receiver that is provably CUDA's counts.
        self.provable = on_known_type || receiver.is_some_and(|r| self.provably_cuda(r));
        // A builder's `spawn(|| …)` (`Builder::new().name(n).spawn(…)`): a call chain, not
        // the `s.spawn` of a scope already reported.
        let with_closure = args.iter().any(|a| is_closure(a))
            && receiver.is_some_and(|r| {
                let r = match r {
                    Expr::Try(t) => &*t.expr,
                    _ => r,
                };
                matches!(r, Expr::MethodCall(_) | Expr::Call(_))
            });
        let rng =
            !on_known_type && receiver.is_some_and(|r| self.scope.kind_of_expr(r) == Kind::Rng);
        // A type of the user's built from a CUDA value: only the names it may forward to
        // what it holds (the loose methods) are judged.
        let wraps =
            !on_known_type && receiver.is_some_and(|r| self.scope.kind_of_expr(r) == Kind::Wraps);
        if !users_own {
            for r in RULES {
                let by_cpu_arg = !wraps
                    && to_cpu.is_some()
                    && r.has(|m| matches!(m, Matcher::ToCpu(n) if *n == name));
                let hit = by_cpu_arg
                    || r.has(|m| match m {
                        Matcher::LooseMethod(n) => *n == name && (loose_ok || wraps),
                        _ if wraps => false,
                        Matcher::Method(n) => *n == name,
                        Matcher::MethodNoArgs(n) => *n == name && args.is_empty(),
                        Matcher::MethodWithClosure(n) => *n == name && with_closure,
                        Matcher::RngMethod => rng && name != "clone",
                        _ => false,
                    });
                let legal_pinned = (pinned_source && r.id == "host-to-device")
                    || (pinned_destination && r.id == "device-to-host");
                if hit && !already.contains(&r.id) && !legal_pinned {
                    // `.to_device(&Device::Cpu)`: the argument is what makes it a read.
                    let what = match to_cpu {
                        Some(a) if by_cpu_arg && what == format!("`.{name}()`") => {
                            format!("`.{name}({})`", compact(a))
                        }
                        _ => what.clone(),
                    };
                    self.report(r, span, &what, "");
                }
            }
        }
        self.provable = false;
        self.static_method(receiver, &name, span);
        self.receiver_kind_rules(receiver, &name, span, &what);
        if !users_own && !pinned_destination {
            self.note_filled_from_device(&name, &args);
        }
    }

    /// `STATIC.load()`, `COUNTER.fetch_add(1)`, …: a `static` used through an atomic or a
    /// cell (`host-static-state`).
    fn static_method(&mut self, receiver: Option<&Expr>, name: &str, span: (Span, Span)) {
        if let Some(stat) = receiver.and_then(|r| self.scope.static_root(r)) {
            const STATIC_METHODS: &[&str] = &[
                "load",
                "store",
                "swap",
                "fetch_add",
                "fetch_sub",
                "fetch_and",
                "fetch_or",
                "fetch_xor",
                "fetch_nand",
                "fetch_max",
                "fetch_min",
                "fetch_update",
                "compare_exchange",
                "compare_exchange_weak",
                "set",
                "take",
                "with_borrow_mut",
            ];
            if STATIC_METHODS.contains(&name) {
                let what = stat.describe(&format!(".{name}()"));
                self.match_rules(span, &what, |m| *m == Matcher::StaticAccess);
            }
        }
    }

    /// The rules that match by what the receiver was declared as: a pinned buffer, a host
    /// collection parameter, a field of a `#[state]` struct of the user's.
    fn receiver_kind_rules(
        &mut self,
        receiver: Option<&Expr>,
        name: &str,
        span: (Span, Span),
        what: &str,
    ) {
        if let Some(recv) = receiver.and_then(root_name) {
            let (pinned, collection, users_state) = match self.scope.get(&recv) {
                Some(b) => (
                    b.kind == Kind::PinnedHost,
                    b.kind == Kind::HostCollection && b.param,
                    b.kind == Kind::Users && b.param,
                ),
                None => (false, false, false),
            };
            let on_field = receiver.is_some_and(|r| field_of(r).is_some());
            let data = format!("`{recv}`");
            for r in RULES {
                let hit = r.has(|m| match m {
                    Matcher::PinnedMethod(n) => pinned && *n == name,
                    Matcher::CollectionParamMethod(n) => collection && *n == name,
                    Matcher::StateFieldMethod(n) => users_state && on_field && *n == name,
                    _ => false,
                });
                if hit {
                    self.report(r, span, what, &data);
                }
            }
        }
    }

    /// `.memcpy_dtoh(src, dst)`: `dst` now holds device data (for the branch rules).
    fn note_filled_from_device(&mut self, name: &str, args: &[&Expr]) {
        if name == "memcpy_dtoh" {
            if let Some(dst) = args.get(1).and_then(|a| root_name(a)) {
                if let Some(b) = self.scope.assign(&dst) {
                    b.device_data = Some(DeviceData {
                        how: format!("`{dst}` (filled from the GPU by `.memcpy_dtoh()`)"),
                        tensor: false,
                    });
                }
            }
        }
    }

    /// Device data an expression reads: calls that read the device, and locals bound to them.
    fn reads(&self, e: &Expr) -> Reads<'_> {
        let mut reads = Reads {
            scope: &self.scope,
            found: Vec::new(),
            direct: false,
        };
        reads.visit_expr(e);
        reads
    }

    /// Reports a condition that reads device data, and walks it.
    fn condition(&mut self, cond: &Expr) {
        let reads = self.reads(cond);
        let direct = reads.direct;
        if let Some(data) = reads.found.into_iter().next() {
            let id = if data.tensor {
                "candle-branch-on-device-data"
            } else {
                "host-branch-on-device-data"
            };
            self.report(rule(id), spans_of(cond), "", &data.how);
        }
        if direct {
            self.quiet_reads += 1;
        }
        self.visit_expr(cond);
        if direct {
            self.quiet_reads -= 1;
        }
    }

    /// What a `let` binds: each name's kind (from the annotation, else from the value, for a
    /// single name), whether it holds device data or a device buffer.
    fn declare(&mut self, pat: &syn::Pat, init: Option<&Expr>) {
        let names = bound_names(pat);
        let single = names.len() == 1;
        let kind = match (annotated_type(pat), init) {
            // Declared as a type of the user's but built around a CUDA value
            // (`let gpu: Gpu = Gpu::new(rt.stream().clone());`): not provably the user's.
            (Some(ty), Some(e)) if single && kind_of_type(ty) == Kind::Users => {
                if self.scope.wraps_cuda(e) {
                    Kind::Wraps
                } else {
                    Kind::Users
                }
            }
            (Some(ty), _) if single => kind_of_type(ty),
            (None, Some(e)) if single => self.scope.kind_of_expr(e),
            _ => Kind::Unknown,
        };
        let read = init.and_then(|e| self.reads(e).found.into_iter().next());
        let device_buffer = single && init.is_some_and(|e| self.scope.is_tensor_value(e));
        let cpu_device = single && init.is_some_and(|e| self.scope.is_cpu_device(e));
        let null_pointer = single && init.is_some_and(is_null_pointer);
        let cuda_rooted = single && init.is_some_and(|e| self.scope.is_cuda_value(e));
        let (static_ref, static_copy) = init
            .filter(|_| single)
            .and_then(|e| self.scope.static_alias(e))
            .map_or((None, false), |(n, copy)| (Some(n), copy));
        for n in names {
            let device_data = read.as_ref().map(|how| describe_read(&n, how));
            self.scope.declare(
                n,
                Binding {
                    kind,
                    param: false,
                    device_buffer,
                    device_data,
                    cpu_device,
                    null_pointer,
                    cuda_rooted,
                    static_ref: static_ref.clone(),
                    static_copy,
                },
            );
        }
    }

    /// Names bound by a pattern that carries nothing over (an arm, a closure parameter).
    fn declare_unknown(&mut self, pat: &syn::Pat) {
        for n in bound_names(pat) {
            self.scope.declare(n, Binding::unknown());
        }
    }

    /// The first of the body's device buffers that a formatting macro's arguments pass as a
    /// whole (`y`, `&y`, `?y`, `name = %y`) or name inline in a literal (`"{y:?}"`).
    /// Uses of a buffer in a larger expression (`y.len()`) are host values and pass.
    fn formatted_buffer(&self, tokens: &TokenStream) -> Option<String> {
        for arg in split_top_level(tokens, &[',']) {
            if let Some(name) = self.whole_buffer(&arg) {
                return Some(name);
            }
            for tt in &arg {
                if let TokenTree::Literal(lit) = tt {
                    if let Ok(s) = syn::parse2::<syn::LitStr>(lit.to_token_stream()) {
                        if let Some(n) = inline_args(&s.value())
                            .into_iter()
                            .find(|n| self.scope.is_device_buffer(n))
                        {
                            return Some(n);
                        }
                    }
                }
            }
        }
        None
    }

    /// Whether one macro argument is a device buffer of the body, as a whole.
    fn whole_buffer(&self, arg: &[TokenTree]) -> Option<String> {
        let mut rest = arg;
        // `name = value` (format and tracing named arguments).
        if let [TokenTree::Ident(_), TokenTree::Punct(eq), tail @ ..] = rest {
            if eq.as_char() == '=' && eq.spacing() == Spacing::Alone {
                rest = tail;
            }
        }
        loop {
            match rest {
                [TokenTree::Punct(p), tail @ ..]
                    if matches!(p.as_char(), '&' | '*' | '?' | '%') =>
                {
                    rest = tail
                }
                [TokenTree::Ident(m), tail @ ..] if m == "mut" => rest = tail,
                _ => break,
            }
        }
        match rest {
            [TokenTree::Ident(id)] => {
                let name = unraw(id);
                self.scope.is_device_buffer(&name).then_some(name)
            }
            [TokenTree::Group(g)] => {
                let inner: Vec<TokenTree> = g.stream().into_iter().collect();
                self.whole_buffer(&inner)
            }
            _ => None,
        }
    }

    /// Walks a macro's arguments, best effort: as comma-separated expressions (a named
    /// format argument `name = value` by its value), else as statements, else each piece
    /// between top-level `;`, `,` and `=>` that parses as an expression. What does not parse
    /// is not reported.
    fn macro_arguments(&mut self, tokens: &TokenStream) {
        if let Ok(exprs) = Punctuated::<Expr, Token![,]>::parse_terminated.parse2(tokens.clone()) {
            for e in &exprs {
                match e {
                    Expr::Assign(a) if plain_name(&a.left).is_some() => self.visit_expr(&a.right),
                    _ => self.visit_expr(e),
                }
            }
            return;
        }
        let statements = |input: ParseStream| syn::Block::parse_within(input);
        if let Ok(stmts) = statements.parse2(tokens.clone()) {
            // `use` items inside the invocation import names like those of the body.
            let block = syn::Block {
                brace_token: Default::default(),
                stmts,
            };
            self.imports.extend(use_aliases(&block));
            let stmts = block.stmts;
            self.scope.push();
            for s in &stmts {
                self.visit_stmt(s);
            }
            self.scope.pop();
            return;
        }
        for piece in split_top_level(tokens, &[';', ',']) {
            for part in split_arrows(piece) {
                // `name = ?expr`, `a.b = %expr`, `?expr`: tracing's field syntax, by its value.
                let stream: TokenStream = strip_named_argument(&part).iter().cloned().collect();
                if let Ok(e) = syn::parse2::<Expr>(stream) {
                    self.visit_expr(&e);
                }
            }
        }
    }
}

impl Walker {
    /// A method of a cudarc, runtime or candle type named as a value, not called
    /// (`streams.iter().for_each(CudaStream::synchronize)`, `let wait = Runtime::synchronize;`):
    /// it runs wherever the body calls it, so it is judged like the call written on the type
    /// (`CudaStream::synchronize(s)`), at the path. A path through a type of the user's
    /// (`Job::query`), or to a variant or constant (`Device::Cpu`), is not.
    fn method_as_value(&mut self, p: &syn::ExprPath, already: Vec<&'static str>) {
        let Some(last) = p.path.segments.last() else {
            return;
        };
        let name = unraw(&last.ident);
        if name.starts_with(char::is_uppercase) {
            return;
        }
        if type_of_path_call(p).is_none_or(|k| k == Kind::Unknown) {
            return;
        }
        let written = match &p.qself {
            Some(q) => format!("<{}>::{name}", q.ty.to_token_stream()),
            None => segment_names(&p.path).join("::"),
        };
        self.method_like(MethodLike {
            name,
            receiver: None,
            args: Vec::new(),
            on_known_type: true,
            span: spans_of(p),
            what: format!("`{written}` as a value"),
            already,
        });
    }

    /// A function declared in the body (or a method of an `impl` or a `trait` there): walked
    /// like the body, its parameters known by their declared types. A parameter whose type
    /// names a generic parameter of the function or of its `impl` bounded by a CUDA type
    /// (`s: S` or `w: Lane<S>` with `S: Deref<Target = CudaStream>`) is judged like a CUDA
    /// value (as `Lane<CudaStream>` is); one whose type is a generic parameter bounded
    /// otherwise (`s: S`, `s: &S`) may be anything, and is of unknown type; `self` is a value
    /// of the `impl`'s type (`self_ty`) under the same rules.
    fn function(
        &mut self,
        sig: &syn::Signature,
        block: &syn::Block,
        outer: &syn::Generics,
        self_ty: Option<&syn::Type>,
    ) {
        let params: Vec<&syn::TypeParam> = outer
            .type_params()
            .chain(sig.generics.type_params())
            .collect();
        let generics: Vec<String> = params.iter().map(|t| unraw(&t.ident)).collect();
        // The generic parameters bounded by a CUDA type (`S: Deref<Target = CudaStream>`, in
        // the list or in a where clause).
        let predicates: Vec<&syn::WherePredicate> = [outer, &sig.generics]
            .into_iter()
            .filter_map(|g| g.where_clause.as_ref())
            .flat_map(|w| &w.predicates)
            .collect();
        let cuda_generics: Vec<String> = params
            .iter()
            .filter(|t| {
                let name = unraw(&t.ident);
                let in_where = predicates.iter().any(|p| match p {
                    syn::WherePredicate::Type(pt) => {
                        names_any(&pt.bounded_ty, std::slice::from_ref(&name))
                            && pt.bounds.iter().any(is_cuda_bound)
                    }
                    _ => false,
                });
                t.bounds.iter().any(is_cuda_bound) || in_where
            })
            .map(|t| unraw(&t.ident))
            .collect();
        let kind_of = |ty: &syn::Type| match kind_of_type(ty) {
            // `Lane<S>` with `S` bounded by a CUDA type is judged like `Lane<CudaStream>`.
            Kind::Users if names_any(ty, &cuda_generics) => Kind::Cuda,
            // `s: S`, `s: &S`, `Box<S>`: anything; `Bag<S>` is a `Bag`, the user's.
            Kind::Users if is_generic_param(ty, &generics) => Kind::Unknown,
            kind => kind,
        };
        self.scope.push();
        for input in &sig.inputs {
            match input {
                syn::FnArg::Typed(t) => {
                    let kind = kind_of(&t.ty);
                    for n in bound_names(&t.pat) {
                        self.scope.declare(
                            n,
                            Binding {
                                kind,
                                ..Binding::unknown()
                            },
                        );
                    }
                }
                syn::FnArg::Receiver(_) => {
                    let kind = self_ty.map_or(Kind::Unknown, kind_of);
                    self.scope.declare(
                        "self".to_owned(),
                        Binding {
                            kind,
                            ..Binding::unknown()
                        },
                    );
                }
            }
        }
        self.visit_block(block);
        self.scope.pop();
    }

    /// Reports an assignment whose place is a `static` (`COUNT += 1`, `STATE.step = 0`).
    fn static_written<T: ToTokens>(&mut self, place: &Expr, whole: &T) {
        if let Some(stat) = self.scope.static_root(place) {
            // A copy's own value (`let mut cfg = DEFAULTS.clone(); cfg.batch = 8`): only a
            // lock or a cell reached through it writes what the static holds.
            if stat.by_copy && !through_lock(place) {
                return;
            }
            let what = match &stat.through {
                None => format!("the write to `{}`", stat.name),
                Some(local) => format!("the write to `{}` through `{local}`", stat.name),
            };
            self.match_rules(spans_of(whole), &what, |m| *m == Matcher::StaticAccess);
        }
    }

    /// A `macro_rules!` declared in the body: its rules' tokens cannot be parsed (they hold
    /// `$x`), so they are scanned for what the rules match by name: macros (`eprintln!`),
    /// methods (`.synchronize(`) and paths (`thread::spawn`).
    fn macro_rules(&mut self, tokens: &TokenStream) {
        let trees: Vec<TokenTree> = tokens.clone().into_iter().collect();
        let mut i = 0;
        while i < trees.len() {
            match &trees[i] {
                TokenTree::Group(g) => self.macro_rules(&g.stream()),
                TokenTree::Ident(id) => {
                    let next = trees.get(i + 1);
                    let name = unraw(id);
                    let punct = |t: Option<&TokenTree>, c: char| matches!(t, Some(TokenTree::Punct(p)) if p.as_char() == c);
                    let after_dot = i > 0 && punct(trees.get(i - 1), '.');
                    if punct(next, '!') && !after_dot {
                        let span = (id.span(), trees.get(i + 2).map_or(id.span(), |t| t.span()));
                        let what = format!("`{name}!`");
                        self.match_rules(
                            span,
                            &what,
                            |m| matches!(m, Matcher::Macro(n) if *n == name),
                        );
                    } else if after_dot
                        && matches!(next, Some(TokenTree::Group(g)) if g.delimiter() == proc_macro2::Delimiter::Parenthesis)
                    {
                        let span = (id.span(), next.map_or(id.span(), |t| t.span()));
                        let what = format!("`.{name}()`");
                        self.match_rules(span, &what, |m| match m {
                            Matcher::Method(n) | Matcher::LooseMethod(n) => *n == name,
                            _ => false,
                        });
                    } else if !after_dot && punct(next, ':') && punct(trees.get(i + 2), ':') {
                        // A path `a::b::c`: collect it and match it once.
                        let mut segs = vec![name];
                        let mut j = i + 3;
                        let mut last_span = id.span();
                        while let Some(TokenTree::Ident(s)) = trees.get(j) {
                            segs.push(unraw(s));
                            last_span = s.span();
                            if punct(trees.get(j + 1), ':') && punct(trees.get(j + 2), ':') {
                                j += 3;
                            } else {
                                break;
                            }
                        }
                        let what = format!("`{}`", segs.join("::"));
                        self.match_rules((id.span(), last_span), &what, |m| path_matches(m, &segs));
                        i = j;
                    }
                }
                _ => {}
            }
            i += 1;
        }
    }
}

impl<'ast> Visit<'ast> for Walker {
    /// Items declared inside the body run only when the body calls them, and only the body
    /// can: a function, a method of an `impl` and a provided method of a `trait` are walked
    /// like the body (their parameters known by their types, generic ones by their bounds:
    /// [`Walker::function`]), a `macro_rules!` by the macros, methods and paths its rules
    /// write. `use` items were read before the walk ([`use_aliases`]); other items hold no
    /// statements the body runs.
    fn visit_item(&mut self, item: &'ast syn::Item) {
        match item {
            syn::Item::Fn(f) => self.function(&f.sig, &f.block, &syn::Generics::default(), None),
            syn::Item::Macro(m) if m.mac.path.is_ident("macro_rules") => {
                self.macro_rules(&m.mac.tokens);
            }
            // Read before the walk for the body; here for those inside macro invocations.
            syn::Item::Use(u) => aliases_of_use(u, &mut self.imports),
            syn::Item::Impl(i) => {
                for it in &i.items {
                    if let syn::ImplItem::Fn(f) = it {
                        self.function(&f.sig, &f.block, &i.generics, Some(&i.self_ty));
                    }
                }
            }
            // A trait's provided methods: `self` may be any type that implements it.
            syn::Item::Trait(t) => {
                for it in &t.items {
                    if let syn::TraitItem::Fn(f) = it {
                        if let Some(block) = &f.default {
                            self.function(&f.sig, block, &t.generics, None);
                        }
                    }
                }
            }
            _ => {}
        }
    }

    /// A pattern is not a call: paths in patterns (`Sink::File =>`) name variants.
    fn visit_pat(&mut self, _: &'ast syn::Pat) {}

    fn visit_block(&mut self, b: &'ast syn::Block) {
        self.scope.push();
        visit::visit_block(self, b);
        self.scope.pop();
    }

    fn visit_expr_closure(&mut self, c: &'ast syn::ExprClosure) {
        self.scope.push();
        for input in &c.inputs {
            self.declare_unknown(input);
        }
        self.visit_expr(&c.body);
        self.scope.pop();
    }

    fn visit_expr_method_call(&mut self, m: &'ast syn::ExprMethodCall) {
        let name = unraw(&m.method);
        self.method_like(MethodLike {
            what: format!("`.{name}()`"),
            name,
            receiver: Some(&m.receiver),
            args: m.args.iter().collect(),
            on_known_type: false,
            span: (m.method.span(), m.paren_token.span.close()),
            already: Vec::new(),
        });
        visit::visit_expr_method_call(self, m);
    }

    fn visit_expr_call(&mut self, c: &'ast syn::ExprCall) {
        let Expr::Path(p) = &*c.func else {
            visit::visit_expr_call(self, c);
            return;
        };
        let segs = segment_names(&p.path);
        if p.qself.is_none()
            && p.path.leading_colon.is_none()
            && segs.len() == 1
            && !self.imports.contains_key(&segs[0])
        {
            let name = &segs[0];
            let what = format!("`{name}()`");
            let closures = c.args.iter().filter(|a| is_closure(a)).count();
            let n_args = c.args.len();
            let one_mut_ref = n_args == 1
                && matches!(c.args.first(), Some(Expr::Reference(r)) if r.mutability.is_some());
            let str_first = matches!(
                c.args.first(),
                Some(Expr::Lit(syn::ExprLit {
                    lit: syn::Lit::Str(_),
                    ..
                }))
            );
            self.match_rules(spans_of(c), &what, |m| match m {
                Matcher::BareCall(n) => n == name,
                Matcher::BareClosureCall(n, k) => n == name && n_args == *k && closures == *k,
                Matcher::BareMutRefCall(n) => n == name && one_mut_ref,
                Matcher::BareStrCall(n) => n == name && str_first,
                _ => false,
            });
        }
        if let Some(last) = segs.last() {
            let args: Vec<&Expr> = c.args.iter().collect();
            // `…_async` of cudarc's `result` layer (not a function of the user's that
            // happens to end so).
            let raw_layer = segs
                .iter()
                .any(|s| matches!(s.as_str(), "result" | "sys" | "cudarc"))
                || ["memcpy_", "memset_", "malloc_", "free_"]
                    .iter()
                    .any(|p| last.starts_with(p))
                || last.starts_with("cu");
            let stream_arg = stream_argument(without_version_suffix(last), &args)
                .filter(|_| raw_layer || last == "launch_kernel");
            if let Some(stream) = stream_arg {
                let null_local = plain_name(stream)
                    .and_then(|n| self.scope.get(&n))
                    .is_some_and(|b| b.null_pointer);
                if is_null_pointer(stream) || null_local {
                    let what = format!("the null stream given to `{}`", segs.join("::"));
                    self.match_rules(spans_of(c), &what, |m| *m == Matcher::NullStream);
                }
            }
        }
        // A called path is matched here, once, with the method rules of a call written on a
        // type (`CudaStream::synchronize(s)`); its segments are not visited again.
        let hit = self.match_path(&p.path);
        if let (Some(kind), Some(name)) = (type_of_path_call(p), segs.last()) {
            let what = match &p.qself {
                Some(q) => format!("`<{}>::{name}`", q.ty.to_token_stream()),
                None => format!("`{}`", segs.join("::")),
            };
            self.method_like(MethodLike {
                name: name.clone(),
                receiver: c.args.first(),
                args: c.args.iter().skip(1).collect(),
                on_known_type: kind != Kind::Unknown,
                span: spans_of(c),
                what,
                already: hit,
            });
        }
        if let [.., ty, f] = segs.as_slice() {
            if f == "capture" && ty.ends_with("Graph") && ty.len() > "Graph".len() {
                let what = format!("`{ty}::capture`");
                self.match_rules(spans_of(c), &what, |m| *m == Matcher::NestedGraphCapture);
            }
        }
        for a in &c.args {
            self.visit_expr(a);
        }
    }

    fn visit_expr_path(&mut self, p: &'ast syn::ExprPath) {
        // A one-segment path is a local variable unless it is called (see `visit_expr_call`).
        if p.path.segments.len() > 1 || p.qself.is_some() {
            let hit = self.match_path(&p.path);
            self.method_as_value(p, hit);
        }
        visit::visit_expr_path(self, p);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        let Some(last) = mac.path.segments.last() else {
            return;
        };
        let name = unraw(&last.ident);
        // The user's word that the statement does the same on every replay as at capture.
        if name == OPT_OUT_MACRO {
            self.opt_out += 1;
            self.macro_arguments(&mac.tokens);
            self.opt_out -= 1;
            return;
        }
        let what = format!("`{name}!`");
        let span = (
            mac.path
                .segments
                .first()
                .map_or_else(|| last.ident.span(), |s| s.ident.span()),
            mac.delimiter.span().close(),
        );
        // The arguments first: a device read inside a `println!` is the error to fix first,
        // and the print's own fix (the host-effects opt-in) does not fix it.
        self.macro_arguments(&mac.tokens);
        if FORMATTING_MACROS.contains(&name.as_str()) {
            if let Some(buf) = self.formatted_buffer(&mac.tokens) {
                let data = format!("`{buf}`");
                self.report(rule("device-value-formatted"), span, &what, &data);
                return;
            }
        }
        let words: Vec<&str> = name.split('_').collect();
        let std_assert = name.starts_with("debug_assert");
        self.match_rules(span, &what, |m| match m {
            Matcher::Macro(n) => *n == name,
            // A span (`tracing::trace_span!`, `debug_span!`) prints nothing by itself.
            Matcher::MacroWord(w) => {
                !std_assert
                    && !FORMATTING_MACROS.contains(&name.as_str())
                    && words.contains(w)
                    && !words.contains(&"span")
            }
            _ => false,
        });
    }

    fn visit_local(&mut self, l: &'ast syn::Local) {
        for a in &l.attrs {
            self.visit_attribute(a);
        }
        if let Some(init) = &l.init {
            if init.diverge.is_some() {
                self.condition(&init.expr);
            } else {
                self.visit_expr(&init.expr);
            }
            if let Some((_, diverge)) = &init.diverge {
                self.visit_expr(diverge);
            }
        }
        self.declare(&l.pat, l.init.as_ref().map(|i| &*i.expr));
    }

    fn visit_expr_let(&mut self, l: &'ast syn::ExprLet) {
        self.visit_expr(&l.expr);
        self.declare_unknown(&l.pat);
    }

    fn visit_expr_binary(&mut self, b: &'ast syn::ExprBinary) {
        use syn::BinOp::*;
        let compound = matches!(
            b.op,
            AddAssign(_)
                | SubAssign(_)
                | MulAssign(_)
                | DivAssign(_)
                | RemAssign(_)
                | BitXorAssign(_)
                | BitAndAssign(_)
                | BitOrAssign(_)
                | ShlAssign(_)
                | ShrAssign(_)
        );
        if compound {
            self.static_written(&b.left, b);
        }
        visit::visit_expr_binary(self, b);
    }

    fn visit_expr_assign(&mut self, a: &'ast syn::ExprAssign) {
        self.static_written(&a.left, a);
        self.visit_expr(&a.right);
        self.visit_expr(&a.left);
        if let Some(name) = plain_name(&a.left) {
            let read = self.reads(&a.right).found.into_iter().next();
            let alloc = self.scope.is_tensor_value(&a.right);
            let kind = self.scope.kind_of_expr(&a.right);
            let cpu_device = self.scope.is_cpu_device(&a.right);
            if let Some(b) = self.scope.assign(&name) {
                b.device_data = read.map(|how| describe_read(&name, &how));
                b.device_buffer |= alloc;
                b.cpu_device = cpu_device;
                if b.kind == Kind::Unknown {
                    b.kind = kind;
                }
            }
        }
    }

    fn visit_expr_if(&mut self, i: &'ast syn::ExprIf) {
        // `if let` bindings live in the then-branch only.
        self.scope.push();
        self.condition(&i.cond);
        self.visit_block(&i.then_branch);
        self.scope.pop();
        if let Some((_, e)) = &i.else_branch {
            self.visit_expr(e);
        }
    }

    fn visit_expr_while(&mut self, w: &'ast syn::ExprWhile) {
        self.scope.push();
        self.condition(&w.cond);
        self.visit_block(&w.body);
        self.scope.pop();
    }

    fn visit_expr_match(&mut self, m: &'ast syn::ExprMatch) {
        self.condition(&m.expr);
        for arm in &m.arms {
            self.visit_arm(arm);
        }
    }

    fn visit_arm(&mut self, arm: &'ast syn::Arm) {
        self.scope.push();
        self.declare_unknown(&arm.pat);
        // syn 3 keeps an arm's guard in its pattern; the guard decides on the host like a
        // condition.
        if let syn::Pat::Guard(g) = &arm.pat {
            self.condition(&g.guard);
        }
        self.visit_expr(&arm.body);
        self.scope.pop();
    }

    fn visit_expr_for_loop(&mut self, f: &'ast syn::ExprForLoop) {
        self.condition(&f.expr);
        self.scope.push();
        self.declare_unknown(&f.pat);
        self.visit_block(&f.body);
        self.scope.pop();
    }
}

/// Finds device data in an expression: reads from the device, and locals bound to them.
struct Reads<'s> {
    scope: &'s Scope,
    /// Each, in order.
    found: Vec<DeviceData>,
    /// Whether one of them is a read written right there.
    direct: bool,
}

impl<'ast> Visit<'ast> for Reads<'_> {
    fn visit_expr_method_call(&mut self, m: &'ast syn::ExprMethodCall) {
        let name = unraw(&m.method);
        let known = !self.scope.is_users_own(&m.receiver);
        let cudarc = DEVICE_READS.contains(&name.as_str());
        let tensor = CANDLE_READS.contains(&name.as_str())
            || (CANDLE_TO_CPU.contains(&name.as_str())
                && m.args.first().is_some_and(|a| self.scope.is_cpu_device(a)));
        if known && (cudarc || tensor) {
            self.found.push(DeviceData {
                how: format!("the result of `.{name}()`"),
                tensor,
            });
            self.direct = true;
        }
        visit::visit_expr_method_call(self, m);
    }

    fn visit_expr_path(&mut self, p: &'ast syn::ExprPath) {
        if let Some(name) = p.path.get_ident().filter(|_| p.qself.is_none()) {
            if let Some(data) = self.scope.device_data(&unraw(name)) {
                self.found.push(data.clone());
            }
        }
    }

    fn visit_expr_closure(&mut self, _: &'ast syn::ExprClosure) {}

    fn visit_item(&mut self, _: &'ast syn::Item) {}
}

/// For a call written as a path on a type (`CudaStream::synchronize(s)`, `<T as X>::f(s)`),
/// what the type is known to be; `None` for other calls and for types of the user's own
/// (whose functions are the user's). The type is the segment before the function, and must
/// look like one (capitalised), so that `thread::spawn` is not taken for a method.
fn type_of_path_call(p: &syn::ExprPath) -> Option<Kind> {
    let kind = match &p.qself {
        Some(q) => kind_of_type(&q.ty),
        None => {
            let mut ty = p.path.clone();
            ty.segments.pop()?;
            ty.segments.pop_punct();
            let last = ty.segments.last()?;
            if !unraw(&last.ident).starts_with(char::is_uppercase) {
                return None;
            }
            kind_of_type(&syn::Type::Path(syn::TypePath {
                attrs: Vec::new(),
                qself: None,
                path: ty,
            }))
        }
    };
    (kind != Kind::Users).then_some(kind)
}

/// Whether a bound of a generic parameter names a CUDA type (`Deref<Target = CudaStream>`,
/// `AsRef<CudaEvent>`).
fn is_cuda_bound(bound: &syn::TypeParamBound) -> bool {
    match bound {
        syn::TypeParamBound::Trait(t) => {
            let ty = syn::Type::Path(syn::TypePath {
                attrs: Vec::new(),
                qself: None,
                path: t.path.clone(),
            });
            kind_of_type(&ty) == Kind::Cuda
        }
        _ => false,
    }
}

/// Whether a type is one of these generic parameters, behind references and the standard
/// wrappers: `S`, `&S`, `Box<S>`, not `Lane<S>`.
fn is_generic_param(ty: &syn::Type, names: &[String]) -> bool {
    match ty {
        syn::Type::Reference(r) => is_generic_param(&r.elem, names),
        syn::Type::Paren(p) => is_generic_param(&p.elem, names),
        syn::Type::Group(g) => is_generic_param(&g.elem, names),
        syn::Type::Path(p) if p.qself.is_none() => {
            if let Some(i) = p.path.get_ident() {
                return names.contains(&unraw(i));
            }
            let Some(last) = p.path.segments.last() else {
                return false;
            };
            let wrapper = [
                "Arc", "Rc", "Box", "RefCell", "Cell", "Mutex", "RwLock", "Option",
            ]
            .contains(&unraw(&last.ident).as_str());
            match &last.arguments {
                syn::PathArguments::AngleBracketed(a) if wrapper => match a.args.first() {
                    Some(syn::GenericArgument::Type(inner)) => is_generic_param(inner, names),
                    _ => false,
                },
                _ => false,
            }
        }
        // `<S as Trait>::Out`, `S::Target`: a type reached through one.
        syn::Type::Path(_) => names_any(ty, names),
        _ => false,
    }
}

/// Whether a type names any of these (generic parameters): `S`, `&S`, `Lane<S>`.
fn names_any(ty: &syn::Type, names: &[String]) -> bool {
    struct Names<'n>(&'n [String], bool);
    impl<'ast> Visit<'ast> for Names<'_> {
        fn visit_ident(&mut self, i: &'ast proc_macro2::Ident) {
            self.1 |= self.0.contains(&unraw(i));
        }
    }
    if names.is_empty() {
        return false;
    }
    let mut v = Names(names, false);
    v.visit_type(ty);
    v.1
}

/// How a local holding device data is described in a message.
fn describe_read(name: &str, data: &DeviceData) -> DeviceData {
    let how = match data.how.strip_prefix("the result of ") {
        Some(call) => format!("`{name}` (read back from the GPU by {call})"),
        None => format!("`{name}`, computed from {}", data.how),
    };
    DeviceData {
        how,
        tensor: data.tensor,
    }
}

/// The field access an expression is, through `&`, `&mut`, `*` and parentheses:
/// `&mut stage.host` → `stage.host`.
fn field_of(e: &Expr) -> Option<&Expr> {
    match e {
        Expr::Field(_) => Some(e),
        Expr::Reference(r) => field_of(&r.expr),
        Expr::Unary(u) => field_of(&u.expr),
        Expr::Paren(p) => field_of(&p.expr),
        _ => None,
    }
}

/// Whether a place is reached through a lock or a cell's borrow (`*s.lock().unwrap()`).
fn through_lock(e: &Expr) -> bool {
    match e {
        Expr::MethodCall(m) => super::scope::is_lock(m) || through_lock(&m.receiver),
        Expr::Unary(u) => through_lock(&u.expr),
        Expr::Paren(p) => through_lock(&p.expr),
        Expr::Group(g) => through_lock(&g.expr),
        Expr::Field(f) => through_lock(&f.base),
        Expr::Index(i) => through_lock(&i.expr),
        Expr::Try(t) => through_lock(&t.expr),
        _ => false,
    }
}
