"""The segments a meta service lists, and the wait for them to be ready: a joining rank's
segments are listed at once but UNDEFINED (no put is placed there) until the local service's
first heartbeat; a test or benchmark puts once every segment is OK.

Standard library only: the perf scripts (perf/cluster_cpu.py, perf/ha_failover.py) import it
too. ``get(path)`` answers the body (bytes or str) of a GET of ``path`` on the meta."""

import json
from urllib.parse import quote


def _text(body):
    return body.decode() if isinstance(body, bytes) else body


def segments(get):
    """The segment names the meta lists (`/get_all_segments`)."""
    return [line for line in _text(get("/get_all_segments")).splitlines() if line]


def ready_segments(get):
    """The segment names, once every one is OK (`/api/v1/segments/status`); else None."""
    names = segments(get)
    for name in names:
        try:
            st = json.loads(_text(get("/api/v1/segments/status?segment=" + quote(name, safe=""))))
        except ValueError:
            return None
        if st.get("status_name") != "OK":
            return None
    return names


def ready_count(get):
    """How many segments the meta lists once every one is OK, else 0."""
    return len(ready_segments(get) or [])
