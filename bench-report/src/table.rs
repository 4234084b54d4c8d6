//! Markdown tables, as the examples print them and the report writes them, and the number
//! formats of their cells.

use std::fmt::Write as _;

/// A Markdown table: a header row, then rows of cells.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Table {
    /// Column titles.
    pub headers: Vec<String>,
    /// Whether each column is right-aligned (numbers).
    pub right: Vec<bool>,
    /// The rows, each with one cell per column.
    pub rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column titles. A title starting with `>` is right-aligned (the
    /// `>` is dropped): `Table::new(&["workload", ">µs"])`.
    pub fn new(headers: &[&str]) -> Self {
        let (headers, right) = headers
            .iter()
            .map(|h| match h.strip_prefix('>') {
                Some(rest) => (rest.to_owned(), true),
                None => ((*h).to_owned(), false),
            })
            .unzip();
        Table {
            headers,
            right,
            rows: Vec::new(),
        }
    }

    /// Adds a row.
    ///
    /// # Panics
    /// If the row does not have one cell per column.
    pub fn row(&mut self, cells: Vec<String>) -> &mut Self {
        assert_eq!(
            cells.len(),
            self.headers.len(),
            "a row of {} cells in a table of {} columns",
            cells.len(),
            self.headers.len()
        );
        self.rows.push(cells);
        self
    }

    /// The table as Markdown, one line per row, ending with a newline.
    pub fn to_markdown(&self) -> String {
        let esc = |s: &str| s.replace('|', "\\|").replace('\n', " ");
        let mut out = String::new();
        let _ = writeln!(
            out,
            "| {} |",
            self.headers
                .iter()
                .map(|h| esc(h))
                .collect::<Vec<_>>()
                .join(" | ")
        );
        let rule: Vec<&str> = (0..self.headers.len())
            .map(|i| {
                if self.right.get(i).copied().unwrap_or(false) {
                    "---:"
                } else {
                    "---"
                }
            })
            .collect();
        let _ = writeln!(out, "|{}|", rule.join("|"));
        for r in &self.rows {
            let _ = writeln!(
                out,
                "| {} |",
                r.iter().map(|c| esc(c)).collect::<Vec<_>>().join(" | ")
            );
        }
        out
    }
}

/// A duration in µs with a precision that suits its size.
pub fn us(v: f64) -> String {
    if !v.is_finite() {
        "–".to_owned()
    } else if v >= 1000.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// A ratio such as a speedup: `4.2×`.
pub fn times(v: f64) -> String {
    if v.is_finite() {
        format!("{v:.2}×")
    } else {
        "–".to_owned()
    }
}

/// Two loss curves side by side, eager and graphed, at the 0-based `steps` (shown from 1):
/// the curve table of the training examples.
///
/// # Panics
/// If a step is past the end of either curve.
pub fn loss_curves(eager: &[f32], graph: &[f32], steps: &[usize]) -> Table {
    let mut t = Table::new(&[">step", ">eager loss", ">graph loss"]);
    for &k in steps {
        t.row(vec![
            (k + 1).to_string(),
            format!("{:.6}", eager[k]),
            format!("{:.6}", graph[k]),
        ]);
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_markdown() {
        let mut t = Table::new(&["workload", ">eager µs", ">speedup"]);
        t.row(vec!["mlp | b=1".into(), us(485.25), times(4.71)]);
        t.row(vec!["chain".into(), us(1234.5), times(f64::NAN)]);
        assert_eq!(
            t.to_markdown(),
            "| workload | eager µs | speedup |\n|---|---:|---:|\n| mlp \\| b=1 | 485.2 | 4.71× |\n| chain | 1234 | – |\n"
        );
        assert_eq!(t.right, vec![false, true, true]);
    }

    #[test]
    #[should_panic(expected = "a row of 1 cells in a table of 2 columns")]
    fn rows_must_fill_the_table() {
        Table::new(&["a", "b"]).row(vec!["x".into()]);
    }

    #[test]
    fn loss_curves_side_by_side() {
        let t = loss_curves(&[1.0, 0.5, 0.25], &[1.0, 0.5, 0.125], &[0, 2]);
        assert_eq!(
            t.to_markdown(),
            "| step | eager loss | graph loss |\n|---:|---:|---:|\n| 1 | 1.000000 | 1.000000 |\n| 3 | 0.250000 | 0.125000 |\n"
        );
    }

    #[test]
    fn number_formats() {
        assert_eq!(us(0.123), "0.12");
        assert_eq!(us(12.34), "12.3");
        assert_eq!(us(f64::INFINITY), "–");
        assert_eq!(times(2.0), "2.00×");
    }
}
