//! The attribute's arguments:
//! `#[cuda_graph(warmup = 3, mode = "global", crate = "path", host_effects_not_replayed)]`.
//!
//! Owns the attribute's keys and how each is read (the `buckets(…)` key in
//! `args/buckets.rs`; the literal helpers both use in `args/lit.rs`). Imports only `ctxt`
//! and its own files; never `model`, `check` or `expand`.

use proc_macro2::Span;
use syn::parse::Parser;
use syn::punctuated::Punctuated;
use syn::{Expr, ExprLit, Lit, Meta, Token};

use crate::ctxt::{Ctxt, Message};

pub mod buckets;
mod lit;

use lit::{boolean, integer, literal, string};

/// The opt-in that lets a body print, log, do I/O, sleep or read clocks. Its name states the
/// consequence: those effects run in the warmup runs and the capture, never on replay.
pub const HOST_EFFECTS_KEY: &str = "host_effects_not_replayed";

/// Every key `#[cuda_graph]` accepts, in the order the error messages list them: the only
/// place that spells them (the unknown-key check, the hint and the messages read it).
const KEYS: [&str; 10] = [
    "warmup",
    "mode",
    "name",
    "crate",
    HOST_EFFECTS_KEY,
    "buckets",
    "verify",
    "verify_every",
    "verify_tolerance",
    "check_determinism",
];

/// The keys as the error messages list them: `` `warmup`, `mode`, … ``.
pub fn valid_keys() -> String {
    KEYS.map(|k| format!("`{k}`")).join(", ")
}

/// Warmup runs when the attribute does not say (PyTorch's `make_graphed_callables` uses 3).
pub const DEFAULT_WARMUP: u32 = 3;

/// Parsed attribute arguments; a key that was not given is `None`.
#[derive(Default)]
pub struct GraphArgs {
    pub warmup: Option<(u32, Span)>,
    pub mode: Option<(CaptureMode, Span)>,
    pub krate: Option<syn::Path>,
    /// `name = Decode`: what the generated types' names start with (`DecodeGraph`,
    /// `DecodeInputs`, …) instead of the function's name in camel case.
    pub name: Option<syn::Ident>,
    /// `host_effects_not_replayed` was given (and not `= false`).
    pub host_effects: bool,
    /// `buckets(batch = [...])`: one graph per batch size.
    pub buckets: Option<buckets::BucketArgs>,
    /// `verify = "never" | "first" | "doubling" | "every"` / `verify_every = N`: which replays verify
    /// themselves (`None`: the first in debug builds, none in release builds).
    pub verify: Option<VerifyEvery>,
    /// `verify_tolerance = 1e-5`: the tolerance of self-verifying replays (absolute and
    /// relative); bitwise when not given.
    pub verify_tolerance: Option<f64>,
    /// `check_determinism = true | false` (`None`: on in debug builds).
    pub check_determinism: Option<bool>,
}

/// Which replays verify themselves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VerifyEvery {
    Never,
    First,
    Doubling,
    Every(u64),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CaptureMode {
    Global,
    ThreadLocal,
    Relaxed,
}

impl CaptureMode {
    pub fn variant(self) -> &'static str {
        match self {
            CaptureMode::Global => "Global",
            CaptureMode::ThreadLocal => "ThreadLocal",
            CaptureMode::Relaxed => "Relaxed",
        }
    }
}

impl GraphArgs {
    pub fn warmup(&self) -> u32 {
        self.warmup.map_or(DEFAULT_WARMUP, |(n, _)| n)
    }

    pub fn mode(&self) -> CaptureMode {
        self.mode.map_or(CaptureMode::ThreadLocal, |(m, _)| m)
    }

    /// The path generated code uses to reach the runtime crate.
    pub fn krate(&self) -> syn::Path {
        self.krate
            .clone()
            .unwrap_or_else(|| syn::parse_quote!(::graph_runtime))
    }
}

