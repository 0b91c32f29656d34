
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
