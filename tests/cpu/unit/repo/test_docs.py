# SPDX-License-Identifier: Apache-2.0
"""The README and docs/ against the code, so that what a user reads cannot fall behind what the code does.

- docs/troubleshooting.md names every error a user can meet: each exception class defined under `recipe/` (found
  with `ast`: no module is imported), each splice refusal rule (`rule N (...) failed`), each `FailureCause`, and
  each `die` message of ray_on_slurm.sh, the Ray bootstrap (its `$VARIABLE` parts match any text).
- Every command shown (in ```bash blocks, and inline code that starts like a command) is run by a test or a script:
  the same string in a test, a shell script or `.ci/run` (interpreter spelled `python`), or the same argument list in
  a test's subprocess call; or it is light and run here (`RUN_HERE`: dry runs and checks that print and exit); or it
  is in `NOT_RUN`, a short list of commands that need a cluster or run for minutes, each with its reason.
- The attach-mode Gym command is the one test support runs; the worked example of docs/adding-an-environment.md is
  consistent (its job file is a valid job whose files exist and whose rows run on the environment's agent); the
  README's configuration table holds every key of the environments file; relative links and their anchors resolve; the
  README stays short, with the GPU quickstart near its top.

Nothing here starts a server, Ray or a trainer.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.support.helpers import REPO_ROOT as REPO
from tests.support.helpers import exception_classes as scanned_exception_classes

README = REPO / "README.md"
DOCS = REPO / "docs"
TROUBLESHOOTING = DOCS / "troubleshooting.md"
ADDING = DOCS / "adding-an-environment.md"
ATTACH = DOCS / "attach-mode.md"
CODE_ROOTS: tuple[Path, ...] = (REPO / "recipe", REPO / "tests" / "support")
"""Where error classes are looked for: the plugin, its demo and its test support."""
SPLICE_CODE = (REPO / "recipe" / "nemo_gym" / "splice", REPO / "recipe" / "nemo_gym" / "server_patch")
FAILURES = REPO / "recipe" / "nemo_gym" / "failures.py"
BOOTSTRAP = REPO / "ray_on_slurm.sh"

README_MAX_LINES = 250
QUICKSTART_HEADING = "## Quickstart: train on a GPU cluster"
QUICKSTART_BY_LINE = 80


def doc_files() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def relative(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


# ------------------------------------------------------------------------------------ troubleshooting.md


def exception_classes(roots: tuple[Path, ...]) -> dict[str, str]:
    """Every public class defined under `roots` that derives, through classes defined there, from a built-in
    exception: name -> `file:line`. Nested classes count (vLLM's `SpliceRefusal` is made inside a function)."""
    return {name: where for name, (where, _) in scanned_exception_classes(roots).items() if not name.startswith("_")}


_RULE = re.compile(r"rule (?:\d+|'[^']+')(?: \([^)]*\))? failed")


def refusal_rules() -> dict[str, str]:
    """Every splice refusal's rule as its message writes it (`rule 2 (unedited history) failed`) -> where."""
    found: dict[str, str] = {}
    for root in SPLICE_CODE:
        for path in sorted(root.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    for rule in _RULE.findall(node.value):
                        found.setdefault(rule, f"{relative(path)}:{node.lineno}")
    return found


def failure_causes() -> list[str]:
    """The values of `FailureCause` in failures.py."""
    tree = ast.parse(FAILURES.read_text())
    enum = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "FailureCause")
    return [
        node.value.value
        for node in enum.body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
    ]


_DIE = re.compile(r"(?:^|[\s;|&{(])die ")
_SHELL_EXPANSION = re.compile(r"\$(?:\{[^}]*\}|\([^)]*\)|[\w?*@#]+|\\n)")


def submit_errors() -> dict[str, str]:
    """Every `die` message of ray_on_slurm.sh, its arguments joined as the function joins them -> where."""
    found: dict[str, str] = {}
    logical: list[tuple[int, str]] = []  # (first line number, the line with its continuations joined)
    for number, line in enumerate(BOOTSTRAP.read_text().splitlines(), start=1):
        if logical and logical[-1][1].endswith("\\"):
            logical[-1] = (logical[-1][0], logical[-1][1][:-1] + " " + line)
        else:
            logical.append((number, line))
    for number, line in logical:
        call = _DIE.search(line)
        if call is None or line.lstrip().startswith(("#", "die()")):
            continue
        lexer = shlex.shlex(line[call.end() :], posix=True, punctuation_chars=";|&()")
        lexer.whitespace_split = True
        lexer.commenters = ""
        words = []
        for word in lexer:
            if word in {";", ";;", "|", "||", "&&", "}", ")"}:
                break
            words.append(word)
        found.setdefault(" ".join(words), f"{relative(BOOTSTRAP)}:{number}")
    return found


def message_pattern(message: str) -> re.Pattern[str] | None:
    """The message with each shell expansion matching any text on one line; None when too little of it is literal
    to recognise (e.g. `$report; $fix`, a message printed by the Python the script ran)."""
    literal = _SHELL_EXPANSION.split(message)
    if sum(len(re.sub(r"\W", "", part)) for part in literal) < 10:
        return None
    return re.compile(r"[^`\n]+?".join(re.escape(part) for part in literal))


def missing_words(names, text: str) -> list[str]:
    return [name for name in names if not re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text)]


