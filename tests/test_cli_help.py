"""Every `mtnlg` command's `--help`, nested subcommands too (`data curate`, `job submit`, ...): each option and
positional argument says what it is and each option its default, and printing them all imports none of torch,
DeepSpeed, megatron-core, lm-eval, datatrove or transformers (so `--help` answers at once). One vocabulary: old
flag names keep working and name the new one; `--step` with an HF model is refused (issue 44)."""
import argparse, contextlib, io, json, subprocess, sys
import pytest
from conftest import ROOT
from mtnlg.cli import COMMANDS, VOCABULARY, build_parser, main, vocabulary_problems
from mtnlg.flags import with_defaults

HEAVY = ("torch", "deepspeed", "megatron", "lm_eval", "datatrove", "transformers")


def help_problems(parser: argparse.ArgumentParser, path: str = "mtnlg") -> list:
    "Arguments of `parser` and its subcommands, recursively, shown without text or (options) without a default."
    out, fmt = [], parser._get_formatter()
    # one of a required choice (`--checkpoint` or `--hf-model`) has no default either
    chosen = {id(a) for g in parser._mutually_exclusive_groups if g.required for a in g._group_actions}
    for a in parser._actions:
        if isinstance(a, (argparse._HelpAction, argparse._VersionAction)) or a.help == argparse.SUPPRESS: continue
        if isinstance(a, argparse._SubParsersAction):
            helps = {c.dest: c.help for c in a._choices_actions}
            seen = set()
            for name, sub in a.choices.items():
                if id(sub) in seen: continue                       # an alias of a subcommand already walked
                seen.add(id(sub))
                if not (helps.get(name) or "").strip(): out.append(f"{path} {name}: the subcommand has no help")
                out += help_problems(sub, f"{path} {name}")
            continue
        name = "/".join(a.option_strings) or a.dest
        if not (a.help or "").strip(): out.append(f"{path}: {name} has no help"); continue
        # what --help prints for it; a switch (no value) is off unless given, a required option has none
        if (a.option_strings and a.nargs != 0 and not a.required and id(a) not in chosen
                and "default" not in fmt._expand_help(a).lower()):
            out.append(f"{path}: {name} shows no default")
    return out


def subcommand_paths(parser, path=()) -> list:
    "Every command line (as a tuple of words) that has its own --help, nested subcommands too."
    out = [path]
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sub in a.choices.items(): out += subcommand_paths(sub, path + (name,))
    return out


# one process: print every --help through `main`, check them, report what got imported
WALK = r'''
import argparse, contextlib, io, json, sys
sys.path.insert(0, sys.argv[1])
from test_cli_help import HEAVY, help_problems, subcommand_paths
from mtnlg.cli import build_parser, main
if sys.argv[2] == "control": import mtnlg.eval                     # a command's module imported to build its parser
ap, texts, unseen = build_parser(), {}, []
for path in subcommand_paths(ap):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try: main([*path, "--help"])
        except SystemExit as e: assert e.code == 0, path
    texts[" ".join(path)] = out.getvalue()
for path in subcommand_paths(ap):                                    # each option appears in its command's help
    p = ap
    for w in path: p = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction)).choices[w]
    unseen += [f"{path}: {s}" for a in p._actions if a.help != argparse.SUPPRESS for s in a.option_strings
               if s not in texts[" ".join(path)]]
heavy = sorted({m.split(".")[0] for m in sys.modules} & set(HEAVY))
print(json.dumps(dict(helps=sorted(texts), problems=help_problems(ap), unseen=unseen, heavy=heavy)))
'''


def walk_helps(mode: str = "plain") -> dict:
    p = subprocess.run([sys.executable, "-c", WALK, str(ROOT / "tests"), mode], capture_output=True, text=True,
                       timeout=600, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.splitlines()[-1])


