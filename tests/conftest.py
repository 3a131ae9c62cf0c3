import os

# One BLAS/OpenMP thread per test process, set before numpy and torch load: on 2 busy cores OpenBLAS's
# threads spin against each other (a 700 x 500 LAPACK SVD took 6 s with two threads, 0.3 s with one).
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from collections.abc import Mapping

import pytest

from lowrank.book import build
from lowrank.core import device

device.reproducible()  # the unit tests' seeded runs repeat bit for bit, as in the notebooks


class _Executed(Mapping):
    """`{name: executed notebook path}`, executing a stale notebook when it is first asked for, so that
    `pytest -k gradients/` executes only Part I and a `make test` after `make book` executes nothing."""

    def __init__(self, names):
        self._names = list(names)

    def __getitem__(self, name):
        if name not in self._names:
            raise KeyError(name)
        build.execute_all([name], jobs=1)
        return build.executed_path(name)

    def __iter__(self):
        return iter(self._names)

    def __len__(self):
        return len(self._names)


@pytest.fixture(scope="session")
def executed_notebooks(request):
    names = build.book_notebooks()
    selected = {item.callspec.params.get("name") for item in request.session.items
                if "executed_notebooks" in getattr(item, "fixturenames", ()) and hasattr(item, "callspec")}
    build.execute_all([n for n in names if n in selected], jobs=2)  # the selected stale ones, two at a time
    return _Executed(names)


def pytest_collection_modifyitems(items):
    for item in items:  # the fast lane (`make unit`) leaves out the tests that read the executed book
        if "executed_notebooks" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.book)
