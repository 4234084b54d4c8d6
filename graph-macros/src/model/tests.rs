//! Unit tests of the model: roles, the context parameter, signature mistakes.

use super::*;
use proc_macro2::TokenStream;
use quote::quote;

/// The model of `item` and every error its analysis recorded.
fn analyze_str(item: TokenStream, bucket: Option<&str>) -> (GraphFn, Vec<String>) {
    let item: ItemFn = syn::parse2(item).expect("the test function parses");
    let bucket = bucket.map(|b| Ident::new(b, Span::call_site()));
    let mut cx = Ctxt::default();
    let model = analyze(item, bucket.as_ref(), &mut cx);
    (model, cx.messages())
}

/// The single error of `item`, which must contain `needle`.
fn one_error(item: TokenStream, needle: &str) {
    let (_, errors) = analyze_str(item, None);
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert!(errors[0].contains(needle), "`{needle}` not in {errors:#?}");
}

fn text(t: &impl ToTokens) -> String {
    t.to_token_stream().to_string()
}

#[test]
fn roles_follow_the_references_and_the_attributes() {
    let (model, errors) = analyze_str(
        quote! {
            fn step(
                rt: &Runtime,
                x: &CudaSlice<f32>,
                #[input] x2: &CudaSlice<f32>,
                y: &mut CudaSlice<f32>,
                #[output] y2: &mut CudaSlice<f32>,
                #[state] w: &CudaSlice<f32>,
                #[state] kv: &mut CudaSlice<f32>,
                #[constant] n: u32,
            ) -> Result<(), GraphError> { Ok(()) }
        },
        None,
    );
    assert!(errors.is_empty(), "{errors:#?}");
    assert_eq!(
        text(&model.context.as_ref().expect("a context").ty),
        "Runtime"
    );
    let roles: Vec<(String, Role)> = model
        .params
        .iter()
        .map(|p| (p.ident.to_string(), p.role))
        .collect();
    assert_eq!(
        roles,
        [
            ("x".to_owned(), Role::Input),
            ("x2".to_owned(), Role::Input),
            ("y".to_owned(), Role::Output),
            ("y2".to_owned(), Role::Output),
            ("w".to_owned(), Role::State { mutable: false }),
            ("kv".to_owned(), Role::State { mutable: true }),
            ("n".to_owned(), Role::Constant),
        ]
    );
    // Buffers are recorded by the type they reference; constants by their own type.
    assert_eq!(text(&model.params[0].ty), "CudaSlice < f32 >");
    assert_eq!(text(&model.params[6].ty), "u32");
    // The emitted function keeps its parameters, without the role attributes.
    let emitted = text(&model.item);
    for role in ROLE_ATTRS {
        assert!(!emitted.contains(&format!("# [{role}]")), "{emitted}");
    }
    assert_eq!(model.of(|r| r == Role::Input).count(), 2);
}

