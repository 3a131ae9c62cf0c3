import pytest

from lowrank import build


@pytest.fixture(scope="session")
def executed_notebooks():
    """Executed notebooks at ci scale, from the book build's cache: executes only what is stale,
    so a `make test` after `make book` executes nothing twice."""
    names = build.book_notebooks()
    build.execute_all(names, jobs=2)
    return {n: build.executed_path(n) for n in names}
