// agenttune logview: runs and steps (left), a step's episodes (middle), one trajectory (right).
//
// Safety rule for this file: text from the logs (model output, tool results, task data, file names)
// reaches the page only as text nodes, `textContent` or attribute values. Never innerHTML.
"use strict";

const POLL_MS = 4000;
const PAGE_SIZE = 100;
const WARNED = new Set(["madness", "not_trainable"]);
const SERIES_COLOURS = ["#2563eb", "#ea580c", "#16a34a", "#9333ea"];

const state = {
  runs: [],
  runsJson: "",
  run: null,         // run id
  file: null,        // step file id
  fileSize: null,
  collapsed: new Set(),
  rows: [],
  selected: null,    // episode index within the file
  episode: null,     // the selected episode's full record
  tab: "conversation",
  query: { q: "", status: "", success: "", policy: "", min_reward: "", max_reward: "", sort: "index", order: "asc", offset: 0 },
  chartsJson: "",
  episodesTicket: 0,
  failed: new Set(), // the statuses that count as failures (the server says which)
};

// ---------- small DOM helpers ----------

function el(tag, props, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "dataset") Object.assign(node.dataset, value);
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  appendAll(node, children);
  return node;
}

function appendAll(node, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function svg(tag, attributes, ...children) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [key, value] of Object.entries(attributes || {})) node.setAttribute(key, String(value));
  appendAll(node, children);
  return node;
}

const $ = (id) => document.getElementById(id);

function setChildren(node, ...children) {
  node.replaceChildren();
  return appendAll(node, children);
}

function fmt(value, digits = 3) {
  if (value === null || value === undefined) return "—";
  if (typeof value !== "number") return String(value);
  if (Number.isInteger(value)) return String(value);
  return Number(value.toFixed(digits)).toString();
}

function bytes(size) {
  if (size < 1024) return `${size} B`;
  if (size < 1024 * 1024) return `${(size / 1024).toFixed(1)} kB`;
  if (size < 1024 ** 3) return `${(size / 1024 ** 2).toFixed(1)} MB`;
  return `${(size / 1024 ** 3).toFixed(2)} GB`;
}

function statusBadge(status) {
  const kind = state.failed.has(status) ? " failed" : WARNED.has(status) ? " warned" : "";
  return el("span", { class: "status" + kind }, status);
}

// ---------- talking to the server ----------

async function api(path, params) {
  const query = new URLSearchParams();
  for (const [key, value] of Object.entries(params || {})) {
    if (value !== "" && value !== null && value !== undefined) query.set(key, value);
  }
  const response = await fetch(`${path}?${query}`);
  if (!response.ok) {
    let message = `${response.status} ${response.statusText}`;
    try { message = (await response.json()).error || message; } catch (_) { /* not JSON */ }
    throw new Error(message);
  }
  return response.json();
}

function showError(error) {
  const banner = $("banner");
  if (!error) { banner.hidden = true; return; }
  banner.textContent = String(error.message || error);
  banner.hidden = false;
}

// ---------- left: runs and steps ----------

async function loadRuns() {
  const data = await api("/api/runs");
  $("root-path").textContent = data.root;
  $("root-path").title = data.root;
  const json = JSON.stringify(data.runs);
  if (json !== state.runsJson) {
    state.runsJson = json;
    state.runs = data.runs;
    if (!state.run && data.runs.length === 1) state.run = data.runs[0].id;
    renderRuns(data.exists);
  }
  return data;
}

function renderRuns(exists) {
  const container = $("runs");
  if (!state.runs.length) {
    setChildren(container, el("div", { class: "empty" },
      exists ? "No runs here yet (a run has a rollouts/ folder or metrics.jsonl)." : "Waiting for the run to start…"));
    return;
  }
  setChildren(container, state.runs.map((run) => {
    const open = !state.collapsed.has(run.id);
    const steps = run.steps.map((step) => el("li", {},
      el("button", {
        type: "button",
        class: `step split-${step.split || "other"}` + (step.id === state.file ? " selected" : ""),
        dataset: { file: step.id },
        title: step.name,
        onclick: () => selectStep(run.id, step.id),
      }, el("span", {}, step.step === null ? step.name : `step ${step.step} · ${step.split}`),
      el("span", { class: "size" }, bytes(step.size)))));
    return el("div", { class: "run" + (run.id === state.run ? " selected" : "") },
      el("button", { type: "button", class: "run-name", title: run.name, onclick: () => selectRun(run.id) },
        `${open ? "▾" : "▸"} ${run.name}`),
      open ? el("ul", { class: "steps" }, steps.length ? steps : el("li", { class: "muted" }, "no steps yet")) : null);
  }));
}

