//! `--plot FILE.svg`: throughput against message size as a small
//! hand-written SVG, no plotting crate.
//!
//! Two panels side by side, messages/s and MB/s, each with a log2 x axis
//! (message size in bytes) and a log10 y axis; one line per (test, mode)
//! series, the same colour in both panels, and a legend. Rows without
//! throughput (ping-pong latency) are not plotted.

use std::fmt::Write as _;

use super::report::Row;

const PANEL_W: f64 = 440.0;
const PANEL_H: f64 = 320.0;
const LEFT: f64 = 80.0; // room for y tick labels and the y axis title
const TOP: f64 = 50.0;
const GAP: f64 = 100.0; // between the two panels
/// Narrowest legend; a wider one is made for long series names.
const LEGEND_W: f64 = 220.0;
/// Rough width of one character of the 13 px legend text.
const CHAR_W: f64 = 7.6;
const BOTTOM: f64 = 60.0;

const COLOURS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

/// One plotted line: its name and its (size, value) points sorted by size.
#[derive(Debug)]
struct Series {
    name: String,
    msgs: Vec<(usize, f64)>,
    mb: Vec<(usize, f64)>,
}

fn series(rows: &[Row]) -> Vec<Series> {
    let mut out: Vec<Series> = Vec::new();
    for r in rows {
        let (Some(m), Some(b)) = (r.msgs_per_s, r.mb_per_s) else {
            continue;
        };
        if r.size == 0 || m <= 0.0 || b <= 0.0 {
            continue; // nothing to place on a log axis
        }
        let name = r.series();
        let idx = match out.iter().position(|s| s.name == name) {
            Some(i) => i,
            None => {
                out.push(Series {
                    name,
                    msgs: Vec::new(),
                    mb: Vec::new(),
                });
                out.len() - 1
            }
        };
        out[idx].msgs.push((r.size, m));
        out[idx].mb.push((r.size, b));
    }
    for s in &mut out {
        s.msgs.sort_by_key(|p| p.0);
        s.mb.sort_by_key(|p| p.0);
    }
    out
}

/// Escapes text for an SVG text node or attribute.
fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A size as a short label: 8, 512, 4K, 16K, 1M.
fn size_label(n: usize) -> String {
    if n >= 1 << 20 && n.is_multiple_of(1 << 20) {
        format!("{}M", n >> 20)
    } else if n >= 1 << 10 && n.is_multiple_of(1 << 10) {
        format!("{}K", n >> 10)
    } else {
        n.to_string()
    }
}

/// A power of ten as a tick label: 1, 10, 100, 1k, …, 100M, 1G, 1e10.
fn decade_label(log10: f64) -> String {
    let e = log10.round() as i32;
    let (base, unit) = match e {
        i32::MIN..=-1 => return format!("1e{e}"),
        0..=2 => (e, ""),
        3..=5 => (e - 3, "k"),
        6..=8 => (e - 6, "M"),
        9..=11 => (e - 9, "G"),
        _ => return format!("1e{e}"),
    };
    format!("{}{unit}", 10i64.pow(base as u32))
}

/// Maps data to pixels in one panel.
#[derive(Debug, Clone, Copy)]
struct Axes {
    x0: f64,
    x_lo: f64,
    x_hi: f64,
    y_lo: f64,
    y_hi: f64,
}

impl Axes {
    fn x(&self, size: usize) -> f64 {
        let t = ((size as f64).log2() - self.x_lo) / (self.x_hi - self.x_lo);
        self.x0 + t * PANEL_W
    }

    fn y(&self, v: f64) -> f64 {
        let t = (v.log10() - self.y_lo) / (self.y_hi - self.y_lo);
        TOP + PANEL_H - t * PANEL_H
    }
}

