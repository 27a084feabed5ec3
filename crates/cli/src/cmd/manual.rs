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
    write_stdout(&completion_script(a.shell))?;
    Ok(exit::OK)
}

fn completion_script(shell: clap_complete::Shell) -> Vec<u8> {
    let mut cmd = Cli::command();
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut cmd, "longhaul", &mut out);
    out
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::ValueEnum;

    /// Every command a user can name, walked down the clap tree (hidden
    /// ones and clap's own `help` left out), each with its path
    /// (`["longhaul", "token", "create"]`).
    fn commands() -> Vec<(Vec<String>, clap::Command)> {
        let mut found = Vec::new();
        let mut todo = vec![(vec!["longhaul".to_string()], Cli::command())];
        while let Some((path, cmd)) = todo.pop() {
            for sub in cmd
                .get_subcommands()
                .filter(|s| !s.is_hide_set() && s.get_name() != "help")
            {
                let mut p = path.clone();
                p.push(sub.get_name().to_string());
                todo.push((p, sub.clone()));
            }
            found.push((path, cmd));
        }
        found
    }

    /// The long names of the options a user sees (clap's own --help and
    /// --version included).
    fn long_options(cmd: &clap::Command) -> Vec<String> {
        let mut cmd = cmd.clone();
        cmd.build();
        cmd.get_arguments()
            .filter(|a| !a.is_hide_set())
            .filter_map(|a| a.get_long().map(str::to_string))
            .collect()
    }

    fn visible_subcommands(cmd: &clap::Command) -> Vec<String> {
        cmd.get_subcommands()
            .filter(|s| !s.is_hide_set() && s.get_name() != "help")
            .map(|s| s.get_name().to_string())
            .collect()
    }

    #[test]
    fn the_command_tree_is_walked_deep() {
        let all = commands();
        assert!(all.len() > 20, "{} commands", all.len());
        assert!(all.iter().any(|(p, _)| p.len() == 3), "no third level");
    }

    #[test]
    fn every_command_has_a_page_naming_it_its_options_and_its_subcommands() {
        let dir = tempfile::tempdir().unwrap();
        let Ok(written) = write_pages(&Cli::command(), dir.path()) else {
            panic!("the pages were not written");
        };
        let all = commands();
        let mut pages: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        pages.sort();
        let mut expected: Vec<String> = all
            .iter()
            .map(|(p, _)| format!("{}.1", p.join("-")))
            .collect();
        expected.sort();
        assert_eq!(pages, expected, "one page for each command, no other");
        assert_eq!(written, all.len());
        for (path, cmd) in &all {
            let name = path.join("-");
            let page = std::fs::read_to_string(dir.path().join(format!("{name}.1"))).unwrap();
            // roff: a hyphen in text is written \-.
            let roff = |s: &str| s.replace('-', "\\-");
            assert!(
                page.contains(&format!("\n.TH {name} 1 ")),
                "{name}: no title of its own"
            );
            for long in long_options(cmd) {
                assert!(
                    page.contains(&format!("\\-\\-{}", roff(&long))),
                    "{name}.1 does not describe --{long}"
                );
            }
            for sub in visible_subcommands(cmd) {
                assert!(
                    page.contains(&format!("{}\\-{}(1)", roff(&name), roff(&sub))),
                    "{name}.1 does not point to {name}-{sub}(1)"
                );
            }
        }
    }

    /// How a shell's script offers option `--long`.
    fn offers_option(shell: clap_complete::Shell, script: &str, long: &str) -> bool {
        match shell {
            clap_complete::Shell::Fish => script.contains(&format!("-l {long}")),
            _ => script.contains(&format!("--{long}")),
        }
    }

    #[test]
    fn every_shells_completion_offers_every_command_and_its_options() {
        let all = commands();
        for shell in clap_complete::Shell::value_variants() {
            let script = String::from_utf8(completion_script(*shell)).unwrap();
            for (path, cmd) in &all {
                let name = path.last().unwrap();
                assert!(
                    script.contains(name.as_str()),
                    "{shell}: no command {}",
                    path.join(" ")
                );
                for long in long_options(cmd) {
                    assert!(
                        offers_option(*shell, &script, &long),
                        "{shell}: no --{long} of {}",
                        path.join(" ")
                    );
                }
            }
        }
    }

    /// Bash's script has a section per command (`longhaul__token__create)`),
    /// each listing that command's own options: checked per command, so an
    /// option offered under the wrong command is caught too.
    #[test]
    fn bash_offers_each_commands_options_under_that_command() {
        let script = String::from_utf8(completion_script(clap_complete::Shell::Bash)).unwrap();
        for (path, cmd) in commands() {
            let key = format!("{})", path.join("__subcmd__").replace('-', "__"));
            let at = script
                .find(&format!("        {key}\n            opts=\""))
                .unwrap_or_else(|| panic!("bash: no section {key}"));
            let opts = script[at..].lines().nth(1).unwrap();
            for long in long_options(&cmd) {
                assert!(
                    opts.split(['"', ' ']).any(|w| w == format!("--{long}")),
                    "bash: {} does not offer --{long}: {opts}",
                    path.join(" ")
                );
            }
        }
    }
}