def test_every_help_says_each_option_and_default_without_importing_torch():
    r = walk_helps()
    assert {"", "train", "eval", "export", "import-hf", "generate", "plan", "demo", "data curate", "data demo-corpus",
            "job submit", "job logs"} <= set(r["helps"]), r["helps"]
    assert set(COMMANDS) <= set(r["helps"])
    assert r["problems"] == [], "\n".join(r["problems"])
    assert r["unseen"] == []
    assert r["heavy"] == [], f"--help imported {r['heavy']}: declare the flags in mtnlg.flags, import in cli_run"
    control = walk_helps("control")                       # the same walk with a command's module imported
    assert {"torch", "lm_eval"} <= set(control["heavy"]) and control["problems"] == []


def test_help_walk_finds_options_without_help_or_default():
    "Controls: an option, a positional argument and a nested subcommand left without help, and an option whose "
    "default is not shown, are each named."
    ap = with_defaults(argparse.ArgumentParser(prog="x"))
    ap.add_argument("--fine", default=8, help="has text"); ap.add_argument("--bare"); ap.add_argument("path")
    ap.add_argument("--limit", default=None, help="first N")
    ap.add_argument("--step", default=None, help="this step (default: the latest)")
    sub = ap.add_subparsers(dest="c")
    s = sub.add_parser("run", help="runs"); s.add_argument("--nodes", type=int, help="nodes", default=1)
    sub.add_parser("quiet")
    with_defaults(ap)
    assert help_problems(ap, "x") == ["x: --bare has no help", "x: path has no help", "x: --limit shows no default",
                                      "x quiet: the subcommand has no help"]
    s.formatter_class = argparse.HelpFormatter             # without `with_defaults`: --nodes' 1 is not shown
    assert help_problems(s, "x run") == ["x run: --nodes shows no default"]


def test_the_flags_choices_are_the_commands_own():
    "mtnlg.flags declares choices without importing the commands' modules: they agree with those modules."
    from mtnlg import flags, train, export, demo
    assert flags.LAYOUTS == train.LAYOUTS and set(flags.PRECISIONS) == set(export.DTYPES)
    assert flags.DEMO_TASKS == demo.DEMO_TASKS


def subparser(parser, *path):
    "The parser of the subcommand `path` (`'data', 'build'`) of `parser`."
    for w in path:
        parser = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[w]
    return parser


def test_every_flag_has_one_meaning_the_table_writes_down():
    "Every option of every command, nested too, against `mtnlg.cli.VOCABULARY`: none missing, none with a second "
    "meaning; every old name names a flag of its command. Controls: each kind of break is named."
    ap = build_parser()
    assert vocabulary_problems(ap) == []
    assert {"--out", "--out-file", "--out-prefix", "--dry-run", "--fake-run", "--no-progress"} <= set(VOCABULARY)
    assert VOCABULARY["--dry-run"][0] == "train, job submit" and VOCABULARY["--no-progress"][0].count(",") >= 4
    # controls, one command each: --dry-run meaning something else, a flag missing, a switch taking a value
    subparser(ap, "eval").add_argument("--dry-run", action="store_true", help="load the model, score nothing")
    subparser(ap, "generate").add_argument("--quiet-please", action="store_true", help="not in the table")
    subparser(ap, "data", "build").add_argument("--json", default="x", help="a value, where --json is a switch")
    got = vocabulary_problems(ap)
    assert any(p.startswith("mtnlg eval: --dry-run: the table gives it one meaning") for p in got), got
    assert "mtnlg generate: --quiet-please is not in the vocabulary table (mtnlg.cli.VOCABULARY)" in got
    assert any(p.startswith("mtnlg data build: --json takes a value, but a switch in `mtnlg ") for p in got)
    assert len(got) == 4, got                              # the fourth: data build is not in --json's row
    # a stale row and an old name that names nothing
    from mtnlg.flags import renamed
    ap = build_parser()
    renamed(subparser(ap, "demo"), "--eval-shots", "--shot-counts", "shots")
    got = vocabulary_problems(ap, {**VOCABULARY, "--gone": ("eval", "a flag no command has")})
    assert got == ["mtnlg demo: --eval-shots is an old name of --shot-counts, which `mtnlg demo` does not have",
                   "the table lists --gone for eval, which do not have it"], got


