//! A hand-written SVG line plot with logarithmic axes: the report's speedup figure.

use std::fmt::Write as _;

/// One data series of a panel.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Legend text.
    pub label: String,
    /// `(x, y)` points; non-positive or non-finite values are left out (log axes).
    pub points: Vec<(f64, f64)>,
    /// An SVG colour.
    pub color: String,
    /// Join the points with a line (otherwise markers only, each labelled).
    pub line: bool,
    /// Dashed line.
    pub dashed: bool,
}

/// One plot: axes, series and a dashed reference line at `y = 1`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Panel {
    /// Title above the plot.
    pub title: String,
    /// Horizontal axis label.
    pub x_label: String,
    /// Vertical axis label.
    pub y_label: String,
    /// The data.
    pub series: Vec<Series>,
}

/// A logarithmic axis mapping `[lo, hi]` onto pixels `[p0, p1]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LogAxis {
    /// Smallest value shown.
    pub lo: f64,
    /// Largest value shown.
    pub hi: f64,
    /// Pixel of `lo`.
    pub p0: f64,
    /// Pixel of `hi`.
    pub p1: f64,
}

impl LogAxis {
    /// An axis covering `values` (and `always`, if given), padded to the enclosing powers of
    /// two. Without a usable value: `[1, 2]`.
    pub fn covering(
        values: impl IntoIterator<Item = f64>,
        always: Option<f64>,
        p0: f64,
        p1: f64,
    ) -> Self {
        let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
        for v in values.into_iter().chain(always) {
            if v.is_finite() && v > 0.0 {
                lo = lo.min(v);
                hi = hi.max(v);
            }
        }
        if !lo.is_finite() {
            (lo, hi) = (1.0, 2.0);
        }
        let lo = 2f64.powf(lo.log2().floor());
        let mut hi = 2f64.powf(hi.log2().ceil());
        if hi <= lo {
            hi = lo * 2.0;
        }
        LogAxis { lo, hi, p0, p1 }
    }

    /// The pixel of `v`.
    pub fn px(&self, v: f64) -> f64 {
        let f = (v.ln() - self.lo.ln()) / (self.hi.ln() - self.lo.ln());
        self.p0 + f * (self.p1 - self.p0)
    }

    /// Tick values: powers of ten when the axis spans more than 64×, else powers of two.
    pub fn ticks(&self) -> Vec<f64> {
        let base: f64 = if self.hi / self.lo > 64.0 { 10.0 } else { 2.0 };
        let mut t = base.powf((self.lo.ln() / base.ln()).ceil());
        let mut out = Vec::new();
        while t <= self.hi * (1.0 + 1e-9) {
            out.push(t);
            t *= base;
        }
        out
    }
}

/// A tick label: `0.5`, `1`, `16`, `10k`.
pub fn tick_label(v: f64) -> String {
    if v >= 1000.0 && (v / 1000.0).fract() == 0.0 {
        format!("{}k", v / 1000.0)
    } else if v.fract() == 0.0 {
        format!("{v}")
    } else {
        format!("{v:.3}")
            .trim_end_matches('0')
            .trim_end_matches('.')
            .to_owned()
    }
}

/// Escapes text for SVG.
pub fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

const PANEL_W: f64 = 540.0;
const PLOT_H: f64 = 344.0;
const MARGIN_L: f64 = 64.0;
const MARGIN_R: f64 = 20.0;
const MARGIN_T: f64 = 40.0;
/// Below the plot: tick labels and the axis label.
const AXIS_B: f64 = 44.0;
const LEGEND_ROW: f64 = 18.0;

fn legend_rows(p: &Panel) -> usize {
    p.series.iter().filter(|s| s.line).count().div_ceil(2)
}

