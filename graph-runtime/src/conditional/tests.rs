//! Unit tests of the conditional constructs: kernels, version checks, node kinds, records.

use super::construct::*;
use super::record::*;
use super::site::*;
use super::*;

#[test]
fn the_kernels_are_built_on_the_device_api() {
    assert!(CONDITION_KERNELS.starts_with(CONDITION_DEVICE_API));
    assert_eq!(CONDITION_DEVICE_API, crate::condition_device_api!());
    assert!(!CONDITION_DEVICE_API.contains("__global__"));
    for name in [
        "cg_condition_set",
        f32::KERNEL,
        i32::KERNEL,
        u32::KERNEL,
        "cg_loop_bound",
    ] {
        let decl = format!("void {name}(");
        let defined = CONDITION_KERNELS.contains(&format!("extern \"C\" __global__ {decl}"))
            || CONDITION_KERNELS.contains(&format!(
                "CG_SET_FROM({}, {name})",
                match name {
                    "cg_condition_set_from_f32" => "float",
                    "cg_condition_set_from_i32" => "int",
                    _ => "unsigned int",
                }
            ));
        assert!(defined, "kernel {name} is defined");
    }
}

#[test]
fn a_kernel_arg_is_the_device_struct() {
    assert_eq!(std::mem::size_of::<ConditionArg<'_>>(), 16);
    assert_eq!(std::mem::align_of::<ConditionArg<'_>>(), 8);
}

#[test]
fn comparisons_match_their_codes() {
    let all = [
        Compare::Lt,
        Compare::Le,
        Compare::Gt,
        Compare::Ge,
        Compare::Eq,
        Compare::Ne,
    ];
    let codes: Vec<i32> = all.iter().map(|c| c.code()).collect();
    assert_eq!(
        codes,
        [0, 1, 2, 3, 4, 5],
        "the order of `cg_compare`'s cases"
    );
    assert!(Compare::Gt.holds(2.0, 1.0) && !Compare::Gt.holds(1.0, 1.0));
    assert!(Compare::Ge.holds(1, 1) && Compare::Le.holds(1u32, 1));
    assert!(!Compare::Gt.holds(f32::NAN, 0.0) && Compare::Ne.holds(f32::NAN, 0.0));
}

#[test]
fn old_drivers_get_a_typed_error() {
    let here = Location::caller();
    let e = check_version("graph_while", 12020, NEEDS_CONDITIONALS, here).unwrap_err();
    let text = e.to_string();
    assert!(
        matches!(
            e,
            GraphError::ConditionalUnsupported {
                construct: "graph_while",
                needs: "12.4",
                ..
            }
        ),
        "{e:?}"
    );
    assert!(
        text.contains("CUDA 12.2") && text.contains("driver 550"),
        "{text}"
    );
    let e = check_version("graph_if_else", 12060, NEEDS_IF_ELSE, here).unwrap_err();
    assert!(e.to_string().contains("CUDA 12.8"), "{e}");
    assert!(check_version("graph_if_else", 12080, NEEDS_IF_ELSE, here).is_ok());
    assert!(check_version("graph_while", 13000, NEEDS_CONDITIONALS, here).is_ok());
    assert_eq!(version_text(12040), "12.4");
    assert_eq!(version_text(13000), "13.0");
}

#[test]
fn forbidden_kinds_are_named() {
    use sys::CUgraphNodeType as T;
    for ok in [
        T::CU_GRAPH_NODE_TYPE_KERNEL,
        T::CU_GRAPH_NODE_TYPE_MEMCPY,
        T::CU_GRAPH_NODE_TYPE_MEMSET,
        T::CU_GRAPH_NODE_TYPE_EMPTY,
        T::CU_GRAPH_NODE_TYPE_CONDITIONAL,
    ] {
        assert_eq!(forbidden_kind(ok), None, "{ok:?}");
    }
    assert!(forbidden_kind(T::CU_GRAPH_NODE_TYPE_MEM_ALLOC)
        .unwrap()
        .contains("allocation"));
    assert!(forbidden_kind(T::CU_GRAPH_NODE_TYPE_MEM_FREE)
        .unwrap()
        .contains("free"));
    assert!(forbidden_kind(T::CU_GRAPH_NODE_TYPE_HOST)
        .unwrap()
        .contains("host"));
}

#[test]
fn constructs_map_to_nodes() {
    assert_eq!(Construct::While.bodies(), 1);
    assert_eq!(Construct::IfElse.bodies(), 2);
    assert_eq!(Construct::IfElse.needs(), NEEDS_IF_ELSE);
    assert_eq!(Construct::If.needs(), NEEDS_CONDITIONALS);
    assert_eq!(
        Construct::IfElse.node_type(),
        sys::CUgraphConditionalNodeType::CU_GRAPH_COND_TYPE_IF
    );
    assert_eq!(
        Construct::While.node_type(),
        sys::CUgraphConditionalNodeType::CU_GRAPH_COND_TYPE_WHILE
    );
}

#[test]
fn records_track_their_handles() {
    open_record(
        std::ptr::null_mut(),
        sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
    );
    with_record(|r| {
        r.handles.push(HandleRecord {
            handle: 7,
            location: Location::caller(),
            used: false,
        })
    });
    let r = close_record().expect("a record");
    assert!(!r.poisoned);
    assert_eq!(r.handles(), vec![7]);
    assert!(r.unused_condition().is_some());
    assert!(r.bodies_of(std::ptr::null_mut()).is_none());
    assert!(close_record().is_none(), "closed once");
}
