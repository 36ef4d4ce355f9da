"""Every `mtnlg` command's `--help`: each option and positional argument, in every subcommand and nested
subcommand (`data curate`, `job submit`, ...), says what it is (issue 44)."""
import argparse
import pytest
from mtnlg.cli import COMMANDS, build_parser

def help_problems(parser: argparse.ArgumentParser, path: str = "mtnlg") -> list:
    "Arguments of `parser` and of its subcommands, recursively, shown in --help without text (as 'PATH: ARG')."
    out = []
    for a in parser._actions:
        if isinstance(a, (argparse._HelpAction, argparse._VersionAction)) or a.help == argparse.SUPPRESS: continue
        if isinstance(a, argparse._SubParsersAction):
            helps = {c.dest: c.help for c in a._choices_actions}
            for name, sub in a.choices.items():
                if not (helps.get(name) or "").strip(): out.append(f"{path} {name}: the subcommand has no help")
                out += help_problems(sub, f"{path} {name}")
            continue
        if not (a.help or "").strip(): out.append(f"{path}: {'/'.join(a.option_strings) or a.dest} has no help")
    return out

def parser_of(command: str) -> argparse.ArgumentParser:
    "The parser `mtnlg COMMAND --help` prints from (only that command's module is imported, as there)."
    ap = build_parser([command])
    sub = next(a for a in ap._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[command]

def test_top_level_help_describes_every_command():
    assert help_problems(build_parser([])) == []       # `mtnlg --help`: each command's one line
    assert set(COMMANDS) >= {"train", "eval", "data", "job", "plan", "demo"}

@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_option_of_every_subcommand_has_help(command):
    p = parser_of(command)
    assert len(p._actions) > 2, f"mtnlg {command}: its module added no options"   # the module's parser was built
    bad = help_problems(p, f"mtnlg {command}")
    assert not bad, "options without help text:\n" + "\n".join(bad)
    text = p.format_help()                                  # what --help prints (argparse renders every argument)
    for a in p._actions:
        for s in a.option_strings: assert s in text, (command, s)

def test_help_walk_finds_options_without_help():
    "Controls: an option, a positional argument and a nested subcommand left without help are each named."
    ap = argparse.ArgumentParser(prog="x")
    ap.add_argument("--fine", help="has text"); ap.add_argument("--bare"); ap.add_argument("path")
    sub = ap.add_subparsers(dest="c")
    s = sub.add_parser("run", help="runs"); s.add_argument("--nodes", type=int)
    sub.add_parser("quiet")
    assert help_problems(ap, "x") == ["x: --bare has no help", "x: path has no help", "x run: --nodes has no help",
                                 "x quiet: the subcommand has no help"]
