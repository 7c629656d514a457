// The form: one control per scenario key. Select values come from /api/choices (the tuples the CLI checks
// against); the state is a flat map of scenario keys to the text the URL carries (`mix.method=qlora`).

const mix = (name) => (c) => c.mix[name].map((v) => [v === null ? "" : String(v), v === null ? "none" : String(v)]);

export const CONTROLS = [
  { group: "Model", key: "model", type: "model", label: "model" },
  { group: "Hardware", key: "hardware.gpu", type: "select", label: "GPU",
    choices: (c) => c.gpus.map((g) => [g.key, `${g.key} (${g.memory_gib} GiB)`]) },
  { group: "Hardware", key: "hardware.gpus_per_node", type: "int", label: "GPUs per node" },
  { group: "Hardware", key: "hardware.nodes", type: "int", label: "nodes" },
  { group: "Mix", key: "mix.method", type: "select", label: "method", choices: mix("method") },
  { group: "Mix", key: "mix.lora_rank", type: "int", label: "LoRA rank", lora: true },
  { group: "Mix", key: "mix.lora_targets", type: "combo", label: "LoRA targets", choices: mix("lora_targets"), lora: true,
    note: "or module names: [q_proj, v_proj]" },
  { group: "Mix", key: "mix.gradient_checkpointing", type: "bool", label: "checkpointing" },
  { group: "Mix", key: "mix.attention", type: "select", label: "attention", choices: mix("attention") },
  { group: "Mix", key: "mix.zero_stage", type: "select", label: "ZeRO stage", choices: mix("zero_stage") },
  { group: "Mix", key: "mix.fsdp", type: "select", label: "FSDP", choices: mix("fsdp") },
  { group: "Mix", key: "mix.offload", type: "select", label: "offload", choices: mix("offload") },
  { group: "Mix", key: "mix.precision", type: "select", label: "precision", choices: mix("precision") },
  { group: "Mix", key: "mix.optimizer", type: "select", label: "optimizer", choices: mix("optimizer") },
  { group: "Mix", key: "mix.loss", type: "select", label: "loss", choices: mix("loss") },
  { group: "Mix", key: "mix.experts_top_k", type: "int", label: "experts top-k", optional: true, moe: true,
    note: "empty: the model's own" },
  { group: "Mix", key: "mix.experts_backend", type: "select", label: "experts backend", choices: mix("experts_backend"), moe: true },
  { group: "Workload", key: "workload.micro_batch_size", type: "batch", label: "micro-batch" },
  { group: "Workload", key: "workload.seq_len", type: "int", label: "sequence length", optional: true },
  { group: "Workload", key: "workload.padding", type: "select", label: "padding", choices: (c) => c.workload.padding.map((v) => [v, v]) },
  { group: "Workload", key: "workload.gradient_accumulation", type: "int", label: "grad accumulation" },
  { group: "Workload", key: "workload.epochs", type: "num", label: "epochs" },
  { group: "Workload", key: "workload.num_samples", type: "int", label: "samples / epoch", optional: true,
    note: "without dataset statistics" },
  { group: "Dataset statistics", key: "workload.dataset.num_samples", type: "int", label: "samples", optional: true },
  { group: "Dataset statistics", key: "workload.dataset.mean_tokens", type: "num", label: "mean tokens", optional: true },
  { group: "Dataset statistics", key: "workload.dataset.median_tokens", type: "num", label: "median tokens", optional: true },
  { group: "Dataset statistics", key: "workload.dataset.p99_tokens", type: "num", label: "p99 tokens", optional: true },
  { group: "Dataset statistics", key: "workload.dataset.max_tokens", type: "int", label: "max tokens", optional: true },
  { group: "Dataset statistics", key: "dataset.sample", type: "jsonl", label: "JSONL sample" },
  { group: "Price", key: "price.usd_per_gpu_hour", type: "num", label: "$ / GPU-hour", optional: true,
    note: "empty: the catalog's dated price" },
];

export const DEFAULTS = {
  "model": "llama-3.1-8b", "hardware.gpu": "a100-80gb", "hardware.gpus_per_node": "1", "hardware.nodes": "1",
  "mix.method": "lora", "mix.lora_rank": "16", "mix.lora_targets": "all-linear", "mix.gradient_checkpointing": "true",
  "mix.attention": "flash", "mix.zero_stage": "0", "mix.fsdp": "", "mix.offload": "none", "mix.precision": "bf16-mixed",
  "mix.optimizer": "adamw", "mix.loss": "standard", "mix.experts_backend": "grouped_mm",
  "workload.micro_batch_size": "max", "workload.seq_len": "2048", "workload.padding": "max_length",
  "workload.gradient_accumulation": "1", "workload.epochs": "1", "workload.num_samples": "10000",
};

// Keys that live in the page but are not scenario keys (never put in the URL).
const PAGE_ONLY = new Set(["dataset.sample"]);

export function scenarioKeys() {
  return CONTROLS.map((c) => c.key).filter((k) => !PAGE_ONLY.has(k));
}

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v !== undefined && v !== null && v !== false) node.setAttribute(k, v === true ? "" : v);
  }
  node.append(...children);
  return node;
}

