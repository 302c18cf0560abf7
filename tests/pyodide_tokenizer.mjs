// Runs a Python file inside Pyodide under Node, with this checkout's pyshim (not the vendored wheel),
// the vendored wheels it needs, and the host file system mounted at /host (PYSHIM_LLAMACPP_VOCABS, when
// set, is passed on with that prefix). Prints the Python result.
//     node tests/pyodide_tokenizer.mjs tests/pyodide_tokenizer_check.py
// Used by tests/test_tokenizer_pyodide.py; needs `pyshim setup` (web/vendor).
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const vendor = path.join(root, "web", "vendor");
const { loadPyodide } = await import(pathToFileURL(path.join(vendor, "pyodide", "pyodide.mjs")).href);

const py = await loadPyodide({ indexURL: path.join(vendor, "pyodide") + "/" });
await py.loadPackage(["numpy", "micropip"], { messageCallback: () => {} });
py.FS.mkdirTree("/host");
py.FS.mount(py.FS.filesystems.NODEFS, { root: "/" }, "/host");
const manifest = JSON.parse(fs.readFileSync(path.join(vendor, "manifest.json"), "utf8"));
const wheels = manifest.wheels.map((w) => w.url).filter((u) => !u.includes("pyshim-"))
  .map((u) => "emfs:/host" + path.join(vendor, u));
py.globals.set("_wheels", py.toPy(wheels));
py.globals.set("_root", "/host" + root);
py.globals.set("_vocabs", process.env.PYSHIM_LLAMACPP_VOCABS ? "/host" + path.resolve(process.env.PYSHIM_LLAMACPP_VOCABS) : "");
await py.runPythonAsync("import micropip, os, sys\nawait micropip.install(_wheels, deps=False)\n" +
  "sys.path.insert(0, _root)\nif _vocabs: os.environ['PYSHIM_LLAMACPP_VOCABS'] = _vocabs");
const script = fs.readFileSync(process.argv[2], "utf8");
console.log(await py.runPythonAsync(script));
