use super::keys::{base32_decode, crc16};
use super::*;
use skiff_proto::router::{Pattern, Subject};

fn signing_key(seed: u8) -> ed25519_dalek::SigningKey {
    ed25519_dalek::SigningKey::from_bytes(&[seed; 32])
}

fn config(text: &str) -> AuthConfig {
    #[derive(Deserialize)]
    struct Wrap {
        auth: AuthConfig,
    }
    toml::from_str::<Wrap>(text).unwrap().auth
}

fn users() -> (Auth, ed25519_dalek::SigningKey) {
    let key = signing_key(7);
    let pk = base64::Engine::encode(
        &base64::engine::general_purpose::STANDARD,
        key.verifying_key().to_bytes(),
    );
    let text = format!(
        r#"
[auth]
token = "tok-123"
[[auth.users]]
name = "alice"
password_hash = "{}"
[auth.users.permissions]
publish = {{ allow = ["orders.>"] }}
subscribe = {{ allow = ["orders.>", "status.*"], deny = ["orders.secret.>"] }}
allow_responses = false
join = {{ allow = [] }}
[[auth.users]]
name = "svc"
public_key = "{pk}"
[[auth.users]]
name = "apps"
uid = 4242
"#,
        hash_password("pw-alice")
    );
    (Auth::new(&config(&text)).unwrap(), key)
}

#[test]
fn no_auth_lets_anyone_in_with_every_permission() {
    let a = Auth::default();
    assert!(!a.enabled());
    let u = a.verify(&Credentials::None, b"n").unwrap();
    assert_eq!(u.name, "anonymous");
    assert!(u.permissions.may_publish("a.b") && u.permissions.may_subscribe(">"));
}

#[test]
fn each_kind_of_credential_proves_its_user() {
    let (a, key) = users();
    let nonce = new_nonce();
    let tok = a
        .verify(&Credentials::Token(Secret::new("tok-123")), &nonce)
        .unwrap();
    assert_eq!(tok.name, "token");
    let alice = a
        .verify(
            &Credentials::Password {
                user: "alice".into(),
                password: Secret::new("pw-alice"),
            },
            &nonce,
        )
        .unwrap();
    assert_eq!(alice.name, "alice");
    use ed25519_dalek::Signer;
    let sig = key.sign(&nonce).to_bytes();
    let svc = a
        .verify(
            &Credentials::Signature {
                public_key: key.verifying_key().to_bytes(),
                signature: sig,
            },
            &nonce,
        )
        .unwrap();
    assert_eq!(svc.name, "svc");
    let apps = a
        .verify(&Credentials::Local { uid: 4242, gid: 1 }, &nonce)
        .unwrap();
    assert_eq!(apps.name, "apps");
    assert_eq!(a.failures(), 0);
}

#[test]
fn every_wrong_credential_gets_the_same_answer_and_is_counted() {
    let (a, key) = users();
    let nonce = new_nonce();
    use ed25519_dalek::Signer;
    let other = signing_key(9);
    let wrong = [
        Credentials::None,
        Credentials::Token(Secret::new("tok-124")),
        Credentials::Token(Secret::new("x".repeat(MAX_CREDENTIAL + 1))),
        Credentials::Password {
            user: "alice".into(),
            password: Secret::new("wrong"),
        },
        Credentials::Password {
            user: "mallory".into(),
            password: Secret::new("pw-alice"),
        },
        // A user with no password.
        Credentials::Password {
            user: "svc".into(),
            password: Secret::new(""),
        },
        // The right key, a signature over another nonce.
        Credentials::Signature {
            public_key: key.verifying_key().to_bytes(),
            signature: key.sign(b"another nonce").to_bytes(),
        },
        // A key no user has, signing correctly.
        Credentials::Signature {
            public_key: other.verifying_key().to_bytes(),
            signature: other.sign(&nonce).to_bytes(),
        },
        // The right key, another key's signature.
        Credentials::Signature {
            public_key: key.verifying_key().to_bytes(),
            signature: other.sign(&nonce).to_bytes(),
        },
        Credentials::Local { uid: 1, gid: 1 },
    ];
    for c in &wrong {
        let e = a.verify(c, &nonce).unwrap_err();
        assert_eq!(
            e.to_string(),
            "authentication failed: the node did not accept these credentials",
            "{c:?}"
        );
    }
    assert_eq!(a.failures(), wrong.len() as u64);
}

#[test]
fn secrets_are_not_printed() {
    let (a, _) = users();
    let dbg = format!("{a:?}");
    assert!(!dbg.contains("tok-123") && !dbg.contains("argon2"), "{dbg}");
    let c = Credentials::Password {
        user: "alice".into(),
        password: Secret::new("pw-alice"),
    };
    assert!(!format!("{c:?}").contains("pw-alice"));
    assert!(!format!("{:?}", Credentials::Token(Secret::new("tok-123"))).contains("tok"));
}

