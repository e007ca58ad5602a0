"""Every bench runs from a clean ``make`` venv: it imports only the standard library, the
project and what the requirements files pin, and no handler hides an import error."""

from __future__ import annotations

import ast
import http.server
import importlib.metadata
import json
import re
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from bench.e2e import API_ERRORS, Api, ApiError

ROOT = Path(__file__).resolve().parents[2]
BENCHES = sorted(p for p in (ROOT / "bench").glob("*.py") if p.name != "__init__.py")
#: Top-level packages of this repository.
FIRST_PARTY = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()} | {"bench"}
#: Sibling scripts a bench imports from its own folder or tools/ (bench/e2e.py's set-up,
#: tools/slurm_cluster.py), which the bench puts on sys.path itself.
FIRST_PARTY |= {p.stem for p in (ROOT / "bench").glob("*.py")}
FIRST_PARTY |= {p.stem for p in (ROOT / "tools").glob("*.py")}


def _imported_modules(path: Path) -> set[str]:
    """The top-level names of every import in the file, lazy ones (inside functions) too."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name.partition(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.partition(".")[0])
    return names - {"__future__"}


def _pinned_distributions() -> set[str]:
    """Distribution names listed in requirements.txt and requirements-dev.txt."""
    names = set()
    for name in ("requirements.txt", "requirements-dev.txt"):
        for line in (ROOT / name).read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if not line or line.startswith("-"):
                continue
            names.add(_normalize(re.split(r"[\[<>=!~ ;]", line, maxsplit=1)[0]))
    return names


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_the_benches_import_only_what_the_requirements_pin():
    pinned = _pinned_distributions()
    providers = importlib.metadata.packages_distributions()
    unlisted = {}
    for path in BENCHES:
        for module in _imported_modules(path):
            if module in sys.stdlib_module_names or module in FIRST_PARTY:
                continue
            dists = {_normalize(d) for d in providers.get(module, [])}
            if not dists & pinned:
                unlisted.setdefault(path.name, []).append(module)
    assert unlisted == {}, f"bench modules import packages no requirements file lists: {unlisted}"


def test_every_bench_module_imports_from_the_venv():
    """Import only (nothing runs): a module-level import of a package the venv lacks fails."""
    modules = [f"bench.{p.stem}" for p in BENCHES]
    code = "import importlib, sys\nfor name in sys.argv[1:]:\n    importlib.import_module(name)\n"
    result = subprocess.run(
        [sys.executable, "-c", code, *modules],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]


def _swallowing_handlers(path: Path) -> list[str]:
    """``except Exception`` / ``BaseException`` / bare ``except`` that do not re-raise, and
    ``contextlib.suppress(Exception)``: each would hide an ImportError or a NameError."""
    found = []
    broad = {"Exception", "BaseException"}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ExceptHandler):
            types = node.type.elts if isinstance(node.type, ast.Tuple) else [node.type]
            catches_all = node.type is None or any(
                isinstance(t, ast.Name) and t.id in broad for t in types
            )
            reraises = any(isinstance(n, ast.Raise) for n in ast.walk(node))
            if catches_all and not reraises:
                found.append(f"{path.name}:{node.lineno}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "suppress"
            and any(isinstance(a, ast.Name) and a.id in broad for a in node.args)
        ):
            found.append(f"{path.name}:{node.lineno}")
    return found


def test_no_bench_handler_swallows_every_exception():
    found = [where for path in BENCHES for where in _swallowing_handlers(path)]
    assert found == []


# --- the benches' API client, on the standard library -----------------------------------------


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen: list[dict] = []

    def _answer(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):  # noqa: N802 - http.server's name
        self.seen.append({"path": self.path, "auth": self.headers.get("Authorization")})
        if self.path.startswith("/api/v1/missing"):
            self._answer(404, {"detail": "Not found."})
        else:
            self._answer(200, {"path": self.path})

    def do_POST(self):  # noqa: N802 - http.server's name
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length))
        self.seen.append({"path": self.path, "body": body, "type": self.headers["Content-Type"]})
        self._answer(201, {"id": 7, "echo": body})

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    _Handler.seen = []
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_the_api_client_sends_the_token_lists_and_json(server):
    api = Api(server, "tok")
    got = api.get("jobs/", state=["PENDING", "RUNNING"], page_size=1)
    assert got == {"path": "/api/v1/jobs/?state=PENDING&state=RUNNING&page_size=1"}
    assert _Handler.seen[-1]["auth"] == "Token tok"
    assert api.post("jobs/", {"name": "x"}) == {"id": 7, "echo": {"name": "x"}}
    assert _Handler.seen[-1]["type"] == "application/json"
    # A page's "next" is a full URL.
    assert api.get(f"{server}/api/v1/jobs/?page=2") == {"path": "/api/v1/jobs/?page=2"}


def test_the_api_client_raises_what_the_waiting_loops_catch(server):
    api = Api(server, "tok")
    with pytest.raises(ApiError) as error:
        api.get("missing/")
    assert error.value.status == 404
    assert isinstance(error.value, API_ERRORS)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens there once closed
    with pytest.raises(API_ERRORS):
        Api(f"http://127.0.0.1:{port}", "tok").get("nodes/")
