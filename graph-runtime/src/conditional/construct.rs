//! What a construct is: driver-version checks and [`Construct`] (which conditional node a
//! construct records, what it needs of the driver). `conditional/api.rs` builds on it.

use super::*;

// ---------------------------------------------------------------------------------------
// Driver support.

/// CUDA 12.4: conditional IF and WHILE nodes, `cudaGraphSetConditional`.
pub(super) const NEEDS_CONDITIONALS: i32 = 12040;
/// CUDA 12.8: IF nodes with an ELSE body.
pub(super) const NEEDS_IF_ELSE: i32 = 12080;

pub(super) fn version_text(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

pub(super) fn installed_driver() -> Result<i32, DriverError> {
    static VERSION: OnceLock<i32> = OnceLock::new();
    if let Some(v) = VERSION.get() {
        return Ok(*v);
    }
    let v = driver::driver_version()?;
    Ok(*VERSION.get_or_init(|| v))
}

/// Refuses `construct` on a driver older than `needs`.
pub(super) fn require_driver(
    construct: &'static str,
    needs: i32,
    location: &'static Location<'static>,
) -> Result<(), GraphError> {
    let have = installed_driver()?;
    check_version(construct, have, needs, location)
}

pub(super) fn check_version(
    construct: &'static str,
    have: i32,
    needs: i32,
    location: &'static Location<'static>,
) -> Result<(), GraphError> {
    if have >= needs {
        return Ok(());
    }
    Err(GraphError::ConditionalUnsupported {
        construct,
        driver: version_text(have),
        needs: if needs >= NEEDS_IF_ELSE {
            "12.8"
        } else {
            "12.4"
        },
        location,
    })
}

// ---------------------------------------------------------------------------------------
// The constructs.

/// Which conditional node a construct records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Construct {
    While,
    If,
    IfElse,
}

impl Construct {
    pub(super) fn name(self) -> &'static str {
        match self {
            Construct::While => "graph_while",
            Construct::If => "graph_if",
            Construct::IfElse => "graph_if_else",
        }
    }

    pub(super) fn needs(self) -> i32 {
        match self {
            Construct::IfElse => NEEDS_IF_ELSE,
            _ => NEEDS_CONDITIONALS,
        }
    }

    pub(super) fn bodies(self) -> u32 {
        match self {
            Construct::IfElse => 2,
            _ => 1,
        }
    }

    pub(super) fn node_type(self) -> sys::CUgraphConditionalNodeType {
        match self {
            Construct::While => sys::CUgraphConditionalNodeType::CU_GRAPH_COND_TYPE_WHILE,
            _ => sys::CUgraphConditionalNodeType::CU_GRAPH_COND_TYPE_IF,
        }
    }
}

/// One body of a construct: records (or runs) branch `i`.
pub(super) type Branches<'a> = dyn FnMut(&Runtime, usize) -> Result<(), GraphError> + 'a;
