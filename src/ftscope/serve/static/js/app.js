// The page: the state lives in the URL (`?model=...&mix.method=qlora`, the CLI's override syntax), every edit
// re-estimates, and each answer is either the CLI's --json object or {error, field} shown beside that field.

import { DEFAULTS, buildForm, readControl, scenarioKeys, showRelevant, showResolved, writeControls } from "./controls.js";
import { renderEstimate, renderPlan, renderRecommend, renderStore } from "./views.js";

const $ = (sel) => document.querySelector(sel);
const form = $("#inputs");
const outputs = $("#outputs");
const banner = $("#general-error");
const body = document.body;
const VIEWS = ["estimate", "plan", "recommend", "store"];

let choices = null;
let state = {};
let view = "estimate";
let seq = 0;
let lastGood = false;
let lastEstimate = null;
let viewTimer = null;
const viewSeq = { plan: 0, recommend: 0, store: 0 };
const moeByModel = {};

// Every API call asks for errors as answers (HTTP 200): see api.py for why.
async function api(path, options = {}) {
  const response = await fetch(path + (path.includes("?") ? "&" : "?") + "_errors=inline", options);
  return response.json();
}

// The controls' keys in form order, then any other scenario key the URL brought (an inline GPU's memory_gib,
// the dataset's p95_tokens, ...): kept as given, so a hand-written link reloads to the same scenario.
function scenarioQuery() {
  const params = new URLSearchParams();
  const known = scenarioKeys();
  for (const key of [...known, ...Object.keys(state).filter((k) => !known.includes(k))]) {
    if (state[key] !== undefined && state[key] !== "") params.append(key, state[key]);
  }
  return params.toString();
}

function pageUrl() {
  return `?${scenarioQuery()}${view === "estimate" ? "" : `&_view=${view}`}`;
}

function loadState() {
  const params = new URLSearchParams(location.search);
  state = {};
  for (const [k, v] of params) if (!k.startsWith("_")) state[k] = v;
  if (!Object.keys(state).length) Object.assign(state, DEFAULTS);
  view = VIEWS.includes(params.get("_view")) ? params.get("_view") : "estimate";
}

function isMoe(model) {
  const preset = choices.models.find((m) => m.name === model || m.hf_id === model);
  if (preset) return preset.moe;
  return model in moeByModel ? moeByModel[model] : null;
}

function clearErrors() {
  banner.hidden = true;
  for (const slot of form.querySelectorAll(".error")) slot.textContent = "";
  for (const f of form.querySelectorAll(".field.invalid")) f.classList.remove("invalid");
}

// Put the message beside the field it is about (or its section), else above the results.
function showError(field, message) {
  let key = field || "";
  while (key) {
    const slot = form.querySelector(`[data-error-for="${CSS.escape(key)}"]`);
    if (slot) {
      const wrap = slot.closest(".field");
      wrap.classList.add("invalid");
      wrap.classList.remove("hidden-field");
      slot.textContent = message;
      return;
    }
    key = key.includes(".") ? key.slice(0, key.lastIndexOf(".")) : "";
  }
  banner.textContent = message;
  banner.hidden = false;
}

function updateDownloads(query, ok) {
  $("#dl-yaml").href = `/api/scenario.yaml?${query}`;
  $("#dl-json").href = `/api/estimate?${query}&_download=1`;
  $("#dl-launch").href = `/api/launch.zip?${query}`;
  for (const a of document.querySelectorAll("#downloads a")) a.classList.toggle("disabled", !ok);
}

async function estimate(t0) {
  const query = scenarioQuery();
  const mine = ++seq;
  body.dataset.state = "busy";
  body.dataset.query = query;
  history.replaceState(null, "", pageUrl());
  updateDownloads(query, false);
  showRelevant(form, state, isMoe(state.model));
  let d;
  try {
    d = await api(`/api/estimate?${query}`);
  } catch (err) {
    if (mine === seq) showError(null, "the ftscope server does not answer: is `ftscope serve` still running?");
    body.dataset.state = "ready";
    return;
  }
  if (mine !== seq) return;  // a later edit's answer will be shown instead
  clearErrors();
  lastGood = d.error === undefined;
  outputs.classList.toggle("stale", !lastGood);
  if (lastGood) {
    moeByModel[state.model] ??= d.model.active_params < d.model.total_params;
    showRelevant(form, state, isMoe(state.model));
    lastEstimate = d;
    renderEstimate($("#view-estimate"), d);
    showResolved(form, d.scenario, state);
    updateDownloads(query, true);
    refreshView();
  } else showError(d.field, d.error);
  body.dataset.rendered = query;
  body.dataset.state = "ready";
  const ms = performance.now() - t0;
  body.dataset.ms = ms.toFixed(1);
  $("#status").textContent = lastGood ? `estimated in ${ms.toFixed(0)} ms` : "";
}

function setView(next) {
  view = next;
  for (const tab of document.querySelectorAll("#tabs button")) tab.setAttribute("aria-selected", String(tab.dataset.view === view));
  for (const v of VIEWS) $(`#view-${v}`).hidden = v !== view;
  history.replaceState(null, "", pageUrl());
  refreshView();
}

// Plan and recommend take 0.1-2 s: ask once the edits pause, and only for the view on screen.
function refreshView() {
  clearTimeout(viewTimer);
  if (view !== "estimate" && (lastGood || view === "store")) {
    $(`#view-${view}`).dataset.state = "busy";
    viewTimer = setTimeout(loadView, 120);
  }
}

