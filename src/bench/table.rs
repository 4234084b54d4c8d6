//! Markdown tables: written by the examples and the report, and read back from the output of
//! `examples/02-chain.rs` (which prints tables, not JSON).

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

    /// The index of the first column whose title is `name` (ignoring case and surrounding
    /// spaces).
    pub fn column(&self, name: &str) -> Option<usize> {
        self.headers
            .iter()
            .position(|h| h.trim().eq_ignore_ascii_case(name.trim()))
    }

    /// The cells of column `name` parsed as numbers (a trailing `×` or `x` allowed), one per
    /// row; `None` for a cell that is not a number.
    pub fn numbers(&self, name: &str) -> Option<Vec<Option<f64>>> {
        let c = self.column(name)?;
        Some(
            self.rows
                .iter()
                .map(|r| r.get(c).and_then(|cell| parse_number(cell)))
                .collect(),
        )
    }
}

/// Parses a table cell as a number: `12.5`, `3.1×`, `+0.25`, `1,024`.
pub fn parse_number(cell: &str) -> Option<f64> {
    let t = cell.trim().trim_end_matches(['×', 'x']).replace(',', "");
    t.trim().parse().ok()
}

/// Every Markdown table in `text`: runs of lines starting with `|` whose second line is a
/// separator row (`|---|---:|`).
pub fn parse_markdown_tables(text: &str) -> Vec<Table> {
    let split = |line: &str| -> Vec<String> {
        let inner = line.trim().trim_start_matches('|');
        let inner = inner.strip_suffix('|').unwrap_or(inner);
        let mut cells = Vec::new();
        let mut cur = String::new();
        let mut chars = inner.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '\\' if chars.peek() == Some(&'|') => {
                    cur.push('|');
                    chars.next();
                }
                '|' => cells.push(std::mem::take(&mut cur).trim().to_owned()),
                c => cur.push(c),
            }
        }
        cells.push(cur.trim().to_owned());
        cells
    };
    let is_rule = |cells: &[String]| {
        !cells.is_empty()
            && cells.iter().all(|c| {
                let c = c.trim();
                !c.is_empty() && c.trim_matches(':').chars().all(|ch| ch == '-') && c.contains('-')
            })
    };
    let lines: Vec<&str> = text.lines().collect();
    let mut tables = Vec::new();
    let mut i = 0;
    while i + 1 < lines.len() {
        let (head, rule) = (lines[i].trim(), lines[i + 1].trim());
        if head.starts_with('|') && rule.starts_with('|') && is_rule(&split(rule)) {
            let headers = split(head);
            let right = split(rule).iter().map(|c| c.ends_with(':')).collect();
            let mut rows = Vec::new();
            i += 2;
            while i < lines.len() && lines[i].trim().starts_with('|') {
                let mut cells = split(lines[i]);
                cells.resize(headers.len(), String::new());
                rows.push(cells);
                i += 1;
            }
            tables.push(Table {
                headers,
                right,
                rows,
            });
        } else {
            i += 1;
        }
    }
    tables
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_and_reads_back() {
        let mut t = Table::new(&["workload", ">eager µs", ">speedup"]);
        t.row(vec!["mlp | b=1".into(), us(485.25), times(4.71)]);
        t.row(vec!["chain".into(), us(1234.5), times(f64::NAN)]);
        let md = t.to_markdown();
        assert_eq!(
            md,
            "| workload | eager µs | speedup |\n|---|---:|---:|\n| mlp \\| b=1 | 485.2 | 4.71× |\n| chain | 1234 | – |\n"
        );
        let back = parse_markdown_tables(&format!("text before\n\n{md}\nafter"));
        assert_eq!(back.len(), 1);
        assert_eq!(back[0].headers, t.headers);
        assert_eq!(back[0].right, vec![false, true, true]);
        assert_eq!(back[0].rows[0][0], "mlp | b=1");
        assert_eq!(back[0].numbers("Speedup").unwrap(), vec![Some(4.71), None]);
        assert!(back[0].numbers("absent").is_none());
    }

    #[test]
    #[should_panic(expected = "a row of 1 cells in a table of 2 columns")]
    fn rows_must_fill_the_table() {
        Table::new(&["a", "b"]).row(vec!["x".into()]);
    }

    #[test]
    fn reads_the_chain_example_output() {
        // The shape of `examples/02-chain.rs`'s first table, values made up.
        let out = "chain of N kernels\n\nwall time per replay\n\
            | N | eager µs/kernel | ours replay µs | ours µs/node | raw cudarc replay µs | raw µs/node | ours/raw | ours launch-only µs | raw launch-only µs | speedup vs eager |\n\
            |---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n\
            | 10 | 2.50 | 9.0 | 0.900 | 8.8 | 0.880 | 1.023 | 7.0 | 6.9 | 2.8× |\n\
            | 100 | 2.40 | 60.0 | 0.600 | 59.0 | 0.590 | 1.017 | 58.0 | 57.0 | 4.0× |\n\
            \nPyTorch: not run (no torch)\n";
        let tables = parse_markdown_tables(out);
        assert_eq!(tables.len(), 1);
        let t = &tables[0];
        assert_eq!(t.numbers("N").unwrap(), vec![Some(10.0), Some(100.0)]);
        assert_eq!(
            t.numbers("ours replay µs").unwrap(),
            vec![Some(9.0), Some(60.0)]
        );
        assert_eq!(
            t.numbers("speedup vs eager").unwrap(),
            vec![Some(2.8), Some(4.0)]
        );
    }

    #[test]
    fn numbers_in_cells() {
        assert_eq!(parse_number(" 1,024 "), Some(1024.0));
        assert_eq!(parse_number("+0.25"), Some(0.25));
        assert_eq!(parse_number("3.5x"), Some(3.5));
        assert_eq!(parse_number("–"), None);
        assert_eq!(us(0.123), "0.12");
        assert_eq!(us(12.34), "12.3");
        assert_eq!(us(f64::INFINITY), "–");
    }
}