#[test]
fn permissions_allow_deny_and_wildcards() {
    let (a, _) = users();
    let alice = a
        .verify(
            &Credentials::Password {
                user: "alice".into(),
                password: Secret::new("pw-alice"),
            },
            b"",
        )
        .unwrap();
    let p = &alice.permissions;
    assert!(p.may_publish("orders.new"));
    assert!(!p.may_publish("orders"));
    assert!(!p.may_publish("payroll.salary.alice"));
    assert!(p.may_subscribe("orders.new"));
    assert!(p.may_subscribe("orders.*"));
    assert!(p.may_subscribe("status.x"));
    assert!(
        !p.may_subscribe("status.>"),
        "status.> is wider than status.*"
    );
    assert!(!p.may_subscribe(">"));
    assert!(
        !p.may_subscribe("orders.>"),
        "overlaps the denied orders.secret.>"
    );
    assert!(!p.may_subscribe("orders.secret.x"));
    assert!(!p.may_subscribe("orders.*.x"), "orders.secret.x overlaps");
    assert!(p.may_subscribe("orders.public.x"));
    assert!(!p.allow_responses);
    assert!(!p.may_join("svc"));
    // Not subjects at all: only an unrestricted rule passes them on.
    assert!(!p.may_publish("orders..x"));
    assert!(Permissions::default().may_publish("bad..subject"));
}

fn pat(s: &str) -> Pattern<'_> {
    Pattern::new(s).unwrap()
}

#[test]
fn covers_and_overlaps_agree_with_matching() {
    let pats = [
        "a", "b", "a.b", "a.*", "*.b", "a.>", ">", "*", "*.*", "a.b.c", "a.*.c", "*.>", "a.b.>",
    ];
    let subjects = [
        "a", "b", "a.b", "a.c", "b.b", "a.b.c", "a.x.c", "a.b.d", "x.y.z.w", "a.b.c.d",
    ];
    for o in pats {
        for i in pats {
            let (po, pi) = (pat(o), pat(i));
            let m = |p: Pattern<'_>, s: &str| p.matches(&Subject::new(s).unwrap());
            // Over this sample of subjects: covers ⇒ no subject of i
            // escapes o; overlaps ⇐ some subject matches both.
            if covers(po, pi) {
                for s in subjects {
                    assert!(!m(pi, s) || m(po, s), "{o} covers {i} but not {s}");
                }
            }
            if subjects.iter().any(|s| m(po, s) && m(pi, s)) {
                assert!(overlaps(po, pi), "{o} and {i} share a subject");
            }
            assert_eq!(overlaps(po, pi), overlaps(pi, po), "{o} {i}");
        }
    }
    assert!(covers(pat(">"), pat("a.>")));
    assert!(covers(pat("a.>"), pat("a.*.>")));
    assert!(!covers(pat("a.*"), pat("a.>")));
    assert!(!covers(pat("a.>"), pat("a")));
    assert!(!overlaps(pat("a.>"), pat("a")));
    assert!(!overlaps(pat("a.b"), pat("a.c")));
    assert!(overlaps(pat("*.b"), pat("a.*")));
}

#[test]
fn nats_nkeys_decode_and_match_their_seed() {
    // The user nkey and seed from nats-server's documentation example.
    let public = "UDXU4RCSJNZOIQHZNWXHXORDPRTGNJAHAHFRGZNEEJCPQTT2M7NLCNF4";
    let seed = "SUACSSL3UAHUDXKFSNVUZRF5UHPMWZ6BFDTJ7M6USDXIEDNPPQYYYCU3VY";
    let pk = PublicKey::parse(public).expect("a valid user nkey");
    let raw = base32_decode(seed).unwrap();
    assert_eq!(raw.len(), 36);
    assert_eq!(crc16(&raw[..34]), u16::from_le_bytes([raw[34], raw[35]]));
    let sk = ed25519_dalek::SigningKey::from_bytes(&raw[2..34].try_into().unwrap());
    assert_eq!(sk.verifying_key().to_bytes(), pk.0);
    // One character changed: the checksum refuses it.
    let mut bad = public.to_string();
    bad.replace_range(10..11, "A");
    assert_ne!(&bad, public);
    assert!(PublicKey::parse(&bad).is_none());
    // Hex and base64 of the same key.
    let hex: String = pk.0.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(PublicKey::parse(&hex), Some(pk));
}

