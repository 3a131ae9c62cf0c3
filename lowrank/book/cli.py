"""The `lowrank` command: rerun any notebook of the book with new parameters.

    lowrank list [PART/NAME]
    lowrank run PART/NAME [-p NAME VALUE ...] [--params FILE.yaml] [--scale ci|laptop|paper] [--force] [--dry-run]
    lowrank report RUN_FOLDER [RUN_FOLDER ...] [-o report.html]
    lowrank sweep SPEC.yaml [--executor local|ray] [--address HOST:PORT] [--jobs N] [--collect]
    lowrank goldens measure PART/NAME [PART/NAME ...] [--seeds 0-4] [--check]
    lowrank goldens check [PART/NAME ...] [--cpu-path default]
    lowrank diff [-o FILE.md] [--strict]
    lowrank data fetch mnist|cifar10 [--root DIR]
    lowrank results store RUN_FOLDER [RUN_FOLDER ...] | lowrank results list
    lowrank --version

An installed copy (`pip install lowrank`) carries the notebooks and parameter files: `list` and `run`
work anywhere, writing runs below the current folder; `goldens`, `diff` and `results` need a clone.
Refused input gives one line on stderr and exit status 2; an error of the environment (a full
disk, a file that cannot be written) one line and 1; Ctrl-C one line and 130.
"""

from __future__ import annotations

import argparse
import errno
import shutil
import sys
from pathlib import Path

from lowrank.book import notebooks, rules, runs

__all__ = ["main"]


def cmd_list(args) -> int:
    names = [args.name] if args.name else notebooks.list_notebooks()
    if not names:
        raise FileNotFoundError(f"no notebooks in {notebooks.NOTEBOOK_ROOT}: run this from a clone of the book's "
                                f"repository (this copy of the package was built without them)")
    for name in names:
        specs = rules.parameter_specs(name)
        paper_path = notebooks.paper_params_path(name)
        paper = rules.load_yaml_mapping(paper_path) if paper_path.is_file() else {}
        print(f"{name}")
        for spec in specs.values():
            p = f"  paper: {paper[spec.name]!r}" if spec.name in paper else ""
            print(f"  {spec.name:<22} = {spec.default!r:<28}{p}")
            if args.name:
                print(f"  {'':<22}   {spec.comment}  [{spec.describe()}]")
        print()
    return 0


def _overrides(pairs) -> dict:
    """`-p NAME VALUE` pairs as a mapping of texts (typed by each parameter's declared type,
    `rules.ParameterSpec.from_text`); a name given twice is refused (which one was meant?)."""
    out = {}
    for k, v in pairs or []:
        if k in out:
            raise rules.ParameterError(f"-p {k} is given twice ({out[k]} and {v}); give it once")
        out[k] = v
    return out


def run_cost(name: str, params: dict, scale: str) -> str:
    """What a run of `name` with the resolved `params` is measured to cost, as one phrase: the ci page's
    execution in the last measured `.ci/run` (bench/ci_page_seconds.csv) when `params` are the ci
    defaults, the paper file's `# Cost` line when they are its values, else the training alone from
    measured seconds per epoch (bench/epoch_seconds.csv) where the parameters name a network, a data
    set, epochs and batch sizes it has measured; otherwise "unknown". Nothing is guessed."""
    from lowrank.book import costs, pages

    if params == rules.resolve_parameters(name, memory=False):
        seconds = pages.recorded_page_seconds(pages.PAGE_SECONDS).get(name)
        if seconds is not None:
            return (f"{seconds:.3g} s (this page at its ci defaults in the last measured ci build, "
                    "bench/ci_page_seconds.csv)")
    paper = notebooks.paper_params_path(name)
    if scale == "paper" and params == rules.resolve_parameters(name, scale="paper", memory=False):
        line = next((ln for ln in paper.read_text(encoding="utf-8").splitlines() if ln.startswith("# Cost")), "")
        if line and "not measured" not in line:
            return f"{line.partition(': ')[2].rstrip('.')} (measured by `make paper`: the Cost line of {paper})"
    batches = params.get("batch_sizes", [params["batch_size"]] if "batch_size" in params else None)
    if all(k in params for k in ("model", "dataset", "epochs")) and batches:
        seconds, _ = costs.training_seconds([(params["model"], params["dataset"], int(b), 1, params["epochs"])
                                             for b in batches])
        if seconds is not None:
            return (f"at least {costs.format_seconds(seconds)} of training: one {params['model']} on "
                    f"{params['dataset']} for {params['epochs']} epochs at each batch size, from measured seconds "
                    "per epoch (bench/epoch_seconds.csv); the page's other settings train more")
    return "unknown (no measurement for these parameters)"


