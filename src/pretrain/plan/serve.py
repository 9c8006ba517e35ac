"""`pretrain plan --serve`: the planner as a local web page, answered by the same functions as the CLI.

The page (page.html, one static file: no build step) keeps its state in the URL's query, the CLI's own
`section.key=value` overrides (`/?model.preset=llama3-8b&parallel.gpus=64`), and asks the JSON API:

  GET  /api/plan?QUERY       exactly `pretrain plan QUERY --json` (plan.command.as_json of the same plan)
  GET  /api/fit?QUERY        exactly `pretrain plan QUERY --fit --json` (the default --top 10)
  GET  /api/explain?QUERY    `--explain`'s trail as text
  GET  /api/phases?QUERY     what each phase of a step holds, the bars of the memory chart
  GET  /api/command?QUERY    the equivalent `pretrain plan ...` command and YAML config
  GET  /api/choices          presets, GPUs and each multiple-choice key's values, for the page's menus
  POST /api/hf_config        a pasted config.json -> its model.* overrides
A user fault answers 400 with the CLI's one-line message (the page shows it inline); nothing answers a
traceback. The chart is drawn by plotly.js from the plotly package's own copy, served at /plotly.min.js, so
the page needs no network.

The server is the standard library's ThreadingHTTPServer: seven small routes need no framework, so `pretrain`
gains no dependency for it; threads let a slow --fit run beside the quick plans the page asks as one types.
It binds 127.0.0.1: the planner reads config files named in a query (model.hf_config), not for other hosts.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import time
import traceback
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any, cast
from urllib.parse import parse_qsl, quote, urlsplit

from ..config import SECTIONS, load_config
from ..errors import UsageError, json_kind

HOST = "127.0.0.1"
MAX_BODY = 1 << 20  # a pasted config.json is a few KB


def serve(items: list[str], port: int) -> int:
    """Serve until interrupted; `items` (a config file and overrides) are the page's starting state."""
    if not 0 <= port <= 65535:
        raise UsageError(f"--port: {port} is not a port number; give 1-65535, or 0 for a free one")
    query = start_query(items)
    try:
        server = ThreadingHTTPServer((HOST, port), Handler)
    except OSError as e:
        raise UsageError(f"--port {port}: cannot listen on {HOST} ({e.strerror}); give another --port") from None
    url = f"http://{HOST}:{server.server_address[1]}/" + (f"?{query}" if query else "")
    print(f"pretrain plan: serving the planner at {url} (Ctrl-C stops it)", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0


def start_query(items: list[str]) -> str:
    """The query of a config file and overrides: the file's keys as overrides, then the ones given. Loaded
    once here, so a bad starting config is one line on stderr before the server starts."""
    from ..config.reading import read_yaml, split_override
    from ..config_args import split_items

    path, given = split_items(items)
    load_config(path, given)
    pairs = {
        f"{section}.{key}": _text(value)
        for section, keys in read_yaml(path).items()
        for key, value in cast(dict[str, Any], keys or {}).items()
    }
    pairs.update(split_override(item) for item in given)  # an override replaces the file's value
    return "&".join(f"{quote(k, safe='.')}={quote(v, safe='.,-+/')}" for k, v in pairs.items())


def _text(value: object) -> str:
    """A YAML value as the CLI writes it after `key=`."""
    import yaml

    if isinstance(value, (list, dict)):
        return yaml.safe_dump(value, default_flow_style=True, width=10**9).strip()
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    return str(value)


# --- the answers -----------------------------------------------------------------------------------------


def overrides(query: str) -> list[str]:
    """`a.b=1&c.d=x` -> ["a.b=1", "c.d=x"], as the CLI takes them; a pair without a section is refused."""
    items: list[str] = []
    for key, value in parse_qsl(query, keep_blank_values=True):
        if "." not in key:
            raise UsageError(f"query key {key!r} must name a section: section.key=value (e.g. parallel.gpus=64)")
        items.append(f"{key}={value}")
    return items


def plan_answer(query: str) -> str:
    from . import make_plan
    from .command import as_json

    return as_json(make_plan(load_config(None, overrides(query))))


def fit_answer(query: str) -> str:
    from .command import as_json, fit_result

    return as_json(fit_result(load_config(None, overrides(query)), top=10)[1])


def explain_answer(query: str) -> str:
    from . import plan_with_explain

    return plan_with_explain(load_config(None, overrides(query)))[1].render()


def phases_answer(query: str) -> str:
    """{phase: [[what, bytes], ...]} of the planned config (budget mode: the model it chose), from the same
    plan/phases.py the plan's memory_bytes.phases sum."""
    from . import plan_with_explain, planned_config
    from .budget_mode import budget_requested
    from .model_states import model_state_tensors
    from .phases import step_phases

    config = load_config(None, overrides(query))
    if budget_requested(config):
        config = planned_config(config, plan_with_explain(config, advice=False)[0])
    parts = step_phases(config, model_state_tensors(config), config.train.micro_batch_size)
    return json.dumps({name: [[what, n] for what, n in p] for name, p in parts.items()})


def command_answer(query: str) -> str:
    """The CLI command and a YAML config (sections of the same keys) that plan what the page shows."""
    import yaml

    items = overrides(query)
    load_config(None, items)  # a link that does not plan gives no command
    sections: dict[str, dict[str, Any]] = {}
    for item in items:
        key, value = item.split("=", 1)
        section, name = key.split(".", 1)
        sections.setdefault(section, {})[name] = yaml.safe_load(value) if value else value
    command = " ".join(["pretrain plan", *(shlex.quote(i) for i in items)])
    return json.dumps({"command": command, "yaml": yaml.safe_dump(sections, sort_keys=False)})


def choices_answer(_query: str = "") -> str:
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
        hf = json.loads(body.decode("utf-8"))
    except UnicodeDecodeError:
        raise UsageError(f"the pasted config.json is not UTF-8 text; {fix}") from None
    except json.JSONDecodeError as e:
        raise UsageError(f"the pasted config.json is not valid JSON ({e.msg} at line {e.lineno}); {fix}") from None
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


class Handler(BaseHTTPRequestHandler):
    server_version = "pretrain-plan"

    def do_GET(self) -> None:  # http.server calls it by this name
        url = urlsplit(self.path)
        if url.path == "/":
            self._send(200, resources.files("pretrain.plan").joinpath("page.html").read_bytes(), "text/html")
        elif url.path == "/plotly.min.js":
            self._send(200, _plotly_js(), "text/javascript", cache=True)
        elif url.path in GET:
            self._answer(GET[url.path], url.query)
        else:
            self._send(404, f"no such page: {url.path}".encode(), "text/plain")

    def do_POST(self) -> None:
        if urlsplit(self.path).path != "/api/hf_config":
            return self._send(404, b"no such API", "text/plain")
        size = int(self.headers.get("Content-Length") or 0)
        if size > MAX_BODY:
            return self._send(400, b"the pasted config.json is over 1 MiB; paste the model's config.json", "text/plain")
        self._answer(hf_config_answer, self.rfile.read(size))

    def _answer(self, answer: Callable[[Any], str], arg: Any) -> None:
        start = time.perf_counter()
        try:
            body, status, kind = answer(arg).encode(), 200, "application/json"
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

    def _send(self, status: int, body: bytes, kind: str, cache: bool = False, elapsed: float | None = None) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", f"{kind}; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "max-age=86400" if cache else "no-store")
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
