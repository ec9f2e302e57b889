// The page: builds the controls from what Python offers, sends each change to the worker and
// draws what comes back. It computes nothing: every number, label and verdict on the page is
// dpcost.explorer_model.explore's (Python), drawn with Vega-Lite through vega-embed.
const page = {
  state: "loading",  // loading | ready | failed
  renderedKey: null,  // the settings (JSON) whose answer is on screen
  updates: [],  // ms from a control change to the redrawn figures, one per update
  errors: {},  // control -> message, from the last answer
  last: null,  // the last answer, parsed
};
window.dpcostExplorer = page;  // for the browser test and the benchmark

const status = document.getElementById("status");
const form = document.getElementById("controls");
const boot = window.dpcostBoot || { messages: [] };  // index.html started the worker

let worker, controls, colors, views = {}, sent = 0, pending = null, queued = null;

function fail(message) {
  page.state = "failed";
  document.body.dataset.state = "failed";
  status.className = "failed";
  status.textContent = message;
  form.hidden = true;
}

const opening = readOpening();
let precomputed = Promise.resolve();  // the opening case drawn from the build's answer

// Run once the whole module is read (main() is called at its end).
function main() {
  // The opening case as book/build.py computed it (CPython, when the site was built): drawn at
  // once, marked as precomputed, with the controls disabled until Python answers here.
  if (opening && !location.hash.slice(1)) {
    precomputed = showPrecomputed(opening).catch((error) => console.error(error));
  }
  if (typeof WebAssembly !== "object" || typeof Worker !== "function") {
    fail("This browser cannot run WebAssembly or Web Workers, which this page needs to run " +
         "the course's Python models. Lesson 05 shows the explorer as a static snapshot " +
         "instead; a current Chrome, Edge, Firefox or Safari runs this page.");
  } else {
    start();
  }
}

function readOpening() {
  const element = document.getElementById("opening");
  return element ? JSON.parse(element.textContent) : null;
}

async function showPrecomputed(built) {
  controls = built.controls;
  colors = built.colors;
  buildForm(true);
  setForm(built.result.settings);
  document.body.dataset.shown = "precomputed";
  status.querySelector(".loading").textContent =
    "Loading Python (Pyodide, about 13 MB the first time) and the course's models… " +
    "Meanwhile the page shows the opening case as computed when this site was built " +
    "(precomputed); the controls come alive when Python answers here.";
  await show(built.result);
  if (page.state === "loading") page.precomputedMs = performance.now();
}

function start() {
  if (boot.startError || !boot.worker) {
    fail(`This browser could not start the page's Python worker (${boot.startError}). ` +
         "Lesson 05 shows the explorer as a static snapshot instead.");
    return;
  }
  worker = boot.worker;
  const onError = (message) => fail(`The Python worker stopped: ${message || "an error"}. ` +
                                    "Reload the page to try again.");
  worker.onerror = (event) => onError(event.message);
  worker.onmessage = (event) => received(event.data);
  if (boot.error) onError(boot.error);
  for (const message of boot.messages.splice(0)) received(message);  // sent before this ran
}

function received(message) {
  if (message.kind === "failed") fail(`Python could not start: ${message.message}`);
  else if (message.kind === "ready") ready(message).catch((e) => fail(String(e)));
  else if (message.kind === "result") answered(message);
}

async function ready(message) {
  if (!controls) {  // no precomputed case on screen (a linked case, or no build data)
    controls = message.controls;
    colors = opening ? opening.colors : await (await fetch("colors.json")).json();
    buildForm(false);
  }
  page.python = message.python;
  page.pythonStartSeconds = message.seconds;
  page.pythonPhases = message.phases;  // {pyodide, model}: seconds in the worker
  page.workerReadyMs = performance.now();
  request({ hash: location.hash }, performance.now());
  window.addEventListener("hashchange", () => {
    if (location.hash.slice(1) !== (page.last && page.last.hash)) {
      request({ hash: location.hash }, performance.now());
    }
  });
}

// --- the controls -------------------------------------------------------------------------