/// The panels side by side under `title`, with `footer` lines below them. Line series are
/// named in a legend under their panel; marker-only series are labelled next to the marker.
pub fn render(title: &str, panels: &[Panel], footer: &[String]) -> String {
    let width = PANEL_W * panels.len().max(1) as f64;
    let rows = panels.iter().map(legend_rows).max().unwrap_or(0);
    let panel_h = MARGIN_T + PLOT_H + AXIS_B + LEGEND_ROW * rows as f64 + 8.0;
    let top = 36.0;
    let height = top + panel_h + 16.0 * footer.len() as f64 + 10.0;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        s,
        r#"<rect width="100%" height="100%" fill="white"/><text x="{}" y="24" font-size="16" text-anchor="middle">{}</text>"#,
        width / 2.0,
        escape(title)
    );
    for (i, p) in panels.iter().enumerate() {
        render_panel(&mut s, p, i as f64 * PANEL_W, top);
    }
    for (i, line) in footer.iter().enumerate() {
        let _ = writeln!(
            s,
            r##"<text x="12" y="{}" fill="#444">{}</text>"##,
            top + panel_h + 10.0 + 16.0 * i as f64,
            escape(line)
        );
    }
    s.push_str("</svg>\n");
    s
}

fn usable(p: &(f64, f64)) -> bool {
    p.0.is_finite() && p.1.is_finite() && p.0 > 0.0 && p.1 > 0.0
}

