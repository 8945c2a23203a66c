//! The node's authentication input on arbitrary bytes: an `[auth]` TOML
//! table (users, hashes, keys, permission patterns), key texts (base64,
//! hex, NATS nkeys and seeds), credentials checked against a configured
//! node, and permission checks on arbitrary subjects and patterns. Never a
//! panic; a pattern covered by another always overlaps it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use skiff_node::auth::{
    covers, overlaps, Auth, AuthConfig, Credentials, PatternText, PublicKey, Rule, Secret,
};
use skiff_proto::router::Pattern;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(rest);
    match mode % 4 {
        0 => {
            #[derive(serde::Deserialize)]
            struct Wrap {
                auth: AuthConfig,
            }
            if let Ok(w) = toml::from_str::<Wrap>(&text) {
                if let Ok(a) = Auth::new(&w.auth) {
                    // No secret in Debug, whatever the configuration.
                    let _ = format!("{a:?}");
                    let _ = a.verify(&Credentials::Token(Secret::new(text.to_string())), b"n");
                    let _ = a.local_user(0, 0);
                }
            }
        }
        1 => {
            let _ = PublicKey::parse(&text);
            let _ = skiff::keys::parse_seed(&text);
            let _ = skiff::keys::parse_public(&text);
        }
        2 => {
            let parts: Vec<&str> = text.split('\n').collect();
            let pats: Vec<PatternText> = parts
                .iter()
                .filter_map(|p| PatternText::new(p).ok())
                .collect();
            let half = pats.len() / 2;
            let rule = Rule {
                allow: Some(pats[..half].to_vec()),
                deny: pats[half..].to_vec(),
            };
            for p in &parts {
                let _ = rule.permits(p);
                let _ = rule.permits_pattern(p);
            }
            for x in &pats {
                for y in &pats {
                    let (px, py) = (
                        Pattern::new(x.as_str()).unwrap(),
                        Pattern::new(y.as_str()).unwrap(),
                    );
                    if covers(px, py) {
                        assert!(
                            overlaps(px, py),
                            "{} covers {} without overlapping",
                            x.as_str(),
                            y.as_str()
                        );
                    }
                    assert_eq!(overlaps(px, py), overlaps(py, px));
                }
            }
        }
        _ => {
            // Datagrams separated by 0xff 0x00.
            let ds: Vec<&[u8]> = rest.split(|&b| b == 0xff).collect();
            assert_eq!(skiff_node::mesh::fuzz_seal_open(&ds), 0);
        }
    }
});
