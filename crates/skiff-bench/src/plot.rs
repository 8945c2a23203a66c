//! `--plot FILE.svg`: throughput against message size, drawn with the
//! `plotters` crate (its SVG backend only).
//!
//! Two panels side by side, messages/s and MB/s, each with log-scaled
//! axes (message size in bytes across, powers of two; rate up, decades); one line per (test, mode)
//! series, the same colour in both panels, and a legend to their right.
//! Rows without throughput (ping-pong latency) are not plotted.

use std::error::Error;

use plotters::coord::Shift;
use plotters::prelude::*;
use skiff_cli::bench::report::Row;

/// Width of one panel, in pixels.
const PANEL_W: u32 = 480;
/// Height of the drawing, in pixels.
const HEIGHT: u32 = 440;
/// Narrowest legend; a wider one is made for long series names.
const LEGEND_W: u32 = 220;
/// Rough width of one character of the 13 px legend text.
const CHAR_W: u32 = 8;
const FONT: &str = "sans-serif";

/// One plotted line: its name and its (size, value) points sorted by size.
#[derive(Debug)]
struct Series {
    name: String,
    msgs: Vec<(f64, f64)>,
    mb: Vec<(f64, f64)>,
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
        out[idx].msgs.push((r.size as f64, m));
        out[idx].mb.push((r.size as f64, b));
    }
    for s in &mut out {
        s.msgs.sort_by(|a, b| a.0.total_cmp(&b.0));
        s.mb.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    out
}

/// A size as a short label: 8, 512, 4K, 16K, 1M.
fn size_label(n: f64) -> String {
    let n = n.round() as u64;
    if n >= 1 << 20 && n.is_multiple_of(1 << 20) {
        format!("{}M", n >> 20)
    } else if n >= 1 << 10 && n.is_multiple_of(1 << 10) {
        format!("{}K", n >> 10)
    } else {
        n.to_string()
    }
}

/// A rate as a short label: 1, 10, 100, 1k, …, 100M, 1G.
fn rate_label(v: f64) -> String {
    let (x, unit) = match v {
        v if v >= 1e9 => (v / 1e9, "G"),
        v if v >= 1e6 => (v / 1e6, "M"),
        v if v >= 1e3 => (v / 1e3, "k"),
        v => (v, ""),
    };
    let x = format!("{x:.1}");
    format!("{}{unit}", x.trim_end_matches(".0"))
}

/// Decade bounds enclosing every value, at least one decade apart.
fn decades(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for v in values {
        lo = lo.min(v.log10());
        hi = hi.max(v.log10());
    }
    if !lo.is_finite() {
        return (1.0, 10.0);
    }
    let (lo, hi) = (lo.floor(), hi.ceil().max(lo.floor() + 1.0));
    (10f64.powf(lo), 10f64.powf(hi))
}

/// The colour of series `i` (dashed past the palette: see [`line_style`]).
fn colour(i: usize) -> PaletteColor<Palette99> {
    Palette99::pick(i)
}

fn line_style(i: usize, width: u32) -> ShapeStyle {
    colour(i).stroke_width(width)
}