/// Decade bounds (log10) enclosing every value, at least one decade apart.
fn decades(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for v in values {
        lo = lo.min(v.log10());
        hi = hi.max(v.log10());
    }
    if !lo.is_finite() {
        return (0.0, 1.0);
    }
    let (lo, hi) = (lo.floor(), hi.ceil());
    if hi <= lo {
        (lo, lo + 1.0)
    } else {
        (lo, hi)
    }
}

#[allow(clippy::too_many_arguments)]
fn panel(
    svg: &mut String,
    x0: f64,
    title: &str,
    y_title: &str,
    sizes: &[usize],
    x_lo: f64,
    x_hi: f64,
    data: &[&[(usize, f64)]],
) {
    let (y_lo, y_hi) = decades(data.iter().flat_map(|d| d.iter().map(|p| p.1)));
    let ax = Axes {
        x0,
        x_lo,
        x_hi,
        y_lo,
        y_hi,
    };
    let (l, r, t, b) = (x0, x0 + PANEL_W, TOP, TOP + PANEL_H);
    let _ = writeln!(svg, r##"<g class="panel">"##);
    let _ = writeln!(
        svg,
        r##"<rect x="{l}" y="{t}" width="{PANEL_W}" height="{PANEL_H}" fill="#ffffff" stroke="#444444"/>"##
    );
    let _ = writeln!(
        svg,
        r##"<text x="{}" y="{}" text-anchor="middle" font-size="15" font-weight="bold">{}</text>"##,
        l + PANEL_W / 2.0,
        t - 14.0,
        esc(title)
    );
    // y grid and labels at every decade, light lines at 2x and 5x.
    let mut d = y_lo;
    while d <= y_hi + 1e-9 {
        let y = ax.y(10f64.powf(d));
        let _ = writeln!(
            svg,
            r##"<line x1="{l}" y1="{y:.1}" x2="{r}" y2="{y:.1}" stroke="#cccccc"/>"##
        );
        let _ = writeln!(
            svg,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="end" font-size="12">{}</text>"##,
            l - 6.0,
            y + 4.0,
            decade_label(d)
        );
        if d < y_hi - 1e-9 {
            for m in [2.0, 5.0] {
                let y = ax.y(m * 10f64.powf(d));
                let _ = writeln!(
                    svg,
                    r##"<line x1="{l}" y1="{y:.1}" x2="{r}" y2="{y:.1}" stroke="#eeeeee"/>"##
                );
            }
        }
        d += 1.0;
    }
    // x ticks at each measured size.
    for &s in sizes {
        let x = ax.x(s);
        let _ = writeln!(
            svg,
            r##"<line x1="{x:.1}" y1="{t}" x2="{x:.1}" y2="{b}" stroke="#e4e4e4"/>"##
        );
        let _ = writeln!(
            svg,
            r##"<text x="{x:.1}" y="{:.1}" text-anchor="middle" font-size="12">{}</text>"##,
            b + 16.0,
            size_label(s)
        );
    }
    let _ = writeln!(
        svg,
        r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="13">message size (bytes, log2 scale)</text>"##,
        l + PANEL_W / 2.0,
        b + 38.0
    );
    let (yx, yy) = (l - 62.0, t + PANEL_H / 2.0);
    let _ = writeln!(
        svg,
        r##"<text x="{yx:.1}" y="{yy:.1}" text-anchor="middle" font-size="13" transform="rotate(-90 {yx:.1} {yy:.1})">{}</text>"##,
        esc(y_title)
    );
    for (i, pts) in data.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let dash = if i >= COLOURS.len() {
            r#" stroke-dasharray="6 3""#
        } else {
            ""
        };
        let points: Vec<String> = pts
            .iter()
            .map(|&(s, v)| format!("{:.1},{:.1}", ax.x(s), ax.y(v)))
            .collect();
        let _ = writeln!(
            svg,
            r##"<polyline fill="none" stroke="{colour}" stroke-width="2"{dash} points="{}"/>"##,
            points.join(" ")
        );
        for &(s, v) in pts.iter() {
            let _ = writeln!(
                svg,
                r##"<circle cx="{:.1}" cy="{:.1}" r="3.5" fill="{colour}"/>"##,
                ax.x(s),
                ax.y(v)
            );
        }
    }
    let _ = writeln!(svg, "</g>");
}

