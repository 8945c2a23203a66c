//! `--markdown FILE.md`: the rows as a Markdown table for
//! bench/RESULTS.md, the same columns as the terminal table, each series'
//! rows together; the run's target verdicts follow as a list.

use skiff_cli::bench::report::{cells, grouped, Align, Row, COLUMNS};

/// The rows as a Markdown table (GitHub style), series grouped, options
/// in code spans; `notes` follow as a list.
pub(crate) fn markdown(rows: &[Row], notes: &[String]) -> String {
    let mut out = String::new();
    let header: Vec<&str> = COLUMNS.iter().map(|(h, _)| *h).collect();
    out.push_str(&format!("| {} |\n", header.join(" | ")));
    let rule: Vec<&str> = COLUMNS
        .iter()
        .map(|(_, a)| if *a == Align::Right { "---:" } else { "---" })
        .collect();
    out.push_str(&format!("| {} |\n", rule.join(" | ")));
    for r in grouped(rows) {
        let mut c = cells(&r);
        if !c[11].is_empty() {
            c[11] = format!("`{}`", c[11]);
        }
        let c: Vec<String> = c.iter().map(|x| x.replace('|', "\\|")).collect();
        out.push_str(&format!("| {} |\n", c.join(" | ")));
    }
    if !notes.is_empty() {
        out.push('\n');
        for n in notes {
            out.push_str(&format!("- {n}\n"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use skiff_cli::bench::report::{histogram, record};

    use super::*;

    fn sample() -> Vec<Row> {
        let mut a = Row::new("queue", "natural", 8);
        a.messages = 10_000_000;
        a.set_throughput(9_999_000, Duration::from_millis(800));
        a.lost = Some(1000);
        a.options = Some("udp://127.0.0.1:0?timeout=0".into());
        let mut b = Row::new("udp-pingpong", "blocking", 16384);
        let mut h = histogram();
        for us in [20u64, 21, 22, 30] {
            record(&mut h, Duration::from_micros(us));
        }
        b.set_latency(&h);
        vec![a, b]
    }

    #[test]
    fn markdown_has_a_header_rule_and_a_line_per_row() {
        let md = markdown(&sample(), &["a note".to_string()]);
        let lines: Vec<&str> = md.lines().collect();
        assert!(lines[0].starts_with("| test | mode | size B |"));
        assert!(lines[1].starts_with("| --- | --- | ---: |"));
        assert_eq!(lines.iter().filter(|l| l.starts_with('|')).count(), 4);
        let pipes = lines[0].matches('|').count();
        assert!(
            lines[..4].iter().all(|l| l.matches('|').count() == pipes),
            "{md}"
        );
        assert!(md.contains("`udp://127.0.0.1:0?timeout=0`"));
        assert!(md.ends_with("- a note\n"));
    }

    #[test]
    fn pipes_in_cells_are_escaped() {
        let mut rows = sample();
        rows[1].options = Some("a|b".into());
        let md = markdown(&rows, &[]);
        assert!(md.contains("`a\\|b`"), "{md}");
    }
}