/// Parses the attribute's arguments, recording every problem in `cx` and keeping whatever
/// was valid.
pub fn parse(tokens: proc_macro2::TokenStream, cx: &mut Ctxt) -> GraphArgs {
    let mut args = GraphArgs::default();
    let valid_keys = valid_keys();
    let metas = match Punctuated::<Meta, Token![,]>::parse_terminated.parse2(tokens) {
        Ok(metas) => metas,
        Err(e) => {
            cx.error_at(
                e.span(),
                Message::new(format!("malformed `#[cuda_graph]` arguments: {e}")).fix(format!(
                    "write `key = value` pairs separated by commas, with keys from {valid_keys}, e.g. \
                     `#[cuda_graph(warmup = 3)]`"
                )),
            );
            return args;
        }
    };
    let mut seen: Vec<String> = Vec::new();
    for meta in &metas {
        let Some(key) = meta.path().get_ident().map(ToString::to_string) else {
            cx.error_spanned_by(
                meta.path(),
                Message::new("unknown `#[cuda_graph]` key")
                    .fix(format!("expected one of: {valid_keys}")),
            );
            continue;
        };
        if !KEYS.contains(&key.as_str()) {
            let mut message = Message::new(format!("unknown `#[cuda_graph]` key `{key}`"));
            if let Some(hint) = hint(&key) {
                message = message.fix(hint);
            }
            cx.error_spanned_by(
                meta.path(),
                message.fix(format!("expected one of: {valid_keys}")),
            );
            continue;
        }
        if seen.contains(&key) {
            cx.error_spanned_by(
                meta.path(),
                Message::new(format!("`{key}` set multiple times")).fix("give each key once"),
            );
            continue;
        }
        seen.push(key.clone());
        if key == HOST_EFFECTS_KEY {
            args.host_effects = flag(
                meta,
                cx,
                &Message::new(format!("`{HOST_EFFECTS_KEY}` is a flag")).fix(format!(
                    "write `{HOST_EFFECTS_KEY}` (or `= true` / `= false`)"
                )),
                &Message::new(format!("`{HOST_EFFECTS_KEY}` is a flag and takes no list"))
                    .fix(format!("write `{HOST_EFFECTS_KEY}`")),
            )
            .unwrap_or_default();
            continue;
        }
        if key == "check_determinism" {
            args.check_determinism = flag(
                meta,
                cx,
                &Message::new("`check_determinism` is `true` or `false`")
                    .why("on by default in debug builds, it captures twice and compares the recordings")
                    .fix("write `check_determinism = true` or `check_determinism = false`"),
                &Message::new("`check_determinism` takes `= true` or `= false`"),
            );
            continue;
        }
        if key == "buckets" {
            match &meta {
                Meta::List(list) => args.buckets = buckets::parse(list, cx),
                _ => cx.error_spanned_by(
                    meta,
                    Message::new("`buckets` takes a list")
                        .fix("write `buckets(batch = [1, 2, 4, 8])`, naming the batch parameter"),
                ),
            }
            continue;
        }
        let value = match &meta {
            Meta::NameValue(nv) => &nv.value,
            _ => {
                cx.error_spanned_by(
                    meta,
                    Message::new(format!("`{key}` needs a value"))
                        .fix(format!("write `{key} = {}`", example(&key))),
                );
                continue;
            }
        };
        match key.as_str() {
            "warmup" => parse_warmup(value, cx, &mut args),
            "mode" => parse_mode(value, cx, &mut args),
            "crate" => parse_crate(value, cx, &mut args),
            "name" => parse_name(value, cx, &mut args),
            "verify" => parse_verify(value, cx, &mut args),
            "verify_every" => parse_verify_every(value, cx, &mut args),
            "verify_tolerance" => parse_verify_tolerance(value, cx, &mut args),
            _ => unreachable!("checked against the key list above"),
        }
    }
    args
}

/// A "did you mean" fix for an unknown key: a valid key one or two edits away, or the
/// host-effects opt-in for keys that look like an attempt at it.
fn hint(key: &str) -> Option<String> {
    let lower = key.to_ascii_lowercase();
    let about_effects = lower.split('_').any(|part| {
        ["host", "effect", "print", "log", "println"]
            .iter()
            .any(|w| part.starts_with(w))
            || part == "io"
    });
    if about_effects {
        return Some(format!(
            "to allow printing, logging, I/O, sleeping or clock reads in the body, write \
             `{HOST_EFFECTS_KEY}`: they then run during warmup and capture, never on replay"
        ));
    }
    KEYS.iter()
        .filter(|k| edit_distance(&lower, k) <= 2)
        .min_by_key(|k| edit_distance(&lower, k))
        .map(|k| format!("did you mean `{k}`?"))
}

