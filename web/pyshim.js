// pyshim's public JavaScript entry: run a GGUF model in this page through OpenAI-shaped calls.
//
//   import { createEngine } from "https://<site>/pyshim.js";
//   const engine = await createEngine({ model: "smollm2", onProgress: (p) => console.log(p.phase, p.fraction) });
//   const reply = await engine.chat.completions.create({ messages: [{ role: "user", content: "Hi" }] });
//   for await (const chunk of await engine.chat.completions.create({ messages, stream: true })) {
//     console.log(chunk.choices[0].delta.content ?? "");
//   }
//
// `model`: a short name ("smollm2", "gemma3", "qwen2.5"), a file the dev server lists, a .gguf URL, or
// a stored model's id. It is downloaded into this site's IndexedDB store once (resumable, verified)
// and loaded from there onto the GPU. Each engine has its own Worker (Python, WebGPU, the weights),
// or with `shared: true` the pages of this origin share one (a SharedWorker: one copy of the weights);
// requests run one at a time. Bad requests reject with an APIError: `status` 400 and OpenAI's
// error object in `body` ({error: {message, type, param, code}}). See web/engine/engine.js.

export { createEngine, Engine } from "./engine/engine.js";
export { APIError } from "./engine/openai.js";
// Serve an engine to same-origin OpenAI clients (the service worker's /v1): `const base = await
// endpointReady(); serveOpenAI(engine);` then `new OpenAI({baseURL: base, apiKey: "none", dangerouslyAllowBrowser: true})`.
export { endpointReady, serveOpenAI } from "./engine/host.js";
