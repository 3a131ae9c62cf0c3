"""The package as a researcher installs it: a licence, a citation (CITATION.cff naming the three papers
of book/references.bib) and complete metadata; and the science install (`pip install .`, no extra) in a
fresh venv outside the clone, with pip's own configuration (index, find-links, cache) and the lock:
a working `lowrank` command (--help, --version, offline `data fetch`, `list` and `run --dry-run` from
the notebooks the wheel carries), then the `run` extra executing one ci page below the current folder
with the verdicts of tests/golden_verdicts.yaml. That check installs torch into a fresh venv (a minute
or two): it is marked `install`, left out of `make test` and run by its own `.ci/run` stage."""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tomllib
import venv
from email.parser import Parser
from pathlib import Path

import pytest
import yaml

from lowrank.book import notebooks

ROOT = Path(__file__).resolve().parents[1]
BOOK_STACK = ("jupyter-book", "jupytext", "papermill", "matplotlib", "seaborn", "myst-nb", "ipykernel", "mnist1d",
              "ray", "pytest", "jupyterlab")
# pip's words when a package cannot be had (no network, no local copy): the test is skipped, not failed
UNREACHABLE = ("No matching distribution found", "Could not find a version", "Failed to establish a new connection",
               "Temporary failure in name resolution", "Network is unreachable", "ProxyError")
CHEAP_PAGE = "gradients/scaling"  # the cheapest ci page that trains nothing (bench/ci_page_seconds.csv: 8 s)
PAPERS = ("sonthalia2025lowrank", "galanti2022sgd", "xu2023dynamics")  # the three the book reproduces


def test_the_light_reader_finds_the_code_cells_jupytext_finds():
    """Without jupytext (the science install) `read_notebook` reads the code cells itself: the same
    cells, sources (up to trailing blank lines) and metadata as jupytext, for every notebook."""
    import jupytext

    for name in notebooks.list_notebooks():
        path = notebooks.source_path(name)
        mine = notebooks.myst_code_cells(path.read_text(encoding="utf-8")).cells
        theirs = [c for c in jupytext.read(path).cells if c.cell_type == "code"]
        assert [(c.source.rstrip(), c.metadata) for c in mine] == \
            [(c.source.rstrip(), dict(c.metadata)) for c in theirs], name


def test_the_licence_is_mit_and_pyproject_says_so():
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License") and "Permission is hereby granted, free of charge" in text
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "MIT" and project["license-files"] == ["LICENSE"]


def _bib_entries() -> dict:
    from pybtex.database import parse_file

    return parse_file(str(ROOT / "book" / "references.bib")).entries


def _latex_to_text(text: str) -> str:
    """BibTeX's LaTeX as text: accents decoded by latexcodec (pybtex's own), protecting braces dropped."""
    import codecs

    import latexcodec  # noqa: F401 (registers the codec)

    return codecs.decode(text, "ulatex").replace("{", "").replace("}", "")


def test_citation_cff_is_cff_1_2_0_and_names_the_three_papers_as_the_bibliography_does():
    """CITATION.cff has the keys CFF 1.2.0 requires, and its `references` are the three reproduced
    papers with the titles, authors, years and identifiers of book/references.bib (read by pybtex)."""
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text(encoding="utf-8"))
    assert cff["cff-version"] == "1.2.0"
    assert {"message", "title", "authors"} <= set(cff) and cff["type"] in ("software", "dataset")
    assert all("name" in a or "family-names" in a for a in cff["authors"])
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert cff["version"] == project["version"] and cff["license"] == project["license"]
    assert cff["repository-code"] == project["urls"]["Source"]
    bib = _bib_entries()
    refs = {r["title"]: r for r in cff["references"]}
    assert len(refs) == len(PAPERS) == len(cff["references"])
    for key in PAPERS:
        entry = bib[key]
        title = _latex_to_text(entry.fields["title"])
        assert title in refs, f"{key}: {title!r} is not among CITATION.cff's references"
        ref = refs[title]
        assert {"type", "title", "authors"} <= set(ref)
        # CFF 1.2.0 types these as integers (a YAML "0024" string would not validate)
        assert all(isinstance(ref[k], int) for k in ("year", "volume", "start", "end", "pages", "month") if k in ref)
        assert ref["year"] == int(entry.fields["year"])
        families = [_latex_to_text(" ".join(p.last_names)) for p in entry.persons["author"]]
        assert [a["family-names"] for a in ref["authors"]] == families, key
        if "doi" in entry.fields:
            assert ref["doi"] == entry.fields["doi"]
        if "eprint" in entry.fields:
            assert {"type": "other", "value": f"arXiv:{entry.fields['eprint']}"} in ref["identifiers"]


