//! `skiff demo`: a complete exchange on this host with nothing else
//! installed, showing each pattern this build has.

use std::time::{Duration, Instant};

use crate::out::outln;

use bytes::Bytes;
use skiff::{Message, Queue};

#[derive(Debug, serde::Serialize, serde::Deserialize, PartialEq)]
struct Reading {
    sensor: String,
    celsius: f64,
}

pub(crate) fn run() -> Result<(), Box<dyn std::error::Error>> {
    outln!("skiff demo: two datagram queues on 127.0.0.1 (CMQ's push/pop)\n");
    let alice = Queue::bind("udp://127.0.0.1:0")?;
    let bob = Queue::bind("udp://127.0.0.1:0?qthresh=512&timeout=200ms")?;
    outln!(
        "alice  {}  natural batching (timeout=0)",
        alice.local_addr()
    );
    outln!(
        "bob    {}  qthresh=512 bytes, timeout=200ms (the CMQ paper's setting)\n",
        bob.local_addr()
    );

    // 1. A message with a subject, a type and fields.
    let hello = Message::new("demo.greeting", Bytes::from_static(b"hello, bob"))
        .with_kind("text")
        .with_field("lang", "en")
        .with_field("n", 1i64);
    let t = Instant::now();
    alice.push(bob.local_addr(), &hello)?;
    let m = bob
        .pop_blocking(Some(Duration::from_secs(2)))
        .ok_or("bob got nothing")?;
    outln!(
        "1. alice -> bob: {:?} subject={} type={:?} fields={:?} seq={} in {:?}",
        String::from_utf8_lossy(&m.payload),
        m.subject,
        m.kind.as_deref(),
        m.fields
            .iter()
            .map(|f| format!("{}={:?}", f.key, f.value))
            .collect::<Vec<_>>(),
        m.meta.seq,
        t.elapsed()
    );

    // 2. Typed push/pop (CMQ's polymorphic queue).
    alice.push_typed(
        bob.local_addr(),
        &Reading {
            sensor: "hallb".into(),
            celsius: 21.5,
        },
    )?;
    let r: Reading = loop {
        if let Some(r) = bob.try_pop_typed::<Reading>() {
            break r?;
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    outln!("2. typed: bob popped {r:?}");

    // 3. Batching: bob replies with 1000 small messages; they wait for
    //    qthresh or the 200 ms timeout and leave in few datagrams.
    let t = Instant::now();
    for i in 0..1000u32 {
        bob.push(
            alice.local_addr(),
            &Message::from_payload(Bytes::copy_from_slice(&i.to_le_bytes())),
        )?;
    }
    let mut got = 0;
    while got < 1000 {
        if alice.pop_blocking(Some(Duration::from_secs(2))).is_none() {
            break;
        }
        got += 1;
    }
    let s = bob.stats();
    outln!(
        "3. batching: bob pushed 1000 x 4-byte messages; they travelled in {} datagrams ({:.0} messages each);\n   \
         alice popped {got} in {:?} (the last, partial batch waited for bob's 200 ms timeout)",
        s.sent_batches,
        1000.0 / s.sent_batches.max(1) as f64,
        t.elapsed(),
    );

    // 4. Non-blocking pop returns at once when nothing is there.
    let t = Instant::now();
    let none = alice.try_pop();
    outln!(
        "4. try_pop on an empty queue: {:?} after {:?}",
        none.map(|_| "message"),
        t.elapsed()
    );

    // 5. Bad input is refused with a clear error, never silently.
    let big = Message::from_payload(vec![0u8; 2000]);
    match alice.push(bob.local_addr(), &big) {
        Err(e) => outln!("5. a 2000-byte message on a 1472-byte path: {e}"),
        Ok(()) => return Err("an oversized message was accepted".into()),
    }
    match Queue::bind("udp://127.0.0.1:0?qthresh=lots") {
        Err(e) => outln!("   a bad locator: {e}"),
        Ok(_) => return Err("a bad locator was accepted".into()),
    }

    let (a, b) = (alice.stats(), bob.stats());
    outln!(
        "\nstats  alice: sent {} msgs in {} datagrams, received {}, lost {}, dropped {}",
        a.sent_messages,
        a.sent_batches,
        a.recv_messages,
        a.lost,
        a.dropped.total()
    );
    outln!(
        "       bob:   sent {} msgs in {} datagrams, received {}, lost {}, dropped {}",
        b.sent_messages,
        b.sent_batches,
        b.recv_messages,
        b.lost,
        b.dropped.total()
    );
    if got != 1000 {
        return Err(format!("alice received {got} of 1000 messages").into());
    }
    node_demo()?;
    outln!("\ndemo complete.");
    Ok(())
}

/// The node's patterns over `mem://` (the node inside this process):
/// publish/subscribe, request/reply, a cluster request and a broadcast.
fn node_demo() -> Result<(), Box<dyn std::error::Error>> {
    use skiff::client::{Client, Incoming, Target};
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async {
        outln!("\nskiff demo: a node inside this process (mem://)\n");
        let a = Client::connect("mem://demo").await?;
        let b = Client::connect("mem://demo").await?;
        let wait = Duration::from_secs(2);

        // 6. Publish/subscribe with a wildcard; subscribe returns once the
        //    node holds the interest.
        let mut sub = b.subscribe("daq.*.rate", "*").await?;
        a.publish(Message::new("daq.hallb.rate", "42 kHz")).await?;
        let d = tokio::time::timeout(wait, sub.recv()).await?.ok_or("no message")?;
        outln!(
            "6. publish/subscribe: b's `daq.*.rate` got {} {:?}",
            d.subject,
            String::from_utf8_lossy(&d.payload)
        );

        // 7. Request/reply to a subject; and no responders, at once.
        let mut svc = b.subscribe("svc.upper", "*").await?;
        let b2 = b.clone();
        tokio::spawn(async move {
            while let Some(d) = svc.recv().await {
                let up = String::from_utf8_lossy(&d.payload).to_uppercase();
                let _ = b2.reply(&d, Message::new("", up)).await;
            }
        });
        let r = a.request("svc.upper", Message::new("", "hello"), wait).await?;
        outln!("7. request svc.upper \"hello\" -> {:?}", String::from_utf8_lossy(&r.payload));
        match a.request("svc.nobody", Message::new("", "?"), wait).await {
            Err(e) => outln!("   request svc.nobody -> {e}"),
            Ok(_) => return Err("a request with no responders was answered".into()),
        }

        // 8. A cluster: two members with capacities 1 and 3; six requests
        //    split 1:3 by weighted round robin; a broadcast reaches both.
        let mut members = Vec::new();
        for (name, cap) in [("small", 1u32), ("big", 3)] {
            let c = Client::connect("mem://demo").await?;
            let m = c.join("workers", cap).await?;
            members.push((name, c, m));
        }
        let mut handles = Vec::new();
        for (name, _c, m) in members {
            handles.push(tokio::spawn(async move {
                let mut broadcasts = 0;
                while let Some(i) = m.recv().await {
                    match i {
                        Incoming::Request(r) => {
                            let _ = r.reply(Message::new("", name)).await;
                        }
                        Incoming::Broadcast(_) => {
                            broadcasts += 1;
                            break;
                        }
                        _ => {}
                    }
                }
                (name, broadcasts, _c)
            }));
        }
        let mut who = Vec::new();
        for _ in 0..8 {
            let r = a.request(Target::cluster("workers"), Message::new("", "job"), wait).await?;
            who.push(String::from_utf8_lossy(&r.payload).into_owned());
        }
        outln!("8. 8 requests to cluster `workers` (capacities small=1, big=3): {}", who.join(" "));
        a.broadcast("workers", Message::new("all.hands", "stop")).await?;
        for h in handles {
            let (name, n, _c) = tokio::time::timeout(wait, h).await??;
            outln!("   broadcast reached {name} ({n})");
        }
        let st = a.stats().await?;
        outln!(
            "   node stats: {} clients, {} subscriptions, {} published, {} requests, {} no responders",
            st.connections, st.subscriptions, st.published, st.requests, st.no_responders
        );
        Ok::<(), Box<dyn std::error::Error>>(())
    })
}
