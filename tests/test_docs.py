"""Every shell and Python block of the README and of docs/ runs here, as written; other blocks are output or data.

What a block's fence language means:

- `python`: the blocks of one file run in order, in one fresh interpreter, as a reader pasting them into one session
  would (docs/training.md's run in tests/test_training_doc.py, which also checks what they produce);
- `bash`: each block runs with `bash -e -o pipefail` from a scratch folder laid out like a checkout (packages/,
  examples/, tests/ linked in), with a scratch virtual environment first on PATH that also sees this environment's
  packages: `python -m pip install ./packages/...` installs into it as a reader's command would, and shadows what is
  installed here without touching it;
- `text`, `toml`: output and data, shown only. A `python` or `toml` block whose first line is a comment naming a file
  (`# pyproject.toml`, `# singa_backend_mydev/backend.py`) is a file of the guide's example package: it is written
  into the scratch folder, under the folder named by the guide's pyproject, before the guide's shell blocks run, so
  that the plugin guide's package installs as written.

A comment `<!-- doc-test: ... -->` on the line above a fence changes that, and stays rare:

- `skip: REASON`: not run (CI's own commands, the benchmarks); the reason is required;
- `needs NAME:INDEX`: runs where that device exists (a GPU), and is reported as skipped elsewhere;
- `excerpt of PATH`: a quotation of a file of the repository; every line of it must still be in that file.
"""

from __future__ import annotations

import json
import os
import re
import site
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import docs_sections
import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
RUN = {"python", "bash"}
SHOWN = {"text", "toml"}
# files whose Python blocks another test runs, with checks of its own
DEDICATED = {"docs/training.md": "tests/test_training_doc.py"}
MAX_SKIPS = 5  # the exceptions stay few: raise this only with a reason as good as the ones there

FENCE = re.compile(r"^```(?P<lang>[^\n`]*)\n(?P<code>.*?)^```[ \t]*$", re.S | re.M)
MARKER = re.compile(r"<!--\s*doc-test:\s*(?P<what>.*?)\s*-->\s*$")
FILE_HEADER = re.compile(r"^#\s*(?P<path>[\w./-]+\.(?:py|toml))\s*$")


@dataclass
class Block:
    doc: str  # path relative to the repository
    line: int  # line of the opening fence, 1-based
    lang: str
    code: str
    marker: str | None

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"

    @property
    def file(self) -> str | None:
        """The file this block is, for a block that starts with `# path`."""
        m = FILE_HEADER.match(self.code.splitlines()[0]) if self.code.strip() else None
        return m.group("path") if m and self.lang in ("python", "toml") else None


def _blocks(path: Path) -> list[Block]:
    text = path.read_text(encoding="utf-8")
    out = []
    for m in FENCE.finditer(text):
        before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = MARKER.match(before.strip())
        out.append(Block(str(path.relative_to(ROOT)), text.count("\n", 0, m.start()) + 1, m.group("lang").strip(),
                         m.group("code"), marker.group("what") if marker else None))
    return out


BLOCKS = [b for p in DOCS for b in _blocks(p)]


def _kind(marker: str | None) -> tuple[str, str]:
    if marker is None:
        return "run", ""
    for prefix, kind in (("skip:", "skip"), ("needs ", "needs"), ("excerpt of ", "excerpt")):
        if marker.startswith(prefix):
            return kind, marker[len(prefix):].strip()
    raise AssertionError(f"unknown doc-test marker {marker!r}")


def test_every_block_is_run_or_shown():
    assert len(BLOCKS) > 30, "the README and docs/ hold more blocks than this: is the parser broken?"
    skips = []
    for b in BLOCKS:
        assert b.lang in RUN | SHOWN, f"{b.id}: a block needs a language ({sorted(RUN | SHOWN)}), got {b.lang!r}"
        kind, arg = _kind(b.marker)
        assert kind == "run" or arg, f"{b.id}: `{b.marker}` needs a reason or a target"
        if kind == "skip":
            skips.append(f"{b.id}: {arg}")
    assert len(skips) <= MAX_SKIPS, "too many blocks that are not run:\n" + "\n".join(skips)


@pytest.mark.parametrize("block", [b for b in BLOCKS if _kind(b.marker)[0] == "excerpt"], ids=lambda b: b.id)
def test_excerpts_are_current(block):
    source = ROOT / _kind(block.marker)[1]
    lines = {line.strip() for line in source.read_text().splitlines()}
    stale = [line for line in block.code.splitlines() if line.strip() and line.strip() not in lines]
    assert not stale, f"{block.id} quotes {source.relative_to(ROOT)}, which no longer has: {stale}"


@pytest.mark.parametrize("name", sorted(docs_sections.SECTIONS))
def test_generated_sections_are_current(name):
    path, make = docs_sections.SECTIONS[name]
    have = docs_sections.current(name)
    assert have is not None, f"{path} lost the markers of section {name}"
    assert have == make().strip(), f"{path}: section {name} is out of date; run `python tests/docs_sections.py`"


