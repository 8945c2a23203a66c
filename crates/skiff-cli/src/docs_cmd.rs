//! `skiff completions` and `skiff man`: shell completions and man pages
//! generated from the command line's own definitions, so they never
//! disagree with `--help`.

use std::error::Error;
use std::io::Write;
use std::path::PathBuf;

use clap_complete::Shell;

/// `skiff completions`
#[derive(clap::Args, Debug)]
pub(crate) struct CompletionsArgs {
    /// The shell: bash, zsh, fish, elvish or powershell.
    shell: Shell,
}

/// `skiff man`
#[derive(clap::Args, Debug)]
pub(crate) struct ManArgs {
    /// Write `skiff.1` and one `skiff-COMMAND.1` per command into this
    /// directory instead of printing `skiff.1`.
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
}

/// Prints the completion script for `a.shell`.
pub(crate) fn completions(
    a: CompletionsArgs,
    mut cmd: clap::Command,
) -> Result<(), Box<dyn Error>> {
    let mut out = Vec::new();
    clap_complete::generate(a.shell, &mut cmd, "skiff", &mut out);
    std::io::stdout().lock().write_all(&out)?;
    Ok(())
}

/// Prints the man page, or writes every page into `a.dir`.
pub(crate) fn man(a: ManArgs, cmd: clap::Command) -> Result<(), Box<dyn Error>> {
    let Some(dir) = a.dir else {
        let mut out = Vec::new();
        clap_mangen::Man::new(cmd).render(&mut out)?;
        std::io::stdout().lock().write_all(&out)?;
        return Ok(());
    };
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    clap_mangen::generate_to(cmd, &dir)
        .map_err(|e| format!("writing into {}: {e}", dir.display()))?;
    eprintln!("skiff man: pages written into {}", dir.display());
    Ok(())
}
