"""mmcctl: an operator's view of mmc-server.

    mmcctl [--url URL] [--token T] [--json] COMMAND ...

Commands: health, segments, capacity, keys [--prefix P] [--limit N], key KEY,
evict HASH... [--location L], prefetch HASH..., summary, kv-events,
watch [--interval S] [--count N].
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import IO, Any, Callable, Dict, List, Optional, Sequence, Tuple
from urllib.parse import quote, urlencode

from ._http import Client, TransportError


class Failure(Exception):
    """One line for stderr."""


class Api:
    def __init__(self, url: str, token: Optional[str], timeout: float) -> None:
        try:
            self.client = Client(url, timeout=timeout, token=token)
        except ValueError as e:
            raise Failure("bad URL %r: %s" % (url, e)) from None
        self.url = url

    def raw(self, method: str, target: str, body: Optional[bytes] = None) -> bytes:
        parts = [body] if body else []
        headers = {"Content-Type": "application/json"} if body else None
        try:
            resp = self.client.request(method, target, parts, headers)
        except TransportError as e:
            raise Failure("%s: %s" % (self.url, e)) from None
        if resp.status != 200:
            raise Failure("%s %s: HTTP %d%s" % (method, target, resp.status,
                                                _envelope_text(resp.body)))
        return bytes(resp.body)

    def json(self, method: str, target: str, body: Optional[bytes] = None) -> Any:
        data = self.raw(method, target, body)
        try:
            v = json.loads(data)
        except ValueError:
            raise Failure("%s %s: the answer is not JSON" % (method, target)) from None
        if isinstance(v, dict) and v.get("success") is False:
            raise Failure(v.get("error_message") or "request failed")
        return v

    def text(self, target: str) -> str:
        return self.raw("GET", target).decode("utf-8", "replace")


def _envelope_text(body: Any) -> str:
    try:
        msg = json.loads(body).get("error_message")
        return ": " + msg if msg else ""
    except (ValueError, AttributeError):
        return ""


def human_bytes(n: Any) -> str:
    try:
        n = float(n)
    except (TypeError, ValueError):
        return str(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return ("%d %s" % (n, unit)) if unit == "B" else ("%.1f %s" % (n, unit))
        n /= 1024.0
    return str(n)


def pct(x: Any) -> str:
    try:
        return "%.1f%%" % (float(x) * 100)
    except (TypeError, ValueError):
        return str(x)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [["" if c is None else str(c) for c in r] for r in rows]
    widths = [len(h) for h in headers]
    for r in cells:
        for i, c in enumerate(r):
            widths[i] = max(widths[i], len(c))
    lines = ["  ".join(h.ljust(widths[i]) for i, h in enumerate(headers)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    for r in cells:
        lines.append("  ".join(c.ljust(widths[i]) for i, c in enumerate(r)).rstrip())
    return "\n".join(lines)


def kv_table(pairs: Sequence[Tuple[str, Any]]) -> str:
    return table(["FIELD", "VALUE"], pairs)


def flatten(d: Dict[str, Any], prefix: str = "") -> List[Tuple[str, Any]]:
    out: List[Tuple[str, Any]] = []
    for k, v in d.items():
        name = prefix + k
        if isinstance(v, dict):
            out += flatten(v, name + ".")
        else:
            out.append((name, json.dumps(v) if isinstance(v, (list, bool)) or v is None else v))
    return out


def parse_summary(text: str) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for field in text.split():
        k, _, v = field.partition("=")
        try:
            out[k] = int(v)
        except ValueError:
            out[k] = v
    return out


# -- commands ----------------------------------------------------------------------------


def cmd_health(api: Api, args: argparse.Namespace) -> Tuple[Any, str]:
    v = api.json("GET", "/health")
    return v, kv_table(flatten(v))


def cmd_segments(api: Api, args: argparse.Namespace) -> Tuple[Any, str]:
    names = [s for s in api.text("/get_all_segments").split("\n") if s.strip()]
    rem = api.json("GET", "/api/v1/capacity/segment_remaining")
    by_name = {s.get("segment_name"): s for s in rem.get("segments", [])}
    segs = []
    for name in names:
        s = dict(by_name.get(name, {"segment_name": name}))
        st = api.json("GET", "/api/v1/segments/status?segment=" + quote(name, safe=""))
        s["status"] = st.get("status_name")
        segs.append(s)
    rows = [[s.get("segment_name"), s.get("medium"), s.get("status"),
             human_bytes(s.get("total_bytes")), human_bytes(s.get("used_bytes")),
             human_bytes(s.get("remaining_bytes")),
             pct(1 - float(s.get("remaining_ratio", 1)))] for s in segs]
    return {"segments": segs}, table(
        ["SEGMENT", "MEDIUM", "STATUS", "TOTAL", "USED", "FREE", "USED%"], rows)


def cmd_capacity(api: Api, args: argparse.Namespace) -> Tuple[Any, str]:
    v = api.json("GET", "/api/v1/capacity/usage")
    rows = []
    for tier, t in v.items():
        if isinstance(t, dict) and "total_bytes" in t:
            rows.append([tier, human_bytes(t.get("total_bytes")), human_bytes(t.get("used_bytes")),
                         human_bytes(t.get("free_bytes")), pct(t.get("usage_ratio"))])
    text = table(["TIER", "TOTAL", "USED", "FREE", "USED%"], rows)
    if v.get("degraded"):
        text += "\n(degraded)"
    return v, text


def cmd_keys(api: Api, args: argparse.Namespace) -> Tuple[Any, str]:
    q = {}
    if args.prefix:
        q["prefix"] = args.prefix
    if args.limit is not None:
        q["limit"] = str(args.limit)
    target = "/get_all_keys" + ("?" + urlencode(q) if q else "")
    keys = [k for k in api.text(target).split("\n") if k]
    return {"keys": keys, "count": len(keys)}, "\n".join(keys + ["(%d keys)" % len(keys)])


def cmd_key(api: Api, args: argparse.Namespace) -> Tuple[Any, str]:
    v = api.json("GET", "/query_key?key=" + quote(args.key, safe=""))
    head = kv_table([("key", v.get("key")), ("size", "%s (%s)" % (v.get("size"), human_bytes(
        v.get("size")))), ("valid", v.get("valid")), ("copies", v.get("numBlobs"))])
    rows = [[b.get("rank"), b.get("medium"), {0: "allocated", 1: "readable"}.get(
        b.get("state"), b.get("state")), b.get("leaseTimeoutTtlMs")] for b in v.get("blobs", [])]
    return v, head + "\n\n" + table(["RANK", "MEDIUM", "STATE", "LEASE_MS"], rows)


def cmd_evict(api: Api, args: argparse.Namespace) -> Tuple[Any, str]:
    body = {"chunk_hashes": args.hashes}
    if args.location:
        body["locations"] = args.location
    v = api.json("POST", "/memory/evict", json.dumps(body).encode())
    return v, kv_table(flatten(v))


def cmd_prefetch(api: Api, args: argparse.Namespace) -> Tuple[Any, str]:
    v = api.json("POST", "/memory/prefetch", json.dumps({"chunk_hashes": args.hashes}).encode())
    return v, kv_table(flatten(v))


def cmd_summary(api: Api, args: argparse.Namespace) -> Tuple[Any, str]:
    v = parse_summary(api.text("/metrics/summary"))
    return v, kv_table(list(v.items()))


def cmd_kv_events(api: Api, args: argparse.Namespace) -> Tuple[Any, str]:
    v = api.json("GET", "/kv_events/status")
    return v, kv_table(flatten(v))


_RATES = [("put", "alloc_req"), ("batch_put", "batch_alloc_req"), ("get", "get_req"),
          ("batch_get", "batch_get_req"), ("remove", "remove_req"), ("query", "query_req"),
          ("exist", "exist_key_req")]


def watch_frame(cap: Tuple[Any, str], summ: Dict[str, Any], prev: Optional[Dict[str, Any]],
                dt: float) -> Tuple[str, Dict[str, Optional[float]], Optional[float]]:
    gets = summ.get("get_req", 0) + summ.get("batch_get_req", 0)
    hits = summ.get("get_success", 0) + summ.get("batch_get_success", 0)
    lines = ["mmc-server watch  %s" % time.strftime("%H:%M:%S"), ""]
    _, captext = cap
    lines += [captext, ""]
    lines.append("keys %s   hit ratio %s (%d of %d gets)   evictions %s   rewarms %s" % (
        summ.get("keys"), pct(hits / gets) if gets else "-", hits, gets, summ.get("evict"),
        summ.get("rewarm")))
    rows = []
    rates: Dict[str, Optional[float]] = {}
    for name, field in _RATES:
        cur = summ.get(field, 0)
        rate = (cur - prev.get(field, 0)) / dt if prev and dt > 0 else None
        rates[name] = rate
        rows.append([name, cur, "-" if rate is None else "%.1f" % rate])
    lines += ["", table(["REQUESTS", "TOTAL", "PER_SEC"], rows)]
    return "\n".join(lines), rates, (hits / gets if gets else None)


def cmd_watch(api: Api, args: argparse.Namespace, out: IO[str]) -> None:
    prev: Optional[Dict[str, Any]] = None
    t_prev: Optional[float] = None
    n = 0
    while True:
        cap = cmd_capacity(api, args)
        summ = parse_summary(api.text("/metrics/summary"))
        now = time.monotonic()
        text, rates, ratio = watch_frame(cap, summ, prev, (now - t_prev) if t_prev else 0)
        if args.json:
            out.write(json.dumps({"capacity": cap[0], "summary": summ, "hit_ratio": ratio,
                                  "rates_per_sec": rates}) + "\n")
        else:
            if out.isatty():
                out.write("\x1b[H\x1b[2J")
            out.write(text + "\n\n")
        out.flush()
        prev, t_prev = summ, now
        n += 1
        if args.count is not None and n >= args.count:
            return
        time.sleep(args.interval)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mmcctl", description="Operate an mmc-server.")
    p.add_argument("--url", default=os.environ.get("MMC_URL", "http://127.0.0.1:8000"),
                   help="server base URL (env MMC_URL; default http://127.0.0.1:8000)")
    p.add_argument("--token", default=os.environ.get("MMC_API_TOKEN"),
                   help="bearer token (env MMC_API_TOKEN)")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds per request")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    sub.add_parser("health", help="role, HA state, readiness")
    sub.add_parser("segments", help="segments with size, use and status")
    sub.add_parser("capacity", help="capacity per tier")
    k = sub.add_parser("keys", help="list keys")
    k.add_argument("--prefix")
    k.add_argument("--limit", type=int)
    k1 = sub.add_parser("key", help="one key: size, copies, location, lease")
    k1.add_argument("key")
    e = sub.add_parser("evict", help="evict objects by LMCache chunk hash")
    e.add_argument("hashes", nargs="+", metavar="HASH")
    e.add_argument("--location", action="append",
                   help="evict one tier down from this location (repeatable)")
    pf = sub.add_parser("prefetch", help="rewarm objects by chunk hash")
    pf.add_argument("hashes", nargs="+", metavar="HASH")
    sub.add_parser("summary", help="the one-line metrics summary, as a table")
    sub.add_parser("kv-events", help="KV-event publisher status")
    w = sub.add_parser("watch", help="refreshing view of capacity, hit ratio, request rates")
    w.add_argument("--interval", type=float, default=2.0)
    w.add_argument("--count", type=int, help="stop after this many refreshes")
    return p


COMMANDS: Dict[str, Callable[[Api, argparse.Namespace], Tuple[Any, str]]] = {"health": cmd_health, "segments": cmd_segments, "capacity": cmd_capacity,
            "keys": cmd_keys, "key": cmd_key, "evict": cmd_evict, "prefetch": cmd_prefetch,
            "summary": cmd_summary, "kv-events": cmd_kv_events}


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    api = None
    try:
        api = Api(args.url, args.token, args.timeout)
        if args.command == "watch":
            cmd_watch(api, args, sys.stdout)
        else:
            data, text = COMMANDS[args.command](api, args)
            sys.stdout.write((json.dumps(data, indent=2) if args.json else text) + "\n")
        return 0
    except Failure as f:
        sys.stderr.write("mmcctl: %s\n" % f)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    except Exception as e:  # noqa: BLE001 - one line, never a traceback
        sys.stderr.write("mmcctl: %s: %s\n" % (type(e).__name__, e))
        return 1
    finally:
        if api is not None:
            api.client.close()


if __name__ == "__main__":
    sys.exit(main())