# -- links -------------------------------------------------------------------------------------------------------------

LINK = re.compile(r"(?<!!)\[[^\]]*\]\((?P<target>[^)\s]+)\)")


def _slug(heading: str) -> str:
    """GitHub's (and mkdocs' toc) anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    return {_slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", text, flags=re.M)}


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc):
    """Links to files of the repository and to headings of other pages exist (mkdocs --strict checks the pages'
    links among themselves again, and the API reference's anchors, in `nox -s docs`)."""
    text = FENCE.sub("", doc.read_text(encoding="utf-8"))
    broken = []
    for m in LINK.finditer(text):
        target = m.group("target")
        if re.match(r"^[a-z]+:", target):
            continue  # https:, mailto: ... (CI reaches no web site but the package registries)
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        checked = dest.exists() and anchor and dest.suffix == ".md" and "/api/" not in str(dest)
        if not dest.exists() or (checked and anchor not in _anchors(dest)):
            broken.append(target)
    assert not broken, f"{doc.relative_to(ROOT)}: broken links {broken}"


# -- running the blocks ------------------------------------------------------------------------------------------------


def _files_of(doc: str) -> dict[str, str]:
    return {b.file: b.code for b in BLOCKS if b.doc == doc and b.file}


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> dict:
    """A folder laid out like a checkout, and a virtual environment that sees this one's packages underneath its own."""
    home = tmp_path_factory.mktemp("doc-checkout")
    for name in ("packages", "examples", "tests", "docs", "VERSION", "README.md"):
        (home / name).symlink_to(ROOT / name)
    venv = tmp_path_factory.mktemp("doc-venv")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    target = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                            check=True, capture_output=True, text=True).stdout.strip()
    # after the venv's own site-packages: this environment's, with their .pth files (editable installs) processed
    parents = [p for p in site.getsitepackages() if os.path.isdir(p)]
    (Path(target) / "_doc_test_parent.pth").write_text(
        "import site; " + "; ".join(f"site.addsitedir({p!r})" for p in parents) + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SINGA_", "PYTHON", "VIRTUAL_ENV"))}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(venv),
               # a native build of the CPU backend: a third of the portable build's time (nox -s tests and
               # nox -s wheels build and test the portable one)
               SINGA_CPU_NATIVE="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    if os.geteuid() == 0:  # CI runs as root; OpenMPI's mpiexec refuses that unless told (docs/distributed.md says how)
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return {"home": home, "env": env}


def _write_example_package(home: Path, doc: str) -> None:
    files = _files_of(doc)
    if "pyproject.toml" not in files:
        return
    name = re.search(r'^name\s*=\s*"([^"]+)"', files["pyproject.toml"], flags=re.M).group(1)
    for rel, code in files.items():
        dest = home / name / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(code)


def _device_exists(spec: str) -> bool:
    from singa import device, plugins

    name, index = device.parse_device_spec(spec)
    backend = plugins.registry().backends.get(name)
    return backend is not None and index < backend.device_count()


SHELL = [b for b in BLOCKS if b.lang == "bash" and _kind(b.marker)[0] in ("run", "needs")]


@pytest.mark.parametrize("block", SHELL, ids=lambda b: b.id)
def test_shell_block(block, scratch):
    kind, arg = _kind(block.marker)
    if kind == "needs" and not _device_exists(arg):
        pytest.skip(f"{block.id} needs device {arg}, which this machine does not have")
    _write_example_package(scratch["home"], block.doc)
    proc = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block.code], cwd=scratch["home"], env=scratch["env"],
                          capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, (f"{block.id} failed ({proc.returncode}):\n{block.code}\n-- stdout:\n"
                                  f"{proc.stdout[-4000:]}\n-- stderr:\n{proc.stderr[-4000:]}")


RUNNER = """
import json, sys
blocks = json.load(open(sys.argv[1]))
namespace = {"__name__": "__main__"}
for where, code in blocks:
    exec(compile(code, where, "exec"), namespace)
"""

PYTHON_DOCS = sorted({b.doc for b in BLOCKS if b.lang == "python" and not b.file and b.marker is None} - set(DEDICATED))


@pytest.mark.parametrize("doc", PYTHON_DOCS)
def test_python_blocks(doc, tmp_path):
    blocks = [(b.id, b.code) for b in BLOCKS if b.doc == doc and b.lang == "python" and not b.file and b.marker is None]
    (tmp_path / "blocks.json").write_text(json.dumps(blocks))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SINGA_")}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(RUNNER), str(tmp_path / "blocks.json")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, f"{doc}: its Python blocks failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-4000:]}"


def test_dedicated_tests_exist():
    for doc, test in DEDICATED.items():
        assert doc in (ROOT / test).read_text(), f"{test} no longer runs {doc}"
