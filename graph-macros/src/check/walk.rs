//! The walker: visits a body with [`syn::visit`] and asks the rule table about every method
//! call, path, macro and condition, keeping the names it passes in a block-scoped
//! [`Scope`].
//!
//! Imports the rules, `scope.rs`, `syntax.rs`, `finding.rs` and `tokens` (names); never
//! this folder's `mod.rs`, which drives it.

use proc_macro2::{Spacing, Span, TokenStream, TokenTree};
use quote::ToTokens;
use syn::parse::{ParseStream, Parser};
use syn::punctuated::Punctuated;
use syn::visit::{self, Visit};
use syn::{Expr, Token};

use super::finding::Finding;
use super::rules::{
    path_matches, rule, Matcher, Rule, CANDLE_READS, CANDLE_TO_CPU, DEVICE_ALLOCS, DEVICE_READS,
    FORMATTING_MACROS, RULES,
};
use super::scope::{annotated_type, bound_names, kind_of_type, Binding, DeviceData, Kind, Scope};
use super::syntax::{
    calls_any, compact, inline_args, plain_name, root_name, spans_of, split_arrows, split_top_level,
};
use crate::tokens::{segment_names, unraw};

pub struct Walker {
    host_effects: bool,
    scope: Scope,
    /// Above zero while walking a condition already reported as a whole: its reads are
    /// part of that error.
    quiet_reads: usize,
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
    pub fn new(scope: Scope, host_effects: bool) -> Self {
        Walker {
            host_effects,
            scope,
            quiet_reads: 0,
            findings: Vec::new(),
        }
    }

    fn report(&mut self, rule: &'static Rule, span: (Span, Span), what: &str, data: &str) {
        if rule.host_effect && self.host_effects {
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

    /// Reports the path rules a path matches.
    fn match_path(&mut self, path: &syn::Path) -> Vec<&'static str> {
        let segs = segment_names(path);
        let what = format!("`{}`", segs.join("::"));
        self.match_rules(spans_of(path), &what, |m| path_matches(m, &segs))
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
        if !users_own {
            for r in RULES {
                let by_cpu_arg =
                    to_cpu.is_some() && r.has(|m| matches!(m, Matcher::ToCpu(n) if *n == name));
                let hit = by_cpu_arg
                    || r.has(|m| match m {
                        Matcher::Method(n) => *n == name,
                        Matcher::MethodNoArgs(n) => *n == name && args.is_empty(),
                        _ => false,
                    });
                if hit && !already.contains(&r.id) && !(pinned_source && r.id == "host-to-device") {
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
        if let Some(recv) = receiver.and_then(root_name) {
            let (pinned, collection) = match self.scope.get(&recv) {
                Some(b) => (
                    b.kind == Kind::PinnedHost,
                    b.kind == Kind::HostCollection && b.param,
                ),
                None => (false, false),
            };
            let data = format!("`{recv}`");
            for r in RULES {
                let hit = r.has(|m| match m {
                    Matcher::PinnedMethod(n) => pinned && *n == name,
                    Matcher::CollectionParamMethod(n) => collection && *n == name,
                    _ => false,
                });
                if hit {
                    self.report(r, span, &what, &data);
                }
            }
        }
        if name == "memcpy_dtoh" && !users_own {
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
            (Some(ty), _) if single => kind_of_type(ty),
            (None, Some(e)) if single => self.scope.kind_of_expr(e),
            _ => Kind::Unknown,
        };
        let read = init.and_then(|e| self.reads(e).found.into_iter().next());
        let device_buffer = init.is_some_and(|e| {
            calls_any(e, DEVICE_ALLOCS)
                || (single && plain_name(e).is_some_and(|n| self.scope.is_device_buffer(&n)))
        });
        let cpu_device = single && init.is_some_and(|e| self.scope.is_cpu_device(e));
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
            self.scope.push();
            for s in &stmts {
                self.visit_stmt(s);
            }
            self.scope.pop();
            return;
        }
        for piece in split_top_level(tokens, &[';', ',']) {
            for part in split_arrows(piece) {
                let stream: TokenStream = part.into_iter().collect();
                if let Ok(e) = syn::parse2::<Expr>(stream) {
                    self.visit_expr(&e);
                }
            }
        }
    }
}

impl<'ast> Visit<'ast> for Walker {
    /// Items declared inside the body are helpers: not walked.
    fn visit_item(&mut self, _: &'ast syn::Item) {}

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
        if p.qself.is_none() && p.path.leading_colon.is_none() && segs.len() == 1 {
            let name = &segs[0];
            let what = format!("`{name}()`");
            self.match_rules(
                spans_of(c),
                &what,
                |m| matches!(m, Matcher::BareCall(n) if n == name),
            );
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
        if p.path.segments.len() > 1 {
            self.match_path(&p.path);
        }
        visit::visit_expr_path(self, p);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        let Some(last) = mac.path.segments.last() else {
            return;
        };
        let name = unraw(&last.ident);
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
        self.match_rules(
            span,
            &what,
            |m| matches!(m, Matcher::Macro(n) if *n == name),
        );
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

    fn visit_expr_assign(&mut self, a: &'ast syn::ExprAssign) {
        self.visit_expr(&a.right);
        self.visit_expr(&a.left);
        if let Some(name) = plain_name(&a.left) {
            let read = self.reads(&a.right).found.into_iter().next();
            let alloc = calls_any(&a.right, DEVICE_ALLOCS);
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
