//! cMsg's LogFile subdomain with real processes: several `skiff pub`
//! writers append through one `skiff node --log` to one log file, one of
//! them is killed with SIGKILL in the middle of a stream of large
//! messages, and the log holds only whole records: every record valid,
//! none skipped, each surviving writer's messages all there and in order,
//! the killed writer's each whole.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use skiff_proto::record::{self, Skipped};

fn skiff() -> Command {
    Command::new(env!("CARGO_BIN_EXE_skiff"))
}

struct Kill(Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Every record in the log: (subject, payload), and what was skipped.
fn read_log(path: &std::path::Path) -> (Vec<(String, Vec<u8>)>, Skipped, usize) {
    let data = Bytes::from(std::fs::read(path).unwrap_or_default());
    let (mut at, mut skipped, mut out) = (0, Skipped::default(), Vec::new());
    while let Some(m) = record::next_skipping(&data, &mut at, 1 << 24, &mut skipped) {
        out.push((m.subject.to_string(), m.payload.to_vec()));
    }
    (out, skipped, data.len() - at)
}

#[test]
fn many_writers_one_log_and_a_killed_writer_leaves_no_torn_record() {
    let dir = std::env::temp_dir().join(format!("skiff-logsink-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("shared.log");
    let _ = std::fs::remove_file(&path);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut node = skiff()
        .args(["node", "--tcp", &format!("127.0.0.1:{port}"), "--no-mesh"])
        .args(["--log", &format!("logs.>={}", path.display())])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn skiff node");
    let mut err = BufReader::new(node.stderr.take().unwrap());
    let mut seen = String::new();
    while !seen.contains("listening on tcp") {
        let mut line = String::new();
        assert!(err.read_line(&mut line).unwrap() > 0, "node exited: {seen}");
        seen += &line;
    }
    std::thread::spawn(move || std::io::copy(&mut err, &mut std::io::sink()));
    let _node = Kill(node);
    let loc = format!("skiff://127.0.0.1:{port}");

    // The victim: 32 KiB messages as fast as it can, killed mid-stream.
    let big = "v".repeat(32 * 1024);
    let victim = skiff()
        .args([
            "pub",
            "-n",
            &loc,
            "logs.victim",
            &big,
            "--count",
            "100000000",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut victim = Kill(victim);

    // Three writers, each numbering its lines.
    const N: usize = 2000;
    let writers: Vec<_> = (0..3)
        .map(|k| {
            let mut c = skiff()
                .args(["pub", "-n", &loc, &format!("logs.w{k}")])
                .stdin(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            let mut stdin = c.stdin.take().unwrap();
            let feed = std::thread::spawn(move || {
                for i in 0..N {
                    writeln!(stdin, "w{k}-{i:06}-{}", "p".repeat(300 + (i * 37) % 900)).unwrap();
                }
            });
            (c, feed)
        })
        .collect();

    // Kill the victim once some of its records are in the log.
    let t = Instant::now();
    loop {
        let (recs, _, _) = read_log(&path);
        if recs.iter().filter(|(s, _)| s == "logs.victim").count() >= 5 {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the victim's records never came"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // SIGKILL: no chance to finish a frame.
    victim.0.kill().unwrap();
    victim.0.wait().unwrap();

    for (c, feed) in writers {
        feed.join().unwrap();
        let out = c.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "writer: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    // Wait for the node to write everything the writers sent, and to
    // finish the batch it is writing: a read during the node's `write`
    // sees the file grow page by page, so it can end inside a record (a
    // batch of the victim's 32 KiB records is megabytes), which is no torn
    // record. One left once the node is done is, and fails here after the
    // deadline.
    let t = Instant::now();
    let (recs, skipped) = loop {
        let (recs, skipped, tail) = read_log(&path);
        let done = recs.iter().filter(|(s, _)| s.starts_with("logs.w")).count();
        if done == 3 * N && tail == 0 {
            break (recs, skipped);
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "{done} of {} records; {tail} bytes of a partial record at the end of the log",
            3 * N
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(skipped.records, 0, "damaged records: {:?}", skipped.last);
    for k in 0..3 {
        let subject = format!("logs.w{k}");
        let got: Vec<String> = recs
            .iter()
            .filter(|(s, _)| *s == subject)
            .map(|(_, p)| String::from_utf8(p.clone()).unwrap())
            .collect();
        let want: Vec<String> = (0..N)
            .map(|i| format!("w{k}-{i:06}-{}", "p".repeat(300 + (i * 37) % 900)))
            .collect();
        assert!(
            got == want,
            "writer {k}: records missing, out of order or changed"
        );
    }
    let victims: Vec<&Vec<u8>> = recs
        .iter()
        .filter(|(s, _)| s == "logs.victim")
        .map(|(_, p)| p)
        .collect();
    assert!(victims.len() >= 5);
    assert!(
        victims.iter().all(|p| p[..] == *big.as_bytes()),
        "a victim record is not whole"
    );

    // The standard reader reads the shared log too.
    let out = skiff()
        .args([
            "sub",
            "-n",
            &format!("file://{}", path.display()),
            "logs.w1",
            "--count",
            "3",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(
        text.lines()
            .next()
            .unwrap()
            .starts_with("logs.w1 w1-000000-"),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