/// Levenshtein distance, for the key hint.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = if ca == *cb {
                prev
            } else {
                1 + prev.min(cur).min(row[j])
            };
            prev = cur;
        }
    }
    row[b.len()]
}

/// A flag key: alone it is `true`, `key = true` or `key = false` says which. Anything else
/// is an error spanning the value (`not_a_bool`) or the list (`a_list`).
fn flag(meta: &Meta, cx: &mut Ctxt, not_a_bool: &Message, a_list: &Message) -> Option<bool> {
    match meta {
        Meta::Path(_) => Some(true),
        Meta::NameValue(nv) => literal(&nv.value, cx, not_a_bool, boolean).map(|b| b.value),
        Meta::List(_) => {
            cx.error_spanned_by(meta, a_list.clone());
            None
        }
    }
}

fn example(key: &str) -> &'static str {
    match key {
        "warmup" => "3",
        "mode" => "\"thread_local\"",
        "verify" => "\"first\"",
        "verify_every" => "100",
        "verify_tolerance" => "1e-5",
        "name" => "DecodeStep",
        _ => "\"graph_runtime\"",
    }
}

fn parse_warmup(value: &Expr, cx: &mut Ctxt, args: &mut GraphArgs) {
    let expected = Message::new("`warmup` must be an integer literal").fix("e.g. `warmup = 3`");
    let Some(n) = literal(value, cx, &expected, integer) else {
        return;
    };
    match n.base10_parse::<u32>() {
        Ok(0) => cx.error_spanned_by(
            n,
            Message::new("`warmup` must be at least 1")
                .why(
                    "without an eager run before capture, one-time work (NVRTC compilation, module \
                     loading, cuBLAS setup, first allocations) would happen inside the capture and fail \
                     it or be baked into the graph",
                )
                .fix("use `warmup = 1` or more (3 is the usual choice)"),
        ),
        Ok(w) => args.warmup = Some((w, n.span())),
        Err(_) => cx.error_spanned_by(
            n,
            Message::new("`warmup` must be a whole number between 1 and 4294967295"),
        ),
    }
}

fn parse_mode(value: &Expr, cx: &mut Ctxt, args: &mut GraphArgs) {
    let expected = Message::new("`mode` must be a string")
        .fix("write \"thread_local\" (the default), \"global\" or \"relaxed\"");
    let Some(s) = literal(value, cx, &expected, string) else {
        return;
    };
    let mode = match s.value().as_str() {
        "global" => CaptureMode::Global,
        "thread_local" => CaptureMode::ThreadLocal,
        "relaxed" => CaptureMode::Relaxed,
        other => {
            cx.error_spanned_by(
                s,
                Message::new(format!("unknown capture mode \"{other}\""))
                    .fix("expected \"thread_local\" (the default), \"global\" or \"relaxed\""),
            );
            return;
        }
    };
    args.mode = Some((mode, s.span()));
}

fn parse_verify(value: &Expr, cx: &mut Ctxt, args: &mut GraphArgs) {
    let expected = Message::new("`verify` must be a string").fix(
        "write \"never\", \"first\", \"doubling\" (replays 1, 2, 4, …: the default in debug builds) or \
         \"every\"",
    );
    let Some(s) = literal(value, cx, &expected, string) else {
        return;
    };
    let every = match s.value().as_str() {
        "never" => VerifyEvery::Never,
        "first" => VerifyEvery::First,
        "doubling" => VerifyEvery::Doubling,
        "every" => VerifyEvery::Every(1),
        other => {
            cx.error_spanned_by(
                s,
                Message::new(format!("unknown `verify` value \"{other}\"")).fix(
                    "expected \"never\", \"first\", \"doubling\" or \"every\" (or `verify_every = N`)",
                ),
            );
            return;
        }
    };
    if args.verify.is_some() {
        cx.error_spanned_by(value, both_verify_keys());
        return;
    }
    args.verify = Some(every);
}

fn parse_verify_every(value: &Expr, cx: &mut Ctxt, args: &mut GraphArgs) {
    let expected =
        Message::new("`verify_every` must be an integer").fix("e.g. `verify_every = 100`");
    let Some(n) = literal(value, cx, &expected, integer) else {
        return;
    };
    match n.base10_parse::<u64>() {
        Ok(0) | Err(_) => cx.error_spanned_by(
            n,
            Message::new("`verify_every` must be at least 1")
                .fix("write `verify = \"never\"` to turn verification off"),
        ),
        Ok(_) if args.verify.is_some() => cx.error_spanned_by(value, both_verify_keys()),
        Ok(k) => args.verify = Some(VerifyEvery::Every(k)),
    }
}