function input(c) {
  const id = `f-${c.key}`;
  if (c.type === "select") return el("select", { id, name: c.key });
  if (c.type === "combo") return el("input", { id, name: c.key, type: "text", list: `${id}-list`, spellcheck: "false" });
  if (c.type === "bool") return el("input", { id, name: c.key, type: "checkbox" });
  if (c.type === "batch") {
    return el("span", { class: "inline" },
      el("input", { id, name: c.key, type: "number", min: 1, step: 1, inputmode: "numeric" }),
      el("label", {}, el("input", { type: "checkbox", id: "batch-max" }), " max"));
  }
  if (c.type === "model") return el("input", { id, name: c.key, type: "text", spellcheck: "false", placeholder: "search presets or an HF id" });
  if (c.type === "jsonl") {
    return el("span", { class: "inline" }, el("input", { id, type: "file", accept: ".jsonl,.json,application/jsonl" }));
  }
  const attrs = { id, name: c.key, type: "number", min: c.type === "num" ? 0 : 1, step: c.type === "num" ? "any" : 1 };
  return el("input", attrs);
}

function field(c) {
  const wrap = el("div", { class: "field", "data-key": c.key });
  if (c.moe) wrap.dataset.moe = "";
  if (c.lora) wrap.dataset.lora = "";
  wrap.append(el("label", { for: `f-${c.key}` }, c.label), input(c));
  if (c.type === "model") {
    wrap.append(el("ul", { class: "suggest", id: "model-suggest", role: "listbox" }));
    wrap.append(el("div", { class: "drop", id: "config-drop" }, "drop a config.json here, or ",
      el("input", { type: "file", id: "config-file", accept: ".json,application/json" })));
  }
  if (c.type === "jsonl") {
    wrap.append(el("label", { for: "tokenizer-file" }, "tokenizer.json"),
      el("input", { type: "file", id: "tokenizer-file", accept: ".json,application/json" }),
      el("label", { for: "jsonl-field" }, "text field"),
      el("input", { type: "text", id: "jsonl-field", value: "text", spellcheck: "false" }),
      el("small", { class: "error", "data-error-for": "dataset.field" }),
      el("span", {}), el("button", { type: "button", id: "jsonl-measure" }, "measure token lengths"),
      el("small", { class: "error", "data-error-for": "dataset.tokenizer" }));
  }
  if (c.note) wrap.append(el("small", { class: "note" }, c.note));
  wrap.append(el("small", { class: "error", "data-error-for": c.key }));
  return wrap;
}

export function buildForm(form, choices) {
  const groups = new Map();
  for (const c of CONTROLS) {
    if (!groups.has(c.group)) {
      const fs = el("fieldset", {}, el("legend", {}, c.group));
      groups.set(c.group, fs);
      form.append(fs);
    }
    const f = field(c);
    groups.get(c.group).append(f);
    if (c.choices) {  // a select's options, or the suggestions of a free-text field
      const list = c.type === "combo" ? f.appendChild(el("datalist", { id: `f-${c.key}-list` })) : f.querySelector("select");
      for (const [value, text] of c.choices(choices)) list.append(el("option", { value }, text));
    }
  }
}

// Write the state into the controls (after a load or a reload of the URL).
export function writeControls(form, state) {
  for (const c of CONTROLS) {
    const node = form.elements.namedItem(c.key);
    if (!node) continue;
    const value = state[c.key] ?? "";
    if (c.type === "bool") node.checked = value === "true";
    else if (c.type === "batch") {
      const max = value === "max";
      form.querySelector("#batch-max").checked = max;
      node.disabled = max;
      node.value = max ? "" : value;
    } else node.value = value;
  }
}

// The state value of the control that changed (the text the URL will carry).
export function readControl(form, key) {
  const c = CONTROLS.find((x) => x.key === key);
  const node = form.elements.namedItem(key);
  if (c.type === "bool") return node.checked ? "true" : "false";
  if (c.type === "batch") return form.querySelector("#batch-max").checked ? "max" : node.value.trim();
  return node.value.trim();
}

// Show the MoE controls only for MoE models, the LoRA ones only for LoRA / QLoRA.
export function showRelevant(form, state, isMoe) {
  for (const f of form.querySelectorAll(".field[data-moe]")) f.classList.toggle("hidden-field", isMoe === false);
  for (const f of form.querySelectorAll(".field[data-lora]")) f.classList.toggle("hidden-field", state["mix.method"] === "full");
}

// Controls the URL leaves unset show the value the scenario resolved to (the server's default), without
// adding it to the state: a shared short URL stays short, and the form never shows a blank select.
export function showResolved(form, resolved, state) {
  for (const c of CONTROLS) {
    if (state[c.key] !== undefined || PAGE_ONLY.has(c.key)) continue;
    const node = form.elements.namedItem(c.key);
    const value = c.key.split(".").reduce((o, k) => (o == null ? undefined : o[k]), resolved);
    if (!node || value === undefined) continue;
    const text = value === null ? "" : String(value);
    if (c.type === "bool") node.checked = value === true;
    else node.value = text;
  }
}
