// A markdown subset for model replies, built from text nodes only: ``` fenced code blocks, `inline
// code`, **bold**, and paragraphs/line breaks. Anything else stays literal text. No innerHTML, ever.
// A code block has a copy button whose word is drawn by CSS, so the reply's text stays the model's.

import { h, copyText } from "./dom.js";

const INLINE = /(`[^`\n]+`|\*\*[^*\n]+\*\*)/g;

function inline(text) {
  return text.split(INLINE).filter(Boolean).map((part) => {
    if (part.startsWith("`") && part.endsWith("`") && part.length > 2) return h("code", { text: part.slice(1, -1) });
    if (part.startsWith("**") && part.endsWith("**") && part.length > 4) return h("strong", { text: part.slice(2, -2) });
    return document.createTextNode(part);
  });
}

export function renderMarkdown(el, text) {
  const nodes = [];
  // Odd pieces are inside ``` fences (an unclosed fence while streaming still renders as code).
  text.split(/```[^\n]*\n?/).forEach((piece, i) => {
    if (i % 2 === 1) {
      const code = piece.replace(/\n$/, "");
      nodes.push(h("pre", {}, h("button", { type: "button", class: "copy-code", "aria-label": "Copy code", title: "Copy code", onclick: () => copyText(code) }),
        h("code", { text: code })));
      return;
    }
    for (const para of piece.split(/\n{2,}/)) {
      if (!para.trim()) continue;
      const lines = para.split("\n");
      nodes.push(h("p", {}, lines.flatMap((line, j) => (j ? [h("br"), ...inline(line)] : inline(line)))));
    }
  });
  el.replaceChildren(...nodes);
}
