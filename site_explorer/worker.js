// The Python side: Pyodide (CPython on WebAssembly) in a Web Worker, so the page never freezes.
// It loads the course's pure models from this site (dpcost_model.zip, written by book/build.py)
// and answers each request with dpcost.explorer_model.explore_json: JSON in, JSON out.
import { loadPyodide } from "./vendor/pyodide/pyodide.mjs";

const here = (path) => new URL(path, import.meta.url).href;

async function start() {
  const began = performance.now();
  const phases = {};  // seconds each step took, for benchmarks/site_explorer.py
  const archive = fetch(here("./dpcost_model.zip"));  // meanwhile
  const pyodide = await loadPyodide({ indexURL: here("./vendor/pyodide/") });
  phases.pyodide = (performance.now() - began) / 1000;
  const response = await archive;
  if (!response.ok) throw new Error(`dpcost_model.zip: HTTP ${response.status}`);
  pyodide.unpackArchive(await response.arrayBuffer(), "zip", { extractDir: "/home/pyodide/site" });
  pyodide.runPython("import sys; sys.path.insert(0, '/home/pyodide/site')");
  const imported = performance.now();
  const model = pyodide.pyimport("dpcost.explorer_model");
  const controls = JSON.parse(pyodide.runPython(
    "import json; from dpcost.explorer_model import controls; json.dumps(controls())"));
  phases.model = (performance.now() - imported) / 1000;
  return { model, controls, phases, python: pyodide.runPython("import sys; sys.version.split()[0]"),
           seconds: (performance.now() - began) / 1000 };
}

const ready = start();

ready.then(
  ({ controls, phases, python, seconds }) => postMessage(
    { kind: "ready", controls, phases, python, seconds }),
  (error) => postMessage({ kind: "failed", message: String(error && error.message || error) }));

onmessage = async (event) => {
  const { id, settings, hash } = event.data;
  let model;
  try {
    ({ model } = await ready);
  } catch (error) {
    return;  // "failed" was posted once already
  }
  let request = settings;
  if (hash !== undefined) {  // a link: the settings its fragment names, still as text
    const proxy = model.settings_from_hash(hash);
    request = proxy.toJs({ dict_converter: Object.fromEntries });
    proxy.destroy();
  }
  const began = performance.now();
  // explore_json never raises: an unexpected error comes back as an error message.
  const json = model.explore_json(JSON.stringify(request));
  postMessage({ kind: "result", id, json, pythonMs: performance.now() - began });
};