TRAIN_DRY_RUN = r'''
import json, sys
from mtnlg.cli import main
rc = main(sys.argv[2:])
print(json.dumps(dict(rc=rc, heavy=sorted({m.split(".")[0] for m in sys.modules} & set(sys.argv[1].split(","))))))
'''


def test_train_dry_run_checks_shows_and_runs_nothing(tmp_path):
    "`mtnlg train --dry-run`: the preflight's checked config printed, no folder written, torch never imported; "
    "controls: a bad setting is refused in one line, and a run folder holding another run is refused."
    def dry(*argv):
        p = subprocess.run([sys.executable, "-c", TRAIN_DRY_RUN, ",".join(HEAVY), "train", "--dry-run", *map(str, argv)],
                           capture_output=True, text=True, timeout=600, cwd=tmp_path)
        return json.loads(p.stdout.splitlines()[-1]), p.stdout, p.stderr
    r, out, err = dry("--preset", "tiny", "--data", "mock", "--steps", 3, "--out", tmp_path / "run")
    assert r == dict(rc=0, heavy=[]) and json.loads(out[:out.rindex("\n{")])["steps"] == 3, out + err
    assert not (tmp_path / "run").exists()
    r, out, err = dry("--preset", "tiny", "--heads", 5, "--out", tmp_path / "run")
    assert r["rc"] == 2 and "5 heads do not divide" in err and len(err.strip().splitlines()) == 1, err
    (tmp_path / "old" / "checkpoints").mkdir(parents=True)
    r, out, err = dry("--preset", "tiny", "--data", "mock", "--out", tmp_path / "old")
    assert r["rc"] == 2 and "holds another run" in err, err


def test_plan_help_shows_only_what_plan_uses():
    "`mtnlg plan --help`: the planner's settings, cluster and output, the fake run in its own group; none of the "
    "training-only settings (still reachable through --set). Control: `mtnlg train --help` shows them."
    plan, train = subparser(build_parser(), "plan").format_help(), subparser(build_parser(), "train").format_help()
    training_only = ["--lr", "--steps", "--seed", "--data", "--out", "--save-interval", "--eval-interval",
                     "--timeout-s", "--keep-last", "--resume", "--no-progress", "--layout"]
    assert [f for f in training_only if f + " " in plan] == []
    assert [f for f in training_only if f + " " not in train] == []
    group = plan[plan.index("fake run: "):]
    assert all(f in group for f in ("--fake-run", "--fake-steps", "--fake-full", "--ranks", "--micro-batches"))
    assert "--dry-run" not in plan and "--tp" in plan and "--nodes" in plan