function buildForm(disabled) {
  for (const name of controls.order) {
    const field = document.createElement("div");
    field.className = "field";
    const label = document.createElement("label");
    label.append(controls.labels[name]);
    const options = controls.options[name];
    let input;
    if (options) {
      input = document.createElement("select");
      for (const [text, value] of options) input.add(new Option(text, String(value)));
    } else {
      input = document.createElement("input");
      input.type = "text";
      input.inputMode = name === "custom" ? "decimal" : "numeric";
      input.placeholder = name === "custom" ? "e.g. 1.5e9" : "";
    }
    input.name = name;
    input.id = `control-${name}`;
    input.disabled = disabled;
    label.append(input);
    const error = document.createElement("div");
    error.className = "error";
    error.id = `error-${name}`;
    error.setAttribute("role", "alert");
    field.append(label, error);
    form.append(field);
    // Text fields update when they are left or Enter is pressed, as the widget's Text does.
    input.addEventListener("change", () => changed(name));
  }
  form.addEventListener("submit", (event) => event.preventDefault());
  form.hidden = false;
}

page.formSettings = () => formSettings();

function formSettings() {
  const settings = {};
  for (const name of controls.order) settings[name] = form.elements[name].value;
  return settings;
}

function setForm(settings) {
  for (const name of controls.order) {
    if (name in settings) form.elements[name].value = String(settings[name]);
  }
  form.elements.custom.disabled = form.elements.model.value !== "custom";
}

page.busy = () => pending !== null || queued !== null;

function changed(name) {
  const began = performance.now();
  if (name === "model" && form.elements.model.value !== "custom") {
    // a new preset brings its own batch and outputs, as in the widget
    const defaults = controls.model_defaults[form.elements.model.value];
    form.elements.batch_size.value = String(defaults.batch_size);
    form.elements.outputs.value = String(defaults.outputs);
  }
  form.elements.custom.disabled = form.elements.model.value !== "custom";
  request({ settings: formSettings() }, began);
}

// --- talking to the worker: one request at a time, the latest wins -------------------------

function request(what, began) {
  if (pending) {
    queued = { what, began };
    return;
  }
  pending = { id: ++sent, began, key: what.settings ? JSON.stringify(what.settings) : null };
  worker.postMessage({ id: pending.id, ...what });
}

async function answered(message) {
  const asked = pending;
  const result = JSON.parse(message.json);
  await precomputed;  // its charts are built once, before the first live answer is drawn
  if (!queued) {
    let key = asked.key;
    if (key === null) {  // a link: the form follows it
      setForm(result.settings);
      key = JSON.stringify(formSettings());
    }
    await show(result);
    // What was asked, not the form now (it may have changed meanwhile), and only when no newer
    // request waits: then the answer on screen is the latest.
    page.renderedKey = queued ? null : key;
    page.updates.push(performance.now() - asked.began);
    page.lastPythonMs = message.pythonMs;
    if (page.state === "loading") {
      page.state = "ready";
      page.readyMs = performance.now();
      document.body.dataset.state = "ready";
      document.body.dataset.shown = "live";
      for (const input of form.elements) input.disabled = false;
      form.elements.custom.disabled = form.elements.model.value !== "custom";
    }
  }
  pending = null;
  if (queued) {
    const next = queued;
    queued = null;
    request(next.what, next.began);
  }
}

// --- drawing what Python returned ----------------------------------------------------------

async function show(result) {
  page.last = result;
  page.errors = result.errors || {};
  for (const name of controls.order) {
    document.getElementById(`error-${name}`).textContent = page.errors[name] || "";
  }
  document.getElementById("form-error").textContent = page.errors[""] || "";
  const hash = result.hash ? `#${result.hash}` : location.pathname + location.search;
  if (result.hash !== undefined) history.replaceState(null, "", hash);
  if (!result.ok) {
    document.body.dataset.ok = "false";
    return;  // the figures keep their last state, as in the widget
  }
  document.body.dataset.ok = "true";
  showReadout(result.readout);
  showSources(result.sources);
  if (!views.volume) await buildCharts(result);  // the first good answer: specs with its data
  const v = result.volume, s = result.steps, m = result.memory;
  views.volume.data("curves", v.rows).data("markers", v.markers).data("rules", v.rules);
  views.time.data("parts", s.parts).data("communication", s.communication)
    .data("labels", s.labels);
  views.memory.data("parts", m.parts).data("totals", m.totals).data("capacity", m.capacity);
  await Promise.all([views.volume.runAsync(), views.time.runAsync(), views.memory.runAsync()]);
}

function element(tag, text, attributes = {}) {
  const node = document.createElement(tag);
  if (text !== undefined) node.textContent = text;
  for (const [key, value] of Object.entries(attributes)) node.setAttribute(key, value);
  return node;
}

