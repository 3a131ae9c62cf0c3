"""Every notebook: executed at ci scale (once, by the build), verdicts against golden values,
figures present, paper-scale parameters valid."""



import nbformat
import pytest
import yaml

from lowrank.book import build, goldens, ledger, notebooks, pages, plotting, rules

GOLDEN = goldens.load()
NAMES = build.book_notebooks()


def test_every_notebook_is_in_the_book():
    assert "gradients/decomposition" in NAMES
    assert sorted(NAMES) == notebooks.list_notebooks(), "a notebook under notebooks/ is missing from _toc.yml"


@pytest.mark.parametrize("name", NAMES)
def test_verdicts_match_golden(name, executed_notebooks):
    nb = nbformat.read(executed_notebooks[name], as_version=4)
    found = goldens.notebook_verdicts(nb)
    assert found, f"{name} glued no verdict"
    golden = GOLDEN.get(name)
    assert golden is not None, f"{name} has no block in tests/golden_verdicts.yaml"
    assert all(v["scale"] == "ci" for v in found.values())
    assert not goldens.block_mismatches(found, golden), f"{name}: " + "\n".join(goldens.block_mismatches(found, golden))


def test_golden_entries_record_their_stability():
    """Every entry counts its outcomes over seeds and CPU paths; it is unstable exactly when they differ, and
    the tolerance of an entry that covers the statistic's whole range says so."""
    for name, block in GOLDEN.items():
        for key, e in block.items():
            assert e.get("outcomes"), f"{name}.{key}: re-measure with `lowrank goldens measure {name} --seeds 0-4`"
            assert sum(e["outcomes"].values()) >= 7, f"{name}.{key}: fewer runs than 5 seeds and two other CPU paths"
            assert (e["outcome"] == "unstable") == (len(e["outcomes"]) > 1), f"{name}.{key}"


def test_verdict_names_are_unique_across_notebooks():
    """The ci book finds a verdict's recorded outcomes by its name alone."""
    names = [k for block in GOLDEN.values() for k in block]
    assert len(names) == len(set(names)), sorted({n for n in names if names.count(n) > 1})


@pytest.mark.parametrize("name", NAMES)
def test_claims_with_passing_controls_are_uninformative(name, executed_notebooks):
    """No claim counts as agreement when one of its negative controls meets the same threshold."""
    for v in goldens.notebook_verdicts(nbformat.read(executed_notebooks[name], as_version=4)).values():
        if v["kind"] == "claim":
            left = v["excluded"] and v["excluded"]["count"] < v["excluded"]["total"]
            if not v["controls"]:  # allowed only where every run was left out, or the statistic is degenerate (too few
                # runs left): nothing measured, nothing decided (out of its regime that reads "needs a larger scale")
                outcome = v["details"].get("stability", {}).get("this_run", v["outcome"])  # an unstable verdict's own
                assert (not left or v["details"].get("degenerate")) and outcome in ("uninformative", "needs a larger scale"), \
                    f"{name}.{v['name']}: a claim without a control"
            if any(c["passes"] for c in v["controls"]):
                assert v["outcome"] != "agrees", f"{name}.{v['name']}: its control passes, yet it 'agrees'"


@pytest.mark.parametrize("name", NAMES)
def test_figures_written_with_data(name, executed_notebooks):
    source = notebooks.source_path(name).read_text()
    # a figure marked "optional figure" is drawn only when its runs train (issue 50: no run, no figure)
    declared = sum("plotting.save_figure(" in line and "optional figure" not in line for line in source.splitlines())
    folder = pages.FIGURES / name
    phone = {p.name[:-len(plotting.PHONE_SUFFIX)] for p in folder.glob(f"*{plotting.PHONE_SUFFIX}")}
    stems = {p.stem for p in folder.glob("*.png")} - {f"{s}.phone" for s in phone}
    assert len(stems) >= max(declared, 1), f"{name}: {len(stems)} figures written, {declared} declared"
    assert phone <= stems, f"{name}: phone layouts of no figure: {sorted(phone - stems)}"
    for stem in stems:
        for ext in ("png", "svg", "csv"):
            path = folder / f"{stem}.{ext}"
            assert path.is_file() and path.stat().st_size > 0, f"missing or empty {path}"


@pytest.mark.parametrize("name", NAMES)
def test_paper_params_are_notebook_parameters(name):
    path = notebooks.paper_params_path(name)
    assert path.is_file(), f"{name} has no {path}"
    paper = yaml.safe_load(path.read_text())
    defaults = notebooks.parameter_defaults(notebooks.read_notebook(name))
    unknown = set(paper) - set(defaults)
    assert not unknown, f"{path.name}: {sorted(unknown)} are not parameters of {name}"
    assert paper.get("scale") == "paper" and defaults.get("scale") == "ci"
    for key, value in paper.items():
        assert type(value) is type(defaults[key]) or (isinstance(value, (int, float)) and isinstance(defaults[key], (int, float))), key
    rules.resolve_parameters(name, scale="paper", memory=False)  # the paper file obeys the notebook's own rules


@pytest.mark.book  # reads the built book (no fixture to mark it)
def test_book_renders_executed_outputs_without_reexecuting():
    """jupyter-cache holds exactly the papermill outputs; Jupyter Book executed nothing itself."""
    from jupyter_cache import get_cache

    cache = get_cache(str(pages.CACHE))
    assert len(cache.list_cache_records()) == len(NAMES)
    assert not cache.list_project_records(), "Jupyter Book executed a notebook itself (cache miss)"
    html = pages.BUILD / "html" / "notebooks" / "gradients" / "decomposition.html"
    assert html.is_file(), "run `make book` first"
    assert "Verdict" in html.read_text()


def test_ledger_lists_every_claim_and_links_every_notebook(executed_notebooks):
    import yaml as _yaml

    text = build.write_ledger(NAMES).read_text()
    claims = _yaml.safe_load((build.REPO_ROOT / "book" / "claims.yaml").read_text())
    assert {c["notebook"] for c in claims} >= set(NAMES), "a notebook without a row in book/claims.yaml"
    for c in claims:
        assert f'class="claim-id">{c["claim_id"]}<' in text, f"claim {c['claim_id']} has no ledger row"
    for name in NAMES:
        assert f"notebooks/{name}.html" in text, f"the ledger does not link {name}"
        for v in goldens.notebook_verdicts(nbformat.read(executed_notebooks[name], as_version=4)).values():
            assert ledger.fmt(v["measured"]) in text and v["outcome"] in text, f"{name}: {v['name']} is not in the ledger"
