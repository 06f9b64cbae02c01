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

// A moment (seconds since the epoch): its time of day, and its date unless it is today.
function moment(epochSeconds) {
  if (epochSeconds === null || epochSeconds === undefined) return "—";
  const at = new Date(epochSeconds * 1000);
  const today = at.toDateString() === new Date().toDateString();
  return today ? at.toLocaleTimeString() : at.toLocaleString();
}

const ON_NODES = { processes: "on nodes that run processes", simulated: "on simulated nodes" };
const gpusOf = (j) => (j.gpu_type ? `${j.gpus}×${j.gpu_type}` : j.gpus);
const occupied = (g) => (g.capacity ? percent((100 * g.busy) / g.capacity) : "—");

// How a job ended: its exit code where its command ran to an end, and why.
function outcome(job) {
  const parts = [];
  if (job.exit_code !== null) parts.push(`exit ${job.exit_code}`);
  if (job.reason) parts.push(job.reason);
  return parts.join(": ") || "—";
}

// A legend shows the value under the cursor; with the cursor elsewhere, the latest one
// (uPlot's default there is "--").
const latest = (format) => (u, value, series, index) => {
  const values = u.data[series];
  const shown = index === null ? values[values.length - 1] : value;
  return shown === undefined || shown === null ? "—" : format(shown);
};

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

// One chart per GPU type, made when the types change (the page is updated in place).
let chartedTypes = "";

function typeCharts(types) {
  const key = JSON.stringify(types.map((t) => t.gpu_type));
  if (key === chartedTypes) return;
  chartedTypes = key;
  for (const id of Object.keys(charts).filter((id) => id.startsWith("occupancy-chart-"))) {
    charts[id].destroy();
    delete charts[id];
  }
  $("occupancy-charts").replaceChildren(
    ...types.map((type, i) => {
      const figure = document.createElement("figure");
      figure.dataset.gpuType = type.gpu_type;
      const caption = document.createElement("figcaption");
      const plot = document.createElement("div");
      plot.id = `occupancy-chart-${i}`;
      plot.className = "chart";
      figure.append(caption, plot);
      return figure;
    }),
  );
}

function renderOccupancy(occupancy) {
  const all = occupancy.now;
  $("gpus-total").textContent = all.capacity;
  $("gpus-busy").textContent = all.busy;
  $("gpus-idle").textContent = all.idle;
  $("gpus-lost").textContent = all.lost;
  $("occupancy-pct").textContent = occupied(all);
  fill(
    "occupancy-rows",
    occupancy.types.map((t) => [
      t.gpu_type, t.runs || "—", t.now.capacity, t.now.busy, t.now.idle, t.now.lost,
      occupied(t.now),
    ]),
    "no node registered",
  );
  typeCharts(occupancy.types);
  const count = latest((n) => String(n));
  occupancy.types.forEach((type, i) => {
    const caption = $("occupancy-charts").children[i].firstChild;
    caption.textContent = `${type.gpu_type}: ${type.now.busy} of ${type.now.capacity} GPUs busy` +
      ` (${occupied(type.now)}) ${ON_NODES[type.runs] ?? `on nodes that run ${type.runs}`}`;
    chart(
      `occupancy-chart-${i}`,
      {
        series: [
          { value: latest((at) => new Date(at * 1000).toLocaleTimeString()) },
          { label: `busy ${type.gpu_type}`, stroke: "#1f6feb", fill: "rgba(31,111,235,0.15)",
            width: 2, points: { show: false }, value: count },
          { label: "idle-flagged", stroke: "#d29922", width: 2, points: { show: false },
            value: count },
          { label: "capacity", stroke: "#57606a", dash: [6, 4], width: 1,
            points: { show: false }, value: count },
        ],
        scales: { y: { range: (u, min, max) => [0, Math.max(max, 1)] } },
        axes: [{}, { label: `${type.gpu_type} GPUs` }],
      },
      [occupancy.at, type.busy, type.idle, type.capacity],
    );
  });
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

// The headline: the worst team over the floor, the weighted figure, the small teams apart.
function headlineText(h) {
  let text =
    `Worst team: ${percent(h.owed_delivered_min_pct)}; ` +
    `weighted (Σ min(delivered, owed) ÷ Σ owed): ${percent(h.owed_delivered_weighted_pct)}.`;
  const small = h.owed_small_teams;
  if (small.count) {
    text +=
      ` Small teams (owed under ${h.small_team_owed_pct}% of the cluster's GPU-hours), ` +
      `shown apart below the line: ${small.count}, ${small.owed_pct.toFixed(2)}% of owed, ` +
      `worst ${percent(small.min_pct)}.`;
  }
  return text;
}

function renderAllocations(view) {
  // Small teams are listed after the others and left out of the chart.
  const small = view.allocations.filter((a) => a.small);
  const rows = [...view.allocations.filter((a) => !a.small), ...small];
  const charted = rows.filter((a) => !a.small);
  target = view.target_pct;
  const window = duration(view.window_s);
  $("allocations-note").textContent =
    `Over the last ${duration(view.span_s)} of the ${window} ` +
    `lookback window; owed = min(entitlement × capacity, demand). ` +
    `Target: ${view.target_pct}% (dashed red line). ${headlineText(view.headline)}`;
  const names = charted.map((a) => a.allocation);
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
      // Labels only: one value per bar, which the table lists (no "--" when not hovered).
      legend: { live: false },
    },
    [xs, charted.map((a) => a.delivered_pct)],
  );
  fill(
    "allocations-rows",
    rows.map((a) => [
      a.small ? `${a.allocation} (small team)` : a.allocation,
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
      j.job_id, j.user, j.allocation, gpusOf(j), j.state, j.reason || "—", duration(j.waited_s),
      startAt(j.estimated_start),
    ]),
    "nothing waiting",
  );
  $("running-count").textContent = view.running.length;
  fill(
    "running-rows",
    view.running.map((j) => [
      j.job_id, j.user, j.allocation, gpusOf(j), j.nodes.join(", ") || "—",
      j.idle ? `${j.state} (GPUs idle)` : j.state, j.attempt, moment(j.started_at),
      duration(j.ran_s),
    ]),
    "nothing running",
  );
  fill(
    "ended-rows",
    view.ended.map((j) => [
      j.job_id, j.user, j.allocation, gpusOf(j), j.state, outcome(j), moment(j.submitted_at),
      moment(j.started_at), moment(j.finished_at), duration(j.ran_s),
    ]),
    "nothing ended yet",
  );
  fill(
    "node-rows",
    view.nodes.map((n) => [
      n.node_id, n.gpu_type, n.workflows_only ? `${n.runs}, workflows only` : n.runs, n.gpus,
      n.busy, n.idle, n.lost ? `lost${n.lost_reason ? `: ${n.lost_reason}` : ""}` : "up",
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