fn parse_verify_tolerance(value: &Expr, cx: &mut Ctxt, args: &mut GraphArgs) {
    let parsed = match value {
        Expr::Lit(ExprLit {
            lit: Lit::Float(f), ..
        }) => f.base10_parse::<f64>().ok(),
        Expr::Lit(ExprLit {
            lit: Lit::Int(i), ..
        }) => i.base10_parse::<f64>().ok(),
        _ => None,
    };
    match parsed {
        Some(t) if t >= 0.0 && t.is_finite() => args.verify_tolerance = Some(t),
        _ => cx.error_spanned_by(
            value,
            Message::new("`verify_tolerance` must be a non-negative number").fix(
                "e.g. `verify_tolerance = 1e-5` (absolute and relative); leave it out for bitwise \
                 comparisons",
            ),
        ),
    }
}

/// Both `verify` and `verify_every` were given.
fn both_verify_keys() -> Message {
    Message::new("give `verify` or `verify_every`, not both")
}

fn parse_name(value: &Expr, cx: &mut Ctxt, args: &mut GraphArgs) {
    let one_identifier = || {
        Message::new("`name` is the start of the generated types' names, one identifier").fix(
            "write `name = DecodeStep` for `DecodeStepGraph`, `DecodeStepInputs`, \
             `DecodeStepOutputs` and `DecodeStepState`",
        )
    };
    match value {
        Expr::Path(p) if p.qself.is_none() && p.attrs.is_empty() => match p.path.get_ident() {
            Some(ident) => args.name = Some(ident.clone()),
            None => cx.error_spanned_by(value, one_identifier()),
        },
        _ => cx.error_spanned_by(value, one_identifier()),
    }
}

