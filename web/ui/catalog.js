// Models the site knows about without asking any server.
//
// KNOWN_FILES: files whose exact bytes are known (the ones `pyshim setup` places), matched by name and
// size wherever they come from (the dev server, a URL, a local file), so their download is checked
// against the whole-file SHA-256.
// CATALOG: well-known GGUF files on the Hugging Face hub. Sizes are approximate (the server's real
// size is what the store uses) and there are no checksums: they could not be verified from here.

// Defined once, in Python (pyshim/setup/catalog.py), and written by `pyshim setup` to vendor/definitions.js:
// `short` is pyshim's short name for the file, which createEngine({model}) accepts.
import { KNOWN_FILES } from "../vendor/definitions.js";

export { KNOWN_FILES };

export function expectedSha256(fileName, size) {
  return KNOWN_FILES.find((k) => k.file === fileName && (size == null || k.size === size))?.sha256 ?? null;
}

const HF = "https://huggingface.co";

export const CATALOG = [
  { name: "SmolLM2 135M Instruct", detail: "llama · Q8_0 · chat", approxBytes: 145e6,
    url: `${HF}/HuggingFaceTB/SmolLM2-135M-Instruct-GGUF/resolve/main/smollm2-135m-instruct-q8_0.gguf` },
  { name: "SmolLM2 360M Instruct", detail: "llama · Q8_0 · chat", approxBytes: 386e6,
    url: `${HF}/HuggingFaceTB/SmolLM2-360M-Instruct-GGUF/resolve/main/smollm2-360m-instruct-q8_0.gguf` },
  { name: "Qwen2.5 0.5B Instruct", detail: "qwen2 · Q4_K_M · chat", approxBytes: 491e6,
    url: `${HF}/Qwen/Qwen2.5-0.5B-Instruct-GGUF/resolve/main/qwen2.5-0.5b-instruct-q4_k_m.gguf` },
  { name: "Qwen2.5 Coder 0.5B Instruct", detail: "qwen2 · Q4_K_M · code", approxBytes: 491e6,
    url: `${HF}/Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF/resolve/main/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf` },
  { name: "Gemma 3 270M Instruct", detail: "gemma3 · Q4_K_M · chat", approxBytes: 253e6,
    url: `${HF}/unsloth/gemma-3-270m-it-GGUF/resolve/main/gemma-3-270m-it-Q4_K_M.gguf` },
  { name: "Qwen2.5 1.5B Instruct", detail: "qwen2 · Q4_K_M · chat", approxBytes: 1.12e9,
    url: `${HF}/Qwen/Qwen2.5-1.5B-Instruct-GGUF/resolve/main/qwen2.5-1.5b-instruct-q4_k_m.gguf` },
];