function showReadout(r) {
  const readout = document.getElementById("readout");
  const head = element("p");
  head.append(element("b", r.n), ` ${r.head}`);
  const table = element("table");
  const header = element("tr");
  for (const column of r.columns) header.append(element("th", column));
  table.append(header);
  for (const row of r.rows) {
    const tr = element("tr", undefined, { "data-row": row.name });
    const name = element("td");
    name.append(element("b", row.name));
    tr.append(name);
    if (row.span) {
      tr.append(element("td", row.span, { colspan: "4" }));
    } else {
      const keys = ["busiest_bytes", "total_s", "exposed_s", "hidden"];
      row.cells.forEach((text, i) => tr.append(element("td", text, {
        "data-key": keys[i], "data-value": JSON.stringify(row.values[keys[i]]) })));
      tr.dataset.values = JSON.stringify(row.values);
    }
    table.append(tr);
  }
  // which clock bounds the compute, DDP's buckets (the bucket cap's control) and host work
  const time = element("p", r.time_line, { class: "time" });
  time.dataset.values = JSON.stringify(r.time);
  const memory = element("p", r.memory_line, { class: "memory" });
  memory.dataset.values = JSON.stringify(r.memory);
  const verdict = element("p", r.verdict, { class: "verdict" });
  readout.replaceChildren(head, table, time, memory, verdict);
}

function showSources(lines) {
  const sources = document.getElementById("sources");
  sources.replaceChildren(...lines.flatMap(([name, text]) => {
    const line = element("div");
    line.append(element("b", name), `: ${text}`);
    return [line];
  }));
}

// --- the three figures: specs built once, data swapped on each change ----------------------

// SVG (crisp when projected or zoomed); ?renderer=canvas in the address picks a canvas
// (benchmarks/site_explorer.py --renderer compares: the same update times here).
const RENDERER = new URLSearchParams(location.search).get("renderer") === "canvas" ? "canvas"
  : "svg";
const FONT = { titleFontSize: 18, labelFontSize: 14, axisTitle: 15 };
const bytesLabel = "format(datum.value, '~s') + 'B'";
// Log axes: a label at each power of ten only (1 GB, 10 GB, ...), as the notebook's figure.
const decadeLabel = "indexof(format(datum.value, '.0e'), '1e') === 0 ? " +
  "format(datum.value, '~s') + 'B' : ''";
const secondsLabel = "format(datum.value, '~s') + 's'";
const config = {
  font: "system-ui, sans-serif",
  axis: { labelFontSize: FONT.labelFontSize, titleFontSize: FONT.axisTitle, titleFontWeight: "normal" },
  legend: { labelFontSize: 14, titleFontSize: 14, labelLimit: 320 },
  title: { fontSize: FONT.titleFontSize },
  view: { stroke: "#bbb" },
};

function volumeSpec() {
  const [copy, nccl, ddp] = controls.curves;
  const x = { field: "n", type: "quantitative", title: "number of GPUs, n (log scale)",
              scale: { type: "log", base: 2, domain: [1, 1024] },
              axis: { values: [1, 4, 16, 64, 256, 1024], format: "d" } };
  const y = { field: "bytes", type: "quantitative",
              title: "bytes on the busiest link (decimal, log scale)",
              scale: { type: "log" }, axis: { labelExpr: decadeLabel } };
  // One legend for the three series: colour, dash (the curves) and shape (the markers) share
  // the field, the domain and the legend's settings, so Vega-Lite draws them as one.
  const series = { field: "series", type: "nominal", title: null,
                   legend: { orient: "bottom", direction: "vertical", symbolStrokeWidth: 3,
                             symbolSize: 260 } };
  const domain = [copy, nccl, ddp];
  const color = { ...series, scale: { domain, range: [colors.dp, colors.dp, colors.ddp] } };
  const strokeDash = { ...series, scale: { domain, range: [[1, 0], [8, 5], [1, 0]] } };
  const shape = { ...series, scale: { domain, range: ["circle", "square", "circle"] } };
  // The vertical rules: the node's size (DataParallel's limit) dotted, the chosen n dashed.
  const rule = (test, dash) => ({
    data: { name: "rules" }, transform: [{ filter: test }],
    mark: { type: "rule", color: "#555", strokeWidth: 1.5, strokeDash: dash },
    encoding: { x: { ...x, title: null } } });
  const node = "indexof(datum.what, 'one node') === 0";
  return {
    width: 540, height: 340, config,
    title: "Bytes per training step",
    layer: [
      rule(node, [2, 3]),
      rule(`!(${node})`, [7, 4]),
      { data: { name: "rules" }, transform: [{ filter: node }],
        mark: { type: "text", angle: 270, align: "left", dx: 0, dy: -6, fontSize: 14,
                color: "#444" },
        encoding: { x: { ...x, title: null }, y: { value: 336 }, text: { field: "what" } } },
      { data: { name: "curves" }, mark: { type: "line", strokeWidth: 3 },
        encoding: { x, y, color, strokeDash } },
      { data: { name: "markers" }, mark: { type: "point", filled: true, size: 140 },
        encoding: { x, y, color, shape, tooltip: [{ field: "series" }, { field: "bytes", format: ".4~s" }] } },
    ],
  };
}

