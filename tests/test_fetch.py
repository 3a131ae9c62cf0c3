"""`lowrank data fetch`: downloads by pooch, checked against published md5 sums and written
atomically; CIFAR-10 batches checked before they are unpickled. Tested against an HTTP server on
127.0.0.1 (a thread of this test) that serves small generated archives, a truncated and a corrupted
one, and cuts a transfer short on request."""

import gzip
import hashlib
import http.server
import io
import pickle
import tarfile
import threading

import numpy as np
import pytest

from lowrank.book import cli
from lowrank.core import datasets


def _idx_gz(arr: np.ndarray) -> bytes:
    arr = np.asarray(arr, dtype=np.uint8)
    header = bytes([0, 0, 8, arr.ndim]) + b"".join(int(n).to_bytes(4, "big") for n in arr.shape)
    return gzip.compress(header + arr.tobytes(), mtime=0)


def _mnist_files() -> dict:
    rng = np.random.default_rng(0)
    return {"train-images-idx3-ubyte.gz": _idx_gz(rng.integers(0, 256, (6, 28, 28))),
            "train-labels-idx1-ubyte.gz": _idx_gz(np.arange(6) % 10),
            "t10k-images-idx3-ubyte.gz": _idx_gz(rng.integers(0, 256, (4, 28, 28))),
            "t10k-labels-idx1-ubyte.gz": _idx_gz(np.arange(4))}


def _cifar_batches() -> dict:
    rng = np.random.default_rng(1)
    return {name: pickle.dumps({b"data": rng.integers(0, 256, (3, 3072), dtype=np.uint8), b"labels": [0, 1, 2]})
            for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]}


def _cifar_archive(batches: dict | None = None) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, raw in (batches or _cifar_batches()).items():
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))
    return buf.getvalue()


class _Loopback:
    """A loopback HTTP server for `handler` (a BaseHTTPRequestHandler class) on a free port of 127.0.0.1,
    serving from a daemon thread between __enter__ and __exit__; `base` is its address."""

    def serve(self, handler, daemon_threads: bool = False) -> None:
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = daemon_threads
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}/"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


class _Server(_Loopback):
    """Serves `files` on 127.0.0.1 with Range support; `cut[name] = n` sends only n bytes of the body
    once (with the full Content-Length), as a dropped connection does; `refuse = code` answers every
    request with that HTTP error (a moved S3 bucket's 403, a 404, a 5xx). Records every Range header."""

    def __init__(self, files: dict, refuse: int | None = None):
        self.files, self.cut, self.ranges, self.honour_range, self.refuse = dict(files), {}, [], True, refuse
        self.requests = 0
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                server.requests += 1
                if server.refuse is not None:
                    self.send_error(server.refuse)
                    return
                name = self.path.rsplit("/", 1)[-1]
                if name not in server.files:
                    self.send_error(404)
                    return
                body = server.files[name]
                rng = self.headers.get("Range")
                server.ranges.append((name, rng))
                rng = rng if server.honour_range else None
                start = int(rng.split("=")[1].rstrip("-")) if rng else 0
                if start >= len(body) and rng:
                    self.send_response(416)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(206 if rng else 200)
                if rng:
                    self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
                self.send_header("Content-Length", str(len(body) - start))
                self.end_headers()
                n = server.cut.pop(name, None)
                self.wfile.write(body[start:] if n is None else body[start:start + n])
                if n is not None:
                    self.close_connection = True

            def log_message(self, *args):
                pass

        self.serve(Handler)


def _md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def _sources(base: str, mnist: dict, cifar: bytes) -> dict:
    """The real source table's layout with the generated files' md5 sums and the local server."""
    real_m, real_c = datasets.SOURCES["mnist"], datasets.SOURCES["cifar10"]
    return {"mnist": real_m._replace(files=tuple((n, _md5(b)) for n, b in mnist.items()), mirrors=(base,)),
            "cifar10": real_c._replace(files=(("cifar-10-python.tar.gz", _md5(cifar)),), mirrors=(base,),
                                       expect=tuple((n, _md5(b)) for n, b in _cifar_batches().items()))}


