"""PromQL helpers for the deploy/ tests: the metric names and label matchers an expression uses,
and a parser for the Prometheus text exposition.

This is not a full PromQL parser. It removes what cannot be a metric name (strings, label
matchers, range selectors, grouping label lists, Grafana variables, numbers) and reads what
is left; every other identifier must be a PromQL function or keyword, so a typo in a metric
name cannot pass as a function and the other way around.
"""

import re

FUNCTIONS = {
    "abs", "absent", "absent_over_time", "avg", "avg_over_time", "bottomk", "ceil", "changes",
    "clamp", "clamp_max", "clamp_min", "count", "count_over_time", "count_values", "delta",
    "deriv", "floor", "group", "histogram_quantile", "idelta", "increase", "irate",
    "label_join", "label_replace", "last_over_time", "max", "max_over_time", "min",
    "min_over_time", "quantile", "quantile_over_time", "rate", "resets", "round", "scalar",
    "sort", "sort_desc", "stddev", "stdvar", "sum", "sum_over_time", "time", "timestamp",
    "topk", "vector",
}
KEYWORDS = {"and", "or", "unless", "offset", "bool", "inf", "nan"}
GROUPING = r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)"
IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
SELECTOR = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)\s*\{([^}]*)\}")
MATCHER = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!=|!~|=)\s*"((?:[^"\\]|\\.)*)"')


def metric_names(expr):
    """Every metric name `expr` reads; raises on an identifier that is neither."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    e = re.sub(r"\{[^}]*\}", " ", e)
    e = re.sub(r"\[[^\]]*\]", " ", e)
    e = re.sub(GROUPING, " ", e)
    e = re.sub(r"\$\{?\w+\}?", " ", e)
    e = re.sub(r"\b\d+(\.\d+)?(e[+-]?\d+)?\b", " ", e)
    names = set()
    for m in IDENT.finditer(e):
        word = m.group(0)
        rest = e[m.end():].lstrip()
        if word in FUNCTIONS or word.lower() in KEYWORDS:
            continue
        if rest.startswith("("):
            raise AssertionError("unknown PromQL function %r in %r" % (word, expr))
        names.add(word)
    return names


def equality_matchers(expr):
    """(name, {label: value}) for every selector, with its literal `=` matchers only."""
    out = []
    for m in SELECTOR.finditer(expr):
        labels = {}
        for lm in MATCHER.finditer(m.group(2)):
            if lm.group(2) == "=" and "$" not in lm.group(3):
                labels[lm.group(1)] = lm.group(3)
        out.append((m.group(1), labels))
    return out


SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{(.*)\})?\s+\S+")
LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_exposition(text):
    """{name: [labels dict, ...]} of every sample in a text exposition."""
    series = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = SAMPLE.match(line)
        assert m, "not a sample line: %r" % line
        series.setdefault(m.group(1), []).append(dict(LABEL.findall(m.group(3) or "")))
    return series


def has_series(series, name, labels):
    """Whether some sample of `name` carries `labels` (a "" value means: label absent)."""
    return any(
        all(s.get(k, "") == v for k, v in labels.items()) for s in series.get(name, [])
    )