RENAMED = [  # (old command line, the old flag, the parsed field, its value, the new name the note says)
    (["eval", "--hf-model", "m", "--data", "E"], "--data", "eval_dir", "E", "--eval-dir"),
    (["data", "curate", "s.txt", "--out", "o", "--tasks", "3"], "--tasks", "shards", 3, "--shards"),
    (["data", "curate", "s.txt", "--out", "o", "--split", "line"], "--split", "doc_split", "line", "--doc-split"),
    (["export", "--checkpoint", "r", "--out", "o", "--dtype", "fp32"], "--dtype", "precision", "fp32",
     "--precision"),
    (["export", "--import-hf", "H", "--out", "o"], "--import-hf", "import_hf", "H", "mtnlg import-hf"),
    (["demo", "--eval-limit", "7"], "--eval-limit", "limit", 7, "--limit"),
    # one vocabulary: --dry-run runs nothing, --no-progress silences progress, --out is the folder written
    (["plan", "--dry-run"], "--dry-run", "fake_run", True, "--fake-run"),
    (["plan", "--dry-steps", "3"], "--dry-steps", "fake_steps", 3, "--fake-steps"),
    (["plan", "--dry-full"], "--dry-full", "fake_full", True, "--fake-full"),
    (["job", "run", "nb.ipynb", "--quiet"], "--quiet", "no_progress", True, "--no-progress"),
    (["generate", "--hf-model", "m", "--prompt", "Hi", "--quiet"], "--quiet", "no_print", True, "--no-print"),
    (["generate", "--hf-model", "m", "--prompt", "Hi", "--out", "g.json"], "--out", "out_file", "g.json",
     "--out-file"),
    (["data", "tokenize", "a.jsonl", "--out", "idx/a"], "--out", "out_prefix", "idx/a", "--out-prefix"),
    (["data", "blend", "A=idx/a", "--out", "b.json"], "--out", "out_file", "b.json", "--out-file"),
]


@pytest.mark.parametrize("argv,old,field,value,now", RENAMED,
                         ids=[" ".join(r[0][:2]) + " " + r[1] for r in RENAMED])
def test_an_old_flag_still_works_and_names_the_new_one(argv, old, field, value, now):
    err = io.StringIO()
    with contextlib.redirect_stderr(err): args = build_parser().parse_args(argv)
    said = err.getvalue().strip().splitlines()
    assert getattr(args, field) == value and len(said) == 1 and old in said[0] and now in said[0], said
    new = [now if a == old else a for a in argv] if now.startswith("--") else None
    if new:                                                # control: the new name says nothing
        err = io.StringIO()
        with contextlib.redirect_stderr(err): args = build_parser().parse_args(new)
        assert getattr(args, field) == value and err.getvalue() == ""