/// Draws the throughput rows of `rows` as an SVG document.
pub(crate) fn svg(rows: &[Row], title: &str) -> String {
    let all = series(rows);
    let mut sizes: Vec<usize> = all
        .iter()
        .flat_map(|s| s.msgs.iter().map(|p| p.0))
        .collect();
    sizes.sort_unstable();
    sizes.dedup();
    let (x_lo, x_hi) = match (sizes.first(), sizes.last()) {
        (Some(&a), Some(&b)) => ((a as f64).log2() - 0.5, (b as f64).log2() + 0.5),
        _ => (0.0, 1.0),
    };
    let longest = all
        .iter()
        .map(|s| s.name.chars().count())
        .max()
        .unwrap_or(0);
    let legend_w = LEGEND_W.max(36.0 + CHAR_W * longest as f64 + 10.0);
    let width = LEFT + PANEL_W + GAP + PANEL_W + 30.0 + legend_w;
    let height = TOP + PANEL_H + BOTTOM + 10.0;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif">"##
    );
    let _ = writeln!(s, r##"<title>{}</title>"##, esc(title));
    let _ = writeln!(s, r##"<rect width="100%" height="100%" fill="#fafafa"/>"##);
    let msgs: Vec<&[(usize, f64)]> = all.iter().map(|x| x.msgs.as_slice()).collect();
    let mb: Vec<&[(usize, f64)]> = all.iter().map(|x| x.mb.as_slice()).collect();
    panel(
        &mut s,
        LEFT,
        "messages per second",
        "messages/s",
        &sizes,
        x_lo,
        x_hi,
        &msgs,
    );
    panel(
        &mut s,
        LEFT + PANEL_W + GAP,
        "payload throughput",
        "MB/s (10^6 B/s)",
        &sizes,
        x_lo,
        x_hi,
        &mb,
    );
    // Legend to the right of both panels.
    let lx = LEFT + 2.0 * PANEL_W + GAP + 30.0;
    let _ = writeln!(s, r##"<g class="legend">"##);
    let _ = writeln!(
        s,
        r##"<text x="{lx}" y="{}" font-size="13" font-weight="bold">{}</text>"##,
        TOP + 4.0,
        esc(title)
    );
    for (i, ser) in all.iter().enumerate() {
        let y = TOP + 28.0 + i as f64 * 22.0;
        let colour = COLOURS[i % COLOURS.len()];
        let dash = if i >= COLOURS.len() {
            r#" stroke-dasharray="6 3""#
        } else {
            ""
        };
        let _ = writeln!(
            s,
            r##"<line x1="{lx}" y1="{y}" x2="{}" y2="{y}" stroke="{colour}" stroke-width="3"{dash}/>"##,
            lx + 28.0
        );
        let _ = writeln!(
            s,
            r##"<text x="{}" y="{}" font-size="13">{}</text>"##,
            lx + 36.0,
            y + 4.0,
            esc(&ser.name)
        );
    }
    if all.is_empty() {
        let _ = writeln!(
            s,
            r##"<text x="{lx}" y="{}" font-size="13">no throughput rows</text>"##,
            TOP + 28.0
        );
    }
    let _ = writeln!(s, "</g>");
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn rows() -> Vec<Row> {
        let mut out = Vec::new();
        for (test, mode, base) in [
            ("queue", "natural", 1e7),
            ("udp", "datagram", 3e5),
            ("zmq", "push-pull <tcp>", 4e6),
        ] {
            for size in [8usize, 64, 512, 4096, 16384] {
                let mut r = Row::new(test, mode, size);
                r.set_throughput((base / (size as f64).sqrt()) as u64, Duration::from_secs(1));
                out.push(r);
            }
        }
        // A latency row is not plotted.
        out.push(Row {
            p50_us: Some(20.0),
            ..Row::new("udp-pingpong", "blocking", 8)
        });
        out
    }

    /// Checks that every tag is closed in order (a tiny XML well-formedness
    /// check: no attribute contains '<' or '>' because text is escaped).
    fn well_formed(s: &str) -> bool {
        let mut stack: Vec<String> = Vec::new();
        let mut rest = s;
        while let Some(open) = rest.find('<') {
            let Some(close) = rest[open..].find('>') else {
                return false;
            };
            let tag = &rest[open + 1..open + close];
            rest = &rest[open + close + 1..];
            if let Some(name) = tag.strip_prefix('/') {
                if stack.pop().as_deref() != Some(name.trim()) {
                    return false;
                }
            } else if !tag.ends_with('/') {
                let name = tag.split_whitespace().next().unwrap_or("");
                stack.push(name.to_string());
            }
        }
        stack.is_empty()
    }

    #[test]
    fn one_polyline_per_series_in_each_panel() {
        let s = svg(&rows(), "skiff bench queue");
        assert!(s.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
        assert!(s.trim_end().ends_with("</svg>"));
        assert!(well_formed(&s), "{s}");
        assert_eq!(s.matches("<polyline").count(), 2 * 3);
        assert_eq!(s.matches("<circle").count(), 2 * 3 * 5);
        assert!(s.contains("queue natural") && s.contains("udp datagram"));
        assert!(s.contains("push-pull &lt;tcp&gt;"), "names are escaped");
        assert!(!s.contains("udp-pingpong"), "latency rows are not plotted");
        assert!(s.contains("messages/s") && s.contains("MB/s") && s.contains("message size"));
        for label in ["8", "64", "512", "4K", "16K"] {
            assert!(s.contains(&format!(">{label}</text>")), "x label {label}");
        }
    }

    #[test]
    fn points_fall_inside_their_panel() {
        let s = svg(&rows(), "t");
        for line in s.lines().filter(|l| l.starts_with("<circle")) {
            let num = |k: &str| -> f64 {
                let i = line.find(k).unwrap() + k.len();
                line[i..].split('"').next().unwrap().parse().unwrap()
            };
            let (cx, cy) = (num("cx=\""), num("cy=\""));
            assert!((TOP..=TOP + PANEL_H).contains(&cy), "{line}");
            let in_left = (LEFT..=LEFT + PANEL_W).contains(&cx);
            let x1 = LEFT + PANEL_W + GAP;
            assert!(in_left || (x1..=x1 + PANEL_W).contains(&cx), "{line}");
        }
    }

    #[test]
    fn the_legend_widens_for_long_names() {
        let short = svg(&rows(), "t");
        let mut long = rows();
        long[0].mode = "qthresh=512,timeout=200ms,max_datagram=65507".into();
        let long = svg(&long, "t");
        let width = |s: &str| -> f64 {
            let i = s.find("width=\"").unwrap() + 7;
            s[i..].split('"').next().unwrap().parse().unwrap()
        };
        assert!(width(&long) > width(&short) + 100.0);
    }

    #[test]
    fn empty_input_still_draws_a_valid_document() {
        let s = svg(&[], "nothing");
        assert!(well_formed(&s));
        assert_eq!(s.matches("<polyline").count(), 0);
        assert!(s.contains("no throughput rows"));
    }

    #[test]
    fn size_labels() {
        assert_eq!(size_label(8), "8");
        assert_eq!(size_label(4096), "4K");
        assert_eq!(size_label(1 << 20), "1M");
        assert_eq!(size_label(1000), "1000");
        assert_eq!(decade_label(0.0), "1");
        assert_eq!(decade_label(4.0), "10k");
        assert_eq!(decade_label(7.0), "10M");
        assert_eq!(decade_label(-2.0), "1e-2");
    }
}
