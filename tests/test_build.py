"""The execution cache: a change in a `lowrank` module re-executes exactly the notebooks that use it."""

import shutil
import time

import pytest

from lowrank.book import build, keys, pages
from probe_book import probe_notebook

NB = "gradients/decomposition"


def test_sources_follow_imports_transitively():
    used = {p.relative_to(keys.PACKAGE).as_posix() for p in keys.lowrank_sources(
        "from lowrank.gradients import decomposition\nfrom lowrank.book import plotting")}
    assert {"gradients/decomposition.py", "core/data.py", "core/spectral.py", "core/nets/two_layer.py",
            "core/validation.py", "book/plotting.py", "__init__.py", "core/__init__.py", "core/nets/__init__.py",
            "gradients/__init__.py", "book/__init__.py"} <= used
    assert not used & {"book/ledger.py", "book/runs.py", "book/cli.py", "book/build.py", "book/verdicts.py"}


@pytest.mark.slow
def test_key_changes_with_used_code_only(tmp_path, monkeypatch):
    pkg = tmp_path / "lowrank"
    shutil.copytree(keys.PACKAGE, pkg, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(keys, "PACKAGE", pkg)
    before = keys.execution_key(NB)
    (pkg / "book" / "ledger.py").write_text((pkg / "book" / "ledger.py").read_text() + "\n# unrelated change\n")
    assert keys.execution_key(NB) == before
    (pkg / "core" / "spectral.py").write_text((pkg / "core" / "spectral.py").read_text() + "\n# used change\n")
    assert keys.execution_key(NB) != before


@pytest.mark.slow
def test_changed_function_shows_up_in_rebuilt_book(tmp_path):
    """Build a two-page book on a copy of the package, change a function one page uses, rebuild:
    that page shows the new value, the other page is not executed again."""
    import json
    import os
    import subprocess
    import sys

    root = tmp_path / "book"
    shutil.copytree(keys.PACKAGE, root / "lowrank", ignore=shutil.ignore_patterns("__pycache__"))
    (root / "book").mkdir()
    shutil.copytree(build.REPO_ROOT / "book" / "_ext", root / "book" / "_ext")
    for rel in ("_config.yml", "book/references.bib", "book/claims.yaml"):
        shutil.copy(build.REPO_ROOT / rel, root / rel)
    (root / "book" / "intro.md").write_text("# Probe book\n")
    (root / "_toc.yml").write_text("format: jb-book\nroot: book/intro\nchapters:\n"
                                   "  - file: notebooks/probe/uses_spectral\n  - file: notebooks/probe/plain\n")
    (root / "notebooks" / "probe").mkdir(parents=True)
    (root / "notebooks" / "probe" / "uses_spectral.md").write_text(probe_notebook(
        name="A", code="from lowrank.core import spectral\nprint('stable rank', spectral.stable_rank([[3.0, 0], [0, 4.0]]))"))
    (root / "notebooks" / "probe" / "plain.md").write_text(probe_notebook(name="B", code="print('no lowrank here')"))
    env = {**os.environ, "PYTHONPATH": str(root)}

    def build_book():
        done = subprocess.run([sys.executable, "-m", "lowrank.book.build", "--jobs", "1"], cwd=root, env=env,
                              capture_output=True, text=True)
        assert done.returncode == 0, f"the probe book did not build:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        page = (root / "_build" / "html" / "notebooks" / "probe" / "uses_spectral.html").read_text()
        stamp = json.loads((root / "_build" / "executed" / "probe" / "plain.ipynb").read_text())
        return page, stamp["metadata"]["lowrank"]["executed_at"]

    page, plain_stamp = build_book()
    assert "stable rank 1.5625" in page  # (9 + 16) / 16
    spectral = root / "lowrank" / "core" / "spectral.py"
    spectral.write_text(spectral.read_text().replace("return _out(fro**2 / top**2", "return _out(2 * fro**2 / top**2"))
    page, plain_again = build_book()
    assert "stable rank 3.125" in page, "the rebuilt book shows a stale output"
    assert plain_again == plain_stamp, "a page that does not use the changed module was executed again"


def test_a_figure_the_notebook_no_longer_draws_does_not_linger(tmp_path, monkeypatch):
    """Each execution starts from an empty figure folder: a renamed figure leaves no stale file
    behind (it would be published and checked as if the page still drew it)."""
    drawn = iter(["old_name", "new_name"])

    def fake_execute(name, output, figure_dir=None, **kwargs):
        figure_dir.mkdir(parents=True, exist_ok=True)
        (figure_dir / f"{next(drawn)}.svg").write_text("<svg/>")
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text("{}")

    monkeypatch.setattr(pages, "FIGURES", tmp_path / "figures")
    monkeypatch.setattr(pages, "EXECUTED", tmp_path / "executed")
    monkeypatch.setattr(build, "execute", fake_execute)
    for _ in range(2):
        build._execute_one(NB, "key", 1)
    assert sorted(p.name for p in (tmp_path / "figures" / NB).iterdir()) == ["new_name.svg"]


def test_key_follows_the_golden_record_of_its_verdicts(monkeypatch):
    """An entry re-measured as unstable, or with another tolerance, changes what the ci page shows (its
    outcome, its nbval summary), so it re-executes the page."""
    from lowrank.book import goldens

    golden = goldens.load()
    before = keys.execution_key(NB)
    block = {k: dict(e) for k, e in golden[NB].items()}
    first = next(iter(block))
    block[first]["outcomes"] = {"agrees": 3, "disagrees": 3}
    monkeypatch.setattr(goldens, "load", lambda path=goldens.GOLDEN: {**golden, NB: block})
    unstable = keys.execution_key(NB)
    assert unstable != before
    block[first] = {**block[first], "abs": 2 * block[first].get("abs", 1.0) + 1}
    assert keys.execution_key(NB) != unstable


def test_pages_are_executed_longest_first(tmp_path, monkeypatch):
    """The build and nbval take the pages longest first: this checkout's last execution time, else the
    last `.ci/run`'s record, and a page with neither (unknown cost) before all."""
    import json

    from lowrank.book import pages

    monkeypatch.setattr(pages, "EXECUTED", tmp_path / "executed")
    (tmp_path / "executed" / "p").mkdir(parents=True)
    (tmp_path / "executed" / "p" / "local.ipynb").write_text(json.dumps({"metadata": {"lowrank": {"wall_s": 40.0}}}))
    recorded = tmp_path / "ci_page_seconds.csv"
    recorded.write_text("page,seconds\np/short,5.0\np/long,60.0\np/local,1.0\n")
    assert pages.longest_first(["p/short", "p/local", "p/new", "p/long"], recorded) == ["p/new", "p/long", "p/local", "p/short"]
    assert pages.longest_first(["p/b", "p/a"], tmp_path / "absent.csv") == ["p/b", "p/a"]  # no record: as given


def test_the_footer_dates_the_commit_not_the_build():
    """The provenance footer sits in the Sphinx configuration: with the build's clock in it, the
    configuration's hash changed every minute and every warm build rewrote all 33 pages (31 s in CI)."""
    import importlib.util
    import subprocess

    spec = importlib.util.spec_from_file_location("reader", build.REPO_ROOT / "book" / "_ext" / "reader.py")
    reader = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reader)
    stamp = subprocess.run(["git", "log", "-1", "--format=%ct"], cwd=build.REPO_ROOT, capture_output=True,
                           text=True, check=True).stdout.strip()
    first = reader.provenance()
    assert first["date"] == time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(int(stamp)))
    time.sleep(0.01)
    assert reader.provenance() == first
