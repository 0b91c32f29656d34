"""HTML pieces of the dashboard: the page shell, tables, the throughput chart and the chain DAG
(inline SVG). Every value we did not write goes through `esc`; no template engine, no build.

The page's script re-fetches the page with `?fragment=1` every two seconds and swaps the live
part in (server-rendered HTML, live without reloads), keeping the boxes the user ticked; the
buttons call the JSON API with the login cookie.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from urllib.parse import quote, urlencode

import msgspec

from hivejobs.chains.render import layers
from hivejobs.display import progress_text
from hivejobs.records import TERMINAL_STATES, ChainJobStatus, JobEvent

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

CSS = """
body{font:14px system-ui,sans-serif;margin:0;color:#1f2933;background:#f5f7fa}
nav{background:#1f2933;padding:10px 16px}nav form{display:inline;float:right}
nav button{margin:0;padding:1px 8px}nav a{color:#e4e7eb;margin-right:18px;text-decoration:none}
main{padding:16px}table{border-collapse:collapse;background:#fff;width:100%;margin:8px 0}
td,th{border-bottom:1px solid #e4e7eb;padding:5px 8px;text-align:left;vertical-align:top}
th{background:#f0f4f8}.state{display:inline-block;padding:1px 6px;border-radius:8px;color:#fff}
pre{background:#fff;border:1px solid #e4e7eb;padding:8px;overflow:auto;max-height:420px}
button{margin:4px 6px 4px 0;padding:4px 10px;cursor:pointer}.muted{color:#7b8794}
#flash{color:#2e9e57;min-height:1.2em}dl{display:grid;grid-template-columns:160px auto}
dt{color:#52606d}svg text{font:12px system-ui,sans-serif}
"""

SCRIPT = """
const live = document.getElementById('live');
function checked(){return [...live.querySelectorAll('input.pick:checked')].map(e=>e.value);}
async function refresh(){
  const keep = new Set(checked());
  const u = new URL(location.href); u.searchParams.set('fragment','1');
  try {
    const r = await fetch(u, {credentials:'same-origin'});
    if (r.ok) { live.innerHTML = await r.text();
      live.querySelectorAll('input.pick').forEach(e=>{e.checked = keep.has(e.value);});
      follow(); }
  } catch (e) {}
}
async function act(method, url, body){
  const r = await fetch(url, {method, credentials:'same-origin',
    headers:{'content-type':'application/json'}, body: body ? JSON.stringify(body) : undefined});
  let data = {}; try { data = await r.json(); } catch (e) {}
  document.getElementById('flash').textContent =
    r.ok ? (data.id && method==='POST' ? 'done: ' + data.id : 'done') : (data.error || r.status);
  await refresh(); return data;
}
document.addEventListener('click', ev => {
  const b = ev.target.closest('button[data-url]'); if (!b) return;
  if (b.dataset.bulk) {
    const ids = checked(); if (!ids.length) return;
    act('POST', b.dataset.url, {action: b.dataset.bulk, ids});
  } else { act(b.dataset.method || 'POST', b.dataset.url); }
});
setInterval(refresh, 2000);
// A job page's progress bar follows the job's server-sent events; the latest event is
// drawn again after each refresh (the stored progress may be a second behind it).
let events = null, latest = null;
function drawProgress(){
  const bar = document.getElementById('progress-bar');
  const text = document.getElementById('progress-text');
  if (!latest || !bar) return;
  if (latest.total) { bar.max = latest.total; bar.value = latest.done; }
  const done = latest.done || 0, total = latest.total;
  const pct = total ? ' (' + Math.round(100 * done / total) + '%)' : '';
  text.textContent = (total == null ? String(done) : done + '/' + total + pct) +
    (latest.note ? ' ' + latest.note : '');
}
function follow(){
  const box = document.getElementById('progress');
  if (events || !box || !box.dataset.events) { drawProgress(); return; }
  events = new EventSource(box.dataset.events);
  events.addEventListener('progress', m => { latest = JSON.parse(m.data); drawProgress(); });
  events.addEventListener('end', () => { events.close(); refresh(); });
}
follow();
"""


def esc(value: object) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def when(moment: datetime | None) -> str:
    if moment is None:
        return "-"
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def seconds(start: datetime | None, end: datetime | None) -> str:
    if start is None or end is None:
        return "-"
    return f"{(end - start).total_seconds():.3f} s"


def badge(state: str) -> str:
    colour = STATE_COLOURS.get(state, "#52606d")
    return f'<span class="state" style="background:{colour}">{esc(state)}</span>'


def link(base: str, path: str, text: object, **query: str | None) -> str:
    params = {k: v for k, v in query.items() if v is not None}
    url = base + path + ("?" + urlencode(params) if params else "")
    return f'<a href="{esc(url)}">{esc(text)}</a>'


def seg(value: str) -> str:
    """A path segment (job ids may hold anything but control characters)."""
    return quote(value, safe="")


def page(base: str, title: str, fragment: str, live: bool = True) -> str:
    """A whole page; `live` pages re-fetch their fragment every two seconds."""
    nav = "".join(
        link(base, p, t)
        for p, t in (
            ("/dashboard", "Job types"),
            ("/dashboard/failed", "Failed jobs"),
            ("/dashboard/chains", "Chains"),
            ("/dashboard/batches", "Batches"),
            ("/dashboard/workers", "Workers"),
        )
    )
    signout = (
        f'<form method="post" action="{esc(base)}/dashboard/logout" class="signout">'
        '<button id="signout">Sign out</button></form>'
    )
    return (
        f"<!doctype html><html><head><meta charset=utf-8><title>{esc(title)} - hivejobs</title>"
        f"<style>{CSS}</style></head><body><nav>{nav}{signout}</nav><main><h2>{esc(title)}</h2>"
        f'<div id="flash"></div><div id="live">{fragment}</div></main>'
        + (f"<script>{SCRIPT}</script>" if live else "")
        + "</body></html>"
    )


def table(headers: Sequence[str], rows: Iterable[Sequence[str]], empty: str = "none") -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    if not body:
        body = f'<tr><td colspan="{len(headers)}" class="muted">{esc(empty)}</td></tr>'
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def pretty(value: object) -> str:
    try:
        return esc(msgspec.json.format(msgspec.json.encode(value), indent=2).decode())
    except (TypeError, msgspec.EncodeError):
        return esc(repr(value))


def sparkline(succeeded: Sequence[int], failed: Sequence[int], width: int = 180) -> str:
    """Jobs finished per minute: green bars, failed stacked in red on top."""
    totals = [s + f for s, f in zip(succeeded, failed, strict=True)]
    peak = max(totals + [1])
    step = width / max(len(totals), 1)
    bars = []
    for i, (s, f) in enumerate(zip(succeeded, failed, strict=True)):
        hs, hf = 28 * s / peak, 28 * f / peak
        x = i * step
        bars.append(
            f'<rect x="{x:.1f}" y="{30 - hs:.1f}" width="{step * 0.8:.1f}" height="{hs:.1f}" '
            f'fill="#2e9e57"/><rect x="{x:.1f}" y="{30 - hs - hf:.1f}" width="{step * 0.8:.1f}" '
            f'height="{hf:.1f}" fill="#d64545"/>'
        )
    label = f"peak {peak}/min" if peak > 1 or any(totals) else "idle"
    # The scale and the time range in words: bars alone say neither.
    scale = f"{len(totals)} min ago to now, top = {peak}/min" if any(totals) else "idle"
    return (
        f'<svg class="chart" width="{width}" height="32" role="img" aria-label="{label}">'
        f"<title>{label}</title>{''.join(bars)}</svg>"
        f'<br><span class="muted chart-scale">{scale}</span>'
    )


def dag(base: str, jobs: Sequence[ChainJobStatus]) -> str:
    """The chain as layers (a job's layer is the longest path from a root), each job a box
    coloured by state with its key, type and status text; edges from `after` to the job."""
    columns = {n: [j.key for j in layer] for n, layer in enumerate(layers(jobs))}
    w, h, gx, gy = 170, 46, 60, 18
    pos = {
        key: (20 + col * (w + gx), 20 + row * (h + gy))
        for col, keys in columns.items()
        for row, key in enumerate(keys)
    }
    width = 40 + (max(columns, default=0) + 1) * (w + gx)
    height = 40 + max((len(k) for k in columns.values()), default=1) * (h + gy)
    edges = []
    for j in jobs:
        x2, y2 = pos[j.key]
        for a in j.after:
            if a in pos:
                x1, y1 = pos[a]
                edges.append(
                    f'<line x1="{x1 + w}" y1="{y1 + h / 2}" x2="{x2}" y2="{y2 + h / 2}" '
                    'stroke="#9aa5b1" marker-end="url(#arrow)"/>'
                )
    nodes = []
    for j in jobs:
        x, y = pos[j.key]
        colour = STATE_COLOURS.get(j.state, "#52606d")
        status = j.status or j.state
        # A job added at run time (ctx.chain.add): dashed, and says by whom.
        added, dash = "", ""
        if j.added_by:
            added = f' data-added-by="{esc(j.added_by)}"'
            dash = ' stroke="#1f2933" stroke-dasharray="4 3"'
        nodes.append(
            f'<g class="node" data-key="{esc(j.key)}" data-state="{esc(j.state)}"{added}>'
            f'<rect x="{x}" y="{y}" width="{w}" height="{h}" rx="6" fill="{colour}"{dash}/>'
            f'<text x="{x + 8}" y="{y + 18}" fill="#fff">{esc(j.key[:22])} ({esc(j.type[:14])})'
            f'</text><text x="{x + 8}" y="{y + 36}" fill="#fff">{esc(status[:26])}</text></g>'
        )
    return (
        f'<svg class="dag" width="{width}" height="{height}" role="img" aria-label="chain DAG">'
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="6" '
        'markerHeight="6" orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="#9aa5b1"/></marker>'
        f"</defs>{''.join(edges)}{''.join(nodes)}</svg>"
    )


def progress_bar(job_url: str, state: str, progress: JobEvent | None) -> str:
    """The job page's progress: the last stored report, and while the job is live the URL
    of its events, which the page's script follows (`job_url` is escaped already)."""
    if progress is None and state in TERMINAL_STATES:
        return ""
    done, total = (progress.done or 0, progress.total) if progress else (0, None)
    value = f' max="{total:g}" value="{done:g}"' if total else ""
    live = "" if state in TERMINAL_STATES else f' data-events="{job_url}/events"'
    text = progress_text(progress) if progress else "no progress reported yet"
    return (
        f'<div id="progress"{live}><progress id="progress-bar"{value}></progress> '
        f'<span id="progress-text">{esc(text)}</span></div>'
    )
