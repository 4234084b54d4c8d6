//! Comparisons of GPU results: bit for bit (eager against graph) and within a tolerance
//! (against the host reference models).

/// The first line of a verification report (`verify `name` (bitwise): replay = eager`), or
/// the whole report as an error when the replay disagreed with the eager run.
pub fn verified(report: graph_runtime::VerifyReport) -> Result<String, graph_runtime::GraphError> {
    let report = report.into_result()?;
    Ok(report
        .to_string()
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned())
}

/// Where two `f32` sequences first differ bit for bit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Mismatch {
    /// The first index whose values differ (or the shorter length, if one is a prefix).
    pub index: usize,
    /// The value of the first sequence there (`NaN` past its end).
    pub a: f32,
    /// The value of the second sequence there (`NaN` past its end).
    pub b: f32,
}

/// The first index where `a` and `b` differ bit for bit (lengths included), or `None` when
/// they are identical. `-0.0` and `0.0` differ; two NaNs with the same bits do not.
pub fn first_mismatch(a: &[f32], b: &[f32]) -> Option<Mismatch> {
    let common = a.len().min(b.len());
    if let Some(i) = (0..common).find(|&i| a[i].to_bits() != b[i].to_bits()) {
        return Some(Mismatch {
            index: i,
            a: a[i],
            b: b[i],
        });
    }
    (a.len() != b.len()).then(|| Mismatch {
        index: common,
        a: a.get(common).copied().unwrap_or(f32::NAN),
        b: b.get(common).copied().unwrap_or(f32::NAN),
    })
}

/// Compares an eager and a graphed training run bit for bit: their loss curves and, when
/// given, their final parameters. `Err` says what differs first (steps counted from 1).
pub fn same_training(
    losses: (&[f32], &[f32]),
    params: Option<(&[f32], &[f32])>,
) -> Result<(), String> {
    if let Some(d) = first_mismatch(losses.0, losses.1) {
        return Err(format!(
            "the loss curves differ first at step {}: eager {} graph {}",
            d.index + 1,
            d.a,
            d.b
        ));
    }
    if let Some(d) = params.and_then(|(eager, graph)| first_mismatch(eager, graph)) {
        return Err(format!(
            "the final weights differ first at parameter {}: eager {} graph {}",
            d.index, d.a, d.b
        ));
    }
    Ok(())
}

/// The largest `|a - b| / max(1, |b|)`: an error that is absolute near zero and relative
/// for large values.
///
/// # Panics
/// If the slices differ in length.
pub fn max_scaled_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "compared slices differ in length");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs() / y.abs().max(1.0))
        .fold(0.0, f32::max)
}

/// The largest absolute difference between two equally long slices.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "compared slices differ in length");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// The largest `|got - want| / |want|` (`|want|` taken as at least `1e-12`): how far GPU
/// figures are from the host reference's.
///
/// # Panics
/// If the slices differ in length.
pub fn max_rel_err(got: &[f32], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len(), "compared slices differ in length");
    got.iter()
        .zip(want)
        .map(|(&g, &w)| (g as f64 - w).abs() / w.abs().max(1e-12))
        .fold(0.0, f64::max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bitwise_mismatches() {
        assert_eq!(first_mismatch(&[1.0, 2.0], &[1.0, 2.0]), None);
        let m = first_mismatch(&[1.0, 2.0, 3.0], &[1.0, 2.5, 3.0]).unwrap();
        assert_eq!((m.index, m.a, m.b), (1, 2.0, 2.5));
        // Sign of zero counts: the curves must be bitwise identical.
        assert_eq!(first_mismatch(&[0.0], &[-0.0]).unwrap().index, 0);
        // The smallest possible difference is found.
        let x = 1.0f32;
        let next = f32::from_bits(x.to_bits() + 1);
        assert_eq!(first_mismatch(&[x], &[next]).unwrap().index, 0);
        // A prefix is a mismatch at the shorter length.
        let m = first_mismatch(&[1.0], &[1.0, 2.0]).unwrap();
        assert_eq!(m.index, 1);
        assert!(m.a.is_nan());
        assert_eq!(m.b, 2.0);
        // Identical NaN bits are equal.
        assert_eq!(first_mismatch(&[f32::NAN], &[f32::NAN]), None);
    }

    #[test]
    fn training_runs_compared() {
        let (l, p) = ([1.0, 0.5], [3.0, 4.0]);
        assert_eq!(same_training((&l, &l), Some((&p, &p))), Ok(()));
        assert_eq!(same_training((&l, &l), None), Ok(()));
        let e = same_training((&l, &[1.0, 0.25]), Some((&p, &p))).unwrap_err();
        assert!(e.contains("loss curves differ first at step 2"), "{e}");
        let e = same_training((&l, &l), Some((&p, &[3.0, -4.0]))).unwrap_err();
        assert!(
            e.contains("final weights differ first at parameter 1"),
            "{e}"
        );
    }

    #[test]
    fn scaled_differences() {
        assert_eq!(max_scaled_diff(&[1.0, 200.0], &[1.0, 200.0]), 0.0);
        assert!((max_scaled_diff(&[0.5], &[0.25]) - 0.25).abs() < 1e-7);
        assert!((max_scaled_diff(&[110.0], &[100.0]) - 0.1).abs() < 1e-6);
    }

    #[test]
    fn relative_errors() {
        assert_eq!(max_rel_err(&[2.0, 4.0], &[2.0, 4.0]), 0.0);
        assert!((max_rel_err(&[2.0, 4.4], &[2.0, 4.0]) - 0.1).abs() < 1e-6);
        assert_eq!(
            max_rel_err(&[1e-12], &[0.0]),
            1e-12 / 1e-12 * (1e-12f32 as f64) / 1e-12
        );
    }

    #[test]
    fn absolute_differences() {
        assert_eq!(max_abs_diff(&[1.0, -2.0], &[1.0, -2.0]), 0.0);
        assert_eq!(max_abs_diff(&[1.0, -2.0], &[1.5, -4.0]), 2.0);
    }
}
