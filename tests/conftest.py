import pytest

from lowrank.book import build
from lowrank.core import device

device.reproducible()  # the unit tests' seeded runs repeat bit for bit, as in the notebooks


@pytest.fixture(scope="session")
def executed_notebooks():
    """Executed notebooks at ci scale, from the book build's cache: executes only what is stale,
    so a `make test` after `make book` executes nothing twice."""
    names = build.book_notebooks()
    build.execute_all(names, jobs=2)
    return {n: build.executed_path(n) for n in names}
