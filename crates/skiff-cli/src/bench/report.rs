//! The output contract shared by every `skiff bench` test: one [`Row`] per
//! measurement, printed as an aligned table for people or, with `--json`,
//! as one JSON object per line for scripts; plus the helpers every test
//! uses to measure (latency [`Histogram`]s, process CPU time, a progress
//! bar on stderr).
//!
//! Units: sizes are payload bytes; `mb_per_s` is payload megabytes
//! (10^6 bytes) per second; latencies are microseconds. A value that does
//! not apply to a row (latency in a throughput test, throughput in a
//! ping-pong) is `null` in JSON and `-` in the table.

use std::io::{self, IsTerminal, Write};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::{Deserialize, Serialize};

/// One measurement: a test at one message size in one mode.
///
/// The first eight fields are always present in JSON (`null` where they do
/// not apply); the extras are omitted when unset.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Row {
    /// What was measured: `queue`, `udp`, `zmq`, `queue-pingpong`, ….
    pub test: String,
    /// How: the batching mode, socket pattern or transport.
    pub mode: String,
    /// Payload bytes per message.
    pub size: usize,
    /// Messages sent (throughput) or round trips timed (latency).
    pub messages: u64,
    /// Messages received per second of the receiver's elapsed time.
    pub msgs_per_s: Option<f64>,
    /// Messages received (throughput tests): with `lost`, accounts for
    /// every message sent, exactly (the rate is rounded).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub received: Option<u64>,
    /// Payload megabytes (10^6 B) received per second.
    pub mb_per_s: Option<f64>,
    /// Median round trip, microseconds.
    pub p50_us: Option<f64>,
    /// 99th percentile round trip, microseconds.
    pub p99_us: Option<f64>,
    /// Datagrams (or system-call batches) the sender sent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batches: Option<u64>,
    /// Messages sent but never received.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lost: Option<u64>,
    /// Messages or datagrams the receiver dropped on purpose and counted
    /// (kernel buffer overflow, malformed, …).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dropped: Option<u64>,
    /// Process CPU time (user + system) as a percentage of one core over
    /// the test's wall time; 200 means both cores of a two-core machine.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_pct: Option<f64>,
    /// Wall time of the measurement, seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub elapsed_s: Option<f64>,
    /// The locator or settings used, so the row can be reproduced.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub options: Option<String>,
    /// Runs of the test this row is the median of (`--repeat`); absent for
    /// a single run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runs: Option<u32>,
    /// The lowest and highest value of the row's figure of merit
    /// ([`Row::merit`]) over those runs: how far a single run strays.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_min: Option<f64>,
    /// See `run_min`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_max: Option<f64>,
}

impl Row {
    /// A row with the identifying fields set and everything else empty.
    pub fn new(test: &str, mode: &str, size: usize) -> Row {
        Row {
            test: test.to_string(),
            mode: mode.to_string(),
            size,
            ..Row::default()
        }
    }

    /// Fills the throughput fields from `received` messages of `self.size`
    /// bytes over `elapsed`.
    pub fn set_throughput(&mut self, received: u64, elapsed: Duration) {
        let secs = elapsed.as_secs_f64().max(1e-9);
        let rate = received as f64 / secs;
        self.received = Some(received);
        self.msgs_per_s = Some(round(rate, 1));
        self.mb_per_s = Some(round(rate * self.size as f64 / 1e6, 3));
        self.elapsed_s = Some(round(secs, 6));
    }

    /// Fills the latency fields from a histogram of nanoseconds.
    pub fn set_latency(&mut self, hist: &Histogram) {
        self.messages = hist.len();
        if !hist.is_empty() {
            self.p50_us = Some(round(hist.value_at_quantile(0.50) as f64 / 1e3, 3));
            self.p99_us = Some(round(hist.value_at_quantile(0.99) as f64 / 1e3, 3));
        }
    }