/// One panel: `pick` chooses the values of each series.
fn panel(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    title: &str,
    y_title: &str,
    all: &[Series],
    (x_lo, x_hi): (f64, f64),
    pick: fn(&Series) -> &[(f64, f64)],
) -> Result<(), Box<dyn Error>> {
    let (y_lo, y_hi) = decades(all.iter().flat_map(|s| pick(s).iter().map(|p| p.1)));
    let mut chart = ChartBuilder::on(area)
        .caption(title, (FONT, 16))
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(64)
        .build_cartesian_2d((x_lo..x_hi).log_scale().base(2.0), (y_lo..y_hi).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("message size (bytes, log scale)")
        .y_desc(y_title)
        .x_label_formatter(&|v| size_label(*v))
        .y_label_formatter(&|v| rate_label(*v))
        .label_style((FONT, 12))
        .axis_desc_style((FONT, 13))
        .draw()?;
    for (i, s) in all.iter().enumerate() {
        let points = pick(s);
        chart.draw_series(LineSeries::new(points.iter().copied(), line_style(i, 2)))?;
        chart.draw_series(
            points
                .iter()
                .map(|&p| Circle::new(p, 3, colour(i).filled())),
        )?;
    }
    Ok(())
}

/// Draws the throughput rows of `rows` as an SVG document titled `title`.
pub(crate) fn svg(rows: &[Row], title: &str) -> Result<String, Box<dyn Error>> {
    let all = series(rows);
    let sizes = all.iter().flat_map(|s| s.msgs.iter().map(|p| p.0));
    let (lo, hi) = sizes.fold((f64::INFINITY, 0f64), |(lo, hi), s| (lo.min(s), hi.max(s)));
    // Half a step of a power of two beyond the smallest and largest size.
    let x = match lo.is_finite() {
        true => (lo / 1.5, hi * 1.5),
        false => (1.0, 2.0),
    };
    let longest = all.iter().map(|s| s.name.chars().count()).max();
    let legend_w = LEGEND_W.max(46 + CHAR_W * longest.unwrap_or(0) as u32);
    let width = 2 * PANEL_W + legend_w;
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (width, HEIGHT)).into_drawing_area();
        root.fill(&WHITE)?;
        let (panels, legend) = root.split_horizontally(2 * PANEL_W);
        let (left, right) = panels.split_horizontally(PANEL_W);
        panel(&left, "messages per second", "messages/s", &all, x, |s| {
            &s.msgs
        })?;
        panel(
            &right,
            "payload throughput",
            "MB/s (10^6 B/s)",
            &all,
            x,
            |s| &s.mb,
        )?;
        let text = |s: &str, y: i32, size: u32| Text::new(s.to_owned(), (10, y), (FONT, size));
        legend.draw(&text(title, 40, 14))?;
        for (i, s) in all.iter().enumerate() {
            let y = 68 + 22 * i as i32;
            legend.draw(&PathElement::new(vec![(10, y), (38, y)], line_style(i, 3)))?;
            legend.draw(&Text::new(s.name.clone(), (46, y - 7), (FONT, 13)))?;
        }
        if all.is_empty() {
            legend.draw(&text("no throughput rows", 68, 13))?;
        }
        root.present()?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

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

    #[test]
    fn a_line_and_points_per_series_in_each_panel_and_a_legend() {
        let s = svg(&rows(), "skiff-bench queue").unwrap();
        assert!(s.starts_with("<svg"), "{s}");
        assert!(s.trim_end().ends_with("</svg>"));
        // Two panels of three series, five sizes each.
        assert_eq!(s.matches("<circle").count(), 2 * 3 * 5, "{s}");
        assert!(
            s.matches("<polyline").count() >= 2 * 3 + 3,
            "lines and legend"
        );
        assert!(s.contains("queue natural") && s.contains("udp datagram"));
        assert!(s.contains("push-pull &lt;tcp&gt;"), "names are escaped");
        assert!(!s.contains("udp-pingpong"), "latency rows are not plotted");
        assert!(s.contains("messages/s") && s.contains("MB/s") && s.contains("message size"));
        // Sizes are labelled on powers of two.
        assert!(s.contains("\n2K\n") && s.contains("\n32\n"), "{s}");
    }

    #[test]
    fn the_legend_widens_for_long_names() {
        let width = |s: &str| -> f64 {
            let i = s.find("width=\"").unwrap() + 7;
            s[i..].split('"').next().unwrap().parse().unwrap()
        };
        let short = svg(&rows(), "t").unwrap();
        let mut long = rows();
        long[0].mode = "qthresh=512,timeout=200ms,max_datagram=65507".into();
        let long = svg(&long, "t").unwrap();
        assert!(width(&long) > width(&short) + 100.0);
    }

    #[test]
    fn empty_input_still_draws_a_document() {
        let s = svg(&[], "nothing").unwrap();
        assert!(s.starts_with("<svg") && s.trim_end().ends_with("</svg>"));
        assert_eq!(s.matches("<circle").count(), 0);
        assert!(s.contains("no throughput rows"));
    }

    #[test]
    fn labels() {
        assert_eq!(size_label(8.0), "8");
        assert_eq!(size_label(4096.0), "4K");
        assert_eq!(size_label(1048576.0), "1M");
        assert_eq!(size_label(1000.0), "1000");
        assert_eq!(rate_label(1.0), "1");
        assert_eq!(rate_label(10_000.0), "10k");
        assert_eq!(rate_label(2.5e7), "25M");
        assert_eq!(rate_label(1e9), "1G");
    }
}
