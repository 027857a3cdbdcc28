"""Load a running mlx-lm-compatible server (``python -m mlx_w8a8.server`` or
``mlx_lm.server``) with concurrent streaming requests; report time to first token and
output tokens/s per concurrency level.

Usage::

    python -m mlx_w8a8.server --model path/to/w8a8-folder --port 8080 &
    python bench/serve_bench.py --url http://127.0.0.1:8080 --concurrency 1,8,32 \\
        --max-tokens 128 --json serve.json

Each level sends ``--requests`` requests (default: twice the concurrency, at most
``MAX_REQUESTS``) from that many client threads, greedy (temperature 0), streaming,
with ``stream_options.include_usage`` so the server reports the tokens it generated.
Each prompt starts with its request's number, so mlx-lm's prompt cache cannot answer
one request from another's. Per level it prints the median and 90th-percentile time to
first token (request sent to first text chunk), the median per-request decode rate
(tokens after the first over the time after the first) and the aggregate output
tokens/s (all tokens over the level's wall time): the last is what batched decode
raises.

Loopback only: the URL's host must resolve to loopback addresses (a load generator
pointed elsewhere is a denial of service); anything else is refused with exit status 2.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import socket
import statistics
import sys
import time
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

PROG = "bench/serve_bench.py"
MAX_REQUESTS = 512  # per level: a bound on what one run sends
ENDPOINTS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


class Result(NamedTuple):
    """One request.

    Args:
        ttft: seconds from sending the request to the first chunk holding text.
        seconds: seconds from sending the request to the end of the stream.
        tokens: output tokens (the server's usage count, else the text chunks).
        error: the error's text, or ``None``.
    """

    ttft: float | None
    seconds: float
    tokens: int
    error: str | None = None


def check_loopback(url: str) -> str:
    """The URL without a trailing ``/``, after checking its host is loopback only.

    Raises:
        ValueError: for a URL that is not ``http://host[:port]`` or whose host resolves
            to any address that is not loopback.
    """
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"[{PROG}] --url must be http://HOST[:PORT], got {url!r}")
    try:
        infos = socket.getaddrinfo(parts.hostname, parts.port or 80, type=socket.SOCK_STREAM)
    except socket.gaierror as error:
        raise ValueError(f"[{PROG}] cannot resolve {parts.hostname!r}: {error}") from None
    addresses = {info[4][0] for info in infos}
    outside = sorted(a for a in addresses if not ipaddress.ip_address(a.split("%")[0]).is_loopback)
    if outside:
        raise ValueError(
            f"[{PROG}] --url host {parts.hostname!r} resolves to non-loopback addresses "
            f"{outside}; this load generator only targets a server on this machine"
        )
    return url.rstrip("/")


def parse_levels(text: str, flag: str = "--concurrency", prog: str = PROG) -> list[int]:
    """``"1,8,32"`` -> ``[1, 8, 32]``.

    Args:
        text: the option's value.
        flag, prog: the option and the command its error names.

    Raises:
        ValueError: for an empty list or a level < 1.
    """
    try:
        levels = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        levels = []
    if not levels or min(levels) < 1:
        raise ValueError(f"[{prog}] {flag} must be positive ints like 1,8,32, got {text!r}")
    return levels


def _body(endpoint: str, prompt: str, max_tokens: int) -> dict:
    body = {"max_tokens": max_tokens, "temperature": 0.0, "stream": True,
            "stream_options": {"include_usage": True}}
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    return body


def _text(chunk: dict, endpoint: str) -> str:
    choices = chunk.get("choices") or []
    if not choices:
        return ""
    if endpoint == "chat":
        return (choices[0].get("delta") or {}).get("content") or ""
    return choices[0].get("text") or ""


def one_request(url: str, endpoint: str, prompt: str, max_tokens: int,
                timeout: float) -> Result:
    """Send one streaming request and time it (errors are returned, not raised)."""
    data = json.dumps(_body(endpoint, prompt, max_tokens)).encode()
    request = urllib.request.Request(url + ENDPOINTS[endpoint], data=data,
                                     headers={"Content-Type": "application/json"})
    start = time.perf_counter()
    ttft, chunks, usage = None, 0, None
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            for raw in response:
                line = raw.decode("utf-8", errors="replace").strip()
                if not line.startswith("data:"):
                    continue  # blank separators and ": keepalive" comments
                payload = line[len("data:"):].strip()
                if payload == "[DONE]":
                    break
                chunk = json.loads(payload)
                if chunk.get("usage") and not chunk.get("choices"):
                    usage = chunk["usage"].get("completion_tokens")
                elif _text(chunk, endpoint):
                    chunks += 1
                    if ttft is None:
                        ttft = time.perf_counter() - start
    except (OSError, ValueError) as error:
        return Result(ttft, time.perf_counter() - start, chunks, f"{type(error).__name__}: {error}")
    return Result(ttft, time.perf_counter() - start, usage if usage is not None else chunks)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def run_level(url: str, endpoint: str, concurrency: int, requests: int, prompt: str,
              max_tokens: int, timeout: float) -> dict:
    """Send ``requests`` requests from ``concurrency`` threads; a summary dict."""
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        results = list(pool.map(
            lambda i: one_request(url, endpoint, f"{i}: {prompt}", max_tokens, timeout),
            range(requests)))
    wall = time.perf_counter() - start
    done = [r for r in results if r.error is None and r.ttft is not None]
    rates = [(r.tokens - 1) / (r.seconds - r.ttft) for r in done
             if r.tokens > 1 and r.seconds > r.ttft]
    tokens = sum(r.tokens for r in results if r.error is None)
    return {
        "concurrency": concurrency,
        "requests": requests,
        "ok": len(done),
        "errors": sorted({r.error for r in results if r.error is not None}),
        "ttft_median_s": statistics.median(r.ttft for r in done) if done else None,
        "ttft_p90_s": _percentile([r.ttft for r in done], 0.9) if done else None,
        "decode_tokens_per_s_median": statistics.median(rates) if rates else None,
        "output_tokens": tokens,
        "output_tokens_per_s": tokens / wall if wall > 0 else None,
        "wall_s": wall,
    }


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8080",
                   help="the server (loopback only; default: http://127.0.0.1:8080)")
    p.add_argument("--concurrency", default="1,8,32",
                   help="concurrent requests per level (default: 1,8,32)")
    p.add_argument("--requests", type=int, default=None,
                   help=f"requests per level (default: 2 x concurrency; at most {MAX_REQUESTS})")
    p.add_argument("--max-tokens", type=int, default=128, help="output tokens per request")
    p.add_argument("--prompt", default="Write a short story about a lighthouse keeper.",
                   help="the prompt (each request prefixes its number)")
    p.add_argument("--endpoint", choices=sorted(ENDPOINTS), default="completions")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    p.add_argument("--json", default=None, help="also write the results to this JSON file")
    return p


def main(argv: list[str] | None = None, out=None) -> int:
    out = out if out is not None else sys.stdout
    args = _parser().parse_args(argv)
    try:
        url = check_loopback(args.url)
        levels = parse_levels(args.concurrency)
        if args.requests is not None and not 1 <= args.requests <= MAX_REQUESTS:
            raise ValueError(f"[{PROG}] --requests must be in 1..{MAX_REQUESTS}, got {args.requests}")
        if args.max_tokens < 1:
            raise ValueError(f"[{PROG}] --max-tokens must be >= 1, got {args.max_tokens}")
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"{url} {ENDPOINTS[args.endpoint]}, max_tokens={args.max_tokens}, greedy", file=out)
    print(f"{'conc':>5} {'reqs':>5} {'ok':>4} {'TTFT p50 s':>10} {'TTFT p90 s':>10} "
          f"{'decode tok/s/req':>16} {'output tok/s':>12}", file=out)
    rows = []
    for level in levels:
        requests = args.requests if args.requests is not None else min(2 * level, MAX_REQUESTS)
        row = run_level(url, args.endpoint, level, requests, args.prompt, args.max_tokens,
                        args.timeout)
        rows.append(row)
        print(f"{level:>5} {requests:>5} {row['ok']:>4} {_fmt(row['ttft_median_s'], '10.3f')} "
              f"{_fmt(row['ttft_p90_s'], '10.3f')} "
              f"{_fmt(row['decode_tokens_per_s_median'], '16.1f')} "
              f"{_fmt(row['output_tokens_per_s'], '12.1f')}", file=out)
        for error in row["errors"]:
            print(f"      error: {error}", file=out)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"url": url, "endpoint": args.endpoint, "max_tokens": args.max_tokens,
                       "levels": rows}, f, indent=2)
    return 0 if all(row["ok"] == row["requests"] for row in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