// The thin bar under each step: every communication, hidden under backward or not.
const ALL_COMMUNICATION = "all communication (hidden or not)";

function timeSpec() {
  const y = { field: "row", type: "nominal", title: null, sort: { field: "order", op: "min" },
              axis: { labelFontSize: 14, labelLimit: 200 } };
  const x = { field: "seconds", type: "quantitative", title: "seconds per training step (modelled)",
              axis: { labelExpr: secondsLabel, tickCount: 5 } };
  return {
    width: 480, height: 260, config,
    title: "Step time at the chosen n",
    layer: [
      { data: { name: "parts" }, mark: { type: "bar", height: 28 },
        encoding: { y, x: { ...x, stack: "zero" }, order: { field: "stack" },
                    color: { field: "part", type: "nominal", title: null,
                             scale: { domain: [...controls.step_parts, ALL_COMMUNICATION],
                                      range: [colors.compute, colors.dp, "#595959"] },
                             legend: { orient: "bottom", direction: "horizontal", columns: 2 } } } },
      { data: { name: "communication" },
        mark: { type: "bar", height: 6, yOffset: 20 },
        encoding: { y, x, color: { datum: ALL_COMMUNICATION, type: "nominal" } } },
      { data: { name: "labels" }, mark: { type: "text", align: "left", fontSize: 14 },
        encoding: { y, x, text: { field: "label" } } },
    ],
  };
}

function memorySpec() {
  const x = { field: "strategy", type: "nominal", title: null, sort: controls.strategies,
              axis: { labelAngle: 0, labelFontSize: 14 } };
  const y = { field: "bytes", type: "quantitative", title: "bytes per GPU (decimal)",
              axis: { labelExpr: bytesLabel } };
  return {
    width: 480, height: 320, config,
    title: "Memory per GPU: fits (✓) or not (✗)",
    layer: [
      { data: { name: "parts" }, mark: { type: "bar", width: 52 },
        encoding: { x, y: { ...y, stack: "zero" }, order: { field: "order" },
                    color: { field: "component", type: "nominal", title: null,
                             scale: { domain: controls.components,
                                      range: controls.components.map((c) => colors.components[c]) },
                             legend: { orient: "right" } } } },
      { data: { name: "capacity" }, mark: { type: "rule", strokeDash: [6, 4], size: 2, color: "#222" },
        encoding: { y } },
      { data: { name: "capacity" }, mark: { type: "text", align: "left", dx: 4, dy: -8, fontSize: 14 },
        encoding: { y, x: { value: 0 }, text: { field: "what" } } },
      { data: { name: "totals" }, mark: { type: "text", dy: -8, fontSize: 14 },
        encoding: { x, y, text: { field: "label" },
                    color: { condition: [{ test: "datum.fits === false", value: colors.dp },
                                         { test: "datum.fits === null", value: "#555" }],
                             value: "#2e7d32" } } },
    ],
  };
}

async function buildCharts(result) {
  // Errors only: an empty layer (no markers at n = 1) is meant, and Vega warns about it.
  const options = { actions: false, renderer: RENDERER, logLevel: vega.Error };
  const v = result.volume, s = result.steps, m = result.memory;
  const specs = {
    volume: { ...volumeSpec(), datasets: { curves: v.rows, markers: v.markers, rules: v.rules } },
    time: { ...timeSpec(), datasets: { parts: s.parts, communication: s.communication,
                                        labels: s.labels } },
    memory: { ...memorySpec(), datasets: { parts: m.parts, totals: m.totals,
                                            capacity: m.capacity } },
  };
  for (const [name, spec] of Object.entries(specs)) {
    views[name] = (await vegaEmbed(`#${name}`, spec, options)).view;
  }
}

main();