def test_troubleshooting_names_every_error_class():
    classes = exception_classes(CODE_ROOTS)
    assert "RolloutAborted" in classes and "SpliceRefusal" in classes, "the class scan found too little"
    missing = missing_words(sorted(classes), TROUBLESHOOTING.read_text())
    assert not missing, (
        f"{relative(TROUBLESHOOTING)} does not mention these error classes (add each with its message, cause and "
        "fix): " + ", ".join(f"{name} ({classes[name]})" for name in missing)
    )


def test_troubleshooting_names_every_splice_refusal_rule():
    rules = refusal_rules()
    assert {"rule 1 (EOS ends each turn) failed", "rule 'one message per generation' failed"} <= set(rules)
    text = TROUBLESHOOTING.read_text()
    missing = [rule for rule in sorted(rules) if rule not in text]
    assert not missing, (
        f"{relative(TROUBLESHOOTING)} does not show these splice refusals as their message writes them: "
        + ", ".join(f"{rule!r} ({rules[rule]})" for rule in missing)
    )


def test_troubleshooting_names_every_failure_cause():
    causes = failure_causes()
    assert "contiguity_broken" in causes
    missing = missing_words(causes, TROUBLESHOOTING.read_text())
    assert not missing, f"{relative(TROUBLESHOOTING)} does not explain these FailureCause values: {missing}"


def test_troubleshooting_shows_every_submit_script_error():
    errors = submit_errors()
    assert any(message.startswith("the job asks for cluster.nnodes=") for message in errors), errors
    text = TROUBLESHOOTING.read_text()
    missing = []
    for message, where in errors.items():
        pattern = message_pattern(message)
        if pattern is not None and not pattern.search(text):
            missing.append(f"{message!r} ({where})")
    assert not missing, (
        f"{relative(TROUBLESHOOTING)} does not show these bootstrap errors (`<...>` for the parts that vary): "
        + "; ".join(missing)
    )


# ------------------------------------------------------------------------------------ commands shown


@dataclass(frozen=True)
class Shown:
    command: str
    where: str


_FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([\w-]*)")
_INLINE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
_COMMAND_START = re.compile(
    r"^(?:[A-Z_][A-Z0-9_]*=\S*\s+)*(?:\./\S|python3? -[mc] |\.venv/bin/python|bash |sbatch |srun )"
)
_ASSIGNMENT = re.compile(r"^[A-Za-z_]\w*=\S*$")


def _strip_comment(line: str) -> str:
    """The line without a shell comment (a `#` at its start or after blanks, outside quotes)."""
    quote = None
    for i, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def shell_commands(block: str) -> Iterator[str]:
    """The commands of a shell block: continuation lines joined, comments dropped, `a && b` split, `cd` and bare
    assignments (they set up, they run nothing) skipped; whitespace collapsed."""
    for line in block.replace("\\\n", " ").splitlines():
        for part in _strip_comment(line).split(" && "):
            part = " ".join(part.split())
            if part and not part.startswith("cd ") and not _ASSIGNMENT.match(part):
                yield part