#[test]
fn strip_role_attrs_keeps_other_attributes() {
    let mut item: ItemFn = syn::parse_quote! {
        fn f(rt: &Runtime, #[state] #[allow(unused)] w: &CudaSlice<f32>, x: &CudaSlice<f32>) {}
    };
    let roles = strip_role_attrs(&mut item);
    assert_eq!(roles.iter().map(Vec::len).collect::<Vec<_>>(), [0, 1, 0]);
    let FnArg::Typed(w) = &item.sig.inputs[1] else {
        panic!("a typed parameter")
    };
    assert_eq!(w.attrs.len(), 1);
    assert!(w.attrs[0].path().is_ident("allow"));
}

#[test]
fn the_context_comes_first_and_is_a_shared_reference() {
    let (model, errors) = analyze_str(
        quote!(
            fn f(s: &Arc<CudaStream>, x: &CudaSlice<f32>) {}
        ),
        None,
    );
    assert!(errors.is_empty(), "{errors:#?}");
    assert_eq!(
        text(&model.context.expect("a context").ty),
        "Arc < CudaStream >"
    );
    one_error(
        quote!(
            fn f() {}
        ),
        "needs an execution context",
    );
    one_error(
        quote!(
            fn f(rt: Runtime) {}
        ),
        "must be a shared reference",
    );
    one_error(
        quote!(
            fn f(rt: &mut Runtime) {}
        ),
        "must be a shared reference",
    );
    one_error(
        quote!(
            fn f(#[state] rt: &Runtime) {}
        ),
        "takes no role attribute",
    );
}

#[test]
fn signature_mistakes() {
    for (item, needle) in [
        (
            quote!(
                async fn f(rt: &Runtime) {}
            ),
            "non-async",
        ),
        (
            quote!(
                const fn f(rt: &Runtime) {}
            ),
            "`const fn`",
        ),
        (
            quote!(
                unsafe fn f(rt: &Runtime) {}
            ),
            "safe fn",
        ),
        (
            quote!(
                extern "C" fn f(rt: &Runtime) {}
            ),
            "`extern` ABI",
        ),
        (
            quote!(
                fn f<T>(rt: &Runtime) {}
            ),
            "without generic",
        ),
        (
            quote!(
                fn f<'a>(rt: &'a Runtime) {}
            ),
            "without generic",
        ),
    ] {
        one_error(item, needle);
    }
    // A method: one error, and its parameters are not classified.
    let (model, errors) = analyze_str(
        quote!(
            fn f(&self, x: u32) {}
        ),
        None,
    );
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert!(errors[0].contains("cannot be put on a method"));
    assert!(model.params.is_empty() && model.context.is_none());
}

#[test]
fn parameter_mistakes() {
    for (param, needle) in [
        (quote!(n: u32), "mark it `#[constant]`"),
        (
            quote!(#[input] x: &mut CudaSlice<f32>),
            "input `x` is `&mut`",
        ),
        (
            quote!(#[output] y: &CudaSlice<f32>),
            "output `y` must be `&mut`",
        ),
        (quote!(#[constant] n: &u32), "is a reference"),
        (quote!(#[state] w: CudaSlice<f32>), "passed by value"),
        (
            quote!(#[state] #[constant] w: &CudaSlice<f32>),
            "more than one role",
        ),
        (quote!(x: &Vec<f32>), "is host memory (`Vec<f32>`)"),
        (quote!(y: &mut [f32]), "is host memory (`[f32]`)"),
        (
            quote!(x: &CudaView<'static, f32>),
            "borrows (it has a lifetime)",
        ),
        (quote!(x: &impl StaticBuffer), "`impl Trait`"),
        (
            quote!(rt: &CudaSlice<f32>),
            "clashes with the first parameter",
        ),
        (quote!((a, b): (u32, u32)), "plain names"),
    ] {
        one_error(quote!(fn f(ctx: &Runtime, #param) {}), needle);
    }
}

#[test]
fn static_lifetimes_are_owned_and_other_lifetimes_say_what_to_do_for_a_model() {
    for param in [
        quote!(#[state] net: &Func<'static>),
        quote!(#[state] net: &mut ModelState<Func<'static>>),
        quote!(#[state] net: &Box<dyn Module + 'static>),
        quote!(#[state] names: &Vec<&'static str>),
    ] {
        let (model, errors) = analyze_str(quote!(fn f(rt: &Runtime, #param) {}), None);
        assert!(errors.is_empty(), "{param}: {errors:#?}");
        assert_eq!(model.params.len(), 1, "{param}");
    }
    let (_, errors) = analyze_str(
        quote!(
            fn f(rt: &Runtime, #[state] net: &Func<'a>) {}
        ),
        None,
    );
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert!(
        errors[0].contains("borrows (it has a lifetime)"),
        "{}",
        errors[0]
    );
    assert!(errors[0].contains("ModelState"), "{}", errors[0]);
    let (_, errors) = analyze_str(
        quote!(
            fn f(rt: &Runtime, #[state] w: &Vec<&CudaSlice<f32>>) {}
        ),
        None,
    );
    assert_eq!(errors.len(), 1, "an elided reference borrows: {errors:#?}");
}

#[test]
fn every_parameter_mistake_is_reported() {
    let (model, errors) = analyze_str(
        quote!(
            fn f(rt: &Runtime, a: u32, #[input] b: &mut CudaSlice<f32>, c: &CudaSlice<f32>) {}
        ),
        None,
    );
    assert_eq!(errors.len(), 2, "{errors:#?}");
    // The valid parameter is still classified.
    assert_eq!(model.params.len(), 1);
    assert_eq!(model.params[0].ident, "c");
}

#[test]
fn the_batch_parameter_of_a_bucket_family() {
    let (model, errors) = analyze_str(
        quote!(
            fn f(rt: &Runtime, x: &CudaSlice<f32>, batch: usize) {}
        ),
        Some("batch"),
    );
    assert!(errors.is_empty(), "{errors:#?}");
    assert_eq!(model.params[1].role, Role::Bucket);
    let (_, errors) = analyze_str(
        quote!(
            fn f(rt: &Runtime, x: &CudaSlice<f32>) {}
        ),
        Some("batch"),
    );
    assert!(errors[0].contains("names a parameter `batch` that the function does not have"));
    let (_, errors) = analyze_str(
        quote!(
            fn f(rt: &Runtime, x: &CudaSlice<f32>, batch: f32) {}
        ),
        Some("batch"),
    );
    assert!(
        errors[0].contains("must be an integer passed by value"),
        "{errors:#?}"
    );
    let (_, errors) = analyze_str(
        quote!(
            fn f(rt: &Runtime, #[constant] batch: usize) {}
        ),
        Some("batch"),
    );
    assert!(errors[0].contains("takes no role attribute"), "{errors:#?}");
    let (_, errors) = analyze_str(
        quote!(
            fn f(rt: &Runtime, batch: usize) {}
        ),
        Some("batch"),
    );
    assert!(
        errors[0].contains("at least one input or output"),
        "{errors:#?}"
    );
}

#[test]
fn host_elements() {
    let ty = |t: TokenStream| syn::parse2::<Type>(t).expect("a type");
    assert_eq!(host_element(&ty(quote!(Vec<f32>))), Some("f32".to_owned()));
    assert_eq!(host_element(&ty(quote!(Box<[u8]>))), Some("u8".to_owned()));
    assert_eq!(host_element(&ty(quote!([i32; 4]))), Some("i32".to_owned()));
    assert_eq!(host_element(&ty(quote!(usize))), Some("usize".to_owned()));
    assert_eq!(host_element(&ty(quote!(CudaSlice<f32>))), None);
    assert_eq!(host_element(&ty(quote!(my::f32))), None);
}
