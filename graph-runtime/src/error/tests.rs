//! Unit tests of the error conversions.

use super::*;
use cudarc::driver::DriverError;

#[test]
fn body_errors_keep_their_kind() {
    use cudarc::driver::sys::CUresult;
    let r: Result<(), DriverError> =
        Err(DriverError(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED));
    let e = r.into_graph_result().unwrap_err();
    assert!(matches!(e, GraphError::Driver(_)));
    let mapped = GraphError::in_capture("f", e);
    assert!(matches!(
        mapped,
        GraphError::CaptureUnsupported { graph: "f" }
    ));

    let r: Result<(), GraphError> = Err(GraphError::EmptyGraph { graph: "g" });
    assert!(matches!(
        r.into_graph_result(),
        Err(GraphError::EmptyGraph { graph: "g" })
    ));

    #[derive(Debug)]
    struct Mine;
    impl std::fmt::Display for Mine {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("my error")
        }
    }
    impl std::error::Error for Mine {}
    let r: Result<(), Mine> = Err(Mine);
    let e = GraphError::in_capture("f", r.into_graph_result().unwrap_err());
    assert_eq!(
        e.to_string(),
        "capturing `f` failed inside the body: my error"
    );
    assert!(().into_graph_result().is_ok());
}

#[test]
fn classification_looks_through_every_wrapper() {
    let oom = GraphError::OutOfMemory {
        during: "allocating".to_owned(),
        requested_bytes: Some(4096),
        free_bytes: None,
    };
    let in_loop = GraphError::ConditionalBody {
        construct: "graph_while",
        graph: "g",
        location: std::panic::Location::caller(),
        source: Box::new(oom),
    };
    let in_warmup = GraphError::Warmup {
        graph: "g",
        iteration: 1,
        warmup: 2,
        source: Box::new(in_loop),
    };
    assert!(in_warmup.is_out_of_memory());
    assert_eq!(in_warmup.requested_bytes(), Some(4096));
    assert_eq!(in_warmup.capture_code(), None);
    let unsupported = GraphError::ConditionalBody {
        construct: "graph_if",
        graph: "g",
        location: std::panic::Location::caller(),
        source: Box::new(GraphError::CaptureUnsupported { graph: "g" }),
    };
    assert_eq!(unsupported.capture_code(), Some(900));
    assert!(!unsupported.is_out_of_memory());
}

/// `fn main() -> Result<(), GraphError>` prints `Error: {:?}`: the Debug form must carry the
/// message a user acts on, then say which variant it is.
#[test]
fn debug_form_carries_the_message_and_the_variant() {
    let e = GraphError::NoDriver;
    let debug = format!("{e:?}");
    assert!(debug.starts_with(&e.to_string()), "{debug}");
    assert!(debug.ends_with("(GraphError::NoDriver)"), "{debug}");

    let e = GraphError::EmptyGraph { graph: "decode" };
    let debug = format!("{e:?}");
    assert!(debug.contains("decode"), "{debug}");
    assert!(debug.starts_with(&e.to_string()), "{debug}");
    assert!(debug.ends_with("(GraphError::EmptyGraph)"), "{debug}");
    assert_eq!(format!("{e:#?}"), debug);
}

/// The message a user without a GPU reads speaks of their program, not of this
/// repository's tests.
#[test]
fn no_driver_speaks_in_the_users_terms() {
    let text = GraphError::NoDriver.to_string();
    assert!(text.starts_with("no CUDA driver"), "{text}");
    assert!(text.contains("install the NVIDIA driver"), "{text}");
    for word in ["workspace", "CUDA_GRAPH_REQUIRE_GPU", "test"] {
        assert!(!text.contains(word), "{text}");
    }
}

#[test]
fn a_registered_framework_converts_its_own_errors_and_only_them() {
    #[derive(Debug)]
    struct FrameworkOwn;
    impl std::fmt::Display for FrameworkOwn {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("the framework's error")
        }
    }
    impl std::error::Error for FrameworkOwn {}
    fn convert(e: BoxError) -> Result<GraphError, BoxError> {
        e.downcast::<FrameworkOwn>()
            .map(|_| GraphError::EmptyGraph { graph: "converted" })
    }
    register_framework_errors("a test framework", convert);
    // Twice under one name: one entry.
    register_framework_errors("a test framework", convert);
    let r: Result<(), FrameworkOwn> = Err(FrameworkOwn);
    assert!(matches!(
        r.into_graph_result(),
        Err(GraphError::EmptyGraph { graph: "converted" })
    ));
    // Other errors pass through it untouched.
    let r: Result<(), std::fmt::Error> = Err(std::fmt::Error);
    assert!(matches!(r.into_graph_result(), Err(GraphError::User(_))));
    let r: Result<(), DriverError> = Err(DriverError(
        cudarc::driver::sys::CUresult::CUDA_ERROR_INVALID_VALUE,
    ));
    assert!(matches!(r.into_graph_result(), Err(GraphError::Driver(_))));
}
