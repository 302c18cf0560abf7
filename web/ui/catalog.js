// Models the site knows about without asking any server.
//
// KNOWN_FILES: files whose exact bytes are known (the ones `pyshim setup` places), matched by name and
// size wherever they come from (the dev server, a URL, a local file), so their download is checked
// against the whole-file SHA-256.
// CATALOG: well-known GGUF files on the Hugging Face hub. Sizes are approximate (the server's real
// size is what the store uses) and there are no checksums: they could not be verified from here.

// `short` is pyshim's short name for the file (pyshim/setup/catalog.py), which createEngine({model}) accepts.
export const KNOWN_FILES = [
  { short: "smollm2", file: "SmolLM2-135M-Instruct.Q4_1.gguf", size: 98_362_432, sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53" },
  { short: "gemma3", file: "gemma-3-270m-q4_k_m.gguf", size: 253_113_024, sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818" },
  { short: "qwen2.5", file: "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", size: 491_400_064, sha256: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32" },
];

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