#[test]
fn configuration_errors_name_the_line() {
    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Wrap {
        auth: AuthConfig,
    }
    let text = "[auth]\ntoken = \"t\"\n[[auth.users]]\nname = \"a\"\nuid = 1\n[auth.users.permissions]\npublish = { allow = [\"a..b\"] }\n";
    let e = toml::from_str::<Wrap>(text).unwrap_err().to_string();
    assert!(e.contains("line 7") && e.contains("a..b"), "{e}");
    let text = "[auth]\n[[auth.users]]\nname = \"a\"\npassword_hash = \"plain\"\n";
    let e = toml::from_str::<Wrap>(text).unwrap_err().to_string();
    assert!(e.contains("line 4") && e.contains("argon2"), "{e}");
    let text = "[auth]\n[[auth.users]]\nname = \"a\"\npublic_key = \"abc\"\n";
    let e = toml::from_str::<Wrap>(text).unwrap_err().to_string();
    assert!(e.contains("line 4") && e.contains("Ed25519"), "{e}");
    let dup = config(
        "[auth]\n[[auth.users]]\nname = \"a\"\nuid = 1\n[[auth.users]]\nname = \"b\"\nuid = 1\n",
    );
    let e = Auth::new(&dup).unwrap_err().to_string();
    assert!(e.contains("uid 1"), "{e}");
    let none = config("[auth]\n[[auth.users]]\nname = \"a\"\n");
    assert!(Auth::new(&none).is_err());
}

#[test]
fn cmsg_subscriptions_are_allowed_only_where_tokens_cannot_be_escaped() {
    use skiff_proto::router::Syntax;
    let open = Permissions::default();
    assert!(open.may_subscribe_as(Syntax::Cmsg, "*"));
    let limited = Permissions {
        subscribe: Rule {
            allow: Some(vec![PatternText::new("public.>").unwrap()]),
            deny: Vec::new(),
        },
        ..Permissions::default()
    };
    // `public.*` as a cMsg pattern also matches `public.a.payroll.x`; as
    // tokens it would be within `public.>`, so the kind must decide.
    assert!(limited.may_subscribe_as(Syntax::Tokens, "public.*"));
    assert!(!limited.may_subscribe_as(Syntax::Cmsg, "public.*"));
    assert!(!limited.may_subscribe_as(Syntax::Cmsg, "*"));
    // Without a wildcard it is one subject, checked as such.
    assert!(limited.may_subscribe_as(Syntax::Cmsg, "public.news"));
    assert!(!limited.may_subscribe_as(Syntax::Cmsg, "private.news"));
}

#[test]
fn a_rebuild_keeps_unchanged_users_updates_changed_ones_and_cuts_the_rest() {
    let h = hash_password("pw");
    let text = |token: &str, bob_pub: &str, carol: bool| {
        let mut t = format!(
            "[auth]\ntoken = \"{token}\"\n[[auth.users]]\nname = \"alice\"\npassword_hash = \"{h}\"\n[[auth.users]]\nname = \"bob\"\npassword_hash = \"{h}\"\n[auth.users.permissions]\npublish = {{ allow = [\"{bob_pub}\"] }}\n"
        );
        if carol {
            t += "[[auth.users]]\nname = \"carol\"\nuid = 7\n";
        }
        t
    };
    let old = Auth::new(&config(&text("t1", "a.>", true))).unwrap();
    let user = |a: &Auth, name: &str| {
        a.users()
            .find(|u| u.name == name)
            .cloned()
            .unwrap_or_else(|| panic!("no {name}"))
    };
    let (alice, bob, carol, tok) = (
        user(&old, "alice"),
        user(&old, "bob"),
        user(&old, "carol"),
        user(&old, "token"),
    );
    bob.denied.publish.fetch_add(3, Relaxed);
    old.count_failure();
    // Same token, bob narrowed, carol gone.
    let new = Auth::rebuild(&config(&text("t1", "b.>", false)), &old).unwrap();
    assert_eq!(new.failures(), 1);
    assert!(matches!(new.fate(&alice), Fate::Keep));
    assert!(matches!(new.fate(&tok), Fate::Keep));
    match new.fate(&bob) {
        Fate::Update(u) => {
            assert!(u.permissions.may_publish("b.x") && !u.permissions.may_publish("a.x"));
            assert_eq!(u.denied.snapshot()[0], 3, "refusals carried over");
        }
        f => panic!("{f:?}"),
    }
    match new.fate(&carol) {
        Fate::Cut(why) => assert!(why.contains("`carol` was removed"), "{why}"),
        f => panic!("{f:?}"),
    }
    // The same users looked up after the rebuild are the kept ones.
    assert!(Arc::ptr_eq(&user(&new, "alice"), &alice));
    // A new token cuts its holders; alice's new password hash cuts her.
    let h2 = hash_password("pw2");
    let t = text("t2", "b.>", false).replacen(&h, &h2, 1);
    let newer = Auth::rebuild(&config(&t), &new).unwrap();
    assert!(matches!(newer.fate(&tok), Fate::Cut(w) if w.contains("token changed")));
    assert!(matches!(newer.fate(&alice), Fate::Cut(w) if w.contains("credentials")));
    // Anonymous clients are cut once authentication is required, and kept
    // where it is not.
    assert!(matches!(newer.fate(&User::anonymous()), Fate::Cut(_)));
    assert!(matches!(
        Auth::default().fate(&User::anonymous()),
        Fate::Keep
    ));
}
