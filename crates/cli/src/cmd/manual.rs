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

    /// The options a shell's script offers in command `path`'s own part, as
    /// `--long` (and `-s`) words; None when the script has no part for it.
    /// Each generator's layout: bash a `case` arm per command (`opts="..."`),
    /// zsh an `_arguments` call per command nested in its parent's `case`,
    /// fish a `complete` line per option under the command's condition,
    /// elvish and PowerShell a block keyed `longhaul;token;create`.
    fn offered(shell: clap_complete::Shell, script: &str, path: &[String]) -> Option<Vec<String>> {
        use clap_complete::Shell;
        match shell {
            Shell::Bash => bash_part(script, path),
            Shell::Zsh => zsh_part(script, path),
            Shell::Fish => Some(fish_part(script, path)),
            Shell::Elvish => keyed_part(script, &format!("&'{}'= {{", path.join(";")), "cand "),
            Shell::PowerShell => keyed_part(
                script,
                &format!("'{}' {{", path.join(";")),
                "[CompletionResult]::new('",
            ),
            other => panic!("no reader of {other}'s completion script: add one"),
        }
    }

    fn bash_part(script: &str, path: &[String]) -> Option<Vec<String>> {
        let key = format!("{})", path.join("__subcmd__").replace('-', "__"));
        let at = script.find(&format!("        {key}\n            opts=\""))?;
        let opts = script[at..].lines().nth(1)?;
        Some(
            opts.split(['"', ' '])
                .filter(|w| w.starts_with('-'))
                .map(str::to_string)
                .collect(),
        )
    }

    /// zsh: the top command's `_arguments` is the first in `_longhaul`; a
    /// subcommand's is the arm `(NAME)` directly inside the `case` that
    /// follows its parent's `curcontext` line (`:longhaul-token-command-`).
    fn zsh_part(script: &str, path: &[String]) -> Option<Vec<String>> {
        let lines: Vec<&str> = script.lines().collect();
        let begin = if let [_] = path {
            let f = lines.iter().position(|l| l.starts_with("_longhaul() {"))?;
            f + lines[f..]
                .iter()
                .position(|l| l.trim_start().starts_with("_arguments"))?
        } else {
            let (parent, name) = (&path[..path.len() - 1], &path[path.len() - 1]);
            let context = format!(":{}-command-$line[1]:\"", parent.join("-"));
            let at = lines
                .iter()
                .position(|l| l.trim_start().starts_with("curcontext=") && l.ends_with(&context))?;
            let (arm, mut depth) = (format!("({name})"), 0);
            let mut found = None;
            for (k, l) in lines.iter().enumerate().skip(at + 1) {
                let t = l.trim();
                if t.starts_with("case ") && t.ends_with(" in") {
                    depth += 1;
                } else if t == "esac" {
                    depth -= 1;
                    if depth == 0 {
                        break;
                    }
                } else if depth == 1 && t == arm && lines[k + 1].starts_with("_arguments") {
                    found = Some(k + 1);
                    break;
                }
            }
            found?
        };
        let end = begin + lines[begin..].iter().position(|l| l.trim() == "&& ret=0")?;
        // '(--csv --json)*--md=[help]:...': exclusions, repeatable, the name.
        let names = lines[begin + 1..end].iter().filter_map(|l| {
            let l = l.strip_prefix('\'')?;
            let l = if l.starts_with('(') {
                &l[l.find(')')? + 1..]
            } else {
                l
            };
            let l = l.trim_start_matches('*');
            let name = &l[..l.find(['[', '=', '+', ':', '\''])?];
            (!name.is_empty()).then(|| name.to_string())
        });
        Some(names.collect())
    }

    /// fish: the `-l NAME` of every `complete` line whose condition is the
    /// command's own (`using_subcommand token; and seen_subcommand_from create`).
    fn fish_part(script: &str, path: &[String]) -> Vec<String> {
        let using = "__fish_longhaul_using_subcommand";
        let mine = |cond: &str| match path {
            [_] => cond == "__fish_longhaul_needs_command",
            [_, a] => {
                cond == format!("{using} {a}")
                    || cond.starts_with(&format!(
                        "{using} {a}; and not __fish_seen_subcommand_from "
                    ))
            }
            [_, a, b] => cond == format!("{using} {a}; and __fish_seen_subcommand_from {b}"),
            _ => panic!("fish: no reader for commands {} deep", path.len()),
        };
        script
            .lines()
            .filter_map(|l| {
                let rest = l.strip_prefix("complete -c longhaul -n \"")?;
                let (cond, rest) = rest.split_once('"')?;
                let opts = rest.split(" -d '").next()?;
                let mut words = opts.split_whitespace().skip_while(|w| *w != "-l");
                let long = words.nth(1)?;
                mine(cond).then(|| format!("--{long}"))
            })
            .collect()
    }

    /// elvish and PowerShell: the block that opens with `head` up to its
    /// closing brace, each offered word following `lead`.
    fn keyed_part(script: &str, head: &str, lead: &str) -> Option<Vec<String>> {
        let mut lines = script.lines().skip_while(|l| l.trim() != head);
        lines.next()?;
        let words = lines
            .take_while(|l| l.trim() != "}")
            .filter_map(|l| l.trim().strip_prefix(lead))
            .filter_map(|w| w.split([' ', '\'']).next().map(str::to_string));
        Some(words.collect())
    }

    /// Every shell's script has a part per command (bash a `case` arm, zsh
    /// an `_arguments` call, fish the command's condition, elvish and
    /// PowerShell a keyed block), and that part offers the command's own
    /// options: checked per command, so an option offered under the wrong
    /// command, or not at all, is caught in every shell. Every shell's
    /// shortfalls are listed at once.
    #[test]
    fn every_shell_offers_each_commands_options_under_that_command() {
        let all = commands();
        let mut short = Vec::new();
        for shell in clap_complete::Shell::value_variants() {
            let script = String::from_utf8(completion_script(*shell)).unwrap();
            for (path, cmd) in &all {
                let Some(offered) = offered(*shell, &script, path) else {
                    short.push(format!("{shell}: no part for {}", path.join(" ")));
                    continue;
                };
                for long in long_options(cmd) {
                    if !offered.iter().any(|o| *o == format!("--{long}")) {
                        short.push(format!(
                            "{shell}: {} does not offer --{long} in its part: {offered:?}",
                            path.join(" ")
                        ));
                    }
                }
            }
        }
        assert!(short.is_empty(), "{}", short.join("\n"));
    }
}