def split_markdown(path: Path) -> tuple[list[tuple[str, str, int]], list[tuple[int, str]]]:
    """The fenced code blocks of a Markdown file, as (language, text, number of its first line), and the other
    lines, as (number, line)."""
    lines = path.read_text().splitlines()
    blocks, prose = [], []
    i = 0
    while i < len(lines):
        opened = _FENCE.match(lines[i])
        if opened is None:
            prose.append((i + 1, lines[i]))
            i += 1
            continue
        indent, fence, language = opened.groups()
        body, start = [], i + 2
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i][len(indent) :] if lines[i].startswith(indent) else lines[i])
            i += 1
        blocks.append((language, "\n".join(body), start))
        i += 1
    return blocks, prose


def fenced_blocks(path: Path) -> list[tuple[str, str, int]]:
    return split_markdown(path)[0]


def shown_commands() -> list[Shown]:
    shown = []
    for path in doc_files():
        blocks, prose = split_markdown(path)
        for language, text, start in blocks:
            if language in ("bash", "sh", "shell"):
                shown += [Shown(c, f"{relative(path)}:{start}") for c in shell_commands(text)]
        for number, line in prose:
            for span in _INLINE.findall(line):
                if _COMMAND_START.match(span):
                    shown.append(Shown(" ".join(span.split()), f"{relative(path)}:{number} (inline)"))
    return shown


_INTERPRETER = re.compile(
    r'(?<![\w/$.-])(?:"\$\{?PY(?:THON)?\}?"|\$\{?PY(?:THON)?\}?|\.venv/bin/python3?|python3?)(?![\w/.-])'
)


def normalized(text: str) -> str:
    return _INTERPRETER.sub("python", " ".join(text.split()))


def shell_runners() -> list[Path]:
    """The shell scripts that run commands: CI's entry point, the setup, test and demo scripts, the submit scripts and
    their Ray bootstrap, and the scripts under tests/."""
    names = (".ci/run", "setup.sh", "run_tests.sh", "run_demo.sh", "submit_math.sh", "submit_multienv.sh")
    names += ("ray_on_slurm.sh",)
    return [REPO / name for name in names] + sorted((REPO / "tests").rglob("*.sh"))


def python_tests() -> list[Path]:
    """The test modules, this one aside (its tables name commands; they do not run them)."""
    return [p for p in sorted((REPO / "tests").rglob("*.py")) if p.name != "test_docs.py"]


def shell_code(path: Path) -> str:
    """A shell script without its comment lines: a command mentioned in a comment is not run."""
    return "\n".join(line for line in path.read_text().splitlines() if not line.lstrip().startswith("#"))