def _all_files(root):
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def test_the_real_sources_are_the_published_ones():
    m, c = datasets.SOURCES["mnist"], datasets.SOURCES["cifar10"]
    assert dict(m.files)["train-images-idx3-ubyte.gz"] == "f68b3c2dcbeaaa9fbdd348bbdeb94873"
    assert dict(m.files)["t10k-labels-idx1-ubyte.gz"] == "ec29112dd5afa0611ce80d1b7f02629c"
    assert c.files == (("cifar-10-python.tar.gz", "c58f30108f718f92721af3b95e74349a"),)
    assert dict(c.expect)["data_batch_1"] == "c99cafc152244af753f735de768cd75f"  # torchvision's CIFAR10.train_list
    assert dict(c.expect)["test_batch"] == "40351d587109b95175f43aff81a1287e" and len(c.expect) == 6
    assert all(b.endswith("/") for b in m.mirrors + c.mirrors)


def test_fetch_mnist_and_cifar10_then_load_them(tmp_path, monkeypatch):
    mnist, cifar = _mnist_files(), _cifar_archive()
    with _Server({**mnist, "cifar-10-python.tar.gz": cifar}) as srv:
        sources = _sources(srv.base, mnist, cifar)
        monkeypatch.setitem(datasets.SOURCES, "cifar10", sources["cifar10"])  # the generated batches' sums
        assert datasets.fetch("mnist", tmp_path, sources=sources, progress=False) == tmp_path
        assert datasets.fetch("cifar10", tmp_path, sources=sources, progress=False) == tmp_path
        n_requests = len(srv.ranges)
        datasets.fetch("mnist", tmp_path, sources=sources, progress=False)  # verified files: no request
        datasets.fetch("cifar10", tmp_path, sources=sources, progress=False)
        assert len(srv.ranges) == n_requests
    m = datasets.load("mnist", root=tmp_path)
    assert m.x_train.shape == (6, 1, 28, 28) and m.y_test.tolist() == [0, 1, 2, 3]
    c = datasets.load("cifar10", root=tmp_path)
    assert c.x_train.shape == (15, 3, 32, 32) and c.y_test.tolist() == [0, 1, 2]
    assert not [f for f in _all_files(tmp_path) if f.rsplit("/", 1)[-1].startswith(".")], "temporary files left"