def _check_metadata(meta) -> None:
    """Licence, authors, addresses and classifiers of the core metadata an install carries."""
    assert meta["License-Expression"] == "MIT" and "LICENSE" in meta.get_all("License-File")
    assert "The lowrank companion-book team" in (meta["Author"] or meta["Author-email"] or "")
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL"))
    assert urls["Source"].startswith("https://github.com/") and {"Issues", "Citation"} <= set(urls)
    assert "Intended Audience :: Science/Research" in meta.get_all("Classifier")
    assert meta["Requires-Python"] == ">=3.11"


def test_the_built_metadata_carries_licence_authors_and_addresses(tmp_path):
    """setuptools' own metadata step (what `pip install .` runs) on a copy of the sources."""
    src = _copy_sources(tmp_path / "src")
    (tmp_path / "meta").mkdir()
    code = ("import sys, setuptools.build_meta as b; "
            "print(b.prepare_metadata_for_build_wheel(sys.argv[1]))")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "meta")], cwd=src, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    dist_info = tmp_path / "meta" / out.stdout.strip().splitlines()[-1]
    _check_metadata(Parser().parsestr((dist_info / "METADATA").read_text(encoding="utf-8")))


def _copy_sources(src: Path) -> Path:
    """What a wheel is built from (setup.py copies notebooks/, params/ and bench/*.csv into it)."""
    for folder in ("lowrank", "notebooks", "params", "bench"):
        shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__", "figures", "*.ipynb"))
    for f in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "LICENSE"):
        shutil.copy(ROOT / f, src / f)
    return src


