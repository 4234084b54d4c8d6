//! Compile-time behaviour of `#[cuda_graph]`: `pass/` must compile, `fail/` must fail with
//! exactly the `.stderr` next to each case. Re-bless with `TRYBUILD=overwrite` (README.md).

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/pass/*.rs");
    t.compile_fail("tests/fail/*.rs");
}