def test_old_names_run_end_to_end(tmp_path, capsys):
    "The old names reach the command: eval's --data is the evaluation data folder, `export --import-hf` imports, "
    "`data demo` is `data demo-corpus`."
    assert main(["eval", "--hf-model", str(tmp_path), "--tasks", "paper", "--data", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert "--data is now --eval-dir" in err and f"data root {tmp_path / 'nope'}: no such folder" in err
    assert main(["export", "--import-hf", str(tmp_path), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "mtnlg import-hf" in err and "mtnlg export: " in err and "no config.json" in err
    assert main(["import-hf", str(tmp_path), "--out", str(tmp_path / "r")]) == 2     # the new command, same check
    err = capsys.readouterr().err
    assert "mtnlg import-hf: " in err and "no config.json" in err and "is now" not in err
    with pytest.raises(SystemExit): main(["data", "demo", "--help"])              # the alias has the same flags
    assert "--max-docs" in capsys.readouterr().out
    # one vocabulary: plan's --dry-run (now --fake-run, a run on fake tensors) and --dry-steps reach the fake run
    with pytest.raises(SystemExit) as e: main(["plan", "--dry-run", "--preset", "mtnlg-530b", "--dry-steps", "0"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--dry-run is now --fake-run" in err and "--fake-steps: 0 is not a number" in err
    assert main(["data", "tokenize", str(tmp_path / "none.jsonl"), "--out", str(tmp_path / "idx")]) == 2
    err = capsys.readouterr().err
    assert "--out is now --out-prefix" in err and "none.jsonl does not exist" in err


def test_generate_old_names_write_the_file_and_print_nothing(tmp_path, tiny_hf, capsys):
    "`generate --quiet --out FILE` (now `--no-print --out-file FILE`) writes the generations and prints none; "
    "control: without --no-print they are printed."
    argv = ["generate", "--hf-model", str(tiny_hf), "--prompt", "Hi", "--max-new-tokens", "2"]
    assert main(argv + ["--quiet", "--out", str(tmp_path / "g.json")]) == 0
    said = capsys.readouterr()
    assert said.out == "" and "--quiet is now --no-print" in said.err and "--out is now --out-file" in said.err
    assert json.loads((tmp_path / "g.json").read_text())[0]["prompt"] == "Hi"
    assert main(argv + ["--out-file", str(tmp_path / "h.json")]) == 0
    said = capsys.readouterr()
    assert said.out.startswith("Hi") and "is now" not in said.err
    assert json.loads((tmp_path / "h.json").read_text()) == json.loads((tmp_path / "g.json").read_text())


def test_step_with_an_hf_model_is_refused(tmp_path, capsys):
    "`--step` names a run's checkpoint: with --hf-model (or an HF folder as --checkpoint) it is one clear error."
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    (hf / "model.safetensors").write_bytes(b"")
    refusal = "holds one model, not a run's steps; drop --step"
    for argv in (["eval", "--hf-model", hf, "--step", 3, "--tasks", "piqa"],
                 ["generate", "--hf-model", hf, "--step", 3, "--prompt", "Hi"],
                 ["generate", "--checkpoint", hf, "--step", 3, "--prompt", "Hi"]):
        assert main([str(a) for a in argv]) == 2
        err = capsys.readouterr().err
        assert refusal in err and len(err.strip().splitlines()) == 1, err
    # control: a run folder with --step gets past the refusal (to the missing checkpoint)
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    assert main(["generate", "--checkpoint", str(run), "--step", "3", "--prompt", "Hi"]) != 0
    assert refusal not in capsys.readouterr().err


class Terminal(io.StringIO):
    "A stderr that says it is a terminal (where a progress bar is drawn)."
    def isatty(self): return True


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory):
    "A one-layer transformers GPT-2 folder with the GPT-2 tokenizer's files."
    import shutil, torch
    from transformers import GPT2Config, GPT2LMHeadModel
    from mtnlg.tokenizer import gpt2_files
    d = tmp_path_factory.mktemp("tiny") / "hf"
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, n_positions=128)).save_pretrained(d)
    for f in gpt2_files(): shutil.copy(f, d / ("merges.txt" if f.name == "vocab.bpe" else "vocab.json"))
    return d


def test_progress_on_a_terminal_only_on_rank_0_and_off_with_no_progress(tmp_path, monkeypatch, fixture_data,
                                                                        tiny_hf):
    "`import-hf`, `export` and `eval` count what they finish on stderr when it is a terminal; controls: not a "
    "terminal, --no-progress, another rank."
    (tmp_path / "hf").symlink_to(tiny_hf, target_is_directory=True)
    def stderr_of(*argv, terminal=True):
        err, out = Terminal() if terminal else io.StringIO(), io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            assert main([str(a) for a in argv]) == 0, err.getvalue()
        return err.getvalue()
    said = stderr_of("import-hf", tmp_path / "hf", "--out", tmp_path / "run")
    assert "mtnlg import-hf" in said and " tensors" in said
    assert " files" in stderr_of("export", "--checkpoint", tmp_path / "run", "--out", tmp_path / "hf2")
    assert stderr_of("export", "--checkpoint", tmp_path / "run", "--out", tmp_path / "hf3", terminal=False) == ""
    assert stderr_of("export", "--checkpoint", tmp_path / "run", "--out", tmp_path / "hf4", "--no-progress") == ""
    monkeypatch.setenv("RANK", "1")
    assert stderr_of("export", "--checkpoint", tmp_path / "run", "--out", tmp_path / "hf5") == ""
    monkeypatch.setenv("RANK", "0")
    flags = ["--hf-model", tmp_path / "hf", "--tasks", "piqa", "--shots", "0", "--limit", 2,
             "--eval-dir", fixture_data / "eval", "--out", tmp_path / "eval"]
    assert "task x shots" in stderr_of("eval", *flags)      # the same bar (`mtnlg.flags.progress_bar`)
