use std::collections::HashSet;

use proc_macro2::{Ident, Span, TokenStream};
use quote::quote;

use super::rules::{rule, Matcher, Rule, CANDLE_READS, CANDLE_TO_CPU, DEVICE_READS, RULES};
use super::*;
use crate::expand;

/// The rule ids a body triggers, in order, through the same entry point the compiler
/// uses (`expand::cuda_graph`), matched back to the table by message.
fn ids(args: TokenStream, body: TokenStream) -> Vec<&'static str> {
    ids_with(
        args,
        quote! {
            x: &CudaSlice<f32>,
            y: &mut CudaSlice<f32>,
            #[state] staging: &PinnedHostSlice<f32>,
            #[state] history: &mut Vec<usize>,
            #[state] stage: &mut Stage,
        },
        body,
    )
}

/// The same, with these parameters after the context `rt: &Runtime`.
fn ids_with(args: TokenStream, params: TokenStream, body: TokenStream) -> Vec<&'static str> {
    let item = quote! {
        fn f(rt: &Runtime, #params) -> Result<(), GraphError> {
            #body
            Ok(())
        }
    };
    let direct: Vec<&'static str> = findings_of(args.clone(), item.clone())
        .iter()
        .map(|f| f.rule.id)
        .collect();
    // End to end: the expansion carries one `compile_error!` per finding, with its text.
    let out = expand::cuda_graph(args, item);
    let messages = compile_errors(out);
    assert_eq!(messages.len(), direct.len(), "{messages:#?}");
    for (id, msg) in direct.iter().zip(&messages) {
        assert!(msg.contains(marker(rule(id))), "rule {id}: {msg}");
    }
    direct
}

/// The longest fixed part of a rule's reason, which identifies its message.
fn marker(rule: &Rule) -> &'static str {
    rule.why
        .split(['{', '}'])
        .filter(|part| !["what", "data"].contains(part))
        .max_by_key(|part| part.len())
        .expect("a reason has text")
        .trim()
}

/// The findings of the checks alone, on the model built from `item`.
fn findings_of(args: TokenStream, item: TokenStream) -> Vec<Finding> {
    let item: syn::ItemFn = syn::parse2(item).expect("test body parses");
    let mut cx = Ctxt::default();
    let parsed = crate::args::parse(args, &mut cx);
    let model = crate::model::analyze(item, None, &mut cx);
    assert_eq!(
        cx.messages(),
        Vec::<String>::new(),
        "the test signature is valid"
    );
    findings(&model, &parsed)
}

fn compile_errors(out: TokenStream) -> Vec<String> {
    let file: syn::File = syn::parse2(out).expect("the expansion parses");
    file.items
        .iter()
        .filter_map(|item| match item {
            syn::Item::Macro(m) if m.mac.path.segments.last()?.ident == "compile_error" => Some(
                syn::parse2::<syn::LitStr>(m.mac.tokens.clone())
                    .ok()?
                    .value(),
            ),
            _ => None,
        })
        .collect()
}

fn one(body: TokenStream) -> Vec<&'static str> {
    ids(quote!(warmup = 2), body)
}

