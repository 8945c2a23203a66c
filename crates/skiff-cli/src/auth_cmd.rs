//! `skiff keygen` and `skiff passwd`: the credentials a node's `[auth]`
//! table and its clients need, made without another tool.

use std::error::Error;
use std::io::{BufRead, Write};
use std::path::PathBuf;

type Result<T> = std::result::Result<T, Box<dyn Error>>;

/// `skiff keygen`
#[derive(clap::Args, Debug)]
pub(crate) struct KeygenArgs {
    /// Where to write the private key (created, readable by its owner
    /// only; an existing file is not overwritten). Clients name it with
    /// `?key=FILE`.
    file: PathBuf,
}

/// Writes a new Ed25519 private key to a file and prints its public key
/// for the node's `[[auth.users]] public_key` (and as a NATS nkey).
pub(crate) fn keygen(a: KeygenArgs) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let seed = skiff::keys::generate_seed()?;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&a.file)
        .map_err(|e| format!("cannot create {}: {e}", a.file.display()))?;
    writeln!(f, "{}", skiff::keys::seed_text(&seed))?;
    let public = skiff::keys::public_of(&seed);
    println!("public_key = \"{}\"", skiff::keys::public_text(&public));
    println!("# as a NATS nkey: {}", skiff::keys::nkey_public(&public));
    Ok(())
}

/// Reads a password from standard input (one line) and prints its argon2
/// hash for `[[auth.users]] password_hash`.
pub(crate) fn passwd() -> Result<()> {
    let mut line = String::new();
    if std::io::IsTerminal::is_terminal(&std::io::stdin()) {
        eprint!("password (shown as typed): ");
    }
    std::io::stdin().lock().read_line(&mut line)?;
    let pw = line.trim_end_matches(['\n', '\r']);
    if pw.is_empty() {
        return Err("an empty password".into());
    }
    println!(
        "password_hash = \"{}\"",
        skiff_node::auth::hash_password(pw)
    );
    Ok(())
}