def cmd_run(args) -> int:
    texts = _overrides(args.p)
    params = rules.resolve_parameters(args.name, scale=args.scale, params_file=args.params, texts=texts)
    if args.dry_run:
        folder = runs.run_dir(args.name, params)
        state = ("exists: it would be reused (--force reruns it)" if folder.is_dir() and not args.force
                 else "would be written")
        print(f"{args.name} at {args.scale} scale: {notebooks.source_path(args.name)}")
        for key, value in params.items():
            print(f"  {key:<22} = {value!r}")
        print(f"run folder: {folder} ({state})")
        print(f"estimated cost: {run_cost(args.name, params, args.scale)}")
        print("nothing was run")
        return 0
    folder, reused = runs.run(args.name, params, force=args.force, progress=True)
    print(f"{'reused' if reused else 'wrote'} {folder}")
    for v in runs.load_run(folder)["verdicts"].values():
        controls = "".join(f"; control {c['name']}: {c['value']:.4g}" for c in v.get("controls", []))
        print(f"  {v['claim_id']} {v['kind']} {v['name']}: {v['measured']:.4g}{controls} (expects {v['expected']}: "
              f"{v['outcome']})")
    return 0


def cmd_report(args) -> int:
    from lowrank.book.report import check_output, render

    out = check_output(args.output)  # before reading any folder
    render([runs.load_run(f) for f in args.folders], out)
    print(f"wrote {out}")
    return 0


def cmd_sweep(args) -> int:
    from lowrank.book import sweeps

    spec = sweeps.load_spec(args.spec, output=args.output)
    if args.dry_run:
        p = sweeps.plan(spec)
        print(f"{spec.path}: {p['runs']} runs of {spec.target} ({p['finished']} already finished)"
              f"{', trained as ensembles' if p['ensemble'] else ''}")
        for k, values in p["grid"].items():
            print(f"  {k}: {values}")
        seconds = p["estimated_seconds"]
        print(f"estimated cost: {'unknown' if seconds is None else f'{seconds / 3600:.3g} h'} of training (measured seconds per epoch, {', '.join(p['measured_on']) or 'no measurement'}"
              f"{'; runs costed one by one, an upper bound for ensembles' if p['ensemble'] else ''})"
              + (f"; no measured time for {len(p['unmeasured'])} (model, dataset, batch size): {', '.join(p['unmeasured'])}"
                 if p["unmeasured"] else ""))
        print(f"results go to {p['output']}; nothing was run")
        return 0
    if args.collect:
        table = sweeps.collect(spec)
        print(f"collected {table['run'].nunique()} runs of {len(spec.points)} into {spec.output / 'collected.csv'}")
        return 0
    result = sweeps.run_sweep(spec, args.executor, address=args.address, jobs=args.jobs)
    unusual = result.get("unusual", {})
    print(f"{len(result['done'])} ran, {len(result['skipped'])} already finished, {len(result['failed'])} failed"
          f"{f', {len(unusual)} diverged or collapsed' if unusual else ''} ({spec.output})")
    for folder, status in unusual.items():
        print(f"{status.upper()} {folder} (status columns of results.csv)", file=sys.stderr)
    for folder, error in result["failed"].items():
        last = error.splitlines()[-1] if error else "no message"
        print(f"FAILED {folder}: {last}", file=sys.stderr)
    return 1 if result["failed"] else 0


def cmd_goldens(args) -> int:
    from lowrank.book import goldens, pages

    if args.action == "check":
        return _goldens_check(args, pages, goldens)
    seeds = goldens.parse_seeds(args.seeds)
    for name in args.names:
        notebooks.source_path(name)  # a clear error for a wrong name, before any work
        goldens.seed_overrides(name, 0)
    recorded, stale = goldens.load(), 0
    for name in args.names:
        print(f"{name}: executing {len(seeds)} seed offsets ({args.seeds}) and offset 0 under "
              f"{goldens.CPU_PATH_ENV}={' and '.join(goldens.OTHER_PATHS)}, {args.jobs} at a time", flush=True)
        fresh = goldens.entries_from_runs(goldens.measure(name, seeds, jobs=args.jobs), goldens._commit())
        if args.check:
            for row in goldens.compare_spread(recorded.get(name, {}), fresh):
                stale += row["stale"]
                print(f"  {row['verdict']}: {'STALE (' + row['why'] + ')' if row['stale'] else 'matches'}")
        else:
            goldens.write_block(name, fresh, order=pages.book_notebooks())
            for key, e in fresh.items():
                print(f"  {key}: {e['value']:.4g} ± {e['abs']:.2g} ({e['outcome']}: {e['outcomes']}; {e['spread']})")
    return 1 if stale else 0


