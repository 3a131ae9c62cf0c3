"""`lowrank data fetch`: downloads checked against published md5 sums, resumed with HTTP Range,
written atomically; tested against an HTTP server on 127.0.0.1 (a thread of this test) that serves
small generated archives, a truncated and a corrupted one, and cuts a transfer short on request."""

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


def _cifar_archive() -> bytes:
    rng = np.random.default_rng(1)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
            batch = {b"data": rng.integers(0, 256, (3, 3072), dtype=np.uint8), b"labels": [0, 1, 2]}
            raw = pickle.dumps(batch)
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))
    return buf.getvalue()


class _Server:
    """Serves `files` on 127.0.0.1 with Range support; `cut[name] = n` sends only n bytes of the body
    once (with the full Content-Length), as a dropped connection does. Records every Range header."""

    def __init__(self, files: dict):
        self.files, self.cut, self.ranges, self.honour_range = dict(files), {}, [], True
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
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

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}/"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def _md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def _sources(base: str, mnist: dict, cifar: bytes) -> dict:
    """The real source table's layout with the generated files' md5 sums and the local server."""
    real_m, real_c = datasets.SOURCES["mnist"], datasets.SOURCES["cifar10"]
    return {"mnist": real_m._replace(files=tuple((n, _md5(b)) for n, b in mnist.items()), mirrors=(base,)),
            "cifar10": real_c._replace(files=(("cifar-10-python.tar.gz", _md5(cifar)),), mirrors=(base,))}


def _all_files(root):
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def test_the_real_sources_are_the_published_ones():
    m, c = datasets.SOURCES["mnist"], datasets.SOURCES["cifar10"]
    assert dict(m.files)["train-images-idx3-ubyte.gz"] == "f68b3c2dcbeaaa9fbdd348bbdeb94873"
    assert dict(m.files)["t10k-labels-idx1-ubyte.gz"] == "ec29112dd5afa0611ce80d1b7f02629c"
    assert c.files == (("cifar-10-python.tar.gz", "c58f30108f718f92721af3b95e74349a"),)
    assert all(b.endswith("/") for b in m.mirrors + c.mirrors)


def test_fetch_mnist_and_cifar10_then_load_them(tmp_path):
    mnist, cifar = _mnist_files(), _cifar_archive()
    with _Server({**mnist, "cifar-10-python.tar.gz": cifar}) as srv:
        sources = _sources(srv.base, mnist, cifar)
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
            with pytest.raises(datasets.FetchError, match=f"is not the published {_md5(cifar)}"):
                datasets.fetch("cifar10", tmp_path, sources=_sources(srv.base, mnist, cifar), progress=False)
        assert _all_files(tmp_path) == [], "a failed download left a file"


def test_a_cut_transfer_keeps_only_the_hidden_partial_and_resumes_with_range(tmp_path):
    mnist, cifar = _mnist_files(), _cifar_archive()
    with _Server({"cifar-10-python.tar.gz": cifar}) as srv:
        sources = _sources(srv.base, mnist, cifar)
        srv.cut["cifar-10-python.tar.gz"] = 1000
        with pytest.raises(datasets.FetchError, match=f"stopped at 1000 of {len(cifar)} bytes.*resume"):
            datasets.fetch("cifar10", tmp_path, sources=sources, progress=False)
        assert _all_files(tmp_path) == [".cifar-10-python.tar.gz.part"]
        datasets.fetch("cifar10", tmp_path, sources=sources, progress=False)
        assert srv.ranges == [("cifar-10-python.tar.gz", None), ("cifar-10-python.tar.gz", "bytes=1000-")]
    assert (tmp_path / "cifar-10-python.tar.gz").read_bytes() == cifar
    assert datasets.load("cifar10", root=tmp_path).x_test.shape == (3, 3, 32, 32)


def test_cli_fetch_and_offline_message(tmp_path, monkeypatch, capsys):
    mnist, cifar = _mnist_files(), _cifar_archive()
    with _Server(mnist) as srv:
        monkeypatch.setitem(datasets.SOURCES, "mnist", _sources(srv.base, mnist, cifar)["mnist"])
        assert cli.main(["data", "fetch", "mnist", "--root", str(tmp_path / "d")]) == 0
    assert "mnist is in" in capsys.readouterr().out
    assert len(_all_files(tmp_path / "d" / "MNIST" / "raw")) == 4
    # a port nobody listens on: the server above has closed
    monkeypatch.setitem(datasets.SOURCES, "mnist", datasets.SOURCES["mnist"]._replace(files=(("x.gz", "0" * 32),)))
    assert cli.main(["data", "fetch", "mnist", "--root", str(tmp_path / "offline")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("lowrank: error: offline?")
    assert "x.gz" in err and str(tmp_path / "offline" / "MNIST" / "raw") in err and srv.base in err
    assert not (tmp_path / "offline").exists()


def test_a_wrong_file_already_in_place_is_not_overwritten(tmp_path):
    target = tmp_path / "f.gz"
    target.write_bytes(b"not it")
    with pytest.raises(datasets.FetchError, match="exists but its md5"):
        datasets.download("http://127.0.0.1:9/f.gz", target, _md5(b"it"), progress=False)
    assert target.read_bytes() == b"not it"


def test_relative_data_root_is_found_below_the_repository_root(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # as a notebook runs in its own folder
    assert datasets.resolve_root("data") == datasets._REPO_ROOT / "data"
    assert datasets.resolve_root(None) == datasets._REPO_ROOT / datasets.DEFAULT_DATA_ROOT
    (tmp_path / "data").mkdir()
    assert datasets.resolve_root("data") == datasets.Path("data")
    assert datasets.resolve_root(str(tmp_path)) == tmp_path


def test_a_server_that_ignores_range_restarts_the_download(tmp_path):
    mnist, cifar = _mnist_files(), _cifar_archive()
    (tmp_path / ".cifar-10-python.tar.gz.part").write_bytes(b"stale bytes of an earlier attempt")
    with _Server({"cifar-10-python.tar.gz": cifar}) as srv:
        srv.honour_range = False
        datasets.fetch("cifar10", tmp_path, sources=_sources(srv.base, mnist, cifar), progress=False)
        assert srv.ranges == [("cifar-10-python.tar.gz", "bytes=33-")]
    assert (tmp_path / "cifar-10-python.tar.gz").read_bytes() == cifar
    assert datasets.present("cifar10", tmp_path) and not datasets.present("mnist", tmp_path)


def test_a_complete_partial_file_is_verified_and_renamed_without_a_body(tmp_path):
    mnist, cifar = _mnist_files(), _cifar_archive()
    (tmp_path / ".cifar-10-python.tar.gz.part").write_bytes(cifar)  # stopped between download and rename
    with _Server({"cifar-10-python.tar.gz": cifar}) as srv:
        datasets.fetch("cifar10", tmp_path, sources=_sources(srv.base, mnist, cifar), progress=False)
        assert srv.ranges == [("cifar-10-python.tar.gz", f"bytes={len(cifar)}-")]  # answered 416
    assert (tmp_path / "cifar-10-python.tar.gz").read_bytes() == cifar
