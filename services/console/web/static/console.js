// The console page: renders /api/view, then every view the server pushes on /events.
// Text only (textContent), never markup: job reasons and names come from users.
/* global uPlot */

const $ = (id) => document.getElementById(id);
const charts = {};
let updates = 0;
let target = 100; // delivered % of owed aimed at; the server says which

const hours = (gpuSeconds) => (gpuSeconds / 3600).toFixed(2);
const percent = (value) => (value === null ? "—" : `${value.toFixed(1)}%`);

function duration(seconds) {
  if (seconds === null) return "—";
  if (seconds < 120) return `${Math.round(seconds)} s`;
  if (seconds < 7200) return `${Math.round(seconds / 60)} min`;
  return `${(seconds / 3600).toFixed(1)} h`;
}

// An estimated start (seconds since the epoch): its time, and how far off it is.
function startAt(epochSeconds) {
  if (epochSeconds === null || epochSeconds === undefined) return "—";
  const at = new Date(epochSeconds * 1000);
  const inSeconds = Math.max(epochSeconds - Date.now() / 1000, 0);
  return `${at.toLocaleTimeString()} (in ${duration(inSeconds)})`;
}

function fill(tbodyId, rows, emptyText) {
  const body = $(tbodyId);
  const fresh = rows.map((cells) => {
    const tr = document.createElement("tr");
    for (const cell of cells) {
      const td = document.createElement("td");
      td.textContent = String(cell);
      tr.append(td);
    }
    return tr;
  });
  if (fresh.length === 0) {
    const tr = document.createElement("tr");
    const td = document.createElement("td");
    td.colSpan = body.parentElement.tHead.rows[0].cells.length;
    td.className = "empty";
    td.textContent = emptyText;
    tr.append(td);
    fresh.push(tr);
  }
  body.replaceChildren(...fresh);
}

function chart(id, options, data) {
  const el = $(id);
  const width = Math.max(el.clientWidth, 320);
  if (!charts[id]) {
    charts[id] = new uPlot({ ...options, width, height: 220 }, data, el);
  } else {
    charts[id].setData(data);
  }
}

function renderOccupancy(occupancy) {
  const now = occupancy.now;
  $("gpus-total").textContent = now.capacity;
  $("gpus-busy").textContent = now.busy;
  $("gpus-idle").textContent = now.idle;
  $("gpus-lost").textContent = now.lost;
  $("occupancy-pct").textContent = now.capacity ? percent((100 * now.busy) / now.capacity) : "—";
  chart(
    "occupancy-chart",
    {
      series: [
        {},
        { label: "busy GPUs", stroke: "#1f6feb", fill: "rgba(31,111,235,0.15)", width: 2,
          points: { show: false } },
        { label: "idle-flagged", stroke: "#d29922", width: 2, points: { show: false } },
        { label: "capacity", stroke: "#57606a", dash: [6, 4], width: 1, points: { show: false } },
      ],
      scales: { y: { range: (u, min, max) => [0, Math.max(max, 1)] } },
      axes: [{}, { label: "GPUs" }],
    },
    [occupancy.at, occupancy.busy, occupancy.idle, occupancy.capacity],
  );
}

// The target, a dashed red line across the whole plot (a series would need two bars).
function drawTarget(u) {
  const y = u.valToPos(target, "y", true);
  const ctx = u.ctx;
  ctx.save();
  ctx.strokeStyle = "#cf222e";
  ctx.lineWidth = 2 * devicePixelRatio;
  ctx.setLineDash([6 * devicePixelRatio, 4 * devicePixelRatio]);
  ctx.beginPath();
  ctx.moveTo(u.bbox.left, y);
  ctx.lineTo(u.bbox.left + u.bbox.width, y);
  ctx.stroke();
  ctx.restore();
}

function renderAllocations(view) {
  const rows = view.allocations;
  target = view.target_pct;
  const window = duration(view.window_s);
  $("allocations-note").textContent =
    `Over the last ${duration(view.span_s)} of the ${window} ` +
    `lookback window; owed = min(entitlement × capacity, demand). ` +
    `Target: ${view.target_pct}% (dashed red line).`;
  const names = rows.map((a) => a.allocation);
  const xs = names.map((_, i) => i);
  chart(
    "delivered-chart",
    {
      scales: { x: { time: false, range: [-0.5, Math.max(names.length - 0.5, 0.5)] },
                y: { range: (u, min, max) => [0, Math.max(max, target) * 1.1] } },
      axes: [
        { values: (u, ticks) => ticks.map((t) => names[t] ?? ""), splits: () => xs },
        { label: "% of owed" },
      ],
      series: [
        {},
        {
          label: "delivered % of owed",
          stroke: "#1a7f37",
          fill: "rgba(26,127,55,0.35)",
          paths: uPlot.paths.bars({ size: [0.6, 80] }),
          points: { show: false },
        },
      ],
      hooks: { draw: [drawTarget] },
    },
    [xs, rows.map((a) => a.delivered_pct)],
  );
  fill(
    "allocations-rows",
    rows.map((a) => [
      a.allocation,
      `${(100 * a.entitlement).toFixed(1)}%`,
      hours(a.owed_gpu_s),
      hours(a.delivered_gpu_s),
      percent(a.delivered_pct),
      hours(a.free_gpu_s),
    ]),
    "no allocation in your scope",
  );
}

function render(view) {
  $("user").textContent = view.user;
  $("scope").textContent = view.sees_all ? "(sees every job)" : "(your jobs and allocations)";
  $("stale").hidden = !view.stale;
  $("stale").textContent = view.stale ? `Data may be stale: ${view.stale}` : "";
  renderOccupancy(view.occupancy);
  renderAllocations(view);
  $("waiting-count").textContent = view.waiting.length;
  fill(
    "waiting-rows",
    view.waiting.map((j) => [
      j.job_id, j.user, j.allocation, j.gpu_type ? `${j.gpus}×${j.gpu_type}` : j.gpus,
      j.state, j.reason || "—", duration(j.waited_s), startAt(j.estimated_start),
    ]),
    "nothing waiting",
  );
  fill(
    "node-rows",
    view.nodes.map((n) => [
      n.node_id, n.gpu_type, n.gpus, n.busy, n.idle,
      n.lost ? `lost${n.lost_reason ? `: ${n.lost_reason}` : ""}` : "up",
    ]),
    "no node registered",
  );
  fill(
    "workflow-rows",
    view.workflows.map((w) => [
      w.job_id, w.user, w.allocation, w.state, `${w.tasks_done}/${w.tasks}`,
      duration(w.elapsed_s), w.slowdown === null ? "—" : `${w.slowdown.toFixed(2)}×`,
    ]),
    "no workflow",
  );
  updates += 1;
  document.body.dataset.updates = String(updates);
}

async function start() {
  const response = await fetch("/api/view", { credentials: "same-origin" });
  if (response.status === 401) {
    location.assign("/login");
    return;
  }
  if (response.ok) render(await response.json());
  const events = new EventSource("/events");
  events.addEventListener("open", () => { $("live").textContent = "live"; });
  events.addEventListener("error", () => { $("live").textContent = "reconnecting…"; });
  events.addEventListener("view", (event) => {
    $("live").textContent = "live";
    render(JSON.parse(event.data));
  });
  events.addEventListener("signed-out", () => {
    events.close();
    location.assign("/login");
  });
}

start();