def _goldens_check(args, pages, goldens) -> int:
    names = args.names or pages.book_notebooks()
    for name in names:
        notebooks.source_path(name)  # a clear error for a wrong name, before any work
    print(f"executing {len(names)} notebook(s) under {goldens.CPU_PATH_ENV}={args.cpu_path}, {args.jobs} at a time, "
          "against tests/golden_verdicts.yaml", flush=True)
    bad = 0
    for name, mismatches in goldens.check_cpu_path(names, args.cpu_path, jobs=args.jobs).items():
        bad += bool(mismatches)
        print(f"  {name}: " + ("matches its golden block" if not mismatches else "DIFFERS\n    " + "\n    ".join(mismatches)))
    return 1 if bad else 0


def cmd_diff(args) -> int:
    from lowrank.book import goldens, pages
    from lowrank.core import io

    # before any work: never over a file the tool did not write (its record, not the file's title, says so)
    out = io.check_replaceable(args.output, "diff output", ours=io.written_by_lowrank)
    executed = {n: pages.executed_path(n) for n in pages.book_notebooks()}
    missing = [n for n, p in executed.items() if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"not executed yet: {', '.join(missing)} (run `make book` first)")
    rows = goldens.verdict_diff(executed)
    text = goldens.diff_markdown(rows)
    io.write_atomically(out, text, record=True)
    print(text + f"\n(written to {args.output})")
    return 1 if args.strict and any(not r["within"] for r in rows) else 0


DISK_FULL_BYTES = 16 * 2**20  # less than this free after a failed write: the disk is full


def _free_bytes(path: Path) -> int | None:
    """Free bytes on the disk holding `path` (its deepest existing folder), None if unknown."""
    for p in [Path(path), *Path(path).parents]:
        if p.exists():
            try:
                return shutil.disk_usage(p).free
            except OSError:
                return None
    return None


def cmd_data(args) -> int:
    """`lowrank data fetch NAME`: download, check the published md5 sums, unpack."""
    from lowrank.core import datasets

    if args.root not in (None, ""):  # before any download: a place the data can be written to
        from lowrank.core.validation import user_path

        root = user_path(args.root, "--root")
        args.root = str(root)
        if root.exists() and not root.is_dir():
            raise notebooks.InputError(f"--root {root} exists and is not a folder")
        runs.check_output_folder(root, "--root")
    try:
        root = datasets.fetch(args.dataset, args.root)
    except datasets.FetchError as err:
        where = datasets.resolve_root(args.root or None)
        free = _free_bytes(where)
        if free is not None and free < DISK_FULL_BYTES:  # a download cut short by a full disk is no network error
            print(f"lowrank: error: the disk holding {where} is full ({free / 2**20:.1f} MiB free): free some space, "
                  f"then run the command again to resume", file=sys.stderr)
            return 1
        print(f"lowrank: error: {err}", file=sys.stderr)
        return 2
    default = "" if args.root else f"; the default data folder, `data_root: {datasets.DEFAULT_DATA_ROOT}` in the paper files"
    print(f"{args.dataset} is in {root.resolve()}{default}")
    return 0


