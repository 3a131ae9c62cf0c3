"""setuptools' build step, extended: the wheel carries the book's notebooks and parameter files in
lowrank/_book/, so that an installed `lowrank` lists and runs them (`lowrank.book.notebooks.SOURCE_ROOT`).
Everything else is declared in pyproject.toml."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
# the sources the `lowrank` command reads: notebooks/<part>/<name>.md, params/ (rules, paper files),
# the measured timings behind `lowrank run --dry-run` and `lowrank sweep --dry-run`
BOOK_SOURCES = {"notebooks": "*/*.md", "params": "**/*.yaml", "bench": "*.csv"}


class build_py_with_book_sources(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install runs from the clone, whose own folders it reads
        target = Path(self.build_lib) / "lowrank" / "_book"
        shutil.rmtree(target, ignore_errors=True)
        for folder, pattern in BOOK_SOURCES.items():
            for src in sorted((HERE / folder).glob(pattern)):
                dest = target / src.relative_to(HERE)
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, dest)


setup(cmdclass={"build_py": build_py_with_book_sources})
