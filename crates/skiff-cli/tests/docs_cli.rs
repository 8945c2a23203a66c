//! `skiff completions` and `skiff man` come from the command line's own
//! definitions; the repository's docs link only inside the repository.

mod cli_util;

use std::path::Path;

use cli_util::{fails, run};

const COMMANDS: [&str; 6] = ["node", "sub", "join", "broadcast", "tunnel", "completions"];

#[test]
fn completions_for_each_shell_know_every_command_and_flag() {
    let bash = run(&["completions", "bash"]);
    assert!(bash.contains("complete -F _skiff"), "{bash}");
    let zsh = run(&["completions", "zsh"]);
    assert!(zsh.starts_with("#compdef skiff"), "{zsh}");
    let fish = run(&["completions", "fish"]);
    assert!(fish.contains("complete -c skiff"), "{fish}");
    for script in [&bash, &zsh, &fish] {
        for c in COMMANDS {
            assert!(script.contains(c), "{c}");
        }
        assert!(script.contains("capacity"), "join --capacity");
    }
    // bash can load what it printed (when bash is here).
    if let Ok(out) = std::process::Command::new("bash")
        .args(["-n", "-c", &bash])
        .output()
    {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let err = fails(&["completions", "tcsh"]);
    assert!(err.contains("bash"), "{err}");
}

#[test]
fn man_pages_render_from_the_definitions() {
    let page = run(&["man"]);
    assert!(
        page.starts_with(".ie") || page.contains(".TH skiff"),
        "{page}"
    );
    assert!(page.contains(".TH skiff 1"), "{page}");
    for c in COMMANDS {
        assert!(page.contains(c), "{c} in the page");
    }
    let dir = std::env::temp_dir().join(format!("skiff-man-{}", std::process::id()));
    run(&["man", "--dir", dir.to_str().unwrap()]);
    for c in [
        "skiff.1",
        "skiff-join.1",
        "skiff-tunnel.1",
        "skiff-broadcast.1",
    ] {
        let text = std::fs::read_to_string(dir.join(c)).unwrap_or_else(|e| panic!("{c}: {e}"));
        assert!(text.contains(".TH"), "{c}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every relative link target in `README.md` and `docs/*.md` exists inside
/// the repository (the docs stand alone: nothing in `../shared`).
#[test]
fn docs_link_only_inside_the_repository() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let root = root.canonicalize().unwrap();
    let mut files = vec![root.join("README.md")];
    for e in std::fs::read_dir(root.join("docs")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "md") {
            files.push(p);
        }
    }
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        for target in text.split("](").skip(1).filter_map(|t| t.split(')').next()) {
            let target = target.split('#').next().unwrap().trim();
            if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let p = f.parent().unwrap().join(target);
            let p = p
                .canonicalize()
                .unwrap_or_else(|_| panic!("{}: link {target:?} leads nowhere", f.display()));
            assert!(
                p.starts_with(&root),
                "{}: link {target:?} leaves the repository",
                f.display()
            );
        }
    }
}