    /// The row as one line of JSON (no trailing newline).
    pub fn to_json(&self) -> String {
        // A struct of strings, integers and options cannot fail to serialize.
        serde_json::to_string(self).expect("Row serializes")
    }

    /// The figure a run is judged by, higher is better: MB/s for a bulk
    /// row, messages per second for a rate row, and minus the median
    /// round trip for a latency row.
    pub fn merit(&self) -> f64 {
        match (self.mb_per_s, self.msgs_per_s, self.p50_us) {
            (Some(mb), _, _) if self.test == "bulk" => mb,
            (_, Some(rate), _) => rate,
            (_, _, Some(p50)) => -p50,
            _ => 0.0,
        }
    }

    /// The run whose [`Row::merit`] is the median of `runs` (the lower
    /// middle one of an even count), with `runs`, `run_min` and `run_max`
    /// set from all of them; `None` for no runs. A single run is returned
    /// as it is.
    pub fn median(mut runs: Vec<Row>) -> Option<Row> {
        let n = runs.len();
        if n <= 1 {
            return runs.pop();
        }
        runs.sort_by(|a, b| a.merit().total_cmp(&b.merit()));
        let figure = |r: &Row| r.merit().abs();
        let (lo, hi) = (figure(&runs[0]), figure(&runs[n - 1]));
        let mut row = runs.swap_remove((n - 1) / 2);
        row.runs = u32::try_from(n).ok();
        row.run_min = Some(lo.min(hi));
        row.run_max = Some(lo.max(hi));
        Some(row)
    }

    /// The (test, mode) pair that names this row's series in a plot.
    pub fn series(&self) -> String {
        format!("{} {}", self.test, self.mode)
    }
}

/// `v` rounded to `digits` decimal places, so JSON lines stay readable.
pub fn round(v: f64, digits: i32) -> f64 {
    let m = 10f64.powi(digits);
    (v * m).round() / m
}

/// Latency histogram in nanoseconds, 1 ns to 100 s, three significant
/// digits.
pub type Histogram = hdrhistogram::Histogram<u64>;

/// A new, empty latency [`Histogram`].
pub fn histogram() -> Histogram {
    Histogram::new_with_bounds(1, 100_000_000_000, 3).expect("valid histogram bounds")
}

/// Records `d` in `hist`, clamped to its range.
pub fn record(hist: &mut Histogram, d: Duration) {
    let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    hist.saturating_record(ns.max(1));
}

/// Column alignment in the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Align {
    /// Text, padded on the right.
    Left,
    /// Numbers, padded on the left.
    Right,
}

/// The table's columns, in order, with their heading and alignment; one
/// cell each in [`cells`].
pub const COLUMNS: [(&str, Align); 12] = [
    ("test", Align::Left),
    ("mode", Align::Left),
    ("size B", Align::Right),
    ("messages", Align::Right),
    ("msgs/s", Align::Right),
    ("MB/s", Align::Right),
    ("p50 µs", Align::Right),
    ("p99 µs", Align::Right),
    ("batches", Align::Right),
    ("lost", Align::Right),
    ("cpu %", Align::Right),
    ("options", Align::Left),
];

fn opt<T>(v: Option<T>, f: impl FnOnce(T) -> String) -> String {
    v.map(f).unwrap_or_else(|| "-".to_string())
}

/// A rate with an SI suffix and three or four significant digits:
/// `12.35 M`, `980.1 k`, `42.0`.
pub fn si(v: f64) -> String {
    let (x, unit) = if v >= 1e9 {
        (v / 1e9, " G")
    } else if v >= 1e6 {
        (v / 1e6, " M")
    } else if v >= 1e3 {
        (v / 1e3, " k")
    } else {
        (v, "")
    };
    if x >= 100.0 {
        format!("{x:.1}{unit}")
    } else {
        format!("{x:.2}{unit}")
    }
}