def _refusing_port() -> socket.socket:
    """A loopback socket bound but never listening: a connection to its port is refused, and no other
    process (a kernel's ZMQ port, a test server) can take the port while the socket is held."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    return s


def _run(cmd, env, timeout=120, cwd=None):
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env, timeout=timeout, cwd=cwd)


@pytest.mark.slow
@pytest.mark.install
def test_science_install_in_a_fresh_venv_runs_the_lowrank_command_and_a_page(tmp_path):
    try:
        venv.create(tmp_path / "venv", with_pip=True, system_site_packages=False)
    except (subprocess.CalledProcessError, OSError) as err:
        pytest.skip(f"no venv with pip could be made here ({err})")
    bin_ = tmp_path / "venv" / "bin"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHON", "LOWRANK_"))}
    env.pop("XDG_DATA_HOME", None)  # the user data folder is then ~/.local/share/lowrank below HOME
    env.update(HOME=str(tmp_path / "home"), PIP_DISABLE_PIP_VERSION_CHECK="1",
               PIP_CACHE_DIR=os.environ.get("PIP_CACHE_DIR", str(Path.home() / ".cache" / "pip")),
               PATH=os.pathsep.join([str(bin_), env.get("PATH", "")]))
    untracked_before = _untracked()
    # README's science line, from the clone itself (its build/ is ignored; --no-compile: no bytecode
    # written for torch's thousands of modules, which the checks below do not need)
    lock = ROOT / "requirements" / "lock.txt"
    out = _run([bin_ / "pip", "install", "--quiet", "--no-compile", "-c", lock, ROOT], env, timeout=1200)
    if out.returncode != 0:
        text = out.stdout + out.stderr
        if any(word in text for word in UNREACHABLE) and "ResolutionImpossible" not in text:
            pytest.skip(f"the science install cannot be fetched here (offline, no local wheels): {text.strip()[-300:]}")
        pytest.fail(f"pip install failed:\n{text[-3000:]}")
    assert _untracked() == untracked_before, "pip install . left files git neither tracks nor ignores"
    installed = _run([bin_ / "pip", "list", "--format=freeze"], env).stdout.lower()
    assert not [p for p in BOOK_STACK if f"\n{p}==" in "\n" + installed.replace("_", "-")], installed
    assert re.search(r"^torch==[\d.]+\+cpu$", installed, re.M), f"not torch's CPU build: {installed}"
    # the command, run from a folder of the user's (its outputs go there; not the clone, whose lowrank/
    # `python -c` would import)
    work = tmp_path / "work"
    work.mkdir()
    python = bin_ / "python"
    meta = _run([python, "-c", "from importlib.metadata import metadata; print(metadata('lowrank').as_string())"], env,
                cwd=work)
    _check_metadata(Parser().parsestr(meta.stdout))
    site = Path(_run([python, "-c", "import lowrank, pathlib; print(pathlib.Path(lowrank.__file__).parent)"], env,
                     cwd=work).stdout.strip())
    assert site.is_relative_to(tmp_path / "venv"), site
    lowrank = bin_ / "lowrank"
    out = _run([lowrank, "--help"], env, cwd=work)
    assert out.returncode == 0 and "data" in out.stdout and "list" in out.stdout, out.stderr
    out = _run([lowrank, "--version"], env, cwd=work)
    assert out.stdout.strip() == "lowrank 0.1.0"
    out = _run([lowrank, "data", "fetch", "--help"], env, cwd=work)
    assert out.returncode == 0 and "LOWRANK_DATA" in out.stdout

    # offline (a loopback port nobody listens on stands in for every mirror): one line that names the
    # files and the user data folder (an installed copy never writes into site-packages)
    with _refusing_port() as refusing:
        env_offline = {**env, "LOWRANK_DATA_MIRRORS": f"http://127.0.0.1:{refusing.getsockname()[1]}/"}
        out = _run([lowrank, "data", "fetch", "mnist"], env_offline, cwd=work)
        err = out.stderr.strip()
        assert out.returncode == 2 and len(err.splitlines()) == 1 and err.startswith("lowrank: error: offline?"), err
        data = tmp_path / "home" / ".local" / "share" / "lowrank" / "MNIST" / "raw"
        assert "train-images-idx3-ubyte.gz" in err and str(data) in err
        out = _run([lowrank, "data", "fetch", "mnist"], {**env_offline, "LOWRANK_DATA": str(tmp_path / "d")}, cwd=work)
        assert out.returncode == 2 and str(tmp_path / "d" / "MNIST" / "raw") in out.stderr

    # the wheel carries the notebooks and parameter files: `list` reads them without jupytext
    out = _run([lowrank, "list"], env, cwd=work)
    assert out.returncode == 0 and all(n in out.stdout for n in notebooks.list_notebooks()), out.stderr
    out = _run([lowrank, "list", CHEAP_PAGE], env, cwd=work)
    assert out.returncode == 0 and out.stdout.startswith(CHEAP_PAGE) and "paper:" in out.stdout, out.stderr
    out = _run([lowrank, "run", CHEAP_PAGE, "--dry-run"], env, cwd=work)
    assert out.returncode == 0 and f"run folder: {work / 'runs' / CHEAP_PAGE}" in out.stdout, out.stdout + out.stderr
    assert "estimated cost: " in out.stdout and str(site / "_book" / "notebooks") in out.stdout
    # a sweep's plan: its results default to ./runs/sweeps/, its cost from the wheel's measured timings
    shutil.copy(ROOT / "sweeps" / "sgd_batch_size_ci.yaml", work / "spec.yaml")
    out = _run([lowrank, "sweep", "spec.yaml", "--dry-run"], env, cwd=work)
    assert out.returncode == 0, out.stderr
    assert f"results go to {work / 'runs' / 'sweeps' / 'spec'}; nothing was run" in out.stdout
    assert "no measurement" not in out.stdout.split("estimated cost:")[1].split(")")[0], out.stdout
    assert not (work / "runs").exists()
    # what needs the clone says so in one line
    out = _run([lowrank, "diff"], env, cwd=work)
    err = out.stderr.strip()
    assert out.returncode == 2 and len(err.splitlines()) == 1 and "run this from a clone" in err and "Errno" not in err
    # without the run extra, `run` names it
    out = _run([lowrank, "run", CHEAP_PAGE], env, cwd=work)
    assert out.returncode == 1 and "lowrank[run]" in out.stderr and len(out.stderr.strip().splitlines()) == 1

    # the run extra (papermill, jupytext, a kernel, and the notebook extra the page imports): the page
    # end to end, its run folder below the current folder, its verdicts those of the golden file
    out = _run([bin_ / "pip", "install", "--quiet", "--no-compile", "-c", lock, f"{ROOT}[run]"], env, timeout=1200)
    assert out.returncode == 0, out.stderr[-3000:]
    probe = "import importlib.util as u; print([m for m in ('sphinx', 'myst_nb') if u.find_spec(m)])"
    assert _run([python, "-c", probe], env).stdout.strip() == "[]", "the run extra brings Sphinx"
    out = _run([lowrank, "run", CHEAP_PAGE], env, cwd=work, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    folder = Path(re.search(r"^wrote (.+)$", out.stdout, re.M).group(1))
    assert folder.parent == work / "runs" / CHEAP_PAGE and (folder / "manifest.json").is_file()
    assert not list(site.rglob("runs")) and not (site.parent / "runs").exists(), "a run wrote into site-packages"
    found = json.loads((folder / "verdicts.json").read_text())
    golden = yaml.safe_load((ROOT / "tests" / "golden_verdicts.yaml").read_text())[CHEAP_PAGE]
    assert set(found) == set(golden)
    for key, v in found.items():
        assert v["outcome"] == golden[key]["outcome"], (key, v["outcome"], golden[key])
        assert abs(v["measured"] - golden[key]["value"]) <= golden[key]["abs"], (key, v["measured"], golden[key])


def _untracked() -> set[str]:
    out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=ROOT, capture_output=True,
                         text=True)
    return {ln[3:] for ln in out.stdout.splitlines() if ln.startswith("??")} if out.returncode == 0 else set()
