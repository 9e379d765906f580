// The kvserve status page: polls GET /v1/status and draws it. Plain script, no build.
// Server strings are only ever inserted as text (textContent), never as HTML.
// With API keys, a 401 shows the key form; the key is kept in this tab's sessionStorage
// and sent as "Authorization: Bearer <key>" to this origin only.
"use strict";

const POLL_MS = 1500;
const KEY_ITEM = "kvserve-api-key";
let timer = null;

const $ = (id) => document.getElementById(id);

function el(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (className) node.className = className;
  return node;
}

function row(cells, className) {
  const tr = el("tr", null, className);
  for (const cell of cells) tr.append(cell instanceof Node ? cell : el("td", cell));
  return tr;
}

function fill(tbody, rows) {
  tbody.replaceChildren(...rows);
}

const dash = "–";
const pct = (v) => (v === null || v === undefined ? dash : `${(100 * v).toFixed(1)} %`);
const num = (v, digits = 0) =>
  v === null || v === undefined ? dash : Number(v).toLocaleString("en-US", {
    maximumFractionDigits: digits, minimumFractionDigits: digits });
function ms(seconds) {
  if (seconds === null || seconds === undefined) return dash;
  return seconds < 1 ? `${(1000 * seconds).toFixed(1)} ms` : `${seconds.toFixed(2)} s`;
}
function duration(seconds) {
  if (seconds < 90) return `${seconds.toFixed(0)} s`;
  if (seconds < 5400) return `${(seconds / 60).toFixed(0)} min`;
  return `${(seconds / 3600).toFixed(1)} h`;
}

function badge(node, text, kind) {
  node.textContent = text;
  node.className = `badge ${kind}`;
}

function drawWorkers(workers) {
  $("worker-count").textContent = `(${workers.length})`;
  fill($("workers").tBodies[0], workers.map((w) => {
    const tr = row([
      w.worker_id, el("td", w.role, `role ${w.role}`), el("td", w.state, `state ${w.state}`),
      num(w.waiting), num(w.running), num(w.queued_prefill_tokens),
      `${pct(w.kv_use)} (${num(w.kv_pages_used)} / ${num(w.kv_pages_total)} pages)`,
      num(w.prefill_tokens_per_s, 1), num(w.decode_tokens_per_s, 1), num(w.requests),
      pct(w.hit_rates.local), pct(w.hit_rates.pool), `${w.report_age_s.toFixed(1)} s`,
    ]);
    tr.dataset.worker = w.worker_id;
    tr.dataset.role = w.role;
    return tr;
  }));
}

function drawCache(cache) {
  const line = (name, c) => row([
    el("th", name), num(c.requests), num(c.prompt_tokens), pct(c.token_rates.local),
    pct(c.token_rates.pool), pct(c.token_rates.miss), pct(c.request_rates.local),
    pct(c.request_rates.pool),
  ]);
  fill($("cache").tBodies[0], [
    line("last minute", cache.last_minute), line("since start", cache.since_start)]);
  $("pool-lookup").textContent = cache.pool_lookup
    ? `Pool lookup on, ${cache.pool_connected ? "connected" : "not connected"}.`
    : "Pool lookup off.";
}

function drawLatency(latency) {
  $("latency-window").textContent = `(last ${latency.window_s.toFixed(0)} s)`;
  const line = (name, s) => row([
    el("th", name), num(s.count), ms(s.mean_s), ms(s.p50_s), ms(s.p90_s), ms(s.p99_s),
    ms(s.max_s)]);
  fill($("latency").tBodies[0], [line("TTFT", latency.ttft), line("ITL", latency.itl)]);
}

function drawRequests(requests) {
  const names = Object.keys(requests).sort();
  const total = names.reduce((sum, name) => sum + requests[name], 0);
  fill($("requests").tBodies[0], [
    ...names.map((name) => row([el("th", name), num(requests[name])])),
    row([el("th", "total"), num(total)], "total"),
  ]);
}

function drawController(c) {
  badge($("controller-state"), c.enabled ? "on" : "off", c.enabled ? "ok" : "muted");
  const cooldown = c.cooldown_remaining_s;
  const facts = [
    ["verdict", c.verdict],
    ["TTFT within SLO",
      `${pct(c.ttft_attainment)} (SLO ${ms(c.ttft_slo_s)}, target ${pct(c.target)})`],
    ["TPOT within SLO", `${pct(c.tpot_attainment)} (SLO ${ms(c.tpot_slo_s)})`],
    ["cool-down", cooldown > 0 ? `${cooldown.toFixed(1)} s` : "none"],
    ["no move because", c.blocked || dash],
    ["decisions", num(c.decisions_total)],
  ];
  $("controller-summary").replaceChildren(
    ...facts.flatMap(([name, value]) => [el("dt", name), el("dd", value)]));
  const rows = c.decisions.map((d) => row([
    `${duration(d.ago_s)} ago`, d.worker_id, `${d.from_role} → ${d.to_role}`, d.reason,
    d.result === null ? "under way" : d.error ? `${d.result}: ${d.error}` : d.result,
  ]));
  const none = el("td", "no decisions yet", "muted");
  none.colSpan = 5;
  fill($("decisions").tBodies[0], rows.length ? rows : [row([none])]);
}

function draw(s) {
  $("model").textContent = s.model || "no model yet";
  badge($("health"), s.serving ? "serving" : "not serving", s.serving ? "ok" : "bad");
  drawWorkers(s.workers);
  drawCache(s.cache);
  drawLatency(s.latency);
  drawRequests(s.requests);
  drawController(s.controller);
  const now = new Date().toLocaleTimeString();
  $("updated").textContent = `updated ${now}, router up ${duration(s.uptime_s)}`;
  $("updated").className = "muted";
  $("status").hidden = false;
}

function schedule() {
  clearTimeout(timer);  // one loop, however many polls ran at once
  timer = setTimeout(poll, POLL_MS);
}

function askForKey(message) {
  clearTimeout(timer);
  $("key-form").hidden = false;
  $("key-error").textContent = message;
  $("key").focus();
}

async function poll() {
  const key = sessionStorage.getItem(KEY_ITEM);
  const headers = key ? { Authorization: `Bearer ${key}` } : {};
  try {
    const response = await fetch("/v1/status", { headers, cache: "no-store" });
    if (response.status === 401) {
      sessionStorage.removeItem(KEY_ITEM);
      askForKey(key ? "That key was refused." : "");
      return;
    }
    if (!response.ok) throw new Error(`/v1/status answered ${response.status}`);
    $("key-form").hidden = true;
    draw(await response.json());
  } catch (err) {
    $("updated").textContent = `no data: ${err.message}`;
    $("updated").className = "error";
  }
  schedule();
}

$("key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const key = $("key").value.trim();
  if (!key) return;
  sessionStorage.setItem(KEY_ITEM, key);
  $("key").value = "";
  poll();
});

poll();