/// A minimal snippet for each matcher, generated from the table.
fn snippet(m: &Matcher) -> TokenStream {
    let ident = |s: &str| Ident::new(s, Span::call_site());
    match m {
        Matcher::Method(n) => {
            let n = ident(n);
            quote!(let _ = thing.#n(arg);)
        }
        Matcher::MethodNoArgs(n) => {
            let n = ident(n);
            quote!(let _ = thing.#n();)
        }
        Matcher::Path(p) => {
            let segs: Vec<Ident> = p.iter().map(|s| ident(s)).collect();
            if segs.len() == 1 {
                quote!(let _ = #(#segs)::*::function();)
            } else {
                quote!(let _ = #(#segs)::*();)
            }
        }
        Matcher::ItemOf(p) => {
            let segs: Vec<Ident> = p.iter().map(|s| ident(s)).collect();
            quote!(let _ = #(#segs)::*::function();)
        }
        Matcher::Driver(n) => {
            let n = ident(&format!("{n}_v2"));
            quote!(let _ = unsafe { sys::#n(arg) };)
        }
        Matcher::BareCall(n) => {
            let n = ident(n);
            quote!(let _ = #n();)
        }
        Matcher::Macro(n) => {
            let n = ident(n);
            quote!(#n!("step");)
        }
        Matcher::FormatsDeviceBuffer => {
            quote!(let t = Tensor::zeros(4, DType::F32, &dev)?; let _ = format!("{:?}", t);)
        }
        Matcher::BranchesOnDeviceData => {
            quote!(if rt.stream().clone_dtoh(y)?[0] > 0.0 {
                launch(rt)?;
            })
        }
        Matcher::BranchesOnTensorData => {
            quote!(if loss.to_scalar::<f32>()? > 1.0 {
                launch(rt)?;
            })
        }
        Matcher::ToCpu(n) => {
            let n = ident(n);
            quote!(let _ = thing.#n(&Device::Cpu);)
        }
        Matcher::NestedGraphCapture => quote!(let _inner = InnerGraph::capture(rt, x, 16)?;),
        Matcher::PinnedMethod(n) => {
            let n = ident(n);
            quote!(let _ = staging.#n();)
        }
        Matcher::CollectionParamMethod(n) => {
            let n = ident(n);
            quote!(history.#n(arg);)
        }
        Matcher::LooseMethod(n) => {
            let n = ident(n);
            quote!(let _ = rt.stream().#n();)
        }
        Matcher::BareClosureCall(n, k) => {
            let n = ident(n);
            let closures = (0..*k).map(|_| quote!(|| launch(rt)));
            quote!(let _ = #n(#(#closures),*);)
        }
        Matcher::BareMutRefCall(n) => {
            let n = ident(n);
            quote!(let _ = #n(&mut seed);)
        }
        Matcher::BareStrCall(n) => {
            let n = ident(n);
            quote!(let _ = #n("SCALE");)
        }
        Matcher::MethodWithClosure(n) => {
            let n = ident(n);
            quote!(let _ = builder.name(w).#n(|| launch(rt));)
        }
        Matcher::RngMethod => quote!({
            let mut r = Rng::new();
            let _ = r.u32(0..10);
        }),
        Matcher::StaticAccess => quote!(STEP.fetch_add(1, Ordering::Relaxed);),
        Matcher::NullStream => quote!(unsafe {
            sys::cuMemsetD32Async(ptr, 0, n, std::ptr::null_mut());
        }),
        Matcher::HostStateMut => quote!(),
        Matcher::MacroWord(w) => {
            let n = ident(&format!("{w}_step"));
            quote!(#n!("step");)
        }
        Matcher::StateFieldMethod(n) => {
            let n = ident(n);
            quote!(let _ = stage.host.#n();)
        }
    }
}

#[test]
fn every_matcher_of_every_rule_fires_alone() {
    for rule in RULES {
        for m in rule
            .matchers
            .iter()
            .filter(|m| **m != Matcher::HostStateMut)
        {
            let got = one(snippet(m));
            assert_eq!(got, vec![rule.id], "{m:?} of rule `{}`", rule.id);
        }
    }
}

/// Every rule has a compile-fail case in `ui-tests/tests/fail/` whose snapshot shows its
/// message.
#[test]
fn every_rule_has_a_ui_case() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../ui-tests/tests/fail");
    // The cases that need graph-runtime's `nccl` sit beside them in `fail-nccl/`.
    let nccl = dir.with_file_name("fail-nccl");
    let snapshots: Vec<String> = [&dir, &nccl]
        .into_iter()
        .flat_map(|d| std::fs::read_dir(d).expect("ui-tests/tests/fail and fail-nccl exist"))
        .filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == "stderr"))
        .map(|e| std::fs::read_to_string(e.path()).expect("readable snapshot"))
        .collect();
    for rule in RULES {
        // The longest fixed part of the reason identifies the message.
        assert!(
            snapshots.iter().any(|s| s.contains(marker(rule))),
            "rule `{}` has no ui case in {}",
            rule.id,
            dir.display()
        );
    }
}

#[test]
fn every_device_read_is_a_device_to_host_matcher() {
    for read in DEVICE_READS {
        assert!(
            rule("device-to-host").has(|m| *m == Matcher::Method(read)),
            "{read}"
        );
    }
}

#[test]
fn every_candle_read_is_a_candle_host_read_matcher() {
    for read in CANDLE_READS {
        assert!(
            rule("candle-host-read").has(|m| *m == Matcher::Method(read)),
            "{read}"
        );
    }
    for to_cpu in CANDLE_TO_CPU {
        assert!(
            rule("candle-host-read").has(|m| *m == Matcher::ToCpu(to_cpu)),
            "{to_cpu}"
        );
    }
}

#[test]
fn rule_ids_are_unique_and_messages_follow_the_style() {
    let mut seen = HashSet::new();
    for rule in RULES {
        assert!(seen.insert(rule.id), "duplicate id {}", rule.id);
        for m in [rule.what, rule.why, rule.fix] {
            assert!(!m.ends_with('.'), "{}: trailing period in {m}", rule.id);
            assert!(!m.contains('\n'), "{}: a line break in {m}", rule.id);
            let first = m.chars().next().unwrap();
            assert!(
                first == '{' || first.is_lowercase(),
                "{}: starts upper-case: {m}",
                rule.id
            );
        }
        assert!(
            rule.why.contains("CUDA error")
                || rule.why.contains("GraphError")
                || rule.why.contains("replay"),
            "{}: the reason must say what goes wrong",
            rule.id
        );
        assert!(
            !rule.fix.is_empty(),
            "{}: must say what to write instead",
            rule.id
        );
        let message = rule.render("`what`", "`data`");
        assert_eq!(
            rule.host_effect,
            message.to_string().contains(&super::rules::opt_in()),
            "{}",
            rule.id
        );
    }
}

#[test]
fn realistic_mistakes() {
    let cases: Vec<(&str, TokenStream)> = vec![
        ("host-sync", quote!(rt.stream().synchronize()?;)),
        ("host-sync", quote!(rt.context().synchronize()?;)),
        ("host-sync", quote!(rt.synchronize()?;)),
        (
            "device-to-host",
            quote!(let host = rt.stream().clone_dtoh(y)?;),
        ),
        (
            "host-to-device",
            quote!(let bias = rt.stream().clone_htod(&vec![0.5f32; 8])?;),
        ),
        (
            "host-to-device",
            quote!(rt.stream().memcpy_htod(&[1.0f32; 4], y)?;),
        ),
        (
            "device-value-formatted",
            quote!(let t = Tensor::zeros(4, DType::F32, &dev)?; let s = format!("{t:?}");),
        ),
        (
            "stream-or-event-query",
            quote!(let done = ev.is_complete();),
        ),
        (
            "stream-or-event-query",
            quote!(let ms = start.elapsed_ms(&end)?;),
        ),
        (
            "pinned-host-alloc",
            quote!(let h = unsafe { rt.context().alloc_pinned::<f32>(8) }?;),
        ),
        (
            "legacy-default-stream",
            quote!(rt.context().default_stream().memcpy_dtod(x, y)?;),
        ),
        (
            "stream-created-in-body",
            quote!(let side = rt.context().new_stream()?;),
        ),
        (
            "stream-created-in-body",
            quote!(let side = rt.stream().fork()?;),
        ),
        (
            "cublas-handle-in-body",
            quote!(let blas = CudaBlas::new(rt.stream().clone())?;),
        ),
        ("capture-control", quote!(rt.stream().begin_capture(mode)?;)),
        (
            "nested-graph-capture",
            quote!(let g = PlusTwoGraph::capture(rt, x, 8)?;),
        ),
        ("cpu-randomness", quote!(let noise: f32 = rand::random();)),
        (
            "cpu-randomness",
            quote!(let scale = rng().random_range(0.5..1.5);),
        ),
        ("host-print", quote!(println!("step done");)),
        ("host-print", quote!(eprint!(".");)),
        (
            "host-log",
            quote!(tracing::info!(n = x.len(), "launching");),
        ),
        ("host-log", quote!(log::warn!("slow");)),
        (
            "host-io",
            quote!(let cfg = std::fs::read_to_string("cfg.toml")?;),
        ),
        ("host-io", quote!(let mut f = File::create("trace.bin")?;)),
        (
            "host-sleep",
            quote!(std::thread::sleep(Duration::from_millis(1));),
        ),
        ("host-clock", quote!(let t0 = Instant::now();)),
        (
            "pinned-host-read",
            quote!(let first = staging.as_slice()?[0];),
        ),
        ("host-bookkeeping", quote!(history.push(x.len());)),
        (
            "host-clock",
            quote!(let seed = SystemTime::now().duration_since(UNIX_EPOCH)?;),
        ),
    ];
    for (id, body) in cases {
        let got = one(body.clone());
        assert!(
            got.contains(&id),
            "expected `{id}` for `{body}`, got {got:?}"
        );
    }
}

#[test]
fn a_condition_reading_the_device_is_one_error_on_the_condition() {
    assert_eq!(
        one(quote! {
            if rt.stream().clone_dtoh(y)?[0].is_nan() {
                return Err(GraphError::User("NaN".into()));
            }
        }),
        ["host-branch-on-device-data"]
    );
    assert_eq!(
        one(quote!(while rt.stream().clone_dtoh(y)?[0] > 1.0 {
            halve(rt, y)?;
        })),
        ["host-branch-on-device-data"]
    );
}

#[test]
fn locals_read_from_the_device_taint_later_conditions() {
    assert_eq!(
        one(quote! {
            let host = rt.stream().clone_dtoh(y)?;
            let worst = host.iter().fold(0.0f32, |a, b| a.max(*b));
            if worst > 1.0 { rescale(rt, y)?; }
            match host.len() { 0 => {}, _ => {} }
            for _ in 0..host.len() {}
        }),
        [
            "device-to-host",
            "host-branch-on-device-data",
            "host-branch-on-device-data",
            "host-branch-on-device-data"
        ]
    );
    assert_eq!(
        one(quote! {
            let mut host = vec![0.0f32; 4];
            rt.stream().memcpy_dtoh(y, &mut host)?;
            let Some(first) = host.first() else { return Ok(()) };
        }),
        ["device-to-host", "host-branch-on-device-data"]
    );
    // Re-binding the name to a host value clears the mark.
    assert_eq!(
        one(quote! {
            let v = rt.stream().clone_dtoh(y)?;
            let v = 1.0f32;
            if v > 0.0 {}
        }),
        ["device-to-host"]
    );
}

#[test]
fn formatting_host_values_of_buffers_is_fine() {
    let opt_in = quote!(warmup = 2, host_effects_not_replayed);
    for body in [
        quote!(println!("{} elements", x.len());),
        quote!(tracing::debug!(n = y.len(), "step");),
        quote!(assert_eq!(x.len(), y.len(), "shapes differ");),
        quote!(let s = format!("{}", x.len());),
    ] {
        assert_eq!(
            ids(opt_in.clone(), body.clone()),
            Vec::<&str>::new(),
            "{body}"
        );
    }
    // cudarc's buffers format their address, length and stream: nothing is read, so
    // formatting one is legal (printing it is a host effect like any print).
    assert_eq!(
        ids(opt_in.clone(), quote!(println!("{:?}", y);)),
        Vec::<&str>::new()
    );
    assert_eq!(one(quote!(println!("{:?}", y);)), ["host-print"]);
    assert_eq!(
        one(quote! {
            let tmp = rt.stream().alloc_zeros::<f32>(x.len())?;
            let s = format!("{tmp:?}");
            assert_eq!(format!("{:?}", x), s, "{y:?}");
        }),
        Vec::<&str>::new()
    );
    // A candle tensor's `Debug` reads the device: refused even with the opt-in, once.
    let tensors = quote!(x: &Tensor, #[state] w: &Tensor);
    assert_eq!(
        ids_with(opt_in, tensors.clone(), quote!(println!("{:?}", x);)),
        ["device-value-formatted"]
    );
    assert_eq!(
        ids_with(
            quote!(warmup = 2),
            tensors.clone(),
            quote!(let h = x.matmul(w)?; let s = format!("{h}");)
        ),
        ["device-value-formatted"]
    );
    assert_eq!(
        ids_with(
            quote!(warmup = 2),
            tensors,
            quote!(let d = x.dims(); let s = format!("{d:?} {:?}", w.shape());)
        ),
        Vec::<&str>::new()
    );
}

#[test]
fn the_opt_in_lifts_host_effects_only() {
    let body = quote! {
        let t0 = Instant::now();
        println!("capturing");
        tracing::info!("capturing");
        std::thread::sleep(Duration::from_millis(1));
        let _ = std::fs::write("capture.log", "x");
        rt.stream().synchronize()?;
        let r: f32 = rand::random();
    };
    assert_eq!(
        one(body.clone()),
        [
            "host-clock",
            "host-print",
            "host-log",
            "host-sleep",
            "host-io",
            "host-sync",
            "cpu-randomness"
        ]
    );
    assert_eq!(
        ids(quote!(warmup = 2, host_effects_not_replayed), body.clone()),
        ["host-sync", "cpu-randomness"]
    );
    assert_eq!(
        ids(quote!(host_effects_not_replayed = false), body).len(),
        7
    );
}

#[test]
fn correct_bodies_pass() {
    for body in [
        // Kernels through the runtime's cache, on the runtime's stream.
        quote! {
            let n = x.len() as i32;
            let f = rt.function(SRC, "scale")?;
            let mut tmp = rt.stream().alloc_zeros::<f32>(x.len())?;
            // SAFETY: test
            unsafe { rt.stream().launch_builder(&f).arg(x).arg(&mut tmp).arg(&n).launch(cfg)?; }
            rt.stream().memcpy_dtod(&tmp, y)?;
        },
        // cuBLAS through the runtime's handle.
        quote!(unsafe { rt.blas().gemm(cfg, x, x, y) }?;),
        // The scoped fork/join, and cudarc's join/wait.
        quote! {
            rt.fork(|side| { side.memcpy_dtod(x, y)?; Ok(()) })?;
            rt.stream().join(&other)?;
            rt.stream().wait(&event)?;
        },
        // The phase and the capture status are legal while capturing.
        quote! {
            if is_capturing() { panic!("found during capture"); }
            match phase() { Phase::Warmup { run, .. } => { let _ = run; } _ => {} }
            let status = rt.stream().capture_status()?;
        },
        // Names that only look like rules.
        quote! {
            let rng = 3;
            let random = rng + 1;
            let stdout = random;
            let sleep = stdout;
            let query = sleep;
            let s = format!("{query} {}", x.len());
            let _ = my_rng.next_index(rng);
        },
        // Copies from a parameter declared as a pinned buffer are the legal host copies.
        quote! {
            rt.stream().memcpy_htod(staging, y)?;
            let up = rt.stream().clone_htod(&staging)?;
            let n = history.len();
        },
        // A closure that allocates does not make its result a device buffer.
        quote! {
            let n = rt.fork(|side| { let t = side.alloc_zeros::<f32>(4)?; drop(t); Ok(4) })?;
            assert_eq!(n, x.len(), "{n}");
        },
        // Items declared inside the body that do nothing wrong.
        quote! {
            fn helper(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
                rt.stream().memcpy_dtod(x, y)?;
                Ok(())
            }
            const DEBUG: bool = false;
        },
    ] {
        assert_eq!(one(body.clone()), Vec::<&str>::new(), "{body}");
    }
}

#[test]
fn macro_arguments_are_walked() {
    assert_eq!(
        one(quote!(assert!(rt.stream().clone_dtoh(y)?.len() > 0);)),
        ["device-to-host"]
    );
    assert_eq!(
        one(quote!(let v = vec![rand::random::<f32>(); 4];)),
        ["cpu-randomness"]
    );
}

#[test]
fn every_error_is_reported_and_the_graph_type_is_still_emitted() {
    let out = expand::cuda_graph(
        quote!(warmup = 2),
        quote! {
            fn f(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
                rt.stream().synchronize()?;
                println!("hi");
                let v = rt.stream().clone_dtoh(y)?;
                Ok(())
            }
        },
    );
    let text = out.to_string();
    assert_eq!(compile_errors(out).len(), 3);
    assert!(text.contains("fn f"), "{text}");
    assert!(text.contains("struct FGraph"), "{text}");
}

#[test]
fn a_pattern_is_not_a_call() {
    // A user's enum with variants named like the standard library's I/O types: matched
    // on, constructed and compared, none of it is I/O.
    assert_eq!(
        one(quote! {
            let sink = Sink::File(path);
            match sink {
                Sink::File(p) => launch(rt, p)?,
                Sink::Stdout => launch(rt, 0)?,
                Sink::Command { .. } => {}
            }
            if let Sink::File(_) = sink {}
            let same = matches!(sink, Sink::File(_));
        }),
        Vec::<&str>::new()
    );
    // Paths through the standard library's items still are.
    assert_eq!(
        one(quote!(let f = std::fs::File::open("w.bin")?;)),
        ["host-io"]
    );
    assert_eq!(one(quote!(let f = File::create(path)?;)), ["host-io"]);
    assert_eq!(one(quote!(let out = std::io::stdout();)), ["host-io"]);
}

#[test]
fn methods_of_the_users_own_types_are_the_users() {
    let params = quote! {
        x: &CudaSlice<f32>,
        y: &mut CudaSlice<f32>,
        #[state] sched: &mut Scheduler,
        #[state] cache: &Arc<Lookup>,
        #[state] stream: &Arc<CudaStream>,
        #[state] model: &Model,
    };
    let with = |body: TokenStream| ids_with(quote!(warmup = 2), params.clone(), body);
    for body in [
        // Parameters declared with the user's types.
        quote!(sched.synchronize();),
        quote!(let hit = cache.query(&key);),
        quote!(let hit = (*cache).query(&key);),
        // Locals bound to the user's values.
        quote!(let mut s = Scheduler::new(4); s.synchronize();),
        quote!(let l = Lookup { table }; let _ = l.query(1);),
        quote!(let l: Lookup = make(); let _ = l.query(1);),
        quote!(let l = Lookup::with_capacity(8); let l2 = l.clone(); let _ = l2.query(1);),
        quote!(let r = &*sched; r.synchronize();),
        // A call written on the user's type.
        quote!(Scheduler::synchronize(sched);),
        // The workaround the coverage table gives for a field: an annotated local.
        quote!(let db: &Lookup = &model.lookup; let _ = db.query(1);),
    ] {
        assert_eq!(with(body.clone()), Vec::<&str>::new(), "{body}");
    }
    for body in [
        // A CUDA type, declared or written on the path.
        quote!(stream.synchronize()?;),
        quote!(CudaStream::synchronize(stream)?;),
        quote!(CudaStream::synchronize(&sched)?;),
        quote!(<CudaStream>::synchronize(stream)?;),
        quote!(Runtime::synchronize(rt)?;),
        // What the macro cannot classify: fields, method chains, closure parameters,
        // locals bound to function calls.
        quote!(model.stream.synchronize()?;),
        quote!(model.stream().synchronize()?;),
        quote!(sched.stream().synchronize()?;),
        quote!(let s = streams_of(rt); s.synchronize()?;),
        quote!(rt.fork(|sched| sched.synchronize())?;),
        // A shadowing binding hides the outer one.
        quote!(let sched = rt.stream(); sched.synchronize()?;),
    ] {
        assert_eq!(with(body.clone()), ["host-sync"], "{body}");
    }
    // The inner block's binding does not leak out of it.
    assert_eq!(
        with(quote! {
            let s = rt.stream();
            { let s = Scheduler::new(1); s.synchronize(); }
            s.synchronize()?;
        }),
        ["host-sync"]
    );
}

#[test]
fn lower_layers_and_path_calls() {
    for (id, body) in [
        (
            "host-sync",
            quote!(unsafe { result::stream::synchronize(raw) }?;),
        ),
        ("host-sync", quote!(result::ctx::synchronize()?;)),
        (
            "host-sync",
            quote!(cudarc::driver::result::event::synchronize(ev)?;),
        ),
        (
            "host-sync",
            quote!(unsafe { sys::cuStreamSynchronize(raw) };),
        ),
        ("host-sync", quote!(unsafe { cuCtxSynchronize() };)),
        (
            "host-sync",
            quote!(CudaContext::synchronize(rt.context())?;),
        ),
        (
            "stream-or-event-query",
            quote!(let r = unsafe { result::event::query(ev) };),
        ),
        (
            "stream-or-event-query",
            quote!(let r = CudaEvent::elapsed_ms(&a, &b)?;),
        ),
        (
            "stream-or-event-query",
            quote!(let r = unsafe { sys::cuStreamQuery(raw) };),
        ),
        (
            "raw-sync-memory-op",
            quote!(unsafe { result::memcpy_htod_sync(dst, &host) }?;),
        ),
        (
            "raw-sync-memory-op",
            quote!(unsafe { result::memcpy_dtoh_sync(&mut host, src) }?;),
        ),
        (
            "raw-sync-memory-op",
            quote!(unsafe { sys::cuMemcpyDtoH_v2(dst, src, n) };),
        ),
        (
            "raw-sync-memory-op",
            quote!(unsafe { sys::cuMemsetD32_v2(dst, 0, n) };),
        ),
        (
            "device-to-host",
            quote!(unsafe { result::memcpy_dtoh_async(&mut host, src, raw) }?;),
        ),
        (
            "device-to-host",
            quote!(let h = CudaStream::clone_dtoh(rt.stream(), y)?;),
        ),
        (
            "host-to-device",
            quote!(unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src, n, raw) };),
        ),
        (
            "pinned-host-alloc",
            quote!(let p = unsafe { result::malloc_host(n, 0) }?;),
        ),
        (
            "pinned-host-alloc",
            quote!(let r = unsafe { sys::cuMemHostAlloc(&mut p, n, 0) };),
        ),
        (
            "pinned-host-alloc",
            quote!(let r = unsafe { sys::cuMemAllocHost_v2(&mut p, n) };),
        ),
        (
            "pinned-host-alloc",
            quote!(let p = unsafe { CudaContext::alloc_pinned::<f32>(rt.context(), n) }?;),
        ),
        (
            "stream-created-in-body",
            quote!(let s = result::stream::create(kind)?;),
        ),
        (
            "stream-created-in-body",
            quote!(let s = CudaContext::new_stream(rt.context())?;),
        ),
        (
            "capture-control",
            quote!(unsafe { sys::cuStreamBeginCapture_v2(raw, mode) };),
        ),
        (
            "legacy-default-stream",
            quote!(let s = result::stream::null();),
        ),
    ] {
        assert_eq!(one(body.clone()), [id], "{body}");
    }
    // Asynchronous raw calls on a stream are recorded like the safe ones: not refused.
    assert_eq!(
        one(quote!(unsafe { result::memcpy_dtod_async(dst, src, n, raw) }?;)),
        Vec::<&str>::new()
    );
    assert_eq!(
        one(quote!(unsafe { sys::cuMemsetD32Async(dst, 0, n, raw) };)),
        Vec::<&str>::new()
    );
}

#[test]
fn threads_modules_and_rand_0_9() {
    for (id, body) in [
        (
            "thread-spawned-in-body",
            quote!(let h = std::thread::spawn(move || work());),
        ),
        (
            "thread-spawned-in-body",
            quote!(thread::scope(|s| { s.spawn(|| work()); });),
        ),
        (
            "thread-spawned-in-body",
            quote!(let b = thread::Builder::new().name("w".into());),
        ),
        ("thread-spawned-in-body", quote!(let h = spawn(|| work());)),
        (
            "thread-spawned-in-body",
            quote!(rayon::join(|| a(), || b());),
        ),
        (
            "module-load-in-body",
            quote!(let m = rt.context().load_module(ptx)?;),
        ),
        ("module-load-in-body", quote!(let ptx = compile_ptx(SRC)?;)),
        (
            "module-load-in-body",
            quote!(let ptx = cudarc::nvrtc::compile_ptx_with_opts(SRC, opts)?;),
        ),
        (
            "module-load-in-body",
            quote!(let ptx = Ptx::from_file("k.ptx");),
        ),
        (
            "module-load-in-body",
            quote!(let m = unsafe { sys::cuModuleLoadData(&mut m, img) };),
        ),
        ("cpu-randomness", quote!(let v: f32 = r.random();)),
        ("cpu-randomness", quote!(let v = rng.sample(dist);)),
        ("cpu-randomness", quote!(let v = items.choose(&mut r);)),
        ("cpu-randomness", quote!(let v = r.next_u64();)),
        ("cpu-randomness", quote!(let v = random_range(0..10);)),
        (
            "cpu-randomness",
            quote!(let v = Rng::random_range(&mut r, 0..10);),
        ),
        ("cpu-randomness", quote!(let mut r = StdRng::from_os_rng();)),
    ] {
        assert_eq!(one(body.clone()), [id], "{body}");
    }
    // rand 0.9's generator seeded in the body draws the same numbers on every run, but the
    // draw is still a CPU draw frozen into the graph.
    assert_eq!(
        one(quote!(let mut r = SmallRng::seed_from_u64(7); let a: f32 = r.random();)),
        ["cpu-randomness"]
    );
}

#[test]
fn inside_a_users_macro_invocation() {
    for body in [
        // Statements.
        quote!(my_macro! { let n = x.len(); rt.stream().synchronize()?; }),
        // Expressions between `=>` and `;`.
        quote!(repeat!(3 => rt.stream().synchronize()?);),
        quote!(with_stream!(s; s.synchronize()?);),
        // Nested in a macro's arguments.
        quote!(outer!(inner!(rt.stream().synchronize()?));),
    ] {
        assert_eq!(one(body.clone()), ["host-sync"], "{body}");
    }
    // What does not parse says nothing.
    assert_eq!(
        one(quote!(weird!(@sync ~> rt.stream() <~);)),
        Vec::<&str>::new()
    );
    // A named format argument is not an assignment to a local.
    assert_eq!(
        one(quote! {
            let v = rt.stream().clone_dtoh(y)?;
            let s = format!("{v}", v = 1);
            if v.is_empty() {}
        }),
        ["device-to-host", "host-branch-on-device-data"]
    );
}

#[test]
fn a_device_read_inside_a_print_comes_first() {
    let body = quote!(println!("{}", rt.stream().clone_dtoh(y)?[0]););
    assert_eq!(one(body.clone()), ["device-to-host", "host-print"]);
    assert_eq!(
        ids(quote!(host_effects_not_replayed), body),
        ["device-to-host"]
    );
}

#[test]
fn scopes_and_guards() {
    // A closure parameter that shadows a buffer is not the buffer.
    assert_eq!(
        one(quote!(let lens: Vec<String> = names.iter().map(|y| format!("{y}")).collect();)),
        Vec::<&str>::new()
    );
    // A match guard decides on the host like a condition.
    assert_eq!(
        one(quote!(match n {
            k if rt.stream().clone_dtoh(y)?[k] > 0.0 => {}
            _ => {}
        })),
        ["host-branch-on-device-data"]
    );
    // A host collection parameter of buffers is still bookkeeping; a local one is not.
    assert_eq!(
        ids_with(
            quote!(warmup = 2),
            quote!(x: &CudaSlice<f32>, #[state] bufs: &mut Vec<CudaSlice<f32>>),
            quote!(bufs.push(rt.stream().alloc_zeros::<f32>(4)?); let mut v = Vec::new(); v.push(1);),
        ),
        ["host-bookkeeping"]
    );
    // A host collection given as state is not a device buffer: formatting it is host work.
    assert_eq!(
        one(quote!(let s = format!("{history:?}");)),
        Vec::<&str>::new()
    );
}

/// The parameters of a candle body: a tensor and a candle model given as state, beside the
/// cudarc buffers (the macro sees the declared types' names).
fn candle(body: TokenStream) -> Vec<&'static str> {
    ids_with(
        quote!(warmup = 2),
        quote! {
            x: &CudaSlice<f32>,
            y: &mut CudaSlice<f32>,
            #[state] w: &Tensor,
            #[state] q: &candle_core::quantized::QTensor,
            #[state] stats: &Stats,
        },
        body,
    )
}

#[test]
fn candle_host_reads() {
    for body in [
        quote!(let loss: f32 = w.sum_all()?.to_scalar()?;),
        quote!(let loss = w.to_scalar::<f32>()?;),
        quote!(let v = w.to_vec0::<f32>()?;),
        quote!(let v = w.to_vec1::<f32>()?;),
        quote!(let v = w.flatten_all()?.to_vec1::<f32>()?;),
        quote!(let rows = w.to_vec2::<f32>()?;),
        quote!(let cube = w.to_vec3::<f32>()?;),
        quote!(let host = w.to_device(&Device::Cpu)?;),
        quote!(let host = w.to_device(&candle_core::Device::Cpu)?;),
        quote!(let host = w.to_device(&(candle::Device::Cpu))?;),
        quote!(let host = w.matmul(&w.t()?)?.to_device(&Device::Cpu)?;),
        quote!(let cpu = Device::Cpu; let host = w.to_device(&cpu)?;),
        quote!(let cpu = &Device::Cpu; let host = w.to_device(cpu)?;),
        quote!(let host = Tensor::to_device(w, &Device::Cpu)?;),
        quote!(let v = Tensor::to_vec1::<f32>(w)?;),
        quote!(let v = candle_core::Tensor::to_scalar::<f32>(w)?;),
        quote!(let d = q.dequantize(&Device::Cpu)?;),
        quote!(let d = q.dequantize_f16(&Device::Cpu)?;),
        quote!(w.write_npy("w.npy")?;),
        quote!(w.save_safetensors("w", "w.safetensors")?;),
        quote!(Tensor::write_npz(&[("w", w)], "w.npz")?;),
        quote!(candle_core::safetensors::save(&tensors, "m.safetensors")?;),
        quote!(let s = match &*w.storage() { Storage::Cuda(c) => c.to_cpu_storage()?, _ => todo!() };),
        // A field or a closure parameter: judged by the name.
        quote!(let v = model.logits.to_vec1::<f32>()?;),
        quote!(let vs: Vec<f32> = ts.iter().map(|t| t.to_scalar::<f32>().unwrap()).collect();),
    ] {
        assert_eq!(candle(body.clone()), ["candle-host-read"], "{body}");
    }
}

#[test]
fn candle_device_copies_and_the_users_own_methods_pass() {
    for body in [
        // A copy to a CUDA device (or to the tensor's own device) is not a host read.
        quote!(let moved = w.to_device(w.device())?;),
        quote!(let moved = w.to_device(&dev)?;),
        quote!(let gpu = Device::new_cuda(0)?; let moved = w.to_device(&gpu)?;),
        quote!(let moved = w.to_device(&Device::Cuda(cuda.clone()))?;),
        quote!(let d = q.dequantize(w.device())?;),
        // A CPU device that is re-bound to a CUDA one is no longer the CPU.
        quote!(let mut d = Device::Cpu; d = gpu.clone(); let moved = w.to_device(&d)?;),
        // Host metadata of a tensor.
        quote!(let n = w.dims().len() + w.elem_count(); let r = w.rank();),
        // Methods of the user's own types with candle's names.
        quote!(let total = stats.to_scalar();),
        quote!(let h = Histogram::new(8); let bins = h.to_vec1(); let grid = h.to_vec2();),
        quote!(let plan = Plan::default(); let host_plan = plan.to_device(&Device::Cpu);),
        quote!(let h = Histogram::new(8); if h.to_vec1().is_empty() { launch(rt)?; }),
        // `Device::Cpu` alone is not a read (a tensor made on the host, host work).
        quote!(let cpu = Device::Cpu; let n = x.len();),
    ] {
        assert_eq!(candle(body.clone()), Vec::<&str>::new(), "{body}");
    }
}

#[test]
fn candle_types_are_not_the_users_own() {
    // A tensor made in the body with a constructor is candle's, not the user's.
    assert_eq!(
        candle(quote!(let t = Tensor::new(&[1.0f32, 2.0], &dev)?; let v = t.to_vec1::<f32>()?;)),
        ["candle-host-read"]
    );
    assert_eq!(
        candle(quote!(let t: candle::Tensor = make(); let v = t.to_scalar::<f32>()?;)),
        ["candle-host-read"]
    );
    // candle's device's `synchronize` is a host sync, as a method or a path call.
    assert_eq!(candle(quote!(dev.synchronize()?;)), ["host-sync"]);
    assert_eq!(candle(quote!(Device::synchronize(&dev)?;)), ["host-sync"]);
    // A read inside a print is the read first, then the print.
    assert_eq!(
        candle(quote!(println!("{}", w.to_scalar::<f32>()?);)),
        ["candle-host-read", "host-print"]
    );
    // A tensor given as state is a device buffer: formatting it reads the device.
    assert_eq!(
        candle(quote!(let s = format!("{w}");)),
        ["device-value-formatted"]
    );
}

#[test]
fn a_condition_on_a_candle_read_is_one_error_on_the_condition() {
    for body in [
        quote!(if w.sum_all()?.to_scalar::<f32>()? > 1.0 {
            launch(rt)?;
        }),
        quote!(while w.to_vec1::<f32>()?[0] > 1.0 {
            launch(rt)?;
        }),
        quote!(match w.argmax(0)?.to_scalar::<u32>()? {
            0 => {}
            _ => {}
        }),
        quote!(for v in w.to_vec1::<f32>()? {
            let _ = v;
        }),
        quote!(let Some(first) = w.to_vec1::<f32>()?.first().copied() else { return Ok(()) };),
        quote!(if w.to_device(&Device::Cpu)?.dims()[0] > 1 {
            launch(rt)?;
        }),
        quote!(match n {
            k if w.to_vec1::<f32>()?[k] > 0.0 => {}
            _ => {}
        }),
    ] {
        assert_eq!(
            candle(body.clone()),
            ["candle-branch-on-device-data"],
            "{body}"
        );
    }
    // Through a local: the read where it is, the branch where it decides.
    assert_eq!(
        candle(quote! {
            let host = w.to_vec1::<f32>()?;
            let worst = host.iter().fold(0.0f32, |a, b| a.max(*b));
            if worst > 1.0 { launch(rt)?; }
        }),
        ["candle-host-read", "candle-branch-on-device-data"]
    );
    // A cudarc read keeps its own rule, also next to a candle read.
    assert_eq!(
        candle(quote!(
            if rt.stream().clone_dtoh(y)?[0] > w.to_scalar::<f32>()? {}
        )),
        ["host-branch-on-device-data"]
    );
    // The user's own value with a candle name does not decide on device data.
    assert_eq!(
        candle(quote!(if stats.to_scalar() > 1.0 {
            launch(rt)?;
        })),
        Vec::<&str>::new()
    );
}

#[test]
fn a_candle_read_is_reported_at_the_call() {
    let item = quote! {
        fn f(rt: &Runtime, x: &CudaSlice<f32>, #[state] w: &Tensor) -> Result<(), GraphError> {
            let host = w.to_device(&Device::Cpu)?;
            Ok(())
        }
    };
    let found = findings_of(quote!(warmup = 2), item);
    assert_eq!(found.len(), 1);
    assert!(
        found[0]
            .message
            .what()
            .starts_with("`.to_device(&Device::Cpu)` copies a candle tensor"),
        "{}",
        found[0].message
    );
}

/// The mistakes of issue 25 as real code spells them: names imported by `use`, code
/// declared in the body, host state, host values, raw work on the legacy stream, reads
/// behind syntax. Each is one error, of the rule named.
#[test]
fn spellings_nobody_listed() {
    let cases: Vec<(&str, TokenStream)> = vec![
        (
            "thread-spawned-in-body",
            quote!(use std::thread::scope; scope(|s| { s.spawn(|| work()); });),
        ),
        (
            "thread-spawned-in-body",
            quote!(let _ = join(|| launch(rt), || launch(rt));),
        ),
        (
            "thread-spawned-in-body",
            quote!(scope(|s| { s.spawn(|| work()); });),
        ),
        (
            "thread-spawned-in-body",
            quote!(let h = Builder::new().name(n).spawn(move || work())?;),
        ),
        (
            "thread-spawned-in-body",
            quote!(let v: Vec<f32> = data.par_iter().map(|a| a * 2.0).collect();),
        ),
        (
            "thread-spawned-in-body",
            quote!(use rayon::join as both; both(|| a(), || b());),
        ),
        ("cpu-randomness", quote!(let _ = fill(&mut seed);)),
        (
            "cpu-randomness",
            quote!(let mut r = Rng::new(); let k = r.u32(0..10);),
        ),
        (
            "cpu-randomness",
            quote!(use rand::thread_rng as trng; let k = trng();),
        ),
        ("cpu-randomness", quote!(let s = RandomState::new();)),
        ("host-sync", quote!(synchronize()?;)),
        (
            "host-sync",
            quote!(use cudarc::driver::result::ctx::synchronize as wait; wait()?;),
        ),
        (
            "host-sync",
            quote!(fn settle(s: &CudaStream) -> Result<(), DriverError> { s.synchronize() } settle(rt.stream())?;),
        ),
        (
            "host-print",
            quote!(macro_rules! note { ($($t:tt)*) => { eprintln!($($t)*) }; } note!("x");),
        ),
        (
            "host-static-state",
            quote!(STEP.fetch_add(1, Ordering::Relaxed);),
        ),
        (
            "host-static-state",
            quote!(unsafe {
                STEP += 1;
            }),
        ),
        (
            "host-static-state",
            quote!(let n = crate::COUNTER.load(Ordering::Relaxed);),
        ),
        ("host-static-state", quote!(*STATE.lock().unwrap() += 1;)),
        ("host-static-state", quote!(*CONFIG.write().unwrap() = 2;)),
        (
            "host-clock",
            quote!(let t = UNIX_EPOCH.elapsed()?.as_nanos() as u64;),
        ),
        ("host-clock", quote!(let dt = t0.elapsed();)),
        (
            "host-input",
            quote!(let scale: f32 = std::env::var("SCALE")?.parse()?;),
        ),
        ("host-input", quote!(let v = var("SCALE");)),
        (
            "host-input",
            quote!(if Path::new("/tmp/flag").exists() {
                launch(rt)?;
            }),
        ),
        ("host-input", quote!(let msg = rx.recv()?;)),
        ("host-log", quote!(log_step!("step {}", 3);)),
        (
            "host-sync",
            quote!(impl Waiter { fn wait(&self, s: &CudaStream) { s.synchronize().ok(); } }),
        ),
        (
            "legacy-default-stream",
            quote!(let null = std::ptr::null_mut(); unsafe { sys::cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, null, params, extra) };),
        ),
        (
            "pinned-host-read",
            quote!(let first = stage.host.as_slice()?[0];),
        ),
        (
            "thread-spawned-in-body",
            quote!(pool.build()?.install(|| work());),
        ),
        ("host-clock", quote!(let now = chrono::Utc::now();)),
        (
            "legacy-default-stream",
            quote!(unsafe { sys::cuMemsetD32Async(ptr, 0, n, std::ptr::null_mut()) };),
        ),
        (
            "legacy-default-stream",
            quote!(unsafe { sys::cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, ptr::null_mut(), params, ptr::null_mut()) };),
        ),
    ];
    for (id, body) in cases {
        assert_eq!(one(body.clone()), vec![id], "{body}");
    }
}

#[test]
fn tracing_fields_around_a_device_read_are_still_reads() {
    // tracing's field syntax around a device read: the read is reported even with the
    // host-effects opt-in, which lifts the log itself.
    for body in [
        quote!(tracing::info!(sum = ?rt.stream().clone_dtoh(y)?, "step");),
        quote!(tracing::info!(%rt.stream().clone_dtoh(y)?.len());),
        quote!(tracing::info!(step.sum = %rt.stream().clone_dtoh(y)?[0]);),
    ] {
        assert_eq!(
            ids(quote!(host_effects_not_replayed), body.clone()),
            ["device-to-host"],
            "{body}"
        );
    }
}

#[test]
fn host_only_mut_state_is_the_signatures_mistake() {
    // `&mut` state that lives on the host is the signature's mistake.
    for params in [
        quote!(x: &CudaSlice<f32>, #[state] step: &mut u64),
        quote!(x: &CudaSlice<f32>, #[state] t: &mut (f32, u32)),
        quote!(x: &CudaSlice<f32>, #[state] c: &mut [usize; 4]),
    ] {
        assert_eq!(
            ids_with(quote!(warmup = 2), params.clone(), quote!(let _ = x.len();)),
            ["host-state-mut"],
            "{params}"
        );
    }
}

/// Correct code that issue 25 found rejected.
#[test]
fn correct_code_that_looks_wrong() {
    for body in [
        // The user's own methods reached through a field or a builder chain.
        quote!(let rows = model.db.query(sql)?;),
        quote!(let rows = Client::builder().timeout(5).build()?.query(sql)?;),
        quote!(let client = Client::builder().timeout(5).build()?; let rows = client.query(sql)?; client.synchronize();),
        quote!(self_.jobs.synchronize();),
        quote!(let done = pool.get().is_complete();),
        // The user's own enum variant.
        quote!(if cmd == Command::Reset { launch(rt)?; } let c = Command::Stop;),
        quote!(let f = File::Open;),
        // A copy into pinned state, and from it; a field of a state struct of the user's as
        // the host end (the runtime refuses a pageable one at capture).
        quote!(rt.stream().memcpy_dtoh(y, &mut staging)?;),
        quote!(rt.stream().memcpy_dtoh(y, &mut stage.host)?; rt.stream().memcpy_htod(&stage.host, y)?;),
        quote!(debug_assert!(x.len() > 0); debug_assert_eq!(x.len(), y.len());),
        quote!(rt.stream().memcpy_htod(&staging, y)?;),
        // cudarc's `Debug` reads nothing.
        quote!(assert_eq!(format!("{:?}", x).is_empty(), false, "{y:?}");),
        // A constant's or a local's SCREAMING_CASE name read in plain ways.
        quote!(let n = N_ROWS * x.len(); let t = TABLE[0];),
        // A cache of the user's in a static, read (a lookup, not an update).
        quote!(let f = KERNELS.lock().unwrap().get("add").cloned(); let g = CACHE.with(|c| c.borrow().len());),
        // A function of the user's whose name ends in `_async`, given a default.
        quote!(let r = fetch_async(url, Default::default());),
        // Bare calls whose shape is not the imported function's.
        quote!(let s = join(&parts, ","); let v = scope(rt, 3); fill(rt, y, 1.0)?;),
        // The explicit opt-out.
        quote!(graph_runtime::replays_as_captured!(let r = self_.stream.synchronize(););),
        quote!(replays_as_captured! { println_like(); STEP.fetch_add(1, Ordering::Relaxed); }),
        // Non-null streams in raw calls.
        quote!(unsafe { sys::cuMemsetD32Async(ptr, 0, n, rt.stream().cu_stream()) };),
    ] {
        assert_eq!(
            ids_with(
                quote!(warmup = 2),
                quote!(x: &CudaSlice<f32>, y: &mut CudaSlice<f32>, #[state] staging: &mut PinnedHostSlice<f32>, #[state] stage: &mut Stage),
                body.clone()
            ),
            Vec::<&str>::new(),
            "{body}"
        );
    }
}

#[test]
fn the_opt_out_keeps_syncs_reads_and_queries_of_cuda_receivers() {
    for (body, want) in [
        (
            quote!(replays_as_captured! { rt.stream().synchronize()?; }),
            vec!["host-sync"],
        ),
        (
            quote!(graph_runtime::replays_as_captured!(rt.synchronize())?;),
            vec!["host-sync"],
        ),
        (
            quote!(let s = rt.stream(); replays_as_captured! { let h = s.clone_dtoh(x)?; }),
            vec!["device-to-host"],
        ),
        (quote!(replays_as_captured! { jobs.synchronize(); }), vec![]),
        (
            quote!(replays_as_captured! { let n = JOBS.query("pending"); }),
            vec![],
        ),
    ] {
        assert_eq!(ids(quote!(warmup = 2), body.clone()), want, "{body}");
    }
}

#[test]
fn methods_passed_as_values_are_judged_like_their_calls() {
    let params = quote! {
        x: &CudaSlice<f32>,
        y: &mut CudaSlice<f32>,
        #[state] streams: &Vec<Arc<CudaStream>>,
        #[state] jobs: &mut Vec<Job>,
    };
    let with = |body: TokenStream| ids_with(quote!(warmup = 2), params.clone(), body);
    for (body, id) in [
        (
            quote!(streams.iter().for_each(CudaStream::synchronize);),
            "host-sync",
        ),
        (
            quote!(let wait = CudaStream::synchronize; wait(&streams[0])?;),
            "host-sync",
        ),
        (quote!(let f = Runtime::synchronize; f(rt)?;), "host-sync"),
        (
            quote!(let r = streams.iter().map(<CudaStream>::synchronize);),
            "host-sync",
        ),
        (
            quote!(let done = events.iter().map(CudaEvent::query);),
            "stream-or-event-query",
        ),
        (
            quote!(let done = events.iter().all(CudaEvent::is_complete);),
            "stream-or-event-query",
        ),
        (
            quote!(let t = events.iter().map(CudaEvent::elapsed_ms);),
            "stream-or-event-query",
        ),
        (
            quote!(let v = outs.iter().map(Tensor::to_vec1::<f32>);),
            "candle-host-read",
        ),
        (
            quote!(let m = rt.context().map(CudaContext::load_module);),
            "module-load-in-body",
        ),
    ] {
        assert_eq!(with(body.clone()), [id], "{body}");
    }
    for body in [
        // Methods of the user's own types, and cudarc methods that are no mistake.
        quote!(let q: Vec<_> = jobs.iter().map(Job::query).collect();),
        quote!(jobs.iter_mut().for_each(Job::synchronize);),
        quote!(let n: usize = streams.iter().map(|s| s.len()).sum(); let l = [x].iter().map(CudaSlice::len);),
        quote!(let d = Device::Cpu; let n = usize::max(1, 2); let c = Command::Stop;),
    ] {
        assert_eq!(with(body.clone()), Vec::<&str>::new(), "{body}");
    }
}

#[test]
fn a_value_of_the_users_type_built_from_a_cuda_value_is_not_provably_theirs() {
    let params = quote! {
        x: &CudaSlice<f32>,
        y: &mut CudaSlice<f32>,
        #[state] done: &CudaEvent,
        #[constant] id: u32,
    };
    let with = |body: TokenStream| ids_with(quote!(warmup = 2), params.clone(), body);
    for (body, id) in [
        (
            quote!(let fence = Fence::from(done); while !fence.is_complete() {}),
            "stream-or-event-query",
        ),
        (
            quote!(let gpu = Gpu::new(rt.stream().clone()); gpu.synchronize()?;),
            "host-sync",
        ),
        (
            quote!(let gpu = Gpu::new(Arc::new(rt.stream().clone())); gpu.synchronize()?;),
            "host-sync",
        ),
        (
            quote!(let gpu: Gpu = Gpu::new(rt); gpu.synchronize()?;),
            "host-sync",
        ),
        (
            quote!(let ev = rt.context().new_event(None)?; let f = Fence::with_event(ev); f.query()?;),
            "stream-or-event-query",
        ),
        (
            quote!(let gpu = Gpu { stream: s }; gpu.synchronize()?;),
            "host-sync",
        ),
        (
            quote!(let gpu = Gpu { lane: rt.stream().clone() }; gpu.synchronize()?;),
            "host-sync",
        ),
        (
            quote!(let gpu = Gpu::from_stream(cfg.main_stream.clone()); gpu.synchronize()?;),
            "host-sync",
        ),
    ] {
        assert_eq!(with(body.clone()), [id], "{body}");
    }
    for body in [
        quote!(let mut t = Timer::new(5); t.synchronize(); let j = Job::from(id); j.query();),
        quote!(let s = Schedule::new(x.len()); s.synchronize(); let c = Config { device: 0 }; c.query();),
        quote!(let j = Job::with_size(cfg.gpu_count, x.num_bytes()); j.is_complete();),
        quote!(let r = Range::new(cfg.start, cfg.end); r.query();),
        // Built from a CUDA value, a type of the user's keeps every method but the ones it
        // may forward to a stream or an event (`synchronize`, `query`, `is_complete`).
        quote!(let b = Batch::new(x); b.load_module(p)?; let mut s = Sampler::new(rt, 0.8); s.sample(x);),
        // A field named like a CUDA object given a host value (a constant of the body).
        quote!(let job = Job { id: 1, device: 0 }; job.query();),
    ] {
        assert_eq!(with(body.clone()), Vec::<&str>::new(), "{body}");
    }
}

#[test]
fn a_static_reached_through_a_local_is_the_static() {
    for body in [
        quote!(let step = &STEP; step.fetch_add(1, Ordering::Relaxed);),
        quote!(let s = &STATE; *s.lock().unwrap() += 1;),
        quote!(let c = &COUNTER; c.set(c.get() + 1);),
        quote!(let s = Arc::clone(&STATE); s.store(1, Ordering::Relaxed);),
        quote!(let s = STATE.clone(); let t = s; t.swap(3, Ordering::SeqCst);),
        quote!(let mut g = STATE.lock().unwrap(); *g += 1;),
        quote!(let inner = &STATE.inner; inner.store(0, Ordering::Relaxed);),
    ] {
        assert_eq!(one(body.clone()), ["host-static-state"], "{body}");
    }
    for body in [
        quote!(let table = &TABLE; let t = table[0] * 2;),
        quote!(let k = &KERNELS; let f = k.lock().unwrap().get("add").cloned();),
        quote!(let n = STEP_COUNT; let v = TABLE[0]; let step = &n; step.set(1);),
        // A shadowing binding is not the static.
        quote!(let step = &STEP; { let step = Counter::new(); step.set(1); }),
    ] {
        assert_eq!(one(body.clone()), Vec::<&str>::new(), "{body}");
    }
}

#[test]
fn generic_helpers_declared_in_the_body_are_walked() {
    for body in [
        quote! {
            fn wait<S: std::ops::Deref<Target = CudaStream>>(s: S) -> Result<(), DriverError> { s.synchronize() }
            wait(rt.stream().clone())?;
        },
        quote! {
            fn wait<S>(s: &S) -> Result<(), DriverError> where S: Deref<Target = CudaStream> { s.synchronize() }
            wait(rt.stream())?;
        },
        quote! {
            struct Lane<S>(S);
            impl<S: Deref<Target = CudaStream>> Lane<S> {
                fn wait(&self) -> Result<(), DriverError> { self.synchronize() }
            }
            Lane(rt.stream().clone()).wait()?;
        },
        quote! {
            struct Lane<S>(S);
            impl<S> Lane<S> where S: AsRef<CudaStream> {
                fn wait(&self) -> Result<(), DriverError> { self.0.synchronize() }
            }
        },
        quote! {
            trait Wait { fn wait(&self) -> Result<(), DriverError> { self.synchronize() } }
        },
        quote! {
            fn wait<S: Waitable>(s: &S) -> Result<(), DriverError> { s.synchronize() }
        },
    ] {
        assert_eq!(one(body.clone()), ["host-sync"], "{body}");
    }
    // The methods of a type of the user's declared in the body are the user's.
    for body in [
        quote! {
            struct Job { id: u32 }
            impl Job { fn query(&self) -> u32 { self.id } fn run(&self) -> u32 { self.query() } }
            fn total<T: Into<u64>>(xs: Vec<T>) -> u64 { xs.into_iter().map(Into::into).sum() }
        },
        quote! {
            struct Bag<T> { items: Vec<T> }
            impl<T: Clone> Bag<T> {
                fn query(&self) -> usize { self.items.len() }
                fn synchronize(&mut self, b: &Bag<T>) -> usize { b.query() + self.query() }
            }
        },
    ] {
        assert_eq!(one(body.clone()), Vec::<&str>::new(), "{body}");
    }
}