/// A number with a precision that suits its magnitude.
fn num(v: f64) -> String {
    if v >= 1000.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// The options cell: the row's options, after how many runs it is the
/// median of and their range, if it is one.
fn options_cell(r: &Row) -> String {
    let options = r.options.clone().unwrap_or_default();
    match (r.runs, r.run_min, r.run_max) {
        (Some(n), Some(lo), Some(hi)) => {
            // The same figure as `Row::merit`: a rate unless the row is
            // bulk (MB/s) or has no rate (p50, µs).
            let rate = r.msgs_per_s.is_some() && !(r.test == "bulk" && r.mb_per_s.is_some());
            let (lo, hi) = if rate {
                (si(lo), si(hi))
            } else {
                (num(lo), num(hi))
            };
            format!("median of {n} runs ({lo} to {hi}); {options}")
        }
        _ => options,
    }
}

/// One row's cells as the table shows them, in [`COLUMNS`] order.
pub fn cells(r: &Row) -> [String; 12] {
    [
        r.test.clone(),
        r.mode.clone(),
        r.size.to_string(),
        r.messages.to_string(),
        opt(r.msgs_per_s, si),
        opt(r.mb_per_s, num),
        opt(r.p50_us, num),
        opt(r.p99_us, num),
        opt(r.batches, |b| b.to_string()),
        opt(r.lost, |l| match r.dropped {
            Some(d) if d > 0 => format!("{l} ({d} dropped)"),
            _ => l.to_string(),
        }),
        opt(r.cpu_pct, |c| format!("{c:.0}")),
        options_cell(r),
    ]
}

fn width(s: &str) -> usize {
    s.chars().count()
}

/// The rows as an aligned table with a header line and a rule, one line
/// per row, each ending in a newline. Numbers are right-aligned; columns
/// are separated by two spaces; trailing spaces are trimmed.
pub fn table(rows: &[Row]) -> String {
    let header: Vec<String> = COLUMNS.iter().map(|(h, _)| h.to_string()).collect();
    let body: Vec<[String; 12]> = rows.iter().map(cells).collect();
    let mut widths: Vec<usize> = header.iter().map(|h| width(h)).collect();
    for line in &body {
        for (w, c) in widths.iter_mut().zip(line.iter()) {
            *w = (*w).max(width(c));
        }
    }
    let mut out = String::new();
    let mut emit = |line: &[String]| {
        let mut s = String::new();
        for (i, c) in line.iter().enumerate() {
            if i > 0 {
                s.push_str("  ");
            }
            let pad = " ".repeat(widths[i] - width(c));
            match COLUMNS[i].1 {
                Align::Left => {
                    s.push_str(c);
                    s.push_str(&pad);
                }
                Align::Right => {
                    s.push_str(&pad);
                    s.push_str(c);
                }
            }
        }
        out.push_str(s.trim_end());
        out.push('\n');
    };
    emit(&header);
    let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
    emit(&rule);
    for line in &body {
        emit(line);
    }
    out
}

/// `rows` reordered so that each (test, mode) series is contiguous, series
/// in order of first appearance, rows within a series in measured order.
pub fn grouped(rows: &[Row]) -> Vec<Row> {
    let mut order: Vec<String> = Vec::new();
    for r in rows {
        let s = r.series();
        if !order.contains(&s) {
            order.push(s);
        }
    }
    let mut out = rows.to_vec();
    out.sort_by_key(|r| order.iter().position(|s| *s == r.series()));
    out
}

/// Where rows go as they are measured: JSON lines are written at once (a
/// long run can be watched or cut short), the table at the end.
#[derive(Debug)]
pub struct Reporter {
    json: bool,
    rows: Vec<Row>,
}

impl Reporter {
    /// A reporter printing JSON lines if `json`, else a table at the end.
    pub fn new(json: bool) -> Reporter {
        Reporter {
            json,
            rows: Vec::new(),
        }
    }

    /// Whether progress bars may be drawn: not with `--json`, and only on
    /// a terminal.
    pub fn progress_enabled(&self) -> bool {
        !self.json && io::stderr().is_terminal()
    }

    /// Records a finished row (and prints it now in JSON mode).
    pub fn push(&mut self, row: Row) -> io::Result<()> {
        if self.json {
            let mut out = io::stdout().lock();
            writeln!(out, "{}", row.to_json())?;
            out.flush()?;
        }
        self.rows.push(row);
        Ok(())
    }

    /// Every row so far.
    pub fn rows(&self) -> &[Row] {
        &self.rows
    }

    /// Prints the table (unless in JSON mode), each series' rows together
    /// in the order the series first appeared.
    /// `notes` (one line each) follow the table.
    pub fn finish(&self, notes: &[String]) -> io::Result<()> {
        if !self.json {
            let mut out = io::stdout().lock();
            out.write_all(table(&grouped(&self.rows)).as_bytes())?;
            if !notes.is_empty() {
                writeln!(out)?;
                for n in notes {
                    writeln!(out, "{n}")?;
                }
            }
            out.flush()?;
        }
        Ok(())
    }
}

/// A progress bar on stderr for one test, or a hidden one.
pub fn progress(enabled: bool, len: u64, label: &str) -> ProgressBar {
    if !enabled {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    let style =
        ProgressStyle::with_template("{msg:>34} [{bar:30}] {human_pos}/{human_len} {elapsed}")
            .expect("valid progress template")
            .progress_chars("=> ");
    pb.set_style(style);
    pb.set_message(label.to_string());
    pb
}

/// A spinner on stderr for a test whose progress cannot be counted (a
/// child process), or a hidden one.
pub fn spinner(enabled: bool, label: &str) -> ProgressBar {
    if !enabled {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    pb.set_style(
        ProgressStyle::with_template("{msg:>34} {spinner} {elapsed}")
            .expect("valid progress template"),
    );
    pb.set_message(label.to_string());
    pb.enable_steady_tick(Duration::from_millis(120));
    pb
}

/// Process CPU time (user + system) used so far.
pub fn cpu_time() -> Duration {
    // SAFETY: getrusage writes into the zeroed struct we own and reads
    // nothing else; RUSAGE_SELF is always valid.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut ru);
        ru
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Measures the process CPU share between its creation and [`Self::pct`].
#[derive(Debug, Clone, Copy)]
pub struct CpuMeter {
    cpu: Duration,
    wall: Instant,
}

impl CpuMeter {
    /// Starts measuring now.
    pub fn start() -> CpuMeter {
        CpuMeter {
            cpu: cpu_time(),
            wall: Instant::now(),
        }
    }

    /// CPU time since start as a percentage of one core.
    pub fn pct(&self) -> f64 {
        let (cpu, wall) = self.elapsed();
        cpu_pct(cpu, wall)
    }

    /// Process CPU time and wall time since start.
    pub fn elapsed(&self) -> (Duration, Duration) {
        (cpu_time().saturating_sub(self.cpu), self.wall.elapsed())
    }
}

/// `cpu` as a percentage of one core over `wall`.
fn cpu_pct(cpu: Duration, wall: Duration) -> f64 {
    round(cpu.as_secs_f64() / wall.as_secs_f64().max(1e-9) * 100.0, 1)
}

/// Process CPU time and wall time summed over separate stretches: the CPU
/// share of a test timed in chunks between other tests' chunks (the
/// interleaved ping-pong rows), counting its own stretches only.
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuTotal {
    cpu: Duration,
    wall: Duration,
}

impl CpuTotal {
    /// Adds the stretch from `meter`'s start to now.
    pub fn add(&mut self, meter: &CpuMeter) {
        let (cpu, wall) = meter.elapsed();
        self.cpu += cpu;
        self.wall += wall;
    }

    /// The wall time of the stretches so far.
    pub fn wall(&self) -> Duration {
        self.wall
    }

    /// CPU time over the stretches as a percentage of one core.
    pub fn pct(&self) -> f64 {
        cpu_pct(self.cpu, self.wall)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<Row> {
        let mut a = Row::new("queue", "natural", 8);
        a.messages = 10_000_000;
        a.set_throughput(9_999_000, Duration::from_millis(800));
        a.lost = Some(1000);
        a.batches = Some(2300);
        a.options = Some("udp://127.0.0.1:0?timeout=0".into());
        let mut b = Row::new("udp-pingpong", "blocking", 16384);
        let mut h = histogram();
        for us in [20u64, 21, 22, 30] {
            record(&mut h, Duration::from_micros(us));
        }
        b.set_latency(&h);
        vec![a, b]
    }

    fn bulk(mb: f64) -> Row {
        Row {
            mb_per_s: Some(mb),
            msgs_per_s: Some(mb / 0.065_536),
            options: Some(format!("run at {mb}")),
            ..Row::new("bulk", "tunnel", 65_536)
        }
    }

    #[test]
    fn the_median_run_is_the_row_with_the_range_of_all_runs() {
        let rows = [1800.0, 2400.0, 1200.0, 2000.0, 1900.0].map(bulk).to_vec();
        let m = Row::median(rows).unwrap();
        assert_eq!(m.mb_per_s, Some(1900.0));
        assert_eq!(
            m.options.as_deref(),
            Some("run at 1900"),
            "the whole run's row"
        );
        assert_eq!(
            (m.runs, m.run_min, m.run_max),
            (Some(5), Some(1200.0), Some(2400.0))
        );
        assert!(
            cells(&m)[11].starts_with("median of 5 runs (1200 to 2400)"),
            "{:?}",
            cells(&m)
        );
        // An even count takes the lower middle; one run stays as it was.
        let m = Row::median([3.0, 1.0, 4.0, 2.0].map(bulk).to_vec()).unwrap();
        assert_eq!(m.mb_per_s, Some(2.0));
        let one = Row::median(vec![bulk(7.0)]).unwrap();
        assert_eq!((one.runs, one.run_min), (None, None));
        assert!(Row::median(Vec::new()).is_none());
    }

    #[test]
    fn latency_rows_take_the_median_p50_and_rate_rows_the_median_rate() {
        let lat = |p50: f64| Row {
            p50_us: Some(p50),
            ..Row::new("pingpong", "tunnel", 64)
        };
        let m = Row::median([90.0, 30.0, 50.0].map(lat).to_vec()).unwrap();
        assert_eq!(m.p50_us, Some(50.0));
        assert_eq!((m.run_min, m.run_max), (Some(30.0), Some(90.0)));
        let rate = |r: f64| Row {
            msgs_per_s: Some(r),
            mb_per_s: Some(r * 64.0 / 1e6),
            ..Row::new("msgs", "tunnel", 64)
        };
        let m = Row::median([3e6, 1e6, 2e6].map(rate).to_vec()).unwrap();
        assert_eq!(m.msgs_per_s, Some(2e6));
    }

    #[test]
    fn json_line_has_every_required_key() {
        for row in sample() {
            let line = row.to_json();
            assert!(!line.contains('\n'));
            let v: serde_json::Value = serde_json::from_str(&line).unwrap();
            let obj = v.as_object().unwrap();
            for key in [
                "test",
                "mode",
                "size",
                "messages",
                "msgs_per_s",
                "mb_per_s",
                "p50_us",
                "p99_us",
            ] {
                assert!(obj.contains_key(key), "{key} missing from {line}");
            }
        }
    }

    #[test]
    fn json_uses_null_where_not_applicable() {
        let rows = sample();
        let v: serde_json::Value = serde_json::from_str(&rows[0].to_json()).unwrap();
        assert!(v["p50_us"].is_null() && v["p99_us"].is_null());
        assert_eq!(v["lost"], 1000);
        let v: serde_json::Value = serde_json::from_str(&rows[1].to_json()).unwrap();
        assert!(v["msgs_per_s"].is_null() && v["mb_per_s"].is_null());
        assert_eq!(v["messages"], 4);
        assert!(v.get("lost").is_none(), "unset extras are omitted");
    }

    #[test]
    fn json_round_trips_and_accepts_foreign_rows() {
        for row in sample() {
            let back: Row = serde_json::from_str(&row.to_json()).unwrap();
            assert_eq!(back, row);
        }
        // A row from another program (the zmq peer) with only the required
        // keys and an unknown one.
        let line = r#"{"test":"zmq","mode":"push-pull-tcp","size":8,"messages":5,"msgs_per_s":5.0,"mb_per_s":4e-5,"p50_us":null,"p99_us":null,"hwm":1000}"#;
        let r: Row = serde_json::from_str(line).unwrap();
        assert_eq!(r.test, "zmq");
        assert_eq!(r.msgs_per_s, Some(5.0));
        assert_eq!(r.p50_us, None);
    }

    #[test]
    fn throughput_and_latency_units() {
        let rows = sample();
        let rate = rows[0].msgs_per_s.unwrap();
        assert!((rate - 12_498_750.0).abs() < 1.0);
        assert!((rows[0].mb_per_s.unwrap() - rate * 8.0 / 1e6).abs() < 1e-3);
        // hdrhistogram keeps 3 significant digits.
        let p50 = rows[1].p50_us.unwrap();
        assert!((21.0..=21.1).contains(&p50), "{p50}");
        assert!((29.9..=30.1).contains(&rows[1].p99_us.unwrap()));
    }

    #[test]
    fn table_aligns_columns() {
        let t = table(&sample());
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 4, "{t}");
        assert!(
            lines[0].starts_with("test")
                && lines[0].contains("msgs/s")
                && lines[0].contains("p50 µs")
        );
        assert!(lines[1].chars().all(|c| c == '-' || c == ' '));
        // Every right-aligned column ends at the same character position on
        // every line; find the header's column ends and check the rows.
        let header = lines[0];
        for name in ["size B", "messages", "msgs/s", "MB/s", "p50 µs", "p99 µs"] {
            let start = header.find(name).unwrap();
            let end = header[..start].chars().count() + name.chars().count();
            for line in &lines[1..] {
                let chars: Vec<char> = line.chars().collect();
                assert_ne!(
                    chars[end - 1],
                    ' ',
                    "column {name} ends at {end} in {line:?}"
                );
                assert!(
                    chars.get(end).is_none_or(|c| *c == ' '),
                    "column {name} overruns in {line:?}"
                );
            }
        }
        assert!(lines[2].contains("12.50 M"), "{}", lines[2]);
        assert!(lines[2].contains("1000"), "lost shown");
        // Latency row shows dashes for throughput.
        assert!(lines[3].contains(" - "), "{}", lines[3]);
    }

    #[test]
    fn grouping_keeps_series_together_in_first_seen_order() {
        let rows: Vec<Row> = [
            ("queue", 8),
            ("udp", 8),
            ("queue", 64),
            ("udp", 64),
            ("zmq", 64),
        ]
        .iter()
        .map(|(t, s)| Row::new(t, "m", *s))
        .collect();
        let g: Vec<(String, usize)> = grouped(&rows)
            .into_iter()
            .map(|r| (r.test, r.size))
            .collect();
        let want = [
            ("queue", 8),
            ("queue", 64),
            ("udp", 8),
            ("udp", 64),
            ("zmq", 64),
        ];
        assert_eq!(g, want.map(|(t, s)| (t.to_string(), s)));
    }

    #[test]
    fn si_suffixes() {
        assert_eq!(si(12_345_678.0), "12.35 M");
        assert_eq!(si(980_100.0), "980.1 k");
        assert_eq!(si(42.0), "42.00");
        assert_eq!(si(1.5e9), "1.50 G");
    }
}
