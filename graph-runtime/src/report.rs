//! What a verification found: pure data and the element-by-element comparison, so that the
//! error type can carry a report without depending on the runtime.

use crate::region::{DeviceRegion, Elem};

/// How close a replay's outputs must be to the eager run's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tolerance {
    /// Largest absolute difference allowed per element.
    pub abs: f64,
    /// Largest difference relative to the eager value allowed per element.
    pub rel: f64,
}

impl Tolerance {
    /// Bit for bit (the default): a graph replays the same kernels on the same data.
    pub const BITWISE: Tolerance = Tolerance { abs: 0.0, rel: 0.0 };

    /// An element passes when it is within `abs` absolutely or within `rel` relatively (for
    /// kernels that are not bitwise reproducible, such as ones that add with atomics).
    pub fn new(abs: f64, rel: f64) -> Self {
        Tolerance { abs, rel }
    }

    fn is_bitwise(&self) -> bool {
        self.abs == 0.0 && self.rel == 0.0
    }
}

impl Default for Tolerance {
    fn default() -> Self {
        Tolerance::BITWISE
    }
}

/// What one compared item is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compared {
    /// An output parameter.
    Output,
    /// A `&mut` state parameter (what the call left in it).
    State,
}

/// The comparison of one output or state.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ItemReport {
    /// The parameter's name.
    pub name: &'static str,
    /// Output or state.
    pub kind: Compared,
    /// Elements compared (bytes, where the element type is not known).
    pub elements: usize,
    /// Every element is bitwise equal.
    pub bitwise_equal: bool,
    /// Every element is within the tolerance.
    pub within_tolerance: bool,
    /// The largest absolute difference (0 when the element type is not numeric).
    pub max_abs: f64,
    /// The largest difference relative to the eager value.
    pub max_rel: f64,
    /// The first index that is not bitwise equal.
    pub first_difference: Option<usize>,
}

/// The result of [verifying](super) one replay against the eager function.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct VerifyReport {
    /// The graph.
    pub graph: &'static str,
    /// The tolerance the items were held to.
    pub tolerance: Tolerance,
    /// Every output, then every `&mut` state, in parameter order.
    pub items: Vec<ItemReport>,
    /// Which replay of the graph verified itself (from 1), when a schedule made it do so
    /// (`verify = …`, the default of debug builds); `None` for a call of `verify`.
    pub replay: Option<u64>,
    /// The bucket (batch size) whose graph was verified, in a bucket family
    /// (`buckets(…)`); `None` for a single graph.
    pub bucket: Option<usize>,
}

impl VerifyReport {
    /// Whether every item is within the tolerance.
    pub fn is_ok(&self) -> bool {
        self.items.iter().all(|i| i.within_tolerance)
    }
}

impl std::fmt::Display for VerifyReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let tolerance = if self.tolerance.is_bitwise() {
            "bitwise".to_owned()
        } else {
            format!("abs {:e}, rel {:e}", self.tolerance.abs, self.tolerance.rel)
        };
        let replay = self
            .replay
            .map_or(String::new(), |n| format!(", replay {n}"));
        let bucket = self
            .bucket
            .map_or(String::new(), |b| format!("bucket {b}, "));
        write!(
            f,
            "verify `{}` ({bucket}{tolerance}{replay}): {}",
            self.graph,
            if self.is_ok() {
                "replay = eager"
            } else {
                "MISMATCH"
            }
        )?;
        for i in &self.items {
            let kind = match i.kind {
                Compared::Output => "output",
                Compared::State => "state",
            };
            write!(f, "\n  {kind} `{}`: {} elements, ", i.name, i.elements)?;
            match (i.bitwise_equal, i.first_difference) {
                (true, _) => write!(f, "bitwise equal")?,
                (false, Some(at)) => write!(
                    f,
                    "{} (first difference at {at}, max abs {:e}, max rel {:e})",
                    if i.within_tolerance {
                        "within tolerance"
                    } else {
                        "DIFFERENT"
                    },
                    i.max_abs,
                    i.max_rel
                )?,
                (false, None) => write!(f, "DIFFERENT (sizes differ)")?,
            }
        }
        Ok(())
    }
}

/// One item's bytes as the eager run and the replay left them.
pub(crate) struct Observed {
    pub(crate) name: &'static str,
    pub(crate) kind: Compared,
    pub(crate) regions: Vec<DeviceRegion>,
    pub(crate) eager: Vec<u8>,
    pub(crate) replay: Vec<u8>,
}

