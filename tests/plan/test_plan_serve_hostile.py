"""`pretrain plan --serve` against hostile requests, as real HTTP on a real socket to one running server: only
loopback Host names are answered (DNS rebinding), only the files its start named are read, every malformed
request is a 4xx of one line, and nothing answers 500 or leaves a traceback in its terminal."""

import json
import os
import socket
import time
from urllib.parse import quote, urlsplit

import pytest
import yaml

from support import run_cli, serve_planner

# A config.json of the start, and another one that is as valid: a query naming the second must not plan it.
HF = {
    "model_type": "llama",
    "vocab_size": 32000,
    "hidden_size": 512,
    "intermediate_size": 1408,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "max_position_embeddings": 2048,
}


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    """The server, started with a config.json and a data.dir whose meta.json is a FIFO (made after the start,
    as a user's mistake would): {"port", "dir", "proc", "query"}; its stderr is checked for tracebacks at the
    end."""
    folder = tmp_path_factory.mktemp("page")
    (folder / "config.json").write_text(json.dumps(HF))
    (folder / "dataset").mkdir()
    proc, url = serve_planner(f"model.hf_config={folder / 'config.json'}", f"data.dir={folder / 'dataset'}")
    os.mkfifo(folder / "dataset" / "meta.json")
    yield {"port": urlsplit(url).port, "dir": folder, "query": urlsplit(url).query}
    proc.terminate()
    _, stderr = proc.communicate(timeout=10)
    assert "Traceback" not in stderr, stderr


