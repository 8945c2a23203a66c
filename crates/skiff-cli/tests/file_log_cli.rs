//! A damaged `file://` log, written and read by `skiff pub` and `skiff sub`
//! as separate processes: a torn tail is cut when the log is next opened to
//! append, a corrupt record is skipped and counted, and every other record
//! is read.

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn skiff() -> Command {
    Command::new(env!("CARGO_BIN_EXE_skiff"))
}

/// `skiff pub -n <log> log.t`, one message per line of `lines`; returns
/// its standard error.
fn publish(log: &str, lines: &[String]) -> String {
    let mut child = skiff()
        .args(["pub", "-n", log, "log.t"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn skiff pub");
    let mut stdin = child.stdin.take().unwrap();
    for l in lines {
        writeln!(stdin, "{l}").unwrap();
    }
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "skiff pub failed: {err}");
    err
}

fn payloads(r: std::ops::Range<usize>) -> Vec<String> {
    r.map(|i| format!("record-{i:02}-{}", "x".repeat(40)))
        .collect()
}

fn find(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len())
        .position(|w| w == needle)
        .expect("in the log")
}

#[test]
fn a_torn_tail_and_a_corrupt_record_cost_only_themselves() {
    let dir = std::env::temp_dir().join(format!("skiff-log-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("damaged.log");
    let _ = std::fs::remove_file(&path);
    let log = format!("file://{}", path.display());

    publish(&log, &payloads(0..10));
    let mut bytes = std::fs::read(&path).unwrap();
    // Silent corruption in the middle: record 4's payload changes.
    let at = find(&bytes, b"record-04");
    bytes[at..at + 6].copy_from_slice(b"RECORD");
    // A torn tail: the last append stopped mid-record 9.
    let cut = find(&bytes, b"record-09") + 4;
    bytes.truncate(cut);
    std::fs::write(&path, &bytes).unwrap();

    let err = publish(&log, &payloads(10..15));
    assert!(
        err.contains("cut a torn record"),
        "no report of the cut: {err}"
    );

    let want: Vec<String> = payloads(0..15)
        .into_iter()
        .enumerate()
        .filter(|(i, _)| *i != 4 && *i != 9)
        .map(|(_, p)| format!("log.t {p}"))
        .collect();
    let mut sub = skiff()
        .args(["sub", "-n", &log, "log.>", "--count"])
        .arg(want.len().to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn skiff sub");
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = sub.try_wait().unwrap() {
            break Some(s);
        }
        if Instant::now() > deadline {
            let _ = sub.kill();
            let _ = sub.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let (mut out, mut err) = (String::new(), String::new());
    sub.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    sub.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert!(
        status.is_some_and(|s| s.success()),
        "skiff sub: {status:?}, read {out}, said {err}"
    );
    assert_eq!(out.lines().collect::<Vec<_>>(), want, "said {err}");
    assert!(
        err.contains("1 damaged log record(s) skipped"),
        "the damage is not reported: {err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