async function loadView() {
  const v = view;
  const pane = $(`#view-${v}`);
  const query = v === "store" ? "store" : body.dataset.rendered;
  if (pane.dataset.rendered === query) {
    pane.dataset.state = "ready";
    return;
  }
  const mine = ++viewSeq[v];
  pane.dataset.state = "busy";
  const d = await api(v === "store" ? "/api/store" : `/api/${v}?${query}`);
  if (mine !== viewSeq[v]) return;
  if (d.error !== undefined) showError(d.field, d.error);
  else if (v === "plan") renderPlan(pane, d, pick);
  else if (v === "recommend") renderRecommend(pane, d);
  else renderStore(pane, d);
  pane.dataset.rendered = query;
  pane.dataset.state = "ready";
}

// A plan row's "use": estimate on that GPU type and count.
function pick(gpu, count) {
  Object.assign(state, { "hardware.gpu": gpu, "hardware.gpus_per_node": String(count) });
  writeControls(form, state);
  setView("estimate");
  estimate(performance.now());
}

function suggest(text) {
  const list = $("#model-suggest");
  const q = text.trim().toLowerCase();
  const hits = q ? [...choices.models.map((m) => [m.name, m.hf_id]), ...choices.cached.map((id) => [id, "local HF cache"])]
    .filter(([name, hint]) => name.toLowerCase().includes(q) || hint.toLowerCase().includes(q)).slice(0, 10) : [];
  list.replaceChildren(...hits.map(([name, hint]) => {
    const li = document.createElement("li");
    const b = document.createElement("button");
    b.type = "button";
    b.dataset.model = name;
    b.append(name, " ", Object.assign(document.createElement("span"), { className: "hf", textContent: hint }));
    b.addEventListener("mousedown", (e) => e.preventDefault());  // keep the focus: no "change" for the half-typed text
    b.addEventListener("click", () => setModel(name));
    li.append(b);
    return li;
  }));
}

function setModel(ref) {
  form.elements.namedItem("model").value = ref;
  $("#model-suggest").replaceChildren();
  state.model = ref;
  estimate(performance.now());
}

function onEdit(event) {
  const t = event.target;
  const key = t.id === "batch-max" ? "workload.micro_batch_size" : t.name;
  if (!key) return;
  if (key === "model") {
    if (event.type === "input") suggest(t.value);
    else if (t.value.trim() !== state.model) setModel(t.value.trim());
    return;
  }
  if (t.id === "batch-max") {  // leaving "max": start from the batch it solved to
    const number = form.elements.namedItem(key);
    number.disabled = t.checked;
    if (!t.checked && !number.value && lastEstimate) number.value = lastEstimate.scenario.workload.micro_batch_size;
  }
  const value = readControl(form, key);
  if (state[key] === value) return;
  state[key] = value;
  estimate(performance.now());
}

// An upload is busy until the estimate it leads to is shown (or its error is).
function failed(field, message) {
  showError(field, message);
  body.dataset.state = "ready";
}

async function uploadConfig(file) {
  clearErrors();
  body.dataset.state = "busy";
  const d = await api("/api/upload/config", { method: "POST", body: file });
  if (d.error !== undefined) return failed("model", d.error);
  moeByModel[d.ref] = d.moe;
  setModel(d.ref);
}

async function measureDataset() {
  clearErrors();
  const sample = $("#f-dataset\\.sample").files[0];
  if (!sample) return showError("dataset.sample", "choose a JSONL file first");
  body.dataset.state = "busy";
  const tokFile = $("#tokenizer-file").files[0];
  let tokenizer = "";
  if (tokFile) {
    const t = await api("/api/upload/tokenizer", { method: "POST", body: tokFile });
    if (t.error !== undefined) return failed("dataset.tokenizer", t.error);
    tokenizer = t.ref;
  }
  const params = new URLSearchParams({ tokenizer, model: state.model || "", field: $("#jsonl-field").value });
  const d = await api(`/api/dataset?${params}`, { method: "POST", body: sample });
  if (d.error !== undefined) return failed(d.field || "dataset.sample", d.error);
  for (const [k, v] of Object.entries(d)) state[`workload.dataset.${k}`] = String(v);
  state["workload.padding"] = "dynamic";
  writeControls(form, state);
  estimate(performance.now());
}

function wire() {
  form.addEventListener("input", onEdit);
  form.addEventListener("change", onEdit);
  form.addEventListener("submit", (e) => e.preventDefault());
  for (const tab of document.querySelectorAll("#tabs button")) tab.addEventListener("click", () => setView(tab.dataset.view));
  const drop = $("#config-drop");
  drop.addEventListener("dragover", (e) => { e.preventDefault(); drop.classList.add("over"); });
  drop.addEventListener("dragleave", () => drop.classList.remove("over"));
  drop.addEventListener("drop", (e) => {
    e.preventDefault();
    drop.classList.remove("over");
    if (e.dataTransfer.files[0]) uploadConfig(e.dataTransfer.files[0]);
  });
  $("#config-file").addEventListener("change", (e) => { e.stopPropagation(); if (e.target.files[0]) uploadConfig(e.target.files[0]); });
  $("#jsonl-measure").addEventListener("click", measureDataset);
  $("#copy-url").addEventListener("click", async () => {
    try { await navigator.clipboard.writeText(location.href); $("#status").textContent = "link copied"; }
    catch { $("#status").textContent = "copy the address bar: it holds the whole scenario"; }
  });
}

async function boot() {
  choices = await api("/api/choices");
  buildForm(form, choices);
  loadState();
  writeControls(form, state);
  $('#tabs [data-view="store"]').hidden = !choices.store;
  wire();
  setView(view);
  await estimate(performance.now());
}

boot();
