// SVG charts drawn by hand: a stacked bar chart (memory), one stacked horizontal bar (step time) and a
// cost-vs-time scatter with its Pareto frontier. Every mark carries its number in data-* attributes.

const NS = "http://www.w3.org/2000/svg";
export const PALETTE = ["#264653", "#2a9d8f", "#e9c46a", "#f4a261", "#e76f51", "#8ab17d", "#6d597a", "#b56576"];

function s(tag, attrs = {}, text) {
  const node = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

function reset(svg, w, h) {
  svg.replaceChildren();
  svg.setAttribute("viewBox", `0 0 ${w} ${h}`);
}

function niceStep(span, count) {
  const raw = span / Math.max(count, 1);
  const mag = 10 ** Math.floor(Math.log10(raw || 1));
  return [1, 2, 2.5, 5, 10].map((m) => m * mag).find((st) => st >= raw) || mag * 10;
}

// Ticks from a round number at or below lo to one at or above hi.
function linearTicks(hi, lo = 0, count = 5) {
  const step = niceStep(hi - lo, count);
  const out = [];
  for (let v = Math.floor(lo / step) * step; out.length < 20; v += step) {
    out.push(+v.toFixed(10));
    if (v >= hi) break;
  }
  return out;
}

function logTicks(lo, hi) {
  const out = [];
  for (let e = Math.floor(Math.log10(lo)); e <= Math.ceil(Math.log10(hi)); e++) {
    for (const m of [1, 2, 5]) {
      const v = m * 10 ** e;
      if (v >= lo && v <= hi) out.push(v);
    }
  }
  return out;
}

const short = (v) => (v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : +v.toPrecision(2) + "");

function legend(svg, keys, x, y, colors) {
  keys.forEach((k, i) => {
    svg.append(s("rect", { x: x + (i % 3) * 95, y: y + Math.floor(i / 3) * 15, width: 10, height: 10, fill: colors[i] }));
    svg.append(s("text", { x: x + 14 + (i % 3) * 95, y: y + 9 + Math.floor(i / 3) * 15 }, k));
  });
}

// bars: [{label, segments: [{key, value}], mark?}], keys: stacking order; capacity: dashed line (same unit).
export function stackedBars(svg, bars, keys, { unit = "GiB", capacity = null } = {}) {
  const W = 460, H = 300, L = 46, R = 10, T = 12, B = 78;
  reset(svg, W, H);
  const totals = bars.map((b) => b.segments.reduce((a, x) => a + x.value, 0));
  const top = Math.max(...totals, capacity || 0) * 1.05 || 1;
  const ticks = linearTicks(top);
  const ymax = ticks[ticks.length - 1];
  const y = (v) => T + (H - T - B) * (1 - v / ymax);
  for (const t of ticks) {
    svg.append(s("line", { class: "grid", x1: L, x2: W - R, y1: y(t), y2: y(t) }));
    svg.append(s("text", { x: L - 4, y: y(t) + 3, "text-anchor": "end" }, short(t)));
  }
  svg.append(s("text", { x: 10, y: T + (H - T - B) / 2, transform: `rotate(-90 10 ${T + (H - T - B) / 2})`, "text-anchor": "middle" }, `${unit} per GPU`));
  const slot = (W - L - R) / bars.length, bw = Math.min(60, slot * 0.6);
  bars.forEach((b, i) => {
    const x = L + slot * i + (slot - bw) / 2;
    let acc = 0;
    for (const seg of b.segments) {
      const color = PALETTE[keys.indexOf(seg.key) % PALETTE.length];
      const rect = s("rect", { x, y: y(acc + seg.value), width: bw, height: Math.max(0, y(acc) - y(acc + seg.value)), fill: color,
        "data-bar": b.label, "data-key": seg.key, "data-value": seg.value });
      rect.append(s("title", {}, `${b.label}: ${seg.key} ${seg.value} ${unit}`));
      svg.append(rect);
      acc += seg.value;
    }
    svg.append(s("text", { x: x + bw / 2, y: y(acc) - 3, "text-anchor": "middle" }, short(acc)));
    svg.append(s("text", { x: x + bw / 2, y: H - B + 14, "text-anchor": "middle", "font-weight": b.mark ? "700" : "400" }, b.label));
  });
  if (capacity) {
    svg.append(s("line", { class: "capacity", x1: L, x2: W - R, y1: y(capacity), y2: y(capacity), stroke: "#111", "stroke-dasharray": "5 4", "data-value": capacity }));
  }
  svg.append(s("line", { class: "axis", x1: L, x2: W - R, y1: y(0), y2: y(0) }));
  legend(svg, keys, L, H - B + 30, keys.map((_, i) => PALETTE[i % PALETTE.length]));
}

// One horizontal stacked bar: {key: seconds}, in the given key order.
export function hbar(svg, parts, keys, unit = "s") {
  const W = 460, H = 300, L = 12, R = 12;
  reset(svg, W, H);
  const total = keys.reduce((a, k) => a + (parts[k] || 0), 0) || 1;
  let x = L;
  const used = keys.filter((k) => parts[k] > 0);
  used.forEach((k) => {
    const w = (W - L - R) * parts[k] / total;
    const rect = s("rect", { x, y: 40, width: w, height: 46, fill: PALETTE[keys.indexOf(k) % PALETTE.length], "data-key": k, "data-value": parts[k] });
    rect.append(s("title", {}, `${k}: ${parts[k]} ${unit}`));
    svg.append(rect);
    x += w;
  });
  svg.append(s("text", { x: L, y: 28 }, `one step: ${short(total)} ${unit}`));
  used.forEach((k, i) => {
    const yy = 115 + i * 22;
    svg.append(s("rect", { x: L, y: yy - 10, width: 12, height: 12, fill: PALETTE[keys.indexOf(k) % PALETTE.length] }));
    svg.append(s("text", { x: L + 18, y: yy }, k));
    svg.append(s("text", { x: 200, y: yy, "text-anchor": "end" }, `${parts[k].toFixed(3)} ${unit}`));
    svg.append(s("text", { x: 260, y: yy, "text-anchor": "end" }, `${(100 * parts[k] / total).toFixed(1)} %`));
  });
}

// points: [{gpu, count, hours, usd, pareto, label}]: log hours on x, dollars on y.
export function pareto(svg, points) {
  const W = 700, H = 380, L = 58, R = 16, T = 14, B = 44;
  reset(svg, W, H);
  if (!points.length) {
    svg.append(s("text", { x: W / 2, y: H / 2, "text-anchor": "middle" }, "no GPU type and count fits this scenario"));
    return;
  }
  const hs = points.map((p) => p.hours), us = points.map((p) => p.usd);
  const lo = Math.min(...hs) / 1.3, hi = Math.max(...hs) * 1.3;
  const ulo = Math.min(...us), uhi = Math.max(...us);
  const pad = (uhi - ulo) * 0.08 || uhi * 0.1 || 1;
  const ut = linearTicks(uhi + pad, Math.max(0, ulo - pad));
  const umin = ut[0], umax = ut[ut.length - 1];
  const x = (h) => L + (W - L - R) * (Math.log(h / lo) / Math.log(hi / lo));
  const y = (u) => T + (H - T - B) * (1 - (u - umin) / (umax - umin));
  for (const t of logTicks(lo, hi)) {
    svg.append(s("line", { class: "grid", x1: x(t), x2: x(t), y1: T, y2: H - B }));
    svg.append(s("text", { x: x(t), y: H - B + 14, "text-anchor": "middle" }, short(t)));
  }
  for (const t of ut) {
    svg.append(s("line", { class: "grid", x1: L, x2: W - R, y1: y(t), y2: y(t) }));
    svg.append(s("text", { x: L - 5, y: y(t) + 3, "text-anchor": "end" }, `$${t >= 1000 ? t.toLocaleString("en-US") : short(t)}`));
  }
  svg.append(s("text", { x: (L + W - R) / 2, y: H - 8, "text-anchor": "middle" }, "hours (log scale)"));
  const gpus = [...new Set(points.map((p) => p.gpu))].sort();
  const front = points.filter((p) => p.pareto).sort((a, b) => a.hours - b.hours);
  if (front.length > 1) {
    svg.append(s("polyline", { class: "frontier", fill: "none", stroke: "#111", "stroke-dasharray": "5 4",
      points: front.map((p) => `${x(p.hours)},${y(p.usd)}`).join(" ") }));
  }
  for (const p of points) {
    const c = s("circle", { class: p.pareto ? "pt front" : "pt", cx: x(p.hours), cy: y(p.usd), r: 3.5 + Math.sqrt(p.count) * 1.5,
      fill: PALETTE[gpus.indexOf(p.gpu) % PALETTE.length], "data-gpu": p.gpu, "data-count": p.count,
      "data-hours": p.hours, "data-usd": p.usd, "data-pareto": p.pareto ? "true" : "false" });
    c.append(s("title", {}, `${p.label}: ${p.hours} h, $${p.usd}`));
    svg.append(c);
  }
  for (const p of front) svg.append(s("text", { x: x(p.hours) + 7, y: y(p.usd) - 6 }, `${p.count}x ${p.gpu}`));
  svg.append(s("line", { class: "axis", x1: L, x2: W - R, y1: H - B, y2: H - B }));
  svg.append(s("line", { class: "axis", x1: L, x2: L, y1: T, y2: H - B }));
}
