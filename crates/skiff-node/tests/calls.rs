//! cMsg's calls, on every transport: `subscribe_and_get` (the next
//! matching message, a timeout, no lasting subscription), callbacks as a
//! way to consume, and the client-wide `start`/`stop` of delivery beside
//! each subscription's pause and resume.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{eventually, quiet, recv_n, H};
use parking_lot::Mutex;
use skiff::client::{Delivery, SubOptions};
use skiff::{Error, Message};

on_every_transport!(
    subscribe_and_get_takes_the_next_match,
    subscribe_and_get_times_out_and_leaves_nothing,
    callbacks_get_every_message_in_order,
    stop_holds_every_subscription_until_start,
);

async fn subscribe_and_get_takes_the_next_match(h: H) {
    let p = h.client().await;
    let c = h.client().await;
    let base = h.node.broker().subscription_count();
    let get = {
        let c = c.clone();
        tokio::spawn(async move {
            c.subscribe_and_get(
                "job.{i>10}",
                "done",
                SubOptions::default().cmsg(),
                Duration::from_secs(20),
            )
            .await
        })
    };
    eventually(|| h.node.broker().subscription_count() == base + 1).await;
    for (s, k) in [
        ("job.3", "done"),
        ("job.11", "start"),
        ("job.12", "done"),
        ("job.13", "done"),
    ] {
        p.publish(Message::new(s, "x").with_kind(k)).await.unwrap();
    }
    let d = get.await.unwrap().unwrap();
    assert_eq!((&*d.subject, d.kind.as_deref()), ("job.12", Some("done")));
    // The subscription it made is gone.
    eventually(|| h.node.broker().subscription_count() == base).await;
    // Token patterns too.
    let get = {
        let c = c.clone();
        tokio::spawn(async move {
            c.subscribe_and_get("t.*", "*", SubOptions::default(), Duration::from_secs(20))
                .await
        })
    };
    eventually(|| h.node.broker().subscription_count() == base + 1).await;
    p.publish(Message::new("t.a", "y")).await.unwrap();
    assert_eq!(&*get.await.unwrap().unwrap().subject, "t.a");
}

async fn subscribe_and_get_times_out_and_leaves_nothing(h: H) {
    let c = h.client().await;
    let base = h.node.broker().subscription_count();
    let e = c
        .subscribe_and_get(
            "never",
            "*",
            SubOptions::default(),
            Duration::from_millis(200),
        )
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Timeout), "{e}");
    eventually(|| h.node.broker().subscription_count() == base).await;
    // A bad pattern is an error at once, not a timeout.
    let e = c
        .subscribe_and_get(
            "a{",
            "*",
            SubOptions::default().cmsg(),
            Duration::from_secs(5),
        )
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Subject(_)), "{e}");
    // The client-wide stop does not hold it back.
    c.stop();
    let p = h.client().await;
    let get = {
        let c = c.clone();
        tokio::spawn(async move {
            c.subscribe_and_get("s", "*", SubOptions::default(), Duration::from_secs(20))
                .await
        })
    };
    eventually(|| h.node.broker().subscription_count() == base + 1).await;
    p.publish(Message::new("s", "z")).await.unwrap();
    assert_eq!(&*get.await.unwrap().unwrap().payload, b"z");
}

async fn callbacks_get_every_message_in_order(h: H) {
    let p = h.client().await;
    let c = h.client().await;
    let got: Arc<Mutex<Vec<String>>> = Arc::default();
    let sink = got.clone();
    let handle = c
        .subscribe_fn(
            "cb.#",
            "*",
            SubOptions::default().cmsg(),
            move |d: Delivery| {
                sink.lock()
                    .push(String::from_utf8_lossy(&d.payload).into_owned());
            },
        )
        .await
        .unwrap();
    for i in 0..100 {
        p.publish(Message::new(format!("cb.{i}"), i.to_string()))
            .await
            .unwrap();
    }
    p.publish(Message::new("cb.x", "not a match"))
        .await
        .unwrap();
    let want: Vec<String> = (0..100).map(|i| i.to_string()).collect();
    eventually(|| got.lock().len() >= 100).await;
    assert_eq!(*got.lock(), want);
    // Paused, the callback is not called; the messages wait and come on
    // resume, in order.
    handle.pause();
    for i in 100..110 {
        p.publish(Message::new(format!("cb.{i}"), i.to_string()))
            .await
            .unwrap();
    }
    p.flush().await.unwrap();
    eventually(|| handle.queue_len() == 10).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(got.lock().len(), 100);
    handle.resume();
    eventually(|| got.lock().len() == 110).await;
    assert_eq!(
        got.lock()[100..],
        (100..110).map(|i| i.to_string()).collect::<Vec<_>>()[..]
    );
    // Dropping the handle ends the subscription in the node.
    let before = h.node.broker().subscription_count();
    drop(handle);
    eventually(|| h.node.broker().subscription_count() == before - 1).await;
    p.publish(Message::new("cb.200", "late")).await.unwrap();
    p.flush().await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(got.lock().len(), 110);
}

async fn stop_holds_every_subscription_until_start(h: H) {
    let p = h.client().await;
    let c = h.client().await;
    let mut a = c.subscribe("st.a", "*").await.unwrap();
    let calls = Arc::new(Mutex::new(0usize));
    let n = calls.clone();
    let _cb = c
        .subscribe_fn("st.a", "*", SubOptions::default(), move |_| *n.lock() += 1)
        .await
        .unwrap();
    assert!(c.is_started());
    c.stop();
    assert!(!c.is_started());
    // Made while stopped: held too.
    let mut b = c.subscribe("st.b", "*").await.unwrap();
    // Paused on its own as well: start does not resume it.
    let mut own = c.subscribe("st.a", "*").await.unwrap();
    own.pause();
    for i in 0..5 {
        p.publish(Message::new("st.a", i.to_string()))
            .await
            .unwrap();
        p.publish(Message::new("st.b", i.to_string()))
            .await
            .unwrap();
    }
    p.flush().await.unwrap();
    eventually(|| a.queue_len() == 5 && b.queue_len() == 5).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(a.try_recv().is_none() && b.try_recv().is_none());
    assert_eq!(*calls.lock(), 0);
    c.start();
    let payloads =
        |v: Vec<Delivery>| -> Vec<Vec<u8>> { v.into_iter().map(|d| d.payload.to_vec()).collect() };
    let want: Vec<Vec<u8>> = (0..5).map(|i: i32| i.to_string().into_bytes()).collect();
    assert_eq!(payloads(recv_n(&mut a, 5).await), want);
    assert_eq!(payloads(recv_n(&mut b, 5).await), want);
    eventually(|| *calls.lock() == 5).await;
    assert!(own.try_recv().is_none());
    quiet(&mut own).await;
    own.resume();
    assert_eq!(payloads(recv_n(&mut own, 5).await), want);
}