/// Compares one item element by element.
pub(crate) fn compare(o: &Observed, tolerance: Tolerance) -> ItemReport {
    let elem = o
        .regions
        .first()
        .map(|r| r.elem)
        .filter(|e| o.regions.iter().all(|r| r.elem == *e))
        .unwrap_or(Elem::Bytes);
    let size = elem.size();
    let mut report = ItemReport {
        name: o.name,
        kind: o.kind,
        elements: o.eager.len() / size,
        bitwise_equal: o.eager == o.replay,
        within_tolerance: true,
        max_abs: 0.0,
        max_rel: 0.0,
        first_difference: None,
    };
    if o.eager.len() != o.replay.len() {
        report.within_tolerance = false;
        return report;
    }
    for (i, (e, r)) in o
        .eager
        .chunks_exact(size)
        .zip(o.replay.chunks_exact(size))
        .enumerate()
    {
        if e == r {
            continue;
        }
        report.first_difference.get_or_insert(i);
        match (value(elem, e), value(elem, r)) {
            (Some(a), Some(b)) => {
                let abs = (a - b).abs();
                let rel = if a != 0.0 { abs / a.abs() } else { abs };
                let nan_mismatch = a.is_nan() != b.is_nan();
                if abs.is_finite() {
                    report.max_abs = report.max_abs.max(abs);
                    report.max_rel = report.max_rel.max(rel);
                }
                if nan_mismatch || !(abs <= tolerance.abs || rel <= tolerance.rel) {
                    report.within_tolerance = false;
                }
            }
            _ => report.within_tolerance = false,
        }
    }
    report
}

/// The numeric value of one element, where the element type is known. `b` is a slice of the
/// bytes read back from the device, so it need not be aligned for the element type.
fn value(elem: Elem, b: &[u8]) -> Option<f64> {
    let arr = |n: usize| -> [u8; 8] {
        let mut a = [0u8; 8];
        a[..n].copy_from_slice(&b[..n]);
        a
    };
    Some(match elem {
        Elem::Bytes => return None,
        Elem::F32 => bytemuck::try_pod_read_unaligned::<f32>(b).ok()? as f64,
        Elem::F64 => bytemuck::try_pod_read_unaligned::<f64>(b).ok()?,
        Elem::UInt(n) => u64::from_ne_bytes(arr(n as usize)) as f64,
        Elem::Int(n) => {
            let shift = 64 - 8 * n as u32;
            ((i64::from_ne_bytes(arr(n as usize)) << shift) >> shift) as f64
        }
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// An observed output `y` of `elem` values: the eager and the replayed bytes.
    pub(crate) fn observed(elem: Elem, eager: &[f32], replay: &[f32]) -> Observed {
        let bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_ne_bytes()).collect::<Vec<u8>>();
        Observed {
            name: "y",
            kind: Compared::Output,
            regions: vec![DeviceRegion {
                elem,
                ..DeviceRegion::device(0, eager.len() * 4)
            }],
            eager: bytes(eager),
            replay: bytes(replay),
        }
    }

    #[test]
    fn bitwise_and_tolerant_comparisons() {
        let same = compare(
            &observed(Elem::F32, &[1.0, 2.0], &[1.0, 2.0]),
            Tolerance::BITWISE,
        );
        assert!(same.bitwise_equal && same.within_tolerance);
        assert_eq!(same.first_difference, None);

        let off = observed(Elem::F32, &[1.0, 2.0, 4.0], &[1.0, 2.0001, 4.0]);
        let strict = compare(&off, Tolerance::BITWISE);
        assert!(!strict.within_tolerance && !strict.bitwise_equal);
        assert_eq!(strict.first_difference, Some(1));
        assert!((strict.max_abs - 1e-4).abs() < 1e-6, "{}", strict.max_abs);
        assert!((strict.max_rel - 5e-5).abs() < 1e-6, "{}", strict.max_rel);
        let loose = compare(&off, Tolerance::new(0.0, 1e-4));
        assert!(loose.within_tolerance && !loose.bitwise_equal);

        let nan = compare(
            &observed(Elem::F32, &[f32::NAN], &[1.0]),
            Tolerance::new(1e9, 1e9),
        );
        assert!(
            !nan.within_tolerance,
            "NaN on one side only fails any tolerance"
        );

        let bytes = compare(
            &observed(Elem::Bytes, &[1.0], &[1.5]),
            Tolerance::new(1.0, 1.0),
        );
        assert!(!bytes.within_tolerance, "unknown elements compare bitwise");
        assert_eq!(bytes.elements, 4);
    }

    #[test]
    fn integers_are_read_with_their_sign() {
        assert_eq!(value(Elem::Int(4), &(-3i32).to_ne_bytes()), Some(-3.0));
        assert_eq!(value(Elem::UInt(2), &7u16.to_ne_bytes()), Some(7.0));
        assert_eq!(value(Elem::Int(1), &[0xff]), Some(-1.0));
    }
}
