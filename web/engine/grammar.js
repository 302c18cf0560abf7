// The page's grammar engine for constrained decoding (response_format): XGrammar's WebAssembly build,
// vendored by `pyshim setup` into vendor/xgrammar/, loaded on the first constrained request only.
//
// Python (pyshim/text/grammar.py, class XGrammar) drives it through the object below: the vocabulary
// arrives once per model in GPT-2's byte alphabet ("byte_level": every byte one character, so partial
// UTF-8 tokens survive a JS string), a matcher per reply answers the allowed-token bitmask (Int32Array,
// bit t % 32 of word t / 32) and takes each token chosen. JSON is compact (", " and ": "), as natively.

const SEPARATORS = [", ", ": "];
const NO_INDENT = -1;                 // web-xgrammar's spelling of "no indentation"
const KEEP_TOKENIZERS = 2;            // models whose vocabularies stay compiled
const KEEP_GRAMMARS = 32;             // compiled grammars kept per model (a schema compiles in ~0.1-0.3 s)

// XGrammar reports a bad schema or grammar by printing "[FATAL] file:line: why" through console.error
// and aborting the call (a RuntimeError "Aborted()"; the module stays usable). Its printer is bound to
// console.error when the module starts, so the wrapper goes in first: while `quietly` runs, the lines are
// kept for the error it throws instead of reaching the console.
let captured = null;
const consoleError = console.error;
console.error = (...args) => (captured ? captured.push(args.join(" ")) : consoleError.apply(console, args));

async function quietly(what, fn) {
  captured = [];
  try {
    return await fn();
  } catch (err) {
    const why = captured.filter((line) => !line.startsWith("Aborted(")).map((line) => line.replace(/^\[FATAL\] \S+:\d+: /, ""));
    throw Object.assign(new Error(`${what}: ${why.join("; ") || err?.message || err}`), { name: "BadRequestError" });
  } finally {
    captured = null;
  }
}

let loading = null;
function xgrammar() {
  // The bundle is UMD: imported as a module it defines globalThis.xgrammar.
  loading ??= import("../vendor/xgrammar/index.js").then(() => {
    if (!globalThis.xgrammar?.GrammarCompiler) throw Object.assign(new Error("vendor/xgrammar/index.js did not define xgrammar"), { name: "SetupError" });
    return globalThis.xgrammar;
  });
  return loading;
}

const models = new Map();             // key -> {info, compiler, grammars: Map}

function forgetOldest(map, keep, dispose) {
  while (map.size > keep) {
    const [key, value] = map.entries().next().value;
    map.delete(key);
    dispose(value);
  }
}

export const grammarAccess = {
  async tokenizer(key, vocabJSON, stopJSON) {
    if (models.has(key)) return;
    const xgr = await xgrammar();
    const vocab = JSON.parse(vocabJSON);
    const info = await xgr.TokenizerInfo.createTokenizerInfo(vocab, "byte_level", false, vocab.length, JSON.parse(stopJSON));
    const compiler = await xgr.GrammarCompiler.createGrammarCompiler(info, true);
    models.set(key, { info, compiler, grammars: new Map() });
    forgetOldest(models, KEEP_TOKENIZERS, (m) => {
      for (const g of m.grammars.values()) g.dispose();
      m.compiler.dispose();
      m.info.dispose();
    });
  },

  // kind "json_schema" (text: the schema) or "grammar" (text: GBNF with rule `root`).
  async matcher(key, kind, text, strict) {
    const xgr = await xgrammar();
    const model = models.get(key);
    if (!model) throw Object.assign(new Error(`no vocabulary for ${key}`), { name: "BadRequestError" });
    const id = `${kind}\u0000${strict}\u0000${text}`;
    let compiled = model.grammars.get(id);
    if (!compiled) {
      compiled = await quietly(kind === "grammar" ? "the grammar" : "the schema", () => (kind === "grammar"
        ? model.compiler.compileGrammar(text, "root")
        : model.compiler.compileJSONSchema(text, false, NO_INDENT, SEPARATORS, Boolean(strict))));
      model.grammars.set(id, compiled);
      forgetOldest(model.grammars, KEEP_GRAMMARS, (g) => g.dispose());
    } else {                           // most recently used last
      model.grammars.delete(id);
      model.grammars.set(id, compiled);
    }
    const matcher = await xgr.GrammarMatcher.createGrammarMatcher(compiled);
    return {
      mask: () => matcher.getNextTokenBitmask(),
      accept: (token) => matcher.acceptToken(token),
      close: () => matcher.dispose(),
    };
  },
};
