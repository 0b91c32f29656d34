"""The dashboard's HTML: Jinja2 templates (web/templates/, shipped as package data) rendered
with autoescape on, so every value we did not write (type names, keys, errors, payloads) is
escaped by the engine, not by hand. Litestar renders them (`template_config`); handlers pass
records and numbers, the templates decide the markup. This module gives the templates their
filters (times, durations, colours, JSON) and the geometry of the two SVG drawings (the
throughput chart and the chain DAG), which the templates only draw.

The page's script (templates/dashboard.js) re-fetches the page with `?fragment=1` every two
seconds and swaps the live part in (server-rendered HTML, live without reloads), keeping the
boxes the user ticked; the buttons call the JSON API with the login cookie. It is inlined
byte for byte: the CSP allows it by its hash (shield.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib.resources import files
from typing import Annotated, Any
from urllib.parse import quote, urlencode

import msgspec
from jinja2 import Environment, PackageLoader, StrictUndefined, pass_context
from jinja2.runtime import Context
from litestar import Request
from litestar.params import QueryParameter
from litestar.plugins.jinja import JinjaTemplateEngine
from litestar.response import Template
from litestar.template.config import TemplateConfig
from markupsafe import Markup

from hivejobs.chains.render import layers
from hivejobs.display import exception_line, progress_text
from hivejobs.records.chains import ChainJobStatus
from hivejobs.records.jobs import TERMINAL_STATES

# `?fragment=1`: only the page's live part, which its script re-fetches and swaps in.
Fragment = Annotated[bool, QueryParameter(name="fragment")]
TEMPLATES = files("hivejobs.web") / "templates"
SCRIPT = (TEMPLATES / "dashboard.js").read_text(encoding="utf-8")
CSS = (TEMPLATES / "dashboard.css").read_text(encoding="utf-8")

STATE_COLOURS = {
    "pending": "#9aa5b1",
    "scheduled": "#9aa5b1",
    "queued": "#5b8def",
    "running": "#f0a202",
    "suspended": "#b084f5",
    "succeeded": "#2e9e57",
    "failed": "#d64545",
    "stopped": "#7b8794",
    "cancelled": "#7b8794",
    "expired": "#7b8794",
    "paused": "#c05621",  # a job type paused fleet-wide, not a job state
}
NAV = (
    ("/dashboard", "Job types"),
    ("/dashboard/failed", "Failed jobs"),
    ("/dashboard/chains", "Chains"),
    ("/dashboard/batches", "Batches"),
    ("/dashboard/workers", "Workers"),
)


def when(moment: datetime | None) -> str:
    if moment is None:
        return "-"
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def seconds(start: datetime | None, end: datetime | None) -> str:
    if start is None or end is None:
        return "-"
    return f"{(end - start).total_seconds():.3f} s"


def colour(state: str) -> str:
    return STATE_COLOURS.get(state, "#52606d")


def seg(value: str) -> str:
    """A path segment (job ids may hold anything but control characters)."""
    return quote(value, safe="")


@pass_context
def url(context: Context, path: str, *segments: str, **query: object) -> str:
    """`path` under where the dashboard is mounted (the context's `base`), then each of
    `segments` quoted as one path segment, then the query (None values left out)."""
    params = {k: str(v) for k, v in query.items() if v is not None}
    out = str(context["base"]) + path + "".join("/" + seg(s) for s in segments)
    return out + ("?" + urlencode(params) if params else "")


def pretty(value: object) -> str:
    """A JSON value indented (a payload, a result), or its repr when it is not JSON."""
    try:
        return msgspec.json.format(msgspec.json.encode(value), indent=2).decode()
    except (TypeError, msgspec.EncodeError):
        return repr(value)


@dataclass(frozen=True)
class Bar:
    """One minute of the chart: its succeeded bar and the failed one stacked on it."""

    x: str
    width: str
    ok_y: str
    ok_h: str
    failed_y: str
    failed_h: str


@dataclass(frozen=True)
class Chart:
    width: int
    bars: list[Bar]
    label: str
    scale: str


def chart(succeeded: Sequence[int], failed: Sequence[int], width: int = 180) -> Chart:
    """Jobs finished per minute: green bars, failed stacked in red on top."""
    totals = [s + f for s, f in zip(succeeded, failed, strict=True)]
    peak = max(totals + [1])
    step = width / max(len(totals), 1)
    bars = []
    for i, (s, f) in enumerate(zip(succeeded, failed, strict=True)):
        hs, hf = 28 * s / peak, 28 * f / peak
        x, w = f"{i * step:.1f}", f"{step * 0.8:.1f}"
        bars.append(Bar(x, w, f"{30 - hs:.1f}", f"{hs:.1f}", f"{30 - hs - hf:.1f}", f"{hf:.1f}"))
    label = f"peak {peak}/min" if peak > 1 or any(totals) else "idle"
    # The scale and the time range in words: bars alone say neither.
    scale = f"{len(totals)} min ago to now, top = {peak}/min" if any(totals) else "idle"
    return Chart(width, bars, label, scale)


@dataclass(frozen=True)
class Node:
    job: ChainJobStatus
    x: int
    y: int


@dataclass(frozen=True)
class Edge:
    x1: float
    y1: float
    x2: float
    y2: float


@dataclass(frozen=True)
class Dag:
    width: int
    height: int
    box_w: int
    box_h: int
    nodes: list[Node]
    edges: list[Edge]


def dag_layout(jobs: Sequence[ChainJobStatus]) -> Dag:
    """The chain as layers (a job's layer is the longest path from a root), one column per
    layer; edges from each of a job's `after` to the job."""
    columns = {n: [j.key for j in layer] for n, layer in enumerate(layers(jobs))}
    w, h, gx, gy = 170, 46, 60, 18
    pos = {
        key: (20 + col * (w + gx), 20 + row * (h + gy))
        for col, keys in columns.items()
        for row, key in enumerate(keys)
    }
    width = 40 + (max(columns, default=0) + 1) * (w + gx)
    height = 40 + max((len(k) for k in columns.values()), default=1) * (h + gy)
    edges = [
        Edge(pos[a][0] + w, pos[a][1] + h / 2, pos[j.key][0], pos[j.key][1] + h / 2)
        for j in jobs
        for a in j.after
        if a in pos
    ]
    nodes = [Node(j, *pos[j.key]) for j in jobs]
    return Dag(width, height, w, h, nodes, edges)


def environment() -> Environment:
    """The dashboard's Jinja environment. Autoescape is on for every template: this is the
    one place that escapes what the pages show."""
    env = Environment(
        loader=PackageLoader("hivejobs.web", "templates"),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        when=when,
        seconds=seconds,
        colour=colour,
        pretty=pretty,
        progress_text=progress_text,
        exception_line=exception_line,
    )
    env.globals.update(
        url=url,
        chart=chart,
        dag_layout=dag_layout,
        NAV=NAV,
        TERMINAL_STATES=TERMINAL_STATES,
        # Ours, inlined verbatim (the CSP names the script's hash).
        script=Markup(SCRIPT),
        css=Markup(CSS),
    )
    return env


ENVIRONMENT = environment()


def template_config() -> TemplateConfig[JinjaTemplateEngine]:
    return TemplateConfig(instance=JinjaTemplateEngine.from_environment(ENVIRONMENT))


def base(request: Request[Any, Any, Any]) -> str:
    """Where the dashboard is mounted: the ASGI root_path, else create_app's base_path."""
    root = str(request.scope.get("root_path", "")) or str(request.app.state.base_path)
    return root.rstrip("/")


def page(
    request: Request[Any, Any, Any], template: str, title: str, fragment: bool, **context: Any
) -> Template:
    """Page `template` of templates/: whole, or only its live part (`?fragment=1`), which the
    page's script swaps in."""
    layout = "fragment.html" if fragment else "page.html"
    context.setdefault("live", True)
    return Template(
        template_name=template,
        context={"base": base(request), "title": title, "layout": layout, **context},
    )


def dag(jobs: Sequence[ChainJobStatus]) -> str:
    """The chain's DAG as the chain page draws it (the `dag` macro of macros.html)."""
    macros: Any = ENVIRONMENT.get_template("macros.html").module
    return str(macros.dag(jobs))