function selectRun(runId) {
  if (state.run === runId) {
    if (state.collapsed.has(runId)) state.collapsed.delete(runId); else state.collapsed.add(runId);
  }
  state.run = runId;
  state.chartsJson = "";
  renderRuns(true);
  writeHash();
  loadCharts().catch(showError);
}

function selectStep(runId, fileId) {
  const runChanged = state.run !== runId;
  state.run = runId;
  state.file = fileId;
  state.selected = null;
  state.query.offset = 0;
  if (runChanged) state.chartsJson = "";
  renderRuns(true);
  clearDetail();
  writeHash();
  loadCharts().catch(showError); // unchanged charts are not redrawn
  loadEpisodes().catch(showError);
}

function findStep(fileId) {
  for (const run of state.runs) for (const step of run.steps) if (step.id === fileId) return step;
  return null;
}

// ---------- middle: charts ----------

async function loadCharts() {
  const run = state.runs.find((candidate) => candidate.id === state.run);
  if (!run || !run.has_metrics) { $("charts").hidden = true; state.chartsJson = ""; return; }
  const data = await api("/api/metrics", { run: run.id });
  const json = JSON.stringify(data);
  if (json === state.chartsJson || run.id !== state.run) return;
  state.chartsJson = json;
  $("charts-title").textContent = `${run.name} · ${data.steps} step${data.steps === 1 ? "" : "s"} in metrics.jsonl`;
  setChildren($("chart-row"), data.charts.map(drawChart));
  $("charts").hidden = false;
}

// Enough decimals that the three tick labels of a small range still differ.
function tickDigits(span) {
  return Math.min(6, Math.max(0, Math.ceil(-Math.log10(span / 2)) + 1));
}

