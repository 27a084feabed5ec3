//! `completions` and `man`: shell completion scripts and manual pages,
//! generated from the same clap definitions as `--help`, so they cannot
//! drift from what the binary accepts.

use std::io::Write;
use std::path::Path;

use clap::CommandFactory;

use super::{Failure, Outcome};
use crate::args::{Cli, CompletionsArgs, ManArgs};
use crate::exit;

/// `longhaul completions SHELL`: the script on stdout.
pub fn completions(a: CompletionsArgs) -> Outcome {
    let mut cmd = Cli::command();
    let mut out = Vec::new();
    clap_complete::generate(a.shell, &mut cmd, "longhaul", &mut out);
    write_stdout(&out)?;
    Ok(exit::OK)
}

/// `longhaul man [--out DIR]`: the main page on stdout, or every page
/// (`longhaul.1`, `longhaul-cp.1`, `longhaul-token-create.1`, ...) into DIR.
pub fn man(a: ManArgs) -> Outcome {
    let cmd = Cli::command();
    match a.out {
        None => {
            let mut out = Vec::new();
            render(&cmd, &mut out)?;
            write_stdout(&out)?;
        }
        Some(dir) => {
            std::fs::create_dir_all(&dir).map_err(|e| {
                Failure::internal(format!("man: cannot make {}: {e}", dir.display()))
            })?;
            let n = write_pages(&cmd, &dir)?;
            outln!("wrote {n} manual pages into {}", dir.display());
        }
    }
    Ok(exit::OK)
}

/// Writes the page of `cmd` and of each of its subcommands, named as man
/// names them (`longhaul-token-create.1`); how many.
fn write_pages(cmd: &clap::Command, dir: &Path) -> Result<usize, Failure> {
    let cmd = cmd.clone().disable_help_subcommand(true);
    let mut n = 0;
    let mut pages = vec![(cmd.get_name().to_owned(), cmd)];
    while let Some((name, cmd)) = pages.pop() {
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            let sub_name = format!("{name}-{}", sub.get_name());
            pages.push((sub_name.clone(), sub.clone().name(sub_name)));
        }
        let mut page = Vec::new();
        render(&cmd, &mut page)?;
        let file = dir.join(format!("{name}.1"));
        std::fs::write(&file, page)
            .map_err(|e| Failure::internal(format!("man: cannot write {}: {e}", file.display())))?;
        n += 1;
    }
    Ok(n)
}

fn render(cmd: &clap::Command, out: &mut Vec<u8>) -> Result<(), Failure> {
    clap_mangen::Man::new(cmd.clone())
        .render(out)
        .map_err(|e| Failure::internal(format!("man: cannot render the page: {e}")))
}

/// Standard output, whole; a closed pipe (`| head`) is not an error.
fn write_stdout(bytes: &[u8]) -> Result<(), Failure> {
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(Failure::internal(format!(
            "cannot write to standard output: {e}"
        ))),
        _ => Ok(()),
    }
}
