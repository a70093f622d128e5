/* Discord-flavoured markdown, the subset the residents produce: code blocks, inline code,
 * bold/italic/underline/strike, headings, block quotes, `-# ` subtext, mentions and links.
 * Everything is escaped first; only tags built here reach innerHTML. */
"use strict";

const RoomMarkdown = (() => {
  const esc = (s) => s.replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"})[c]);

  /* Stump and generation ids become links in the moderator panel (opts.refs). */
  const REF = /\b([sg])-[0-9a-f]{6,32}\b/g;
  function refs(html, on) {
    if (!on) return html;
    return html.replace(REF, (id, k) =>
      `<a href="#" class="ref ref-${k === "s" ? "stump" : "generation"}" data-ref="${id}">${id}</a>`);
  }

  function emphasis(html) {
    return html
      .replace(/\*\*([^*]+?)\*\*/g, "<strong>$1</strong>")
      .replace(/__([^_]+?)__/g, "<u>$1</u>")
      .replace(/(^|[^\w*])\*([^*\s][^*]*?)\*(?!\w)/g, "$1<em>$2</em>")
      .replace(/(^|[^\w_])_([^_\s][^_]*?)_(?!\w)/g, "$1<em>$2</em>")
      .replace(/~~([^~]+?)~~/g, "<s>$1</s>");
  }

  /* Inline: code spans, mentions, URLs and backslash escapes are tokens; the text between gets
   * emphasis. As in Discord, `\` before a punctuation mark shows the mark and hides the backslash
   * (so an escaped `\-# ` line reads "-# …" in plain type, not as subtext). */
  const INLINE = /(`+)([\s\S]*?[^`])\1(?!`)|<@!?(\d+)>|<#(\d+)>|@(everyone|here)\b|(https?:\/\/[^\s<>]+[^\s<>.,;:!?)'"])|\\([^0-9A-Za-z\s])/g;
  function inline(text, opts) {
    let out = "", last = 0, m;
    INLINE.lastIndex = 0;
    while ((m = INLINE.exec(text)) !== null) {
      out += refs(emphasis(esc(text.slice(last, m.index))), opts.refs);
      if (m[1]) out += `<code>${refs(esc(m[2]), opts.refs)}</code>`;
      else if (m[3]) out += `<span class="mention" data-user-id="${m[3]}">@${esc(opts.names(m[3]) || "unknown-user")}</span>`;
      else if (m[4]) out += `<span class="mention">#${esc(opts.channels(m[4]) || "unknown")}</span>`;
      else if (m[5]) out += `<span class="mention">@${m[5]}</span>`;
      else if (m[6]) out += `<a href="${esc(m[6])}" rel="noopener noreferrer" target="_blank">${esc(m[6])}</a>`;
      else out += esc(m[7]);
      last = INLINE.lastIndex;
    }
    return out + refs(emphasis(esc(text.slice(last))), opts.refs);
  }

  /* Line blocks outside code fences: subtext, headings, quotes, plain lines. */
  function lines(text, opts) {
    const out = [];
    for (const line of text.split("\n")) {
      let m;
      if ((m = /^-# (.*)$/.exec(line))) out.push(`<div class="subtext">${inline(m[1], opts)}</div>`);
      else if ((m = /^(#{1,3}) (.*)$/.exec(line))) out.push(`<div class="h${m[1].length}">${inline(m[2], opts)}</div>`);
      else if ((m = /^> ?(.*)$/.exec(line))) out.push(`<blockquote>${inline(m[1], opts)}</blockquote>`);
      else out.push(`<div class="line">${line ? inline(line, opts) : "<br>"}</div>`);
    }
    return out.join("");
  }

  const FENCE = /```(?:([\w+-]+)?\n)?([\s\S]*?)```/g;

  /** HTML for a message's content. opts: names(id) -> name, channels(id) -> name, refs: bool. */
  function render(content, opts = {}) {
    const o = {names: () => null, channels: () => null, refs: false, ...opts};
    let out = "", last = 0, m;
    FENCE.lastIndex = 0;
    while ((m = FENCE.exec(content)) !== null) {
      const before = content.slice(last, m.index).replace(/\n$/, "");
      if (before) out += lines(before, o);
      const lang = m[1] ? ` data-lang="${esc(m[1])}"` : "";
      out += `<pre${lang}><code>${refs(esc(m[2].replace(/\n$/, "")), o.refs)}</code></pre>`;
      last = FENCE.lastIndex;
      if (content[last] === "\n") last += 1;
    }
    const rest = content.slice(last);
    if (rest) out += lines(rest, o);
    return out;
  }

  /** True when every non-empty line is `-# ` subtext: the shape of a receipt or notice. */
  function allSubtext(content) {
    const ls = content.split("\n").filter((l) => l.trim());
    return ls.length > 0 && ls.every((l) => l.startsWith("-# "));
  }

  return {render, allSubtext, esc};
})();