def test_corrupted_and_truncated_archives_fail_clearly_and_leave_nothing(tmp_path):
    mnist, cifar = _mnist_files(), _cifar_archive()
    corrupted = bytearray(cifar)
    corrupted[len(corrupted) // 2] ^= 0xFF
    for bad in (bytes(corrupted), cifar[: len(cifar) // 2]):  # served whole, with a matching Content-Length
        with _Server({"cifar-10-python.tar.gz": bad}) as srv:
            with pytest.raises(datasets.FetchError, match=f"the published one {_md5(cifar)}"):
                datasets.fetch("cifar10", tmp_path, sources=_sources(srv.base, mnist, cifar), progress=False)
        assert _all_files(tmp_path) == [], "a failed download left a file"


def test_a_cut_transfer_leaves_nothing_and_the_next_attempt_downloads_it_whole(tmp_path, monkeypatch):
    mnist, cifar = _mnist_files(), _cifar_archive()
    with _Server({"cifar-10-python.tar.gz": cifar}) as srv:
        sources = _sources(srv.base, mnist, cifar)
        monkeypatch.setitem(datasets.SOURCES, "cifar10", sources["cifar10"])
        srv.cut["cifar-10-python.tar.gz"] = 1000
        with pytest.raises(datasets.FetchError, match="cut short.*nothing was kept"):
            datasets.fetch("cifar10", tmp_path, sources=sources, progress=False)
        assert _all_files(tmp_path) == []
        datasets.fetch("cifar10", tmp_path, sources=sources, progress=False)
        assert [r for _, r in srv.ranges] == [None, None]
    assert (tmp_path / "cifar-10-python.tar.gz").read_bytes() == cifar
    assert datasets.load("cifar10", root=tmp_path).x_test.shape == (3, 3, 32, 32)


class _Marker:
    """A pickle that creates a file when it is read (as a crafted CIFAR batch would run a command)."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def _crafted_batches(marker) -> dict:
    return {**_cifar_batches(), "data_batch_1": pickle.dumps({b"data": _Marker(marker), b"labels": [0]})}


def test_a_crafted_cifar_batch_is_refused_before_it_is_unpickled(tmp_path, capsys):
    """Issue 51: `data_root` holding crafted batch files ran their pickles; `data fetch cifar10 --root D`
    said "cifar10 is in D" for them. Both now check each batch's published md5 first."""
    marker = tmp_path / "ran"
    folder = tmp_path / "d" / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    for name, raw in _crafted_batches(marker).items():
        (folder / name).write_bytes(raw)
    with pytest.raises(ValueError, match="data_batch_1 is not the published CIFAR-10 batch .* is not read"):
        datasets.load("cifar10", root=tmp_path / "d")
    assert not marker.exists(), "the crafted pickle ran"
    assert cli.main(["data", "fetch", "cifar10", "--root", str(tmp_path / "d")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "data_batch_1 is there but its md5" in err and not marker.exists()
    pickle.loads((folder / "data_batch_1").read_bytes())  # the test's own check that the file does what it says
    assert marker.exists()


def test_a_crafted_batch_inside_a_fetched_archive_is_not_unpacked(tmp_path, monkeypatch):
    marker = tmp_path / "ran"
    mnist, cifar = _mnist_files(), _cifar_archive(_crafted_batches(marker))
    with _Server({"cifar-10-python.tar.gz": cifar}) as srv:
        sources = _sources(srv.base, mnist, cifar)  # the archive's md5 matches; its first batch does not
        with pytest.raises(datasets.FetchError, match="data_batch_1 is there but its md5"):
            datasets.fetch("cifar10", tmp_path / "d", sources=sources, progress=False)
    assert not (tmp_path / "d" / "cifar-10-batches-py").exists() and not marker.exists()


def test_a_root_naming_an_unknown_user_is_one_line(tmp_path, capsys):
    assert cli.main(["data", "fetch", "mnist", "--root", "~nouser-lowrank/x"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "nouser-lowrank" in err and "no user" in err
    with pytest.raises(ValueError, match="no user 'nouser-lowrank'"):
        datasets.load("mnist", root="~nouser-lowrank/x")


def test_cli_fetch_and_offline_message(tmp_path, monkeypatch, capfd):  # capfd: pooch logs to the stream itself
    mnist, cifar = _mnist_files(), _cifar_archive()
    with _Server(mnist) as srv:
        monkeypatch.setitem(datasets.SOURCES, "mnist", _sources(srv.base, mnist, cifar)["mnist"])
        assert cli.main(["data", "fetch", "mnist", "--root", str(tmp_path / "d")]) == 0
    assert "mnist is in" in capfd.readouterr().out
    assert len(_all_files(tmp_path / "d" / "MNIST" / "raw")) == 4
    # a port nobody listens on: the server above has closed
    monkeypatch.setitem(datasets.SOURCES, "mnist", datasets.SOURCES["mnist"]._replace(files=(("x.gz", "0" * 32),)))
    assert cli.main(["data", "fetch", "mnist", "--root", str(tmp_path / "offline")]) == 2
    err = capfd.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("lowrank: error: offline?")
    assert "x.gz" in err and str(tmp_path / "offline" / "MNIST" / "raw") in err and srv.base in err
    assert not (tmp_path / "offline").exists()


def test_a_wrong_file_already_in_place_is_not_overwritten(tmp_path):
    target = tmp_path / "f.gz"
    target.write_bytes(b"not it")
    with pytest.raises(datasets.FetchError, match="exists but its md5"):
        datasets.download("http://127.0.0.1:9/f.gz", target, _md5(b"it"), progress=False)
    assert target.read_bytes() == b"not it"


@pytest.mark.parametrize("status", [403, 404, 500, 503])
def test_an_http_error_falls_back_to_the_next_mirror(tmp_path, status):
    mnist, cifar = _mnist_files(), _cifar_archive()
    with _Server({}, refuse=status) as bad, _Server(mnist) as good:
        source = _sources(good.base, mnist, cifar)["mnist"]._replace(mirrors=(bad.base, good.base))
        assert datasets.fetch("mnist", tmp_path, sources={"mnist": source}, progress=False) == tmp_path
        assert bad.requests == 4 and len(good.ranges) == 4  # each file: refused by the first, served by the second
    assert datasets.load("mnist", root=tmp_path).y_test.tolist() == [0, 1, 2, 3]


def test_every_mirror_refusing_names_each_http_error_and_leaves_nothing(tmp_path):
    mnist, cifar = _mnist_files(), _cifar_archive()
    with _Server({}, refuse=403) as first, _Server({}, refuse=404) as second:
        source = _sources(first.base, mnist, cifar)["mnist"]._replace(mirrors=(first.base, second.base))
        with pytest.raises(datasets.FetchError) as err:
            datasets.fetch("mnist", tmp_path / "d", sources={"mnist": source}, progress=False)
    message = str(err.value)
    assert "\n" not in message and not message.startswith("offline?")
    assert f"{first.base} (HTTP 403" in message and f"{second.base} (HTTP 404" in message
    assert "train-images-idx3-ubyte.gz" in message and str(tmp_path / "d" / "MNIST" / "raw") in message
    assert not (tmp_path / "d").exists()


def test_default_data_folder_of_a_checkout_an_installed_copy_and_lowrank_data(tmp_path, monkeypatch):
    monkeypatch.delenv(datasets.DATA_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    assert datasets.default_data_root() == datasets._REPO_ROOT / "data"  # this checkout
    # an installed copy: the package's parents[2] is site-packages, which holds no pyproject.toml
    monkeypatch.setattr(datasets, "_REPO_ROOT", tmp_path / "site-packages")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert datasets.default_data_root() == tmp_path / "xdg" / "lowrank"
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert datasets.default_data_root() == tmp_path / "home" / ".local" / "share" / "lowrank"
    # the paper files' `data_root: data` and None mean the same folder; LOWRANK_DATA overrides both
    assert datasets.resolve_root("data") == datasets.resolve_root(None) == datasets.default_data_root()
    monkeypatch.setenv(datasets.DATA_ENV, str(tmp_path / "mine"))
    (tmp_path / "data").mkdir()  # a folder `data` where the command runs: LOWRANK_DATA still wins
    assert datasets.resolve_root("data") == datasets.resolve_root(None) == tmp_path / "mine"
    assert datasets.resolve_root("other") == datasets.Path("other")  # relative to the working folder


def test_cli_fetch_without_root_writes_to_lowrank_data(tmp_path, monkeypatch, capsys):
    mnist, cifar = _mnist_files(), _cifar_archive()
    monkeypatch.setenv(datasets.DATA_ENV, str(tmp_path / "env-data"))
    with _Server(mnist) as srv:
        monkeypatch.setitem(datasets.SOURCES, "mnist", _sources(srv.base, mnist, cifar)["mnist"])
        assert cli.main(["data", "fetch", "mnist"]) == 0
    out = capsys.readouterr().out
    assert f"mnist is in {tmp_path / 'env-data'}" in out and "data_root: data" in out
    assert datasets.present("mnist", "data") and datasets.mnist("data").x_train.shape == (6, 1, 28, 28)


def test_lowrank_data_mirrors_replaces_the_mirrors(tmp_path, monkeypatch):
    mnist, cifar = _mnist_files(), _cifar_archive()
    with _Server(mnist) as srv:
        monkeypatch.setitem(datasets.SOURCES, "mnist", _sources("http://127.0.0.1:9/nowhere/", mnist, cifar)["mnist"])
        monkeypatch.setenv(datasets.MIRRORS_ENV, srv.base.rstrip("/"))
        datasets.fetch("mnist", tmp_path, progress=False)
        assert len(srv.ranges) == 4
    assert datasets.present("mnist", tmp_path)


def test_relative_data_root_is_found_below_the_repository_root(tmp_path, monkeypatch):
    monkeypatch.delenv(datasets.DATA_ENV, raising=False)
    monkeypatch.chdir(tmp_path)  # as a notebook runs in its own folder
    assert datasets.resolve_root("data") == datasets._REPO_ROOT / "data"
    assert datasets.resolve_root(None) == datasets._REPO_ROOT / datasets.DEFAULT_DATA_ROOT
    (tmp_path / "data").mkdir()
    assert datasets.resolve_root("data") == datasets.Path("data")
    assert datasets.resolve_root(str(tmp_path)) == tmp_path
