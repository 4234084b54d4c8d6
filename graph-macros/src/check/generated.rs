//! The robustness test of the checks: bodies generated from a grammar of the mistakes the
//! rules catch and of correct code that looks like them, nested in closures, blocks, loops,
//! forks and macro invocations of the user's, with islands of valid code and of tokens that
//! are not Rust between them. For every body the expansion must return (never panic), every
//! marked mistake must be reported exactly once, by its rule, on its line, and a body with no
//! mistake must expand without an error.
//!
//! The generator is a small seeded xorshift, so a failure names its seed and reproduces.

use std::collections::BTreeMap;

use proc_macro2::TokenStream;
use quote::quote;

use super::findings;
use crate::ctxt::Ctxt;
use crate::expand;

/// One statement that is a mistake: the rule that must report it, and its text (one line).
/// A `+` joins two rules one line must both trigger (a log around a device read).
const MISTAKES: &[(&str, &str)] = &[
    ("host-sync", "rt.stream().synchronize()?;"),
    ("host-sync", "synchronize()?;"),
    ("device-to-host", "let _h = rt.stream().clone_dtoh(y)?;"),
    ("host-to-device", "let _d = rt.stream().clone_htod(&[1.0f32, 2.0])?;"),
    ("host-print", "println!(\"step {}\", x.len());"),
    ("host-clock", "let _t = std::time::Instant::now();"),
    ("host-clock", "let _e = UNIX_EPOCH.elapsed();"),
    ("cpu-randomness", "let _r: f32 = rand::random();"),
    ("cpu-randomness", "let _s = RandomState::new();"),
    ("thread-spawned-in-body", "std::thread::spawn(|| ());"),
    ("thread-spawned-in-body", "let _p = join(|| 1, || 2);"),
    ("host-input", "let _v = std::env::var(\"SCALE\");"),
    ("host-input", "let _m = rx.recv();"),
    ("host-static-state", "STEP.fetch_add(1, Ordering::Relaxed);"),
    ("host-static-state", "unsafe { CALLS += 1 };"),
    ("stream-created-in-body", "let _s = rt.context().new_stream()?;"),
    (
        "legacy-default-stream",
        "unsafe { sys::cuMemsetD32Async(p, 0, n, std::ptr::null_mut()) };",
    ),
    (
        "host-sync",
        "fn settle(s: &CudaStream) { s.synchronize().ok(); }",
    ),
    ("cpu-randomness", "use rand::thread_rng as trng; let _g = trng();"),
    ("host-print", "macro_rules! say { ($e:expr) => { eprintln!(\"{}\", $e) }; }"),
    ("host-static-state", "CALLS = 0;"),
    (
        "legacy-default-stream",
        "let null = std::ptr::null_mut(); unsafe { sys::cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, null, p, e) };",
    ),
    (
        "device-to-host+host-log",
        "tracing::info!(first = ?rt.stream().clone_dtoh(y)?, \"step\");",
    ),
];

/// Correct statements, several of them named like mistakes.
const VALID: &[&str] = &[
    "rt.stream().memcpy_dtod(x, y)?;",
    "let n = x.len();",
    "let s = format!(\"{:?} {}\", x, y.len());",
    "let rows = model.db.query(3);",
    "let ready = Client::builder().build().is_complete();",
    "if cmd == Command::Reset { rt.stream().memset_zeros(y)?; }",
    "let t = TABLE[0] * SCALE;",
    "let joined = join(&parts, \",\");",
    "graph_runtime::replays_as_captured! { jobs.synchronize(); }",
    "rt.stream().memcpy_dtoh(x, staging)?;",
    "let _own = Timer::new().elapsed();",
    "fn helper(a: usize) -> usize { a + 1 }",
    "let name = PREFIX.replace(\"a\", \"b\");",
    "let _c = Cache.exists();",
];

/// Token soup for user macros: not Rust, must not panic the walker or be reported.
const SOUP: &[&str] = &[
    "@ # ~ $x => { }",
    "struct { , , }",
    "1 2 3 ; ; => =>",
    "match { _ if }",
];

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len())]
    }
}