def argument_lists(path: Path) -> Iterator[list[str | None]]:
    """Each list or tuple of a Python file with at least two string literals: literals as they are, any other
    element (`sys.executable`, `str(spec_file)`) as None, which matches any argument."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.List | ast.Tuple) and not any(isinstance(e, ast.Starred) for e in node.elts):
            items = [e.value if isinstance(e, ast.Constant) and isinstance(e.value, str) else None for e in node.elts]
            if sum(item is not None for item in items) >= 2:
                yield items


def same_arguments(tokens: list[str], items: list[str | None]) -> bool:
    """`tokens` (a command, interpreter spelled `python`) is this argument list: the program, module or script it
    runs must be a literal there, and every other literal equal."""
    if len(tokens) != len(items):
        return False
    if tokens[0] == "python":
        named = 2 if len(tokens) > 2 and tokens[1] in ("-m", "-c") else 1
        if items[0] not in (None, "python"):
            return False
    else:
        named = 0
    return all(items[i] == tokens[i] for i in range(1 if tokens[0] == "python" else 0, named + 1)) and all(
        item is None or item == token for item, token in zip(items, tokens, strict=True)
    )


def run_by(command: str) -> str | None:
    """Where the repository runs `command`, or None."""
    wanted = normalized(command)
    for path in shell_runners():
        if path.exists() and wanted in normalized(shell_code(path)):
            return relative(path)
    if re.match(r"^[A-Za-z_]\w*=", command):  # an assignment is an environment: only a same-string run counts
        return None
    try:
        tokens = shlex.split(wanted)
    except ValueError:
        return None
    for path in python_tests():
        if any(same_arguments(tokens, items) for items in argument_lists(path)):
            return relative(path)
    return None


# Light commands shown in the docs that this module runs itself, exactly as shown, from the repository root with the
# trainer's environment first on PATH: command -> (exit statuses accepted, text its output must hold).
RUN_HERE: dict[str, tuple[set[int], str]] = {
    "DRY_RUN=1 ./submit_multienv.sh": ({0}, "verl.trainer.main_ppo"),
    # the shipped job up to its data files, which are placeholders to fill in
    "python -m recipe.nemo_gym.launch check jobs/multienv.yaml": (
        {1},
        "launch: ERROR: data.train_files: data file /shared/data/multienv/math_train.jsonl does not exist",
    ),
    "python -m recipe.nemo_gym.launch.preflight megatron": ({0, 1}, ""),
    "python -m recipe.nemo_gym.gym.owned.environment": ({0}, "nemo-gym"),
    "python -m recipe.nemo_gym.cpu_backend difference": ({0}, "trainer.device=cpu"),
}

# Commands shown that no test runs as shown, each with the reason (a regular expression over the command).
NOT_RUN: dict[str, str] = {
    r"\./run_demo\.sh": "the main job on CPU (8 steps, minutes); tests/cpu/e2e/test_main_ppo.py runs its job the "
    "same way (`recipe/nemo_gym_demo/console.py`'s `run_job`: the launcher on a job file) on the same blend",
    r"(?:\.venv/bin/)?python -m recipe\.nemo_gym\.launch (?:run|check) uppercase_check\.yaml": "the reader's CPU "
    "check of a new environment (a training run, minutes): test_adding_an_environment_example_is_consistent "
    "validates its job file, and tests/cpu/e2e/test_job_failures.py runs jobs through `python -m "
    "recipe.nemo_gym.launch run` the same way",
    r"\./run_tests\.sh .+": "CI's command (.ci/run runs ./run_tests.sh) with pytest arguments, passed to pytest",
    r"\.venv/bin/python -m pytest tests/cpu/\S+(?: -n \d+)?": "one module or one tier's folder of the suite "
    "./run_tests.sh runs",
    r"python -m verl\.trainer\.main_ppo": "the trainer's command, which the launcher composes and runs "
    "(recipe/nemo_gym/launch/compose.py); tests/cpu/e2e/test_slurm.py runs it through the submit script",
    r"JOB=jobs/uppercase\.yaml DRY_RUN=1 \./submit_multienv\.sh": "the reader's own job file; RUN_HERE runs "
    "`DRY_RUN=1 ./submit_multienv.sh` with a job of its own",
    r"(?:[A-Z_]+=\S+ )*sbatch .+": "needs a Slurm cluster (GPUs for training jobs); tests/cpu/e2e/test_slurm.py "
    "submits submit_multienv.sh with sbatch to a private one-node CPU cluster",
    r"PYTHONPATH=\$REPO:\$PYTHONPATH VERL_USE_EXTERNAL_MODULES=recipe\.nemo_gym\.vllm_plugin python -m "
    r"verl\.trainer\.main_ppo .+": "the README's command 'in essence' (`...` for the job's own settings): "
    "tests/cpu/unit/test_verl_overrides.py checks that it carries every plugin override; the submit scripts run it",
    r"\.venv/bin/python -m tests\.support\.each_module outputs/each-module": "every module of the suite in a "
    "session of its own (about 40 minutes); tests/cpu/unit/testing_support/test_each_module.py runs the tool on "
    "two light modules",
    r"srun \.venv-gym/bin/gym env start .+": "attach mode's Gym job (Slurm): "
    "test_attach_command_shown_is_the_one_test_support_runs checks it against external_gym.attach_command, which "
    "tests/cpu/integration/test_attach.py runs",
}


def test_every_command_shown_is_run_by_a_test_or_here_or_explained():
    shown = shown_commands()
    assert any(s.command == "./run_tests.sh" for s in shown), "no command found: is the extraction broken?"
    unaccounted = [
        s
        for s in shown
        if s.command not in RUN_HERE
        and not any(re.fullmatch(pattern, s.command) for pattern in NOT_RUN)
        and run_by(s.command) is None
    ]
    assert not unaccounted, (
        "commands shown in the docs that no test runs: show the string a test runs, run it in RUN_HERE (if it "
        "is light) or explain it in NOT_RUN:\n" + "\n".join(f"  {s.where}: {s.command}" for s in unaccounted)
    )


def test_the_tables_of_commands_name_only_commands_still_shown():
    commands = {s.command for s in shown_commands()}
    stale = [c for c in RUN_HERE if c not in commands]
    stale += [p for p in NOT_RUN if not any(re.fullmatch(p, c) for c in commands)]
    assert not stale, f"RUN_HERE / NOT_RUN entries that the docs no longer show: {stale}"


@pytest.fixture
def submit_job(tmp_path) -> Path:
    """jobs/multienv.yaml for submit_multienv.sh's dry run, with data files that exist."""
    data = tmp_path / "rows.jsonl"
    data.write_text("")
    job = yaml.safe_load((REPO / "jobs" / "multienv.yaml").read_text())
    job["environments"] = str(REPO / "recipe" / "nemo_gym" / "configs" / "multienv.yaml")
    job["data"] = {"train_files": [str(data)], "val_files": [str(data)]}
    path = tmp_path / "multienv.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