fn render_panel(s: &mut String, p: &Panel, ox: f64, oy: f64) {
    let (x0, x1) = (ox + MARGIN_L, ox + PANEL_W - MARGIN_R);
    let (y0, y1) = (oy + MARGIN_T + PLOT_H, oy + MARGIN_T);
    let pts = || {
        p.series
            .iter()
            .flat_map(|s| s.points.iter().filter(|q| usable(q)))
    };
    let xa = LogAxis::covering(pts().map(|q| q.0), None, x0, x1);
    let ya = LogAxis::covering(pts().map(|q| q.1), Some(1.0), y0, y1);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" font-size="14" text-anchor="middle">{}</text>"#,
        (x0 + x1) / 2.0,
        oy + 20.0,
        escape(&p.title)
    );
    // Grid and ticks.
    for t in xa.ticks() {
        let x = xa.px(t);
        let _ = writeln!(
            s,
            r##"<line x1="{x:.1}" y1="{y0:.1}" x2="{x:.1}" y2="{y1:.1}" stroke="#e4e4e4"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
            y0 + 16.0,
            tick_label(t)
        );
    }
    for t in ya.ticks() {
        let y = ya.px(t);
        let _ = writeln!(
            s,
            r##"<line x1="{x0:.1}" y1="{y:.1}" x2="{x1:.1}" y2="{y:.1}" stroke="#e4e4e4"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}×</text>"##,
            x0 - 6.0,
            y + 4.0,
            tick_label(t)
        );
    }
    let one = ya.px(1.0);
    let _ = writeln!(
        s,
        r##"<line x1="{x0:.1}" y1="{one:.1}" x2="{x1:.1}" y2="{one:.1}" stroke="#888" stroke-dasharray="5,4"/><text x="{:.1}" y="{:.1}" fill="#666">no speedup</text>"##,
        x0 + 4.0,
        one - 4.0
    );
    let _ = writeln!(
        s,
        r#"<rect x="{x0:.1}" y="{y1:.1}" width="{:.1}" height="{:.1}" fill="none" stroke="black"/>"#,
        x1 - x0,
        y0 - y1
    );
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
        (x0 + x1) / 2.0,
        y0 + 34.0,
        escape(&p.x_label)
    );
    let _ = writeln!(
        s,
        r#"<text transform="translate({:.1},{:.1}) rotate(-90)" text-anchor="middle">{}</text>"#,
        ox + 16.0,
        (y0 + y1) / 2.0,
        escape(&p.y_label)
    );
    if pts().next().is_none() {
        let _ = writeln!(
            s,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" fill="#a00">no data</text>"##,
            (x0 + x1) / 2.0,
            (y0 + y1) / 2.0
        );
    }
    // Series, then the legend of the line series under the plot.
    let mut legend = 0usize;
    for ser in &p.series {
        let points: Vec<(f64, f64)> = ser
            .points
            .iter()
            .copied()
            .filter(usable)
            .map(|(x, y)| (xa.px(x), ya.px(y)))
            .collect();
        let color = escape(&ser.color);
        let dash = if ser.dashed {
            r#" stroke-dasharray="6,3""#
        } else {
            ""
        };
        if ser.line && points.len() > 1 {
            let list: Vec<String> = points
                .iter()
                .map(|(x, y)| format!("{x:.1},{y:.1}"))
                .collect();
            let _ = writeln!(
                s,
                r#"<polyline fill="none" stroke="{color}" stroke-width="2"{dash} points="{}"/>"#,
                list.join(" ")
            );
        }
        for (x, y) in &points {
            let _ = writeln!(
                s,
                r#"<circle cx="{x:.1}" cy="{y:.1}" r="3.5" fill="{color}"/>"#
            );
            if !ser.line {
                let _ = writeln!(
                    s,
                    r#"<text x="{:.1}" y="{:.1}" fill="{color}">{}</text>"#,
                    x + 6.0,
                    y - 6.0,
                    escape(&ser.label)
                );
            }
        }
        if ser.line {
            let lx = x0 + (legend % 2) as f64 * (x1 - x0) / 2.0;
            let ly = y0 + AXIS_B + LEGEND_ROW * (legend / 2) as f64 + 12.0;
            let _ = writeln!(
                s,
                r#"<line x1="{lx:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="{color}" stroke-width="2"{dash}/><text x="{:.1}" y="{ly:.1}">{}</text>"#,
                ly - 4.0,
                lx + 24.0,
                ly - 4.0,
                lx + 30.0,
                escape(&ser.label)
            );
            legend += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axes_cover_the_data_on_powers_of_two() {
        let a = LogAxis::covering([3.0, 50.0], Some(1.0), 0.0, 100.0);
        assert_eq!((a.lo, a.hi), (1.0, 64.0));
        assert_eq!(a.px(1.0), 0.0);
        assert!((a.px(64.0) - 100.0).abs() < 1e-9);
        assert!((a.px(8.0) - 50.0).abs() < 1e-9);
        assert_eq!(a.ticks(), vec![1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0]);
        // A wide axis ticks on powers of ten; a downward axis maps downwards.
        let w = LogAxis::covering([10.0, 10_000.0], None, 300.0, 0.0);
        assert_eq!(w.ticks(), vec![10.0, 100.0, 1000.0, 10_000.0]);
        assert!(w.px(100.0) > w.px(1000.0));
        // Nothing usable: a default range.
        let e = LogAxis::covering([f64::NAN, -1.0, 0.0], None, 0.0, 1.0);
        assert_eq!((e.lo, e.hi), (1.0, 2.0));
        // One value: still a range.
        let one = LogAxis::covering([4.0], None, 0.0, 1.0);
        assert!(one.hi > one.lo);
    }

    #[test]
    fn tick_labels() {
        assert_eq!(tick_label(0.5), "0.5");
        assert_eq!(tick_label(0.25), "0.25");
        assert_eq!(tick_label(16.0), "16");
        assert_eq!(tick_label(10_000.0), "10k");
    }

    #[test]
    fn renders_lines_markers_and_escaped_labels() {
        let panel = Panel {
            title: "speedup <vs> kernels".into(),
            x_label: "kernels".into(),
            y_label: "eager / graph".into(),
            series: vec![
                Series {
                    label: "ours & co".into(),
                    points: vec![(10.0, 2.0), (100.0, 3.0), (1000.0, 3.5), (0.0, 9.0)],
                    color: "#1f77b4".into(),
                    line: true,
                    dashed: false,
                },
                Series {
                    label: "decode".into(),
                    points: vec![(76.0, 4.0)],
                    color: "#d62728".into(),
                    line: false,
                    dashed: false,
                },
            ],
        };
        let svg = render("report", &[panel, Panel::default()], &["GPU: test".into()]);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<polyline").count(), 1);
        // Three usable points on the line (the one at x = 0 is dropped), one marker.
        assert_eq!(svg.matches("<circle").count(), 4);
        let poly = svg.lines().find(|l| l.starts_with("<polyline")).unwrap();
        let pts = poly
            .split("points=\"")
            .nth(1)
            .unwrap()
            .trim_end_matches("\"/>");
        assert_eq!(pts.split(' ').count(), 3);
        assert!(svg.contains("speedup &lt;vs&gt; kernels"));
        assert!(svg.contains("ours &amp; co"));
        assert!(svg.contains("no speedup"));
        assert!(svg.contains("no data"), "the empty panel says so");
        assert!(svg.contains("GPU: test"));
        assert!(!svg.contains("NaN") && !svg.contains("inf"));
    }
}
