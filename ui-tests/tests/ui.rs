//! Compile-time behaviour of `#[cuda_graph]`: `pass/` must compile, `fail/` (and with the
//! `nccl` feature `fail-nccl/`) must fail with exactly the `.stderr` next to each case.
//! Re-bless with `TRYBUILD=overwrite` (README.md).

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/pass/*.rs");
    t.compile_fail("tests/fail/*.rs");
}

/// The cases that need graph-runtime's `nccl` (`--features nccl`): `fail-nccl/` must fail
/// with exactly its snapshots.
#[cfg(feature = "nccl")]
#[test]
fn ui_nccl() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/fail-nccl/*.rs");
}