def request(port: int, head: str, body: bytes = b"", close_write: bool = False, wait: float = 20) -> tuple[int, str]:
    """One raw request (`head` without its blank line) -> (status, body). The connection stays open for
    writing unless `close_write`: a server that waits for more than it was sent times out here."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait) as s:
        try:
            s.sendall(head.encode("latin-1") + b"\r\n\r\n" + body)
        except (BrokenPipeError, ConnectionResetError):  # refused before all was sent: its answer is there
            pass
        if close_write:
            s.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := s.recv(1 << 16):
            answer += chunk
    status_line, _, rest = answer.partition(b"\r\n")
    return int(status_line.split()[1]), rest.partition(b"\r\n\r\n")[2].decode()


def get(port: int, target: str, host: str | None = None) -> tuple[int, str]:
    return request(port, f"GET {target} HTTP/1.1\r\nHost: {host or f'127.0.0.1:{port}'}\r\nConnection: close")


def post(port: int, body: bytes, length: str | None = None, **kw) -> tuple[int, str]:
    size = "" if length == "" else f"\r\nContent-Length: {len(body) if length is None else length}"
    return request(port, f"POST /api/hf_config HTTP/1.1\r\nHost: 127.0.0.1:{port}{size}", body, **kw)


def one_line(status: int, text: str, expected: int) -> str:
    assert status == expected and text and "\n" not in text and "Traceback" not in text, (status, text)
    return text


def test_only_loopback_host_names_are_answered(page):
    port = page["port"]
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"LOCALHOST:{port}", f"[::1]:{port}"):
        assert get(port, "/api/choices", host)[0] == 200, host
    secret = page["dir"] / "config.json"  # a file the page may read: the Host alone refuses the request
    for host in (
        f"evil.example:{port}",
        "evil.example",
        f"127.0.0.1:{port + 1}",
        "127.0.0.1",
        f"127.0.0.1.evil:{port}",
    ):
        for target in ("/", f"/api/plan?model.hf_config={secret}", "/plotly.min.js"):
            text = one_line(*get(port, target, host), 403)
            assert "answers only requests to" in text
    # no Host, two of them, a request target naming another host
    one_line(*request(port, "GET /api/choices HTTP/1.0"), 403)
    one_line(*request(port, f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nHost: evil.example:{port}"), 403)
    one_line(*request(port, f"GET http://evil.example/ HTTP/1.1\r\nHost: 127.0.0.1:{port}"), 403)
    one_line(
        *request(port, f"POST /api/hf_config HTTP/1.1\r\nHost: evil.example:{port}\r\nContent-Length: 2", b"{}"), 403
    )


def test_the_page_reads_only_the_paths_its_start_named(page, tmp_path):
    port, start = page["port"], page["dir"]
    assert get(port, f"/api/plan?{page['query']}")[0] == 200  # its own config.json and data.dir
    other = tmp_path / "other.json"
    other.write_text(json.dumps({**HF, "hidden_size": 1024}))  # a valid config.json: read, it would plan
    (tmp_path / "data").mkdir()
    (tmp_path / "tasks.jsonl").write_text('{"context": "a", "choices": ["b", "c"], "gold": 0}\n')
    refused = {
        "model.hf_config": [str(other), str(tmp_path), str(tmp_path / "missing.json"), "/dev/zero"],
        "hardware.profile": [str(other), str(tmp_path / "missing.json")],
        "data.dir": [str(tmp_path / "data"), str(tmp_path / "missing")],
        "data.mixture": [f"[{{dir: {tmp_path / 'data'}, weight: 1}}]", f"[{{dir: {tmp_path / 'no'}, weight: 1}}]"],
        "run.eval_tasks": [str(tmp_path / "tasks.jsonl"), str(tmp_path / "missing.jsonl")],
    }
    for key, values in refused.items():
        texts = set()
        for value in values:
            for route in ("plan", "fit", "explain", "phases", "command"):
                query = f"model.preset=gpt2&{key}={quote(value)}" if key != "model.hf_config" else f"{key}={value}"
                texts.add(one_line(*get(port, f"/api/{route}?{query}"), 400))
        # one line per key whatever the file: it says neither whether it exists nor what it holds
        assert len(texts) == 1, texts
        (text,) = texts
        assert text.startswith(f"{key}: the planner page reads only the files named when it was started")
        assert str(tmp_path) not in text
    # the start's own paths stay readable, under their own keys only
    assert get(port, f"/api/plan?model.hf_config={start / 'config.json'}")[0] == 200
    one_line(*get(port, f"/api/plan?model.preset=gpt2&hardware.profile={start / 'config.json'}"), 400)


def test_a_fifo_the_start_named_does_not_block_the_page(page):
    # data.dir/meta.json is a FIFO with no writer: opened for reading, it would wait forever (the request would
    # time out here); the plan goes on without the data, as for a directory not prepared yet
    began = time.perf_counter()
    status, text = get(page["port"], f"/api/explain?{page['query']}")
    assert status == 200 and "meta.json is not a finished `pretrain prepare` output yet" in text
    assert time.perf_counter() - began < 10


def test_a_post_body_is_read_only_within_its_stated_length(page):
    port = page["port"]
    body = json.dumps(HF).encode()
    assert post(port, body)[0] == 200
    big = b"x" * (3 << 20)
    # a negative, non-numeric, doubled or absent length: refused before reading anything
    for length in ("-1", "abc", "+5", "0x10", "1_0", "99999999999999999999"):
        assert "Content-Length" in one_line(*post(port, big, length), 400), length
    one_line(*post(port, body, ""), 411)
    one_line(
        *request(
            port,
            f"POST /api/hf_config HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 5\r\nContent-Length: 9",
            b"{}",
        ),
        400,
    )
    one_line(
        *request(
            port,
            f"POST /api/hf_config HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nTransfer-Encoding: chunked",
            b"2\r\n{}\r\n0\r\n\r\n",
        ),
        411,
    )
    assert "over 1 MiB" in one_line(*post(port, big), 413)
    assert "shorter" in one_line(*post(port, body, str(len(body) + 100), close_write=True), 400)


def test_malformed_json_and_methods_are_4xx_lines(page):
    port = page["port"]
    assert "nested too deeply" in one_line(*post(port, b"[" * 100_000 + b"]" * 100_000), 400)
    assert "digits" in one_line(*post(port, b'{"model_type": "llama", "hidden_size": ' + b"9" * 5000 + b"}"), 400)
    one_line(*post(port, b"\xff\xfe{}"), 400)
    # YAML in a query, nested past the parser's recursion (500 deep: PyYAML takes seconds on thousands)
    for key in ("data.mixture", "model.rope_scaling"):
        assert "nested too deeply" in one_line(*get(port, f"/api/plan?model.preset=gpt2&{key}={'[' * 500}"), 400)
    for method in ("PUT", "DELETE", "OPTIONS", "PATCH", "FOO"):
        one_line(*request(port, f"{method} / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close"), 405)
    one_line(*get(port, "/api/plan?" + "a" * 70_000), 414)  # http.server's own refusal, as one line
    one_line(*get(port, "/nothing"), 404)


@pytest.mark.parametrize(
    "value",
    ["'abc", "2024-13-45", "9" * 5000, "{a: '", "\x00", "%ff", "*alias", "!!python/object:os.system"],
)
def test_any_value_of_any_key_is_an_answer_or_a_400_line(page, value):
    """Each key of the schema with a value YAML cannot read, or reads to a surprise: /api/command (which reads
    the values as YAML) and /api/plan answer 200 or one 400 line, never 500."""
    from dataclasses import fields

    from pretrain.config import SECTIONS

    port = page["port"]
    keys = [f"{s}.{f.name}" for s, cls in SECTIONS.items() for f in fields(cls)]
    for i, key in enumerate(keys):
        route = ("command", "plan")[i % 2]
        status, text = get(port, f"/api/{route}?model.preset=gpt2&{key}={quote(value)}")
        assert status == 200 or (status == 400 and text and "\n" not in text), (key, status, text)


def test_the_command_of_a_value_yaml_cannot_read_plans_the_same(page, tmp_path):
    query = "model.preset=gpt2&parallel.gpus=8&run.dir='abc"
    status, text = get(page["port"], f"/api/command?{quote(query, safe='=&')}")
    assert status == 200, text
    shown = json.loads(text)
    (tmp_path / "page.yaml").write_text(shown["yaml"])
    from_yaml = run_cli("plan", str(tmp_path / "page.yaml"), "--json")
    from_command = run_cli("plan", *query.split("&"), "--json")
    assert from_yaml.returncode == 0 and from_yaml.stdout == from_command.stdout
    assert yaml.safe_load(shown["yaml"])["run"]["dir"] == "'abc"  # the string the CLI reads