/// A generated body: its lines, and the mistakes marked in it, by line (1-based, within the
/// whole function text).
struct Body {
    lines: Vec<String>,
    expected: Vec<(usize, &'static str)>,
}

impl Body {
    fn push(&mut self, line: impl Into<String>) {
        self.lines.push(line.into());
    }

    /// Statements at nesting `depth`: valid code, mistakes, and nested constructs.
    fn statements(&mut self, rng: &mut Rng, depth: usize, mistakes: bool) {
        for _ in 0..1 + rng.below(4) {
            match rng.below(if depth < 3 { 9 } else { 3 }) {
                0 | 1 => self.push(rng.pick(VALID)),
                2 if mistakes => {
                    let (rule, text) = MISTAKES[rng.below(MISTAKES.len())];
                    self.push(text);
                    // Line 1 is the signature.
                    for r in rule.split('+') {
                        self.expected.push((self.lines.len() + 1, r));
                    }
                }
                2 => self.push(rng.pick(VALID)),
                3 => self.nested("{", "}", rng, depth, mistakes),
                4 => self.nested("let f = |a: usize| {", "};", rng, depth, mistakes),
                5 => self.nested("for _i in 0..3 {", "}", rng, depth, mistakes),
                6 => self.nested(
                    "if x.len() > 4 {",
                    "} else { let _z = 0; }",
                    rng,
                    depth,
                    mistakes,
                ),
                7 => self.nested("my_block! {", "}", rng, depth, mistakes),
                _ => {
                    self.push(format!("my_macro!({});", rng.pick(SOUP)));
                }
            }
        }
    }

    fn nested(&mut self, open: &str, close: &str, rng: &mut Rng, depth: usize, mistakes: bool) {
        self.push(open);
        self.statements(rng, depth + 1, mistakes);
        self.push(close);
    }

    fn item(&self) -> String {
        format!(
            "fn f(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>, #[state] staging: &mut PinnedHostSlice<f32>) -> Result<(), GraphError> {{\n{}\nOk(())\n}}",
            self.lines.join("\n")
        )
    }
}

fn compile_errors(out: &TokenStream) -> usize {
    out.to_string().matches("compile_error").count()
}

#[test]
fn generated_bodies_report_each_mistake_once_at_its_line() {
    let started = std::time::Instant::now();
    for seed in 1..=1000u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let mistakes = seed % 4 != 0;
        let mut body = Body {
            lines: Vec::new(),
            expected: Vec::new(),
        };
        body.statements(&mut rng, 0, mistakes);
        let text = body.item();
        let item: TokenStream = text.parse().expect("generated text lexes");
        let args = quote!(warmup = 2);

        // The expansion returns, whatever the body, and carries one error per finding.
        let out = std::panic::catch_unwind(|| expand::cuda_graph(args.clone(), item.clone()))
            .unwrap_or_else(|_| panic!("seed {seed}: the expansion panicked on\n{text}"));

        let syn_item: syn::ItemFn = syn::parse2(item).expect("generated body parses");
        let mut cx = Ctxt::default();
        let parsed = crate::args::parse(args, &mut cx);
        let model = crate::model::analyze(syn_item, None, &mut cx);
        assert!(!cx.has_errors(), "seed {seed}: the signature is valid");
        cx.finish();
        let found = findings(&model, &parsed);

        let mut got: BTreeMap<(usize, &str), usize> = BTreeMap::new();
        for f in &found {
            *got.entry((f.span.0.start().line, f.rule.id)).or_default() += 1;
        }
        let mut want: BTreeMap<(usize, &str), usize> = BTreeMap::new();
        for (line, rule) in &body.expected {
            *want.entry((*line, *rule)).or_default() += 1;
        }
        assert_eq!(got, want, "seed {seed}:\n{text}");
        assert_eq!(compile_errors(&out), found.len(), "seed {seed}:\n{text}");
        if body.expected.is_empty() {
            assert_eq!(compile_errors(&out), 0, "seed {seed}:\n{text}");
        }
    }
    assert!(
        started.elapsed() < std::time::Duration::from_secs(20),
        "the generated bodies took {:?}",
        started.elapsed()
    );
}
