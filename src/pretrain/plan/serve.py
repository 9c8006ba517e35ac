"""`pretrain plan --serve`: the planner as a local web page, answered by the same functions as the CLI.

The page (page.html, one static file: no build step) keeps its state in the URL's query, the CLI's own
`section.key=value` overrides (`/?model.preset=llama3-8b&parallel.gpus=64`), and asks the JSON API:

  GET  /api/plan?QUERY       exactly `pretrain plan QUERY --json` (plan.answers.as_json of the same plan)
  GET  /api/fit?QUERY        exactly `pretrain plan QUERY --fit --json` (the default --top 10)
  GET  /api/explain?QUERY    `--explain`'s trail as text
  GET  /api/phases?QUERY     what each phase of a step holds, the bars of the memory chart
  GET  /api/command?QUERY    the equivalent `pretrain plan ...` command and YAML config
  GET  /api/choices          presets, GPUs and each multiple-choice key's values, for the page's menus
  POST /api/hf_config        a pasted config.json -> its model.* overrides
A user fault answers 400 with the CLI's one-line message (the page shows it inline); a malformed request a 4xx
with one line; nothing answers a traceback. The chart is drawn by plotly.js from the plotly package's own copy,
served at /plotly.min.js, so the page needs no network.

Safe to leave running (docs/plan.md, "The planner page"): it binds 127.0.0.1 and answers only requests addressed
to it by a loopback name (the Host header), so a web page cannot reach it by DNS rebinding; it reads no file
but those its start named (page_query.py); a POST body is read only up to MAX_BODY.

The server is the standard library's ThreadingHTTPServer: seven small routes need no framework, so `pretrain`
gains no dependency for it; threads let a slow --fit run beside the quick plans the page asks as one types.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import socket
import time
import traceback
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any, cast
from urllib.parse import quote, urlsplit

from ..config import SECTIONS, ResolvedConfig, load_config
from ..errors import UsageError, json_kind
from ..files import NotAConfig, parse_json
from .page_query import Readable, page_config, readable_paths

HOST = "127.0.0.1"
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")  # the Host names a request to this server may carry
MAX_BODY = 1 << 20  # a pasted config.json is a few KB
BODY_SECONDS = 30  # a client that stops sending mid-request frees its thread after this
# A refused body is dropped, never kept, for at most this long and this much before the connection closes.
LINGER_SECONDS, MAX_LINGER_BYTES = 2.0, 64 << 20


def serve(items: list[str], port: int) -> int:
    """Serve until interrupted; `items` (a config file and overrides) are the page's starting state."""
    if not 0 <= port <= 65535:
        raise UsageError(f"--port: {port} is not a port number; give 1-65535, or 0 for a free one")
    query, start = start_query(items)
    try:
        server = PlannerServer((HOST, port), Handler)
    except OSError as e:
        raise UsageError(f"--port {port}: cannot listen on {HOST} ({e.strerror}); give another --port") from None
    server.readable = readable_paths(start)
    url = f"http://{HOST}:{server.server_address[1]}/" + (f"?{query}" if query else "")
    print(f"pretrain plan: serving the planner at {url} (Ctrl-C stops it)", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0


def start_query(items: list[str]) -> tuple[str, ResolvedConfig]:
    """The query of a config file and overrides (the file's keys as overrides, then the ones given), and their
    config. Loaded once here, so a bad starting config is one line on stderr before the server starts."""
    from ..config.reading import read_yaml, split_override
    from ..config_args import split_items

    path, given = split_items(items)
    start = load_config(path, given)
    pairs = {
        f"{section}.{key}": _text(value)
        for section, keys in read_yaml(path).items()
        for key, value in cast(dict[str, Any], keys or {}).items()
    }
    pairs.update(split_override(item) for item in given)  # an override replaces the file's value
    return "&".join(f"{quote(k, safe='.')}={quote(v, safe='.,-+/')}" for k, v in pairs.items()), start


def _text(value: object) -> str:
    """A YAML value as the CLI writes it after `key=`."""
    import yaml

    if isinstance(value, (list, dict)):
        return yaml.safe_dump(value, default_flow_style=True, width=10**9).strip()
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    return str(value)


# --- the answers -----------------------------------------------------------------------------------------


def plan_answer(query: str, readable: Readable) -> str:
    from . import make_plan
    from .answers import as_json

    return as_json(make_plan(page_config(query, readable)[1]))


def fit_answer(query: str, readable: Readable) -> str:
    from .answers import as_json, fit_result

    return as_json(fit_result(page_config(query, readable)[1], top=10)[1])


def explain_answer(query: str, readable: Readable) -> str:
    from . import plan_with_explain

    return plan_with_explain(page_config(query, readable)[1])[1].render()


def phases_answer(query: str, readable: Readable) -> str:
    """{phase: [[what, bytes], ...]} of the planned config (budget mode: the model it chose), from the same
    plan/phases.py the plan's memory_bytes.phases sum."""
    from . import plan_with_explain, planned_config
    from .budget_mode import budget_requested
    from .model_states import model_state_tensors
    from .phases import step_phases

    config = page_config(query, readable)[1]
    if budget_requested(config):
        config = planned_config(config, plan_with_explain(config, advice=False)[0])
    parts = step_phases(config, model_state_tensors(config), config.train.micro_batch_size)
    return json.dumps({name: [[what, n] for what, n in p] for name, p in parts.items()})


def command_answer(query: str, readable: Readable) -> str:
    """The CLI command and a YAML config (sections of the same keys) that plan what the page shows."""
    import yaml

    items = page_config(query, readable)[0]  # a link that does not plan gives no command
    sections: dict[str, dict[str, Any]] = {}
    for item in items:
        key, value = item.split("=", 1)
        section, name = key.split(".", 1)
        sections.setdefault(section, {})[name] = _yaml_value(value)
    command = " ".join(["pretrain plan", *(shlex.quote(i) for i in items)])
    return json.dumps({"command": command, "yaml": yaml.safe_dump(sections, sort_keys=False)})


def _yaml_value(text: str) -> Any:
    """A value as the YAML config holds it: the text read as YAML, as the CLI reads a list or a mapping; text
    YAML cannot read (`'abc`) stays the string it is to the CLI (only a string key takes it: the config loaded)."""
    import yaml

    if not text:
        return text
    try:
        return yaml.safe_load(text)
    except (yaml.YAMLError, RecursionError, ValueError):  # ValueError: a date 2024-13-45, 5,000 digits
        return text


def choices_answer(_query: str = "", _readable: Readable = frozenset()) -> str:
    from ..gpus import CATALOG
    from ..presets import PRESETS

    menus = {
        f"{s}.{f.name}": [str(c) for c in f.metadata["choices"]]
        for s, cls in SECTIONS.items()
        for f in dataclasses.fields(cls)
        if f.metadata.get("choices")
    }
    return json.dumps({"presets": list(PRESETS), "gpus": list(CATALOG), "menus": menus})


def hf_config_answer(body: bytes) -> str:
    """A pasted config.json -> {"model.key": "value"}: the overrides that plan it without a file."""
    from ..hf_config import model_keys

    fix = "paste a Hugging Face config.json"
    try:
        hf = parse_json(body)
    except UnicodeDecodeError:
        raise UsageError(f"the pasted config.json is not UTF-8 text; {fix}") from None
    except json.JSONDecodeError as e:
        raise UsageError(f"the pasted config.json is not valid JSON ({e.msg} at line {e.lineno}); {fix}") from None
    except NotAConfig as e:
        raise UsageError(f"the pasted config.json is not a config ({e}); {fix}") from None
    if not isinstance(hf, dict):
        raise UsageError(f"the pasted config.json holds {json_kind(hf)}, not a mapping of keys; {fix}")
    keys = model_keys(cast(dict[str, Any], hf), "the pasted config.json")
    return json.dumps({f"model.{k}": _text(v) for k, v in keys.items()})


GET = {
    "/api/plan": plan_answer,
    "/api/fit": fit_answer,
    "/api/explain": explain_answer,
    "/api/phases": phases_answer,
    "/api/command": command_answer,
    "/api/choices": choices_answer,
}


class PlannerServer(ThreadingHTTPServer):
    """A thread per request (daemon threads: one still planning does not hold Ctrl-C), and what they may read."""

    readable: Readable = frozenset()  # readable_paths of the start, set before serving


class Handler(BaseHTTPRequestHandler):
    server_version = "pretrain-plan"
    _linger = False  # a request refused with its body unread: see finish
    timeout = BODY_SECONDS  # on the socket: a request line, headers or body that stop coming end the connection
    # http.server's own refusals (a request line over 64 KiB, too many headers, bad syntax): one line, not HTML
    error_message_format = "%(message)s: %(explain)s"
    error_content_type = "text/plain; charset=utf-8"

    def parse_request(self) -> bool:
        """http.server's parsing, and any method but GET and POST refused with a 405 (not its 501)."""
        if not super().parse_request():
            return False
        if self.command not in ("GET", "POST"):
            self.close_connection = True
            self.send_error(405, "Method Not Allowed", "the planner page answers GET and POST")
            return False
        return True

    def do_GET(self) -> None:  # http.server calls it by this name
        if not self._addressed_to_us():
            return
        url = urlsplit(self.path)
        if url.path == "/":
            self._send(200, resources.files("pretrain.plan").joinpath("page.html").read_bytes(), "text/html")
        elif url.path == "/plotly.min.js":
            self._send(200, _plotly_js(), "text/javascript", cache=True)
        elif url.path in GET:
            self._answer(GET[url.path], url.query, cast(PlannerServer, self.server).readable)
        else:
            self._send(404, b"no such page", "text/plain")

    def do_POST(self) -> None:
        if not self._addressed_to_us():
            return
        if urlsplit(self.path).path != "/api/hf_config":
            return self._refuse_body(404, "no such API")
        body = self._body()
        if body is not None:
            self._answer(hf_config_answer, body)

    def _addressed_to_us(self) -> bool:
        """Only a request to this server by a loopback name, in origin form (/path): a page of another site that
        resolves its own name to 127.0.0.1 (DNS rebinding) sends its name as Host and is refused."""
        port: int = cast(PlannerServer, self.server).server_port
        names = {f"{name}:{port}" for name in LOOPBACK_NAMES} | set(LOOPBACK_NAMES if port == 80 else ())
        hosts = self.headers.get_all("Host") or []
        if len(hosts) == 1 and hosts[0].strip().lower() in names and self.path.startswith("/"):
            return True
        self._refuse_body(403, f"the planner page answers only requests to http://{HOST}:{port}/ or localhost:{port}")
        return False

    def _body(self) -> bytes | None:
        """The request's body, read only when its Content-Length is one number of at most MAX_BODY; otherwise a 4xx
        is answered and None returned (the connection closed: an unread body must not be taken for a request)."""
        lengths = self.headers.get_all("Content-Length") or []
        if self.headers.get("Transfer-Encoding") or not lengths:
            return self._refuse_body(411, "send the pasted config.json with a Content-Length (not chunked)")
        if len(set(lengths)) > 1 or not re.fullmatch(r"[0-9]{1,12}", lengths[0].strip()):
            return self._refuse_body(400, "the Content-Length is not one number of bytes")
        size = int(lengths[0])
        if size > MAX_BODY:
            return self._refuse_body(413, "the pasted config.json is over 1 MiB; paste the model's config.json")
        try:
            body = self.rfile.read(size)
        except TimeoutError:
            return self._refuse_body(408, f"the body did not come within {BODY_SECONDS} s")
        if len(body) < size:
            return self._refuse_body(400, "the body is shorter than its Content-Length")
        return body

    def _refuse_body(self, status: int, line: str) -> None:
        self.close_connection = self._linger = True
        self._send(status, line.encode(), "text/plain", close=True)

    def finish(self) -> None:
        """After a refusal, a body still coming is read and dropped for a moment (a "lingering close"): closed
        with unread bytes, the socket would be reset, and a client still sending would lose the answer."""
        super().finish()
        if not self._linger:
            return
        try:
            self.connection.shutdown(socket.SHUT_WR)  # the answer is complete
            self.connection.settimeout(0.2)
            deadline, dropped = time.monotonic() + LINGER_SECONDS, 0
            while (
                time.monotonic() < deadline and dropped < MAX_LINGER_BYTES and (chunk := self.connection.recv(1 << 16))
            ):
                dropped += len(chunk)
        except OSError:  # the client closed, reset, or went quiet: nothing more to wait for
            pass

    def _answer(self, answer: Callable[..., str], *args: Any) -> None:
        start = time.perf_counter()
        try:
            body, status, kind = answer(*args).encode(), 200, "application/json"
        except UsageError as e:  # the CLI's one line, shown beside the inputs
            body, status, kind = str(e).encode(), 400, "text/plain"
        except Exception as e:  # noqa: BLE001 - a bug: one line on the page, the traceback in the terminal
            traceback.print_exc()
            body, status, kind = (
                f"internal error ({type(e).__name__}: {e}); please report it".encode(),
                500,
                "text/plain",
            )
        if answer is explain_answer and status == 200:
            kind = "text/plain"
        self._send(status, body, kind, elapsed=time.perf_counter() - start)

    def _send(
        self,
        status: int,
        body: bytes,
        kind: str,
        cache: bool = False,
        elapsed: float | None = None,
        close: bool = False,
    ) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", f"{kind}; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "max-age=86400" if cache else "no-store")
            if close:  # a body left unread must not be taken for the next request
                self.send_header("Connection", "close")
            if elapsed is not None:  # the page shows how long the planner took
                self.send_header("Server-Timing", f"plan;dur={1000 * elapsed:.1f}")
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):  # the tab was closed or reloaded mid-answer
            pass

    def log_message(self, format: str, *args: Any) -> None:  # quiet: one line per keystroke would bury the URL
        pass


_PLOTLY: list[bytes] = []  # read once: 4.7 MB


def _plotly_js() -> bytes:
    """plotly.js as the plotly package ships it (its offline HTML embeds the same file)."""
    if not _PLOTLY:
        _PLOTLY.append(resources.files("plotly").joinpath("package_data/plotly.min.js").read_bytes())
    return _PLOTLY[0]