def cmd_results(args) -> int:
    """`lowrank results store FOLDER...`: keep laptop- and paper-scale runs' verdicts and provenance in
    results/<scale>/; `lowrank results list`: each stored result, current or stale (and why)."""
    from lowrank.book import paper_results as pr

    if args.action == "store":
        for folder in args.folders:
            print(f"stored {pr.store_run(runs.load_run(folder))}")
        return 0
    for scale in pr.STORED_SCALES:
        if not pr.stored_names(scale=scale):
            print(f"no {scale}-scale results in {pr.results_root(scale)} (`make {scale}`, or `lowrank results store RUN_FOLDER`)")
        for name in pr.stored_names(scale=scale):
            r = pr.stored_result(name, scale=scale)
            p = r["provenance"]
            state = f"STALE ({r['stale_reason']})" if r["stale"] else "current"
            print(f"{scale} {name}: {len(r['verdicts'])} verdicts, {p.get('wall_s')} s on {p.get('device')}, "
                  f"commit {str((p.get('git') or {}).get('commit'))[:10]}: {state}")
    return 0


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"lowrank {version('lowrank')}"
    except PackageNotFoundError:
        return "lowrank (not installed: run from a source checkout)"


def parser() -> argparse.ArgumentParser:
    """The `lowrank` command's arguments: every command and argument with its help text."""
    ap = argparse.ArgumentParser(prog="lowrank", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--version", action="version", version=_version())
    sub = ap.add_subparsers(dest="command", required=True)
    p_list = sub.add_parser("list", help="notebooks with their parameters, defaults and paper values")
    p_list.add_argument("name", nargs="?", metavar="PART/NAME", help="one notebook: also what each parameter allows")
    p_run = sub.add_parser("run", help="execute a notebook with new parameters into a run folder")
    p_run.add_argument("name", help="PART/NAME, e.g. gradients/decomposition")
    p_run.add_argument("-p", nargs=2, action="append", metavar=("NAME", "VALUE"),
                       help="set a parameter (repeatable); VALUE typed by the parameter's declared type: the text "
                            "itself for a str parameter, else YAML 1.2 (1e-3, [0.1, 0.2], true, .inf)")
    p_run.add_argument("--params", metavar="FILE", help="YAML file of parameters")
    p_run.add_argument("--scale", choices=list(notebooks.SCALES), default="ci",
                       help="start from the ci defaults, the laptop YAML (params/laptop/) or the paper YAML (params/paper/)")
    p_run.add_argument("--force", action="store_true", help="rerun even if a run folder with this hash exists")
    p_run.add_argument("--dry-run", action="store_true", help="print the notebook, parameters, run folder and "
                       "estimated cost; run nothing")
    p_rep = sub.add_parser("report", help="render run folders as one standalone HTML page")
    p_rep.add_argument("folders", nargs="+", metavar="RUN_FOLDER", help="run folders written by `lowrank run`")
    p_rep.add_argument("-o", "--output", default="report.html", help="the HTML file to write (default report.html)")
    p_sw = sub.add_parser("sweep", help="run (or --collect) a sweep spec on a local pool or Ray")
    p_sw.add_argument("spec", metavar="SPEC.yaml", help="the sweep spec (examples in sweeps/)")
    p_sw.add_argument("--executor", choices=["local", "ray"], default="local",
                      help="local: a process pool on this machine (default); ray: a Ray cluster (the sweep extra)")
    p_sw.add_argument("--address", help="Ray cluster address (default: a local Ray instance)")
    p_sw.add_argument("--jobs", type=int, help="local executor: runs at once, a positive number (default: CPU count "
                      "divided by the spec's num_cpus)")
    p_sw.add_argument("--output", help="sweep folder (default runs/sweeps/<spec name>)")
    p_sw.add_argument("--collect", action="store_true", help="gather finished runs into collected.csv")
    p_sw.add_argument("--dry-run", action="store_true", help="print the runs, grid, estimated cost and output folder; run nothing")
    p_gold = sub.add_parser("goldens", help="measure golden verdicts over seeds (tests/golden_verdicts.yaml)")
    gold_sub = p_gold.add_subparsers(dest="action", required=True)
    p_meas = gold_sub.add_parser("measure", help="execute over seed offsets and write (or --check) the golden entries")
    p_meas.add_argument("names", nargs="+", metavar="PART/NAME", help="the notebooks to measure")
    p_meas.add_argument("--seeds", default="0-4", help="seed offsets, 0 first (default 0-4)")
    p_meas.add_argument("--jobs", type=int, default=2, choices=range(1, 65), metavar="N", help="executions at once")
    p_meas.add_argument("--check", action="store_true", help="compare with the recorded entries, write nothing")
    p_chk = gold_sub.add_parser("check", help="execute once on another CPU code path and compare with the golden entries")
    p_chk.add_argument("names", nargs="*", metavar="PART/NAME", help="notebooks (default: every notebook of the book)")
    p_chk.add_argument("--cpu-path", default="default", choices=["default", "avx2", "avx512"],
                       help="ATEN_CPU_CAPABILITY for the kernels (default: torch's portable path)")
    p_chk.add_argument("--jobs", type=int, default=2, choices=range(1, 65), metavar="N", help="executions at once")
    p_diff = sub.add_parser("diff", help="verdicts of the built notebooks that differ from their golden entries")
    p_diff.add_argument("-o", "--output", default="_build/verdict-diff.md", help="the Markdown file to write "
                        "(default _build/verdict-diff.md)")
    p_diff.add_argument("--strict", action="store_true", help="exit 1 when a verdict is outside its tolerance")
    p_data = sub.add_parser("data", help="real data sets: fetch MNIST / CIFAR-10 into the data root")
    p_data_sub = p_data.add_subparsers(dest="action", required=True)
    p_fetch = p_data_sub.add_parser("fetch", help="download from the canonical address, check md5")
    p_fetch.add_argument("dataset", choices=["mnist", "cifar10"], help="the data set to download")
    p_fetch.add_argument("--root", metavar="DIR", help="data folder (default: $LOWRANK_DATA, else data/ of the source "
                         "checkout, else the user data folder such as ~/.local/share/lowrank; the paper files' "
                         "`data_root: data` means the same folder)")
    p_res = sub.add_parser("results", help="paper-scale results kept in results/paper/ with their provenance")
    p_res_sub = p_res.add_subparsers(dest="action", required=True)
    p_store = p_res_sub.add_parser("store", help="store finished `lowrank run NAME --scale paper` folders")
    p_store.add_argument("folders", nargs="+", metavar="RUN_FOLDER", help="run folders of `lowrank run NAME --scale paper`")
    p_res_sub.add_parser("list", help="every stored result: current, or stale when its parameters changed")
    return ap


# the commands that read or write the clone's own files (an installed copy has none of them)
NEEDS_CLONE = {"diff": "compares the built book's verdicts with tests/golden_verdicts.yaml",
               "goldens": "measures into tests/golden_verdicts.yaml", "results": "keeps results in results/paper/"}
# the extra that brings a module a command imports (what the science install lacks)
EXTRA_OF = {"mnist1d": "data", "matplotlib": "notebook", "IPython": "notebook", "papermill": "run", "jupytext": "run",
            "nbformat": "run", "ipykernel": "run", "ray": "sweep"}


def main(argv=None) -> int:
    args = parser().parse_args(argv)

    def say(err) -> None:
        from lowrank.core.validation import cut

        message = cut(" ".join(str(err).split()), 1000)  # one line, whatever the exception's text
        print(f"lowrank: error: {message}", file=sys.stderr)

    try:
        if args.command in NEEDS_CLONE and not notebooks.IN_CLONE:
            raise notebooks.InputError(f"`lowrank {args.command}` {NEEDS_CLONE[args.command]}: run this from a clone "
                                       f"of the book's repository (`make book` first), not from an installed copy")
        commands = {"list": cmd_list, "run": cmd_run, "report": cmd_report, "sweep": cmd_sweep,
                    "goldens": cmd_goldens, "diff": cmd_diff,
                    "data": cmd_data, "results": cmd_results}
        return commands[args.command](args)
    except notebooks.NotebookFailed as err:  # a few lines: the cell, its error, the partial notebook
        print(f"lowrank: error: {err}", file=sys.stderr)
        return 1
    except ModuleNotFoundError as err:  # a command of an extra the install lacks
        if (err.name or "lowrank").split(".")[0] == "lowrank":
            raise  # the package's own module: a bug, not a missing extra
        extra = EXTRA_OF.get((err.name or "").split(".")[0], "book")
        say(f"{err}: this command needs `pip install 'lowrank[{extra}]'` (the science install lacks {err.name})")
        return 1
    except KeyboardInterrupt:
        print("lowrank: interrupted (partial results and kernel files removed)", file=sys.stderr)
        return 130
    except (notebooks.InputError, FileNotFoundError, ValueError) as err:  # SweepError is an InputError
        say(err)
        return 2
    except OSError as err:  # the environment: a full disk, a folder that cannot be written
        if err.errno in (errno.ENOSPC, errno.EDQUOT):
            say(f"the disk is full ({err}); free some space and run the command again")
        else:
            say(f"{type(err).__name__}: {err}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