function drawChart(chart) {
  const width = 320, height = 130, right = 8, top = 8, bottom = 20;
  const series = chart.series.filter((line) => line.points.length);
  const box = el("div", { class: "chart", dataset: { title: chart.title } }, el("h3", {}, chart.title));
  if (!series.length) return appendAll(box, [el("div", { class: "muted" }, "no data yet")]);
  const points = series.flatMap((line) => line.points);
  const steps = points.map((p) => p[0]);
  let [x0, x1] = [Math.min(...steps), Math.max(...steps)];
  if (x0 === x1) { x0 -= 1; x1 += 1; }
  let y0, y1;
  if (chart.fraction) { y0 = 0; y1 = 1; } else {
    const values = points.map((p) => p[1]);
    y0 = Math.min(...values); y1 = Math.max(...values);
    const pad = y1 === y0 ? Math.max(Math.abs(y0) * 0.1, 0.5) : (y1 - y0) * 0.1;
    y0 -= pad; y1 += pad;
  }
  const ticks = [y0, (y0 + y1) / 2, y1].map((value) => [value,
    chart.fraction ? `${Math.round(value * 100)}%` : value.toFixed(tickDigits(y1 - y0))]);
  const left = 10 + 5.6 * Math.max(...ticks.map(([, label]) => label.length)); // room for the labels
  const x = (step) => left + ((step - x0) / (x1 - x0)) * (width - left - right);
  const y = (value) => top + (1 - (value - y0) / (y1 - y0)) * (height - top - bottom);
  const plot = svg("svg", { viewBox: `0 0 ${width} ${height}`, role: "img" });
  for (const [tick, label] of ticks) {
    plot.append(svg("line", { class: "grid", x1: left, x2: width - right, y1: y(tick), y2: y(tick) }));
    plot.append(svg("text", { x: left - 3, y: y(tick) + 3, "text-anchor": "end" }, label));
  }
  plot.append(svg("line", { class: "axis", x1: left, x2: width - right, y1: height - bottom, y2: height - bottom }));
  const labelled = [...new Set(steps)].sort((a, b) => a - b);
  const shown = labelled.length <= 8 ? labelled : [labelled[0], labelled[Math.floor(labelled.length / 2)], labelled[labelled.length - 1]];
  shown.forEach((step, i) => {
    const anchor = shown.length > 1 && i === shown.length - 1 ? "end" : i === 0 && shown.length > 1 ? "start" : "middle";
    plot.append(svg("text", { x: x(step), y: height - 6, "text-anchor": anchor }, i === 0 ? `step ${step}` : String(step)));
  });
  const legend = el("div", { class: "legend" });
  chart.series.forEach((line, number) => {
    if (!line.points.length) return;
    const colour = SERIES_COLOURS[number % SERIES_COLOURS.length];
    const path = line.points.map((p, i) => `${i ? "L" : "M"}${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join(" ");
    plot.append(svg("path", { d: path, fill: "none", stroke: colour, "stroke-width": 1.6 }));
    for (const [step, value] of line.points) {
      plot.append(svg("circle", { cx: x(step), cy: y(value), r: 2.4, fill: colour },
        svg("title", {}, `${line.label}, step ${step}: ${fmt(value, 4)}`)));
    }
    const last = line.points[line.points.length - 1][1];
    const swatch = el("span", { class: "swatch" });
    swatch.style.background = colour; // CSSOM, not a style attribute: the CSP forbids inline styles
    legend.append(el("span", { dataset: { key: line.key } }, swatch,
      `${line.label} ${chart.fraction ? `${(last * 100).toFixed(1)}%` : fmt(last)}`));
  });
  return appendAll(box, [plot, legend]);
}

// ---------- middle: the episode table ----------

async function loadEpisodes() {
  if (!state.file) return;
  const step = findStep(state.file);
  state.fileSize = step ? step.size : null;
  $("step-title").textContent = step ? (step.step === null ? step.name : `Step ${step.step} · ${step.split}`) : state.file;
  const ticket = ++state.episodesTicket;
  const data = await api("/api/episodes", { file: state.file, limit: PAGE_SIZE, ...state.query });
  if (ticket !== state.episodesTicket) return; // a newer request (another step, filter, page) is on its way
  $("step-view").hidden = false;
  state.failed = new Set(data.failed_statuses);
  state.rows = data.episodes;
  renderStatusFilter(data.statuses);
  renderPolicyFilter(data.policies || {});
  renderEpisodes(data);
}

function renderStatusFilter(counts) {
  const select = $("status-filter");
  const current = state.query.status;
  const total = Object.values(counts).reduce((a, b) => a + b, 0);
  const failed = Object.entries(counts).filter(([status]) => state.failed.has(status)).reduce((a, [, n]) => a + n, 0);
  const options = [el("option", { value: "" }, `status: any (${total})`)];
  if (failed) options.push(el("option", { value: "failed" }, `failed (${failed})`));
  for (const [status, count] of Object.entries(counts).sort()) options.push(el("option", { value: status }, `${status} (${count})`));
  setChildren(select, options);
  select.value = current;
}

// Several policies in one run: which episodes have samples of each (docs/multi_policy.md); hidden otherwise.
function renderPolicyFilter(counts) {
  const select = $("policy-filter");
  const current = state.query.policy;
  const names = Object.keys(counts).sort();
  select.hidden = !names.length && !current;
  const options = [el("option", { value: "" }, "policy: any")];
  for (const name of names) options.push(el("option", { value: name }, `${name} (${counts[name]})`));
  if (current && !names.includes(current)) options.push(el("option", { value: current }, `${current} (0)`));
  setChildren(select, options);
  select.value = current;
}

function renderEpisodes(data) {
  const tbody = $("episodes").querySelector("tbody");
  setChildren(tbody, data.episodes.map((row) => {
    const tr = el("tr", {
      dataset: { index: row.index },
      class: row.index === state.selected ? "selected" : "",
      title: row.error ? `${row.query}\n\n${row.error}` : row.query,
      onclick: () => selectEpisode(row.index),
    },
    el("td", { class: "num" }, row.index),
    el("td", {}, row.task_id),
    el("td", { class: "num" }, row.repeat_index),
    el("td", {}, statusBadge(row.status)),
    el("td", { class: "num" }, fmt(row.reward)),
    el("td", {}, row.success === null ? "—" : row.success ? el("span", { class: "yes" }, "✓") : el("span", { class: "no" }, "✗")),
    el("td", {}, (row.policies || []).join(", ") || "—"),
    el("td", { class: "num" }, fmt(row.turns)),
    el("td", { class: "num" }, fmt(row.duration_s, 1)));
    return tr;
  }));
  if (!data.episodes.length) tbody.append(el("tr", {}, el("td", { colspan: 9, class: "muted" }, "No episodes match.")));
  const from = data.matched ? data.offset + 1 : 0;
  const to = data.offset + data.episodes.length;
  const filtered = data.matched !== data.total ? ` (${data.total.toLocaleString()} in the step)` : "";
  $("page-info").textContent = `${from.toLocaleString()}–${to.toLocaleString()} of ${data.matched.toLocaleString()}${filtered}`;
  $("prev").disabled = data.offset === 0;
  $("next").disabled = to >= data.matched;
  for (const th of document.querySelectorAll("#episodes th")) {
    th.classList.toggle("sorted-asc", th.dataset.sort === state.query.sort && state.query.order === "asc");
    th.classList.toggle("sorted-desc", th.dataset.sort === state.query.sort && state.query.order === "desc");
  }
}

function changeQuery(changes) {
  Object.assign(state.query, { offset: 0 }, changes);
  loadEpisodes().catch(showError);
}

function setUpControls() {
  let timer = null;
  $("search").addEventListener("input", (event) => {
    clearTimeout(timer);
    timer = setTimeout(() => changeQuery({ q: event.target.value.trim() }), 250);
  });
  $("status-filter").addEventListener("change", (event) => changeQuery({ status: event.target.value }));
  $("success-filter").addEventListener("change", (event) => changeQuery({ success: event.target.value }));
  $("policy-filter").addEventListener("change", (event) => changeQuery({ policy: event.target.value }));
  for (const id of ["min-reward", "max-reward"]) {
    $(id).addEventListener("change", (event) => changeQuery({ [id.replace("-", "_")]: event.target.value }));
  }
  for (const th of document.querySelectorAll("#episodes th[data-sort]")) {
    th.addEventListener("click", () => {
      const same = state.query.sort === th.dataset.sort;
      changeQuery({ sort: th.dataset.sort, order: same && state.query.order === "asc" ? "desc" : "asc" });
    });
  }
  $("prev").addEventListener("click", () => { state.query.offset = Math.max(0, state.query.offset - PAGE_SIZE); loadEpisodes().catch(showError); });
  $("next").addEventListener("click", () => { state.query.offset += PAGE_SIZE; loadEpisodes().catch(showError); });
  for (const button of document.querySelectorAll(".tabs button")) {
    button.addEventListener("click", () => showTab(button.dataset.tab));
  }
  document.addEventListener("keydown", (event) => {
    if (event.target.closest("input, select, textarea") || !state.rows.length) return;
    const step = { ArrowDown: 1, j: 1, ArrowUp: -1, k: -1 }[event.key];
    if (!step) return;
    event.preventDefault();
    const position = state.rows.findIndex((row) => row.index === state.selected);
    const next = state.rows[Math.min(state.rows.length - 1, Math.max(0, position + step))];
    if (next) selectEpisode(next.index);
  });
}

// ---------- right: one trajectory ----------

function clearDetail() {
  state.episode = null;
  $("detail").hidden = true;
  $("detail-empty").hidden = false;
}

async function selectEpisode(index) {
  state.selected = index;
  for (const tr of document.querySelectorAll("#episodes tbody tr")) {
    const selected = Number(tr.dataset.index) === index;
    tr.classList.toggle("selected", selected);
    if (selected) tr.scrollIntoView({ block: "nearest" });
  }
  writeHash();
  const file = state.file;
  const record = await api("/api/episode", { file, index });
  if (file !== state.file || index !== state.selected) return; // the user moved on meanwhile
  state.episode = record;
  renderEpisode(record);
}

function renderEpisode(record) {
  $("detail-empty").hidden = true;
  $("detail").hidden = false;
  if (record.unreadable) {
    setChildren($("episode-header"), el("div", { class: "error-box" }, record.error));
    for (const id of ["tab-conversation", "tab-tokens", "tab-record"]) setChildren($(id));
    return;
  }
  renderHeader(record);
  setChildren($("tab-conversation"), renderConversation(record));
  setChildren($("tab-tokens"), renderTokens(record));
  setChildren($("tab-record"), renderRecord(record));
  showTab(state.tab);
}

function renderHeader(record) {
  const task = record.task || {};
  const metrics = record.metrics || {};
  setChildren($("episode-header"),
    el("div", { class: "title" }, `${task.task_id ?? ""} `, el("span", { class: "muted" }, `#${record.repeat_index ?? 0}`)),
    el("div", { class: "facts" },
      statusBadge(record.status),
      el("span", {}, "reward ", el("b", {}, fmt(record.reward, 4))),
      el("span", {}, "success ", el("b", {}, record.success ? "yes" : "no")),
      el("span", {}, "turns ", el("b", {}, fmt(metrics.calls))),
      el("span", {}, "samples ", el("b", {}, (record.samples || []).length)),
      el("span", {}, "time ", el("b", {}, `${fmt(record.duration_s, 2)} s`)),
      el("span", { class: "mono", title: "episode id" }, record.episode_id)),
    record.error ? el("details", { class: "error-box" }, el("summary", {}, firstLine(record.error)), el("pre", {}, record.error)) : null);
}

function firstLine(text) {
  const line = String(text).split("\n").find((part) => part.trim()) || "";
  return line.length > 160 ? line.slice(0, 159) + "…" : line;
}

function showTab(tab) {
  state.tab = tab;
  for (const button of document.querySelectorAll(".tabs button")) button.classList.toggle("active", button.dataset.tab === tab);
  for (const name of ["conversation", "tokens", "record"]) $(`tab-${name}`).hidden = name !== tab;
}

// The conversation, in OpenAI message form.
function renderConversation(record) {
  const messages = record.messages || [];
  if (!messages.length) {
    return el("div", { class: "empty" }, "No conversation was recorded for this episode.",
      record.task && record.task.query ? el("pre", {}, `\nTask query:\n${record.task.query}`) : null);
  }
  return messages.map((message) => {
    const role = String(message.role || "unknown");
    const extra = [message.name, message.tool_call_id ? `call ${message.tool_call_id}` : null].filter(Boolean).join(" · ");
    return el("div", { class: `msg ${role}` },
      el("div", { class: "msg-head" }, role === "tool" ? "tool result" : role, extra ? el("span", { class: "extra" }, extra) : null),
      message.reasoning_content ? el("details", { class: "reasoning", open: true },
        el("summary", {}, "reasoning"), el("div", {}, message.reasoning_content)) : null,
      hasContent(message.content) ? el("div", { class: "msg-body" }, contentText(message.content)) : null,
      (message.tool_calls || []).map(renderToolCall));
  });
}

function hasContent(content) {
  return !(content === null || content === undefined || content === "" || (Array.isArray(content) && !content.length));
}

function contentText(content) {
  if (typeof content === "string") return content;
  if (Array.isArray(content)) {
    return content.map((part) => (part && part.type === "text" ? part.text : JSON.stringify(part))).join("\n");
  }
  return JSON.stringify(content, null, 2);
}

function renderToolCall(call) {
  const fn = call.function || {};
  let args = fn.arguments ?? "";
  try { args = JSON.stringify(JSON.parse(args), null, 2); } catch (_) { /* shown as sent */ }
  return el("div", { class: "tool-call" },
    el("div", {}, "→ ", el("span", { class: "name" }, fn.name || "?"), call.id ? el("span", { class: "muted" }, `  ${call.id}`) : null),
    el("pre", {}, typeof args === "string" ? args : JSON.stringify(args)));
}

// The token view: every sample's prompt and response, one span per token.
function renderTokens(record) {
  const samples = record.samples || [];
  const legend = el("div", { class: "legend-tokens" },
    el("span", {}, el("span", { class: "tok loss" }, " trained "), " generated, carries loss"),
    el("span", {}, el("span", { class: "tok ctx" }, " context "), " tool results, user turns, template"),
    el("span", {}, el("span", { class: "tok prompt" }, " prompt "), " the first prompt (context)"),
    el("span", { class: "muted" }, "Hover a token for its id, text and logprob."));
  if (!samples.length) return [legend, el("div", { class: "empty" }, "This episode has no samples (no LLM call produced tokens).")];
  const container = el("div", {}, legend, samples.map((sample, number) => renderSample(sample, number, samples.length)));
  container.addEventListener("mouseover", onTokenHover);
  container.addEventListener("mouseout", (event) => { if (event.target.classList.contains("tok")) hideTooltip(); });
  return container;
}

function renderSample(sample, number, count) {
  const response = sample.response_ids || [];
  const trained = (sample.loss_mask || []).reduce((a, b) => a + b, 0);
  return el("div", { class: "sample", dataset: { sample: number } },
    el("div", { class: "sample-head" },
      el("b", {}, `Sample ${number + 1} of ${count}`),
      ` · agent ${sample.agent ?? "default"}${sample.policy ? ` · policy ${sample.policy}` : ""} · ${sample.num_calls ?? 1} call${sample.num_calls === 1 ? "" : "s"} merged · `,
      `prompt ${(sample.prompt_ids || []).length} tokens · response ${response.length} tokens, ${trained} trained`,
      sample.trainable === false ? el("span", { class: "tag" }, "not trainable") : null),
    el("details", { class: "part", open: true },
      el("summary", { class: "part-label" }, "prompt"),
      tokenRun(number, "p", sample.prompt_ids || [], sample.prompt_tokens || [], null)),
    el("div", { class: "part" },
      el("div", { class: "part-label" }, "response"),
      tokenRun(number, "r", response, sample.response_tokens || [], sample.loss_mask || [])));
}

function tokenRun(sampleNumber, part, ids, texts, mask) {
  const box = document.createElement("div");
  box.className = "tokens";
  const fragment = document.createDocumentFragment();
  for (let i = 0; i < ids.length; i++) {
    const span = document.createElement("span");
    const known = i < texts.length;
    span.className = "tok " + (mask === null ? "prompt" : mask[i] ? "loss" : "ctx") + (known ? "" : " noid")
      + (known && /^<\|.*\|>$|^<\/?[a-z_]+>$/.test(texts[i]) ? " special" : "");
    span.dataset.s = sampleNumber;
    span.dataset.p = part;
    span.dataset.i = i;
    span.textContent = known ? visible(texts[i]) : `[${ids[i]}]`;
    fragment.append(span);
  }
  box.append(fragment);
  return box;
}

// Whitespace-only tokens would be invisible: mark newlines (and keep the line break) and empty text.
function visible(text) {
  if (text === "") return "∅";
  return text.includes("\n") ? text.replace(/\n/g, "↵\n") : text;
}

function onTokenHover(event) {
  const span = event.target;
  if (!span.classList || !span.classList.contains("tok") || span.dataset.s === undefined) return;
  const sample = state.episode.samples[Number(span.dataset.s)];
  const i = Number(span.dataset.i);
  const prompt = span.dataset.p === "p";
  const ids = prompt ? sample.prompt_ids : sample.response_ids;
  const texts = (prompt ? sample.prompt_tokens : sample.response_tokens) || [];
  const trained = !prompt && sample.loss_mask[i] === 1;
  const logprob = trained ? sample.logprobs[i] : null;
  const rows = [
    ["id", String(ids[i])],
    ["text", i < texts.length ? JSON.stringify(texts[i]) : "(no text logged)"],
    ["logprob", trained ? `${logprob.toFixed(4)}  (p = ${Math.exp(logprob).toFixed(3)})` : "— (context: not sampled)"],
    ["kind", trained ? "trained (loss mask 1)" : prompt ? "prompt (context)" : "context (loss mask 0)"],
    // Asynchronous training: which policy version (optimizer step) sampled the token.
    ...(!prompt && sample.policy_versions && sample.policy_versions[i] >= 0
      ? [["policy version", String(sample.policy_versions[i])]] : []),
    ["position", `${prompt ? "prompt" : "response"} token ${i + 1} of ${ids.length}, sample ${Number(span.dataset.s) + 1}`],
  ];
  const tooltip = $("tooltip");
  setChildren(tooltip, rows.map(([key, value]) => el("div", { class: "row", dataset: { key } },
    el("span", { class: "key" }, key), el("span", { class: "value" }, value))));
  tooltip.hidden = false;
  const rect = span.getBoundingClientRect();
  const width = tooltip.offsetWidth, height = tooltip.offsetHeight;
  const left = Math.min(window.innerWidth - width - 8, Math.max(8, rect.left));
  const top = rect.bottom + 6 + height > window.innerHeight ? rect.top - height - 6 : rect.bottom + 6;
  tooltip.style.left = `${left}px`;
  tooltip.style.top = `${Math.max(8, top)}px`;
}

function hideTooltip() { $("tooltip").hidden = true; }

// Everything else in the record: task, output, judge details, metrics.
function renderRecord(record) {
  const task = record.task || {};
  const facts = [["episode", record.episode_id], ["group", record.group_id], ["repeat", record.repeat_index],
    ["step", record.step], ["split", record.split], ["status", record.status], ["reward", record.reward],
    ["success", record.success], ["started", record.started_at ? new Date(record.started_at * 1000).toLocaleString() : "—"],
    ["duration", `${fmt(record.duration_s, 3)} s`], ["schema", record.schema_version]];
  const section = (title, value) => el("div", { class: "record-section" }, el("h3", {}, title),
    el("pre", {}, typeof value === "string" ? value : JSON.stringify(value, null, 2)));
  return [
    el("dl", { class: "kv" }, facts.flatMap(([key, value]) => [el("dt", {}, key), el("dd", {}, String(value ?? "—"))])),
    section("task query", task.query ?? ""),
    section("task", { task_id: task.task_id, env_type: task.env_type, metadata: task.metadata, init_messages: task.init_messages }),
    section("workflow output", record.output || {}),
    section("judge details", record.judge_details || {}),
    section("metrics", record.metrics || {}),
    record.error ? section("error", record.error) : null,
  ];
}

// ---------- the address bar: run, step and episode survive a reload ----------

function writeHash() {
  const params = new URLSearchParams();
  if (state.run) params.set("run", state.run);
  if (state.file) params.set("file", state.file);
  if (state.selected !== null) params.set("episode", state.selected);
  history.replaceState(null, "", `#${params}`);
}

function readHash() {
  const params = new URLSearchParams(location.hash.slice(1));
  return { run: params.get("run"), file: params.get("file"), episode: params.get("episode") };
}

// ---------- live updates ----------

async function poll() {
  try {
    await loadRuns();
    if (state.run) await loadCharts();
    const step = state.file && findStep(state.file);
    if (step && step.size !== state.fileSize) await loadEpisodes(); // the step is still being written
    showError(null);
    $("live").classList.remove("down");
    $("live").textContent = `live · updated ${new Date().toLocaleTimeString()}`;
  } catch (error) {
    $("live").classList.add("down");
    $("live").textContent = `cannot reach the viewer: ${error.message}`;
  }
}

async function start() {
  setUpControls();
  try {
    await loadRuns();
    const saved = readHash();
    if (saved.run && state.runs.some((run) => run.id === saved.run)) state.run = saved.run;
    if (saved.file && findStep(saved.file)) {
      const owner = state.runs.find((run) => run.steps.some((step) => step.id === saved.file));
      selectStep(owner.id, saved.file);
      if (saved.episode !== null) await selectEpisode(Number(saved.episode));
    } else if (state.runs.length === 1 && state.runs[0].steps.length) {
      // One run (a run directory, `train --with-logview`): open its latest train step right away.
      const steps = state.runs[0].steps;
      const latest = [...steps].reverse().find((step) => step.split === "train") || steps[steps.length - 1];
      selectStep(state.runs[0].id, latest.id);
    } else if (state.run) {
      renderRuns(true);
      await loadCharts();
    }
  } catch (error) {
    showError(error);
  }
  $("live").textContent = `live · updated ${new Date().toLocaleTimeString()}`;
  setInterval(poll, POLL_MS);
}

document.addEventListener("DOMContentLoaded", start);