@pytest.mark.parametrize("command", sorted(RUN_HERE))
def test_light_commands_shown_run_as_shown(command, submit_job):
    statuses, expected = RUN_HERE[command]
    venv_bin = Path(sys.executable).parent
    env = {
        **os.environ,
        "PATH": f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}",
        "JOB": str(submit_job),
    }
    env.pop("PYTHONPATH", None)
    done = subprocess.run(["bash", "-c", command], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    output = done.stdout + done.stderr
    assert done.returncode in statuses, f"{command!r} exited {done.returncode}:\n{output[-3000:]}"
    assert expected in output, f"{command!r} did not print {expected!r}:\n{output[-3000:]}"


def test_attach_command_shown_is_the_one_test_support_runs():
    from tests.support.external_gym import attach_command

    block = next(text for language, text, _ in fenced_blocks(ATTACH) if "gym env start" in text)
    shown = next(c for c in shell_commands(block) if "gym env start" in c)
    tokens = shlex.split(shown)
    assert tokens[0] == "srun", shown
    environment_config = "resources_servers/math_with_judge/configs/math_with_judge.yaml"
    expected = attach_command(
        Path(".venv-gym/bin"),
        [environment_config],
        endpoint_file=Path("$SHARED/policy_endpoint"),
        model_name="$MODEL_PATH",
        port=11000,
    )
    assert tokens[1:] == expected


# ------------------------------------------------------------------------------------ the worked example


def blocks_of(path: Path, language: str) -> list[str]:
    return [text for lang, text, _ in fenced_blocks(path) if lang == language]


def test_adding_an_environment_example_is_consistent(tmp_path):
    from recipe.nemo_gym.config import load_config
    from recipe.nemo_gym.data_check import check_data_files
    from recipe.nemo_gym.gym.owned.gym_layout import section_config_paths
    from recipe.nemo_gym.launch.job import load_job
    from recipe.nemo_gym_demo import tiny_model

    # the job file as the doc says to save it: in the repository root, its relative paths taken from there
    job_text = next(text for text in blocks_of(ADDING, "yaml") if text.startswith("backend: cpu"))
    job_file = REPO / f"uppercase_check.{tmp_path.name}.yaml"
    job_file.write_text(job_text)
    try:
        job = load_job(job_file, environ={})
    finally:
        job_file.unlink()
    assert job.model == REPO / f".cache/tiny-qwen3-{tiny_model._stamp()}", "the tiny model's folder changed"
    for path in (job.environments, *job.data.train_files, *job.data.val_files):
        assert path.is_file(), path
    assert f"python -m recipe.nemo_gym.launch run {job_file.name.split('.')[0]}.yaml" in ADDING.read_text()

    environments_file = next(yaml.safe_load(t) for t in blocks_of(ADDING, "yaml") if t.startswith("nemo_gym:"))
    assert environments_file == yaml.safe_load(job.environments.read_text()), "the doc's environments file differs"
    config_paths = section_config_paths(load_config(job.environments).nemo_gym)
    environment_yaml = next(yaml.safe_load(t) for t in blocks_of(ADDING, "yaml") if "resources_servers:" in t)
    assert environment_yaml == yaml.safe_load(config_paths[1].read_text()), "the doc's environment config"

    agents = {
        name
        for path in config_paths[1:]
        for name, entry in yaml.safe_load(path.read_text()).items()
        if "responses_api_agents" in entry
    }
    check = check_data_files([*job.data.train_files, *job.data.val_files], agents)
    assert check.rows > 0 and not check.bad, check.bad

    row = next(text for text in blocks_of(ADDING, "json") if "agent_ref" in text)
    assert json.loads(row) == json.loads(job.data.train_files[0].read_text().splitlines()[0])
    app = (REPO / "resources_servers" / "uppercase_share" / "app.py").read_text()
    excerpt = next(text for text in blocks_of(ADDING, "python") if "def verify" in text)
    assert all(line.strip() in app for line in excerpt.splitlines()), "the doc's app.py excerpt differs from app.py"


# ------------------------------------------------------------------------------------ README and links


def config_keys() -> list[str]:
    """Every key of the environments file, dotted (`nemo_gym.head_server.port`)."""
    import typing

    from pydantic import BaseModel

    from recipe.nemo_gym.config import NeMoGymConfig

    def model_of(annotation) -> type[BaseModel] | None:
        for candidate in (annotation, *typing.get_args(annotation)):
            if isinstance(candidate, type) and issubclass(candidate, BaseModel):
                return candidate
        return None

    def walk(model: type[BaseModel], prefix: str) -> Iterator[str]:
        for name, field in model.model_fields.items():
            nested = model_of(field.annotation)
            yield from walk(nested, f"{prefix}{name}.") if nested else [f"{prefix}{name}"]

    return list(walk(NeMoGymConfig, ""))


def test_readme_configuration_table_names_every_key():
    keys = config_keys()
    assert "nemo_gym.head_server.port" in keys and "data.check_rows" in keys
    text = README.read_text()
    missing = [key for key in keys if f"`{key}`" not in text]
    assert not missing, f"README's Configuration table lacks these environments file keys: {missing}"


def test_readme_is_short_and_reaches_the_gpu_quickstart_early():
    lines = README.read_text().splitlines()
    assert len(lines) < README_MAX_LINES, f"README.md has {len(lines)} lines; keep it under {README_MAX_LINES}"
    assert QUICKSTART_HEADING in lines, f"README.md has no {QUICKSTART_HEADING!r}"
    at = lines.index(QUICKSTART_HEADING) + 1
    assert at <= QUICKSTART_BY_LINE, f"the GPU quickstart starts at line {at}; bring it within {QUICKSTART_BY_LINE}"
    assert lines.index("## Why") < at


def slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {slug(m[1]) for _, line in split_markdown(path)[1] if (m := re.match(r"^#+\s+(.*)$", line))}


def test_relative_links_and_anchors_resolve():
    broken = []
    for path in [*doc_files(), REPO / "benchmarks" / "README.md"]:
        for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text()):
            if re.match(r"^[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            resolved = (path.parent / file).resolve() if file else path
            if not resolved.exists():
                broken.append(f"{relative(path)}: {target} (no such file)")
            elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
                broken.append(f"{relative(path)}: {target} (no such heading)")
    assert not broken, "broken links:\n" + "\n".join(broken)