fn parse_crate(value: &Expr, cx: &mut Ctxt, args: &mut GraphArgs) {
    let expected = Message::new("`crate` must be a string naming the runtime crate")
        .fix("e.g. `crate = \"graph_runtime\"`");
    let Some(s) = literal(value, cx, &expected, string) else {
        return;
    };
    match s.parse::<syn::Path>() {
        Ok(mut p) => {
            if p.leading_colon.is_none() && p.segments.len() == 1 && p.segments[0].ident != "crate"
            {
                p.leading_colon = Some(Default::default());
            }
            args.krate = Some(p);
        }
        Err(_) => cx.error_spanned_by(
            s,
            Message::new("`crate` must name a path").fix("e.g. `crate = \"graph_runtime\"`"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quote::quote;

    fn parse_str(tokens: proc_macro2::TokenStream) -> (GraphArgs, Vec<String>) {
        let mut cx = Ctxt::default();
        let args = parse(tokens, &mut cx);
        (args, cx.messages())
    }

    #[test]
    fn empty_means_defaults() {
        let (args, errors) = parse_str(quote!());
        assert!(errors.is_empty());
        assert_eq!(args.warmup(), DEFAULT_WARMUP);
        assert_eq!(args.mode(), CaptureMode::ThreadLocal);
    }

    #[test]
    fn all_keys() {
        let (args, errors) = parse_str(quote!(warmup = 7, mode = "global", crate = "my_rt"));
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(args.warmup(), 7);
        assert_eq!(args.mode(), CaptureMode::Global);
        let p = args.krate();
        assert_eq!(quote!(#p).to_string(), ":: my_rt");
    }

    #[test]
    fn warmup_zero_is_refused() {
        let (_, errors) = parse_str(quote!(warmup = 0));
        assert_eq!(errors.len(), 1);
        assert!(errors[0].contains("at least 1"), "{errors:?}");
    }

    #[test]
    fn every_error_is_reported() {
        let (args, errors) = parse_str(quote!(
            warmup = 0,
            warmpu = 3,
            mode = "fast",
            warmup = 2,
            mode = "global"
        ));
        assert_eq!(errors.len(), 5, "{errors:?}");
        assert!(errors[0].contains("at least 1"));
        assert!(
            errors[1].contains("unknown `#[cuda_graph]` key `warmpu`")
                && errors[1].contains(&valid_keys())
        );
        assert!(errors[2].contains("unknown capture mode \"fast\""));
        assert!(errors[3].contains("`warmup` set multiple times"));
        assert!(errors[4].contains("`mode` set multiple times"));
        assert_eq!(args.warmup(), DEFAULT_WARMUP);
    }

    #[test]
    fn host_effects_opt_in() {
        let (args, errors) = parse_str(quote!());
        assert!(errors.is_empty() && !args.host_effects);
        let (args, errors) = parse_str(quote!(warmup = 2, host_effects_not_replayed));
        assert!(errors.is_empty(), "{errors:?}");
        assert!(args.host_effects);
        let (args, errors) = parse_str(quote!(host_effects_not_replayed = true));
        assert!(errors.is_empty() && args.host_effects, "{errors:?}");
        let (args, errors) = parse_str(quote!(host_effects_not_replayed = false));
        assert!(errors.is_empty() && !args.host_effects, "{errors:?}");
        let (_, errors) = parse_str(quote!(host_effects_not_replayed = "yes"));
        assert!(errors[0].contains("is a flag"), "{errors:?}");
        let (_, errors) = parse_str(quote!(host_effects_not_replayed(print)));
        assert!(errors[0].contains("takes no list"), "{errors:?}");
        let (_, errors) = parse_str(quote!(host_effects_not_replayed, host_effects_not_replayed));
        assert!(errors[0].contains("set multiple times"), "{errors:?}");
    }

    #[test]
    fn unknown_keys_get_a_hint() {
        let (_, errors) = parse_str(quote!(warmups = 3));
        assert!(
            errors[0].contains("\n= help: did you mean `warmup`?\n"),
            "{errors:?}"
        );
        let (_, errors) = parse_str(quote!(allow_host_effects));
        assert!(
            errors[0].contains("write `host_effects_not_replayed`"),
            "{errors:?}"
        );
        let (_, errors) = parse_str(quote!(allow_println = true));
        assert!(
            errors[0].contains("write `host_effects_not_replayed`"),
            "{errors:?}"
        );
        let (_, errors) = parse_str(quote!(pool = "shared"));
        assert!(
            errors[0].ends_with(&valid_keys()) && errors[0].matches("= help:").count() == 1,
            "no hint for a far key: {errors:?}"
        );
        assert_eq!(edit_distance("mdoe", "mode"), 2);
        assert_eq!(edit_distance("", "crate"), 5);
    }

    #[test]
    fn verification_keys() {
        let (args, errors) = parse_str(quote!(
            verify = "every",
            verify_tolerance = 1e-5,
            check_determinism
        ));
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(args.verify, Some(VerifyEvery::Every(1)));
        assert_eq!(args.verify_tolerance, Some(1e-5));
        assert_eq!(args.check_determinism, Some(true));
        let (args, errors) = parse_str(quote!(verify_every = 10, check_determinism = false));
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(args.verify, Some(VerifyEvery::Every(10)));
        assert_eq!(args.check_determinism, Some(false));
        let (_, errors) = parse_str(quote!(
            verify = "always",
            verify_every = 0,
            verify_tolerance = -1.0
        ));
        assert_eq!(errors.len(), 3, "{errors:?}");
        assert!(errors[0].contains("unknown `verify` value"));
        assert!(errors[1].contains("at least 1"));
        assert!(errors[2].contains("non-negative"));
        let (_, errors) = parse_str(quote!(verify = "first", verify_every = 5));
        assert!(errors[0].contains("not both"), "{errors:?}");
    }

    #[test]
    fn every_listed_key_is_known() {
        assert_eq!(valid_keys().matches('`').count(), 2 * KEYS.len());
        for key in KEYS {
            let key = syn::Ident::new(key, proc_macro2::Span::call_site());
            let (_, errors) = parse_str(quote!(#key));
            assert!(
                errors.iter().all(|e| !e.starts_with("unknown")),
                "{key}: {errors:?}"
            );
        }
    }

    #[test]
    fn malformed_values() {
        let (_, errors) = parse_str(quote!(warmup = "3", mode, crate = 5));
        assert_eq!(errors.len(), 3, "{errors:?}");
        assert!(errors[0].contains("integer literal"));
        assert!(errors[1].contains("needs a value"));
        assert!(errors[2].contains("must be a string"));
        let (_, errors) = parse_str(quote!(warmup 3));
        assert!(errors[0].starts_with("malformed"), "{errors:?}");
    }
}
