// The four views: estimate, plan across GPUs, recommendations, profile store. Every number shown is a field of
// the CLI's --json object, kept unrounded in data-value (what the browser test compares with the CLI).

import { hbar, pareto, stackedBars } from "./charts.js";

const MEMORY_KEYS = ["weights", "gradients", "optimizer", "activations", "temporary", "overhead"];
const TIME_KEYS = ["forward", "backward", "recompute", "optimizer", "communication", "dequant", "other"];

export function get(obj, path) {
  return path.split(".").reduce((o, k) => (o === null || o === undefined ? undefined : o[k]), obj);
}

const num = (v, digits) => v.toLocaleString("en-US", { minimumFractionDigits: digits, maximumFractionDigits: digits });

export const FORMATS = {
  gib: (v) => `${num(v, 2)} GiB`,
  int: (v) => num(v, 0),
  num: (v) => num(v, 2),
  s: (v) => `${num(v, 3)} s`,
  h: (v) => `${num(v, 2)} h`,
  usd: (v) => `$${num(v, 2)}`,
  pct: (v) => `${num(100 * v, 1)} %`,
  text: (v) => String(v),
  fits: (v) => (v ? "fits" : "does not fit"),
};

function show(node, value) {
  node.dataset.value = JSON.stringify(value === undefined ? null : value);
  const empty = value === null || value === undefined || value === "";
  node.textContent = empty ? (node.dataset.fmt === "text" ? "" : "-") : FORMATS[node.dataset.fmt](value);
}

export function renderEstimate(root, d) {
  const m = d.memory;
  const view = { ...d, headroom_gib: +(m.capacity_gib - m.peak_gib).toFixed(3) };
  for (const node of root.querySelectorAll("[data-field]")) show(node, get(view, node.dataset.field));
  root.querySelector("#fit-badge").classList.toggle("no", !m.fits);
  const bars = [{ label: `peak (${m.peak_phase})`, mark: true,
    segments: MEMORY_KEYS.map((k) => ({ key: k, value: m.breakdown_gib[k] || 0 })) }];
  for (const [phase, v] of Object.entries(m.phases_gib)) bars.push({ label: phase, segments: [{ key: "allocated", value: v }] });
  stackedBars(root.querySelector("#memory-chart"), bars, [...MEMORY_KEYS, "allocated"], { capacity: m.capacity_gib });
  if (d.time) hbar(root.querySelector("#time-chart"), d.time.breakdown_s, TIME_KEYS);
  else root.querySelector("#time-chart").replaceChildren();
  const warnings = root.querySelector("#warnings");
  warnings.replaceChildren(...d.warnings.map((w) => Object.assign(document.createElement("li"), { textContent: w })));
}

function cell(text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  return td;
}

const hw = (r) => r.scenario.hardware;
const or = (v, f) => (v === null || v === undefined ? "-" : f(v));

// plan: the CLI's plan --json; onPick(gpu, count) when a row's "use" button is pressed.
export function renderPlan(root, plan, onPick) {
  const feasible = plan.rows.filter((r) => r.memory.fits && r.run && r.run.usd !== null);
  pareto(root.querySelector("#pareto-chart"), feasible.map((r) => ({
    gpu: hw(r).gpu, count: hw(r).gpus_per_node * hw(r).nodes, hours: r.run.hours, usd: r.run.usd, pareto: r.pareto, label: r.label })));
  const seen = new Set();
  const best = plan.rows.filter((r) => !seen.has(hw(r).gpu) && seen.add(hw(r).gpu));
  const body = root.querySelector("#plan-table tbody");
  body.replaceChildren(...best.map((r, i) => {
    const tr = document.createElement("tr");
    const ok = r.memory.fits && r.time;
    tr.className = r.pareto ? "front" : "";
    tr.dataset.gpu = hw(r).gpu;
    tr.append(cell(i + 1), cell(hw(r).gpu, "text"), cell(hw(r).gpus_per_node * hw(r).nodes), cell(r.memory.capacity_gib.toFixed(0)),
      cell(r.limits.max_micro_batch_size), cell(ok ? r.memory.peak_gib.toFixed(1) : "-"),
      cell(ok ? r.time.samples_per_s.toFixed(2) : "-"), cell(ok ? FORMATS.int(r.time.tokens_per_s) : "-"),
      cell(ok ? or(r.run.usd_per_gpu_hour, FORMATS.usd) : "-"), cell(ok ? FORMATS.h(r.run.hours) : "-"),
      cell(ok ? or(r.run.usd, FORMATS.usd) : "-"), cell(r.pareto ? "*" : (r.reason || ""), "text reason"));
    const use = document.createElement("button");
    use.type = "button";
    use.textContent = "use";
    use.addEventListener("click", () => onPick(hw(r).gpu, hw(r).gpus_per_node));
    const td = document.createElement("td");
    td.append(use);
    tr.append(td);
    return tr;
  }));
  const b = plan.best;
  root.querySelector("#plan-summary").textContent = b
    ? `best by ${plan.by}: ${hw(b).gpus_per_node * hw(b).nodes}x ${hw(b).gpu}, micro-batch ${b.scenario.workload.micro_batch_size}: `
      + `${FORMATS.h(b.run.hours)}, ${or(b.run.usd, FORMATS.usd)} (${b.run.price_source}). ${plan.rows.length} candidates; `
      + `* = cost/time Pareto frontier.`
    : "no GPU type and count fits: try QLoRA, checkpointing, ZeRO-3 or more GPUs.";
}

export function renderRecommend(root, rec) {
  const feasible = rec.rows.filter((r) => r.memory.fits);
  root.querySelector("#rec-summary").textContent = `${rec.counts.feasible.toLocaleString("en-US")} of `
    + `${rec.counts.candidates.toLocaleString("en-US")} configurations run; top ${feasible.length} by ${rec.by}.`;
  root.querySelector("#rec-table tbody").replaceChildren(...feasible.map((r, i) => {
    const tr = document.createElement("tr");
    const [gpus, ...mix] = r.label.split(" | ").slice(1);
    tr.append(cell(i + 1), cell(gpus, "text"), cell(mix.join(" | ").replace(/ \| b\d+$/, ""), "text"),
      cell(`${r.scenario.workload.micro_batch_size} x ${r.scenario.workload.gradient_accumulation}`),
      cell(r.memory.peak_gib.toFixed(1)), cell(FORMATS.int(r.time.tokens_per_s)), cell(FORMATS.h(r.run.hours)),
      cell(or(r.run.usd, FORMATS.usd)));
    return tr;
  }));
  root.querySelector("#rec-explanation").replaceChildren(...(rec.explanation.length ? rec.explanation
    : ["nothing fits: every candidate was rejected (see the plan view for why)"]).map(
    (line) => Object.assign(document.createElement("li"), { textContent: line })));
}

export function renderStore(root, store) {
  root.querySelector("#store-summary").textContent = `${store.db}: ${store.sections.length} profiled run(s), charted as `
    + "`ftscope report --db` charts them.";
  root.querySelector("#store-sections").replaceChildren(...store.sections.map((sec) => {
    const div = document.createElement("section");
    div.append(Object.assign(document.createElement("h3"), { textContent: sec.title }),
      Object.assign(document.createElement("p"), { textContent: sec.text }),
      ...sec.figures.map((f) => Object.assign(document.createElement("img"), { src: f.src, alt: f.name })));
    return div;
  }));
}
